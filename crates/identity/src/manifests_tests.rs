//! Validates the checked-in manifests under `manifests/identity/`.

use clap::Parser;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

use crate::cli::IdentityArgs;

fn docs(file: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../manifests/identity")
        .join(file);
    let text = std::fs::read_to_string(&path).expect("manifest readable");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("valid YAML");
    for d in &docs {
        assert!(d["apiVersion"].is_string(), "{file}: apiVersion");
        assert!(d["kind"].is_string(), "{file}: kind");
        assert!(d["metadata"]["name"].is_string(), "{file}: metadata.name");
    }
    docs
}

fn of_kind<T: serde::de::DeserializeOwned>(docs: &[Value], kind: &str) -> Vec<T> {
    docs.iter()
        .filter(|d| d["kind"] == kind)
        .map(|d| serde_json::from_value(d.clone()).expect("typed"))
        .collect()
}

#[test]
fn webhook_configurations() {
    let d = docs("webhooks.yaml");
    let vwcs: Vec<ValidatingWebhookConfiguration> = of_kind(&d, "ValidatingWebhookConfiguration");
    assert_eq!(vwcs.len(), 3);
    for vwc in &vwcs {
        let hooks = vwc.webhooks.as_ref().expect("webhooks");
        assert_eq!(hooks.len(), 1);
        let h = &hooks[0];
        assert_eq!(h.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(h.side_effects, "None");
        assert_eq!(h.admission_review_versions, vec!["v1".to_string()]);
        let url = h.client_config.url.as_deref().expect("url");
        assert!(url.starts_with("https://localhost:9443/"), "{url}");
        let conds = h.match_conditions.as_ref().expect("matchConditions");
        assert!(!conds.is_empty());
        for c in conds {
            // balanced parentheses and quotes: a cheap guard against broken CEL
            let e = &c.expression;
            assert_eq!(e.matches('(').count(), e.matches(')').count(), "{}", c.name);
            assert_eq!(e.matches('\'').count() % 2, 0, "{}", c.name);
        }
        let name = vwc.metadata.name.as_deref().expect("name");
        assert_eq!(h.name, format!("{name}.k8s.io"));
    }
    let by_name = |n: &str| {
        vwcs.iter()
            .find(|v| v.metadata.name.as_deref() == Some(n))
            .and_then(|v| v.webhooks.as_ref())
            .map(|w| w[0].clone())
            .expect("webhook present")
    };

    let node = by_name("ovn-kubernetes-admission-webhook-node");
    assert_eq!(
        node.client_config.url.as_deref(),
        Some("https://localhost:9443/node")
    );
    let rules = node.rules.as_ref().expect("rules");
    assert_eq!(
        rules[0].operations.as_deref(),
        Some(&["CREATE".to_string(), "UPDATE".to_string()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["nodes".to_string(), "nodes/status".to_string()][..])
    );
    let exprs: Vec<&str> = node
        .match_conditions
        .iter()
        .flatten()
        .map(|c| c.expression.as_str())
        .collect();
    assert!(
        exprs[0].contains("startsWith('system:ovn-node:')")
            && exprs[0].contains("startsWith('system:node:')")
    );
    // the kubelet condition must short-circuit on CREATE before touching oldObject
    let kubelet = exprs[1];
    let create_at = kubelet
        .find("request.operation == 'CREATE'")
        .expect("CREATE guard");
    let old_at = kubelet.find("oldObject").expect("oldObject");
    assert!(create_at < old_at);

    let pod = by_name("ovn-kubernetes-admission-webhook-pod");
    assert_eq!(
        pod.client_config.url.as_deref(),
        Some("https://localhost:9443/pod")
    );
    let rules = pod.rules.as_ref().expect("rules");
    assert_eq!(
        rules[0].operations.as_deref(),
        Some(&["UPDATE".to_string()][..])
    );
    assert_eq!(
        rules[0].resources.as_deref(),
        Some(&["pods/status".to_string()][..])
    );
    let exprs: Vec<&str> = pod
        .match_conditions
        .iter()
        .flatten()
        .map(|c| c.expression.as_str())
        .collect();
    assert!(
        exprs
            .iter()
            .any(|e| e.trim() == "request.userInfo.username.startsWith('system:ovn-node:')")
    );
    assert!(
        exprs
            .iter()
            .any(|e| e.contains("ovnkube-identity") && e.starts_with('!')),
        "self-exclusion"
    );
    assert!(
        !exprs.iter().any(|e| e.contains("'system:node:'")),
        "kubelet pod updates never reach it"
    );

    let owned = by_name("ovn-kubernetes-admission-webhook-node-owned");
    assert_eq!(
        owned.client_config.url.as_deref(),
        Some("https://localhost:9443/node-owned")
    );
}

#[test]
fn rbac_uses_the_ovn_nodes_group() {
    let d = docs("rbac.yaml");
    let bindings: Vec<ClusterRoleBinding> = of_kind(&d, "ClusterRoleBinding");
    let roles: Vec<ClusterRole> = of_kind(&d, "ClusterRole");
    let node_binding = bindings
        .iter()
        .find(|b| b.metadata.name.as_deref() == Some("ovnkube-node"))
        .expect("ovnkube-node binding");
    let subjects = node_binding.subjects.as_ref().expect("subjects");
    assert!(
        subjects
            .iter()
            .all(|s| s.kind == "Group" && s.name == "system:ovn-nodes")
    );
    // every binding points at a role defined here
    for b in &bindings {
        assert!(
            roles
                .iter()
                .any(|r| r.metadata.name.as_deref() == Some(b.role_ref.name.as_str())),
            "{:?}",
            b.role_ref.name
        );
    }
    // the approver may approve for the kube-apiserver-client signer only, and update approvals
    let id = roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some("ovnkube-identity"))
        .expect("identity role");
    let rules = id.rules.as_ref().expect("rules");
    assert!(rules.iter().any(|r| {
        r.resources.iter().flatten().any(|x| x == "signers")
            && r.resource_names
                .iter()
                .flatten()
                .any(|n| n == "kubernetes.io/kube-apiserver-client")
            && r.verbs.iter().any(|v| v == "approve")
    }));
    assert!(rules.iter().any(|r| {
        r.resources
            .iter()
            .flatten()
            .any(|x| x == "certificatesigningrequests/approval")
            && r.verbs.iter().any(|v| v == "update")
    }));
    // node agents: CSR create/get but no CSR update (least privilege)
    let csr_role = roles
        .iter()
        .find(|r| r.metadata.name.as_deref() == Some("ovnkube-node-csr"))
        .expect("csr role");
    for r in csr_role.rules.iter().flatten() {
        assert!(!r.verbs.iter().any(|v| v == "update" || v == "delete"));
    }
}

#[test]
fn daemonset_runs_identity_with_valid_flags() {
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: IdentityArgs,
    }
    let d = docs("daemonset.yaml");
    let ds: Vec<DaemonSet> = of_kind(&d, "DaemonSet");
    assert_eq!(ds.len(), 1);
    let spec = ds[0].spec.as_ref().expect("spec");
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(pod.host_network, Some(true));
    assert!(
        pod.node_selector
            .as_ref()
            .is_some_and(|s| s.contains_key("node-role.kubernetes.io/control-plane"))
    );
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.as_ref())
        .expect("labels");
    assert_eq!(
        labels.get("name").map(String::as_str),
        Some("ovnkube-identity"),
        "matches the pod webhook self-exclusion"
    );
    let c = &pod.containers[0];
    let args = c.args.clone().unwrap_or_default();
    let cli =
        Cli::try_parse_from(std::iter::once("ovnk".to_string()).chain(args)).expect("flags parse");
    assert_eq!(cli.args.webhook_port, 9443);
    assert_eq!(cli.args.webhook_host, "localhost");
    assert!(cli.args.webhook_cert_dir.is_some());
    let mounts = c.volume_mounts.as_ref().expect("mounts");
    assert!(mounts.iter().any(|m| Some(m.mount_path.as_str())
        == cli.args.webhook_cert_dir.as_ref().and_then(|p| p.to_str())));
}
