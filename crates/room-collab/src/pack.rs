//! Packs: a collaboration's roles and phases, as TOML. A phase is an `agent` run by one role,
//! a `panel` of reviewers (parsed now, run by part 2), a `gate` that runs the pack's commands
//! as `command` acceptance, or an `approval` that waits for the person. Each names what it
//! `reads` and `writes` on the blackboard, and may name phases it comes `after`.
//!
//! A pack is validated at load, fail-closed, and the first thing wrong is refused:
//! `pack_invalid` (unknown kind or role, a read that nothing writes, a bad field, naming the
//! field), `pack_cycle` (naming the phases of the cycle) and `pack_write_overlap` (two phases
//! that may run together write one key). The order phases run in is what they read and the
//! `after` they name: a phase comes after every phase that writes what it reads.

use crate::artifact::ArtifactKind;
use crate::profile::{Profile, Role, valid_name};
use room_core::acceptance::Check;
use room_core::{Code, Refusal};
use serde::Deserialize;
use std::collections::{BTreeMap, BTreeSet};

/// Phases one pack holds at most, and the bytes of its text.
pub const PHASES_MAX: usize = 64;
pub const PACK_BYTES_MAX: usize = 256 * 1024;
/// Reviewers one panel fans out to at most.
pub const PANEL_REVIEWERS_MAX: u32 = 16;
/// Commands one gate runs at most.
pub const GATE_COMMANDS_MAX: usize = 16;

/// The pack Room ships: spec → research ∥ architecture → implementation → gate → review →
/// approval, with its prompt files beside it (`packs/default/`).
pub const DEFAULT_PACK: &str = include_str!("../../../packs/default.toml");

/// The shipped pack's prompt files, by the path its phases name (relative to `packs/`).
pub const DEFAULT_PROMPTS: [(&str, &str); 6] = [
    (
        "default/orchestrator.md",
        include_str!("../../../packs/default/orchestrator.md"),
    ),
    (
        "default/spec.md",
        include_str!("../../../packs/default/spec.md"),
    ),
    (
        "default/research.md",
        include_str!("../../../packs/default/research.md"),
    ),
    (
        "default/architecture.md",
        include_str!("../../../packs/default/architecture.md"),
    ),
    (
        "default/implementation.md",
        include_str!("../../../packs/default/implementation.md"),
    ),
    (
        "default/review.md",
        include_str!("../../../packs/default/review.md"),
    ),
];

/// The role that plans and dispatches: bound to a backend, an agent orchestrates.
pub const ORCHESTRATOR: &str = "orchestrator";

/// The longest prompt file.
pub const PROMPT_BYTES_MAX: usize = 64 * 1024;

/// What kind of step a phase is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PhaseKind {
    Agent,
    Panel,
    Gate,
    Approval,
}

impl PhaseKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PhaseKind::Agent => "agent",
            PhaseKind::Panel => "panel",
            PhaseKind::Gate => "gate",
            PhaseKind::Approval => "approval",
        }
    }
}

/// One validated phase.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    pub name: String,
    pub kind: PhaseKind,
    /// The role that runs it (agent and panel phases).
    pub role: Option<String>,
    pub reads: Vec<ArtifactKind>,
    pub writes: Vec<ArtifactKind>,
    pub after: Vec<String>,
    /// Its prompt file, relative to the pack's directory.
    pub prompt: Option<String>,
    /// A panel's breadth.
    pub reviewers: Option<u32>,
    /// What a panel's reviewers must differ in (`backend` unless the pack says `family`).
    pub distinct: Distinct,
    /// How long a panel's reviewer may take before it is shown `timed_out` (its task
    /// cancelled); none: `PANEL_TIMEOUT_MS_DEFAULT`.
    pub timeout_ms: Option<u64>,
    /// A panel's fix loop: how many times its blocking findings go back to the implementer
    /// (the agent phase that writes the diff it reads) before the loop stops
    /// (`fix_loop_exhausted`); 0: never. None for other phases.
    pub fix_loops_max: Option<u32>,
    /// A panel's debate round: once every reviewer has settled, each that wrote findings is
    /// given the others' findings once, to revise its own (or keep them) before the join.
    pub debate: bool,
    /// A panel's judge: the role whose child synthesizes the joined findings (merged,
    /// de-duplicated, every disagreement kept, no vote) as `extra/synthesis` keyed by the
    /// panel, before the join; none: the merge is mechanical, shown to the person.
    pub judge: Option<String>,
    /// An agent phase whose child writes a plan first (`extra/plan`, keyed by the phase):
    /// the person approves it before the child is given the write scopes the phase needs.
    pub plan: bool,
    /// A gate's commands, as `command` acceptance checks.
    pub commands: Vec<Check>,
    /// Whether its dispatch waits for the person's approval (by default: a role that writes
    /// the project or reaches the network; an approval phase always).
    pub approve: bool,
}

/// What a panel's reviewers must differ in: each its own backend (adapter and model), or
/// each its own model family too (so two sizes of one family never review together).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Distinct {
    #[default]
    Backend,
    Family,
}

impl Distinct {
    pub fn as_str(self) -> &'static str {
        match self {
            Distinct::Backend => "backend",
            Distinct::Family => "family",
        }
    }
}

/// A panel's fix loops when its phase names none.
pub const FIX_LOOPS_DEFAULT: u32 = 3;
/// The most fix loops a panel may name.
pub const FIX_LOOPS_MAX: u32 = 16;

/// A panel reviewer's deadline when its phase names none.
pub const PANEL_TIMEOUT_MS_DEFAULT: u64 = 30 * 60_000;
/// The longest deadline a panel may give its reviewers.
pub const PANEL_TIMEOUT_MS_MAX: u64 = 24 * 60 * 60_000;

impl Phase {
    /// A panel's seats, each a role of its own bound to its own backend: the panel's role
    /// for the first, then `<role>-2` … `<role>-N` (bound by naming the role again at start).
    /// Any other phase has none.
    pub fn seats(&self) -> Vec<String> {
        match (self.kind, &self.role, self.reviewers) {
            (PhaseKind::Panel, Some(role), Some(n)) => (1..=n)
                .map(|i| {
                    if i == 1 {
                        role.clone()
                    } else {
                        format!("{role}-{i}")
                    }
                })
                .collect(),
            _ => Vec::new(),
        }
    }

    /// The phase a panel's blocking findings go back to: the agent phase that writes a diff
    /// the panel reads (none: the panel reads no diff an agent writes).
    pub fn fixer<'p>(&self, pack: &'p Pack) -> Option<&'p Phase> {
        if self.kind != PhaseKind::Panel {
            return None;
        }
        pack.phases.iter().find(|p| {
            p.kind == PhaseKind::Agent
                && p.writes.contains(&ArtifactKind::Diff)
                && self.reads.contains(&ArtifactKind::Diff)
        })
    }

    /// Whether `role` runs this phase: its role, or one of a panel's seats (its judge only
    /// synthesizes: `judged_by`).
    pub fn run_by(&self, role: &str) -> bool {
        self.role.as_deref() == Some(role) || self.seats().iter().any(|s| s == role)
    }

    /// Whether `role` is this panel's judge.
    pub fn judged_by(&self, role: &str) -> bool {
        self.judge.as_deref() == Some(role)
    }
}

/// A validated pack.
#[derive(Debug, Clone, PartialEq)]
pub struct Pack {
    pub name: String,
    pub description: Option<String>,
    pub profile: Profile,
    pub phases: Vec<Phase>,
    pub guards: Guards,
    /// The prompt file an agent orchestrator is woken with (`[orchestrator] prompt`): its
    /// choreography, editable with the pack. Used when the orchestrator role is bound.
    pub orchestrator_prompt: Option<String>,
}

/// What holds a collaboration's dispatches back (`[guards]`): how many of its runs may be
/// in flight at once (dispatched to a worker, not yet ended), and the money it may spend.
#[derive(Debug, Clone, PartialEq)]
pub struct Guards {
    pub live_workers_max: u32,
    /// US dollars; none: no ceiling. With a ceiling, a cost that cannot be known (a launch
    /// without usage records, a model without a price) holds dispatch too: never guessed.
    pub usd_max: Option<f64>,
}

/// Runs of one collaboration in flight at once unless its pack says otherwise.
pub const LIVE_WORKERS_DEFAULT: u32 = 8;
/// The most a pack may let run at once.
pub const LIVE_WORKERS_MAX: u32 = 64;

impl Default for Guards {
    fn default() -> Guards {
        Guards {
            live_workers_max: LIVE_WORKERS_DEFAULT,
            usd_max: None,
        }
    }
}

/// A money ceiling: a finite, positive number of dollars, or `invalid` naming `field`.
pub fn check_usd(field: &str, usd: f64) -> Result<f64, Refusal> {
    if usd.is_finite() && usd > 0.0 {
        Ok(usd)
    } else {
        Err(Refusal::invalid(field, "a positive number of US dollars"))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GuardsFile {
    #[serde(default)]
    live_workers_max: Option<u32>,
    #[serde(default)]
    usd_max: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PackFile {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    roles: Vec<Role>,
    #[serde(default)]
    phases: Vec<PhaseFile>,
    #[serde(default)]
    guards: Option<GuardsFile>,
    #[serde(default)]
    orchestrator: Option<OrchestratorFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OrchestratorFile {
    prompt: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PhaseFile {
    name: String,
    kind: String,
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    reads: Vec<String>,
    #[serde(default)]
    writes: Vec<String>,
    #[serde(default)]
    after: Vec<String>,
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    reviewers: Option<u32>,
    #[serde(default)]
    distinct: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    fix_loops_max: Option<u32>,
    #[serde(default)]
    debate: Option<bool>,
    #[serde(default)]
    judge: Option<String>,
    #[serde(default)]
    plan: Option<bool>,
    #[serde(default)]
    commands: Vec<toml::Value>,
    #[serde(default)]
    approve: Option<bool>,
}

fn invalid(field: &str, why: impl std::fmt::Display) -> Refusal {
    Refusal::new(Code::PackInvalid, format!("{field}: {why}"))
        .detail(serde_json::json!({"field": field}))
}

impl Pack {
    /// The pack Room ships, over the default profile.
    pub fn default_pack() -> Pack {
        Pack::load(DEFAULT_PACK, &Profile::default()).expect("the shipped pack is valid")
    }

    /// Parse and validate a pack's text. Its roles are `base`'s, each replaced or joined by a
    /// role the pack declares; bindings are the profile's to validate (`Profile::validate`).
    pub fn load(text: &str, base: &Profile) -> Result<Pack, Refusal> {
        if text.len() > PACK_BYTES_MAX {
            return Err(invalid(
                "(pack)",
                format!("more than {PACK_BYTES_MAX} bytes"),
            ));
        }
        let file: PackFile = toml::from_str(text).map_err(|e| {
            invalid("(pack)", e.message().to_string()).detail(serde_json::json!({
                "field": "(pack)", "span": e.span().map(|s| [s.start, s.end])}))
        })?;
        if !valid_name(&file.name) {
            return Err(invalid("name", "1..=32 of a-z, 0-9, _ and -"));
        }
        let mut profile = base.clone();
        for r in file.roles {
            match profile.roles.iter().position(|b| b.name == r.name) {
                Some(i) => profile.roles[i] = r,
                None => profile.roles.push(r),
            }
        }
        if file.phases.is_empty() || file.phases.len() > PHASES_MAX {
            return Err(invalid("phases", format!("1..={PHASES_MAX} phases")));
        }
        let names: BTreeSet<&str> = file.phases.iter().map(|p| p.name.as_str()).collect();
        let mut phases = Vec::with_capacity(file.phases.len());
        for (i, p) in file.phases.iter().enumerate() {
            phases.push(phase(i, p, &profile, &names)?);
        }
        for (i, p) in phases.iter().enumerate() {
            if phases[..i].iter().any(|q| q.name == p.name) {
                return Err(invalid(&format!("phases[{i}].name"), "named twice"));
            }
        }
        let mut guards = Guards::default();
        if let Some(g) = &file.guards {
            if let Some(n) = g.live_workers_max {
                if !(1..=LIVE_WORKERS_MAX).contains(&n) {
                    return Err(invalid(
                        "guards.live_workers_max",
                        format!("1..={LIVE_WORKERS_MAX}"),
                    ));
                }
                guards.live_workers_max = n;
            }
            if let Some(u) = g.usd_max {
                guards.usd_max =
                    Some(check_usd("guards.usd_max", u).map_err(|_| {
                        invalid("guards.usd_max", "a positive number of US dollars")
                    })?);
            }
        }
        let pack = Pack {
            name: file.name,
            description: file.description,
            profile,
            phases,
            guards,
            orchestrator_prompt: file.orchestrator.map(|o| o.prompt),
        };
        pack.check_reads()?;
        let order = pack.order()?;
        pack.check_overlap(&order)?;
        Ok(pack)
    }

    /// Check that every phase's prompt file exists and is readable text, through `read`
    /// (the pack's directory is the caller's); `pack_invalid` naming the phase's field.
    pub fn check_prompts(
        &self,
        read: impl Fn(&str) -> Result<String, String>,
    ) -> Result<(), Refusal> {
        let files = self
            .phases
            .iter()
            .enumerate()
            .filter_map(|(i, p)| Some((format!("phases[{i}].prompt"), p.prompt.as_ref()?)))
            .chain(
                self.orchestrator_prompt
                    .iter()
                    .map(|f| ("orchestrator.prompt".to_string(), f)),
            );
        for (field, file) in files {
            match read(file) {
                Ok(t) if t.len() <= PROMPT_BYTES_MAX => {}
                Ok(_) => {
                    return Err(invalid(
                        &field,
                        format!("{file}: more than {PROMPT_BYTES_MAX} bytes"),
                    ));
                }
                Err(why) => return Err(invalid(&field, format!("{file}: {why}"))),
            }
        }
        Ok(())
    }

    /// Whether an agent orchestrates this pack: its `orchestrator` role is bound to a
    /// backend. Otherwise the daemon's scheduler dispatches each ready phase itself.
    pub fn agent_orchestrated(&self) -> bool {
        self.profile
            .role(ORCHESTRATOR)
            .is_some_and(|r| !r.adapter.is_empty())
    }

    /// An agent orchestrator needs its choreography: `pack_invalid` on `orchestrator.prompt`
    /// when the orchestrator role is bound and the pack names no prompt file for it.
    pub fn check_orchestrator(&self) -> Result<(), Refusal> {
        if self.agent_orchestrated() && self.orchestrator_prompt.is_none() {
            return Err(invalid(
                "orchestrator.prompt",
                "the orchestrator role is bound, and the pack names no prompt file for it",
            )
            .hint("add [orchestrator] prompt = \"FILE\" to the pack"));
        }
        Ok(())
    }

    /// Bind the person's `NAME=ADAPTER:MODEL` strings (`field` names them in a refusal). A
    /// panel's role is named once per reviewer: its second binding seats `<role>-2`, its
    /// third `<role>-3`, each with the role's policy and prompt (`Phase::seats`). Any other
    /// role named twice is refused: a second binding would silently replace the first.
    pub fn bind_roles(&mut self, field: &str, bindings: &[String]) -> Result<(), Refusal> {
        let panels: Vec<String> = self
            .phases
            .iter()
            .filter(|p| p.kind == PhaseKind::Panel)
            .filter_map(|p| p.role.clone())
            .collect();
        let mut times: BTreeMap<String, u32> = BTreeMap::new();
        for b in bindings {
            let (name, adapter, model) = crate::profile::parse_binding(field, b)?;
            let n = times.entry(name.to_string()).or_insert(0);
            *n += 1;
            if *n == 1 {
                self.profile.bind(name, adapter, model);
                continue;
            }
            if !panels.iter().any(|p| p == name) {
                return Err(Refusal::invalid(
                    field,
                    format!(
                        "{name} is bound twice: only a panel's role is bound once per reviewer"
                    ),
                ));
            }
            let seat = format!("{name}-{n}");
            if self.profile.role(&seat).is_none()
                && let Some(base) = self.profile.role(name)
            {
                let mut r = base.clone();
                r.name = seat.clone();
                r.adapter.clear();
                self.profile.roles.push(r);
            }
            self.profile.bind(&seat, adapter, model);
        }
        Ok(())
    }

    /// Keep only the roles the phases run (a role no phase runs needs no backend).
    pub fn keep_used_roles(&mut self) {
        let used: Vec<String> = self
            .phases
            .iter()
            .flat_map(|p| {
                p.role
                    .iter()
                    .cloned()
                    .chain(p.seats())
                    .chain(p.judge.clone())
            })
            .collect();
        let agent_orchestrated = self.agent_orchestrated();
        self.profile
            .roles
            .retain(|r| used.contains(&r.name) || (agent_orchestrated && r.name == ORCHESTRATOR));
    }

    /// The pack as data, for a person or a script.
    pub fn view(&self) -> serde_json::Value {
        let phases: Vec<serde_json::Value> = self
            .phases
            .iter()
            .map(|p| {
                serde_json::json!({"name": p.name, "kind": p.kind.as_str(), "role": p.role,
                    "reads": p.reads.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                    "writes": p.writes.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                    "after": self.predecessors()[p.name.as_str()], "approve": p.approve,
                    "reviewers": p.reviewers, "seats": p.seats(),
                    "debate": (p.kind == PhaseKind::Panel).then_some(p.debate),
                    "judge": p.judge,
                    "plan": (p.kind == PhaseKind::Agent).then_some(p.plan),
                    "distinct": (p.kind == PhaseKind::Panel).then(|| p.distinct.as_str()),
                    "prompt": p.prompt})
            })
            .collect();
        serde_json::json!({"pack": self.name, "description": self.description,
            "roles": self.profile.roles, "phases": phases,
            "guards": {"live_workers_max": self.guards.live_workers_max, "usd_max": self.guards.usd_max}})
    }

    pub fn phase(&self, name: &str) -> Option<&Phase> {
        self.phases.iter().find(|p| p.name == name)
    }

    /// Every read names a kind some phase writes.
    fn check_reads(&self) -> Result<(), Refusal> {
        for (i, p) in self.phases.iter().enumerate() {
            for (j, r) in p.reads.iter().enumerate() {
                if !self.phases.iter().any(|q| q.writes.contains(r)) {
                    return Err(invalid(
                        &format!("phases[{i}].reads[{j}]"),
                        format!("no phase writes {r}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The phases each comes after, directly: every writer of what it reads, and what it
    /// names in `after`.
    pub fn predecessors(&self) -> BTreeMap<&str, BTreeSet<&str>> {
        let mut out: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for p in &self.phases {
            let e = out.entry(p.name.as_str()).or_default();
            for q in &self.phases {
                if p.reads.iter().any(|r| q.writes.contains(r)) {
                    e.insert(q.name.as_str());
                }
            }
            e.extend(p.after.iter().map(String::as_str));
        }
        out
    }

    /// For each phase, every phase it comes after (transitively); `pack_cycle` when one comes
    /// after itself, naming the phases of the cycle.
    fn order(&self) -> Result<BTreeMap<&str, BTreeSet<&str>>, Refusal> {
        let pred = self.predecessors();
        // depth-first, with the path kept to name a cycle
        fn visit<'a>(
            n: &'a str,
            pred: &BTreeMap<&'a str, BTreeSet<&'a str>>,
            path: &mut Vec<&'a str>,
            done: &mut BTreeMap<&'a str, BTreeSet<&'a str>>,
        ) -> Result<(), Vec<&'a str>> {
            if done.contains_key(n) {
                return Ok(());
            }
            if let Some(at) = path.iter().position(|p| *p == n) {
                let mut cycle = path[at..].to_vec();
                cycle.push(n);
                return Err(cycle);
            }
            path.push(n);
            let mut all = BTreeSet::new();
            for &q in pred.get(n).into_iter().flatten() {
                visit(q, pred, path, done)?;
                all.insert(q);
                all.extend(done[q].iter().copied());
            }
            path.pop();
            done.insert(n, all);
            Ok(())
        }
        let mut done = BTreeMap::new();
        for p in &self.phases {
            visit(&p.name, &pred, &mut Vec::new(), &mut done).map_err(|cycle| {
                Refusal::new(
                    Code::PackCycle,
                    format!("the phases come after each other: {}", cycle.join(" → ")),
                )
                .detail(serde_json::json!({"cycle": cycle}))
            })?;
        }
        Ok(done)
    }

    /// Two phases that write one key must be ordered (one after the other): unordered, they
    /// may run together and one's version would silently replace the other's.
    fn check_overlap(&self, order: &BTreeMap<&str, BTreeSet<&str>>) -> Result<(), Refusal> {
        for (i, a) in self.phases.iter().enumerate() {
            for b in &self.phases[i + 1..] {
                let Some(k) = a.writes.iter().find(|k| b.writes.contains(k)) else {
                    continue;
                };
                let ordered = order[a.name.as_str()].contains(b.name.as_str())
                    || order[b.name.as_str()].contains(a.name.as_str());
                if !ordered {
                    return Err(Refusal::new(
                        Code::PackWriteOverlap,
                        format!(
                            "phases {} and {} both write {k} and neither comes after the other",
                            a.name, b.name
                        ),
                    )
                    .detail(serde_json::json!({"phases": [a.name, b.name], "key": k.to_string()}))
                    .hint("order them: name one in the other's `after`"));
                }
            }
        }
        Ok(())
    }
}

fn phase(
    i: usize,
    p: &PhaseFile,
    profile: &Profile,
    names: &BTreeSet<&str>,
) -> Result<Phase, Refusal> {
    let at = |f: &str| format!("phases[{i}].{f}");
    if !valid_name(&p.name) {
        return Err(invalid(&at("name"), "1..=32 of a-z, 0-9, _ and -"));
    }
    let kind = match p.kind.as_str() {
        "agent" => PhaseKind::Agent,
        "panel" => PhaseKind::Panel,
        "gate" => PhaseKind::Gate,
        "approval" => PhaseKind::Approval,
        other => {
            return Err(invalid(
                &at("kind"),
                format!("{other:?} is not a phase kind (agent, panel, gate, approval)"),
            ));
        }
    };
    let kinds = |list: &[String], f: &str| -> Result<Vec<ArtifactKind>, Refusal> {
        let mut out: Vec<ArtifactKind> = Vec::new();
        for (j, k) in list.iter().enumerate() {
            let k = ArtifactKind::parse(&format!("{}[{j}]", at(f)), k)
                .map_err(|r| invalid(&format!("{}[{j}]", at(f)), r.message))?;
            if !out.contains(&k) {
                out.push(k);
            }
        }
        Ok(out)
    };
    let reads = kinds(&p.reads, "reads")?;
    let writes = kinds(&p.writes, "writes")?;
    let role = match (kind, &p.role) {
        (PhaseKind::Agent | PhaseKind::Panel, None) => {
            return Err(invalid(
                &at("role"),
                "an agent or panel phase names its role",
            ));
        }
        (PhaseKind::Gate | PhaseKind::Approval, Some(_)) => {
            return Err(invalid(
                &at("role"),
                "a gate or approval phase runs no role",
            ));
        }
        (_, Some(r)) if profile.role(r).is_none() => {
            return Err(invalid(
                &at("role"),
                format!("{r:?} is not a role of the profile"),
            ));
        }
        (_, r) => r.clone(),
    };
    if matches!(kind, PhaseKind::Gate | PhaseKind::Approval) && !writes.is_empty() {
        return Err(invalid(
            &at("writes"),
            "a gate or approval phase writes nothing",
        ));
    }
    if matches!(kind, PhaseKind::Agent | PhaseKind::Panel) && writes.is_empty() {
        return Err(invalid(
            &at("writes"),
            "an agent or panel phase writes at least one artifact (its run is done when they exist and validate)",
        ));
    }
    for (j, a) in p.after.iter().enumerate() {
        if !names.contains(a.as_str()) || *a == p.name {
            return Err(invalid(
                &format!("{}[{j}]", at("after")),
                format!("{a:?} is not another phase of the pack"),
            ));
        }
    }
    let reviewers = match (kind, p.reviewers) {
        (PhaseKind::Panel, Some(n)) if (1..=PANEL_REVIEWERS_MAX).contains(&n) => Some(n),
        (PhaseKind::Panel, None) => Some(1),
        (PhaseKind::Panel, Some(_)) => {
            return Err(invalid(
                &at("reviewers"),
                format!("1..={PANEL_REVIEWERS_MAX}"),
            ));
        }
        (_, Some(_)) => return Err(invalid(&at("reviewers"), "a panel's field")),
        (_, None) => None,
    };
    let distinct = match (kind, p.distinct.as_deref()) {
        (PhaseKind::Panel, None | Some("backend")) => Distinct::Backend,
        (PhaseKind::Panel, Some("family")) => Distinct::Family,
        (PhaseKind::Panel, Some(other)) => {
            return Err(invalid(
                &at("distinct"),
                format!("{other:?} is not backend or family"),
            ));
        }
        (_, Some(_)) => return Err(invalid(&at("distinct"), "a panel's field")),
        (_, None) => Distinct::Backend,
    };
    let timeout_ms = match (kind, p.timeout_ms) {
        (PhaseKind::Panel, Some(t)) if (1_000..=PANEL_TIMEOUT_MS_MAX).contains(&t) => Some(t),
        (PhaseKind::Panel, Some(_)) => {
            return Err(invalid(
                &at("timeout_ms"),
                format!("1000..={PANEL_TIMEOUT_MS_MAX} milliseconds"),
            ));
        }
        (_, Some(_)) => return Err(invalid(&at("timeout_ms"), "a panel's field")),
        (_, None) => None,
    };
    let fix_loops_max = match (kind, p.fix_loops_max) {
        (PhaseKind::Panel, Some(n)) if n <= FIX_LOOPS_MAX => Some(n),
        (PhaseKind::Panel, Some(_)) => {
            return Err(invalid(
                &at("fix_loops_max"),
                format!("0..={FIX_LOOPS_MAX}"),
            ));
        }
        (PhaseKind::Panel, None) => Some(FIX_LOOPS_DEFAULT),
        (_, Some(_)) => return Err(invalid(&at("fix_loops_max"), "a panel's field")),
        (_, None) => None,
    };
    let debate = match (kind, p.debate) {
        (PhaseKind::Panel, d) => d.unwrap_or(false),
        (_, Some(_)) => return Err(invalid(&at("debate"), "a panel's field")),
        (_, None) => false,
    };
    let judge = match (kind, &p.judge) {
        (PhaseKind::Panel, Some(j)) if profile.role(j).is_none() => {
            return Err(invalid(
                &at("judge"),
                format!("{j:?} is not a role of the profile"),
            ));
        }
        (PhaseKind::Panel, Some(j)) if role.as_deref() == Some(j.as_str()) => {
            return Err(invalid(
                &at("judge"),
                "a panel's judge is not one of its reviewers",
            ));
        }
        (PhaseKind::Panel, j) => j.clone(),
        (_, Some(_)) => return Err(invalid(&at("judge"), "a panel's field")),
        (_, None) => None,
    };
    let plan = match (kind, p.plan) {
        (PhaseKind::Agent, Some(true)) if writes.is_empty() => {
            return Err(invalid(
                &at("plan"),
                "a plan gates writes: the phase writes nothing",
            ));
        }
        (PhaseKind::Agent, a) => a.unwrap_or(false),
        (_, Some(_)) => return Err(invalid(&at("plan"), "an agent phase's field")),
        (_, None) => false,
    };
    if kind == PhaseKind::Panel && writes.iter().any(|w| *w != ArtifactKind::Findings) {
        return Err(invalid(
            &at("writes"),
            "a panel writes findings (one per reviewer), nothing else",
        ));
    }
    let commands = gate_commands(i, kind, &p.commands)?;
    if let Some(pr) = &p.prompt
        && (pr.is_empty()
            || pr.len() > 256
            || pr.starts_with('/')
            || pr.split('/').any(|c| c.is_empty() || c == "." || c == ".."))
    {
        return Err(invalid(
            &at("prompt"),
            "a file relative to the pack, without '.', '..' or empty components",
        ));
    }
    let reaches = role
        .as_deref()
        .and_then(|r| profile.role(r))
        .is_some_and(|r| {
            r.policy.project == crate::profile::ProjectAccess::Write || r.policy.network
        });
    let approve = match (kind, p.approve) {
        (PhaseKind::Approval, Some(false)) => {
            return Err(invalid(
                &at("approve"),
                "an approval phase is always approved",
            ));
        }
        (PhaseKind::Approval, _) => true,
        (_, Some(a)) => a,
        (_, None) => reaches,
    };
    Ok(Phase {
        name: p.name.clone(),
        kind,
        role,
        reads,
        writes,
        after: p.after.clone(),
        prompt: p.prompt.clone(),
        reviewers,
        distinct,
        timeout_ms,
        fix_loops_max,
        debate,
        judge,
        plan,
        commands,
        approve,
    })
}

/// A gate's commands, each parsed as a `command` acceptance check (an absolute program, the
/// exact arguments, a bounded time); only a gate has them, and a gate has at least one.
fn gate_commands(i: usize, kind: PhaseKind, list: &[toml::Value]) -> Result<Vec<Check>, Refusal> {
    let field = format!("phases[{i}].commands");
    match (kind, list.is_empty()) {
        (PhaseKind::Gate, true) => return Err(invalid(&field, "a gate runs at least one command")),
        (PhaseKind::Gate, false) if list.len() > GATE_COMMANDS_MAX => {
            return Err(invalid(&field, format!("at most {GATE_COMMANDS_MAX}")));
        }
        (PhaseKind::Gate, false) => {}
        (_, true) => return Ok(Vec::new()),
        (_, false) => return Err(invalid(&field, "only a gate runs commands")),
    }
    list.iter()
        .enumerate()
        .map(|(j, c)| {
            let f = format!("{field}[{j}]");
            let mut v = serde_json::to_value(c).map_err(|e| invalid(&f, e))?;
            match v.as_object_mut() {
                Some(o) => {
                    o.insert("kind".into(), serde_json::json!("command"));
                }
                None => {
                    return Err(invalid(
                        &f,
                        "a command is a table {program, args, timeout_ms}",
                    ));
                }
            }
            Check::parse(&f, &v).map_err(|r| invalid(&f, r.message))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<Pack, Refusal> {
        Pack::load(text, &Profile::default())
    }

    #[track_caller]
    fn refused(text: &str, code: Code) -> Refusal {
        let r = load(text).unwrap_err();
        assert_eq!(r.code, code, "{r}");
        r
    }

    #[test]
    fn the_shipped_pack_loads_in_its_order() {
        let p = Pack::default_pack();
        let names: Vec<&str> = p.phases.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "spec",
                "research",
                "architecture",
                "implementation",
                "gate",
                "review",
                "approval"
            ]
        );
        let pred = p.predecessors();
        assert!(pred["research"].contains("spec"));
        assert!(!pred["research"].contains("architecture"));
        assert!(pred["review"].contains("gate"));
        // implementation writes the project: its dispatch waits for approval
        assert!(p.phase("implementation").unwrap().approve);
        // research reaches the network: so does its approval
        assert!(p.phase("research").unwrap().approve);
        assert!(!p.phase("architecture").unwrap().approve);
        assert_eq!(p.phase("gate").unwrap().commands.len(), 1);
    }

    const TWO: &str = r#"
name = "t"
[[phases]]
name = "a"
kind = "agent"
role = "architecture"
writes = ["spec"]
[[phases]]
name = "b"
kind = "agent"
role = "search"
reads = ["spec"]
writes = ["research"]
"#;

    #[test]
    fn a_minimal_pack_loads() {
        let p = load(TWO).unwrap();
        assert_eq!(p.phases.len(), 2);
    }

    #[test]
    fn unknown_kinds_and_roles_and_unwritten_reads_are_pack_invalid() {
        let r = refused(
            &TWO.replace(
                "kind = \"agent\"\nrole = \"search\"",
                "kind = \"dance\"\nrole = \"search\"",
            ),
            Code::PackInvalid,
        );
        assert_eq!(r.detail["field"], "phases[1].kind");
        let r = refused(
            &TWO.replace("role = \"search\"", "role = \"oracle\""),
            Code::PackInvalid,
        );
        assert_eq!(r.detail["field"], "phases[1].role");
        let r = refused(
            &TWO.replace("reads = [\"spec\"]", "reads = [\"adr\"]"),
            Code::PackInvalid,
        );
        assert_eq!(r.detail["field"], "phases[1].reads[0]");
        let r = refused("name = \"t\"\nphases = 3\n", Code::PackInvalid);
        assert_eq!(r.detail["field"], "(pack)");
        let r = refused(
            &TWO.replace(
                "writes = [\"research\"]",
                "writes = [\"research\"]\nafter = [\"nowhere\"]",
            ),
            Code::PackInvalid,
        );
        assert_eq!(r.detail["field"], "phases[1].after[0]");
    }

    #[test]
    fn a_cycle_is_refused_naming_its_phases() {
        let text = TWO.replace(
            "role = \"architecture\"\nwrites = [\"spec\"]",
            "role = \"architecture\"\nreads = [\"research\"]\nwrites = [\"spec\"]",
        );
        let r = refused(&text, Code::PackCycle);
        let cycle: Vec<&str> = r.detail["cycle"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(cycle.contains(&"a") && cycle.contains(&"b"), "{r}");
    }

    #[test]
    fn two_unordered_phases_writing_one_key_are_refused_and_ordering_them_admits_them() {
        let c = "\n[[phases]]\nname = \"c\"\nkind = \"agent\"\nrole = \"architecture\"\nreads = [\"spec\"]\nwrites = [\"research\"]\n";
        let r = refused(&format!("{TWO}{c}"), Code::PackWriteOverlap);
        assert_eq!(r.detail["key"], "research");
        assert_eq!(r.detail["phases"], serde_json::json!(["b", "c"]));
        load(&format!("{TWO}{c}after = [\"b\"]\n")).unwrap();
    }

    #[test]
    fn a_gate_runs_commands_and_writes_nothing() {
        let gate = format!(
            "{TWO}\n[[phases]]\nname = \"g\"\nkind = \"gate\"\nafter = [\"b\"]\ncommands = [{{ program = \"/usr/bin/true\" }}]\n"
        );
        let p = load(&gate).unwrap();
        assert!(p.phase("g").unwrap().commands[0].is_command());
        let r = refused(&gate.replace("/usr/bin/true", "true"), Code::PackInvalid);
        assert_eq!(r.detail["field"], "phases[2].commands[0]");
        let r = refused(
            &gate.replace("after = [\"b\"]", "after = [\"b\"]\nwrites = [\"adr\"]"),
            Code::PackInvalid,
        );
        assert_eq!(r.detail["field"], "phases[2].writes");
    }

    #[test]
    fn a_debate_round_is_a_panel_s_field() {
        let p = Pack::default_pack();
        assert!(!p.phase("review").unwrap().debate, "off unless asked");
        let on = DEFAULT_PACK.replace("reviewers = 2\n", "reviewers = 2\ndebate = true\n");
        assert!(load(&on).unwrap().phase("review").unwrap().debate);
        let r = refused(
            &DEFAULT_PACK.replace(
                "writes = [\"spec\"]\nprompt",
                "writes = [\"spec\"]\ndebate = true\nprompt",
            ),
            Code::PackInvalid,
        );
        assert_eq!(r.detail["field"], "phases[0].debate", "{r}");
        // a plan gates an agent phase's writes
        let planned = DEFAULT_PACK.replace(
            "writes = [\"diff\"]\nprompt",
            "writes = [\"diff\"]\nplan = true\nprompt",
        );
        assert!(
            load(&planned)
                .unwrap()
                .phase("implementation")
                .unwrap()
                .plan
        );
        let r = refused(
            &DEFAULT_PACK.replace("kind = \"gate\"\n", "kind = \"gate\"\nplan = true\n"),
            Code::PackInvalid,
        );
        assert_eq!(r.detail["field"], "phases[4].plan", "{r}");
        // a judge is a role of the profile, not the panel's own, and only a panel's
        let judged =
            DEFAULT_PACK.replace("reviewers = 2\n", "reviewers = 2\njudge = \"reasoning\"\n");
        let p = load(&judged).unwrap();
        assert!(p.phase("review").unwrap().judged_by("reasoning"));
        for (text, field) in [
            (
                DEFAULT_PACK.replace("reviewers = 2\n", "reviewers = 2\njudge = \"nobody\"\n"),
                "phases[5].judge",
            ),
            (
                DEFAULT_PACK.replace("reviewers = 2\n", "reviewers = 2\njudge = \"review\"\n"),
                "phases[5].judge",
            ),
            (
                DEFAULT_PACK.replace("kind = \"gate\"\n", "kind = \"gate\"\njudge = \"review\"\n"),
                "phases[4].judge",
            ),
        ] {
            let r = refused(&text, Code::PackInvalid);
            assert_eq!(r.detail["field"], field, "{r}");
        }
    }
}
