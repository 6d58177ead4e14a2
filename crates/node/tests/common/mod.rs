//! Shared helpers: real ovsdb-servers, a real ovn-northd, plan fixtures.
#![allow(dead_code)]

pub mod cluster;

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use node::plan::LocalNode;
use node::snapshot::NodeInfo;
use ovsdb::{Client, ClientOptions, Db, DbCache};
use ovsdb_harness::OvsdbServer;

pub fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter("info,node=debug")
        .try_init();
}

/// A foreground ovn-northd, killed by PID and reaped when dropped.
pub struct Northd {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Northd {
    pub fn start(nb: &OvsdbServer, sb: &OvsdbServer) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let child = Command::new("ovn-northd")
            .arg(format!("--ovnnb-db={}", nb.endpoint()))
            .arg(format!("--ovnsb-db={}", sb.endpoint()))
            .arg(format!(
                "--unixctl={}",
                dir.path().join("northd.ctl").display()
            ))
            .arg(format!(
                "--log-file={}",
                dir.path().join("northd.log").display()
            ))
            .arg("-vsyslog:off")
            .arg("-vconsole:off")
            .arg("--no-chdir")
            .env("OVN_RUNDIR", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn ovn-northd");
        Northd { child, _dir: dir }
    }
}

impl Drop for Northd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn fast_opts() -> ClientOptions {
    ClientOptions {
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        ..ClientOptions::default()
    }
}

/// A client and its replica of `db` with everything ovnk monitors.
pub async fn replica(srv: &OvsdbServer) -> (Client, Arc<Db>) {
    let c = Client::connect(&srv.endpoint(), fast_opts())
        .await
        .expect("connect");
    let needs = match srv.db_name() {
        "OVN_Northbound" => ovn_model::nb_needs(),
        "OVN_Southbound" => ovn_model::sb_needs(),
        _ => ovn_model::ovs_needs(),
    };
    let db = ovn_model::connect_db(&c, srv.db_name(), &needs)
        .await
        .expect("monitor");
    db.wait_synced().await;
    (c, db)
}

pub async fn wait_for(db: &Db, what: &str, pred: impl FnMut(&DbCache) -> bool) {
    if tokio::time::timeout(Duration::from_secs(20), db.wait_until(pred))
        .await
        .is_err()
    {
        panic!("timed out waiting for {what}");
    }
}

/// A Node with every cluster-manager and node annotation, as the plan sees it.
pub fn node(name: &str, id: u8, zones: &[&str]) -> NodeInfo {
    NodeInfo {
        name: name.into(),
        id: Some(u32::from(id)),
        subnet: format!("10.244.{id}.0/24").parse().ok(),
        transit: format!("100.88.0.{id}/16").parse().ok(),
        join: format!("100.64.0.{id}/16").parse().ok(),
        chassis_id: Some(format!("ch-{name}")),
        encap_ips: vec![IpAddr::V4(Ipv4Addr::new(172, 16, 0, id))],
        zones: zones
            .iter()
            .map(|z| (*z).to_owned())
            .collect::<BTreeSet<_>>(),
        internal_ip: Some(IpAddr::V4(Ipv4Addr::new(172, 16, 0, id))),
        errors: Vec::new(),
    }
}

pub fn local(name: &str) -> LocalNode {
    LocalNode {
        name: name.into(),
        system_id: format!("ch-{name}"),
        encap_ip: None,
        primary_ifaddr: None,
        gateway_interface: Some("br-phy".into()),
        mtu: 1400,
        cluster_cidr: "10.244.0.0/16".parse().expect("cidr"),
        transit_cidr: "100.88.0.0/16".parse().expect("cidr"),
        join_cidr: "100.64.0.0/16".parse().expect("cidr"),
        enforcement: Default::default(),
    }
}

/// A dump of what ovnk writes, made with `ovsdb-client dump` (independent of ovnk's client),
/// as comparable text rows: `table|key columns`, UUIDs left out.
pub fn summary(srv: &OvsdbServer) -> BTreeSet<String> {
    let tables: &[&str] = if srv.db_name() == "OVN_Northbound" {
        &[
            "Logical_Router",
            "Logical_Router_Port",
            "Logical_Router_Static_Route",
            "Logical_Switch",
            "Logical_Switch_Port",
        ]
    } else {
        &["Chassis", "Encap"]
    };
    let dump = srv.dump(tables).expect("dump");
    let mut out = BTreeSet::new();
    for t in tables {
        let Some(rows) = dump[*t].as_object() else {
            continue;
        };
        for cols in rows.values() {
            let g = |c: &str| render(&cols[c]);
            let line = match *t {
                "Logical_Router" => format!("LR|{}|{}", g("name"), g("external_ids")),
                "Logical_Router_Port" => {
                    format!(
                        "LRP|{}|{}|{}|{}",
                        g("name"),
                        g("mac"),
                        g("networks"),
                        g("options")
                    )
                }
                "Logical_Router_Static_Route" => format!(
                    "ROUTE|{}|{}|{}",
                    g("ip_prefix"),
                    g("nexthop"),
                    g("external_ids")
                ),
                "Logical_Switch" => format!("LS|{}|{}", g("name"), g("other_config")),
                "Logical_Switch_Port" => format!(
                    "LSP|{}|{}|{}|{}|{}",
                    g("name"),
                    g("type"),
                    g("addresses"),
                    g("options"),
                    g("external_ids")
                ),
                "Chassis" => format!(
                    "CHASSIS|{}|{}|{}|{}",
                    g("name"),
                    g("hostname"),
                    g("other_config"),
                    g("transport_zones")
                ),
                "Encap" => format!(
                    "ENCAP|{}|{}|{}|{}",
                    g("chassis_name"),
                    g("type"),
                    g("ip"),
                    g("options")
                ),
                _ => continue,
            };
            out.insert(line);
        }
    }
    out
}

/// Renders a wire datum with sets and maps sorted (UUID-free columns only).
fn render(v: &serde_json::Value) -> String {
    match v
        .as_array()
        .map(|a| (a.first().and_then(|x| x.as_str()), a.get(1)))
    {
        Some((Some("set"), Some(serde_json::Value::Array(items)))) => {
            let mut s: Vec<String> = items.iter().map(render).collect();
            s.sort();
            format!("[{}]", s.join(","))
        }
        Some((Some("map"), Some(serde_json::Value::Array(items)))) => {
            let m: BTreeMap<String, String> = items
                .iter()
                .filter_map(|p| p.as_array())
                .filter_map(|p| Some((render(p.first()?), render(p.get(1)?))))
                .collect();
            format!("{m:?}")
        }
        _ => match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        },
    }
}

/// `ovs-vsctl init` pointing the node's OVS at `sb`, userspace datapath.
pub fn ovs_init(ovs: &OvsdbServer, sb: &OvsdbServer) {
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
            &format!("external_ids:ovn-remote={}", sb.endpoint()),
            "external_ids:ovn-bridge-datapath-type=netdev",
        ],
    )
    .expect("ovs init");
}

/// ovs-vswitchd (userspace datapath only) inside `ns`, on `ovs`, with its files in `rundir`.
pub fn start_vswitchd(ns: &Netns, ovs: &OvsdbServer, rundir: &str) -> Proc {
    Proc {
        name: "ovs-vswitchd",
        child: Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.name,
                "ovs-vswitchd",
                &ovs.endpoint(),
                "--disable-system",
                &format!("--unixctl={rundir}/vswitchd.ctl"),
                &format!("--log-file={rundir}/vswitchd.log"),
                "-vconsole:off",
                "-vsyslog:off",
                "--no-chdir",
            ])
            .env("OVS_RUNDIR", rundir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("vswitchd"),
    }
}

/// ovn-controller on `ovs`, with its files in `rundir`.
pub fn start_controller(ovs: &OvsdbServer, rundir: &str) -> Proc {
    Proc {
        name: "ovn-controller",
        child: Command::new("ovn-controller")
            .args([
                ovs.endpoint().as_str(),
                &format!("--log-file={rundir}/controller.log"),
                "-vconsole:off",
                "-vsyslog:off",
                "--no-chdir",
            ])
            .env("OVS_RUNDIR", rundir)
            .env("OVN_RUNDIR", rundir)
            .env("OVN_SYSCONFDIR", rundir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("ovn-controller"),
    }
}

/// A child process killed by PID (SIGKILL) and reaped when dropped.
pub struct Proc {
    pub child: Child,
    pub name: &'static str,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A network namespace created by this test; deleted when dropped.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn create(tag: &str) -> Self {
        let name = format!("ovnkn-{tag}-{}", std::process::id());
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
        sh("ip", &["netns", "add", &name]);
        sh("ip", &["-n", &name, "link", "set", "lo", "up"]);
        Netns { name }
    }
    /// Runs `ip -n NS args…`, returning stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut a = vec!["-n", self.name.as_str()];
        a.extend_from_slice(args);
        sh("ip", &a)
    }
    /// Runs a command in the namespace; `None` when it fails.
    pub fn exec(&self, cmd: &str, args: &[&str]) -> Option<String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, cmd])
            .args(args)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

/// Runs a command that must succeed.
pub fn sh(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}
