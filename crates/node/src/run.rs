//! The shell: Kubernetes watches and OVSDB replicas feed a debounced reconcile loop.
//!
//! Reconcile order: NB, then SB, then OVS (the SB's Port_Binding rows only exist once
//! ovn-northd has seen the NB change, so `Port_Binding.chassis` is set by a later reconcile,
//! triggered by the SB replica's change). When every transaction of a reconcile only removes
//! rows, the order is reversed (OVS, SB, NB): the tunnel goes before the ports behind it.

use k8s_api::watch::spawn_reflector;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt;
use k8s_api::trust_zone::TrustZone;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use ovsdb::{ClientOptions, Db, DbCache, Txn};
use tokio::sync::Notify;
use tracing::{Instrument, info_span};

use crate::apply;
use crate::config::NodeArgs;
use crate::kernel::Kernel;
use crate::plan::{self, Desired, KernelDesired, LocalNode, ObjectRef, Problem};
use crate::snapshot::{self, AnnotationZones, PodAddr, Snapshot, ZoneSource};
use crate::trust_zones::TrustZones;
use crate::tunnels::{self, ReportSync};

/// How often an absent TrustZone or TunnelReport CRD is looked for again.
const CRD_RETRY: Duration = Duration::from_secs(10);

/// Runs the agent with a client built from `--kubeconfig` (or kube's defaults).
pub async fn run(args: NodeArgs) -> anyhow::Result<()> {
    let client = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
            Client::try_from(cfg)?
        }
        None => Client::try_default().await?,
    };
    run_with(client, args).await
}

async fn connect(
    endpoint: &str,
    db: &str,
    needs: &[ovsdb::TableNeeds],
) -> anyhow::Result<(ovsdb::Client, Arc<Db>)> {
    let client = ovsdb::Client::start(endpoint, ClientOptions::default())
        .with_context(|| format!("OVSDB endpoint {endpoint}"))?;
    let mut delay = Duration::from_millis(100);
    loop {
        match client.wait_connected().await {
            Ok(()) => match ovn_model::connect_db(&client, db, needs).await {
                Ok(h) => {
                    h.wait_synced().await;
                    return Ok((client, h));
                }
                Err(e @ ovsdb::Error::Schema(_)) => {
                    return Err(e).context(format!("{db} at {endpoint}"));
                }
                Err(e) => tracing::info!(db, endpoint, error = %e, "waiting for the database"),
            },
            Err(e) => tracing::info!(db, endpoint, error = %e, "waiting for the database"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// Whether the TrustZone API is served (the CRD is installed).
async fn trust_zones_served(api: &Api<TrustZone>) -> bool {
    match api.list(&ListParams::default().limit(1)).await {
        Ok(_) => true,
        Err(kube::Error::Api(e)) if e.code == 404 => false,
        Err(e) => {
            tracing::warn!(error = %e, "listing TrustZones failed (retrying)");
            false
        }
    }
}

/// The TrustZone store. When the CRD is installed at start-up, the store is synced before
/// this returns (no reconcile may program peers a TrustZone would filter). When it is not,
/// the agent works from annotations alone (said once) and the CRD is looked for again every
/// [`CRD_RETRY`]; the store fills once it appears.
async fn trust_zone_store(kube: &Client, notify: Arc<Notify>) -> anyhow::Result<Store<TrustZone>> {
    let api: Api<TrustZone> = Api::all(kube.clone());
    let served = trust_zones_served(&api).await;
    if !served {
        tracing::warn!(
            "the TrustZone CRD is not installed: zones come from the k8s.ovn.org/transport-zones \
             annotation only until it is"
        );
    }
    let (reader, writer) = reflector::store();
    tokio::spawn(async move {
        if !served {
            while !trust_zones_served(&api).await {
                tokio::time::sleep(CRD_RETRY).await;
            }
            tracing::info!("the TrustZone CRD is installed: watching TrustZones");
        }
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .touched_objects();
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => notify.notify_one(),
                Err(e) => tracing::warn!(error = %e, "TrustZone watch error (retrying)"),
            }
        }
    });
    if served {
        reader.wait_until_ready().await?;
    }
    Ok(reader)
}

fn watch_db(db: Arc<Db>, notify: Arc<Notify>) {
    let mut rx = db.subscribe();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            notify.notify_one();
        }
    });
}

/// Everything the loop keeps between reconciles.
struct Agent {
    args: NodeArgs,
    kube: Client,
    nodes: Store<Node>,
    pods: Store<Pod>,
    nb: (ovsdb::Client, Arc<Db>),
    sb: (ovsdb::Client, Arc<Db>),
    ovs: (ovsdb::Client, Arc<Db>),
    system_id: String,
    /// The annotation and any extension sources.
    zones: Vec<Box<dyn ZoneSource>>,
    trust_zone_store: Store<TrustZone>,
    /// TrustZone membership, kept in step with the stores.
    trust_zones: TrustZones,
    /// The peers `TunnelReport/<node>` is known to say (`None`: unknown, read it).
    report: Option<Vec<String>>,
    /// The TunnelReport CRD was missing: when to look again (said once).
    report_retry: Option<Instant>,
    kernel: Kernel,
    /// Pod addresses this agent published (by pod UID), until the store shows them.
    written: BTreeMap<String, PodAddr>,
    kernel_applied: Option<KernelDesired>,
    primary_ifaddr: Option<(std::net::IpAddr, Option<ipnet::IpNet>)>,
    reported: BTreeSet<Problem>,
    recorder: Recorder,
}

/// Extension points of the run loop.
#[derive(Default)]
pub struct Extensions {
    /// Zone sources besides the `k8s.ovn.org/transport-zones` annotation (issue 5 adds
    /// TrustZones); a node's zones are the union over all sources.
    pub zone_sources: Vec<Box<dyn ZoneSource>>,
    /// Extra wake-ups for the reconcile loop (e.g. a TrustZone reflector's events).
    pub wake: Vec<Arc<Notify>>,
}

/// Runs the agent with `kube` until the task is dropped or a fatal start-up error occurs.
pub async fn run_with(kube: Client, args: NodeArgs) -> anyhow::Result<()> {
    run_with_extensions(kube, args, Extensions::default()).await
}

/// [`run_with`] plus extra zone sources and wake-ups.
pub async fn run_with_extensions(
    kube: Client,
    args: NodeArgs,
    ext: Extensions,
) -> anyhow::Result<()> {
    let node = args.node.clone();
    async move {
        let nb = connect(&args.nb_address, ovn_model::NB_DB, &ovn_model::nb_needs()).await?;
        let sb = connect(&args.sb_address, ovn_model::SB_DB, &ovn_model::sb_needs()).await?;
        let ovs = connect(&args.ovs_address, ovn_model::OVS_DB, &ovn_model::ovs_needs()).await?;
        let system_id = {
            let c = ovs.1.cache();
            c.table("Open_vSwitch")
                .and_then(|t| t.rows().next())
                .and_then(|r| r.get("external_ids").and_then(|d| d.map_get("system-id")).and_then(|a| a.as_str().map(str::to_owned)))
                .filter(|s| !s.trim().is_empty())
        }
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        tracing::info!(system_id, "chassis id");
        let notify = Arc::new(Notify::new());
        let nodes = spawn_reflector(Api::<Node>::all(kube.clone()), watcher::Config::default(), notify.clone());
        let pods = spawn_reflector(
            Api::<Pod>::all(kube.clone()),
            watcher::Config::default().fields(&format!("spec.nodeName={}", args.node)),
            notify.clone(),
        );
        for db in [&nb.1, &sb.1, &ovs.1] {
            watch_db(db.clone(), notify.clone());
        }
        for w in ext.wake {
            let n = notify.clone();
            tokio::spawn(async move {
                loop {
                    w.notified().await;
                    n.notify_one();
                }
            });
        }
        let mut zones: Vec<Box<dyn ZoneSource>> = vec![Box::new(AnnotationZones)];
        zones.extend(ext.zone_sources);
        let trust_zone_store = trust_zone_store(&kube, notify.clone()).await?;
        nodes.wait_until_ready().await?;
        pods.wait_until_ready().await?;
        let recorder = Recorder::new(
            kube.clone(),
            Reporter {
                controller: "ovnk-node".into(),
                instance: Some(args.node.clone()),
            },
        );
        let mut agent = Agent {
            kernel: Kernel::new(args.netns.clone()),
            args,
            kube,
            nodes,
            pods,
            nb,
            sb,
            ovs,
            system_id,
            zones,
            trust_zone_store,
            trust_zones: TrustZones::new(),
            report: None,
            report_retry: None,
            written: BTreeMap::new(),
            kernel_applied: None,
            primary_ifaddr: None,
            reported: BTreeSet::new(),
            recorder,
        };
        let mut backoff = Duration::from_millis(200);
        loop {
            match agent.reconcile().await {
                Ok(true) => backoff = Duration::from_millis(200),
                Ok(false) => {
                    // Something is not there yet (br-int, the management port's device):
                    // retry on the next change (the OVS replica shows both) or soon.
                    tokio::select! {
                        _ = notify.notified() => {}
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), retry_in = ?backoff, "reconcile failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            }
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(60)) => { agent.kernel_applied = None; }
            }
            // Coalesce a burst of events into one reconcile.
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    }
    .instrument(info_span!("node-agent", node = %node))
    .await
}

/// A pod's UID (its namespace/name when the server gave none), so that a pod re-created under
/// the same name is never mistaken for the old one.
fn pod_uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_else(|| {
        format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

fn has_inserts(t: &Txn) -> bool {
    t.ops()
        .iter()
        .any(|o| o.summary.starts_with("insert") || o.summary.starts_with("update"))
        || t.ops()
            .iter()
            .any(|o| o.summary.starts_with("mutate") && o.json.contains("\"insert\""))
}

impl Agent {
    fn local(&mut self) -> LocalNode {
        let me = self.nodes.get(&reflector::ObjectRef::new(&self.args.node));
        let encap_ip = self.args.encap_ip.or_else(|| {
            me.as_ref()
                .and_then(|n| snapshot::node_info(n, &[]).internal_ip)
        });
        let primary = match (encap_ip, self.primary_ifaddr) {
            (Some(ip), Some((cached, p))) if cached == ip => p,
            (Some(ip), _) => {
                let p = self.kernel.find_ifaddr(ip);
                self.primary_ifaddr = Some((ip, p));
                p
            }
            (None, _) => None,
        };
        LocalNode {
            name: self.args.node.clone(),
            system_id: self.system_id.clone(),
            encap_ip,
            primary_ifaddr: primary.or_else(|| encap_ip.map(ipnet::IpNet::from)),
            gateway_interface: self.args.gateway_interface.clone(),
            mtu: self.args.mtu,
            cluster_cidr: self.args.cluster_cidr,
            transit_cidr: self.args.transit_cidr,
            join_cidr: self.args.join_cidr,
            enforcement: self.args.enforcement,
        }
    }

    fn snapshot(&mut self) -> Snapshot {
        let all_nodes = self.nodes.state();
        let tzs = self.trust_zone_store.state();
        let changed = self.trust_zones.sync(
            all_nodes.iter().map(|n| n.as_ref()),
            tzs.iter().map(|t| t.as_ref()),
        );
        if !changed.is_empty() {
            tracing::info!(nodes = ?changed, "TrustZone membership changed");
        }
        let mut zones: Vec<&dyn ZoneSource> = self.zones.iter().map(|z| z.as_ref()).collect();
        zones.push(&self.trust_zones);
        let nodes = all_nodes
            .iter()
            .map(|n| snapshot::node_info(n, &zones))
            .map(|i| (i.name.clone(), i))
            .collect();
        let mut live = BTreeSet::new();
        let pods: Vec<_> = self
            .pods
            .state()
            .iter()
            .map(|p| {
                let uid = pod_uid(p);
                let info = snapshot::pod_info(p, self.written.get(&uid).copied());
                live.insert(uid);
                info
            })
            .collect();
        // Addresses of pods that are gone are released.
        self.written.retain(|uid, _| live.contains(uid));
        Snapshot { nodes, pods }
    }

    /// One reconcile. `Ok(false)`: done what could be done, something is not there yet.
    async fn reconcile(&mut self) -> anyhow::Result<bool> {
        let local = self.local();
        let snap = self.snapshot();
        let desired = plan::plan(&snap, &local);
        let mut problems = desired.problems.clone();
        problems.extend(self.trust_zones.problems());
        let mut complete = true;
        let mut failures: Vec<anyhow::Error> = Vec::new();

        // ---- OVSDB: at most one transaction per database
        let nb_t = desired
            .nb
            .as_ref()
            .map(|d| apply::nb_txn(d, &self.nb.1.cache()));
        let sb_t = desired.sb.as_ref().map(|d| {
            let (t, p) = apply::sb_txn(d, &self.sb.1.cache(), &self.args.node);
            problems.extend(p);
            t
        });
        let ovs_t = apply::ovs_txn(&desired.ovs, &self.ovs.1.cache());
        let all = [&nb_t, &sb_t, &Some(ovs_t.clone())];
        let removing_only = all
            .iter()
            .all(|t| t.as_ref().is_none_or(|t| !has_inserts(t)));
        let order: [usize; 3] = if removing_only { [2, 1, 0] } else { [0, 1, 2] };
        for i in order {
            let (txn, client, db) = match i {
                0 => (nb_t.as_ref(), &self.nb.0, &self.nb.1),
                1 => (sb_t.as_ref(), &self.sb.0, &self.sb.1),
                _ => (Some(&ovs_t), &self.ovs.0, &self.ovs.1),
            };
            let Some(txn) = txn.filter(|t| !t.is_empty()) else {
                continue;
            };
            tracing::info!(db = txn.db(), ops = txn.len(), "transact");
            for op in txn.ops() {
                tracing::debug!(db = txn.db(), op = %op.summary);
            }
            // One database failing does not hold the others back; the error is retried.
            match client.transact(txn).await {
                Ok(_) => wait_applied(db, txn, &desired, i, &self.args.node).await,
                Err(e) => failures
                    .push(anyhow::Error::new(e).context(format!("{} transaction", txn.db()))),
            }
        }
        if desired.ovs.mgmt_port.is_some()
            && apply::find_named(&self.ovs.1.cache(), "Bridge", "br-int").is_none()
        {
            complete = false;
        }

        // ---- what this node observes
        if let Err(e) = self.report_tunnels(&snap).await {
            failures.push(e);
        }

        // ---- annotations
        if let Err(e) = self.patch_node(&desired).await {
            failures.push(e);
        }
        failures.extend(self.patch_pods(&desired).await);

        // ---- kernel
        if !self.args.no_kernel
            && let Some(k) = &desired.kernel
            && self.kernel_applied.as_ref() != Some(k)
        {
            let kernel = self.kernel.clone();
            let want = k.clone();
            match tokio::task::spawn_blocking(move || kernel.apply(&want)).await? {
                Ok(()) => {
                    tracing::info!(mgmt_ip = %k.mgmt_ip, "kernel side configured");
                    self.kernel_applied = Some(k.clone());
                }
                Err(crate::kernel::KernelError::NoMgmtPort) => complete = false,
                Err(e) => failures.push(anyhow::Error::new(e).context("kernel side")),
            }
        }
        self.report(problems).await;
        match failures.len() {
            0 => Ok(complete),
            1 => Err(failures.remove(0)),
            n => {
                for e in &failures[1..] {
                    tracing::error!(error = format!("{e:#}"), "reconcile step failed");
                }
                Err(failures
                    .remove(0)
                    .context(format!("and {} more failures", n - 1)))
            }
        }
    }

    /// Keeps `TunnelReport/<node>` equal to the peers of the geneve tunnels in this node's
    /// own Open_vSwitch database; the API is only called when that set differs from what the
    /// report is known to say.
    async fn report_tunnels(&mut self, snap: &Snapshot) -> anyhow::Result<()> {
        let peers = tunnels::peers(
            &tunnels::tunnels(&self.ovs.1.cache()),
            snap.nodes.values(),
            &self.args.node,
        );
        if self.report.as_ref() == Some(&peers) {
            return Ok(());
        }
        if self.report_retry.is_some_and(|t| Instant::now() < t) {
            return Ok(());
        }
        let uid = self
            .nodes
            .get(&reflector::ObjectRef::new(&self.args.node))
            .and_then(|n| n.metadata.uid.clone());
        match tunnels::sync_report(&self.kube, &self.args.node, uid.as_deref(), &peers).await? {
            ReportSync::NoCrd => {
                if self.report_retry.is_none() {
                    tracing::warn!(
                        "the TunnelReport CRD is not installed: observed tunnels are not reported \
                         until it is"
                    );
                }
                self.report_retry = Some(Instant::now() + CRD_RETRY);
            }
            r => {
                if r == ReportSync::Written {
                    tracing::info!(?peers, "TunnelReport written");
                }
                self.report_retry = None;
                self.report = Some(peers);
            }
        }
        Ok(())
    }

    async fn patch_node(&self, desired: &Desired) -> anyhow::Result<()> {
        let Some(me) = self.nodes.get(&reflector::ObjectRef::new(&self.args.node)) else {
            return Ok(());
        };
        let cur = me.metadata.annotations.clone().unwrap_or_default();
        let changed: BTreeMap<&String, &String> = desired
            .node_annotations
            .iter()
            .filter(|(k, v)| cur.get(*k) != Some(*v))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        let patch = serde_json::json!({"metadata": {"annotations": changed}});
        // Through nodes/status, as upstream's ovnkube-node does (the identity webhook and the
        // node RBAC are written for that subresource; it persists metadata too).
        Api::<Node>::all(self.kube.clone())
            .patch_status(
                &self.args.node,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .context("annotating the Node")?;
        tracing::info!(keys = ?changed.keys().collect::<Vec<_>>(), "node annotations written");
        Ok(())
    }

    /// Publishes pod addresses; one pod failing does not hold the others back.
    async fn patch_pods(&mut self, desired: &Desired) -> Vec<anyhow::Error> {
        let mut failures = Vec::new();
        for pa in &desired.pod_annotations {
            let key = format!("{}/{}", pa.namespace, pa.name);
            let Some(pod) = self
                .pods
                .get(&reflector::ObjectRef::new(&pa.name).within(&pa.namespace))
            else {
                continue;
            };
            let uid = pod_uid(&pod);
            let cur = pod
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k8s_api::annotations::POD_NETWORKS))
                .and_then(|v| snapshot::parse_pod_addr(v).ok().flatten());
            if cur == Some(pa.addr) || self.written.get(&uid) == Some(&pa.addr) {
                continue;
            }
            let patch = serde_json::json!({"metadata": {"annotations": {
                k8s_api::annotations::POD_NETWORKS: pa.value,
            }}});
            match Api::<Pod>::namespaced(self.kube.clone(), &pa.namespace)
                .patch_status(&pa.name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    tracing::info!(pod = %key, ip = %pa.addr.ip, "pod address published");
                    self.written.insert(uid, pa.addr);
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    failures.push(anyhow::Error::new(e).context(format!("annotating pod {key}")))
                }
            }
        }
        failures
    }

    /// New problems become an Event on their object and a log line; repeated ones are quiet.
    async fn report(&mut self, problems: Vec<Problem>) {
        let now: BTreeSet<Problem> = problems.into_iter().collect();
        for p in now.difference(&self.reported) {
            let (reference, what) = match &p.object {
                ObjectRef::Node(n) => {
                    let uid = self
                        .nodes
                        .get(&reflector::ObjectRef::new(n))
                        .and_then(|o| o.metadata.uid.clone());
                    (
                        ObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("Node".into()),
                            name: Some(n.clone()),
                            uid,
                            ..Default::default()
                        },
                        format!("node {n}"),
                    )
                }
                ObjectRef::TrustZone(z) => {
                    let uid = self
                        .trust_zone_store
                        .get(&reflector::ObjectRef::new(z))
                        .and_then(|o| o.metadata.uid.clone());
                    (
                        ObjectReference {
                            api_version: Some("k8s.ovn.org/v1alpha1".into()),
                            kind: Some("TrustZone".into()),
                            name: Some(z.clone()),
                            uid,
                            ..Default::default()
                        },
                        format!("trustzone {z}"),
                    )
                }
                ObjectRef::Pod { namespace, name } => {
                    let uid = self
                        .pods
                        .get(&reflector::ObjectRef::new(name).within(namespace))
                        .and_then(|o| o.metadata.uid.clone());
                    (
                        ObjectReference {
                            api_version: Some("v1".into()),
                            kind: Some("Pod".into()),
                            name: Some(name.clone()),
                            namespace: Some(namespace.clone()),
                            uid,
                            ..Default::default()
                        },
                        format!("pod {namespace}/{name}"),
                    )
                }
            };
            tracing::warn!(object = %what, reason = p.reason, "{}", p.message);
            let ev = Event {
                type_: EventType::Warning,
                reason: p.reason.into(),
                note: Some(p.message.clone()),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = self.recorder.publish(&ev, &reference).await {
                tracing::warn!(object = %what, error = %e, "could not post an Event");
            }
        }
        self.reported = now;
    }
}

/// After a transaction, wait (bounded) until the replica shows it: until none of the
/// operations just sent would be planned again. (Other operations may legitimately appear
/// meanwhile, e.g. a Port_Binding northd just created.)
async fn wait_applied(db: &Arc<Db>, sent: &Txn, desired: &Desired, which: usize, node: &str) {
    let sent: BTreeSet<&str> = sent.ops().iter().map(|o| o.json.as_str()).collect();
    let done = |c: &DbCache| {
        let again = match which {
            0 => desired.nb.as_ref().map(|d| apply::nb_txn(d, c)),
            1 => desired.sb.as_ref().map(|d| apply::sb_txn(d, c, node).0),
            _ => Some(apply::ovs_txn(&desired.ovs, c)),
        };
        again.is_none_or(|t| !t.ops().iter().any(|o| sent.contains(o.json.as_str())))
    };
    let _ = tokio::time::timeout(Duration::from_secs(2), db.wait_until(done)).await;
}
