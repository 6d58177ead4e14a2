//! The kube-runtime shell of the cluster manager: a reflector on Nodes feeds
//! [`Allocator::sync`] after every change (level-triggered, over the whole store), and each
//! Node whose annotations do not show its assignment gets one JSON merge patch with just the
//! keys that differ. Problems are Warning Events on the Node concerned; a failed write is
//! logged, retried with backoff and never holds up the other Nodes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};

use crate::alloc::{self, AllocConfig, Allocator, Assignment, ConfigError, NodeInfo, Observed};

/// The reporting controller of the cluster manager's Events.
pub const CONTROLLER_NAME: &str = "ovnk-cluster-manager";

/// Flags of `ovnk cluster-manager`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterManagerArgs {
    /// Kubeconfig to use (in-cluster config, then $KUBECONFIG / ~/.kube/config, when absent).
    #[arg(long, env = "OVNK_CLUSTER_MANAGER_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Cluster (pod) network CIDR that node subnets are carved from. IPv4 only.
    #[arg(long, env = "OVNK_CLUSTER_CIDR", default_value = "10.244.0.0/16")]
    pub cluster_cidr: IpNet,

    /// Prefix length of each node's subnet within the cluster CIDR.
    #[arg(long, env = "OVNK_HOST_SUBNET_LENGTH", default_value_t = 24)]
    pub host_subnet_length: u8,

    /// Transit switch range; a node's transit port address is its base + the node ID.
    #[arg(long, env = "OVNK_TRANSIT_CIDR", default_value = "100.88.0.0/16")]
    pub transit_cidr: IpNet,

    /// Join range; a node's gateway-router join address is its base + the node ID.
    #[arg(long, env = "OVNK_JOIN_CIDR", default_value = "100.64.0.0/16")]
    pub join_cidr: IpNet,

    /// Run only while holding a coordination.k8s.io Lease (for more than one replica).
    #[arg(
        long,
        env = "OVNK_CLUSTER_MANAGER_LEADER_ELECT",
        default_value_t = false
    )]
    pub leader_elect: bool,

    /// Namespace of the leader election Lease.
    #[arg(
        long,
        env = "OVNK_CLUSTER_MANAGER_LEADER_ELECT_NAMESPACE",
        default_value = "kube-system"
    )]
    pub leader_elect_namespace: String,

    /// Name of the leader election Lease.
    #[arg(
        long,
        env = "OVNK_CLUSTER_MANAGER_LEADER_ELECT_LEASE",
        default_value = "ovnk-cluster-manager"
    )]
    pub leader_elect_lease: String,

    /// Seconds a lease stays valid without renewal (renewed every fifth of it).
    #[arg(
        long,
        env = "OVNK_CLUSTER_MANAGER_LEADER_ELECT_LEASE_SECONDS",
        default_value_t = 15,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub leader_elect_lease_seconds: u64,

    /// This replica's identity in the Lease (default: $POD_NAME, else hostname and PID).
    #[arg(long, env = "OVNK_CLUSTER_MANAGER_LEADER_ELECT_IDENTITY")]
    pub leader_elect_identity: Option<String>,

    /// ovnk's identity webhook protects every label key a TrustZone selector reads, so a
    /// TrustZone selecting on kubelet-settable keys is `SelectorProtected=True`
    /// (`ProtectedByWebhook`). Set to false when the webhook is not deployed: such TrustZones
    /// then get `SelectorProtected=False` (`KubeletSettableKeys`) and a Warning Event.
    #[arg(
        long,
        env = "OVNK_ZONE_LABELS_PROTECTED_BY_WEBHOOK",
        default_value_t = true,
        action = clap::ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true"
    )]
    pub zone_labels_protected_by_webhook: bool,
}

impl ClusterManagerArgs {
    /// The TrustZone status controller's settings from the flags.
    pub fn zone_status_config(&self) -> crate::zone_controller::ZoneStatusConfig {
        crate::zone_controller::ZoneStatusConfig {
            options: crate::zone_status::StatusOptions {
                labels_protected_by_webhook: self.zone_labels_protected_by_webhook,
            },
            ..Default::default()
        }
    }

    /// The validated allocator configuration.
    pub fn alloc_config(&self) -> Result<AllocConfig, ConfigError> {
        AllocConfig::new(
            self.cluster_cidr,
            self.host_subnet_length,
            self.transit_cidr,
            self.join_cidr,
        )
    }

    /// The leader election settings from the `--leader-elect-*` flags.
    pub fn lease_config(&self) -> crate::leader::LeaseConfig {
        let identity = self.leader_elect_identity.clone().unwrap_or_else(|| {
            std::env::var("POD_NAME").unwrap_or_else(|_| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_owned())
                    .unwrap_or_else(|_| "ovnk".into());
                format!("{host}-{}", std::process::id())
            })
        });
        let lease = Duration::from_secs(self.leader_elect_lease_seconds);
        crate::leader::LeaseConfig {
            namespace: self.leader_elect_namespace.clone(),
            name: self.leader_elect_lease.clone(),
            identity,
            lease_duration: lease,
            retry_period: lease / 5,
        }
    }

    /// A client from `--kubeconfig`, or inferred from the environment.
    pub async fn kube_client(&self) -> anyhow::Result<Client> {
        use anyhow::Context as _;
        let cfg = match &self.kubeconfig {
            Some(p) => {
                let kc = kube::config::Kubeconfig::read_from(p)
                    .with_context(|| format!("reading kubeconfig {}", p.display()))?;
                kube::Config::from_custom_kubeconfig(
                    kc,
                    &kube::config::KubeConfigOptions::default(),
                )
                .await
                .with_context(|| format!("loading kubeconfig {}", p.display()))?
            }
            None => kube::Config::infer()
                .await
                .context("no --kubeconfig and no in-cluster or default kubeconfig")?,
        };
        Ok(Client::try_from(cfg)?)
    }
}

/// Runs the cluster manager until SIGINT/SIGTERM (the `ovnk cluster-manager` entry point):
/// the allocator and the TrustZone status controller, side by side (both only while holding
/// the Lease with `--leader-elect`).
pub async fn run(args: ClusterManagerArgs) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let cfg = args.alloc_config().context("invalid allocation ranges")?;
    let zone_cfg = args.zone_status_config();
    let client = args.kube_client().await?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let work = {
        let client = client.clone();
        move || async move {
            tokio::select! {
                r = run_with_client(client.clone(), cfg) => r.map_err(anyhow::Error::from),
                r = crate::zone_controller::run_zone_status(client, zone_cfg) => {
                    r.map_err(anyhow::Error::from)
                }
            }
        }
    };
    let main = async {
        if args.leader_elect {
            crate::leader::run_as_leader(client, args.lease_config(), work).await
        } else {
            work().await
        }
    };
    tokio::select! {
        r = main => r,
        _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: stopping"); Ok(()) }
        _ = term.recv() => { tracing::info!("SIGTERM: stopping"); Ok(()) }
    }
}

/// Why the cluster manager loop stopped.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The Node watch stream ended (it retries internally, so this means the client is gone).
    #[error("the Node watch ended")]
    WatchEnded,
}

/// Runs the cluster manager with `client` until the future is dropped (tests and the sandbox
/// run it as a task and abort it to stop). It does nothing before the first full list of
/// Nodes, so the allocator is always rebuilt from every existing annotation first.
pub async fn run_with_client(client: Client, cfg: AllocConfig) -> Result<(), ControllerError> {
    let api: Api<Node> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let stream = watcher(api.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    futures::pin_mut!(stream);
    let reporter = Reporter {
        controller: CONTROLLER_NAME.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let mut state = Shell {
        api,
        client,
        reporter,
        alloc: Allocator::new(cfg),
        written: HashMap::new(),
        reported: HashMap::new(),
    };
    tracing::info!(
        cluster_cidr = %state.alloc.config().cluster_cidr(),
        max_node_id = state.alloc.config().max_node_id(),
        "cluster manager starting"
    );

    let mut ready = false;
    let mut backoff = RETRY_MIN;
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let mut dirty = false;
        tokio::select! {
            ev = stream.next() => {
                handle_event(ev, &mut ready, &mut dirty)?;
                // Coalesce a burst of events into one pass.
                while let Some(ev) = stream.next().now_or_never() {
                    handle_event(ev, &mut ready, &mut dirty)?;
                }
            }
            _ = sleep_until(retry_at) => { dirty = true; retry_at = None; }
            _ = tokio::time::sleep(RESYNC) => { dirty = true; }
        }
        if !(dirty && ready) {
            continue;
        }
        if state.pass(&reader).await {
            backoff = RETRY_MIN;
        } else {
            retry_at = Some(tokio::time::Instant::now() + backoff);
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }
}

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);
const RESYNC: Duration = Duration::from_secs(60);

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn handle_event(
    ev: Option<Result<watcher::Event<Node>, watcher::Error>>,
    ready: &mut bool,
    dirty: &mut bool,
) -> Result<(), ControllerError> {
    match ev {
        None => return Err(ControllerError::WatchEnded),
        Some(Err(e)) => tracing::warn!(error = %e, "Node watch error (retrying)"),
        Some(Ok(watcher::Event::InitDone)) => {
            *ready = true;
            *dirty = true;
        }
        Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
        Some(Ok(_)) => *dirty = true,
    }
    Ok(())
}

/// The view of a Node the allocator needs.
pub fn node_info(node: &Node) -> NodeInfo {
    NodeInfo {
        name: node.name_any(),
        created: node
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
        observed: Observed::from_annotations(node.annotations()),
    }
}

struct Shell {
    api: Api<Node>,
    client: Client,
    reporter: Reporter,
    alloc: Allocator,
    /// Per node: the resourceVersion a patch was computed from, and the patch; a pass that sees
    /// the same version again (the watch has not caught up yet) does not write it twice.
    written: HashMap<String, (String, BTreeMap<&'static str, String>)>,
    /// Per node: the problems already reported as Events, so each is reported once.
    reported: HashMap<String, BTreeSet<String>>,
}

impl Shell {
    /// One reconcile pass over every Node. Returns false when some write failed.
    async fn pass(&mut self, reader: &Store<Node>) -> bool {
        let nodes = reader.state();
        let infos: Vec<NodeInfo> = nodes.iter().map(|n| node_info(n)).collect();
        let report = self.alloc.sync(&infos);
        for n in &report.released {
            tracing::info!(node = %n, "node gone; its ID and subnet are free again");
        }
        let by_name: HashMap<String, &Node> = nodes.iter().map(|n| (n.name_any(), &**n)).collect();
        self.written.retain(|n, _| by_name.contains_key(n));

        // Problems, as Warning Events (once each while they last).
        #[allow(clippy::type_complexity)]
        let mut now: HashMap<String, Vec<(String, String, Option<ObjectReference>)>> =
            HashMap::new();
        for (name, f) in &report.findings {
            let just_written = by_name.get(name).is_some_and(|n| {
                self.written.get(name).map(|w| &w.0) == n.resource_version().as_ref()
            });
            if matches!(f, alloc::Finding::Mismatch { .. }) && just_written {
                continue;
            }
            let reason = match f {
                alloc::Finding::Conflict { .. } => "NodeAllocationConflict",
                _ => "InvalidNodeAllocation",
            };
            let related = match f {
                alloc::Finding::Conflict { holder, .. } => {
                    by_name.get(holder).map(|h| h.object_ref(&()))
                }
                _ => None,
            };
            now.entry(name.clone())
                .or_default()
                .push((reason.into(), f.to_string(), related));
        }
        for (name, e) in &report.exhausted {
            now.entry(name.clone()).or_default().push((
                "NodeAllocationFailed".into(),
                e.to_string(),
                None,
            ));
        }
        let mut reported = HashMap::new();
        for (name, items) in now {
            let Some(node) = by_name.get(&name) else {
                continue;
            };
            let before = self.reported.remove(&name).unwrap_or_default();
            let mut keep = BTreeSet::new();
            for (reason, note, related) in items {
                if !before.contains(&note) {
                    tracing::warn!(node = %name, reason = %reason, "{note}");
                    self.event(node, &reason, note.clone(), related).await;
                }
                keep.insert(note);
            }
            reported.insert(name, keep);
        }
        // A problem that is gone is forgotten, so it is reported again if it comes back.
        self.reported = reported;

        // Writes: one merge patch per Node that needs one.
        let mut ok = true;
        for (name, a) in self.alloc.assignments() {
            let Some(node) = by_name.get(&name) else {
                continue;
            };
            let patch =
                alloc::annotation_patch(&a, &Observed::from_annotations(node.annotations()));
            if patch.is_empty() {
                continue;
            }
            let rv = node.resource_version().unwrap_or_default();
            if self.written.get(&name) == Some(&(rv.clone(), patch.clone())) {
                continue;
            }
            match self.write(&name, &a, &patch).await {
                Ok(()) => {
                    self.written.insert(name, (rv, patch));
                }
                Err(e) => {
                    ok = false;
                    tracing::warn!(node = %name, error = %e, "writing node allocation failed (will retry)");
                }
            }
        }
        ok
    }

    #[tracing::instrument(skip_all, fields(node = %name, id = a.id, subnet = %a.subnet))]
    async fn write(
        &self,
        name: &str,
        a: &Assignment,
        patch: &BTreeMap<&'static str, String>,
    ) -> Result<(), kube::Error> {
        let body = serde_json::json!({ "metadata": { "annotations": patch } });
        match self
            .api
            .patch(name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => {
                tracing::info!(keys = ?patch.keys().collect::<Vec<_>>(), "node allocation written");
                Ok(())
            }
            // Deleted meanwhile: the next pass releases it.
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Publishes a Warning Event on `node` (`related`: the other Node of a conflict).
    ///
    /// kube-runtime's Recorder folds Events with the same reason into one series and keeps the
    /// first note, which would hide a second, different problem; this shell already reports
    /// each problem once, so every Event goes through a fresh Recorder and stays distinct.
    async fn event(
        &self,
        node: &Node,
        reason: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "Allocate".into(),
            secondary: related,
        };
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        if let Err(e) = recorder.publish(&ev, &node.object_ref(&())).await {
            tracing::warn!(node = %node.name_any(), error = %e, "publishing Event failed");
        }
    }
}
