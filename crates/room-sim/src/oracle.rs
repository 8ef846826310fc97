//! An independent check of the five runtime invariants over the journals as they are on disk.
//! It shares no code with `room_engine::invariants`: it replays every record of a room from its
//! raw JSON and rebuilds tasks, leases and lifecycles on its own, so a bug in the engine's
//! checks (or their projection) shows up here instead of being agreed with.

use room_core::Record;
use serde_json::Value;
use std::collections::BTreeMap;

/// A sweep that succeeded: the clock it ran at and each room's tip right after it.
pub struct Sweep {
    pub now_ms: u64,
    pub tips: BTreeMap<String, u64>,
}

const TASKED_TTL_MS: u64 = 20 * 60 * 1000;

struct Task {
    recipient: Option<String>,
    status: String,
    scopes: Vec<String>,
    parent: Option<String>,
    /// A live lease on its scopes: taken by a claim, given up by any transition and by the
    /// lapse of its holder's claim.
    leased: bool,
    /// It declared acceptance checks: it closes only on a passing evaluation.
    checked: bool,
    /// Seqs of its newest amendment and its newest claim: a done closes it only on a claim
    /// taken after the terms it measures.
    amended_seq: u64,
    claimed_seq: u64,
}

struct Life {
    begun: bool,
    began_ms: u64,
    ttl_ms: u64,
    lapsed: bool,
}

/// The oracle's own conflict rule: file scopes overlap when one path is a component-wise
/// prefix of the other; other namespaces only when identical.
fn overlap(a: &str, b: &str) -> bool {
    match (a.strip_prefix("file:"), b.strip_prefix("file:")) {
        (Some(x), Some(y)) => {
            let (xs, ys): (Vec<&str>, Vec<&str>) = (x.split('/').collect(), y.split('/').collect());
            let n = xs.len().min(ys.len());
            xs[..n] == ys[..n]
        }
        (None, None) => a == b,
        _ => false,
    }
}

fn s(v: &Value) -> Option<String> {
    v.as_str().map(String::from)
}

#[derive(Default)]
struct Replay {
    /// (actor, key) → the event that registered it.
    keys: BTreeMap<(String, String), String>,
    tasks: BTreeMap<String, Task>,
    lives: BTreeMap<(String, String), Life>,
    /// A `done` over unresolved children: (its event id, task), whose flag must come next.
    expect_flag: Option<(String, String)>,
}

impl Replay {
    fn record(&mut self, r: &Record) -> Result<(), String> {
        let ev = &r.event;
        let kind = ev["kind"].as_str().unwrap_or_default();
        let actor = s(&ev["actor"]).unwrap_or_default();
        let at = format!("seq {} ({})", r.seq, r.id);
        if let Some((eid, task)) = self.expect_flag.take() {
            let ok = kind == "invariant_violation"
                && ev["invariant"] == "children_open"
                && ev["severity"] == "flag"
                && ev["event"] == eid.as_str()
                && ev["task"] == task.as_str();
            if !ok {
                return Err(format!(
                    "children_open: done {eid} on {task} over unresolved children is not followed by its flag (at {at})"
                ));
            }
            return Ok(());
        }
        if kind != "invariant_violation"
            && let Some(key) = s(&ev["idempotency_key"])
            && self
                .keys
                .insert((actor.clone(), key.clone()), r.id.clone())
                .is_some()
        {
            return Err(format!(
                "exactly_once: {actor} committed idempotency key {key} twice (at {at})"
            ));
        }
        match kind {
            "task" => self.task(r, ev, &actor, &at),
            "turn" => self.turn(r, ev, &actor, &at),
            "invariant_violation" => self.violation(r, ev, &actor, &at),
            _ => Ok(()),
        }
    }

    fn task(&mut self, r: &Record, ev: &Value, actor: &str, at: &str) -> Result<(), String> {
        let id = s(&ev["task"]).unwrap_or_default();
        if let Some(c) = ev.get("created") {
            self.tasks.insert(
                id.clone(),
                Task {
                    recipient: s(&c["recipient"]),
                    status: "open".into(),
                    scopes: c["scopes"]
                        .as_array()
                        .map(|a| a.iter().filter_map(s).collect())
                        .unwrap_or_default(),
                    parent: s(&c["parent"]),
                    leased: false,
                    checked: c["acceptance"].as_array().is_some_and(|a| !a.is_empty()),
                    amended_seq: 0,
                    claimed_seq: 0,
                },
            );
        }
        if let Some(terms) = ev.get("terms")
            && let Some(t) = self.tasks.get_mut(&id)
        {
            t.checked = terms["acceptance"]
                .as_array()
                .is_some_and(|a| !a.is_empty());
            t.amended_seq = r.seq;
        }
        let settled_by_owner = ev["transition"]["to"]
            .as_str()
            .filter(|s| matches!(*s, "superseded" | "cancelled"));
        if let Some(to) = settled_by_owner {
            if let Some(t) = self.tasks.get_mut(&id) {
                t.status = to.into();
                t.leased = false;
            }
            for ((_, lt), l) in self.lives.iter_mut() {
                if *lt == id {
                    l.begun = false;
                }
            }
        }
        if ev["transition"]["to"] == "claimed" {
            let mine = self
                .tasks
                .get(&id)
                .map(|t| t.scopes.clone())
                .unwrap_or_default();
            for (oid, o) in &self.tasks {
                if *oid == id || !o.leased || o.recipient.as_deref() == Some(actor) {
                    continue;
                }
                for a in &mine {
                    if let Some(b) = o.scopes.iter().find(|b| overlap(a, b)) {
                        return Err(format!(
                            "exclusive: {actor} claimed {id} ({a}) while {:?} held {oid} ({b}) (at {at})",
                            o.recipient
                        ));
                    }
                }
            }
            if let Some(t) = self.tasks.get_mut(&id) {
                t.status = "claimed".into();
                t.recipient = Some(actor.into());
                t.leased = !t.scopes.is_empty();
                t.claimed_seq = r.seq;
            }
            self.lives.insert(
                (actor.into(), id),
                Life {
                    begun: true,
                    began_ms: r.hlc.ms,
                    ttl_ms: ev["ttl_ms"].as_u64().unwrap_or(TASKED_TTL_MS),
                    lapsed: false,
                },
            );
        }
        Ok(())
    }

    fn begun(&self, actor: &str, task: &str) -> bool {
        self.lives
            .get(&(actor.to_string(), task.to_string()))
            .is_some_and(|l| l.begun)
    }

    fn turn(&mut self, r: &Record, ev: &Value, actor: &str, at: &str) -> Result<(), String> {
        let verb = ev["verb"].as_str().unwrap_or_default();
        let Some(task) = s(&ev["task"]) else {
            return Ok(());
        };
        if verb == "done" && !self.begun(actor, &task) {
            return Err(format!(
                "well_formed: {actor} did done on {task} outside a lifecycle it began (at {at})"
            ));
        }
        let own = self
            .tasks
            .get(&task)
            .is_some_and(|t| t.recipient.as_deref() == Some(actor));
        if matches!(verb, "note" | "send") && own && !self.begun(actor, &task) {
            return Err(format!(
                "well_formed: {actor} did {verb} on its task {task} before claiming it (at {at})"
            ));
        }
        if verb == "done" {
            // completion is a measurement: a task with checks closes only on a passing
            // evaluation of every one, and a done proves nothing it did not measure
            let checked = self.tasks.get(&task).is_some_and(|t| t.checked);
            if let Some(t) = self.tasks.get(&task)
                && t.claimed_seq < t.amended_seq
            {
                return Err(format!(
                    "authority: {actor} closed {task} on a claim taken before its amendment (at {at})"
                ));
            }
            let d = &ev["detail"];
            let passed = d["acceptance"] == "passed"
                && d["acceptance_results"]
                    .as_array()
                    .is_some_and(|r| !r.is_empty() && r.iter().all(|x| x["pass"] == true));
            if checked && !passed {
                return Err(format!(
                    "acceptance: {actor} closed {task} without a passing evaluation of its checks (at {at})"
                ));
            }
            let resolves = ev["resolves"].as_array().is_some_and(|r| !r.is_empty());
            if !passed && resolves {
                return Err(format!(
                    "acceptance: {actor}'s done on {task} resolved obligations it did not prove (at {at})"
                ));
            }
            let open_children = self.tasks.values().any(|t| {
                t.parent.as_deref() == Some(task.as_str())
                    && !matches!(
                        t.status.as_str(),
                        "done" | "declined" | "superseded" | "cancelled"
                    )
            });
            if open_children {
                self.expect_flag = Some((r.id.clone(), task.clone()));
            }
        }
        if let Some(tr) = ev.get("task_transition") {
            if let Some(t) = self.tasks.get_mut(&task) {
                t.status = s(&tr["to"]).unwrap_or_default();
                t.recipient = s(&tr["recipient"]);
                t.leased = false;
            }
            for ((_, lt), l) in self.lives.iter_mut() {
                if *lt == task {
                    l.begun = false;
                }
            }
        }
        Ok(())
    }

    fn violation(&mut self, r: &Record, ev: &Value, actor: &str, at: &str) -> Result<(), String> {
        match (ev["invariant"].as_str(), ev["severity"].as_str()) {
            (Some("children_open"), _) => Err(format!(
                "children_open: a flag with no done over unresolved children before it (at {at})"
            )),
            (Some("resolution"), Some("in_doubt")) => {
                let task = s(&ev["task"]).unwrap_or_default();
                let l = self.lives.get_mut(&(actor.to_string(), task.clone()));
                match l {
                    Some(l) if l.begun && !l.lapsed && l.began_ms + l.ttl_ms <= r.hlc.ms => {
                        l.lapsed = true;
                        // the holder's lapsed claim gives its lease up
                        if let Some(t) = self.tasks.get_mut(&task)
                            && t.recipient.as_deref() == Some(actor)
                        {
                            t.leased = false;
                        }
                        Ok(())
                    }
                    _ => Err(format!(
                        "resolution: {actor}'s claim of {task} recorded in doubt though it was not a begun, unlapsed claim past its TTL (at {at})"
                    )),
                }
            }
            (Some(inv), Some("reject")) => self.rejected(inv, ev, actor, at),
            other => Err(format!(
                "an invariant_violation record of unknown shape {other:?} (at {at})"
            )),
        }
    }

    /// A rejection must be justified by the state the oracle itself replayed: an engine that
    /// refused good acts would pass every other check.
    fn rejected(&self, inv: &str, ev: &Value, actor: &str, at: &str) -> Result<(), String> {
        let task = s(&ev["task"]).unwrap_or_default();
        let act = ev["act"].as_str().unwrap_or_default();
        // the aggregate standing for rejections the flood bound left without records
        if act == "suppressed" {
            return match ev["detail"]["suppressed"].as_u64() {
                Some(n) if n > 0 => Ok(()),
                _ => Err(format!(
                    "{inv}: an aggregate record that counts nothing (at {at})"
                )),
            };
        }
        let ok = match inv {
            "exactly_once" => {
                let key = s(&ev["detail"]["key"]).unwrap_or_default();
                self.keys.get(&(actor.to_string(), key)).map(String::as_str)
                    == ev["detail"]["original_event"].as_str()
            }
            "well_formed" => {
                let own = self
                    .tasks
                    .get(&task)
                    .is_some_and(|t| t.recipient.as_deref() == Some(actor));
                !self.begun(actor, &task) && (act == "done" || own)
            }
            "exclusive" => {
                let mine = self
                    .tasks
                    .get(&task)
                    .map(|t| t.scopes.clone())
                    .unwrap_or_default();
                self.tasks.iter().any(|(oid, o)| {
                    *oid != task
                        && o.leased
                        && o.recipient.as_deref() != Some(actor)
                        && o.scopes.iter().any(|b| mine.iter().any(|a| overlap(a, b)))
                })
            }
            _ => false,
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{inv}: {actor}'s {act} on {task:?} was rejected though the replayed state does not justify it (at {at})"
            ))
        }
    }

    /// At a sweep: every begun claim past its TTL must have been recorded in doubt.
    fn swept(&self, now_ms: u64, room: &str) -> Result<(), String> {
        for ((agent, task), l) in &self.lives {
            if l.begun && !l.lapsed && l.began_ms + l.ttl_ms <= now_ms {
                return Err(format!(
                    "resolution: in room {room}, {agent}'s claim of {task} (began {} ms, ttl {} ms) was past its TTL at the sweep at {now_ms} ms and not recorded in doubt",
                    l.began_ms, l.ttl_ms
                ));
            }
        }
        Ok(())
    }
}

/// The oracle for one live room, fed after every step with what its journal gained.
pub struct RoomOracle {
    room: String,
    path: std::path::PathBuf,
    replay: Replay,
    /// Where the records replayed so far end, and the chain tip there.
    end: u64,
    tip: room_core::chain::ChainTip,
}

impl RoomOracle {
    pub fn new(room: &str, graph: &str, path: std::path::PathBuf) -> RoomOracle {
        RoomOracle {
            room: room.into(),
            path,
            replay: Replay::default(),
            end: 0,
            tip: room_core::chain::ChainTip::genesis(graph),
        }
    }

    /// Replay the whole records appended since the last call. A `done` that needs a flag must
    /// have it by now: both are written in one append.
    pub fn advance(&mut self) -> Result<(), String> {
        use std::os::unix::fs::FileExt;
        let room = self.room.clone();
        let file = std::fs::File::open(&self.path).map_err(|e| e.to_string())?;
        // Read whole lines up to the journal's free space (the first NUL) or its end; the
        // oracle parses and chains them itself rather than trusting the store's reader.
        let mut tail = Vec::new();
        let mut chunk = vec![0u8; 64 * 1024];
        let mut at = self.end;
        loop {
            let n = file.read_at(&mut chunk, at).map_err(|e| e.to_string())?;
            let data = &chunk[..n];
            let stop = data.iter().position(|&b| b == 0);
            tail.extend_from_slice(&data[..stop.unwrap_or(n)]);
            if n == 0 || stop.is_some() {
                break;
            }
            at += n as u64;
        }
        let whole = tail.iter().rposition(|&b| b == b'\n').map_or(0, |p| p + 1);
        for line in tail[..whole]
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            let r: Record = serde_json::from_slice(line)
                .map_err(|e| format!("room {room}: a journal line is not a record: {e}"))?;
            self.tip = r
                .verify_after(&self.tip)
                .map_err(|e| format!("room {room}: chain: {e}"))?;
            self.replay
                .record(&r)
                .map_err(|e| format!("room {room}: {e}"))?;
        }
        self.end += whole as u64;
        if let Some((eid, task)) = &self.replay.expect_flag {
            return Err(format!(
                "room {room}: causal: done {eid} on {task} over unresolved children was appended without its flag"
            ));
        }
        Ok(())
    }

    /// A stable order for oracles (by journal path).
    pub fn path_cmp(&self, other: &RoomOracle) -> std::cmp::Ordering {
        self.path.cmp(&other.path)
    }

    /// Right after a sweep at `now_ms`: every begun claim past its TTL is recorded in doubt.
    pub fn swept(&self, now_ms: u64) -> Result<(), String> {
        self.replay.swept(now_ms, &self.room)
    }
}

/// Check one room's records (in journal order).
pub fn check_room(room: &str, records: &[Record], sweep: Option<&Sweep>) -> Result<(), String> {
    let mut replay = Replay::default();
    let sweep_tip = sweep.and_then(|s| s.tips.get(room).copied());
    if let Some(tip) = sweep_tip
        && (records.len() as u64) < tip
    {
        return Err(format!(
            "room {room}: record {tip}, durable at the last sweep, is gone after a crash ({} records left)",
            records.len()
        ));
    }
    if let (Some(sw), Some(0)) = (sweep, sweep_tip) {
        replay.swept(sw.now_ms, room)?;
    }
    for r in records {
        replay.record(r).map_err(|e| format!("room {room}: {e}"))?;
        if let (Some(sw), Some(tip)) = (sweep, sweep_tip)
            && r.seq == tip
        {
            replay.swept(sw.now_ms, room)?;
        }
    }
    if let Some((eid, task)) = &replay.expect_flag {
        return Err(format!(
            "room {room}: causal: done {eid} on {task} over unresolved children is the last record and has no flag"
        ));
    }
    check_withholding(records).map_err(|e| format!("room {room}: withholding: {e}"))
}

fn names(v: &Value) -> Option<std::collections::BTreeSet<String>> {
    let set: std::collections::BTreeSet<String> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| n.as_str().map(String::from))
        .collect();
    (!set.is_empty()).then_some(set)
}

/// The withholding closure, from the raw records: a turn's audience holds its author and lies
/// within the audience of every causal parent it names (directly, or through the mention or
/// obligation it answers, or of evidence it cites), everyone it addresses is inside it, and the
/// records derived from it (its items, its flags) carry exactly its audience. Evidence lies within
/// its lineage's audience, and a task's evidence has none.
fn check_withholding(records: &[Record]) -> Result<(), String> {
    type Audience = Option<std::collections::BTreeSet<String>>;
    let mut of: BTreeMap<String, Audience> = BTreeMap::new();
    let mut item_source: BTreeMap<String, String> = BTreeMap::new();
    // evidence handles (ev_…) by the record that registered them
    let mut handle: BTreeMap<String, String> = BTreeMap::new();
    for r in records {
        let ev = &r.event;
        let at = format!("seq {} ({})", r.seq, r.id);
        let audience = names(&ev["audience"]);
        match ev["kind"].as_str().unwrap_or_default() {
            "turn" => {
                let actor = ev["actor"].as_str().unwrap_or_default();
                if let Some(a) = &audience
                    && !a.contains(actor)
                {
                    return Err(format!("{at}: its author {actor} is outside its audience"));
                }
                let mut parents: Vec<String> = ev["parents"]
                    .as_array()
                    .into_iter()
                    .chain(ev["evidence"].as_array())
                    .flatten()
                    .filter_map(s)
                    .map(|p| handle.get(&p).cloned().unwrap_or(p))
                    .collect();
                if let Some(t) = s(&ev["reply_to"]) {
                    parents.push(item_source.get(&t).cloned().unwrap_or(t));
                }
                // what it resolves answers that item's source (a task's turn is the task's)
                let resolves = if ev["task_transition"].is_null() {
                    ev["resolves"].as_array()
                } else {
                    None
                };
                for res in resolves.into_iter().flatten() {
                    if let Some(src) = s(&res["id"]).and_then(|i| item_source.get(&i).cloned()) {
                        parents.push(src);
                    }
                }
                for p in &parents {
                    let Some(Some(pa)) = of.get(p) else { continue };
                    if !audience.as_ref().is_some_and(|a| a.is_subset(pa)) {
                        return Err(format!(
                            "{at}: audience {audience:?} is wider than its parent {p}'s {pa:?}"
                        ));
                    }
                }
                if audience.is_some() && !ev["task_transition"].is_null() {
                    return Err(format!("{at}: a turn that moves a task has an audience"));
                }
                if let Some(a) = &audience {
                    let plan = &ev["plan"];
                    for list in [&ev["to"], &plan["mention"], &plan["oblige"], &plan["wake"]] {
                        for n in list.as_array().into_iter().flatten() {
                            let n = n.as_str().unwrap_or_default();
                            if !a.contains(n) {
                                return Err(format!(
                                    "{at}: addresses {n}, outside its audience {a:?}"
                                ));
                            }
                        }
                    }
                }
            }
            "items" => {
                let source = s(&ev["source"]).unwrap_or_default();
                if of.get(&source) != Some(&audience) {
                    return Err(format!(
                        "{at}: items of {source} carry audience {audience:?}, not their turn's"
                    ));
                }
                for list in [&ev["mentions"], &ev["obligations"]] {
                    for i in list.as_array().into_iter().flatten() {
                        if let Some(id) = s(&i["id"]) {
                            item_source.insert(id, source.clone());
                        }
                    }
                }
            }
            "evidence" => {
                let actor = ev["actor"].as_str().unwrap_or_default();
                if let Some(a) = &audience {
                    if !a.contains(actor) {
                        return Err(format!(
                            "{at}: its registrant {actor} is outside its audience"
                        ));
                    }
                    if !ev["task"].is_null() {
                        return Err(format!("{at}: a task's evidence with an audience"));
                    }
                }
                for l in ev["lineage"].as_array().into_iter().flatten() {
                    let Some(src) = s(l).and_then(|l| handle.get(&l).cloned()) else {
                        continue;
                    };
                    if let Some(Some(pa)) = of.get(&src)
                        && !audience.as_ref().is_some_and(|a| a.is_subset(pa))
                    {
                        return Err(format!(
                            "{at}: audience {audience:?} is wider than its lineage {src}'s {pa:?}"
                        ));
                    }
                }
                if let Some(h) = s(&ev["evidence"]) {
                    handle.insert(h, r.id.clone());
                }
            }
            "invariant_violation" if ev["severity"] == "flag" => {
                if let Some(e) = s(&ev["event"])
                    && let Some(turn) = of.get(&e)
                    && *turn != audience
                {
                    return Err(format!(
                        "{at}: a flag on {e} carries another audience than its act"
                    ));
                }
            }
            "invariant_violation" => {
                // a reject is withheld as the act it refused (or the first call it repeats) was
                let actor = ev["actor"].as_str().unwrap_or_default();
                if let Some(a) = &audience
                    && !a.contains(actor)
                {
                    return Err(format!(
                        "{at}: a reject withheld from its own actor {actor}"
                    ));
                }
                if let Some(orig) = s(&ev["detail"]["original_event"])
                    && let Some(Some(oa)) = of.get(&orig)
                    && audience.as_ref() != Some(oa)
                {
                    return Err(format!(
                        "{at}: an exactly_once reject names {orig} to readers outside its audience"
                    ));
                }
            }
            _ => {
                if audience.is_some() {
                    return Err(format!("{at}: a {} record with an audience", ev["kind"]));
                }
            }
        }
        of.insert(r.id.clone(), audience);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::overlap;

    #[test]
    fn the_oracle_overlap_rule() {
        assert!(overlap("file:src", "file:src/a.rs"));
        assert!(!overlap("file:src/a.rs", "file:src/b.rs"));
        assert!(!overlap("file:src", "api:src"));
        assert!(overlap("api:stripe", "api:stripe"));
    }
}
