//! Pure CSR approval checks: upstream `pkg/csrapprover/approver.go` (release-1.3 messages)
//! plus ovnk's additions (valid signature, no SANs, ECDSA P-256/P-384 or RSA ≥ 2048 only,
//! the node must exist).

use std::collections::BTreeSet;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::oid_registry::{
    OID_EC_P256, OID_KEY_TYPE_EC_PUBLIC_KEY, OID_NIST_EC_P384, OID_PKCS1_RSAENCRYPTION,
};
use x509_parser::prelude::FromDer;
use x509_parser::public_key::PublicKey;

use crate::dns::{dns1123_subdomain_errors, go_list};
use crate::user::{KUBELET_PREFIX, OVN_NODE_PREFIX, OVN_NODES_GROUP};

/// The only signer the approver acts on.
pub const KUBE_APISERVER_CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// Upstream `ControllerName`.
pub const CONTROLLER_NAME: &str = "ovnkube-csr-approver-controller";
/// Upstream `MaxDuration` (365 days), in seconds.
pub const MAX_DURATION_SECS: i64 = 365 * 24 * 3600;
pub const USAGE_DIGITAL_SIGNATURE: &str = "digital signature";
pub const USAGE_CLIENT_AUTH: &str = "client auth";
/// Minimum RSA modulus size ovnk accepts.
pub const MIN_RSA_BITS: usize = 2048;

/// One CSR acceptance condition (`--csr-acceptance-conditions` is a JSON list of these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsrAcceptanceCondition {
    pub common_name_prefix: String,
    #[serde(default)]
    pub organizations: Vec<String>,
    #[serde(default)]
    pub groups: BTreeSet<String>,
    #[serde(default)]
    pub user_prefixes: BTreeSet<String>,
}

impl CsrAcceptanceCondition {
    /// Upstream `DefaultCSRAcceptanceCondition`.
    pub fn default_ovn_node() -> Self {
        CsrAcceptanceCondition {
            common_name_prefix: OVN_NODE_PREFIX.to_string(),
            organizations: vec![OVN_NODES_GROUP.to_string()],
            groups: ["system:nodes", OVN_NODES_GROUP, "system:authenticated"]
                .into_iter()
                .map(String::from)
                .collect(),
            user_prefixes: [KUBELET_PREFIX, OVN_NODE_PREFIX]
                .into_iter()
                .map(String::from)
                .collect(),
        }
    }
}

/// What the approver accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApproverPolicy {
    /// The default condition first, then the extra ones.
    pub conditions: Vec<CsrAcceptanceCondition>,
    pub max_duration_secs: i64,
}

impl Default for ApproverPolicy {
    fn default() -> Self {
        ApproverPolicy {
            conditions: vec![CsrAcceptanceCondition::default_ovn_node()],
            max_duration_secs: MAX_DURATION_SECS,
        }
    }
}

impl ApproverPolicy {
    /// The default condition plus `extra` (from `--csr-acceptance-conditions`).
    pub fn with_extra(extra: Vec<CsrAcceptanceCondition>) -> Self {
        let mut p = ApproverPolicy::default();
        p.conditions.extend(extra);
        p
    }
}

/// The fields of a `CertificateSigningRequest` the checks read.
#[derive(Debug, Clone, Copy)]
pub struct CsrView<'a> {
    pub name: &'a str,
    pub signer_name: &'a str,
    pub username: &'a str,
    pub groups: &'a [String],
    pub usages: &'a [String],
    pub expiration_seconds: Option<i64>,
    /// `spec.request`: PEM bytes.
    pub request: &'a [u8],
    /// `status.certificate` is non-empty.
    pub signed: bool,
    /// `status.conditions` has an Approved or Denied entry.
    pub approved_or_denied: bool,
}

/// Whether a node exists, from the approver's node cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeExistence {
    Exists,
    Missing,
    /// The cache cannot tell (not synced yet); the CSR is retried, not denied.
    Unknown(String),
}

/// The approver's decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsrDecision {
    /// Not ours (CN prefix or signer); leave it alone.
    Ignore,
    /// Already signed, approved or denied.
    AlreadyHandled,
    Approve,
    Deny(String),
    /// Cannot decide now (unparsable PEM/CN, node cache not ready): retry with backoff.
    Retry(String),
}

/// Decides what to do with a CSR. Pure: node existence is injected.
pub fn evaluate(
    policy: &ApproverPolicy,
    csr: &CsrView<'_>,
    node_exists: &dyn Fn(&str) -> NodeExistence,
) -> CsrDecision {
    let name = csr.name;
    let der = match pem::parse(csr.request) {
        Ok(block) => block.into_contents(),
        Err(_) => {
            return CsrDecision::Retry(format!(
                "failed to decode {name:?} PEM block in .spec.request: no CSRs were found"
            ));
        }
    };
    let x509 = match X509CertificationRequest::from_der(&der) {
        Ok((_, r)) => r,
        Err(e) => return CsrDecision::Retry(format!("failed to parse {name} PEM bytes: {e}")),
    };
    let subject = &x509.certification_request_info.subject;
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or_default();
    let organizations: Vec<&str> = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok())
        .collect();

    // Filter: one of our CN prefixes and the kube-apiserver-client signer.
    let ours = policy
        .conditions
        .iter()
        .any(|c| cn.starts_with(c.common_name_prefix.as_str()));
    if !ours || csr.signer_name != KUBE_APISERVER_CLIENT_SIGNER {
        return CsrDecision::Ignore;
    }
    if csr.signed || csr.approved_or_denied {
        return CsrDecision::AlreadyHandled;
    }
    let Some(i) = cn.rfind(':').filter(|i| *i != cn.len() - 1) else {
        return CsrDecision::Retry(format!("failed to parse the common name: {cn}"));
    };
    let cn_prefix = &cn[..i];
    let cn_node = &cn[i + 1..];

    let mut matched = false;
    for cond in policy
        .conditions
        .iter()
        .filter(|c| c.common_name_prefix == cn_prefix)
    {
        matched = true;
        if let Err(msg) = validate_condition(cond, csr, cn, &organizations) {
            return CsrDecision::Deny(msg);
        }
    }
    if !matched {
        return CsrDecision::Deny(format!(
            "CSR {name:?} was created with unexpected common name: {cn:?}"
        ));
    }
    let Some(exp) = csr.expiration_seconds else {
        return CsrDecision::Deny(format!(
            "CSR {name:?} was created without specyfying the expirationSeconds"
        ));
    };
    if exp > policy.max_duration_secs {
        return CsrDecision::Deny(format!(
            "CSR {name:?} was created with invalid expirationSeconds value: {exp}"
        ));
    }

    // ovnk additions.
    let sans = requested_sans(&x509);
    if !sans.is_empty() {
        return CsrDecision::Deny(format!(
            "CSR {name:?} must not request subject alternative names, but it requests {}",
            go_list(&sans)
        ));
    }
    if let Err(desc) = check_key(&x509) {
        return CsrDecision::Deny(format!(
            "CSR {name:?} uses an unsupported public key ({desc}): only ECDSA P-256, ECDSA P-384 and RSA keys of at least {MIN_RSA_BITS} bits are accepted"
        ));
    }
    if let Err(e) = x509.verify_signature() {
        return CsrDecision::Deny(format!("CSR {name:?} has an invalid signature: {e}"));
    }
    match node_exists(cn_node) {
        NodeExistence::Exists => CsrDecision::Approve,
        NodeExistence::Missing => CsrDecision::Deny(format!(
            "CSR {name:?} was created for node {cn_node:?}, which does not exist"
        )),
        NodeExistence::Unknown(why) => CsrDecision::Retry(format!(
            "cannot tell whether node {cn_node:?} exists: {why}"
        )),
    }
}

/// Upstream `validateCSR` for the non-DPU conditions.
fn validate_condition(
    cond: &CsrAcceptanceCondition,
    csr: &CsrView<'_>,
    cn: &str,
    organizations: &[&str],
) -> Result<(), String> {
    let name = csr.name;
    let user = csr.username;
    let Some(i) = user.rfind(':').filter(|i| *i != user.len() - 1) else {
        return Err(format!("failed to parse the username: {user}"));
    };
    let (user_prefix, node) = (&user[..i], &user[i + 1..]);
    if !cond.user_prefixes.contains(user_prefix) {
        return Err(format!(
            "CSR {name:?} was created by an unexpected user: {user:?}"
        ));
    }
    let errs = dns1123_subdomain_errors(node);
    if !errs.is_empty() {
        return Err(format!(
            "extracted node name {node:?} is not a valid DNS subdomain {}",
            go_list(&errs)
        ));
    }
    let usages: BTreeSet<&str> = csr.usages.iter().map(String::as_str).collect();
    let want: BTreeSet<&str> = [USAGE_DIGITAL_SIGNATURE, USAGE_CLIENT_AUTH]
        .into_iter()
        .collect();
    if usages != want {
        let list: Vec<&str> = usages.into_iter().collect();
        return Err(format!(
            "CSR {name:?} was created with unexpected usages: {}",
            go_list(&list)
        ));
    }
    if !csr.groups.iter().all(|g| cond.groups.contains(g)) {
        return Err(format!(
            "CSR {name:?} was created by a user with unexpected groups: {}",
            go_list(csr.groups)
        ));
    }
    let expected = format!("{}:{node}", cond.common_name_prefix);
    if cn != expected {
        return Err(format!(
            "expected the CSR's commonName to be {expected:?}, but it is {cn:?}"
        ));
    }
    if organizations
        != cond
            .organizations
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
    {
        return Err(format!(
            "expected the CSR's organization to be {}, but it is {}",
            go_list(&cond.organizations),
            go_list(organizations)
        ));
    }
    Ok(())
}

fn requested_sans(x509: &X509CertificationRequest<'_>) -> Vec<String> {
    let mut out = Vec::new();
    let Some(exts) = x509.requested_extensions() else {
        return out;
    };
    for ext in exts {
        if let ParsedExtension::SubjectAlternativeName(san) = ext {
            for gn in &san.general_names {
                out.push(describe_general_name(gn));
            }
        }
    }
    out
}

fn describe_general_name(gn: &GeneralName<'_>) -> String {
    match gn {
        GeneralName::DNSName(d) => format!("DNS:{d}"),
        GeneralName::RFC822Name(e) => format!("email:{e}"),
        GeneralName::URI(u) => format!("URI:{u}"),
        GeneralName::IPAddress(b) => match b.len() {
            4 => <[u8; 4]>::try_from(*b)
                .map(|a| format!("IP:{}", IpAddr::from(a)))
                .unwrap_or_else(|_| "IP:?".into()),
            16 => <[u8; 16]>::try_from(*b)
                .map(|a| format!("IP:{}", IpAddr::from(a)))
                .unwrap_or_else(|_| "IP:?".into()),
            _ => "IP:?".to_string(),
        },
        GeneralName::DirectoryName(n) => format!("dirName:{n}"),
        other => format!("{other:?}"),
    }
}

/// Accepts ECDSA P-256, ECDSA P-384 and RSA ≥ 2048 bits; `Err` describes anything else.
fn check_key(x509: &X509CertificationRequest<'_>) -> Result<(), String> {
    let spki = &x509.certification_request_info.subject_pki;
    let alg = &spki.algorithm.algorithm;
    if *alg == OID_KEY_TYPE_EC_PUBLIC_KEY {
        let curve = spki
            .algorithm
            .parameters
            .as_ref()
            .and_then(|p| p.as_oid().ok());
        return match curve {
            Some(c) if c == OID_EC_P256 || c == OID_NIST_EC_P384 => Ok(()),
            Some(c) => Err(format!("ECDSA on curve {c}")),
            None => Err("ECDSA without a named curve".to_string()),
        };
    }
    if *alg == OID_PKCS1_RSAENCRYPTION {
        return match spki.parsed() {
            Ok(PublicKey::RSA(rsa)) => {
                let bits = modulus_bits(rsa.modulus);
                if bits >= MIN_RSA_BITS {
                    Ok(())
                } else {
                    Err(format!("RSA {bits} bits"))
                }
            }
            _ => Err("malformed RSA key".to_string()),
        };
    }
    Err(format!("algorithm {alg}"))
}

fn modulus_bits(modulus: &[u8]) -> usize {
    let m: &[u8] = match modulus.iter().position(|b| *b != 0) {
        Some(i) => &modulus[i..],
        None => return 0,
    };
    match m.first() {
        Some(first) => (m.len() - 1) * 8 + (8 - first.leading_zeros() as usize),
        None => 0,
    }
}

#[cfg(test)]
#[path = "checks_tests.rs"]
mod tests;
