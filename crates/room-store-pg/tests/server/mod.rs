//! A private PostgreSQL server for one test: `initdb` in a temporary directory, `pg_ctl`
//! on a free loopback port, stopped when dropped (Debian's binaries under
//! `/usr/lib/postgresql/<version>/bin`; as root they run as the `postgres` user, which
//! initdb requires). `ROOM_TEST_PG_URL` (libpq's `key=value` form without `dbname`) uses that server
//! instead.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

pub struct Server {
    /// `host=SOCKET_DIR port=PORT user=postgres` (no database).
    base: String,
    dir: Option<tempfile::TempDir>,
    bin: PathBuf,
    as_root: bool,
    /// The server's options (`pg_ctl -o`), kept for a restart.
    opts: String,
}

static DATABASES: AtomicU32 = AtomicU32::new(0);

/// The newest installed server's binaries.
fn binaries() -> PathBuf {
    if let Some(b) = std::env::var_os("ROOM_TEST_PG_BIN") {
        return PathBuf::from(b);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .expect("no PostgreSQL server here\nhint: scripts/test installs Debian's postgresql (apt-get install postgresql)")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Server {
    pub fn start() -> Server {
        if let Ok(url) = std::env::var("ROOM_TEST_PG_URL") {
            return Server {
                base: url,
                dir: None,
                bin: PathBuf::new(),
                as_root: false,
                opts: String::new(),
            };
        }
        let bin = binaries();
        let as_root = rustix_euid_is_root();
        let dir = tempfile::Builder::new()
            .prefix("room-pg-")
            .tempdir()
            .unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        if as_root {
            // the server refuses to run as root: its directory goes to `postgres`
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
            let ok = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success();
            assert!(ok, "chown to postgres");
        }
        // only through a Unix socket in a directory no one else may enter: the server trusts
        // whoever reaches it
        let port = free_port();
        let sock = dir.path().display().to_string();
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        }
        let mut s = Server {
            base: format!("host={sock} port={port} user=postgres"),
            dir: Some(dir),
            bin,
            as_root,
            opts: String::new(),
        };
        s.pg(&[
            "initdb",
            "-D",
            &data.display().to_string(),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
        ]);
        s.opts = format!("-p {port} -c listen_addresses='' -k {sock} -c fsync=on");
        s.up();
        s
    }

    /// Start the server (again).
    fn up(&self) {
        let data = self.data().expect("a server this test started");
        let log = data.with_file_name("log");
        self.pg(&[
            "pg_ctl",
            "-D",
            &data.display().to_string(),
            "-o",
            &self.opts,
            "-l",
            &log.display().to_string(),
            "-w",
            "start",
        ]);
    }

    /// Stop the server as a crash would (`immediate`: no checkpoint), leave it down for
    /// `down`, and start it again: what a restart mid-load looks like to its clients.
    pub fn crash_and_restart(&self, down: std::time::Duration) {
        let data = self.data().expect("a server this test started");
        self.pg(&[
            "pg_ctl",
            "-D",
            &data.display().to_string(),
            "-m",
            "immediate",
            "-w",
            "stop",
        ]);
        std::thread::sleep(down);
        self.up();
    }

    /// Run one of the server's programs (as `postgres` when this test is root).
    fn pg(&self, args: &[&str]) {
        let program = self.bin.join(args[0]);
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let out = cmd.args(&args[1..]).output().unwrap();
        assert!(
            out.status.success(),
            "{}: {}{}",
            args[0],
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// A new, empty database on the server: its url.
    pub fn fresh_database(&self) -> String {
        let n = DATABASES.fetch_add(1, Ordering::SeqCst);
        let name = format!("room_test_{}_{n}", std::process::id());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let base = format!("{} dbname=postgres", self.base);
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&base, tokio_postgres::NoTls)
                .await
                .expect("the test server answers");
            let task = tokio::spawn(conn);
            client
                .batch_execute(&format!("CREATE DATABASE {name}"))
                .await
                .unwrap();
            drop(client);
            let _ = task.await;
        });
        format!("{} dbname={name}", self.base)
    }

    fn data(&self) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.path().join("data"))
    }
}

fn rustix_euid_is_root() -> bool {
    rustix::process::geteuid().is_root()
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(data) = self.data() {
            let program = self.bin.join("pg_ctl");
            let mut cmd = if self.as_root {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&program);
                c
            } else {
                Command::new(&program)
            };
            let _ = cmd
                .args(["-D", &data.display().to_string(), "-m", "immediate", "stop"])
                .output();
        }
    }
}
