//! `room bench dashboard`: the dashboard's event stream under load. 64 writers commit (each an
//! agent alone in its own room, over the daemon's socket) while 50 browsers' worth of
//! `/api/events` streams read; measured: events delivered per second over all streams, how
//! many of the committed events each stream got, and the lag from a commit's acknowledgement to
//! its delivery (p50, p99; every tenth event sampled). The baseline is the same writers in the
//! same run with no stream open: the ratio says what watching costs the writers.

use crate::bench::BenchArgs;
use room_server::client::Client;
use room_server::daemon::{Background, ServeConfig};
use room_server::wire::Request;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const WRITERS: usize = 64;
const STREAMS: usize = 50;
/// Every this many events of a writer is timed.
const SAMPLE_EVERY: u64 = 10;

fn owner(sock: &Path, op: &str, args: Value) -> anyhow::Result<Value> {
    let r = Client::connect(sock)?.call(&Request::new(op, args))?;
    r.result
        .ok_or_else(|| anyhow::anyhow!("{op} refused: {:?}", r.refusal))
}

struct Served {
    _tmp: tempfile::TempDir,
    daemon: Background,
    http: SocketAddr,
    writers: Vec<(String, String)>,
}

fn served(dir: &Path) -> anyhow::Result<Served> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    room_store::statedir::init(&state, &boot, "bench-dashboard")?;
    let daemon = Background::start_with(ServeConfig {
        state_dir: state.clone(),
        bootstrap: boot,
        listen: Some("127.0.0.1:0".parse().expect("a loopback address")),
        engine_threads: room_server::daemon::engine_threads_default(),
        limits: Default::default(),
        room_exe: None,
        store: None,
    })?;
    let http = std::fs::read_to_string(state.join("http.addr"))?
        .trim()
        .parse()?;
    let mut writers = vec![];
    for i in 0..WRITERS {
        let token = owner(
            &daemon.socket,
            "agent_enroll",
            json!({"name": format!("w{i}")}),
        )?["token"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        owner(
            &daemon.socket,
            "room_create",
            json!({"name": format!("r{i}"), "members": [format!("w{i}")]}),
        )?;
        writers.push((token, format!("r{i}")));
    }
    Ok(Served {
        _tmp: tmp,
        daemon,
        http,
        writers,
    })
}

/// The writers for `secs`: how many commits, and when each sampled one was acknowledged.
fn write(s: &Served, secs: f64) -> anyhow::Result<(u64, HashMap<String, Instant>, Duration)> {
    let acks = Arc::new(Mutex::new(HashMap::new()));
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = s
        .writers
        .iter()
        .enumerate()
        .map(|(i, (token, room))| {
            let (sock, token, room) = (s.daemon.socket.clone(), token.clone(), room.clone());
            let (acks, done) = (acks.clone(), done.clone());
            std::thread::spawn(move || -> anyhow::Result<()> {
                let mut c = Client::connect(&sock)?;
                let mut call = |op: &str, args: Value| -> anyhow::Result<Value> {
                    let mut req = Request::new(op, args);
                    req.token = Some(token.clone());
                    let r = c.call(&req)?;
                    r.result
                        .ok_or_else(|| anyhow::anyhow!("{op} refused: {:?}", r.refusal))
                };
                // the room's creation read first, as the Work Gate asks
                let page = call("sync", json!({"room": room}))?;
                call("sync", json!({"room": room, "confirm": page["receipt"]}))?;
                let mut n = 0u64;
                while start.elapsed().as_secs_f64() < secs {
                    n += 1;
                    let text = format!("w{i}-{n}");
                    call("note", json!({"room": room, "text": text}))?;
                    let at = Instant::now();
                    done.fetch_add(1, Ordering::Relaxed);
                    if n.is_multiple_of(SAMPLE_EVERY) {
                        acks.lock().expect("acks lock").insert(text, at);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join()
            .map_err(|_| anyhow::anyhow!("a writer panicked"))??;
    }
    let elapsed = start.elapsed();
    let acks = std::mem::take(&mut *acks.lock().expect("acks lock"));
    Ok((done.load(Ordering::Relaxed), acks, elapsed))
}

/// A session cookie, as a browser gets it from `room dashboard`'s link.
fn login(s: &Served) -> anyhow::Result<String> {
    let code = owner(&s.daemon.socket, "dashboard_login", json!({}))?["code"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut t = TcpStream::connect(s.http)?;
    write!(
        t,
        "GET /login?code={code} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
        s.http
    )?;
    let mut out = String::new();
    t.read_to_string(&mut out)?;
    out.lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .starts_with("set-cookie:")
                .then(|| l["set-cookie:".len()..].split(';').next().map(str::trim))
                .flatten()
                .map(String::from)
        })
        .ok_or_else(|| anyhow::anyhow!("no session cookie: {out}"))
}

/// One stream's tally: events delivered, and when each sampled text arrived.
#[derive(Default)]
struct Seen {
    events: u64,
    sampled: Vec<(String, Instant)>,
}

fn stream(http: SocketAddr, cookie: String, stop: Arc<AtomicBool>) -> anyhow::Result<Seen> {
    let mut t = TcpStream::connect(http)?;
    t.set_read_timeout(Some(Duration::from_millis(500)))?;
    write!(
        t,
        "GET /api/events HTTP/1.1\r\nHost: {http}\r\nCookie: {cookie}\r\nAccept: text/event-stream\r\n\r\n"
    )?;
    let mut r = BufReader::new(t);
    let mut seen = Seen::default();
    let mut kind = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        let l = line.trim_end();
        if let Some(k) = l.strip_prefix("event:") {
            kind = k.trim().to_string();
        } else if let Some(d) = l.strip_prefix("data:")
            && kind == "event"
        {
            let at = Instant::now();
            seen.events += 1;
            // the text is the last string field the feed writes before its numbers: find it
            // without parsing every event (the client must not be the bottleneck)
            if let Some(text) = d
                .split("\"text\":\"")
                .nth(1)
                .and_then(|t| t.split('"').next())
                && let Some(n) = text.rsplit('-').next().and_then(|n| n.parse::<u64>().ok())
                && n.is_multiple_of(SAMPLE_EVERY)
            {
                seen.sampled.push((text.to_string(), at));
            }
        }
        if stop.load(Ordering::Acquire) {
            break;
        }
    }
    Ok(seen)
}

fn pct_ms(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    eprintln!(
        "measuring in {} for {} s per row …",
        dir.display(),
        a.seconds
    );
    eprintln!("  {WRITERS} writers, no stream (baseline) …");
    let base = served(&dir)?;
    let (n0, _, t0) = write(&base, a.seconds)?;
    base.daemon.stop()?;
    let base_rate = n0 as f64 / t0.as_secs_f64();

    eprintln!("  {WRITERS} writers while {STREAMS} event streams read …");
    let s = served(&dir)?;
    let cookie = login(&s)?;
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..STREAMS)
        .map(|_| {
            let (http, cookie, stop) = (s.http, cookie.clone(), stop.clone());
            std::thread::spawn(move || stream(http, cookie, stop))
        })
        .collect();
    // every stream open and said hello before the writers start
    std::thread::sleep(Duration::from_millis(500));
    let (n, acks, t) = write(&s, a.seconds)?;
    // what was committed has a moment to arrive
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Release);
    let mut delivered = 0u64;
    let mut lags = vec![];
    for r in readers {
        let seen = r
            .join()
            .map_err(|_| anyhow::anyhow!("a stream reader panicked"))??;
        delivered += seen.events;
        for (text, at) in seen.sampled {
            if let Some(ack) = acks.get(&text) {
                lags.push(at.saturating_duration_since(*ack).as_secs_f64() * 1000.0);
            }
        }
    }
    s.daemon.stop()?;
    let rate = n as f64 / t.as_secs_f64();
    println!(
        "{:<44} {:>12} {:>12} {:>10} {:>10} {:>12}",
        "row", "commits/s", "delivered/s", "p50 ms", "p99 ms", "vs baseline"
    );
    println!(
        "{:<44} {:>12.0} {:>12} {:>10} {:>10} {:>12}",
        format!("{WRITERS} writers, no stream (baseline)"),
        base_rate,
        "-",
        "-",
        "-",
        "1.00x"
    );
    println!(
        "{:<44} {:>12.0} {:>12.0} {:>10.1} {:>10.1} {:>11.2}x",
        format!("{WRITERS} writers, {STREAMS} event streams"),
        rate,
        delivered as f64 / t.as_secs_f64(),
        pct_ms(&mut lags, 0.5),
        pct_ms(&mut lags, 0.99),
        rate / base_rate
    );
    println!(
        "each stream got {:.1}% of the {n} committed events (lag from a commit's acknowledgement to its delivery, every {SAMPLE_EVERY}th event)",
        100.0 * delivered as f64 / (n as f64 * STREAMS as f64)
    );
    Ok(())
}
