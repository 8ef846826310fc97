//! A deterministic simulation of the real engine over the real store. Agents, rooms, tasks,
//! syncs, revocations, rotations, resets, clock jumps, injected journal faults and crashes are
//! drawn from one seeded generator; the clock and entropy are simulated, so a seed replays the
//! same run exactly. After every step the simulator checks what Room promises:
//! - nothing acknowledged is lost across crashes, and every chain verifies (HLC order included);
//! - a refused call changes nothing;
//! - no agent's turn lands past a foreign event it had not confirmed;
//! - the five runtime invariants hold over every journal, checked by an independent replay
//!   (`oracle`): no repeated idempotency key, well-formed task lifecycles, no overlapping live
//!   leases, a causal flag beside every `done` over unresolved children, and every claim past
//!   its TTL at a sweep recorded in doubt;
//! - a retry of an acknowledged-but-unanswered turn with its idempotency key is refused as a
//!   repeat naming the original event;
//! - with `blackboard` on: some members are delegated principals holding artifact scopes,
//!   and every artifact write and read is checked against the fence (a write or read the
//!   scopes do not allow is refused `artifact_write_denied`/`artifact_read_denied`), the
//!   versions acknowledged (a write lands as the next version, holding what was written, and
//!   survives every crash) and audiences (a withheld version does not exist for its reader).
//!
//! A failure names the seed and step; `room-sim --seed N` replays it.

pub mod collab;
pub mod disk;
pub mod oracle;

use room_core::env::{Clock, ManualClock, SeededEntropy};
use room_core::{Code, Tier, Verb};
use room_engine::principal::AgentCaller;
use room_engine::turnstile::TurnStep;
use room_engine::verbs::TurnArgs;
use room_engine::{Engine, EngineConfig, Env};
use room_store::fs::RealFs;
use room_store::journal::{Fault, Faults};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A deliberately broken store, to prove the simulator finds what it should.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// Acknowledge appends without fsync.
    AckBeforeFsync,
    /// The commit pipeline acknowledges a batch without syncing its frame.
    CommitLogSkipsSync,
    /// Do not check the five runtime invariants.
    SkipInvariants,
    /// The disk under SQLite answers fsync without writing anything (control.db and the sync
    /// indexes then lose acknowledged changes at a crash).
    SqliteFsyncLies,
    /// `done` does not require the authority its claim pinned (an amendment between a claim
    /// and its done goes unnoticed).
    SkipAuthorityPins,
}

/// The program a simulated task's acceptance check runs (never started: the simulated runner
/// answers for it).
pub const SIM_CHECK: &str = "/sim/check";

/// A deterministic runner: each run exits 0 or 1 by its own seeded sequence (70 % pass).
pub struct SimRunner(Mutex<u64>);

impl SimRunner {
    pub fn new(seed: u64) -> SimRunner {
        SimRunner(Mutex::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1))
    }
}

impl room_core::Runner for SimRunner {
    fn run(&self, req: &room_core::RunRequest) -> std::io::Result<room_core::RunOutcome> {
        if req.program != std::path::Path::new(SIM_CHECK) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the simulation runs only its own check",
            ));
        }
        let mut s = self.0.lock().expect("sim runner lock");
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        let pass = *s % 10 < 7;
        Ok(room_core::RunOutcome {
            exit_code: Some(if pass { 0 } else { 1 }),
            job_empty: true,
            ..Default::default()
        })
    }
}

#[derive(Debug, Clone)]
pub struct SimConfig {
    pub seed: u64,
    pub steps: u64,
    pub agents: usize,
    pub rooms: usize,
    /// Inject journal faults and crashes.
    pub faults: bool,
    pub broken: Option<Broken>,
    /// Some members are delegated principals holding artifact scopes, some notes write
    /// blackboard artifacts and some steps read them, each checked against the fence and the
    /// versions acknowledged (off by default: the regression seeds replay as they were found).
    pub blackboard: bool,
}

impl SimConfig {
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            steps: 400,
            agents: 24,
            rooms: 6,
            faults: true,
            broken: None,
            blackboard: false,
        }
    }
}

/// What went wrong, where.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub step: u64,
    pub what: String,
    pub recent: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} step {}: {}", self.seed, self.step, self.what)?;
        writeln!(
            f,
            "replay: room-sim --seed {} --steps {}",
            self.seed,
            self.step + 1
        )?;
        for l in &self.recent {
            writeln!(f, "  {l}")?;
        }
        Ok(())
    }
}

/// Summary of a passing run.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub accepted: u64,
    pub refused: u64,
    pub crashes: u64,
    pub faults: u64,
    pub acked_events: u64,
    /// Refusals by code.
    pub refusals: BTreeMap<String, u64>,
    /// Invariant verdicts by invariant and severity.
    pub invariants: BTreeMap<String, u64>,
    /// SQLite's traffic on the simulated disk.
    pub disk: disk::DiskStats,
    /// Journals with unsynced bytes at a crash, cut to a prefix of them.
    pub journals_cut: u64,
    /// Journals with unsynced bytes at a crash that kept only some of their sectors, and those
    /// where a sector after a lost one was kept (written out of order).
    pub journals_sectored: u64,
    pub journals_out_of_order: u64,
    /// Turns the turnstile told to wait (each called again later, or given up), and those
    /// that landed when called again.
    pub turn_waits: u64,
    pub turns_after_wait: u64,
}

pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub(crate) fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Where an armed fault strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Journal,
    /// The commit pipeline's batch: its frame's write and sync.
    CommitLog,
    Blob,
    Index,
    Control,
}

/// One armed fault at a time, for the next write of its target; `fired` says one struck since
/// the last restart (a storage refusal is then expected, and a crash follows).
#[derive(Debug)]
struct SimFaults {
    /// The armed fault, and how many of its target's write points it lets pass first.
    next: Mutex<Option<(Target, Fault, u32)>>,
    fired: std::sync::atomic::AtomicBool,
    always: Option<Fault>,
    /// What every commit log batch meets (a planted bug).
    log_always: Option<Fault>,
}

impl SimFaults {
    fn take(&self, target: Target) -> Option<Fault> {
        self.take_if(target, |_| true)
    }

    /// The armed fault, if it is for `target` and of a kind this write point can suffer.
    fn take_if(&self, target: Target, kind: impl Fn(Fault) -> bool) -> Option<Fault> {
        let mut next = self.next.lock().expect("fault lock");
        match &mut *next {
            Some((t, f, pass)) if *t == target && kind(*f) && *pass > 0 => {
                *pass -= 1;
                None
            }
            &mut Some((t, f, _)) if t == target && kind(f) => {
                *next = None;
                self.fired.store(true, std::sync::atomic::Ordering::SeqCst);
                Some(f)
            }
            _ => None,
        }
    }

    fn fired(&self) -> bool {
        self.fired.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Faults for SimFaults {
    fn on_append(&self, _path: &Path, _bytes: usize) -> Option<Fault> {
        self.take(Target::Journal).or(self.always)
    }

    fn on_blob_write(&self, _path: &Path, _bytes: usize) -> Option<Fault> {
        self.take(Target::Blob)
    }

    fn on_log_write(&self, _path: &Path, _bytes: usize) -> Option<Fault> {
        self.take(Target::CommitLog).or(self.log_always)
    }
}

/// SQLite's writes and syncs, under it: control.db (and its WAL) or a room's sync index.
impl disk::DiskFaults for SimFaults {
    fn on_write(&self, path: &Path) -> Option<Fault> {
        self.take_if(sqlite_target(path), |f| {
            matches!(
                f,
                Fault::WriteError(_) | Fault::ShortWrite(_) | Fault::CrashAfterWrite
            )
        })
    }

    fn on_sync(&self, path: &Path) -> Option<Fault> {
        self.take_if(sqlite_target(path), |f| {
            matches!(f, Fault::SyncError | Fault::CrashAfterWrite)
        })
    }
}

fn sqlite_target(path: &Path) -> Target {
    let control = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("control.db"));
    if control {
        Target::Control
    } else {
        Target::Index
    }
}

/// A page an agent read and has not confirmed: its receipt, the position it (or the chain of
/// delta pages it continues) starts after, and the last seq it covers.
#[derive(Debug, Clone)]
struct Read {
    receipt: String,
    after: u64,
    to: u64,
}

/// A turn the room's turnstile told to wait: called again with its ticket on a later step of
/// its agent, or given up (a caller that went away, whose place lapses).
#[derive(Debug, Clone)]
struct Pending {
    room: String,
    verb: Verb,
    args: TurnArgs,
    read: Option<Read>,
    wait: Waiting,
}

/// A ticket the turnstile gave, and since when its wait is measured.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    ticket: u64,
    /// The clock when this ticket was drawn, and how many times the clock had stepped back
    /// by then (a wait measured across a step back is not checked against its bound).
    since_ms: u64,
    backs: u64,
    /// Restarts so far when this ticket was drawn. The turnstile is in memory: a restart ends
    /// every wait, and a ticket kept across one names no place in the new queue (called again
    /// with it, the turn arrives afresh).
    restarts: u64,
}

struct Agent {
    name: String,
    token: String,
    revoked: bool,
    /// A rotation or revocation of this agent failed on storage: whether it took is unknown.
    control_doubt: bool,
    rooms: Vec<String>,
    /// Per room: the last receipt read and the position it covers.
    receipt: BTreeMap<String, (String, u64)>,
    /// Per room: what this agent has really confirmed (by reading or by the Fold Rule).
    confirmed: BTreeMap<String, u64>,
    /// Per room: the checkpoint its last acknowledged confirmation established, which must
    /// survive any crash (the Fold Rule's advances may not).
    confirmed_durably: BTreeMap<String, u64>,
    open: BTreeMap<String, Vec<String>>,
    /// Tasks addressed to this agent and not yet claimed: (room, task).
    tasks: Vec<(String, String)>,
    /// Tasks this agent claimed and has not yet settled: (room, task).
    claimed: Vec<(String, String)>,
    /// Obligations this agent raised with send: (room, obligation id), for circle.
    raised: Vec<(String, String)>,
    /// Its turn waiting in a room's turnstile, if any.
    pending: Option<Pending>,
    /// Per room: what it had confirmed when the room's view last changed under it, while it
    /// has confirmed nothing since. The engine keeps that checkpoint, stamped with the old
    /// view, and honours it again if the view comes back (a member revoked, then restored):
    /// what was read under a view is still read under the same view.
    revivable: BTreeMap<String, u64>,
    /// A delegated principal's scopes (`None`: a root the owner enrolled, bounded by its tier).
    scopes: Option<Vec<String>>,
}

/// The scopes the simulation's delegated members draw from.
const BOARD_SCOPES: [&str; 5] = [
    "artifact:read:spec",
    "artifact:write:spec",
    "artifact:read:extra/notes",
    "artifact:write:extra/notes",
    "session:read",
];
const BOARD_KINDS: [&str; 2] = ["spec", "extra/notes"];

/// One acknowledged artifact version: its event, content and audience (empty: every reader).
#[derive(Debug, Clone)]
struct Version {
    event: String,
    content: Value,
    audience: Vec<String>,
}

fn holds(scopes: &Option<Vec<String>>, scope: &str) -> bool {
    scopes.as_ref().is_none_or(|s| s.iter().any(|x| x == scope))
}

pub struct Sim {
    cfg: SimConfig,
    rng: Rng,
    _tmp: tempfile::TempDir,
    state: PathBuf,
    boot: PathBuf,
    clock: Arc<ManualClock>,
    entropy: Arc<SeededEntropy>,
    faults: Arc<SimFaults>,
    /// The page cache under SQLite.
    disk: disk::Mount,
    engine: Option<Engine>,
    agents: Vec<Agent>,
    rooms: Vec<String>,
    /// Rooms the owner archived (no step writes to them any more).
    archived: Vec<String>,
    /// Rooms created mid-run so far (their names count up).
    created: u64,
    acked: BTreeMap<String, BTreeSet<String>>,
    step: u64,
    recent: Vec<String>,
    report: Report,
    /// A crash was injected into the last append: restart before anything else.
    crash_pending: bool,
    /// The clock and each room's tip at the last sweep that succeeded everywhere: every claim
    /// begun by then whose TTL had run out must be recorded in doubt.
    last_sweep: Option<(u64, BTreeMap<String, u64>)>,
    /// Tasks created so far per room, for parents.
    room_tasks: BTreeMap<String, Vec<String>>,
    keys: u64,
    /// The invariant oracle of each room, fed after every step.
    oracles: Vec<oracle::RoomOracle>,
    /// This step ran a sweep at this clock: the oracle checks it right after.
    swept_at: Option<u64>,
    /// Answers the simulated tasks' acceptance commands (kept across restarts of the engine).
    runner: Arc<SimRunner>,
    /// Turns written for an audience, by event id: no page may carry one to anyone else.
    withheld: BTreeMap<String, BTreeSet<String>>,
    /// The blackboard's acknowledged versions per (room, kind); keys whose last write's
    /// answer was lost (it may have landed) are in `board_doubt`.
    board: BTreeMap<(String, String), Vec<Version>>,
    board_doubt: BTreeSet<(String, String)>,
    /// Times the clock stepped back so far.
    clock_backs: u64,
    /// `ROOM_SIM_TRACE` is set: every line noted goes to stderr as well, not only the last 30
    /// a failure shows.
    trace: bool,
}

pub(crate) fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

impl Sim {
    pub fn new(cfg: SimConfig) -> Sim {
        let tmp = tempfile::tempdir_in(scratch_dir()).expect("a scratch dir");
        let root = std::fs::canonicalize(tmp.path()).expect("canonical scratch dir");
        let state = root.join("state");
        let boot = root.join("boot.toml");
        room_store::statedir::init(&state, &boot, &format!("sim-{}", cfg.seed)).expect("state dir");
        // the simulated acceptance command: the only program a sim task's check may run
        {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(state.join("config.toml"))
                .expect("config.toml");
            writeln!(f, "\n[acceptance]\ncommands = [\"{SIM_CHECK}\"]").expect("config.toml");
        }
        let seed = cfg.seed;
        let always = match cfg.broken {
            Some(Broken::AckBeforeFsync) => Some(Fault::SkipSync),
            _ => None,
        };
        let faults = Arc::new(SimFaults {
            next: Mutex::new(None),
            fired: std::sync::atomic::AtomicBool::new(false),
            always,
            log_always: (cfg.broken == Some(Broken::CommitLogSkipsSync)).then_some(Fault::SkipSync),
        });
        Sim {
            disk: disk::Mount::new(
                &root,
                faults.clone(),
                cfg.broken == Some(Broken::SqliteFsyncLies),
            ),
            rng: Rng(cfg.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1),
            clock: Arc::new(ManualClock::new(1_790_000_000_000)),
            entropy: Arc::new(SeededEntropy::new(cfg.seed ^ 0x5eed)),
            faults,
            cfg,
            _tmp: tmp,
            state,
            boot,
            engine: None,
            agents: vec![],
            rooms: vec![],
            archived: vec![],
            created: 0,
            acked: BTreeMap::new(),
            step: 0,
            recent: vec![],
            report: Report::default(),
            crash_pending: false,
            last_sweep: None,
            room_tasks: BTreeMap::new(),
            keys: 0,
            oracles: Vec::new(),
            swept_at: None,
            runner: Arc::new(SimRunner::new(seed)),
            withheld: BTreeMap::new(),
            board: BTreeMap::new(),
            board_doubt: BTreeSet::new(),
            clock_backs: 0,
            trace: std::env::var_os("ROOM_SIM_TRACE").is_some(),
        }
    }

    /// No item of `page` is of a record withheld from `reader`: neither a turn written for an
    /// audience without it, nor any record (a reply, its items) whose own audience leaves it out.
    fn check_served(&self, reader: &str, room: &str, page: &Value) -> Result<(), Failure> {
        for item in page["items"].as_array().into_iter().flatten() {
            let id = item["id"].as_str().unwrap_or_default();
            let known = self.withheld.get(id).is_some_and(|a| !a.contains(reader));
            let own = item["event"]["audience"]
                .as_array()
                .is_some_and(|a| !a.is_empty() && !a.iter().any(|n| n == reader));
            if known || own {
                return Err(self.fail(format!(
                    "{room}: {reader} was served {id} (seq {}), which is withheld from it",
                    item["seq"]
                )));
            }
        }
        Ok(())
    }

    fn open_engine(&mut self) -> Result<(), String> {
        let s =
            room_store::statedir::validate(&self.state, &self.boot).map_err(|e| e.to_string())?;
        let env = Env {
            clock: self.clock.clone(),
            entropy: self.entropy.clone(),
            fs: Arc::new(RealFs),
            runner: self.runner.clone(),
        };
        let store = room_store::SqliteBackendConfig {
            faults: Some(self.faults.clone()),
            sqlite: room_store::index::SqliteConfig {
                vfs: Some(disk::VFS_NAME.to_string()),
                // checkpoint after nearly every commit, so crashes and faults land inside them
                wal_autocheckpoint_pages: 4,
                index_checkpoint_commits: 2,
                // evict receipts often, so that confirmations meet evicted ones
                receipts_kept_max: 64,
            },
            // small segments, so that checkpoints happen and crashes land around them
            pipeline: room_store::pipeline::PipelineConfig {
                segment_bytes_max: 16 * 1024,
            },
            ..Default::default()
        };
        let store = Arc::new(room_store::SqliteBackend::new(&s, store));
        let config = EngineConfig {
            skip_invariants: self.cfg.broken == Some(Broken::SkipInvariants),
            skip_authority_pins: self.cfg.broken == Some(Broken::SkipAuthorityPins),
            ..EngineConfig::default()
        };
        self.engine = Some(
            Engine::open(s, env, store, config)
                .map_err(|e| format!("engine failed to open: {e}"))?,
        );
        Ok(())
    }

    fn owner(&self) -> room_engine::Owner {
        self.e()
            .owner(&room_engine::Caller::Local(
                room_engine::Evidence::UnixPeer {
                    uid: self.e().config().owner_uid,
                    pid: std::process::id(),
                },
            ))
            .expect("the simulator is the owner")
    }

    fn e(&self) -> &Engine {
        self.engine
            .as_ref()
            .expect("the engine is open between steps")
    }

    fn note(&mut self, line: String) {
        if self.trace {
            eprintln!(
                "trace: step {} clock {}: {line}",
                self.step,
                self.clock.now_ms()
            );
        }
        self.recent.push(line);
        if self.recent.len() > 30 {
            self.recent.remove(0);
        }
    }

    fn fail(&self, what: impl Into<String>) -> Failure {
        Failure {
            seed: self.cfg.seed,
            step: self.step,
            what: what.into(),
            recent: self.recent.clone(),
        }
    }

    fn caller(&self, i: usize) -> AgentCaller {
        AgentCaller {
            token: self.agents[i].token.clone(),
            conversation: "sim".into(),
            declared_tier: None,
            page_bytes_max: None,
        }
    }

    fn tips(&self) -> Vec<u64> {
        self.rooms
            .iter()
            .map(|r| {
                self.e()
                    .room_log(&self.owner(), r, 1, 1)
                    .map(|v| v["tip_seq"].as_u64().unwrap_or(0))
                    .unwrap_or(0)
            })
            .collect()
    }

    fn setup(&mut self) -> Result<(), String> {
        self.open_engine()?;
        for i in 0..self.cfg.agents {
            let tier = if i % 4 == 0 {
                Tier::Coordinator
            } else {
                Tier::Member
            };
            let name = format!("a{i}");
            let scopes = (self.cfg.blackboard && i % 4 != 0 && self.rng.chance(50)).then(|| {
                BOARD_SCOPES
                    .iter()
                    .filter(|_| self.rng.chance(50))
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
            });
            let token = match &scopes {
                None => {
                    self.e()
                        .enroll(&self.owner(), &name, tier, "sim")
                        .map_err(|r| r.to_string())?
                        .token
                }
                Some(scopes) => self
                    .e()
                    .delegate_as_owner(&self.owner(), None, &name, scopes, Some(tier))
                    .map_err(|r| r.to_string())?["token"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            };
            self.agents.push(Agent {
                name,
                token,
                revoked: false,
                control_doubt: false,
                rooms: vec![],
                receipt: BTreeMap::new(),
                confirmed: BTreeMap::new(),
                confirmed_durably: BTreeMap::new(),
                open: BTreeMap::new(),
                tasks: vec![],
                claimed: vec![],
                raised: vec![],
                pending: None,
                revivable: BTreeMap::new(),
                scopes,
            });
        }
        for r in 0..self.cfg.rooms {
            let room = format!("r{r}");
            let size = 2 + self.rng.below(6) as usize;
            let mut members = BTreeSet::new();
            while members.len() < size.min(self.cfg.agents) {
                members.insert(self.rng.below(self.cfg.agents as u64) as usize);
            }
            let names: Vec<String> = members
                .iter()
                .map(|i| self.agents[*i].name.clone())
                .collect();
            self.e()
                .room_create(&self.owner(), &room, None, &names)
                .map_err(|r| r.to_string())?;
            for i in members {
                self.agents[i].rooms.push(room.clone());
            }
            self.rooms.push(room);
        }
        Ok(())
    }

    /// Run every step; the first broken promise ends the run.
    pub fn run(mut self) -> Result<Report, Failure> {
        self.setup().map_err(|e| self.fail(format!("setup: {e}")))?;
        self.reset_oracles()?;
        while self.step < self.cfg.steps {
            self.one_step()?;
            self.check_step()?;
            self.step += 1;
        }
        self.crash_and_restart()?;
        self.report.acked_events = self.acked.values().map(|s| s.len() as u64).sum();
        self.report.disk = self.disk.stats();
        Ok(self.report)
    }

    /// One oracle per room, replayed from the start of its journal.
    fn reset_oracles(&mut self) -> Result<(), Failure> {
        self.oracles.clear();
        for r in self.rooms_on_disk()? {
            self.oracles.push(oracle::RoomOracle::new(
                &r.room,
                &r.graph,
                r.shard.journal(),
            ));
        }
        self.oracles.sort_by(|a, b| a.path_cmp(b));
        self.check_step()
    }

    /// After every step that left the store healthy: the five invariants over what each
    /// journal gained, and the sweep's promise if the step swept.
    fn check_step(&mut self) -> Result<(), Failure> {
        let swept = self.swept_at.take();
        if self.crash_pending {
            // the restart replays everything from the start
            return Ok(());
        }
        for k in 0..self.oracles.len() {
            if let Err(e) = self.oracles[k].advance() {
                return Err(self.fail(e));
            }
            if let Some(now) = swept
                && let Err(e) = self.oracles[k].swept(now)
            {
                return Err(self.fail(e));
            }
        }
        Ok(())
    }

    fn one_step(&mut self) -> Result<(), Failure> {
        if self.crash_pending {
            return self.crash_and_restart();
        }
        let roll = self.rng.below(100);
        match roll {
            0..=34 => self.agent_turn(),
            35..=59 => self.agent_sync(),
            60..=69 => self.task_flow(),
            70..=72 => self.owner_rotate(),
            73..=74 => self.owner_revoke(),
            75..=76 => self.owner_reset(),
            77..=79 => {
                let jump = self.rng.below(600_000);
                if self.rng.chance(40) {
                    self.clock.set(
                        self.clock
                            .0
                            .load(std::sync::atomic::Ordering::SeqCst)
                            .saturating_sub(jump),
                    );
                    self.clock_backs += 1;
                    self.note(format!("clock steps back {jump} ms"));
                } else {
                    self.clock.advance(jump);
                    self.note(format!("clock jumps ahead {jump} ms"));
                }
                Ok(())
            }
            80..=81 if self.cfg.faults => {
                let f = match self.rng.below(5) {
                    0 => Fault::WriteError(std::io::ErrorKind::Other),
                    1 => Fault::WriteError(std::io::ErrorKind::StorageFull),
                    2 => Fault::ShortWrite(1 + self.rng.below(200) as usize),
                    3 => Fault::SyncError,
                    _ => Fault::CrashAfterWrite,
                };
                let target = match self.rng.below(10) {
                    0..=2 => Target::Journal,
                    3..=4 => Target::CommitLog,
                    5..=6 => Target::Blob,
                    7..=8 => Target::Index,
                    _ => Target::Control,
                };
                // SQLite writes many pages and syncs per commit: strike any one of them
                let pass = match target {
                    Target::Index | Target::Control => self.rng.below(12) as u32,
                    Target::Journal | Target::CommitLog | Target::Blob => 0,
                };
                *self.faults.next.lock().expect("fault lock") = Some((target, f, pass));
                self.report.faults += 1;
                self.note(format!(
                    "{target:?} write point {} from now fails: {f:?}",
                    pass + 1
                ));
                Ok(())
            }
            82 => self.owner_create_room(),
            83 if self.rooms.len() > 3 => self.owner_archive_room(),
            86 if self.cfg.faults => self.crash_and_restart(),
            87..=88 => self.sweep(),
            89 => self.dispatch(),
            90..=91 if self.cfg.blackboard => self.artifact_read(),
            _ => {
                self.clock.advance(1 + self.rng.below(50));
                // what the daemon does every 100 ms: commit pending index rows
                if self.rng.chance(30) {
                    self.e().flush_indexes();
                    if self.faults.fired() {
                        self.note("index flush hit the injected fault".into());
                        self.crash_pending = true;
                    }
                }
                Ok(())
            }
        }
    }

    /// Mostly an agent whose credential works; now and then a revoked one, whose every call
    /// must be refused.
    fn pick_agent(&mut self) -> usize {
        let mut i = self.rng.below(self.agents.len() as u64) as usize;
        for _ in 0..4 {
            if !self.agents[i].revoked || self.rng.chance(10) {
                break;
            }
            i = self.rng.below(self.agents.len() as u64) as usize;
        }
        i
    }

    /// Call the engine; check that a refusal changed nothing; return the outcome.
    fn checked<T>(
        &mut self,
        what: String,
        f: impl FnOnce(&Engine) -> Result<T, room_core::Refusal>,
    ) -> Result<Result<T, room_core::Refusal>, Failure> {
        let before = self.tips();
        let out = f(self.e());
        let injected = self.faults.fired();
        if injected {
            // whatever the call answered, the store took a fault: restart before going on
            self.crash_pending = true;
        }
        match &out {
            Ok(_) => {
                self.report.accepted += 1;
                self.note(format!("{what} -> ok"));
            }
            Err(r) => {
                self.report.refused += 1;
                *self
                    .report
                    .refusals
                    .entry(r.code.as_str().to_string())
                    .or_default() += 1;
                self.note(format!("{what} -> {}", r.code));
                if let Some(inv) = r.detail["invariant"].as_str() {
                    *self
                        .report
                        .invariants
                        .entry(format!("{inv} (reject)"))
                        .or_default() += 1;
                }
                if r.code == Code::StorageFailed || r.detail["violation_recorded"] == false {
                    // an injected fault: the journal may be poisoned; a crash follows
                    if injected || self.cfg.broken.is_some() {
                        self.crash_pending = true;
                    } else {
                        return Err(
                            self.fail(format!("storage failed without an injected fault: {r}"))
                        );
                    }
                }
                let after = self.tips();
                // a refusal that says its records are durable (or may be) is honest about it
                let durable_anyway =
                    r.detail["journal_committed"] == true || r.detail["in_doubt"] == true;
                if matches!(r.code, Code::InvariantViolation | Code::LeaseConflict) {
                    self.only_the_violation_was_written(&what, &before, &after)?;
                } else if after != before && !durable_anyway {
                    return Err(self.fail(format!(
                        "refused call {what} ({}) changed the room tips {before:?} -> {after:?}",
                        r.code
                    )));
                }
            }
        }
        // a fault armed for an append that did not happen stays armed for the next one
        Ok(out)
    }

    /// A rejected act leaves exactly one trace: its `invariant_violation` record (never its
    /// envelope), in one room.
    fn only_the_violation_was_written(
        &self,
        what: &str,
        before: &[u64],
        after: &[u64],
    ) -> Result<(), Failure> {
        let changed: Vec<usize> = (0..before.len())
            .filter(|&k| before[k] != after[k])
            .collect();
        let bad = || {
            self.fail(format!(
                "rejected {what} changed more than its violation record: {before:?} -> {after:?}"
            ))
        };
        match changed.as_slice() {
            [] => Ok(()),
            [k] if after[*k] == before[*k] + 1 => {
                let log = self
                    .e()
                    .room_log(&self.owner(), &self.rooms[*k], after[*k], 1)
                    .map_err(|r| self.fail(r.to_string()))?;
                let ev = &log["events"][0]["event"];
                if ev["kind"] == "invariant_violation" && ev["severity"] == "reject" {
                    Ok(())
                } else {
                    Err(bad())
                }
            }
            _ => Err(bad()),
        }
    }

    /// A blackboard write's outcome against the fence and the versions acknowledged: a
    /// write the writer's scopes do not allow is refused `artifact_write_denied`; one that
    /// lands is the next version, holding what was written; a conflict is refused only when
    /// the expectation was stale (or a write in doubt may have moved the key).
    fn check_put(
        &mut self,
        i: usize,
        room: &str,
        draft: &room_engine::blackboard::ArtifactDraft,
        audience: &[String],
        out: &Result<Value, room_core::Refusal>,
    ) -> Result<(), Failure> {
        let key = (room.to_string(), draft.kind.clone());
        let scope = format!("artifact:write:{}", draft.kind);
        let allowed = holds(&self.agents[i].scopes, &scope);
        let known = self.board.get(&key).map_or(0, |v| v.len() as u32);
        let doubt = self.board_doubt.contains(&key);
        let name = self.agents[i].name.clone();
        match out {
            Ok(v) if !allowed => {
                return Err(self.fail(format!("{name} wrote {} without {scope}: {v}", draft.kind)));
            }
            Ok(v) => {
                let event = v["event"].as_str().unwrap_or_default().to_string();
                let got = self
                    .e()
                    .artifact_get_owner(&self.owner(), room, &draft.kind, None, None)
                    .map_err(|r| self.fail(format!("{name}'s landed {}: {r}", draft.kind)))?;
                let version = got["version"].as_u64().unwrap_or(0) as u32;
                if got["event"] != event.as_str() || got["content"] != draft.content {
                    return Err(self.fail(format!(
                        "{name}'s {} in {room} reads back otherwise: {got}",
                        draft.kind
                    )));
                }
                if version != draft.expected_version + 1 || (!doubt && version != known + 1) {
                    return Err(self.fail(format!(
                        "{name}'s {} in {room} landed as version {version}, expected after {} (acknowledged {known})",
                        draft.kind, draft.expected_version
                    )));
                }
                let mut readers: Vec<String> = v["audience"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|a| a.as_str().map(String::from))
                    .collect();
                if readers.is_empty() && !audience.is_empty() {
                    readers = audience.to_vec();
                }
                let versions = self.board.entry(key.clone()).or_default();
                // a version a lost answer wrote is learned from its successor's number
                versions.truncate(version as usize - 1);
                while versions.len() < version as usize - 1 {
                    versions.push(Version {
                        event: String::new(),
                        content: Value::Null,
                        audience: vec!["(unknown)".into()],
                    });
                }
                versions.push(Version {
                    event,
                    content: draft.content.clone(),
                    audience: readers,
                });
                self.board_doubt.remove(&key);
            }
            Err(r) if !allowed && !self.agents[i].revoked => {
                // the fence runs before the gate: nothing but authorization comes first
                if !matches!(
                    r.code,
                    Code::ArtifactWriteDenied
                        | Code::CredentialRevoked
                        | Code::CredentialInvalid
                        | Code::RoomNotMember
                        | Code::RoomArchived
                        | Code::RoomTurnQueueExceeded
                        | Code::StorageFailed
                ) {
                    return Err(self.fail(format!(
                        "{name} without {scope} was refused {} instead of artifact_write_denied",
                        r.code
                    )));
                }
            }
            Err(r) if r.code == Code::ArtifactVersionConflict => {
                if !doubt && draft.expected_version == known {
                    return Err(self.fail(format!(
                        "{name}'s {} in {room} after version {known} (acknowledged) was refused as a conflict: {r}",
                        draft.kind
                    )));
                }
            }
            Err(r) if r.code == Code::StorageFailed => {
                self.board_doubt.insert(key);
            }
            Err(_) => {}
        }
        Ok(())
    }

    /// An agent reads an artifact: the fence, then the newest acknowledged version (as it was
    /// written), or nothing when that version is withheld from the reader.
    fn artifact_read(&mut self) -> Result<(), Failure> {
        let i = self.pick_agent();
        if self.agents[i].rooms.is_empty() {
            return Ok(());
        }
        let room = self.agents[i].rooms[self.rng.below(self.agents[i].rooms.len() as u64) as usize]
            .clone();
        let kind = BOARD_KINDS[self.rng.below(2) as usize];
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        let out = self.checked(format!("{name} artifact_get {room} {kind}"), |e| {
            e.artifact_get(&c, &room, kind, None, None)
        })?;
        if self.agents[i].revoked || self.archived.contains(&room) {
            return Ok(());
        }
        let allowed = holds(&self.agents[i].scopes, &format!("artifact:read:{kind}"));
        let key = (room.clone(), kind.to_string());
        let doubt = self.board_doubt.contains(&key);
        let newest = self.board.get(&key).and_then(|v| v.last()).cloned();
        match (&out, allowed) {
            (Ok(v), false) => Err(self.fail(format!("{name} read {kind} without its scope: {v}"))),
            (Err(r), false)
                if r.code != Code::ArtifactReadDenied && r.code != Code::StorageFailed =>
            {
                Err(self.fail(format!(
                    "{name} without the read scope was refused {}",
                    r.code
                )))
            }
            (_, false) => Ok(()),
            (Ok(v), true) => match newest {
                _ if doubt => Ok(()),
                None => Err(self.fail(format!(
                    "{name} read {kind} in {room}, which holds none: {v}"
                ))),
                Some(n) if v["event"] != n.event.as_str() || v["content"] != n.content => Err(self
                    .fail(format!(
                        "{name} read {kind} in {room} as {v}, not the newest acknowledged {n:?}"
                    ))),
                Some(n) if !n.audience.is_empty() && !n.audience.contains(&name) => Err(self.fail(
                    format!("{name} read {kind} in {room}, withheld from it: {n:?}"),
                )),
                Some(_) => Ok(()),
            },
            (Err(r), true) if r.code == Code::NotFound => match newest {
                Some(n) if !doubt && (n.audience.is_empty() || n.audience.contains(&name)) => {
                    Err(self.fail(format!(
                        "{name} was told {kind} in {room} does not exist; it holds {n:?}"
                    )))
                }
                _ => Ok(()),
            },
            (Err(_), true) => Ok(()),
        }
    }

    fn agent_sync(&mut self) -> Result<(), Failure> {
        let i = self.pick_agent();
        if self.agents[i].rooms.is_empty() {
            return Ok(());
        }
        let room = self.agents[i].rooms[self.rng.below(self.agents[i].rooms.len() as u64) as usize]
            .clone();
        // mostly read until caught up; sometimes read one page and stop
        let pages = if self.rng.chance(70) { 50 } else { 1 };
        self.catch_up(i, &room, pages)
    }

    fn catch_up(&mut self, i: usize, room: &str, pages: usize) -> Result<(), Failure> {
        let room = room.to_string();
        for _ in 0..pages {
            let confirm = if self.rng.chance(90) {
                self.agents[i].receipt.get(&room).cloned()
            } else {
                None
            };
            let c = self.caller(i);
            let r = confirm.as_ref().map(|(r, _)| r.clone());
            let out = self.checked(
                format!(
                    "{} sync {room} confirm={:?}",
                    self.agents[i].name,
                    confirm.as_ref().map(|c| c.1)
                ),
                |e| e.sync(&c, &room, r.as_deref()),
            )?;
            let page = match out {
                Ok(p) => p,
                Err(r) if matches!(r.code, Code::ReceiptUnknown | Code::RoomSyncViewChanged) => {
                    // the receipt did not survive a crash, or belongs to an older view: read again
                    self.agents[i].receipt.remove(&room);
                    continue;
                }
                Err(r) => {
                    // A confirmation whose commit failed is in doubt: it may have landed. The
                    // agent did read that page, so the model takes the upper bound.
                    if r.code == Code::StorageFailed
                        && let Some((_, to)) = confirm
                    {
                        let m = self.agents[i].confirmed.entry(room.clone()).or_default();
                        *m = (*m).max(to);
                    }
                    return Ok(());
                }
            };
            self.check_served(&self.agents[i].name, &room, &page)?;
            if let Some((_, to)) = confirm {
                let m = self.agents[i].confirmed.entry(room.clone()).or_default();
                *m = (*m).max(to);
                self.agents[i].revivable.remove(&room);
            }
            if let Some(seq) = page["confirmed"]["confirmed_seq"].as_u64() {
                self.agents[i].confirmed_durably.insert(room.clone(), seq);
            }
            if page["view_changed"] == true {
                self.view_changed(i, &room);
            }
            let to = page["to_seq"].as_u64().unwrap_or(0);
            let receipt = page["receipt"].as_str().unwrap_or_default().to_string();
            self.agents[i].receipt.insert(room.clone(), (receipt, to));
            let open: Vec<String> = page["open_items"]
                .as_array()
                .map(|v| {
                    v.iter()
                        .filter_map(|x| x["id"].as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            // the total is kept apart from the items (triggers): it must agree with the list
            let Some(total) = page["open_items_total"].as_u64() else {
                return Err(self.fail(format!("{room}: a sync page without open_items_total")));
            };
            let listed = open.len() as u64;
            if total < listed
                || (listed < room_engine::verbs::OPEN_ITEMS_PAGE_MAX as u64 && total != listed)
            {
                return Err(self.fail(format!(
                    "{room}: the sync page lists {listed} open items but says {total} are open"
                )));
            }
            self.agents[i].open.insert(room.clone(), open);
            if page["items"].as_array().is_some_and(Vec::is_empty) {
                break;
            }
        }
        Ok(())
    }

    /// A page told `i` that `room`'s view changed under its checkpoint: nothing is confirmed
    /// for the new view, and the checkpoint it had is kept aside (see `Agent::revivable`).
    fn view_changed(&mut self, i: usize, room: &str) {
        let a = &mut self.agents[i];
        if let Some(c) = a.confirmed.insert(room.to_string(), 0).filter(|c| *c > 0) {
            a.revivable.insert(room.to_string(), c);
        }
        a.confirmed_durably.remove(room);
        let line = format!(
            "{}'s view of {room} changed: checkpoint {:?} kept aside",
            a.name,
            a.revivable.get(room)
        );
        self.note(line);
    }

    /// Read one page of `room` without confirming it: what a `read_through` turn presents.
    fn read_page(&mut self, i: usize, room: &str) -> Result<Option<Read>, Failure> {
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        let out = self.checked(format!("{name} sync {room} (read)"), |e| {
            e.sync(&c, room, None)
        })?;
        let Ok(page) = out else { return Ok(None) };
        self.check_served(&name, room, &page)?;
        if page["view_changed"] == true {
            self.view_changed(i, room);
        }
        Ok(page["receipt"].as_str().map(|r| Read {
            receipt: r.into(),
            after: page["from_seq"].as_u64().unwrap_or(1).saturating_sub(1),
            to: page["to_seq"].as_u64().unwrap_or(0),
        }))
    }

    fn agent_turn(&mut self) -> Result<(), Failure> {
        let i = self.pick_agent();
        // a turn the turnstile told to wait is called again with its ticket, mostly
        if let Some(p) = self.agents[i].pending.take() {
            let live = self.agents[i].rooms.contains(&p.room) && !self.archived.contains(&p.room);
            if live && self.rng.chance(85) {
                return self.attempt_turn(i, &p.room, p.verb, p.args, p.read, Some(p.wait));
            }
            let name = self.agents[i].name.clone();
            self.note(format!("{name} gives up its waiting turn in {}", p.room));
        }
        if self.agents[i].rooms.is_empty() {
            return Ok(());
        }
        let room = self.agents[i].rooms[self.rng.below(self.agents[i].rooms.len() as u64) as usize]
            .clone();
        // mostly catch up first; else sometimes read one page and act on it with read_through
        let mut read = None;
        if self.rng.chance(70) {
            self.catch_up(i, &room, 50)?;
        } else if self.rng.chance(60) {
            read = self.read_page(i, &room)?;
        }
        let mates: Vec<String> = self
            .agents
            .iter()
            .filter(|a| a.name != self.agents[i].name && a.rooms.contains(&room))
            .map(|a| a.name.clone())
            .collect();
        let open = self.agents[i].open.get(&room).cloned().unwrap_or_default();
        let k = self.rng.below(100);
        let text = format!(
            "{} step {} {}",
            self.agents[i].name,
            self.step,
            "x".repeat(self.rng.below(300) as usize)
        );
        let (verb, args) = if k < 15 && !open.is_empty() {
            (
                Verb::Reply,
                TurnArgs {
                    room: room.clone(),
                    text: Some(text),
                    reply_to: Some(open[0].clone()),
                    ..Default::default()
                },
            )
        } else if k < 35 && !mates.is_empty() {
            let to = mates[self.rng.below(mates.len() as u64) as usize].clone();
            (
                Verb::Send,
                TurnArgs {
                    room: room.clone(),
                    text: Some(text),
                    to: vec![to],
                    ..Default::default()
                },
            )
        } else if k < 45
            && let Some((_, t)) = self.agents[i]
                .tasks
                .iter()
                .find(|(r, _)| *r == room)
                .cloned()
        {
            // an effect on a task addressed to us that we have not claimed: not well formed
            (
                Verb::Note,
                TurnArgs {
                    room: room.clone(),
                    text: Some(text),
                    task: Some(t),
                    ..Default::default()
                },
            )
        } else if k < 60 && self.cfg.blackboard && self.rng.chance(40) {
            let kind = BOARD_KINDS[self.rng.below(2) as usize];
            let known = self
                .board
                .get(&(room.clone(), kind.to_string()))
                .map_or(0, |v| v.len() as u32);
            // now and then a stale expectation, which must be refused
            let expected = if self.rng.chance(10) {
                known.saturating_sub(1)
            } else {
                known
            };
            let content = if kind == "spec" {
                serde_json::json!({"title": "t", "goal": format!("step {}", self.step),
                    "requirements": ["r"]})
            } else {
                serde_json::json!({"step": self.step, "by": self.agents[i].name})
            };
            (
                Verb::Note,
                TurnArgs {
                    room: room.clone(),
                    artifact: Some(room_engine::blackboard::ArtifactDraft {
                        kind: kind.into(),
                        key: None,
                        content,
                        expected_version: expected,
                    }),
                    ..Default::default()
                },
            )
        } else if k < 60 {
            (
                Verb::Note,
                TurnArgs {
                    room: room.clone(),
                    text: Some(text),
                    ..Default::default()
                },
            )
        } else if k < 63 {
            // occasionally huge, to exercise blobs and chunked pages
            (
                Verb::Note,
                TurnArgs {
                    room: room.clone(),
                    text: Some("é".repeat(6000)),
                    ..Default::default()
                },
            )
        } else {
            (
                Verb::Say,
                TurnArgs {
                    room: room.clone(),
                    text: Some(text),
                    ..Default::default()
                },
            )
        };
        let mut args = args;
        args.idempotency_key = self.maybe_key();
        // sometimes for an audience of some mates: a send mostly includes its recipient (else
        // it is refused, audience_excludes_recipient, and must change nothing)
        if verb != Verb::Reply && !mates.is_empty() && self.rng.chance(20) {
            let mut audience: Vec<String> = mates
                .iter()
                .filter(|_| self.rng.chance(40))
                .cloned()
                .collect();
            if verb == Verb::Send && self.rng.chance(90) {
                audience.extend(args.to.iter().cloned());
            }
            if audience.is_empty() {
                audience.push(mates[0].clone());
            }
            args.audience = audience;
        }
        self.attempt_turn(i, &room, verb, args, read, None)
    }

    /// Act in `room`, presenting `read` (with one more try on the delta page a refusal hands
    /// over), through the room's turnstile as the daemon does or, now and then, straight to
    /// `Engine::turn`. `waiting`: the ticket the turnstile gave this turn before (with the
    /// clock then, and its step-backs and the restarts by then). A turn told to wait is kept
    /// for a later step.
    fn attempt_turn(
        &mut self,
        i: usize,
        room: &str,
        verb: Verb,
        mut args: TurnArgs,
        mut read: Option<Read>,
        waiting: Option<Waiting>,
    ) -> Result<(), Failure> {
        let room = room.to_string();
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        let via_turnstile = waiting.is_some() || self.rng.chance(70);
        let mut ticket = waiting.map(|w| w.ticket);
        let mut out = Ok(Value::Null);
        // with read_through: one try, and one more with the delta page a refusal hands over
        for _ in 0..2 {
            args.read_through = read.as_ref().map(|r: &Read| r.receipt.clone());
            let what = format!("{name} {verb} {room} read_through={read:?} ticket={ticket:?}");
            let step = if via_turnstile {
                let t = ticket.take();
                self.checked(what, |e| e.turn_step(&c, verb, args.clone(), t))?
            } else {
                self.checked(what, |e| e.turn(&c, verb, args.clone()).map(TurnStep::Done))?
            };
            out = match step {
                Ok(TurnStep::Done(v)) => Ok(v),
                Ok(TurnStep::Wait { ticket, until_ms }) => {
                    return self.turn_waits(i, &room, verb, args, read, waiting, ticket, until_ms);
                }
                // the delta page's items, kept as text in the refusal, read as a caller does
                Err(r) => Err(r.materialized()),
            };
            match (&out, &read) {
                (Err(r), Some(old)) if r.code == Code::RoomSyncRequired => {
                    let next = &r.detail["next_page"];
                    self.check_served(&name, &room, next)?;
                    let Some(receipt) = next["receipt"].as_str() else {
                        break;
                    };
                    read = Some(Read {
                        receipt: receipt.into(),
                        after: if next.get("continues").is_some() {
                            old.after
                        } else {
                            next["from_seq"].as_u64().unwrap_or(1).saturating_sub(1)
                        },
                        to: next["to_seq"].as_u64().unwrap_or(0),
                    });
                }
                _ => break,
            }
        }
        if let Some(draft) = &args.artifact {
            self.check_put(i, &room, draft, &args.audience, &out)?;
        }
        // A read_through turn that landed confirmed what the agent read (the chain from where
        // it started); one whose commit failed is in doubt and may have landed, so the model
        // takes the upper bound, as for a confirmation in doubt. It credits the chain only if
        // the chain starts where the model stands, or where the checkpoint it kept aside
        // stands (`Agent::revivable`: the view that checkpoint was stamped with came back, so
        // the engine reads on from it and a receipt continuing it is sound).
        let in_doubt = out.as_ref().is_err_and(|r| r.code == Code::StorageFailed);
        if let Some(r) = read.as_ref().filter(|_| out.is_ok() || in_doubt) {
            let m = self.agents[i].confirmed.get(&room).copied().unwrap_or(0);
            let kept = self.agents[i].revivable.get(&room).copied();
            // the gap between the chain's start and where it continues may hold the agent's
            // own events only (a turn whose answer a crash swallowed, which the gate excepts)
            let mut from = None;
            for base in std::iter::once(m).chain(kept) {
                if r.after <= base || self.foreign_in(&room, &name, base + 1, r.after)?.is_none() {
                    from = Some(base);
                    break;
                }
            }
            if let Some(base) = from {
                self.agents[i]
                    .confirmed
                    .insert(room.clone(), m.max(base).max(r.to));
                self.agents[i].revivable.remove(&room);
            }
        }
        let Ok(v) = out else { return Ok(()) };
        if waiting.is_some() {
            self.report.turns_after_wait += 1;
        }
        if let (Some(ev), Some(a)) = (v["event"].as_str(), v["audience"].as_array())
            && !a.is_empty()
        {
            let a = a
                .iter()
                .filter_map(|n| n.as_str().map(String::from))
                .collect();
            self.withheld.insert(ev.to_string(), a);
        }
        if verb == Verb::Reply
            && let Some(answered) = &args.reply_to
            && let Some(open) = self.agents[i].open.get_mut(&room)
        {
            open.retain(|o| o != answered);
        }
        if verb == Verb::Send
            && let Some(ob) = v["obligations"][0]["id"].as_str()
        {
            self.agents[i].raised.push((room.clone(), ob.to_string()));
        }
        self.record_turn(i, &room, &v, Some((verb, args)))
    }

    /// The turnstile told this turn to wait: the answer names when to call again, within the
    /// room's bound (a wait is never a silent hang), and the agent keeps the turn for a later
    /// step. `waiting` is what it held before this call, if it was waiting already.
    #[allow(clippy::too_many_arguments)]
    fn turn_waits(
        &mut self,
        i: usize,
        room: &str,
        verb: Verb,
        args: TurnArgs,
        read: Option<Read>,
        waiting: Option<Waiting>,
        ticket: u64,
        until_ms: u64,
    ) -> Result<(), Failure> {
        let now = self.clock.now_ms();
        let restarts = self.report.crashes;
        // the same ticket in the same run is the same place in the queue; a new one starts a
        // new wait, and so does every wait after a restart (the turnstile is in memory)
        let wait = match waiting {
            Some(w) if w.ticket == ticket && w.restarts == restarts => w,
            Some(w) if w.ticket == ticket => {
                // tickets are unique across the daemon's runs: a number from before a restart
                // handed out again would pass for its old place in the queue
                return Err(self.fail(format!(
                    "a turn in {room} called again after a restart with its ticket {ticket} from before it was given the same ticket again"
                )));
            }
            _ => Waiting {
                ticket,
                since_ms: now,
                backs: self.clock_backs,
                restarts,
            },
        };
        let Waiting {
            since_ms, backs, ..
        } = wait;
        let wait_max = self.e().policy().gate.turn_wait_ms_max;
        if backs == self.clock_backs
            && (now.saturating_sub(since_ms) > wait_max || until_ms > since_ms + wait_max + 1)
        {
            return Err(self.fail(format!(
                "a turn in {room} waiting since {since_ms} was told at {now} to wait until {until_ms}, past the {wait_max} ms bound"
            )));
        }
        self.report.turn_waits += 1;
        self.agents[i].pending = Some(Pending {
            room: room.into(),
            verb,
            args,
            read,
            wait,
        });
        Ok(())
    }

    /// The first event in `from..=to` of `room` that is not `name`'s own (invariant verdicts
    /// are evidence, not acts: they hold no one at the gate).
    fn foreign_in(
        &mut self,
        room: &str,
        name: &str,
        from: u64,
        to: u64,
    ) -> Result<Option<Value>, Failure> {
        if to < from {
            return Ok(None);
        }
        let log = self
            .e()
            .room_log(&self.owner(), room, from, (to - from + 1) as usize)
            .map_err(|r| self.fail(r.to_string()))?;
        Ok(log["events"].as_array().and_then(|es| {
            es.iter()
                .find(|e| {
                    e["actor"].as_str() != Some(name)
                        && e["kind"] != "invariant_violation"
                        && reads(e, name)
                })
                .cloned()
        }))
    }

    /// An accepted gated turn: check that it did not land past an unconfirmed foreign event,
    /// apply the Fold Rule to the model, and record it as acknowledged (unless the process
    /// "dies" before the answer reaches the agent).
    fn record_turn(
        &mut self,
        i: usize,
        room: &str,
        v: &Value,
        call: Option<(Verb, TurnArgs)>,
    ) -> Result<(), Failure> {
        let room = room.to_string();
        let name = self.agents[i].name.clone();
        let seq = v["seq"].as_u64().unwrap_or(0);
        let event = v["event"].as_str().unwrap_or_default().to_string();
        for f in v["flags"].as_array().into_iter().flatten() {
            let k = format!("{} (flag)", f["invariant"].as_str().unwrap_or("?"));
            *self.report.invariants.entry(k).or_default() += 1;
        }
        // The agent acted at `seq`: every foreign event before it must have been confirmed.
        let confirmed = self.agents[i].confirmed.get(&room).copied().unwrap_or(0);
        if seq > confirmed + 1 {
            let log = self
                .e()
                .room_log(
                    &self.owner(),
                    &room,
                    confirmed + 1,
                    (seq - confirmed - 1) as usize,
                )
                .map_err(|r| self.fail(r.to_string()))?;
            if let Some(foreign) = log["events"].as_array().and_then(|es| {
                // invariant verdicts are evidence, not acts: they hold no one at the gate
                // nor does one withheld from the agent: it is never owed
                es.iter().find(|e| {
                    e["actor"].as_str() != Some(name.as_str())
                        && e["kind"] != "invariant_violation"
                        && reads(e, &name)
                })
            }) {
                let foreign = foreign["seq"].clone();
                // unless the view its checkpoint was stamped with came back, and that covers it
                let revived = match self.agents[i].revivable.get(&room).copied() {
                    Some(c) => self.foreign_in(&room, &name, c + 1, seq - 1)?.is_none(),
                    None => false,
                };
                if !revived {
                    return Err(self.fail(format!(
                        "{name} acted at seq {seq} in {room} past unconfirmed foreign event {foreign} (confirmed up to {confirmed})"
                    )));
                }
                self.note(format!(
                    "{name}'s checkpoint in {room} from a view that came back covers seq {seq}"
                ));
            }
        }
        let last = if v["obligations"].as_array().is_some_and(|o| !o.is_empty())
            || v["mentions"].as_array().is_some_and(|m| !m.is_empty())
        {
            seq + 1
        } else {
            seq
        };
        self.agents[i].confirmed.insert(room.clone(), last);
        self.agents[i].revivable.remove(&room);
        // Sometimes the process dies after the durable write but before the answer reaches the
        // agent: the event may exist, but it was never acknowledged.
        if self.cfg.faults && self.rng.chance(2) {
            self.note(format!("crash before the answer to {event} reached {name}"));
            self.crash_and_restart()?;
            if let Some((verb, args)) = call
                && args.idempotency_key.is_some()
            {
                return self.retry(i, &event, verb, args);
            }
            return Ok(());
        }
        // The Fold Rule is in the journal: an acknowledged turn moves its author's checkpoint,
        // where one was durably established for this conversation and view, up to the turn,
        // whatever crash follows (a read_through confirmation rides exactly this).
        if let Some(d) = self.agents[i].confirmed_durably.get_mut(&room) {
            *d = (*d).max(seq);
        }
        self.acked.entry(room).or_default().insert(event);
        Ok(())
    }

    fn mates(&self, i: usize, room: &str) -> Vec<String> {
        self.agents
            .iter()
            .filter(|a| a.name != self.agents[i].name && a.rooms.iter().any(|r| r == room))
            .map(|a| a.name.clone())
            .collect()
    }

    fn agent_index(&self, name: &str) -> Option<usize> {
        self.agents.iter().position(|a| a.name == name)
    }

    /// The agent never saw the answer and retries with the same key: the engine must refuse
    /// the repeat and name the event the first call wrote.
    fn retry(&mut self, i: usize, event: &str, verb: Verb, args: TurnArgs) -> Result<(), Failure> {
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        let out = self.checked(
            format!("{name} retries {verb} (first landed as {event})"),
            |e| e.turn(&c, verb, args),
        )?;
        match out {
            Err(r)
                if r.code == Code::InvariantViolation
                    && r.detail["invariant"] == "exactly_once"
                    && r.detail["original_event"] == event =>
            {
                Ok(())
            }
            Err(r) if r.code == Code::StorageFailed => Ok(()),
            other => Err(self.fail(format!(
                "a retry of {event} with its idempotency key was not refused as a repeat of it (the original event is gone after a crash, or exactly_once is broken): {:?}",
                other.map(|v| v["event"].clone()).map_err(|r| r.code)
            ))),
        }
    }

    fn task_flow(&mut self) -> Result<(), Failure> {
        let i = self.pick_agent();
        if self.agents[i].rooms.is_empty() {
            return Ok(());
        }
        let k = self.rng.below(100);
        // most task steps go to an agent that has something to claim or settle
        let pick = |sim: &mut Sim, has: &dyn Fn(&Agent) -> bool| -> usize {
            let holders: Vec<usize> = (0..sim.agents.len())
                .filter(|&j| has(&sim.agents[j]))
                .collect();
            if holders.is_empty() || sim.rng.chance(20) {
                i
            } else {
                holders[sim.rng.below(holders.len() as u64) as usize]
            }
        };
        if k < 35 {
            let j = pick(self, &|a: &Agent| !a.tasks.is_empty());
            if let Some((room, t)) = self.agents[j].tasks.pop() {
                return self.claim(j, &room, &t);
            }
        }
        if k < 65 {
            let j = pick(self, &|a: &Agent| !a.claimed.is_empty());
            // leave some claims open a while, so that leases overlap and TTLs run out
            if self.rng.chance(60)
                && let Some((room, t)) = self.agents[j].claimed.pop()
            {
                return self.settle(j, &room, &t);
            }
            // or its owner changes its terms under the claim
            if self.rng.chance(30)
                && let Some((room, t)) = self.agents[j].claimed.last().cloned()
            {
                return self.amend_or_supersede(i, Some((room, t)));
            }
            return Ok(());
        }
        if k < 75
            && let Some((r, ob)) = self.agents[i].raised.pop()
        {
            return self.circle(i, &r, &ob);
        }
        if k < 82 {
            return self.amend_or_supersede(i, None);
        }
        // tasks are created by coordinators (every fourth agent); now and then by a member, to
        // be refused for its tier
        let coordinators: Vec<usize> = (0..self.agents.len())
            .filter(|&j| j % 4 == 0 && !self.agents[j].rooms.is_empty())
            .collect();
        let creator = if coordinators.is_empty() || self.rng.chance(10) {
            i
        } else {
            coordinators[self.rng.below(coordinators.len() as u64) as usize]
        };
        self.create_task(creator)
    }

    fn claim(&mut self, i: usize, room: &str, t: &str) -> Result<(), Failure> {
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        // short TTLs, so that clock jumps leave some claims unresolved past them
        let ttl = self.rng.chance(40).then(|| 1_000 + self.rng.below(300_000));
        let out = self.checked(format!("{name} claim {t} ttl={ttl:?}"), |e| {
            e.task_claim(&c, t, ttl)
        })?;
        if out.is_ok() {
            self.agents[i].claimed.push((room.into(), t.into()));
        } else if self.rng.chance(50) {
            // try again later (a lease may be released by then)
            self.agents[i].tasks.push((room.into(), t.into()));
        }
        Ok(())
    }

    /// Settle a claimed task: sometimes an effect first, then done, blocked, decline or handoff.
    fn settle(&mut self, i: usize, room: &str, t: &str) -> Result<(), Failure> {
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        self.catch_up(i, room, 50)?;
        if self.rng.chance(30) {
            let args = TurnArgs {
                room: room.into(),
                task: Some(t.into()),
                text: Some(format!("working on {t}")),
                ..Default::default()
            };
            let out = self.checked(format!("{name} note --task {t}"), |e| {
                e.turn(&c, Verb::Note, args.clone())
            })?;
            if let Ok(v) = out {
                self.record_turn(i, room, &v, Some((Verb::Note, args)))?;
            }
            if self.crash_pending {
                return Ok(());
            }
            self.catch_up(i, room, 50)?;
        }
        let mates = self.mates(i, room);
        let k = self.rng.below(100);
        let (verb, to) = if k < 55 || mates.is_empty() {
            (Verb::Done, vec![])
        } else if k < 70 {
            (Verb::Blocked, vec![])
        } else if k < 82 {
            (Verb::Decline, vec![])
        } else {
            (
                Verb::Handoff,
                vec![mates[self.rng.below(mates.len() as u64) as usize].clone()],
            )
        };
        let args = TurnArgs {
            room: room.into(),
            task: Some(t.into()),
            text: Some(format!("{verb} {t}")),
            to: to.clone(),
            idempotency_key: self.maybe_key(),
            ..Default::default()
        };
        let out = self.checked(format!("{name} {verb} {t}"), |e| {
            e.turn(&c, verb, args.clone())
        })?;
        match out {
            Ok(v) => {
                match verb {
                    Verb::Handoff => {
                        if let Some(j) = self.agent_index(&to[0]) {
                            self.agents[j].tasks.push((room.into(), t.into()));
                        }
                    }
                    // a blocked task is resumed by claiming it again
                    Verb::Blocked => self.agents[i].tasks.push((room.into(), t.into())),
                    _ => {}
                }
                self.record_turn(i, room, &v, Some((verb, args)))
            }
            Err(r) => {
                let moved = matches!(
                    r.code,
                    Code::TaskAcceptanceChangedBeforeCompletion | Code::TaskAuthorityChanged
                );
                if moved {
                    // the terms moved under the claim: renew it before trying again
                    self.agents[i].tasks.push((room.into(), t.into()));
                } else if self.rng.chance(50) {
                    self.agents[i].claimed.push((room.into(), t.into()));
                }
                Ok(())
            }
        }
    }

    /// An owner changes a task's terms (a checked task loses its check or the reverse), or
    /// replaces one task with another (mostly refused: few pairs make a verified successor).
    /// `held`: a task someone holds now, so that the amendment lands between its claim and
    /// its done (which must not close on the old terms).
    fn amend_or_supersede(
        &mut self,
        i: usize,
        held: Option<(String, String)>,
    ) -> Result<(), Failure> {
        let (room, t) = match held {
            Some(h) => h,
            None => {
                if self.agents[i].rooms.is_empty() {
                    return Ok(());
                }
                let n = self.agents[i].rooms.len() as u64;
                let room = self.agents[i].rooms[self.rng.below(n) as usize].clone();
                let known = self.room_tasks.get(&room).cloned().unwrap_or_default();
                if known.is_empty() {
                    return Ok(());
                }
                let t = known[self.rng.below(known.len() as u64) as usize].clone();
                (room, t)
            }
        };
        let known = self.room_tasks.get(&room).cloned().unwrap_or_default();
        let view = self.e().task_view_owner(&self.owner(), &t).ok();
        let owner = view
            .as_ref()
            .and_then(|v| v["task"]["owner"].as_str().map(String::from));
        let i = match owner.and_then(|o| self.agent_index(&o)) {
            Some(j) if self.rng.chance(90) => j,
            _ => i,
        };
        let checked = view
            .as_ref()
            .and_then(|v| v["task"]["acceptance"].as_array().map(|a| !a.is_empty()))
            .unwrap_or(false);
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        let out = if self.rng.chance(75) {
            let accept = if checked {
                Vec::new()
            } else {
                vec![
                    serde_json::json!({"kind": "command", "program": SIM_CHECK, "timeout_ms": 1000}),
                ]
            };
            let a = room_engine::completion::AmendArgs {
                task: t.clone(),
                requirements: None,
                accept: Some(accept),
            };
            self.checked(format!("{name} task_amend {t}"), |e| e.task_amend(&c, a))?
        } else if self.rng.chance(70) {
            let next = known[self.rng.below(known.len() as u64) as usize].clone();
            self.checked(format!("{name} task_supersede {t} by {next}"), |e| {
                e.task_supersede(&c, &t, &next)
            })?
        } else {
            // or withdraws it: its lease and its holder's claim end with it
            self.checked(format!("{name} task_cancel {t}"), |e| {
                e.task_cancel(&c, &t, Some("withdrawn"))
            })?
        };
        if let Ok(v) = out {
            self.acked
                .entry(room)
                .or_default()
                .insert(v["event"].as_str().unwrap_or_default().to_string());
        }
        Ok(())
    }

    fn circle(&mut self, i: usize, r: &str, ob: &str) -> Result<(), Failure> {
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        self.catch_up(i, r, 50)?;
        let args = TurnArgs {
            room: r.into(),
            obligation: Some(ob.into()),
            text: Some("still waiting".into()),
            ..Default::default()
        };
        let out = self.checked(format!("{name} circle {ob}"), |e| {
            e.turn(&c, Verb::Circle, args.clone())
        })?;
        if let Ok(v) = out {
            return self.record_turn(i, r, &v, Some((Verb::Circle, args)));
        }
        Ok(())
    }

    fn maybe_key(&mut self) -> Option<String> {
        self.rng.chance(50).then(|| {
            self.keys += 1;
            format!("k-{}-{}", self.cfg.seed, self.keys)
        })
    }

    /// A task for the creator or a mate, sometimes under a parent and with overlapping scopes.
    fn create_task(&mut self, i: usize) -> Result<(), Failure> {
        let room = self.agents[i].rooms[self.rng.below(self.agents[i].rooms.len() as u64) as usize]
            .clone();
        let c = self.caller(i);
        let name = self.agents[i].name.clone();
        let mates = self.mates(i, &room);
        let to = if mates.is_empty() || self.rng.chance(60) {
            name.clone()
        } else {
            mates[self.rng.below(mates.len() as u64) as usize].clone()
        };
        const POOL: [&str; 5] = [
            "file:src",
            "file:src/a.rs",
            "file:src/b.rs",
            "file:docs/guide.md",
            "api:stripe",
        ];
        let scopes: Vec<String> = (0..self.rng.below(3).max(u64::from(self.rng.chance(60))))
            .map(|_| POOL[self.rng.below(POOL.len() as u64) as usize].to_string())
            .collect();
        let known = self.room_tasks.get(&room).cloned().unwrap_or_default();
        let parent = (!known.is_empty() && self.rng.chance(30))
            .then(|| known[self.rng.below(known.len() as u64) as usize].clone());
        // some tasks close only on a measured check, which the simulated runner passes or
        // fails by the seed: the oracle holds every done to a passing evaluation
        let accept = if self.rng.chance(40) {
            vec![serde_json::json!({"kind": "command", "program": SIM_CHECK, "timeout_ms": 1000})]
        } else {
            Vec::new()
        };
        let args = room_engine::verbs::TaskCreateArgs {
            room: room.clone(),
            title: format!("task at step {}", self.step),
            to: Some(to.clone()),
            parent,
            scopes,
            idempotency_key: self.maybe_key(),
            accept,
            ..Default::default()
        };
        let out = self.checked(format!("{name} task_create {room}"), |e| {
            e.task_create(&c, args)
        })?;
        if let Ok(v) = out {
            let t = v["task"]["id"].as_str().unwrap_or_default().to_string();
            self.acked
                .entry(room.clone())
                .or_default()
                .insert(v["event"].as_str().unwrap_or_default().to_string());
            self.room_tasks
                .entry(room.clone())
                .or_default()
                .push(t.clone());
            if let Some(j) = self.agent_index(&to) {
                self.agents[j].tasks.push((room, t));
            }
        }
        Ok(())
    }

    /// The `resolution` sweep. Remember when it last succeeded everywhere and each room's tip
    /// then: the oracle holds the engine to it.
    /// Dispatch revalidation: queued permits are checked again and refused ones dead-lettered.
    /// It decides about proposals only: no room's journal moves (their obligations stay open).
    fn dispatch(&mut self) -> Result<(), Failure> {
        let before = self.tips();
        match self.e().dispatch_sweep() {
            Ok(v) => {
                for d in v["dead"].as_array().into_iter().flatten() {
                    *self
                        .report
                        .refusals
                        .entry(format!(
                            "dead letter: {}",
                            d["code"].as_str().unwrap_or("?")
                        ))
                        .or_default() += 1;
                }
                self.note(format!("dispatch sweep: {v}"));
                if self.tips() != before {
                    return Err(self.fail("a dispatch sweep moved a room's journal"));
                }
                Ok(())
            }
            Err(r)
                if r.code == Code::StorageFailed
                    && (self.faults.fired() || self.cfg.broken.is_some()) =>
            {
                self.note(format!("dispatch sweep -> {} (injected)", r.code));
                self.crash_pending = true;
                Ok(())
            }
            Err(r) => Err(self.fail(format!("dispatch sweep failed: {r}"))),
        }
    }

    fn sweep(&mut self) -> Result<(), Failure> {
        let before = self.tips();
        let now = self.clock.0.load(std::sync::atomic::Ordering::SeqCst);
        match self.e().sweep_invariants() {
            Ok(n) => {
                self.note(format!("sweep at {now}: {n} lapses recorded"));
                if n > 0 {
                    *self
                        .report
                        .invariants
                        .entry("resolution (in_doubt)".into())
                        .or_default() += n;
                }
                let tips: BTreeMap<String, u64> =
                    self.rooms.iter().cloned().zip(self.tips()).collect();
                self.last_sweep = Some((now, tips));
                self.swept_at = Some(now);
                Ok(())
            }
            Err(r)
                if r.code == Code::StorageFailed
                    && (self.faults.fired() || self.cfg.broken.is_some()) =>
            {
                self.note(format!("sweep -> {} (injected)", r.code));
                self.crash_pending = true;
                let _ = before;
                Ok(())
            }
            Err(r) => Err(self.fail(format!("sweep failed: {r}"))),
        }
    }

    fn owner_rotate(&mut self) -> Result<(), Failure> {
        let i = self.pick_agent();
        let name = self.agents[i].name.clone();
        let out = self.checked(format!("owner rotate {name}"), |e| {
            e.rotate(&sim_owner(e), &name)
        })?;
        self.agents[i].control_doubt = matches!(&out, Err(r) if r.code == Code::StorageFailed);
        if let Ok(en) = out {
            self.agents[i].token = en.token;
            self.agents[i].revoked = false;
            // a new registration is a new conversation key: nothing is confirmed for it
            self.agents[i].confirmed.clear();
            self.agents[i].confirmed_durably.clear();
            self.agents[i].revivable.clear();
            self.agents[i].receipt.clear();
        }
        Ok(())
    }

    fn owner_revoke(&mut self) -> Result<(), Failure> {
        let i = self.pick_agent();
        let name = self.agents[i].name.clone();
        let out = self.checked(format!("owner revoke {name}"), |e| {
            e.revoke(&sim_owner(e), &name)
        })?;
        self.agents[i].control_doubt = matches!(&out, Err(r) if r.code == Code::StorageFailed);
        if out.is_ok() {
            self.agents[i].revoked = true;
            // its next call must be refused
            let c = self.caller(i);
            let out = self.checked(format!("{name} whoami after revoke"), |e| e.whoami(&c))?;
            match out {
                Err(r) if r.code == Code::CredentialRevoked => {}
                other => {
                    return Err(self.fail(format!("revoked {name} was not refused: {other:?}")));
                }
            }
        }
        Ok(())
    }

    fn owner_reset(&mut self) -> Result<(), Failure> {
        let room = self.rooms[self.rng.below(self.rooms.len() as u64) as usize].clone();
        if self
            .checked(format!("owner reset {room}"), |e| {
                e.room_reset(&sim_owner(e).control(), &room)
            })?
            .is_ok()
        {
            for a in &mut self.agents {
                a.confirmed.remove(&room);
                a.confirmed_durably.remove(&room);
                // a reset never comes back: no checkpoint of an earlier view is honoured again
                a.revivable.remove(&room);
                a.receipt.remove(&room);
            }
        }
        Ok(())
    }

    /// The owner creates a room mid-run, so that faults and crashes strike creations: a room
    /// is whole (binding, manifest, journal with its first record, control row) or absent, and
    /// one whose creation was acknowledged survives every restart.
    fn owner_create_room(&mut self) -> Result<(), Failure> {
        let room = format!("n{}", self.created);
        self.created += 1;
        let size = 2 + self.rng.below(3) as usize;
        let mut members = BTreeSet::new();
        while members.len() < size.min(self.agents.len()) {
            members.insert(self.rng.below(self.agents.len() as u64) as usize);
        }
        let names: Vec<String> = members
            .iter()
            .map(|i| self.agents[*i].name.clone())
            .collect();
        let out = self.checked(format!("owner create {room}"), |e| {
            e.room_create(&sim_owner(e), &room, None, &names)
        })?;
        if out.is_ok() {
            for i in members {
                self.agents[i].rooms.push(room.clone());
            }
            self.rooms.push(room.clone());
            let state = self.e().state().clone();
            let graph = room_engine::room::graph_id(&state.instance_id, &room);
            self.oracles.push(oracle::RoomOracle::new(
                &room,
                &graph,
                state.shard(&graph).journal(),
            ));
            self.oracles.sort_by(|a, b| a.path_cmp(b));
        }
        Ok(())
    }

    /// The owner archives a room: from then on it refuses writes, across restarts.
    fn owner_archive_room(&mut self) -> Result<(), Failure> {
        let k = self.rng.below(self.rooms.len() as u64) as usize;
        let room = self.rooms[k].clone();
        let out = self.checked(format!("owner archive {room}"), |e| {
            e.room_archive(&sim_owner(e), &room)
        })?;
        if out.is_ok() {
            self.rooms.remove(k);
            for a in &mut self.agents {
                a.rooms.retain(|r| *r != room);
            }
            self.archived.push(room);
        }
        Ok(())
    }

    /// Every archived room is still archived and refuses writes.
    fn check_archived(&mut self) -> Result<(), Failure> {
        for room in self.archived.clone() {
            let out = self.e().room_reset(&self.owner().control(), &room);
            match out {
                Err(r) if r.code == Code::RoomArchived => {}
                other => {
                    return Err(self.fail(format!(
                        "archived room {room} answered a write with {:?} after a restart",
                        other.map(|_| "ok").map_err(|r| r.code)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Crash: pending index rows are lost and each journal keeps its synced bytes plus a random
    /// part of what was written but not synced (a torn tail). Then restart and check.
    fn crash_and_restart(&mut self) -> Result<(), Failure> {
        self.crash_pending = false;
        // a fault armed but not struck dies with the process; recovery runs unfaulted
        *self.faults.next.lock().expect("fault lock") = None;
        self.faults
            .fired
            .store(false, std::sync::atomic::Ordering::SeqCst);
        self.report.crashes += 1;
        let engine = self.engine.take().expect("an engine to crash");
        self.disk.crash();
        let crash = engine.crash_for_simulation();
        let rng = &mut self.rng;
        let notes = self
            .disk
            .restart(&mut |n| rng.below(n))
            .map_err(|e| self.fail(format!("restarting the simulated disk: {e}")))?;
        for n in notes {
            self.note(n);
        }
        for (path, synced, len) in crash.journals {
            if len > synced {
                self.crash_journal(&path, synced, len)?;
            }
        }
        self.note("restart".into());
        self.open_engine().map_err(|e| self.fail(e))?;
        self.check_durable()?;
        self.check_archived()?;
        self.reset_oracles()
    }

    /// What a crash leaves of a journal's unsynced bytes `[synced, len)`: either a prefix of them
    /// (the file cut anywhere in the range), or any subset of their 512-byte sectors, each written
    /// whole or not at all, in no order, since the disk may persist unsynced writes in any order.
    /// A sector that was not written reads as the zeros the journal preallocated there.
    fn crash_journal(&mut self, path: &Path, synced: u64, len: u64) -> Result<(), Failure> {
        use disk::SECTOR_BYTES;
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| self.fail(e.to_string()))?;
        // Past the last byte written lie the preallocated zeros: nothing there to lose.
        let mut bytes = vec![0u8; (len - synced) as usize];
        f.read_exact_at(&mut bytes, synced)
            .map_err(|e| self.fail(e.to_string()))?;
        let written = synced
            + bytes
                .iter()
                .rposition(|b| *b != 0)
                .map_or(0, |i| i as u64 + 1);
        if written == synced || self.rng.chance(30) {
            let keep = synced + self.rng.below(len - synced + 1);
            f.set_len(keep).map_err(|e| self.fail(e.to_string()))?;
            self.report.journals_cut += u64::from(written > synced);
            self.note(format!(
                "crash: {} keeps {keep} of {len} bytes ({synced} synced, {written} written)",
                path.display()
            ));
            return Ok(());
        }
        let mut lost = vec![];
        let mut out_of_order = false;
        let mut at = synced;
        while at < written {
            let sector_end = (at / SECTOR_BYTES + 1) * SECTOR_BYTES;
            let end = sector_end.min(written);
            if self.rng.chance(50) {
                f.write_all_at(&vec![0u8; (end - at) as usize], at)
                    .map_err(|e| self.fail(e.to_string()))?;
                lost.push(at);
            } else if !lost.is_empty() {
                out_of_order = true;
            }
            at = end;
        }
        self.report.journals_sectored += 1;
        self.report.journals_out_of_order += u64::from(out_of_order);
        self.note(format!(
            "crash: {} loses unsynced sectors at {lost:?} of [{synced}, {written})",
            path.display()
        ));
        Ok(())
    }

    /// Every acknowledged event is present, every chain verifies, and every acknowledged
    /// rotation, revocation and confirmation holds.
    fn check_durable(&mut self) -> Result<(), Failure> {
        self.check_confirmations()?;
        for i in 0..self.agents.len() {
            if self.agents[i].control_doubt {
                continue;
            }
            let c = self.caller(i);
            let out = self.e().whoami(&c);
            let a = &self.agents[i];
            match (a.revoked, &out) {
                (true, Err(r)) if r.code == Code::CredentialRevoked => {}
                (false, Ok(_)) => {}
                _ => {
                    return Err(self.fail(format!(
                        "after a restart {} (revoked: {}) is answered {:?}: an acknowledged registration, rotation or revocation was lost",
                        a.name,
                        a.revoked,
                        out.map(|_| "ok").map_err(|r| r.code)
                    )));
                }
            }
        }
        for room in self.rooms.clone() {
            let view = self
                .e()
                .rooms_view(&self.owner())
                .map_err(|r| self.fail(r.to_string()))?;
            let ro = view["rooms"]
                .as_array()
                .and_then(|rs| rs.iter().find(|r| r["room"] == room.as_str()))
                .map(|r| r["read_only"].clone())
                .unwrap_or(Value::Null);
            if !ro.is_null() {
                return Err(self.fail(format!("room {room} is read-only after restart: {ro}")));
            }
            let mut present = BTreeSet::new();
            let mut from = 1;
            loop {
                let log = self
                    .e()
                    .room_log(&self.owner(), &room, from, 1000)
                    .map_err(|r| self.fail(r.to_string()))?;
                let events = log["events"].as_array().cloned().unwrap_or_default();
                for e in &events {
                    present.insert(e["id"].as_str().unwrap_or_default().to_string());
                }
                if events.len() < 1000 {
                    break;
                }
                from += 1000;
            }
            if let Some(lost) = self
                .acked
                .get(&room)
                .and_then(|a| a.iter().find(|id| !present.contains(*id)))
            {
                return Err(self.fail(format!(
                    "acknowledged event {lost} of room {room} is gone after a crash"
                )));
            }
        }
        for r in self.rooms_on_disk()? {
            if let Err(e) = room_store::journal::verify(&r.shard.journal(), &r.graph) {
                return Err(self.fail(format!("chain of {} does not verify: {e}", r.graph)));
            }
            self.check_invariants(&r)?;
        }
        Ok(())
    }

    /// Each checkpoint an acknowledged confirmation established is still there (a sync without
    /// a confirmation reports it).
    fn check_confirmations(&mut self) -> Result<(), Failure> {
        for i in 0..self.agents.len() {
            let a = &self.agents[i];
            if a.revoked || a.control_doubt {
                continue;
            }
            let c = self.caller(i);
            for (room, floor) in a.confirmed_durably.clone() {
                let Ok(page) = self.e().sync(&c, &room, None) else {
                    continue;
                };
                let now = page["confirmed_seq"].as_u64().unwrap_or(0);
                if page["view_changed"] != true && now < floor {
                    return Err(self.fail(format!(
                        "after a restart {} stands at {now} in {room}, below the {floor} its acknowledged confirmation established",
                        self.agents[i].name
                    )));
                }
            }
        }
        Ok(())
    }

    /// Every room shard in the state dir, with the room its manifest names.
    fn rooms_on_disk(&self) -> Result<Vec<RoomDir>, Failure> {
        let rooms = self.state.join("rooms");
        let shards = room_store::shard::on_disk(&rooms).map_err(|e| self.fail(e.to_string()))?;
        let named = std::fs::read_dir(&rooms)
            .map_err(|e| self.fail(e.to_string()))?
            .count();
        if named != shards.len() {
            return Err(self.fail(format!(
                "{} of {named} room shards have no readable manifest",
                named - shards.len()
            )));
        }
        Ok(shards
            .into_iter()
            .map(|(shard, m)| RoomDir {
                shard,
                graph: m.graph_id,
                room: m.room,
            })
            .collect())
    }

    /// Replay one journal through the independent oracle.
    fn check_invariants(&self, r: &RoomDir) -> Result<(), Failure> {
        let (shard, graph, room) = (&r.shard, r.graph.as_str(), &r.room);
        let file = std::fs::File::open(shard.journal()).map_err(|e| self.fail(e.to_string()))?;
        let mut records = Vec::new();
        room_store::journal::scan(&file, 0, room_core::chain::ChainTip::genesis(graph), |sc| {
            records.push(sc.record);
            Ok(())
        })
        .map_err(|e| self.fail(format!("{graph}: {e}")))?;
        let sweep = self
            .last_sweep
            .as_ref()
            .map(|(now_ms, tips)| oracle::Sweep {
                now_ms: *now_ms,
                tips: tips.clone(),
            });
        oracle::check_room(room, &records, sweep.as_ref()).map_err(|e| self.fail(e))?;
        // every wake permit the journal implies is queued, whole and sealed
        let queued: std::collections::BTreeSet<String> = self
            .e()
            .wakes_view(&self.owner(), Some(room))
            .map_err(|r| self.fail(format!("room {room}: listing its wake queue: {r}")))?["wakes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|w| w["intact"] == true)
            .filter_map(|w| w["path"].as_str().map(str::to_string))
            .collect();
        for r in &records {
            if r.event["kind"] != "items" {
                continue;
            }
            let source = r.event["source"].as_str().unwrap_or_default();
            for agent in r.event["wakes"].as_array().into_iter().flatten() {
                let agent = agent.as_str().unwrap_or_default();
                let path = room_core::wake::wake_path(room, agent, source);
                if !queued.contains(&path) {
                    return Err(self.fail(format!(
                        "room {room}: the wake permit {path} implied by record {} is missing or damaged after a restart",
                        r.seq
                    )));
                }
            }
        }
        // a durable record never names a missing or damaged blob
        use room_store::BlobStore;
        let blobs = room_store::blobs::Blobs::new(shard.blobs());
        for r in &records {
            if let Some(sha) = r.event["text_blob"]["sha256"].as_str()
                && let Err(e) = blobs.get(sha, "txt")
            {
                return Err(self.fail(format!(
                    "room {room}: record {} names blob {sha}, which does not read back: {e}",
                    r.seq
                )));
            }
        }
        Ok(())
    }
}

/// Whether `reader` reads the logged record `e` (an audience, when it names one, includes it).
fn reads(e: &Value, reader: &str) -> bool {
    e["event"]["audience"]
        .as_array()
        .is_none_or(|a| a.is_empty() || a.iter().any(|n| n == reader))
}

/// One room shard on disk.
struct RoomDir {
    shard: room_store::shard::Shard,
    graph: String,
    room: String,
}

pub(crate) fn sim_owner(e: &Engine) -> room_engine::Owner {
    e.owner(&room_engine::Caller::Local(
        room_engine::Evidence::UnixPeer {
            uid: e.config().owner_uid,
            pid: std::process::id(),
        },
    ))
    .expect("the simulator is the owner")
}

/// Run one seed.
pub fn run(cfg: SimConfig) -> Result<Report, Failure> {
    Sim::new(cfg).run()
}
