//! Shared helpers for the integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use ovsdb::{Client, ClientOptions, Datum, Db, RowData, Txn};
use ovsdb_harness::OvsdbServer;

pub const SB: &str = "OVN_Southbound";

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("ovsdb=debug")
        .try_init();
}

pub fn fast_opts() -> ClientOptions {
    ClientOptions {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..ClientOptions::default()
    }
}

pub fn row<const N: usize>(cols: [(&str, Datum); N]) -> RowData {
    cols.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
}

/// Adds a remote chassis the way OVN-Kubernetes IC does: Encap + Chassis in one transaction.
pub fn add_chassis(t: &mut Txn, name: &str, ip: &str) {
    let e = t.insert(
        "Encap",
        row([
            ("type", "geneve".into()),
            ("ip", ip.into()),
            ("chassis_name", name.into()),
            ("options", Datum::str_map([("csum", "true")])),
        ]),
    );
    t.insert(
        "Chassis",
        row([
            ("name", name.into()),
            ("hostname", name.into()),
            ("encaps", (&e).into()),
            ("other_config", Datum::str_map([("is-remote", "true")])),
        ]),
    );
}

/// Asserts that the client's replica of `tables` equals an `ovsdb-client dump` of the server,
/// comparing datums (not JSON text, whose set order differs).
pub fn assert_cache_matches_dump(db: &Db, srv: &OvsdbServer, tables: &[&str]) {
    let dump = srv.dump(tables).expect("dump");
    let cache = db.cache();
    for t in tables {
        let tc = cache
            .table(t)
            .unwrap_or_else(|| panic!("table {t} not cached"));
        let rows = dump[t].as_object().expect("dump rows");
        let mut want: BTreeMap<String, BTreeMap<String, Datum>> = BTreeMap::new();
        for (uuid, cols) in rows {
            let mut m = BTreeMap::new();
            for (c, v) in cols.as_object().expect("cols") {
                let Some(i) = tc.columns().index_of(c) else {
                    continue;
                };
                m.insert(
                    c.clone(),
                    Datum::from_json(v, &tc.columns().types[i]).expect("dump datum"),
                );
            }
            want.insert(uuid.clone(), m);
        }
        let mut got: BTreeMap<String, BTreeMap<String, Datum>> = BTreeMap::new();
        for r in tc.rows() {
            let mut m = BTreeMap::new();
            for (i, c) in tc.columns().names.iter().enumerate() {
                if want.values().next().is_none_or(|w| w.contains_key(c)) {
                    m.insert(c.clone(), r.row.values()[i].clone());
                }
            }
            got.insert(r.uuid.to_string(), m);
        }
        assert_eq!(got, want, "table {t}: cache differs from the server's dump");
    }
}

pub async fn connect(srv: &OvsdbServer) -> Client {
    Client::connect(&srv.endpoint(), fast_opts())
        .await
        .expect("connect")
}
