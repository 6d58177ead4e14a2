use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

use proptest::prelude::*;

use super::*;
use crate::snapshot::{NodeInfo, PodAddr, PodInfo, Snapshot};

fn zones(z: &[&str]) -> BTreeSet<String> {
    z.iter().map(|s| (*s).to_owned()).collect()
}

fn node(name: &str, id: u32, z: &[&str]) -> NodeInfo {
    let id8 = u8::try_from(id).unwrap_or(255);
    NodeInfo {
        name: name.into(),
        id: Some(id),
        subnet: Some(format!("10.244.{id}.0/24").parse().unwrap_or_default()),
        transit: Some(format!("100.88.0.{id}/16").parse().unwrap_or_default()),
        join: Some(format!("100.64.0.{id}/16").parse().unwrap_or_default()),
        chassis_id: Some(format!("ch-{name}")),
        encap_ips: vec![IpAddr::V4(Ipv4Addr::new(172, 16, 0, id8))],
        zones: zones(z),
        internal_ip: Some(IpAddr::V4(Ipv4Addr::new(172, 16, 0, id8))),
        errors: Vec::new(),
    }
}

fn local(name: &str) -> LocalNode {
    LocalNode {
        name: name.into(),
        system_id: format!("ch-{name}"),
        encap_ip: None,
        primary_ifaddr: None,
        gateway_interface: Some("br-phy".into()),
        mtu: 1400,
        cluster_cidr: "10.244.0.0/16".parse().unwrap_or_default(),
        transit_cidr: "100.88.0.0/16".parse().unwrap_or_default(),
        join_cidr: "100.64.0.0/16".parse().unwrap_or_default(),
        enforcement: Default::default(),
    }
}

fn snap(nodes: Vec<NodeInfo>, pods: Vec<PodInfo>) -> Snapshot {
    Snapshot {
        nodes: nodes.into_iter().map(|n| (n.name.clone(), n)).collect(),
        pods,
    }
}

fn pod(ns: &str, name: &str, addr: Option<u8>) -> PodInfo {
    PodInfo {
        namespace: ns.into(),
        name: name.into(),
        host_network: false,
        terminal: false,
        network: addr.map(|a| {
            let ip = Ipv4Addr::new(10, 244, 1, a);
            let o = ip.octets();
            PodAddr {
                ip,
                mac: [0x0a, 0x58, o[0], o[1], o[2], o[3]],
            }
        }),
        error: None,
    }
}

#[test]
fn local_node_without_cluster_manager_data_gets_only_ovs_and_annotations() {
    let mut n1 = node("node1", 1, &[]);
    n1.id = None;
    n1.subnet = None;
    let d = plan(
        &snap(vec![n1, node("node2", 2, &[])], vec![]),
        &local("node1"),
    );
    assert!(d.nb.is_none() && d.sb.is_none() && d.kernel.is_none());
    assert_eq!(
        d.ovs.external_ids.get("ovn-is-interconn"),
        Some(&Some("true".into()))
    );
    assert_eq!(
        d.ovs.external_ids.get("ovn-encap-ip"),
        Some(&Some("172.16.0.1".into()))
    );
    assert_eq!(
        d.ovs.external_ids.get("hostname"),
        Some(&Some("node1".into()))
    );
    assert_eq!(d.ovs.external_ids.get("ovn-transport-zones"), Some(&None));
    assert_eq!(
        d.node_annotations
            .get(ann::NODE_CHASSIS_ID)
            .map(String::as_str),
        Some("ch-node1")
    );
    assert_eq!(
        d.node_annotations
            .get(ann::NODE_ENCAP_IPS)
            .map(String::as_str),
        Some(r#"["172.16.0.1"]"#)
    );
}

#[test]
fn three_nodes_full_mesh_records() {
    let d = plan(
        &snap(
            vec![
                node("node1", 1, &[]),
                node("node2", 2, &[]),
                node("node3", 3, &[]),
            ],
            vec![],
        ),
        &local("node1"),
    );
    let nb = d.nb.as_ref().expect("nb");
    let lrps: Vec<(&str, &str)> = nb
        .router
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.mac.as_str()))
        .collect();
    assert_eq!(
        lrps,
        vec![
            ("rtos-node1", "0a:58:0a:f4:01:01"),
            ("rtots-node1", "0a:58:64:58:00:01")
        ]
    );
    let routes: Vec<(&str, &str, Option<&String>)> = nb
        .router
        .routes
        .iter()
        .map(|r| {
            (
                r.ip_prefix.as_str(),
                r.nexthop.as_str(),
                r.external_ids.get(IC_NODE_KEY),
            )
        })
        .collect();
    let n2 = "node2".to_owned();
    let n3 = "node3".to_owned();
    assert_eq!(
        routes,
        vec![
            ("0.0.0.0/0", "10.244.1.2", None),
            ("10.244.0.0/16", "discard", None),
            ("100.64.0.0/16", "discard", None),
            ("10.244.2.0/24", "100.88.0.2", Some(&n2)),
            ("100.64.0.2/32", "100.88.0.2", Some(&n2)),
            ("10.244.3.0/24", "100.88.0.3", Some(&n3)),
            ("100.64.0.3/32", "100.88.0.3", Some(&n3)),
        ]
    );
    let ts = &nb.switches[1];
    assert_eq!(ts.name, TRANSIT_SWITCH);
    assert_eq!(
        ts.other_config.get("requested-tnl-key").map(String::as_str),
        Some("16711683")
    );
    let remote = ts
        .ports
        .iter()
        .find(|p| p.name == "tstor-node2")
        .expect("remote port");
    assert_eq!(remote.kind, "remote");
    assert_eq!(
        remote.addresses,
        set(["0a:58:64:58:00:02 100.88.0.2/16".into()])
    );
    assert_eq!(
        remote.options.get("requested-chassis").map(String::as_str),
        Some("node2")
    );
    assert_eq!(
        remote.options.get("requested-tnl-key").map(String::as_str),
        Some("2")
    );
    let local_ts = ts
        .ports
        .iter()
        .find(|p| p.name == "tstor-node1")
        .expect("local port");
    assert_eq!(local_ts.kind, "router");
    assert_eq!(
        local_ts.options.get("router-port").map(String::as_str),
        Some("rtots-node1")
    );
    let ns = &nb.switches[0];
    assert_eq!(
        ns.other_config.get("subnet").map(String::as_str),
        Some("10.244.1.0/24")
    );
    let mgmt = ns
        .ports
        .iter()
        .find(|p| p.name == "k8s-node1")
        .expect("mgmt");
    assert_eq!(mgmt.addresses, set(["0a:58:0a:f4:01:02 10.244.1.2".into()]));
    let sb = d.sb.as_ref().expect("sb");
    let names: Vec<&str> = sb.chassis.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, vec!["ch-node2", "ch-node3"]);
    assert_eq!(
        sb.bindings.get("tstor-node3").map(String::as_str),
        Some("ch-node3")
    );
    assert_eq!(d.remotes, zones(&["node2", "node3"]));
    let k = d.kernel.as_ref().expect("kernel");
    assert_eq!(k.mgmt_ip.to_string(), "10.244.1.2/24");
    assert!(k.nft.contains("oifname \"br-phy\""), "{}", k.nft);
    assert!(k.nft.contains("snat ip to 172.16.0.1"), "{}", k.nft);
}

#[test]
fn peers_missing_annotations_are_skipped_quietly() {
    let mut n2 = node("node2", 2, &[]);
    n2.chassis_id = None;
    let mut n3 = node("node3", 3, &[]);
    n3.transit = None;
    let mut n4 = node("node4", 4, &[]);
    n4.encap_ips.clear();
    let d = plan(
        &snap(vec![node("node1", 1, &[]), n2, n3, n4], vec![]),
        &local("node1"),
    );
    assert!(d.remotes.is_empty());
    assert!(d.problems.is_empty(), "{:?}", d.problems);
}

#[test]
fn zone_table() {
    // (local zones, peer zones, connected)
    let cases: &[(&[&str], &[&str], bool)] = &[
        (&[], &[], true),
        (&["a"], &[], false),
        (&[], &["a"], false),
        (&["a"], &["a"], true),
        (&["a"], &["b"], false),
        (&["a", "b"], &["b", "c"], true),
        (&["gw-a", "gw-b"], &["gw-b"], true),
    ];
    for (l, p, want) in cases {
        let d = plan(
            &snap(vec![node("node1", 1, l), node("node2", 2, p)], vec![]),
            &local("node1"),
        );
        assert_eq!(d.remotes.contains("node2"), *want, "local {l:?} peer {p:?}");
        let sb = d.sb.as_ref().expect("sb");
        if *want {
            assert_eq!(sb.chassis[0].transport_zones, zones(p));
        } else {
            assert!(sb.chassis.is_empty());
            assert!(
                !d.nb
                    .as_ref()
                    .expect("nb")
                    .router
                    .routes
                    .iter()
                    .any(|r| r.external_ids.contains_key(IC_NODE_KEY))
            );
        }
        let tz = d
            .ovs
            .external_ids
            .get("ovn-transport-zones")
            .cloned()
            .flatten();
        assert_eq!(tz, (!l.is_empty()).then(|| l.join(",")));
    }
}

#[test]
fn invalid_annotations_become_problems_not_panics() {
    let mut n2 = node("node2", 2, &[]);
    n2.errors
        .push("annotation k8s.ovn.org/transport-zones: invalid JSON".into());
    let d = plan(
        &snap(vec![node("node1", 1, &[]), n2], vec![]),
        &local("node1"),
    );
    assert_eq!(d.problems.len(), 1);
    assert_eq!(d.problems[0].object, ObjectRef::Node("node2".into()));
    assert!(d.remotes.contains("node2"));
}

#[test]
fn pods_keep_their_addresses_and_new_ones_fill_from_3() {
    let mut hostnet = pod("kube-system", "hn", None);
    hostnet.host_network = true;
    let mut done = pod("default", "done", Some(3));
    done.terminal = true;
    let pods = vec![
        pod("default", "b", Some(5)),
        pod("default", "a", None),
        pod("default", "c", None),
        hostnet,
        done,
    ];
    let d = plan(&snap(vec![node("node1", 1, &[])], pods), &local("node1"));
    let got: BTreeMap<String, String> = d
        .pod_annotations
        .iter()
        .map(|p| (p.name.clone(), p.addr.ip.to_string()))
        .collect();
    let want: BTreeMap<String, String> = [
        ("a", "10.244.1.3"),
        ("b", "10.244.1.5"),
        ("c", "10.244.1.4"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    assert_eq!(got, want);
    let nb = d.nb.expect("nb");
    let lsp = nb.switches[0]
        .ports
        .iter()
        .find(|p| p.name == "default_a")
        .expect("lsp");
    assert_eq!(lsp.addresses, set(["0a:58:0a:f4:01:03 10.244.1.3".into()]));
    assert_eq!(lsp.port_security, lsp.addresses);
    assert_eq!(
        lsp.external_ids.get("pod").map(String::as_str),
        Some("true")
    );
    assert!(
        !nb.switches[0]
            .ports
            .iter()
            .any(|p| p.name == "kube-system_hn" || p.name == "default_done")
    );
    let a = d.pod_annotations.iter().find(|p| p.name == "a").expect("a");
    assert!(
        a.value.contains(r#""gateway_ips":["10.244.1.1"]"#),
        "{}",
        a.value
    );
    assert!(
        a.value.contains(r#""ip_addresses":["10.244.1.3/24"]"#),
        "{}",
        a.value
    );
}

#[test]
fn conflicting_pod_addresses_are_reported() {
    let pods = vec![pod("default", "a", Some(7)), pod("default", "b", Some(7))];
    let d = plan(&snap(vec![node("node1", 1, &[])], pods), &local("node1"));
    assert_eq!(d.pod_annotations.len(), 1);
    assert!(d.problems.iter().any(|p| p.reason == "AddressConflict"));
}

proptest! {
    #[test]
    fn remotes_follow_the_connected_rule(zs in proptest::collection::vec(proptest::collection::btree_set(0u8..4, 0..3), 2..8)) {
        let names = ["z0", "z1", "z2", "z3"];
        let nodes: Vec<NodeInfo> = zs.iter().enumerate().map(|(i, z)| {
            let zz: Vec<&str> = z.iter().map(|x| names[usize::from(*x)]).collect();
            node(&format!("node{}", i + 1), u32::try_from(i + 1).unwrap_or(1), &zz)
        }).collect();
        let s = snap(nodes.clone(), vec![]);
        for me in &nodes {
            let d = plan(&s, &local(&me.name));
            for other in &nodes {
                if other.name == me.name { continue; }
                let want = (me.zones.is_empty() && other.zones.is_empty())
                    || me.zones.intersection(&other.zones).next().is_some();
                prop_assert_eq!(d.remotes.contains(&other.name), want);
                let sb = d.sb.as_ref().expect("sb");
                prop_assert_eq!(sb.chassis.iter().any(|c| c.hostname == other.name), want);
            }
        }
    }

    #[test]
    fn ipam_never_double_allocates(existing in proptest::collection::vec(proptest::option::of(0u8..=255), 0..40)) {
        let subnet: Ipv4Net = "10.244.1.0/26".parse().unwrap_or_default();
        let pods: Vec<PodInfo> = existing.iter().enumerate()
            .map(|(i, a)| pod("ns", &format!("p{i}"), *a)).collect();
        let (addrs, problems) = assign(subnet, &pods);
        let mut seen = BTreeSet::new();
        for a in addrs.values() {
            prop_assert!(seen.insert(a.ip), "double allocation of {}", a.ip);
            let n = u32::from(a.ip) - u32::from(subnet.network());
            prop_assert!((3..63).contains(&n), "{} outside the pod range", a.ip);
        }
        // every pod got an address or a problem naming it
        prop_assert_eq!(addrs.len() + problems.len(), pods.len());
        // valid, unique pre-existing addresses are kept
        for p in &pods {
            if let (Some(a), Some(got)) = (p.network, addrs.get(&p.key())) {
                let n = u32::from(a.ip) - u32::from(subnet.network());
                if (3..63).contains(&n) { prop_assert_eq!(a.ip, got.ip); }
            }
        }
    }
}

#[test]
fn duplicates_that_would_fail_a_transaction_leave_the_later_node_out() {
    let mut n3 = node("node3", 3, &[]);
    n3.encap_ips = vec![IpAddr::V4(Ipv4Addr::new(172, 16, 0, 2))];
    let mut n4 = node("node4", 4, &[]);
    n4.chassis_id = Some("ch-node2".into());
    let mut n5 = node("node5", 5, &[]);
    n5.id = Some(2);
    let mut n6 = node("node6", 6, &[]);
    n6.chassis_id = Some("ch-node1".into());
    let d = plan(
        &snap(
            vec![node("node1", 1, &[]), node("node2", 2, &[]), n3, n4, n5, n6],
            vec![],
        ),
        &local("node1"),
    );
    assert_eq!(d.remotes, zones(&["node2"]));
    let reasons: BTreeMap<String, &str> = d
        .problems
        .iter()
        .filter_map(|p| match &p.object {
            ObjectRef::Node(n) => Some((n.clone(), p.reason)),
            _ => None,
        })
        .collect();
    assert_eq!(reasons.get("node3"), Some(&"DuplicateEncapIP"));
    assert_eq!(reasons.get("node4"), Some(&"DuplicateChassisID"));
    assert_eq!(reasons.get("node5"), Some(&"DuplicateNodeID"));
    assert_eq!(reasons.get("node6"), Some(&"DuplicateChassisID"));
}

/// The rows a plan programs for one remote node (transit port, routes, chassis).
fn rows_of(d: &Desired, peer: &str) -> (Option<Lsp>, Vec<Route>, Option<RemoteChassis>) {
    let nb = d.nb.as_ref().expect("nb");
    let lsp = nb
        .switches
        .iter()
        .flat_map(|s| &s.ports)
        .find(|p| p.name == format!("tstor-{peer}"))
        .cloned();
    let routes = nb
        .router
        .routes
        .iter()
        .filter(|r| r.external_ids.get(IC_NODE_KEY).map(String::as_str) == Some(peer))
        .cloned()
        .collect();
    let ch =
        d.sb.as_ref()
            .expect("sb")
            .chassis
            .iter()
            .find(|c| c.hostname == peer)
            .cloned();
    (lsp, routes, ch)
}

/// A zone change (as after a relabel) moves one peer out: exactly its rows leave the plan,
/// the peer that stays keeps identical rows, and a peer whose zones change but stays
/// connected only changes its Chassis `transport_zones`.
#[test]
fn plan_under_zone_changes_touches_only_the_affected_peer() {
    let before = snap(
        vec![
            node("node1", 1, &["a", "gw"]),
            node("node2", 2, &["a"]),
            node("node3", 3, &["a"]),
            node("node4", 4, &["gw"]),
        ],
        vec![],
    );
    let d0 = plan(&before, &local("node1"));
    assert_eq!(d0.remotes, zones(&["node2", "node3", "node4"]));
    let mut after = before.clone();
    if let Some(n) = after.nodes.get_mut("node3") {
        n.zones = zones(&["b"]); // relabelled into tenant b
    }
    if let Some(n) = after.nodes.get_mut("node4") {
        n.zones = zones(&["gw", "c"]); // gains a zone, stays connected
    }
    let d1 = plan(&after, &local("node1"));
    assert_eq!(d1.remotes, zones(&["node2", "node4"]));
    assert_eq!(rows_of(&d1, "node3"), (None, vec![], None));
    assert_eq!(rows_of(&d0, "node2"), rows_of(&d1, "node2"));
    let (l0, r0, c0) = rows_of(&d0, "node4");
    let (l1, r1, c1) = rows_of(&d1, "node4");
    assert_eq!((l0, r0), (l1, r1));
    assert_eq!(c1.map(|c| c.transport_zones), Some(zones(&["c", "gw"])));
    assert_eq!(c0.map(|c| c.transport_zones), Some(zones(&["gw"])));
    // the local zones change: only ovn-transport-zones changes locally
    let mut moved = after.clone();
    if let Some(n) = moved.nodes.get_mut("node1") {
        n.zones = zones(&["b"]);
    }
    let d2 = plan(&moved, &local("node1"));
    assert_eq!(d2.remotes, zones(&["node3"]));
    assert_eq!(
        d2.ovs.external_ids.get("ovn-transport-zones"),
        Some(&Some("b".to_owned()))
    );
    // no zones at all: the key is removed
    if let Some(n) = moved.nodes.get_mut("node1") {
        n.zones.clear();
    }
    let d3 = plan(&moved, &local("node1"));
    assert_eq!(d3.ovs.external_ids.get("ovn-transport-zones"), Some(&None));
}

/// The test-only knobs: without row filtering every peer is programmed (transport zones
/// still carried); without transport zones neither the local key nor remote
/// `transport_zones` is written (rows still filtered).
#[test]
fn enforcement_knobs_turn_off_exactly_one_enforcement() {
    let s = snap(
        vec![node("node1", 1, &["a"]), node("node2", 2, &["b"])],
        vec![],
    );
    let mut l = local("node1");
    l.enforcement.filter_rows = false;
    let d = plan(&s, &l);
    assert_eq!(d.remotes, zones(&["node2"]));
    assert_eq!(
        d.sb.as_ref().expect("sb").chassis[0].transport_zones,
        zones(&["b"])
    );
    assert_eq!(
        d.ovs.external_ids.get("ovn-transport-zones"),
        Some(&Some("a".to_owned()))
    );
    let mut l = local("node1");
    l.enforcement.transport_zones = false;
    let d = plan(&s, &l);
    assert!(d.remotes.is_empty());
    assert_eq!(d.ovs.external_ids.get("ovn-transport-zones"), Some(&None));
    let s = snap(
        vec![node("node1", 1, &["a"]), node("node2", 2, &["a"])],
        vec![],
    );
    let d = plan(&s, &l);
    assert!(
        d.sb.as_ref().expect("sb").chassis[0]
            .transport_zones
            .is_empty()
    );
}
