//! TrustZones (seed 000) as a zone source: a [`zones::ZoneIndex`] kept in step with the Node
//! and TrustZone stores by applying only what changed since the last reconcile.
//!
//! The index holds each node's labels and the TrustZones selecting it; the annotation zones
//! stay with [`crate::snapshot::AnnotationZones`] (which reports a bad annotation on the Node),
//! and `node_info` unions the two sources. The connected-iff rule itself is
//! [`zones::connected`], used by the plan.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_api::trust_zone::TrustZone;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use zones::ZoneIndex;

use crate::plan::{ObjectRef, Problem};
use crate::snapshot::ZoneSource;

/// The TrustZone membership of every node, maintained incrementally.
#[derive(Debug, Default)]
pub struct TrustZones {
    index: ZoneIndex,
    /// Labels last applied to the index, per node.
    labels: HashMap<String, BTreeMap<String, String>>,
    /// Selectors last applied to the index, per TrustZone.
    selectors: BTreeMap<String, LabelSelector>,
    /// TrustZones whose selector cannot be evaluated, with the reason.
    invalid: BTreeMap<String, String>,
}

impl TrustZones {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// Brings the index up to date with `nodes` and `trust_zones`, touching only what changed.
    /// Returns the nodes whose TrustZone set changed.
    pub fn sync<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = &'a Node>,
        trust_zones: impl IntoIterator<Item = &'a TrustZone>,
    ) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        // TrustZones first, against the nodes the index already knows; new or relabelled
        // nodes are then evaluated against the final set of zones.
        let mut live_tz = BTreeSet::new();
        for tz in trust_zones {
            let Some(name) = tz.metadata.name.as_deref() else {
                continue;
            };
            live_tz.insert(name.to_owned());
            let sel = &tz.spec.node_selector;
            if self.selectors.get(name) == Some(sel) {
                continue;
            }
            self.selectors.insert(name.to_owned(), sel.clone());
            // (this index holds no annotation zones: a zone's members are its selected nodes)
            let before = self.index.members(name);
            match self.index.upsert_trust_zone(name, sel.clone()) {
                Ok(c) => {
                    self.invalid.remove(name);
                    changed.extend(c);
                }
                Err(e) => {
                    // it now selects nothing: its former members changed
                    self.invalid.insert(name.to_owned(), e.to_string());
                    changed.extend(before);
                }
            }
        }
        let gone: Vec<String> = self
            .selectors
            .keys()
            .filter(|z| !live_tz.contains(*z))
            .cloned()
            .collect();
        for z in gone {
            self.selectors.remove(&z);
            self.invalid.remove(&z);
            changed.extend(self.index.remove_trust_zone(&z));
        }
        let mut live_nodes = BTreeSet::new();
        for n in nodes {
            let Some(name) = n.metadata.name.as_deref() else {
                continue;
            };
            live_nodes.insert(name);
            let labels = n.metadata.labels.clone().unwrap_or_default();
            if self.labels.get(name) == Some(&labels) {
                continue;
            }
            self.labels.insert(name.to_owned(), labels.clone());
            if self.index.upsert_node(name, labels, BTreeSet::new()) {
                changed.insert(name.to_owned());
            }
        }
        let gone: Vec<String> = self
            .labels
            .keys()
            .filter(|n| !live_nodes.contains(n.as_str()))
            .cloned()
            .collect();
        for n in gone {
            self.labels.remove(&n);
            self.index.remove_node(&n);
            changed.insert(n);
        }
        changed
    }

    /// The TrustZones selecting `node` (empty for an unknown node).
    pub fn of(&self, node: &str) -> BTreeSet<String> {
        self.index.trust_zones_of(node).cloned().unwrap_or_default()
    }

    /// One problem per TrustZone whose selector cannot be evaluated (it selects nothing).
    pub fn problems(&self) -> Vec<Problem> {
        self.invalid
            .iter()
            .map(|(z, why)| Problem {
                object: ObjectRef::TrustZone(z.clone()),
                reason: "InvalidSelector",
                message: format!("{why}; this TrustZone selects no node until it is fixed"),
            })
            .collect()
    }
}

impl ZoneSource for TrustZones {
    fn zones(&self, node: &Node) -> Result<BTreeSet<String>, String> {
        Ok(node
            .metadata
            .name
            .as_deref()
            .map(|n| self.of(n))
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::{AnnotationZones, node_info};

    fn node(name: &str, labels: serde_json::Value, ann: Option<&str>) -> Node {
        let mut v = serde_json::json!({"metadata": {"name": name, "labels": labels}});
        if let Some(a) = ann {
            v["metadata"]["annotations"] = serde_json::json!({"k8s.ovn.org/transport-zones": a});
        }
        serde_json::from_value(v).unwrap_or_default()
    }

    fn tz(name: &str, selector: serde_json::Value) -> TrustZone {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "k8s.ovn.org/v1alpha1", "kind": "TrustZone",
            "metadata": {"name": name},
            "spec": {"nodeSelector": selector},
        }))
        .expect("trust zone")
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn zones_of(tzs: &TrustZones, n: &Node) -> BTreeSet<String> {
        node_info(n, &[&AnnotationZones, tzs]).zones
    }

    /// A node's zones = TrustZones selecting it ∪ its annotation zones; every kind of change
    /// (label, annotation, TrustZone create/update/delete, node delete) is reflected, and only
    /// the nodes it affects are reported as changed.
    #[test]
    fn zone_source_union_follows_every_change() {
        let mut v = TrustZones::new();
        let a1 = node("a1", serde_json::json!({"tenant": "a"}), None);
        let gw = node("gw", serde_json::json!({"tenant": "a"}), Some("[\"b\"]"));
        let z1 = node("z1", serde_json::json!({}), None);
        let ta = tz("a", serde_json::json!({"matchLabels": {"tenant": "a"}}));
        let changed = v.sync([&a1, &gw, &z1], [&ta]);
        assert_eq!(changed, set(&["a1", "gw"]));
        assert_eq!(zones_of(&v, &a1), set(&["a"]));
        assert_eq!(zones_of(&v, &gw), set(&["a", "b"]));
        assert_eq!(zones_of(&v, &z1), set(&[]));
        // nothing changed: nothing reported
        assert!(v.sync([&a1, &gw, &z1], [&ta]).is_empty());
        // relabel a1 to tenant b; a TrustZone for b appears in the same sync
        let a1b = node("a1", serde_json::json!({"tenant": "b"}), None);
        let tb = tz(
            "tb",
            serde_json::json!({"matchExpressions": [
            {"key": "tenant", "operator": "In", "values": ["b"]}]}),
        );
        assert_eq!(v.sync([&a1b, &gw, &z1], [&ta, &tb]), set(&["a1"]));
        assert_eq!(zones_of(&v, &a1b), set(&["tb"]));
        // update a TrustZone's selector to `{}`: selects every node
        let ta_all = tz("a", serde_json::json!({}));
        assert_eq!(v.sync([&a1b, &gw, &z1], [&ta_all, &tb]), set(&["a1", "z1"]));
        assert_eq!(zones_of(&v, &z1), set(&["a"]));
        // an annotation on z1 adds to its TrustZones
        let z1ann = node("z1", serde_json::json!({}), Some("[\"c\"]"));
        assert_eq!(zones_of(&v, &z1ann), set(&["a", "c"]));
        // delete the TrustZone: back to annotation zones only
        assert_eq!(v.sync([&a1b, &gw, &z1ann], [&tb]), set(&["a1", "gw", "z1"]));
        assert_eq!(zones_of(&v, &gw), set(&["b"]));
        // node delete
        assert_eq!(v.sync([&a1b, &z1ann], [&tb]), set(&["gw"]));
        assert_eq!(v.of("gw"), set(&[]));
    }

    /// An invalid selector: a problem on the TrustZone, it selects nothing, others unaffected;
    /// fixing it clears the problem.
    #[test]
    fn invalid_selector_is_reported_and_selects_nothing() {
        let mut v = TrustZones::new();
        let n = node("n1", serde_json::json!({"x": "1"}), None);
        let good = tz("good", serde_json::json!({"matchLabels": {"x": "1"}}));
        let bad = tz(
            "bad",
            serde_json::json!({"matchExpressions": [
            {"key": "x", "operator": "Near"}]}),
        );
        v.sync([&n], [&good, &bad]);
        assert_eq!(v.of("n1"), set(&["good"]));
        let p = v.problems();
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].object, ObjectRef::TrustZone("bad".into()));
        assert_eq!(p[0].reason, "InvalidSelector");
        let fixed = tz(
            "bad",
            serde_json::json!({"matchExpressions": [
            {"key": "x", "operator": "Exists"}]}),
        );
        assert_eq!(v.sync([&n], [&good, &fixed]), set(&["n1"]));
        assert_eq!(v.of("n1"), set(&["bad", "good"]));
        assert!(v.problems().is_empty());
        // broken again: the node it selected is reported as changed and loses the zone
        assert_eq!(v.sync([&n], [&good, &bad]), set(&["n1"]));
        assert_eq!(v.of("n1"), set(&["good"]));
    }
}
