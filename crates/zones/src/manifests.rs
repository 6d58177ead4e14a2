//! Offline planning from a directory of YAML manifests (`ovnk plan --manifests DIR`): Nodes
//! with their labels and annotations, and TrustZones. Other kinds are ignored; `List` objects
//! are unpacked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use k8s_api::annotations;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;
use serde_json::Value;

use crate::ZoneIndex;

/// A manifest directory that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not YAML: {reason}")]
    Yaml { path: String, reason: String },
    #[error("{path}: {kind} without metadata.name")]
    Unnamed { path: String, kind: String },
    #[error("{path}: TrustZone {name}: {reason}")]
    TrustZone {
        path: String,
        name: String,
        reason: String,
    },
    #[error("no Node named {0} in the manifests")]
    NoSuchNode(String),
}

/// A Node as the plan sees it.
#[derive(Clone, Debug)]
pub struct NodeManifest {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Everything read from a directory.
#[derive(Clone, Debug, Default)]
pub struct ManifestSet {
    pub nodes: Vec<NodeManifest>,
    pub trust_zones: Vec<(String, LabelSelector)>,
}

/// Reads every `*.yaml`/`*.yml`/`*.json` file of `dir` (not recursive), in name order.
pub fn load_dir(dir: &Path) -> Result<ManifestSet, ManifestError> {
    let io = |source| ManifestError::Io {
        path: dir.display().to_string(),
        source,
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml" | "json")
            )
        })
        .collect();
    files.sort();
    let mut set = ManifestSet::default();
    for f in files {
        let path = f.display().to_string();
        let text = std::fs::read_to_string(&f).map_err(|source| ManifestError::Io {
            path: path.clone(),
            source,
        })?;
        let docs: Vec<Value> =
            serde_saphyr::from_multiple(&text).map_err(|e| ManifestError::Yaml {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        for d in docs {
            add_object(&mut set, &path, d)?;
        }
    }
    Ok(set)
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn add_object(set: &mut ManifestSet, path: &str, d: Value) -> Result<(), ManifestError> {
    let kind = d["kind"].as_str().unwrap_or_default().to_owned();
    if kind == "List" || kind.ends_with("List") {
        if let Some(items) = d["items"].as_array() {
            for i in items {
                add_object(set, path, i.clone())?;
            }
        }
        return Ok(());
    }
    if kind != "Node" && kind != "TrustZone" {
        return Ok(());
    }
    let name = d["metadata"]["name"]
        .as_str()
        .ok_or_else(|| ManifestError::Unnamed {
            path: path.to_owned(),
            kind: kind.clone(),
        })?
        .to_owned();
    if kind == "Node" {
        set.nodes.push(NodeManifest {
            name,
            labels: string_map(&d["metadata"]["labels"]),
            annotations: string_map(&d["metadata"]["annotations"]),
        });
    } else {
        let sel = d["spec"]
            .get("nodeSelector")
            .ok_or_else(|| ManifestError::TrustZone {
                path: path.to_owned(),
                name: name.clone(),
                reason: "spec.nodeSelector is required".into(),
            })?;
        let sel: LabelSelector =
            serde_json::from_value(sel.clone()).map_err(|e| ManifestError::TrustZone {
                path: path.to_owned(),
                name: name.clone(),
                reason: e.to_string(),
            })?;
        set.trust_zones.push((name, sel));
    }
    Ok(())
}

/// The plan for one node.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct NodePlan {
    pub node: String,
    /// Its zones (TrustZones selecting it ∪ its annotation).
    pub zones: Vec<String>,
    /// The remote nodes it connects to.
    pub peers: Vec<String>,
    /// Problems found on the way (bad annotations, invalid selectors).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

/// Builds the index of a manifest set; returns it with the warnings (bad input is reported and
/// treated as "no zones from it", never fatal).
pub fn index(set: &ManifestSet) -> (ZoneIndex, Vec<String>) {
    let mut ix = ZoneIndex::new();
    let mut warnings = Vec::new();
    for (name, sel) in &set.trust_zones {
        if let Err(e) = ix.upsert_trust_zone(name, sel.clone()) {
            warnings.push(format!("TrustZone {name}: {e}; it selects no node"));
        }
    }
    for n in &set.nodes {
        let zones = match n.annotations.get(annotations::TRANSPORT_ZONES) {
            None => BTreeSet::new(),
            Some(v) => match annotations::parse_transport_zones(v) {
                Ok(z) => z.into_iter().collect(),
                Err(e) => {
                    warnings.push(format!("Node {}: {e}; treated as no zones", n.name));
                    BTreeSet::new()
                }
            },
        };
        ix.upsert_node(&n.name, n.labels.clone(), zones);
    }
    (ix, warnings)
}

/// The plan for `node`.
pub fn plan(set: &ManifestSet, node: &str) -> Result<NodePlan, ManifestError> {
    let (ix, warnings) = index(set);
    let zones = ix
        .zones_of(node)
        .ok_or_else(|| ManifestError::NoSuchNode(node.to_owned()))?;
    Ok(NodePlan {
        node: node.to_owned(),
        zones: zones.iter().cloned().collect(),
        peers: ix.peers(node).into_iter().collect(),
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_from_a_directory() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(
            dir.path().join("nodes.yaml"),
            r#"
apiVersion: v1
kind: Node
metadata: {name: a1, labels: {tenant: a}}
---
apiVersion: v1
kind: Node
metadata: {name: b1, annotations: {k8s.ovn.org/transport-zones: '["tenant-b"]'}}
---
apiVersion: v1
kind: Node
metadata: {name: gw, labels: {tenant: a}, annotations: {k8s.ovn.org/transport-zones: '["tenant-b"]'}}
---
apiVersion: v1
kind: Node
metadata: {name: bad, annotations: {k8s.ovn.org/transport-zones: 'tenant-b'}}
---
apiVersion: v1
kind: Service
metadata: {name: ignored}
"#,
        )
        .expect("write");
        std::fs::write(
            dir.path().join("zones.yaml"),
            "apiVersion: k8s.ovn.org/v1alpha1\nkind: TrustZone\nmetadata: {name: tenant-a}\nspec:\n  nodeSelector:\n    matchLabels: {tenant: a}\n",
        )
        .expect("write");
        let set = load_dir(dir.path()).expect("load");
        let p = plan(&set, "gw").expect("plan");
        assert_eq!(p.zones, vec!["tenant-a", "tenant-b"]);
        assert_eq!(p.peers, vec!["a1", "b1"]);
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        assert!(p.warnings[0].contains("Node bad"));
        assert_eq!(plan(&set, "bad").expect("plan").peers, Vec::<String>::new());
        assert!(matches!(
            plan(&set, "nope"),
            Err(ManifestError::NoSuchNode(_))
        ));
    }

    #[test]
    fn trust_zone_without_selector_is_an_error() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::write(
            dir.path().join("z.yaml"),
            "kind: TrustZone\nmetadata: {name: z}\nspec: {}\n",
        )
        .expect("write");
        let e = load_dir(dir.path()).expect_err("missing selector");
        assert!(e.to_string().contains("nodeSelector is required"), "{e}");
    }
}
