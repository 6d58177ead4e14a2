//! Kubernetes objects → plan [`Snapshot`] (pure). Malformed fields are skipped with a debug
//! log, never a panic, and never hide the other objects.

use std::collections::BTreeSet;
use std::net::IpAddr;

use k8s_api::egress_service::{EGRESS_SERVICE_HOST_ANNOTATION, EgressService};
use k8s_api::service_fwmark::ServiceFWMark;
use k8s_openapi::api::core::v1::{Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::plan::{Endpoint, MarkRequest, ServiceInfo, ServiceKey, Snapshot};

/// Label on an EndpointSlice naming its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

fn key_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Option<ServiceKey> {
    Some(ServiceKey::new(meta.namespace.clone()?, meta.name.clone()?))
}

/// A ServiceFWMark as a plan input.
pub fn mark_request(o: &ServiceFWMark) -> Option<MarkRequest> {
    Some(MarkRequest {
        key: key_of(&o.metadata)?,
        fwmark: o.spec.fwmark,
        created: o
            .metadata
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second()),
    })
}

fn parse_ip(s: &str, what: &str) -> Option<IpAddr> {
    match s.trim().parse() {
        Ok(ip) => Some(ip),
        Err(_) => {
            tracing::debug!(value = s, what, "skipping unparsable address");
            None
        }
    }
}

/// A Service as a plan input.
pub fn service_info(s: &Service) -> Option<(ServiceKey, ServiceInfo)> {
    let key = key_of(&s.metadata)?;
    let spec = s.spec.as_ref();
    let mut raw: Vec<&str> = spec
        .and_then(|sp| sp.cluster_ips.as_ref())
        .map(|v| v.iter().map(String::as_str).collect())
        .unwrap_or_default();
    if raw.is_empty()
        && let Some(ip) = spec.and_then(|sp| sp.cluster_ip.as_deref())
    {
        raw.push(ip);
    }
    let cluster_ips = raw
        .into_iter()
        .filter(|ip| !ip.is_empty() && *ip != "None")
        .filter_map(|ip| parse_ip(ip, "clusterIP"))
        .collect();
    let egress_host_annotation = s
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EGRESS_SERVICE_HOST_ANNOTATION))
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty());
    Some((
        key,
        ServiceInfo {
            cluster_ips,
            egress_host_annotation,
        },
    ))
}

/// The endpoints of an EndpointSlice, with the Service they belong to. `host_ips` are node
/// addresses: an endpoint whose address is one of them is a hostNetwork endpoint.
pub fn slice_endpoints(
    s: &EndpointSlice,
    host_ips: &BTreeSet<IpAddr>,
) -> Option<(ServiceKey, Vec<Endpoint>)> {
    let ns = s.metadata.namespace.clone()?;
    let svc = s.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?.clone();
    if s.address_type != "IPv4" && s.address_type != "IPv6" {
        return None; // FQDN slices carry no addresses to mark
    }
    let eps = s
        .endpoints
        .iter()
        .map(|e| {
            let addresses: Vec<IpAddr> = e
                .addresses
                .iter()
                .filter_map(|a| parse_ip(a, "endpoint address"))
                .collect();
            let host_network = addresses.iter().any(|a| host_ips.contains(a));
            Endpoint {
                addresses,
                node: e.node_name.clone(),
                host_network,
            }
        })
        .collect();
    Some((ServiceKey::new(ns, svc), eps))
}

/// `status.host` of an EgressService, when set.
pub fn egress_host(e: &EgressService) -> Option<(ServiceKey, String)> {
    let host = e.status.as_ref()?.host.trim().to_string();
    if host.is_empty() {
        return None;
    }
    Some((key_of(&e.metadata)?, host))
}

/// A Node's addresses (InternalIP / ExternalIP), i.e. what hostNetwork pods use.
pub fn node_addresses(n: &Node) -> Vec<IpAddr> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| parse_ip(&a.address, "node address"))
        .collect()
}

/// Build a snapshot from the stores' contents.
pub fn snapshot<'a>(
    marks: impl IntoIterator<Item = &'a ServiceFWMark>,
    services: impl IntoIterator<Item = &'a Service>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    egress: impl IntoIterator<Item = &'a EgressService>,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Snapshot {
    let host_ips: BTreeSet<IpAddr> = nodes.into_iter().flat_map(node_addresses).collect();
    let mut snap = Snapshot::default();
    for m in marks.into_iter().filter_map(mark_request) {
        snap.marks.insert(m.key.clone(), m);
    }
    for (k, s) in services.into_iter().filter_map(service_info) {
        snap.services.insert(k, s);
    }
    for (k, eps) in slices
        .into_iter()
        .filter_map(|s| slice_endpoints(s, &host_ips))
    {
        snap.endpoints.entry(k).or_default().extend(eps);
    }
    for (k, h) in egress.into_iter().filter_map(egress_host) {
        snap.egress_hosts.insert(k, h);
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("fixture parses")
    }

    #[test]
    fn objects_to_snapshot() {
        let mark: ServiceFWMark = from(json!({
            "apiVersion": "k8s.ovn.org/v1", "kind": "ServiceFWMark",
            "metadata": {"name": "web", "namespace": "ns", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"fwmark": 1000}}));
        let svc: Service = from(json!({
            "metadata": {"name": "web", "namespace": "ns",
                         "annotations": {"k8s.ovn.org/egress-service-host": "node2"}},
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10", "fd00::10", "bogus"]}}));
        let headless: Service = from(json!({
            "metadata": {"name": "h", "namespace": "ns"}, "spec": {"clusterIP": "None"}}));
        let slice: EndpointSlice = from(json!({
        "metadata": {"name": "web-abc", "namespace": "ns",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [
            {"addresses": ["10.244.0.3"], "nodeName": "node1"},
            {"addresses": ["192.168.0.11"], "nodeName": "node1"},
            {"addresses": ["not-an-ip"], "nodeName": "node1"}
        ]}));
        let fqdn: EndpointSlice = from(json!({
            "metadata": {"name": "x", "namespace": "ns",
                         "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "FQDN", "endpoints": [{"addresses": ["example.com"]}]}));
        let es: EgressService = from(json!({
            "apiVersion": "k8s.ovn.org/v1", "kind": "EgressService",
            "metadata": {"name": "web", "namespace": "ns"}, "spec": {}, "status": {"host": "node1"}}));
        let node: Node = from(json!({
            "metadata": {"name": "node1"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.0.11"},
                                      {"type": "Hostname", "address": "node1"}]}}));
        let snap = snapshot([&mark], [&svc, &headless], [&slice, &fqdn], [&es], [&node]);
        let k = ServiceKey::new("ns", "web");
        assert_eq!(snap.marks[&k].created, Some(1_767_225_600));
        assert_eq!(snap.services[&k].cluster_ips.len(), 2);
        assert_eq!(
            snap.services[&k].egress_host_annotation.as_deref(),
            Some("node2")
        );
        assert!(
            snap.services[&ServiceKey::new("ns", "h")]
                .cluster_ips
                .is_empty()
        );
        let eps = &snap.endpoints[&k];
        assert_eq!(eps.len(), 3);
        assert!(!eps[0].host_network && eps[1].host_network);
        assert!(eps[2].addresses.is_empty());
        assert_eq!(snap.egress_hosts[&k], "node1");
    }
}
