//! EndpointSlices for Services with a selector: the desired slices are a pure function of the
//! Service and the Pods of its namespace ([`desired_slices`]); the shell in [`super`] creates,
//! replaces and deletes slices carrying ovnk's `managed-by` label to match.
//!
//! Slices are grouped like the real controller's: one per address family of the Service, and
//! within a family one per distinct set of resolved ports (a named `targetPort` can resolve to
//! different numbers on different Pods). A family without endpoints gets one empty slice.
//! Names are deterministic: `<service>-<ipv4|ipv6>` for the Service's canonical ports (numeric
//! and default targets; named targets left out), which is what every Pod gets unless the
//! Service uses named target ports, and `<service>-<ipv4|ipv6>-<hash of the ports>` for other
//! port sets. So a slice is updated in place as Pods come and go; only with named target ports
//! does the empty placeholder give way to hashed slices.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service, ServicePort};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

/// Label naming the Service a slice belongs to.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// Label naming the controller that manages a slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// ovnk's value of [`LABEL_MANAGED_BY`]; slices with another value are never touched.
pub const MANAGED_BY: &str = "endpointslice-controller.ovnk.k8s.ovn.org";

/// The Service's address families (`IPv4`/`IPv6`): `spec.ipFamilies`, else the family of its
/// ClusterIP, else IPv4.
pub fn families(svc: &Service) -> Vec<&'static str> {
    let spec = svc.spec.as_ref();
    let listed: Vec<&'static str> = spec
        .and_then(|s| s.ip_families.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|f| match f.as_str() {
            "IPv4" => Some("IPv4"),
            "IPv6" => Some("IPv6"),
            _ => None,
        })
        .collect();
    if !listed.is_empty() {
        return listed;
    }
    match spec
        .and_then(|s| s.cluster_ip.as_deref())
        .and_then(|ip| ip.parse::<IpAddr>().ok())
    {
        Some(IpAddr::V6(_)) => vec!["IPv6"],
        _ => vec!["IPv4"],
    }
}

/// The Service's selector when it has a non-empty one (Services without are left alone).
pub fn selector(svc: &Service) -> Option<&BTreeMap<String, String>> {
    svc.spec
        .as_ref()
        .and_then(|s| s.selector.as_ref())
        .filter(|s| !s.is_empty())
}

fn matches(pod: &Pod, sel: &BTreeMap<String, String>) -> bool {
    let labels = pod.labels();
    sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    let Some(st) = pod.status.as_ref() else {
        return Vec::new();
    };
    let mut ips: Vec<IpAddr> = st
        .pod_ips
        .iter()
        .flatten()
        .filter_map(|p| p.ip.parse().ok())
        .collect();
    if ips.is_empty()
        && let Some(ip) = st.pod_ip.as_deref().and_then(|s| s.parse().ok())
    {
        ips.push(ip);
    }
    ips
}

/// Resolves a Service port's target on `pod`: a number, a named container port of the same
/// protocol, or (no targetPort) the Service port itself. `None` when a name does not resolve.
pub fn target_port(sp: &ServicePort, pod: Option<&Pod>) -> Option<i32> {
    match &sp.target_port {
        None => Some(sp.port),
        Some(IntOrString::Int(n)) => Some(*n),
        Some(IntOrString::String(s)) => {
            if let Ok(n) = s.parse::<i32>() {
                return Some(n);
            }
            let proto = sp.protocol.as_deref().unwrap_or("TCP");
            pod?.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|cp| {
                    cp.name.as_deref() == Some(s.as_str())
                        && cp.protocol.as_deref().unwrap_or("TCP") == proto
                })
                .map(|cp| cp.container_port)
        }
    }
}

fn fnv32(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

type PortKey = (Option<String>, Option<String>, Option<i32>);

fn resolve_ports(svc_ports: &[ServicePort], pod: Option<&Pod>) -> Vec<PortKey> {
    svc_ports
        .iter()
        .filter_map(|sp| {
            let port = target_port(sp, pod)?;
            Some((
                Some(sp.name.clone().unwrap_or_default()),
                Some(sp.protocol.clone().unwrap_or_else(|| "TCP".into())),
                Some(port),
            ))
        })
        .collect()
}

fn slice_name(svc: &str, family: &str, ports: &[EndpointPort], canonical: bool) -> String {
    if canonical {
        return format!("{svc}-{}", family.to_ascii_lowercase());
    }
    let key: Vec<String> = ports
        .iter()
        .map(|p| {
            format!(
                "{}/{}/{}",
                p.name.as_deref().unwrap_or(""),
                p.protocol.as_deref().unwrap_or(""),
                p.port.unwrap_or(0)
            )
        })
        .collect();
    format!(
        "{svc}-{}-{:08x}",
        family.to_ascii_lowercase(),
        fnv32(&key.join(","))
    )
}

/// The EndpointSlices `svc` should have given `pods` (any namespace; only the Service's are
/// used). Empty when the Service has no selector.
pub fn desired_slices<'a>(
    svc: &Service,
    pods: impl IntoIterator<Item = &'a Pod>,
) -> Vec<EndpointSlice> {
    let Some(sel) = selector(svc) else {
        return Vec::new();
    };
    let ns = svc.namespace().unwrap_or_default();
    let name = svc.name_any();
    let fams = families(svc);
    let svc_ports: Vec<ServicePort> = svc
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default();

    let canonical = resolve_ports(&svc_ports, None);
    // (family, ports) → endpoints
    type Group = (&'static str, Vec<PortKey>);
    let mut groups: BTreeMap<Group, Vec<Endpoint>> = BTreeMap::new();
    for pod in pods {
        if pod.namespace().as_deref() != Some(ns.as_str())
            || !matches(pod, sel)
            || matches!(phase(pod), "Succeeded" | "Failed")
        {
            continue;
        }
        let running = phase(pod) == "Running";
        let terminating = pod.metadata.deletion_timestamp.is_some();
        let ports = resolve_ports(&svc_ports, Some(pod));
        for ip in pod_ips(pod) {
            let fam = if ip.is_ipv4() { "IPv4" } else { "IPv6" };
            if !fams.contains(&fam) {
                continue;
            }
            groups
                .entry((fam, ports.clone()))
                .or_default()
                .push(Endpoint {
                    addresses: vec![ip.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some(running && !terminating),
                        serving: Some(running),
                        terminating: Some(terminating),
                    }),
                    node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
                    target_ref: Some(ObjectReference {
                        kind: Some("Pod".into()),
                        namespace: Some(ns.clone()),
                        name: Some(pod.name_any()),
                        uid: pod.metadata.uid.clone(),
                        ..ObjectReference::default()
                    }),
                    ..Endpoint::default()
                });
        }
    }
    for fam in &fams {
        if !groups.keys().any(|(f, _)| f == fam) {
            groups.insert((fam, canonical.clone()), Vec::new());
        }
    }

    let owner = OwnerReference {
        api_version: "v1".into(),
        kind: "Service".into(),
        name: name.clone(),
        uid: svc.metadata.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    };
    groups
        .into_iter()
        .map(|((fam, ports), mut endpoints)| {
            endpoints.sort_by(|a, b| a.addresses.cmp(&b.addresses));
            let is_canonical = ports == canonical;
            let ports: Vec<EndpointPort> = ports
                .into_iter()
                .map(|(name, protocol, port)| EndpointPort {
                    name,
                    protocol,
                    port,
                    app_protocol: None,
                })
                .collect();
            EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(slice_name(&name, fam, &ports, is_canonical)),
                    namespace: Some(ns.clone()),
                    labels: Some(BTreeMap::from([
                        (LABEL_SERVICE_NAME.into(), name.clone()),
                        (LABEL_MANAGED_BY.into(), MANAGED_BY.into()),
                    ])),
                    owner_references: Some(vec![owner.clone()]),
                    ..ObjectMeta::default()
                },
                address_type: fam.into(),
                endpoints,
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect()
}

/// True when `current` already holds what `desired` says (the fields this controller owns).
pub fn up_to_date(current: &EndpointSlice, desired: &EndpointSlice) -> bool {
    let labels_ok = desired
        .labels()
        .iter()
        .all(|(k, v)| current.labels().get(k) == Some(v));
    labels_ok
        && current.address_type == desired.address_type
        && current.endpoints == desired.endpoints
        && current.ports.as_deref().unwrap_or_default()
            == desired.ports.as_deref().unwrap_or_default()
        && current.metadata.owner_references == desired.metadata.owner_references
}

/// Whether a slice is managed by this controller.
pub fn is_managed(slice: &EndpointSlice) -> bool {
    slice.labels().get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).expect("fixture")
    }

    fn svc(ports: serde_json::Value) -> Service {
        from(json!({
            "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid"},
            "spec": {"selector": {"app": "web"}, "clusterIP": "10.96.0.10", "ports": ports},
        }))
    }

    fn pod(name: &str, node: &str, ip: Option<&str>, phase: &str, named_port: i32) -> Pod {
        from(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"), "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": named_port}]}]},
            "status": {"phase": phase, "podIP": ip},
        }))
    }

    #[test]
    fn endpoints_ports_and_conditions() {
        let s = svc(json!([
            {"name": "a", "port": 80, "targetPort": 8080},
            {"name": "b", "port": 81},
            {"name": "c", "port": 82, "targetPort": "http"},
        ]));
        let mut other_ns = pod("x", "n1", Some("10.244.0.9"), "Running", 9000);
        other_ns.metadata.namespace = Some("elsewhere".into());
        let mut unlabelled = pod("y", "n1", Some("10.244.0.8"), "Running", 9000);
        unlabelled.metadata.labels = None;
        let garbage_ip = pod("z", "n1", Some("not-an-ip"), "Running", 9000);
        let pods = [
            pod("p1", "n1", Some("10.244.0.5"), "Running", 9000),
            pod("p2", "n2", Some("10.244.1.5"), "Pending", 9000),
            pod("p3", "n2", None, "Pending", 9000),
            pod("p4", "n2", Some("10.244.1.6"), "Succeeded", 9000),
            other_ns,
            unlabelled,
            garbage_ip,
        ];
        let out = desired_slices(&s, &pods);
        assert_eq!(out.len(), 1, "{out:#?}");
        let sl = &out[0];
        assert_eq!(sl.address_type, "IPv4");
        assert_eq!(sl.labels()[LABEL_SERVICE_NAME], "web");
        assert_eq!(sl.labels()[LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(sl.owner_references()[0].uid, "svc-uid");
        let ports: Vec<(String, i32)> = sl
            .ports
            .iter()
            .flatten()
            .map(|p| (p.name.clone().unwrap_or_default(), p.port.unwrap_or(0)))
            .collect();
        assert_eq!(
            ports,
            vec![("a".into(), 8080), ("b".into(), 81), ("c".into(), 9000)]
        );
        let eps: Vec<(&str, bool, &str)> = sl
            .endpoints
            .iter()
            .map(|e| {
                (
                    e.addresses[0].as_str(),
                    e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(false),
                    e.node_name.as_deref().unwrap_or(""),
                )
            })
            .collect();
        assert_eq!(
            eps,
            vec![("10.244.0.5", true, "n1"), ("10.244.1.5", false, "n2")]
        );
        assert_eq!(
            sl.endpoints[0]
                .target_ref
                .as_ref()
                .and_then(|r| r.name.as_deref()),
            Some("p1")
        );
    }

    #[test]
    fn named_ports_split_slices_and_empty_family_gets_placeholder() {
        let s = svc(json!([{"name": "c", "port": 82, "targetPort": "http"}]));
        let pods = [
            pod("p1", "n1", Some("10.244.0.5"), "Running", 9000),
            pod("p2", "n1", Some("10.244.0.6"), "Running", 9001),
        ];
        let out = desired_slices(&s, &pods);
        assert_eq!(out.len(), 2);
        assert_ne!(out[0].name_any(), out[1].name_any());
        assert!(out.iter().all(|s| s.name_any().starts_with("web-ipv4-")));
        let empty = desired_slices(&s, &[]);
        assert_eq!(empty.len(), 1);
        assert!(empty[0].endpoints.is_empty() && empty[0].ports.is_none());
        assert_eq!(empty[0].name_any(), "web-ipv4");
        // Deterministic names.
        assert_eq!(desired_slices(&s, &pods), out);
        // Terminating pods are not ready.
        let mut t = pod("p1", "n1", Some("10.244.0.5"), "Running", 9000);
        t.metadata.deletion_timestamp = Some(from(json!("2026-01-01T00:00:00Z")));
        let c = desired_slices(&s, &[t])[0].endpoints[0]
            .conditions
            .clone()
            .expect("conditions");
        assert_eq!((c.ready, c.terminating), (Some(false), Some(true)));
    }

    #[test]
    fn no_selector_no_slices() {
        let s: Service = from(
            json!({"metadata": {"name": "ext", "namespace": "ns"}, "spec": {"ports": [{"port": 80}]}}),
        );
        assert!(
            desired_slices(&s, &[pod("p1", "n1", Some("10.244.0.5"), "Running", 1)]).is_empty()
        );
        let s: Service = from(
            json!({"metadata": {"name": "v6", "namespace": "ns"}, "spec": {"selector": {"a": "b"}, "ipFamilies": ["IPv6"]}}),
        );
        assert_eq!(families(&s), vec!["IPv6"]);
    }
}
