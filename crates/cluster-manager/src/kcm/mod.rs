//! The sandbox's stand-ins for the parts of kube-controller-manager and kube-scheduler ovnk's
//! sandbox needs. **Never needed on a real cluster**, which runs the real ones; the sandbox
//! has only the embedded API server, so [`run_kcm`] runs, in-process:
//!
//! - an **EndpointSlice controller** ([`endpointslice`]): Services with a selector get
//!   EndpointSlices of their Pods (ready = Running and not terminating), labelled with ovnk's
//!   `endpointslice.kubernetes.io/managed-by` value and owned by the Service. The embedded API
//!   server has no owner-reference garbage collector, so this controller deletes the slices of a
//!   Service that is gone or lost its selector itself.
//! - **pod GC** ([`orphaned_pods`]): Pods bound to a Node that no longer exists are deleted
//!   (grace period 0), after the Node's absence is confirmed with a GET.
//! - a **trivial scheduler** ([`schedule`]): a Pod without `spec.nodeName` goes to the
//!   schedulable Node with the fewest Pods (Ready Nodes preferred when any is Ready; ties by
//!   name). The embedded API server has no `pods/binding` subresource, so binding is a JSON
//!   merge patch of `spec.nodeName` carrying the Pod's `metadata.resourceVersion` as a
//!   precondition (a Pod changed meanwhile answers 409 and is retried on the next pass).
//!
//! Each is a level-triggered loop over reflector stores: every change (and a periodic resync)
//! runs a pass over all objects; an error on one object is logged and retried with backoff and
//! never stops the others.

pub mod endpointslice;

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

const RESYNC: Duration = Duration::from_secs(30);
const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Runs the EndpointSlice controller, pod GC and the scheduler until the future is dropped
/// (the sandbox runs it as a task). Returns only if a watch stream ends.
pub async fn run_kcm(client: Client) -> anyhow::Result<()> {
    let (eps, gc, sched) = (
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
        Arc::new(Notify::new()),
    );
    let (services, drive_svc) = reflect::<Service>(&client, vec![eps.clone()]);
    let (pods, drive_pods) = reflect::<Pod>(&client, vec![eps.clone(), gc.clone(), sched.clone()]);
    let (slices, drive_slices) = reflect::<EndpointSlice>(&client, vec![eps.clone()]);
    let (nodes, drive_nodes) = reflect::<Node>(&client, vec![gc.clone(), sched.clone()]);
    tracing::info!("sandbox controllers (EndpointSlice, pod GC, scheduler) starting");

    let eps_loop = {
        let (c, services, pods, slices) = (
            client.clone(),
            services.clone(),
            pods.clone(),
            slices.clone(),
        );
        control_loop("endpointslice", eps, move || {
            let (c, services, pods, slices) =
                (c.clone(), services.clone(), pods.clone(), slices.clone());
            async move { sync_endpoint_slices(&c, &services, &pods, &slices).await }
        })
    };
    let gc_loop = {
        let (c, pods, nodes) = (client.clone(), pods.clone(), nodes.clone());
        control_loop("pod-gc", gc, move || {
            let (c, pods, nodes) = (c.clone(), pods.clone(), nodes.clone());
            async move { gc_pods(&c, &pods, &nodes).await }
        })
    };
    let sched_loop = {
        let (c, pods, nodes) = (client.clone(), pods.clone(), nodes.clone());
        control_loop("scheduler", sched, move || {
            let (c, pods, nodes) = (c.clone(), pods.clone(), nodes.clone());
            async move { schedule_pods(&c, &pods, &nodes).await }
        })
    };
    let ready = async {
        let _ = tokio::join!(
            services.wait_until_ready(),
            pods.wait_until_ready(),
            slices.wait_until_ready(),
            nodes.wait_until_ready(),
        );
    };
    let loops = async move {
        ready.await;
        tokio::join!(eps_loop, gc_loop, sched_loop);
    };
    tokio::select! {
        _ = loops => Ok(()),
        r = drive_svc => r,
        r = drive_pods => r,
        r = drive_slices => r,
        r = drive_nodes => r,
    }
}

/// A reflector store for `K` and the future that keeps it fed; every change pokes `notify`.
fn reflect<K>(
    client: &Client,
    notify: Vec<Arc<Notify>>,
) -> (Store<K>, impl Future<Output = anyhow::Result<()>>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(Api::<K>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let drive = async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                Ok(_) => notify.iter().for_each(|n| n.notify_one()),
                Err(e) => tracing::warn!(kind = %kind, error = %e, "watch error (retrying)"),
            }
        }
        anyhow::bail!("{kind} watch ended")
    };
    (reader, drive)
}

/// Runs `pass` on every poke, on a periodic resync, and again with backoff while it reports
/// failures (`pass` returns how many objects failed).
async fn control_loop<F, Fut>(name: &'static str, notify: Arc<Notify>, mut pass: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = usize>,
{
    let mut backoff = RETRY_MIN;
    loop {
        let span = tracing::debug_span!("kcm_pass", controller = name);
        let failed = tracing::Instrument::instrument(pass(), span).await;
        let wait = if failed == 0 {
            backoff = RETRY_MIN;
            RESYNC
        } else {
            tracing::debug!(controller = name, failed, "pass had failures; retrying");
            let w = backoff;
            backoff = (backoff * 2).min(RETRY_MAX);
            w
        };
        let _ = tokio::time::timeout(wait, notify.notified()).await;
    }
}

fn key<K: Resource>(o: &K) -> (String, String) {
    (o.namespace().unwrap_or_default(), o.name_any())
}

async fn sync_endpoint_slices(
    client: &Client,
    services: &Store<Service>,
    pods: &Store<Pod>,
    slices: &Store<EndpointSlice>,
) -> usize {
    let pods = pods.state();
    let mut by_ns: HashMap<String, Vec<&Pod>> = HashMap::new();
    for p in &pods {
        by_ns
            .entry(p.namespace().unwrap_or_default())
            .or_default()
            .push(p);
    }
    let mut desired: BTreeMap<(String, String), EndpointSlice> = BTreeMap::new();
    for svc in services.state() {
        let ns_pods = by_ns.get(&svc.namespace().unwrap_or_default());
        for s in endpointslice::desired_slices(&svc, ns_pods.into_iter().flatten().copied()) {
            desired.insert(key(&s), s);
        }
    }
    let current: BTreeMap<(String, String), Arc<EndpointSlice>> = slices
        .state()
        .into_iter()
        .filter(|s| endpointslice::is_managed(s))
        .map(|s| (key(&*s), s))
        .collect();

    let mut failed = 0;
    for ((ns, name), want) in &desired {
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let res = match current.get(&(ns.clone(), name.clone())) {
            Some(cur) if endpointslice::up_to_date(cur, want) => continue,
            Some(cur) => {
                let mut next = want.clone();
                next.metadata.resource_version = cur.resource_version();
                api.replace(name, &PostParams::default(), &next)
                    .await
                    .map(|_| "updated")
            }
            None => api
                .create(&PostParams::default(), want)
                .await
                .map(|_| "created"),
        };
        match res {
            Ok(what) => {
                tracing::info!(namespace = %ns, slice = %name, endpoints = want.endpoints.len(), "EndpointSlice {what}")
            }
            // The cache was behind (already exists / changed meanwhile): the next pass sees it.
            Err(e) => {
                failed += 1;
                tracing::warn!(namespace = %ns, slice = %name, error = %e, "EndpointSlice write failed (will retry)");
            }
        }
    }
    for ((ns, name), cur) in &current {
        if desired.contains_key(&(ns.clone(), name.clone())) {
            continue;
        }
        let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
        let dp = DeleteParams {
            preconditions: cur
                .metadata
                .uid
                .clone()
                .map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
            ..DeleteParams::default()
        };
        match api.delete(name, &dp).await {
            Ok(_) => tracing::info!(namespace = %ns, slice = %name, "EndpointSlice deleted"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                failed += 1;
                tracing::warn!(namespace = %ns, slice = %name, error = %e, "EndpointSlice delete failed (will retry)");
            }
        }
    }
    failed
}

/// Pods bound to a Node that is not in `nodes`: `(namespace, name, node)`.
pub fn orphaned_pods<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<(String, String, String)> {
    let names: std::collections::HashSet<String> =
        nodes.into_iter().map(|n| n.name_any()).collect();
    pods.into_iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            (!names.contains(&node))
                .then(|| (p.namespace().unwrap_or_default(), p.name_any(), node))
        })
        .collect()
}

async fn gc_pods(client: &Client, pods: &Store<Pod>, nodes: &Store<Node>) -> usize {
    let (p, n) = (pods.state(), nodes.state());
    let orphans = orphaned_pods(n.iter().map(|n| &**n), p.iter().map(|p| &**p));
    let node_api: Api<Node> = Api::all(client.clone());
    let mut failed = 0;
    for (ns, name, node) in orphans {
        // The Node cache may lag behind a just-created Node: confirm with the server.
        match node_api.get_opt(&node).await {
            Ok(None) => {}
            Ok(Some(_)) => continue,
            Err(e) => {
                failed += 1;
                tracing::warn!(node = %node, error = %e, "checking node for pod GC failed");
                continue;
            }
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match api
            .delete(&name, &DeleteParams::default().grace_period(0))
            .await
        {
            Ok(_) => {
                tracing::info!(namespace = %ns, pod = %name, node = %node, "deleted pod of a deleted node")
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                failed += 1;
                tracing::warn!(namespace = %ns, pod = %name, error = %e, "pod GC delete failed (will retry)");
            }
        }
    }
    failed
}

fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

fn terminal(p: &Pod) -> bool {
    matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Binds every unscheduled, non-terminating Pod to the schedulable Node with the fewest Pods
/// (counting the bindings decided in this call), preferring Ready Nodes when any is Ready, ties
/// by name. Returns `(namespace, name, resourceVersion, node)` per binding.
pub fn schedule<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    pods: impl IntoIterator<Item = &'a Pod> + Clone,
) -> Vec<(String, String, String, String)> {
    let candidates: Vec<&Node> = nodes
        .into_iter()
        .filter(|n| {
            n.metadata.deletion_timestamp.is_none()
                && !n
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false)
        })
        .collect();
    let any_ready = candidates.iter().any(|n| node_ready(n));
    let mut load: BTreeMap<String, usize> = candidates
        .iter()
        .filter(|n| !any_ready || node_ready(n))
        .map(|n| (n.name_any(), 0))
        .collect();
    if load.is_empty() {
        return Vec::new();
    }
    for p in pods.clone() {
        if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.as_ref())
            && !terminal(p)
            && let Some(c) = load.get_mut(node)
        {
            *c += 1;
        }
    }
    let mut unscheduled: Vec<&Pod> = pods
        .into_iter()
        .filter(|p| {
            p.spec.as_ref().is_some_and(|s| s.node_name.is_none())
                && p.metadata.deletion_timestamp.is_none()
                && !terminal(p)
        })
        .collect();
    unscheduled.sort_by_key(|p| (p.creation_timestamp().map(|t| t.0), key(*p)));
    let mut out = Vec::new();
    for p in unscheduled {
        let Some((node, count)) = load
            .iter_mut()
            .min_by_key(|(name, c)| (**c, (*name).clone()))
        else {
            break;
        };
        *count += 1;
        let (ns, name) = key(p);
        out.push((
            ns,
            name,
            p.resource_version().unwrap_or_default(),
            node.clone(),
        ));
    }
    out
}

async fn schedule_pods(client: &Client, pods: &Store<Pod>, nodes: &Store<Node>) -> usize {
    let (p, n) = (pods.state(), nodes.state());
    let bindings = schedule(n.iter().map(|n| &**n), p.iter().map(|p| &**p));
    let mut failed = 0;
    for (ns, name, rv, node) in bindings {
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let body = serde_json::json!({
            "metadata": {"resourceVersion": rv},
            "spec": {"nodeName": node},
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
            .await
        {
            Ok(_) => tracing::info!(namespace = %ns, pod = %name, node = %node, "pod scheduled"),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => {
                failed += 1;
                tracing::warn!(namespace = %ns, pod = %name, error = %e, "binding pod failed (will retry)");
            }
        }
    }
    failed
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("fixture")
    }

    fn node(name: &str, ready: Option<bool>) -> Node {
        let conds =
            ready.map(|r| json!([{"type": "Ready", "status": if r {"True"} else {"False"}}]));
        from(json!({"metadata": {"name": name}, "status": {"conditions": conds}}))
    }

    fn pod(name: &str, node: Option<&str>) -> Pod {
        from(json!({
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": "7"},
            "spec": {"nodeName": node, "containers": [{"name": "c"}]},
        }))
    }

    #[test]
    fn scheduler_balances_and_prefers_ready() {
        let nodes = [node("b", None), node("a", None), node("c", None)];
        let pods = [
            pod("x", Some("a")),
            pod("u1", None),
            pod("u2", None),
            pod("u3", None),
        ];
        let got: Vec<(String, String)> = schedule(&nodes, &pods)
            .into_iter()
            .map(|(_, p, _, n)| (p, n))
            .collect();
        assert_eq!(
            got,
            vec![
                ("u1".into(), "b".into()),
                ("u2".into(), "c".into()),
                ("u3".into(), "a".into())
            ]
        );
        let nodes = [node("a", Some(false)), node("z", Some(true))];
        let got = schedule(&nodes, &[pod("u", None)]);
        assert_eq!(got[0].3, "z");
        assert!(schedule(&[], &[pod("u", None)]).is_empty());
        let mut cordoned = node("a", None);
        cordoned.spec = Some(from(json!({"unschedulable": true})));
        assert!(schedule(&[cordoned], &[pod("u", None)]).is_empty());
    }

    #[test]
    fn orphans_are_pods_of_missing_nodes() {
        let nodes = [node("a", None)];
        let pods = [pod("x", Some("a")), pod("y", Some("gone")), pod("z", None)];
        assert_eq!(
            orphaned_pods(&nodes, &pods),
            vec![("ns".into(), "y".into(), "gone".into())]
        );
    }
}
