//! The TrustZone status controller: the single writer of `TrustZone.status`.
//!
//! It watches TrustZones, Nodes (metadata only: labels and annotations are all it reads) and
//! TunnelReports, keeps a [`ZoneIndex`] of membership up to date incrementally, and recomputes
//! only the zones a change affects:
//!
//! - a Node's labels or `k8s.ovn.org/transport-zones` annotation change → the zones it joined
//!   or left;
//! - a Node is deleted → the zones it was in;
//! - a TunnelReport changes → the zones of its node;
//! - a TrustZone is created or changed → that zone (its selector is re-evaluated against every
//!   Node only when it changed).
//!
//! Each affected TrustZone gets [`zone_status`] and, when that differs from what is published
//! in more than transition times, one JSON merge patch on its status subresource. A change
//! that only rewrites a message (a count of missing tunnels while tunnels are still missing) is
//! written at most once per [`ZoneStatusConfig::message_interval`] per zone, because every node
//! agent watches TrustZones and each status write reaches all of them.
//!
//! Bad input never stops other zones: an invalid selector selects nothing and is reported on
//! the TrustZone (condition + Warning Event), a malformed annotation counts as no zones and is
//! reported on the Node, a TunnelReport named after no Node is ignored and reported on itself.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt};
use k8s_api::annotations::{TRANSPORT_ZONES, parse_transport_zones};
use k8s_api::trust_zone::{TrustZone, TrustZoneStatus, TunnelReport};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Patch, PatchParams};
use kube::core::PartialObjectMeta;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use tokio::time::Instant;
use zones::ZoneIndex;

use crate::zone_status::{
    self, Change, REASON_INVALID_SELECTOR, REASON_KUBELET_SETTABLE_KEYS, Reports, StatusOptions,
    ZoneSnapshot,
};

/// Settings of the TrustZone status controller.
#[derive(Clone, Debug)]
pub struct ZoneStatusConfig {
    /// How the status is computed (`--zone-labels-protected-by-webhook`).
    pub options: StatusOptions,
    /// Minimum time between two writes of one zone's status that change only messages.
    pub message_interval: Duration,
    /// Every zone is recomputed this often, whatever happened (level-triggered safety net).
    pub resync: Duration,
}

impl Default for ZoneStatusConfig {
    fn default() -> Self {
        Self {
            options: StatusOptions::default(),
            message_interval: Duration::from_secs(10),
            resync: Duration::from_secs(300),
        }
    }
}

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum ZoneControllerError {
    /// Every watch stream ended (they retry internally, so the client is gone).
    #[error("the TrustZone, Node and TunnelReport watches ended")]
    WatchEnded,
}

/// A TrustZone as the controller keeps it.
#[derive(Clone, Debug)]
struct ZoneObject {
    selector: LabelSelector,
    selector_error: Option<String>,
    generation: Option<i64>,
    resource_version: Option<String>,
    status: Option<TrustZoneStatus>,
    reference: ObjectReference,
}

/// A Warning Event to publish.
#[derive(Clone, Debug, PartialEq)]
pub struct Warning {
    /// The object it is about.
    pub regarding: ObjectReference,
    /// CamelCase reason.
    pub reason: String,
    /// Detail.
    pub note: String,
}

/// Everything the controller knows, and which zones need recomputing. No I/O: the shell feeds
/// it watch events and asks it for the statuses to write.
#[derive(Debug, Default)]
pub struct ZoneState {
    index: ZoneIndex,
    /// Last seen (labels, annotation value) per Node, to skip unrelated Node updates.
    nodes: HashMap<String, (BTreeMap<String, String>, Option<String>)>,
    zones: BTreeMap<String, ZoneObject>,
    reports: Reports,
    report_refs: HashMap<String, ObjectReference>,
    /// TrustZones to recompute.
    dirty: BTreeSet<String>,
    /// TunnelReports whose node existence must be checked.
    check_reports: BTreeSet<String>,
    /// Problems already reported, by object key, so each is reported once while it lasts.
    reported: HashMap<String, String>,
    warnings: Vec<Warning>,
}

impl ZoneState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// A Node was added or changed.
    pub fn apply_node(
        &mut self,
        name: &str,
        meta: &kube::core::ObjectMeta,
        reference: impl Fn() -> ObjectReference,
    ) {
        let labels = meta.labels.clone().unwrap_or_default();
        let annotation = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(TRANSPORT_ZONES))
            .cloned();
        let key = format!("node/{name}");
        if self.nodes.get(name) == Some(&(labels.clone(), annotation.clone())) {
            return;
        }
        let annotated: BTreeSet<String> = match annotation.as_deref().map(parse_transport_zones) {
            None => {
                self.reported.remove(&key);
                BTreeSet::new()
            }
            Some(Ok(z)) => {
                self.reported.remove(&key);
                z.into_iter().collect()
            }
            Some(Err(e)) => {
                let note = format!("{e}; the node is in no zone through this annotation");
                self.warn_once(key, reference(), "InvalidTransportZones", note);
                BTreeSet::new()
            }
        };
        self.nodes
            .insert(name.to_owned(), (labels.clone(), annotation));
        let before = self.index.zones_of(name).cloned().unwrap_or_default();
        let known_before = self.index.zones_of(name).is_some();
        self.index.upsert_node(name, labels, annotated);
        let after = self.index.zones_of(name).cloned().unwrap_or_default();
        self.dirty
            .extend(before.symmetric_difference(&after).cloned());
        if !known_before {
            // a report that named no Node may be valid now
            self.reported.remove(&format!("tunnelreport/{name}"));
        }
    }

    /// A Node was deleted.
    pub fn delete_node(&mut self, name: &str) {
        self.nodes.remove(name);
        self.reported.remove(&format!("node/{name}"));
        if let Some(z) = self.index.zones_of(name).cloned() {
            self.dirty.extend(z);
        }
        self.index.remove_node(name);
        if self.reports.contains_key(name) {
            self.check_reports.insert(name.to_owned());
        }
    }

    /// A TrustZone was added or changed.
    pub fn apply_zone(&mut self, tz: &TrustZone) {
        let name = tz.name_any();
        let selector = tz.spec.node_selector.clone();
        let selector_changed = self.zones.get(&name).is_none_or(|z| z.selector != selector);
        let mut selector_error = self.zones.get(&name).and_then(|z| z.selector_error.clone());
        if selector_changed {
            selector_error = match self.index.upsert_trust_zone(&name, selector.clone()) {
                Ok(_) => None,
                Err(e) => Some(e.0),
            };
        }
        self.zones.insert(
            name.clone(),
            ZoneObject {
                selector,
                selector_error,
                generation: tz.metadata.generation,
                resource_version: tz.resource_version(),
                status: tz.status.clone(),
                reference: tz.object_ref(&()),
            },
        );
        self.dirty.insert(name);
    }

    /// A TrustZone was deleted (the annotation zone of the same name, if any, lives on).
    pub fn delete_zone(&mut self, name: &str) {
        if self.zones.remove(name).is_some() {
            self.index.remove_trust_zone(name);
        }
        self.reported
            .retain(|k, _| !k.starts_with(&format!("trustzone/{name}/")));
        self.dirty.remove(name);
    }

    /// A TunnelReport was added or changed.
    pub fn apply_report(&mut self, report: &TunnelReport) {
        let name = report.name_any();
        let peers: BTreeSet<String> = report.spec.peers.iter().cloned().collect();
        self.report_refs
            .insert(name.clone(), report.object_ref(&()));
        if self.reports.get(&name) == Some(&peers) {
            return;
        }
        self.reports.insert(name.clone(), peers);
        self.touch_node_zones(&name);
        self.check_reports.insert(name);
    }

    /// A TunnelReport was deleted.
    pub fn delete_report(&mut self, name: &str) {
        self.report_refs.remove(name);
        self.reported.remove(&format!("tunnelreport/{name}"));
        if self.reports.remove(name).is_some() {
            self.touch_node_zones(name);
        }
    }

    fn touch_node_zones(&mut self, node: &str) {
        if let Some(z) = self.index.zones_of(node) {
            self.dirty.extend(z.iter().cloned());
        }
    }

    /// Marks every TrustZone for recomputation.
    pub fn touch_all(&mut self) {
        self.dirty.extend(self.zones.keys().cloned());
        self.check_reports.extend(self.reports.keys().cloned());
    }

    /// Known names of one kind (for pruning after a relist).
    fn names(&self, kind: Kind) -> Vec<String> {
        match kind {
            Kind::Node => self.nodes.keys().cloned().collect(),
            Kind::Zone => self.zones.keys().cloned().collect(),
            Kind::Report => self.report_refs.keys().cloned().collect(),
        }
    }

    fn delete(&mut self, kind: Kind, name: &str) {
        match kind {
            Kind::Node => self.delete_node(name),
            Kind::Zone => self.delete_zone(name),
            Kind::Report => self.delete_report(name),
        }
    }

    fn warn_once(&mut self, key: String, regarding: ObjectReference, reason: &str, note: String) {
        if self.reported.get(&key) == Some(&note) {
            return;
        }
        tracing::warn!(object = %key, reason, "{note}");
        self.reported.insert(key, note.clone());
        self.warnings.push(Warning {
            regarding,
            reason: reason.to_owned(),
            note,
        });
    }

    /// Warnings raised since the last call.
    pub fn take_warnings(&mut self) -> Vec<Warning> {
        std::mem::take(&mut self.warnings)
    }

    /// The TrustZones waiting to be recomputed.
    pub fn dirty(&self) -> &BTreeSet<String> {
        &self.dirty
    }

    /// Computes the status of every dirty zone and returns, for each TrustZone whose status
    /// must change, the zone, the resourceVersion the computation saw and the new status.
    /// `published` overrides the status seen in the watch for zones just written (the watch
    /// may not have caught up yet). Dirty zones are cleared.
    pub fn plan(
        &mut self,
        opts: &StatusOptions,
        published: &HashMap<String, (Option<String>, TrustZoneStatus)>,
    ) -> Vec<Planned> {
        self.check_unknown_reports();
        let now = zone_status::now_seconds();
        let mut out = Vec::new();
        for name in std::mem::take(&mut self.dirty) {
            let Some(z) = self.zones.get(&name) else {
                continue;
            };
            let members = self.index.members(&name);
            let snapshot = ZoneSnapshot {
                generation: z.generation,
                members: &members,
                selector: &z.selector,
                selector_error: z.selector_error.as_deref(),
            };
            let current = match published.get(&name) {
                Some((rv, s)) if *rv == z.resource_version => Some(s),
                _ => z.status.as_ref(),
            };
            let status = zone_status::zone_status(&snapshot, &self.reports, opts, current, &now);
            let change = zone_status::change(current, &status);
            let reference = z.reference.clone();
            let resource_version = z.resource_version.clone();
            self.zone_warnings(&name, reference, &status);
            if change != Change::None {
                out.push(Planned {
                    zone: name,
                    resource_version,
                    status,
                    change,
                });
            }
        }
        out
    }

    /// Warning Events for the conditions an admin must act on.
    fn zone_warnings(&mut self, name: &str, reference: ObjectReference, status: &TrustZoneStatus) {
        for reason in [REASON_INVALID_SELECTOR, REASON_KUBELET_SETTABLE_KEYS] {
            let key = format!("trustzone/{name}/{reason}");
            match status.conditions.iter().find(|c| c.reason == reason) {
                Some(c) => {
                    let note = c.message.clone();
                    self.warn_once(key, reference.clone(), reason, note);
                }
                None => {
                    self.reported.remove(&key);
                }
            }
        }
    }

    fn check_unknown_reports(&mut self) {
        for name in std::mem::take(&mut self.check_reports) {
            if !self.reports.contains_key(&name) || self.index.zones_of(&name).is_some() {
                continue;
            }
            let Some(reference) = self.report_refs.get(&name).cloned() else {
                continue;
            };
            self.warn_once(
                format!("tunnelreport/{name}"),
                reference,
                "UnknownNode",
                format!("TunnelReport {name:?} is named after no Node; it is ignored"),
            );
        }
    }

    /// Puts a zone back in the dirty set (a failed or deferred write).
    pub fn retry(&mut self, zone: &str) {
        if self.zones.contains_key(zone) {
            self.dirty.insert(zone.to_owned());
        }
    }

    /// Members of a zone (either carrier), sorted.
    pub fn members(&self, zone: &str) -> Vec<String> {
        self.index.members(zone)
    }
}

/// A status write the controller decided on.
#[derive(Clone, Debug)]
pub struct Planned {
    /// The TrustZone.
    pub zone: String,
    /// The resourceVersion of the TrustZone the status was computed from.
    pub resource_version: Option<String>,
    /// The new status.
    pub status: TrustZoneStatus,
    /// How it differs from the published one.
    pub change: Change,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Node,
    Zone,
    Report,
}

enum Input {
    Node(Result<watcher::Event<PartialObjectMeta<Node>>, watcher::Error>),
    Zone(Result<watcher::Event<TrustZone>, watcher::Error>),
    Report(Result<watcher::Event<TunnelReport>, watcher::Error>),
}

/// Relist bookkeeping of one watch.
#[derive(Default)]
struct Listing {
    synced: bool,
    seen: Option<HashSet<String>>,
}

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Runs the TrustZone status controller with `client` until the future is dropped. Nothing is
/// written before all three watches have listed once.
pub async fn run_zone_status(
    client: Client,
    cfg: ZoneStatusConfig,
) -> Result<(), ZoneControllerError> {
    let zones_api: Api<TrustZone> = Api::all(client.clone());
    let nodes = watcher(
        Api::<PartialObjectMeta<Node>>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .map(Input::Node);
    let zones = watcher(zones_api.clone(), watcher::Config::default())
        .default_backoff()
        .map(Input::Zone);
    let reports = watcher(
        Api::<TunnelReport>::all(client.clone()),
        watcher::Config::default(),
    )
    .default_backoff()
    .map(Input::Report);
    let stream = futures::stream::select(futures::stream::select(nodes, zones), reports);
    run_loop(client, zones_api, stream, cfg).await
}

async fn run_loop(
    client: Client,
    api: Api<TrustZone>,
    stream: impl Stream<Item = Input>,
    cfg: ZoneStatusConfig,
) -> Result<(), ZoneControllerError> {
    futures::pin_mut!(stream);
    let reporter = Reporter {
        controller: crate::controller::CONTROLLER_NAME.into(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let mut state = ZoneState::new();
    let mut listings: HashMap<Kind, Listing> = HashMap::new();
    // Per zone: (resourceVersion computed from, status written) of the last successful write.
    let mut published: HashMap<String, (Option<String>, TrustZoneStatus)> = HashMap::new();
    let mut last_write: HashMap<String, Instant> = HashMap::new();
    // Zones whose write is deferred or failed, and when to look again.
    let mut wake: BTreeMap<String, Instant> = BTreeMap::new();
    let mut backoff = RETRY_MIN;
    let mut resync_at = Instant::now() + cfg.resync;
    tracing::info!(
        protected_by_webhook = cfg.options.labels_protected_by_webhook,
        "TrustZone status controller starting"
    );
    loop {
        let next_wake = wake.values().min().copied();
        tokio::select! {
            ev = stream.next() => {
                let Some(ev) = ev else { return Err(ZoneControllerError::WatchEnded) };
                handle(&mut state, &mut listings, ev);
                // Coalesce a burst of events into one pass.
                while let Some(ev) = stream.next().now_or_never() {
                    let Some(ev) = ev else { return Err(ZoneControllerError::WatchEnded) };
                    handle(&mut state, &mut listings, ev);
                }
            }
            _ = sleep_until(next_wake) => {
                let now = Instant::now();
                let due: Vec<String> = wake.iter().filter(|(_, t)| **t <= now).map(|(z, _)| z.clone()).collect();
                for z in due {
                    wake.remove(&z);
                    state.retry(&z);
                }
            }
            _ = tokio::time::sleep_until(resync_at) => {
                resync_at = Instant::now() + cfg.resync;
                state.touch_all();
            }
        }
        let ready = [Kind::Node, Kind::Zone, Kind::Report]
            .iter()
            .all(|k| listings.get(k).is_some_and(|l| l.synced));
        if !ready {
            continue;
        }
        published.retain(|z, _| state.zones.contains_key(z));
        last_write.retain(|z, _| state.zones.contains_key(z));
        wake.retain(|z, _| state.zones.contains_key(z));
        let planned = state.plan(&cfg.options, &published);
        publish_warnings(&client, &reporter, state.take_warnings()).await;
        let mut failed = false;
        for p in planned {
            let now = Instant::now();
            if p.change == Change::MessageOnly {
                if wake.contains_key(&p.zone) {
                    // a deferred or failed write is already scheduled; recomputed then
                    continue;
                }
                if let Some(t) = last_write.get(&p.zone)
                    && now < *t + cfg.message_interval
                {
                    wake.insert(p.zone.clone(), *t + cfg.message_interval);
                    continue;
                }
            }
            // A significant change is written at once, whatever was scheduled.
            wake.remove(&p.zone);
            match write(&api, &p.zone, &p.status).await {
                Ok(()) => {
                    last_write.insert(p.zone.clone(), now);
                    published.insert(p.zone, (p.resource_version, p.status));
                }
                Err(e) => {
                    failed = true;
                    tracing::warn!(zone = %p.zone, error = %e, "writing TrustZone status failed (will retry)");
                    wake.insert(p.zone, now + backoff);
                }
            }
        }
        backoff = if failed {
            (backoff * 2).min(RETRY_MAX)
        } else {
            RETRY_MIN
        };
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn handle(state: &mut ZoneState, listings: &mut HashMap<Kind, Listing>, input: Input) {
    match input {
        Input::Node(ev) => on_event(
            state,
            listings,
            Kind::Node,
            ev,
            |s, n: &PartialObjectMeta<Node>| {
                let name = n.name_any();
                s.apply_node(&name, &n.metadata, || n.object_ref(&()));
                name
            },
        ),
        Input::Zone(ev) => on_event(state, listings, Kind::Zone, ev, |s, tz: &TrustZone| {
            s.apply_zone(tz);
            tz.name_any()
        }),
        Input::Report(ev) => on_event(state, listings, Kind::Report, ev, |s, r: &TunnelReport| {
            s.apply_report(r);
            r.name_any()
        }),
    }
}

/// Applies one watch event; a relist (Init … InitDone) prunes what it did not see.
fn on_event<K: ResourceExt>(
    state: &mut ZoneState,
    listings: &mut HashMap<Kind, Listing>,
    kind: Kind,
    ev: Result<watcher::Event<K>, watcher::Error>,
    apply: impl Fn(&mut ZoneState, &K) -> String,
) {
    let listing = listings.entry(kind).or_default();
    match ev {
        Err(e) => tracing::warn!(?kind, error = %e, "watch error (retrying)"),
        Ok(watcher::Event::Init) => listing.seen = Some(HashSet::new()),
        Ok(watcher::Event::InitApply(o)) => {
            let name = apply(state, &o);
            if let Some(seen) = listing.seen.as_mut() {
                seen.insert(name);
            }
        }
        Ok(watcher::Event::InitDone) => {
            listing.synced = true;
            if let Some(seen) = listing.seen.take() {
                for gone in state.names(kind) {
                    if !seen.contains(&gone) {
                        state.delete(kind, &gone);
                    }
                }
            }
            if kind == Kind::Node {
                // reports seen before the Nodes were listed may name existing Nodes after all
                state.touch_all();
            }
        }
        Ok(watcher::Event::Apply(o)) => {
            apply(state, &o);
        }
        Ok(watcher::Event::Delete(o)) => state.delete(kind, &o.name_any()),
    }
}

async fn write(
    api: &Api<TrustZone>,
    zone: &str,
    status: &TrustZoneStatus,
) -> Result<(), kube::Error> {
    let body = zone_status::status_patch(status);
    match api
        .patch_status(zone, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => {
            let ready = status
                .conditions
                .first()
                .map(|c| format!("{}/{}", c.status, c.reason))
                .unwrap_or_default();
            tracing::info!(zone, members = status.member_count, ready = %ready, "TrustZone status written");
            Ok(())
        }
        // Deleted meanwhile.
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Publishes Warning Events. Every Event goes through a fresh Recorder so that two different
/// problems with the same reason stay two Events (the Recorder folds a series into its first
/// note); the state already reports each problem once.
async fn publish_warnings(client: &Client, reporter: &Reporter, warnings: Vec<Warning>) {
    for w in warnings {
        let ev = Event {
            type_: EventType::Warning,
            reason: w.reason,
            note: Some(w.note),
            action: "ComputeTrustZoneStatus".into(),
            secondary: None,
        };
        let recorder = Recorder::new(client.clone(), reporter.clone());
        if let Err(e) = recorder.publish(&ev, &w.regarding).await {
            tracing::warn!(object = ?w.regarding.name, error = %e, "publishing Event failed");
        }
    }
}

#[cfg(test)]
#[path = "zone_controller_tests.rs"]
mod tests;
