//! `status` and `connectivity`: what a running sandbox looks like, read from the API server and
//! from each node's own Open_vSwitch database, and measured with real packets.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use anyhow::Context;
use k8s_api::annotations;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use serde::Serialize;

use crate::layout::{self, EXTERNAL_IP, Layout, PROBE_PORT};
use crate::state::SandboxState;
use crate::supervisor::{geneve_peers, node_ready};

/// One node in `status`.
#[derive(Clone, Debug, Serialize)]
pub struct NodeStatus {
    pub name: String,
    pub netns: String,
    pub chassis: Option<String>,
    pub encap_ip: String,
    pub ready: bool,
    /// Remote node names of the Geneve tunnels in this node's own Open_vSwitch database.
    pub tunnels: Vec<String>,
    /// `k8s.ovn.org/transport-zones` of the node, if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
}

/// One pod in `status`.
#[derive(Clone, Debug, Serialize)]
pub struct PodStatus {
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    pub ip: Option<String>,
    pub ready: bool,
    /// The pod's network namespace (none for hostNetwork pods).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netns: Option<String>,
}

/// `status --json`.
#[derive(Clone, Debug, Serialize)]
pub struct Status {
    pub nodes: Vec<NodeStatus>,
    pub pods: Vec<PodStatus>,
}

/// A kube client for the sandbox's admin kubeconfig.
pub async fn admin_client(layout: &Layout) -> anyhow::Result<kube::Client> {
    apiserver::install_crypto_provider();
    let kc = kube::config::Kubeconfig::read_from(layout.kubeconfig())
        .with_context(|| format!("reading {}", layout.kubeconfig().display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// Reads the remote node names of `node`'s tunnels from its Open_vSwitch database.
pub async fn tunnels_of(st: &SandboxState, node: &str) -> anyhow::Result<Vec<String>> {
    let spec = crate::stack::NodeSpec::new(
        &st.layout,
        layout::node_index(node).with_context(|| format!("{node} is not a sandbox node name"))?,
    );
    let by_ip: BTreeMap<String, String> = st
        .nodes
        .iter()
        .filter_map(|n| {
            Some((
                layout::node_ip(layout::node_index(n)?).to_string(),
                n.clone(),
            ))
        })
        .collect();
    let client = ovsdb::Client::connect(&spec.socket("conf"), ovsdb::ClientOptions::default())
        .await
        .with_context(|| format!("{node}: connecting to its Open_vSwitch database"))?;
    let db = ovn_model::connect_db(&client, ovn_model::OVS_DB, &ovn_model::ovs_needs()).await?;
    let mut names: Vec<String> = geneve_peers(&db)
        .into_iter()
        .map(|ip| by_ip.get(&ip).cloned().unwrap_or(ip))
        .collect();
    names.sort_by_key(|n| (layout::node_index(n).unwrap_or(u32::MAX), n.clone()));
    Ok(names)
}

/// Gathers `status`.
pub async fn status(st: &SandboxState) -> anyhow::Result<Status> {
    let client = admin_client(&st.layout).await?;
    let nodes: BTreeMap<String, Node> = Api::<Node>::all(client.clone())
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), n))
        .collect();
    let tunnel_reads = st.nodes.iter().map(|n| tunnels_of(st, n));
    let tunnels = futures::future::join_all(tunnel_reads).await;
    let mut out = Vec::new();
    for (name, t) in st.nodes.iter().zip(tunnels) {
        let k = layout::node_index(name).unwrap_or(0);
        let node = nodes.get(name);
        let ann = node.and_then(|n| n.metadata.annotations.as_ref());
        out.push(NodeStatus {
            name: name.clone(),
            netns: st.layout.node_netns(name),
            chassis: ann
                .and_then(|a| a.get(annotations::NODE_CHASSIS_ID))
                .cloned(),
            encap_ip: layout::node_ip(k).to_string(),
            ready: node.is_some_and(node_ready),
            tunnels: t.unwrap_or_default(),
            zones: ann
                .and_then(|a| a.get(annotations::TRANSPORT_ZONES))
                .and_then(|v| annotations::parse_transport_zones(v).ok())
                .unwrap_or_default(),
        });
    }
    let mut pods: Vec<PodStatus> = Api::<Pod>::all(client)
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|p| pod_status(&st.layout, &p))
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(Status { nodes: out, pods })
}

fn pod_status(layout: &Layout, p: &Pod) -> PodStatus {
    let status = p.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let host_network = p
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    PodStatus {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
        ip: status.and_then(|s| s.pod_ip.clone()),
        ready,
        netns: (!host_network)
            .then(|| p.metadata.uid.as_deref().map(|u| layout.pod_netns(u)))
            .flatten(),
    }
}

/// One pair of `connectivity --json`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Pair {
    pub from: String,
    pub to: String,
    pub tcp: bool,
    pub icmp: bool,
}

/// One pod-to-external probe.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct External {
    pub from: String,
    pub tcp: bool,
    /// The source address the external namespace saw (the node's IP after SNAT).
    pub seen_as: Option<String>,
}

/// `connectivity --json`.
#[derive(Clone, Debug, Serialize)]
pub struct Connectivity {
    pub pairs: Vec<Pair>,
    pub external: Vec<External>,
}

/// Measures the pod-to-pod matrix and pod-to-external, with `timeout` per probe.
pub async fn connectivity(st: &SandboxState, timeout: Duration) -> anyhow::Result<Connectivity> {
    let s = status(st).await?;
    let pods: Vec<PodStatus> = s
        .pods
        .into_iter()
        .filter(|p| p.ready && p.ip.is_some() && p.netns.is_some())
        .collect();
    let targets: Vec<(String, IpAddr)> = pods
        .iter()
        .filter_map(|p| {
            let ip: IpAddr = p.ip.as_deref()?.parse().ok()?;
            Some((format!("{}/{}", p.namespace, p.name), ip))
        })
        .collect();
    let runs = pods.iter().map(|p| {
        let from = format!("{}/{}", p.namespace, p.name);
        let ns = p.netns.clone().unwrap_or_default();
        let mut ips: Vec<IpAddr> = targets
            .iter()
            .filter(|(k, _)| *k != from)
            .map(|(_, ip)| *ip)
            .collect();
        ips.push(IpAddr::V4(EXTERNAL_IP));
        async move {
            let r = crate::probe::probe_from(&ns, &ips, PROBE_PORT, true, timeout).await;
            (from, r)
        }
    });
    let by_ip: BTreeMap<IpAddr, String> = targets.iter().map(|(k, ip)| (*ip, k.clone())).collect();
    let mut pairs = Vec::new();
    let mut external = Vec::new();
    for (from, r) in futures::future::join_all(runs).await {
        let probes = r.with_context(|| format!("probing from {from}"))?;
        for p in probes {
            if p.to == IpAddr::V4(EXTERNAL_IP) {
                external.push(External {
                    from: from.clone(),
                    tcp: p.tcp,
                    seen_as: p
                        .answer
                        .as_deref()
                        .and_then(|a| a.split_whitespace().nth(1))
                        .map(str::to_owned),
                });
            } else if let Some(to) = by_ip.get(&p.to) {
                pairs.push(Pair {
                    from: from.clone(),
                    to: to.clone(),
                    tcp: p.tcp,
                    icmp: p.icmp,
                });
            }
        }
    }
    Ok(Connectivity { pairs, external })
}
