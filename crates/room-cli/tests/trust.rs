//! A journal is checked before it is trusted, and loss is never hidden (issue 17, items 3
//! and 4), through the `room` binary with real files edited behind the daemon's back: a
//! flipped byte quarantines the room (at the open after an unclean stop, and by the background
//! scrub after a clean one), `room verify` names the bad record or the missing seqs, and
//! `room index rebuild` refuses to write over a loss until the owner accepts it, which the
//! journal then records.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::Duration;

struct Env {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    state: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        Env {
            state: root.join("state"),
            root,
            _tmp: tmp,
        }
    }

    fn run(&self, args: &[&str], token: Option<&str>) -> Output {
        self.cmd(args, token).output().unwrap()
    }

    fn cmd(&self, args: &[&str], token: Option<&str>) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_room"));
        c.args(args)
            .arg("--state-dir")
            .arg(&self.state)
            .env("XDG_CONFIG_HOME", self.root.join("config"))
            .env("ROOM_LOG", "error");
        c.env_remove("ROOM_TOKEN")
            .env_remove("ROOM_CONVERSATION")
            .env_remove("ROOM_TIER");
        if let Some(t) = token {
            c.env("ROOM_TOKEN", t);
        }
        c
    }

    fn serve(&self) -> Daemon {
        let mut child = self.cmd(&["serve"], None).spawn().unwrap();
        for _ in 0..500 {
            if self.state.join("room.sock").exists() && self.run(&["list"], None).status.success() {
                return Daemon(Some(child));
            }
            if let Ok(Some(_)) = child.try_wait() {
                panic!("daemon exited");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        panic!("daemon did not come up");
    }

    /// A daemon with room `r` whose journal holds `room_created` and three turns by alpha (seqs
    /// 1..=4).
    fn with_three_turns(&self) -> (Daemon, String) {
        assert!(self.run(&["init"], None).status.success());
        let daemon = self.serve();
        let enrolled = self.run(&["agent", "enroll", "alpha", "--json"], None);
        let token = json(&enrolled)["token"].as_str().unwrap().to_string();
        assert!(
            self.run(&["create", "r", "--member", "alpha"], None)
                .status
                .success()
        );
        let blind = self.run(&["say", "r", "hello", "--json"], Some(&token));
        let receipt = json(&blind)["refusal"]["detail"]["next_page"]["receipt"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(
            self.run(&["sync", "r", "--confirm", &receipt], Some(&token))
                .status
                .success()
        );
        for i in 0..3 {
            let said = self.run(&["say", "r", &format!("turn-{i}-text")], Some(&token));
            assert!(said.status.success(), "{}", stderr(&said));
        }
        (daemon, token)
    }

    fn journal(&self) -> PathBuf {
        std::fs::read_dir(self.state.join("rooms"))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("EVENTS.jsonl")
    }

    fn room_listed(&self) -> serde_json::Value {
        let listed = self.run(&["list", "--json"], None);
        assert!(listed.status.success(), "{}", stderr(&listed));
        json(&listed)["rooms"][0].clone()
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stdout)))
}

/// A daemon the test started, killed if the test ends (or panics) without stopping it.
struct Daemon(Option<Child>);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn stop(mut d: Daemon, clean: bool) {
    let mut daemon = d.0.take().unwrap();
    if clean {
        let _ = Command::new("kill")
            .args(["-TERM", &daemon.id().to_string()])
            .status();
    } else {
        daemon.kill().unwrap();
    }
    daemon.wait().unwrap();
}

/// Change one byte of the text of turn 1 (seq 3: after `room_created` and turn 0) in place.
fn flip_a_byte(journal: &Path) {
    let mut bytes = std::fs::read(journal).unwrap();
    let at = bytes
        .windows(11)
        .position(|w| w == b"turn-1-text")
        .expect("turn 1 is in the journal");
    bytes[at + 5] = b'X';
    std::fs::write(journal, bytes).unwrap();
}

/// The end of the last record (the journal is preallocated with zeros after it).
fn records_end(journal: &Path) -> u64 {
    let bytes = std::fs::read(journal).unwrap();
    bytes.iter().rposition(|&b| b == b'\n').unwrap() as u64 + 1
}

fn refused_code(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(1), "{}", stderr(o));
    json(o)["refusal"]["code"].as_str().unwrap().to_string()
}

/// Quarantine, then the owner's way out: a refused rebuild changes nothing, an accepted loss
/// is recorded in the journal and the room takes turns again.
fn refuse_then_accept(env: &Env, token: &str, missing: (u64, u64)) {
    let journal = env.journal();
    let before = std::fs::read(&journal).unwrap();
    let said = env.run(&["say", "r", "onto a broken chain", "--json"], Some(token));
    assert_eq!(refused_code(&said), "room_quarantined");
    assert!(stderr(&said).contains("room index rebuild r --accept-loss"));
    let rebuilt = env.run(&["index", "rebuild", "r", "--json"], None);
    assert_eq!(refused_code(&rebuilt), "journal_loss_unaccepted");
    let detail = &json(&rebuilt)["refusal"]["detail"];
    assert_eq!(
        (
            detail["missing_from"].as_u64(),
            detail["missing_to"].as_u64()
        ),
        (Some(missing.0), Some(missing.1)),
        "{detail}"
    );
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        before,
        "refused calls change nothing"
    );
    assert!(env.room_listed()["quarantined"].is_object());

    let accepted = env.run(
        &[
            "index",
            "rebuild",
            "r",
            "--accept-loss",
            "--json",
            "--progress",
        ],
        None,
    );
    assert!(accepted.status.success(), "{}", stderr(&accepted));
    // --progress says what is rebuilt and when it is done, on stderr (stdout stays the answer)
    let said = stderr(&accepted);
    assert!(
        said.contains("rebuilding the index of r from its journal (")
            && said.contains("rebuilt the index of r in"),
        "{said}"
    );
    let a = json(&accepted);
    assert_eq!(a["loss_accepted"]["missing_from"], missing.0);
    assert_eq!(a["loss_accepted"]["missing_to"], missing.1);
    let text = std::fs::read_to_string(&journal).unwrap();
    assert!(text.contains("\"kind\":\"journal_loss\""), "{text}");
    assert!(text.contains(&format!("\"missing_from\":{}", missing.0)));
    assert!(env.room_listed()["quarantined"].is_null());
    // the loss reset the view: alpha reads again, then works on
    let blind = env.run(&["say", "r", "after", "--json"], Some(token));
    let receipt = json(&blind)["refusal"]["detail"]["next_page"]["receipt"]
        .as_str()
        .map(String::from);
    if let Some(receipt) = receipt {
        assert!(
            env.run(&["sync", "r", "--confirm", &receipt], Some(token))
                .status
                .success()
        );
    }
    let said = env.run(&["say", "r", "after"], Some(token));
    assert!(said.status.success(), "{}", stderr(&said));
}

#[test]
fn a_flipped_byte_quarantines_the_room_at_the_open_after_an_unclean_stop() {
    let env = Env::new();
    let (daemon, token) = env.with_three_turns();
    // a clean stop empties the commit log; a byte flipped in what it held would be put back
    // by the replay (the log's checksummed copy of an acknowledged append wins)
    stop(daemon, true);
    let daemon = env.serve();
    stop(daemon, false);
    flip_a_byte(&env.journal());

    let verified = env.run(&["verify", "r", "--json"], None);
    assert_eq!(verified.status.code(), Some(1));
    let error = json(&verified)["rooms"][0]["error"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(error.contains("record 3"), "{error}");

    let daemon = env.serve();
    let listed = env.room_listed();
    assert!(
        listed["quarantined"]["reason"]
            .as_str()
            .unwrap()
            .contains("record 3"),
        "{listed}"
    );
    // the damaged record and everything after it is what the owner accepts losing
    refuse_then_accept(&env, &token, (3, 4));
    stop(daemon, true);
    let verified = env.run(&["verify", "r", "--json"], None);
    assert!(verified.status.success(), "{}", stderr(&verified));
}

#[test]
fn a_flipped_byte_after_a_clean_stop_is_found_by_the_scrub() {
    let env = Env::new();
    let (daemon, token) = env.with_three_turns();
    // push turn 1 out of the trailing 4 KiB the reconciliation compares (seqs 5..=10)
    let long = "y".repeat(1000);
    for _ in 0..6 {
        assert!(env.run(&["say", "r", &long], Some(&token)).status.success());
    }
    stop(daemon, true);
    // a clean start verifies what the last run appended, and a clean stop records that
    let daemon = env.serve();
    assert!(env.room_listed()["quarantined"].is_null());
    stop(daemon, true);
    flip_a_byte(&env.journal());
    let daemon = env.serve();
    // so this open verifies nothing before the damage; the scrub reads the whole chain within
    // its first ticks
    let mut listed = env.room_listed();
    for _ in 0..100 {
        if listed["quarantined"].is_object() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        listed = env.room_listed();
    }
    assert!(
        listed["quarantined"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("scrub") && r.contains("record 3")),
        "{listed}"
    );
    let said = env.run(&["say", "r", "onto a broken chain", "--json"], Some(&token));
    assert_eq!(refused_code(&said), "room_quarantined");
    // quarantine is remembered: a restart verifies the whole chain and finds it again
    stop(daemon, true);
    let daemon = env.serve();
    assert!(env.room_listed()["quarantined"].is_object());
    refuse_then_accept(&env, &token, (3, 10));
    stop(daemon, true);
}

#[test]
fn after_an_unclean_stop_the_commit_log_puts_back_what_a_power_cut_took_from_the_journal() {
    let env = Env::new();
    let (daemon, token) = env.with_three_turns();
    stop(daemon, false);
    // the journal itself was never synced past its creation: a power cut may take any of it
    let journal = env.journal();
    let end = records_end(&journal);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap();
    f.set_len(end - 50).unwrap();
    drop(f);

    let verified = env.run(&["verify", "r", "--json"], None);
    assert!(verified.status.success(), "{}", stderr(&verified));
    assert!(
        stderr(&verified).contains("put back"),
        "{}",
        stderr(&verified)
    );
    assert_eq!(json(&verified)["rooms"][0]["records"], 4);
    let daemon = env.serve();
    let listed = env.room_listed();
    assert!(listed["quarantined"].is_null(), "{listed}");
    assert_eq!(listed["tip_seq"], 4, "{listed}");
    let said = env.run(&["say", "r", "after the crash"], Some(&token));
    assert!(said.status.success(), "{}", stderr(&said));
    stop(daemon, true);
}

#[test]
fn a_cut_acknowledged_record_is_a_loss_verify_names_and_rebuild_will_not_hide() {
    let env = Env::new();
    let (daemon, token) = env.with_three_turns();
    stop(daemon, true);
    // cut the last 50 bytes of the last acknowledged record (seq 4)
    let journal = env.journal();
    let end = records_end(&journal);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap();
    f.set_len(end - 50).unwrap();
    drop(f);

    let verified = env.run(&["verify", "r", "--json"], None);
    assert_eq!(verified.status.code(), Some(1), "{}", stderr(&verified));
    let room = &json(&verified)["rooms"][0];
    assert_eq!(room["ok"], false, "{room}");
    assert_eq!(
        (room["missing_from"].as_u64(), room["missing_to"].as_u64()),
        (Some(4), Some(4)),
        "{room}"
    );
    assert_eq!(room["records"], 3);

    let daemon = env.serve();
    let listed = env.room_listed();
    assert_eq!(
        listed["quarantined"]["missing"],
        serde_json::json!([4, 4]),
        "{listed}"
    );
    refuse_then_accept(&env, &token, (4, 4));
    stop(daemon, true);
    let verified = env.run(&["verify", "r", "--json"], None);
    assert!(
        verified.status.success(),
        "{}",
        String::from_utf8_lossy(&verified.stdout)
    );
}

/// A journal replaced by a copy of itself (same bytes, another inode) verifies and holds every
/// acknowledged record: a rotation. The room refuses writes with `room_sync_journal_rotated`
/// (writing nothing) until the owner accepts it with `room index rebuild`.
#[test]
fn a_replaced_journal_that_verifies_is_a_rotation_refused_until_rebuilt() {
    let env = Env::new();
    let (daemon, token) = env.with_three_turns();
    stop(daemon, true);
    let journal = env.journal();
    let bytes = std::fs::read(&journal).unwrap();
    // the copy is written while the original still exists, then renamed over it: removing
    // first would let the file system hand the copy the freed inode number again (ext4 does),
    // and a replaced file with the same (dev, ino) is no rotation anyone could see
    let copy = journal.with_extension("copy");
    std::fs::write(&copy, &bytes).unwrap();
    std::fs::rename(&copy, &journal).unwrap();
    let daemon = env.serve();
    let said = env.run(
        &["say", "r", "onto a rotated journal", "--json"],
        Some(&token),
    );
    assert_eq!(refused_code(&said), "room_sync_journal_rotated");
    assert_eq!(
        std::fs::read(&journal).unwrap(),
        bytes,
        "the refused turn wrote nothing"
    );
    let rebuilt = env.run(&["index", "rebuild", "r"], None);
    assert!(rebuilt.status.success(), "{}", stderr(&rebuilt));
    // the rebuilt room is a new view: read it and act in one call
    let said = env.run(&["say", "r", "after the rebuild", "--json"], Some(&token));
    assert_eq!(refused_code(&said), "room_sync_view_changed");
    let receipt = json(&said)["refusal"]["detail"]["next_page"]["receipt"]
        .as_str()
        .unwrap()
        .to_string();
    let said = env.run(
        &["say", "r", "after the rebuild", "--read-through", &receipt],
        Some(&token),
    );
    assert!(said.status.success(), "{}", stderr(&said));
    stop(daemon, true);
}

/// `room index rebuild` onto a shorter journal reconciles the task rows and leases with what
/// the journal still holds, and the fencing number never goes back: a claim after the rebuild
/// and a restart gets a generation above every one handed out before (the lost claim's too).
#[test]
fn a_rebuild_onto_a_shorter_journal_reconciles_tasks_and_never_reissues_a_fencing_number() {
    let env = Env::new();
    assert!(env.run(&["init"], None).status.success());
    let daemon = env.serve();
    let enrolled = env.run(
        &[
            "agent",
            "enroll",
            "alpha",
            "--max-tier",
            "coordinator",
            "--json",
        ],
        None,
    );
    let token = json(&enrolled)["token"].as_str().unwrap().to_string();
    assert!(
        env.run(&["create", "r", "--member", "alpha"], None)
            .status
            .success()
    );
    let task = |title: &str| -> String {
        let made = env.run(
            &[
                "task",
                "create",
                "r",
                title,
                "--to",
                "alpha",
                "--scope",
                &format!("file:{title}"),
                "--json",
            ],
            Some(&token),
        );
        assert!(made.status.success(), "{}", stderr(&made));
        json(&made)["task"]["id"].as_str().unwrap().to_string()
    };
    let claim = |id: &str| -> u64 {
        let c = env.run(&["task", "claim", id, "--json"], Some(&token));
        assert!(c.status.success(), "{}", stderr(&c));
        json(&c)["lease"]["generation"].as_u64().unwrap()
    };
    let kept = task("kept");
    assert_eq!(claim(&kept), 1);
    let journal = env.journal();
    let cut = records_end(&journal);
    let lost = task("lost");
    assert_eq!(claim(&lost), 2);
    stop(daemon, true);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&journal)
        .unwrap();
    f.set_len(cut).unwrap();
    drop(f);

    let daemon = env.serve();
    let accepted = env.run(&["index", "rebuild", "r", "--accept-loss", "--json"], None);
    assert!(accepted.status.success(), "{}", stderr(&accepted));
    let shown = env.run(&["task", "show", &kept, "--json"], Some(&token));
    let shown = json(&shown);
    assert_eq!(shown["task"]["status"], "claimed", "{shown}");
    assert_eq!(shown["lease"]["generation"], 1, "{shown}");
    let gone = env.run(&["task", "show", &lost, "--json"], Some(&token));
    assert_eq!(refused_code(&gone), "task_not_found");
    // a restart forgets the daemon's own high-water mark; the store's floor remains
    stop(daemon, true);
    let _daemon = env.serve();
    let next = task("next");
    assert_eq!(claim(&next), 3, "generation 2 was handed out once already");
}
