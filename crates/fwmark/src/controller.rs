//! The node controller shell (`ovnk node`): watch ServiceFWMark, Service, EndpointSlice,
//! EgressService and Node; on any change plan for this node and apply with the chosen backend.
//!
//! It holds no feature logic: [`crate::index`] builds the snapshot, [`crate::plan`] decides,
//! [`crate::backend`] applies. It never writes status (see [`crate::status`]).

use k8s_api::watch::spawn_reflector;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_api::egress_service::EgressService;
use k8s_api::service_fwmark::ServiceFWMark;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use tokio::sync::Notify;

use crate::backend::{Backend, BackendError};
use crate::config::FwmarkArgs;
use crate::exec::Runner;
use crate::plan::{self, PlanWarning, ServiceKey};

/// Errors that stop the node controller (at start only; later errors are retried).
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    #[error("ServiceFWMark backend could not start: {0}")]
    Backend(#[from] BackendError),
    #[error("ServiceFWMark backend task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
}

/// Every object of kind `K`, in a store kept by a watcher that wakes `notify`.
fn watch_all<K>(client: &Client, notify: &Arc<Notify>) -> Store<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    spawn_reflector(
        Api::all(client.clone()),
        watcher::Config::default(),
        notify.clone(),
    )
}

/// Stores of everything the plan reads.
pub(crate) struct Stores {
    pub marks: Store<ServiceFWMark>,
    pub services: Store<Service>,
    pub slices: Store<EndpointSlice>,
    pub egress: Store<EgressService>,
    pub nodes: Store<Node>,
}

impl Stores {
    pub(crate) fn start(client: &Client, notify: &Arc<Notify>) -> Self {
        Self {
            marks: watch_all(client, notify),
            services: watch_all(client, notify),
            slices: watch_all(client, notify),
            egress: watch_all(client, notify),
            nodes: watch_all(client, notify),
        }
    }

    /// Wait for the initial lists. The EgressService CRD may not be installed: wait for it
    /// at most `egress_grace`, then go on without Egress Service hosts from it.
    pub(crate) async fn ready(&self, egress_grace: Duration) {
        let _ = tokio::join!(
            self.marks.wait_until_ready(),
            self.services.wait_until_ready(),
            self.slices.wait_until_ready(),
            self.nodes.wait_until_ready(),
        );
        if tokio::time::timeout(egress_grace, self.egress.wait_until_ready())
            .await
            .is_err()
        {
            tracing::warn!(
                "EgressService objects not listed (CRD missing?); using the egress-service-host annotation only"
            );
        }
    }

    pub(crate) fn snapshot(&self) -> plan::Snapshot {
        let (m, s, e, g, n) = (
            self.marks.state(),
            self.services.state(),
            self.slices.state(),
            self.egress.state(),
            self.nodes.state(),
        );
        crate::index::snapshot(
            m.iter().map(|a| a.as_ref()),
            s.iter().map(|a| a.as_ref()),
            e.iter().map(|a| a.as_ref()),
            g.iter().map(|a| a.as_ref()),
            n.iter().map(|a| a.as_ref()),
        )
    }
}

/// Logs the warnings that are new since the last sync (each names the ServiceFWMark) and
/// returns them, with the object each one is about, for Events.
fn log_warnings(new: &[PlanWarning], old: &mut BTreeSet<String>) -> Vec<(ServiceKey, String)> {
    let now: Vec<(ServiceKey, String)> = new
        .iter()
        .map(|w| match w {
            PlanWarning::InvalidMark { key, error } => (
                key.clone(),
                format!("ServiceFWMark {key} not applied: {error}"),
            ),
            PlanWarning::Conflict { ip, winner, loser } => (
                loser.clone(),
                format!(
                    "source {ip} claimed by ServiceFWMarks {winner} and {loser} with different marks; {winner} wins"
                ),
            ),
        })
        .collect();
    let fresh: Vec<(ServiceKey, String)> = now
        .iter()
        .filter(|(_, w)| !old.contains(w))
        .cloned()
        .collect();
    for (_, w) in &fresh {
        tracing::warn!("{w}");
    }
    *old = now.into_iter().map(|(_, w)| w).collect();
    fresh
}

/// Publishes Warning Events from the node controller: a plan warning on the ServiceFWMark it
/// is about (once, when it appears), a failed sync on this Node (once per failure streak).
struct Events {
    client: Client,
    reporter: Reporter,
    node: String,
}

impl Events {
    async fn publish(&self, regarding: &ObjectReference, reason: &str, note: String) {
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "ApplyServiceFWMark".into(),
            secondary: None,
        };
        // a fresh Recorder per Event so two problems with one reason stay two Events
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        if let Err(e) = recorder.publish(&ev, regarding).await {
            tracing::warn!(object = ?regarding.name, error = %e, "publishing Event failed");
        }
    }

    async fn plan_warnings(&self, stores: &Stores, fresh: Vec<(ServiceKey, String)>) {
        for (key, note) in fresh {
            let obj = stores.marks.state().into_iter().find(|m| {
                m.metadata.namespace.as_deref() == Some(key.namespace.as_str())
                    && m.metadata.name.as_deref() == Some(key.name.as_str())
            });
            let Some(obj) = obj else { continue };
            let reason = if note.contains("not applied") {
                "FWMarkNotApplied"
            } else {
                "FWMarkSourceConflict"
            };
            let note = format!("node {}: {note}", self.node);
            self.publish(&obj.object_ref(&()), reason, note).await;
        }
    }

    async fn sync_failed(&self, error: &str) {
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(self.node.clone()),
            ..Default::default()
        };
        self.publish(
            &node,
            "FWMarkSyncFailed",
            format!("applying ServiceFWMark rules failed (retrying): {error}"),
        )
        .await;
    }
}

/// Run the ServiceFWMark node controller for `node_name` until the process ends.
///
/// Fails at start when the chosen backend's binaries are missing; afterwards errors are logged
/// and retried with backoff, and the next attempt re-reads the live ruleset.
pub async fn run_node(
    client: Client,
    node_name: String,
    args: FwmarkArgs,
) -> Result<(), ControllerError> {
    run_node_with(client, node_name, args, Runner::host()).await
}

/// [`run_node`] with the packet-filter commands run through `runner` (tests run it against a
/// network namespace).
pub async fn run_node_with(
    client: Client,
    node_name: String,
    args: FwmarkArgs,
    runner: Runner,
) -> Result<(), ControllerError> {
    if args.disable {
        tracing::info!("ServiceFWMark node controller disabled");
        return Ok(());
    }
    for r in crate::mark::mask_clobbers(args.mask) {
        tracing::warn!(
            mask = format!("{:#x}", args.mask),
            owner = r.owner,
            what = r.what,
            "fwmark mask overwrites these bits on marked packets"
        );
    }
    let (kind, bin_dir, table) = (args.backend, args.bin_dir.clone(), args.nft_table.clone());
    let backend = tokio::task::spawn_blocking(move || {
        Backend::start(kind, runner, bin_dir.as_deref(), &table)
    })
    .await??;
    tracing::info!(backend = %kind, node = %node_name, "ServiceFWMark node controller starting");
    let backend = Arc::new(Mutex::new(backend));

    let notify = Arc::new(Notify::new());
    let stores = Stores::start(&client, &notify);
    stores.ready(Duration::from_secs(10)).await;
    let events = Events {
        client: client.clone(),
        reporter: Reporter {
            controller: "ovnk-fwmark-node".into(),
            instance: Some(node_name.clone()),
        },
        node: node_name.clone(),
    };

    let mut warned = BTreeSet::new();
    let mut backoff = Duration::from_secs(1);
    let mut retry = false;
    loop {
        if !retry {
            tokio::select! {
                _ = notify.notified() => {}
                _ = tokio::time::sleep(args.resync_period) => {
                    if let Ok(mut b) = backend.lock() { b.resync(); }
                }
            }
            // coalesce bursts of events into one sync
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let snap = stores.snapshot();
        let plan = plan::plan_node(&snap, &node_name, args.mask);
        let fresh = log_warnings(&plan.warnings, &mut warned);
        events.plan_warnings(&stores, fresh).await;
        let b = backend.clone();
        let desired = plan.desired;
        let entries = desired.len();
        let res = tokio::task::spawn_blocking(move || match b.lock() {
            Ok(mut b) => b.sync(&desired).map_err(|e| e.to_string()),
            Err(_) => Err("backend lock poisoned".to_string()),
        })
        .await;
        match res {
            Ok(Ok(report)) => {
                tracing::debug!(entries, ?report, "ServiceFWMark rules synced");
                backoff = Duration::from_secs(1);
                retry = false;
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, retry_in = ?backoff, "ServiceFWMark sync failed");
                if !retry {
                    events.sync_failed(&e).await;
                }
                if let Ok(mut b) = backend.lock() {
                    b.resync();
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(30));
                retry = true;
            }
            Err(e) => return Err(e.into()),
        }
    }
}
