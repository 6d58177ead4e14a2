//! Desired state → the fewest OVSDB operations, one transaction per database.
//!
//! Each `*_txn` function is pure: it reads a replica and returns the transaction that turns
//! it into the desired state (empty when nothing differs). Ownership: ovnk owns every port
//! and route on `ovn_cluster_router`, on the node switch and on `transit_switch`; any
//! `Logical_Switch` with `external_ids:k8s.ovn.org/owner` that is not desired is deleted; any
//! SB Chassis with `other_config:is-remote=true` that is not desired is deleted (its Encaps go
//! with it).

use std::collections::{BTreeMap, BTreeSet};

use ovn_model::{NB_DB, OVS_DB, OWNER_KEY, SB_DB, by_name};
use ovsdb::{Atom, AtomSet, Condition, Datum, DbCache, Mutation, RowData, RowRef, Txn, Uuid};

use crate::plan::{
    Lrp, Lsp, MGMT_PORT, NbDesired, ObjectRef, OvsDesired, Problem, RemoteChassis, Route,
    SbDesired, Switch,
};

fn s(v: &str) -> Datum {
    Datum::scalar(v)
}
fn strs<'a>(v: impl IntoIterator<Item = &'a String>) -> Datum {
    Datum::set(v.into_iter().map(|x| x.as_str()))
}
fn smap(m: &BTreeMap<String, String>) -> Datum {
    Datum::map(m.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}
fn uuids(v: impl IntoIterator<Item = Uuid>) -> Datum {
    Datum::set(v)
}
fn row<const N: usize>(cols: [(&str, Datum); N]) -> RowData {
    cols.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

fn str_of<'a>(r: &RowRef<'a>, col: &str) -> &'a str {
    r.get(col)
        .and_then(Datum::as_scalar)
        .and_then(Atom::as_str)
        .unwrap_or("")
}
fn map_get<'a>(r: &RowRef<'a>, col: &str, key: &str) -> Option<&'a str> {
    r.get(col)
        .and_then(|d| d.map_get(key))
        .and_then(Atom::as_str)
}
fn refs(r: &RowRef<'_>, col: &str) -> Vec<Uuid> {
    r.get(col)
        .and_then(Datum::as_set)
        .map(|s| s.iter().filter_map(Atom::as_uuid).collect())
        .unwrap_or_default()
}

/// The row named `name` (through the name index, or a scan).
pub fn find_named<'a>(cache: &'a DbCache, table: &str, name: &str) -> Option<RowRef<'a>> {
    let t = cache.table(table)?;
    match t.find_str(&by_name(), name) {
        Some(v) => v.into_iter().next(),
        None => t.rows().find(|r| str_of(r, "name") == name),
    }
}

/// The columns of `want` whose value differs in `cur`.
fn changed(cur: &RowRef<'_>, want: &RowData) -> RowData {
    want.iter()
        .filter(|(c, d)| cur.get(c) != Some(*d))
        .map(|(c, d)| (c.clone(), d.clone()))
        .collect()
}

fn by_uuid(u: Uuid) -> [Condition; 1] {
    [Condition::uuid(u)]
}

fn lsp_row(p: &Lsp) -> RowData {
    row([
        ("name", s(&p.name)),
        ("type", s(&p.kind)),
        ("addresses", strs(&p.addresses)),
        ("port_security", strs(&p.port_security)),
        ("options", smap(&p.options)),
        ("external_ids", smap(&p.external_ids)),
    ])
}
fn lrp_row(p: &Lrp) -> RowData {
    row([
        ("name", s(&p.name)),
        ("mac", s(&p.mac)),
        ("networks", strs(&p.networks)),
        ("options", smap(&p.options)),
        ("external_ids", smap(&p.external_ids)),
    ])
}
fn route_row(r: &Route) -> RowData {
    row([
        ("ip_prefix", s(&r.ip_prefix)),
        ("nexthop", s(&r.nexthop)),
        ("external_ids", smap(&r.external_ids)),
    ])
}

/// Children of one parent row, reconciled by name: returns the refs to add and remove.
struct Children {
    add: Vec<Atom>,
    remove: Vec<Uuid>,
}

impl Children {
    fn mutations(&self, col: &str) -> Vec<Mutation> {
        let mut m = Vec::new();
        if !self.remove.is_empty() {
            m.push(Mutation::delete(col, uuids(self.remove.iter().copied())));
        }
        if !self.add.is_empty() {
            m.push(Mutation::insert(
                col,
                Datum::Set(self.add.iter().cloned().collect()),
            ));
        }
        m
    }
}

/// Reconciles named children (`ports`) of a parent: updates changed ones in place, inserts
/// missing ones, drops undesired ones from the parent (non-root rows: the server deletes them).
fn named_children(
    t: &mut Txn,
    cache: &DbCache,
    table: &str,
    current: &[Uuid],
    want: Vec<(String, RowData)>,
) -> Children {
    let tc = cache.table(table);
    let cur: BTreeMap<String, Uuid> = current
        .iter()
        .filter_map(|u| tc.and_then(|t| t.get(u)))
        .map(|r| (str_of(&r, "name").to_owned(), r.uuid))
        .collect();
    let mut out = Children {
        add: Vec::new(),
        remove: Vec::new(),
    };
    let wanted: BTreeSet<&String> = want.iter().map(|(n, _)| n).collect();
    for (name, u) in &cur {
        if !wanted.contains(name) {
            out.remove.push(*u);
        }
    }
    for (name, data) in want {
        // Names are unique per table: a row elsewhere is updated and adopted.
        let existing = cur
            .get(&name)
            .and_then(|u| tc.and_then(|t| t.get(u)))
            .or_else(|| find_named(cache, table, &name));
        match existing {
            Some(r) => {
                let diff = changed(&r, &data);
                if !diff.is_empty() {
                    t.update(table, &by_uuid(r.uuid), diff);
                }
                if !cur.contains_key(&name) {
                    out.add.push(Atom::Uuid(r.uuid));
                }
            }
            None => out.add.push(t.insert(table, data).atom()),
        }
    }
    out
}

fn switch_txn(t: &mut Txn, cache: &DbCache, sw: &Switch) {
    let ports: Vec<(String, RowData)> = sw
        .ports
        .iter()
        .map(|p| (p.name.clone(), lsp_row(p)))
        .collect();
    let want = row([
        ("name", s(&sw.name)),
        ("other_config", smap(&sw.other_config)),
        ("external_ids", smap(&sw.external_ids)),
    ]);
    match find_named(cache, "Logical_Switch", &sw.name) {
        None => {
            let ch = named_children(t, cache, "Logical_Switch_Port", &[], ports);
            let mut data = want;
            data.insert("ports".into(), Datum::Set(ch.add.into_iter().collect()));
            t.insert("Logical_Switch", data);
        }
        Some(cur) => {
            let diff = changed(&cur, &want);
            if !diff.is_empty() {
                t.update("Logical_Switch", &by_uuid(cur.uuid), diff);
            }
            let ch = named_children(t, cache, "Logical_Switch_Port", &refs(&cur, "ports"), ports);
            let m = ch.mutations("ports");
            if !m.is_empty() {
                t.mutate("Logical_Switch", &by_uuid(cur.uuid), &m);
            }
        }
    }
}

fn routes_children(t: &mut Txn, cache: &DbCache, current: &[Uuid], want: &[Route]) -> Children {
    let tc = cache.table("Logical_Router_Static_Route");
    let mut cur: Vec<RowRef<'_>> = current
        .iter()
        .filter_map(|u| tc.and_then(|t| t.get(u)))
        .collect();
    cur.sort_by_key(|r| r.uuid);
    let mut out = Children {
        add: Vec::new(),
        remove: Vec::new(),
    };
    let mut used = BTreeSet::new();
    for r in want {
        let data = route_row(r);
        // Same prefix, main table, dst-ip: the same route (its next hop may have moved).
        let m = cur.iter().find(|c| {
            !used.contains(&c.uuid)
                && str_of(c, "ip_prefix") == r.ip_prefix
                && str_of(c, "route_table").is_empty()
                && matches!(str_of(c, "policy"), "" | "dst-ip")
                && c.get("output_port")
                    .and_then(Datum::as_set)
                    .is_none_or(|s| s.is_empty())
        });
        match m {
            Some(c) => {
                used.insert(c.uuid);
                let diff = changed(c, &data);
                if !diff.is_empty() {
                    t.update("Logical_Router_Static_Route", &by_uuid(c.uuid), diff);
                }
            }
            None => out
                .add
                .push(t.insert("Logical_Router_Static_Route", data).atom()),
        }
    }
    out.remove = cur
        .iter()
        .map(|c| c.uuid)
        .filter(|u| !used.contains(u))
        .collect();
    out
}

/// The Northbound transaction.
pub fn nb_txn(want: &NbDesired, cache: &DbCache) -> Txn {
    let mut t = Txn::new(NB_DB);
    let r = &want.router;
    let lrps: Vec<(String, RowData)> = r
        .ports
        .iter()
        .map(|p| (p.name.clone(), lrp_row(p)))
        .collect();
    let rwant = row([
        ("name", s(&r.name)),
        ("external_ids", smap(&r.external_ids)),
    ]);
    match find_named(cache, "Logical_Router", &r.name) {
        None => {
            let ports = named_children(&mut t, cache, "Logical_Router_Port", &[], lrps);
            let routes = routes_children(&mut t, cache, &[], &r.routes);
            let mut data = rwant;
            data.insert("ports".into(), Datum::Set(ports.add.into_iter().collect()));
            data.insert(
                "static_routes".into(),
                Datum::Set(routes.add.into_iter().collect()),
            );
            t.insert("Logical_Router", data);
        }
        Some(cur) => {
            let diff = changed(&cur, &rwant);
            if !diff.is_empty() {
                t.update("Logical_Router", &by_uuid(cur.uuid), diff);
            }
            let ports = named_children(
                &mut t,
                cache,
                "Logical_Router_Port",
                &refs(&cur, "ports"),
                lrps,
            );
            let routes = routes_children(&mut t, cache, &refs(&cur, "static_routes"), &r.routes);
            let mut m = ports.mutations("ports");
            m.extend(routes.mutations("static_routes"));
            if !m.is_empty() {
                t.mutate("Logical_Router", &by_uuid(cur.uuid), &m);
            }
        }
    }
    for sw in &want.switches {
        switch_txn(&mut t, cache, sw);
    }
    // Stale switches ovnk made (a renamed or removed node's switch).
    let names: BTreeSet<&str> = want.switches.iter().map(|s| s.name.as_str()).collect();
    if let Some(tc) = cache.table("Logical_Switch") {
        for r in tc.rows() {
            if map_get(&r, "external_ids", OWNER_KEY).is_some()
                && !names.contains(str_of(&r, "name"))
            {
                t.delete("Logical_Switch", &by_uuid(r.uuid));
            }
        }
    }
    t
}

fn is_remote(r: &RowRef<'_>) -> bool {
    map_get(r, "other_config", "is-remote").is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

fn encap_row(chassis: &str, ip: &str) -> RowData {
    row([
        ("type", s("geneve")),
        ("ip", s(ip)),
        ("chassis_name", s(chassis)),
        ("options", Datum::str_map([("csum", "true")])),
    ])
}

/// The Southbound transaction, and problems found in the SB (a foreign non-remote chassis:
/// centralized mode, which ovnk does not support).
pub fn sb_txn(want: &SbDesired, cache: &DbCache, node: &str) -> (Txn, Vec<Problem>) {
    let mut t = Txn::new(SB_DB);
    let mut problems = Vec::new();
    let desired: BTreeMap<&str, &RemoteChassis> =
        want.chassis.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut chassis_ref: BTreeMap<&str, Atom> = BTreeMap::new();
    if let Some(tc) = cache.table("Chassis") {
        for r in tc.rows() {
            let name = str_of(&r, "name");
            if is_remote(&r) {
                if !desired.contains_key(name) {
                    t.delete("Chassis", &by_uuid(r.uuid));
                }
            } else if name != want.local_chassis {
                problems.push(Problem {
                    object: ObjectRef::Node(node.to_owned()),
                    reason: "CentralizedModeUnsupported",
                    message: format!(
                        "the Southbound database holds chassis {name:?} (host {:?}) besides this \
                         node's own: several nodes share one Southbound database (centralized mode or \
                         a multi-node IC zone), which ovnk does not support. Trust and transport \
                         zones are NOT enforced between the nodes sharing it: each ovn-controller \
                         writes its own Chassis.transport_zones, so any one of them can open tunnels \
                         to all the others (seed 001, Risks). Run one node per IC zone.",
                        str_of(&r, "hostname")
                    ),
                });
            }
        }
    }
    let encaps = cache.table("Encap");
    for c in &want.chassis {
        let base = row([
            ("hostname", s(&c.hostname)),
            ("other_config", Datum::str_map([("is-remote", "true")])),
            ("transport_zones", strs(&c.transport_zones)),
        ]);
        let want_encaps: BTreeSet<(String, String, String)> = c
            .encap_ips
            .iter()
            .map(|ip| ("geneve".to_owned(), ip.to_string(), c.name.clone()))
            .collect();
        match find_named(cache, "Chassis", &c.name) {
            Some(cur) if !is_remote(&cur) => {
                problems.push(Problem {
                    object: ObjectRef::Node(c.hostname.clone()),
                    reason: "ChassisIDConflict",
                    message: format!(
                        "chassis id {} of node {} is a local chassis in this node's Southbound database",
                        c.name, c.hostname
                    ),
                });
            }
            Some(cur) => {
                let mut diff = changed(&cur, &base);
                let have: BTreeSet<(String, String, String)> = refs(&cur, "encaps")
                    .iter()
                    .filter_map(|u| encaps.and_then(|t| t.get(u)))
                    .filter(|e| map_get(e, "options", "csum") == Some("true"))
                    .map(|e| {
                        (
                            str_of(&e, "type").to_owned(),
                            str_of(&e, "ip").to_owned(),
                            str_of(&e, "chassis_name").to_owned(),
                        )
                    })
                    .collect();
                if have != want_encaps || refs(&cur, "encaps").len() != want_encaps.len() {
                    let new: AtomSet = c
                        .encap_ips
                        .iter()
                        .map(|ip| {
                            t.insert("Encap", encap_row(&c.name, &ip.to_string()))
                                .atom()
                        })
                        .collect();
                    diff.insert("encaps".into(), Datum::Set(new));
                }
                if !diff.is_empty() {
                    t.update("Chassis", &by_uuid(cur.uuid), diff);
                }
                chassis_ref.insert(&c.name, Atom::Uuid(cur.uuid));
            }
            None => {
                let new: AtomSet = c
                    .encap_ips
                    .iter()
                    .map(|ip| {
                        t.insert("Encap", encap_row(&c.name, &ip.to_string()))
                            .atom()
                    })
                    .collect();
                let mut data = base;
                data.insert("name".into(), s(&c.name));
                data.insert("encaps".into(), Datum::Set(new));
                let named = t.insert("Chassis", data);
                chassis_ref.insert(&c.name, named.atom());
            }
        }
    }
    // Port_Binding.chassis of remote ports (OVN 23.03's northd leaves it empty).
    if let Some(tc) = cache.table("Port_Binding") {
        for pb in tc.rows() {
            let lp = str_of(&pb, "logical_port");
            let Some(ch) = want.bindings.get(lp) else {
                continue;
            };
            let Some(target) = chassis_ref.get(ch.as_str()) else {
                continue;
            };
            let cur = pb
                .get("chassis")
                .and_then(Datum::as_set)
                .and_then(|s| s.iter().next().cloned());
            if cur.as_ref() != Some(target) {
                t.update(
                    "Port_Binding",
                    &by_uuid(pb.uuid),
                    row([("chassis", Datum::scalar(target.clone()))]),
                );
            }
        }
    }
    (t, problems)
}

/// The local Open_vSwitch transaction. Only the keys ovnk owns are touched.
pub fn ovs_txn(want: &OvsDesired, cache: &DbCache) -> Txn {
    let mut t = Txn::new(OVS_DB);
    let Some(ovs) = cache.table("Open_vSwitch").and_then(|tc| tc.rows().next()) else {
        return t;
    };
    let mut del: Vec<&str> = Vec::new();
    let mut ins: Vec<(&str, &str)> = Vec::new();
    for (k, v) in &want.external_ids {
        let cur = map_get(&ovs, "external_ids", k);
        match (cur, v) {
            (Some(_), None) => del.push(k),
            (c, Some(v)) if c != Some(v.as_str()) => {
                if c.is_some() {
                    del.push(k);
                }
                ins.push((k, v));
            }
            _ => {}
        }
    }
    let mut m = Vec::new();
    if !del.is_empty() {
        m.push(Mutation::delete("external_ids", Datum::set(del)));
    }
    if !ins.is_empty() {
        m.push(Mutation::insert("external_ids", Datum::str_map(ins)));
    }
    if !m.is_empty() {
        t.mutate("Open_vSwitch", &by_uuid(ovs.uuid), &m);
    }
    let Some(mp) = &want.mgmt_port else {
        return t;
    };
    // br-int is created by ovn-controller; until then there is nothing to attach to.
    let Some(br) = find_named(cache, "Bridge", "br-int") else {
        return t;
    };
    let want_iface = row([
        ("type", s("internal")),
        ("mac", s(&mp.mac)),
        ("mtu_request", Datum::scalar(i64::from(mp.mtu))),
    ]);
    match find_named(cache, "Interface", MGMT_PORT) {
        None => {
            let mut data = want_iface;
            data.insert("name".into(), s(MGMT_PORT));
            data.insert(
                "external_ids".into(),
                Datum::str_map([("iface-id", mp.iface_id.as_str())]),
            );
            let i = t.insert("Interface", data);
            let p = t.insert(
                "Port",
                row([("name", s(MGMT_PORT)), ("interfaces", (&i).into())]),
            );
            t.mutate(
                "Bridge",
                &by_uuid(br.uuid),
                &[Mutation::insert("ports", Datum::from(&p))],
            );
        }
        Some(cur) => {
            let diff = changed(&cur, &want_iface);
            if !diff.is_empty() {
                t.update("Interface", &by_uuid(cur.uuid), diff);
            }
            if map_get(&cur, "external_ids", "iface-id") != Some(mp.iface_id.as_str()) {
                t.mutate(
                    "Interface",
                    &by_uuid(cur.uuid),
                    &[
                        Mutation::delete("external_ids", Datum::set(["iface-id"])),
                        Mutation::insert(
                            "external_ids",
                            Datum::str_map([("iface-id", mp.iface_id.as_str())]),
                        ),
                    ],
                );
            }
        }
    }
    t
}
