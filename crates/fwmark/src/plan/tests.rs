use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test ip")
}

fn key(n: &str) -> ServiceKey {
    ServiceKey::new("default", n)
}

fn ep(addr: &[&str], node: &str) -> Endpoint {
    Endpoint {
        addresses: addr.iter().map(|a| ip(a)).collect(),
        node: Some(node.into()),
        host_network: false,
    }
}

/// The seed's example: service1, ClusterIP 100.100.100.100, endpoints on node1 and node2.
fn seed() -> Snapshot {
    let mut s = Snapshot::default();
    s.marks.insert(
        key("service1"),
        MarkRequest {
            key: key("service1"),
            fwmark: 1000,
            created: Some(10),
        },
    );
    s.services.insert(
        key("service1"),
        ServiceInfo {
            cluster_ips: vec![ip("100.100.100.100")],
            egress_host_annotation: None,
        },
    );
    s.endpoints.insert(
        key("service1"),
        vec![ep(&["10.244.0.3"], "node1"), ep(&["10.244.1.6"], "node2")],
    );
    s
}

fn ips(p: &NodePlan) -> Vec<String> {
    p.desired.entries.keys().map(|i| i.to_string()).collect()
}

#[test]
fn seed_example_per_node() {
    let s = seed();
    assert_eq!(
        ips(&plan_node(&s, "node1", FULL_MASK)),
        ["10.244.0.3", "100.100.100.100"]
    );
    assert_eq!(
        ips(&plan_node(&s, "node2", FULL_MASK)),
        ["10.244.1.6", "100.100.100.100"]
    );
    // a node without endpoints still marks reply traffic from the ClusterIP
    assert_eq!(ips(&plan_node(&s, "node3", FULL_MASK)), ["100.100.100.100"]);
    let p = plan_node(&s, "node1", FULL_MASK);
    let e = &p.desired.entries[&ip("10.244.0.3")];
    assert_eq!((e.mark.value(), e.mark.mask()), (1000, FULL_MASK));
    assert_eq!(e.owner.to_string(), "default/service1");
    assert!(p.warnings.is_empty());
}

#[test]
fn endpoints_merged_across_slices_and_nodes() {
    let mut s = seed();
    s.endpoints
        .get_mut(&key("service1"))
        .expect("eps")
        .extend([ep(&["10.244.0.9"], "node1"), ep(&["10.244.2.2"], "node3")]);
    assert_eq!(
        ips(&plan_node(&s, "node1", FULL_MASK)),
        ["10.244.0.3", "10.244.0.9", "100.100.100.100"]
    );
}

#[test]
fn egress_service_annotation_host_only() {
    let mut s = seed();
    s.services
        .get_mut(&key("service1"))
        .expect("svc")
        .egress_host_annotation = Some("node2".into());
    assert!(plan_node(&s, "node1", FULL_MASK).desired.is_empty());
    assert_eq!(
        ips(&plan_node(&s, "node2", FULL_MASK)),
        ["10.244.0.3", "10.244.1.6", "100.100.100.100"]
    );
}

#[test]
fn egress_service_status_host_wins_over_annotation() {
    let mut s = seed();
    s.services
        .get_mut(&key("service1"))
        .expect("svc")
        .egress_host_annotation = Some("node2".into());
    s.egress_hosts.insert(key("service1"), "node1".into());
    assert!(plan_node(&s, "node2", FULL_MASK).desired.is_empty());
    assert_eq!(plan_node(&s, "node1", FULL_MASK).desired.len(), 3);
}

#[test]
fn egress_service_all_means_each_node_its_own() {
    let mut s = seed();
    s.egress_hosts.insert(key("service1"), "ALL".into());
    assert_eq!(
        ips(&plan_node(&s, "node1", FULL_MASK)),
        ["10.244.0.3", "100.100.100.100"]
    );
    assert_eq!(egress_scope(&s, &key("service1")), EgressScope::All);
    // empty host = not hosted yet = ordinary Service
    s.egress_hosts.insert(key("service1"), "".into());
    assert_eq!(egress_scope(&s, &key("service1")), EgressScope::PerNode);
}

#[test]
fn dual_stack() {
    let mut s = seed();
    let svc = s.services.get_mut(&key("service1")).expect("svc");
    svc.cluster_ips.push(ip("fd00:10:96::10"));
    s.endpoints.insert(
        key("service1"),
        vec![ep(&["10.244.0.3", "fd00:10:244::3"], "node1")],
    );
    let p = plan_node(&s, "node1", FULL_MASK);
    assert_eq!(p.desired.family(true).count(), 2);
    assert_eq!(p.desired.family(false).count(), 2);
}

#[test]
fn host_network_endpoints_not_marked() {
    let mut s = seed();
    s.endpoints.insert(
        key("service1"),
        vec![Endpoint {
            addresses: vec![ip("192.168.1.10")],
            node: Some("node1".into()),
            host_network: true,
        }],
    );
    assert_eq!(ips(&plan_node(&s, "node1", FULL_MASK)), ["100.100.100.100"]);
}

fn conflicting() -> Snapshot {
    let mut s = seed();
    s.marks.insert(
        key("b"),
        MarkRequest {
            key: key("b"),
            fwmark: 1500,
            created: Some(5), // older than service1
        },
    );
    s.services.insert(
        key("b"),
        ServiceInfo {
            cluster_ips: vec![ip("100.100.100.200")],
            egress_host_annotation: None,
        },
    );
    s.endpoints
        .insert(key("b"), vec![ep(&["10.244.0.3"], "node1")]);
    s
}

#[test]
fn conflict_older_wins_deterministically() {
    let s = conflicting();
    let p = plan_node(&s, "node1", FULL_MASK);
    let e = &p.desired.entries[&ip("10.244.0.3")];
    assert_eq!(e.owner, key("b"));
    assert_eq!(e.mark.value(), 1500);
    assert_eq!(
        p.warnings,
        vec![PlanWarning::Conflict {
            ip: ip("10.244.0.3"),
            winner: key("b"),
            loser: key("service1")
        }]
    );
    // ties on creation time: namespace/name order
    let mut t = s.clone();
    for m in t.marks.values_mut() {
        m.created = None;
    }
    let p = plan_node(&t, "node1", FULL_MASK);
    assert_eq!(p.desired.entries[&ip("10.244.0.3")].owner, key("b"));
    // plan is independent of insertion order
    assert_eq!(
        plan_node(&s, "node1", FULL_MASK),
        plan_node(&s.clone(), "node1", FULL_MASK)
    );
}

#[test]
fn conflict_conditions_name_each_other() {
    let s = conflicting();
    let st = plan_status(&s);
    let find = |k: &str, t: &str| {
        st[&key(k)]
            .iter()
            .find(|c| c.type_ == t)
            .cloned()
            .expect("condition")
    };
    let a = find("service1", "ConflictFree");
    let b = find("b", "ConflictFree");
    assert!(!a.status && !b.status);
    assert!(a.message.contains("default/b"), "{}", a.message);
    assert!(a.message.contains("10.244.0.3"));
    assert!(a.message.ends_with("default/b wins"), "{}", a.message);
    assert!(b.message.contains("default/service1"), "{}", b.message);
    assert!(b.message.ends_with("default/b wins"), "{}", b.message);
    assert!(!find("service1", "Ready").status);
}

#[test]
fn same_mark_overlap_is_no_conflict() {
    let mut s = conflicting();
    s.marks.get_mut(&key("b")).expect("b").fwmark = 1000;
    assert!(plan_node(&s, "node1", FULL_MASK).warnings.is_empty());
    assert!(plan_status(&s).values().flatten().all(|c| c.status));
}

#[test]
fn status_service_missing_and_invalid_mark() {
    let mut s = seed();
    s.marks.insert(
        key("ghost"),
        MarkRequest {
            key: key("ghost"),
            fwmark: 1200,
            created: None,
        },
    );
    s.marks.get_mut(&key("service1")).expect("m").fwmark = 1008;
    let st = plan_status(&s);
    let g = &st[&key("ghost")];
    assert!(!g[0].status && g[0].reason == "ServiceNotFound");
    let m = &st[&key("service1")];
    assert!(!m[1].status && m[1].reason == "ReservedMarkCollision");
    assert!(m[1].message.contains("OVN-Kubernetes"), "{}", m[1].message);
    // an invalid mark is never applied, and never blocks others
    let p = plan_node(&s, "node1", FULL_MASK);
    assert!(p.desired.is_empty());
    assert!(matches!(p.warnings[0], PlanWarning::InvalidMark { .. }));
}

#[test]
fn deletions_remove_exactly_their_entries() {
    let base = conflicting();
    // delete the ServiceFWMark b: service1 takes over the shared endpoint, b's ClusterIP goes
    let mut s = base.clone();
    s.marks.remove(&key("b"));
    let p = plan_node(&s, "node1", FULL_MASK);
    assert_eq!(ips(&p), ["10.244.0.3", "100.100.100.100"]);
    assert_eq!(p.desired.entries[&ip("10.244.0.3")].owner, key("service1"));
    // delete Service service1: its ServiceFWMark has no effect
    let mut s = base.clone();
    s.services.remove(&key("service1"));
    assert_eq!(
        ips(&plan_node(&s, "node1", FULL_MASK)),
        ["10.244.0.3", "100.100.100.200"]
    );
    // delete one endpoint
    let mut s = seed();
    s.endpoints
        .insert(key("service1"), vec![ep(&["10.244.1.6"], "node2")]);
    assert_eq!(ips(&plan_node(&s, "node1", FULL_MASK)), ["100.100.100.100"]);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn arb_snapshot() -> impl Strategy<Value = Snapshot> {
        let svc = (
            0u8..6,
            1000i64..=2000,
            proptest::option::of(0i64..3),
            0u8..4,
        );
        proptest::collection::vec(
            (
                svc,
                proptest::collection::vec((0u8..20, 0u8..3, any::<bool>()), 0..6),
            ),
            0..6,
        )
        .prop_map(|items| {
            let mut s = Snapshot::default();
            for ((n, fw, created, host), eps) in items {
                let k = ServiceKey::new("ns", format!("s{n}"));
                s.marks.insert(
                    k.clone(),
                    MarkRequest {
                        key: k.clone(),
                        fwmark: fw,
                        created,
                    },
                );
                s.services.insert(
                    k.clone(),
                    ServiceInfo {
                        cluster_ips: vec![IpAddr::from([100, 64, 0, n])],
                        egress_host_annotation: match host {
                            0 => Some("n0".into()),
                            1 => Some("ALL".into()),
                            _ => None,
                        },
                    },
                );
                s.endpoints.insert(
                    k,
                    eps.into_iter()
                        .map(|(a, node, hn)| Endpoint {
                            addresses: vec![IpAddr::from([10, 0, 0, a])],
                            node: Some(format!("n{node}")),
                            host_network: hn,
                        })
                        .collect(),
                );
            }
            s
        })
    }

    proptest! {
        #[test]
        fn plan_invariants(s in arb_snapshot()) {
            for node in ["n0", "n1", "n2"] {
                let p = plan_node(&s, node, FULL_MASK);
                for (ip, e) in &p.desired.entries {
                    // every entry belongs to an existing Service with a valid mark
                    prop_assert!(s.services.contains_key(&e.owner));
                    prop_assert!(mark::validate(s.marks[&e.owner].fwmark, FULL_MASK).is_ok());
                    // and is one of its sources, never a hostNetwork address only
                    prop_assert!(all_sources(&s, &e.owner).contains(ip));
                }
                // deterministic
                prop_assert_eq!(&p, &plan_node(&s, node, FULL_MASK));
            }
        }
    }
}
