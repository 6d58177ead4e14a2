use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use k8s_openapi::jiff::Timestamp;

use super::*;

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn reports(r: &[(&str, &[&str])]) -> Reports {
    r.iter()
        .map(|(n, p)| (n.to_string(), p.iter().map(|s| s.to_string()).collect()))
        .collect()
}

fn by_labels(kv: &[(&str, &str)]) -> LabelSelector {
    LabelSelector {
        match_labels: Some(
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Default::default()
    }
}

fn t(s: i64) -> Time {
    Time(Timestamp::from_second(s).expect("time"))
}

const ALL: &[&str] = &["n1", "n2", "n3"];

/// Table: members × reports × selector error → Ready verdict.
#[test]
fn ready_table() {
    struct Case {
        name: &'static str,
        members: &'static [&'static str],
        reports: &'static [(&'static str, &'static [&'static str])],
        selector_error: Option<&'static str>,
        status: bool,
        reason: &'static str,
        message: &'static str,
    }
    let cases = [
        Case {
            name: "no members",
            members: &[],
            reports: &[],
            selector_error: None,
            status: false,
            reason: REASON_NO_MEMBERS,
            message: "no Node is a member: the selector matches no Node and no Node names this zone in its k8s.ovn.org/transport-zones annotation",
        },
        Case {
            name: "one member, no report: nothing to establish",
            members: &["n1"],
            reports: &[],
            selector_error: None,
            status: true,
            reason: REASON_ALL_TUNNELS,
            message: "1 member: no tunnel to establish",
        },
        Case {
            name: "all present",
            members: ALL,
            reports: &[
                ("n1", &["n2", "n3"]),
                ("n2", &["n1", "n3"]),
                ("n3", &["n1", "n2"]),
            ],
            selector_error: None,
            status: true,
            reason: REASON_ALL_TUNNELS,
            message: "all 6 tunnels between 3 members established",
        },
        Case {
            name: "extra peers outside the zone and self do not count",
            members: &["n1", "n2"],
            reports: &[("n1", &["n1", "n2", "x9"]), ("n2", &["n1", "other"])],
            selector_error: None,
            status: true,
            reason: REASON_ALL_TUNNELS,
            message: "all 2 tunnels between 2 members established",
        },
        Case {
            name: "one missing in each direction",
            members: ALL,
            reports: &[("n1", &["n2"]), ("n2", &["n1", "n3"]), ("n3", &["n2"])],
            selector_error: None,
            status: false,
            reason: REASON_TUNNELS_MISSING,
            message: "2 of 6 tunnels missing: n1→n3, n3→n1",
        },
        Case {
            name: "a member without a report observes nothing",
            members: ALL,
            reports: &[("n1", &["n2", "n3"]), ("n2", &["n1", "n3"])],
            selector_error: None,
            status: false,
            reason: REASON_TUNNELS_MISSING,
            message: "2 of 6 tunnels missing: n3→n1, n3→n2; no TunnelReport from n3",
        },
        Case {
            name: "no reports at all",
            members: &["n1", "n2"],
            reports: &[],
            selector_error: None,
            status: false,
            reason: REASON_TUNNELS_MISSING,
            message: "2 of 2 tunnels missing: n1→n2, n2→n1; no TunnelReport from n1, n2",
        },
        Case {
            name: "invalid selector wins, annotation members counted",
            members: &["n1", "n2"],
            reports: &[("n1", &["n2"]), ("n2", &["n1"])],
            selector_error: Some("x: unknown operator \"Near\""),
            status: false,
            reason: REASON_INVALID_SELECTOR,
            message: "spec.nodeSelector selects no Node: x: unknown operator \"Near\"; 2 members from the k8s.ovn.org/transport-zones annotation",
        },
        Case {
            name: "invalid selector, no members",
            members: &[],
            reports: &[],
            selector_error: Some("bad"),
            status: false,
            reason: REASON_INVALID_SELECTOR,
            message: "spec.nodeSelector selects no Node: bad",
        },
    ];
    let sel = LabelSelector::default();
    for c in cases {
        let members = names(c.members);
        let zone = ZoneSnapshot {
            generation: Some(1),
            members: &members,
            selector: &sel,
            selector_error: c.selector_error,
        };
        let v = ready(&zone, &reports(c.reports));
        assert_eq!(
            (v.status, v.reason, v.message.as_str()),
            (c.status, c.reason, c.message),
            "case: {}",
            c.name
        );
    }
}

#[test]
fn large_zone_message_is_truncated() {
    let members: Vec<String> = (0..100).map(|i| format!("n{i:03}")).collect();
    // nobody reports anything: 100·99 missing
    let zone = ZoneSnapshot {
        generation: None,
        members: &members,
        selector: &LabelSelector::default(),
        selector_error: None,
    };
    let v = ready(&zone, &Reports::new());
    assert!(!v.status);
    assert!(
        v.message.starts_with(
            "9900 of 9900 tunnels missing: n000→n001, n000→n002, n000→n003, n000→n004, n000→n005, n000→n006, n000→n007, n000→n008, n000→n009, n000→n010, … (9890 more); no TunnelReport from n000, n001,"
        ),
        "{}",
        v.message
    );
    assert!(v.message.ends_with("n009, … (90 more)"), "{}", v.message);
    assert!(v.message.len() < 400);
}

/// A full mesh of 200 members reporting each other: ready, linear in the report sizes.
#[test]
fn full_mesh_is_ready() {
    let members: Vec<String> = (0..5000).map(|i| format!("node{i}")).collect();
    let all: BTreeSet<String> = members.iter().cloned().collect();
    let mut r = Reports::new();
    for m in &members {
        let mut p = all.clone();
        p.remove(m);
        r.insert(m.clone(), p);
        if r.len() == 200 {
            break; // reports of the first 200 also name the other 4,800, which do not count
        }
    }
    let zone = ZoneSnapshot {
        generation: None,
        members: &members[..200],
        selector: &LabelSelector::default(),
        selector_error: None,
    };
    let v = ready(&zone, &r);
    assert!(v.status, "{}", v.message);
    assert_eq!(
        v.message,
        "all 39800 tunnels between 200 members established"
    );
}

#[test]
fn selector_protected_table() {
    let expr = |key: &str| LabelSelectorRequirement {
        key: key.into(),
        operator: "Exists".into(),
        values: None,
    };
    let webhook = StatusOptions {
        labels_protected_by_webhook: true,
    };
    let bare = StatusOptions {
        labels_protected_by_webhook: false,
    };
    let protected_only = by_labels(&[("node-restriction.kubernetes.io/tenant", "a")]);
    let mixed = LabelSelector {
        match_labels: Some(BTreeMap::from([("tenant".into(), "a".into())])),
        match_expressions: Some(vec![
            expr("example.com/rack"),
            expr("node-role.kubernetes.io/worker"),
        ]),
    };
    let cases: [(&str, &LabelSelector, StatusOptions, bool, &str, &str); 6] = [
        (
            "empty selector",
            &LabelSelector::default(),
            bare,
            true,
            REASON_NO_KUBELET_SETTABLE_KEYS,
            "spec.nodeSelector reads no label (it selects every Node)",
        ),
        (
            "protected namespace only, no webhook",
            &protected_only,
            bare,
            true,
            REASON_NO_KUBELET_SETTABLE_KEYS,
            "no label key of spec.nodeSelector can be set by a kubelet on its own Node: node-restriction.kubernetes.io/tenant",
        ),
        (
            "protected namespace only, webhook",
            &protected_only,
            webhook,
            true,
            REASON_NO_KUBELET_SETTABLE_KEYS,
            "no label key of spec.nodeSelector can be set by a kubelet on its own Node: node-restriction.kubernetes.io/tenant",
        ),
        (
            "settable keys, webhook protects them",
            &mixed,
            webhook,
            true,
            REASON_PROTECTED_BY_WEBHOOK,
            "a kubelet could set example.com/rack, tenant on its own Node; the ovnk identity webhook denies node identities changing them",
        ),
        (
            "settable keys, no webhook",
            &mixed,
            bare,
            false,
            REASON_KUBELET_SETTABLE_KEYS,
            "a node can add itself to this zone: its kubelet may set example.com/rack, tenant on its own Node and no webhook protects them. Select on labels NodeRestriction protects (e.g. node-restriction.kubernetes.io/...) or run the ovnk identity webhook",
        ),
        (
            "one settable key, no webhook",
            &by_labels(&[("tenant", "a")]),
            bare,
            false,
            REASON_KUBELET_SETTABLE_KEYS,
            "a node can add itself to this zone: its kubelet may set tenant on its own Node and no webhook protects it. Select on labels NodeRestriction protects (e.g. node-restriction.kubernetes.io/...) or run the ovnk identity webhook",
        ),
    ];
    for (name, sel, opts, status, reason, message) in cases {
        let v = selector_protected(sel, &opts);
        assert_eq!(
            (v.status, v.reason, v.message.as_str()),
            (status, reason, message),
            "case: {name}"
        );
    }
}

#[test]
fn transition_times_kept_while_status_holds() {
    let members = names(ALL);
    let sel = by_labels(&[("tenant", "a")]);
    let zone = ZoneSnapshot {
        generation: Some(2),
        members: &members,
        selector: &sel,
        selector_error: None,
    };
    let opts = StatusOptions::default();
    let missing = reports(&[("n1", &["n2"]), ("n2", &["n1", "n3"]), ("n3", &["n2"])]);
    let first = zone_status(&zone, &missing, &opts, None, &t(100));
    assert_eq!(first.members, members);
    assert_eq!(first.member_count, 3);
    assert_eq!(first.conditions.len(), 2);
    assert_eq!(first.conditions[0].type_, CONDITION_READY);
    assert_eq!(first.conditions[0].status, "False");
    assert_eq!(first.conditions[0].observed_generation, Some(2));
    assert_eq!(first.conditions[1].type_, CONDITION_SELECTOR_PROTECTED);
    assert!(
        first
            .conditions
            .iter()
            .all(|c| c.last_transition_time == t(100))
    );

    // Fewer missing, still False: the time stays, only the message changes.
    let fewer = reports(&[
        ("n1", &["n2", "n3"]),
        ("n2", &["n1", "n3"]),
        ("n3", &["n2"]),
    ]);
    let second = zone_status(&zone, &fewer, &opts, Some(&first), &t(200));
    assert!(
        second
            .conditions
            .iter()
            .all(|c| c.last_transition_time == t(100))
    );
    assert_eq!(change(Some(&first), &second), Change::MessageOnly);
    assert_eq!(change(Some(&second), &second.clone()), Change::None);

    // All present: Ready flips and gets the new time; SelectorProtected keeps its own.
    let all = reports(&[
        ("n1", &["n2", "n3"]),
        ("n2", &["n1", "n3"]),
        ("n3", &["n1", "n2"]),
    ]);
    let third = zone_status(&zone, &all, &opts, Some(&second), &t(300));
    assert_eq!(third.conditions[0].status, "True");
    assert_eq!(third.conditions[0].reason, REASON_ALL_TUNNELS);
    assert_eq!(third.conditions[0].last_transition_time, t(300));
    assert_eq!(third.conditions[1].last_transition_time, t(100));
    assert_eq!(change(Some(&second), &third), Change::Significant);

    // Recomputing with nothing changed is no change at all, whatever `now` is.
    let again = zone_status(&zone, &all, &opts, Some(&third), &t(400));
    assert_eq!(again, third);
    assert_eq!(change(Some(&third), &again), Change::None);

    // A new generation is significant even when the verdicts are the same.
    let newer = ZoneSnapshot {
        generation: Some(3),
        ..zone
    };
    let fourth = zone_status(&newer, &all, &opts, Some(&third), &t(500));
    assert_eq!(change(Some(&third), &fourth), Change::Significant);
    assert_eq!(change(None, &fourth), Change::Significant);
}

#[test]
fn patch_clears_members() {
    let s = TrustZoneStatus::default();
    let p = status_patch(&s);
    assert_eq!(p["status"]["members"], serde_json::Value::Null);
    assert_eq!(p["status"]["memberCount"], 0);
    let s = TrustZoneStatus {
        members: names(&["a"]),
        member_count: 1,
        conditions: vec![],
    };
    assert_eq!(
        status_patch(&s)["status"]["members"],
        serde_json::json!(["a"])
    );
}
