use super::*;
use proptest::prelude::*;

fn net(s: &str) -> IpNet {
    s.parse().expect("cidr")
}

fn cfg() -> AllocConfig {
    AllocConfig::new(
        net("10.244.0.0/16"),
        24,
        net("100.88.0.0/16"),
        net("100.64.0.0/16"),
    )
    .expect("config")
}

fn node(name: &str, created: i64) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        created: Some(created),
        observed: Observed::default(),
    }
}

fn annotated(name: &str, created: i64, a: &Assignment) -> NodeInfo {
    let m = annotations(a);
    NodeInfo {
        name: name.into(),
        created: Some(created),
        observed: Observed {
            node_id: m.get(ann::NODE_ID).cloned(),
            subnets: m.get(ann::NODE_SUBNETS).cloned(),
            transit: m.get(ann::NODE_TRANSIT_SWITCH_PORT_IFADDR).cloned(),
            join: m.get(ann::NODE_GATEWAY_ROUTER_LRP_IFADDRS).cloned(),
        },
    }
}

#[test]
fn config_validation() {
    let ok = |c: &str, l: u8, t: &str, j: &str| AllocConfig::new(net(c), l, net(t), net(j));
    assert!(ok("10.244.0.0/16", 24, "100.88.0.0/16", "100.64.0.0/16").is_ok());
    assert!(matches!(
        ok("10.244.1.0/16", 24, "100.88.0.0/16", "100.64.0.0/16"),
        Err(ConfigError::HostBits { .. })
    ));
    assert!(matches!(
        ok("fd00::/48", 64, "100.88.0.0/16", "100.64.0.0/16"),
        Err(ConfigError::NotIpv4 { .. })
    ));
    assert!(matches!(
        ok("10.244.0.0/16", 15, "100.88.0.0/16", "100.64.0.0/16"),
        Err(ConfigError::HostSubnetLength { .. })
    ));
    assert!(matches!(
        ok("10.244.0.0/16", 31, "100.88.0.0/16", "100.64.0.0/16"),
        Err(ConfigError::HostSubnetLength { .. })
    ));
    assert!(matches!(
        ok("0.0.0.0/4", 30, "100.88.0.0/16", "100.64.0.0/16"),
        Err(ConfigError::HostSubnetLength { .. })
    ));
    assert!(matches!(
        ok("10.244.0.0/16", 24, "100.88.0.0/31", "100.64.0.0/16"),
        Err(ConfigError::TooSmall { .. })
    ));
    // /30 has hosts 1 and 2: exactly one node ID (2).
    let c = ok("10.244.0.0/16", 24, "100.88.0.0/30", "100.64.0.0/16").expect("ok");
    assert_eq!(c.max_node_id(), 2);
    assert_eq!(cfg().max_node_id(), MAX_PORT_TUNNEL_KEY);
    let c = ok("10.244.0.0/16", 24, "100.88.0.0/24", "100.64.0.0/16").expect("ok");
    assert_eq!(c.max_node_id(), 254);
}

#[test]
fn subnet_indexing() {
    let c = cfg();
    assert_eq!(c.subnet_count(), 256);
    assert_eq!(c.subnet(0), "10.244.0.0/24".parse::<Ipv4Net>().expect("n"));
    assert_eq!(
        c.subnet(255),
        "10.244.255.0/24".parse::<Ipv4Net>().expect("n")
    );
    for i in [0, 1, 77, 255] {
        assert_eq!(c.subnet_index(c.subnet(i)), Some(i));
    }
    for bad in ["10.244.1.0/23", "10.245.0.0/24", "10.244.1.0/25"] {
        assert_eq!(c.subnet_index(bad.parse().expect("n")), None, "{bad}");
    }
    assert_eq!(c.transit_addr(3).to_string(), "100.88.0.3/16");
    assert_eq!(c.join_addr(300).to_string(), "100.64.1.44/16");
}

#[test]
fn exact_upstream_formats() {
    let a = cfg().assignment(3, 1);
    let m = annotations(&a);
    assert_eq!(m[ann::NODE_ID], "3");
    assert_eq!(m[ann::NODE_SUBNETS], r#"{"default":["10.244.1.0/24"]}"#);
    assert_eq!(
        m[ann::NODE_TRANSIT_SWITCH_PORT_IFADDR],
        r#"{"ipv4":"100.88.0.3/16"}"#
    );
    assert_eq!(
        m[ann::NODE_GATEWAY_ROUTER_LRP_IFADDRS],
        r#"{"default":{"ipv4":"100.64.0.3/16"}}"#
    );
}

#[test]
fn fresh_nodes_in_creation_order() {
    let mut al = Allocator::new(cfg());
    let r = al.sync(&[node("b", 2), node("a", 2), node("c", 1)]);
    assert!(r.findings.is_empty() && r.exhausted.is_empty(), "{r:?}");
    let got: Vec<(String, u32, String)> = al
        .assignments()
        .into_iter()
        .map(|(n, a)| (n, a.id, a.subnet.to_string()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("a".into(), 3, "10.244.1.0/24".into()),
            ("b".into(), 4, "10.244.2.0/24".into()),
            ("c".into(), 2, "10.244.0.0/24".into()),
        ]
    );
}

#[test]
fn release_and_reuse_lowest_free() {
    let mut al = Allocator::new(cfg());
    al.sync(&[node("a", 1), node("b", 2), node("c", 3)]);
    let b = al.get("b").expect("b");
    let r = al.sync(&[node("a", 1), node("c", 3)]);
    assert_eq!(r.released, vec!["b".to_string()]);
    assert_eq!(al.get("b"), None);
    al.sync(&[node("a", 1), node("c", 3), node("d", 4)]);
    assert_eq!(al.get("d"), Some(b), "d reuses what b released");
}

#[test]
fn rebuild_adopts_annotations_even_for_older_unannotated_nodes() {
    let c = cfg();
    // "new" (older, unannotated) must not take the ID/subnet "old" already publishes.
    let published = c.assignment(2, 0);
    let nodes = [node("new", 1), annotated("old", 5, &published)];
    let mut al = Allocator::new(c);
    let r = al.sync(&nodes);
    assert!(r.findings.is_empty(), "{r:?}");
    assert_eq!(al.get("old"), Some(published));
    assert_eq!(al.get("new").map(|a| a.id), Some(3));
}

#[test]
fn conflicts_go_to_the_later_node() {
    let c = cfg();
    let a = c.assignment(5, 9);
    let mut later = annotated("z-later", 10, &a);
    later.name = "a-later".into(); // the name sorts first, but the creation time decides
    let nodes = [later, annotated("first", 1, &a)];
    let mut al = Allocator::new(c.clone());
    let r = al.sync(&nodes);
    assert_eq!(al.get("first"), Some(a));
    let l = al.get("a-later").expect("reallocated");
    assert_ne!(l.id, a.id);
    assert_ne!(l.subnet, a.subnet);
    let kinds: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|(n, _)| n == "a-later")
        .map(|(_, f)| f)
        .collect();
    assert!(
        kinds.contains(&&Finding::Conflict {
            key: ann::NODE_ID,
            value: "5".into(),
            holder: "first".into()
        }),
        "{kinds:?}"
    );
    assert!(
        kinds.iter().any(|f| matches!(
            f,
            Finding::Conflict { key, holder, .. } if *key == ann::NODE_SUBNETS && holder == "first"
        )),
        "{kinds:?}"
    );
    // Transit/join values of the loser were also not its own: reported as mismatches.
    assert!(
        kinds
            .iter()
            .any(|f| matches!(f, Finding::Mismatch { key, .. } if *key == ann::NODE_TRANSIT_SWITCH_PORT_IFADDR))
    );
    // Same creation time: the name decides.
    let nodes = [annotated("b", 1, &a), annotated("a", 1, &a)];
    let mut al = Allocator::new(c);
    al.sync(&nodes);
    assert_eq!(al.get("a"), Some(a));
    assert_ne!(al.get("b").map(|x| x.id), Some(a.id));
}

#[test]
fn malformed_and_out_of_range_claims_are_refused() {
    let c = AllocConfig::new(
        net("10.244.0.0/16"),
        24,
        net("100.88.0.0/24"),
        net("100.64.0.0/16"),
    )
    .expect("config");
    let cases: Vec<(Observed, &str, &'static str)> = vec![
        (
            Observed {
                node_id: Some("x".into()),
                ..Default::default()
            },
            "malformed",
            ann::NODE_ID,
        ),
        (
            Observed {
                node_id: Some("1".into()),
                ..Default::default()
            },
            "out of range",
            ann::NODE_ID,
        ),
        (
            Observed {
                node_id: Some("255".into()),
                ..Default::default()
            },
            "out of range",
            ann::NODE_ID,
        ),
        (
            Observed {
                subnets: Some("{".into()),
                ..Default::default()
            },
            "malformed",
            ann::NODE_SUBNETS,
        ),
        (
            Observed {
                subnets: Some(r#"{"blue":["10.244.1.0/24"]}"#.into()),
                ..Default::default()
            },
            "malformed",
            ann::NODE_SUBNETS,
        ),
        (
            Observed {
                subnets: Some(r#"{"default":["10.244.1.0/24","10.244.2.0/24"]}"#.into()),
                ..Default::default()
            },
            "malformed",
            ann::NODE_SUBNETS,
        ),
        (
            Observed {
                subnets: Some(r#"{"default":["10.99.1.0/24"]}"#.into()),
                ..Default::default()
            },
            "out of range",
            ann::NODE_SUBNETS,
        ),
        (
            Observed {
                transit: Some("garbage".into()),
                ..Default::default()
            },
            "was",
            ann::NODE_TRANSIT_SWITCH_PORT_IFADDR,
        ),
    ];
    for (obs, word, key) in cases {
        let mut al = Allocator::new(c.clone());
        let r = al.sync(&[NodeInfo {
            name: "n".into(),
            created: None,
            observed: obs.clone(),
        }]);
        assert!(al.get("n").is_some(), "{obs:?}: node still allocated");
        assert!(
            r.findings.iter().any(|(n, f)| n == "n"
                && f.to_string().contains(word)
                && f.to_string().contains(key)),
            "{obs:?}: {r:?}"
        );
    }
    // The old single-string subnet form and an IPv6 extra are accepted.
    let mut al = Allocator::new(c.clone());
    let r = al.sync(&[NodeInfo {
        name: "n".into(),
        created: None,
        observed: Observed {
            node_id: Some("7".into()),
            subnets: Some(r#"{"default":"10.244.9.0/24"}"#.into()),
            ..Default::default()
        },
    }]);
    assert!(
        r.findings
            .iter()
            .all(|(_, f)| !matches!(f, Finding::Mismatch { key, .. } if *key == ann::NODE_ID)),
        "{r:?}"
    );
    assert_eq!(
        al.get("n").map(|a| (a.id, a.subnet.to_string())),
        Some((7, "10.244.9.0/24".into()))
    );
}

#[test]
fn exhaustion_affects_only_the_extra_nodes() {
    // Two subnets only.
    let c = AllocConfig::new(
        net("10.244.0.0/23"),
        24,
        net("100.88.0.0/16"),
        net("100.64.0.0/16"),
    )
    .expect("config");
    let mut al = Allocator::new(c.clone());
    let r = al.sync(&[node("a", 1), node("b", 2), node("c", 3)]);
    assert!(al.get("a").is_some() && al.get("b").is_some());
    assert_eq!(al.get("c"), None);
    assert_eq!(
        r.exhausted,
        vec![(
            "c".into(),
            Exhausted::Subnets {
                cidr: c.cluster_cidr(),
                count: 2
            }
        )]
    );
    // c's ID was handed back, so a later node does not skip it.
    let r = al.sync(&[node("b", 2), node("c", 3)]);
    assert!(r.exhausted.is_empty());
    assert_eq!(al.get("c").map(|a| a.id), Some(2));

    // Node IDs exhausted: a /30 transit range addresses only ID 2.
    let c = AllocConfig::new(
        net("10.244.0.0/16"),
        24,
        net("100.88.0.0/30"),
        net("100.64.0.0/16"),
    )
    .expect("config");
    let mut al = Allocator::new(c);
    let r = al.sync(&[node("a", 1), node("b", 2)]);
    assert_eq!(
        r.exhausted,
        vec![("b".into(), Exhausted::NodeIds { max: 2 })]
    );
}

#[test]
fn allocated_node_keeps_its_values_when_annotations_are_edited() {
    let mut al = Allocator::new(cfg());
    al.sync(&[node("a", 1)]);
    let a = al.get("a").expect("a");
    let mut edited = annotated("a", 1, &a);
    edited.observed.node_id = Some("99".into());
    let r = al.sync(&[edited.clone()]);
    assert_eq!(al.get("a"), Some(a));
    assert_eq!(
        r.findings,
        vec![(
            "a".into(),
            Finding::Mismatch {
                key: ann::NODE_ID,
                found: "99".into()
            }
        )]
    );
    assert_eq!(
        annotation_patch(&a, &edited.observed),
        BTreeMap::from([(ann::NODE_ID, a.id.to_string())])
    );
    assert!(annotation_patch(&a, &annotated("a", 1, &a).observed).is_empty());
    assert_eq!(annotation_patch(&a, &Observed::default()), annotations(&a));
}

// ---- property test: random add / delete / corrupt / restart sequences ----

#[derive(Debug, Clone)]
enum Op {
    Add(u8),
    Delete(u8),
    /// Set a node's annotation `key` to the value another node (or garbage) has.
    Corrupt(u8, u8, u8),
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..12).prop_map(Op::Add),
        2 => (0u8..12).prop_map(Op::Delete),
        1 => (0u8..12, 0u8..4, 0u8..13).prop_map(|(a, k, b)| Op::Corrupt(a, k, b)),
        1 => Just(Op::Restart),
    ]
}

const KEYS: [&str; 4] = [
    ann::NODE_ID,
    ann::NODE_SUBNETS,
    ann::NODE_TRANSIT_SWITCH_PORT_IFADDR,
    ann::NODE_GATEWAY_ROUTER_LRP_IFADDRS,
];

fn set(o: &mut Observed, key: &str, v: Option<String>) {
    match key {
        ann::NODE_ID => o.node_id = v,
        ann::NODE_SUBNETS => o.subnets = v,
        ann::NODE_TRANSIT_SWITCH_PORT_IFADDR => o.transit = v,
        _ => o.join = v,
    }
}

fn get(o: &Observed, key: &str) -> Option<String> {
    match key {
        ann::NODE_ID => o.node_id.clone(),
        ann::NODE_SUBNETS => o.subnets.clone(),
        ann::NODE_TRANSIT_SWITCH_PORT_IFADDR => o.transit.clone(),
        _ => o.join.clone(),
    }
}

/// What the shell does after a sync: write the patch onto the node.
fn publish(al: &Allocator, nodes: &mut BTreeMap<String, NodeInfo>) {
    for n in nodes.values_mut() {
        if let Some(a) = al.get(&n.name) {
            for (k, v) in annotation_patch(&a, &n.observed) {
                set(&mut n.observed, k, Some(v));
            }
        }
    }
}

fn check_invariants(al: &Allocator, nodes: &BTreeMap<String, NodeInfo>) {
    let all = al.assignments();
    assert!(all.keys().all(|n| nodes.contains_key(n)), "only live nodes");
    let mut ids = BTreeSet::new();
    let mut subnets = BTreeSet::new();
    let mut transit = BTreeSet::new();
    let mut join = BTreeSet::new();
    for a in all.values() {
        assert!(ids.insert(a.id), "duplicate id {a:?}");
        assert!(subnets.insert(a.subnet), "duplicate subnet {a:?}");
        assert!(transit.insert(a.transit), "duplicate transit {a:?}");
        assert!(join.insert(a.join), "duplicate join {a:?}");
        assert!(a.id >= FIRST_NODE_ID && a.id <= al.config().max_node_id());
        assert!(al.config().cluster_cidr().contains(&a.subnet));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn never_collide_and_rebuild_reproduces(ops in proptest::collection::vec(op(), 1..60)) {
        // Small ranges so exhaustion happens: 8 subnets, node IDs 2..=6.
        let c = AllocConfig::new(
            net("10.244.0.0/21"), 24, net("100.88.0.0/29"), net("100.64.0.0/16"),
        ).expect("config");
        let mut al = Allocator::new(c.clone());
        let mut nodes: BTreeMap<String, NodeInfo> = BTreeMap::new();
        let mut clock = 0i64;
        let garbage = ["x", "{", "1", "70000", r#"{"default":["10.99.0.0/24"]}"#];
        for op in ops {
            match op {
                Op::Add(i) => {
                    clock += 1;
                    let name = format!("n{i}");
                    nodes.entry(name.clone()).or_insert(NodeInfo { name, created: Some(clock), observed: Observed::default() });
                }
                Op::Delete(i) => { nodes.remove(&format!("n{i}")); }
                Op::Corrupt(i, k, src) => {
                    let key = KEYS[usize::from(k)];
                    let value = match nodes.get(&format!("n{src}")) {
                        Some(n) => get(&n.observed, key),
                        None => Some(garbage[usize::from(src) % garbage.len()].to_string()),
                    };
                    if let Some(n) = nodes.get_mut(&format!("n{i}")) {
                        set(&mut n.observed, key, value);
                    }
                }
                Op::Restart => {
                    let before = al.assignments();
                    // Allocated nodes were published after the last sync. A node left without
                    // an allocation (exhaustion) may still carry a forged claim; an older node's
                    // claim legitimately wins a rebuild, so equality is only promised without one.
                    let clean = nodes
                        .values()
                        .all(|n| before.contains_key(&n.name) || n.observed == Observed::default());
                    al = Allocator::new(c.clone());
                    let list: Vec<NodeInfo> = nodes.values().cloned().collect();
                    let r = al.sync(&list);
                    if clean {
                        prop_assert_eq!(&al.assignments(), &before, "{:?}", r);
                        prop_assert!(r.findings.is_empty(), "{:?}", r);
                    }
                }
            }
            let list: Vec<NodeInfo> = nodes.values().cloned().collect();
            al.sync(&list);
            check_invariants(&al, &nodes);
            publish(&al, &mut nodes);
            // Published annotations mean exactly the assignment.
            for (name, a) in al.assignments() {
                prop_assert!(annotation_patch(&a, &nodes[&name].observed).is_empty());
            }
        }
    }
}
