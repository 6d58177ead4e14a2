//! Fault tests: the server is killed and restarted on the same database file while a client
//! holds a monitor and another process writes. The client must reconnect by itself and its
//! replica must equal a fresh dump of the server.

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use ovsdb::{Client, ClientOptions, ConnState, MonitorSpec, Txn};
use ovsdb_harness::{OvsdbServer, Schema};

/// Another process writing to the database: ovn-sbctl, one transaction per call.
fn sbctl(srv: &OvsdbServer, args: &[&str]) {
    let out = Command::new("ovn-sbctl")
        .arg(format!("--db={}", srv.endpoint()))
        .arg("--no-leader-only")
        .args(args)
        .output()
        .expect("ovn-sbctl (install ovn-central)");
    assert!(
        out.status.success(),
        "ovn-sbctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

async fn crash_and_write_while_away(mut srv: OvsdbServer) -> (OvsdbServer, ovsdb::SyncState) {
    init_logs();
    // A long first backoff so the writes below happen while the client is away.
    let opts = ClientOptions {
        backoff_initial: Duration::from_millis(1500),
        backoff_max: Duration::from_secs(2),
        inactivity_probe: Some(Duration::from_secs(2)),
        ..ClientOptions::default()
    };
    let c = Client::connect(&srv.endpoint(), opts)
        .await
        .expect("connect");
    let mut t = Txn::new(SB);
    for (n, ip) in [
        ("keep", "10.0.0.1"),
        ("change", "10.0.0.2"),
        ("drop", "10.0.0.3"),
    ] {
        add_chassis(&mut t, n, ip);
    }
    c.transact(&t).await.expect("seed");
    let db = c
        .monitor(SB, MonitorSpec::tables(["Chassis", "Encap"]))
        .await
        .expect("monitor");
    // One more transaction seen live, so a resuming client has a recent transaction id.
    sbctl(&srv, &["set", "chassis", "keep", "external_ids:seen=live"]);
    db.wait_until(|c| {
        c.table("Chassis").is_some_and(|t| {
            t.rows().any(|r| {
                r.get("external_ids")
                    .and_then(|d| d.map_get("seen"))
                    .is_some()
            })
        })
    })
    .await;
    assert_eq!(db.sync_state().full_syncs, 1);

    srv.kill();
    let mut st = c.state_watch();
    st.wait_for(|s| matches!(s, ConnState::Backoff(_)))
        .await
        .expect("client notices");
    assert!(
        !db.synced(),
        "the replica is marked stale while disconnected"
    );
    // Reads during the outage serve the last consistent replica.
    assert_eq!(db.cache().table("Chassis").map(|t| t.len()), Some(3));

    srv.restart().expect("restart on the same db file");
    sbctl(&srv, &["chassis-add", "new", "geneve", "10.0.0.4"]);
    sbctl(
        &srv,
        &[
            "set",
            "chassis",
            "change",
            "hostname=changed",
            "other_config:is-remote=false",
        ],
    );
    sbctl(&srv, &["chassis-del", "drop"]);

    // The client reconnects by itself and catches up.
    tokio::time::timeout(Duration::from_secs(20), db.wait_synced())
        .await
        .expect("resynced in time");
    assert_cache_matches_dump(&db, &srv, &["Chassis", "Encap"]);
    let names: Vec<String> = {
        let cache = db.cache();
        let mut v: Vec<String> = cache
            .table("Chassis")
            .expect("t")
            .rows()
            .filter_map(|r| {
                r.get("name")
                    .and_then(|d| d.as_scalar())
                    .and_then(|a| a.as_str())
                    .map(str::to_owned)
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(names, ["change", "keep", "new"]);

    // Live updates flow again after the reconnect.
    sbctl(&srv, &["chassis-del", "new"]);
    db.wait_until(|c| c.table("Chassis").is_some_and(|t| t.len() == 2))
        .await;
    assert_cache_matches_dump(&db, &srv, &["Chassis", "Encap"]);
    let state = db.sync_state();
    drop(c);
    (srv, state)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_restart_full_resync() {
    let srv = OvsdbServer::start(Schema::Southbound).expect("server");
    let (_srv, state) = crash_and_write_while_away(srv).await;
    // A standalone server keeps no transaction history: the client rebuilt its replica.
    assert_eq!(state.full_syncs, 2, "{state:?}");
    assert_eq!(state.resumes, 0, "{state:?}");
    assert_eq!(state.method, Some("monitor_cond_since"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clustered_restart_resumes_without_full_resync() {
    let srv = OvsdbServer::start_clustered(Schema::Southbound).expect("clustered server");
    let (_srv, state) = crash_and_write_while_away(srv).await;
    // A clustered server found our last transaction id: only the changes were sent.
    assert_eq!(state.resumes, 1, "{state:?}");
    assert_eq!(
        state.full_syncs, 1,
        "only the initial load was a full sync: {state:?}"
    );
}
