//! `room snapshot --out DIR` and `room restore DIR`: the person's side of
//! `room_store::snapshot`. Both need the daemon stopped (they take the state dir's lock), print
//! what they copied and where the replaced tree is kept, and turn each refusal into its code
//! and a hint.

use crate::cmd::{Cli, EXIT_IO, EXIT_REFUSED, EXIT_STATE, state_dir};
use room_store::StoreError;
use room_store::snapshot::{self, RestoreConfig, SnapshotError, StopAfter};
use room_store::statedir;
use serde_json::json;
use std::path::Path;

pub fn take(cli: &Cli, out: &Path) -> i32 {
    let state = match statedir::validate(&state_dir(cli), &statedir::default_bootstrap_path()) {
        Ok(s) => s,
        Err(e) => return state_error(&e),
    };
    if let Ok(to) = std::fs::read_to_string(state.store_migrated()) {
        eprintln!(
            "error: the state dir's store was migrated to a database: {}",
            to.trim()
        );
        eprintln!("hint: back the database up with pg_dump; this embedded copy is not served");
        return EXIT_STATE;
    }
    let _lock = match statedir::lock(&state) {
        Ok(l) => l,
        Err(e) => return state_error(&e),
    };
    let taken = match snapshot::take(&state, out, now_ms()) {
        Ok(t) => t,
        Err(e) => return refused(&e),
    };
    let m = &taken.manifest;
    if cli.json {
        println!(
            "{}",
            json!({"out": taken.out, "state_dir": m.canonical_path, "instance": m.instance_id,
                "fingerprint": m.fingerprint, "files": m.files.len(), "bytes": m.bytes(),
                "rooms": m.chains})
        );
        return 0;
    }
    println!(
        "snapshot of {} (instance {}): {} files, {} bytes, {} rooms, every chain verified",
        m.canonical_path,
        m.instance_id,
        m.files.len(),
        m.bytes(),
        m.chains.len()
    );
    println!("fingerprint {}", m.fingerprint);
    println!("in {}", taken.out.display());
    println!(
        "next: keep it off this disk; `room restore {}` puts it back (the daemon stopped)",
        taken.out.display()
    );
    0
}

pub fn restore(cli: &Cli, from: &Path) -> i32 {
    let dir = state_dir(cli);
    let bootstrap = statedir::default_bootstrap_path();
    let now = now_ms();
    let cfg = RestoreConfig {
        state_dir: &dir,
        bootstrap: &bootstrap,
        snapshot: from,
        now_ms: now,
        op: format!("{now}-{}", std::process::id()),
        // a crash at a chosen step, for the tests of resumption (as `ROOM_FAULT` elsewhere)
        stop_after: match std::env::var("ROOM_FAULT").as_deref() {
            Ok("restore_after_staged") => Some(StopAfter::Staged),
            Ok("restore_after_moved_aside") => Some(StopAfter::MovedAside),
            _ => None,
        },
    };
    let done = match snapshot::restore(&cfg) {
        Ok(d) => d,
        Err(e) if cfg.stop_after.is_some() && e.code().is_none() => {
            tracing::error!("ROOM_FAULT: aborting here: {e}");
            std::process::abort();
        }
        Err(e) => return refused(&e),
    };
    let m = &done.manifest;
    if cli.json {
        println!(
            "{}",
            json!({"state_dir": done.root, "previous": done.previous, "fingerprint": m.fingerprint,
                "resumed": done.resumed, "files": m.files.len(), "rooms": m.chains,
                "unpinned": done.unpinned})
        );
        return 0;
    }
    println!(
        "restored {} from {} ({} files, {} rooms{})",
        done.root.display(),
        from.display(),
        m.files.len(),
        m.chains.len(),
        if done.resumed {
            ", finishing the restore an earlier run began"
        } else {
            ""
        }
    );
    println!(
        "the tree it replaced is kept in {} (remove it once the restored state serves)",
        done.previous.display()
    );
    for g in &done.unpinned {
        println!(
            "room {g}: its index and journal disagreed in the snapshot already; the daemon refuses it until `room index rebuild`"
        );
    }
    println!("next: room serve");
    0
}

fn refused(e: &SnapshotError) -> i32 {
    let Some(code) = e.code() else {
        return match e {
            SnapshotError::Store(s) => state_error(s),
            _ => unreachable!("every case but Store has a code"),
        };
    };
    eprintln!("error[{}]: {e}", code.as_str());
    let hint = match e {
        SnapshotError::Link(_) => {
            "a state dir holds no links: replace the link with what it names, or take the snapshot again from an intact copy"
        }
        SnapshotError::Outside(_) | SnapshotError::Invalid(_) => {
            "the snapshot is damaged or was changed since it was taken; nothing here was changed: restore another copy"
        }
        SnapshotError::OtherStateDir(_) => {
            "restore a snapshot of this state dir, or name the one the snapshot is of with --state-dir"
        }
        SnapshotError::Pending(_) => {
            "finish the restore under way first: run `room restore` again with its snapshot"
        }
        SnapshotError::Argument(_) => "name a new or empty directory outside the state dir",
        SnapshotError::Store(_) => unreachable!("handled above"),
    };
    eprintln!("hint: {hint}");
    EXIT_REFUSED
}

fn state_error(e: &StoreError) -> i32 {
    eprintln!("error: {e}");
    match e {
        StoreError::Locked { .. } => {
            eprintln!(
                "hint: stop the daemon first; a snapshot and a restore need the state dir to themselves"
            );
            EXIT_STATE
        }
        StoreError::RestorePending(_) => {
            eprintln!("hint: run the same `room restore` again: it resumes where it stopped");
            EXIT_STATE
        }
        StoreError::SplitBrain(_) => EXIT_STATE,
        _ => EXIT_IO,
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
