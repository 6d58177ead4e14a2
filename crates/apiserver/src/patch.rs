//! PATCH bodies: JSON merge patch, JSON patch, strategic merge patch (for the built-in kinds, as
//! far as kubectl and ovnk need) and an approximation of server-side apply.

use serde_json::{Map, Value};

/// Patch flavours, from the request's `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`.
    Json,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (approximated: strategic merge without deletions by omission).
    Apply,
}

impl PatchType {
    /// From a content type; `None` when unsupported.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        let ct = ct.split(';').next().unwrap_or_default().trim();
        match ct {
            "application/json-patch+json" => Some(Self::Json),
            "application/merge-patch+json" => Some(Self::Merge),
            "application/strategic-merge-patch+json" => Some(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => Some(Self::Apply),
            _ => None,
        }
    }
}

/// Errors applying a patch (answered as 400/422).
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch body does not parse.
    #[error("{0}")]
    Malformed(String),
    /// A JSON patch operation failed.
    #[error("the server rejected our request due to an error in our request: {0}")]
    Failed(String),
}

/// Apply `body` of type `ty` to `current`.
pub fn apply(
    ty: PatchType,
    current: &Value,
    body: &[u8],
    custom: bool,
) -> Result<Value, PatchError> {
    match ty {
        PatchType::Json => {
            let p: json_patch::Patch =
                serde_json::from_slice(body).map_err(|e| PatchError::Malformed(e.to_string()))?;
            let mut doc = current.clone();
            json_patch::patch(&mut doc, &p).map_err(|e| PatchError::Failed(e.to_string()))?;
            Ok(doc)
        }
        PatchType::Merge => {
            let p: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Malformed(e.to_string()))?;
            if !p.is_object() {
                return Err(PatchError::Malformed(
                    "merge patch must be a JSON object".into(),
                ));
            }
            let mut doc = current.clone();
            json_patch::merge(&mut doc, &p);
            Ok(doc)
        }
        PatchType::Strategic => {
            if custom {
                return Err(PatchError::Malformed(
                    "strategic merge patch is not supported for custom resources; use merge patch or JSON patch".into(),
                ));
            }
            let p: Value =
                serde_json::from_slice(body).map_err(|e| PatchError::Malformed(e.to_string()))?;
            if !p.is_object() {
                return Err(PatchError::Malformed(
                    "strategic merge patch must be a JSON object".into(),
                ));
            }
            let mut doc = current.clone();
            strategic_merge(&mut doc, &p);
            Ok(doc)
        }
        PatchType::Apply => {
            let p = parse_yaml_or_json(body)?;
            if !p.is_object() {
                return Err(PatchError::Malformed(
                    "apply patch must be an object".into(),
                ));
            }
            let mut doc = current.clone();
            strategic_merge(&mut doc, &p);
            Ok(doc)
        }
    }
}

/// Parse a body that is JSON or YAML.
pub fn parse_yaml_or_json(body: &[u8]) -> Result<Value, PatchError> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return Ok(v);
    }
    let s = std::str::from_utf8(body).map_err(|e| PatchError::Malformed(e.to_string()))?;
    serde_saphyr::from_str::<Value>(s)
        .map_err(|e| PatchError::Malformed(format!("error decoding YAML: {e}")))
}

/// Merge key for a list field, by field name (and, for `ports`, by element shape).
fn merge_key(field: &str, elems: &[Value]) -> Option<&'static str> {
    Some(match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "env"
        | "volumes"
        | "imagePullSecrets" => "name",
        "volumeMounts" => "mountPath",
        "volumeDevices" => "devicePath",
        "conditions" | "addresses" => "type",
        "taints" => "key",
        "ownerReferences" => "uid",
        "hostAliases" => "ip",
        "ports" => {
            if elems.iter().any(|e| e.get("containerPort").is_some()) {
                "containerPort"
            } else {
                "port"
            }
        }
        _ => return None,
    })
}

/// Lists merged as sets of primitives.
fn primitive_merge(field: &str) -> bool {
    matches!(field, "finalizers")
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, x) in m {
                if k.starts_with('$') {
                    continue;
                }
                out.insert(k.clone(), strip_directives(x));
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

/// Strategic merge of `patch` into `target`.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Some(pm) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if pm.get("$patch").and_then(Value::as_str) == Some("replace") {
        *target = strip_directives(patch);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let retain: Option<Vec<String>> = pm.get("$retainKeys").and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    });
    for (k, pv) in pm {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(list), Some(del)) = (
                target.get_mut(field).and_then(Value::as_array_mut),
                pv.as_array(),
            ) {
                list.retain(|x| !del.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        let Some(tm) = target.as_object_mut() else {
            return;
        };
        match pv {
            Value::Null => {
                tm.remove(k);
            }
            Value::Object(o) => {
                if o.get("$patch").and_then(Value::as_str) == Some("delete") {
                    tm.remove(k);
                    continue;
                }
                let entry = tm
                    .entry(k.clone())
                    .or_insert_with(|| Value::Object(Map::new()));
                if !entry.is_object() {
                    *entry = Value::Object(Map::new());
                }
                strategic_merge(entry, pv);
            }
            Value::Array(pa) => {
                let cur = tm.get(k).and_then(Value::as_array).cloned();
                let merged = merge_list(k, cur, pa);
                tm.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                tm.insert(k.clone(), scalar.clone());
            }
        }
    }
    if let (Some(keys), Some(tm)) = (retain, target.as_object_mut()) {
        tm.retain(|k, _| keys.contains(k));
    }
}

fn merge_list(field: &str, cur: Option<Vec<Value>>, patch: &[Value]) -> Vec<Value> {
    if primitive_merge(field) {
        let mut out = cur.unwrap_or_default();
        for p in patch {
            if !out.contains(p) {
                out.push(p.clone());
            }
        }
        return out;
    }
    let all_objects = !patch.is_empty() && patch.iter().all(Value::is_object);
    let Some(key) = merge_key(field, patch).filter(|_| all_objects) else {
        return patch.iter().map(strip_directives).collect();
    };
    // A `$patch: replace` element replaces the whole list.
    if patch
        .iter()
        .any(|p| p.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return patch
            .iter()
            .filter(|p| p.get("$patch").is_none())
            .map(strip_directives)
            .collect();
    }
    let mut out = cur.unwrap_or_default();
    for p in patch {
        let kv = p.get(key).cloned().unwrap_or(Value::Null);
        let pos = out.iter().position(|e| e.get(key) == Some(&kv));
        let delete = p.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut out[i], p),
            (None, false) => out.push(strip_directives(p)),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn smp_merges_by_key() {
        let cur = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]},
                         "metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["f1"]}});
        let p = json!({"spec": {"containers": [{"name": "b", "image": "z"}, {"name": "a", "$patch": "delete"}],
                                "$setElementOrder/containers": [{"name": "b"}]},
                       "metadata": {"labels": {"a": null, "c": "3"}, "finalizers": ["f2"]}});
        let out =
            apply(PatchType::Strategic, &cur, p.to_string().as_bytes(), false).expect("patch");
        assert_eq!(
            out["spec"]["containers"],
            json!([{"name": "b", "image": "z"}])
        );
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        assert_eq!(out["metadata"]["finalizers"], json!(["f1", "f2"]));
    }

    #[test]
    fn malformed() {
        assert!(apply(PatchType::Merge, &json!({}), b"{nope", false).is_err());
        assert!(
            apply(
                PatchType::Json,
                &json!({}),
                b"[{\"op\":\"remove\",\"path\":\"/x\"}]",
                false
            )
            .is_err()
        );
        assert!(apply(PatchType::Strategic, &json!({}), b"{}", true).is_err());
    }
}
