//! The apply layer against real ovsdb-servers and a real ovn-northd: exact rows on the first
//! reconcile, zero operations on the second, node deletion, and a restart over stale rows.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::*;
use node::apply::{nb_txn, ovs_txn, sb_txn};
use node::plan::{Desired, LocalNode, plan};
use node::snapshot::{NodeInfo, PodAddr, PodInfo, Snapshot};
use ovsdb::{Client, Datum, Db, Txn};
use ovsdb_harness::{OvsdbServer, Schema};

struct Agent {
    nb: (Client, Arc<Db>),
    sb: (Client, Arc<Db>),
}

async fn send(c: &Client, t: &Txn) -> usize {
    if !t.is_empty() {
        c.transact(t)
            .await
            .unwrap_or_else(|e| panic!("{} txn failed: {e}", t.db()));
    }
    t.len()
}

impl Agent {
    async fn new(nb: &OvsdbServer, sb: &OvsdbServer) -> Self {
        Agent {
            nb: replica(nb).await,
            sb: replica(sb).await,
        }
    }

    /// One reconcile (NB then SB); returns the number of ops sent per database.
    async fn reconcile(&self, d: &Desired) -> (usize, usize) {
        let (nb, sb) = (d.nb.as_ref().expect("nb"), d.sb.as_ref().expect("sb"));
        let t = nb_txn(nb, &self.nb.1.cache());
        let n = send(&self.nb.0, &t).await;
        wait_for(&self.nb.1, "NB replica", |c| nb_txn(nb, c).is_empty()).await;
        let (t, problems) = sb_txn(sb, &self.sb.1.cache(), "node1");
        assert!(problems.is_empty(), "{problems:?}");
        let s = send(&self.sb.0, &t).await;
        // (a Port_Binding northd created meanwhile may still want its chassis: next reconcile)
        wait_for(&self.sb.1, "SB replica", |c| {
            sb_txn(sb, c, "node1")
                .0
                .ops()
                .iter()
                .all(|o| o.summary.contains("Port_Binding"))
        })
        .await;
        (n, s)
    }

    async fn wait_bindings(&self, ports: &[&str]) {
        let ports: Vec<String> = ports.iter().map(|p| (*p).to_owned()).collect();
        wait_for(&self.sb.1, "port bindings from northd", |c| {
            let have: BTreeSet<String> = c
                .table("Port_Binding")
                .map(|t| {
                    t.rows()
                        .filter_map(|r| {
                            r.get("logical_port")?
                                .as_scalar()?
                                .as_str()
                                .map(str::to_owned)
                        })
                        .collect()
                })
                .unwrap_or_default();
            ports.iter().all(|p| have.contains(p))
        })
        .await;
    }

    fn bound(&self, port: &str) -> Option<String> {
        let c = self.sb.1.cache();
        let pb = c.table("Port_Binding")?.rows().find(|r| {
            r.get("logical_port")
                .and_then(|d| d.as_scalar())
                .and_then(|a| a.as_str())
                == Some(port)
        })?;
        let ch = pb.get("chassis")?.as_set()?.iter().next()?.as_uuid()?;
        let row = c.table("Chassis")?.get(&ch)?;
        row.get("name")?.as_scalar()?.as_str().map(str::to_owned)
    }

    fn chassis_uuid(&self, name: &str) -> Option<ovsdb::Uuid> {
        node::apply::find_named(&self.sb.1.cache(), "Chassis", name).map(|r| r.uuid)
    }
}

fn snap(nodes: Vec<NodeInfo>, pods: Vec<PodInfo>) -> Snapshot {
    Snapshot {
        nodes: nodes.into_iter().map(|n| (n.name.clone(), n)).collect(),
        pods,
    }
}

fn pod(name: &str) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        host_network: false,
        terminal: false,
        network: None,
        error: None,
    }
}

fn three() -> Vec<NodeInfo> {
    vec![
        node("node1", 1, &[]),
        node("node2", 2, &[]),
        node("node3", 3, &[]),
    ]
}

fn expected_nb(remotes: &[u8], pods: &[(&str, u8)]) -> BTreeSet<String> {
    let own = "{\"k8s.ovn.org/owner\": \"node/node1\"}";
    let mut e: BTreeSet<String> = [
        "LR|ovn_cluster_router|{\"k8s.ovn.org/owner\": \"cluster\"}".to_owned(),
        "LRP|rtos-node1|0a:58:0a:f4:01:01|10.244.1.1/24|{}".to_owned(),
        "LRP|rtots-node1|0a:58:64:58:00:01|100.88.0.1/16|{\"mcast_flood\": \"true\"}".to_owned(),
        "LS|node1|{\"subnet\": \"10.244.1.0/24\"}".to_owned(),
        "LS|transit_switch|{\"interconn-ts\": \"transit_switch\", \"mcast_flood_unregistered\": \"true\", \"mcast_querier\": \"false\", \"mcast_snoop\": \"true\", \"requested-tnl-key\": \"16711683\"}".to_owned(),
        format!("LSP|stor-node1|router|router|{{\"router-port\": \"rtos-node1\"}}|{own}"),
        format!("LSP|k8s-node1||0a:58:0a:f4:01:02 10.244.1.2|{{}}|{own}"),
        "LSP|tstor-node1|router|router|{\"requested-tnl-key\": \"1\", \"router-port\": \"rtots-node1\"}|{\"k8s.ovn.org/owner\": \"node/node1\", \"node\": \"node1\"}".to_owned(),
        "ROUTE|0.0.0.0/0|10.244.1.2|{\"k8s.ovn.org/network\": \"default\", \"k8s.ovn.org/owner\": \"node/node1\"}".to_owned(),
        "ROUTE|10.244.0.0/16|discard|{\"k8s.ovn.org/network\": \"default\", \"k8s.ovn.org/owner\": \"node/node1\"}".to_owned(),
        "ROUTE|100.64.0.0/16|discard|{\"k8s.ovn.org/network\": \"default\", \"k8s.ovn.org/owner\": \"node/node1\"}".to_owned(),
    ]
    .into_iter()
    .collect();
    for r in remotes {
        let ids = format!(
            "{{\"ic-node\": \"node{r}\", \"k8s.ovn.org/network\": \"default\", \"k8s.ovn.org/owner\": \"node/node{r}\"}}"
        );
        e.insert(format!("ROUTE|10.244.{r}.0/24|100.88.0.{r}|{ids}"));
        e.insert(format!("ROUTE|100.64.0.{r}/32|100.88.0.{r}|{ids}"));
        e.insert(format!("LSP|tstor-node{r}|remote|0a:58:64:58:00:{r:02x} 100.88.0.{r}/16|{{\"requested-chassis\": \"node{r}\", \"requested-tnl-key\": \"{r}\"}}|{{\"k8s.ovn.org/owner\": \"node/node{r}\", \"node\": \"node{r}\"}}"));
    }
    for (p, ip) in pods {
        e.insert(format!("LSP|default_{p}||0a:58:0a:f4:01:{ip:02x} 10.244.1.{ip}|{{}}|{{\"k8s.ovn.org/owner\": \"pod/default/{p}\", \"namespace\": \"default\", \"pod\": \"true\"}}"));
    }
    e
}

fn expected_sb(remotes: &[u8]) -> BTreeSet<String> {
    let mut e = BTreeSet::new();
    for r in remotes {
        e.insert(format!(
            "CHASSIS|ch-node{r}|node{r}|{{\"is-remote\": \"true\"}}|[]"
        ));
        e.insert(format!(
            "ENCAP|ch-node{r}|geneve|172.16.0.{r}|{{\"csum\": \"true\"}}"
        ));
    }
    e
}

fn local1() -> LocalNode {
    local("node1")
}

#[tokio::test]
async fn first_reconcile_exact_rows_then_zero_ops_then_node_delete() {
    init_logs();
    let nb = OvsdbServer::start(Schema::Northbound).expect("nb");
    let sb = OvsdbServer::start(Schema::Southbound).expect("sb");
    let _northd = Northd::start(&nb, &sb);
    let a = Agent::new(&nb, &sb).await;

    let d = plan(&snap(three(), vec![pod("web")]), &local1());
    let (n, s) = a.reconcile(&d).await;
    assert!(n > 0 && s > 0);
    assert_eq!(summary(&nb), expected_nb(&[2, 3], &[("web", 3)]));
    assert_eq!(summary(&sb), expected_sb(&[2, 3]));

    // northd makes the remote ports' bindings; the next reconcile binds them to the chassis.
    a.wait_bindings(&["tstor-node2", "tstor-node3"]).await;
    let (n, s) = a.reconcile(&d).await;
    assert_eq!((n, s), (0, 2), "only the two Port_Binding.chassis updates");
    assert_eq!(a.bound("tstor-node2").as_deref(), Some("ch-node2"));
    assert_eq!(a.bound("tstor-node3").as_deref(), Some("ch-node3"));

    // nothing changed: nothing sent
    assert_eq!(a.reconcile(&d).await, (0, 0));

    // delete node3: exactly its rows go
    let ch2 = a.chassis_uuid("ch-node2");
    let d2 = plan(
        &snap(
            vec![node("node1", 1, &[]), node("node2", 2, &[])],
            vec![pod("web")],
        ),
        &local1(),
    );
    let (n, s) = a.reconcile(&d2).await;
    assert_eq!(
        (n, s),
        (2, 1),
        "one mutate per parent in NB, one chassis delete in SB"
    );
    assert_eq!(summary(&nb), expected_nb(&[2], &[("web", 3)]));
    assert_eq!(summary(&sb), expected_sb(&[2]));
    assert_eq!(
        a.chassis_uuid("ch-node2"),
        ch2,
        "the other chassis row is untouched"
    );
    assert_eq!(a.reconcile(&d2).await, (0, 0));

    // a zone change that disconnects node2 removes it too
    let d3 = plan(
        &snap(
            vec![node("node1", 1, &["a"]), node("node2", 2, &["b"])],
            vec![pod("web")],
        ),
        &local1(),
    );
    a.reconcile(&d3).await;
    assert_eq!(summary(&nb), expected_nb(&[], &[("web", 3)]));
    assert_eq!(summary(&sb), expected_sb(&[]));
}

#[tokio::test]
async fn restarted_agent_removes_stale_rows_and_keeps_live_chassis() {
    init_logs();
    let nb = OvsdbServer::start(Schema::Northbound).expect("nb");
    let sb = OvsdbServer::start(Schema::Southbound).expect("sb");
    let _northd = Northd::start(&nb, &sb);
    let pods = vec![pod("a"), pod("b")];
    {
        // The "previous run": four nodes and two pods.
        let a = Agent::new(&nb, &sb).await;
        let mut nodes = three();
        nodes.push(node("node4", 4, &[]));
        a.reconcile(&plan(&snap(nodes, pods.clone()), &local1()))
            .await;
        a.wait_bindings(&["tstor-node2", "tstor-node3", "tstor-node4"])
            .await;
        a.reconcile(&plan(&snap(three(), pods.clone()), &local1()))
            .await;
        // plus rows an older run left: a stale switch, a remote chassis of a deleted node
        let mut t = Txn::new("OVN_Southbound");
        let e = t.insert(
            "Encap",
            [
                ("type".to_owned(), Datum::scalar("geneve")),
                ("ip".to_owned(), Datum::scalar("172.16.0.9")),
                ("chassis_name".to_owned(), Datum::scalar("ch-node9")),
            ]
            .into_iter()
            .collect(),
        );
        t.insert(
            "Chassis",
            [
                ("name".to_owned(), Datum::scalar("ch-node9")),
                ("hostname".to_owned(), Datum::scalar("node9")),
                ("encaps".to_owned(), Datum::from(&e)),
                (
                    "other_config".to_owned(),
                    Datum::str_map([("is-remote", "true")]),
                ),
            ]
            .into_iter()
            .collect(),
        );
        a.sb.0.transact(&t).await.expect("stale chassis");
        let mut t = Txn::new("OVN_Northbound");
        t.insert(
            "Logical_Switch",
            [
                ("name".to_owned(), Datum::scalar("node9")),
                (
                    "external_ids".to_owned(),
                    Datum::str_map([("k8s.ovn.org/owner", "node/node9")]),
                ),
            ]
            .into_iter()
            .collect(),
        );
        a.nb.0.transact(&t).await.expect("stale switch");
    }
    // The restarted agent: pod "a" is gone, pod "b" kept its published address (.4), node3
    // was deleted while the agent was down.
    let a = Agent::new(&nb, &sb).await;
    let ch2 = a.chassis_uuid("ch-node2");
    let mut b = pod("b");
    b.network = Some(PodAddr {
        ip: "10.244.1.4".parse().expect("ip"),
        mac: [0x0a, 0x58, 10, 244, 1, 4],
    });
    let d = plan(
        &snap(vec![node("node1", 1, &[]), node("node2", 2, &[])], vec![b]),
        &local1(),
    );
    a.reconcile(&d).await;
    assert_eq!(summary(&nb), expected_nb(&[2], &[("b", 4)]));
    assert_eq!(summary(&sb), expected_sb(&[2]));
    assert_eq!(
        a.chassis_uuid("ch-node2"),
        ch2,
        "no delete/re-add of a live chassis (no tunnel flap)"
    );
    assert_eq!(a.bound("tstor-node2").as_deref(), Some("ch-node2"));
    assert_eq!(a.reconcile(&d).await, (0, 0));
}

#[tokio::test]
async fn local_ovs_settings_and_management_port() {
    init_logs();
    let ovs = OvsdbServer::start(Schema::Vswitch).expect("ovs");
    let db = format!("--db={}", ovs.endpoint());
    ovsdb_harness::run(
        "ovs-vsctl",
        &[
            &db,
            "--no-wait",
            "init",
            "--",
            "set",
            "Open_vSwitch",
            ".",
            "external_ids:ovn-remote=unix:/x",
            "external_ids:ovn-transport-zones=old",
        ],
    )
    .expect("init");
    let (c, r) = replica(&ovs).await;
    let mut d = plan(&snap(three(), vec![]), &local1());
    // before br-int exists: only the Open_vSwitch keys
    let t = ovs_txn(&d.ovs, &r.cache());
    assert_eq!(t.len(), 1);
    c.transact(&t).await.expect("ovs txn");
    wait_for(&r, "ovs replica", |x| ovs_txn(&d.ovs, x).is_empty()).await;
    ovsdb_harness::run("ovs-vsctl", &[&db, "--no-wait", "add-br", "br-int"]).expect("br-int");
    wait_for(&r, "br-int", |x| !ovs_txn(&d.ovs, x).is_empty()).await;
    let t = ovs_txn(&d.ovs, &r.cache());
    assert_eq!(t.len(), 3, "interface, port, bridge mutate");
    c.transact(&t).await.expect("ovs txn");
    wait_for(&r, "ovs replica", |x| ovs_txn(&d.ovs, x).is_empty()).await;
    let get = |k: &str| {
        ovsdb_harness::run(
            "ovs-vsctl",
            &[
                &db,
                "--no-wait",
                "get",
                "Open_vSwitch",
                ".",
                &format!("external_ids:{k}"),
            ],
        )
        .map(|s| s.trim().trim_matches('"').to_owned())
        .ok()
    };
    assert_eq!(get("ovn-is-interconn").as_deref(), Some("true"));
    assert_eq!(get("hostname").as_deref(), Some("node1"));
    assert_eq!(get("system-id").as_deref(), Some("ch-node1"));
    assert_eq!(get("ovn-encap-ip").as_deref(), Some("172.16.0.1"));
    assert_eq!(
        get("ovn-remote").as_deref(),
        Some("unix:/x"),
        "foreign keys are kept"
    );
    assert_eq!(
        get("ovn-transport-zones"),
        None,
        "removed when the node has no zones"
    );
    let iface = ovsdb_harness::run(
        "ovs-vsctl",
        &[
            &db,
            "--no-wait",
            "get",
            "Interface",
            "ovn-k8s-mp0",
            "external_ids:iface-id",
            "mac",
            "type",
        ],
    )
    .expect("iface");
    assert_eq!(
        iface.split_whitespace().collect::<Vec<_>>(),
        vec!["k8s-node1", "\"0a:58:0a:f4:01:02\"", "internal"]
    );
    // zones appear as a comma list
    d = plan(
        &snap(
            vec![node("node1", 1, &["b", "a"]), node("node2", 2, &[])],
            vec![],
        ),
        &local1(),
    );
    let t = ovs_txn(&d.ovs, &r.cache());
    assert_eq!(t.len(), 1);
    c.transact(&t).await.expect("ovs txn");
    wait_for(&r, "ovs replica", |x| ovs_txn(&d.ovs, x).is_empty()).await;
    assert_eq!(get("ovn-transport-zones").as_deref(), Some("a,b"));
}

#[tokio::test]
async fn foreign_local_chassis_is_reported_and_left_alone() {
    init_logs();
    let sb = OvsdbServer::start(Schema::Southbound).expect("sb");
    let (c, db) = replica(&sb).await;
    let mut t = Txn::new("OVN_Southbound");
    for (name, host, ip) in [
        ("ch-node1", "node1", "172.16.0.1"),
        ("ch-other", "other", "172.16.0.50"),
    ] {
        let e = t.insert(
            "Encap",
            [
                ("type".to_owned(), Datum::scalar("geneve")),
                ("ip".to_owned(), Datum::scalar(ip)),
                ("chassis_name".to_owned(), Datum::scalar(name)),
            ]
            .into_iter()
            .collect(),
        );
        t.insert(
            "Chassis",
            [
                ("name".to_owned(), Datum::scalar(name)),
                ("hostname".to_owned(), Datum::scalar(host)),
                ("encaps".to_owned(), Datum::from(&e)),
            ]
            .into_iter()
            .collect(),
        );
    }
    c.transact(&t).await.expect("chassis");
    wait_for(&db, "chassis", |x| {
        x.table("Chassis").is_some_and(|t| t.len() == 2)
    })
    .await;
    let d = plan(&snap(three(), vec![]), &local1());
    let (t, problems) = sb_txn(d.sb.as_ref().expect("sb"), &db.cache(), "node1");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].reason, "CentralizedModeUnsupported");
    assert!(problems[0].message.contains("ch-other"));
    assert!(
        !t.ops().iter().any(|o| o.summary.starts_with("delete")),
        "a chassis ovnk does not own is never deleted"
    );
}

#[tokio::test]
async fn chassis_id_and_encap_changes_apply_in_one_transaction() {
    init_logs();
    let nb = OvsdbServer::start(Schema::Northbound).expect("nb");
    let sb = OvsdbServer::start(Schema::Southbound).expect("sb");
    let a = Agent::new(&nb, &sb).await;
    a.reconcile(&plan(&snap(three(), vec![]), &local1())).await;
    let ch2 = a.chassis_uuid("ch-node2");
    // node2's encap IP moves: the chassis row stays, its Encap is replaced
    let mut n2 = node("node2", 2, &[]);
    n2.encap_ips = vec!["172.16.0.22".parse().expect("ip")];
    let (_, s) = a
        .reconcile(&plan(
            &snap(
                vec![node("node1", 1, &[]), n2.clone(), node("node3", 3, &[])],
                vec![],
            ),
            &local1(),
        ))
        .await;
    assert_eq!(s, 2, "insert Encap + update Chassis.encaps");
    assert_eq!(a.chassis_uuid("ch-node2"), ch2);
    assert!(summary(&sb).contains("ENCAP|ch-node2|geneve|172.16.0.22|{\"csum\": \"true\"}"));
    assert!(!summary(&sb).iter().any(|l| l.contains("172.16.0.2|")));
    // node3 is re-created with a new chassis id but the same encap IP (unique (type, ip) index)
    let mut n3 = node("node3", 3, &[]);
    n3.chassis_id = Some("ch-node3-new".into());
    a.reconcile(&plan(
        &snap(vec![node("node1", 1, &[]), n2, n3], vec![]),
        &local1(),
    ))
    .await;
    let sbs = summary(&sb);
    assert!(
        sbs.iter()
            .any(|l| l.starts_with("CHASSIS|ch-node3-new|node3|")),
        "{sbs:?}"
    );
    assert!(
        !sbs.iter().any(|l| l.starts_with("CHASSIS|ch-node3|")),
        "{sbs:?}"
    );
}

/// UUIDs of every NB row programmed for remote `peer` (its transit port and its routes).
fn nb_uuids_of(a: &Agent, peer: &str) -> BTreeSet<ovsdb::Uuid> {
    let c = a.nb.1.cache();
    let mut out = BTreeSet::new();
    let s = |r: &ovsdb::RowRef<'_>, col: &str, key: &str| {
        r.get(col)
            .and_then(|d| d.map_get(key))
            .and_then(|a| a.as_str())
            .map(str::to_owned)
    };
    for (table, col, key) in [
        ("Logical_Switch_Port", "external_ids", "node"),
        ("Logical_Router_Static_Route", "external_ids", "ic-node"),
    ] {
        if let Some(t) = c.table(table) {
            out.extend(
                t.rows()
                    .filter(|r| s(r, col, key).as_deref() == Some(peer))
                    .map(|r| r.uuid),
            );
        }
    }
    out
}

fn chassis_zones(a: &Agent, name: &str) -> Option<BTreeSet<String>> {
    let c = a.sb.1.cache();
    let r = node::apply::find_named(&c, "Chassis", name)?;
    Some(
        r.get("transport_zones")?
            .as_set()?
            .iter()
            .filter_map(|x| x.as_str().map(str::to_owned))
            .collect(),
    )
}

/// Issue 5: a peer that leaves node1's zones loses exactly its rows (transit port, routes,
/// Chassis and Encap), in one transaction per database; a peer that stays keeps its row
/// UUIDs (no tunnel flap); a peer whose zones change but stays connected only gets its
/// Chassis `transport_zones` updated; reconnecting it costs exactly its rows.
#[tokio::test]
async fn zone_changes_remove_exactly_the_leaving_peer_and_keep_the_rest() {
    init_logs();
    let nb = OvsdbServer::start(Schema::Northbound).expect("nb");
    let sb = OvsdbServer::start(Schema::Southbound).expect("sb");
    let _northd = Northd::start(&nb, &sb);
    let a = Agent::new(&nb, &sb).await;
    let cluster = |z3: &[&str], z4: &[&str]| {
        snap(
            vec![
                node("node1", 1, &["a", "gw"]),
                node("node2", 2, &["a"]),
                node("node3", 3, z3),
                node("node4", 4, z4),
            ],
            vec![],
        )
    };
    let d0 = plan(&cluster(&["a"], &["gw"]), &local1());
    a.reconcile(&d0).await;
    a.wait_bindings(&["tstor-node2", "tstor-node3", "tstor-node4"])
        .await;
    a.reconcile(&d0).await;
    assert_eq!(a.reconcile(&d0).await, (0, 0));
    assert_eq!(chassis_zones(&a, "ch-node3"), Some(["a".to_owned()].into()));
    let keep_nb: Vec<_> = ["node2", "node4"].map(|p| nb_uuids_of(&a, p)).into();
    let keep_sb = ["ch-node2", "ch-node4"].map(|c| a.chassis_uuid(c));
    assert!(keep_nb.iter().all(|s| s.len() == 3), "{keep_nb:?}");

    // node3 relabelled from a to b (disconnects), node4 gains zone c (stays connected)
    let d1 = plan(&cluster(&["b"], &["gw", "c"]), &local1());
    let (n, s) = a.reconcile(&d1).await;
    assert_eq!(
        (n, s),
        (2, 2),
        "NB: one mutate of the transit switch's ports and one of the router's routes; \
         SB: delete node3's Chassis, update node4's transport_zones"
    );
    assert_eq!(summary(&nb), expected_nb(&[2, 4], &[]));
    let sb_rows: BTreeSet<String> = summary(&sb)
        .into_iter()
        .filter(|r| r.starts_with("ENCAP"))
        .collect();
    assert_eq!(
        sb_rows,
        expected_sb(&[2, 4])
            .into_iter()
            .filter(|r| r.starts_with("ENCAP"))
            .collect()
    );
    assert_eq!(a.chassis_uuid("ch-node3"), None);
    assert_eq!(
        chassis_zones(&a, "ch-node4"),
        Some(["c".to_owned(), "gw".to_owned()].into())
    );
    let now_nb: Vec<_> = ["node2", "node4"].map(|p| nb_uuids_of(&a, p)).into();
    assert_eq!(now_nb, keep_nb, "staying peers keep their NB rows");
    assert_eq!(
        ["ch-node2", "ch-node4"].map(|c| a.chassis_uuid(c)),
        keep_sb,
        "staying peers keep their Chassis rows"
    );
    assert!(nb_uuids_of(&a, "node3").is_empty());
    assert_eq!(a.reconcile(&d1).await, (0, 0));

    // node3 back in zone a (node4 unchanged): exactly its rows come back
    let d2 = plan(&cluster(&["a"], &["gw", "c"]), &local1());
    let (n, s) = a.reconcile(&d2).await;
    assert_eq!(
        (n, s),
        (5, 2),
        "NB: port insert + switch mutate + 2 route inserts + router mutate; SB: chassis + encap"
    );
    assert_eq!(nb_uuids_of(&a, "node3").len(), 3);
    assert_eq!(now_nb, ["node2", "node4"].map(|p| nb_uuids_of(&a, p)));
}
