//! Real packets through a node namespace: `ip rule fwmark 1000 lookup 100` sends marked
//! traffic to a second next hop. UDP from an endpoint's address (in another namespace, routed
//! through the node) must arrive at the marked route's destination; UDP from a non-endpoint
//! address at the main route's. Both backends, IPv4 and IPv6. Needs root; fails without it.

mod common;

use common::*;
use fwmark::backend::{Backend, BackendKind};
use fwmark::mark::FULL_MASK;
use fwmark::plan::{Snapshot, plan_node};
use fwmark::testbed::Topology;

const PROBE: &str = env!("CARGO_BIN_EXE_ovnk-fwmark-probe");
const N: u64 = 20;

fn send(t: &Topology, src: std::net::IpAddr) {
    let out =
        t.ep.exec(
            PROBE,
            &[
                "send",
                &src.to_string(),
                &t.plan.probe.to_string(),
                &N.to_string(),
            ],
            None,
        )
        .expect("probe send");
    assert_eq!(out.trim(), N.to_string(), "all datagrams sent");
}

fn run(kind: BackendKind, v6: bool) {
    let t = Topology::build(v6, 1000).expect("topology (needs root)");
    let mut backend = Backend::start(kind, t.node.runner().expect("runner"), None, "ovnk-fwmark")
        .expect("backend");
    let (svc_ip, other_node_ep) = if v6 {
        ("fd00:96::10", "fd10:9::9")
    } else {
        ("10.96.0.10", "10.9.9.9")
    };
    let mut snap = Snapshot::default();
    let endpoint = t.plan.endpoint.to_string();
    put_service(
        &mut snap,
        "svc",
        1000,
        &[svc_ip],
        &[(endpoint.as_str(), "node1"), (other_node_ep, "node2")],
    );
    let plan = plan_node(&snap, "node1", FULL_MASK);
    assert!(plan.desired.entries.contains_key(&t.plan.endpoint));
    backend.sync(&plan.desired).expect("sync");

    // endpoint source → marked → table 100 → dst-marked
    send(&t, t.plan.endpoint);
    let (main, marked) = t.counts().expect("counts");
    assert_eq!(main, 0, "endpoint traffic must not take the main route");
    assert!(marked > 0, "endpoint traffic must take the marked route");

    // other source → unmarked → main table → dst-main
    send(&t, t.plan.other);
    let (main2, marked2) = t.counts().expect("counts");
    assert!(main2 > 0, "non-endpoint traffic must take the main route");
    assert_eq!(marked2, marked, "non-endpoint traffic must not be marked");

    // endpoint removed → its traffic is no longer marked
    put_service(
        &mut snap,
        "svc",
        1000,
        &[svc_ip],
        &[(other_node_ep, "node2")],
    );
    backend
        .sync(&plan_node(&snap, "node1", FULL_MASK).desired)
        .expect("sync after removal");
    send(&t, t.plan.endpoint);
    let (main3, marked3) = t.counts().expect("counts");
    assert!(main3 > main2, "removed endpoint goes the main route again");
    assert_eq!(marked3, marked2);
}

#[test]
fn packets_nft_ipv4() {
    run(BackendKind::Nftables, false);
}

#[test]
fn packets_nft_ipv6() {
    run(BackendKind::Nftables, true);
}

#[test]
fn packets_iptables_ipv4() {
    run(BackendKind::Iptables, false);
}

#[test]
fn packets_iptables_ipv6() {
    run(BackendKind::Iptables, true);
}
