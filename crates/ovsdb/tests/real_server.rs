//! The client against a real ovsdb-server (Debian's openvswitch-switch / ovn-central).

mod common;

use common::*;
use ovsdb::{Condition, Datum, Error, MonitorSpec, Mutation, Txn, TxnError};
use ovsdb_harness::{OvsdbServer, Schema};

#[tokio::test]
async fn list_dbs_schema_and_echo() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let c = connect(&srv).await;
    let dbs = c.list_dbs().await.expect("list_dbs");
    assert!(dbs.contains(&SB.to_string()), "{dbs:?}");
    let schema = c.get_schema(SB).await.expect("schema");
    assert!(schema.table("Chassis").is_some());
    assert!(schema.table("Encap").is_some_and(|t| !t.is_root));
    c.echo().await.expect("echo");
    let err = c.get_schema("No_Such_Db").await.expect_err("unknown db");
    assert!(matches!(err, Error::Rpc { .. }), "{err}");
}

#[tokio::test]
async fn two_clients_see_each_others_writes() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let a = connect(&srv).await;
    let b = connect(&srv).await;
    let da = a
        .monitor(SB, MonitorSpec::tables(["Chassis", "Encap"]))
        .await
        .expect("monitor a");
    let db = b
        .monitor(SB, MonitorSpec::tables(["Chassis", "Encap"]))
        .await
        .expect("monitor b");

    let mut t = Txn::new(SB);
    add_chassis(&mut t, "from-a", "10.0.0.1");
    a.transact(&t).await.expect("a writes");
    let mut t = Txn::new(SB);
    add_chassis(&mut t, "from-b", "10.0.0.2");
    b.transact(&t).await.expect("b writes");

    // A client sees its own write when the reply arrives (the server sends the update first);
    // the other sees it once the notification is in.
    for d in [&da, &db] {
        d.wait_until(|c| c.table("Chassis").is_some_and(|t| t.len() == 2))
            .await;
        assert_cache_matches_dump(d, &srv, &["Chassis", "Encap"]);
    }

    // A modify (map diff) and a delete travel too.
    let mut t = Txn::new(SB);
    t.mutate(
        "Chassis",
        &[Condition::eq("name", "from-a")],
        &[Mutation::insert(
            "external_ids",
            Datum::str_map([("k", "v")]),
        )],
    );
    t.delete("Chassis", &[Condition::eq("name", "from-b")]);
    a.transact(&t).await.expect("mutate+delete");
    db.wait_until(|c| {
        c.table("Chassis").is_some_and(|t| t.len() == 1)
            && c.table("Encap").is_some_and(|t| t.len() == 1)
    })
    .await;
    assert_cache_matches_dump(&db, &srv, &["Chassis", "Encap"]);
    let cache = db.cache();
    let ch = cache
        .table("Chassis")
        .expect("t")
        .rows()
        .next()
        .expect("row");
    assert_eq!(ch.get("external_ids"), Some(&Datum::str_map([("k", "v")])));
}

#[tokio::test]
async fn schema_violation_is_surfaced_with_the_failing_op() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let c = connect(&srv).await;
    // Chassis.encaps has min 1: a Chassis with no Encap is refused by the server.
    let mut t = Txn::new(SB);
    t.insert(
        "Chassis",
        row([("name", "bare".into()), ("hostname", "bare".into())]),
    );
    let err = c.transact(&t).await.expect_err("must fail");
    let Error::Txn(e) = err else {
        panic!("expected a transaction error, got {err}")
    };
    let text = e.to_string();
    assert!(text.contains("Chassis"), "{text}");
    assert!(
        e.kind().contains("constraint violation") || e.kind().contains("referential integrity"),
        "{text}"
    );

    // Wrong type in an op: the server names the op.
    let mut t = Txn::new(SB);
    add_chassis(&mut t, "ok", "10.0.0.9");
    t.update(
        "Chassis",
        &[Condition::eq("name", "ok")],
        row([("nb_cfg", "not-a-number".into())]),
    );
    let err = c.transact(&t).await.expect_err("must fail");
    match err {
        Error::Txn(TxnError::Op { index, op, .. }) => {
            assert_eq!(index, 2, "the update is op 2");
            assert!(op.starts_with("update Chassis"), "{op}");
        }
        other => panic!("expected an op error, got {other}"),
    }
    // Nothing of the failed transactions was committed.
    let dump = srv.dump(&["Chassis"]).expect("dump");
    assert_eq!(dump["Chassis"].as_object().map(|o| o.len()), Some(0));
}

#[tokio::test]
async fn wait_conflict_is_detected() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let c = connect(&srv).await;
    let mut t = Txn::new(SB);
    add_chassis(&mut t, "ch1", "10.0.0.1");
    c.transact(&t).await.expect("insert");

    // Optimistic concurrency: assert the hostname we read, then write.
    let guarded = |expect_host: &str| {
        let mut t = Txn::new(SB);
        t.wait(
            "Chassis",
            &[Condition::eq("name", "ch1")],
            &["hostname"],
            &[row([("hostname", expect_host.into())])],
            true,
        );
        t.update(
            "Chassis",
            &[Condition::eq("name", "ch1")],
            row([("hostname", "renamed".into())]),
        );
        t
    };
    let err = c
        .transact(&guarded("stale-read"))
        .await
        .expect_err("conflict");
    match &err {
        Error::Txn(TxnError::Op {
            index: 0, error, ..
        }) => assert_eq!(error, "timed out"),
        other => panic!("expected the wait op to fail, got {other}"),
    }
    let ok = c
        .transact(&guarded("ch1"))
        .await
        .expect("matching wait passes");
    assert_eq!(ok.count(1), Some(1));
}

#[tokio::test]
async fn monitor_of_unknown_table_is_a_clear_error() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let c = connect(&srv).await;
    let err = c
        .monitor(SB, MonitorSpec::tables(["Chassis", "No_Such_Table"]))
        .await
        .expect_err("unknown table");
    assert!(err.to_string().contains("No_Such_Table"), "{err}");
}

#[tokio::test]
async fn conditional_monitor_replicates_only_matching_rows() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let c = connect(&srv).await;
    let mut t = Txn::new(SB);
    add_chassis(&mut t, "keep", "10.0.0.1");
    add_chassis(&mut t, "skip", "10.0.0.2");
    c.transact(&t).await.expect("insert");
    let spec = MonitorSpec {
        tables: vec![ovsdb::MonitorTable {
            name: "Chassis".into(),
            columns: Some(vec!["name".into(), "hostname".into()]),
            conditions: vec![Condition::eq("name", "keep")],
        }],
    };
    let db = c.monitor(SB, spec).await.expect("monitor");
    let cache = db.cache();
    let t = cache.table("Chassis").expect("table");
    assert_eq!(t.len(), 1);
    let r = t.rows().next().expect("row");
    assert_eq!(r.get("name"), Some(&Datum::from("keep")));
    assert_eq!(r.get("encaps"), None, "unmonitored column is not cached");
}

#[tokio::test]
async fn tcp_transport() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let ep = srv.tcp_endpoint().expect("tcp listener in the log");
    let c = ovsdb::Client::connect(&ep, fast_opts())
        .await
        .expect("connect over tcp");
    let db = c
        .monitor(SB, MonitorSpec::tables(["Chassis", "Encap"]))
        .await
        .expect("monitor");
    let mut t = Txn::new(SB);
    add_chassis(&mut t, "over-tcp", "10.0.0.7");
    c.transact(&t).await.expect("transact");
    db.wait_until(|c| c.table("Chassis").is_some_and(|t| t.len() == 1))
        .await;
    assert_cache_matches_dump(&db, &srv, &["Chassis", "Encap"]);
}

#[tokio::test]
async fn monitor_cancel_stops_replication() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let c = connect(&srv).await;
    let db = c
        .monitor(SB, MonitorSpec::tables(["Chassis", "Encap"]))
        .await
        .expect("monitor");
    c.monitor_cancel(SB).await.expect("cancel");
    assert!(c.db(SB).is_none());
    let mut t = Txn::new(SB);
    add_chassis(&mut t, "after-cancel", "10.0.0.8");
    c.transact(&t).await.expect("transact still works");
    // The server sends updates before the transact reply; none came.
    assert_eq!(db.cache().table("Chassis").map(|t| t.len()), Some(0));
    // And the database can be monitored again.
    let again = c
        .monitor(SB, MonitorSpec::tables(["Chassis"]))
        .await
        .expect("monitor again");
    assert_eq!(again.cache().table("Chassis").map(|t| t.len()), Some(1));
}
