//! `room bench core --store postgres://…`: gated turns per second with Room's whole store on
//! PostgreSQL (1, 8 and 64 writers in one room, and 16 writers in 16 rooms), as a ratio to
//! pgbench's single-row insert rate on the same server in the same run, so the numbers mean
//! something whatever the server. Each row runs in a database of its own, made for it and
//! dropped after (the url's user needs CREATEDB).

use crate::bench::{BenchArgs, Loop, Store, own_rooms, pct, shared_room};
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static SCRATCH: AtomicU32 = AtomicU32::new(0);

/// A fresh database on the server `url` names, dropped with the value.
pub(crate) fn scratch(url: &str) -> anyhow::Result<room_store_pg::ScratchDatabase> {
    let n = SCRATCH.fetch_add(1, Ordering::SeqCst);
    let name = format!("room_bench_{}_{n}", std::process::id());
    Ok(room_store_pg::ScratchDatabase::create(url, &name)?)
}

/// pgbench: Debian keeps it beside the server's binaries, not on the PATH.
fn pgbench() -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("pgbench"))
        .find(|p| p.exists());
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin/pgbench"))
        .filter(|p| p.exists())
        .collect();
    debian.sort();
    on_path.or_else(|| debian.pop()).ok_or_else(|| {
        anyhow::anyhow!("no pgbench here (hint: install postgresql-client or postgresql)")
    })
}

/// pgbench's rate of single-row inserts of 256 bytes, one client, on a scratch database.
fn pgbench_rate(url: &str, secs: f64) -> anyhow::Result<f64> {
    let db = scratch(url)?;
    db.execute("CREATE TABLE raw (id bigserial PRIMARY KEY, body bytea NOT NULL)")?;
    let script = tempfile::NamedTempFile::new()?;
    std::fs::write(
        script.path(),
        "INSERT INTO raw (body) VALUES (decode(repeat('07', 256), 'hex'));\n",
    )?;
    let c = &db.config;
    let mut cmd = Command::new(pgbench()?);
    cmd.args(["-n", "-c", "1", "-j", "1", "-T"])
        .arg(format!("{}", secs.ceil().max(1.0) as u64))
        .arg("-f")
        .arg(script.path());
    if let Some(h) = c.get_hosts().first() {
        match h {
            room_store_pg::PgHost::Tcp(h) => cmd.args(["-h", h]),
            room_store_pg::PgHost::Unix(p) => cmd.arg("-h").arg(p),
        };
    }
    if let Some(p) = c.get_ports().first() {
        cmd.args(["-p", &p.to_string()]);
    }
    if let Some(u) = c.get_user() {
        cmd.args(["-U", u]);
    }
    cmd.arg(c.get_dbname().unwrap_or("postgres"));
    let out = cmd.output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("tps = "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("pgbench said no rate: {text}"))
}

pub(crate) fn bench(a: &BenchArgs, url: &str) -> anyhow::Result<()> {
    let dir = a.dir.clone().unwrap_or_else(std::env::temp_dir);
    let secs = a.seconds;
    eprintln!("measuring Room on PostgreSQL for {secs} s per row …");
    let base = pgbench_rate(url, secs)?;
    let store = Store::Postgres(url.to_string());
    println!(
        "{:<52} {:>12} {:>10} {:>10}  note",
        "row", "per second", "p50 µs", "p99 µs"
    );
    println!(
        "{:<52} {base:>12.0} {:>10} {:>10}  baseline",
        "pgbench single-row insert, 1 client", "-", "-"
    );
    let row = |name: &str, per_s: f64, lat: &mut Vec<std::time::Duration>, note: &str| {
        let f = |v: Option<f64>| v.map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into());
        println!(
            "{name:<52} {per_s:>12.0} {:>10} {:>10}  {:.2}x pgbench{note}",
            f(pct(lat, 0.5)),
            f(pct(lat, 0.99)),
            per_s / base
        );
    };
    let mut one = own_rooms(&dir, 1, secs, &store)?;
    row("1 writer in one room", one.per_s, &mut one.lat, "");
    for writers in [8usize, 64].into_iter().filter(|w| *w <= a.writers_max) {
        let mut sh = shared_room(&dir, None, writers, secs, Loop::ReadThrough, &store)?;
        row(
            &format!("{writers} writers in one room (read_through)"),
            sh.per_s,
            &mut sh.refusals,
            "; refusals per turn in the p50/p99 columns",
        );
    }
    let mut sixteen = own_rooms(&dir, 16, secs, &store)?;
    row(
        "16 writers in 16 rooms",
        sixteen.per_s,
        &mut sixteen.lat,
        "",
    );
    Ok(())
}
