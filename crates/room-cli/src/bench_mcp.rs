//! `room bench mcp`: gated tool calls per second and their latency over streamable HTTP with 1,
//! 16 and 64 concurrent sessions, each agent alone in its own room, as a ratio to the same turns
//! made in-process in the same run. The client is rmcp's own streamable-HTTP client, speaking the
//! current protocol (2026-07-28).

use crate::bench::{BenchArgs, ClientKind, own_rooms, pct};
use crate::mcp_http::McpHttp;
use rmcp::model::CallToolRequestParams;
use rmcp::model::ProtocolVersion;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt};
use room_server::client::Client;
use room_server::daemon::{Background, ServeConfig};
use room_server::wire::Request;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn owner(sock: &Path, op: &str, args: Value) -> anyhow::Result<Value> {
    let req = Request::new(op, args);
    let r = Client::connect(sock)?.call(&req)?;
    r.result
        .ok_or_else(|| anyhow::anyhow!("{op} refused: {:?}", r.refusal))
}

fn obj(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!("arguments are objects"),
    }
}

/// A client that keeps its connection (rmcp's default opens one per request to dodge delayed-ACK
/// stalls; with TCP_NODELAY a kept connection does not stall and costs far less).
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .build()
        .expect("a reqwest client builds")
}

/// The current protocol (2026-07-28: no session, per-request metadata, plain JSON results), as
/// today's SDK clients speak it by default.
fn modern() -> ClientLifecycleMode {
    ClientLifecycleMode::Discover {
        preferred_versions: vec![ProtocolVersion::LATEST],
    }
}

async fn session(
    url: String,
    token: String,
    room: String,
    secs: f64,
) -> anyhow::Result<Vec<Duration>> {
    let transport = StreamableHttpClientTransport::with_client(
        http_client(),
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    let client = ().serve_with_lifecycle(transport, modern()).await?;
    let mut confirm: Option<String> = None;
    loop {
        let mut args = json!({"room": room});
        if let Some(c) = &confirm {
            args["confirm"] = json!(c);
        }
        let r = client
            .call_tool(CallToolRequestParams::new("room_sync").with_arguments(obj(args)))
            .await?;
        let page = r.structured_content.unwrap_or_default();
        if page["items"].as_array().is_none_or(Vec::is_empty) {
            break;
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
    let mut lat = vec![];
    let start = Instant::now();
    let mut i = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        i += 1;
        let args = json!({"room": room, "text": format!("status {i}: {}", "x".repeat(200))});
        let t = Instant::now();
        let r = client
            .call_tool(CallToolRequestParams::new("room_note").with_arguments(obj(args)))
            .await?;
        anyhow::ensure!(
            r.is_error != Some(true),
            "refused: {:?}",
            r.structured_content
        );
        lat.push(t.elapsed());
    }
    client.cancel().await?;
    Ok(lat)
}

/// A daemon with an HTTP listener on a fresh state dir under `dir`.
struct Served {
    _tmp: tempfile::TempDir,
    state: std::path::PathBuf,
    daemon: Background,
    sock: std::path::PathBuf,
    url: String,
}

fn served(dir: &Path, instance: &str, engine_threads: Option<u64>) -> anyhow::Result<Served> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    room_store::statedir::init(&state, &boot, instance)?;
    let daemon = Background::start_with(ServeConfig {
        state_dir: state.clone(),
        bootstrap: boot,
        listen: Some("127.0.0.1:0".parse().expect("a loopback address")),
        engine_threads: engine_threads
            .map(|n| n as usize)
            .unwrap_or_else(room_server::daemon::engine_threads_default),
        limits: Default::default(),
        room_exe: None,
        store: None,
    })?;
    let sock = daemon.socket.clone();
    let url = format!(
        "http://{}/mcp",
        std::fs::read_to_string(state.join("http.addr"))?.trim()
    );
    Ok(Served {
        _tmp: tmp,
        state,
        daemon,
        sock,
        url,
    })
}

fn over_http(
    dir: &Path,
    sessions: usize,
    secs: f64,
    engine_threads: Option<u64>,
) -> anyhow::Result<(f64, Vec<Duration>)> {
    let Served {
        _tmp,
        state: _,
        daemon,
        sock,
        url,
    } = served(dir, "bench-mcp", engine_threads)?;
    let mut agents = vec![];
    for i in 0..sessions {
        let token = owner(&sock, "agent_enroll", json!({"name": format!("s{i}")}))?["token"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        owner(
            &sock,
            "room_create",
            json!({"name": format!("r{i}"), "members": [format!("s{i}")]}),
        )?;
        agents.push((token, format!("r{i}")));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .thread_name("bench-client")
        .enable_all()
        .build()?;
    let start = Instant::now();
    let lat = rt.block_on(async {
        let tasks: Vec<_> = agents
            .into_iter()
            .map(|(t, r)| tokio::spawn(session(url.clone(), t, r, secs)))
            .collect();
        let mut all = vec![];
        for t in tasks {
            all.extend(t.await??);
        }
        anyhow::Ok(all)
    })?;
    let elapsed = start.elapsed().as_secs_f64();
    daemon.stop()?;
    Ok((lat.len() as f64 / elapsed, lat))
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    eprintln!(
        "measuring in {} for {} s per row …",
        dir.display(),
        a.seconds
    );
    println!(
        "{:<40} {:>12} {:>10} {:>10} {:>14}",
        "sessions (each its own agent and room)", "calls/s", "p50 µs", "p99 µs", "vs in-process"
    );
    for n in [1usize, 16, 64] {
        eprintln!("  {n} session(s) …");
        let base = own_rooms(
            &dir,
            n,
            a.seconds,
            &crate::bench::Store::Embedded(room_store::JournalSync::Pipeline),
        )?
        .per_s;
        let (rate, mut lat) = over_http(&dir, n, a.seconds, a.engine_threads)?;
        let f = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into());
        println!(
            "{:<40} {:>12.0} {:>10} {:>10} {:>13.2}x",
            format!("{n} over streamable HTTP"),
            rate,
            f(pct(&mut lat, 0.5)),
            f(pct(&mut lat, 0.99)),
            rate / base
        );
        println!(
            "{:<40} {:>12.0}",
            format!("{n} in-process (baseline)"),
            base
        );
    }
    Ok(())
}

/// What one swarm agent did.
#[derive(Default)]
struct Tally {
    lat: Vec<Duration>,
    accepted: u64,
    gate_refused: u64,
    other_refused: u64,
    other_codes: std::collections::BTreeMap<String, u64>,
    by_tool: std::collections::BTreeMap<&'static str, Vec<Duration>>,
}

struct Agent {
    name: String,
    token: String,
    room: String,
    mates: Vec<String>,
}

/// What the swarm reads of a tool's structured content.
#[derive(Deserialize, Default)]
struct Answer {
    receipt: Option<String>,
    items: Option<Vec<PageItem>>,
    open_items: Option<Vec<OpenItem>>,
    refusal: Option<Refused>,
}

#[derive(Deserialize)]
struct OpenItem {
    id: String,
}

/// What the swarm reads of a page item: whether it creates a task for someone.
#[derive(Deserialize)]
struct PageItem {
    kind: Option<String>,
    event: Option<ItemEvent>,
}

#[derive(Deserialize)]
struct ItemEvent {
    action: Option<String>,
    task: Option<String>,
    created: Option<Created>,
}

#[derive(Deserialize)]
struct Created {
    recipient: Option<String>,
}

/// The tasks these page items create for `agent`.
fn tasks_for(items: &[PageItem], agent: &str) -> Vec<String> {
    items
        .iter()
        .filter_map(|i| i.task_for(agent))
        .map(String::from)
        .collect()
}

impl PageItem {
    /// The task this item creates for `agent`, if it creates one.
    fn task_for(&self, agent: &str) -> Option<&str> {
        let e = self.event.as_ref()?;
        let for_agent = self.kind.as_deref() == Some("task")
            && e.action.as_deref() == Some("created")
            && e.created.as_ref()?.recipient.as_deref() == Some(agent);
        if for_agent { e.task.as_deref() } else { None }
    }
}

#[derive(Deserialize)]
struct Refused {
    code: String,
    detail: Option<RefusalDetail>,
}

/// A Work Gate refusal hands over the unread page: the agent reads it and confirms its
/// receipt in its next sync, as the tools tell a model to.
#[derive(Deserialize)]
struct RefusalDetail {
    next_page: Option<NextPage>,
}

#[derive(Deserialize)]
struct NextPage {
    receipt: Option<String>,
    items: Option<Vec<PageItem>>,
}

/// The swarm's MCP client: the lean one by default, rmcp's own on `--client rmcp`.
enum SwarmClient {
    Lean(McpHttp),
    Rmcp(rmcp::service::RunningService<rmcp::RoleClient, ()>),
}

impl SwarmClient {
    async fn connect(kind: ClientKind, url: &str, token: &str) -> anyhow::Result<Self> {
        Ok(match kind {
            ClientKind::Lean => SwarmClient::Lean(McpHttp::connect(url, token).await?),
            ClientKind::Rmcp => {
                let transport = StreamableHttpClientTransport::with_client(
                    http_client(),
                    StreamableHttpClientTransportConfig::with_uri(url.to_string())
                        .auth_header(token.to_string()),
                );
                SwarmClient::Rmcp(().serve_with_lifecycle(transport, modern()).await?)
            }
        })
    }

    async fn call(&mut self, tool: &'static str, args: Value) -> anyhow::Result<(bool, Answer)> {
        match self {
            SwarmClient::Lean(c) => c.call_tool(tool, args).await,
            SwarmClient::Rmcp(c) => {
                let r = c
                    .call_tool(CallToolRequestParams::new(tool).with_arguments(obj(args)))
                    .await?;
                let a = match r.structured_content {
                    Some(v) => serde_json::from_value(v)?,
                    None => Answer::default(),
                };
                Ok((r.is_error != Some(true), a))
            }
        }
    }

    async fn close(self) -> anyhow::Result<()> {
        if let SwarmClient::Rmcp(c) = self {
            c.cancel().await?;
        }
        Ok(())
    }
}

async fn call(
    client: &mut SwarmClient,
    tally: &mut Tally,
    tool: &'static str,
    args: Value,
) -> anyhow::Result<(bool, Answer)> {
    let t = Instant::now();
    let r = client.call(tool, args).await?;
    tally.lat.push(t.elapsed());
    tally.by_tool.entry(tool).or_default().push(t.elapsed());
    Ok(r)
}

/// A refusal by the Work Gate: a room-mate wrote first.
fn gated(a: &Answer) -> bool {
    a.refusal.as_ref().is_some_and(|r| {
        matches!(
            r.code.as_str(),
            "room_sync_required" | "room_sync_concurrent_arrival"
        )
    })
}

impl Tally {
    fn record(&mut self, tool: &str, ok: bool, a: Answer, done: &AtomicU64) {
        if ok {
            self.accepted += 1;
            done.fetch_add(1, Ordering::Relaxed);
        } else if gated(&a) {
            self.gate_refused += 1;
        } else {
            self.other_refused += 1;
            let code = a.refusal.map(|r| r.code).unwrap_or_default();
            *self
                .other_codes
                .entry(format!("{tool}:{code}"))
                .or_default() += 1;
        }
    }
}

/// One agent: catch up, then a realistic mix of turns until the deadline.
async fn swarm_agent(
    url: String,
    kind: ClientKind,
    a: Agent,
    secs: f64,
    seed: u64,
    done: Arc<AtomicU64>,
) -> anyhow::Result<Tally> {
    let mut client = SwarmClient::connect(kind, &url, &a.token).await?;
    let mut t = Tally::default();
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let start = Instant::now();
    let mut open: Vec<OpenItem> = vec![];
    // tasks created for this agent and not yet claimed; tasks it claimed and has not finished
    let mut assigned: std::collections::VecDeque<String> = Default::default();
    let mut claimed: std::collections::VecDeque<String> = Default::default();
    // the receipt of a page a refusal handed over, read and not yet confirmed
    let mut handed: Option<String> = None;
    while start.elapsed().as_secs_f64() < secs {
        // read until caught up
        let mut confirm: Option<String> = handed.take();
        for _ in 0..32 {
            let mut args = json!({"room": a.room});
            if let Some(c) = &confirm {
                args["confirm"] = json!(c);
            }
            let (ok, page) = call(&mut client, &mut t, "room_sync", args).await?;
            if !ok {
                break;
            }
            open = page.open_items.unwrap_or_default();
            let items = page.items.unwrap_or_default();
            assigned.extend(tasks_for(&items, &a.name));
            if items.is_empty() {
                break;
            }
            confirm = page.receipt;
        }
        // a task created for this agent is claimed before anything else
        if let Some(task) = assigned.pop_front() {
            let (ok, v) = call(&mut client, &mut t, "task_claim", json!({"task": task})).await?;
            if ok {
                claimed.push_back(task);
            }
            t.record("task_claim", ok, v, &done);
            continue;
        }
        let mate = a.mates[(next() as usize) % a.mates.len()].clone();
        let roll = next() % 100;
        let (tool, args) = if roll < 10 && !claimed.is_empty() {
            let task = claimed.pop_front().expect("a claimed task");
            (
                "room_done",
                json!({"room": a.room, "task": task, "text": format!("{} finished it", a.name)}),
            )
        } else if roll < 25 && !open.is_empty() {
            (
                "room_reply",
                json!({"room": a.room, "reply_to": open[0].id, "text": format!("{} answers", a.name)}),
            )
        } else if roll < 45 {
            (
                "room_send",
                json!({"room": a.room, "to": [mate], "text": format!("{} asks {mate} to look at item {}", a.name, next() % 1000)}),
            )
        } else if roll < 50 {
            (
                "task_create",
                json!({"room": a.room, "title": format!("task from {}", a.name), "to": mate}),
            )
        } else if roll < 65 {
            (
                "room_note",
                json!({"room": a.room, "text": format!("{} status: step {} of the plan", a.name, next() % 50)}),
            )
        } else {
            (
                "room_say",
                json!({"room": a.room, "to": [mate], "text": format!("{} to {mate}: {}", a.name, "a".repeat((next() % 400) as usize))}),
            )
        };
        let (mut ok, mut v) = call(&mut client, &mut t, tool, args.clone()).await?;
        // a turn the gate sent back with the unread page: read it and try once more with its
        // receipt as read_through (one call confirms and acts), as the tools tell a model to
        let mut retried = false;
        loop {
            let refused_gated = !ok && gated(&v);
            if let Some(page) = v
                .refusal
                .as_mut()
                .and_then(|r| r.detail.take())
                .and_then(|d| d.next_page)
            {
                assigned.extend(tasks_for(&page.items.unwrap_or_default(), &a.name));
                handed = page.receipt;
            }
            let retry = match (&handed, retried || !refused_gated || tool == "task_create") {
                (Some(r), false) => Some(r.clone()),
                _ => None,
            };
            let Some(receipt) = retry else { break };
            t.record(tool, ok, v, &done);
            let mut again = args.clone();
            again["read_through"] = json!(receipt);
            (ok, v) = call(&mut client, &mut t, tool, again).await?;
            retried = true;
            if ok {
                // the receipt was confirmed by the turn itself
                handed = None;
            }
        }
        if tool == "room_done" && !ok && gated(&v) {
            // the gate sent it back to read first: finish it next time
            if let Some(task) = args["task"].as_str() {
                claimed.push_front(task.to_string());
            }
        }
        t.record(tool, ok, v, &done);
    }
    client.close().await?;
    Ok(t)
}

fn dir_bytes(p: &Path, suffix: &str) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(p) {
        for e in rd.flatten() {
            let path = e.path();
            if path.is_dir() {
                total += dir_bytes(&path, suffix);
            } else if path.to_str().is_some_and(|s| s.ends_with(suffix)) {
                total += e.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
    }
    total
}

/// CPU time (ns) spent so far by this process's threads whose name starts with `prefix`, from
/// `/proc/self/task/*/schedstat`. Threads that already exited are not counted, so this is a
/// lower bound.
fn threads_cpu_ns(prefix: &str) -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    let mut total = 0;
    for t in tasks.flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        total += std::fs::read_to_string(t.path().join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
    }
    total
}

fn rss_peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

pub fn swarm(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let secs = a.seconds.max(5.0);
    eprintln!(
        "swarm in {} for {secs} s per size (rooms of 2 to 8 agents, MCP over streamable HTTP, {:?} client) …",
        dir.display(),
        a.client
    );
    println!(
        "{:>7} {:>6} {:>11} {:>10} {:>8} {:>8} {:>9} {:>10} {:>9} {:>10} {:>11} {:>13} {:>13}",
        "agents",
        "rooms",
        "accepted/s",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "p99.9 ms",
        "gate-ref %",
        "RSS MiB",
        "index MiB",
        "journal MiB",
        "daemon µs/call",
        "client µs/call"
    );
    // Each size's state dir is removed only when the whole bench ends: deleting tens of
    // thousands of files just before the next size would charge that size for the cleanup
    // (ext4 without a journal scans recently freed inodes on every file creation for a while).
    let mut finished_dirs = vec![];
    for n in a
        .agents
        .iter()
        .map(|n| *n as usize)
        .filter(|n| *n <= a.writers_max.max(10) * 2)
    {
        let Served {
            _tmp: tmp,
            state,
            daemon,
            sock,
            url,
        } = served(&dir, "swarm", a.engine_threads)?;
        // rooms of 2..=8 agents
        let mut agents = vec![];
        let mut i = 0;
        let mut r = 0;
        while i < n {
            let mut size = (2 + (r * 5) % 7).min(n - i);
            if n - i - size == 1 {
                size += 1; // never leave an agent alone in a room
            }
            let names: Vec<String> = (i..i + size).map(|k| format!("a{k}")).collect();
            let mut tokens = vec![];
            for name in &names {
                let tok = owner(
                    &sock,
                    "agent_enroll",
                    json!({"name": name, "max_tier": "coordinator"}),
                )?["token"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                tokens.push(tok);
            }
            let room = format!("r{r}");
            owner(
                &sock,
                "room_create",
                json!({"name": room, "members": names}),
            )?;
            for (name, token) in names.iter().zip(tokens) {
                let mates: Vec<String> = names.iter().filter(|m| *m != name).cloned().collect();
                let mates = if mates.is_empty() {
                    vec![name.clone()]
                } else {
                    mates
                };
                agents.push(Agent {
                    name: name.clone(),
                    token,
                    room: room.clone(),
                    mates,
                });
            }
            i += size;
            r += 1;
        }
        let rooms = r;
        let done = Arc::new(AtomicU64::new(0));
        let rt = tokio::runtime::Builder::new_multi_thread()
            .thread_name("bench-client")
            .enable_all()
            .build()?;
        let start = Instant::now();
        let daemon_cpu_before = threads_cpu_ns("room-daemon");
        let client_cpu_before = threads_cpu_ns("bench-client");
        let tallies = rt.block_on(async {
            let tasks: Vec<_> = agents
                .into_iter()
                .enumerate()
                .map(|(k, ag)| {
                    tokio::spawn(swarm_agent(
                        url.clone(),
                        a.client,
                        ag,
                        secs,
                        0x9e37_79b9 ^ k as u64,
                        done.clone(),
                    ))
                })
                .collect();
            let progress = {
                let done = done.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        let e = start.elapsed().as_secs_f64();
                        eprint!(
                            "\r  {n} agents: {:>4.0} s, {} accepted turns ({:.0}/s)   ",
                            e,
                            done.load(Ordering::Relaxed),
                            done.load(Ordering::Relaxed) as f64 / e
                        );
                    }
                })
            };
            let mut out = vec![];
            for t in tasks {
                out.push(t.await??);
            }
            progress.abort();
            eprintln!();
            anyhow::Ok(out)
        })?;
        let elapsed = start.elapsed().as_secs_f64();
        let daemon_cpu_ns = threads_cpu_ns("room-daemon").saturating_sub(daemon_cpu_before);
        let client_cpu_ns = threads_cpu_ns("bench-client").saturating_sub(client_cpu_before);
        daemon.stop()?;
        finished_dirs.push(tmp);
        let mut lat: Vec<Duration> = tallies.iter().flat_map(|t| t.lat.iter().copied()).collect();
        let accepted: u64 = tallies.iter().map(|t| t.accepted).sum();
        let gate: u64 = tallies.iter().map(|t| t.gate_refused).sum();
        let other: u64 = tallies.iter().map(|t| t.other_refused).sum();
        let calls = lat.len();
        let ms = |v: Option<f64>| {
            v.map(|x| format!("{:.1}", x / 1000.0))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:>7} {:>6} {:>11.0} {:>10.0} {:>8} {:>8} {:>9} {:>10.1} {:>9.0} {:>10.1} {:>11.1} {:>13.0} {:>13.0}",
            n,
            rooms,
            accepted as f64 / elapsed,
            calls as f64 / elapsed,
            ms(pct(&mut lat, 0.5)),
            ms(pct(&mut lat, 0.99)),
            ms(pct(&mut lat, 0.999)),
            gate as f64 * 100.0 / (accepted + gate + other).max(1) as f64,
            rss_peak_kib() as f64 / 1024.0,
            dir_bytes(&state.join("rooms"), ".db") as f64 / (1 << 20) as f64,
            dir_bytes(&state.join("rooms"), "EVENTS.jsonl") as f64 / (1 << 20) as f64,
            daemon_cpu_ns as f64 / 1000.0 / calls.max(1) as f64,
            client_cpu_ns as f64 / 1000.0 / calls.max(1) as f64,
        );
        if a.by_tool {
            let mut by: std::collections::BTreeMap<&str, Vec<Duration>> = Default::default();
            for t in &tallies {
                for (k, v) in &t.by_tool {
                    by.entry(k).or_default().extend(v);
                }
            }
            for (k, mut v) in by {
                eprintln!(
                    "  {k:<12} {:>7} calls  p50 {} ms  p99 {} ms  max {} ms",
                    v.len(),
                    ms(pct(&mut v, 0.5)),
                    ms(pct(&mut v, 0.99)),
                    ms(pct(&mut v, 1.0))
                );
            }
        }
        if other > 0 {
            let mut codes: std::collections::BTreeMap<String, u64> = Default::default();
            for t in &tallies {
                for (k, v) in &t.other_codes {
                    *codes.entry(k.clone()).or_default() += v;
                }
            }
            eprintln!("  note: {other} turns refused for other reasons: {codes:?}");
        }
    }
    drop(finished_dirs);
    Ok(())
}
