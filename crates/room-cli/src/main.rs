//! The `room` command: owner console, agent verbs, the daemon, the demo and the bench.
//! Exit status: 0 done, 1 refused (`error[CODE]` on stderr), 2 usage, 3 daemon unreachable or
//! I/O failure, 4 the state directory is invalid or already served.

mod agent_script;
mod api;
mod audit_html;
mod bench;
mod bench_accept;
mod bench_collab;
mod bench_dashboard;
mod bench_mcp;
mod bench_pg;
mod bench_search;
mod bench_wakes;
mod cmd;
mod collab;
mod connect;
mod demo;
mod demo_collab;
mod doctor;
mod mcp_cmd;
mod mcp_http;
mod migrate;
mod native;
mod probe;
mod prove;
mod snapshot;

use clap::Parser;

/// jemalloc instead of glibc's malloc: the daemon runs each call on one of up to 64 threads
/// and allocates many short-lived JSON buffers; under `room bench swarm` glibc spent about a
/// tenth of the daemon's CPU in its arenas (consolidating fast bins), and jemalloc served
/// 10–45 % more calls per second at 100 and 500 agents for about 10 % more resident memory.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    // everything room creates (state dir, journals, control.db, bootstrap) is the owner's alone
    room_server::daemon::private_umask();
    let cli = cmd::Cli::parse();
    // `room prove` drives its own daemon into the refusals and damage it checks: the card
    // reports each, and the daemon's log lines about them would read as trouble here
    let quiet = if matches!(cli.cmd, cmd::Cmd::Prove { .. }) {
        "off"
    } else {
        "warn"
    };
    let filter =
        tracing_subscriber::EnvFilter::try_from_env("ROOM_LOG").unwrap_or_else(|_| quiet.into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::env::var_os("NO_COLOR").is_none())
        .init();
    std::process::exit(cmd::run(cli));
}
