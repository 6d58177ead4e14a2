//! The controller state without I/O: which zones a change marks for recomputation, what is
//! planned, and which problems are reported.

use std::collections::BTreeMap;

use k8s_api::trust_zone::{TrustZoneSpec, TunnelReportSpec};
use kube::core::ObjectMeta;

use super::*;

fn meta(labels: &[(&str, &str)], zones: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        labels: Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        annotations: zones.map(|z| BTreeMap::from([(TRANSPORT_ZONES.to_owned(), z.to_owned())])),
        ..Default::default()
    }
}

fn node_ref(name: &str) -> ObjectReference {
    ObjectReference {
        kind: Some("Node".into()),
        name: Some(name.into()),
        ..Default::default()
    }
}

fn node(s: &mut ZoneState, name: &str, labels: &[(&str, &str)], zones: Option<&str>) {
    s.apply_node(name, &meta(labels, zones), || node_ref(name));
}

fn tz(name: &str, selector: serde_json::Value) -> TrustZone {
    let mut t = TrustZone::new(
        name,
        TrustZoneSpec {
            node_selector: serde_json::from_value(selector).expect("selector"),
        },
    );
    t.metadata.generation = Some(1);
    t.metadata.resource_version = Some("1".into());
    t
}

fn report(name: &str, peers: &[&str]) -> TunnelReport {
    TunnelReport::new(
        name,
        TunnelReportSpec {
            peers: peers.iter().map(|s| s.to_string()).collect(),
        },
    )
}

fn dirty(s: &ZoneState) -> Vec<&str> {
    s.dirty().iter().map(String::as_str).collect()
}

/// Plans, pretending every planned status was written and echoed by the watch.
fn settle(s: &mut ZoneState) -> Vec<Planned> {
    let planned = s.plan(&StatusOptions::default(), &HashMap::new());
    for p in &planned {
        if let Some(z) = s.zones.get_mut(&p.zone) {
            z.status = Some(p.status.clone());
        }
    }
    planned
}

fn two_tenants() -> ZoneState {
    let mut s = ZoneState::new();
    s.apply_zone(&tz(
        "a",
        serde_json::json!({"matchLabels": {"tenant": "a"}}),
    ));
    s.apply_zone(&tz(
        "b",
        serde_json::json!({"matchLabels": {"tenant": "b"}}),
    ));
    node(&mut s, "a1", &[("tenant", "a")], None);
    node(&mut s, "a2", &[("tenant", "a")], None);
    node(&mut s, "b1", &[("tenant", "b")], None);
    node(&mut s, "gw", &[("tenant", "a")], Some(r#"["b"]"#));
    node(&mut s, "z1", &[], None);
    settle(&mut s);
    s
}

#[test]
fn changes_mark_only_the_affected_zones() {
    let mut s = two_tenants();
    assert!(dirty(&s).is_empty());
    assert_eq!(s.members("a"), ["a1", "a2", "gw"]);
    assert_eq!(s.members("b"), ["b1", "gw"]);

    // an unrelated label on a zone-less node: nothing
    node(&mut s, "z1", &[("rack", "7")], None);
    assert!(dirty(&s).is_empty());
    // the same labels again (a status heartbeat): nothing
    node(&mut s, "a1", &[("tenant", "a")], None);
    assert!(dirty(&s).is_empty());

    // relabel a2 from a to b: both
    node(&mut s, "a2", &[("tenant", "b")], None);
    assert_eq!(dirty(&s), ["a", "b"]);
    settle(&mut s);

    // a report from b1: the zones of b1 only
    s.apply_report(&report("b1", &["gw"]));
    assert_eq!(dirty(&s), ["b"]);
    settle(&mut s);
    // the same report again: nothing
    s.apply_report(&report("b1", &["gw"]));
    assert!(dirty(&s).is_empty());

    // the gateway's report: both of its zones
    s.apply_report(&report("gw", &["a1"]));
    assert_eq!(dirty(&s), ["a", "b"]);
    settle(&mut s);

    // annotating z1 into an annotation-only zone: "c" has no TrustZone, nothing to write
    node(&mut s, "z1", &[], Some(r#"["c"]"#));
    assert_eq!(dirty(&s), ["c"]);
    assert!(settle(&mut s).is_empty());
    assert_eq!(s.members("c"), ["z1"]);

    // deleting TrustZone b: the annotation zone b lives on (gw), nothing to write
    s.delete_zone("b");
    assert!(dirty(&s).is_empty());
    assert_eq!(s.members("b"), ["gw"]);

    // deleting the gateway: its zones (b has no TrustZone any more: nothing planned for it)
    s.delete_node("gw");
    assert_eq!(dirty(&s), ["a", "b"]);
    let planned = settle(&mut s);
    assert_eq!(
        planned.iter().map(|p| p.zone.as_str()).collect::<Vec<_>>(),
        ["a"]
    );
    assert_eq!(s.members("a"), ["a1"]);
}

#[test]
fn nothing_planned_when_nothing_changed() {
    let mut s = two_tenants();
    s.touch_all();
    assert_eq!(dirty(&s), ["a", "b"]);
    assert!(settle(&mut s).is_empty(), "recomputing is not rewriting");
}

#[test]
fn planned_status_and_published_override() {
    let mut s = ZoneState::new();
    s.apply_zone(&tz(
        "a",
        serde_json::json!({"matchLabels": {"tenant": "a"}}),
    ));
    node(&mut s, "a1", &[("tenant", "a")], None);
    node(&mut s, "a2", &[("tenant", "a")], None);
    s.apply_report(&report("a1", &["a2"]));
    let planned = s.plan(&StatusOptions::default(), &HashMap::new());
    assert_eq!(planned.len(), 1);
    let p = &planned[0];
    assert_eq!(p.status.members, ["a1", "a2"]);
    assert_eq!(p.status.conditions[0].status, "False");
    assert_eq!(
        p.status.conditions[0].message,
        "1 of 2 tunnels missing: a2→a1; no TunnelReport from a2"
    );
    // The watch has not delivered the write yet (same resourceVersion): the written status
    // counts as published, so the same status is not planned twice.
    let published = HashMap::from([(
        "a".to_owned(),
        (p.resource_version.clone(), p.status.clone()),
    )]);
    s.retry("a");
    assert!(s.plan(&StatusOptions::default(), &published).is_empty());
}

#[test]
fn bad_input_is_reported_once_and_isolated() {
    let mut s = ZoneState::new();
    s.apply_zone(&tz(
        "good",
        serde_json::json!({"matchLabels": {"tenant": "a"}}),
    ));
    s.apply_zone(&tz(
        "bad",
        serde_json::json!({"matchExpressions": [{"key": "tenant", "operator": "Near"}]}),
    ));
    node(&mut s, "n1", &[("tenant", "a")], Some("not json"));
    node(&mut s, "n2", &[("tenant", "a")], Some(r#"["Bad_Name"]"#));
    node(&mut s, "n3", &[], Some(r#"["bad"]"#));
    s.apply_report(&report("ghost", &["n1"]));
    let planned = settle(&mut s);
    let by: HashMap<&str, &Planned> = planned.iter().map(|p| (p.zone.as_str(), p)).collect();
    assert_eq!(by["good"].status.members, ["n1", "n2"]);
    assert_eq!(
        by["bad"].status.members,
        ["n3"],
        "annotation members still count"
    );
    assert_eq!(by["bad"].status.conditions[0].reason, "InvalidSelector");
    let w = s.take_warnings();
    let reasons: Vec<(&str, &str)> = w
        .iter()
        .map(|w| (w.regarding.name.as_deref().unwrap_or(""), w.reason.as_str()))
        .collect();
    assert_eq!(
        reasons,
        [
            ("n1", "InvalidTransportZones"),
            ("n2", "InvalidTransportZones"),
            ("ghost", "UnknownNode"),
            ("bad", "InvalidSelector"),
        ]
    );
    // recomputing does not repeat them
    s.touch_all();
    node(
        &mut s,
        "n1",
        &[("tenant", "a"), ("x", "y")],
        Some("not json"),
    );
    settle(&mut s);
    assert!(s.take_warnings().is_empty());
    // fixed and broken again: reported again
    node(&mut s, "n1", &[("tenant", "a")], Some(r#"["good"]"#));
    node(&mut s, "n1", &[("tenant", "a")], Some("[1]"));
    assert_eq!(s.take_warnings().len(), 1);
    // the ghost's Node appears: no longer unknown
    node(&mut s, "ghost", &[], None);
    s.touch_all();
    settle(&mut s);
    assert!(s.take_warnings().is_empty());
}

#[test]
fn kubelet_settable_selector_warns_without_webhook() {
    let mut s = ZoneState::new();
    s.apply_zone(&tz(
        "a",
        serde_json::json!({"matchLabels": {"tenant": "a"}}),
    ));
    let bare = StatusOptions {
        labels_protected_by_webhook: false,
    };
    let planned = s.plan(&bare, &HashMap::new());
    assert_eq!(planned[0].status.conditions[1].status, "False");
    let w = s.take_warnings();
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].reason, "KubeletSettableKeys");
    // with the webhook, no warning
    let mut s = ZoneState::new();
    s.apply_zone(&tz(
        "a",
        serde_json::json!({"matchLabels": {"tenant": "a"}}),
    ));
    s.plan(&StatusOptions::default(), &HashMap::new());
    assert!(s.take_warnings().is_empty());
}

/// Cost figures for docs/zones.md: 5,000 nodes in 100 TrustZones of 50, every node reporting
/// its 49 zone peers. Prints timings; asserts only correctness.
/// `cargo test --release -p ovnk-cluster-manager --lib scale -- --ignored --nocapture`
#[test]
#[ignore = "measurement; run in release"]
fn scale_5000_nodes_100_zones() {
    use std::time::Instant;
    let (n, z) = (5000usize, 100usize);
    let mut s = ZoneState::new();
    for k in 0..z {
        s.apply_zone(&tz(
            &format!("tz{k}"),
            serde_json::json!({"matchLabels": {"tenant": format!("t{k}")}}),
        ));
    }
    let t = Instant::now();
    for i in 0..n {
        let tenant = format!("t{}", i % z);
        node(&mut s, &format!("node{i}"), &[("tenant", &tenant)], None);
    }
    let nodes_ms = t.elapsed().as_secs_f64() * 1e3;
    for i in 0..n {
        let peers: Vec<String> = (0..n)
            .filter(|j| j % z == i % z && *j != i)
            .map(|j| format!("node{j}"))
            .collect();
        let peers: Vec<&str> = peers.iter().map(String::as_str).collect();
        s.apply_report(&report(&format!("node{i}"), &peers));
    }
    let t = Instant::now();
    let first = settle(&mut s);
    let all_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(first.len(), z);
    assert!(
        first
            .iter()
            .all(|p| p.status.conditions[0].status == "True")
    );

    let t = Instant::now();
    s.touch_all();
    assert!(settle(&mut s).is_empty());
    let resync_ms = t.elapsed().as_secs_f64() * 1e3;

    let t = Instant::now();
    node(&mut s, "node0", &[("tenant", "t1")], None);
    let planned = settle(&mut s);
    let label_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(planned.len(), 2);

    let t = Instant::now();
    s.apply_report(&report("node1", &["node101"]));
    let planned = settle(&mut s);
    let report_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(planned.len(), 1);

    let t = Instant::now();
    s.apply_zone(&tz(
        "tz5",
        serde_json::json!({"matchLabels": {"tenant": "t6"}}),
    ));
    let planned = settle(&mut s);
    let selector_ms = t.elapsed().as_secs_f64() * 1e3;
    assert_eq!(planned.len(), 1);
    eprintln!(
        "{{\"nodes\":{n},\"zones\":{z},\"index_build_ms\":{nodes_ms:.1},\"first_status_all_zones_ms\":{all_ms:.2},\
         \"resync_no_write_ms\":{resync_ms:.2},\"label_change_ms\":{label_ms:.3},\
         \"report_change_ms\":{report_ms:.3},\"selector_change_ms\":{selector_ms:.3}}}"
    );
}
