//! The kinds the server serves: built-in definitions plus those registered by CRDs.

use serde_json::Value;

/// How writes to the main endpoint and to `/status` are split for a kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusStrategy {
    /// No status subresource: the main endpoint writes everything.
    None,
    /// Node/Pod: `/status` persists metadata and status, not spec.
    MetadataAndStatus,
    /// Custom resources and the rest: `/status` changes only status.
    StatusOnly,
}

/// One served resource (group/version/plural).
#[derive(Debug, Clone)]
pub struct ResourceDef {
    /// API group ("" for core).
    pub group: String,
    /// Version.
    pub version: String,
    /// Plural resource name.
    pub plural: String,
    /// Singular name.
    pub singular: String,
    /// Kind.
    pub kind: String,
    /// Namespaced or cluster-scoped.
    pub namespaced: bool,
    /// Short names for kubectl.
    pub short_names: Vec<String>,
    /// Status subresource behaviour.
    pub status: StatusStrategy,
    /// CSR approval subresource.
    pub approval: bool,
    /// Where objects live in the store (shared by core and events.k8s.io Events).
    pub storage: String,
    /// CRD-provided bits.
    pub crd: Option<CrdInfo>,
    /// Categories (e.g. `all`).
    pub categories: Vec<String>,
}

/// Extra information for kinds served from a CRD.
#[derive(Debug, Clone)]
pub struct CrdInfo {
    /// CRD name (`plural.group`).
    pub crd_name: String,
    /// `openAPIV3Schema` of this version (may be absent).
    pub schema: Option<Value>,
    /// `additionalPrinterColumns`.
    pub printer_columns: Vec<Value>,
}

impl ResourceDef {
    /// `v1` or `group/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    /// `plural` or `plural.group` (used in messages).
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    /// `Kind` list kind.
    pub fn list_kind(&self) -> String {
        format!("{}List", self.kind)
    }
    /// Whether this is a custom resource.
    pub fn is_custom(&self) -> bool {
        self.crd.is_some()
    }
}

#[allow(clippy::too_many_arguments)]
fn def(
    group: &str,
    version: &str,
    plural: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    short: &[&str],
    status: StatusStrategy,
) -> ResourceDef {
    ResourceDef {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: singular.into(),
        kind: kind.into(),
        namespaced,
        short_names: short.iter().map(|s| s.to_string()).collect(),
        status,
        approval: false,
        storage: format!("{group}/{plural}"),
        crd: None,
        categories: Vec::new(),
    }
}

/// The built-in kinds.
pub fn builtin() -> Vec<ResourceDef> {
    use StatusStrategy::*;
    let mut v = vec![
        def(
            "",
            "v1",
            "nodes",
            "node",
            "Node",
            false,
            &["no"],
            MetadataAndStatus,
        ),
        def(
            "",
            "v1",
            "namespaces",
            "namespace",
            "Namespace",
            false,
            &["ns"],
            StatusOnly,
        ),
        def(
            "",
            "v1",
            "pods",
            "pod",
            "Pod",
            true,
            &["po"],
            MetadataAndStatus,
        ),
        def(
            "",
            "v1",
            "services",
            "service",
            "Service",
            true,
            &["svc"],
            StatusOnly,
        ),
        def("", "v1", "events", "event", "Event", true, &["ev"], None),
        def(
            "",
            "v1",
            "configmaps",
            "configmap",
            "ConfigMap",
            true,
            &["cm"],
            None,
        ),
        def("", "v1", "secrets", "secret", "Secret", true, &[], None),
        def(
            "",
            "v1",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
            &["sa"],
            None,
        ),
        def(
            "",
            "v1",
            "endpoints",
            "endpoints",
            "Endpoints",
            true,
            &["ep"],
            None,
        ),
        def(
            "events.k8s.io",
            "v1",
            "events",
            "event",
            "Event",
            true,
            &["ev"],
            None,
        ),
        def(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "endpointslice",
            "EndpointSlice",
            true,
            &[],
            None,
        ),
        def(
            "networking.k8s.io",
            "v1",
            "networkpolicies",
            "networkpolicy",
            "NetworkPolicy",
            true,
            &["netpol"],
            None,
        ),
        def(
            "certificates.k8s.io",
            "v1",
            "certificatesigningrequests",
            "certificatesigningrequest",
            "CertificateSigningRequest",
            false,
            &["csr"],
            StatusOnly,
        ),
        def(
            "coordination.k8s.io",
            "v1",
            "leases",
            "lease",
            "Lease",
            true,
            &[],
            None,
        ),
        def(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "role",
            "Role",
            true,
            &[],
            None,
        ),
        def(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "clusterrole",
            "ClusterRole",
            false,
            &[],
            None,
        ),
        def(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "rolebinding",
            "RoleBinding",
            true,
            &[],
            None,
        ),
        def(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "clusterrolebinding",
            "ClusterRoleBinding",
            false,
            &[],
            None,
        ),
        def(
            "admissionregistration.k8s.io",
            "v1",
            "validatingwebhookconfigurations",
            "validatingwebhookconfiguration",
            "ValidatingWebhookConfiguration",
            false,
            &[],
            None,
        ),
        def(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            StatusOnly,
        ),
        def(
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            "selfsubjectaccessreview",
            "SelfSubjectAccessReview",
            false,
            &[],
            None,
        ),
        def(
            "authorization.k8s.io",
            "v1",
            "subjectaccessreviews",
            "subjectaccessreview",
            "SubjectAccessReview",
            false,
            &[],
            None,
        ),
    ];
    for d in &mut v {
        if d.group == "events.k8s.io" {
            d.storage = "/events".into();
        }
        if d.kind == "CertificateSigningRequest" {
            d.approval = true;
        }
        if d.group.is_empty() && matches!(d.kind.as_str(), "Pod" | "Service") {
            d.categories = vec!["all".into()];
        }
    }
    v
}

/// The resource definitions a stored CRD object asks to serve (one per served version).
pub fn from_crd(crd: &Value) -> Vec<ResourceDef> {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default().to_string();
    let names = &spec["names"];
    let plural = names["plural"].as_str().unwrap_or_default().to_string();
    let kind = names["kind"].as_str().unwrap_or_default().to_string();
    if group.is_empty() || plural.is_empty() || kind.is_empty() {
        return Vec::new();
    }
    let singular = names["singular"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| kind.to_lowercase());
    let short: Vec<String> = names["shortNames"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let categories: Vec<String> = names["categories"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let namespaced = spec["scope"].as_str() != Some("Cluster");
    let crd_name = crd["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let mut out = Vec::new();
    for ver in spec["versions"].as_array().into_iter().flatten() {
        if ver["served"].as_bool() == Some(false) {
            continue;
        }
        let Some(vname) = ver["name"].as_str() else {
            continue;
        };
        let has_status = ver["subresources"]["status"].is_object();
        let cols = ver["additionalPrinterColumns"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        out.push(ResourceDef {
            group: group.clone(),
            version: vname.to_string(),
            plural: plural.clone(),
            singular: singular.clone(),
            kind: kind.clone(),
            namespaced,
            short_names: short.clone(),
            status: if has_status {
                StatusStrategy::StatusOnly
            } else {
                StatusStrategy::None
            },
            approval: false,
            storage: format!("{group}/{plural}"),
            crd: Some(CrdInfo {
                crd_name: crd_name.clone(),
                schema: ver["schema"]["openAPIV3Schema"]
                    .as_object()
                    .map(|_| ver["schema"]["openAPIV3Schema"].clone()),
                printer_columns: cols,
            }),
            categories: categories.clone(),
        });
    }
    out
}

/// Verbs advertised in discovery.
pub fn verbs() -> Vec<&'static str> {
    vec![
        "create",
        "delete",
        "deletecollection",
        "get",
        "list",
        "patch",
        "update",
        "watch",
    ]
}
