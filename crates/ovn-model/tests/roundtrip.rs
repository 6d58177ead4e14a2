//! Every typed table against a real ovsdb-server: the schema check passes, a row written from
//! the model comes back equal through the monitor, a one-field change is a one-column update,
//! and the indexes find rows by name and by owner key.

use std::collections::{BTreeMap, BTreeSet};

use ovn_model::*;
use ovsdb::{Client, ClientOptions, Condition, Datum, Txn};
use ovsdb_harness::{OvsdbServer, Schema};

async fn client(srv: &OvsdbServer) -> Client {
    Client::connect(&srv.endpoint(), ClientOptions::default())
        .await
        .expect("connect")
}

fn ids(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn strs(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn northbound_tables_round_trip() {
    let srv = OvsdbServer::start(Schema::Northbound).expect("nb");
    let c = client(&srv).await;
    let db = connect_db(&c, NB_DB, &nb_needs())
        .await
        .expect("schema fits and monitor starts");

    let acl = Acl {
        name: Some("allow-host".into()),
        priority: 1001,
        direction: "to-lport".into(),
        match_: "ip4.src == $a1".into(),
        action: "allow-related".into(),
        log: true,
        severity: Some("info".into()),
        external_ids: ids(&[(OWNER_KEY, "ns1")]),
        ..Default::default()
    };
    let lsp = LogicalSwitchPort {
        name: "k8s-node1".into(),
        addresses: strs(&["0a:58:0a:f4:01:02 10.244.1.2"]),
        port_security: strs(&["0a:58:0a:f4:01:02 10.244.1.2"]),
        options: ids(&[("requested-tnl-key", "2")]),
        external_ids: ids(&[(OWNER_KEY, "node1"), ("node", "node1")]),
        enabled: Some(true),
        ..Default::default()
    };
    let lrp = LogicalRouterPort {
        name: "rtos-node1".into(),
        mac: "0a:58:0a:f4:01:01".into(),
        networks: strs(&["10.244.1.1/24"]),
        options: ids(&[("mcast_flood", "true")]),
        ..Default::default()
    };
    let route = LogicalRouterStaticRoute {
        ip_prefix: "10.244.2.0/24".into(),
        nexthop: "100.88.0.3".into(),
        external_ids: ids(&[("ic-node", "node2"), (OWNER_KEY, "node2")]),
        ..Default::default()
    };
    let policy = LogicalRouterPolicy {
        priority: 1004,
        match_: "ip4.src == 10.244.1.0/24 && ip4.dst != 10.244.0.0/16".into(),
        action: "reroute".into(),
        nexthops: strs(&["10.244.1.2"]),
        ..Default::default()
    };
    let aset = AddressSet {
        name: "a1".into(),
        addresses: strs(&["10.244.1.2", "100.64.0.2"]),
        external_ids: ids(&[(OWNER_KEY, "hostnet")]),
        ..Default::default()
    };
    let global = NbGlobal {
        options: ids(&[("name", "zone-node1")]),
        external_ids: ids(&[("k", "v")]),
        ..Default::default()
    };

    // Typed inserts (`insert_model`, serialized from the fields) here; the Southbound test
    // below goes through `RowData` (`to_row`), so both paths meet the real server.
    let mut t = Txn::new(NB_DB);
    let g = t.insert_model(&global, &[]);
    let a = t.insert_model(&acl, &[]);
    let p = t.insert_model(&lsp, &[]);
    let mut ls = LogicalSwitch {
        name: "node1".into(),
        other_config: ids(&[("subnet", "10.244.1.0/24")]),
        ..Default::default()
    };
    let s = t.insert_model(&ls, &[("ports", (&p).into()), ("acls", (&a).into())]);
    let rp = t.insert_model(&lrp, &[]);
    let sr = t.insert_model(&route, &[]);
    let po = t.insert_model(&policy, &[]);
    let mut lr = LogicalRouter {
        name: "ovn_cluster_router".into(),
        ..Default::default()
    };
    let r = t.insert_model(
        &lr,
        &[
            ("ports", (&rp).into()),
            ("static_routes", (&sr).into()),
            ("policies", (&po).into()),
        ],
    );
    let asn = t.insert_model(&aset, &[]);
    let mut pg = PortGroup {
        name: "pg1".into(),
        external_ids: ids(&[(OWNER_KEY, "ns1")]),
        ..Default::default()
    };
    let pgn = t.insert_model(&pg, &[("ports", (&p).into())]);
    let res = c.transact(&t).await.expect("insert everything");

    let u = |n| res.uuid_of(n).expect("uuid");
    db.wait_until(|c| c.get::<PortGroup>(&u(&pgn)).is_some())
        .await;
    {
        let cache = db.cache();
        assert_eq!(
            cache.get::<NbGlobal>(&u(&g)),
            Some(NbGlobal {
                uuid: u(&g),
                ..global
            })
        );
        assert_eq!(cache.get::<Acl>(&u(&a)), Some(Acl { uuid: u(&a), ..acl }));
        assert_eq!(
            cache.get::<LogicalSwitchPort>(&u(&p)),
            Some(LogicalSwitchPort {
                uuid: u(&p),
                ..lsp.clone()
            })
        );
        ls.uuid = u(&s);
        ls.ports = BTreeSet::from([u(&p)]);
        ls.acls = BTreeSet::from([u(&a)]);
        assert_eq!(cache.get::<LogicalSwitch>(&u(&s)), Some(ls));
        assert_eq!(
            cache.get::<LogicalRouterPort>(&u(&rp)),
            Some(LogicalRouterPort {
                uuid: u(&rp),
                ..lrp
            })
        );
        assert_eq!(
            cache.get::<LogicalRouterStaticRoute>(&u(&sr)),
            Some(LogicalRouterStaticRoute {
                uuid: u(&sr),
                ..route
            })
        );
        assert_eq!(
            cache.get::<LogicalRouterPolicy>(&u(&po)),
            Some(LogicalRouterPolicy {
                uuid: u(&po),
                ..policy
            })
        );
        lr.uuid = u(&r);
        lr.ports = BTreeSet::from([u(&rp)]);
        lr.static_routes = BTreeSet::from([u(&sr)]);
        lr.policies = BTreeSet::from([u(&po)]);
        assert_eq!(cache.get::<LogicalRouter>(&u(&r)), Some(lr));
        assert_eq!(
            cache.get::<AddressSet>(&u(&asn)),
            Some(AddressSet {
                uuid: u(&asn),
                ..aset
            })
        );
        pg.uuid = u(&pgn);
        pg.ports = BTreeSet::from([u(&p)]);
        assert_eq!(cache.get::<PortGroup>(&u(&pgn)), Some(pg));

        // Indexes: by name, by owner key.
        assert_eq!(cache.named::<LogicalSwitch>("node1").len(), 1);
        assert_eq!(cache.named::<LogicalSwitch>("nope").len(), 0);
        let owned_by_ns1: Vec<Acl> = cache.find(&by_external_id(OWNER_KEY), "ns1");
        assert_eq!(owned_by_ns1.len(), 1);
        let owned_pgs: Vec<PortGroup> = cache.find(&by_external_id(OWNER_KEY), "ns1");
        assert_eq!(owned_pgs.len(), 1);
        let node2: Vec<LogicalRouterStaticRoute> = cache.find(&by_external_id(OWNER_KEY), "node2");
        assert_eq!(node2.len(), 1);
    }

    // A one-field change is a one-column update, and the index follows it.
    let current = db.cache().get::<LogicalSwitchPort>(&u(&p)).expect("lsp");
    let mut desired = current.clone();
    desired
        .external_ids
        .insert(OWNER_KEY.into(), "node9".into());
    let diff = desired.diff(&current);
    assert_eq!(diff.keys().collect::<Vec<_>>(), ["external_ids"]);
    let mut t = Txn::new(NB_DB);
    t.update(
        LogicalSwitchPort::TABLE,
        &[Condition::uuid(current.uuid)],
        diff,
    );
    c.transact(&t).await.expect("update");
    db.wait_until(|c| {
        !c.find::<LogicalSwitchPort>(&by_external_id(OWNER_KEY), "node9")
            .is_empty()
    })
    .await;
    assert!(
        db.cache()
            .find::<LogicalSwitchPort>(&by_external_id(OWNER_KEY), "node1")
            .is_empty()
    );
    assert_eq!(db.cache().get::<LogicalSwitchPort>(&u(&p)), Some(desired));
}

#[tokio::test]
async fn southbound_tables_round_trip() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("sb");
    let c = client(&srv).await;
    let db = connect_db(&c, SB_DB, &sb_needs())
        .await
        .expect("schema fits");

    let encap = Encap {
        kind: "geneve".into(),
        ip: "172.18.0.3".into(),
        chassis_name: "ch-node2".into(),
        options: ids(&[("csum", "true")]),
        ..Default::default()
    };
    let mut chassis = Chassis {
        name: "ch-node2".into(),
        hostname: "node2".into(),
        transport_zones: strs(&["tenant-a"]),
        other_config: ids(&[("is-remote", "true")]),
        external_ids: ids(&[(OWNER_KEY, "node2")]),
        ..Default::default()
    };
    let mut t = Txn::new(SB_DB);
    let g = t.insert(
        SbGlobal::TABLE,
        SbGlobal {
            options: ids(&[("x", "y")]),
            ..Default::default()
        }
        .to_row(),
    );
    let e = t.insert(Encap::TABLE, encap.to_row());
    let mut ch_row = chassis.to_row();
    ch_row.insert("encaps".into(), (&e).into());
    let ch = t.insert(Chassis::TABLE, ch_row);
    let mut cp_row = ChassisPrivate {
        name: "ch-node2".into(),
        ..Default::default()
    }
    .to_row();
    cp_row.insert("chassis".into(), (&ch).into());
    let cp = t.insert(ChassisPrivate::TABLE, cp_row);
    // Port_Binding needs a datapath; ovnk never inserts either (northd does), the test does.
    let dp = t.insert(
        "Datapath_Binding",
        [("tunnel_key".to_string(), Datum::scalar(16711683i64))].into(),
    );
    let pb = t.insert(
        PortBinding::TABLE,
        [
            ("logical_port".to_string(), Datum::from("tstor-node2")),
            ("type".into(), "remote".into()),
            ("datapath".into(), (&dp).into()),
            ("tunnel_key".into(), 3i64.into()),
        ]
        .into(),
    );
    let res = c.transact(&t).await.expect("insert");
    let u = |n| res.uuid_of(n).expect("uuid");
    db.wait_until(|c| c.get::<PortBinding>(&u(&pb)).is_some())
        .await;

    // ovnk binds the remote port to its chassis (OVN 23.03's northd does not): one column.
    let current = db.cache().get::<PortBinding>(&u(&pb)).expect("pb");
    assert_eq!(current.kind, "remote");
    assert_eq!(current.chassis, None);
    let desired = PortBinding {
        chassis: Some(u(&ch)),
        ..current.clone()
    };
    let diff = desired.diff(&current);
    assert_eq!(diff.keys().collect::<Vec<_>>(), ["chassis"]);
    let mut t = Txn::new(SB_DB);
    t.update(PortBinding::TABLE, &[Condition::uuid(current.uuid)], diff);
    c.transact(&t).await.expect("bind");
    db.wait_until(|c| {
        c.get::<PortBinding>(&u(&pb))
            .is_some_and(|p| p.chassis.is_some())
    })
    .await;

    let cache = db.cache();
    chassis.uuid = u(&ch);
    chassis.encaps = BTreeSet::from([u(&e)]);
    assert_eq!(cache.get::<Chassis>(&u(&ch)), Some(chassis));
    assert_eq!(
        cache.get::<Encap>(&u(&e)),
        Some(Encap {
            uuid: u(&e),
            ..encap
        })
    );
    assert_eq!(
        cache.get::<ChassisPrivate>(&u(&cp)).and_then(|c| c.chassis),
        Some(u(&ch))
    );
    assert_eq!(
        cache.get::<SbGlobal>(&u(&g)).map(|g| g.options),
        Some(ids(&[("x", "y")]))
    );
    assert_eq!(cache.get::<PortBinding>(&u(&pb)), Some(desired));
    assert_eq!(cache.named::<Chassis>("ch-node2").len(), 1);
    assert_eq!(
        cache
            .find::<Chassis>(&by_external_id(OWNER_KEY), "node2")
            .len(),
        1
    );
}

#[tokio::test]
async fn open_vswitch_tables_round_trip() {
    let srv = OvsdbServer::start(Schema::Vswitch).expect("conf");
    let c = client(&srv).await;
    let db = connect_db(&c, OVS_DB, &ovs_needs())
        .await
        .expect("schema fits");

    let iface = Interface {
        name: "ovn-node2-0".into(),
        kind: "geneve".into(),
        options: ids(&[("remote_ip", "172.18.0.3"), ("key", "flow")]),
        mtu_request: Some(1400),
        ..Default::default()
    };
    let mut t = Txn::new(OVS_DB);
    let i = t.insert(Interface::TABLE, iface.to_row());
    let mut p_row = Port {
        name: "ovn-node2-0".into(),
        external_ids: ids(&[("ovn-chassis-id", "node2@172.18.0.3")]),
        ..Default::default()
    }
    .to_row();
    p_row.insert("interfaces".into(), (&i).into());
    let p = t.insert(Port::TABLE, p_row);
    let mut b_row = Bridge {
        name: "br-int".into(),
        datapath_type: "netdev".into(),
        fail_mode: Some("secure".into()),
        ..Default::default()
    }
    .to_row();
    b_row.insert("ports".into(), (&p).into());
    let b = t.insert(Bridge::TABLE, b_row);
    let mut o_row = OpenVSwitch {
        external_ids: ids(&[("system-id", "node1"), ("ovn-is-interconn", "true")]),
        ..Default::default()
    }
    .to_row();
    o_row.insert("bridges".into(), (&b).into());
    let o = t.insert(OpenVSwitch::TABLE, o_row);
    let res = c.transact(&t).await.expect("insert");
    let u = |n| res.uuid_of(n).expect("uuid");
    db.wait_until(|c| c.get::<OpenVSwitch>(&u(&o)).is_some())
        .await;
    let cache = db.cache();
    assert_eq!(
        cache.get::<Interface>(&u(&i)),
        Some(Interface {
            uuid: u(&i),
            ..iface
        })
    );
    assert_eq!(
        cache.get::<Port>(&u(&p)).map(|p| p.interfaces),
        Some(BTreeSet::from([u(&i)]))
    );
    let br = cache.get::<Bridge>(&u(&b)).expect("bridge");
    assert_eq!(
        (br.datapath_type.as_str(), br.fail_mode.as_deref()),
        ("netdev", Some("secure"))
    );
    let ovs = cache.get::<OpenVSwitch>(&u(&o)).expect("ovs");
    assert_eq!(
        ovs.external_ids.get("ovn-is-interconn").map(String::as_str),
        Some("true")
    );
    assert_eq!(ovs.bridges, BTreeSet::from([u(&b)]));
}

#[tokio::test]
async fn a_server_schema_missing_a_needed_column_is_a_clear_error() {
    // An SB schema whose Chassis lacks transport_zones, and whose Encap.ip is an integer.
    let text = std::fs::read_to_string(ovsdb_harness::SB_SCHEMA).expect("schema");
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let tables = v["tables"].as_object_mut().expect("tables");
    tables["Chassis"]["columns"]
        .as_object_mut()
        .expect("cols")
        .remove("transport_zones");
    tables["Encap"]["columns"]["ip"]["type"] = serde_json::json!("integer");
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("old-sb.ovsschema");
    std::fs::write(&path, serde_json::to_string(&v).expect("ser")).expect("write");

    let srv = OvsdbServer::start(Schema::File(path)).expect("server");
    let c = client(&srv).await;
    let err = connect_db(&c, SB_DB, &sb_needs())
        .await
        .expect_err("must not fit");
    let msg = err.to_string();
    assert!(
        msg.contains("column Chassis.transport_zones is missing"),
        "{msg}"
    );
    assert!(
        msg.contains("column Encap.ip has type integer but ovnk needs string"),
        "{msg}"
    );
}

/// A table large enough to be converted on several threads lists exactly the rows that
/// one-by-one lookups return, each once.
#[tokio::test]
async fn a_large_table_lists_the_same_rows_as_lookups() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("sb");
    let c = client(&srv).await;
    let n = 5000;
    let mut t = Txn::new(SB_DB);
    for i in 0..n {
        let e = t.insert_model(
            &Encap {
                kind: "geneve".into(),
                ip: format!("10.1.{}.{}", i / 256, i % 256),
                chassis_name: format!("ch{i}"),
                ..Default::default()
            },
            &[],
        );
        t.insert_model(
            &Chassis {
                name: format!("ch{i}"),
                hostname: format!("host{i}"),
                external_ids: ids(&[(OWNER_KEY, &format!("node{i}"))]),
                ..Default::default()
            },
            &[("encaps", Datum::from(&e))],
        );
    }
    c.transact(&t).await.expect("insert");
    let db = connect_db(&c, SB_DB, &[Chassis::NEEDS, Encap::NEEDS])
        .await
        .expect("monitor");
    let cache = db.cache();
    let listed = cache.list::<Chassis>();
    assert_eq!(listed.len(), n);
    let names: BTreeSet<&str> = listed.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names.len(), n, "every chassis listed once");
    for ch in &listed {
        assert_eq!(cache.get::<Chassis>(&ch.uuid).as_ref(), Some(ch));
        assert_eq!(ch.hostname, ch.name.replace("ch", "host"));
        assert_eq!(ch.encaps.len(), 1);
    }
    assert_eq!(cache.list::<Encap>().len(), n);
}
