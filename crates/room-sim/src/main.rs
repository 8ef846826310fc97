//! `room-sim`: run the deterministic simulator over a range of seeds, or replay one.
//! `room-sim --seeds 0..50 --steps 400 [--agents N --rooms N] [--blackboard]`, `room-sim --seed 17`,
//! `room-sim --soak` (2,000 seeds of 2,000 steps with 200 agents in 40 rooms),
//! `room-sim --collab --seeds 0..50 [--steps 600]` (a collaboration per seed: the real
//! scheduler, seeded roles, decisions and restarts, `room_sim::collab`'s oracle),
//! `room-sim --broken ack-before-fsync|commit-log-skips-sync|skip-invariants|sqlite-fsync-lies|skip-authority-pins` (planted bugs the
//! simulator must find). A failing seed does not stop the others (a campaign that stopped at
//! a false alarm would hide the real failures behind it): each failure is printed as it
//! happens, and the end names every failing seed and exits 1 if there was one.

use room_sim::{Broken, SimConfig, run};

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let steps: u64 = arg(&args, "--steps")
        .and_then(|s| s.parse().ok())
        .unwrap_or(400);
    let soak = args.iter().any(|a| a == "--soak");
    let broken = match arg(&args, "--broken").as_deref() {
        None => None,
        Some("ack-before-fsync") => Some(Broken::AckBeforeFsync),
        Some("commit-log-skips-sync") => Some(Broken::CommitLogSkipsSync),
        Some("skip-invariants") => Some(Broken::SkipInvariants),
        Some("sqlite-fsync-lies") => Some(Broken::SqliteFsyncLies),
        Some("skip-authority-pins") => Some(Broken::SkipAuthorityPins),
        Some(other) => {
            eprintln!(
                "error: --broken {other:?}: the planted bugs are ack-before-fsync, commit-log-skips-sync, skip-invariants, sqlite-fsync-lies and skip-authority-pins"
            );
            std::process::exit(2);
        }
    };
    let seeds: Vec<u64> = if let Some(s) = arg(&args, "--seed") {
        vec![s.parse().unwrap_or_else(|_| {
            eprintln!("error: --seed needs a number");
            std::process::exit(2)
        })]
    } else {
        let range = arg(&args, "--seeds").unwrap_or_else(|| {
            if soak {
                "0..2000".into()
            } else {
                "0..20".into()
            }
        });
        let (a, b) = range.split_once("..").unwrap_or(("0", "20"));
        let (a, b): (u64, u64) = (a.parse().unwrap_or(0), b.parse().unwrap_or(20));
        (a..b).collect()
    };
    if args.iter().any(|a| a == "--collab") {
        std::process::exit(collab(&seeds, steps));
    }
    let mut totals = room_sim::Report::default();
    let mut failed: Vec<(u64, String)> = vec![];
    for (k, seed) in seeds.iter().enumerate() {
        let cfg = SimConfig {
            steps: if soak { steps.max(2000) } else { steps },
            broken,
            blackboard: args.iter().any(|a| a == "--blackboard"),
            ..SimConfig::new(*seed)
        };
        // a panic in one seed is that seed's failure, not the campaign's end
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cfg)));
        match out {
            Ok(Ok(r)) => {
                totals.accepted += r.accepted;
                totals.refused += r.refused;
                totals.crashes += r.crashes;
                totals.faults += r.faults;
                totals.acked_events += r.acked_events;
                totals.disk += r.disk;
                totals.journals_cut += r.journals_cut;
                totals.journals_sectored += r.journals_sectored;
                totals.journals_out_of_order += r.journals_out_of_order;
                totals.turn_waits += r.turn_waits;
                totals.turns_after_wait += r.turns_after_wait;
                for (k, v) in r.refusals {
                    *totals.refusals.entry(k).or_default() += v;
                }
                for (k, v) in r.invariants {
                    *totals.invariants.entry(k).or_default() += v;
                }
            }
            Ok(Err(f)) => {
                eprint!("{f}");
                failed.push((*seed, format!("(--steps {}): {}", f.step + 1, f.what)));
            }
            Err(panic) => {
                let what = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("a panic");
                eprintln!("seed {seed}: panicked: {what}");
                failed.push((*seed, format!("panicked: {what}")));
            }
        }
        if seeds.len() > 1 && (k + 1) % 50 == 0 {
            eprintln!(
                "{} of {} seeds run, {} failed",
                k + 1,
                seeds.len(),
                failed.len()
            );
        }
    }
    eprintln!(
        "{} passing seeds: {} calls accepted, {} refused, {} crashes, {} injected faults, {} acknowledged events checked",
        seeds.len() - failed.len(),
        totals.accepted,
        totals.refused,
        totals.crashes,
        totals.faults,
        totals.acked_events
    );
    let d = totals.disk;
    eprintln!(
        "SQLite on the simulated disk: {} writes ({} checkpointed to a database file), {} syncs, {} struck by faults; unsynced writes at crashes: {} lost, {} torn, {} kept",
        d.writes, d.db_writes, d.syncs, d.faults, d.lost, d.torn, d.kept
    );
    eprintln!(
        "journals with unsynced bytes at crashes: {} cut to a prefix, {} kept some sectors ({} out of order)",
        totals.journals_cut, totals.journals_sectored, totals.journals_out_of_order
    );
    eprintln!(
        "turns told to wait by a room's turnstile: {} ({} landed when called again)",
        totals.turn_waits, totals.turns_after_wait
    );
    eprintln!("refusals by code: {:?}", totals.refusals);
    eprintln!("invariant verdicts: {:?}", totals.invariants);
    for (seed, what) in &failed {
        println!("failed: seed {seed} {what}");
    }
    println!(
        "{} passed, {} failed",
        seeds.len() - failed.len(),
        failed.len()
    );
    if !failed.is_empty() {
        std::process::exit(1);
    }
}

/// `--collab`: one collaboration per seed; each report on stdout, failures named.
fn collab(seeds: &[u64], steps: u64) -> i32 {
    let mut failed = Vec::new();
    for &seed in seeds {
        match room_sim::collab::run(room_sim::collab::CollabConfig { seed, steps }) {
            Ok(r) => println!(
                "seed {seed}: {}{} after {} passes, {} restarts ({} cutting a pass); {} tasks done, {} declined; {} decisions ({} stale refused); {} fenced attempts; {} panels joined, {} judged, {} fix loops, {} timed out; refusals {:?}",
                r.state,
                if r.agent_orchestrated {
                    format!(
                        " (agent-orchestrated: {} dispatches, {} wakes, {} reminders)",
                        r.steered_dispatches, r.wakes_told, r.retells
                    )
                } else {
                    String::new()
                },
                r.passes,
                r.restarts,
                r.crashes_in_pass,
                r.tasks_done,
                r.declined,
                r.decisions,
                r.stale_decisions,
                r.fenced,
                r.panels_joined,
                r.judged,
                r.fixes,
                r.timed_out,
                r.refusals
            ),
            Err(f) => {
                eprint!("{f}");
                failed.push(seed);
            }
        }
    }
    println!(
        "{} passed, {} failed {:?}",
        seeds.len() - failed.len(),
        failed.len(),
        failed
    );
    i32::from(!failed.is_empty())
}
