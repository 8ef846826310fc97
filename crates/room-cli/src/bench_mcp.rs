//! `room bench mcp`: gated tool calls per second and their latency over streamable HTTP with 1,
//! 16 and 64 concurrent sessions, each agent alone in its own room, as a ratio to the same turns
//! made in-process in the same run. The client is rmcp's own streamable-HTTP client.

use crate::bench::{BenchArgs, own_rooms, pct};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use room_server::client::Client;
use room_server::daemon::{Background, ServeConfig};
use room_server::wire::Request;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

fn owner(sock: &Path, op: &str, args: Value) -> anyhow::Result<Value> {
    let req = Request {
        op: op.into(),
        token: None,
        conversation: None,
        tier: None,
        args,
        meta: None,
    };
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

async fn session(
    url: String,
    token: String,
    room: String,
    secs: f64,
) -> anyhow::Result<Vec<Duration>> {
    let transport = StreamableHttpClientTransport::from_config(
        StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
    );
    let client = ().serve(transport).await?;
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

fn over_http(dir: &Path, sessions: usize, secs: f64) -> anyhow::Result<(f64, Vec<Duration>)> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let (state, boot) = (root.join("state"), root.join("boot.toml"));
    room_store::statedir::init(&state, &boot, "bench-mcp")?;
    let daemon = Background::start_with(ServeConfig {
        state_dir: state.clone(),
        bootstrap: boot,
        listen: Some("127.0.0.1:0".parse().expect("a loopback address")),
    })?;
    let sock = daemon.socket.clone();
    let url = format!(
        "http://{}/mcp",
        std::fs::read_to_string(state.join("http.addr"))?.trim()
    );
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
        let (base, _) = own_rooms(&dir, n, a.seconds)?;
        let (rate, mut lat) = over_http(&dir, n, a.seconds)?;
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
