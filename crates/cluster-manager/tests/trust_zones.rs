//! The TrustZone status controller against the embedded API server, running as the cluster
//! manager's ServiceAccount with only the grants of `manifests/zones/rbac.yaml`; and that
//! manifest's grants for node identities.

mod common;

use std::time::Duration;

use cluster_manager::zone_status::StatusOptions;
use cluster_manager::{ZoneStatusConfig, run_zone_status};
use common::*;
use k8s_api::trust_zone::{TrustZone, TrustZoneStatus, TunnelReport};
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

const RBAC_YAML: &str = include_str!("../../../manifests/zones/rbac.yaml");
const CM_USER: &str = "system:serviceaccount:ovn-kubernetes:ovnkube-cluster-manager";
const CM_GROUPS: &[&str] = &[
    "system:serviceaccounts",
    "system:serviceaccounts:ovn-kubernetes",
];

/// The API server with ovnk's CRDs and the trust-zones RBAC installed.
async fn setup() -> (apiserver::ApiServer, Client) {
    let (s, admin) = server().await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in k8s_api::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let tz: Api<TrustZone> = Api::all(admin.clone());
    eventually("TrustZones served", || async {
        tz.list(&ListParams::default()).await.ok()
    })
    .await;
    apply_yaml(&admin, RBAC_YAML).await;
    (s, admin)
}

/// Creates every document of a multi-document YAML (kinds whose plural is `<kind>s`).
async fn apply_yaml(c: &Client, yaml: &str) {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("YAML");
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        let api_version = d["apiVersion"].as_str().expect("apiVersion").to_owned();
        let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
        let kind = d["kind"].as_str().expect("kind").to_owned();
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, &kind),
            &format!("{}s", kind.to_lowercase()),
        );
        let api: Api<DynamicObject> = match d["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(c.clone(), ns, &ar),
            None => Api::all_with(c.clone(), &ar),
        };
        let obj: DynamicObject = serde_json::from_value(d).expect("object");
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("creating {kind} {}: {e}", obj.name_any()),
        }
    }
}

fn test_config(protected_by_webhook: bool) -> ZoneStatusConfig {
    ZoneStatusConfig {
        options: StatusOptions {
            labels_protected_by_webhook: protected_by_webhook,
        },
        message_interval: Duration::from_millis(200),
        ..Default::default()
    }
}

/// Starts the controller as the cluster manager's ServiceAccount.
async fn start(s: &apiserver::ApiServer, protected_by_webhook: bool) -> JoinHandle<()> {
    let c = s.client(CM_USER, CM_GROUPS).await.expect("cm client");
    let cfg = test_config(protected_by_webhook);
    tokio::spawn(async move {
        if let Err(e) = run_zone_status(c, cfg).await {
            panic!("zone status controller stopped: {e}");
        }
    })
}

async fn stop(h: JoinHandle<()>) {
    h.abort();
    let _ = h.await;
}

async fn node(c: &Client, name: &str, labels: Value, annotations: Value) {
    let api: Api<Node> = Api::all(c.clone());
    api.create(
        &PostParams::default(),
        &from(json!({"metadata": {"name": name, "labels": labels, "annotations": annotations}})),
    )
    .await
    .expect("create node");
}

async fn patch_node(c: &Client, name: &str, metadata: Value) {
    let api: Api<Node> = Api::all(c.clone());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&json!({ "metadata": metadata })),
    )
    .await
    .expect("patch node");
}

async fn zone(c: &Client, name: &str, selector: Value) {
    let api: Api<TrustZone> = Api::all(c.clone());
    api.create(
        &PostParams::default(),
        &from(
            json!({"apiVersion": "k8s.ovn.org/v1alpha1", "kind": "TrustZone",
            "metadata": {"name": name}, "spec": {"nodeSelector": selector}}),
        ),
    )
    .await
    .expect("create TrustZone");
}

/// Creates or replaces the TunnelReport of `node`.
async fn report(c: &Client, node: &str, peers: &[&str]) {
    let api: Api<TunnelReport> = Api::all(c.clone());
    let body = json!({"apiVersion": "k8s.ovn.org/v1alpha1", "kind": "TunnelReport",
        "metadata": {"name": node}, "spec": {"peers": peers}});
    match api.get_opt(node).await.expect("get report") {
        None => {
            api.create(&PostParams::default(), &from(body))
                .await
                .expect("create report");
        }
        Some(_) => {
            api.patch(node, &PatchParams::default(), &Patch::Merge(&body))
                .await
                .expect("patch report");
        }
    }
}

/// Waits until TrustZone `name`'s status satisfies `pred`, and returns it.
async fn status_where(
    c: &Client,
    name: &str,
    what: &str,
    pred: impl Fn(&TrustZoneStatus) -> bool,
) -> TrustZoneStatus {
    let api: Api<TrustZone> = Api::all(c.clone());
    eventually(&format!("TrustZone {name}: {what}"), || async {
        let s = api.get(name).await.ok()?.status?;
        pred(&s).then_some(s)
    })
    .await
}

async fn members_are(c: &Client, zone: &str, want: &[&str]) -> TrustZoneStatus {
    status_where(c, zone, &format!("members {want:?}"), |s| {
        s.members == want && s.member_count == want.len() as i64
    })
    .await
}

fn cond<'a>(
    s: &'a TrustZoneStatus,
    type_: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    s.conditions.iter().find(|c| c.type_ == type_)
}

/// Waits for condition `type_` with `status` and `reason` whose message contains `words`.
async fn condition_is(
    c: &Client,
    zone: &str,
    type_: &str,
    status: &str,
    reason: &str,
    words: &[&str],
) -> TrustZoneStatus {
    status_where(
        c,
        zone,
        &format!("{type_}={status} ({reason}) mentioning {words:?}"),
        |s| {
            cond(s, type_).is_some_and(|c| {
                c.status == status
                    && c.reason == reason
                    && words.iter().all(|w| c.message.contains(w))
            })
        },
    )
    .await
}

async fn warning_on(c: &Client, object: &str, reason: &str) -> String {
    let api: Api<Event> = Api::namespaced(c.clone(), "default");
    eventually(&format!("{reason} Event on {object}"), || async {
        api.list(&ListParams::default().fields(&format!("involvedObject.name={object}")))
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason))
            .and_then(|e| e.message)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_follow_labels_annotations_trust_zones_and_node_deletes() {
    let (s, c) = setup().await;
    node(&c, "n1", json!({"tenant": "a"}), json!({})).await;
    node(&c, "n2", json!({"tenant": "a"}), json!({})).await;
    node(&c, "n3", json!({}), json!({})).await;
    node(&c, "n4", json!({}), json!({})).await;
    zone(&c, "tz-a", json!({"matchLabels": {"tenant": "a"}})).await;
    let h = start(&s, true).await;
    members_are(&c, "tz-a", &["n1", "n2"]).await;

    // label change
    patch_node(&c, "n3", json!({"labels": {"tenant": "a"}})).await;
    members_are(&c, "tz-a", &["n1", "n2", "n3"]).await;
    patch_node(&c, "n1", json!({"labels": {"tenant": "b"}})).await;
    members_are(&c, "tz-a", &["n2", "n3"]).await;

    // annotation change: the annotation zone "tz-a" is the same zone as the TrustZone
    patch_node(
        &c,
        "n4",
        json!({"annotations": {"k8s.ovn.org/transport-zones": r#"["tz-a","other"]"#}}),
    )
    .await;
    members_are(&c, "tz-a", &["n2", "n3", "n4"]).await;
    patch_node(
        &c,
        "n4",
        json!({"annotations": {"k8s.ovn.org/transport-zones": null}}),
    )
    .await;
    members_are(&c, "tz-a", &["n2", "n3"]).await;

    // TrustZone update
    let api: Api<TrustZone> = Api::all(c.clone());
    api.patch(
        "tz-a",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"nodeSelector": {"matchLabels": {"tenant": "b"}}}})),
    )
    .await
    .expect("patch selector");
    let st = members_are(&c, "tz-a", &["n1"]).await;
    assert_eq!(
        cond(&st, "Ready").and_then(|c| c.observed_generation),
        Some(2),
        "conditions carry the new generation"
    );

    // a second TrustZone, then Node deletion
    zone(&c, "everyone", json!({})).await;
    members_are(&c, "everyone", &["n1", "n2", "n3", "n4"]).await;
    Api::<Node>::all(c.clone())
        .delete("n1", &DeleteParams::default())
        .await
        .expect("delete n1");
    members_are(&c, "tz-a", &[]).await;
    condition_is(
        &c,
        "tz-a",
        "Ready",
        "False",
        "NoMembers",
        &["no Node is a member"],
    )
    .await;
    members_are(&c, "everyone", &["n2", "n3", "n4"]).await;

    // TrustZone delete and re-create: computed afresh
    api.delete("tz-a", &DeleteParams::default())
        .await
        .expect("delete tz-a");
    eventually("tz-a gone", || async {
        api.get_opt("tz-a").await.ok()?.is_none().then_some(())
    })
    .await;
    zone(&c, "tz-a", json!({"matchLabels": {"tenant": "a"}})).await;
    members_are(&c, "tz-a", &["n2", "n3"]).await;
    stop(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_tunnel_reports() {
    let (s, c) = setup().await;
    for n in ["n1", "n2", "n3"] {
        node(&c, n, json!({"tenant": "a"}), json!({})).await;
    }
    node(&c, "other", json!({}), json!({})).await;
    zone(&c, "tz-a", json!({"matchLabels": {"tenant": "a"}})).await;
    let h = start(&s, true).await;
    condition_is(
        &c,
        "tz-a",
        "Ready",
        "False",
        "TunnelsMissing",
        &["6 of 6 tunnels missing", "no TunnelReport from n1, n2, n3"],
    )
    .await;

    // Each node writes its own report, with its own identity.
    for (n, peers) in [
        ("n1", &["n2", "n3"][..]),
        ("n2", &["n1", "n3"][..]),
        ("n3", &["n1", "n2", "other"][..]),
    ] {
        let nc = s
            .client(&format!("system:ovn-node:{n}"), &["system:ovn-nodes"])
            .await
            .expect("node client");
        report(&nc, n, peers).await;
    }
    let st = condition_is(
        &c,
        "tz-a",
        "Ready",
        "True",
        "AllTunnelsEstablished",
        &["all 6 tunnels between 3 members established"],
    )
    .await;
    let since = cond(&st, "Ready")
        .map(|c| c.last_transition_time.clone())
        .expect("Ready");

    // One tunnel goes away: False, the pair named.
    report(&c, "n3", &["n2"]).await;
    condition_is(
        &c,
        "tz-a",
        "Ready",
        "False",
        "TunnelsMissing",
        &["1 of 6 tunnels missing: n3→n1"],
    )
    .await;
    // A report deleted: that node observes nothing.
    Api::<TunnelReport>::all(c.clone())
        .delete("n2", &DeleteParams::default())
        .await
        .expect("delete report");
    condition_is(
        &c,
        "tz-a",
        "Ready",
        "False",
        "TunnelsMissing",
        &[
            "3 of 6 tunnels missing: n2→n1, n2→n3, n3→n1",
            "no TunnelReport from n2",
        ],
    )
    .await;
    // Back to all: True again, with a new transition time no earlier than the first.
    report(&c, "n2", &["n1", "n3"]).await;
    report(&c, "n3", &["n1", "n2"]).await;
    let st = condition_is(&c, "tz-a", "Ready", "True", "AllTunnelsEstablished", &[]).await;
    assert!(cond(&st, "Ready").expect("Ready").last_transition_time >= since);

    // A report named after no Node is ignored and reported.
    report(&c, "ghost", &["n1"]).await;
    warning_on(&c, "ghost", "UnknownNode").await;
    condition_is(&c, "tz-a", "Ready", "True", "AllTunnelsEstablished", &[]).await;
    stop(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selector_protected_both_ways() {
    let (s, c) = setup().await;
    node(&c, "n1", json!({"tenant": "a"}), json!({})).await;
    zone(&c, "settable", json!({"matchLabels": {"tenant": "a"}})).await;
    zone(
        &c,
        "protected",
        json!({"matchLabels": {"node-restriction.kubernetes.io/tenant": "a"}}),
    )
    .await;

    // The webhook protects the keys.
    let h = start(&s, true).await;
    condition_is(
        &c,
        "settable",
        "SelectorProtected",
        "True",
        "ProtectedByWebhook",
        &["tenant"],
    )
    .await;
    condition_is(
        &c,
        "protected",
        "SelectorProtected",
        "True",
        "NoKubeletSettableKeys",
        &["node-restriction.kubernetes.io/tenant"],
    )
    .await;
    stop(h).await;

    // Without the webhook: the admin is warned, on the condition and with an Event.
    let h = start(&s, false).await;
    condition_is(
        &c,
        "settable",
        "SelectorProtected",
        "False",
        "KubeletSettableKeys",
        &["a node can add itself to this zone", "tenant"],
    )
    .await;
    let msg = warning_on(&c, "settable", "KubeletSettableKeys").await;
    assert!(msg.contains("tenant"), "{msg}");
    condition_is(
        &c,
        "protected",
        "SelectorProtected",
        "True",
        "NoKubeletSettableKeys",
        &[],
    )
    .await;
    stop(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_reported_and_does_not_stop_other_zones() {
    let (s, c) = setup().await;
    node(&c, "n1", json!({"tenant": "a"}), json!({})).await;
    node(
        &c,
        "n2",
        json!({"tenant": "a"}),
        json!({"k8s.ovn.org/transport-zones": "not a list"}),
    )
    .await;
    node(
        &c,
        "n3",
        json!({}),
        json!({"k8s.ovn.org/transport-zones": r#"["bad"]"#}),
    )
    .await;
    zone(
        &c,
        "bad",
        // the schema refuses unknown operators; `In` without values gets past it and still
        // cannot be evaluated
        json!({"matchExpressions": [{"key": "tenant", "operator": "In"}]}),
    )
    .await;
    zone(&c, "good", json!({"matchLabels": {"tenant": "a"}})).await;
    let h = start(&s, true).await;
    let st = condition_is(
        &c,
        "bad",
        "Ready",
        "False",
        "InvalidSelector",
        &[
            "In needs values",
            "1 member from the k8s.ovn.org/transport-zones annotation",
        ],
    )
    .await;
    assert_eq!(st.members, ["n3"]);
    members_are(&c, "good", &["n1", "n2"]).await;
    warning_on(&c, "bad", "InvalidSelector").await;
    let msg = warning_on(&c, "n2", "InvalidTransportZones").await;
    assert!(msg.contains("k8s.ovn.org/transport-zones"), "{msg}");

    // fixing the selector
    Api::<TrustZone>::all(c.clone())
        .patch(
            "bad",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"nodeSelector": {"matchExpressions": [
                {"key": "tenant", "operator": "In", "values": ["a"]}]}}})),
        )
        .await
        .expect("fix selector");
    members_are(&c, "bad", &["n1", "n2", "n3"]).await;
    stop(h).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_status_write_when_nothing_changed() {
    let (s, c) = setup().await;
    node(&c, "n1", json!({"tenant": "a"}), json!({})).await;
    node(&c, "n2", json!({"tenant": "a"}), json!({})).await;
    node(&c, "n9", json!({}), json!({})).await;
    zone(&c, "tz-a", json!({"matchLabels": {"tenant": "a"}})).await;
    report(&c, "n1", &["n2"]).await;
    report(&c, "n2", &["n1"]).await;
    let h = start(&s, true).await;
    condition_is(&c, "tz-a", "Ready", "True", "AllTunnelsEstablished", &[]).await;
    let api: Api<TrustZone> = Api::all(c.clone());
    let before = api.get("tz-a").await.expect("get");

    // Changes that do not touch the zone: an unrelated label on a member, a non-member's
    // label and report, a restart of the controller.
    patch_node(&c, "n1", json!({"labels": {"rack": "7"}})).await;
    patch_node(&c, "n9", json!({"labels": {"tenant": "b"}})).await;
    report(&c, "n9", &["n1"]).await;
    stop(h).await;
    let h = start(&s, true).await;
    // A sentinel zone created after those changes: once it has a status, the controller has
    // seen them all (it lists everything before its first write).
    zone(&c, "sentinel", json!({"matchLabels": {"tenant": "b"}})).await;
    members_are(&c, "sentinel", &["n9"]).await;

    let after = api.get("tz-a").await.expect("get");
    assert_eq!(
        after.resource_version(),
        before.resource_version(),
        "no write"
    );
    assert_eq!(after.status, before.status);
    stop(h).await;
}

/// `manifests/zones/rbac.yaml`: what node identities and the cluster manager may do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_manifest_grants() {
    let (s, admin) = setup().await;
    zone(&admin, "tz-a", json!({"matchLabels": {"tenant": "a"}})).await;
    let node1 = s
        .client("system:ovn-node:node1", &["system:ovn-nodes"])
        .await
        .expect("node client");
    let cm = s.client(CM_USER, CM_GROUPS).await.expect("cm client");
    let forbidden = |r: Result<TrustZone, kube::Error>, what: &str| match r {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("{what}: expected 403, got {other:?}"),
    };

    // Node: read TrustZones, never write them.
    let tz: Api<TrustZone> = Api::all(node1.clone());
    assert_eq!(
        tz.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        1
    );
    tz.get("tz-a").await.expect("get");
    forbidden(
        tz.create(
            &PostParams::default(),
            &from(
                json!({"apiVersion": "k8s.ovn.org/v1alpha1", "kind": "TrustZone",
                "metadata": {"name": "mine"}, "spec": {"nodeSelector": {}}}),
            ),
        )
        .await,
        "node creates a TrustZone",
    );
    let mut existing = tz.get("tz-a").await.expect("get");
    existing.spec.node_selector = Default::default();
    forbidden(
        tz.replace("tz-a", &PostParams::default(), &existing).await,
        "node updates a TrustZone",
    );
    forbidden(
        tz.patch(
            "tz-a",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"nodeSelector": {}}})),
        )
        .await,
        "node patches a TrustZone",
    );
    match tz.delete("tz-a", &DeleteParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("node deletes a TrustZone: expected 403, got {other:?}"),
    }
    let status = json!({"status": {"members": ["node1"], "memberCount": 1}});
    forbidden(
        tz.patch_status("tz-a", &PatchParams::default(), &Patch::Merge(&status))
            .await,
        "node writes TrustZone status",
    );

    // Node: its TunnelReport (create, get, update); no listing of the others'.
    report(&node1, "node1", &["node2"]).await;
    report(&node1, "node1", &["node2", "node3"]).await;
    let reports: Api<TunnelReport> = Api::all(node1.clone());
    assert_eq!(
        reports.get("node1").await.expect("get own").spec.peers,
        ["node2", "node3"]
    );
    match reports.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("node lists TunnelReports: expected 403, got {other:?}"),
    }

    // Cluster manager: status yes, spec no.
    let cm_tz: Api<TrustZone> = Api::all(cm.clone());
    let patched = cm_tz
        .patch_status("tz-a", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("cluster manager patches status");
    assert_eq!(
        patched.status.map(|s| s.members),
        Some(vec!["node1".to_owned()])
    );
    forbidden(
        cm_tz
            .patch(
                "tz-a",
                &PatchParams::default(),
                &Patch::Merge(&json!({"spec": {"nodeSelector": {}}})),
            )
            .await,
        "cluster manager patches a TrustZone's spec",
    );
    Api::<TunnelReport>::all(cm.clone())
        .list(&ListParams::default())
        .await
        .expect("cluster manager lists reports");
    Api::<Node>::all(cm)
        .list(&ListParams::default())
        .await
        .expect("cluster manager lists nodes");
}
