//! Both backends against the real kernel, in a network namespace this test creates: after every
//! step of a create/update/delete sequence the live ruleset equals the plan, and rules that
//! belong to others survive. Needs root; fails without it.

mod common;

use common::*;
use fwmark::backend::{Backend, BackendKind};
use fwmark::mark::FULL_MASK;
use fwmark::plan::{Snapshot, plan_node};
use fwmark::testbed::Netns;

const TABLE: &str = "ovnk-fwmark";

/// The create/update/delete sequence: (step name, snapshot, node mask).
fn steps() -> Vec<(&'static str, Snapshot, u32)> {
    let mut out = Vec::new();
    let mut s = Snapshot::default();
    put_service(
        &mut s,
        "service1",
        1000,
        &["100.100.100.100"],
        &[("10.244.0.3", "node1"), ("10.244.1.6", "node2")],
    );
    out.push(("create", s.clone(), FULL_MASK));
    put_service(
        &mut s,
        "service1",
        1000,
        &["100.100.100.100", "fd00:96::10"],
        &[
            ("10.244.0.3", "node1"),
            ("10.244.0.4", "node1"),
            ("fd00:244::3", "node1"),
        ],
    );
    out.push(("add endpoint + dual stack", s.clone(), FULL_MASK));
    put_service(
        &mut s,
        "web",
        1500,
        &["100.100.100.200"],
        &[("10.244.0.9", "node1")],
    );
    out.push(("second service", s.clone(), FULL_MASK));
    put_service(
        &mut s,
        "service1",
        1200,
        &["100.100.100.100", "fd00:96::10"],
        &[
            ("10.244.0.3", "node1"),
            ("10.244.0.4", "node1"),
            ("fd00:244::3", "node1"),
        ],
    );
    out.push(("change mark", s.clone(), FULL_MASK));
    out.push(("narrow mask", s.clone(), 0xffff));
    put_service(
        &mut s,
        "service1",
        1200,
        &["100.100.100.100", "fd00:96::10"],
        &[("10.244.0.4", "node1"), ("fd00:244::3", "node1")],
    );
    out.push(("remove endpoint", s.clone(), 0xffff));
    s.services.remove(&key("web"));
    out.push(("delete service", s.clone(), 0xffff));
    s.marks.remove(&key("service1"));
    out.push(("delete servicefwmark", s.clone(), 0xffff));
    out
}

fn run_sequence(kind: BackendKind) {
    let ns = Netns::create("rules").expect("netns (needs root)");
    install_foreign(&ns);
    let mut backend =
        Backend::start(kind, ns.runner().expect("runner"), None, TABLE).expect("backend starts");
    for (name, snap, mask) in steps() {
        let plan = plan_node(&snap, "node1", mask);
        backend.sync(&plan.desired).expect(name);
        let live = match kind {
            BackendKind::Nftables => nft_live(&ns, TABLE),
            BackendKind::Iptables => ipt_live(&ns),
        };
        assert_eq!(live, expected(&plan.desired), "step {name}");
        assert_foreign(&ns);
        // a second sync of the same state changes nothing
        match backend.sync(&plan.desired).expect(name) {
            fwmark::backend::SyncReport::Nft(s) => assert_eq!(s.commands, 0, "step {name}"),
            fwmark::backend::SyncReport::Ipt(s) => {
                assert_eq!(s.families_written, 0, "step {name}")
            }
        }
    }
}

#[test]
fn nft_ruleset_follows_every_step() {
    run_sequence(BackendKind::Nftables);
}

#[test]
fn iptables_ruleset_follows_every_step() {
    run_sequence(BackendKind::Iptables);
}

#[test]
fn iptables_keeps_exactly_one_jump() {
    let ns = Netns::create("jump").expect("netns (needs root)");
    let (_, snap, mask) = steps().remove(1);
    let plan = plan_node(&snap, "node1", mask);
    let mut b =
        Backend::start(BackendKind::Iptables, ns.runner().expect("r"), None, TABLE).expect("start");
    for _ in 0..3 {
        b.sync(&plan.desired).expect("sync");
    }
    // someone adds a second jump and a stray rule into our chain: the next sync repairs both
    ns.exec(
        "iptables-restore",
        &["--noflush"],
        Some(b"*mangle\n-A PREROUTING -j OVN-KUBE-SERVICE-FWMARK\n-A OVN-KUBE-SERVICE-FWMARK -s 10.9.9.9/32 -j MARK --set-xmark 0x1/0xffffffff\nCOMMIT\n"),
    )
    .expect("inject");
    b.sync(&plan.desired).expect("repair");
    assert_eq!(ipt_live(&ns), expected(&plan.desired));
}

#[test]
fn restart_resyncs_and_removes_stale() {
    let ns = Netns::create("restart").expect("netns (needs root)");
    install_foreign(&ns);
    let all = steps();
    let before = plan_node(&all[2].1, "node1", FULL_MASK).desired;
    let after = plan_node(&all[5].1, "node1", 0xffff).desired;
    for kind in [BackendKind::Nftables, BackendKind::Iptables] {
        {
            let mut b = Backend::start(kind, ns.runner().expect("r"), None, TABLE).expect("start");
            b.sync(&before).expect("sync before");
        }
        if kind == BackendKind::Nftables {
            // a stale element and a stale chain nobody wants any more
            ns.exec(
                "nft",
                &["-f", "-"],
                Some(b"add chain inet ovnk-fwmark mark-1999\nadd rule inet ovnk-fwmark mark-1999 meta mark set 1999\nadd element inet ovnk-fwmark src-v4 { 10.1.2.3 : goto mark-1999 }\n"),
            )
            .expect("inject stale");
        }
        // "restart": a new backend instance with nothing cached
        let mut b = Backend::start(kind, ns.runner().expect("r"), None, TABLE).expect("restart");
        b.sync(&after).expect("sync after restart");
        let live = match kind {
            BackendKind::Nftables => nft_live(&ns, TABLE),
            BackendKind::Iptables => ipt_live(&ns),
        };
        assert_eq!(live, expected(&after), "{kind}");
        if kind == BackendKind::Nftables {
            let t = ns
                .exec("nft", &["list", "table", "inet", TABLE], None)
                .expect("list");
            assert!(!t.contains("mark-1999"), "{t}");
        }
        assert_foreign(&ns);
    }
}

#[test]
fn switching_backends_removes_leftovers() {
    let ns = Netns::create("switch").expect("netns (needs root)");
    install_foreign(&ns);
    let plan = plan_node(&steps()[1].1, "node1", FULL_MASK).desired;
    let mut nft =
        Backend::start(BackendKind::Nftables, ns.runner().expect("r"), None, TABLE).expect("nft");
    nft.sync(&plan).expect("nft sync");
    let mut ipt =
        Backend::start(BackendKind::Iptables, ns.runner().expect("r"), None, TABLE).expect("ipt");
    let tables = ns.exec("nft", &["list", "tables"], None).expect("tables");
    assert!(!tables.contains(TABLE), "nft table left behind: {tables}");
    ipt.sync(&plan).expect("ipt sync");
    assert_eq!(ipt_live(&ns), expected(&plan));
    let _nft = Backend::start(BackendKind::Nftables, ns.runner().expect("r"), None, TABLE)
        .expect("nft again");
    for save in ["iptables-save", "ip6tables-save"] {
        let text = ns.exec(save, &["-t", "mangle"], None).expect("save");
        assert!(!text.contains("OVN-KUBE-SERVICE-FWMARK"), "{save}: {text}");
    }
    assert_foreign(&ns);
}

#[test]
fn missing_binaries_fail_at_start() {
    let empty = tempfile::tempdir().expect("tempdir");
    for kind in [BackendKind::Nftables, BackendKind::Iptables] {
        let err = Backend::open(
            kind,
            fwmark::exec::Runner::host(),
            Some(empty.path()),
            TABLE,
        )
        .expect_err("must fail");
        let msg = err.to_string();
        assert!(
            msg.contains("not found") && msg.contains("install the Debian package"),
            "{msg}"
        );
    }
}

#[test]
fn nft_table_name_is_checked_at_start() {
    let ns = Netns::create("tname").expect("netns (needs root)");
    // names nft's text parser reads as keywords, and a name outside the charset
    for bad in ["ip", "counter", "auto-merge", "a b"] {
        let err = Backend::start(BackendKind::Nftables, ns.runner().expect("r"), None, bad)
            .expect_err(bad)
            .to_string();
        assert!(
            err.contains(&format!("{bad:?}")) && err.contains("--fwmark-nft-table"),
            "{err}"
        );
    }
    // the check applies nothing; a name with `.` and `_` works end to end
    let name = "ovnk_fw.mark-2";
    let mut b = Backend::start(BackendKind::Nftables, ns.runner().expect("r"), None, name)
        .expect("valid name");
    let tables = ns.exec("nft", &["list", "tables"], None).expect("tables");
    assert!(
        !tables.contains(name),
        "the name check created a table: {tables}"
    );
    let plan = plan_node(&steps()[1].1, "node1", FULL_MASK).desired;
    b.sync(&plan).expect("sync");
    assert_eq!(nft_live(&ns, name), expected(&plan));
}

/// What the text batches make, read back through `nft -j list table` and `parse_table`: the base
/// is recognised as ovnk's, each mark chain's comment and every element are as planned, and a
/// fresh backend (nothing cached) has nothing to do.
#[test]
fn nft_text_batches_parse_back_whole() {
    use fwmark::nft::{NftBackend, mark_chain, mark_comment};
    let ns = Netns::create("parse").expect("netns (needs root)");
    let mut b =
        Backend::start(BackendKind::Nftables, ns.runner().expect("r"), None, TABLE).expect("start");
    for (name, snap, mask) in steps() {
        let plan = plan_node(&snap, "node1", mask);
        b.sync(&plan.desired).expect(name);
        let mut fresh = NftBackend::new(ns.runner().expect("r"), None, TABLE).expect("backend");
        let live = fresh.live().expect("live");
        assert!(live.exists && live.base_ok, "step {name}: {live:?}");
        let chains: std::collections::BTreeMap<String, Option<String>> = plan
            .desired
            .entries
            .values()
            .map(|e| (mark_chain(e.mark.value()), Some(mark_comment(e.mark))))
            .collect();
        assert_eq!(live.chains, chains, "step {name}");
        assert_eq!(live.elems, expected(&plan.desired), "step {name}");
        let s = fresh.sync(&plan.desired).expect(name);
        assert_eq!(s.commands, 0, "step {name}: {s:?}");
    }
}
