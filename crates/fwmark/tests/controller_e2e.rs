//! The kube-rs shells end to end: the node controller (nft backend, in a network namespace this
//! test creates) and the status writer, against the embedded API server (`ovnk-apiserver`).
//! Needs root; fails without it. Waits are polls with a generous deadline, not timing checks.

mod common;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::time::Duration;

use common::*;
use fwmark::backend::BackendKind;
use fwmark::config::FwmarkArgs;
use fwmark::testbed::Netns;
use k8s_api::service_fwmark::ServiceFWMark;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(60);

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = std::time::Instant::now();
    while start.elapsed() < DEADLINE {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out waiting for: {what}");
}

fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("fixture parses")
}

fn live(ns: &Netns) -> BTreeMap<IpAddr, u32> {
    let tables = ns
        .exec("nft", &["list", "tables"], None)
        .expect("nft list tables");
    if !tables.contains("ovnk-fwmark") {
        return BTreeMap::new();
    }
    nft_live(ns, "ovnk-fwmark")
}

async fn condition(api: &Api<ServiceFWMark>, name: &str, type_: &str) -> Option<String> {
    let obj = api.get(name).await.ok()?;
    obj.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_controller_and_status_writer_against_embedded_apiserver() {
    let ns = Netns::create("e2e").expect("netns (needs root)");
    apiserver::install_crypto_provider();
    let server = apiserver::ApiServer::start(apiserver::ServerConfig::default())
        .await
        .expect("apiserver");
    let client = server.admin_client().await.expect("client");

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in k8s_api::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let pp = PostParams::default();
    let services: Api<Service> = Api::namespaced(client.clone(), "default");
    let svc = services
        .create(
            &pp,
            &from(json!({"metadata": {"name": "web"}, "spec": {"ports": [{"port": 80}]}})),
        )
        .await
        .expect("service");
    let cluster_ip: IpAddr = svc
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("clusterIP allocated")
        .parse()
        .expect("clusterIP parses");
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), "default");
    slices
        .create(
            &pp,
            &from(json!({
            "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["10.244.0.3"], "nodeName": "node1"},
                {"addresses": ["10.244.1.6"], "nodeName": "node2"}
            ]})),
        )
        .await
        .expect("slice");
    let marks: Api<ServiceFWMark> = Api::namespaced(client.clone(), "default");
    for (name, mark) in [("web", 1000), ("ghost", 1200)] {
        marks
            .create(
                &pp,
                &from(
                    json!({"apiVersion": "k8s.ovn.org/v1", "kind": "ServiceFWMark",
                             "metadata": {"name": name}, "spec": {"fwmark": mark}}),
                ),
            )
            .await
            .expect("servicefwmark");
    }

    let args = FwmarkArgs {
        backend: BackendKind::Nftables,
        resync_period: Duration::from_secs(30),
        ..FwmarkArgs::default()
    };
    let node = tokio::spawn(fwmark::run_node_with(
        client.clone(),
        "node1".into(),
        args,
        ns.runner().expect("runner"),
    ));
    let status = tokio::spawn(fwmark::run_status_writer(
        client.clone(),
        Duration::from_secs(30),
    ));

    // node1 marks the ClusterIP and its own endpoint
    let want: BTreeMap<IpAddr, u32> = [(cluster_ip, 1000), (ip("10.244.0.3"), 1000)].into();
    eventually("node1 rules", || {
        let ok = live(&ns) == want;
        async move { ok }
    })
    .await;
    eventually("status conditions", || async {
        condition(&marks, "web", "Ready").await.as_deref() == Some("True")
            && condition(&marks, "ghost", "ServiceFound").await.as_deref() == Some("False")
    })
    .await;

    // the Service becomes an Egress Service hosted on node2: node1 has no rules
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations":
                {"k8s.ovn.org/egress-service-host": "node2"}}})),
        )
        .await
        .expect("annotate");
    eventually("egress host elsewhere", || {
        let ok = live(&ns).is_empty();
        async move { ok }
    })
    .await;

    // ... now hosted here: node1 marks every endpoint
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations":
                {"k8s.ovn.org/egress-service-host": "node1"}}})),
        )
        .await
        .expect("annotate");
    let want: BTreeMap<IpAddr, u32> = [
        (cluster_ip, 1000),
        (ip("10.244.0.3"), 1000),
        (ip("10.244.1.6"), 1000),
    ]
    .into();
    eventually("egress host here", || {
        let ok = live(&ns) == want;
        async move { ok }
    })
    .await;

    // deleting the ServiceFWMark removes its rules
    marks
        .delete("web", &DeleteParams::default())
        .await
        .expect("delete");
    eventually("rules removed", || {
        let ok = live(&ns).is_empty();
        async move { ok }
    })
    .await;

    node.abort();
    status.abort();
    let _ = server.shutdown().await;
}
