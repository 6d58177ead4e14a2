use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType, SignatureAlgorithm};
use rstest::rstest;

use super::*;

struct Csr {
    name: String,
    signer: String,
    username: String,
    groups: Vec<String>,
    usages: Vec<String>,
    expiration: Option<i64>,
    pem: Vec<u8>,
    signed: bool,
    decided: bool,
}

fn request(
    cn: &str,
    orgs: &[&str],
    sans: Vec<SanType>,
    alg: &'static SignatureAlgorithm,
) -> Vec<u8> {
    let key = KeyPair::generate_for(alg).expect("key");
    request_with_key(cn, orgs, sans, &key)
}

fn request_with_key(cn: &str, orgs: &[&str], sans: Vec<SanType>, key: &KeyPair) -> Vec<u8> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    for o in orgs {
        dn.push(DnType::OrganizationName, *o);
    }
    dn.push(DnType::CommonName, cn);
    params.distinguished_name = dn;
    params.subject_alt_names = sans;
    params
        .serialize_request(key)
        .expect("csr")
        .pem()
        .expect("pem")
        .into_bytes()
}

fn good() -> Csr {
    Csr {
        name: "csr-abc".into(),
        signer: KUBE_APISERVER_CLIENT_SIGNER.into(),
        username: "system:node:node1".into(),
        groups: vec!["system:nodes".into(), "system:authenticated".into()],
        usages: vec!["digital signature".into(), "client auth".into()],
        expiration: Some(600),
        pem: request(
            "system:ovn-node:node1",
            &["system:ovn-nodes"],
            vec![],
            &rcgen::PKCS_ECDSA_P256_SHA256,
        ),
        signed: false,
        decided: false,
    }
}

fn eval_with(policy: &ApproverPolicy, c: &Csr, nodes: &[&str]) -> CsrDecision {
    let view = CsrView {
        name: &c.name,
        signer_name: &c.signer,
        username: &c.username,
        groups: &c.groups,
        usages: &c.usages,
        expiration_seconds: c.expiration,
        request: &c.pem,
        signed: c.signed,
        approved_or_denied: c.decided,
    };
    let exists = |n: &str| {
        if nodes.contains(&n) {
            NodeExistence::Exists
        } else {
            NodeExistence::Missing
        }
    };
    evaluate(policy, &view, &exists)
}

fn eval(c: &Csr) -> CsrDecision {
    eval_with(&ApproverPolicy::default(), c, &["node1", "node2"])
}

fn deny(m: &str) -> CsrDecision {
    CsrDecision::Deny(m.to_string())
}

#[rstest]
#[case::bootstrap_from_kubelet("system:node:node1")]
#[case::rotation_from_ovn_node("system:ovn-node:node1")]
fn approves_good_csr(#[case] user: &str) {
    let mut c = good();
    c.username = user.into();
    if user.starts_with("system:ovn-node") {
        c.groups = vec!["system:ovn-nodes".into(), "system:authenticated".into()];
    }
    assert_eq!(eval(&c), CsrDecision::Approve);
}

#[rstest]
#[case::p384(&rcgen::PKCS_ECDSA_P384_SHA384)]
#[case::p256(&rcgen::PKCS_ECDSA_P256_SHA256)]
fn accepted_ec_keys(#[case] alg: &'static SignatureAlgorithm) {
    let mut c = good();
    c.pem = request("system:ovn-node:node1", &["system:ovn-nodes"], vec![], alg);
    assert_eq!(eval(&c), CsrDecision::Approve);
}

#[test]
fn accepts_rsa_2048() {
    let key_pem = include_str!("../../testdata/rsa2048.test-key.pem");
    let key = KeyPair::from_pem_and_sign_algo(key_pem, &rcgen::PKCS_RSA_SHA256).expect("rsa key");
    let mut c = good();
    c.pem = request_with_key("system:ovn-node:node1", &["system:ovn-nodes"], vec![], &key);
    assert_eq!(eval(&c), CsrDecision::Approve);
}

#[test]
fn denies_rsa_1024() {
    let mut c = good();
    c.pem = include_bytes!("../../testdata/rsa1024.csr.pem").to_vec();
    assert_eq!(
        eval(&c),
        deny(
            "CSR \"csr-abc\" uses an unsupported public key (RSA 1024 bits): only ECDSA P-256, ECDSA P-384 and RSA keys of at least 2048 bits are accepted"
        )
    );
}

#[test]
fn denies_ed25519() {
    let mut c = good();
    c.pem = request(
        "system:ovn-node:node1",
        &["system:ovn-nodes"],
        vec![],
        &rcgen::PKCS_ED25519,
    );
    assert_eq!(
        eval(&c),
        deny(
            "CSR \"csr-abc\" uses an unsupported public key (algorithm 1.3.101.112): only ECDSA P-256, ECDSA P-384 and RSA keys of at least 2048 bits are accepted"
        )
    );
}

#[rstest]
#[case::dns(vec![SanType::DnsName("node1.example.com".try_into().expect("dns"))], "[DNS:node1.example.com]")]
#[case::ip(vec![SanType::IpAddress("10.0.0.1".parse().expect("ip"))], "[IP:10.0.0.1]")]
#[case::two(vec![SanType::DnsName("a".try_into().expect("dns")), SanType::Rfc822Name("x@y".try_into().expect("email"))], "[DNS:a email:x@y]")]
fn denies_sans(#[case] sans: Vec<SanType>, #[case] listed: &str) {
    let mut c = good();
    c.pem = request(
        "system:ovn-node:node1",
        &["system:ovn-nodes"],
        sans,
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    assert_eq!(
        eval(&c),
        deny(&format!(
            "CSR \"csr-abc\" must not request subject alternative names, but it requests {listed}"
        ))
    );
}

#[test]
fn denies_missing_node() {
    let mut c = good();
    c.username = "system:node:node9".into();
    c.pem = request(
        "system:ovn-node:node9",
        &["system:ovn-nodes"],
        vec![],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    assert_eq!(
        eval(&c),
        deny("CSR \"csr-abc\" was created for node \"node9\", which does not exist")
    );
}

#[test]
fn unknown_node_retries() {
    let c = good();
    let view = CsrView {
        name: &c.name,
        signer_name: &c.signer,
        username: &c.username,
        groups: &c.groups,
        usages: &c.usages,
        expiration_seconds: c.expiration,
        request: &c.pem,
        signed: false,
        approved_or_denied: false,
    };
    let d = evaluate(&ApproverPolicy::default(), &view, &|_| {
        NodeExistence::Unknown("cache not synced".into())
    });
    assert!(matches!(d, CsrDecision::Retry(_)), "{d:?}");
}

#[test]
fn denies_other_nodes_cn() {
    let mut c = good();
    c.pem = request(
        "system:ovn-node:node2",
        &["system:ovn-nodes"],
        vec![],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    assert_eq!(
        eval(&c),
        deny(
            "expected the CSR's commonName to be \"system:ovn-node:node1\", but it is \"system:ovn-node:node2\""
        )
    );
}

#[test]
fn denies_unexpected_cn_prefix() {
    let mut c = good();
    c.pem = request(
        "system:ovn-node-x:node1",
        &["system:ovn-nodes"],
        vec![],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    assert_eq!(
        eval(&c),
        deny(
            "CSR \"csr-abc\" was created with unexpected common name: \"system:ovn-node-x:node1\""
        )
    );
}

#[rstest]
#[case::none(&[], "expected the CSR's organization to be [system:ovn-nodes], but it is []")]
#[case::other(&["system:nodes"], "expected the CSR's organization to be [system:ovn-nodes], but it is [system:nodes]")]
#[case::case_differs(&["System:OVN-Nodes"], "expected the CSR's organization to be [system:ovn-nodes], but it is [System:OVN-Nodes]")]
fn denies_wrong_organization(#[case] orgs: &[&str], #[case] want: &str) {
    let mut c = good();
    c.pem = request(
        "system:ovn-node:node1",
        orgs,
        vec![],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    assert_eq!(eval(&c), deny(want));
}

#[rstest]
#[case::admin("kubernetes-admin", "failed to parse the username: kubernetes-admin")]
#[case::trailing_colon("system:node:", "failed to parse the username: system:node:")]
#[case::service_account(
    "system:serviceaccount:ovn:node1",
    "CSR \"csr-abc\" was created by an unexpected user: \"system:serviceaccount:ovn:node1\""
)]
#[case::bad_node_name(
    "system:node:Node_1",
    "extracted node name \"Node_1\" is not a valid DNS subdomain [a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')]"
)]
fn denies_wrong_user(#[case] user: &str, #[case] want: &str) {
    let mut c = good();
    c.username = user.into();
    assert_eq!(eval(&c), deny(want));
}

#[rstest]
#[case::missing_client_auth(&["digital signature"], "[digital signature]")]
#[case::extra_key_encipherment(&["digital signature", "key encipherment", "client auth"], "[client auth digital signature key encipherment]")]
#[case::server_auth(&["digital signature", "server auth"], "[digital signature server auth]")]
#[case::empty(&[], "[]")]
fn denies_wrong_usages(#[case] usages: &[&str], #[case] listed: &str) {
    let mut c = good();
    c.usages = usages.iter().map(|s| s.to_string()).collect();
    assert_eq!(
        eval(&c),
        deny(&format!(
            "CSR \"csr-abc\" was created with unexpected usages: {listed}"
        ))
    );
}

#[test]
fn duplicate_usages_are_a_set() {
    let mut c = good();
    c.usages = vec![
        "client auth".into(),
        "digital signature".into(),
        "client auth".into(),
    ];
    assert_eq!(eval(&c), CsrDecision::Approve);
}

#[test]
fn denies_wrong_groups() {
    let mut c = good();
    c.groups = vec!["system:nodes".into(), "system:masters".into()];
    assert_eq!(
        eval(&c),
        deny(
            "CSR \"csr-abc\" was created by a user with unexpected groups: [system:nodes system:masters]"
        )
    );
}

#[rstest]
#[case::missing(
    None,
    Some("CSR \"csr-abc\" was created without specyfying the expirationSeconds")
)]
#[case::two_years(Some(2 * 365 * 24 * 3600), Some("CSR \"csr-abc\" was created with invalid expirationSeconds value: 63072000"))]
#[case::one_year(Some(MAX_DURATION_SECS), None)]
#[case::one_year_plus(Some(MAX_DURATION_SECS + 1), Some("CSR \"csr-abc\" was created with invalid expirationSeconds value: 31536001"))]
fn expiration(#[case] exp: Option<i64>, #[case] want: Option<&str>) {
    let mut c = good();
    c.expiration = exp;
    assert_eq!(eval(&c), want.map(deny).unwrap_or(CsrDecision::Approve));
}

#[rstest]
#[case::other_signer(|c: &mut Csr| c.signer = "kubernetes.io/kube-apiserver-client-kubelet".into())]
#[case::kubelet_cn(|c: &mut Csr| c.pem = request("system:node:node1", &["system:nodes"], vec![], &rcgen::PKCS_ECDSA_P256_SHA256))]
fn ignores_foreign_csrs(#[case] f: fn(&mut Csr)) {
    let mut c = good();
    f(&mut c);
    assert_eq!(eval(&c), CsrDecision::Ignore);
}

#[rstest]
#[case::signed(|c: &mut Csr| c.signed = true)]
#[case::decided(|c: &mut Csr| c.decided = true)]
fn skips_handled(#[case] f: fn(&mut Csr)) {
    let mut c = good();
    f(&mut c);
    assert_eq!(eval(&c), CsrDecision::AlreadyHandled);
}

#[rstest]
#[case::not_pem(b"garbage".to_vec())]
#[case::pem_not_csr(b"-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n".to_vec())]
fn unparsable_requests_retry(#[case] pem: Vec<u8>) {
    let mut c = good();
    c.pem = pem;
    assert!(matches!(eval(&c), CsrDecision::Retry(_)));
}

#[test]
fn cn_without_node_part_retries() {
    let mut c = good();
    c.pem = request(
        "system:ovn-node:",
        &["system:ovn-nodes"],
        vec![],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    assert_eq!(
        eval(&c),
        CsrDecision::Retry("failed to parse the common name: system:ovn-node:".into())
    );
}

#[test]
fn extra_conditions() {
    let extra: Vec<CsrAcceptanceCondition> = serde_json::from_str(
        r#"[{"commonNamePrefix":"system:custom-node","organizations":["system:custom-nodes"],
             "groups":["system:custom-nodes","system:authenticated"],"userPrefixes":["system:custom-node"]}]"#,
    )
    .expect("conditions");
    let policy = ApproverPolicy::with_extra(extra);
    let mut c = good();
    c.username = "system:custom-node:node1".into();
    c.groups = vec!["system:custom-nodes".into()];
    c.pem = request(
        "system:custom-node:node1",
        &["system:custom-nodes"],
        vec![],
        &rcgen::PKCS_ECDSA_P256_SHA256,
    );
    assert_eq!(eval_with(&policy, &c, &["node1"]), CsrDecision::Approve);
    // without the extra condition the same CSR is not ours
    assert_eq!(
        eval_with(&ApproverPolicy::default(), &c, &["node1"]),
        CsrDecision::Ignore
    );
}

#[test]
fn modulus_bit_count() {
    assert_eq!(modulus_bits(&[0x00, 0x80, 0x00]), 16);
    assert_eq!(modulus_bits(&[0x01, 0x00]), 9);
    assert_eq!(modulus_bits(&[]), 0);
}
