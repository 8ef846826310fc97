//! `room migrate --from DIR --to URL`: the person's side of `room_store_pg::migrate`. It
//! opens the state dir as a daemon would (validated, its lock held, so no daemon serves it
//! meanwhile), reports each room as it lands, and once the database holds the whole store,
//! leaves `store_migrated.json` in the state dir so that its embedded copy is not served again.

use crate::cmd::{Cli, EXIT_IO, EXIT_REFUSED, EXIT_STATE, state_dir};
use room_store::StoreError;
use room_store::statedir;
use room_store_pg::migrate::{MigrateError, Migrated, Progress, Source};
use serde_json::json;
use std::io::Write;
use std::path::Path;

pub fn run(cli: &Cli, from: Option<&Path>, to: &str) -> i32 {
    if !room_engine::policy::is_postgres_url(to) {
        eprintln!("error[invalid_argument]: to: the url is not a postgres:// url");
        return EXIT_REFUSED;
    }
    let dir = from.map_or_else(|| state_dir(cli), Path::to_path_buf);
    let state = match statedir::validate(&dir, &statedir::default_bootstrap_path()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_STATE;
        }
    };
    if let Ok(before) = std::fs::read_to_string(state.store_migrated()) {
        eprintln!(
            "error: the state dir's store was migrated already: {}",
            before.trim()
        );
        eprintln!("hint: serve the database it went to: room serve --store URL");
        return EXIT_STATE;
    }
    let _lock = match statedir::lock(&state) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("error: {e}");
            if matches!(e, StoreError::Locked { .. }) {
                eprintln!("hint: stop the daemon first; a migration copies a store nothing writes");
            }
            return EXIT_STATE;
        }
    };
    let target = match room_store_pg::PgBackend::connect(to) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_IO;
        }
    };
    let sqlite = room_store::SqliteBackend::new(&state, Default::default());
    let source = Source {
        state: &state,
        store: &sqlite,
    };
    let json = cli.json;
    let mut progress = |p: Progress<'_>| {
        if json {
            return;
        }
        let mut out = std::io::stdout().lock();
        let _ = match p {
            Progress::Room(r) => writeln!(
                out,
                "room {}: {} records ({} copied now), {} blobs, {} index rows, tip {}",
                r.name, r.records, r.appended, r.blobs, r.index_rows, r.tip_hash
            ),
            Progress::Control { rows } => writeln!(out, "control: {rows} rows"),
        };
        // a person (or a test) sees each room as it lands, also when the run is cut short
        let _ = out.flush();
    };
    let done = match room_store_pg::migrate::migrate(&source, &target, now_ms(), &mut progress) {
        Ok(m) => m,
        Err(MigrateError::NotEmpty(why)) => {
            eprintln!("error[store_not_empty]: to: {why}");
            eprintln!(
                "hint: a migration fills only an empty database: create one (createdb NAME) and point --to at it"
            );
            return EXIT_REFUSED;
        }
        Err(MigrateError::Store(e)) => {
            eprintln!("error: {e}");
            eprintln!(
                "hint: what was copied stays; run the same command again to resume, and no daemon serves the database until it has finished"
            );
            return EXIT_IO;
        }
    };
    let to_shown = without_password(to);
    let marker = json!({"to": to_shown, "instance": state.instance_id, "rooms": done.rooms.len()});
    let marker = serde_json::to_vec(&marker).expect("a json value serializes");
    if let Err(e) = room_store::fs::write_atomic(&state.store_migrated(), &marker) {
        eprintln!("error: {}: {e}", state.store_migrated().display());
        return EXIT_IO;
    }
    report(json, &done, &to_shown);
    0
}

fn report(json: bool, done: &Migrated, to: &str) {
    if json {
        let rooms: Vec<_> = done
            .rooms
            .iter()
            .map(|r| {
                json!({"room": r.name, "graph_id": r.graph_id, "records": r.records,
                    "appended": r.appended, "tip_hash": r.tip_hash, "blobs": r.blobs,
                    "index_rows": r.index_rows})
            })
            .collect();
        println!(
            "{}",
            json!({"to": to, "resumed": done.resumed, "rooms": rooms,
                "control_rows": done.control_rows})
        );
        return;
    }
    println!(
        "migrated {} rooms{} to {to}",
        done.rooms.len(),
        if done.resumed { " (resumed)" } else { "" }
    );
    println!(
        "next: room init --store {to} (names it in config.toml, as on any other host that serves it), then room serve"
    );
}

/// `url` without the password its user part may hold: what may be printed and kept.
fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((user, host)) => {
            let user = user.split_once(':').map_or(user, |(u, _)| u);
            format!("{scheme}://{user}@{host}{path}")
        }
        None => url.to_string(),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::without_password;

    #[test]
    fn a_password_is_never_kept() {
        assert_eq!(
            without_password("postgres://ann:s3cret@db.example:5432/room"),
            "postgres://ann@db.example:5432/room"
        );
        assert_eq!(
            without_password("postgres://ann@db/room"),
            "postgres://ann@db/room"
        );
        assert_eq!(without_password("postgres://db/room"), "postgres://db/room");
        assert_eq!(
            without_password("postgresql://a:b@h/d?sslmode=disable"),
            "postgresql://a@h/d?sslmode=disable"
        );
    }
}
