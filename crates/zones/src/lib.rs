//! Trust zones (seed 000, `TrustZone` objects) and transport zones (seed 001, the
//! `k8s.ovn.org/transport-zones` Node annotation) as one feature.
//!
//! A node's zones are the names of every TrustZone whose `spec.nodeSelector` selects it, plus
//! the names in its annotation; both carriers share one namespace of zone names. Two nodes are
//! *connected* iff their zone sets intersect, or both are empty — OVN's own transport-zone rule
//! (`chassis_tzones_overlap`), so zone-less nodes mesh only with each other and a node in
//! several zones connects to all of them.
//!
//! [`ZoneIndex`] keeps the membership up to date incrementally (a label change re-evaluates
//! that node against every TrustZone; a TrustZone change re-evaluates every node against that
//! zone) and answers [`ZoneIndex::peers`], the plan's question "which remote nodes does this
//! node connect to", from an inverted index. Nothing here does I/O.

pub mod manifests;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_api::trust_zone::{SelectorError, selector_matches};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// The connected-iff rule on two zone sets.
pub fn connected(a: &BTreeSet<String>, b: &BTreeSet<String>) -> bool {
    if a.is_empty() && b.is_empty() {
        return true;
    }
    // iterate the smaller set
    let (small, big) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    small.iter().any(|z| big.contains(z))
}

#[derive(Clone, Debug, Default)]
struct NodeEntry {
    labels: BTreeMap<String, String>,
    annotated: BTreeSet<String>,
    /// TrustZones selecting the node.
    selected: BTreeSet<String>,
    /// `annotated ∪ selected`.
    zones: BTreeSet<String>,
}

/// Membership of every node in every zone, maintained incrementally.
#[derive(Clone, Debug, Default)]
pub struct ZoneIndex {
    trust_zones: BTreeMap<String, LabelSelector>,
    nodes: HashMap<String, NodeEntry>,
    members: HashMap<String, BTreeSet<String>>,
    zoneless: BTreeSet<String>,
}

impl ZoneIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or updates a node (its labels and its annotation zones). Returns whether its
    /// zone set changed.
    pub fn upsert_node(
        &mut self,
        name: &str,
        labels: BTreeMap<String, String>,
        annotated: BTreeSet<String>,
    ) -> bool {
        let selected: BTreeSet<String> = self
            .trust_zones
            .iter()
            // a selector that cannot be evaluated selects nothing (upsert_trust_zone refused it)
            .filter(|(_, sel)| selector_matches(sel, &labels).unwrap_or(false))
            .map(|(z, _)| z.clone())
            .collect();
        let entry = self.nodes.entry(name.to_owned()).or_default();
        entry.labels = labels;
        entry.annotated = annotated;
        entry.selected = selected;
        self.refresh(name)
    }

    /// Removes a node. Returns whether it was known.
    pub fn remove_node(&mut self, name: &str) -> bool {
        let Some(e) = self.nodes.remove(name) else {
            return false;
        };
        self.unindex(name, &e.zones);
        true
    }

    /// Adds or updates a TrustZone. An invalid selector is refused (the zone then selects
    /// nothing) and the error says why. Returns the nodes whose zone set changed.
    pub fn upsert_trust_zone(
        &mut self,
        name: &str,
        selector: LabelSelector,
    ) -> Result<Vec<String>, SelectorError> {
        // validate once against empty labels: operator/values errors do not depend on labels
        if let Err(e) = selector_matches(&selector, &BTreeMap::new()) {
            self.trust_zones.remove(name);
            self.reevaluate_zone(name);
            return Err(e);
        }
        self.trust_zones.insert(name.to_owned(), selector);
        Ok(self.reevaluate_zone(name))
    }

    /// Removes a TrustZone. Returns the nodes whose zone set changed.
    pub fn remove_trust_zone(&mut self, name: &str) -> Vec<String> {
        self.trust_zones.remove(name);
        self.reevaluate_zone(name)
    }

    fn reevaluate_zone(&mut self, zone: &str) -> Vec<String> {
        let sel = self.trust_zones.get(zone).cloned();
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        let mut changed = Vec::new();
        for n in names {
            let Some(e) = self.nodes.get_mut(&n) else {
                continue;
            };
            let now = sel
                .as_ref()
                .is_some_and(|s| selector_matches(s, &e.labels).unwrap_or(false));
            let was = e.selected.contains(zone);
            if now == was {
                continue;
            }
            if now {
                e.selected.insert(zone.to_owned());
            } else {
                e.selected.remove(zone);
            }
            if self.refresh(&n) {
                changed.push(n);
            }
        }
        changed.sort();
        changed
    }

    /// Recomputes `zones` of one node and the inverted index. Returns whether it changed.
    fn refresh(&mut self, name: &str) -> bool {
        let Some(e) = self.nodes.get_mut(name) else {
            return false;
        };
        let zones: BTreeSet<String> = e.selected.union(&e.annotated).cloned().collect();
        let indexed = !e.zones.is_empty() || self.zoneless.contains(name);
        if zones == e.zones && indexed {
            return false;
        }
        let old = std::mem::replace(&mut e.zones, zones.clone());
        self.unindex(name, &old);
        if zones.is_empty() {
            self.zoneless.insert(name.to_owned());
        } else {
            for z in &zones {
                self.members
                    .entry(z.clone())
                    .or_default()
                    .insert(name.to_owned());
            }
        }
        old != zones
    }

    fn unindex(&mut self, name: &str, zones: &BTreeSet<String>) {
        self.zoneless.remove(name);
        for z in zones {
            if let Some(m) = self.members.get_mut(z) {
                m.remove(name);
                if m.is_empty() {
                    self.members.remove(z);
                }
            }
        }
    }

    /// The zones of `node` (None if unknown).
    pub fn zones_of(&self, node: &str) -> Option<&BTreeSet<String>> {
        self.nodes.get(node).map(|e| &e.zones)
    }

    /// The TrustZones selecting `node`.
    pub fn trust_zones_of(&self, node: &str) -> Option<&BTreeSet<String>> {
        self.nodes.get(node).map(|e| &e.selected)
    }

    /// Members of `zone` (from either carrier), sorted.
    pub fn members(&self, zone: &str) -> Vec<String> {
        self.members
            .get(zone)
            .map(|m| m.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether two known nodes are connected.
    pub fn connected(&self, a: &str, b: &str) -> bool {
        match (self.nodes.get(a), self.nodes.get(b)) {
            (Some(x), Some(y)) => connected(&x.zones, &y.zones),
            _ => false,
        }
    }

    /// The remote nodes `node` connects to, sorted (the plan's remote set).
    pub fn peers(&self, node: &str) -> BTreeSet<String> {
        let Some(e) = self.nodes.get(node) else {
            return BTreeSet::new();
        };
        let mut out = BTreeSet::new();
        if e.zones.is_empty() {
            out.extend(self.zoneless.iter().cloned());
        } else {
            for z in &e.zones {
                if let Some(m) = self.members.get(z) {
                    out.extend(m.iter().cloned());
                }
            }
        }
        out.remove(node);
        out
    }

    /// Every TrustZone name, sorted.
    pub fn trust_zone_names(&self) -> Vec<String> {
        self.trust_zones.keys().cloned().collect()
    }

    /// Every node name, unsorted.
    pub fn node_names(&self) -> impl Iterator<Item = &String> {
        self.nodes.keys()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| s.to_string()).collect()
    }
    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
    fn by_label(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(labels(&[(k, v)])),
            ..Default::default()
        }
    }

    #[test]
    fn the_rule() {
        assert!(connected(&set(&[]), &set(&[])));
        assert!(!connected(&set(&["a"]), &set(&[])));
        assert!(!connected(&set(&[]), &set(&["a"])));
        assert!(connected(&set(&["a"]), &set(&["b", "a"])));
        assert!(!connected(&set(&["a"]), &set(&["b"])));
    }

    /// Seed 001's stories: two tenants, a gateway in both, zone-less nodes.
    #[test]
    fn tenants_gateway_and_zoneless() {
        let mut ix = ZoneIndex::new();
        ix.upsert_trust_zone("tenant-a", by_label("tenant", "a"))
            .expect("valid");
        ix.upsert_node("a1", labels(&[("tenant", "a")]), set(&[]));
        ix.upsert_node("a2", labels(&[("tenant", "a")]), set(&[]));
        ix.upsert_node("b1", labels(&[]), set(&["tenant-b"]));
        ix.upsert_node("b2", labels(&[]), set(&["tenant-b"]));
        ix.upsert_node("gw", labels(&[("tenant", "a")]), set(&["tenant-b"]));
        ix.upsert_node("z1", labels(&[]), set(&[]));
        ix.upsert_node("z2", labels(&[]), set(&[]));
        assert_eq!(ix.peers("a1"), set(&["a2", "gw"]));
        assert_eq!(ix.peers("b1"), set(&["b2", "gw"]));
        assert_eq!(ix.peers("gw"), set(&["a1", "a2", "b1", "b2"]));
        assert_eq!(ix.peers("z1"), set(&["z2"]));
        assert_eq!(ix.zones_of("gw"), Some(&set(&["tenant-a", "tenant-b"])));

        // relabel a2 from A to B
        assert!(ix.upsert_node("a2", labels(&[("tenant", "b")]), set(&[])));
        assert_eq!(
            ix.peers("a2"),
            set(&["z1", "z2"]),
            "no zone now: meshes with zone-less"
        );
        ix.upsert_trust_zone("tenant-b-labels", by_label("tenant", "b"))
            .expect("valid");
        assert_eq!(
            ix.peers("a2"),
            set(&[]),
            "its only zone has no other member"
        );
        // delete the TrustZone of tenant A: a1 becomes zone-less
        let changed = ix.remove_trust_zone("tenant-a");
        assert_eq!(
            changed,
            vec!["a1".to_owned(), "gw".to_owned()],
            "both lose tenant-a"
        );
        assert_eq!(ix.peers("a1"), set(&["z1", "z2"]));
        // annotate a zone-less node
        ix.upsert_node("z1", labels(&[]), set(&["tenant-b"]));
        assert_eq!(ix.peers("z1"), set(&["b1", "b2", "gw"]));
        assert_eq!(ix.peers("z2"), set(&["a1"]));
        ix.remove_node("gw");
        assert_eq!(ix.peers("b1"), set(&["b2", "z1"]));
    }

    #[test]
    fn invalid_selector_selects_nothing() {
        let mut ix = ZoneIndex::new();
        ix.upsert_node("n1", labels(&[("x", "1")]), set(&[]));
        ix.upsert_trust_zone("z", by_label("x", "1"))
            .expect("valid");
        assert_eq!(ix.zones_of("n1"), Some(&set(&["z"])));
        let bad = LabelSelector {
            match_expressions: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement {
                    key: "x".into(),
                    operator: "Near".into(),
                    values: None,
                },
            ]),
            ..Default::default()
        };
        assert!(ix.upsert_trust_zone("z", bad).is_err());
        assert_eq!(ix.zones_of("n1"), Some(&set(&[])));
    }

    #[test]
    fn empty_selector_selects_every_node() {
        let mut ix = ZoneIndex::new();
        ix.upsert_node("n1", labels(&[]), set(&[]));
        ix.upsert_node("n2", labels(&[("a", "b")]), set(&["other"]));
        ix.upsert_trust_zone("all", LabelSelector::default())
            .expect("valid");
        assert_eq!(ix.peers("n1"), set(&["n2"]));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Node(usize, u8, Vec<usize>),
        DelNode(usize),
        Zone(usize, u8),
        DelZone(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (
                0..12usize,
                0..4u8,
                proptest::collection::vec(0..5usize, 0..3)
            )
                .prop_map(|(n, l, z)| Op::Node(n, l, z)),
            (0..12usize).prop_map(Op::DelNode),
            (0..5usize, 0..4u8).prop_map(|(z, l)| Op::Zone(z, l)),
            (0..5usize).prop_map(Op::DelZone),
        ]
    }

    proptest! {
        /// After any sequence of node/label/annotation/TrustZone changes, the incremental
        /// index answers exactly what the connected-iff rule computed from scratch says.
        #[test]
        fn incremental_index_equals_the_rule(ops in proptest::collection::vec(op(), 1..60)) {
            let mut ix = ZoneIndex::new();
            let mut nodes: BTreeMap<String, (u8, BTreeSet<String>)> = BTreeMap::new();
            let mut tzs: BTreeMap<String, u8> = BTreeMap::new();
            for o in ops {
                match o {
                    Op::Node(n, l, z) => {
                        let ann: BTreeSet<String> = z.iter().map(|i| format!("z{i}")).collect();
                        ix.upsert_node(&format!("n{n}"), labels(&[("color", &l.to_string())]), ann.clone());
                        nodes.insert(format!("n{n}"), (l, ann));
                    }
                    Op::DelNode(n) => { ix.remove_node(&format!("n{n}")); nodes.remove(&format!("n{n}")); }
                    Op::Zone(z, l) => {
                        ix.upsert_trust_zone(&format!("z{z}"), by_label("color", &l.to_string())).expect("valid");
                        tzs.insert(format!("z{z}"), l);
                    }
                    Op::DelZone(z) => { ix.remove_trust_zone(&format!("z{z}")); tzs.remove(&format!("z{z}")); }
                }
            }
            let zones_of = |l: u8, ann: &BTreeSet<String>| -> BTreeSet<String> {
                let mut s = ann.clone();
                s.extend(tzs.iter().filter(|(_, tl)| **tl == l).map(|(z, _)| z.clone()));
                s
            };
            for (a, (la, ana)) in &nodes {
                let za = zones_of(*la, ana);
                prop_assert_eq!(ix.zones_of(a), Some(&za));
                let want: BTreeSet<String> = nodes.iter()
                    .filter(|(b, _)| *b != a)
                    .filter(|(_, (lb, anb))| connected(&za, &zones_of(*lb, anb)))
                    .map(|(b, _)| b.clone())
                    .collect();
                prop_assert_eq!(ix.peers(a), want);
            }
        }
    }
}
