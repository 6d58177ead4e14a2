//! The cluster manager against the embedded API server: annotations in upstream's formats,
//! restarts, release on delete, conflicts, malformed values and exhaustion.

mod common;

use std::collections::BTreeMap;

use cluster_manager::alloc::AllocConfig;
use common::*;
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use tokio::task::JoinHandle;

const KEYS: [&str; 4] = [
    "k8s.ovn.org/node-id",
    "k8s.ovn.org/node-subnets",
    "k8s.ovn.org/node-transit-switch-port-ifaddr",
    "k8s.ovn.org/node-gateway-router-lrp-ifaddrs",
];

fn cfg(cluster: &str) -> AllocConfig {
    AllocConfig::new(
        cluster.parse().expect("cidr"),
        24,
        "100.88.0.0/16".parse().expect("cidr"),
        "100.64.0.0/16".parse().expect("cidr"),
    )
    .expect("config")
}

fn start(c: &Client, cluster: &str) -> JoinHandle<()> {
    let (c, cfg) = (c.clone(), cfg(cluster));
    tokio::spawn(async move {
        if let Err(e) = cluster_manager::run_with_client(c, cfg).await {
            panic!("cluster manager stopped: {e}");
        }
    })
}

async fn stop(h: JoinHandle<()>) {
    h.abort();
    let _ = h.await;
}

/// The four cluster-manager annotations of `name`, once all are present.
async fn allocation(c: &Client, name: &str) -> BTreeMap<String, String> {
    let api: Api<Node> = Api::all(c.clone());
    eventually(&format!("allocation of {name}"), || async {
        let n = api.get(name).await.ok()?;
        let a = n.annotations();
        KEYS.iter()
            .map(|k| a.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect::<Option<BTreeMap<_, _>>>()
    })
    .await
}

/// Waits until `name`'s allocation satisfies `pred`.
async fn allocation_where(
    c: &Client,
    name: &str,
    pred: impl Fn(&BTreeMap<String, String>) -> bool,
) -> BTreeMap<String, String> {
    let api: Api<Node> = Api::all(c.clone());
    eventually(&format!("allocation of {name} to change"), || async {
        let n = api.get(name).await.ok()?;
        let a: BTreeMap<String, String> = KEYS
            .iter()
            .filter_map(|k| n.annotations().get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        (a.len() == KEYS.len() && pred(&a)).then_some(a)
    })
    .await
}

fn expected(id: u32, subnet: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (KEYS[0].to_string(), id.to_string()),
        (
            KEYS[1].to_string(),
            format!(r#"{{"default":["{subnet}"]}}"#),
        ),
        (
            KEYS[2].to_string(),
            format!(r#"{{"ipv4":"100.88.0.{id}/16"}}"#),
        ),
        (
            KEYS[3].to_string(),
            format!(r#"{{"default":{{"ipv4":"100.64.0.{id}/16"}}}}"#),
        ),
    ])
}

/// Warning Events on Node `name` (the recorder puts cluster-scoped objects' Events in `default`).
async fn warnings(c: &Client, name: &str) -> Vec<(String, String)> {
    let api: Api<Event> = Api::namespaced(c.clone(), "default");
    api.list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect()
}

async fn warning_containing(c: &Client, name: &str, reason: &str, words: &[&str]) -> String {
    eventually(
        &format!("{reason} Event on {name} mentioning {words:?}"),
        || async {
            warnings(c, name)
                .await
                .into_iter()
                .find(|(r, m)| r == reason && words.iter().all(|w| m.contains(w)))
                .map(|(_, m)| m)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_get_distinct_allocations_that_survive_a_restart() {
    let (_s, c) = server().await;
    for n in ["node1", "node2", "node3"] {
        create_node(&c, n, json!({})).await;
    }
    let cm = start(&c, "10.244.0.0/16");
    // Same creationTimestamp second: ordered by name. IDs start at 2 as upstream's.
    let mut before = BTreeMap::new();
    for (i, n) in ["node1", "node2", "node3"].into_iter().enumerate() {
        let a = allocation(&c, n).await;
        assert_eq!(
            a,
            expected(2 + i as u32, &format!("10.244.{i}.0/24")),
            "{n}"
        );
        before.insert(n, a);
    }
    let api: Api<Node> = Api::all(c.clone());
    let rv1 = api.get("node1").await.expect("node1").resource_version();

    stop(cm).await;
    create_node(&c, "node4", json!({})).await;
    let cm = start(&c, "10.244.0.0/16");
    assert_eq!(allocation(&c, "node4").await, expected(5, "10.244.3.0/24"));
    for (n, a) in &before {
        assert_eq!(&allocation(&c, n).await, a, "{n} kept its allocation");
    }
    // The pass that allocated node4 saw node1 too and did not rewrite it.
    assert_eq!(
        api.get("node1").await.expect("node1").resource_version(),
        rv1
    );
    stop(cm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_nodes_subnet_is_reused_only_after_deletion() {
    let (_s, c) = server().await;
    let cm = start(&c, "10.244.0.0/16");
    create_node(&c, "a", json!({})).await;
    allocation(&c, "a").await;
    create_node(&c, "b", json!({})).await;
    let b = allocation(&c, "b").await;
    create_node(&c, "c", json!({})).await;
    let cc = allocation(&c, "c").await;
    assert_ne!(cc[KEYS[1]], b[KEYS[1]]);
    assert_ne!(cc[KEYS[0]], b[KEYS[0]]);

    let api: Api<Node> = Api::all(c.clone());
    api.delete("b", &DeleteParams::default())
        .await
        .expect("delete b");
    // Wait until the deletion is certainly seen: a node created now gets b's values.
    create_node(&c, "d", json!({})).await;
    let d = allocation(&c, "d").await;
    assert_eq!(d, b, "d reuses what b released (lowest free)");
    stop(cm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_colliding_node_is_reallocated_with_an_event() {
    let (_s, c) = server().await;
    // Before start: two nodes publish the same values; the later (by name, same second) loses.
    let dup = expected(7, "10.244.9.0/24");
    create_node(&c, "first", json!(dup)).await;
    create_node(&c, "second", json!(dup)).await;
    let cm = start(&c, "10.244.0.0/16");
    let second = allocation_where(&c, "second", |a| a != &dup).await;
    assert_eq!(
        allocation(&c, "first").await,
        dup,
        "the older node keeps it"
    );
    assert_ne!(second[KEYS[0]], dup[KEYS[0]]);
    assert_ne!(second[KEYS[1]], dup[KEYS[1]]);
    let m = warning_containing(
        &c,
        "second",
        "NodeAllocationConflict",
        &["node-subnets", "10.244.9.0/24", "first"],
    )
    .await;
    assert!(m.contains("reallocating"), "{m}");
    warning_containing(
        &c,
        "second",
        "NodeAllocationConflict",
        &["node-id", "first"],
    )
    .await;
    assert!(warnings(&c, "first").await.is_empty());

    // While running: a new node pre-annotated with first's subnet.
    create_node(
        &c,
        "intruder",
        json!({"k8s.ovn.org/node-subnets": r#"{"default":["10.244.9.0/24"]}"#}),
    )
    .await;
    let i = allocation_where(&c, "intruder", |a| a[KEYS[1]] != dup[KEYS[1]]).await;
    assert!(i[KEYS[1]].starts_with(r#"{"default":["10.244."#), "{i:?}");
    warning_containing(
        &c,
        "intruder",
        "NodeAllocationConflict",
        &["10.244.9.0/24", "first"],
    )
    .await;
    assert_eq!(allocation(&c, "first").await, dup);
    stop(cm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_annotations_are_replaced_with_an_event() {
    let (_s, c) = server().await;
    create_node(
        &c,
        "bad",
        json!({
            "k8s.ovn.org/node-id": "banana",
            "k8s.ovn.org/node-subnets": "{not json",
            "k8s.ovn.org/node-transit-switch-port-ifaddr": r#"{"ipv4":"fd97::3/64"}"#,
            "k8s.ovn.org/node-gateway-router-lrp-ifaddrs": "[]",
        }),
    )
    .await;
    create_node(
        &c,
        "far",
        json!({"k8s.ovn.org/node-id": "70000", "k8s.ovn.org/node-subnets": r#"{"default":["192.168.0.0/24"]}"#}),
    )
    .await;
    let cm = start(&c, "10.244.0.0/16");
    let bad = allocation_where(&c, "bad", |a| a[KEYS[0]] != "banana").await;
    assert_eq!(bad, expected(2, "10.244.0.0/24"));
    warning_containing(
        &c,
        "bad",
        "InvalidNodeAllocation",
        &["node-id", "malformed"],
    )
    .await;
    warning_containing(
        &c,
        "bad",
        "InvalidNodeAllocation",
        &["node-subnets", "malformed"],
    )
    .await;
    let far = allocation_where(&c, "far", |a| a[KEYS[0]] != "70000").await;
    assert_eq!(far, expected(3, "10.244.1.0/24"));
    warning_containing(
        &c,
        "far",
        "InvalidNodeAllocation",
        &["70000", "out of range"],
    )
    .await;
    warning_containing(
        &c,
        "far",
        "InvalidNodeAllocation",
        &["192.168.0.0/24", "out of range"],
    )
    .await;
    stop(cm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhaustion_is_an_event_on_that_node_only() {
    let (_s, c) = server().await;
    // Two /24 subnets only.
    let cm = start(&c, "10.244.0.0/23");
    create_node(&c, "a", json!({})).await;
    allocation(&c, "a").await;
    create_node(&c, "b", json!({})).await;
    allocation(&c, "b").await;
    create_node(&c, "c", json!({})).await;
    warning_containing(&c, "c", "NodeAllocationFailed", &["no free node subnet"]).await;
    let api: Api<Node> = Api::all(c.clone());
    let n = api.get("c").await.expect("c");
    assert!(
        KEYS.iter().all(|k| !n.annotations().contains_key(*k)),
        "{:?}",
        n.annotations()
    );
    // Others unaffected, and c gets one as soon as one is free.
    let a = allocation(&c, "a").await;
    api.delete("a", &DeleteParams::default())
        .await
        .expect("delete a");
    assert_eq!(allocation(&c, "c").await, a);
    stop(cm).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_allocation_is_restored_with_an_event() {
    let (_s, c) = server().await;
    let cm = start(&c, "10.244.0.0/16");
    create_node(&c, "a", json!({})).await;
    let a = allocation(&c, "a").await;
    let api: Api<Node> = Api::all(c.clone());
    api.patch(
        "a",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"annotations": {
            "k8s.ovn.org/node-id": "42",
            "k8s.ovn.org/node-transit-switch-port-ifaddr": null,
        }}})),
    )
    .await
    .expect("edit");
    let restored = allocation_where(&c, "a", |now| now == &a).await;
    assert_eq!(restored, a);
    warning_containing(
        &c,
        "a",
        "InvalidNodeAllocation",
        &["node-id", "42", "rewriting"],
    )
    .await;
    stop(cm).await;
}
