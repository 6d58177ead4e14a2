//! `ovnk`: one binary, one subcommand per role.

use clap::{Parser, Subcommand};

/// Replica building and transaction encoding allocate many small objects; mimalloc is
/// markedly faster at that than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod demo;

#[derive(Parser, Debug)]
#[command(
    name = "ovnk",
    version,
    about = "OVN-Kubernetes-compatible control plane for OVN Interconnect clusters"
)]
struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info,ovsdb=debug`.
    #[arg(long, env = "OVNK_LOG", default_value = "info", global = true)]
    log: String,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// A narrated walkthrough on real OVN daemons (the README's main job).
    Demo(demo::DemoArgs),
    /// Node identity (ovnkube-identity): the admission webhook and the CSR approver.
    Identity(identity::cli::IdentityArgs),
    /// The node agent: local OVS settings, this node's OVN zone, remote nodes, pods, egress.
    Node(node::NodeArgs),
    /// Print ovnk's CustomResourceDefinitions as YAML (pipe to `kubectl apply -f -`).
    Crds,
    /// A cluster on one machine, for development and tests.
    #[command(subcommand)]
    Sandbox(SandboxCommand),
}

#[derive(Subcommand, Debug)]
enum SandboxCommand {
    #[command(flatten)]
    Apiserver(apiserver::cli::Command),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&cli.log))
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Demo(a) => rt.block_on(demo::run(a)),
        Command::Node(a) => rt.block_on(node::run(a)),
        Command::Identity(a) => Ok(rt.block_on(identity::cli::run(a))?),
        Command::Crds => {
            for (i, (_, yaml)) in k8s_api::crd_manifests()?.into_iter().enumerate() {
                if i > 0 {
                    println!("---");
                }
                print!("{yaml}");
            }
            Ok(())
        }
        Command::Sandbox(SandboxCommand::Apiserver(c)) => rt.block_on(apiserver::cli::run(c)),
    }
}
