//! `ovnk-bench ovsdb`: the OVSDB client against Open vSwitch's own tools, on real servers.
//!
//! (a) Insert N Chassis rows, each with one geneve Encap (`other_config:is-remote=true`), in
//!     one transaction: this client (connect included) vs `ovn-sbctl` (one process, one
//!     transaction), and vs the server's floor: the same request, built beforehand, written on
//!     a raw socket and its reply read to the end. Each on a fresh ovsdb-server.
//! (b) A full monitor of those rows into the typed cache (connect, schema check, monitor,
//!     typed conversion of every row) vs `ovsdb-client dump -f json` of the database (whose
//!     only non-empty tables are Chassis and Encap), and vs
//!     the floor: a raw socket that sends the same monitor request and only reads the reply
//!     bytes to the end of the message.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::BytesMut;
use ovn_model::{Chassis, Encap, Model, SB_DB, TxnExt, TypedCache};
use ovsdb::codec::JsonFramer;
use ovsdb::{Client, ClientOptions, Datum, Txn};
use ovsdb_harness::{OvsdbServer, Schema};
use serde_json::json;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of Chassis (each with one Encap).
    #[arg(long, default_value_t = 5000)]
    rows: usize,
    /// Runs; each measures the compared things back to back (in a rotating order), and the
    /// median of each figure is reported.
    #[arg(long, default_value_t = 15)]
    runs: usize,
    /// Also print where the monitor's time goes.
    #[arg(long)]
    profile: bool,
}

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

async fn client_insert(srv: &OvsdbServer, rows: usize) -> Result<Duration> {
    let t0 = Instant::now();
    let c = Client::connect(&srv.endpoint(), ClientOptions::default()).await?;
    let t = insert_txn(rows);
    c.transact(&t).await?;
    Ok(t0.elapsed())
}

/// Where the client insert's time goes (printed with --profile).
async fn profile_insert(srv: &OvsdbServer, rows: usize) -> Result<()> {
    let t0 = Instant::now();
    let c = Client::connect(&srv.endpoint(), ClientOptions::default()).await?;
    let t1 = Instant::now();
    let t = insert_txn(rows);
    let t2 = Instant::now();
    c.transact(&t).await?;
    let t3 = Instant::now();
    println!(
        "  client insert: connect {:.1} ms, build {:.1} ms, transact {:.1} ms",
        ms(t1 - t0),
        ms(t2 - t1),
        ms(t3 - t2)
    );
    Ok(())
}

fn insert_txn(rows: usize) -> Txn {
    let mut t = Txn::new(SB_DB);
    for i in 0..rows {
        let name = format!("ch{i}");
        let e = t.insert_model(
            &Encap {
                kind: "geneve".into(),
                ip: ip(i),
                chassis_name: name.clone(),
                options: [("csum".into(), "true".into())].into(),
                ..Default::default()
            },
            &[],
        );
        t.insert_model(
            &Chassis {
                hostname: name.clone(),
                name,
                other_config: [("is-remote".into(), "true".into())].into(),
                ..Default::default()
            },
            &[("encaps", Datum::from(&e))],
        );
    }
    t
}

fn sbctl_insert(srv: &OvsdbServer, rows: usize) -> Result<Duration> {
    let mut args: Vec<String> = vec![
        format!("--db={}", srv.endpoint()),
        "--no-leader-only".into(),
    ];
    for i in 0..rows {
        // The same rows as the client writes, 15 words each (as in ../shared/reference/ovn-sandbox.md §3).
        let name = format!("ch{i}");
        args.extend([
            "--".into(),
            format!("--id=@e{i}"),
            "create".into(),
            "Encap".into(),
            "type=geneve".into(),
            format!("ip={}", ip(i)),
            format!("chassis_name={name}"),
            "options:csum=true".into(),
        ]);
        args.extend([
            "--".into(),
            "create".into(),
            "Chassis".into(),
            format!("name={name}"),
            format!("hostname={name}"),
            format!("encaps=@e{i}"),
            "other_config:is-remote=true".into(),
        ]);
    }
    let t0 = Instant::now();
    let out = Command::new("ovn-sbctl")
        .args(&args)
        .output()
        .context("run ovn-sbctl (install ovn-central)")?;
    let d = t0.elapsed();
    if !out.status.success() {
        bail!("ovn-sbctl: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(d)
}

async fn client_monitor(srv: &OvsdbServer, rows: usize) -> Result<Duration> {
    let t0 = Instant::now();
    let c = Client::connect(&srv.endpoint(), ClientOptions::default()).await?;
    let db = ovn_model::connect_db(&c, SB_DB, &[Chassis::NEEDS, Encap::NEEDS]).await?;
    let (nc, ne) = {
        let cache = db.cache();
        (cache.list::<Chassis>().len(), cache.list::<Encap>().len())
    };
    let d = t0.elapsed();
    if nc != rows || ne != rows {
        bail!("monitor saw {nc} chassis / {ne} encaps, expected {rows}");
    }
    Ok(d)
}

fn dump(srv: &OvsdbServer) -> Result<Duration> {
    let t0 = Instant::now();
    let out = Command::new("ovsdb-client")
        // One process; `dump` takes a single table, and the database's only non-empty tables
        // are Chassis and Encap, so the whole-database dump is the dump of those two.
        .args(["-f", "json", "dump", &srv.endpoint(), SB_DB])
        .output()
        .context("run ovsdb-client")?;
    let d = t0.elapsed();
    if !out.status.success() {
        bail!(
            "ovsdb-client dump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(d)
}

/// One request written on a raw unix socket and its reply read to the end of the message: no
/// client library, the request built beforehand.
struct RawExchange {
    /// Until the last reply byte.
    total: Duration,
    /// Until the request was written.
    written: Duration,
    /// Until the first reply byte.
    first_byte: Duration,
    reply: BytesMut,
}

fn raw_exchange(srv: &OvsdbServer, request: &[u8]) -> Result<RawExchange> {
    let t0 = Instant::now();
    let mut s = UnixStream::connect(srv.socket_path())?;
    s.write_all(request)?;
    let written = t0.elapsed();
    let mut framer = JsonFramer::new(usize::MAX);
    let mut buf = BytesMut::with_capacity(4 << 20);
    let mut chunk = vec![0u8; 1 << 20];
    let mut first = None;
    loop {
        let n = s.read(&mut chunk)?;
        if n == 0 {
            bail!("server closed before the reply ended");
        }
        first.get_or_insert_with(|| t0.elapsed());
        buf.extend_from_slice(&chunk[..n]);
        if let Some(len) = framer.scan(&mut buf)? {
            let total = t0.elapsed();
            buf.truncate(len);
            return Ok(RawExchange {
                total,
                written,
                first_byte: first.unwrap_or_default(),
                reply: buf,
            });
        }
    }
}

/// The monitor request this client sends for Chassis and Encap.
fn monitor_request() -> Result<Vec<u8>> {
    let cols = |n: &ovsdb::TableNeeds| n.columns.iter().map(|(c, _)| *c).collect::<Vec<_>>();
    let req = json!({"id": 1, "method": "monitor_cond_since", "params": [SB_DB, SB_DB, {
        "Chassis": [{"columns": cols(&Chassis::NEEDS)}],
        "Encap": [{"columns": cols(&Encap::NEEDS)}],
    }, "00000000-0000-0000-0000-000000000000"]});
    Ok(serde_json::to_vec(&req)?)
}

/// The floor: the same monitor request on a raw socket, the reply read to its end.
fn floor(srv: &OvsdbServer) -> Result<(Duration, usize)> {
    let x = raw_exchange(srv, &monitor_request()?)?;
    Ok((x.total, x.reply.len()))
}

/// The `result` of a captured reply, found as the client finds it (the envelope parse).
fn response_result(bytes: &[u8]) -> Result<&serde_json::value::RawValue> {
    match ovsdb::rpc::Incoming::parse(bytes)? {
        ovsdb::rpc::Incoming::Response {
            result: Some(r), ..
        } => Ok(r),
        _ => bail!("the captured reply is not a response with a result"),
    }
}

/// Client-side cost of a captured reply, stage by stage as the client does it: the envelope,
/// one walk splitting the result into rows, the rows decoded into the replica, typed rows.
/// Each stage's median over 15 repetitions on the same bytes (no server in the loop).
fn profile_pipeline(srv: &OvsdbServer, schema: &ovsdb::DbSchema) -> Result<()> {
    let bytes = raw_exchange(srv, &monitor_request()?)?.reply;
    let schema = std::sync::Arc::new(schema.clone());
    let mut stages: [Vec<f64>; 4] = Default::default();
    let mut n = 0;
    for _ in 0..15 {
        let t0 = Instant::now();
        let result = response_result(&bytes)?;
        let t1 = Instant::now();
        let (_found, _id, upd): (bool, String, ovsdb::TableUpdates<'_>) =
            serde_json::from_str(result.get())?;
        let t2 = Instant::now();
        let mut cache = ovsdb::DbCache::new(
            schema.clone(),
            &[("Chassis".into(), None), ("Encap".into(), None)],
        );
        cache.apply_table_updates(upd)?;
        let t3 = Instant::now();
        n = cache.list::<Chassis>().len() + cache.list::<Encap>().len();
        let t4 = Instant::now();
        for (v, d) in stages.iter_mut().zip([t1 - t0, t2 - t1, t3 - t2, t4 - t3]) {
            v.push(ms(d));
        }
    }
    let [a, b, c, d] = stages.map(median);
    println!(
        "  pipeline on {} bytes (median of 15): envelope {a:.1} ms, split into rows {b:.1} ms, decode into replica {c:.1} ms, typed {n} rows {d:.1} ms",
        bytes.len(),
    );
    Ok(())
}

/// The insert's server-side floor: the same `transact` request, built beforehand, on a raw
/// socket. Returns the exchange and the transaction (to check the reply with).
fn raw_insert(srv: &OvsdbServer, rows: usize) -> Result<(RawExchange, Txn)> {
    let txn = insert_txn(rows);
    let params = txn.params_bytes();
    let mut req = Vec::with_capacity(params.len() + 64);
    req.extend_from_slice(br#"{"id":1,"method":"transact","params":"#);
    req.extend_from_slice(&params);
    req.push(b'}');
    Ok((raw_exchange(srv, &req)?, txn))
}

/// Time to the first byte and to the last byte of the monitor reply on a raw socket.
fn floor_ttfb(srv: &OvsdbServer) -> Result<(Duration, Duration)> {
    let x = raw_exchange(srv, &monitor_request()?)?;
    Ok((x.first_byte, x.total))
}

/// Where the monitor's time goes (printed with --profile).
async fn profile_monitor(srv: &OvsdbServer) -> Result<()> {
    let t0 = Instant::now();
    let c = Client::connect(&srv.endpoint(), ClientOptions::default()).await?;
    let t1 = Instant::now();
    let schema = c.get_schema(SB_DB).await?;
    let t2 = Instant::now();
    let db = c
        .monitor(SB_DB, ovsdb::MonitorSpec::tables(["Chassis", "Encap"]))
        .await?;
    let t3 = Instant::now();
    let n = db.cache().list::<Chassis>().len() + db.cache().list::<Encap>().len();
    let t4 = Instant::now();
    println!(
        "  profile: connect {:.1} ms, get_schema {:.1} ms ({} tables), monitor incl. 2nd get_schema {:.1} ms, typed list of {n} rows {:.1} ms",
        ms(t1 - t0),
        ms(t2 - t1),
        schema.tables.len(),
        ms(t3 - t2),
        ms(t4 - t3)
    );
    Ok(())
}

/// Per-run figures; each run measures the compared things back to back, in a rotating order
/// (so no side always follows the same other). Ratios are ratios of the medians: on this
/// shared machine the noise is per measurement (the two sides of a run are not correlated),
/// and the median of each side cancels more of it than a median of per-run ratios.
struct Series {
    runs: Vec<[f64; 3]>,
}

impl Series {
    fn median(&self, i: usize) -> f64 {
        median(self.runs.iter().map(|r| r[i]).collect())
    }
}

/// Pause between two measurements.
const SETTLE: Duration = Duration::from_millis(50);

/// Runs the three measurements of one run in the order given by `run` (a rotation).
fn rotated<T>(run: usize, steps: [&mut dyn FnMut() -> Result<T>; 3]) -> Result<[T; 3]>
where
    T: Default + Copy,
{
    let mut out = [T::default(); 3];
    for k in 0..3 {
        let i = (run + k) % 3;
        // Let the previous measurement's teardown (a closed session's monitor freed by the
        // server, a stopped server exiting) finish before the next one starts.
        std::thread::sleep(SETTLE);
        out[i] = (steps[i])()?;
    }
    Ok(out)
}

pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let rows = a.rows;
    let runs = a.runs.max(1);
    println!(
        "ovsdb bench: {rows} Chassis + {rows} Encap, {runs} runs, each on fresh servers, in a rotating order"
    );

    let mut insert = Series { runs: Vec::new() };
    for r in 0..runs {
        // Each measurement on its own fresh server.
        let run = rotated(
            r,
            [
                &mut || {
                    let srv = OvsdbServer::start(Schema::Southbound)?;
                    Ok(ms(rt.block_on(client_insert(&srv, rows))?))
                },
                &mut || {
                    Ok(ms(sbctl_insert(
                        &OvsdbServer::start(Schema::Southbound)?,
                        rows,
                    )?))
                },
                &mut || {
                    let srv = OvsdbServer::start(Schema::Southbound)?;
                    Ok(ms(raw_insert(&srv, rows)?.0.total))
                },
            ],
        )?;
        println!(
            "  run {r}: insert client {:.1} ms, ovn-sbctl {:.1} ms, raw request (server floor) {:.1} ms",
            run[0], run[1], run[2]
        );
        insert.runs.push(run);
    }

    let srv = OvsdbServer::start(Schema::Southbound)?;
    rt.block_on(client_insert(&srv, rows))?;
    if a.profile {
        let schema = rt.block_on(async {
            let c = Client::connect(&srv.endpoint(), ClientOptions::default()).await?;
            c.get_schema(SB_DB).await
        })?;
        for _ in 0..3 {
            let t0 = Instant::now();
            let t = insert_txn(rows);
            let t1 = Instant::now();
            let b = t.params_bytes();
            println!(
                "  insert txn: build {:.1} ms, serialize {:.1} ms ({} bytes)",
                ms(t1 - t0),
                ms(t1.elapsed()),
                b.len()
            );
            rt.block_on(profile_monitor(&srv))?;
            profile_pipeline(&srv, &schema)?;
            let (first, last) = floor_ttfb(&srv)?;
            println!(
                "  raw monitor reply: first byte {:.1} ms, last byte {:.1} ms",
                ms(first),
                ms(last)
            );
            let fresh = OvsdbServer::start(Schema::Southbound)?;
            let (x, txn) = raw_insert(&fresh, rows)?;
            // The client's work on the reply: the envelope, then the op-by-op check.
            let t0 = Instant::now();
            let result = response_result(&x.reply)?;
            let checked = txn.check_results(result)?;
            let check = t0.elapsed();
            let fresh3 = OvsdbServer::start(Schema::Southbound)?;
            rt.block_on(profile_insert(&fresh3, rows))?;
            println!(
                "  raw insert (server floor): written {:.1} ms, first reply byte {:.1} ms, total {:.1} ms; reply ({} bytes, {} results) parsed and checked in {:.1} ms",
                ms(x.written),
                ms(x.first_byte),
                ms(x.total),
                x.reply.len(),
                checked.results.len(),
                ms(check),
            );
        }
    }
    let mut monitor = Series { runs: Vec::new() };
    let mut reply_bytes = 0;
    for r in 0..runs {
        let run = rotated(
            r,
            [
                &mut || Ok(ms(rt.block_on(client_monitor(&srv, rows))?)),
                &mut || Ok(ms(dump(&srv)?)),
                &mut || {
                    let (f, len) = floor(&srv)?;
                    reply_bytes = len;
                    Ok(ms(f))
                },
            ],
        )?;
        println!(
            "  run {r}: monitor->typed cache {:.1} ms, ovsdb-client dump {:.1} ms, raw floor {:.1} ms",
            run[0], run[1], run[2]
        );
        monitor.runs.push(run);
    }
    let (insert_ms, sbctl_insert_ms, insert_floor_ms) =
        (insert.median(0), insert.median(1), insert.median(2));
    let insert_ratio = insert_ms / sbctl_insert_ms;
    let insert_floor_ratio = insert_ms / insert_floor_ms;
    let (monitor_ms, dump_ms, floor_ms) = (monitor.median(0), monitor.median(1), monitor.median(2));
    let monitor_ratio = monitor_ms / dump_ms;
    let floor_ratio = monitor_ms / floor_ms;
    println!(
        "insert {rows} chassis+encap, one txn: client {insert_ms:.1} ms vs ovn-sbctl {sbctl_insert_ms:.1} ms -> ratio {insert_ratio:.2} (target <= 0.5); vs the same request on a raw socket {insert_floor_ms:.1} ms -> {insert_floor_ratio:.2}"
    );
    println!(
        "full monitor into typed cache: {monitor_ms:.1} ms vs dump {dump_ms:.1} ms -> {monitor_ratio:.2} (target <= 0.9); vs raw floor {floor_ms:.1} ms ({reply_bytes} bytes) -> {floor_ratio:.2} (target <= 1.25)"
    );
    println!(
        "{}",
        json!({
            "bench": "ovsdb", "rows": rows, "runs": runs,
            "insert_ms": insert_ms, "sbctl_insert_ms": sbctl_insert_ms, "insert_ratio": insert_ratio,
            "insert_floor_ms": insert_floor_ms, "insert_floor_ratio": insert_floor_ratio,
            "monitor_ms": monitor_ms, "dump_ms": dump_ms, "monitor_ratio": monitor_ratio,
            "floor_ms": floor_ms, "floor_ratio": floor_ratio, "reply_bytes": reply_bytes,
        })
    );
    Ok(())
}
