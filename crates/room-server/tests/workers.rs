//! Wakes that reach real worker processes, through a real daemon: a `send` to an agent with a
//! route starts its worker (the wake prompt on stdin, a one-launch credential in
//! `ROOM_TOKEN`), and what was proven is recorded: `replied` when the worker's own turns
//! resolved the permit's items, `process_exit_only` for an exit without them, `timed_out` when
//! its deadline killed its whole process group. The credential works only while the launch
//! runs; an agent without a route keeps its permits queued.

mod common;
use common::*;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn route(fx: &Fx, mode: &str, timeout_ms: u64) {
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    fx.write_config(&format!(
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, {mode:?}]\ntimeout_ms = {timeout_ms}\n",
        agent.to_str().unwrap()
    ));
}

fn send(fx: &mut Fx, a: &str, text: &str) -> String {
    fx.sync_all(a, "coord");
    fx.ok(
        Some(a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": text}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Wait (at most 30 s) until the permit of `source` leaves the states in `passing`.
fn settled(fx: &mut Fx, source: &str, passing: &[&str]) -> Value {
    let start = Instant::now();
    loop {
        let all = fx.ok(None, "wakes_list", json!({}));
        let w = all["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["source_event"] == source)
            .cloned()
            .unwrap_or(Value::Null);
        let state = w["state"].as_str().unwrap_or("");
        if !w.is_null() && !passing.contains(&state) {
            return w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the permit stayed {state}: {w}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The worker's stdout lines for the one launch in the state dir (the one directory there
/// with a log: a test may add a decoy).
fn worker_out(fx: &Fx) -> Vec<Value> {
    let dir = fx.state.join("workers");
    let launch = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|d| d.path())
        .find(|p| p.join("stdout.log").exists())
        .expect("a launch with a log");
    std::fs::read_to_string(launch.join("stdout.log"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn beta_open(fx: &mut Fx, b: &str) -> usize {
    fx.ok(Some(b), "sync", json!({"room": "coord"}))["open_items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["kind"] == "obligation")
        .count()
}

#[test]
fn a_routed_send_wakes_a_worker_whose_reply_is_proven() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    route(&fx, "reply", 30_000);
    let src = send(&mut fx, &a, "summarize the thread");
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["state"], "replied", "{w}");
    assert_eq!(
        beta_open(&mut fx, &b),
        0,
        "the worker's reply resolved the obligation"
    );
    let out = worker_out(&fx);
    let env: Vec<&str> = out[0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        // Python sets LC_CTYPE itself at start (its locale coercion)
        .filter(|v| *v != "LC_CTYPE")
        .collect();
    assert_eq!(
        env,
        ["ROOM_LAUNCH", "ROOM_SOCKET", "ROOM_STATE_DIR", "ROOM_TOKEN"],
        "nothing else of the daemon's environment"
    );
    let launch = out[0]["launch"].as_str().unwrap();
    assert_eq!(out[1]["whoami"]["agent"], "beta");
    assert_eq!(out[1]["whoami"]["conversation"], format!("wake:{launch}"));
    // the worker sees the wake its launch delivers
    let mine = &out[1]["whoami"]["wakes"]["this_launch"];
    assert_eq!(mine["launch"], launch, "{mine}");
    assert_eq!(mine["wake"]["source_event"], src.as_str());
    assert_eq!(mine["wake"]["prompt"], "summarize the thread");
    // the one-launch credential ended with its launch
    let token = out[0]["token"].as_str().unwrap().to_string();
    fx.refuse(Some(&token), "whoami", json!({}), "credential_revoked");
}

#[test]
fn an_exit_without_a_reply_is_process_exit_only_and_the_obligation_stays_open() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    route(&fx, "exit", 30_000);
    let src = send(&mut fx, &a, "look");
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["state"], "pending_reply", "{w}");
    assert_eq!(w["dead_letter"], Value::Null);
    assert_eq!(beta_open(&mut fx, &b), 1);
}

#[test]
fn a_worker_past_its_deadline_is_stopped_with_its_whole_group() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    route(&fx, "hang", 1_500);
    let src = send(&mut fx, &a, "never ends");
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["state"], "failed", "{w}");
    let out = worker_out(&fx);
    let child = out[1]["marker"].as_str().unwrap();
    assert_eq!(
        common::marked(child),
        Vec::<u32>::new(),
        "the worker's child outlived its launch"
    );
}

#[test]
fn workers_beyond_the_daemon_s_capacity_wait_queued_and_say_why() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    let mut config = String::from("[dispatch]\nworkers_max = 1\n\n");
    for who in ["beta", "gamma"] {
        config.push_str(&format!(
            "[routes.{who}]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, \"hang\"]\ntimeout_ms = 2000\n\n",
            agent.to_str().unwrap()
        ));
    }
    fx.write_config(&config);
    fx.sync_all(&a, "coord");
    let to_beta = fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["beta"], "text": "one"}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    fx.sync_all(&a, "coord");
    let to_gamma = fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["gamma"], "text": "two"}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    // while one worker runs, the other permit waits, queued, and says why
    let start = Instant::now();
    let waiting = loop {
        let all = fx.ok(None, "wakes_list", json!({}));
        let queued = all["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["state"] == "queued" && w["deferred"] == "worker_route_capacity")
            .cloned();
        if let Some(w) = queued {
            break w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no permit waited for capacity: {all}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(waiting["dead_letter"], Value::Null);
    let b = settled(&mut fx, &to_beta, &["queued", "dispatched"]);
    let g = settled(&mut fx, &to_gamma, &["queued", "dispatched"]);
    assert_eq!(
        (b["state"].as_str(), g["state"].as_str()),
        (Some("failed"), Some("failed"))
    );
    let (lb, lg) = (&b["launches"][0], &g["launches"][0]);
    let (first, second) = if lb["created_ms"].as_u64() < lg["created_ms"].as_u64() {
        (lb, lg)
    } else {
        (lg, lb)
    };
    assert!(
        second["created_ms"].as_u64().unwrap() >= first["ended_ms"].as_u64().unwrap(),
        "two workers ran at once under workers_max = 1: {first} {second}"
    );
}

#[test]
fn workers_of_one_model_route_wait_for_its_bound_while_other_routes_run() {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    for who in ["beta", "gamma", "delta"] {
        fx.enroll(who, "member");
    }
    fx.ok(
        None,
        "room_create",
        json!({"name": "coord", "members": ["alpha", "beta", "gamma", "delta"]}),
    );
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    // beta and gamma share model route "m" (one at a time); delta names none
    let mut config = String::from("[dispatch.model_routes]\nm = 1\n\n");
    for (who, model_route) in [
        ("beta", "model_route = \"m\"\n"),
        ("gamma", "model_route = \"m\"\n"),
        ("delta", ""),
    ] {
        config.push_str(&format!(
            "[routes.{who}]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, \"hang\"]\ntimeout_ms = 3000\n{model_route}\n",
            agent.to_str().unwrap()
        ));
    }
    fx.write_config(&config);
    let mut sent = Vec::new();
    for who in ["beta", "gamma", "delta"] {
        fx.sync_all(&a, "coord");
        let e = fx.ok(
            Some(&a),
            "send",
            json!({"room": "coord", "to": [who], "text": format!("to {who}")}),
        )["event"]
            .as_str()
            .unwrap()
            .to_string();
        sent.push(e);
    }
    // one of beta and gamma waits, naming the model route, while delta's worker runs
    let start = Instant::now();
    let waiting = loop {
        let all = fx.ok(None, "wakes_list", json!({}));
        let wakes = all["wakes"].as_array().unwrap();
        let queued = wakes
            .iter()
            .find(|w| w["state"] == "queued" && w["deferred"] == "worker_route_capacity")
            .cloned();
        let delta_ran = wakes
            .iter()
            .any(|w| w["agent"] == "delta" && w["state"] != "queued");
        if let Some(w) = queued.filter(|_| delta_ran) {
            break w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no permit waited for its model route: {all}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(waiting["deferred_model_route"], "m", "{waiting}");
    assert_eq!(waiting["dead_letter"], Value::Null);
    assert!(["beta", "gamma"].contains(&waiting["agent"].as_str().unwrap()));
    let b = settled(&mut fx, &sent[0], &["queued", "dispatched"]);
    let g = settled(&mut fx, &sent[1], &["queued", "dispatched"]);
    let (lb, lg) = (&b["launches"][0], &g["launches"][0]);
    let (first, second) = if lb["created_ms"].as_u64() < lg["created_ms"].as_u64() {
        (lb, lg)
    } else {
        (lg, lb)
    };
    assert!(
        second["created_ms"].as_u64().unwrap() >= first["ended_ms"].as_u64().unwrap(),
        "two workers of model route m ran at once: {first} {second}"
    );
}

#[test]
fn a_model_route_that_is_not_declared_or_out_of_bounds_fails_the_policy_closed() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    for (config, names) in [
        (
            "[routes.beta]\nadapter = \"script\"\nmodel_route = \"nowhere\"\n",
            "routes.beta.model_route",
        ),
        (
            "[dispatch.model_routes]\nm = 0\n",
            "dispatch.model_routes.m",
        ),
        (
            "[dispatch.model_routes]\n\"a b\" = 1\n",
            "dispatch.model_routes",
        ),
    ] {
        fx.write_config(config);
        let r = fx.refuse(
            Some(&a),
            "sync",
            json!({"room": "coord"}),
            "tool_result_withheld",
        );
        assert!(r.to_string().contains(names), "{config}: {r}");
    }
}

#[test]
fn a_capacity_outside_its_bounds_fails_the_policy_closed() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    fx.write_config("[dispatch]\nworkers_max = 0\n");
    // a policy that cannot be loaded withholds results, naming what to fix
    let r = fx.refuse(
        Some(&a),
        "sync",
        json!({"room": "coord"}),
        "tool_result_withheld",
    );
    assert!(r.to_string().contains("dispatch.workers_max"), "{r}");
}

#[test]
fn a_worker_s_grandchild_that_left_its_process_group_ends_with_its_job() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    route(&fx, "escape", 30_000);
    let src = send(&mut fx, &a, "leave something behind");
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["state"], "pending_reply", "{w}");
    let job = &w["launches"][0]["job"];
    assert_eq!(job["confirmed_empty"], true, "zero processes observed: {w}");
    let out = worker_out(&fx);
    let child = out[1]["marker"].as_str().unwrap();
    // the daemon makes cgroup jobs wherever this process could
    let here = room_exec::job::Jobs::detect(&format!("probe{}", std::process::id()));
    let forced = std::env::var("ROOM_JOB_KIND").as_deref() == Ok("subreaper");
    if let Some(base) = here.base() {
        std::fs::remove_dir(base).unwrap();
        let kind = if forced { "subreaper" } else { "cgroup" };
        assert_eq!(job["kind"], kind, "{w}");
    }
    // a cgroup leaf and a subreaper shim both hold what left the worker's group
    assert!(job["kind"] == "cgroup" || job["kind"] == "subreaper", "{w}");
    assert_eq!(
        common::marked(child),
        Vec::<u32>::new(),
        "the setsid grandchild outlived its job: {w}"
    );
}

#[test]
fn an_agent_without_a_route_keeps_its_permits_queued() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let src = send(&mut fx, &a, "for your own session");
    fx.ok(None, "wakes_check", json!({}));
    std::thread::sleep(Duration::from_millis(1_200));
    let all = fx.ok(None, "wakes_list", json!({}));
    let w = all["wakes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["source_event"] == src.as_str())
        .unwrap()
        .clone();
    assert_eq!(w["state"], "queued");
    let launched = std::fs::read_dir(fx.state.join("workers"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(launched, 0, "nothing was launched");
    // its own session sees what waits for it
    let me = fx.ok(Some(&b), "whoami", json!({}));
    let queued = &me["wakes"]["queued"];
    assert_eq!(queued[0]["source_event"], src.as_str(), "{me}");
    assert_eq!(queued[0]["prompt"], "for your own session");
    assert_eq!(me["wakes"]["this_launch"], Value::Null);
}

/// A scripted OpenAI-compatible server (tests/workers/openai_server.py), ended with the test.
struct ApiServer {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ApiServer {
    fn start(fx: &Fx, mode: &str) -> ApiServer {
        use std::io::BufRead;
        let script =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/openai_server.py");
        let log = fx.root.join(format!("openai-{mode}.jsonl"));
        let mut child = std::process::Command::new("/usr/bin/python3")
            .arg(script)
            .arg(mode)
            .arg(&log)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        ApiServer {
            port: line.trim().parse().expect("the server prints its port"),
            child,
            log,
        }
    }

    fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// Route beta to the scripted server in `mode`, wake it, and return its settled permit and
/// its one launch.
fn api_wake(fx: &mut Fx, mode: &str) -> (ApiServer, Value, Value, String) {
    api_wake_with(fx, mode, "adapter = \"openai\"")
}

fn api_wake_with(fx: &mut Fx, mode: &str, route: &str) -> (ApiServer, Value, Value, String) {
    let server = ApiServer::start(fx, mode);
    let (a, b, _) = fx.team("coord");
    fx.write_config(&format!(
        "[routes.beta]\n{route}\nbase_url = \"http://127.0.0.1:{}/v1\"\nmodel = \"test-model\"\ntimeout_ms = 20000\n",
        server.port
    ));
    let src = send(fx, &a, "summarize the thread");
    let w = settled(fx, &src, &["queued", "dispatched"]);
    let l = w["launches"][0].clone();
    (server, w, l, b)
}

#[test]
fn an_api_model_replies_through_room_s_tools_and_its_usage_is_kept() {
    let mut fx = Fx::new();
    let (server, w, l, b) = api_wake(&mut fx, "reply");
    assert_eq!(w["state"], "replied", "{w}");
    assert_eq!(
        (&l["outcome"], &l["proof"]),
        (&json!("replied"), &json!("replied"))
    );
    let r = &l["adapter"];
    assert_eq!(
        (r["completions"].as_u64(), r["tool_calls"].as_u64()),
        (Some(4), Some(3)),
        "{r}"
    );
    assert_eq!(r["tool_errors"], 0, "{r}");
    assert_eq!(
        (r["prompt_tokens"].as_u64(), r["completion_tokens"].as_u64()),
        (Some(400), Some(28))
    );
    assert_eq!(r["usage"].as_array().unwrap().len(), 4);
    assert_eq!(r["turn_ended"], true);
    assert_eq!(l["job"]["kind"], "in_daemon");
    assert_eq!(
        beta_open(&mut fx, &b),
        0,
        "the model's reply resolved the obligation"
    );
    let reqs = server.requests();
    let first = &reqs[0]["body"];
    assert_eq!(first["model"], "test-model");
    let tools: Vec<&str> = first["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"room_sync") && tools.contains(&"room_reply"),
        "{tools:?}"
    );
    assert_eq!(
        reqs[0]["auth"],
        Value::Null,
        "no key was configured, none was sent"
    );
    // the model saw each tool's result, the receipt it confirmed among them
    let last = reqs.last().unwrap()["body"]["messages"].as_array().unwrap();
    assert_eq!(last.iter().filter(|m| m["role"] == "tool").count(), 3);
}

#[test]
fn arguments_that_are_not_json_go_back_to_the_model_as_a_refused_call() {
    let mut fx = Fx::new();
    let (server, w, l, _) = api_wake(&mut fx, "bad_args");
    assert_eq!(w["state"], "pending_reply", "{w}");
    assert_eq!(l["outcome"], "body_visible_pending_reply", "{l}");
    assert_eq!(
        (
            l["adapter"]["tool_calls"].as_u64(),
            l["adapter"]["tool_errors"].as_u64()
        ),
        (Some(1), Some(1))
    );
    let reqs = server.requests();
    let tool = reqs[1]["body"]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("arguments are not JSON"),
        "{tool}"
    );
}

#[test]
fn malformed_truncated_and_refused_responses_prove_nothing_and_say_why() {
    for (mode, why) in [
        ("malformed", "malformed response"),
        ("truncated", "truncated response"),
        ("status", "the API answered 401"),
    ] {
        let mut fx = Fx::new();
        let (_server, w, l, b) = api_wake(&mut fx, mode);
        assert_eq!(w["state"], "failed", "{mode}: {w}");
        assert_eq!(
            (&l["outcome"], &l["proof"]),
            (&json!("failed"), &json!("dispatched")),
            "{mode}: {l}"
        );
        let e = l["adapter"]["error"].as_str().unwrap_or("");
        assert!(e.contains(why), "{mode}: {e}");
        assert_eq!(l["adapter"]["completions"], 0);
        assert_eq!(
            beta_open(&mut fx, &b),
            1,
            "{mode}: the obligation stays open"
        );
    }
}

#[test]
fn a_route_that_does_not_fit_its_adapter_fails_the_policy_closed_and_names_the_field() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    for (route, field) in [
        (
            "adapter = \"openai\"\nbase_url = \"ftp://x/v1\"\nmodel = \"m\"",
            "base_url",
        ),
        (
            "adapter = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"",
            "model",
        ),
        (
            "adapter = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\nrounds_max = 65",
            "rounds_max",
        ),
        (
            "adapter = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\ncommand = [\"/bin/true\"]",
            "runs no command",
        ),
        (
            "adapter = \"command\"\ncommand = [\"/bin/true\"]\nmodel = \"m\"",
            "for the openai and anthropic adapters",
        ),
        (
            "adapter = \"anthropic\"\nmodel = \"m\"\nmax_tokens = 0",
            "max_tokens",
        ),
        (
            "adapter = \"acp\"\ncommand = [\"/bin/true\"]\nspawn_policy = \"sometimes\"",
            "spawn_policy",
        ),
        (
            "adapter = \"command\"\ncommand = [\"/bin/true\"]\nsteps = [\"read\"]",
            "steps are for the script adapter",
        ),
        (
            "adapter = \"command\"\ncommand = [\"/bin/true\"]\nnetwork = \"some\"",
            "network",
        ),
        (
            "adapter = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\nnetwork = \"none\"",
            "network is for workers that run as processes",
        ),
        (
            "adapter = \"openai\"\nbase_url = \"http://10.1.2.3/v1\"\nmodel = \"m\"\napi_key_env = \"K\"",
            "only over https",
        ),
        (
            "adapter = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\ncwd = \"/tmp\"",
            "no env or cwd",
        ),
        (
            "adapter = \"command\"\ncommand = [\"/bin/true\"]\nspawn_policy = \"never\"",
            "spawn_policy is for the acp adapter",
        ),
        (
            "adapter = \"command\"\ncommand = [\"/bin/true\"]\npreset = \"claude\"",
            "for the acp adapter",
        ),
        (
            "adapter = \"acp\"\ncommand = [\"/bin/true\"]\npreset = \"other\"",
            "preset",
        ),
        (
            "adapter = \"acp\"\ncommand = [\"/bin/true\"]\npermissions = \"allow_always\"",
            "permissions",
        ),
        (
            "adapter = \"acp\"\ncommand = [\"/bin/true\"]\ntool_kinds = [\"teleport\"]",
            "tool_kinds",
        ),
        (
            "adapter = \"command\"\ncommand = [\"/bin/true\"]\ntool_kinds = [\"read\"]",
            "tool_kinds is for the acp adapter",
        ),
        (
            "adapter = \"command\"\ncommand = [\"/bin/true\"]\nbroker_programs = [\"perl\"]",
            "broker_programs",
        ),
        (
            "adapter = \"openai\"\nbase_url = \"http://127.0.0.1:1/v1\"\nmodel = \"m\"\nbroker_programs = [\"/usr/bin/perl\"]",
            "broker_programs is for workers that run as processes",
        ),
        (
            "adapter = \"script\"\nsteps = [\"write:a/../../x\"]",
            "write:PATH",
        ),
        ("adapter = \"script\"\nsteps = [\"write:\"]", "steps"),
        (
            "adapter = \"script\"\nsteps = [\"read\"]\ntags = [\"a b\"]",
            "tags",
        ),
    ] {
        fx.write_config(&format!("[routes.beta]\n{route}\n"));
        let r = fx.refuse(
            Some(&a),
            "sync",
            json!({"room": "coord"}),
            "tool_result_withheld",
        );
        assert!(r.to_string().contains(field), "{route}: {r}");
    }
}

#[test]
fn an_anthropic_model_replies_through_tool_use_blocks_with_its_key_and_version() {
    let mut fx = Fx::new();
    // CARGO_PKG_NAME is in the daemon's (this test's) environment: the key is read by name
    let route = "adapter = \"anthropic\"\napi_key_env = \"CARGO_PKG_NAME\"\nmax_tokens = 512";
    let (server, w, l, b) = api_wake_with(&mut fx, "reply", route);
    assert_eq!(w["state"], "replied", "{w}");
    assert_eq!(l["proof"], "replied");
    let r = &l["adapter"];
    assert_eq!(
        (r["completions"].as_u64(), r["tool_calls"].as_u64()),
        (Some(4), Some(3)),
        "{r}"
    );
    assert_eq!(r["finish_reason"], "end_turn");
    assert_eq!(
        (r["prompt_tokens"].as_u64(), r["completion_tokens"].as_u64()),
        (Some(200), Some(20))
    );
    assert_eq!(beta_open(&mut fx, &b), 0);
    let reqs = server.requests();
    assert!(reqs.iter().all(|q| q["path"] == "/v1/messages"));
    assert_eq!(reqs[0]["x_api_key"], "room-server");
    assert_eq!(reqs[0]["anthropic_version"], "2023-06-01");
    assert_eq!(reqs[0]["auth"], Value::Null);
    let body = &reqs[0]["body"];
    assert_eq!(body["max_tokens"], 512);
    assert!(body["system"].as_str().unwrap().contains("room_sync"));
    assert!(body["tools"][0]["input_schema"].is_object());
}

#[test]
fn the_owner_sees_open_obligations_with_their_fold_and_the_circular_waits() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    send(&mut fx, &a, "review my patch");
    fx.sync_all(&b, "coord");
    fx.ok(
        Some(&b),
        "send",
        json!({"room": "coord", "to": ["alpha"], "text": "first mine"}),
    );
    let v = fx.ok(None, "wakes_obligations", json!({"room": "coord"}));
    assert_eq!(v["obligations"].as_array().unwrap().len(), 2, "{v}");
    assert!(
        v["obligations"]
            .as_array()
            .unwrap()
            .iter()
            .all(|o| o["fold"] == "pending")
    );
    assert_eq!(
        v["circular_waits"][0]["agents"],
        json!(["alpha", "beta"]),
        "{v}"
    );
    assert_eq!(
        v["circular_waits"][0]["obligations"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    fx.refuse(
        None,
        "wakes_obligations",
        json!({"room": "nowhere"}),
        "room_not_found",
    );
}

#[test]
fn an_answer_cut_at_its_token_limit_runs_none_of_its_calls() {
    let mut fx = Fx::new();
    let (server, w, l, b) = api_wake(&mut fx, "length");
    assert_eq!(w["state"], "failed", "{w}");
    assert_eq!(
        (&l["outcome"], &l["proof"]),
        (&json!("failed"), &json!("delivered_to_body")),
        "{l}"
    );
    let r = &l["adapter"];
    assert!(
        r["error"].as_str().unwrap().contains("truncated answer"),
        "{r}"
    );
    assert_eq!(
        (r["completions"].as_u64(), r["tool_calls"].as_u64()),
        (Some(1), Some(0))
    );
    assert_eq!(r["turn_ended"], false);
    assert_eq!(server.requests().len(), 1);
    assert_eq!(beta_open(&mut fx, &b), 1);
}

#[test]
fn the_policy_s_acp_presets_are_the_adapter_s() {
    // config validation (the engine) and the adapter (room-agents) name the same presets
    let adapter: Vec<&str> = room_agents::acp::PRESETS.iter().map(|p| p.name).collect();
    assert_eq!(adapter, room_engine::policy::ACP_PRESETS);
}

#[test]
fn cited_evidence_is_served_to_the_recipient_at_wake_time_with_a_delivery_receipt() {
    let mut fx = Fx::new();
    let a = fx.enroll("alpha", "coordinator");
    fx.enroll("beta", "member");
    let (dir, pid) = fx.open_project("p1");
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta"]}),
    );
    route(&fx, "exit", 30_000);
    let t = fx.ok(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "review", "to": "beta"}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    std::fs::create_dir_all(dir.join("docs")).unwrap();
    std::fs::write(dir.join("docs/spec.md"), b"the spec").unwrap();
    let register = |fx: &mut Fx, origin: &str| {
        fx.ok(
            Some(&a),
            "evidence_register",
            json!({"room": "build", "task": t, "origin": origin,
            "summary": format!("about {origin}")}),
        )["evidence"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let web = register(&mut fx, "url:https://example.test/spec");
    let file = register(&mut fx, "file:docs/spec.md");
    // the file changes after it was registered: the recipient is not served the old claim
    std::fs::write(dir.join("docs/spec.md"), b"rewritten").unwrap();
    fx.sync_all(&a, "build");
    let src = fx.ok(
        Some(&a),
        "send",
        json!({"room": "build", "to": ["beta"], "task": t,
        "text": "review against these", "evidence": [web, file]}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    let d = &w["launches"][0]["delivery"];
    assert_eq!(
        (d["tool"].as_str(), d["recipient"].as_str()),
        (Some("wake_delivery"), Some("beta")),
        "{w}"
    );
    let id = d["id"].as_str().unwrap();
    assert!(id.len() == 36 && id.starts_with("srv_"), "{id}");
    assert_eq!(d["served"].as_array().unwrap().len(), 1, "{d}");
    assert_eq!(d["served"][0]["evidence"], web.as_str());
    assert_eq!(
        d["served"][0]["summary"],
        "about url:https://example.test/spec"
    );
    assert_eq!(d["withheld"][0]["evidence"], file.as_str());
    assert_eq!(d["withheld"][0]["reason"], "content_mismatch");
    // the passage rode inline in the worker's prompt, under the same receipt
    let launch = w["launches"][0]["launch"].as_str().unwrap();
    let out =
        std::fs::read_to_string(fx.state.join("workers").join(launch).join("stdout.log")).unwrap();
    let first: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
    assert_eq!(first["evidence"]["id"], id);
    assert_eq!(
        first["evidence"]["served"][0]["summary"],
        "about url:https://example.test/spec"
    );
}

/// Whether this machine lets a child run confined (as the daemon's own start probe finds).
fn confinable() -> bool {
    confinement().is_some()
}

/// What the daemon's start probe finds on this machine.
fn confinement() -> Option<room_exec::confine::Support> {
    let tmp = tempfile::tempdir().unwrap();
    let found = room_exec::confine::Confinement::probe(&tmp.path().join("probe"));
    // where the test run says this machine has the namespaces, none of it may be skipped
    if std::env::var("ROOM_TEST_CONFINEMENT").as_deref() == Ok("required") {
        let full = room_exec::confine::Support {
            no_pid_namespace: None,
        };
        assert_eq!(found, Ok(full), "confinement is required here");
    }
    found.ok()
}

#[test]
fn a_worker_reaches_neither_the_owner_socket_nor_the_state_dir_only_its_broker() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    route(&fx, "probe", 30_000);
    // another launch's directory: the worker must not see it from where it starts
    std::fs::create_dir_all(fx.state.join("workers").join("lch_decoy")).unwrap();
    let src = send(&mut fx, &a, "look around");
    settled(&mut fx, &src, &["queued", "dispatched"]);
    let out = worker_out(&fx);
    let seen = out
        .iter()
        .find_map(|v| v.get("probe").cloned())
        .expect("the worker reported what it reached");
    // without a credential it is not the owner console, whatever its uid
    assert_eq!(seen["no_token_owner_op"], "credential_invalid", "{seen}");
    assert_eq!(seen["no_token_enroll"], "credential_invalid", "{seen}");
    // with its own it is its agent, never the owner
    assert_eq!(seen["own_token_owner_op"], "owner_required", "{seen}");
    assert_eq!(seen["own_token_whoami"], "ok", "{seen}");
    // and no other credential passes its broker
    assert_eq!(seen["other_token"], "credential_invalid", "{seen}");
    // nor another program of its job, with its own credential: perl is not the route's
    // program nor Room's
    assert_eq!(seen["other_program"], "broker_peer_refused", "{seen}");
    assert_eq!(seen["other_program_reason"], "program", "{seen}");
    // admitted at connect, refused once it runs another program on the same connection
    assert_eq!(seen["before_exec"], "ok", "{seen}");
    assert_eq!(seen["after_exec"], "broker_peer_refused", "{seen}");
    assert_eq!(seen["after_exec_reason"], "program", "{seen}");
    let agents = fx.ok(None, "agent_list", json!({}));
    assert!(
        !agents.to_string().contains("intruder"),
        "nothing was enrolled: {agents}"
    );
    if let Some(support) = confinement() {
        // no cgroup outside its job can be named: the mounts are hidden, its namespace's root
        // is its leaf
        let escapes = seen["cgroup_escape"].as_array().unwrap();
        assert!(
            !escapes.is_empty() && escapes.iter().all(|e| e == "EROFS" || e == "ENOENT"),
            "{seen}"
        );
        assert_eq!(seen["own_cgroup"], "0::/", "{seen}");
        assert_eq!(seen["control_db"], "FileNotFoundError", "{seen}");
        assert_eq!(
            seen["state_dir_entries"],
            json!(["room.sock", "workers"]),
            "{seen}"
        );
        let above = seen["cwd_parent_entries"].as_array().unwrap();
        assert!(above.len() == 1 && above[0] != "lch_decoy", "{seen}");
        if let Some(why) = support.no_pid_namespace {
            return eprintln!("no PID namespace here ({why}): /proc is the machine's");
        }
        // nor through another process's root: the worker sees only its own job's processes
        assert_eq!(seen["proc_root_leaks"], json!([]), "{seen}");
        assert!(seen["proc_pids"].as_u64().unwrap() < 8, "{seen}");
        // and cannot take the hiding away, even as the root of a root daemon
        assert_ne!(seen["umount_state_dir"], "unmounted", "{seen}");
        assert_eq!(
            seen["state_dir_after_umount"],
            json!(["room.sock", "workers"]),
            "{seen}"
        );
    }
}

#[test]
fn a_revocation_while_a_broker_response_is_partly_written_severs_it_and_is_recorded() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    // a room long enough that beta's first page is many chunks
    fx.sync_all(&a, "coord");
    for i in 0..40 {
        let text = format!("{i} {}", "x".repeat(900));
        fx.ok(Some(&a), "note", json!({"room": "coord", "text": text}));
    }
    route(&fx, "sever", 30_000);
    let src = send(&mut fx, &a, "read it all");
    let start = Instant::now();
    let read_some = |fx: &Fx| {
        let Some(Ok(d)) = std::fs::read_dir(fx.state.join("workers"))
            .ok()
            .and_then(|mut d| d.next())
        else {
            return false;
        };
        std::fs::read_to_string(d.path().join("stdout.log"))
            .is_ok_and(|out| out.contains("\"partial\""))
    };
    while !read_some(&fx) {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the worker never read"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    fx.ok(None, "agent_revoke", json!({"name": "beta"}));
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    let start = Instant::now();
    let l = loop {
        let all = fx.ok(None, "wakes_list", json!({}));
        let l = all["wakes"][0]["launches"][0].clone();
        if l.get("severed_mid_response").is_some() {
            break l;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "nothing recorded: {w}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let cut = &l["severed_mid_response"];
    assert_eq!(cut["code"], "severed_mid_response", "{l}");
    let (sent, total) = (
        cut["bytes_sent"].as_u64().unwrap(),
        cut["bytes_total"].as_u64().unwrap(),
    );
    assert!(sent > 0 && sent < total, "cut part-way: {cut}");
    assert_eq!(sent % 4096, 0, "at a chunk's edge: {cut}");
}

#[test]
fn a_program_a_route_names_in_broker_programs_reaches_the_broker() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    fx.write_config(&format!(
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, \"probe\"]\ntimeout_ms = 30000\nbroker_programs = [\"/usr/bin/perl\"]\n",
        agent.to_str().unwrap()
    ));
    let src = send(&mut fx, &a, "look around");
    settled(&mut fx, &src, &["queued", "dispatched"]);
    let seen = worker_out(&fx)
        .iter()
        .find_map(|v| v.get("probe").cloned())
        .expect("the worker reported what it reached");
    assert_eq!(seen["other_program"], "ok", "{seen}");
}

#[test]
fn a_broker_refuses_a_process_outside_its_launch_s_job() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    route(&fx, "hang", 30_000);
    let src = send(&mut fx, &a, "keep running");
    let start = Instant::now();
    let launch = loop {
        let all = fx.ok(None, "wakes_list", json!({}));
        let w = all["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["source_event"] == src.as_str())
            .cloned()
            .unwrap_or(Value::Null);
        if w["launches"][0]["state"] == "running" {
            break w["launches"][0]["launch"].as_str().unwrap().to_string();
        }
        assert!(start.elapsed() < Duration::from_secs(30), "never ran: {w}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let broker = fx.state.join("workers").join(&launch).join("broker.sock");
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(&broker).unwrap();
    let _ = s.write_all(b"{\"op\":\"ping\",\"args\":{}}\n");
    let mut line = String::new();
    std::io::BufReader::new(&s).read_line(&mut line).unwrap();
    let r: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(r["refusal"]["code"], "broker_peer_refused", "{r}");
    assert_eq!(r["refusal"]["detail"]["launch"], launch.as_str());
    assert_eq!(r["refusal"]["detail"]["reason"], "outside_job", "{r}");
    // the refused connection changed nothing: the worker still runs, its permit dispatched
    let all = fx.ok(None, "wakes_list", json!({}));
    assert_eq!(all["wakes"][0]["launches"][0]["state"], "running");
    // its credential, carried out of the job, does not work on the owner's socket while the
    // launch runs (nor over HTTP: hardening.rs), and the refused calls changed nothing
    let start = Instant::now();
    let token = loop {
        if let Some(t) = worker_out(&fx).first().and_then(|v| v["token"].as_str()) {
            break t.to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no token printed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let before = fx.snapshot();
    for (op, args) in [
        ("whoami", json!({})),
        (
            "note",
            json!({"room": "coord", "text": "from outside the job"}),
        ),
    ] {
        let r = fx.refuse(
            Some(&token),
            op,
            args.clone(),
            "launch_credential_outside_broker",
        );
        assert_eq!(r.detail["launch"], launch.as_str(), "{r}");
        assert_eq!(r.detail["agent"], "beta", "{r}");
    }
    assert_eq!(
        fx.snapshot(),
        before,
        "a refused credential changed nothing"
    );
    let all = fx.ok(None, "wakes_list", json!({}));
    assert_eq!(all["wakes"][0]["launches"][0]["state"], "running");
    fx.ok(None, "room_cancel", json!({"room": "coord"}));
    // once its launch ended the credential is simply revoked, wherever it is shown
    let start = Instant::now();
    while fx.ok(None, "wakes_list", json!({}))["wakes"][0]["launches"][0]["state"] != "ended" {
        assert!(start.elapsed() < Duration::from_secs(30), "never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    fx.refuse(Some(&token), "whoami", json!({}), "credential_revoked");
}

#[test]
fn a_route_with_network_none_runs_its_worker_without_a_network() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    let config = |network: &str| {
        format!(
            "[routes.beta]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, \"probe\", \"{port}\"]\ntimeout_ms = 30000\nnetwork = \"{network}\"\n",
            agent.to_str().unwrap()
        )
    };
    fx.write_config(&config("none"));
    let src = send(&mut fx, &a, "reach out");
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    let out = worker_out(&fx);
    let seen = out.iter().find_map(|v| v.get("probe").cloned());
    if !confinable() {
        // the policy asks for what this machine cannot give: the worker never started
        assert_eq!(w["state"], "failed", "{w}");
        return;
    }
    let seen = seen.expect("the worker reported what it reached");
    assert_ne!(seen["network"], "reached", "{seen}");
    assert_eq!(
        seen["own_token_whoami"], "ok",
        "its broker still works: {seen}"
    );
    drop(listener);
}

/// A project room `build` (alpha, beta, gamma) whose project holds `notes.txt` and
/// `data.json`; beta routed to the staging probe.
fn staged_team(fx: &mut Fx) -> (String, std::path::PathBuf) {
    let (a, _, _, dir) = staged_team_tokens(fx);
    (a, dir)
}

/// `staged_team`, with beta's and gamma's credentials too.
fn staged_team_tokens(fx: &mut Fx) -> (String, String, String, std::path::PathBuf) {
    let a = fx.enroll("alpha", "coordinator");
    let b = fx.enroll("beta", "member");
    let g = fx.enroll("gamma", "member");
    let (dir, pid) = fx.open_project("p1");
    std::fs::write(dir.join("notes.txt"), b"the plan").unwrap();
    std::fs::write(
        dir.join("data.json"),
        br#"[{"id":1,"v":1,"name":"a","secret":"x"},{"id":2,"v":1,"name":"b","secret":"y"}]"#,
    )
    .unwrap();
    fx.ok(
        None,
        "room_create",
        json!({"name": "build", "project": pid, "members": ["alpha", "beta", "gamma"]}),
    );
    route(fx, "staged", 30_000);
    (a, b, g, dir)
}

fn sha(path: &std::path::Path) -> String {
    room_core::sha256_hex(&std::fs::read(path).unwrap())
}

fn staged_send(fx: &mut Fx, a: &str, stage: Value) -> String {
    let task = fx.ok(
        Some(a),
        "task_create",
        json!({"room": "build", "title": "read the plan", "to": "beta", "stage": stage}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(task.clone());
    fx.sync_all(a, "build");
    fx.ok(
        Some(a),
        "send",
        json!({"room": "build", "to": ["beta"], "text": "go", "task": task}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn a_worker_is_staged_with_exactly_the_verified_sources_its_task_selects() {
    let mut fx = Fx::new();
    let (a, dir) = staged_team(&mut fx);
    let stage = json!([
        {"path": "notes.txt", "sha256": sha(&dir.join("notes.txt"))},
        {"path": "data.json", "sha256": sha(&dir.join("data.json")),
         "project": {"format": "json", "key": "id", "version": "v", "columns": ["name"], "rows": ["2"]}},
    ]);
    let src = staged_send(&mut fx, &a, stage);
    settled(&mut fx, &src, &["queued", "dispatched"]);
    let out = worker_out(&fx);
    let seen = out.iter().find(|v| v.get("files").is_some()).unwrap();
    assert_eq!(seen["notes"], "the plan", "{seen}");
    assert_eq!(
        seen["files"],
        json!(["data.json.projection.json", "manifest.json", "notes.txt"]),
        "{seen}"
    );
    let p = &seen["staged"]["selections"][1]["projection"];
    assert_eq!(
        (p["rows_kept"].as_u64(), p["rows_withheld"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(p["fields_withheld"], json!(["secret"]));
}

#[test]
fn a_source_that_changed_since_its_task_was_created_is_never_staged() {
    let mut fx = Fx::new();
    let (a, dir) = staged_team(&mut fx);
    let stage = json!([{"path": "notes.txt", "sha256": sha(&dir.join("notes.txt"))}]);
    std::fs::write(dir.join("notes.txt"), b"another plan").unwrap();
    let src = staged_send(&mut fx, &a, stage);
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["state"], "failed", "{w}");
    let detail = w["launches"][0]["adapter"]["not_run"]
        .as_str()
        .unwrap_or("");
    assert!(detail.contains("stage_digest_mismatch"), "{w}");
    // the worker never ran: no stage, no output
    assert!(worker_out_missing(&fx), "nothing ran");
}

fn worker_out_missing(fx: &Fx) -> bool {
    std::fs::read_dir(fx.state.join("workers"))
        .map(|d| {
            d.flatten()
                .all(|e| !e.path().join("stdout.log").exists() && !e.path().join("stage").exists())
        })
        .unwrap_or(true)
}

#[test]
fn staging_selections_are_checked_at_task_creation_and_a_refusal_changes_nothing() {
    let mut fx = Fx::new();
    let (a, dir) = staged_team(&mut fx);
    let good = sha(&dir.join("notes.txt"));
    fx.ok(
        None,
        "room_create",
        json!({"name": "talk", "members": ["alpha", "beta"]}),
    );
    for (room, stage, field) in [
        (
            "build",
            json!([{"path": "../notes.txt", "sha256": good}]),
            "stage[0].path",
        ),
        (
            "build",
            json!([{"path": "notes.txt", "sha256": "abc"}]),
            "stage[0].sha256",
        ),
        ("build", json!([{"path": "notes.txt"}]), "stage[0]"),
        (
            "build",
            json!([{"path": "notes.txt", "sha256": good, "project": {"format": "sqlite", "key": "id", "version": "v"}}]),
            "stage[0].project.table",
        ),
        (
            "talk",
            json!([{"path": "notes.txt", "sha256": good}]),
            "stage",
        ),
    ] {
        let r = fx.refuse(
            Some(&a),
            "task_create",
            json!({"room": room, "title": "t", "stage": stage}),
            "invalid_argument",
        );
        assert_eq!(r.detail["field"], field, "{r}");
    }
    let many: Vec<Value> = (0..257)
        .map(|i| json!({"path": format!("f{i}"), "sha256": good}))
        .collect();
    let r = fx.refuse(
        Some(&a),
        "task_create",
        json!({"room": "build", "title": "t", "stage": many}),
        "invalid_argument",
    );
    assert_eq!(r.detail["field"], "stage", "{r}");
}

/// A task for beta selecting `data.json` projected to its `name` column and row 2.
fn proposal_task(fx: &mut Fx, a: &str, dir: &std::path::Path) -> String {
    let stage = json!([
        {"path": "notes.txt", "sha256": sha(&dir.join("notes.txt"))},
        {"path": "data.json", "sha256": sha(&dir.join("data.json")),
         "project": {"format": "json", "key": "id", "version": "v", "columns": ["name"], "rows": ["2"]}},
    ]);
    let t = fx.ok(
        Some(a),
        "task_create",
        json!({"room": "build", "title": "rename b", "to": "beta", "stage": stage}),
    )["task"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    fx.tasks.push(t.clone());
    t
}

fn sha_bytes(v: &Value) -> String {
    room_core::sha256_hex(&serde_json::to_vec(v).unwrap())
}

fn proposals_in(fx: &mut Fx, room: &str) -> Vec<Value> {
    let log = fx.ok(None, "room_log", json!({"room": room, "limit": 1000}));
    log["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e.to_string().contains("\"proposal_"))
        .cloned()
        .collect()
}

#[test]
fn a_proposal_is_applied_by_the_daemon_with_its_version_moved_by_one_and_every_refusal_changes_nothing()
 {
    let mut fx = Fx::new();
    let (a, b, g, dir) = staged_team_tokens(&mut fx);
    fx.write_config("");
    let task = proposal_task(&mut fx, &a, &dir);
    let data = dir.join("data.json");
    let original = std::fs::read(&data).unwrap();
    let change = |version: i64, set: Value| json!({"task": task, "path": "data.json", "key": "2", "version": version, "set": set});
    // only the holder of a claim proposes
    fx.refuse(
        Some(&b),
        "task_propose",
        change(1, json!({"name": "z"})),
        "task_not_held",
    );
    fx.ok(Some(&b), "task_claim", json!({"task": task}));
    fx.refuse(
        Some(&g),
        "task_propose",
        change(1, json!({"name": "z"})),
        "task_not_held",
    );
    // within the projection the worker was given, and nothing else
    for (args, field) in [
        (change(1, json!({"secret": "s"})), "a withheld column"),
        (change(1, json!({"v": 9})), "the version"),
        (change(1, json!({"id": 9})), "the key"),
        (
            json!({"task": task, "path": "data.json", "key": "1", "version": 1, "set": {"name": "z"}}),
            "a withheld row",
        ),
        (
            json!({"task": task, "path": "notes.txt", "key": "1", "version": 1, "set": {"name": "z"}}),
            "a source staged whole",
        ),
        (
            json!({"task": task, "path": "other.json", "key": "1", "version": 1, "set": {"name": "z"}}),
            "a path not selected",
        ),
    ] {
        let r = fx.refuse(Some(&b), "task_propose", args, "proposal_withheld");
        assert!(!r.message.is_empty(), "{field}");
    }
    for (args, field) in [
        (change(1, json!({})), "set"),
        (change(1, json!({"name": {"nested": 1}})), "set.name"),
        (
            json!({"task": task, "path": "../data.json", "key": "2", "version": 1, "set": {"name": "z"}}),
            "path",
        ),
    ] {
        let r = fx.refuse(Some(&b), "task_propose", args, "invalid_argument");
        assert_eq!(r.detail["field"], field, "{r}");
    }
    let r = fx.refuse(
        Some(&b),
        "task_propose",
        change(1, json!({"name": "x".repeat(70_000)})),
        "payload_too_large",
    );
    assert_eq!(r.detail["field"], "set", "{r}");
    // a version the row has left
    fx.refuse(
        Some(&b),
        "task_propose",
        change(7, json!({"name": "z"})),
        "proposal_version_conflict",
    );
    assert_eq!(
        std::fs::read(&data).unwrap(),
        original,
        "nothing was written"
    );
    // applied: the live row moves from 1 to 2, with the change and its digests journaled
    let out = fx.ok(Some(&b), "task_propose", change(1, json!({"name": "z"})));
    assert_eq!(
        (
            out["outcome"].as_str(),
            out["from_version"].as_i64(),
            out["to_version"].as_i64()
        ),
        (Some("applied"), Some(1), Some(2)),
        "{out}"
    );
    let live: Value = serde_json::from_slice(&std::fs::read(&data).unwrap()).unwrap();
    assert_eq!(
        live,
        json!([{"id":1,"v":1,"name":"a","secret":"x"},{"id":2,"v":2,"name":"z","secret":"y"}])
    );
    assert_eq!(out["before_sha256"], room_core::sha256_hex(&original));
    assert_eq!(out["after_sha256"], sha(&data));
    let recs = proposals_in(&mut fx, "build");
    assert_eq!(recs.len(), 1, "{recs:?}");
    assert_eq!(recs[0]["actor"], "beta");
    // the daemon's own change moves the task's staging pin with it: the task's next worker
    // stages the file as it is now
    let pin = |fx: &mut Fx| {
        fx.ok(Some(&b), "task_show", json!({"task": task}))["task"]["stage"][1]["sha256"].clone()
    };
    assert_eq!(pin(&mut fx), out["after_sha256"]);
    // a source changed some other way first keeps its pin where it was, stale as it is
    let mut edited = live.clone();
    edited[0]["name"] = json!("edited");
    std::fs::write(&data, serde_json::to_vec(&edited).unwrap()).unwrap();
    let second = fx.ok(Some(&b), "task_propose", change(2, json!({"name": "w"})));
    assert_eq!(second["outcome"], "applied", "{second}");
    assert_eq!(second["before_sha256"], sha_bytes(&edited));
    assert_eq!(pin(&mut fx), out["after_sha256"], "the stale pin stays");
    let live: Value = serde_json::from_slice(&std::fs::read(&data).unwrap()).unwrap();
    // the same proposal again read a version that is gone
    fx.refuse(
        Some(&b),
        "task_propose",
        change(1, json!({"name": "y"})),
        "proposal_version_conflict",
    );
    // a source swapped for a link is refused, and its target untouched
    let target = dir.join("target.json");
    std::fs::rename(&data, &target).unwrap();
    std::os::unix::fs::symlink("target.json", &data).unwrap();
    fx.refuse(
        Some(&b),
        "task_propose",
        change(3, json!({"name": "q"})),
        "proposal_source_refused",
    );
    assert_eq!(
        std::fs::read(&target).unwrap(),
        serde_json::to_vec(&live).unwrap()
    );
    assert_eq!(proposals_in(&mut fx, "build").len(), 2);
    // a cancelled room applies nothing
    std::fs::remove_file(&data).unwrap();
    std::fs::rename(&target, &data).unwrap();
    fx.ok(None, "room_cancel", json!({"room": "build"}));
    fx.refuse(
        Some(&b),
        "task_propose",
        change(3, json!({"name": "q"})),
        "room_admission_closed",
    );
    assert_eq!(proposals_in(&mut fx, "build").len(), 2);
    assert!(
        std::fs::read_dir(fx.state.join("proposals"))
            .unwrap()
            .flatten()
            .all(|e| e.file_name().to_string_lossy().starts_with('.')),
        "no intention is left in the outbox"
    );
}

#[test]
fn a_worker_with_a_read_only_project_changes_it_only_through_a_proposal() {
    let mut fx = Fx::new();
    let (a, dir) = staged_team(&mut fx);
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    fx.write_config(&format!(
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/usr/bin/python3\", {:?}, \"propose\", {:?}]\ntimeout_ms = 30000\nproject = \"read_only\"\n",
        agent.to_str().unwrap(),
        dir.to_str().unwrap()
    ));
    let task = proposal_task(&mut fx, &a, &dir);
    fx.sync_all(&a, "build");
    let src = fx.ok(
        Some(&a),
        "send",
        json!({"room": "build", "to": ["beta"], "text": "rename b", "task": task}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    if !confinable() {
        // the policy asks for what this machine cannot give: the worker never started
        assert_eq!(w["state"], "failed", "{w}");
        return;
    }
    let out = worker_out(&fx);
    let seen = out
        .iter()
        .find_map(|v| v.get("proposals").cloned())
        .unwrap_or_else(|| panic!("the worker reported: {out:?} {w}"));
    assert_eq!(
        seen["read"],
        json!([{"id": 2, "v": 1, "name": "b"}]),
        "{seen}"
    );
    // EROFS: the project is read-only inside the worker
    assert_eq!(seen["direct_write"], "OSError:30", "{seen}");
    assert_eq!(seen["before_claim"], "task_not_held", "{seen}");
    assert_eq!(seen["claim"], "ok", "{seen}");
    assert_eq!(seen["applied"]["to_version"], 2, "{seen}");
    assert_eq!(seen["again"], "proposal_version_conflict", "{seen}");
    assert_eq!(seen["withheld"], "proposal_withheld", "{seen}");
    let live: Value =
        serde_json::from_slice(&std::fs::read(dir.join("data.json")).unwrap()).unwrap();
    assert_eq!(
        live,
        json!([{"id":1,"v":1,"name":"a","secret":"x"},{"id":2,"v":2,"name":"z","secret":"y"}])
    );
    assert_eq!(proposals_in(&mut fx, "build").len(), 1);
}

#[test]
fn a_project_policy_that_is_neither_read_only_nor_writable_fails_the_policy_closed() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    fx.write_config(
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/bin/true\"]\nproject = \"hidden\"\n",
    );
    let r = fx.refuse(
        Some(&a),
        "sync",
        json!({"room": "coord"}),
        "tool_result_withheld",
    );
    assert!(r.to_string().contains("routes.beta.project"), "{r}");
}

#[test]
fn the_owner_routes_an_agent_from_the_console_and_a_route_that_would_not_load_writes_nothing() {
    let mut fx = Fx::new();
    let (a, b, _) = fx.team("coord");
    let cfg = fx.state.join("config.toml");
    std::fs::write(
        &cfg,
        "# the owner's notes\n[fleet]\nceiling = \"operator\"\n",
    )
    .unwrap();
    let before = std::fs::read(&cfg).unwrap();
    let script = json!({"adapter": "script"});
    for (args, code, field) in [
        (
            json!({"agent": "nobody", "route": script}),
            "not_found",
            None,
        ),
        (
            json!({"agent": "../x", "route": script}),
            "invalid_argument",
            Some("agent"),
        ),
        (
            json!({"agent": "beta", "route": "script"}),
            "invalid_argument",
            Some("route"),
        ),
        (
            json!({"agent": "beta", "route": {"adapter": "script", "colour": "red"}}),
            "invalid_argument",
            Some("route"),
        ),
        (
            json!({"agent": "beta", "route": {"adapter": "telepathy"}}),
            "invalid_argument",
            Some("route"),
        ),
        (
            json!({"agent": "beta", "route": {"adapter": "command", "command": ["python3"]}}),
            "invalid_argument",
            Some("route"),
        ),
        (json!({"agent": "beta"}), "invalid_argument", None),
    ] {
        let r = fx.refuse(None, "route_set", args.clone(), code);
        if let Some(f) = field {
            assert_eq!(r.detail["field"], f, "{args}: {r}");
        }
        assert_eq!(
            std::fs::read(&cfg).unwrap(),
            before,
            "{args}: nothing written"
        );
    }
    fx.refuse(
        Some(&b),
        "route_set",
        json!({"agent": "beta", "route": script}),
        "owner_required",
    );
    fx.refuse(None, "route_remove", json!({"name": "beta"}), "not_found");
    fx.refuse(Some(&b), "routes_list", json!({}), "owner_required");
    assert_eq!(std::fs::read(&cfg).unwrap(), before);
    // set: the file keeps the owner's notes and gains the table; the next send goes through it
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workers/agent.py");
    fx.ok(
        None,
        "route_set",
        json!({"agent": "beta", "route": {"adapter": "command",
            "command": ["/usr/bin/python3", agent, "reply"], "timeout_ms": 30000}}),
    );
    let text = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        text.starts_with("# the owner's notes\n[fleet]\nceiling = \"operator\"\n"),
        "{text}"
    );
    assert!(text.contains("[routes.beta]"), "{text}");
    let listed = fx.ok(None, "routes_list", json!({}));
    assert_eq!(listed["routes"]["beta"]["timeout_ms"], 30000, "{listed}");
    let src = send(&mut fx, &a, "hello through the new route");
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["state"], "replied", "{w}");
    // removed: the agent's wakes stay queued for its own session
    fx.ok(None, "route_remove", json!({"name": "beta"}));
    let listed = fx.ok(None, "routes_list", json!({}));
    assert!(listed["routes"].get("beta").is_none(), "{listed}");
    assert!(
        std::fs::read_to_string(&cfg)
            .unwrap()
            .contains("# the owner's notes")
    );
}

/// The permit of `source` once it is queued and deferred with `code`.
fn deferred_with(fx: &mut Fx, source: &str, code: &str) -> Value {
    let start = Instant::now();
    loop {
        let all = fx.ok(None, "wakes_list", json!({}));
        let w = all["wakes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["source_event"] == source)
            .cloned()
            .unwrap_or(Value::Null);
        if w["state"] == "queued" && w["deferred"] == code {
            return w;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the permit was not deferred {code}: {w}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A worker that writes 400 MiB to its stdout in a second fills no disk: its log keeps the
/// first and the last MiB with a line that says how much was cut between them.
#[test]
fn a_worker_that_floods_its_output_fills_no_disk() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    fx.write_config(
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/bin/sh\", \"-c\", \"echo first; head -c 419430400 /dev/zero | tr '\\\\0' x; echo; echo last\"]\ntimeout_ms = 60000\n",
    );
    let src = send(&mut fx, &a, "flood");
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["launches"][0]["state"], "ended", "{w}");
    let dir = fx.state.join("workers");
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|d| d.path().join("stdout.log"))
        .find(|p| p.exists())
        .expect("the worker's stdout.log");
    // the pump finishes once the pipe's last writer is gone: wait for the tail to land
    let start = Instant::now();
    let text = loop {
        let t = std::fs::read(&log).unwrap();
        if t.ends_with(b"last\n") {
            break t;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "no tail");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(text.len() <= (2 << 20) + 128, "{} bytes kept", text.len());
    assert!(text.starts_with(b"first\n"));
    let s = String::from_utf8_lossy(&text);
    assert!(
        s.contains("bytes of this output were cut here]"),
        "no cut mark"
    );
}

/// Below the state directory's free-space floor, and past the workers' quota, no worker
/// starts: the permit waits, queued, saying why, and starts once the owner lowers the floor.
#[test]
fn no_worker_starts_below_the_free_space_floor_or_past_the_workers_quota() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    let routes =
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/bin/true\"]\ntimeout_ms = 10000\n";
    fx.write_config(&format!(
        "[dispatch]\nstate_dir_free_bytes_min = 9223372036854775807\n\n{routes}"
    ));
    let src = send(&mut fx, &a, "wait for space");
    let w = deferred_with(&mut fx, &src, "state_dir_space_low");
    assert_eq!(w["launches"], json!([]), "{w}");
    // a workers' share over its quota (a leftover file of 2 MiB) holds launches too
    let junk = fx.state.join("workers/leftover");
    std::fs::create_dir_all(&junk).unwrap();
    std::fs::write(junk.join("big.log"), vec![0u8; 2 << 20]).unwrap();
    // config.toml changes are picked up once their timestamps settle
    std::thread::sleep(Duration::from_millis(2_100));
    fx.write_config(&format!(
        "[dispatch]\nworkers_bytes_max = 1048576\n\n{routes}"
    ));
    deferred_with(&mut fx, &src, "worker_space_quota");
    std::fs::remove_dir_all(&junk).unwrap();
    let w = settled(&mut fx, &src, &["queued", "dispatched"]);
    assert_eq!(w["launches"][0]["state"], "ended", "{w}");
}

/// A busy agent's backlog does not hide a free agent's permit: each pass looks at the oldest
/// permit of every routed agent.
#[test]
fn a_backlog_of_one_agent_does_not_hold_back_another_agent_s_permit() {
    let mut fx = Fx::new();
    let (a, _, _) = fx.team("coord");
    // beta's route holds it busy; its 70 permits wait
    fx.write_config(
        "[routes.beta]\nadapter = \"command\"\ncommand = [\"/bin/sleep\", \"30\"]\ntimeout_ms = 30000\n\n[routes.gamma]\nadapter = \"command\"\ncommand = [\"/bin/true\"]\ntimeout_ms = 10000\n",
    );
    for i in 0..70 {
        send(&mut fx, &a, &format!("backlog {i}"));
    }
    fx.sync_all(&a, "coord");
    let to_gamma = fx.ok(
        Some(&a),
        "send",
        json!({"room": "coord", "to": ["gamma"], "text": "free"}),
    )["event"]
        .as_str()
        .unwrap()
        .to_string();
    let g = settled(&mut fx, &to_gamma, &["queued", "dispatched"]);
    assert_eq!(g["launches"][0]["state"], "ended", "{g}");
}
