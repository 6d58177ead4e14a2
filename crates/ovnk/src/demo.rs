//! `ovnk demo`: a narrated walkthrough on real OVN databases.
//!
//! Until the sandbox exists this shows the foundation everything else stands on: ovnk's OVSDB
//! client replicating a real Southbound database, writing remote chassis the way OVN
//! Interconnect does, following another writer live, surviving a server crash, and reporting
//! a refused transaction with the server's reason.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ovn_model::{Chassis, Encap, Model, SB_DB, TypedCache};
use ovsdb::{Client, ClientOptions, Condition, ConnState, Datum, Txn};
use ovsdb_harness::{OvsdbServer, Schema};

#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Pause between steps, for reading along.
    #[arg(long, env = "OVNK_DEMO_PAUSE_MS", default_value_t = 0)]
    pause_ms: u64,
}

struct Narrator {
    step: usize,
    pause: Duration,
    t0: Instant,
}

impl Narrator {
    fn step(&mut self, title: &str) {
        if self.step > 0 {
            std::thread::sleep(self.pause);
        }
        self.step += 1;
        println!(
            "\n[{:>6.2}s] ── step {}: {title}",
            self.t0.elapsed().as_secs_f64(),
            self.step
        );
    }
}

fn say(line: impl AsRef<str>) {
    println!("           {}", line.as_ref());
}

fn sbctl(srv: &OvsdbServer, args: &[&str]) -> Result<()> {
    let out = Command::new("ovn-sbctl")
        .arg(format!("--db={}", srv.endpoint()))
        .args(args)
        .output()
        .context("run ovn-sbctl (scripts/install-deps installs ovn-central)")?;
    if !out.status.success() {
        bail!(
            "ovn-sbctl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn chassis_table(client_db: &ovsdb::Db) -> Vec<String> {
    let cache = client_db.cache();
    let mut rows: Vec<String> = cache
        .list::<Chassis>()
        .into_iter()
        .map(|c| {
            let ips: Vec<String> = c
                .encaps
                .iter()
                .filter_map(|u| cache.get::<Encap>(u))
                .map(|e| e.ip)
                .collect();
            let tz = if c.transport_zones.is_empty() {
                String::new()
            } else {
                format!(
                    " zones={}",
                    c.transport_zones
                        .iter()
                        .cloned()
                        .collect::<Vec<_>>()
                        .join(",")
                )
            };
            format!(
                "{:<8} host={:<10} encap={:<12} is-remote={}{}",
                c.name,
                c.hostname,
                ips.join(","),
                c.other_config
                    .get("is-remote")
                    .map(String::as_str)
                    .unwrap_or("-"),
                tz
            )
        })
        .collect();
    rows.sort();
    rows
}

fn add_remote_chassis(t: &mut Txn, name: &str, ip: &str) {
    let e = t.insert(
        Encap::TABLE,
        Encap {
            kind: "geneve".into(),
            ip: ip.into(),
            chassis_name: name.into(),
            options: [("csum".into(), "true".into())].into(),
            ..Default::default()
        }
        .to_row(),
    );
    let mut row = Chassis {
        name: name.into(),
        hostname: name.into(),
        other_config: [("is-remote".into(), "true".into())].into(),
        ..Default::default()
    }
    .to_row();
    row.insert("encaps".into(), Datum::from(&e));
    t.insert(Chassis::TABLE, row);
}

pub async fn run(args: DemoArgs) -> Result<()> {
    let mut n = Narrator {
        step: 0,
        pause: Duration::from_millis(args.pause_ms),
        t0: Instant::now(),
    };
    println!("ovnk demo: the OVSDB foundation, on a real OVN Southbound database");

    n.step("start a real ovsdb-server with the OVN Southbound schema");
    let mut srv = OvsdbServer::start(Schema::Southbound).context("start ovsdb-server")?;
    say(format!(
        "ovsdb-server pid {} listening on {}",
        srv.pid().unwrap_or(0),
        srv.endpoint()
    ));

    n.step("connect, check the server's schema against ovnk's typed model, monitor Chassis+Encap");
    let opts = ClientOptions {
        backoff_initial: Duration::from_millis(800),
        ..ClientOptions::default()
    };
    let client = Client::connect(&srv.endpoint(), opts).await?;
    let schema = client.get_schema(SB_DB).await?;
    say(format!(
        "{} schema {}: every table and column ovnk needs is there",
        schema.name, schema.version
    ));
    let db = ovn_model::connect_db(&client, SB_DB, &ovn_model::sb_needs()).await?;
    say(format!(
        "replica live via {}",
        db.sync_state().method.unwrap_or("?")
    ));

    n.step("write three remote nodes as OVN Interconnect does: Chassis + Encap, one transaction");
    let mut t = Txn::new(SB_DB);
    for (i, name) in ["node2", "node3", "node4"].iter().enumerate() {
        add_remote_chassis(&mut t, name, &format!("172.18.0.{}", i + 2));
    }
    let t1 = Instant::now();
    client.transact(&t).await?;
    say(format!(
        "{} operations committed in {:.1} ms; the replica already holds them:",
        t.len(),
        t1.elapsed().as_secs_f64() * 1e3
    ));
    for r in chassis_table(&db) {
        say(format!("  {r}"));
    }

    n.step(
        "another process (ovn-sbctl) puts node3 into transport zone tenant-a; the replica follows",
    );
    sbctl(
        &srv,
        &["set", "chassis", "node3", "transport_zones=tenant-a"],
    )?;
    db.wait_until(|c| {
        c.named::<Chassis>("node3")
            .first()
            .is_some_and(|c| !c.transport_zones.is_empty())
    })
    .await;
    for r in chassis_table(&db) {
        say(format!("  {r}"));
    }

    n.step("crash: SIGKILL the server; while the client is away, node4 is deleted and node5 added");
    srv.kill();
    let mut st = client.state_watch();
    let _ = st.wait_for(|s| matches!(s, ConnState::Backoff(_))).await;
    say(format!(
        "client state: {:?}; reads keep serving the last consistent replica ({} chassis)",
        client.state(),
        chassis_table(&db).len()
    ));
    srv.restart()?;
    sbctl(&srv, &["chassis-del", "node4"])?;
    sbctl(&srv, &["chassis-add", "node5", "geneve", "172.18.0.5"])?;
    tokio::time::timeout(Duration::from_secs(20), db.wait_synced())
        .await
        .context("client did not reconnect")?;
    let s = db.sync_state();
    say(format!(
        "reconnected by itself: {} (a standalone server keeps no history, so the replica was rebuilt and swapped in at once)",
        if s.resumes > 0 {
            "resumed"
        } else {
            "full resync"
        }
    ));
    for r in chassis_table(&db) {
        say(format!("  {r}"));
    }

    n.step("a transaction the schema refuses: a Chassis without any Encap");
    let mut t = Txn::new(SB_DB);
    t.insert(
        Chassis::TABLE,
        Chassis {
            name: "bare".into(),
            hostname: "bare".into(),
            ..Default::default()
        }
        .to_row(),
    );
    match client.transact(&t).await {
        Ok(_) => bail!("the server accepted a Chassis without Encap"),
        Err(e) => say(format!("refused as expected: {e}")),
    }
    let mut t = Txn::new(SB_DB);
    t.delete(Chassis::TABLE, &[Condition::eq("name", "node2")]);
    client.transact(&t).await?;
    say(
        "and cleanup by name works: node2 deleted (its Encap goes with it, it is not a root table)",
    );

    n.step("stop");
    drop(client);
    srv.stop();
    say("ovsdb-server stopped by PID; its temp dir is removed");
    println!("\ndone in {:.2}s", n.t0.elapsed().as_secs_f64());
    Ok(())
}
