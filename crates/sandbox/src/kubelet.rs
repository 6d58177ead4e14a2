//! The sandbox's minimal kubelet and CNI, one for all nodes.
//!
//! - A Pod bound to a sandbox node whose `k8s.ovn.org/pod-networks` annotation exists gets a
//!   network namespace, a veth whose host end is a port of the node's `br-int` with
//!   `external_ids:iface-id=<namespace>_<name>` (the name of the logical switch port the node
//!   agent created), the annotation's MAC/IP/gateway, MTU 1400 and transmit checksum offload
//!   off (both needed for TCP through the userspace datapath), and a tiny TCP listener on
//!   port 8080 that answers `<namespace>/<name> <peer address>`. Once ovn-controller has set
//!   `external_ids:ovn-installed=true` on the interface the Pod is marked Running with its
//!   podIP. Deleting the Pod removes all of it.
//! - hostNetwork Pods are marked Running with the node's IP.
//! - Each Node's `Ready` condition follows its agent: True once the agent runs, has published
//!   the chassis id and ovn-controller has created `br-int`.
//!
//! Everything is level-triggered: a pass compares what the API says with what is wired and
//! fixes the difference, so a missed event costs at most one tick.

use k8s_api::watch::spawn_reflector;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use k8s_api::annotations::{self, DEFAULT_NETWORK, PodNetwork};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use ovn_model::TypedCache;
use ovn_model::tables::{Bridge, Interface};
use ovsdb::Db;
use tokio::sync::Notify;

use crate::layout::{Layout, POD_MTU, PROBE_PORT};
use crate::netns;
use crate::stack::NodeSpec;

/// What a node's kubelet needs to know about it.
pub struct KubeletNode {
    /// The node.
    pub spec: NodeSpec,
    /// Its local Open_vSwitch database replica.
    pub ovs: Arc<Db>,
    /// Whether its agent process currently runs.
    pub agent_running: Arc<dyn Fn() -> bool + Send + Sync>,
}

enum Slot {
    Wiring,
    Wired(Wired),
    Failed {
        error: String,
        at: tokio::time::Instant,
    },
}

struct Wired {
    node: String,
    netns: String,
    host_if: String,
    listener: tokio::task::JoinHandle<()>,
}

/// The kubelet.
pub struct Kubelet {
    layout: Layout,
    client: kube::Client,
    nodes: BTreeMap<String, KubeletNode>,
    pods: Mutex<HashMap<String, Slot>>,
    notify: Arc<Notify>,
}

impl Kubelet {
    /// A kubelet for `nodes`.
    pub fn new(layout: Layout, client: kube::Client, nodes: Vec<KubeletNode>) -> Arc<Self> {
        Arc::new(Self {
            layout,
            client,
            nodes: nodes
                .into_iter()
                .map(|n| (n.spec.name.clone(), n))
                .collect(),
            pods: Mutex::new(HashMap::new()),
            notify: Arc::new(Notify::new()),
        })
    }

    /// Runs until the task is dropped.
    pub async fn run(self: Arc<Self>) {
        let pods = spawn_reflector(
            Api::<Pod>::all(self.client.clone()),
            watcher::Config::default(),
            self.notify.clone(),
        );
        let nodes = spawn_reflector(
            Api::<Node>::all(self.client.clone()),
            watcher::Config::default(),
            self.notify.clone(),
        );
        for n in self.nodes.values() {
            let mut rx = n.ovs.subscribe();
            let notify = self.notify.clone();
            tokio::spawn(async move {
                while rx.changed().await.is_ok() {
                    notify.notify_one();
                }
            });
        }
        let _ = tokio::join!(pods.wait_until_ready(), nodes.wait_until_ready());
        loop {
            self.pass(&pods, &nodes).await;
            let _ = tokio::time::timeout(Duration::from_millis(500), self.notify.notified()).await;
        }
    }

    async fn pass(self: &Arc<Self>, pods: &Store<Pod>, nodes: &Store<Node>) {
        for node in nodes.state() {
            let name = node.metadata.name.clone().unwrap_or_default();
            if let Some(kn) = self.nodes.get(&name)
                && let Err(e) = self.sync_node_status(kn, &node).await
            {
                tracing::warn!(node = %name, error = %e, "updating Node status");
            }
        }
        let mut desired: HashMap<String, Arc<Pod>> = HashMap::new();
        for pod in pods.state() {
            let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                continue;
            };
            if !self.nodes.contains_key(&node) || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let host_network = pod
                .spec
                .as_ref()
                .and_then(|s| s.host_network)
                .unwrap_or(false);
            if host_network {
                if let Err(e) = self.sync_host_network_pod(&pod, &node).await {
                    tracing::warn!(pod = %pod_key(&pod), error = %e, "hostNetwork pod status");
                }
                continue;
            }
            // the CNI waits for the node agent's annotation; until then there is nothing to do
            let annotated = pod
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(annotations::POD_NETWORKS));
            if !annotated {
                continue;
            }
            if let Some(uid) = pod.metadata.uid.clone() {
                desired.insert(uid, pod);
            }
        }
        // tear down what is no longer wanted
        let gone: Vec<(String, Option<Wired>)> = {
            let Ok(mut map) = self.pods.lock() else {
                return;
            };
            let keys: Vec<String> = map
                .keys()
                .filter(|k| !desired.contains_key(*k))
                .cloned()
                .collect();
            keys.into_iter()
                .filter_map(|k| match map.get(&k) {
                    Some(Slot::Wiring) => None,
                    _ => map.remove(&k).map(|s| match s {
                        Slot::Wired(w) => (k, Some(w)),
                        _ => (k, None),
                    }),
                })
                .collect()
        };
        for (_, w) in gone {
            if let Some(w) = w {
                self.unwire(w).await;
            }
        }
        // wire what is new
        for (uid, pod) in desired {
            let start = {
                let Ok(mut map) = self.pods.lock() else {
                    return;
                };
                match map.get(&uid) {
                    None => true,
                    Some(Slot::Failed { at, .. }) => at.elapsed() > Duration::from_millis(500),
                    _ => false,
                }
                .then(|| map.insert(uid.clone(), Slot::Wiring))
                .is_some()
            };
            if !start {
                continue;
            }
            let me = self.clone();
            tokio::spawn(async move {
                let result = me.wire(&pod).await;
                let slot = match result {
                    Ok(w) => Slot::Wired(w),
                    Err(e) => {
                        let error = format!("{e:#}");
                        tracing::debug!(pod = %pod_key(&pod), error = %error, "pod not wired yet");
                        Slot::Failed {
                            error,
                            at: tokio::time::Instant::now(),
                        }
                    }
                };
                if let Ok(mut map) = me.pods.lock() {
                    map.insert(uid, slot);
                }
                me.notify.notify_one();
            });
        }
    }

    async fn wire(&self, pod: &Pod) -> anyhow::Result<Wired> {
        let key = pod_key(pod);
        let ns_name = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let node_name = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let node = self
            .nodes
            .get(&node_name)
            .with_context(|| format!("{node_name} is not a sandbox node"))?;
        let net = pod_network(pod)?;
        let netns_name = self.layout.pod_netns(&uid);
        let host_if = crate::layout::pod_host_ifname(&uid);
        let node_ns = &node.spec.netns;
        let iface_id = format!("{ns_name}_{name}");

        // a leftover from an earlier attempt
        netns::del(&netns_name).await?;
        let _ = netns::ip(node_ns, &["link", "del", &host_if]).await;

        netns::add(&netns_name).await?;
        let mtu = POD_MTU.to_string();
        netns::ip(
            node_ns,
            &[
                "link",
                "add",
                &host_if,
                "mtu",
                &mtu,
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "mtu",
                &mtu,
                "netns",
                &netns_name,
            ],
        )
        .await?;
        netns::ip(node_ns, &["link", "set", &host_if, "up"]).await?;
        netns::ip(
            &netns_name,
            &["link", "set", "eth0", "address", &net.mac_address],
        )
        .await?;
        for addr in &net.ip_addresses {
            netns::ip(
                &netns_name,
                &["addr", "add", &addr.to_string(), "dev", "eth0"],
            )
            .await?;
        }
        netns::ip(&netns_name, &["link", "set", "eth0", "up"]).await?;
        for gw in &net.gateway_ips {
            let fam = if gw.is_ipv4() { "-4" } else { "-6" };
            netns::ip(
                &netns_name,
                &[
                    fam,
                    "route",
                    "add",
                    "default",
                    "via",
                    &gw.to_string(),
                    "dev",
                    "eth0",
                ],
            )
            .await?;
        }
        netns::tx_checksum_off(&netns_name, "eth0").await?;

        let conf = node.spec.socket("conf");
        netns::run(
            "ovs-vsctl",
            &[
                "--db",
                &conf,
                "--timeout=10",
                "--",
                "--may-exist",
                "add-port",
                "br-int",
                &host_if,
                "--",
                "set",
                "interface",
                &host_if,
                &format!("external_ids:iface-id={iface_id}"),
                &format!("external_ids:iface-id-ver={uid}"),
                &format!("external_ids:sandbox={netns_name}"),
                &format!("external_ids:k8s.ovn.org/owner=pod/{ns_name}/{name}"),
            ],
        )
        .await?;

        // the listener lives in the pod's namespace, served by this process
        let std_listener = netns::in_netns_async(&netns_name, move || {
            let l = std::net::TcpListener::bind(("0.0.0.0", PROBE_PORT))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })
        .await?;
        let listener = tokio::net::TcpListener::from_std(std_listener)?;
        let who = key.clone();
        let listener = tokio::spawn(serve_probe(listener, who));

        let wired = Wired {
            node: node_name.clone(),
            netns: netns_name.clone(),
            host_if: host_if.clone(),
            listener,
        };
        // wait until ovn-controller has installed the port's flows
        let installed = tokio::time::timeout(
            Duration::from_secs(30),
            node.ovs.wait_until(|c| {
                c.named::<Interface>(&host_if).iter().any(|i| {
                    i.external_ids.get("ovn-installed").map(String::as_str) == Some("true")
                })
            }),
        )
        .await;
        if installed.is_err() {
            self.unwire(wired).await;
            anyhow::bail!("{key}: ovn-controller did not install port {iface_id} within 30s");
        }

        let ip = net
            .ip_addresses
            .first()
            .map(|n| n.addr().to_string())
            .unwrap_or_default();
        let ips: Vec<serde_json::Value> = net
            .ip_addresses
            .iter()
            .map(|n| serde_json::json!({ "ip": n.addr().to_string() }))
            .collect();
        let now = Time(Timestamp::now());
        let cond =
            |t: &str| serde_json::json!({"type": t, "status": "True", "lastTransitionTime": now});
        let status = serde_json::json!({
            "status": {
                "phase": "Running",
                "podIP": ip,
                "podIPs": ips,
                "hostIP": node.spec.ip.to_string(),
                "hostIPs": [{"ip": node.spec.ip.to_string()}],
                "startTime": now,
                "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"), cond("Ready")],
            }
        });
        Api::<Pod>::namespaced(self.client.clone(), &ns_name)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("marking {key} Running"))?;
        tracing::info!(pod = %key, node = %node_name, ip = %ip, "pod running");
        Ok(wired)
    }

    async fn unwire(&self, w: Wired) {
        w.listener.abort();
        if let Some(node) = self.nodes.get(&w.node) {
            let conf = node.spec.socket("conf");
            let _ = netns::run(
                "ovs-vsctl",
                &[
                    "--db",
                    &conf,
                    "--timeout=10",
                    "--if-exists",
                    "del-port",
                    "br-int",
                    &w.host_if,
                ],
            )
            .await;
            let _ = netns::ip(&node.spec.netns, &["link", "del", &w.host_if]).await;
        }
        if let Err(e) = netns::del(&w.netns).await {
            tracing::warn!(netns = %w.netns, error = %e, "deleting pod namespace");
        }
    }

    /// Tears every pod down (at shutdown).
    pub async fn unwire_all(&self) {
        let all: Vec<Wired> = match self.pods.lock() {
            Ok(mut m) => m
                .drain()
                .filter_map(|(_, s)| match s {
                    Slot::Wired(w) => Some(w),
                    _ => None,
                })
                .collect(),
            Err(_) => Vec::new(),
        };
        for w in all {
            self.unwire(w).await;
        }
    }

    /// Pods that could not be wired, with the reason (for `status`).
    pub fn failures(&self) -> Vec<(String, String)> {
        self.pods
            .lock()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, s)| match s {
                        Slot::Failed { error, .. } => Some((k.clone(), error.clone())),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn sync_host_network_pod(&self, pod: &Pod, node: &str) -> anyhow::Result<()> {
        let Some(kn) = self.nodes.get(node) else {
            return Ok(());
        };
        let ip = kn.spec.ip.to_string();
        let status = pod.status.as_ref();
        if status.and_then(|s| s.phase.as_deref()) == Some("Running")
            && status.and_then(|s| s.pod_ip.as_deref()) == Some(ip.as_str())
        {
            return Ok(());
        }
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let patch = serde_json::json!({"status": {
            "phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}],
        }});
        Api::<Pod>::namespaced(self.client.clone(), &ns)
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    async fn sync_node_status(&self, kn: &KubeletNode, node: &Node) -> anyhow::Result<()> {
        let annotated = node
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(annotations::NODE_CHASSIS_ID));
        let has_br_int = !kn.ovs.cache().named::<Bridge>("br-int").is_empty();
        let agent = (kn.agent_running)();
        let (ready, reason, message) = match (agent, annotated, has_br_int) {
            (false, _, _) => (
                false,
                "AgentNotRunning",
                "the ovnk node agent is not running",
            ),
            (true, false, _) => (
                false,
                "ChassisNotPublished",
                "the node agent has not published k8s.ovn.org/node-chassis-id yet",
            ),
            (true, true, false) => (
                false,
                "IntegrationBridgeMissing",
                "ovn-controller has not created br-int yet",
            ),
            (true, true, true) => (true, "OvnkNodeReady", "the OVN stack and agent are running"),
        };
        let has_addresses = node
            .status
            .as_ref()
            .and_then(|s| s.addresses.as_ref())
            .is_some_and(|a| !a.is_empty());
        if !has_addresses {
            // a re-created Node object: report the addresses again, as a kubelet does
            crate::supervisor::set_node_addresses(&self.client, &kn.spec).await?;
        }
        let want = if ready { "True" } else { "False" };
        let current = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()));
        if current == Some((want.to_owned(), reason.to_owned())) {
            return Ok(());
        }
        let now = Time(Timestamp::now());
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "Ready", "status": want, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": now,
        }]}});
        let name = node.metadata.name.clone().unwrap_or_default();
        Api::<Node>::all(self.client.clone())
            .patch_status(&name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await?;
        Ok(())
    }
}

/// `namespace/name`.
pub fn pod_key(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

fn pod_network(pod: &Pod) -> anyhow::Result<PodNetwork> {
    let raw = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotations::POD_NETWORKS))
        .with_context(|| {
            format!(
                "{}: no {} annotation yet",
                pod_key(pod),
                annotations::POD_NETWORKS
            )
        })?;
    let mut map = annotations::parse_pod_networks(raw)?;
    map.remove(DEFAULT_NETWORK)
        .with_context(|| format!("{}: no default network in its annotation", pod_key(pod)))
}

async fn serve_probe(listener: tokio::net::TcpListener, who: String) {
    use tokio::io::AsyncWriteExt;
    loop {
        let Ok((mut sock, peer)) = listener.accept().await else {
            continue;
        };
        let line = format!("{who} {}\n", peer.ip());
        tokio::spawn(async move {
            let _ = sock.write_all(line.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

/// Serves the probe listener in the external namespace.
pub async fn serve_external(netns_name: &str) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let l = netns::in_netns_async(netns_name, || {
        let l = std::net::TcpListener::bind(("0.0.0.0", PROBE_PORT))?;
        l.set_nonblocking(true)?;
        Ok(l)
    })
    .await?;
    let l = tokio::net::TcpListener::from_std(l)?;
    Ok(tokio::spawn(serve_probe(l, "external".to_owned())))
}
