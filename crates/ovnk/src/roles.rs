//! The `node` and `cluster-manager` roles: each runs its controllers side by side in one
//! process, as the DaemonSet / Deployment would.
//!
//! - `ovnk node` = the node agent (`crates/node`) + the ServiceFWMark node controller
//!   (`crates/fwmark`), both under the node's identity. With `--bootstrap-kubeconfig` and
//!   `--cert-dir` that identity is a per-node client certificate from the certificate manager
//!   (`crates/identity`): the controllers start once a certificate exists and are restarted
//!   in-process with a client for each new certificate (their state lives in the databases and
//!   the kernel, so a restart changes nothing — the sandbox's SIGKILL test shows it); an expired
//!   or not-yet-valid certificate (suspend, clock jump) ends the process with an error.
//! - `ovnk cluster-manager` = allocations and TrustZone status (`crates/cluster-manager`) + the
//!   single writer of ServiceFWMark status (`crates/fwmark`).

use std::sync::Arc;

use anyhow::Context;
use kube::Client;

/// `ovnk node` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct NodeRoleArgs {
    #[command(flatten)]
    pub node: node::NodeArgs,
    #[command(flatten)]
    pub certs: identity::certmgr::NodeCertArgs,
    #[command(flatten)]
    pub fwmark: fwmark::FwmarkArgs,
}

async fn client_from(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    Ok(match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            Client::try_from(cfg)?
        }
        None => Client::try_default().await?,
    })
}

async fn run_controllers(client: Client, a: &NodeRoleArgs) -> anyhow::Result<()> {
    let runner = match &a.node.netns {
        Some(ns) => fwmark::exec::Runner::in_netns(ns.clone())?,
        None => fwmark::exec::Runner::host(),
    };
    let node_name = a.node.node.clone();
    let fw = fwmark::run_node_with(client.clone(), node_name, a.fwmark.clone(), runner);
    tokio::try_join!(
        async { node::run_with(client.clone(), a.node.clone()).await },
        async { fw.await.context("ServiceFWMark node controller") },
    )?;
    Ok(())
}

/// Runs `ovnk node`.
pub async fn run_node(a: NodeRoleArgs) -> anyhow::Result<()> {
    identity::install_crypto_provider();
    let Some((mgr, bootstrap)) = a
        .certs
        .manager(&a.node.node)
        .await
        .context("setting up the node certificate manager")?
    else {
        let client = client_from(a.node.kubeconfig.as_deref()).await?;
        return run_controllers(client, &a).await;
    };
    let mgr = Arc::new(mgr);
    let first = mgr
        .start()
        .await
        .context("obtaining the node's client certificate")?;
    let cert_file = mgr.config().current_path();
    let mut certs = mgr.subscribe();
    let mut rotation = {
        let m = mgr.clone();
        tokio::spawn(async move { m.run(first).await })
    };
    loop {
        let cfg = identity::certmgr::config_with_cert_file(&bootstrap, &cert_file);
        let client = Client::try_from(cfg).context("building a client for the node certificate")?;
        tracing::info!(cert = %cert_file.display(), "controllers running with the node's client certificate");
        tokio::select! {
            r = run_controllers(client, &a) => return r,
            changed = certs.changed() => {
                if changed.is_err() {
                    anyhow::bail!("the certificate manager stopped");
                }
                tracing::info!("new client certificate: restarting the controllers with it");
            }
            r = &mut rotation => {
                return match r {
                    Ok(Ok(())) => Err(anyhow::anyhow!("the certificate manager stopped")),
                    Ok(Err(e)) => Err(anyhow::anyhow!("node client certificate: {e}")),
                    Err(e) => Err(anyhow::anyhow!("certificate manager task: {e}")),
                };
            }
        }
    }
}

/// `ovnk cluster-manager` flags.
#[derive(clap::Args, Debug)]
pub struct ClusterManagerRoleArgs {
    #[command(flatten)]
    pub cm: cluster_manager::ClusterManagerArgs,
    /// How often the ServiceFWMark status writer re-checks every object.
    #[arg(long, env = "OVNK_FWMARK_STATUS_RESYNC", default_value = "300s", value_parser = fwmark::config::parse_duration)]
    pub fwmark_status_resync: std::time::Duration,
    /// Do not run the ServiceFWMark status writer here.
    #[arg(long, env = "OVNK_NO_FWMARK_STATUS")]
    pub no_fwmark_status: bool,
}

/// Runs `ovnk cluster-manager`.
pub async fn run_cluster_manager(a: ClusterManagerRoleArgs) -> anyhow::Result<()> {
    if a.no_fwmark_status {
        return cluster_manager::run(a.cm).await;
    }
    let client = a.cm.kube_client().await?;
    let status = fwmark::run_status_writer(client, a.fwmark_status_resync);
    tokio::select! {
        r = cluster_manager::run(a.cm) => r,
        _ = status => Err(anyhow::anyhow!("the ServiceFWMark status writer stopped")),
    }
}
