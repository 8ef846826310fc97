//! `room bench acceptance`: what measuring completion costs. `done` with 1, 16 and 64 `sha256`
//! checks over files of 4 KiB, 1 MiB and 64 MiB, as a ratio to hashing the same bytes in the
//! same process (so the ratio is Room's overhead, not the disk's speed); and `task claim`
//! against 10,000 live leases of other holders (the `exclusive` check), as a ratio to one
//! uncontended claim.

use crate::bench::{BenchArgs, owner};
use room_core::{Tier, Verb};
use room_engine::Engine;
use room_engine::principal::AgentCaller;
use room_engine::verbs::{TaskCreateArgs, TurnArgs};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Instant;

const SIZES: [(&str, usize); 3] = [("4 KiB", 4 << 10), ("1 MiB", 1 << 20), ("64 MiB", 64 << 20)];
const CHECKS: [usize; 3] = [1, 16, 64];
const LEASES: usize = 10_000;

fn agent(e: &Engine, name: &str, tier: Tier) -> anyhow::Result<AgentCaller> {
    let t = e
        .enroll(&owner(e), name, tier, "bench")
        .map_err(anyhow::Error::msg)?;
    Ok(AgentCaller {
        token: t.token,
        conversation: "bench".into(),
        declared_tier: None,
        page_bytes_max: None,
    })
}

fn ok(r: Result<Value, room_core::Refusal>) -> anyhow::Result<Value> {
    r.map_err(|e| anyhow::anyhow!("{e}"))
}

fn catch_up(e: &Engine, a: &AgentCaller, room: &str) -> anyhow::Result<()> {
    let mut confirm: Option<String> = None;
    loop {
        let page = ok(e.sync(a, room, confirm.as_deref()))?;
        if page["more"] != true && confirm.is_some() {
            return Ok(());
        }
        confirm = page["receipt"].as_str().map(String::from);
    }
}

/// A world with a project room `build`, the coordinator `boss` and the worker `w`.
struct Project {
    _tmp: tempfile::TempDir,
    e: Engine,
    dir: std::path::PathBuf,
    boss: AgentCaller,
    w: AgentCaller,
}

fn project(dir: &Path) -> anyhow::Result<Project> {
    let tmp = tempfile::tempdir_in(dir)?;
    let root = std::fs::canonicalize(tmp.path())?;
    let state = room_store::statedir::init(&root.join("state"), &root.join("boot.toml"), "bench")?;
    std::fs::write(
        state.root.join("config.toml"),
        "[quotas]\ntasks_open = 100000\n",
    )?;
    let store = room_server::daemon::embedded_store(&state);
    let e = Engine::open(
        state,
        room_server::daemon::real_env(),
        store,
        Default::default(),
    )?;
    let work = root.join("work");
    std::fs::create_dir_all(&work)?;
    let boss = agent(&e, "boss", Tier::Coordinator)?;
    let w = agent(&e, "w", Tier::Member)?;
    let p = ok(e.project_open(&owner(&e), work.to_str().unwrap_or_default(), None))?;
    let pid = p["id"].as_str().unwrap_or_default().to_string();
    ok(e.room_create(
        &owner(&e),
        "build",
        Some(&pid),
        &["boss".into(), "w".into()],
    ))?;
    Ok(Project {
        _tmp: tmp,
        e,
        dir: work,
        boss,
        w,
    })
}

impl Project {
    fn task(&self, title: &str, scopes: Vec<String>, accept: Vec<Value>) -> anyhow::Result<String> {
        let v = ok(self.e.task_create(
            &self.boss,
            TaskCreateArgs {
                room: "build".into(),
                title: title.into(),
                to: Some("w".into()),
                scopes,
                accept,
                ..Default::default()
            },
        ))?;
        Ok(v["task"]["id"].as_str().unwrap_or_default().to_string())
    }

    /// Claim and close `task`; the seconds `done` took.
    fn claim_and_done(&self, task: &str) -> anyhow::Result<f64> {
        ok(self.e.task_claim(&self.w, task, None))?;
        catch_up(&self.e, &self.w, "build")?;
        let args = TurnArgs {
            room: "build".into(),
            task: Some(task.into()),
            ..Default::default()
        };
        let t = Instant::now();
        let v = ok(self.e.turn(&self.w, Verb::Done, args))?;
        let took = t.elapsed().as_secs_f64();
        anyhow::ensure!(
            v["detail"]["acceptance"] == "passed",
            "done did not pass: {v}"
        );
        Ok(took)
    }
}

fn hash_seconds(path: &Path, times: usize) -> anyhow::Result<f64> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let t = Instant::now();
    for _ in 0..times {
        let mut f = std::fs::File::open(path)?;
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        std::hint::black_box(h.finalize());
    }
    Ok(t.elapsed().as_secs_f64())
}

pub fn bench(a: &BenchArgs) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    eprintln!("measuring acceptance in {} …", dir.display());
    let p = project(&dir)?;
    println!(
        "{:<44} {:>12} {:>14}  ratio",
        "row", "done ms", "hash-only ms"
    );
    for (label, bytes) in SIZES {
        let file = format!("artifact-{bytes}.bin");
        let body: Vec<u8> = (0..bytes).map(|i| (i % 251) as u8).collect();
        std::fs::write(p.dir.join(&file), &body)?;
        let digest = room_core::sha256_hex(&body);
        drop(body);
        for n in CHECKS {
            let check = json!({"kind": "sha256", "path": file, "expected": digest});
            let task = p.task("measured", vec![], vec![check; n])?;
            let done = p.claim_and_done(&task)?;
            let hash = hash_seconds(&p.dir.join(&file), n)?;
            println!(
                "{:<44} {:>12.2} {:>14.2}  {:.2}x",
                format!("done, {n} sha256 check(s) over {label}"),
                done * 1e3,
                hash * 1e3,
                done / hash.max(1e-9)
            );
        }
    }
    claims(&p)
}

/// One uncontended scoped claim, then the same against `LEASES` live leases of another holder.
fn claims(p: &Project) -> anyhow::Result<()> {
    let holder = agent(&p.e, "holder", Tier::Member)?;
    ok(p.e.room_members_add(&owner(&p.e), "build", "holder"))?;
    let samples = 50;
    let measure = |tag: &str| -> anyhow::Result<f64> {
        let mut total = 0.0;
        for i in 0..samples {
            let t = p.task("claimed", vec![format!("file:free/{tag}{i}")], vec![])?;
            let start = Instant::now();
            ok(p.e.task_claim(&p.w, &t, None))?;
            total += start.elapsed().as_secs_f64();
        }
        Ok(total / samples as f64)
    };
    let alone = measure("a")?;
    eprintln!("  taking {LEASES} leases for another holder …");
    for i in 0..LEASES {
        let v = ok(p.e.task_create(
            &p.boss,
            TaskCreateArgs {
                room: "build".into(),
                title: "held".into(),
                to: Some("holder".into()),
                scopes: vec![format!("file:held/{i}")],
                ..Default::default()
            },
        ))?;
        let t = v["task"]["id"].as_str().unwrap_or_default().to_string();
        ok(p.e.task_claim(&holder, &t, None))?;
    }
    let crowded = measure("b")?;
    println!(
        "{:<44} {:>12.3} {:>14}  baseline",
        "task claim, no other live lease",
        alone * 1e3,
        "-"
    );
    println!(
        "{:<44} {:>12.3} {:>14}  {:.2}x",
        format!("task claim, {LEASES} live leases"),
        crowded * 1e3,
        "-",
        crowded / alone.max(1e-9)
    );
    Ok(())
}
