//! `ovnk-bench <area>`: benchmarks that measure ovnk against a baseline in the same run.
//!
//! Every subcommand prints human-readable lines and, as its very last line, one JSON object
//! with its figures (the checking contract of the project's issues).

use clap::{Parser, Subcommand};

/// Replica building and transaction encoding allocate many small objects; mimalloc is
/// markedly faster at that than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod apiserver_watch;
mod fwmark;
mod ovsdb;
mod sandbox;
mod webhook;
mod zones;
mod zones_sandbox;

#[derive(Parser, Debug)]
#[command(
    name = "ovnk-bench",
    version,
    about = "ovnk benchmarks (each ends with one JSON line)"
)]
struct Cli {
    #[command(subcommand)]
    area: Area,
}

#[derive(Subcommand, Debug)]
enum Area {
    /// Embedded API server watch fan-out: 5,000 Nodes, 20 watchers, 1,000 label updates.
    ApiserverWatch(apiserver_watch::Args),
    /// OVSDB client vs ovn-sbctl / ovsdb-client dump / a raw-socket floor (issue 2).
    Ovsdb(ovsdb::Args),
    /// ServiceFWMark: nft vs iptables programming time and packet rate at 10,000 sources.
    Fwmark(fwmark::Args),
    /// `ovnk sandbox`: up time for 10 nodes, pod create → reachable, per-node memory (issue 4).
    Sandbox(sandbox::Args),
    /// Admission webhook throughput/latency vs a bare rustls+hyper server (issue 6).
    Webhook(webhook::Args),
    /// Trust/transport zones, node side: plan time, index update, OVSDB ops per label change (issue 5).
    Zones(zones::Args),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.area {
        Area::ApiserverWatch(a) => apiserver_watch::run(a),
        Area::Ovsdb(a) => ovsdb::run(a),
        Area::Fwmark(a) => fwmark::run(a),
        Area::Webhook(a) => webhook::run(a),
        Area::Sandbox(a) => sandbox::run(a),
        Area::Zones(a) => zones::run(a),
    }
}
