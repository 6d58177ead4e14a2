//! Helpers for the tests that run whole node stacks.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use ovsdb_harness::OvsdbServer;
use serde_json::json;

use super::Proc;

pub const DEADLINE: Duration = Duration::from_secs(45);

pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < DEADLINE {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for: {what}");
}

pub fn node_obj(name: &str, id: u8, agent_ran: bool) -> Node {
    let mut a = BTreeMap::from([
        ("k8s.ovn.org/node-id".to_owned(), id.to_string()),
        (
            "k8s.ovn.org/node-subnets".to_owned(),
            format!(r#"{{"default":["10.244.{id}.0/24"]}}"#),
        ),
        (
            "k8s.ovn.org/node-transit-switch-port-ifaddr".to_owned(),
            format!(r#"{{"ipv4":"100.88.0.{id}/16"}}"#),
        ),
        (
            "k8s.ovn.org/node-gateway-router-lrp-ifaddrs".to_owned(),
            format!(r#"{{"default":{{"ipv4":"100.64.0.{id}/16"}}}}"#),
        ),
    ]);
    if agent_ran {
        a.insert("k8s.ovn.org/node-chassis-id".into(), format!("ch-{name}"));
        a.insert(
            "k8s.ovn.org/node-encap-ips".into(),
            format!(r#"["172.16.0.{id}"]"#),
        );
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": a},
    }))
    .expect("node")
}

/// Creates the `ovnkube-node` ClusterRole and its binding from manifests/identity/rbac.yaml.
pub async fn install_node_rbac(admin: &kube::Client) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../manifests/identity/rbac.yaml");
    let text = std::fs::read_to_string(path).expect("rbac manifest");
    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&text).expect("yaml");
    for d in docs {
        if d["metadata"]["name"] != "ovnkube-node" {
            continue;
        }
        match d["kind"].as_str() {
            Some("ClusterRole") => {
                let r: ClusterRole = serde_json::from_value(d).expect("role");
                Api::<ClusterRole>::all(admin.clone())
                    .create(&PostParams::default(), &r)
                    .await
                    .expect("create role");
            }
            Some("ClusterRoleBinding") => {
                let b: ClusterRoleBinding = serde_json::from_value(d).expect("binding");
                Api::<ClusterRoleBinding>::all(admin.clone())
                    .create(&PostParams::default(), &b)
                    .await
                    .expect("create binding");
            }
            _ => {}
        }
    }
}

pub fn listener_output(mut p: Proc) -> String {
    use std::io::Read;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        if let Ok(Some(_)) = p.child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut out = String::new();
    if let Some(mut o) = p.child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    out
}

pub fn ovs_tunnels(ovs: &OvsdbServer) -> Vec<String> {
    let db = format!("--db={}", ovs.endpoint());
    let out = ovsdb_harness::run(
        "ovs-vsctl",
        &[
            &db,
            "--no-wait",
            "--bare",
            "--columns=options",
            "find",
            "Interface",
            "type=geneve",
        ],
    )
    .unwrap_or_default();
    let mut v: Vec<String> = out
        .split_whitespace()
        .filter_map(|w| {
            w.strip_prefix("remote_ip=")
                .map(|s| s.trim_matches(|c| c == '"' || c == ',').to_owned())
        })
        .collect();
    v.sort();
    v
}

pub fn nb_has(nb: &OvsdbServer, table: &str, name: &str) -> bool {
    summary_names(nb, table).iter().any(|n| n == name)
}

pub fn summary_names(srv: &OvsdbServer, table: &str) -> Vec<String> {
    let d = srv.dump(&[table]).expect("dump");
    d[table]
        .as_object()
        .map(|rows| {
            rows.values()
                .filter_map(|r| r["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// One node's whole stack: NB, SB and Open_vSwitch ovsdb-servers, ovn-northd, ovs-vswitchd
/// (userspace datapath) in the node's namespace with the underlay on a netdev bridge `br-phy`,
/// and ovn-controller.
pub struct NodeStack {
    pub k: u8,
    pub name: String,
    pub nb: OvsdbServer,
    pub sb: OvsdbServer,
    pub ovs: OvsdbServer,
    pub ns: super::Netns,
    pub procs: Vec<Proc>,
    _northd: super::Northd,
    _run: tempfile::TempDir,
}

impl NodeStack {
    /// Two node stacks joined by a veth underlay (`ul1` ↔ `ul2`), each with its ovn-controller
    /// running.
    pub async fn start_pair() -> (Self, Self) {
        let mut n1 = Self::start(1);
        let mut n2 = Self::start(2);
        n1.ns.ip(&[
            "link",
            "add",
            "ul1",
            "type",
            "veth",
            "peer",
            "name",
            "ul2",
            "netns",
            &n2.ns.name,
        ]);
        n1.underlay("ul1").await;
        n2.underlay("ul2").await;
        n1.start_controller();
        n2.start_controller();
        (n1, n2)
    }

    /// Starts node `k`'s databases, northd and vswitchd (ovn-controller: [`Self::start_controller`]).
    pub fn start(k: u8) -> Self {
        use ovsdb_harness::Schema;
        let nb = OvsdbServer::start(Schema::Northbound).expect("nb");
        let sb = OvsdbServer::start(Schema::Southbound).expect("sb");
        let ovs = OvsdbServer::start(Schema::Vswitch).expect("ovs");
        let northd = super::Northd::start(&nb, &sb);
        super::ovs_init(&ovs, &sb);
        let ns = super::Netns::create(&format!("n{k}"));
        let run = tempfile::tempdir().expect("rundir");
        let rd = run.path().display().to_string();
        let vswitchd = super::start_vswitchd(&ns, &ovs, &rd);
        NodeStack {
            k,
            name: format!("node{k}"),
            nb,
            sb,
            ovs,
            ns,
            procs: vec![vswitchd],
            _northd: northd,
            _run: run,
        }
    }

    pub fn vsctl(&self, args: &[&str]) -> String {
        let db = format!("--db={}", self.ovs.endpoint());
        let mut a = vec![db.as_str(), "--no-wait"];
        a.extend_from_slice(args);
        ovsdb_harness::run("ovs-vsctl", &a).expect("ovs-vsctl")
    }

    /// `br-phy` (netdev) with `port` on it and the encap IP 172.16.0.K/24 on its tap.
    pub async fn underlay(&self, port: &str) {
        self.vsctl(&[
            "add-br",
            "br-phy",
            "--",
            "set",
            "Bridge",
            "br-phy",
            "datapath_type=netdev",
        ]);
        self.vsctl(&["add-port", "br-phy", port]);
        self.ns.ip(&["link", "set", port, "up"]);
        let ns = &self.ns;
        eventually("br-phy tap", || async {
            ns.exec("ip", &["link", "show", "br-phy"]).is_some()
        })
        .await;
        self.ns.ip(&[
            "addr",
            "add",
            &format!("172.16.0.{}/24", self.k),
            "dev",
            "br-phy",
        ]);
        self.ns.ip(&["link", "set", "br-phy", "up"]);
    }

    pub fn start_controller(&mut self) {
        let rd = self._run.path().display().to_string();
        self.procs.push(super::start_controller(&self.ovs, &rd));
    }

    pub fn args(&self, gateway_interface: &str) -> node::NodeArgs {
        node::NodeArgs {
            node: self.name.clone(),
            kubeconfig: None,
            nb_address: self.nb.endpoint(),
            sb_address: self.sb.endpoint(),
            ovs_address: self.ovs.endpoint(),
            netns: Some(self.ns.name.clone()),
            encap_ip: Some(format!("172.16.0.{}", self.k).parse().expect("ip")),
            gateway_interface: Some(gateway_interface.into()),
            mtu: 1400,
            cluster_cidr: "10.244.0.0/16".parse().expect("cidr"),
            transit_cidr: "100.88.0.0/16".parse().expect("cidr"),
            join_cidr: "100.64.0.0/16".parse().expect("cidr"),
            no_kernel: false,
            enforcement: Default::default(),
        }
    }

    /// Wires a pod the way the sandbox's kubelet does: a netns with `eth0` (MAC, IP, MTU,
    /// checksum offload off, default route via .1) plugged into br-int with `iface-id`.
    pub async fn wire_pod(
        &self,
        iface_id: &str,
        port: &str,
        ip: std::net::Ipv4Addr,
    ) -> super::Netns {
        let pod = super::Netns::create(port);
        self.ns.ip(&[
            "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", &pod.name,
        ]);
        self.ns.ip(&["link", "set", port, "up"]);
        let o = ip.octets();
        let mac = format!("0a:58:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3]);
        pod.ip(&["link", "set", "eth0", "address", &mac, "mtu", "1400", "up"]);
        pod.ip(&["addr", "add", &format!("{ip}/24"), "dev", "eth0"]);
        pod.ip(&[
            "route",
            "add",
            "default",
            "via",
            &format!("{}.{}.{}.1", o[0], o[1], o[2]),
        ]);
        let _ = pod.exec("ethtool", &["-K", "eth0", "tx", "off"]);
        self.vsctl(&[
            "add-port",
            "br-int",
            port,
            "--",
            "set",
            "Interface",
            port,
            &format!("external_ids:iface-id={iface_id}"),
        ]);
        eventually("ovn-installed on the pod port", || async {
            self.vsctl(&["get", "Interface", port, "external_ids"])
                .contains("ovn-installed")
        })
        .await;
        pod
    }
}
