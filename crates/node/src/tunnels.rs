//! What this node observes: the Geneve tunnels ovn-controller built in the node's own
//! Open_vSwitch database, mapped to peer Node names, and the `TunnelReport/<node>` that
//! publishes them (only this node's own report, only when the set changes).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use anyhow::Context as _;
use k8s_api::trust_zone::{TunnelReport, TunnelReportSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use ovsdb::{Atom, Datum, DbCache};

use crate::snapshot::NodeInfo;

/// One geneve tunnel port as ovn-controller wrote it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tunnel {
    /// The Port's `external_ids:ovn-chassis-id`: `<chassis>@<remote ip>[%<local ip>]`
    /// (older OVN: `<chassis>`).
    pub chassis_id: Option<String>,
    /// The Interface's `options:remote_ip`.
    pub remote_ip: Option<String>,
}

/// Every geneve Interface of the Open_vSwitch replica, with its Port's chassis id.
pub fn tunnels(ovs: &DbCache) -> Vec<Tunnel> {
    let get = |d: Option<&Datum>, k: &str| {
        d.and_then(|d| d.map_get(k))
            .and_then(Atom::as_str)
            .map(str::to_owned)
    };
    let Some(ifaces) = ovs.table("Interface") else {
        return Vec::new();
    };
    // Interface uuid → the chassis id on the Port holding it.
    let mut chassis_of = BTreeMap::new();
    if let Some(ports) = ovs.table("Port") {
        for p in ports.rows() {
            let Some(ch) = get(p.get("external_ids"), "ovn-chassis-id") else {
                continue;
            };
            for i in p
                .get("interfaces")
                .and_then(Datum::as_set)
                .into_iter()
                .flatten()
                .filter_map(Atom::as_uuid)
            {
                chassis_of.insert(i, ch.clone());
            }
        }
    }
    ifaces
        .rows()
        .filter(|r| {
            r.get("type")
                .and_then(Datum::as_scalar)
                .and_then(Atom::as_str)
                == Some("geneve")
        })
        .map(|r| Tunnel {
            chassis_id: chassis_of.get(&r.uuid).cloned(),
            remote_ip: get(r.get("options"), "remote_ip"),
        })
        .collect()
}

/// The peer Node names of `tunnels`, sorted: a tunnel maps to the node whose
/// `node-chassis-id` is the tunnel's chassis, else whose `node-encap-ips` holds its remote
/// IP. Tunnels to no known node (and to this node) are left out.
pub fn peers<'a>(
    tunnels: &[Tunnel],
    nodes: impl IntoIterator<Item = &'a NodeInfo>,
    me: &str,
) -> Vec<String> {
    let mut by_chassis: BTreeMap<&str, &str> = BTreeMap::new();
    let mut by_ip: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for n in nodes {
        if let Some(c) = &n.chassis_id {
            by_chassis.insert(c, &n.name);
        }
        for ip in &n.encap_ips {
            by_ip.insert(*ip, &n.name);
        }
    }
    let out: BTreeSet<&str> = tunnels
        .iter()
        .filter_map(|t| {
            let chassis = t
                .chassis_id
                .as_deref()
                .map(|c| c.split('@').next().unwrap_or(c));
            chassis
                .and_then(|c| by_chassis.get(c).copied())
                .or_else(|| {
                    let ip: IpAddr = t.remote_ip.as_deref()?.trim_matches('"').parse().ok()?;
                    by_ip.get(&ip).copied()
                })
        })
        .filter(|n| *n != me)
        .collect();
    out.into_iter().map(str::to_owned).collect()
}

/// The outcome of [`sync_report`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReportSync {
    /// The report already said this; nothing was written.
    Unchanged,
    /// The report was created or its peers replaced.
    Written,
    /// The TunnelReport CRD is not installed (try again later).
    NoCrd,
}

/// Makes `TunnelReport/<node>` say `peers` (sorted), writing only when it differs: create if
/// missing (owned by the Node, so it goes with it), merge-patch `spec.peers` otherwise.
pub async fn sync_report(
    kube: &Client,
    node: &str,
    node_uid: Option<&str>,
    peers: &[String],
) -> anyhow::Result<ReportSync> {
    let api: Api<TunnelReport> = Api::all(kube.clone());
    let cur = match api.get_opt(node).await {
        Ok(c) => c,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(ReportSync::NoCrd),
        Err(e) => return Err(e).context("reading this node's TunnelReport"),
    };
    match cur {
        Some(r) if r.spec.peers == peers => Ok(ReportSync::Unchanged),
        Some(_) => {
            let patch = serde_json::json!({"spec": {"peers": peers}});
            api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .context("updating this node's TunnelReport")?;
            Ok(ReportSync::Written)
        }
        None => {
            let mut r = TunnelReport::new(
                node,
                TunnelReportSpec {
                    peers: peers.to_vec(),
                },
            );
            r.metadata.owner_references = node_uid.map(|uid| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "Node".into(),
                    name: node.to_owned(),
                    uid: uid.to_owned(),
                    ..Default::default()
                }]
            });
            match api.create(&PostParams::default(), &r).await {
                Ok(_) => Ok(ReportSync::Written),
                Err(kube::Error::Api(e)) if e.code == 404 => Ok(ReportSync::NoCrd),
                Err(e) => Err(e).context("creating this node's TunnelReport"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str, ch: &str, ip: &str) -> NodeInfo {
        NodeInfo {
            name: name.into(),
            chassis_id: Some(ch.into()),
            encap_ips: ip.parse().into_iter().collect(),
            ..NodeInfo::default()
        }
    }

    #[test]
    fn tunnels_map_to_nodes_by_chassis_then_ip() {
        let nodes = [
            n("node1", "ch1", "172.16.0.1"),
            n("node2", "ch2", "172.16.0.2"),
            n("node3", "ch3", "172.16.0.3"),
            n("node4", "ch4", "172.16.0.4"),
        ];
        let t = |c: Option<&str>, ip: Option<&str>| Tunnel {
            chassis_id: c.map(str::to_owned),
            remote_ip: ip.map(str::to_owned),
        };
        let tunnels = [
            // current OVN: chassis@remote%local
            t(Some("ch3@172.16.0.3%172.16.0.1"), Some("172.16.0.3")),
            // older OVN: the bare chassis id
            t(Some("ch2"), Some("10.0.0.9")),
            // no chassis id: by remote IP
            t(None, Some("172.16.0.4")),
            // unknown peers and this node itself are left out
            t(Some("chX@1.2.3.4"), Some("1.2.3.4")),
            t(None, Some("172.16.0.1")),
            t(None, Some("not an ip")),
        ];
        assert_eq!(
            peers(&tunnels, &nodes, "node1"),
            vec!["node2", "node3", "node4"]
        );
        assert!(peers(&[], &nodes, "node1").is_empty());
    }
}
