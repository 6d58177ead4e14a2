//! Bad input from the server never panics the client: each case yields a clear error or is
//! ignored with a log line, and the client keeps working where that is possible.

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::*;
use ovsdb::codec::JsonFramer;
use ovsdb::{Client, ClientOptions, ConnState, Error, MonitorSpec};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;
use tokio_util::codec::Decoder;

type Handler = Box<dyn FnMut(&Value) -> Vec<Vec<u8>> + Send>;

/// A scripted server: `greeting` is written on connect, then `handler` answers each message.
struct Fake {
    _dir: tempfile::TempDir,
    endpoint: String,
    seen: tokio::sync::mpsc::UnboundedReceiver<Value>,
}

fn fake(greeting: Vec<u8>, mut handler: Handler) -> Fake {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("fake.sock");
    let listener = UnixListener::bind(&path).expect("bind");
    let (seen_tx, seen) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            if !greeting.is_empty() && s.write_all(&greeting).await.is_err() {
                continue;
            }
            let mut framer = JsonFramer::new(1 << 20);
            let mut buf = BytesMut::new();
            'conn: loop {
                let mut chunk = [0u8; 4096];
                let n = match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Ok(Some(frame)) = framer.decode(&mut buf) {
                    let Ok(msg) = serde_json::from_slice::<Value>(&frame) else {
                        break 'conn;
                    };
                    let _ = seen_tx.send(msg.clone());
                    for out in handler(&msg) {
                        if out.is_empty() {
                            // An empty write means: hang up.
                            break 'conn;
                        }
                        if s.write_all(&out).await.is_err() {
                            break 'conn;
                        }
                    }
                }
            }
        }
    });
    Fake {
        endpoint: format!("unix:{}", path.display()),
        _dir: dir,
        seen,
    }
}

fn reply(req: &Value, result: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": req["id"], "result": result, "error": null})).expect("ser")
}

fn method(req: &Value) -> &str {
    req["method"].as_str().unwrap_or("")
}

fn opts() -> ClientOptions {
    ClientOptions {
        backoff_initial: Duration::from_secs(30),
        inactivity_probe: None,
        connect_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

async fn lost_reason(f: Handler, greeting: Vec<u8>, o: ClientOptions) -> String {
    init_logs();
    let srv = fake(greeting, f);
    let c = Client::connect(&srv.endpoint, o).await.expect("connect");
    match c.echo().await {
        Err(Error::Disconnected { reason, .. }) => reason,
        Err(Error::NotConnected(reason)) => reason,
        other => panic!("expected the connection to drop, got {other:?}"),
    }
}

#[tokio::test]
async fn truncated_frame() {
    let r = lost_reason(
        Box::new(|_| vec![br#"{"id":1,"result":["#.to_vec(), vec![]]),
        vec![],
        opts(),
    )
    .await;
    assert!(r.contains("ended inside a message"), "{r}");
}

#[tokio::test]
async fn invalid_json() {
    let r = lost_reason(
        Box::new(|_| vec![br#"{"id":1 "result":[]}"#.to_vec()]),
        vec![],
        opts(),
    )
    .await;
    assert!(r.contains("invalid JSON"), "{r}");
}

#[tokio::test]
async fn oversized_message() {
    let o = ClientOptions {
        max_message_bytes: 1024,
        ..opts()
    };
    let big = format!(
        r#"{{"id":1,"result":["{}"],"error":null}}"#,
        "x".repeat(4096)
    );
    let r = lost_reason(Box::new(move |_| vec![big.clone().into_bytes()]), vec![], o).await;
    assert!(r.contains("exceeds the maximum size of 1024 bytes"), "{r}");
}

#[tokio::test]
async fn reply_for_unknown_id_and_non_object_messages_are_ignored() {
    init_logs();
    let srv = fake(
        vec![],
        Box::new(|req| {
            vec![
                br#"{"id":987654,"result":[],"error":null}"#.to_vec(),
                br#"{"id":"not-ours","result":[],"error":null}"#.to_vec(),
                br#"[1,2,3]"#.to_vec(),
                br#"{"neither":"request nor reply"}"#.to_vec(),
                reply(req, json!(["pong"])),
            ]
        }),
    );
    let c = Client::connect(&srv.endpoint, opts())
        .await
        .expect("connect");
    let v = c
        .request("echo", json!(["x"]))
        .await
        .expect("the real reply still arrives");
    assert_eq!(v, json!(["pong"]));
    assert_eq!(c.state(), ConnState::Connected);
}

#[tokio::test]
async fn server_echo_is_answered() {
    init_logs();
    let greeting = br#"{"id":"srv-1","method":"echo","params":["ping",7]}"#.to_vec();
    let mut srv = fake(greeting, Box::new(|_| vec![]));
    let _c = Client::connect(&srv.endpoint, opts())
        .await
        .expect("connect");
    let got = tokio::time::timeout(Duration::from_secs(5), srv.seen.recv())
        .await
        .expect("answer")
        .expect("msg");
    assert_eq!(
        got,
        json!({"id": "srv-1", "result": ["ping", 7], "error": null})
    );
}

#[tokio::test]
async fn inactivity_probe_drops_a_silent_server() {
    init_logs();
    // Never answers anything, not even echo.
    let srv = fake(vec![], Box::new(|_| vec![]));
    let o = ClientOptions {
        inactivity_probe: Some(Duration::from_millis(200)),
        ..opts()
    };
    let c = Client::connect(&srv.endpoint, o).await.expect("connect");
    let mut st = c.state_watch();
    let s = tokio::time::timeout(
        Duration::from_secs(10),
        st.wait_for(|s| matches!(s, ConnState::Backoff(_))),
    )
    .await
    .expect("probe fires")
    .expect("state")
    .clone();
    match s {
        ConnState::Backoff(r) => assert!(r.contains("inactivity probe"), "{r}"),
        other => panic!("{other:?}"),
    }
}

const SCHEMA: &str = r#"{"name":"Fake","version":"1.0.0","tables":{
  "T":{"columns":{"name":{"type":"string"},"n":{"type":"integer"},
                  "tags":{"type":{"key":"string","min":0,"max":"unlimited"}}},"isRoot":true}}}"#;

const U1: &str = "11111111-1111-1111-1111-111111111111";
const U2: &str = "22222222-2222-2222-2222-222222222222";
const U3: &str = "33333333-3333-3333-3333-333333333333";

/// A server without monitor_cond_since (like ovsdb-server before 2.12), whose updates carry an
/// unknown table and a row of the wrong type next to valid rows.
#[tokio::test]
async fn fallback_unknown_table_and_bad_rows_in_updates() {
    init_logs();
    let srv = fake(
        vec![],
        Box::new(|req| match method(req) {
            "get_schema" => vec![reply(req, serde_json::from_str(SCHEMA).expect("schema"))],
            "monitor_cond_since" => {
                vec![
                    serde_json::to_vec(
                        &json!({"id": req["id"], "result": null, "error": "unknown method"}),
                    )
                    .expect("ser"),
                ]
            }
            "monitor_cond" => vec![
                reply(req, json!({"T": {U1: {"initial": {"name": "a", "n": 1}}}})),
                serde_json::to_vec(
                    &json!({"id": null, "method": "update2", "params": ["Fake", {
                        "Bogus": {U3: {"insert": {"x": 1}}},
                        "T": {
                            U2: {"insert": {"name": "b", "tags": ["set", ["x", "y"]]}},
                            U3: {"insert": {"name": 42}},
                            "not-a-uuid": {"insert": {"name": "c"}}
                        }
                    }]}),
                )
                .expect("ser"),
                serde_json::to_vec(
                    &json!({"id": null, "method": "update2", "params": ["Fake", "garbage"]}),
                )
                .expect("ser"),
                serde_json::to_vec(
                    &json!({"id": null, "method": "update2", "params": ["Fake", {
                        "T": {U2: {"modify": {"tags": ["set", ["y", "z"]], "n": 5}}}
                    }]}),
                )
                .expect("ser"),
            ],
            _ => vec![reply(req, json!([]))],
        }),
    );
    let c = Client::connect(&srv.endpoint, opts())
        .await
        .expect("connect");
    let db = c
        .monitor("Fake", MonitorSpec::tables(["T"]))
        .await
        .expect("monitor falls back");
    assert_eq!(db.sync_state().method, Some("monitor_cond"));
    db.wait_until(|c| {
        c.table("T").and_then(|t| {
            t.get(&U2.parse().expect("uuid"))
                .and_then(|r| r.get("n").cloned())
        }) == Some(ovsdb::Datum::scalar(5))
    })
    .await;
    let cache = db.cache();
    let t = cache.table("T").expect("T");
    assert_eq!(t.len(), 2, "the valid rows a and b, not the mistyped one");
    let b = t.get(&U2.parse().expect("uuid")).expect("b");
    assert_eq!(
        b.get("tags"),
        Some(&ovsdb::Datum::set(["x", "z"])),
        "set diff applied as symmetric difference"
    );
    assert_eq!(c.state(), ConnState::Connected);
}

/// A modify for a row the replica does not hold means the replica cannot be trusted: the
/// client drops the connection and starts over with a full resync.
#[tokio::test]
async fn inconsistent_update_forces_a_resync() {
    init_logs();
    let mut calls = 0;
    let srv = fake(
        vec![],
        Box::new(move |req| match method(req) {
            "get_schema" => vec![reply(req, serde_json::from_str(SCHEMA).expect("schema"))],
            "monitor_cond_since" => {
                calls += 1;
                let mut out = vec![reply(
                    req,
                    json!([false, "00000000-0000-0000-0000-000000000000", {"T": {U1: {"initial": {"name": "a"}}}}]),
                )];
                if calls == 1 {
                    out.push(
                        serde_json::to_vec(
                            &json!({"id": null, "method": "update3", "params": ["Fake", U3, {
                                "T": {U2: {"modify": {"n": 3}}}
                            }]}),
                        )
                        .expect("ser"),
                    );
                }
                out
            }
            _ => vec![reply(req, json!([]))],
        }),
    );
    let o = ClientOptions {
        backoff_initial: Duration::from_millis(20),
        ..opts()
    };
    let c = Client::connect(&srv.endpoint, o).await.expect("connect");
    let db = c
        .monitor("Fake", MonitorSpec::tables(["T"]))
        .await
        .expect("monitor");
    let mut rx = db.subscribe();
    tokio::time::timeout(
        Duration::from_secs(10),
        rx.wait_for(|s| s.full_syncs >= 2 && s.synced),
    )
    .await
    .expect("resynced")
    .expect("state");
    assert_eq!(db.cache().table("T").map(|t| t.len()), Some(1));
}

/// An update that races ahead of its monitor's reply is kept and applied after the reply.
#[tokio::test]
async fn update_before_the_monitor_reply_is_not_lost() {
    init_logs();
    let srv = fake(
        vec![],
        Box::new(|req| match method(req) {
            "get_schema" => vec![reply(req, serde_json::from_str(SCHEMA).expect("schema"))],
            "monitor_cond_since" => vec![
                serde_json::to_vec(
                    &json!({"id": null, "method": "update3", "params": ["Fake", U3, {
                        "T": {U2: {"insert": {"name": "raced"}}}
                    }]}),
                )
                .expect("ser"),
                reply(
                    req,
                    json!([false, U3, {"T": {U1: {"initial": {"name": "a"}}}}]),
                ),
            ],
            _ => vec![reply(req, json!([]))],
        }),
    );
    let c = Client::connect(&srv.endpoint, opts())
        .await
        .expect("connect");
    let db = c
        .monitor("Fake", MonitorSpec::tables(["T"]))
        .await
        .expect("monitor");
    let cache = db.cache();
    let t = cache.table("T").expect("T");
    assert_eq!(t.len(), 2, "initial row and the raced insert");
    assert!(t.get(&U2.parse().expect("uuid")).is_some());
}
