//! Admission: the NodeRestriction plugin (for `system:node:<name>` users) and validating
//! admission webhooks (rules, namespace/object selectors, the `matchConditions` CEL subset,
//! `failurePolicy`, `timeoutSeconds`, HTTPS with the configuration's `caBundle`).

use crate::authz::UserInfo;
use crate::error::ApiError;
use crate::registry::ResourceDef;
use crate::selector;
use crate::store::Store;
use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// One admission decision's input.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// CREATE, UPDATE or DELETE.
    pub operation: &'a str,
    /// The kind.
    pub def: &'a ResourceDef,
    /// Subresource ("" for none).
    pub subresource: &'a str,
    /// Namespace ("" for cluster scope).
    pub namespace: &'a str,
    /// Object name.
    pub name: &'a str,
    /// New object (CREATE/UPDATE).
    pub object: Option<&'a Value>,
    /// Stored object (UPDATE/DELETE).
    pub old_object: Option<&'a Value>,
    /// The caller.
    pub user: &'a UserInfo,
    /// dryRun=All.
    pub dry_run: bool,
}

const KUBELET_LABELS: &[&str] = &[
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "node.kubernetes.io/instance-type",
    "beta.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

fn in_domain(ns: &str, domain: &str) -> bool {
    ns == domain || ns.ends_with(&format!(".{domain}"))
}

/// Whether NodeRestriction forbids a node to set this label key.
pub fn forbidden_node_label(key: &str) -> bool {
    let Some((ns, _)) = key.split_once('/') else {
        return false;
    };
    if in_domain(ns, "node-restriction.kubernetes.io") {
        return true;
    }
    if !(in_domain(ns, "kubernetes.io") || in_domain(ns, "k8s.io")) {
        return false;
    }
    !(KUBELET_LABELS.contains(&key)
        || in_domain(ns, "kubelet.kubernetes.io")
        || in_domain(ns, "node.kubernetes.io"))
}

fn labels(v: Option<&Value>) -> BTreeMap<String, String> {
    v.map(selector::labels_of).unwrap_or_default()
}

fn deny(def: &ResourceDef, name: &str, msg: String) -> ApiError {
    let what = if def.group.is_empty() {
        format!("{} \"{name}\"", def.plural)
    } else {
        format!("{}.{} \"{name}\"", def.plural, def.group)
    };
    ApiError::forbidden(format!("{what} is forbidden: {msg}"))
}

/// The NodeRestriction admission plugin.
pub fn node_restriction(r: &Request<'_>) -> Result<(), ApiError> {
    let Some(node) = r.user.node_name() else {
        return Ok(());
    };
    let d = r.def;
    match (d.group.as_str(), d.plural.as_str()) {
        ("", "nodes") => {
            if r.name != node {
                return Err(deny(
                    d,
                    r.name,
                    format!(
                        "node \"{node}\" is not allowed to modify node \"{}\"",
                        r.name
                    ),
                ));
            }
            let new = labels(r.object);
            let old = labels(r.old_object);
            let mut bad: Vec<String> = match r.operation {
                "CREATE" => new
                    .keys()
                    .filter(|k| forbidden_node_label(k))
                    .cloned()
                    .collect(),
                "UPDATE" => {
                    let mut keys: Vec<String> = new
                        .iter()
                        .filter(|(k, v)| old.get(*k) != Some(*v))
                        .map(|(k, _)| k.clone())
                        .collect();
                    keys.extend(old.keys().filter(|k| !new.contains_key(*k)).cloned());
                    keys.into_iter()
                        .filter(|k| forbidden_node_label(k))
                        .collect()
                }
                _ => Vec::new(),
            };
            bad.sort();
            bad.dedup();
            if !bad.is_empty() {
                let verb = if r.operation == "CREATE" {
                    "set the following labels"
                } else {
                    "modify labels"
                };
                return Err(deny(
                    d,
                    r.name,
                    format!(
                        "node \"{node}\" is not allowed to {verb}: {}",
                        bad.join(", ")
                    ),
                ));
            }
            if r.operation == "UPDATE"
                && let (Some(o), Some(n)) = (r.old_object, r.object)
            {
                if o["spec"]["taints"] != n["spec"]["taints"] {
                    return Err(deny(
                        d,
                        r.name,
                        format!("node \"{node}\" is not allowed to modify taints"),
                    ));
                }
                if !n["spec"]["configSource"].is_null()
                    && o["spec"]["configSource"] != n["spec"]["configSource"]
                {
                    return Err(deny(
                        d,
                        r.name,
                        format!("node \"{node}\" is not allowed to set spec.configSource"),
                    ));
                }
            }
            if r.operation == "CREATE"
                && r.object
                    .is_some_and(|o| !o["spec"]["configSource"].is_null())
            {
                return Err(deny(
                    d,
                    r.name,
                    format!(
                        "node \"{node}\" is not allowed to create pods with a non-nil configSource"
                    ),
                ));
            }
            Ok(())
        }
        ("", "pods") => match (r.operation, r.subresource) {
            ("CREATE", "") => {
                let o = r.object.cloned().unwrap_or_default();
                if o["metadata"]["annotations"]["kubernetes.io/config.mirror"].is_null() {
                    return Err(deny(
                        d,
                        r.name,
                        format!(
                            "pod does not have \"kubernetes.io/config.mirror\" annotation, node \"{node}\" can only create mirror pods"
                        ),
                    ));
                }
                if o["spec"]["nodeName"].as_str() != Some(node) {
                    return Err(deny(
                        d,
                        r.name,
                        format!(
                            "node \"{node}\" can only create pods with spec.nodeName set to itself"
                        ),
                    ));
                }
                Ok(())
            }
            ("DELETE", "") => {
                if r.old_object.and_then(|o| o["spec"]["nodeName"].as_str()) != Some(node) {
                    return Err(deny(
                        d,
                        r.name,
                        format!(
                            "node \"{node}\" can only delete pods with spec.nodeName set to itself"
                        ),
                    ));
                }
                Ok(())
            }
            ("UPDATE", "status") => {
                if r.old_object.and_then(|o| o["spec"]["nodeName"].as_str()) != Some(node) {
                    return Err(deny(
                        d,
                        r.name,
                        format!(
                            "node \"{node}\" can only update pod status for pods with spec.nodeName set to itself"
                        ),
                    ));
                }
                if labels(r.object) != labels(r.old_object) {
                    return Err(deny(
                        d,
                        r.name,
                        format!("node \"{node}\" cannot update labels through pod status"),
                    ));
                }
                Ok(())
            }
            ("UPDATE", "") => Err(deny(
                d,
                r.name,
                format!("node \"{node}\" can only update pod status"),
            )),
            _ => Ok(()),
        },
        ("coordination.k8s.io", "leases") => {
            if r.namespace != "kube-node-lease" || r.name != node {
                return Err(deny(
                    d,
                    r.name,
                    format!(
                        "can only access node lease with the same name as the requesting node \"{node}\""
                    ),
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Roots a matchCondition may use.
pub const MATCH_ROOTS: &[&str] = &[
    "object",
    "oldObject",
    "request",
    "namespaceObject",
    "params",
];

/// Check a ValidatingWebhookConfiguration at create/update time: returns field errors.
pub fn validate_configuration(obj: &Value) -> Vec<(String, String)> {
    let mut errs = Vec::new();
    for (i, wh) in obj["webhooks"].as_array().into_iter().flatten().enumerate() {
        let base = format!("webhooks[{i}]");
        if wh["name"].as_str().is_none_or(str::is_empty) {
            errs.push((format!("{base}.name"), "Required value".into()));
        }
        match wh["clientConfig"]["url"].as_str() {
            Some(u) if u.starts_with("https://") => {}
            Some(u) => errs.push((
                format!("{base}.clientConfig.url"),
                format!("Unsupported value: \"{u}\": supported values: \"https\""),
            )),
            None if wh["clientConfig"]["service"].is_object() => {}
            None => errs.push((
                format!("{base}.clientConfig"),
                "Required value: exactly one of url or service is required".into(),
            )),
        }
        if wh["sideEffects"].is_null() {
            errs.push((
                format!("{base}.sideEffects"),
                "Required value: must specify one of None, NoneOnDryRun".into(),
            ));
        }
        if wh["admissionReviewVersions"]
            .as_array()
            .is_none_or(|a| !a.iter().any(|v| v.as_str() == Some("v1")))
        {
            errs.push((
                format!("{base}.admissionReviewVersions"),
                "Required value: must include v1".into(),
            ));
        }
        if let Some(t) = wh["timeoutSeconds"].as_i64()
            && !(1..=30).contains(&t)
        {
            errs.push((
                format!("{base}.timeoutSeconds"),
                format!("Invalid value: {t}: the timeout value must be between 1 and 30 seconds"),
            ));
        }
        for (j, mc) in wh["matchConditions"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            let expr = mc["expression"].as_str().unwrap_or_default();
            if let Err(e) = crate::cel::parse(expr, MATCH_ROOTS) {
                errs.push((
                    format!("{base}.matchConditions[{j}].expression"),
                    format!("Invalid value: \"{expr}\": compilation failed (outside the supported CEL subset): {e}"),
                ));
            }
        }
    }
    errs
}

fn list_has(list: &Value, want: &str) -> bool {
    list.as_array().is_some_and(|a| {
        a.iter()
            .any(|x| x.as_str() == Some("*") || x.as_str() == Some(want))
    })
}

fn resource_rule_matches(list: &Value, resource: &str, sub: &str) -> bool {
    list.as_array().is_some_and(|a| {
        a.iter().filter_map(Value::as_str).any(|r| {
            if r == "*/*" {
                return true;
            }
            let (rr, rs) = r.split_once('/').unwrap_or((r, ""));
            (rr == "*" || rr == resource) && (rs == sub || (rs == "*" && !sub.is_empty()))
        })
    })
}

fn rules_match(wh: &Value, r: &Request<'_>) -> bool {
    wh["rules"].as_array().into_iter().flatten().any(|rule| {
        list_has(&rule["operations"], r.operation)
            && list_has(&rule["apiGroups"], &r.def.group)
            && list_has(&rule["apiVersions"], &r.def.version)
            && resource_rule_matches(&rule["resources"], &r.def.plural, r.subresource)
            && match rule["scope"].as_str() {
                Some("Cluster") => !r.def.namespaced,
                Some("Namespaced") => r.def.namespaced,
                _ => true,
            }
    })
}

fn selector_matches(sel: &Value, labels: &BTreeMap<String, String>) -> bool {
    if sel.is_null() {
        return true;
    }
    match selector::from_label_selector_object(sel) {
        Ok(s) => s.matches(labels),
        Err(_) => false,
    }
}

fn gvr(def: &ResourceDef) -> (Value, Value) {
    (
        json!({"group": def.group, "version": def.version, "kind": def.kind}),
        json!({"group": def.group, "version": def.version, "resource": def.plural}),
    )
}

/// Build the `admission.k8s.io/v1` AdmissionReview for a request.
pub fn review(r: &Request<'_>, uid: &str) -> Value {
    let (kind, resource) = gvr(r.def);
    let mut req = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": kind,
        "requestResource": resource,
        "name": r.name,
        "operation": r.operation,
        "userInfo": {"username": r.user.username, "groups": r.user.groups},
        "object": r.object.cloned().unwrap_or(Value::Null),
        "oldObject": r.old_object.cloned().unwrap_or(Value::Null),
        "dryRun": r.dry_run,
        "options": match r.operation {
            "CREATE" => json!({"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"}),
            "UPDATE" => json!({"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}),
            _ => json!({"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}),
        },
    });
    if !r.subresource.is_empty() {
        req["subResource"] = json!(r.subresource);
        req["requestSubResource"] = json!(r.subresource);
    }
    if !r.namespace.is_empty() {
        req["namespace"] = json!(r.namespace);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req})
}

/// Run every matching validating webhook.
pub async fn run_webhooks(store: &Store, r: &Request<'_>) -> Result<(), ApiError> {
    let (configs, _) = store.list(
        "admissionregistration.k8s.io/validatingwebhookconfigurations",
        None,
    );
    if configs.is_empty() {
        return Ok(());
    }
    let ns_labels = if r.def.namespaced && !r.namespace.is_empty() {
        store
            .get("/namespaces", "", r.namespace)
            .map(|n| selector::labels_of(&n))
            .unwrap_or_default()
    } else if r.def.kind == "Namespace" && r.def.group.is_empty() {
        labels(r.object.or(r.old_object))
    } else {
        BTreeMap::new()
    };
    let uid = uuid::Uuid::new_v4().to_string();
    let review = review(r, &uid);
    for cfg in configs {
        for wh in cfg["webhooks"].as_array().into_iter().flatten() {
            if !rules_match(wh, r) {
                continue;
            }
            if (r.def.namespaced || r.def.kind == "Namespace")
                && !selector_matches(&wh["namespaceSelector"], &ns_labels)
            {
                continue;
            }
            if !wh["objectSelector"].is_null()
                && !selector_matches(&wh["objectSelector"], &labels(r.object))
                && !selector_matches(&wh["objectSelector"], &labels(r.old_object))
            {
                continue;
            }
            let name = wh["name"].as_str().unwrap_or_default();
            let fail_closed = wh["failurePolicy"].as_str() != Some("Ignore");
            match match_conditions(wh, &review, store, r) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(e) if fail_closed => {
                    return Err(ApiError::internal(format!(
                        "failed calling webhook \"{name}\": failed to evaluate match condition: {e}"
                    )));
                }
                Err(_) => continue,
            }
            let timeout =
                Duration::from_secs(wh["timeoutSeconds"].as_u64().unwrap_or(10).clamp(1, 30));
            match tokio::time::timeout(timeout, call(wh, &review)).await {
                Ok(Ok(resp)) => {
                    let rs = &resp["response"];
                    if rs["uid"].as_str() != Some(uid.as_str()) {
                        if fail_closed {
                            return Err(ApiError::internal(format!(
                                "failed calling webhook \"{name}\": expected response.uid=\"{uid}\", got \"{}\"",
                                rs["uid"].as_str().unwrap_or_default()
                            )));
                        }
                        continue;
                    }
                    if rs["allowed"].as_bool() != Some(true) {
                        let st = &rs["status"];
                        let code = st["code"]
                            .as_u64()
                            .and_then(|c| u16::try_from(c).ok())
                            .filter(|c| (400..600).contains(c))
                            .unwrap_or(403);
                        let msg = match st["message"].as_str().filter(|m| !m.is_empty()) {
                            Some(m) => {
                                format!("admission webhook \"{name}\" denied the request: {m}")
                            }
                            None => format!(
                                "admission webhook \"{name}\" denied the request without explanation"
                            ),
                        };
                        let reason = if code == 403 {
                            "Forbidden"
                        } else if code == 422 {
                            "Invalid"
                        } else {
                            "BadRequest"
                        };
                        return Err(ApiError::custom(code, reason, msg));
                    }
                }
                Ok(Err(e)) => {
                    tracing::info!(webhook = name, error = %e, fail_closed, "webhook call failed");
                    if fail_closed {
                        return Err(ApiError::internal(format!(
                            "failed calling webhook \"{name}\": failed to call webhook: {e}"
                        )));
                    }
                }
                Err(_) => {
                    tracing::info!(webhook = name, fail_closed, "webhook call timed out");
                    if fail_closed {
                        return Err(ApiError::internal(format!(
                            "failed calling webhook \"{name}\": failed to call webhook: context deadline exceeded"
                        )));
                    }
                }
            }
        }
    }
    Ok(())
}

fn match_conditions(
    wh: &Value,
    review: &Value,
    store: &Store,
    r: &Request<'_>,
) -> Result<bool, String> {
    let conds = wh["matchConditions"].as_array();
    let Some(conds) = conds.filter(|c| !c.is_empty()) else {
        return Ok(true);
    };
    let mut env = HashMap::new();
    env.insert("request".to_string(), review["request"].clone());
    env.insert(
        "object".to_string(),
        r.object.cloned().unwrap_or(Value::Null),
    );
    env.insert(
        "oldObject".to_string(),
        r.old_object.cloned().unwrap_or(Value::Null),
    );
    let ns_obj = if r.namespace.is_empty() {
        None
    } else {
        store.get("/namespaces", "", r.namespace)
    };
    env.insert(
        "namespaceObject".to_string(),
        ns_obj.map(|n| (*n).clone()).unwrap_or(Value::Null),
    );
    env.insert("params".to_string(), Value::Null);
    let mut first_err = None;
    for c in conds {
        let src = c["expression"].as_str().unwrap_or_default();
        let res = crate::cel::parse(src, MATCH_ROOTS).and_then(|e| crate::cel::eval_bool(&e, &env));
        match res {
            Ok(false) => return Ok(false),
            Ok(true) => {}
            Err(e) => {
                first_err = first_err.or(Some(format!(
                    "{}: {e}",
                    c["name"].as_str().unwrap_or_default()
                )))
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(true),
    }
}

/// Webhook call failures.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// Configuration problem.
    #[error("{0}")]
    Config(String),
    /// Network or TLS problem.
    #[error("Post \"{url}\": {err}")]
    Transport {
        /// Target.
        url: String,
        /// Cause.
        err: String,
    },
}

async fn call(wh: &Value, review: &Value) -> Result<Value, CallError> {
    let url = match wh["clientConfig"]["url"].as_str() {
        Some(u) => u.to_string(),
        None => {
            let svc = &wh["clientConfig"]["service"];
            format!(
                "https://{}.{}.svc:{}{}",
                svc["name"].as_str().unwrap_or_default(),
                svc["namespace"].as_str().unwrap_or_default(),
                svc["port"].as_u64().unwrap_or(443),
                svc["path"].as_str().unwrap_or("/")
            )
        }
    };
    let terr = |e: String| CallError::Transport {
        url: url.clone(),
        err: e,
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| CallError::Config(e.to_string()))?;
    let host = uri
        .host()
        .ok_or_else(|| CallError::Config("webhook URL has no host".into()))?
        .trim_matches(['[', ']'])
        .to_string();
    let port = uri.port_u16().unwrap_or(443);
    let mut roots = rustls::RootCertStore::empty();
    let ca = wh["clientConfig"]["caBundle"].as_str().unwrap_or_default();
    let pem_bytes = base64::engine::general_purpose::STANDARD
        .decode(ca)
        .map_err(|e| CallError::Config(format!("caBundle: {e}")))?;
    for p in pem::parse_many(&pem_bytes).map_err(|e| CallError::Config(format!("caBundle: {e}")))? {
        roots
            .add(rustls_pki_types::CertificateDer::from(
                p.contents().to_vec(),
            ))
            .map_err(|e| CallError::Config(format!("caBundle: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| CallError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
    let server_name = rustls_pki_types::ServerName::try_from(host.clone())
        .map_err(|e| CallError::Config(e.to_string()))?;
    let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| terr(format!("dial tcp {host}:{port}: {e}")))?;
    let stream = connector
        .connect(server_name, tcp)
        .await
        .map_err(|e| terr(format!("tls: {e}")))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| terr(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let body = serde_json::to_vec(review).map_err(|e| CallError::Config(e.to_string()))?;
    let path = uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let req = http::Request::post(path)
        .header("host", format!("{host}:{port}"))
        .header("content-type", "application/json")
        .header("accept", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| CallError::Config(e.to_string()))?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(|e| terr(e.to_string()))?;
    let status = resp.status();
    let bytes = http_body_util::Limited::new(resp.into_body(), 3 << 20)
        .collect()
        .await
        .map_err(|e| terr(e.to_string()))?
        .to_bytes();
    if !status.is_success() {
        return Err(terr(format!("HTTP {status}")));
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| terr(format!("invalid AdmissionReview response: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_labels() {
        assert!(!forbidden_node_label("example.com/x"));
        assert!(!forbidden_node_label("k8s.ovn.org/zone"));
        assert!(forbidden_node_label("node-restriction.kubernetes.io/x"));
        assert!(forbidden_node_label("node-role.kubernetes.io/master"));
        assert!(!forbidden_node_label("kubernetes.io/hostname"));
        assert!(!forbidden_node_label("foo.node.kubernetes.io/x"));
        assert!(!forbidden_node_label("plain"));
    }

    #[test]
    fn configuration_check() {
        let ok = json!({"webhooks": [{"name": "a.b", "clientConfig": {"url": "https://x"}, "sideEffects": "None",
            "admissionReviewVersions": ["v1"], "matchConditions": [{"name": "m", "expression": "request.userInfo.username.startsWith('system:ovn-node:')"}]}]});
        assert!(validate_configuration(&ok).is_empty());
        let mut bad = ok.clone();
        bad["webhooks"][0]["matchConditions"][0]["expression"] =
            json!("authorizer.requestResource.check('x').allowed()");
        assert_eq!(validate_configuration(&bad).len(), 1);
    }
}
