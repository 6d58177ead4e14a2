//! The `ovnk-bench apiserver-watch` bench, runnable without building the whole bench binary:
//! `cargo run --release -p ovnk-apiserver --example apiserver_watch -- [--nodes N] ...`.

#[path = "../../bench/src/apiserver_watch.rs"]
mod apiserver_watch;

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: apiserver_watch::Args,
}

fn main() -> anyhow::Result<()> {
    apiserver_watch::run(Cli::parse().args)
}
