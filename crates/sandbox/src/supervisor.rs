//! The long-lived supervisor (`ovnk sandbox supervise`, started by `up`): one process that
//! owns every daemon of the sandbox in the foreground, serves the embedded API server, runs
//! the kubelet and the kube-controller-manager share, restarts node agents and the cluster
//! manager when they exit (as a kubelet restarts a DaemonSet pod), and tears everything down
//! on SIGTERM/SIGINT.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use ovn_model::TypedCache;
use ovn_model::tables::Interface;
use tokio::process::Command;

use crate::kubelet::{Kubelet, KubeletNode};
use crate::layout::{self, PHYS_BRIDGE};
use crate::netns;
use crate::procs::Procs;
use crate::stack::{self, NodeSpec};
use crate::state::{self, SandboxState};

/// Runs the supervisor for the sandbox described in `DIR/sandbox.json`.
pub async fn supervise(dir: &Path) -> anyhow::Result<()> {
    let st = SandboxState::load(dir)?;
    let layout = st.layout.clone();
    std::fs::write(
        state::supervisor_pid_file(dir),
        format!("{}\n", std::process::id()),
    )?;
    let procs = Arc::new(Procs::new(dir, layout.pid_dir())?);
    let result = run(&st, procs.clone()).await;
    if let Err(e) = &result {
        state::progress(dir, &format!("error {e:#}"));
    }
    result
}

async fn run(st: &SandboxState, procs: Arc<Procs>) -> anyhow::Result<()> {
    let layout = &st.layout;
    let dir = &layout.dir;
    let started = std::time::Instant::now();

    apiserver::install_crypto_provider();
    state::progress(dir, "step starting the embedded Kubernetes API server");
    let mut cfg = apiserver::ServerConfig::with_dir(layout.apiserver_dir());
    cfg.write_admin_kubeconfig = false;
    cfg.min_csr_expiration_seconds = st.node_cert_seconds.min(600);
    let server = apiserver::ApiServer::start(cfg)
        .await
        .context("starting the embedded API server")?;
    std::fs::write(
        layout.kubeconfig(),
        server.kubeconfig_yaml("kubernetes-admin", &["system:masters".to_owned()])?,
    )?;
    let admin = server.admin_client().await?;
    install_rbac(&admin).await?;
    install_crds(&admin).await?;

    state::progress(dir, "step creating the fabric and external namespaces");
    stack::create_fabric(layout).await?;
    let external = crate::kubelet::serve_external(&layout.external_netns()).await?;

    let specs: Vec<NodeSpec> = st
        .nodes
        .iter()
        .filter_map(|n| layout::node_index(n))
        .map(|k| NodeSpec::new(layout, k))
        .collect();
    state::progress(
        dir,
        &format!(
            "step starting {} nodes (NB/SB/conf ovsdb-server, ovn-northd, ovs-vswitchd, ovn-controller each)",
            specs.len()
        ),
    );
    let starts = specs.iter().map(|s| {
        let procs = procs.clone();
        async move {
            stack::start_node(layout, &procs, s)
                .await
                .with_context(|| format!("starting {}", s.name))?;
            state::progress(
                &layout.dir,
                &format!("step {} OVN stack up ({})", s.name, s.ip),
            );
            anyhow::Ok(())
        }
    });
    for r in futures::future::join_all(starts).await {
        r?;
    }

    state::progress(
        dir,
        "step registering Nodes and starting the cluster manager and node agents",
    );
    for s in &specs {
        register_node(&admin, s).await?;
        // the node's bootstrap (kubelet) identity; the agent trades it for a per-node client
        // certificate (system:ovn-node:<node>) through a CSR the identity service approves
        std::fs::write(
            s.dir.join("bootstrap.kubeconfig"),
            server.kubeconfig_yaml(
                &format!("system:node:{}", s.name),
                &["system:nodes".to_owned()],
            )?,
        )?;
    }
    let bin = std::env::current_exe().context("finding the ovnk binary")?;
    let mut restarters = Vec::new();

    // node identity: the admission webhook (and the CSR approver), as on a real cluster
    state::progress(
        dir,
        "step starting ovnk identity (admission webhook, CSR approver)",
    );
    let webhook = start_identity(layout, &procs, &bin, &mut restarters).await?;
    register_webhooks(&admin, &webhook).await?;
    {
        let kubeconfig = layout.kubeconfig();
        let bin = bin.clone();
        let log = dir.join("cluster-manager.log");
        restarters.push(tokio::spawn(keep_running(
            procs.clone(),
            "cluster-manager".to_owned(),
            move || {
                let mut c = Command::new(&bin);
                c.arg("cluster-manager")
                    .arg("--kubeconfig")
                    .arg(&kubeconfig);
                c
            },
            log,
        )));
    }
    for s in &specs {
        let bin = bin.clone();
        let s2 = s.clone();
        restarters.push(tokio::spawn(keep_running(
            procs.clone(),
            format!("{}-agent", s.name),
            {
                let secs = st.node_cert_seconds;
                move || {
                    let mut c = agent_command(&bin, &s2);
                    c.arg("--cert-duration").arg(format!("{secs}s"));
                    c
                }
            },
            s.dir.join("agent.log"),
        )));
    }

    // the kubelet, with a replica of each node's Open_vSwitch database
    let mut knodes = Vec::new();
    let mut ovs_dbs = BTreeMap::new();
    for s in &specs {
        let client = ovsdb::Client::connect(&s.socket("conf"), ovsdb::ClientOptions::default())
            .await
            .with_context(|| format!("{}: connecting to its Open_vSwitch database", s.name))?;
        let db = ovn_model::connect_db(&client, ovn_model::OVS_DB, &ovn_model::ovs_needs()).await?;
        ovs_dbs.insert(s.name.clone(), (client, db.clone()));
        let p = procs.clone();
        let agent = format!("{}-agent", s.name);
        knodes.push(KubeletNode {
            spec: s.clone(),
            ovs: db,
            agent_running: Arc::new(move || p.pid(&agent).is_some()),
        });
    }
    let kubelet = Kubelet::new(layout.clone(), admin.clone(), knodes);
    let kubelet_task = tokio::spawn(kubelet.clone().run());
    let kcm_task = tokio::spawn(crate::controllers::run(admin.clone()));

    state::progress(
        dir,
        "step waiting for Nodes Ready and the Geneve tunnel mesh",
    );
    let nodes_api = Api::<Node>::all(admin.clone());
    let expected = specs.len().saturating_sub(1);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let ready = count_ready(&nodes_api).await;
        let tunnels: Vec<usize> = ovs_dbs
            .values()
            .map(|(_, db)| geneve_peers(db).len())
            .collect();
        if ready == specs.len() && tunnels.iter().all(|t| *t == expected) {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            anyhow::bail!(
                "the cluster did not become ready within 120s: {ready}/{} Nodes Ready, tunnels per node {tunnels:?} (want {expected}); see {}/nodes/*/agent.log",
                specs.len(),
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // every node learns every other node's underlay address now, so no pod's first packet is
    // dropped while the userspace datapath resolves a tunnel neighbour
    let warm = specs.iter().map(|s| {
        let others: Vec<std::net::Ipv4Addr> = specs
            .iter()
            .filter(|o| o.name != s.name)
            .map(|o| o.ip)
            .collect();
        async move { crate::probe::ping_from(&s.netns, &others, Duration::from_secs(2)).await }
    });
    for r in futures::future::join_all(warm).await {
        if let Err(e) = r {
            tracing::warn!(error = %e, "warming the underlay neighbour caches");
        }
    }
    state::progress(
        dir,
        &format!("ready in {:.1}s", started.elapsed().as_secs_f64()),
    );

    wait_for_signal().await;
    state::progress(dir, "step shutting down");
    kcm_task.abort();
    for r in restarters {
        r.abort();
    }
    procs.stop("cluster-manager", Duration::from_secs(5)).await;
    procs.stop("identity", Duration::from_secs(5)).await;
    for s in &specs {
        procs
            .stop(&format!("{}-agent", s.name), Duration::from_secs(5))
            .await;
    }
    kubelet_task.abort();
    kubelet.unwire_all().await;
    external.abort();
    drop(ovs_dbs);
    let stops = specs.iter().map(|s| stack::stop_node(&procs, &s.name));
    futures::future::join_all(stops).await;
    for ns in netns::list(&layout.netns_prefix()) {
        if let Err(e) = netns::del(&ns).await {
            tracing::warn!(netns = %ns, error = %e, "deleting namespace");
        }
    }
    server.shutdown().await?;
    let _ = std::fs::remove_file(state::supervisor_pid_file(dir));
    state::progress(dir, "stopped");
    Ok(())
}

/// Where the sandbox's identity webhook listens and the CA that signed its certificate.
struct Webhook {
    host_port: String,
    ca_pem: String,
}

/// Starts `ovnk identity` (kept running) with a serving certificate for 127.0.0.1 and waits
/// until it accepts connections.
async fn start_identity(
    layout: &crate::layout::Layout,
    procs: &Arc<Procs>,
    bin: &Path,
    restarters: &mut Vec<tokio::task::JoinHandle<()>>,
) -> anyhow::Result<Webhook> {
    let cert_dir = layout.dir.join("identity");
    std::fs::create_dir_all(&cert_dir)?;
    let (ca_pem, crt, key) =
        identity::loadgen::localhost_pki().context("making the webhook's certificate")?;
    std::fs::write(cert_dir.join("tls.crt"), crt)?;
    std::fs::write(cert_dir.join("tls.key"), key)?;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let kubeconfig = layout.kubeconfig();
    let bin = bin.to_owned();
    let log = layout.dir.join("identity.log");
    restarters.push(tokio::spawn(keep_running(
        procs.clone(),
        "identity".to_owned(),
        move || {
            let mut c = Command::new(&bin);
            c.arg("identity")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .arg("--webhook-cert-dir")
                .arg(&cert_dir)
                .args(["--webhook-host", "127.0.0.1", "--webhook-port"])
                .arg(port.to_string())
                .args([
                    "--enable-interconnect",
                    "--node-owned-resource",
                    "tunnelreports.k8s.ovn.org",
                ]);
            c
        },
        log,
    )));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "ovnk identity did not listen on 127.0.0.1:{port} within 20s (see identity.log)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(Webhook {
        host_port: format!("127.0.0.1:{port}"),
        ca_pem,
    })
}

async fn register_webhooks(admin: &kube::Client, w: &Webhook) -> anyhow::Result<()> {
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
    let api = Api::<ValidatingWebhookConfiguration>::all(admin.clone());
    let pp = PatchParams::apply("ovnk-sandbox").force();
    for vwc in identity::manifests::webhook_configurations(w.ca_pem.as_bytes(), &w.host_port)? {
        let name = vwc.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(&vwc))
            .await
            .with_context(|| format!("registering webhook {name}"))?;
    }
    Ok(())
}

fn agent_command(bin: &Path, s: &NodeSpec) -> Command {
    let mut c = Command::new(bin);
    c.arg("node")
        .arg("--node")
        .arg(&s.name)
        .arg("--bootstrap-kubeconfig")
        .arg(s.dir.join("bootstrap.kubeconfig"))
        .arg("--cert-dir")
        .arg(s.dir.join("certs"))
        .arg("--nb-address")
        .arg(s.socket("nb"))
        .arg("--sb-address")
        .arg(s.socket("sb"))
        .arg("--ovs-address")
        .arg(s.socket("conf"))
        .arg("--netns")
        .arg(&s.netns)
        .arg("--encap-ip")
        .arg(s.ip.to_string())
        .arg("--gateway-interface")
        .arg(PHYS_BRIDGE);
    c
}

/// Keeps child `name` running: starts it, and restarts it (after a short backoff) whenever
/// it exits, until this task is aborted.
async fn keep_running(
    procs: Arc<Procs>,
    name: String,
    make: impl Fn() -> Command,
    log: std::path::PathBuf,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        if procs.pid(&name).is_none() {
            let mut cmd = make();
            match procs.spawn(&name, &mut cmd, &log) {
                Ok(pid) => tracing::info!(%name, pid, "started"),
                Err(e) => tracing::error!(%name, error = %e, "could not start"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if let Some(status) = procs.exited(&name) {
            tracing::warn!(%name, %status, "exited; restarting after {backoff:?}");
            procs.forget(&name);
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        } else if procs.pid(&name).is_none() {
            tokio::time::sleep(backoff).await;
        }
    }
}

async fn register_node(admin: &kube::Client, s: &NodeSpec) -> anyhow::Result<()> {
    let api = Api::<Node>::all(admin.clone());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": s.name, "labels": {
            "kubernetes.io/hostname": s.name,
            "kubernetes.io/os": "linux",
        }},
    }))?;
    match api.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => return Err(e).with_context(|| format!("registering Node {}", s.name)),
    }
    set_node_addresses(admin, s).await
}

/// Writes the node's addresses into its status (what a kubelet reports).
pub async fn set_node_addresses(admin: &kube::Client, s: &NodeSpec) -> anyhow::Result<()> {
    let patch = serde_json::json!({"status": {"addresses": [
        {"type": "InternalIP", "address": s.ip.to_string()},
        {"type": "Hostname", "address": s.name},
    ]}});
    Api::<Node>::all(admin.clone())
        .patch_status(&s.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("setting the addresses of Node {}", s.name))?;
    Ok(())
}

async fn count_ready(api: &Api<Node>) -> usize {
    let Ok(list) = api.list(&Default::default()).await else {
        return 0;
    };
    list.items.iter().filter(|n| node_ready(n)).count()
}

/// Whether a Node's `Ready` condition is True.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The remote IPs of the Geneve tunnel interfaces in an Open_vSwitch replica.
pub fn geneve_peers(db: &ovsdb::Db) -> Vec<String> {
    let mut v: Vec<String> = db
        .cache()
        .list::<Interface>()
        .into_iter()
        .filter(|i| i.kind == "geneve")
        .filter_map(|i| i.options.get("remote_ip").cloned())
        .collect();
    v.sort();
    v
}

/// The repository's RBAC manifests, applied as on a real cluster: node identities get exactly
/// what `manifests/identity/rbac.yaml` and `manifests/zones/rbac.yaml` grant.
const RBAC_MANIFESTS: &[(&str, &str)] = &[
    (
        "manifests/identity/rbac.yaml",
        include_str!("../../../manifests/identity/rbac.yaml"),
    ),
    (
        "manifests/zones/rbac.yaml",
        include_str!("../../../manifests/zones/rbac.yaml"),
    ),
];

async fn install_rbac(admin: &kube::Client) -> anyhow::Result<()> {
    use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
    let pp = PatchParams::apply("ovnk-sandbox").force();
    for (file, text) in RBAC_MANIFESTS {
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(text).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
        for doc in docs.into_iter().filter(|d| d.is_object()) {
            let kind = doc["kind"].as_str().unwrap_or_default().to_owned();
            let (group, version, plural, namespaced) = match kind.as_str() {
                "Namespace" => ("", "v1", "namespaces", false),
                "ServiceAccount" => ("", "v1", "serviceaccounts", true),
                "ClusterRole" => ("rbac.authorization.k8s.io", "v1", "clusterroles", false),
                "ClusterRoleBinding" => (
                    "rbac.authorization.k8s.io",
                    "v1",
                    "clusterrolebindings",
                    false,
                ),
                "Role" => ("rbac.authorization.k8s.io", "v1", "roles", true),
                "RoleBinding" => ("rbac.authorization.k8s.io", "v1", "rolebindings", true),
                other => anyhow::bail!("{file}: unexpected kind {other:?}"),
            };
            let ar = ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, version, &kind),
                plural,
            );
            let obj: DynamicObject = serde_json::from_value(doc)?;
            let name = obj.metadata.name.clone().unwrap_or_default();
            let api: Api<DynamicObject> = match (&obj.metadata.namespace, namespaced) {
                (Some(ns), true) => Api::namespaced_with(admin.clone(), ns, &ar),
                _ => Api::all_with(admin.clone(), &ar),
            };
            api.patch(&name, &pp, &Patch::Apply(&obj))
                .await
                .with_context(|| format!("{file}: applying {kind} {name}"))?;
        }
    }
    // Stand-in for the Node authorizer of a real API server: kubelets (group system:nodes) may
    // read and write Nodes. NodeRestriction-like limits come from ovnk's identity webhook.
    let kubelet_role: ClusterRole = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ovnk-sandbox-kubelet"},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "create", "patch", "update"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch", "update"]},
        ],
    }))?;
    let kubelet_binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "ovnk-sandbox-kubelet"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "ovnk-sandbox-kubelet"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:nodes"}],
    }))?;
    Api::<ClusterRole>::all(admin.clone())
        .patch("ovnk-sandbox-kubelet", &pp, &Patch::Apply(&kubelet_role))
        .await
        .context("installing ClusterRole ovnk-sandbox-kubelet")?;
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch("ovnk-sandbox-kubelet", &pp, &Patch::Apply(&kubelet_binding))
        .await
        .context("installing ClusterRoleBinding ovnk-sandbox-kubelet")?;
    Ok(())
}

/// Serves ovnk's CustomResourceDefinitions (TrustZone, TunnelReport, ServiceFWMark,
/// EgressService), as `kubectl apply -f manifests/crds/` would on a real cluster.
async fn install_crds(admin: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api = Api::<CustomResourceDefinition>::all(admin.clone());
    let pp = PatchParams::apply("ovnk-sandbox").force();
    for crd in k8s_api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        api.patch(&name, &pp, &Patch::Apply(&crd))
            .await
            .with_context(|| format!("installing CRD {name}"))?;
    }
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        futures::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
