//! `ovnk`: one binary, one subcommand per role.

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(name = "ovnk", version, about = "OVN-Kubernetes-compatible control plane for OVN Interconnect clusters")]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info,ovsdb=debug`.
    #[arg(long, env = "OVNK_LOG", default_value = "info", global = true)]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    match cli.command {}
}
