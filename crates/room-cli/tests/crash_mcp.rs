//! Crash test with real MCP clients: a swarm of agents over streamable HTTP (rmcp's client) in
//! shared rooms, the daemon killed with SIGKILL at random moments; after each restart every turn a
//! client saw acknowledged is present and every chain verifies. Every turn carries an
//! idempotency key: a call in flight when the daemon died is retried with its key after the
//! restart and either lands now or is refused as a repeat naming the event that landed before,
//! so each key is in the journal exactly once.

use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use room_server::client::Client;
use room_server::wire::Request;
use serde_json::{Value, json};
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const AGENTS: usize = 8;
const ROUNDS: usize = 5;

fn owner(sock: &Path, op: &str, args: Value) -> Value {
    let r = Client::connect(sock)
        .unwrap()
        .call(&Request::new(op, args))
        .unwrap();
    r.result.unwrap_or_else(|| panic!("{op}: {:?}", r.refusal))
}

/// Kills the daemon when the test ends, even by panic, so it never outlives the test.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn(state: &Path, config: &Path) -> (Daemon, String) {
    // a SIGKILLed daemon leaves its address file behind; wait for the new one's
    let _ = std::fs::remove_file(state.join("http.addr"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_room"))
        .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state)
        .env("XDG_CONFIG_HOME", config)
        .env("ROOM_LOG", "error")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..1000 {
        if let Ok(addr) = std::fs::read_to_string(state.join("http.addr"))
            && !addr.trim().is_empty()
        {
            return (Daemon(child), format!("http://{}/mcp", addr.trim()));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("daemon did not come up");
}

fn args(v: Value) -> serde_json::Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

type Mcp = rmcp::service::RunningService<rmcp::RoleClient, ()>;

/// Read until caught up, confirming each page.
async fn catch_up(client: &Mcp, room: &str) -> bool {
    let mut confirm: Option<String> = None;
    loop {
        let mut a = json!({"room": room});
        if let Some(c) = &confirm {
            a["confirm"] = json!(c);
        }
        let Ok(p) = client
            .call_tool(CallToolRequestParams::new("room_sync").with_arguments(args(a)))
            .await
        else {
            return false;
        };
        let page = p.structured_content.unwrap_or_default();
        if p.is_error == Some(true) {
            confirm = None;
            continue;
        }
        if page["items"].as_array().is_none_or(Vec::is_empty) {
            return true;
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
}

/// Write until the connection dies; record what was acknowledged, and the key of a call that
/// was in flight when it died.
async fn agent(
    url: String,
    (name, token, room): (String, String, String),
    acked: Arc<Mutex<Vec<String>>>,
    in_doubt: Arc<Mutex<Vec<String>>>,
    round: usize,
) {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    let Ok(client) = ().serve(transport).await else {
        return;
    };
    let mut n = 0;
    loop {
        n += 1;
        let key = format!("{name}-{round}-{n}");
        let r = client
            .call_tool(CallToolRequestParams::new("room_note").with_arguments(args(
                json!({"room": room, "text": format!("note {key}"), "idempotency_key": key}),
            )))
            .await;
        let Ok(r) = r else {
            in_doubt.lock().unwrap().push(key);
            return;
        };
        let v = r.structured_content.unwrap_or_default();
        if r.is_error != Some(true) {
            acked
                .lock()
                .unwrap()
                .push(v["event"].as_str().unwrap().to_string());
            continue;
        }
        // refused by the gate: read what the room-mate wrote, then go on
        assert!(
            matches!(
                v["refusal"]["code"].as_str(),
                Some("room_sync_required" | "room_sync_concurrent_arrival")
            ),
            "unexpected refusal {v}"
        );
        // the key was not registered: the same call may go again after reading
        n -= 1;
        if !catch_up(&client, &room).await {
            return;
        }
    }
}

/// After a restart: retry each in-flight call with its key. It lands now, or it is refused as
/// a repeat naming the event that landed before the kill. Returns the events now acknowledged.
async fn retry_in_doubt(
    url: String,
    token: String,
    room: String,
    keys: Vec<String>,
) -> Vec<(String, bool)> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    let client = ().serve(transport).await.expect("the restarted daemon answers");
    let mut out = vec![];
    for key in keys {
        for _ in 0..100 {
            let r = client
                .call_tool(CallToolRequestParams::new("room_note").with_arguments(args(
                    json!({"room": room, "text": format!("note {key}"), "idempotency_key": key}),
                )))
                .await
                .expect("the restarted daemon answers");
            let v = r.structured_content.unwrap_or_default();
            if r.is_error != Some(true) {
                out.push((v["event"].as_str().unwrap().to_string(), false));
                break;
            }
            match v["refusal"]["code"].as_str() {
                Some("invariant_violation") => {
                    assert_eq!(v["refusal"]["detail"]["invariant"], "exactly_once", "{v}");
                    out.push((
                        v["refusal"]["detail"]["original_event"]
                            .as_str()
                            .unwrap()
                            .to_string(),
                        true,
                    ));
                    break;
                }
                Some("room_sync_required" | "room_sync_concurrent_arrival") => {
                    assert!(catch_up(&client, &room).await);
                }
                other => panic!("retry of {key}: unexpected {other:?}: {v}"),
            }
        }
    }
    let _ = client.cancel().await;
    out
}

#[test]
fn sigkill_under_an_mcp_http_swarm_loses_no_acknowledged_event() {
    let tmp = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(tmp.path()).unwrap();
    let (state, config): (PathBuf, PathBuf) = (root.join("state"), root.join("config"));
    room_store::statedir::init(&state, &config.join("room/bootstrap.toml"), "crash-mcp").unwrap();
    let sock = state.join("room.sock");
    let (mut child, mut url) = spawn(&state, &config);
    let mut agents = vec![];
    for i in 0..AGENTS {
        let name = format!("m{i}");
        let token = owner(&sock, "agent_enroll", json!({"name": name}))["token"]
            .as_str()
            .unwrap()
            .to_string();
        agents.push((name, token, format!("room{}", i / 2)));
    }
    for r in 0..AGENTS / 2 {
        owner(
            &sock,
            "room_create",
            json!({"name": format!("room{r}"), "members": [format!("m{}", 2 * r), format!("m{}", 2 * r + 1)]}),
        );
    }
    let acked: Vec<Arc<Mutex<Vec<String>>>> =
        (0..AGENTS).map(|_| Arc::new(Mutex::new(vec![]))).collect();
    let in_doubt: Vec<Arc<Mutex<Vec<String>>>> =
        (0..AGENTS).map(|_| Arc::new(Mutex::new(vec![]))).collect();
    let (mut retried, mut repeats) = (0, 0);
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("crash-mcp seed {seed}");
    for round in 0..ROUNDS {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        for ((who, a), d) in agents.iter().zip(&acked).zip(&in_doubt) {
            rt.spawn(agent(url.clone(), who.clone(), a.clone(), d.clone(), round));
        }
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(300 + seed % 500));
        child.0.kill().unwrap(); // SIGKILL
        child.0.wait().unwrap();
        rt.shutdown_timeout(Duration::from_secs(5));
        (child, url) = spawn(&state, &config);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for (((_, token, room), a), d) in agents.iter().zip(&acked).zip(&in_doubt) {
            let keys = std::mem::take(&mut *d.lock().unwrap());
            for (event, repeat) in rt.block_on(retry_in_doubt(
                url.clone(),
                token.clone(),
                room.clone(),
                keys,
            )) {
                retried += 1;
                repeats += usize::from(repeat);
                a.lock().unwrap().push(event);
            }
        }
        for r in 0..AGENTS / 2 {
            let room = format!("room{r}");
            let mut present = HashSet::new();
            let mut keys = HashSet::new();
            let mut from = 1;
            loop {
                let log = owner(
                    &sock,
                    "room_log",
                    json!({"room": room, "from": from, "limit": 1000}),
                );
                let events = log["events"].as_array().unwrap();
                present.extend(events.iter().map(|e| e["id"].as_str().unwrap().to_string()));
                for e in events {
                    if let Some(k) = e["event"]["idempotency_key"].as_str() {
                        assert!(
                            keys.insert(k.to_string()),
                            "round {round}: key {k} is in {room}'s journal twice"
                        );
                    }
                }
                if events.len() < 1000 {
                    break;
                }
                from += 1000;
            }
            for a in &acked[2 * r..2 * r + 2] {
                for id in a.lock().unwrap().iter() {
                    assert!(
                        present.contains(id),
                        "round {round}: acknowledged {id} of {room} lost"
                    );
                }
            }
        }
        let verify = Command::new(env!("CARGO_BIN_EXE_room"))
            .args(["verify", "--state-dir"])
            .arg(&state)
            .env("XDG_CONFIG_HOME", &config)
            .output()
            .unwrap();
        assert!(
            verify.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&verify.stdout)
        );
    }
    let total: usize = acked.iter().map(|a| a.lock().unwrap().len()).sum();
    eprintln!(
        "{total} turns acknowledged over MCP survived {ROUNDS} SIGKILLs; {retried} in-flight calls retried by key, {repeats} of them had landed before the kill"
    );
    assert!(total > 0);
    drop(child);
}
