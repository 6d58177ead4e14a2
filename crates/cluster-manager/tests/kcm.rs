//! The sandbox controllers (EndpointSlice, pod GC, scheduler) against the embedded API server.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

fn start(c: &Client) -> JoinHandle<()> {
    let c = c.clone();
    tokio::spawn(async move {
        if let Err(e) = cluster_manager::kcm::run_kcm(c).await {
            panic!("kcm stopped: {e}");
        }
    })
}

async fn create_pod(c: &Client, name: &str, node: Option<&str>, labels: serde_json::Value) {
    let api: Api<Pod> = Api::namespaced(c.clone(), "default");
    api.create(
        &PostParams::default(),
        &from(json!({
            "metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "pause"}]},
        })),
    )
    .await
    .expect("create pod");
}

async fn set_status(c: &Client, name: &str, phase: &str, ip: &str) {
    let api: Api<Pod> = Api::namespaced(c.clone(), "default");
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}]}})),
    )
    .await
    .expect("pod status");
}

async fn slices_of(c: &Client, svc: &str) -> Vec<EndpointSlice> {
    let api: Api<EndpointSlice> = Api::namespaced(c.clone(), "default");
    api.list(&ListParams::default().labels(&format!("kubernetes.io/service-name={svc}")))
        .await
        .expect("list slices")
        .items
}

/// (address, ready, nodeName, targetRef name) of every endpoint of `svc`'s slices.
async fn endpoints(c: &Client, svc: &str) -> Vec<(String, bool, String, String)> {
    let mut v: Vec<_> = slices_of(c, svc)
        .await
        .into_iter()
        .flat_map(|s| s.endpoints)
        .map(|e| {
            (
                e.addresses.first().cloned().unwrap_or_default(),
                e.conditions.and_then(|c| c.ready).unwrap_or(false),
                e.node_name.unwrap_or_default(),
                e.target_ref.and_then(|r| r.name).unwrap_or_default(),
            )
        })
        .collect();
    v.sort();
    v
}

async fn wait_endpoints(c: &Client, svc: &str, want: Vec<(&str, bool, &str, &str)>) {
    let want: Vec<(String, bool, String, String)> = want
        .into_iter()
        .map(|(a, r, n, p)| (a.into(), r, n.into(), p.into()))
        .collect();
    eventually(&format!("endpoints of {svc} = {want:?}"), || async {
        (endpoints(c, svc).await == want).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_slices_follow_pods_and_services() {
    let (_s, c) = server().await;
    create_node(&c, "n1", json!({})).await;
    create_node(&c, "n2", json!({})).await;
    let kcm = start(&c);
    let services: Api<Service> = Api::namespaced(c.clone(), "default");
    let web = services
        .create(
            &PostParams::default(),
            &from(json!({
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [
                    {"name": "http", "port": 80, "targetPort": 8080},
                    {"name": "plain", "port": 81},
                ]},
            })),
        )
        .await
        .expect("svc");
    services
        .create(
            &PostParams::default(),
            &from(json!({"metadata": {"name": "ext"}, "spec": {"ports": [{"port": 80}]}})),
        )
        .await
        .expect("svc ext");

    // An empty slice first, labelled and owned.
    let s = eventually("empty slice for web", || async {
        slices_of(&c, "web").await.into_iter().next()
    })
    .await;
    assert!(s.endpoints.is_empty());
    assert_eq!(s.address_type, "IPv4");
    assert_eq!(
        s.labels()
            .get("endpointslice.kubernetes.io/managed-by")
            .map(String::as_str),
        Some(cluster_manager::kcm::endpointslice::MANAGED_BY)
    );
    let owner = &s.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), Some(&owner.uid)),
        ("Service", "web", web.metadata.uid.as_ref())
    );

    // A pod gets an IP (not ready while Pending), then becomes Running.
    create_pod(&c, "p1", Some("n1"), json!({"app": "web"})).await;
    create_pod(&c, "other", Some("n1"), json!({"app": "db"})).await;
    set_status(&c, "other", "Running", "10.244.0.9").await;
    set_status(&c, "p1", "Pending", "10.244.0.5").await;
    wait_endpoints(&c, "web", vec![("10.244.0.5", false, "n1", "p1")]).await;
    set_status(&c, "p1", "Running", "10.244.0.5").await;
    wait_endpoints(&c, "web", vec![("10.244.0.5", true, "n1", "p1")]).await;
    let ports: Vec<(String, i32)> = slices_of(&c, "web").await[0]
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap_or_default(), p.port.unwrap_or(0)))
        .collect();
    assert_eq!(ports, vec![("http".into(), 8080), ("plain".into(), 81)]);

    create_pod(&c, "p2", Some("n2"), json!({"app": "web"})).await;
    set_status(&c, "p2", "Running", "10.244.1.5").await;
    wait_endpoints(
        &c,
        "web",
        vec![
            ("10.244.0.5", true, "n1", "p1"),
            ("10.244.1.5", true, "n2", "p2"),
        ],
    )
    .await;

    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.delete("p1", &DeleteParams::default())
        .await
        .expect("delete p1");
    wait_endpoints(&c, "web", vec![("10.244.1.5", true, "n2", "p2")]).await;
    // The one slice was updated in place, not replaced by another.
    assert_eq!(slices_of(&c, "web").await.len(), 1);
    assert_eq!(slices_of(&c, "web").await[0].name_any(), s.name_any());

    // A Service without a selector is left alone.
    assert!(slices_of(&c, "ext").await.is_empty());

    // Losing the selector, then coming back, then deletion.
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": null}})),
        )
        .await
        .expect("drop selector");
    eventually("web's slices gone after losing its selector", || async {
        slices_of(&c, "web").await.is_empty().then_some(())
    })
    .await;
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"selector": {"app": "web"}}})),
        )
        .await
        .expect("selector back");
    wait_endpoints(&c, "web", vec![("10.244.1.5", true, "n2", "p2")]).await;
    services
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete svc");
    eventually("web's slices gone after deletion", || async {
        slices_of(&c, "web").await.is_empty().then_some(())
    })
    .await;
    kcm.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_gc_deletes_pods_of_a_deleted_node() {
    let (_s, c) = server().await;
    create_node(&c, "n1", json!({})).await;
    create_node(&c, "n2", json!({})).await;
    create_pod(&c, "on-n1", Some("n1"), json!({})).await;
    create_pod(&c, "on-n2", Some("n2"), json!({})).await;
    let kcm = start(&c);
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.clone());
    nodes
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete n1");
    eventually("on-n1 deleted", || async {
        pods.get_opt("on-n1")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(pods.get_opt("on-n2").await.expect("get").is_some());
    kcm.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_binds_unscheduled_pods_to_the_least_loaded_node() {
    let (_s, c) = server().await;
    create_node(&c, "n1", json!({})).await;
    create_node(&c, "n2", json!({})).await;
    create_pod(&c, "busy", Some("n1"), json!({})).await;
    let kcm = start(&c);
    create_pod(&c, "u1", None, json!({})).await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    let node_of = |name: &'static str| {
        let pods = pods.clone();
        async move {
            eventually(&format!("{name} scheduled"), || async {
                pods.get(name).await.ok()?.spec?.node_name
            })
            .await
        }
    };
    assert_eq!(node_of("u1").await, "n2", "n1 already has a pod");
    create_pod(&c, "u2", None, json!({})).await;
    // Both nodes have one pod now: tie broken by name.
    assert_eq!(node_of("u2").await, "n1");
    kcm.abort();
}
