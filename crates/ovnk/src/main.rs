//! `ovnk`: one binary, one subcommand per role.

use clap::{Parser, Subcommand};

/// Replica building and transaction encoding allocate many small objects; mimalloc is
/// markedly faster at that than the system allocator.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod demo;
mod roles;

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
    /// Cluster manager: allocates node IDs, node subnets, transit and join addresses.
    ClusterManager(roles::ClusterManagerRoleArgs),
    /// The node agent: local OVS settings, this node's OVN zone, remote nodes, pods, egress.
    Node(roles::NodeRoleArgs),
    /// Print ovnk's CustomResourceDefinitions as YAML (pipe to `kubectl apply -f -`).
    Crds,
    /// Offline: the zones of a node and the remote nodes it connects to, from a directory of
    /// YAML manifests (Nodes with their labels and annotations, TrustZones).
    Plan(PlanArgs),
    /// A cluster on one machine, for development and tests.
    #[command(subcommand)]
    Sandbox(sandbox::cli::Command),
}

#[derive(clap::Args, Debug)]
struct PlanArgs {
    /// Directory of YAML/JSON manifests (not recursive).
    #[arg(long)]
    manifests: std::path::PathBuf,
    /// The node to plan for.
    #[arg(long)]
    node: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

fn plan(a: PlanArgs) -> anyhow::Result<()> {
    let set = zones::manifests::load_dir(&a.manifests)?;
    let p = zones::manifests::plan(&set, &a.node)?;
    if a.json {
        println!("{}", serde_json::to_string(&p)?);
    } else {
        for w in &p.warnings {
            eprintln!("warning: {w}");
        }
        println!("node:  {}", p.node);
        println!(
            "zones: {}",
            if p.zones.is_empty() {
                "(none)".to_owned()
            } else {
                p.zones.join(", ")
            }
        );
        println!(
            "peers: {}",
            if p.peers.is_empty() {
                "(none)".to_owned()
            } else {
                p.peers.join(", ")
            }
        );
    }
    Ok(())
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
        Command::Node(a) => rt.block_on(roles::run_node(a)),
        Command::Identity(a) => Ok(rt.block_on(identity::cli::run(a))?),
        Command::Plan(a) => plan(a),
        Command::ClusterManager(a) => rt.block_on(roles::run_cluster_manager(a)),
        Command::Crds => {
            for (i, (_, yaml)) in k8s_api::crd_manifests()?.into_iter().enumerate() {
                if i > 0 {
                    println!("---");
                }
                print!("{yaml}");
            }
            Ok(())
        }
        Command::Sandbox(c) => rt.block_on(sandbox::cli::run(c)),
    }
}
