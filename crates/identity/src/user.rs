//! Identity parsing for admission requests (upstream `pkg/ovnwebhook/user.go`).

/// CN / username prefix of ovnkube-node identities (upstream `csrapprover.NamePrefix`).
pub const OVN_NODE_PREFIX: &str = "system:ovn-node";
/// The group every ovnkube-node certificate carries in its Organization.
pub const OVN_NODES_GROUP: &str = "system:ovn-nodes";
/// Kubelet username prefix.
pub const KUBELET_PREFIX: &str = "system:node";

/// Returns the node name when `username` is `system:ovn-node:<node>`.
///
/// Upstream release-1.3 matches the prefix without the trailing colon and then trims
/// `system:ovn-node:`; master requires the colon. Node names cannot contain a colon, so the two
/// agree on every name that can refer to a node; we require the colon (master behaviour).
pub fn ovnkube_node_identity(username: &str) -> Option<&str> {
    username
        .strip_prefix(OVN_NODE_PREFIX)
        .and_then(|rest| rest.strip_prefix(':'))
}

/// Returns the node name when `username` is `system:node:<node>` (kubelet identity).
pub fn kubelet_identity(username: &str) -> Option<&str> {
    username
        .strip_prefix(KUBELET_PREFIX)
        .and_then(|rest| rest.strip_prefix(':'))
}

/// Returns the node name of any node identity: `system:node:<n>` or `system:ovn-node:<n>`.
pub fn any_node_identity(username: &str) -> Option<&str> {
    ovnkube_node_identity(username).or_else(|| kubelet_identity(username))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("system:ovn-node:node1", Some("node1"))]
    #[case("system:ovn-node:", Some(""))]
    #[case("system:ovn-nodes", None)]
    #[case("system:node:node1", None)]
    #[case("admin", None)]
    fn ovnkube_identity(#[case] user: &str, #[case] want: Option<&str>) {
        assert_eq!(ovnkube_node_identity(user), want);
    }

    #[rstest]
    #[case("system:node:node1", Some("node1"))]
    #[case("system:ovn-node:node1", Some("node1"))]
    #[case("system:nodes", None)]
    #[case("system:serviceaccount:ovn:x", None)]
    fn any_identity(#[case] user: &str, #[case] want: Option<&str>) {
        assert_eq!(any_node_identity(user), want);
    }
}
