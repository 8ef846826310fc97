//! `room serve --store postgres://…` and `room verify` on PostgreSQL, as a person runs them:
//! the daemon keeps its rooms in the database, and `room verify` reads their chains from
//! there (by `--store`, or by config.toml's `[store] url`). The server is private to the
//! test (room-store-pg's test server).

#[path = "../../room-store-pg/tests/server/mod.rs"]
#[allow(dead_code)]
mod server;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

fn room(state: &Path, root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_room"));
    c.args(args)
        .arg("--state-dir")
        .arg(state)
        .env("XDG_CONFIG_HOME", root.join("config"))
        .env("ROOM_LOG", "error")
        .env_remove("ROOM_TOKEN");
    c
}

fn run(state: &Path, root: &Path, args: &[&str]) -> Output {
    room(state, root, args).output().unwrap()
}

/// The test server's libpq words (`host=DIR port=N user=U dbname=D`) as a postgres:// url,
/// the socket directory percent-encoded as the host.
fn as_url(words: &str) -> String {
    let get = |k: &str| {
        words
            .split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{k}=")))
            .unwrap_or_default()
            .to_string()
    };
    let host = get("host").replace('/', "%2F");
    format!(
        "postgres://{}@{host}:{}/{}",
        get("user"),
        get("port"),
        get("dbname")
    )
}

#[test]
fn a_daemon_on_postgres_keeps_its_rooms_there_and_verify_reads_them() {
    let server = server::Server::start();
    let url = as_url(&server.fresh_database());
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = root.join("state");
    assert!(run(&state, &root, &["init"]).status.success());
    let mut daemon = room(&state, &root, &["serve", "--store", &url])
        .spawn()
        .unwrap();
    let sock = state.join("room.sock");
    for _ in 0..200 {
        if sock.exists() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let enrolled = run(&state, &root, &["agent", "enroll", "alice"]);
    assert!(enrolled.status.success(), "{enrolled:?}");
    let created = run(&state, &root, &["create", "demo", "--member", "alice"]);
    assert!(created.status.success(), "{created:?}");
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(daemon.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(daemon.wait().unwrap().success());
    // the state dir holds no room: the database does
    assert!(
        std::fs::read_dir(state.join("rooms"))
            .map(|d| d.count())
            .unwrap_or(0)
            == 0
    );
    let verified = run(&state, &root, &["verify", "--store", &url]);
    let out = String::from_utf8_lossy(&verified.stdout);
    assert!(verified.status.success(), "{verified:?}");
    assert!(out.starts_with("ok   demo 1 records"), "{out}");
    // config.toml's [store] url is the default for verify (and serve)
    let config = state.join("config.toml");
    let kept = std::fs::read_to_string(&config).unwrap_or_default();
    std::fs::write(&config, format!("{kept}\n[store]\nurl = \"{url}\"\n")).unwrap();
    let verified = run(&state, &root, &["verify", "demo"]);
    assert!(verified.status.success(), "{verified:?}");
    assert!(String::from_utf8_lossy(&verified.stdout).starts_with("ok   demo 1 records"));
    // a database a daemon has written to is no migration's target: refused, nothing written
    let other = root.join("other");
    assert!(run(&other, &root, &["init"]).status.success());
    let refused = run(&other, &root, &["migrate", "--to", &url]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.starts_with(
            "error[store_not_empty]: to: the database is not empty: its table shards holds rows"
        ),
        "{stderr}"
    );
    assert!(!other.join("store_migrated.json").exists());
    let verified = run(&state, &root, &["verify", "--store", &url]);
    assert!(String::from_utf8_lossy(&verified.stdout).starts_with("ok   demo 1 records"));
    let missing = run(&state, &root, &["verify", "nowhere"]);
    assert!(!missing.status.success());
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("no room named \"nowhere\""),
        "{missing:?}"
    );
}

/// Run statements on the test server's database `words` (libpq words), for what a test
/// arranges or inspects beside Room.
fn sql(words: &str, statements: &str) -> Vec<tokio_postgres::SimpleQueryMessage> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(words, tokio_postgres::NoTls)
            .await
            .unwrap();
        let conn = tokio::spawn(conn);
        let out = client.simple_query(statements).await.unwrap();
        drop(client);
        let _ = conn.await;
        out
    })
}

/// The first column of the first row `query` returns.
fn one(words: &str, query: &str) -> String {
    sql(words, query)
        .into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default()
}

/// A test's daemon: killed when dropped, so a failing test leaves none behind writing to a
/// server that is gone.
struct Daemon(std::process::Child);

impl std::ops::Deref for Daemon {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        &self.0
    }
}

impl std::ops::DerefMut for Daemon {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        &mut self.0
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A daemon on the state dir (`store` its --store), once its socket answers.
fn start_daemon(state: &Path, root: &Path, store: Option<&str>) -> Daemon {
    let mut args = vec!["serve"];
    if let Some(url) = store {
        args.extend(["--store", url]);
    }
    let _ = std::fs::remove_file(state.join("room.sock"));
    let mut daemon = Daemon(room(state, root, &args).spawn().unwrap());
    for _ in 0..400 {
        if state.join("room.sock").exists() && run(state, root, &["list"]).status.success() {
            return daemon;
        }
        if let Some(status) = daemon.try_wait().unwrap() {
            panic!("the daemon exited: {status}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the daemon did not answer");
}

fn stop_daemon(mut daemon: Daemon) {
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(daemon.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert!(daemon.wait().unwrap().success());
}

fn as_agent(state: &Path, root: &Path, token: &str, args: &[&str]) -> serde_json::Value {
    let out = room(state, root, args)
        .arg("--json")
        .env("ROOM_TOKEN", token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every room's chain as `room verify --json` reports it: (room, records, tip hash).
fn chains(state: &Path, root: &Path, store: Option<&str>) -> Vec<(String, u64, String)> {
    let mut args = vec!["verify", "--json"];
    if let Some(url) = store {
        args.extend(["--store", url]);
    }
    let out = run(state, root, &args);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["rooms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["room"].as_str().unwrap().to_string(),
                r["records"].as_u64().unwrap(),
                r["tip_hash"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn migrate_copies_a_state_dir_whole_resumes_a_cut_run_and_refuses_what_is_not_empty() {
    let server = server::Server::start();
    let words = server.fresh_database();
    let url = as_url(&words);
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = root.join("state");
    assert!(run(&state, &root, &["init"]).status.success());

    // an embedded state dir with rooms, turns, a blob, a confirmed reading and a task
    let daemon = start_daemon(&state, &root, None);
    let enrolled = run(
        &state,
        &root,
        &[
            "agent",
            "enroll",
            "alice",
            "--max-tier",
            "coordinator",
            "--json",
        ],
    );
    let token: serde_json::Value = serde_json::from_slice(&enrolled.stdout).unwrap();
    let token = token["token"].as_str().unwrap().to_string();
    for r in ["alpha", "beta", "gamma"] {
        assert!(
            run(&state, &root, &["create", r, "--member", "alice"])
                .status
                .success()
        );
    }
    let read = |room: &str| {
        let page = as_agent(&state, &root, &token, &["sync", room]);
        let receipt = page["receipt"].as_str().unwrap().to_string();
        as_agent(
            &state,
            &root,
            &token,
            &["sync", room, "--confirm", &receipt],
        );
        page["to_seq"].as_u64().unwrap()
    };
    read("alpha");
    as_agent(
        &state,
        &root,
        &token,
        &["say", "alpha", &"a long turn ".repeat(1_000)],
    );
    for i in 0..30 {
        read("gamma");
        as_agent(
            &state,
            &root,
            &token,
            &["say", "gamma", &format!("turn {i}")],
        );
    }
    let confirmed = read("alpha");
    as_agent(
        &state,
        &root,
        &token,
        &["task", "create", "beta", "first task"],
    );
    stop_daemon(daemon);
    let before = chains(&state, &root, None);
    assert_eq!(before.len(), 3);
    let blobs_dir = std::fs::read_dir(state.join("rooms"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("blobs"))
        .find(|b| std::fs::read_dir(b).is_ok_and(|mut d| d.next().is_some()))
        .expect("the long turn went to a blob");
    assert!(blobs_dir.exists());

    // the whole store lands, each chain verified on both sides
    let migrated = run(&state, &root, &["migrate", "--to", &url]);
    let out = String::from_utf8_lossy(&migrated.stdout);
    assert!(migrated.status.success(), "{migrated:?}");
    assert!(
        out.contains("room alpha:") && out.contains("1 blobs"),
        "{out}"
    );
    assert!(out.contains("migrated 3 rooms to"), "{out}");
    assert!(state.join("store_migrated.json").exists());

    // its embedded copy is not served again, and a second migration of it is refused
    let embedded = run(&state, &root, &["serve"]);
    assert_eq!(embedded.status.code(), Some(4), "{embedded:?}");
    assert!(String::from_utf8_lossy(&embedded.stderr).contains("store migrated"));
    let again = run(&state, &root, &["migrate", "--to", &url]);
    assert_eq!(again.status.code(), Some(4), "{again:?}");
    assert!(String::from_utf8_lossy(&again.stderr).contains("migrated already"));

    // a finished target is not empty: refused, and nothing in it changes
    let count = |q: &str| one(&words, q);
    let rows_before = (
        count("SELECT count(*) FROM journal"),
        count("SELECT count(*) FROM agents"),
        count(
            "SELECT string_agg(source_id || coalesce(finished_ms::text, '-'), ',') FROM migrate_runs",
        ),
    );
    std::fs::remove_file(state.join("store_migrated.json")).unwrap();
    let refused = run(&state, &root, &["migrate", "--to", &url]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.starts_with("error[store_not_empty]: to: the database already holds"),
        "{stderr}"
    );
    let rows_after = (
        count("SELECT count(*) FROM journal"),
        count("SELECT count(*) FROM agents"),
        count(
            "SELECT string_agg(source_id || coalesce(finished_ms::text, '-'), ',') FROM migrate_runs",
        ),
    );
    assert_eq!(rows_before, rows_after);
    assert!(!state.join("store_migrated.json").exists());

    // a run cut short, as a kill leaves it: one room's journal part-way (its head at seq
    // 10, each batch being a transaction), another's blob and receipts not there yet, the
    // control store not copied, the run open
    let gamma = count("SELECT graph_id FROM rooms WHERE name = 'gamma'");
    let alpha = count("SELECT graph_id FROM rooms WHERE name = 'alpha'");
    sql(
        &words,
        &format!(
            "UPDATE migrate_runs SET finished_ms = NULL;
             TRUNCATE agents, retired_secrets, denied_verbs, projects, project_sources, rooms,
                 members, tasks, task_scopes, task_checks, wakes, launches, sessions, holds,
                 collabs, collab_runs, collab_approvals CASCADE;
             DELETE FROM journal WHERE graph_id = '{gamma}' AND seq > 10;
             UPDATE room_heads h SET seq = j.seq, len = j.\"offset\" + length(j.line),
                 hash = convert_from(j.line, 'UTF8')::jsonb ->> 'hash',
                 hlc_ms = (convert_from(j.line, 'UTF8')::jsonb -> 'hlc' ->> 'ms')::bigint,
                 hlc_c = (convert_from(j.line, 'UTF8')::jsonb -> 'hlc' ->> 'c')::bigint
               FROM journal j WHERE j.graph_id = h.graph_id AND h.graph_id = '{gamma}' AND j.seq = 10;
             DELETE FROM blobs WHERE graph_id = '{alpha}';
             DELETE FROM receipts WHERE graph_id = '{alpha}';"
        ),
    );
    // nor does another state dir's migration take it over
    let other = root.join("other");
    assert!(run(&other, &root, &["init"]).status.success());
    let journal_rows = count("SELECT count(*) FROM journal");
    let taken = run(&other, &root, &["migrate", "--to", &url]);
    assert_eq!(taken.status.code(), Some(1), "{taken:?}");
    let stderr = String::from_utf8_lossy(&taken.stderr);
    assert!(
        stderr.starts_with("error[store_not_empty]: to: a migration from another state dir"),
        "{stderr}"
    );
    assert_eq!(count("SELECT count(*) FROM journal"), journal_rows);
    assert_eq!(count("SELECT count(*) FROM migrate_runs"), "1");
    // no daemon serves a database a migration has not finished
    let unfinished = run(&state, &root, &["serve", "--store", &url]);
    assert_eq!(unfinished.status.code(), Some(3), "{unfinished:?}");
    let stderr = String::from_utf8_lossy(&unfinished.stderr);
    assert!(stderr.contains("migration unfinished"), "{stderr}");
    assert!(
        stderr.contains("hint: run the same room migrate again"),
        "{stderr}"
    );
    let resumed = run(&state, &root, &["migrate", "--to", &url]);
    let out = String::from_utf8_lossy(&resumed.stdout);
    assert!(resumed.status.success(), "{resumed:?}");
    let gamma_records = before.iter().find(|c| c.0 == "gamma").unwrap().1;
    assert!(
        out.contains(&format!(
            "room gamma: {gamma_records} records ({} copied now)",
            gamma_records - 10
        )),
        "{out}"
    );
    assert!(
        out.contains("room beta:") && out.contains("(0 copied now)"),
        "{out}"
    );
    assert!(out.contains("migrated 3 rooms (resumed)"), "{out}");
    assert!(
        out.contains(&format!("next: room init --store {url}")),
        "{out}"
    );
    // the database belongs to the migrated state dir's instance
    let init: serde_json::Value =
        serde_json::from_slice(&run(&state, &root, &["init", "--json"]).stdout).unwrap();
    assert_eq!(
        one(&words, "SELECT instance FROM store_instance"),
        init["instance"].as_str().unwrap()
    );
    // what `next:` says: the migrated state dir names the database (its embedded rooms are
    // the database's now), and serves it from config.toml
    let adopted = run(&state, &root, &["init", "--store", &url]);
    assert!(adopted.status.success(), "{adopted:?}");

    // the database serves what the state dir held: the same chains, the agent's token, its
    // confirmed reading, the blob's text, the task
    assert_eq!(chains(&state, &root, Some(&url)), before);
    let daemon = start_daemon(&state, &root, None);
    let page = as_agent(&state, &root, &token, &["sync", "alpha"]);
    assert_eq!(page["confirmed_seq"].as_u64(), Some(confirmed), "{page}");
    let log = run(&state, &root, &["log", "alpha", "--json"]);
    assert!(String::from_utf8_lossy(&log.stdout).contains("a long turn a long turn"));
    let search = as_agent(&state, &root, &token, &["search", "gamma", "turn"]);
    assert!(
        !search["results"].as_array().unwrap().is_empty(),
        "{search}"
    );
    let tasks = run(&state, &root, &["log", "beta", "--json"]);
    assert!(String::from_utf8_lossy(&tasks.stdout).contains("first task"));
    stop_daemon(daemon);
}

/// PostgreSQL crashes and restarts under a daemon taking turns: turns are refused while it is
/// down (never acknowledged), the daemon stays up and takes turns again once the server is
/// back, and afterwards the chain verifies from the database and holds every acknowledged turn
/// exactly once (a turn whose answer was lost with the connection lands at most once).
#[test]
fn a_postgres_restart_under_a_daemon_loses_no_acknowledged_turn() {
    const DOWN: Duration = Duration::from_millis(1_500);
    let server = server::Server::start();
    if std::env::var_os("ROOM_TEST_PG_URL").is_some() {
        eprintln!(
            "ROOM_TEST_PG_URL names a server this test cannot restart: the crash is not exercised"
        );
        return;
    }
    let url = as_url(&server.fresh_database());
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = root.join("state");
    assert!(run(&state, &root, &["init"]).status.success());
    let mut daemon = start_daemon(&state, &root, Some(&url));
    let enrolled = run(&state, &root, &["agent", "enroll", "alice", "--json"]);
    let token = serde_json::from_slice::<serde_json::Value>(&enrolled.stdout).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        run(&state, &root, &["create", "demo", "--member", "alice"])
            .status
            .success()
    );
    let sock = state.join("room.sock");
    let call = |c: &mut room_server::client::Client, op: &str, args: serde_json::Value| {
        c.call(&room_server::wire::Request::new(op, args).with_token(Some(&token)))
    };
    let mut c = room_server::client::Client::connect(&sock).unwrap();
    // alice reads the room to its tip once; her own notes fold, so she stays caught up
    let page = call(&mut c, "sync", serde_json::json!({"room": "demo"})).unwrap();
    let receipt = page.result.unwrap()["receipt"].clone();
    call(
        &mut c,
        "sync",
        serde_json::json!({"room": "demo", "confirm": receipt}),
    )
    .unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let acked_now = std::sync::atomic::AtomicUsize::new(0);
    let (acked, unknown, refused, written, longest, at_crash) = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut c = room_server::client::Client::connect(&sock).unwrap();
            let (mut acked, mut unknown, mut refused) = (Vec::new(), Vec::new(), 0);
            let mut written = Vec::new();
            let mut longest = Duration::ZERO;
            let mut codes = std::collections::BTreeMap::<String, usize>::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let key = format!("k{i}");
                let args = serde_json::json!({"room": "demo", "text": format!("n{i}"),
                    "idempotency_key": key});
                let began = std::time::Instant::now();
                let answer = call(&mut c, "note", args);
                longest = longest.max(began.elapsed());
                match answer {
                    Ok(r) if r.ok => {
                        acked.push(key);
                        acked_now.store(acked.len(), std::sync::atomic::Ordering::SeqCst);
                    }
                    Ok(r) => {
                        let detail = r.refusal.as_ref().map(|r| r.detail.clone());
                        let detail = detail.unwrap_or_default();
                        if detail["journal_committed"] == true {
                            // written, though its projection failed: the refusal says so
                            written.push((key, detail["events"][0].as_str().map(String::from)));
                        } else if detail["in_doubt"] == true {
                            unknown.push(key);
                        } else {
                            refused += 1;
                        }
                        let why = r
                            .refusal
                            .map(|r| format!("{}: {}", r.code.as_str(), r.message));
                        *codes.entry(why.unwrap_or_default()).or_default() += 1;
                    }
                    Err(_) => {
                        // the answer was lost: the turn may or may not have landed
                        unknown.push(key);
                        c = loop {
                            match room_server::client::Client::connect(&sock) {
                                Ok(c) => break c,
                                Err(_) => std::thread::sleep(Duration::from_millis(50)),
                            }
                        };
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            eprintln!("refusals while the server was down: {codes:#?}");
            (acked, unknown, refused, written, longest)
        });
        std::thread::sleep(Duration::from_millis(500));
        let at_crash = acked_now.load(std::sync::atomic::Ordering::SeqCst);
        server.crash_and_restart(DOWN);
        // turns are taken again once the server is back
        let mut recovered = false;
        for _ in 0..600 {
            std::thread::sleep(Duration::from_millis(50));
            if acked_now.load(std::sync::atomic::Ordering::SeqCst) > at_crash + 10 {
                recovered = true;
                break;
            }
        }
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (acked, unknown, refused, written, longest) = writer.join().unwrap();
        assert!(recovered, "no turn was acknowledged after the restart");
        (acked, unknown, refused, written, longest, at_crash)
    });
    eprintln!(
        "{} turns acknowledged ({at_crash} before the crash), {refused} refused while the server was down, {} answers lost, {} written but refused, the longest call {longest:?}",
        acked.len(),
        unknown.len(),
        written.len()
    );
    assert!(at_crash > 0, "the writer took turns before the crash");
    // felt as refusals, lost answers, or one call held across the whole outage (the daemon
    // waits for a server that restarts before it reads back what its commit did)
    assert!(
        refused + unknown.len() + written.len() > 0 || longest >= DOWN,
        "the crash was felt"
    );
    assert!(daemon.try_wait().unwrap().is_none(), "the daemon stayed up");
    // every note's text, as the owner reads the room from the database
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    let mut from = 1;
    loop {
        let out = run(
            &state,
            &root,
            &[
                "log",
                "demo",
                "--from",
                &from.to_string(),
                "--limit",
                "1000",
                "--json",
            ],
        );
        assert!(out.status.success(), "{out:?}");
        let page: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let events = page["events"].as_array().unwrap();
        for e in events {
            if e["event"]["verb"] == "note" {
                let text = e["event"]["text"].as_str().unwrap();
                *seen.entry(format!("k{}", &text[1..])).or_default() += 1;
            }
        }
        match events.last() {
            Some(last) if events.len() == 1000 => from = last["seq"].as_u64().unwrap() + 1,
            _ => break,
        }
    }
    for k in &acked {
        assert_eq!(seen.get(k), Some(&1), "acknowledged turn {k}");
    }
    for k in &unknown {
        assert!(
            seen.get(k).copied().unwrap_or(0) <= 1,
            "turn {k} landed twice"
        );
    }
    // a turn refused as written but not projected is there once, and its key, repeated, is
    // refused as a repeat naming that very event (what its hint tells a client to rely on)
    let mut c = room_server::client::Client::connect(&sock).unwrap();
    for (k, event) in &written {
        assert_eq!(seen.get(k), Some(&1), "written turn {k}");
        let args = serde_json::json!({"room": "demo", "text": format!("n{}", &k[1..]),
            "idempotency_key": k});
        let again = call(&mut c, "note", args).unwrap();
        let r = again.refusal.expect("a repeated key is refused");
        assert_eq!(r.code.as_str(), "invariant_violation", "{r:?}");
        assert_eq!(
            r.detail["original_event"].as_str(),
            event.as_deref(),
            "{r:?}"
        );
    }
    // the daemon took its database lock back after the restart: a second daemon is refused
    let second = root.join("second");
    assert!(
        run(&second, &root, &["init", "--store", &url])
            .status
            .success()
    );
    let mut refused = room(&second, &root, &["serve"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut ended = None;
    for _ in 0..300 {
        ended = refused.try_wait().unwrap();
        if ended.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if ended.is_none() {
        let _ = refused.kill();
    }
    let refused = refused.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("another daemon serves this database"),
        "{refused:?}"
    );
    stop_daemon(daemon);
    let verified = chains(&state, &root, Some(&url));
    assert_eq!(verified.len(), 1, "{verified:?}");
    let extra: Vec<_> = seen
        .keys()
        .filter(|k| {
            !acked.contains(k) && !unknown.contains(k) && !written.iter().any(|(w, _)| w == *k)
        })
        .collect();
    assert!(
        extra.is_empty(),
        "turns landed that were refused: {extra:?}"
    );
}

/// `room migrate` killed with SIGKILL as soon as its first room has landed: the database is
/// refused to a daemon until the same command runs again, which resumes (rooms already whole
/// are checked and kept, the one cut short continues from its head) and ends with every chain
/// in the database exactly as in the state dir.
#[test]
fn migrate_killed_mid_copy_resumes_to_the_same_chains() {
    use std::io::BufRead;
    let server = server::Server::start();
    let words = server.fresh_database();
    let url = as_url(&words);
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = root.join("state");
    assert!(run(&state, &root, &["init"]).status.success());
    let daemon = start_daemon(&state, &root, None);
    let enrolled = run(&state, &root, &["agent", "enroll", "alice", "--json"]);
    let token = serde_json::from_slice::<serde_json::Value>(&enrolled.stdout).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    let rooms: Vec<String> = (0..6).map(|i| format!("r{i}")).collect();
    for r in &rooms {
        assert!(
            run(&state, &root, &["create", r, "--member", "alice"])
                .status
                .success()
        );
    }
    let mut c = room_server::client::Client::connect(&state.join("room.sock")).unwrap();
    let mut call = |op: &str, args: serde_json::Value| {
        let r = c
            .call(&room_server::wire::Request::new(op, args).with_token(Some(&token)))
            .unwrap();
        assert!(r.ok, "{op}: {:?}", r.refusal);
        r.result.unwrap_or_default()
    };
    for r in &rooms {
        let page = call("sync", serde_json::json!({"room": r}));
        call(
            "sync",
            serde_json::json!({"room": r, "confirm": page["receipt"]}),
        );
        for i in 0..400 {
            call(
                "note",
                serde_json::json!({"room": r, "text": format!("note {i} of {r}")}),
            );
        }
    }
    stop_daemon(daemon);
    let before = chains(&state, &root, None);
    assert_eq!(before.len(), rooms.len());

    // killed as soon as the first room has landed
    let mut child = room(&state, &root, &["migrate", "--to", &url])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(first.starts_with("room "), "{first}");
    assert_eq!(
        one(
            &words,
            "SELECT count(*) FROM migrate_runs WHERE finished_ms IS NULL"
        ),
        "1",
        "the kill came before the migration finished"
    );
    let landed = one(&words, "SELECT count(*) FROM journal");
    let all: u64 = before.iter().map(|(_, n, _)| n).sum();
    assert!(
        landed.parse::<u64>().unwrap() < all,
        "{landed} of {all} records had landed at the kill"
    );
    assert!(!state.join("store_migrated.json").exists());
    // the database is refused to a daemon meanwhile
    let refused = run(&state, &root, &["serve", "--store", &url]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("migration unfinished"),
        "{refused:?}"
    );
    // the same command resumes and finishes
    let resumed = run(&state, &root, &["migrate", "--to", &url]);
    assert!(resumed.status.success(), "{resumed:?}");
    let text = String::from_utf8_lossy(&resumed.stdout);
    assert!(text.contains("(resumed)"), "{text}");
    assert_eq!(chains(&state, &root, Some(&url)), before);
    assert_eq!(
        one(&words, "SELECT count(*) FROM journal"),
        all.to_string(),
        "every record once"
    );
}

/// A database belongs to the Room instance that first served it: a state dir of another
/// instance is refused before it reads anything (its permits and read positions would all be
/// someone else's), and `room init --store URL` makes a state dir on another host that serves
/// the same Room (the database's instance, config.toml naming the database).
#[test]
fn a_database_is_served_only_as_the_instance_it_belongs_to() {
    let server = server::Server::start();
    let words = server.fresh_database();
    let url = as_url(&words);
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let instance_of = |out: &Output| -> String {
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["instance"].as_str().unwrap().to_string()
    };
    // the first host: its daemon binds the database to its instance
    let first = root.join("first");
    let first_id = instance_of(&run(&first, &root, &["init", "--json"]));
    let daemon = start_daemon(&first, &root, Some(&url));
    let enrolled = run(&first, &root, &["agent", "enroll", "alice", "--json"]);
    let token = serde_json::from_slice::<serde_json::Value>(&enrolled.stdout).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        run(&first, &root, &["create", "demo", "--member", "alice"])
            .status
            .success()
    );
    let page = as_agent(&first, &root, &token, &["sync", "demo"]);
    let receipt = page["receipt"].as_str().unwrap().to_string();
    as_agent(
        &first,
        &root,
        &token,
        &["sync", "demo", "--confirm", &receipt],
    );
    as_agent(
        &first,
        &root,
        &token,
        &["note", "demo", "from the first host"],
    );
    stop_daemon(daemon);
    assert_eq!(one(&words, "SELECT instance FROM store_instance"), first_id);
    let heads = || {
        one(
            &words,
            "SELECT string_agg(graph_id || ':' || seq, ',') FROM room_heads",
        )
    };
    let before = (heads(), one(&words, "SELECT count(*) FROM journal"));
    let serving = || one(&words, "SELECT generation || ' ' || holder FROM serving");
    let served = serving();
    // a state dir of another instance: refused at start, nothing read or written
    let other = root.join("other");
    let other_id = instance_of(&run(&other, &root, &["init", "--json"]));
    assert_ne!(other_id, first_id);
    let refused = run(&other, &root, &["serve", "--store", &url]);
    assert_eq!(refused.status.code(), Some(4), "{refused:?}");
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains(&format!(
            "store of another instance: this database belongs to Room instance {first_id}; this state dir is instance {other_id}"
        )) && stderr.contains("hint: serve it from that instance's state dir, or make one for this host: room init --store URL"),
        "{stderr}"
    );
    assert_eq!(one(&words, "SELECT instance FROM store_instance"), first_id);
    assert_eq!(
        (heads(), one(&words, "SELECT count(*) FROM journal")),
        before
    );
    // a refused start took no serving generation (it fences no one)
    assert_eq!(serving(), served);
    // nor does room init adopt the database into a state dir of another instance
    let again = run(&other, &root, &["init", "--store", &url]);
    assert_eq!(again.status.code(), Some(4), "{again:?}");
    assert!(
        String::from_utf8_lossy(&again.stderr).contains(&format!(
            "this database belongs to Room instance {first_id}"
        )),
        "{again:?}"
    );
    assert!(
        !std::fs::read_to_string(other.join("config.toml"))
            .unwrap()
            .contains("[store]")
    );
    // the second host: room init --store takes the database's instance and names it
    let second = root.join("second");
    let second_id = instance_of(&run(&second, &root, &["init", "--store", &url, "--json"]));
    assert_eq!(second_id, first_id);
    let config = std::fs::read_to_string(second.join("config.toml")).unwrap();
    assert!(
        config.contains(&format!("[store]\nurl = \"{url}\"")),
        "{config}"
    );
    // idempotent: the same init again changes nothing
    assert_eq!(
        instance_of(&run(&second, &root, &["init", "--store", &url, "--json"])),
        first_id
    );
    assert_eq!(
        std::fs::read_to_string(second.join("config.toml")).unwrap(),
        config
    );
    // room init --store binds a database nothing bound yet to the new state dir's instance
    let words2 = server.fresh_database();
    let url2 = as_url(&words2);
    // (but not while config.toml names another store: refused, nothing bound or written)
    let named = root.join("named");
    assert!(run(&named, &root, &["init"]).status.success());
    let config = named.join("config.toml");
    let kept = std::fs::read_to_string(&config).unwrap();
    let elsewhere = format!("{kept}\n[store]\nurl = \"postgres://someone@elsewhere/room\"\n");
    std::fs::write(&config, &elsewhere).unwrap();
    let refused = run(&named, &root, &["init", "--store", &url2]);
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("names another store"),
        "{refused:?}"
    );
    assert_eq!(one(&words2, "SELECT count(*) FROM store_instance"), "0");
    assert_eq!(std::fs::read_to_string(&config).unwrap(), elsewhere);
    let third_id = instance_of(&run(
        &root.join("third"),
        &root,
        &["init", "--store", &url2, "--json"],
    ));
    assert_eq!(
        one(&words2, "SELECT instance FROM store_instance"),
        third_id
    );
    // and refuses a state dir whose embedded store holds rooms (they would be left behind)
    let embedded = root.join("embedded");
    assert!(run(&embedded, &root, &["init"]).status.success());
    let local = start_daemon(&embedded, &root, None);
    assert!(run(&embedded, &root, &["create", "here"]).status.success());
    stop_daemon(local);
    let words3 = server.fresh_database();
    let left = run(&embedded, &root, &["init", "--store", &as_url(&words3)]);
    assert_eq!(left.status.code(), Some(4), "{left:?}");
    let stderr = String::from_utf8_lossy(&left.stderr);
    assert!(
        stderr.contains("keeps rooms in its embedded store (1)")
            && stderr.contains("hint: room migrate --to URL"),
        "{stderr}"
    );
    assert_eq!(one(&words3, "SELECT count(*) FROM store_instance"), "0");
    assert!(
        !std::fs::read_to_string(embedded.join("config.toml"))
            .unwrap()
            .contains("[store]")
    );
    // served from config.toml's url: the same rooms, the same agent's credential
    let daemon = start_daemon(&second, &root, None);
    let who = as_agent(&second, &root, &token, &["whoami"]);
    assert_eq!(who["agent"], "alice", "{who}");
    // her read position is the instance's: she is caught up there as she was here
    as_agent(
        &second,
        &root,
        &token,
        &["note", "demo", "from the second host"],
    );
    let log = run(&second, &root, &["log", "demo", "--json"]);
    let text = String::from_utf8_lossy(&log.stdout);
    assert!(
        text.contains("from the first host") && text.contains("from the second host"),
        "{text}"
    );
    stop_daemon(daemon);
    assert_eq!(chains(&second, &root, None).len(), 1);
}

/// Another writer (what a second daemon on the database is) appends to a room this daemon
/// holds open: the daemon's next turn there is refused `room_sync_concurrent_arrival` with
/// nothing written, never a fork; its next call reads the room anew and lands after the
/// foreign record, on one chain.
#[test]
fn a_foreign_append_under_an_open_room_is_a_concurrent_arrival_never_a_fork() {
    use room_store::Backend;
    let server = server::Server::start();
    let words = server.fresh_database();
    let url = as_url(&words);
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = root.join("state");
    assert!(run(&state, &root, &["init"]).status.success());
    let daemon = start_daemon(&state, &root, Some(&url));
    let enrolled = run(&state, &root, &["agent", "enroll", "alice", "--json"]);
    let token = serde_json::from_slice::<serde_json::Value>(&enrolled.stdout).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        run(&state, &root, &["create", "demo", "--member", "alice"])
            .status
            .success()
    );
    let caught_up = || {
        let page = as_agent(&state, &root, &token, &["sync", "demo"]);
        let receipt = page["receipt"].as_str().unwrap().to_string();
        as_agent(
            &state,
            &root,
            &token,
            &["sync", "demo", "--confirm", &receipt],
        );
    };
    let note = |text: &str| {
        room(&state, &root, &["note", "demo", text, "--json"])
            .env("ROOM_TOKEN", &token)
            .output()
            .unwrap()
    };
    caught_up();
    assert!(note("one").status.success());
    // the other writer: alice's note again, sealed after the head as a daemon beside this
    // one would seal it, appended straight to the database
    let log = run(&state, &root, &["log", "demo", "--json"]);
    let page: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
    let mut event = page["events"].as_array().unwrap().last().unwrap()["event"].clone();
    assert_eq!(event["text"], "one", "{event}");
    event["text"] = "from another daemon".into();
    let graph = one(&words, "SELECT graph_id FROM room_heads");
    let other = room_store_pg::PgBackend::connect(&url).unwrap();
    let mut journal = other.open_log(&graph, None, &mut |_| Ok(())).unwrap();
    let tip = journal.tip();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let hlc = tip.hlc.tick(now);
    let id = room_core::id::event_id(hlc, &room_server::daemon::OsEntropy);
    journal
        .append(&[room_core::Sealed::seal(&tip, id.clone(), hlc, event)])
        .unwrap();
    drop(journal);
    drop(other);
    let count = || one(&words, "SELECT count(*) FROM journal");
    let before = count();
    // refused: the head moved under the daemon's open room; nothing written
    let refused = note("two");
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let r: serde_json::Value = serde_json::from_slice(&refused.stdout).unwrap();
    assert_eq!(r["refusal"]["code"], "room_sync_concurrent_arrival", "{r}");
    assert_eq!(r["refusal"]["detail"]["moved_by"], "another writer", "{r}");
    assert_eq!(count(), before);
    // the next call reads the room anew: the foreign record is alice's own (her session on
    // the other daemon), so she is caught up over it, and her turn lands after it
    let mut l = serde_json::Value::Null;
    for _ in 0..20 {
        let landed = note("two");
        l = serde_json::from_slice(&landed.stdout).unwrap();
        if landed.status.success() {
            break;
        }
        // a flush held the room a moment: the caller is told to try again, nothing written
        assert_eq!(l["refusal"]["code"], "room_sync_concurrent_arrival", "{l}");
        assert_eq!(count(), before);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(l["event"].is_string(), "{l}");
    assert_eq!(count(), (before.parse::<u64>().unwrap() + 1).to_string());
    let log = run(&state, &root, &["log", "demo", "--json"]);
    let page: serde_json::Value = serde_json::from_slice(&log.stdout).unwrap();
    let tail: Vec<(u64, String)> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["seq"].as_u64().unwrap(),
                e["id"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let at = |id: &str| tail.iter().find(|(_, i)| i == id).map(|(s, _)| *s);
    let foreign = at(&id).expect("the foreign record is in the room");
    assert_eq!(
        at(l["event"].as_str().unwrap()),
        Some(foreign + 1),
        "{tail:?}"
    );
    stop_daemon(daemon);
    let verified = chains(&state, &root, Some(&url));
    assert_eq!(verified.len(), 1, "{verified:?}");
}

/// A session of the test's own on the test server, kept across statements.
struct Session {
    rt: tokio::runtime::Runtime,
    client: tokio_postgres::Client,
}

impl Session {
    fn open(words: &str) -> Session {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(words, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            client
        });
        Session { rt, client }
    }

    /// The first column of the first row, as text.
    fn one(&self, query: &str) -> String {
        self.rt.block_on(async {
            self.client
                .simple_query(query)
                .await
                .unwrap()
                .into_iter()
                .find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
                    _ => None,
                })
                .unwrap_or_default()
        })
    }
}

/// The daemon's lock on its database goes with the session that holds it. Until it has the
/// lock back it refuses every turn (nothing written); it takes the lock back once free while
/// the serving generation is still its own. A lock session that stops answering stops the
/// daemon's writes too, until it answers again. A daemon that took the database over meanwhile
/// moved the generation: the first one's next append is refused by the database itself, and
/// the first daemon stops (exit 4, "fenced").
#[test]
fn a_daemon_that_loses_its_database_lock_writes_nothing_until_it_holds_it_again() {
    const LOCK: &str = "5940088948614325613"; // the daemon's advisory lock key, "RoomDaem"
    let server = server::Server::start();
    let words = server.fresh_database();
    let url = as_url(&words);
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let state = root.join("state");
    assert!(run(&state, &root, &["init"]).status.success());
    let errors = root.join("daemon.err");
    let mut daemon = Daemon(
        room(&state, &root, &["serve", "--store", &url])
            .stderr(std::fs::File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    for _ in 0..400 {
        if state.join("room.sock").exists() && run(&state, &root, &["list"]).status.success() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let enrolled = run(&state, &root, &["agent", "enroll", "alice", "--json"]);
    let token = serde_json::from_slice::<serde_json::Value>(&enrolled.stdout).unwrap()["token"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        run(&state, &root, &["create", "demo", "--member", "alice"])
            .status
            .success()
    );
    let page = as_agent(&state, &root, &token, &["sync", "demo"]);
    let receipt = page["receipt"].as_str().unwrap().to_string();
    as_agent(
        &state,
        &root,
        &token,
        &["sync", "demo", "--confirm", &receipt],
    );
    let note = |text: &str| {
        let out = room(&state, &root, &["note", "demo", text, "--json"])
            .env("ROOM_TOKEN", &token)
            .output()
            .unwrap();
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    assert!(note("one")["event"].is_string());
    let test = Session::open(&words);
    let generation = test.one("SELECT generation FROM serving");
    assert_ne!(generation, "0");
    let count = || test.one("SELECT count(*) FROM journal");
    // the lock's session ends (as a server or a network would end it) and the test takes
    // the lock before the daemon takes it back
    let mut held = false;
    for _ in 0..50 {
        test.one(&format!(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid() AND objid = ({LOCK}::bigint & 4294967295)::oid"
        ));
        if test.one(&format!("SELECT pg_try_advisory_lock({LOCK})")) == "t" {
            held = true;
            break;
        }
    }
    assert!(held, "the test took the lock");
    std::thread::sleep(Duration::from_millis(300));
    let before = count();
    let refused = note("two");
    assert_eq!(refused["refusal"]["code"], "storage_failed", "{refused}");
    assert!(
        refused["refusal"]["message"]
            .as_str()
            .unwrap()
            .contains("lock on the database went with its connection"),
        "{refused}"
    );
    assert_eq!(count(), before);
    // the lock is free again and the generation is still the daemon's: it takes it back
    test.one(&format!("SELECT pg_advisory_unlock({LOCK})"));
    let mut landed = serde_json::Value::Null;
    for _ in 0..100 {
        landed = note("two");
        if landed["event"].is_string() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(landed["event"].is_string(), "{landed}");
    assert_eq!(test.one("SELECT generation FROM serving"), generation);
    // the lock's session stops answering (its server process stopped, as a cut network
    // would silence it): after a few seconds the daemon writes nothing, and once it answers
    // again the daemon writes again
    let holder = test.one(&format!(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objid = ({LOCK}::bigint & 4294967295)::oid"
    ));
    let holder = rustix::process::Pid::from_raw(holder.parse().unwrap()).unwrap();
    rustix::process::kill_process(holder, rustix::process::Signal::STOP).unwrap();
    std::thread::sleep(Duration::from_millis(9_000));
    let before = count();
    let silent = note("silent");
    rustix::process::kill_process(holder, rustix::process::Signal::CONT).unwrap();
    assert_eq!(silent["refusal"]["code"], "storage_failed", "{silent}");
    assert!(
        silent["refusal"]["message"]
            .as_str()
            .unwrap()
            .contains("has not answered for"),
        "{silent}"
    );
    assert_eq!(count(), before);
    let mut landed = serde_json::Value::Null;
    for _ in 0..100 {
        landed = note("answered again");
        if landed["event"].is_string() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(landed["event"].is_string(), "{landed}");
    // another daemon took the database over (as one that took the lock would, it moved the
    // serving generation): the daemon's next append is refused by the database
    test.one("UPDATE serving SET generation = generation + 1, holder = 'the test'");
    let before = count();
    let fenced = note("three");
    assert_eq!(fenced["refusal"]["code"], "storage_failed", "{fenced}");
    assert!(
        fenced["refusal"]["message"]
            .as_str()
            .unwrap()
            .contains("another daemon took this database over (the test"),
        "{fenced}"
    );
    assert_eq!(count(), before);
    // and the daemon stops
    let mut status = None;
    for _ in 0..200 {
        status = daemon.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(status.and_then(|s| s.code()), Some(4), "{status:?}");
    let stderr = std::fs::read_to_string(&errors).unwrap();
    assert!(
        stderr.contains("error: fenced: another daemon took this database over (the test")
            && stderr.contains("hint: another daemon serves this database now"),
        "{stderr}"
    );
    assert_eq!(count(), before);
}
