//! `TunnelReport/<node>` against the embedded API server: absent CRD tolerated, created on
//! first write (owned by the Node), written only when the peer set changes.

mod common;

use common::cluster::*;
use k8s_api::trust_zone::TunnelReport;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use node::tunnels::{ReportSync, sync_report};

#[tokio::test]
async fn tunnel_report_is_written_on_change_only() {
    common::init_logs();
    apiserver::install_crypto_provider();
    let api = apiserver::ApiServer::start(apiserver::ServerConfig::default())
        .await
        .expect("apiserver");
    let admin = api.admin_client().await.expect("admin");
    install_node_rbac(&admin).await;
    let node = Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node_obj("node1", 1, true))
        .await
        .expect("node");
    let uid = node.metadata.uid.clone();
    let me = api
        .client("system:ovn-node:node1", &["system:ovn-nodes"])
        .await
        .expect("node client");
    let peers = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    // no CRD: tolerated, nothing written
    assert_eq!(
        sync_report(&me, "node1", uid.as_deref(), &peers(&["node2"]))
            .await
            .expect("no CRD is not an error"),
        ReportSync::NoCrd
    );
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in k8s_api::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let reports: Api<TunnelReport> = Api::all(admin.clone());
    let rv = || async {
        reports
            .get("node1")
            .await
            .expect("report")
            .metadata
            .resource_version
    };

    assert_eq!(
        sync_report(&me, "node1", uid.as_deref(), &peers(&["node2", "node3"]))
            .await
            .expect("create"),
        ReportSync::Written
    );
    let r = reports.get("node1").await.expect("report");
    assert_eq!(r.spec.peers, peers(&["node2", "node3"]));
    let owners = r.metadata.owner_references.unwrap_or_default();
    assert_eq!(owners.len(), 1);
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].name.as_str()),
        ("Node", "node1")
    );
    let v1 = rv().await;

    // the same set (as after an agent restart, which knows nothing): no write
    for _ in 0..3 {
        assert_eq!(
            sync_report(&me, "node1", uid.as_deref(), &peers(&["node2", "node3"]))
                .await
                .expect("sync"),
            ReportSync::Unchanged
        );
    }
    assert_eq!(
        rv().await,
        v1,
        "resourceVersion stable when nothing changes"
    );

    // a changed set: one write
    assert_eq!(
        sync_report(&me, "node1", uid.as_deref(), &peers(&["node3"]))
            .await
            .expect("patch"),
        ReportSync::Written
    );
    assert_eq!(
        reports.get("node1").await.expect("report").spec.peers,
        peers(&["node3"])
    );
    assert_ne!(rv().await, v1);
    let v2 = rv().await;
    assert_eq!(
        sync_report(&me, "node1", uid.as_deref(), &peers(&["node3"]))
            .await
            .expect("sync"),
        ReportSync::Unchanged
    );
    assert_eq!(rv().await, v2);
}
