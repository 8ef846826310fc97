//! `/api/events`: what changed, as server-sent events, for every open dashboard. One producer
//! per daemon scans the owner's views when a call may have moved something (the dispatcher's
//! change signal) and at least every [`SCAN_EVERY_MS`], and appends what it finds to a ring of
//! items numbered in order: committed events (and the tasks they name), wake state changes,
//! collaborations' and phases' state changes, and approvals. Each stream tails the ring.
//!
//! An item's SSE id is `<epoch>-<n>`. A browser that reconnects sends it as `Last-Event-ID`
//! and is given exactly the items after it: no gap, no duplicate. Where that cannot be
//! honoured (the id is from another producer's epoch, or so old the ring no longer holds what
//! followed it) the stream says `reset` instead of skipping silently, and the page reloads its
//! views. The producer stops [`IDLE_STOP_MS`] after its last stream ends; the next starts a
//! new epoch, because what happened in between was not recorded.

use super::{Ask, Dash, KEY_QUERY, cookie, hardened, refused, withhold_credentials};
use crate::wire::Response;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response as HttpResponse};
use room_core::{Code, Refusal};
use room_engine::{Engine, Owner};
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Items the ring keeps; a stream further behind than this is told to `reset`.
pub const RING_ITEMS_MAX: usize = 8192;
/// The producer scans at least this often (wake and phase states move without a call).
pub const SCAN_EVERY_MS: u64 = 500;
/// And at most this often under a stream of calls.
pub const SCAN_GAP_MS: u64 = 20;
/// The producer stops this long after its last stream ended.
pub const IDLE_STOP_MS: u64 = 30_000;
/// Pages of one room's log one scan reads at most (the rest waits for the next scan).
pub const LOG_PAGES_PER_SCAN_MAX: usize = 8;
/// Events per log page the producer reads.
pub const LOG_PAGE_EVENTS: usize = 200;
/// Open event streams at most.
pub const STREAMS_MAX: usize = 256;
/// Items one stream sends before it looks again.
pub const SEND_BATCH_MAX: usize = 256;
/// A stream checks its session at least this often (a log-out ends it).
pub const SESSION_CHECK_MS: u64 = 5_000;
/// How much of an event's text an item carries (the page reads the rest from the log); cut
/// after the redactor has read the whole text, so no secret is cut in two past its notice.
pub const TEXT_CHARS_MAX: usize = 280;
/// The wake queue is read at most this often (each read flushes every room's new permits).
pub const WAKES_SCAN_EVERY_MS: u64 = 1_000;

#[derive(Clone)]
struct Item {
    id: u64,
    kind: &'static str,
    data: Arc<str>,
}

struct Ring {
    epoch: String,
    /// The id of the next item.
    next: u64,
    items: VecDeque<Item>,
}

pub struct Feed {
    engine: Arc<Engine>,
    ring: Mutex<Ring>,
    newest: tokio::sync::watch::Sender<u64>,
    streams: AtomicUsize,
    running: tokio::sync::Mutex<bool>,
}

/// What a stream is given after `Last-Event-ID`.
enum Since {
    Items(Vec<Item>),
    /// The ring no longer holds what follows (or the epoch is another's): start again here.
    Reset {
        epoch: String,
        newest: u64,
    },
}

fn new_epoch() -> String {
    let mut b = [0u8; 6];
    if getrandom::fill(&mut b).is_err() {
        // the time is unique enough to tell one producer from the next in one daemon
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        b.copy_from_slice(&t.to_le_bytes()[..6]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Feed {
    pub fn new(engine: Arc<Engine>) -> Arc<Feed> {
        Arc::new(Feed {
            engine,
            ring: Mutex::new(Ring {
                epoch: new_epoch(),
                next: 1,
                items: VecDeque::new(),
            }),
            newest: tokio::sync::watch::Sender::new(0),
            streams: AtomicUsize::new(0),
            running: tokio::sync::Mutex::new(false),
        })
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring
            .lock()
            .expect("feed ring lock is never poisoned: no panics while held")
    }

    /// Start the producer if none runs: its first scan is taken before this returns, so a
    /// stream that starts after it misses nothing that commits after its `hello`.
    async fn ensure_running(self: &Arc<Self>, owner: Owner) -> Result<(), Refusal> {
        let mut running = self.running.lock().await;
        if *running {
            return Ok(());
        }
        let owner = Arc::new(owner);
        let (e, o) = (self.engine.clone(), owner.clone());
        let seen = tokio::task::spawn_blocking(move || prime(&e, &o))
            .await
            .map_err(|e| Refusal::storage(format!("event feed: {e}")))??;
        {
            let mut ring = self.ring();
            ring.epoch = new_epoch();
            ring.items.clear();
        }
        *running = true;
        let me = self.clone();
        tokio::spawn(async move { me.produce(owner, seen).await });
        Ok(())
    }

    async fn produce(self: Arc<Self>, owner: Arc<Owner>, mut seen: Seen) {
        let mut changes = crate::dispatch::changes().subscribe();
        let mut idle_since: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(Duration::from_millis(SCAN_EVERY_MS)) => {}
            }
            if self.streams.load(Ordering::Acquire) == 0 {
                let since = *idle_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= Duration::from_millis(IDLE_STOP_MS) {
                    let mut running = self.running.lock().await;
                    if self.streams.load(Ordering::Acquire) == 0 {
                        *running = false;
                        return;
                    }
                }
            } else {
                idle_since = None;
            }
            let (e, o) = (self.engine.clone(), owner.clone());
            let mut mine = std::mem::take(&mut seen);
            let scanned = tokio::task::spawn_blocking(move || {
                let items = scan(&e, &o, &mut mine, false);
                (items, mine)
            })
            .await;
            match scanned {
                Ok((items, s)) => {
                    seen = s;
                    self.push(items);
                }
                Err(e) => {
                    // what that scan saw is lost: a new epoch, and every stream is told to
                    // reset, rather than a gap none of them would know of
                    tracing::error!("the dashboard's event feed scan failed, starting over: {e}");
                    let (e, o) = (self.engine.clone(), owner.clone());
                    match tokio::task::spawn_blocking(move || prime(&e, &o)).await {
                        Ok(Ok(s)) => seen = s,
                        _ => {
                            self.new_epoch();
                            *self.running.lock().await = false;
                            return;
                        }
                    }
                    self.new_epoch();
                }
            }
            tokio::time::sleep(Duration::from_millis(SCAN_GAP_MS)).await;
        }
    }

    /// A new epoch: every stream's next look finds its epoch gone and says `reset`.
    fn new_epoch(&self) {
        let newest = {
            let mut ring = self.ring();
            ring.epoch = new_epoch();
            ring.items.clear();
            ring.next - 1
        };
        // wakes every stream (a send marks the value changed even when it is the same)
        self.newest.send_replace(newest);
    }

    fn push(&self, items: Vec<(&'static str, Value)>) {
        if items.is_empty() {
            return;
        }
        let policy = self.engine.policy();
        let redactor = policy.redactor().ok();
        let newest = {
            let mut ring = self.ring();
            for (kind, mut v) in items {
                match redactor {
                    Some(r) => {
                        r.redact_in_place(&mut v);
                        cut_text(&mut v);
                    }
                    // without an egress policy nothing leaves, as no answer does
                    None => v = json!({"withheld": Code::ToolResultWithheld.as_str()}),
                }
                let v = withhold_credentials(Response::ok(v))
                    .result
                    .unwrap_or(Value::Null);
                let id = ring.next;
                ring.next += 1;
                ring.items.push_back(Item {
                    id,
                    kind,
                    data: v.to_string().into(),
                });
                if ring.items.len() > RING_ITEMS_MAX {
                    ring.items.pop_front();
                }
            }
            ring.next - 1
        };
        self.newest.send_replace(newest);
    }

    /// Where a stream starts: `hello` at the newest item (no `Last-Event-ID`), the items
    /// after `last`, or a `reset`.
    fn start(&self, last: Option<&str>) -> (String, u64, Vec<Event>) {
        let ring = self.ring();
        let newest = ring.next - 1;
        let epoch = ring.epoch.clone();
        let hello = |kind: &str| {
            Event::default()
                .id(format!("{epoch}-{newest}"))
                .event(kind)
                .data(json!({"epoch": epoch, "id": newest}).to_string())
        };
        let Some(last) = last else {
            return (epoch.clone(), newest, vec![hello("hello")]);
        };
        let resumable = last
            .rsplit_once('-')
            .filter(|(e, _)| *e == epoch)
            .and_then(|(_, n)| n.parse::<u64>().ok())
            .filter(|n| *n <= newest && n + 1 >= ring.items.front().map_or(ring.next, |i| i.id));
        match resumable {
            Some(n) => (epoch.clone(), n, Vec::new()),
            None => (epoch.clone(), newest, vec![hello("reset")]),
        }
    }

    fn since(&self, epoch: &str, cursor: u64) -> Since {
        let ring = self.ring();
        let oldest = ring.items.front().map_or(ring.next, |i| i.id);
        if ring.epoch != epoch || cursor + 1 < oldest {
            return Since::Reset {
                epoch: ring.epoch.clone(),
                newest: ring.next - 1,
            };
        }
        let skip = (cursor + 1 - oldest) as usize;
        Since::Items(
            ring.items
                .iter()
                .skip(skip)
                .take(SEND_BATCH_MAX)
                .cloned()
                .collect(),
        )
    }
}

/// One open stream (counted while it lives).
struct Tail {
    feed: Arc<Feed>,
    secret: String,
    key: String,
    epoch: String,
    cursor: u64,
    pending: VecDeque<Event>,
    rx: tokio::sync::watch::Receiver<u64>,
    ended: bool,
}

impl Drop for Tail {
    fn drop(&mut self) {
        self.feed.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Tail {
    async fn next(&mut self) -> Option<Event> {
        loop {
            if let Some(e) = self.pending.pop_front() {
                return Some(e);
            }
            if self.ended {
                return None;
            }
            if let Err(r) = self
                .feed
                .engine
                .console_owner(Some(&self.secret), Some(&self.key))
            {
                self.ended = true;
                self.pending.push_back(
                    Event::default()
                        .event("ended")
                        .data(json!({"code": r.code.as_str(), "message": r.message}).to_string()),
                );
                continue;
            }
            match self.feed.since(&self.epoch, self.cursor) {
                Since::Reset { epoch, newest } => {
                    self.pending.push_back(
                        Event::default()
                            .id(format!("{epoch}-{newest}"))
                            .event("reset")
                            .data(json!({"epoch": epoch, "id": newest}).to_string()),
                    );
                    self.epoch = epoch;
                    self.cursor = newest;
                }
                Since::Items(items) if !items.is_empty() => {
                    for i in items {
                        self.cursor = i.id;
                        self.pending.push_back(
                            Event::default()
                                .id(format!("{}-{}", self.epoch, i.id))
                                .event(i.kind)
                                .data(&*i.data),
                        );
                    }
                }
                Since::Items(_) => {
                    self.rx.mark_unchanged();
                    if *self.rx.borrow() > self.cursor {
                        continue;
                    }
                    tokio::select! {
                        _ = self.rx.changed() => {}
                        _ = tokio::time::sleep(Duration::from_millis(SESSION_CHECK_MS)) => {}
                    }
                }
            }
        }
    }
}

/// `GET /api/events?k=KEY`.
pub(crate) async fn events(
    State(d): State<Dash>,
    headers: HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> HttpResponse {
    let key = q.get(KEY_QUERY).cloned().unwrap_or_default();
    let owner = match d.admit(&headers, Some(&key), Ask::Read) {
        Ok(o) => o,
        Err(r) => return *r,
    };
    let secret = cookie(&headers, &d.cookie).unwrap_or_default();
    if d.feed.streams.fetch_add(1, Ordering::AcqRel) >= STREAMS_MAX {
        d.feed.streams.fetch_sub(1, Ordering::AcqRel);
        return refused(
            StatusCode::TOO_MANY_REQUESTS,
            Refusal::new(
                Code::QuotaExceeded,
                format!("at most {STREAMS_MAX} event streams at once"),
            ),
        );
    }
    let rx = d.feed.newest.subscribe();
    let mut tail = Tail {
        feed: d.feed.clone(),
        secret,
        key,
        epoch: String::new(),
        cursor: 0,
        pending: VecDeque::new(),
        rx,
        ended: false,
    };
    if let Err(r) = d.feed.ensure_running(owner).await {
        return refused(StatusCode::SERVICE_UNAVAILABLE, r);
    }
    let last = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let (epoch, cursor, first) = d.feed.start(last.as_deref());
    tail.epoch = epoch;
    tail.cursor = cursor;
    tail.pending.extend(first);
    let stream = futures_util::stream::unfold(tail, |mut t| async move {
        t.next()
            .await
            .map(|e| (Ok::<_, std::convert::Infallible>(e), t))
    });
    let mut r = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response();
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        axum::http::HeaderValue::from_static("no-store"),
    );
    hardened(r)
}

/// The priming pass: what stands now, recorded without items; a view that cannot be read
/// refuses the stream (503) rather than have the next pass take all history for new.
fn prime(engine: &Engine, owner: &Owner) -> Result<Seen, Refusal> {
    engine.rooms_view(owner)?;
    engine.wakes_view(owner, None)?;
    crate::collab::list(engine, owner)?;
    let mut seen = Seen::default();
    scan(engine, owner, &mut seen, true);
    Ok(seen)
}

/// What the producer has seen, to tell what changed.
#[derive(Default)]
struct Seen {
    /// When the wake queue was last read (its reads are throttled).
    wakes_at: Option<std::time::Instant>,
    /// Room → the newest seq seen.
    rooms: HashMap<String, u64>,
    /// Wake path → state.
    wakes: HashMap<String, String>,
    /// Collaboration → state.
    collabs: HashMap<String, String>,
    /// (collaboration, phase) → (state, runs).
    phases: HashMap<(String, String), (String, u64)>,
    /// Approval → state.
    approvals: HashMap<String, String>,
}

/// One pass over the owner's views: the items for what changed since the last (none on the
/// priming pass, which only records).
fn scan(
    engine: &Engine,
    owner: &Owner,
    seen: &mut Seen,
    prime: bool,
) -> Vec<(&'static str, Value)> {
    let mut out = Vec::new();
    scan_rooms(engine, owner, seen, prime, &mut out);
    scan_wakes(engine, owner, seen, prime, &mut out);
    scan_collabs(engine, owner, seen, prime, &mut out);
    out
}

fn scan_rooms(
    engine: &Engine,
    owner: &Owner,
    seen: &mut Seen,
    prime: bool,
    out: &mut Vec<(&'static str, Value)>,
) {
    let Ok(v) = engine.rooms_view(owner) else {
        return;
    };
    for r in v["rooms"].as_array().into_iter().flatten() {
        let (Some(room), Some(tip)) = (r["room"].as_str(), r["tip_seq"].as_u64()) else {
            continue;
        };
        let known = match seen.rooms.get(room) {
            Some(k) => *k,
            None if prime => {
                seen.rooms.insert(room.to_string(), tip);
                continue;
            }
            None => {
                out.push(("room", json!({"room": room, "tip_seq": tip})));
                0
            }
        };
        let mut at = known;
        for _ in 0..LOG_PAGES_PER_SCAN_MAX {
            if at >= tip {
                break;
            }
            let Ok(page) = engine.room_log(owner, room, at + 1, LOG_PAGE_EVENTS) else {
                break;
            };
            let events = page["events"].as_array().cloned().unwrap_or_default();
            if events.is_empty() {
                break;
            }
            for e in &events {
                at = e["seq"].as_u64().unwrap_or(at).max(at);
                out.push(("event", event_item(room, e)));
                if let Some(task) = e["event"]["task"].as_str() {
                    out.push((
                        "task",
                        json!({"room": room, "task": task, "seq": e["seq"], "kind": e["kind"]}),
                    ));
                }
            }
        }
        seen.rooms.insert(room.to_string(), at);
    }
}

fn event_item(room: &str, e: &Value) -> Value {
    let body = &e["event"];
    json!({"room": room, "seq": e["seq"], "id": e["id"], "actor": e["actor"], "kind": e["kind"],
        "hlc": e["hlc"], "text": body["text"], "parents": body["parents"],
        "reply_to": body["reply_to"], "task": body["task"]})
}

/// An item's text cut to [`TEXT_CHARS_MAX`] (after redaction).
fn cut_text(v: &mut Value) {
    if let Some(t) = v.get_mut("text")
        && let Some(text) = t.as_str()
        && text.chars().count() > TEXT_CHARS_MAX
    {
        *t = json!(text.chars().take(TEXT_CHARS_MAX).collect::<String>());
    }
}

fn scan_wakes(
    engine: &Engine,
    owner: &Owner,
    seen: &mut Seen,
    prime: bool,
    out: &mut Vec<(&'static str, Value)>,
) {
    if !prime
        && seen
            .wakes_at
            .is_some_and(|t| t.elapsed() < Duration::from_millis(WAKES_SCAN_EVERY_MS))
    {
        return;
    }
    seen.wakes_at = Some(std::time::Instant::now());
    let Ok(v) = engine.wakes_view(owner, None) else {
        return;
    };
    for w in v["wakes"].as_array().into_iter().flatten() {
        // the permit's binding is flattened into it
        let b = w;
        let (Some(room), Some(agent), Some(event)) = (
            b["room"].as_str(),
            b["agent"].as_str(),
            b["source_event"].as_str(),
        ) else {
            continue;
        };
        let path = room_core::wake::wake_path(room, agent, event);
        let state = w["state"].as_str().unwrap_or("").to_string();
        if seen.wakes.get(&path) != Some(&state) {
            if !prime {
                out.push((
                    "wake",
                    json!({"wake": path, "room": room, "agent": agent, "state": state,
                        "task": b["task"], "deferred": w["deferred"]}),
                ));
            }
            seen.wakes.insert(path, state);
        }
    }
}

fn scan_collabs(
    engine: &Engine,
    owner: &Owner,
    seen: &mut Seen,
    prime: bool,
    out: &mut Vec<(&'static str, Value)>,
) {
    let Ok(list) = crate::collab::list(engine, owner) else {
        return;
    };
    for c in list["collabs"].as_array().into_iter().flatten() {
        let Some(id) = c["collab"].as_str() else {
            continue;
        };
        let state = c["state"].as_str().unwrap_or("").to_string();
        let changed = seen.collabs.get(id) != Some(&state);
        if changed {
            if !prime {
                out.push((
                    "collab",
                    json!({"collab": id, "state": state, "room": c["room"]}),
                ));
            }
            seen.collabs.insert(id.to_string(), state.clone());
        }
        // a settled collaboration's phases do not move; its last change was seen above
        if state != "running" && !changed {
            continue;
        }
        let Ok(s) = crate::collab::status(engine, owner, id) else {
            continue;
        };
        for p in s["phases"].as_array().into_iter().flatten() {
            let name = p["phase"].as_str().unwrap_or("").to_string();
            let now = (
                p["state"].as_str().unwrap_or("").to_string(),
                p["runs"].as_u64().unwrap_or(0),
            );
            let key = (id.to_string(), name.clone());
            if seen.phases.get(&key) != Some(&now) {
                if !prime {
                    out.push((
                        "phase",
                        json!({"collab": id, "phase": name, "state": now.0, "runs": now.1}),
                    ));
                }
                seen.phases.insert(key, now);
            }
        }
        for a in s["approvals"].as_array().into_iter().flatten() {
            let Some(aid) = a["approval"].as_str() else {
                continue;
            };
            let st = a["state"].as_str().unwrap_or("").to_string();
            if seen.approvals.get(aid) != Some(&st) {
                if !prime {
                    out.push((
                        "approval",
                        json!({"collab": id, "approval": aid, "phase": a["phase"], "state": st}),
                    ));
                }
                seen.approvals.insert(aid.to_string(), st);
            }
        }
    }
}
