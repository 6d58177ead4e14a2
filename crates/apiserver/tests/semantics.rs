//! Per-kind semantics: ClusterIPs, Events through both APIs (kube-runtime's recorder), custom
//! resource status/generation/finalizers, namespace cascade, selector-filtered watches,
//! persistence across restarts.

mod common;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace, Node, ObjectReference, Service};
use k8s_openapi::api::events::v1::Event as NewEvent;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::events::{Event, EventType, Recorder};
use serde_json::json;

#[tokio::test]
async fn standard_namespaces_and_service_cluster_ips() {
    let sb = common::start().await;
    let c = sb.server.admin_client().await.expect("admin");
    let nss: Vec<String> = Api::<Namespace>::all(c.clone())
        .list(&ListParams::default())
        .await
        .expect("ns")
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    for want in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(nss.iter().any(|n| n == want), "{want} in {nss:?}");
    }
    let svcs = Api::<Service>::namespaced(c.clone(), "default");
    let mk = |name: &str, ip: Option<&str>| -> Service {
        let mut spec = json!({"ports": [{"port": 80}]});
        if let Some(ip) = ip {
            spec["clusterIP"] = json!(ip);
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("svc")
    };
    let a = svcs
        .create(&PostParams::default(), &mk("a", None))
        .await
        .expect("a");
    let b = svcs
        .create(&PostParams::default(), &mk("b", None))
        .await
        .expect("b");
    let ip_a = a
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("ip a");
    let ip_b = b
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .expect("ip b");
    assert_ne!(ip_a, ip_b);
    let net: ipnet::Ipv4Net = "10.96.0.0/16".parse().expect("net");
    assert!(net.contains(&ip_a.parse::<std::net::Ipv4Addr>().expect("v4")));
    let h = svcs
        .create(&PostParams::default(), &mk("headless", Some("None")))
        .await
        .expect("headless");
    assert_eq!(h.spec.and_then(|s| s.cluster_ip).as_deref(), Some("None"));
    match svcs
        .create(&PostParams::default(), &mk("dup", Some(&ip_a)))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422),
        other => panic!("expected 422, got {other:?}"),
    }
}

#[tokio::test]
async fn recorder_events_are_visible_through_both_event_apis() {
    let sb = common::start().await;
    let c = sb.server.admin_client().await.expect("admin");
    let recorder = Recorder::new(c.clone(), "ovnk-test".into());
    let reference = ObjectReference {
        kind: Some("Node".into()),
        name: Some("node1".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Warning,
        reason: "BadAnnotation".into(),
        note: Some("zone-name is malformed".into()),
        action: "Validate".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.expect("publish");
    recorder
        .publish(&ev, &reference)
        .await
        .expect("publish again (series patch)");
    let new_api = Api::<NewEvent>::namespaced(c.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("events.k8s.io");
    assert_eq!(new_api.items.len(), 1);
    let e = &new_api.items[0];
    assert_eq!(e.note.as_deref(), Some("zone-name is malformed"));
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    let core = Api::<CoreEvent>::namespaced(c.clone(), "default")
        .list(&ListParams::default())
        .await
        .expect("core");
    assert_eq!(core.items.len(), 1);
    assert_eq!(
        core.items[0].message.as_deref(),
        Some("zone-name is malformed")
    );
    assert_eq!(core.items[0].involved_object.name.as_deref(), Some("node1"));
    let sel = Api::<CoreEvent>::namespaced(c, "default")
        .list(&ListParams::default().fields("involvedObject.name=node1"))
        .await
        .expect("field selector");
    assert_eq!(sel.items.len(), 1);
}

const CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "servicefwmarks.k8s.ovn.org"},
  "spec": {"group": "k8s.ovn.org", "scope": "Namespaced",
    "names": {"plural": "servicefwmarks", "singular": "servicefwmark", "kind": "ServiceFWMark", "shortNames": ["sfm"]},
    "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "properties": {"fwmark": {"type": "integer", "minimum": 1}},
                 "x-kubernetes-validations": [{"rule": "self.fwmark == oldSelf.fwmark", "message": "fwmark is immutable"}]},
        "status": {"type": "object", "properties": {"state": {"type": "string"}}}}}}}]}
}"#;

#[tokio::test]
async fn custom_resources_follow_status_generation_and_finalizer_rules() {
    let sb = common::start().await;
    let c = sb.server.admin_client().await.expect("admin");
    let crds = Api::<DynamicObject>::all_with(
        c.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"),
            "customresourcedefinitions",
        ),
    );
    crds.create(
        &PostParams::default(),
        &serde_json::from_str(CRD).expect("crd"),
    )
    .await
    .expect("crd");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("k8s.ovn.org", "v1", "ServiceFWMark"),
        "servicefwmarks",
    );
    let api = Api::<DynamicObject>::namespaced_with(c.clone(), "default", &ar);
    let obj: DynamicObject = serde_json::from_value(json!({"apiVersion": "k8s.ovn.org/v1", "kind": "ServiceFWMark",
        "metadata": {"name": "web", "finalizers": ["k8s.ovn.org/test"]}, "spec": {"fwmark": 7}, "status": {"state": "ignored on create"}}))
    .expect("obj");
    let created = api
        .create(&PostParams::default(), &obj)
        .await
        .expect("create");
    assert!(
        created.data.get("status").is_none(),
        "status dropped on create"
    );
    assert_eq!(created.metadata.generation, Some(1));
    // CEL transition rule.
    match api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fwmark": 8}})),
        )
        .await
    {
        Err(kube::Error::Api(s)) => assert!(
            s.code == 422 && s.message.contains("fwmark is immutable"),
            "{}",
            s.message
        ),
        other => panic!("expected 422, got {other:?}"),
    }
    // Status only through /status; the main endpoint ignores it; metadata changes do not bump generation.
    let st = api
        .patch_status(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": "ok"}, "spec": {"fwmark": 9}})),
        )
        .await
        .expect("status");
    assert_eq!(st.data["status"]["state"], "ok");
    assert_eq!(st.data["spec"]["fwmark"], 7);
    let main = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"state": "nope"}, "metadata": {"labels": {"a": "b"}}})),
        )
        .await
        .expect("main");
    assert_eq!(main.data["status"]["state"], "ok");
    assert_eq!(main.metadata.generation, Some(1));
    // Finalizers hold deletion until removed.
    api.delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    let pending = api.get("web").await.expect("still there");
    assert!(pending.metadata.deletion_timestamp.is_some());
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("remove finalizer");
    assert!(api.get_opt("web").await.expect("get").is_none());
    // Deleting the namespace deletes what is in it.
    let nss = Api::<Namespace>::all(c.clone());
    nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "gone"}})).expect("ns"),
    )
    .await
    .expect("ns");
    let in_ns = Api::<DynamicObject>::namespaced_with(c.clone(), "gone", &ar);
    let o2: DynamicObject = serde_json::from_value(json!({"apiVersion": "k8s.ovn.org/v1", "kind": "ServiceFWMark", "metadata": {"name": "x"}, "spec": {"fwmark": 1}})).expect("o2");
    in_ns
        .create(&PostParams::default(), &o2)
        .await
        .expect("create in ns");
    nss.delete("gone", &DeleteParams::default())
        .await
        .expect("delete ns");
    assert!(
        in_ns
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn selector_watch_reports_objects_leaving_and_entering_the_selection() {
    let sb = common::start().await;
    let api = Api::<Node>::all(sb.server.admin_client().await.expect("admin"));
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "n", "labels": {"zone": "a"}}}))
            .expect("n"),
    )
    .await
    .expect("n");
    let rv = api
        .list(&ListParams::default())
        .await
        .expect("list")
        .metadata
        .resource_version
        .expect("rv");
    api.patch(
        "n",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"zone": "b"}}})),
    )
    .await
    .expect("leave");
    api.patch(
        "n",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"zone": "a"}}})),
    )
    .await
    .expect("enter");
    let mut s = api
        .watch(&WatchParams::default().labels("zone=a").timeout(5), &rv)
        .await
        .expect("watch")
        .boxed();
    let mut got = Vec::new();
    while let Some(ev) = s.try_next().await.expect("event") {
        match ev {
            WatchEvent::Deleted(_) => got.push("DELETED"),
            WatchEvent::Added(_) => got.push("ADDED"),
            WatchEvent::Modified(_) => got.push("MODIFIED"),
            _ => continue,
        }
        if got.len() == 2 {
            break;
        }
    }
    assert_eq!(got, vec!["DELETED", "ADDED"]);
}

#[tokio::test]
async fn state_and_resource_versions_persist_across_restarts() {
    let sb = common::start().await;
    let dir = sb.dir.path().to_path_buf();
    let ca = sb.server.ca_pem().to_string();
    let api = Api::<Node>::all(sb.server.admin_client().await.expect("admin"));
    let n = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "p"}})).expect("n"),
        )
        .await
        .expect("n");
    let rv1: u64 = n
        .metadata
        .resource_version
        .expect("rv")
        .parse()
        .expect("num");
    sb.server.shutdown().await.expect("shutdown");
    assert!(
        dir.join("kubeconfig").exists()
            && dir.join("ca.crt").exists()
            && dir.join("state.json").exists()
    );
    let server = apiserver::ApiServer::start(apiserver::ServerConfig::with_dir(&dir))
        .await
        .expect("restart");
    assert_eq!(server.ca_pem(), ca, "the CA is reused");
    let api = Api::<Node>::all(server.admin_client().await.expect("admin"));
    let p = api.get("p").await.expect("persisted");
    assert_eq!(p.metadata.uid, n.metadata.uid);
    let q = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "q"}})).expect("q"),
        )
        .await
        .expect("q");
    let rv2: u64 = q
        .metadata
        .resource_version
        .expect("rv")
        .parse()
        .expect("num");
    assert!(rv2 > rv1, "resourceVersion continues: {rv2} > {rv1}");
    // The CLI's kubeconfig minting works from the dir alone.
    let yaml =
        apiserver::kubeconfig::from_dir(&dir, "carol", &["system:masters".to_string()], None)
            .expect("kubeconfig");
    let carol = apiserver::kubeconfig::client_from_yaml(&yaml)
        .await
        .expect("client");
    assert_eq!(
        Api::<Node>::all(carol)
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .len(),
        2
    );
    server.shutdown().await.expect("shutdown");
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let sb = common::start().await;
    let api = Api::<Node>::all(sb.server.admin_client().await.expect("admin"));
    let pp = PatchParams::apply("ovnk-test").force();
    let n = api
        .patch("ssa", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ssa", "labels": {"a": "1"}}})))
        .await
        .expect("apply creates");
    assert_eq!(
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("a"))
            .map(String::as_str),
        Some("1")
    );
    let n = api
        .patch("ssa", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "ssa", "labels": {"b": "2"}}})))
        .await
        .expect("apply merges");
    let labels = n.metadata.labels.unwrap_or_default();
    assert_eq!(
        (
            labels.get("a").map(String::as_str),
            labels.get("b").map(String::as_str)
        ),
        (Some("1"), Some("2"))
    );
    let st = api
        .patch_status(
            "ssa",
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Node", "status": {"conditions": [{"type": "Ready", "status": "True"}]}})),
        )
        .await
        .expect("apply status");
    assert_eq!(
        st.status.and_then(|s| s.conditions).map(|c| c.len()),
        Some(1)
    );
}
