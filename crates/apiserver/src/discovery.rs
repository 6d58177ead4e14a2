//! Discovery documents, `/version`, OpenAPI v3 and Table output.

use crate::registry::{ResourceDef, StatusStrategy};
use crate::timeutil;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;

/// The Kubernetes version this server reports (kubectl picks its client version from it).
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-ovnk",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// Groups and their versions, in registry order (core excluded).
fn groups(defs: &[ResourceDef]) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for d in defs.iter().filter(|d| !d.group.is_empty()) {
        match out.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, vs)) => {
                if !vs.contains(&d.version) {
                    vs.push(d.version.clone());
                }
            }
            None => out.push((d.group.clone(), vec![d.version.clone()])),
        }
    }
    out
}

fn group_doc(g: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{g}/{v}"), "version": v}))
        .collect();
    let preferred = vs.first().cloned().unwrap_or(Value::Null);
    json!({"name": g, "versions": vs, "preferredVersion": preferred})
}

/// `/api`.
pub fn api_versions(server_addr: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_addr}]})
}

/// `/apis`.
pub fn api_group_list(defs: &[ResourceDef]) -> Value {
    let gs: Vec<Value> = groups(defs)
        .iter()
        .map(|(g, vs)| group_doc(g, vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/<group>`.
pub fn api_group(defs: &[ResourceDef], group: &str) -> Option<Value> {
    groups(defs)
        .into_iter()
        .find(|(g, _)| g == group)
        .map(|(g, vs)| {
            let mut d = group_doc(&g, &vs);
            d["kind"] = json!("APIGroup");
            d["apiVersion"] = json!("v1");
            d
        })
}

/// `/api/v1` or `/apis/<group>/<version>`.
pub fn resource_list(defs: &[ResourceDef], group: &str, version: &str) -> Option<Value> {
    let mine: Vec<&ResourceDef> = defs
        .iter()
        .filter(|d| d.group == group && d.version == version)
        .collect();
    if mine.is_empty() {
        return None;
    }
    let mut res = Vec::new();
    for d in mine {
        let mut r = json!({
            "name": d.plural, "singularName": d.singular, "namespaced": d.namespaced, "kind": d.kind,
            "verbs": crate::registry::verbs(),
        });
        if !d.short_names.is_empty() {
            r["shortNames"] = json!(d.short_names);
        }
        if !d.categories.is_empty() {
            r["categories"] = json!(d.categories);
        }
        res.push(r);
        if d.status != StatusStrategy::None {
            res.push(json!({"name": format!("{}/status", d.plural), "singularName": "", "namespaced": d.namespaced, "kind": d.kind, "verbs": ["get", "patch", "update"]}));
        }
        if d.approval {
            res.push(json!({"name": format!("{}/approval", d.plural), "singularName": "", "namespaced": d.namespaced, "kind": d.kind, "verbs": ["get", "patch", "update"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": res}),
    )
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per group/version.
pub fn openapi_root(defs: &[ResourceDef], hash: u64) -> Value {
    let mut paths = Map::new();
    let mut seen = Vec::new();
    for d in defs {
        let p = gv_path(&d.group, &d.version);
        if !seen.contains(&p) {
            paths.insert(
                p.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash:016X}")}),
            );
            seen.push(p);
        }
    }
    json!({"paths": paths})
}

fn schema_name(d: &ResourceDef) -> String {
    let g: Vec<&str> = if d.group.is_empty() {
        vec!["core"]
    } else {
        d.group.split('.').collect()
    };
    format!("io.ovnk.{}.{}.{}", g.join("."), d.version, d.kind)
}

/// `/openapi/v3/<api|apis/...>`: paths with PATCH operations advertising `fieldValidation` (so
/// kubectl validates server-side) and a schema per kind.
pub fn openapi_gv(defs: &[ResourceDef], gvp: &str) -> Option<Value> {
    let mine: Vec<&ResourceDef> = defs
        .iter()
        .filter(|d| gv_path(&d.group, &d.version) == gvp)
        .collect();
    if mine.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for d in mine {
        let gvk = json!({"group": d.group, "version": d.version, "kind": d.kind});
        let sname = schema_name(d);
        let sref = json!({"$ref": format!("#/components/schemas/{sname}")});
        let params = json!([
            {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
        ]);
        let body = json!({"content": {"application/json": {"schema": sref}, "application/merge-patch+json": {"schema": {"type": "object"}}, "application/json-patch+json": {"schema": {"type": "object"}}, "application/apply-patch+yaml": {"schema": {"type": "object"}}}});
        let op = |action: &str| {
            json!({"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk, "parameters": params, "requestBody": body,
                   "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": sref}}}}})
        };
        let base = format!("/{gvp}");
        let coll = if d.namespaced {
            format!("{base}/namespaces/{{namespace}}/{}", d.plural)
        } else {
            format!("{base}/{}", d.plural)
        };
        paths.insert(coll.clone(), json!({"post": op("post"), "get": {"x-kubernetes-action": "list", "x-kubernetes-group-version-kind": gvk, "responses": {"200": {"description": "OK"}}}}));
        paths.insert(format!("{coll}/{{name}}"), json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
        if d.status != StatusStrategy::None {
            paths.insert(
                format!("{coll}/{{name}}/status"),
                json!({"get": op("get"), "put": op("put"), "patch": op("patch")}),
            );
        }
        let mut schema = d
            .crd
            .as_ref()
            .and_then(|c| c.schema.clone())
            .unwrap_or_else(
                || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
            );
        if let Some(m) = schema.as_object_mut() {
            m.insert("x-kubernetes-group-version-kind".into(), json!([gvk]));
            let props = m.entry("properties").or_insert_with(|| json!({}));
            if let Some(p) = props.as_object_mut() {
                p.entry("apiVersion").or_insert(json!({"type": "string"}));
                p.entry("kind").or_insert(json!({"type": "string"}));
                p.insert(
                    "metadata".into(),
                    json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
                );
            }
        }
        schemas.insert(sname, schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas}
    }))
}

/// Evaluate the simple JSONPath forms printer columns use.
pub fn json_path(obj: &Value, path: &str) -> Vec<Value> {
    let path = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('$');
    let mut cur = vec![obj.clone()];
    let mut rest = path;
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            let key = &r[..end];
            cur = cur.iter().filter_map(|v| v.get(key).cloned()).collect();
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let Some(end) = r.find(']') else {
                return Vec::new();
            };
            let inner = &r[..end];
            rest = &r[end + 1..];
            if inner == "*" {
                cur = cur
                    .iter()
                    .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                    .collect();
            } else if let Ok(i) = inner.parse::<usize>() {
                cur = cur.iter().filter_map(|v| v.get(i).cloned()).collect();
            } else if let Some(f) = inner.strip_prefix("?(@.").and_then(|f| f.strip_suffix(')')) {
                let Some((k, want)) = f.split_once("==") else {
                    return Vec::new();
                };
                let want = want.trim().trim_matches(['"', '\'']);
                cur = cur
                    .iter()
                    .flat_map(|v| v.as_array().cloned().unwrap_or_default())
                    .filter(|e| crate::selector::field_value(e, k.trim()) == want)
                    .collect();
            } else {
                cur = cur
                    .iter()
                    .filter_map(|v| v.get(inner.trim_matches(['"', '\''])).cloned())
                    .collect();
            }
        } else {
            return Vec::new();
        }
    }
    cur
}

fn cell(v: &[Value], ty: &str) -> Value {
    match v {
        [] => Value::Null,
        [one] => match (ty, one) {
            ("date", Value::String(s)) => Value::String(timeutil::age(s)),
            (_, Value::String(_) | Value::Number(_) | Value::Bool(_)) => one.clone(),
            _ => Value::String(one.to_string()),
        },
        many => Value::String(
            many.iter()
                .map(|x| match x {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(","),
        ),
    }
}

/// Column definitions for a kind.
pub fn columns(def: &ResourceDef) -> Vec<Value> {
    let mut cols = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    let printer = def
        .crd
        .as_ref()
        .map(|c| c.printer_columns.clone())
        .unwrap_or_default();
    if printer.is_empty() {
        if def.kind == "Node" && def.group.is_empty() {
            cols.push(json!({"name": "Status", "type": "string", "format": "", "description": "The status of the node", "priority": 0}));
        }
        cols.push(json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    } else {
        for c in printer {
            cols.push(json!({
                "name": c["name"], "type": c["type"].as_str().unwrap_or("string"), "format": c["format"].as_str().unwrap_or_default(),
                "description": c["description"].as_str().unwrap_or_default(), "priority": c["priority"].as_i64().unwrap_or(0)
            }));
        }
    }
    cols
}

/// A Table row for one object.
pub fn row(def: &ResourceDef, obj: &Value) -> Value {
    let name = obj["metadata"]["name"].clone();
    let mut cells = vec![name];
    let printer = def
        .crd
        .as_ref()
        .map(|c| c.printer_columns.clone())
        .unwrap_or_default();
    if printer.is_empty() {
        if def.kind == "Node" && def.group.is_empty() {
            let ready = json_path(obj, ".status.conditions[?(@.type==\"Ready\")].status");
            let s = match ready.first().and_then(Value::as_str) {
                Some("True") => "Ready",
                Some(_) => "NotReady",
                None => "Unknown",
            };
            cells.push(json!(s));
        }
        cells.push(json!(timeutil::age(
            obj["metadata"]["creationTimestamp"]
                .as_str()
                .unwrap_or_default()
        )));
    } else {
        for c in printer {
            let v = json_path(obj, c["jsonPath"].as_str().unwrap_or_default());
            cells.push(cell(&v, c["type"].as_str().unwrap_or("string")));
        }
    }
    let partial = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]});
    json!({"cells": cells, "object": partial})
}

/// A Table for a list of objects.
pub fn table(def: &ResourceDef, objs: &[Value], list_meta: Value) -> Value {
    let rows: Vec<Value> = objs.iter().map(|o| row(def, o)).collect();
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list_meta, "columnDefinitions": columns(def), "rows": rows})
}

/// Group objects by namespace (helper for tests and callers that need it).
pub fn by_namespace(objs: &[Value]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for o in objs {
        *m.entry(
            o["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        )
        .or_insert(0) += 1;
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        let o = json!({"status": {"conditions": [{"type": "A", "status": "x"}, {"type": "Ready", "status": "True"}]}, "spec": {"l": [{"n": 1}, {"n": 2}]}});
        assert_eq!(
            json_path(&o, ".status.conditions[?(@.type==\"Ready\")].status"),
            vec![json!("True")]
        );
        assert_eq!(json_path(&o, ".spec.l[*].n"), vec![json!(1), json!(2)]);
        assert_eq!(json_path(&o, ".spec.l[1].n"), vec![json!(2)]);
        assert!(json_path(&o, ".nope.x").is_empty());
    }
}
