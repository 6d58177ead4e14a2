//! ovnk: node-owned objects. For each configured `resource.group` (for example the per-node
//! tunnel reports of the trust-zones feature), a node identity (`system:node:<n>` or
//! `system:ovn-node:<n>`) may create, update or delete only the object named `<n>`.
//! Other users and other resources are not checked here (RBAC applies).

use std::collections::BTreeSet;

use serde_json::Value;

use super::{AdmissionRequest, DenyReason, Operation, ReviewError, Verdict};
use crate::user::any_node_identity;

/// The set of `resource.group` names (core group: just `resource`) whose objects are node-owned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeOwnedResources {
    resources: BTreeSet<String>,
}

impl NodeOwnedResources {
    /// From `resource.group` strings such as `tunnelreports.k8s.ovn.org`.
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(items: I) -> Self {
        NodeOwnedResources {
            resources: items.into_iter().map(Into::into).collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.resources.iter().map(String::as_str)
    }

    /// Reviews a request for a node-owned object.
    pub fn review(&self, req: &AdmissionRequest) -> Result<Verdict, ReviewError> {
        let qualified = if req.resource.group.is_empty() {
            req.resource.resource.clone()
        } else {
            format!("{}.{}", req.resource.resource, req.resource.group)
        };
        if !self.resources.contains(&qualified) {
            return Ok(Verdict::Allowed);
        }
        let username = req.user_info.username.as_str();
        let Some(node) = any_node_identity(username) else {
            return Ok(Verdict::Allowed);
        };
        let obj_name = |o: Option<&Value>| {
            o.and_then(|o| o.get("metadata"))
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let name = if !req.name.is_empty() {
            req.name.clone()
        } else {
            let from_obj = match req.operation {
                Operation::Delete => obj_name(req.old_object.as_ref()),
                _ => obj_name(req.object.as_ref()),
            };
            match from_obj {
                Some(n) => n,
                None if req.object.is_none() && req.old_object.is_none() => {
                    return Err(ReviewError::NoObject(req.operation.as_str()));
                }
                None => String::new(),
            }
        };
        if name == node {
            return Ok(Verdict::Allowed);
        }
        Ok(Verdict::deny(
            DenyReason::OtherNode,
            format!(
                "user {username:?} is not allowed to {} {qualified} {name:?}: a node may only write the object named after itself ({node:?})",
                req.operation.as_str().to_ascii_lowercase()
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::review::decode;
    use rstest::rstest;
    use serde_json::json;

    fn req(
        op: &str,
        user: &str,
        group: &str,
        resource: &str,
        name: &str,
        obj_name: Option<&str>,
    ) -> AdmissionRequest {
        let obj = obj_name.map(|n| json!({"kind": "TunnelReport", "metadata": {"name": n}}));
        let (object, old) = if op == "DELETE" {
            (None, obj)
        } else {
            (obj, None)
        };
        let body = json!({"request": {"uid": "u", "operation": op, "name": name,
            "resource": {"group": group, "version": "v1", "resource": resource},
            "userInfo": {"username": user}, "object": object, "oldObject": old}});
        decode(&serde_json::to_vec(&body).expect("json")).expect("decodes")
    }

    fn owned() -> NodeOwnedResources {
        NodeOwnedResources::new(["tunnelreports.k8s.ovn.org", "configmaps"])
    }

    #[rstest]
    #[case::own_create("CREATE", "system:ovn-node:node1", "", Some("node1"), None)]
    #[case::own_update("UPDATE", "system:ovn-node:node1", "node1", Some("node1"), None)]
    #[case::own_delete("DELETE", "system:ovn-node:node1", "", Some("node1"), None)]
    #[case::other_create(
        "CREATE",
        "system:ovn-node:node1",
        "",
        Some("node2"),
        Some(
            "user \"system:ovn-node:node1\" is not allowed to create tunnelreports.k8s.ovn.org \"node2\": a node may only write the object named after itself (\"node1\")"
        )
    )]
    #[case::other_update(
        "UPDATE",
        "system:node:node1",
        "node2",
        Some("node2"),
        Some(
            "user \"system:node:node1\" is not allowed to update tunnelreports.k8s.ovn.org \"node2\": a node may only write the object named after itself (\"node1\")"
        )
    )]
    #[case::other_delete(
        "DELETE",
        "system:ovn-node:node1",
        "node2",
        None,
        Some(
            "user \"system:ovn-node:node1\" is not allowed to delete tunnelreports.k8s.ovn.org \"node2\": a node may only write the object named after itself (\"node1\")"
        )
    )]
    #[case::admin("UPDATE", "kubernetes-admin", "node2", Some("node2"), None)]
    fn tunnel_reports(
        #[case] op: &str,
        #[case] user: &str,
        #[case] name: &str,
        #[case] obj: Option<&str>,
        #[case] want: Option<&str>,
    ) {
        let v = owned()
            .review(&req(op, user, "k8s.ovn.org", "tunnelreports", name, obj))
            .expect("ok");
        assert_eq!(v.message(), want);
    }

    #[test]
    fn core_group_and_unconfigured_resources() {
        let v = owned()
            .review(&req(
                "UPDATE",
                "system:ovn-node:node1",
                "",
                "configmaps",
                "node2",
                Some("node2"),
            ))
            .expect("ok");
        assert!(!v.is_allowed());
        let v = owned()
            .review(&req(
                "UPDATE",
                "system:ovn-node:node1",
                "k8s.ovn.org",
                "egressips",
                "x",
                Some("x"),
            ))
            .expect("ok");
        assert!(v.is_allowed());
    }

    #[test]
    fn no_name_anywhere_is_malformed() {
        let r = req(
            "CREATE",
            "system:ovn-node:node1",
            "k8s.ovn.org",
            "tunnelreports",
            "",
            None,
        );
        assert_eq!(owned().review(&r), Err(ReviewError::NoObject("CREATE")));
    }
}
