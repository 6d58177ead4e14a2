//! Authorization: the Node authorizer (kubelet identities) and RBAC evaluated over the stored
//! Role/ClusterRole/RoleBinding/ClusterRoleBinding objects. `system:masters` may do anything.

use crate::store::Store;
use serde_json::Value;

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// User name (certificate CN).
    pub username: String,
    /// Groups (certificate O values plus `system:authenticated`).
    pub groups: Vec<String>,
}

impl UserInfo {
    /// An unauthenticated caller.
    pub fn anonymous() -> Self {
        Self {
            username: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
        }
    }
    /// The node name when this is a kubelet identity (`system:node:<name>` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        if !self.groups.iter().any(|g| g == "system:nodes") {
            return None;
        }
        self.username
            .strip_prefix("system:node:")
            .filter(|n| !n.is_empty())
    }
    /// Member of `system:masters`.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// What is being attempted.
#[derive(Debug, Clone)]
pub struct Attributes<'a> {
    /// Verb (get, list, watch, create, update, patch, delete, deletecollection, approve, ...).
    pub verb: &'a str,
    /// API group.
    pub group: &'a str,
    /// Resource (plural).
    pub resource: &'a str,
    /// Subresource ("" when none).
    pub subresource: &'a str,
    /// Namespace ("" for cluster scope).
    pub namespace: &'a str,
    /// Object name ("" when none).
    pub name: &'a str,
}

/// Non-resource paths every caller may read (discovery, version, health, OpenAPI).
pub fn public_path(path: &str) -> bool {
    path == "/version"
        || path == "/healthz"
        || path == "/readyz"
        || path == "/livez"
        || path == "/api"
        || path == "/apis"
        || path.starts_with("/api/")
        || path.starts_with("/apis/")
        || path.starts_with("/openapi/")
}

/// The Node authorizer plus the `system:node` role, simplified for the kinds this server serves.
fn node_allows(node: &str, a: &Attributes<'_>) -> bool {
    let read = matches!(a.verb, "get" | "list" | "watch");
    match (a.group, a.resource, a.subresource) {
        ("", "nodes", "") => {
            read || a.verb == "create"
                || (matches!(a.verb, "update" | "patch" | "delete") && a.name == node)
        }
        ("", "nodes", "status") => matches!(a.verb, "get" | "update" | "patch") && a.name == node,
        ("", "pods", "") => read || matches!(a.verb, "create" | "delete"),
        ("", "pods", "status") => matches!(a.verb, "get" | "update" | "patch"),
        ("", "pods", "eviction") => a.verb == "create",
        ("", "services", "")
        | ("", "endpoints", "")
        | ("discovery.k8s.io", "endpointslices", "") => read,
        ("", "events", "") | ("events.k8s.io", "events", "") => {
            matches!(a.verb, "create" | "update" | "patch")
        }
        ("coordination.k8s.io", "leases", "") => {
            a.namespace == "kube-node-lease"
                && (matches!(a.verb, "get" | "create")
                    || (matches!(a.verb, "update" | "patch" | "delete") && a.name == node))
        }
        ("certificates.k8s.io", "certificatesigningrequests", "") => {
            matches!(a.verb, "create" | "get" | "list" | "watch")
        }
        _ => false,
    }
}

fn contains(list: &Value, want: &str) -> bool {
    list.as_array().is_some_and(|a| {
        a.iter()
            .any(|x| x.as_str() == Some(want) || x.as_str() == Some("*"))
    })
}

fn resource_matches(list: &Value, resource: &str, sub: &str) -> bool {
    let full = if sub.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}/{sub}")
    };
    list.as_array().is_some_and(|a| {
        a.iter().filter_map(Value::as_str).any(|r| {
            r == "*"
                || r == full
                || (!sub.is_empty() && r == format!("*/{sub}"))
                || (!sub.is_empty() && r == format!("{resource}/*"))
        })
    })
}

fn rule_allows(rule: &Value, a: &Attributes<'_>) -> bool {
    contains(&rule["verbs"], a.verb)
        && contains(&rule["apiGroups"], a.group)
        && resource_matches(&rule["resources"], a.resource, a.subresource)
        && match rule["resourceNames"].as_array() {
            Some(names) if !names.is_empty() => names.iter().any(|n| n.as_str() == Some(a.name)),
            _ => true,
        }
}

fn subject_matches(subj: &Value, user: &UserInfo, binding_ns: &str) -> bool {
    let name = subj["name"].as_str().unwrap_or_default();
    match subj["kind"].as_str() {
        Some("User") => name == user.username,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = subj["namespace"]
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or(binding_ns);
            user.username == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn role_rules(store: &Store, binding: &Value, binding_ns: &str) -> Vec<Value> {
    let r = &binding["roleRef"];
    let name = r["name"].as_str().unwrap_or_default();
    let role = match r["kind"].as_str() {
        Some("ClusterRole") => store.get("rbac.authorization.k8s.io/clusterroles", "", name),
        Some("Role") => store.get("rbac.authorization.k8s.io/roles", binding_ns, name),
        _ => None,
    };
    role.and_then(|r| r["rules"].as_array().cloned())
        .unwrap_or_default()
}

/// Whether `user` may do `a`.
pub fn allowed(store: &Store, user: &UserInfo, a: &Attributes<'_>) -> bool {
    if user.is_master() {
        return true;
    }
    if let Some(node) = user.node_name()
        && node_allows(node, a)
    {
        return true;
    }
    // Every authenticated user may create self-subject reviews in a real cluster; we serve none.
    let (crbs, _) = store.list("rbac.authorization.k8s.io/clusterrolebindings", None);
    for b in &crbs {
        if b["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| subject_matches(s, user, ""))
            && role_rules(store, b, "").iter().any(|r| rule_allows(r, a))
        {
            return true;
        }
    }
    if !a.namespace.is_empty() {
        let (rbs, _) = store.list("rbac.authorization.k8s.io/rolebindings", Some(a.namespace));
        for b in &rbs {
            if b["subjects"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| subject_matches(s, user, a.namespace))
                && role_rules(store, b, a.namespace)
                    .iter()
                    .any(|r| rule_allows(r, a))
            {
                return true;
            }
        }
    }
    false
}

/// The message a real server puts in a Forbidden Status.
pub fn forbidden_message(user: &UserInfo, a: &Attributes<'_>) -> String {
    let res = if a.subresource.is_empty() {
        a.resource.to_string()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let what = if a.name.is_empty() {
        if a.group.is_empty() {
            a.resource.to_string()
        } else {
            format!("{}.{}", a.resource, a.group)
        }
    } else if a.group.is_empty() {
        format!("{} \"{}\"", a.resource, a.name)
    } else {
        format!("{}.{} \"{}\"", a.resource, a.group, a.name)
    };
    let scope = if a.namespace.is_empty() {
        "at the cluster scope".to_string()
    } else {
        format!("in the namespace \"{}\"", a.namespace)
    };
    format!(
        "{what} is forbidden: User \"{}\" cannot {} resource \"{res}\" in API group \"{}\" {scope}",
        user.username, a.verb, a.group
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rbac_through_group() {
        let s = Store::open(None, 100).expect("store");
        s.create(
            "rbac.authorization.k8s.io/clusterroles",
            json!({"metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["nodes", "nodes/status"], "verbs": ["get", "patch"]}]}),
        )
        .expect("role");
        s.create(
            "rbac.authorization.k8s.io/clusterrolebindings",
            json!({"metadata": {"name": "b"}, "roleRef": {"kind": "ClusterRole", "name": "r"}, "subjects": [{"kind": "Group", "name": "g"}]}),
        )
        .expect("binding");
        let u = UserInfo {
            username: "u".into(),
            groups: vec!["g".into()],
        };
        let at = |verb, sub| Attributes {
            verb,
            group: "",
            resource: "nodes",
            subresource: sub,
            namespace: "",
            name: "n",
        };
        assert!(allowed(&s, &u, &at("get", "")));
        assert!(allowed(&s, &u, &at("patch", "status")));
        assert!(!allowed(&s, &u, &at("delete", "")));
        let other = UserInfo {
            username: "u".into(),
            groups: vec![],
        };
        assert!(!allowed(&s, &other, &at("get", "")));
        assert!(
            forbidden_message(&other, &at("get", "")).contains("cannot get resource \"nodes\"")
        );
    }
}
