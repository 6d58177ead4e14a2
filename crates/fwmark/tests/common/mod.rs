//! Shared helpers of the real-kernel tests. They need root and fail (never skip) without it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;

use fwmark::plan::{Endpoint, MarkRequest, ServiceInfo, ServiceKey, Snapshot};
use fwmark::testbed::Netns;
use serde_json::Value;

pub fn ip(s: &str) -> IpAddr {
    s.parse().expect("test ip")
}

pub fn key(n: &str) -> ServiceKey {
    ServiceKey::new("default", n)
}

/// Add or replace a ServiceFWMark + Service + endpoints in a snapshot.
pub fn put_service(
    s: &mut Snapshot,
    name: &str,
    fwmark: i64,
    cluster_ips: &[&str],
    endpoints: &[(&str, &str)],
) {
    let k = key(name);
    s.marks.insert(
        k.clone(),
        MarkRequest {
            key: k.clone(),
            fwmark,
            created: Some(s.marks.len() as i64),
        },
    );
    s.services.insert(
        k.clone(),
        ServiceInfo {
            cluster_ips: cluster_ips.iter().map(|i| ip(i)).collect(),
            egress_host_annotation: None,
        },
    );
    s.endpoints.insert(
        k,
        endpoints
            .iter()
            .map(|(a, n)| Endpoint {
                addresses: vec![ip(a)],
                node: Some((*n).into()),
                host_network: false,
            })
            .collect(),
    );
}

/// Source → mark value as the kernel holds it in ovnk's nft table, read independently of the
/// backend's own parser: map elements → target chain → the chain rule's mangle value.
pub fn nft_live(ns: &Netns, table: &str) -> BTreeMap<IpAddr, u32> {
    let out = ns
        .exec("nft", &["-j", "list", "table", "inet", table], None)
        .expect("nft list table");
    let v: Value = serde_json::from_str(&out).expect("nft json");
    let items = v["nftables"].as_array().expect("nftables array");
    let mut chain_mark: BTreeMap<String, u32> = BTreeMap::new();
    let mut elems: Vec<(IpAddr, String, String)> = Vec::new();
    let mut hooked = 0;
    for it in items {
        if let Some(r) = it.get("rule") {
            let chain = r["chain"].as_str().expect("chain").to_string();
            for e in r["expr"].as_array().expect("expr") {
                if let Some(m) = e.get("mangle") {
                    assert_eq!(m["key"]["meta"]["key"], "mark");
                    let val = &m["value"];
                    let mark = val
                        .as_u64()
                        .or_else(|| val["|"][1].as_u64())
                        .expect("mark value");
                    chain_mark.insert(chain.clone(), mark as u32);
                }
            }
        }
        if let Some(c) = it.get("chain")
            && c.get("hook").and_then(Value::as_str) == Some("prerouting")
        {
            hooked += 1;
        }
        if let Some(m) = it.get("map") {
            let name = m["name"].as_str().expect("map name").to_string();
            for e in m["elem"].as_array().into_iter().flatten() {
                let a = ip(e[0].as_str().expect("elem key"));
                let target = e[1]["goto"]["target"].as_str().expect("goto").to_string();
                elems.push((a, target, name.clone()));
            }
        }
    }
    assert_eq!(hooked, 1, "exactly one base chain");
    elems
        .into_iter()
        .map(|(a, chain, map)| {
            assert_eq!(
                map,
                if a.is_ipv4() { "src-v4" } else { "src-v6" },
                "{a} in wrong map"
            );
            (a, *chain_mark.get(&chain).expect("chain has a mark rule"))
        })
        .collect()
}

/// Source → mark value in ovnk's iptables chain (both families), read from iptables-save;
/// asserts exactly one PREROUTING jump per family.
pub fn ipt_live(ns: &Netns) -> BTreeMap<IpAddr, u32> {
    let mut out = BTreeMap::new();
    for save in ["iptables-save", "ip6tables-save"] {
        let text = ns.exec(save, &["-t", "mangle"], None).expect("save");
        let jumps = text
            .lines()
            .filter(|l| l.trim() == "-A PREROUTING -j OVN-KUBE-SERVICE-FWMARK")
            .count();
        assert_eq!(jumps, 1, "{save}: exactly one jump\n{text}");
        for l in text
            .lines()
            .filter(|l| l.starts_with("-A OVN-KUBE-SERVICE-FWMARK "))
        {
            let w: Vec<&str> = l.split_whitespace().collect();
            let pos = |k: &str| w.iter().position(|x| *x == k).expect(k) + 1;
            let src = w[pos("-s")].split('/').next().expect("addr");
            let xmark = w[pos("--set-xmark")].split('/').next().expect("value");
            let v = u32::from_str_radix(xmark.trim_start_matches("0x"), 16).expect("hex");
            assert!(out.insert(ip(src), v).is_none(), "duplicate rule for {src}");
        }
    }
    out
}

/// The expected source → mark value for a plan.
pub fn expected(d: &fwmark::plan::Desired) -> BTreeMap<IpAddr, u32> {
    d.entries
        .iter()
        .map(|(a, e)| (*a, e.mark.value()))
        .collect()
}

/// Install rules that belong to someone else, in nft and in iptables mangle.
pub fn install_foreign(ns: &Netns) {
    ns.exec(
        "nft",
        &["-f", "-"],
        Some(b"table inet foreign { chain pre { type filter hook prerouting priority -200; ip saddr 192.0.2.7 counter; }; }"),
    )
    .expect("foreign nft");
    for (restore, src) in [
        ("iptables-restore", "192.0.2.1"),
        ("ip6tables-restore", "2001:db8::1"),
    ] {
        let input = format!(
            "*mangle\n:FOREIGN - [0:0]\n-A PREROUTING -s {src} -j ACCEPT\n-A FOREIGN -s {src} -j RETURN\nCOMMIT\n"
        );
        ns.exec(restore, &["--noflush"], Some(input.as_bytes()))
            .expect("foreign iptables");
    }
}

/// The foreign rules are all still there.
pub fn assert_foreign(ns: &Netns) {
    let t = ns
        .exec("nft", &["list", "table", "inet", "foreign"], None)
        .expect("foreign table survives");
    assert!(t.contains("ip saddr 192.0.2.7"), "{t}");
    for (save, src) in [
        ("iptables-save", "192.0.2.1/32"),
        ("ip6tables-save", "2001:db8::1/128"),
    ] {
        let text = ns.exec(save, &["-t", "mangle"], None).expect("save");
        assert!(
            text.contains(&format!("-A PREROUTING -s {src} -j ACCEPT")),
            "{text}"
        );
        assert!(
            text.contains(&format!("-A FOREIGN -s {src} -j RETURN")),
            "{text}"
        );
    }
}
