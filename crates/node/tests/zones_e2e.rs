//! Issue 5 with real ovn-controllers: each zone enforcement alone blocks the tunnel, observed
//! in each node's own Open_vSwitch database; TrustZones and the transport-zones annotation
//! are both zone sources; `TunnelReport/<node>` follows the observed tunnels. Needs root.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::*;
use common::*;
use k8s_api::trust_zone::{TrustZone, TunnelReport};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use node::plan::Enforcement;
use ovsdb_harness::OvsdbServer;
use serde_json::json;

/// Remote (is-remote) Chassis rows of a Southbound database: hostname → transport_zones.
fn remote_chassis(sb: &OvsdbServer) -> BTreeMap<String, Vec<String>> {
    let d = sb.dump(&["Chassis"]).expect("dump");
    let Some(rows) = d["Chassis"].as_object() else {
        return BTreeMap::new();
    };
    rows.values()
        .filter(|r| r["other_config"].to_string().contains("is-remote"))
        .map(|r| {
            let tz = &r["transport_zones"];
            let zones = match tz.as_str() {
                Some(z) => vec![z.to_owned()],
                None => tz[1]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default(),
            };
            (r["hostname"].as_str().unwrap_or_default().to_owned(), zones)
        })
        .collect()
}

fn local_tz(n: &NodeStack) -> String {
    n.vsctl(&[
        "--if-exists",
        "get",
        "Open_vSwitch",
        ".",
        "external_ids:ovn-transport-zones",
    ])
    .trim()
    .trim_matches('"')
    .to_owned()
}

async fn set_zones(nodes: &Api<Node>, node1_label: Option<&str>, node2_ann: Option<&str>) {
    let p = json!({"metadata": {"labels": {"tenant": node1_label}}});
    nodes
        .patch("node1", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .expect("label node1");
    let p = json!({"metadata": {"annotations": {"k8s.ovn.org/transport-zones": node2_ann}}});
    nodes
        .patch("node2", &PatchParams::default(), &Patch::Merge(&p))
        .await
        .expect("annotate node2");
}

#[tokio::test]
async fn each_enforcement_alone_blocks_the_tunnel() {
    init_logs();
    apiserver::install_crypto_provider();
    let api = apiserver::ApiServer::start(apiserver::ServerConfig::default())
        .await
        .expect("apiserver");
    let admin = api.admin_client().await.expect("admin");
    install_node_rbac(&admin).await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    for crd in k8s_api::crds() {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
    let nodes: Api<Node> = Api::all(admin.clone());
    for k in [1, 2] {
        nodes
            .create(
                &PostParams::default(),
                &node_obj(&format!("node{k}"), k, false),
            )
            .await
            .expect("node");
    }
    // tenant a is a TrustZone (node1 by label); node2 is annotated into zone b
    let tz: TrustZone = serde_json::from_value(json!({
        "apiVersion": "k8s.ovn.org/v1alpha1", "kind": "TrustZone",
        "metadata": {"name": "tenant-a"},
        "spec": {"nodeSelector": {"matchLabels": {"tenant": "a"}}},
    }))
    .expect("tz");
    Api::<TrustZone>::all(admin.clone())
        .create(&PostParams::default(), &tz)
        .await
        .expect("create TrustZone");

    let (n1, n2) = NodeStack::start_pair().await;
    let start = |enforcement: Enforcement| {
        let api = &api;
        let (n1, n2) = (&n1, &n2);
        async move {
            let mut agents = Vec::new();
            for n in [n1, n2] {
                let me = api
                    .client(
                        &format!("system:ovn-node:{}", n.name),
                        &["system:ovn-nodes"],
                    )
                    .await
                    .expect("node client");
                let mut args = n.args("br-phy");
                args.no_kernel = true;
                args.enforcement = enforcement;
                agents.push(tokio::spawn(node::run_with(me, args)));
            }
            agents
        }
    };
    let stop = |agents: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>| async move {
        for a in agents {
            a.abort();
            let _ = a.await;
        }
    };
    let both_tunnels = || async {
        ovs_tunnels(&n1.ovs) == vec!["172.16.0.2".to_owned()]
            && ovs_tunnels(&n2.ovs) == vec!["172.16.0.1".to_owned()]
    };
    let no_tunnels =
        || async { ovs_tunnels(&n1.ovs).is_empty() && ovs_tunnels(&n2.ovs).is_empty() };
    let reports: Api<TunnelReport> = Api::all(admin.clone());
    let report_of = |name: &'static str| {
        let reports = reports.clone();
        async move { reports.get_opt(name).await.ok().flatten() }
    };

    // ---- (a) row filtering off (every peer programmed), transport zones on
    let agents = start(Enforcement {
        filter_rows: false,
        transport_zones: true,
    })
    .await;
    eventually("zone-less nodes: tunnels both ways", both_tunnels).await;
    eventually("TunnelReport/node1 says node2", || async {
        report_of("node1")
            .await
            .is_some_and(|r| r.spec.peers == ["node2"])
    })
    .await;
    let rv = report_of("node1")
        .await
        .and_then(|r| r.metadata.resource_version);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        report_of("node1")
            .await
            .and_then(|r| r.metadata.resource_version),
        rv,
        "an unchanged peer set is not written again"
    );
    set_zones(&nodes, Some("a"), Some(r#"["b"]"#)).await;
    eventually("(a) transport zones alone remove the tunnels", no_tunnels).await;
    assert_eq!(local_tz(&n1), "tenant-a");
    assert_eq!(local_tz(&n2), "b");
    assert_eq!(
        remote_chassis(&n1.sb),
        BTreeMap::from([("node2".to_owned(), vec!["b".to_owned()])]),
        "(a) the peer's Chassis row is still there: only transport zones blocked the tunnel"
    );
    eventually("TunnelReport/node1 says no peer", || async {
        report_of("node1")
            .await
            .is_some_and(|r| r.spec.peers.is_empty())
    })
    .await;
    stop(agents).await;

    // ---- (b) transport zones off, row filtering on
    set_zones(&nodes, None, None).await;
    let agents = start(Enforcement {
        filter_rows: true,
        transport_zones: false,
    })
    .await;
    eventually("zone-less again: tunnels both ways", both_tunnels).await;
    assert_eq!(local_tz(&n1), "");
    set_zones(&nodes, Some("a"), Some(r#"["b"]"#)).await;
    eventually("(b) row filtering alone removes the tunnels", no_tunnels).await;
    assert!(
        remote_chassis(&n1.sb).is_empty() && remote_chassis(&n2.sb).is_empty(),
        "(b) no Chassis rows for the filtered peers"
    );
    assert_eq!(
        (local_tz(&n1), local_tz(&n2)),
        (String::new(), String::new()),
        "(b) OVN's transport zones were not set"
    );
    // both back in one zone (the annotation names the TrustZone): the tunnel returns
    set_zones(&nodes, Some("a"), Some(r#"["tenant-a"]"#)).await;
    eventually("same zone: tunnels both ways", both_tunnels).await;
    stop(agents).await;
}
