//! The `room` command: owner console, agent verbs, the daemon, the demo and the bench.
//! Exit status: 0 done, 1 refused (`error[CODE]` on stderr), 2 usage, 3 daemon unreachable or
//! I/O failure, 4 the state directory is invalid or already served.

mod bench;
mod bench_mcp;
mod cmd;
mod connect;
mod demo;
mod mcp_cmd;

use clap::Parser;

fn main() {
    let cli = cmd::Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("ROOM_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::env::var_os("NO_COLOR").is_none())
        .init();
    std::process::exit(cmd::run(cli));
}
