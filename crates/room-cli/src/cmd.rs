//! Command-line grammar and its mapping onto daemon requests.

use clap::{Args, Parser, Subcommand};
use room_server::ServerError;
use room_server::client::Client;
use room_server::wire::{
    ComposeArgs, EvidenceArgs, OpArgs, OpBeginArgs, ProjectSourceArgs, Request, SourceReadArgs,
    SyncArgs, TaskAmendArgs, TaskCancelArgs, TaskClaimArgs, TaskCreateArgs, TaskOverrideArgs,
    TaskProposeArgs, TaskSupersedeArgs, TurnWire, WakeTakeArgs,
};
use room_store::StoreError;
use room_store::statedir;
use serde_json::{Value, json};
use std::path::PathBuf;

pub const EXIT_REFUSED: i32 = 1;
pub const EXIT_IO: i32 = 3;
pub const EXIT_STATE: i32 = 4;

/// The exit status for an error of the server library, chosen by its case: a refusal is 1; a
/// state directory that is a split brain or already served is 4; anything else (no daemon, a
/// broken connection, I/O) is 3.
pub fn exit_code(e: &ServerError) -> i32 {
    match e {
        ServerError::Refused(_) => EXIT_REFUSED,
        ServerError::State(
            StoreError::SplitBrain(_)
            | StoreError::Locked { .. }
            | StoreError::Migrated(_)
            | StoreError::OtherInstance(_)
            | StoreError::Fenced(_)
            | StoreError::RestorePending(_),
        ) => EXIT_STATE,
        ServerError::DaemonUnreachable { .. }
        | ServerError::Connection(_)
        | ServerError::Protocol(_)
        | ServerError::State(_)
        | ServerError::EngineOpen(_)
        | ServerError::ListenNotLoopback(_)
        | ServerError::Bind { .. }
        | ServerError::Io(_)
        | ServerError::Mcp(_)
        | ServerError::Daemon(_) => EXIT_IO,
    }
}

#[derive(Parser, Debug)]
#[command(
    name = "room",
    version,
    about = "Room: the coordination plane for AI agents"
)]
pub struct Cli {
    /// State directory (default $XDG_DATA_HOME/room).
    #[arg(long, global = true, env = "ROOM_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Print machine-readable JSON.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Create the state directory and register it in the machine bootstrap.
    Init {
        /// A PostgreSQL database to serve (`postgres://…`): the state dir takes the Room
        /// instance the database belongs to, and its config.toml names the database, so
        /// another host serves the same Room.
        #[arg(long)]
        store: Option<String>,
    },
    /// Room's scripted agent, as the `script` adapter launches it for a wake (the prompt on
    /// stdin, ROOM_TOKEN and ROOM_SOCKET in the environment).
    #[command(hide = true)]
    AgentScript {
        #[arg(long, default_value = "read,reply")]
        steps: String,
    },
    /// Room's scripted ACP agent, as an `acp` route may run it (for `room prove` and for trying
    /// the adapter without a model): ACP on stdin and stdout, every prompt answered one way
    /// (reply: read and reply through ROOM_SOCKET; silent; wrong_body; hang).
    #[command(hide = true)]
    AgentAcp {
        #[arg(long, default_value = "reply")]
        mode: String,
    },
    /// The daemon API as lines, for scripts and workers: each JSON request read on stdin is
    /// sent to the daemon (ROOM_SOCKET when set, else the state dir's socket) and its response
    /// printed on stdout, one line each.
    Api,
    /// Run the daemon.
    Serve {
        /// Also listen for HTTP on this loopback address (for example 127.0.0.1:7878).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Threads that run engine calls (default: 4 per core); more for a disk with slow fsyncs.
        #[arg(long, value_parser = clap::value_parser!(u16).range(1..=512))]
        engine_threads: Option<u16>,
        /// Where Room keeps its state: a PostgreSQL url (postgres://user@host:port/db), or,
        /// without one (nor `[store] url` in config.toml), the state dir's embedded store.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// The stdio MCP server for agent hosts (needs ROOM_TOKEN; starts a daemon if none runs).
    Mcp {
        /// `full`: every tool; `compact`: only room_sync and the multiplexer `room`.
        #[arg(long, default_value = "full")]
        tools: String,
    },
    /// Enroll (or rotate) an agent and print the MCP configuration for its host.
    Connect {
        #[arg(value_enum)]
        host: crate::connect::Host,
        agent: String,
        #[arg(long)]
        max_tier: Option<String>,
    },
    /// Print a one-time login link to the dashboard (the daemon's page on its HTTP listener);
    /// the link works once, within two minutes, and sets a session cookie in that browser.
    Dashboard,
    /// Play a short scene on a throw-away state dir that shows the Work Gate at work;
    /// `room demo collab` runs a collaboration end to end instead.
    Demo {
        #[arg(value_parser = ["collab"])]
        scene: Option<String>,
    },
    /// Measure throughput and latency against raw SQLite commits on the same disk.
    Bench(crate::bench::BenchArgs),
    /// Exercise the seed's bounded claims (04-C01 … 04-C12; all when none is named) on a
    /// scratch state dir with a real daemon, and print the card: what was exercised, the
    /// evidence, each claim's ceiling and what was not exercised here. Exit 0 only when every
    /// claim asked for passed.
    Prove {
        /// Claims to run: 04-C05, C05 or 5.
        claims: Vec<String>,
    },
    /// Copy a state dir's embedded store into an empty PostgreSQL database, verifying every
    /// chain on the way; run it again to resume one that was interrupted (the daemon must be
    /// stopped).
    Migrate {
        /// The state dir to copy (default: the state dir in use).
        #[arg(long, value_name = "DIR")]
        from: Option<PathBuf>,
        /// The empty database to fill: postgres://user@host:port/db.
        #[arg(long, value_name = "URL")]
        to: String,
    },
    /// Copy the state dir into DIR with every file's digest and every chain's tip recorded
    /// (the daemon must be stopped); a symbolic or hard link in the tree is refused.
    Snapshot {
        /// A new or empty directory outside the state dir.
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
    /// Put a snapshot back as the state dir it was taken of (the daemon must be stopped): the
    /// snapshot is checked whole and staged, the current tree kept aside, then promoted; an
    /// interrupted restore blocks the daemon until the same command runs again.
    Restore {
        /// The snapshot's directory (made by `room snapshot`).
        snapshot: PathBuf,
    },
    /// Verify every room's hash chain (works without the daemon).
    Verify {
        room: Option<String>,
        /// Say on stderr which room is being verified (the default when stderr is a terminal).
        #[arg(long)]
        progress: bool,
        /// The PostgreSQL store to verify (default: config.toml's `[store] url`, else the
        /// state dir's embedded store).
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// Check what Room needs of this machine and of the state dir, each with what to do about
    /// it; exits 1 when something required is missing (works without the daemon).
    Doctor,
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff), generated from the same grammar as `--help`.
    Man,
    /// Collaborative sessions: check a pack offline, start one, follow it, decide its approvals.
    #[command(subcommand)]
    Collab(crate::collab::CollabCmd),
    /// Manage agents (owner).
    #[command(subcommand)]
    Agent(AgentCmd),
    /// Manage project grants (owner).
    #[command(subcommand)]
    Project(ProjectCmd),
    /// Create a room (owner).
    Create {
        name: String,
        #[arg(long)]
        project: Option<String>,
        #[arg(long = "member")]
        members: Vec<String>,
    },
    /// List rooms (the owner sees all; an agent its own).
    List,
    /// Room membership (owner).
    #[command(subcommand)]
    Members(MembersCmd),
    /// Reset a room's view: every agent must sync again (owner or operator).
    Reset { room: String },
    /// Cancel a room: stop its dispatcher and running workers, dead-letter its queued wakes,
    /// hold what a destination may have accepted (owner or operator agent).
    Cancel {
        room: String,
        /// Who you act for, recorded with the cancel (it grants nothing).
        #[arg(long)]
        by: Option<String>,
    },
    /// Let a cancelled room dispatch again (owner or operator agent).
    Resume { room: String },
    /// List what a cancel held, or resolve one held item with evidence (owner or operator).
    Reconcile {
        room: String,
        /// The hold to resolve (hld_…).
        #[arg(long, requires_all = ["outcome", "evidence"])]
        hold: Option<String>,
        /// accepted, not_accepted or compensated.
        #[arg(long, requires = "hold")]
        outcome: Option<String>,
        /// What shows it (a destination's record, a ticket, a log line).
        #[arg(long, requires = "hold")]
        evidence: Option<String>,
    },
    /// Stop every worker and dispatch nothing anywhere, or release that (owner or operator).
    BreakGlass {
        #[arg(long)]
        release: bool,
    },
    /// The stop outbox: every worker stop, its two phases and whether each was committed.
    Stops,
    /// A governed task's governing source.
    #[command(subcommand)]
    Source(SourceCmd),
    /// Read several rooms together in causal order (as an agent; read only; several rooms
    /// need the owner's grant, `room composition grant`).
    Compose(ComposeArgs),
    /// The owner's grants to read several rooms composed.
    #[command(subcommand)]
    Composition(CompositionCmd),
    /// Close or open a room's admission: while closed no agent writes to it (owner).
    Admission {
        room: String,
        #[arg(long, conflicts_with = "close", required_unless_present = "close")]
        open: bool,
        #[arg(long)]
        close: bool,
    },
    /// Archive a room: read-only from now on, its journal kept and verifiable (owner).
    Archive { room: String },
    /// Show a room's events, unredacted (owner).
    Log {
        room: String,
        #[arg(long, default_value_t = 1)]
        from: u64,
        #[arg(long, default_value_t = 200)]
        limit: usize,
    },
    /// `room audit TASK`: one assignment proved (its readiness map, its wake permits replayed
    /// against today's authority, its checks measured again, its deliveries' proofs, what is
    /// held) with a verdict; writes nothing. `room audit ROOM EVENT`: every causal ancestor
    /// of an event (owner).
    Audit {
        /// A task id (tsk_…), or a room followed by an event id.
        target: String,
        event: Option<String>,
        /// Also write the task's audit as one self-contained HTML file (no script, nothing
        /// fetched).
        #[arg(long, value_name = "FILE")]
        html: Option<PathBuf>,
    },
    /// The sync index (owner).
    #[command(subcommand)]
    Index(IndexCmd),
    /// The sealed wake queue (owner).
    #[command(subcommand)]
    Wakes(WakesCmd),
    /// Which adapter delivers an agent's wakes: config.toml's routes, edited in place (owner).
    #[command(subcommand)]
    Route(RouteCmd),
    /// The native sessions adapters opened or loaded for launches (owner).
    #[command(subcommand)]
    Sessions(SessionsCmd),
    /// What each adapter can do and prove (owner).
    #[command(subcommand)]
    Adapters(AdaptersCmd),
    /// Tasks.
    #[command(subcommand)]
    Task(TaskCmd),
    /// The destination ledger: external operations of a task you hold.
    #[command(subcommand)]
    Op(OpCmd),
    /// Evidence handles.
    #[command(subcommand)]
    Evidence(EvidenceCmd),
    /// Find events of a room by the words they say (or, --mode semantic, by what they mean),
    /// best first: as an agent (ROOM_TOKEN) only what it may read; as the owner, everything.
    /// Confirms nothing.
    Search {
        room: String,
        query: String,
        #[arg(long)]
        cursor: Option<u64>,
        #[arg(long)]
        limit: Option<usize>,
        /// `text` (every word must appear) or `semantic` (ranked by meaning through the
        /// embeddings endpoint of config.toml's [search.embeddings]).
        #[arg(long, value_parser = ["text", "semantic"])]
        mode: Option<String>,
    },
    /// Who the current ROOM_TOKEN acts as.
    Whoami,
    /// Take your oldest queued wake in this conversation (an agent without a route); answer it
    /// with reply from the same ROOM_CONVERSATION.
    Take(WakeTakeArgs),
    /// Read the next page of a room; --confirm a receipt to advance your checkpoint.
    Sync(SyncArgs),
    /// Status telemetry; never wakes, may not @mention.
    Note(TurnWire),
    /// A conversational turn (wakes only in coordination rooms).
    Say(TurnWire),
    /// Answer a mention or obligation addressed to you.
    Reply {
        room: String,
        reply_to: String,
        text: String,
        #[command(flatten)]
        common: Common,
    },
    /// Assign work: creates obligations and one sealed wake per recipient.
    Send(TurnWire),
    /// Move a task to another agent (no lease moves; a fresh claim is required).
    Handoff(TurnWire),
    /// Finish a task you hold.
    Done(TurnWire),
    /// Mark your task blocked; its owner gets an obligation.
    Blocked(TurnWire),
    /// Refuse a task addressed to you.
    Decline(TurnWire),
    /// Re-raise your own unresolved obligation to its addressee, under its original deadline.
    Circle {
        room: String,
        #[arg(long)]
        obligation: String,
        text: Option<String>,
        #[command(flatten)]
        common: Common,
    },
    /// Run the raw `room` multiplexer with a JSON argument object (the MCP route).
    Multiplex { args: String },
}

#[derive(Args, Debug, Clone, Default)]
pub struct Common {
    /// Evidence handles (event ids of this room).
    #[arg(long)]
    pub evidence: Vec<String>,
    /// Explicit causal parents (event ids of this room).
    #[arg(long)]
    pub parent: Vec<String>,
    /// Self-identification; must be the caller.
    #[arg(long = "as")]
    pub actor: Option<String>,
    /// A key that makes a retry safe: a repeat in the same room is refused as exactly_once.
    #[arg(long)]
    pub idempotency_key: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum AgentCmd {
    /// Enroll an agent; prints its token once.
    Enroll {
        name: String,
        #[arg(long)]
        max_tier: Option<String>,
        #[arg(long)]
        host: Option<String>,
    },
    /// Mint a node of the delegated identity tree: under --parent (or a root), holding
    /// exactly the --scope list given (session:read, session:dispatch, artifact:read:<kind>,
    /// artifact:write:<kind>, project:read, project:write, tools:execute); prints its token once.
    Delegate {
        name: String,
        #[arg(long)]
        parent: Option<String>,
        #[arg(long = "scope", value_name = "SCOPE")]
        scopes: Vec<String>,
        #[arg(long)]
        max_tier: Option<String>,
    },
    /// Issue a new token; the old one stops working at once.
    Rotate {
        name: String,
    },
    /// Revoke the agent's credential.
    Revoke {
        name: String,
    },
    /// Deny or allow verbs, or change the max tier.
    Policy {
        name: String,
        #[arg(long)]
        deny: Vec<String>,
        #[arg(long)]
        allow: Vec<String>,
        #[arg(long)]
        max_tier: Option<String>,
    },
    List,
}

#[derive(Subcommand, Debug)]
pub enum ProjectCmd {
    /// Grant a directory as a project.
    Open {
        path: PathBuf,
        #[arg(long)]
        name: Option<String>,
    },
    List,
    /// Set a project's governing source: its parts, text files of the project (none clears it).
    Source(ProjectSourceArgs),
}

#[derive(Subcommand, Debug)]
pub enum MembersCmd {
    Add { room: String, agent: String },
}

#[derive(Subcommand, Debug)]
pub enum IndexCmd {
    /// Rebuild the projection from the journal; receipts and checkpoints survive.
    Rebuild {
        room: String,
        /// Write over acknowledged records the journal lost (what follows a damaged record is
        /// kept beside the journal and cut), recording the loss in the journal itself.
        #[arg(long)]
        accept_loss: bool,
        /// Say on stderr what is rebuilt and, every two seconds, how long it has taken (the
        /// default on a terminal).
        #[arg(long)]
        progress: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum WakesCmd {
    /// The queue: each permit, checked against its digest, with its dispatch state.
    List { room: Option<String> },
    /// One permit in full, by the path `list` prints (`wakes/<room>/<agent>/<event>.json`).
    Show { wake: String },
    /// Revalidate queued permits now (the daemon does it every second): dead-letter refused ones.
    Check,
    /// A room's open obligations with their fold (`pending`, or `dead_obligation` once past
    /// their wake deadline unanswered) and the circular waits among them.
    Obligations { room: String },
}

#[derive(Subcommand, Debug)]
pub enum RouteCmd {
    /// Route an agent's wakes (writes `[routes.AGENT]`, replacing it; the rest of config.toml
    /// is kept as written, and a change that would not load is not written).
    Set {
        agent: String,
        #[command(flatten)]
        route: Box<RouteArgs>,
    },
    /// Remove an agent's route: its wakes stay queued for its own session.
    Remove { agent: String },
    /// The routes config.toml gives.
    List,
}

/// A route's fields, as config.toml spells them (see docs/guide.md, routes).
#[derive(Args, Debug, serde::Serialize)]
pub struct RouteArgs {
    /// command, acp, script, openai or anthropic.
    #[arg(long)]
    adapter: String,
    /// The program, then each argument: one per flag (command and acp).
    #[arg(long = "command", allow_hyphen_values = true)]
    command: Vec<String>,
    /// script: the steps, comma-separated (read, reply, exit, fail, hang).
    #[arg(long, value_delimiter = ',')]
    steps: Vec<String>,
    /// acp: claude, codex or gemini.
    #[arg(long)]
    preset: Option<String>,
    /// acp: reject or allow_once.
    #[arg(long)]
    permissions: Option<String>,
    /// acp: new or never.
    #[arg(long)]
    spawn_policy: Option<String>,
    #[arg(long)]
    base_url: Option<String>,
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    api_key_env: Option<String>,
    #[arg(long)]
    rounds_max: Option<u32>,
    #[arg(long)]
    max_tokens: Option<u32>,
    /// A daemon environment variable the worker gets: one per flag.
    #[arg(long = "env")]
    env: Vec<String>,
    #[arg(long)]
    cwd: Option<String>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// none or host.
    #[arg(long)]
    network: Option<String>,
    /// read_only or writable.
    #[arg(long)]
    project: Option<String>,
    /// Another program that may reach the launch's broker: one per flag.
    #[arg(long = "broker-program")]
    broker_programs: Vec<String>,
    /// A label its sessions carry: one per flag.
    #[arg(long = "tag")]
    tags: Vec<String>,
    /// The model route its workers draw on (a name of [dispatch.model_routes], whose bound
    /// every route naming it shares).
    #[arg(long)]
    model_route: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum SessionsCmd {
    /// Sessions newest first: global id, agent, transport, proof cursor, lease, binding.
    List {
        #[arg(long)]
        agent: Option<String>,
    },
    /// One session by its global id (`sf_<host>_<native>`).
    Show { id: String },
    /// The sessions an ACP agent keeps, asked of the agent itself (`session/list`), each
    /// beside Room's record of it. Runs the route's program in an owned job, asks it nothing
    /// else, and stops it.
    Native { agent: String },
}

#[derive(Subcommand, Debug)]
pub enum AdaptersCmd {
    /// Each adapter's coverage of the session factory's eleven operations and of the proof
    /// ladder, and its capability matrix.
    List,
    /// Check each adapter's declared capability matrix against a real process or server
    /// (offline, in a scratch directory): exit 1 on drift.
    Probe {
        /// One adapter (acp, openai, anthropic, script, command); default: all.
        adapter: Option<String>,
        /// What to check instead of Room's matrix, as KEY=VALUE (tool_deny=hard, …).
        #[arg(long = "declare", value_name = "KEY=VALUE")]
        declare: Vec<String>,
        /// The ACP agent to probe, absolute paths (it runs in a scratch directory; default:
        /// config.toml's [backends.acp] command).
        #[arg(last = true, value_name = "PROGRAM ARGS")]
        command: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum EvidenceCmd {
    /// Register evidence with its first-hand origin (or lineage); prints its ev_ handle.
    Register(EvidenceArgs),
}

#[derive(Subcommand, Debug)]
pub enum OpCmd {
    /// Before an external effect: record the intention (prints the op id).
    Begin(OpBeginArgs),
    /// The effect was performed.
    Effect(OpArgs),
    /// The operation's outcome (--outcome succeeded|failed).
    Resolve(OpArgs),
}

#[derive(Subcommand, Debug)]
pub enum SourceCmd {
    /// Read a chunk of a part (as an agent); Room keeps the receipt done measures coverage by.
    Read(SourceReadArgs),
}

#[derive(Subcommand, Debug)]
pub enum CompositionCmd {
    /// Let AGENT read ROOMS (2 to 8, of one project) composed; it must still read each room.
    Grant {
        agent: String,
        #[arg(required = true)]
        rooms: Vec<String>,
    },
    /// Revoke a grant: a composition under it is refused from its next page.
    Revoke { id: String },
    /// The grants (of one agent, or all), revoked ones too.
    List {
        #[arg(long)]
        agent: Option<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TaskCmd {
    Create(TaskCreateArgs),
    Claim(TaskClaimArgs),
    /// A task with its lineage, lease and last acceptance results.
    Show {
        task: String,
    },
    /// Evaluate a task's acceptance checks now, without closing it.
    Check {
        task: String,
    },
    /// Replace a task's requirements or checks (its owner); a claim taken before must be renewed.
    Amend(TaskAmendArgs),
    /// Replace a task with a verified successor (its owner).
    Supersede(TaskSupersedeArgs),
    /// Withdraw a live task (its owner): lease released, open obligations resolved as cancelled.
    Cancel(TaskCancelArgs),
    /// Ask Room to change one row of a projected source of a task you hold (version + 1).
    Propose(TaskProposeArgs),
    /// Let a task with requirements close without checks, on a recorded reason (owner console).
    Override(TaskOverrideArgs),
}

/// The wire structs the CLI parses directly, as the JSON arguments of their request.
mod erased {
    pub trait Wire {
        fn to_json(&self) -> serde_json::Value;
    }
    impl<T: serde::Serialize> Wire for T {
        fn to_json(&self) -> serde_json::Value {
            serde_json::to_value(self).expect("wire arguments serialize")
        }
    }
}

pub fn state_dir(cli: &Cli) -> PathBuf {
    cli.state_dir
        .clone()
        .unwrap_or_else(statedir::default_state_dir)
}

/// The daemon socket a command talks to: `ROOM_SOCKET` when set (a worker's broker, where its
/// launch's credential works and nowhere else), else the state dir's.
pub fn socket(cli: &Cli) -> std::path::PathBuf {
    std::env::var_os("ROOM_SOCKET")
        .filter(|s| !s.is_empty())
        .map_or_else(
            || state_dir(cli).join("room.sock"),
            std::path::PathBuf::from,
        )
}

/// Build the request a command stands for, or run it locally and return its exit status.
fn request(cmd: &Cmd) -> Result<Request, String> {
    let agent = std::env::var("ROOM_TOKEN").ok().filter(|t| !t.is_empty());
    let req = |op: &str, args: Value| Request {
        op: op.into(),
        token: agent.clone(),
        conversation: std::env::var("ROOM_CONVERSATION")
            .ok()
            .filter(|c| !c.is_empty()),
        tier: std::env::var("ROOM_TIER").ok().filter(|c| !c.is_empty()),
        args,
        meta: None,
        page_bytes_max: None,
    };
    let wire = |op: &str, args: &dyn erased::Wire| req(op, args.to_json());
    let turn = |op: &str, t: &TurnWire| wire(op, t);
    Ok(match cmd {
        Cmd::Agent(a) => match a {
            AgentCmd::Enroll {
                name,
                max_tier,
                host,
            } => req(
                "agent_enroll",
                json!({"name": name, "max_tier": max_tier, "host": host}),
            ),
            AgentCmd::Delegate {
                name,
                parent,
                scopes,
                max_tier,
            } => req(
                "agent_delegate",
                json!({"name": name, "parent": parent, "scopes": scopes, "max_tier": max_tier}),
            ),
            AgentCmd::Rotate { name } => req("agent_rotate", json!({"name": name})),
            AgentCmd::Revoke { name } => req("agent_revoke", json!({"name": name})),
            AgentCmd::Policy {
                name,
                deny,
                allow,
                max_tier,
            } => req(
                "agent_policy",
                json!({"name": name, "deny": deny, "allow": allow, "max_tier": max_tier}),
            ),
            AgentCmd::List => req("agent_list", json!({})),
        },
        Cmd::Project(p) => match p {
            ProjectCmd::Open { path, name } => {
                let abs = std::path::absolute(path).map_err(|e| format!("path: {e}"))?;
                let text = abs
                    .to_str()
                    .ok_or("path: not UTF-8; Room records project roots as UTF-8 text")?;
                req("project_open", json!({"path": text, "name": name}))
            }
            ProjectCmd::List => req("project_list", json!({})),
            ProjectCmd::Source(a) => wire("project_source", a),
        },
        Cmd::Create {
            name,
            project,
            members,
        } => req(
            "room_create",
            json!({"name": name, "project": project, "members": members}),
        ),
        Cmd::List => {
            if agent.is_some() {
                req("list", json!({}))
            } else {
                req("rooms", json!({}))
            }
        }
        Cmd::Members(MembersCmd::Add { room, agent: a }) => {
            req("room_members_add", json!({"room": room, "agent": a}))
        }
        Cmd::Reset { room } => req("room_reset", json!({"room": room})),
        Cmd::Cancel { room, by } => req("room_cancel", json!({"room": room, "by": by})),
        Cmd::Resume { room } => req("room_resume", json!({"room": room})),
        Cmd::Reconcile {
            room,
            hold,
            outcome,
            evidence,
        } => req(
            "room_reconcile",
            json!({"room": room, "hold": hold, "outcome": outcome, "evidence": evidence}),
        ),
        Cmd::BreakGlass { release } => req("break_glass", json!({"engage": !release})),
        Cmd::Stops => req("stops_list", json!({})),
        Cmd::Archive { room } => req("room_archive", json!({"room": room})),
        Cmd::Compose(a) => wire("room_compose", a),
        Cmd::Source(SourceCmd::Read(a)) => wire("source_read", a),
        Cmd::Composition(c) => match c {
            CompositionCmd::Grant { agent, rooms } => {
                req("compose_grant", json!({"agent": agent, "rooms": rooms}))
            }
            CompositionCmd::Revoke { id } => req("compose_revoke", json!({"id": id})),
            CompositionCmd::List { agent } => req("compose_grants", json!({"agent": agent})),
        },
        Cmd::Admission { room, open, .. } => {
            req("room_admission", json!({"room": room, "open": open}))
        }
        Cmd::Log { room, from, limit } => req(
            "room_log",
            json!({"room": room, "from": from, "limit": limit}),
        ),
        Cmd::Audit {
            target,
            event: Some(event),
            html: None,
        } => req("room_audit", json!({"room": target, "event": event})),
        Cmd::Audit {
            event: Some(_),
            html: Some(_),
            ..
        } => return Err("--html: only a task's audit (room audit TASK) is written as HTML".into()),
        Cmd::Audit {
            target,
            event: None,
            ..
        } => {
            if !room_core::id::is_task_id(target) {
                return Err(format!(
                    "target: {target:?} is not a task id (tsk_…); an event's audit is room audit ROOM EVENT"
                ));
            }
            req("task_audit", json!({"task": target}))
        }
        Cmd::Index(IndexCmd::Rebuild {
            room, accept_loss, ..
        }) => req(
            "index_rebuild",
            json!({"room": room, "accept_loss": accept_loss}),
        ),
        Cmd::Wakes(WakesCmd::List { room }) => req("wakes_list", json!({"room": room})),
        Cmd::Route(RouteCmd::Set { agent, route }) => {
            let mut r = serde_json::to_value(route).expect("route flags serialize");
            prune(&mut r);
            req("route_set", json!({"agent": agent, "route": r}))
        }
        Cmd::Route(RouteCmd::Remove { agent }) => req("route_remove", json!({"name": agent})),
        Cmd::Route(RouteCmd::List) => req("routes_list", json!({})),
        Cmd::Sessions(SessionsCmd::List { agent }) => req("sessions_list", json!({"agent": agent})),
        Cmd::Sessions(SessionsCmd::Show { id }) => req("sessions_show", json!({"id": id})),
        Cmd::Sessions(SessionsCmd::Native { .. }) => unreachable!("a local command"),
        Cmd::Adapters(AdaptersCmd::List) => req("adapters_list", json!({})),
        Cmd::Adapters(AdaptersCmd::Probe { .. }) => unreachable!("a local command"),
        Cmd::Wakes(WakesCmd::Show { wake }) => req("wakes_show", json!({"wake": wake})),
        Cmd::Wakes(WakesCmd::Check) => req("wakes_check", json!({})),
        Cmd::Wakes(WakesCmd::Obligations { room }) => {
            req("wakes_obligations", json!({"room": room}))
        }
        Cmd::Task(t) => match t {
            TaskCmd::Create(a) => wire("task_create", a),
            TaskCmd::Claim(a) => wire("task_claim", a),
            TaskCmd::Show { task } => {
                if agent.is_some() {
                    req("task_show", json!({"task": task}))
                } else {
                    req("owner_task_show", json!({"task": task}))
                }
            }
            TaskCmd::Amend(a) => wire("task_amend", a),
            TaskCmd::Supersede(a) => wire("task_supersede", a),
            TaskCmd::Cancel(a) => wire("task_cancel", a),
            TaskCmd::Propose(a) => wire("task_propose", a),
            TaskCmd::Override(a) => wire("owner_task_override", a),
            TaskCmd::Check { task } => {
                if agent.is_some() {
                    req("task_check", json!({"task": task}))
                } else {
                    req("owner_task_check", json!({"task": task}))
                }
            }
        },
        Cmd::Evidence(EvidenceCmd::Register(a)) => wire("evidence_register", a),
        Cmd::Op(o) => match o {
            OpCmd::Begin(a) => wire("op_begin", a),
            OpCmd::Effect(a) => wire("op_effect", a),
            OpCmd::Resolve(a) => wire("op_resolve", a),
        },
        Cmd::Whoami => req("whoami", json!({})),
        Cmd::Take(a) => wire("wake_take", a),
        Cmd::Sync(a) => wire("sync", a),
        Cmd::Note(t) => turn("note", t),
        Cmd::Say(t) => turn("say", t),
        Cmd::Send(t) => turn("send", t),
        Cmd::Handoff(t) => turn("handoff", t),
        Cmd::Done(t) => turn("done", t),
        Cmd::Blocked(t) => turn("blocked", t),
        Cmd::Decline(t) => turn("decline", t),
        Cmd::Reply {
            room,
            reply_to,
            text,
            common,
        } => req(
            "reply",
            json!({"room": room, "reply_to": reply_to, "text": text, "evidence": common.evidence, "parents": common.parent, "actor": common.actor,
                "idempotency_key": common.idempotency_key}),
        ),
        Cmd::Circle {
            room,
            obligation,
            text,
            common,
        } => req(
            "circle",
            json!({"room": room, "obligation": obligation, "text": text, "actor": common.actor,
                "idempotency_key": common.idempotency_key}),
        ),
        Cmd::Multiplex { args } => {
            let v: Value =
                serde_json::from_str(args).map_err(|e| format!("args: not JSON: {e}"))?;
            req("room", v)
        }
        Cmd::Search {
            room,
            query,
            cursor,
            limit,
            mode,
        } => req(
            "search",
            json!({"room": room, "query": query, "cursor": cursor, "limit": limit, "mode": mode}),
        ),
        Cmd::Init { .. }
        | Cmd::Api
        | Cmd::AgentScript { .. }
        | Cmd::AgentAcp { .. }
        | Cmd::Serve { .. }
        | Cmd::Demo { .. }
        | Cmd::Bench(_)
        | Cmd::Verify { .. }
        | Cmd::Migrate { .. }
        | Cmd::Snapshot { .. }
        | Cmd::Restore { .. }
        | Cmd::Prove { .. }
        | Cmd::Collab(_)
        | Cmd::Completions { .. }
        | Cmd::Doctor
        | Cmd::Man
        | Cmd::Mcp { .. }
        | Cmd::Connect { .. }
        | Cmd::Dashboard => {
            unreachable!("local commands")
        }
    })
}

/// Drop nulls so the daemon's strict decoding sees only what the user gave.
fn prune(v: &mut Value) {
    if let Value::Object(m) = v {
        m.retain(|_, x| !(x.is_null() || x.as_array().is_some_and(Vec::is_empty)));
    }
}

pub fn run(cli: Cli) -> i32 {
    match &cli.cmd {
        Cmd::Init { store } => return init(&cli, store.as_deref()),
        Cmd::Serve {
            listen,
            engine_threads,
            store,
        } => {
            let store = match store_of(&cli, store.as_deref()) {
                Ok(s) => s,
                Err(code) => return code,
            };
            return serve(&cli, *listen, *engine_threads, store);
        }
        Cmd::Demo { scene } => {
            return match scene.as_deref() {
                Some("collab") => crate::demo_collab::run(),
                _ => crate::demo::run(),
            };
        }
        Cmd::AgentScript { steps } => return crate::agent_script::run(steps),
        Cmd::AgentAcp { mode } => return crate::agent_script::run_acp(mode),
        Cmd::Api => return crate::api::run(&socket(&cli)),
        Cmd::Bench(a) => return crate::bench::run(a),
        Cmd::Verify {
            room,
            progress,
            store,
        } => {
            return match store_of(&cli, store.as_deref()) {
                Ok(Some(url)) => verify_store(&cli, &url, room.as_deref()),
                Ok(None) => verify(&cli, room.as_deref(), *progress),
                Err(code) => code,
            };
        }
        Cmd::Migrate { from, to } => return crate::migrate::run(&cli, from.as_deref(), to),
        Cmd::Snapshot { out } => return crate::snapshot::take(&cli, out),
        Cmd::Restore { snapshot } => return crate::snapshot::restore(&cli, snapshot),
        Cmd::Prove { claims } => return crate::prove::run(claims, cli.json),
        Cmd::Collab(c) => return crate::collab::run(&cli, c),
        Cmd::Doctor => return crate::doctor::run(&cli),
        Cmd::Adapters(AdaptersCmd::Probe {
            adapter,
            declare,
            command,
        }) => return crate::probe::run(&cli, adapter.as_deref(), command, declare),
        Cmd::Sessions(SessionsCmd::Native { agent }) => return crate::native::run(&cli, agent),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            let mut out = std::io::stdout();
            clap_complete::generate(*shell, &mut Cli::command(), "room", &mut out);
            return 0;
        }
        Cmd::Man => {
            use clap::CommandFactory;
            return match clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("error: {e}");
                    EXIT_IO
                }
            };
        }
        Cmd::Mcp { tools } => {
            let Some(mode) = room_server::mcp::ToolsMode::parse(tools) else {
                eprintln!("error[invalid_argument]: tools: {tools:?} is not full or compact");
                return EXIT_REFUSED;
            };
            return crate::mcp_cmd::run(&state_dir(&cli), mode);
        }
        Cmd::Connect {
            host,
            agent,
            max_tier,
        } => return connect(&cli, *host, agent, max_tier.as_deref()),
        Cmd::Dashboard => return dashboard(&cli),
        Cmd::Index(IndexCmd::Rebuild {
            room,
            accept_loss,
            progress,
        }) => return index_rebuild(&cli, room, *accept_loss, *progress),
        _ => {}
    }
    let mut req = match request(&cli.cmd) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error[invalid_argument]: {e}");
            return EXIT_REFUSED;
        }
    };
    prune(&mut req.args);
    let sock = socket(&cli);
    let resp = Client::connect(&sock).and_then(|mut c| c.request(&req));
    if let Cmd::Audit {
        html: Some(file), ..
    } = &cli.cmd
        && let Ok(report) = &resp
        && let Err(e) =
            room_store::fs::write_atomic(file, crate::audit_html::render(report).as_bytes())
    {
        eprintln!("error: {}: {e}", file.display());
        return EXIT_IO;
    }
    print_response(resp, cli.json)
}

pub fn print_response(resp: Result<Value, ServerError>, as_json: bool) -> i32 {
    match resp {
        Err(ServerError::Refused(refusal)) => {
            if as_json {
                println!("{}", json!({"refusal": refusal}));
            }
            eprintln!("{refusal}");
            exit_code(&ServerError::Refused(refusal))
        }
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, ServerError::DaemonUnreachable { .. }) {
                eprintln!("hint: start the daemon with `room serve` (after `room init`)");
            }
            exit_code(&e)
        }
        Ok(v) => {
            if as_json {
                println!("{v}");
            } else {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&v).expect("values print")
                );
            }
            0
        }
    }
}

fn init(cli: &Cli, store: Option<&str>) -> i32 {
    let dir = state_dir(cli);
    let fresh = {
        let mut b = [0u8; 16];
        use room_core::Entropy;
        room_server::daemon::OsEntropy.fill(&mut b);
        b.iter().map(|x| format!("{x:02x}")).collect::<String>()
    };
    let (db, bound) = match store.map(store_instance).transpose() {
        Ok(Some((db, bound))) => (Some(db), bound),
        Ok(None) => (None, None),
        Err(code) => return code,
    };
    let id = bound.clone().unwrap_or(fresh);
    match statedir::init(&dir, &statedir::default_bootstrap_path(), &id) {
        Ok(s) => {
            if let (Some(db), Some(url)) = (&db, store)
                && let Err(code) = adopt_store(&s, db, bound.as_deref(), url)
            {
                return code;
            }
            if cli.json {
                println!(
                    "{}",
                    json!({"state_dir": s.root, "instance": s.instance_id})
                );
            } else {
                println!(
                    "state dir {} (instance {})",
                    s.root.display(),
                    s.instance_id
                );
            }
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_STATE
        }
    }
}

/// The database at `url` and the Room instance it belongs to (none when nothing bound it).
fn store_instance(url: &str) -> Result<(room_store_pg::PgBackend, Option<String>), i32> {
    if !room_engine::policy::is_postgres_url(url) {
        eprintln!("error[invalid_argument]: store: the url is not a postgres:// url");
        eprintln!("hint: room init --store postgres://USER@HOST:PORT/DATABASE");
        return Err(EXIT_REFUSED);
    }
    let found = room_store_pg::PgBackend::connect(url)
        .and_then(|pg| pg.instance().map(|bound| (pg, bound)));
    found.map_err(|e| {
        eprintln!("error: store: {e}");
        EXIT_IO
    })
}

/// Make the state dir `s` serve the database `db` (which belongs to `bound`, if anything
/// bound it). Everything that can refuse is checked first, so a refusal changes nothing: a
/// state dir of another instance, one whose embedded store holds rooms not migrated (they
/// would vanish from view), a config.toml that names another store. Then an unbound
/// database is bound to this instance (the next host's `room init --store` takes the same
/// one) and config.toml names it.
fn adopt_store(
    s: &statedir::StateDir,
    db: &room_store_pg::PgBackend,
    bound: Option<&str>,
    url: &str,
) -> Result<(), i32> {
    if let Some(b) = bound.filter(|b| *b != s.instance_id) {
        eprintln!(
            "error: store of another instance: this database belongs to Room instance {b}; the state dir {} is instance {}",
            s.root.display(),
            s.instance_id
        );
        eprintln!("hint: give room init a new --state-dir for this database");
        return Err(EXIT_STATE);
    }
    let config = s.root.join("config.toml");
    let named = store_named(&config, url)?;
    // rooms `room migrate` copied out are the database's now
    if !s.store_migrated().exists() {
        let rooms = match std::fs::read_dir(s.root.join("rooms")) {
            Ok(d) => d.count(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
            Err(e) => {
                eprintln!("error: {}: {e}", s.root.join("rooms").display());
                return Err(EXIT_STATE);
            }
        };
        if rooms > 0 {
            eprintln!(
                "error: the state dir {} keeps rooms in its embedded store ({rooms}): serving the database would leave them behind",
                s.root.display()
            );
            eprintln!("hint: room migrate --to URL copies them into an empty database");
            return Err(EXIT_STATE);
        }
    }
    if bound.is_none() {
        let now_ms = room_core::Clock::now_ms(&room_server::daemon::SystemClock);
        match db.bind_instance(&s.instance_id, now_ms) {
            Ok(()) => {}
            Err(e @ StoreError::OtherInstance(_)) => {
                eprintln!("error: {e}");
                eprintln!(
                    "hint: another host bound it first: give room init a new --state-dir for this database"
                );
                return Err(EXIT_STATE);
            }
            Err(e) => {
                eprintln!("error: store: {e}");
                return Err(EXIT_IO);
            }
        }
    }
    match named {
        Some(text) => room_store::fs::write_atomic(&config, text.as_bytes()).map_err(|e| {
            eprintln!("error: {}: {e}", config.display());
            EXIT_STATE
        }),
        None => Ok(()),
    }
}

/// config.toml's text with `[store] url` naming the database, or none when it names it
/// already; a config that names another store (or does not parse) is refused.
fn store_named(config: &std::path::Path, url: &str) -> Result<Option<String>, i32> {
    let kept = match std::fs::read(config) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            eprintln!("error: {}: {e}", config.display());
            return Err(EXIT_STATE);
        }
    };
    match room_engine::policy::store_url(&kept) {
        Ok(Some(named)) if named == url => return Ok(None),
        Ok(Some(_)) => {
            eprintln!(
                "error[invalid_argument]: store: {} names another store",
                config.display()
            );
            eprintln!("hint: edit its [store] url, or give room init a new --state-dir");
            return Err(EXIT_REFUSED);
        }
        Ok(None) => {}
        Err(e) => {
            eprintln!("error[invalid_argument]: store: {e}");
            return Err(EXIT_REFUSED);
        }
    }
    let text = String::from_utf8(kept).map_err(|_| {
        eprintln!("error: {}: not UTF-8", config.display());
        EXIT_STATE
    })?;
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e| {
        eprintln!("error: {}: {e}", config.display());
        EXIT_STATE
    })?;
    match doc.get_mut("store").and_then(|t| t.as_table_like_mut()) {
        // a [store] table without a url keeps its other keys and comments
        Some(t) => {
            t.insert("url", toml_edit::value(url));
        }
        None => {
            let mut table = toml_edit::Table::new();
            table["url"] = toml_edit::value(url);
            doc["store"] = toml_edit::Item::Table(table);
        }
    }
    Ok(Some(doc.to_string()))
}

/// The store the daemon runs on: `--store`, else config.toml's `[store] url`, else the
/// embedded one (None). A url of another kind is refused before anything starts.
fn store_of(cli: &Cli, flag: Option<&str>) -> Result<Option<String>, i32> {
    if let Some(url) = flag {
        if !room_engine::policy::is_postgres_url(url) {
            eprintln!("error[invalid_argument]: store: the url is not a postgres:// url");
            eprintln!(
                "hint: run room serve without --store: the state dir's embedded store needs no set-up"
            );
            return Err(EXIT_REFUSED);
        }
        return Ok(Some(url.to_string()));
    }
    let config = state_dir(cli).join("config.toml");
    match std::fs::read(&config) {
        Ok(bytes) => room_engine::policy::store_url(&bytes).map_err(|e| {
            eprintln!("error[invalid_argument]: store: {e}");
            EXIT_REFUSED
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => {
            eprintln!("error: {}: {e}", config.display());
            Err(EXIT_STATE)
        }
    }
}

fn serve(
    cli: &Cli,
    listen: Option<std::net::SocketAddr>,
    engine_threads: Option<u16>,
    store: Option<String>,
) -> i32 {
    let cfg = room_server::daemon::ServeConfig {
        state_dir: state_dir(cli),
        bootstrap: statedir::default_bootstrap_path(),
        listen,
        engine_threads: engine_threads
            .map_or_else(room_server::daemon::engine_threads_default, usize::from),
        limits: Default::default(),
        room_exe: std::env::current_exe().ok(),
        store,
    };
    let rt = room_server::daemon::runtime(cfg.engine_threads).expect("tokio runtime");
    let result = rt.block_on(room_server::daemon::serve(cfg, async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("signal handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }));
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, ServerError::State(StoreError::SplitBrain(_))) {
                eprintln!(
                    "hint: this directory is not the state dir the machine bootstrap knows; run `room init` on the right one"
                );
            }
            if matches!(e, ServerError::State(StoreError::RestorePending(_))) {
                eprintln!("hint: run the same `room restore` again: it resumes where it stopped");
            }
            if matches!(e, ServerError::State(StoreError::Migrated(_))) {
                eprintln!(
                    "hint: serve the database: room serve --store URL, or `[store] url` in config.toml"
                );
            }
            if matches!(e, ServerError::State(StoreError::Fenced(_))) {
                eprintln!(
                    "hint: another daemon serves this database now; start this one again only once that one has stopped"
                );
            }
            if matches!(e, ServerError::State(StoreError::OtherInstance(_))) {
                eprintln!(
                    "hint: serve it from that instance's state dir, or make one for this host: room init --store URL"
                );
            }
            if matches!(
                e,
                ServerError::EngineOpen(StoreError::MigrationUnfinished(_))
            ) {
                eprintln!("hint: run the same room migrate again: it resumes where it stopped");
            }
            exit_code(&e)
        }
    }
}

/// Offline chain verification of every room (or one).
pub fn verify(cli: &Cli, only: Option<&str>, progress: bool) -> i32 {
    use std::io::IsTerminal;
    let dir = state_dir(cli);
    let progress = progress || std::io::stderr().is_terminal();
    let mut say = |i: usize, n: usize, room: &str| {
        if progress {
            eprintln!("verifying {i}/{n}: {room}");
        }
    };
    match verify_dir_with(&dir, only, &mut say) {
        Ok(report) => {
            let bad = report.iter().any(|r| r["ok"] == false);
            if cli.json {
                println!("{}", json!({"rooms": report, "ok": !bad}));
            } else {
                for r in &report {
                    if r["ok"] == true {
                        println!(
                            "ok   {} {} records, tip {}",
                            r["room"].as_str().unwrap_or("?"),
                            r["records"],
                            r["tip_hash"].as_str().unwrap_or("")
                        );
                    } else {
                        println!(
                            "FAIL {} {}",
                            r["room"].as_str().unwrap_or("?"),
                            r["error"].as_str().unwrap_or("")
                        );
                    }
                }
            }
            if bad { EXIT_REFUSED } else { 0 }
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_IO
        }
    }
}

/// `room verify` of a PostgreSQL store: every room the control store names (or `only`), its
/// chain read back from the database and verified from its first record.
fn verify_store(cli: &Cli, url: &str, only: Option<&str>) -> i32 {
    use room_store::backend::Backend;
    let report = (|| -> Result<Vec<Value>, String> {
        let store = room_store_pg::PgBackend::connect(url).map_err(|e| e.to_string())?;
        let rooms = store
            .open_control()
            .and_then(|c| c.rooms())
            .map_err(|e| e.to_string())?;
        let rooms: Vec<_> = rooms
            .into_iter()
            .filter(|r| only.is_none_or(|o| o == r.name))
            .collect();
        if let Some(o) = only
            && rooms.is_empty()
        {
            return Err(format!("no room named {o:?} in the store"));
        }
        Ok(rooms
            .iter()
            .map(|r| match store.verify_log(&r.graph_id) {
                Ok(v) => json!({"room": r.name, "ok": true, "records": v.records,
                    "tip_hash": v.tip_hash}),
                Err(e) => json!({"room": r.name, "ok": false, "error": e.to_string()}),
            })
            .collect())
    })();
    match report {
        Ok(report) => {
            let bad = report.iter().any(|r| r["ok"] == false);
            if cli.json {
                println!("{}", json!({"rooms": report, "ok": !bad}));
            } else {
                for r in &report {
                    let room = r["room"].as_str().unwrap_or("?");
                    if r["ok"] == true {
                        let tip = r["tip_hash"].as_str().unwrap_or("");
                        println!("ok   {room} {} records, tip {tip}", r["records"]);
                    } else {
                        println!("FAIL {room} {}", r["error"].as_str().unwrap_or(""));
                    }
                }
            }
            if bad { EXIT_REFUSED } else { 0 }
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_IO
        }
    }
}

pub fn verify_dir(dir: &std::path::Path, only: Option<&str>) -> Result<Vec<Value>, String> {
    verify_dir_with(dir, only, &mut |_, _, _| {})
}

/// `verify_dir`, telling `progress` each room (its place, of how many, its name) before it is
/// verified.
pub fn verify_dir_with(
    dir: &std::path::Path,
    only: Option<&str>,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Vec<Value>, String> {
    // a tree part old and part restored is no state to verify (or to replay into)
    if let Some(why) = room_store::snapshot::pending_restore(dir) {
        return Err(format!(
            "restore pending: {why}\nhint: run the same `room restore` again: it resumes where it stopped"
        ));
    }
    replay_unclean_stop(dir)?;
    let rooms = dir.join("rooms");
    let shards: Vec<_> = room_store::shard::on_disk(&rooms)
        .map_err(|e| format!("{}: {e}", rooms.display()))?
        .into_iter()
        .filter(|(_, m)| only.is_none_or(|o| o == m.room))
        .collect();
    let mut out = Vec::new();
    let n = shards.len();
    for (i, (shard, manifest)) in shards.into_iter().enumerate() {
        let room = manifest.room;
        progress(i + 1, n, &room);
        out.push(verify_room(dir, &shard, &room, &manifest.graph_id));
    }
    if let Some(o) = only
        && out.is_empty()
    {
        return Err(format!("no room named {o:?} in {}", dir.display()));
    }
    out.sort_by(|a, b| a["room"].as_str().cmp(&b["room"].as_str()));
    Ok(out)
}

/// After an unclean stop the commit log holds acknowledged appends that the journals may
/// lack: put them back first, as the daemon's start does, so that verification reads what the
/// daemon will. Only while no daemon runs (one that runs holds them in its journals already).
fn replay_unclean_stop(dir: &std::path::Path) -> Result<(), String> {
    let commit = dir.join("commit");
    if !room_store::pipeline::holds_segments(&commit) {
        return Ok(());
    }
    let state = room_store::statedir::StateDir {
        root: dir.to_path_buf(),
        instance_id: String::new(),
    };
    let Ok(_lock) = room_store::statedir::lock(&state) else {
        return Ok(());
    };
    let (log, replayed) = room_store::pipeline::CommitLog::open(
        &commit,
        &dir.join("rooms"),
        room_store::pipeline::PipelineConfig::default(),
        None,
    )
    .map_err(|e| format!("replaying the commit log of an unclean stop: {e}"))?;
    log.checkpoint_now()
        .map_err(|e| format!("checkpointing the commit log: {e}"))?;
    if replayed.restored > 0 {
        eprintln!(
            "note: the commit log of an unclean stop put back {} acknowledged append(s) the journals lacked",
            replayed.restored
        );
    }
    Ok(())
}

/// Verify one room's chain, then compare it with every durable witness of what was
/// acknowledged (the index's tip, receipts, checkpoints and wakes mark; control.db's last
/// reset and wake queue), read without changing them. A journal shorter than what was
/// acknowledged fails, naming the missing seqs, unless a `journal_loss` event in it accepts
/// them. Witnesses a running daemon holds locked are reported as unavailable.
fn verify_room(
    dir: &std::path::Path,
    shard: &room_store::shard::Shard,
    room: &str,
    graph_id: &str,
) -> Value {
    let mut accepted = Vec::new();
    let control = room_store::control::read_room_witnesses(&dir.join("control.db"), room);
    let mut wake_sources: std::collections::HashSet<String> = control
        .as_ref()
        .map(|c| c.wake_sources.iter().cloned().collect())
        .unwrap_or_default();
    let scanned = room_store::journal::verify_with(&shard.journal(), graph_id, |s| {
        wake_sources.remove(&s.record.id);
        if let Ok(room_core::event::EventBody::JournalLoss {
            missing_from,
            missing_to,
            ..
        }) = serde_json::from_value(s.record.event.clone())
        {
            accepted.push((missing_from, missing_to));
        }
        Ok(())
    });
    let r = match scanned {
        Ok(r) => r,
        Err(err) => return json!({"room": room, "ok": false, "error": err.to_string()}),
    };
    let mut v = json!({"room": room, "ok": true, "records": r.records, "tip_hash": r.tip_hash, "torn_bytes": r.torn_bytes});
    let index = room_store::index::read_witnesses(&shard.index(), r.records);
    let (mut w, more) = match (&index, &control) {
        (Ok(w), Ok(c)) => {
            let mut more = Vec::new();
            if c.reset_seq > 0 {
                more.push(room_core::event::SeqWitness {
                    source: "room_reset".into(),
                    seq: c.reset_seq,
                });
            }
            (w.clone(), more)
        }
        (Err(e), _) | (_, Err(e)) => {
            v["witnesses_unavailable"] = json!(e.to_string());
            return v;
        }
    };
    // the journal itself says which losses the owner accepted
    w.accepted = accepted;
    let missing = w.missing_after(r.records, &more);
    v["witnesses"] = json!(w.seqs.iter().chain(more.iter()).collect::<Vec<_>>());
    if !wake_sources.is_empty() {
        let mut absent: Vec<_> = wake_sources.into_iter().collect();
        absent.sort();
        v["ok"] = json!(false);
        v["wake_sources_absent"] = json!(absent);
        v["error"] = json!(format!(
            "the wake queue names {} event(s) the journal does not hold",
            absent.len()
        ));
    }
    if let Some((a, b)) = missing {
        v["ok"] = json!(false);
        v["missing_from"] = json!(a);
        v["missing_to"] = json!(b);
        v["error"] = json!(format!(
            "acknowledged records {a}..={b} are missing: the journal ends at seq {}",
            r.records
        ));
    }
    v
}

/// `room index rebuild`: the daemon rebuilds the room's projection; on a terminal (or with
/// `--progress`) what is rebuilt is said first, and how long it has taken every two seconds
/// until it is done (the daemon reports no fraction of the work).
fn index_rebuild(cli: &Cli, room: &str, accept_loss: bool, progress: bool) -> i32 {
    use std::io::IsTerminal;
    let sock = state_dir(cli).join("room.sock");
    let progress = progress || std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticker = progress.then(|| {
        let tip = Client::connect(&sock)
            .and_then(|mut c| c.request(&Request::new("rooms", json!({}))))
            .ok()
            .and_then(|v| {
                v["rooms"]
                    .as_array()?
                    .iter()
                    .find(|r| r["room"] == room)
                    .and_then(|r| r["tip_seq"].as_u64())
            });
        match tip {
            Some(n) => eprintln!("rebuilding the index of {room} from its journal ({n} events)"),
            None => eprintln!("rebuilding the index of {room} from its journal"),
        }
        let done = done.clone();
        std::thread::spawn(move || {
            let tick = std::time::Duration::from_millis(100);
            let mut said = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::sleep(tick);
                let secs = started.elapsed().as_secs();
                if secs >= said + 2 {
                    said = secs;
                    eprintln!("  … {secs} s");
                }
            }
        })
    });
    let resp = Client::connect(&sock).and_then(|mut c| {
        c.request(&Request::new(
            "index_rebuild",
            json!({"room": room, "accept_loss": accept_loss}),
        ))
    });
    done.store(true, std::sync::atomic::Ordering::Release);
    if let Some(t) = ticker {
        let _ = t.join();
        if resp.is_ok() {
            eprintln!(
                "rebuilt the index of {room} in {:.1} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    print_response(resp, cli.json)
}

/// `room dashboard`: a login code from the daemon, printed as a link to its HTTP listener.
fn dashboard(cli: &Cli) -> i32 {
    let state = state_dir(cli);
    let Some(addr) = std::fs::read_to_string(state.join("http.addr"))
        .ok()
        .map(|a| a.trim().to_string())
    else {
        eprintln!(
            "error[invalid_argument]: the daemon has no HTTP listener, so there is no page to open"
        );
        eprintln!("hint: start it with `room serve --listen 127.0.0.1:7878`");
        return EXIT_REFUSED;
    };
    let resp = Client::connect(&state.join("room.sock"))
        .and_then(|mut c| c.request(&Request::new("dashboard_login", json!({}))));
    let v = match resp {
        Ok(v) => v,
        other => return print_response(other, cli.json),
    };
    let code = v["code"].as_str().unwrap_or_default();
    let url = format!("http://{addr}/login?code={code}");
    if cli.json {
        println!(
            "{}",
            json!({"url": url, "expires_ms": v["expires_ms"], "ttl_ms": v["ttl_ms"]})
        );
    } else {
        println!("{url}");
        eprintln!(
            "open it in a browser on this machine within {} s; it works once",
            v["ttl_ms"].as_u64().unwrap_or(0) / 1000
        );
    }
    0
}

fn connect(cli: &Cli, host: crate::connect::Host, agent: &str, max_tier: Option<&str>) -> i32 {
    let state = state_dir(cli);
    let sock = state.join("room.sock");
    let owner = Request::new;
    let mut args = json!({"name": agent, "host": host.kind()});
    if let Some(t) = max_tier {
        args["max_tier"] = json!(t);
    }
    let mut resp = Client::connect(&sock).and_then(|mut c| c.request(&owner("agent_enroll", args)));
    let mut rotated = false;
    if let Err(ServerError::Refused(r)) = &resp
        && r.code == room_core::Code::AlreadyExists
    {
        rotated = true;
        resp = Client::connect(&sock)
            .and_then(|mut c| c.request(&owner("agent_rotate", json!({"name": agent}))));
    }
    let token = match resp {
        Ok(v) => v["token"].as_str().map(String::from).unwrap_or_default(),
        other => return print_response(other, cli.json),
    };
    let http = std::fs::read_to_string(state.join("http.addr")).ok();
    let bin = std::env::current_exe()
        .ok()
        .and_then(|p| p.to_str().map(String::from))
        .unwrap_or_else(|| "room".into());
    let snip = crate::connect::snippets(host, &token, &state, &bin, http.as_deref().map(str::trim));
    if cli.json {
        println!(
            "{}",
            json!({"agent": agent, "token": token, "rotated": rotated, "config": snip})
        );
        return 0;
    }
    if rotated {
        eprintln!(
            "note: {agent} was already enrolled; it has a new token now and the old one no longer works"
        );
    }
    println!("agent {agent} ({}) token: {token}\n", host.kind());
    println!(
        "# {} — stdio (room mcp):\n{}\n",
        snip["file"].as_str().unwrap_or(""),
        snip["stdio"].as_str().unwrap_or("")
    );
    println!(
        "# streamable HTTP:\n{}",
        snip["http"].as_str().unwrap_or("")
    );
    if let Some(n) = snip["http_note"].as_str() {
        println!("# {n}");
    }
    if let Some(n) = snip["note"].as_str() {
        println!("\n# note: {n}");
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_come_from_the_error_case() {
        let refused =
            ServerError::Refused(room_core::Refusal::new(room_core::Code::OwnerRequired, "x"));
        assert_eq!(exit_code(&refused), EXIT_REFUSED);
        let split = ServerError::State(StoreError::SplitBrain("moved".into()));
        assert_eq!(exit_code(&split), EXIT_STATE);
        let locked = ServerError::State(StoreError::Locked { pid: "1".into() });
        assert_eq!(exit_code(&locked), EXIT_STATE);
        let unreadable = ServerError::State(StoreError::Corrupt("marker".into()));
        assert_eq!(exit_code(&unreadable), EXIT_IO);
        let down = ServerError::DaemonUnreachable {
            path: "/x/room.sock".into(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        };
        assert_eq!(exit_code(&down), EXIT_IO);
        // a message that merely mentions a state error does not make it one
        let text = ServerError::Daemon("state_dir_split_brain already running".into());
        assert_eq!(exit_code(&text), EXIT_IO);
    }
}
