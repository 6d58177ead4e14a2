use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer, KeyPair,
};
use serde_json::{Value, json};

use super::*;
use crate::admission::node::NodeAdmissionConfig;
use crate::admission::pod::PodAdmissionConfig;
use crate::loadgen::{Conn, client_config};
use crate::tls::TlsMinVersion;

/// A CA and a serving certificate for localhost / 127.0.0.1 (PEMs: ca, cert, key).
fn pki(label: &str) -> (String, String, String) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("test ca {label}"));
    ca.distinguished_name = dn;
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("key");
    let mut leaf = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
        .expect("params");
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("webhook {label}"));
    leaf.distinguished_name = dn;
    let cert = leaf.signed_by(&key, &issuer).expect("leaf");
    (ca_cert.pem(), cert.pem(), key.serialize_pem())
}

fn write_pair(dir: &Path, cert: &str, key: &str) {
    // write via rename so the reloader never sees half a file
    for (name, data) in [("tls.crt", cert), ("tls.key", key)] {
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, data).expect("write");
        std::fs::rename(&tmp, dir.join(name)).expect("rename");
    }
}

fn state() -> Arc<WebhookState> {
    Arc::new(WebhookState::new(
        NodeAdmission::new(&NodeAdmissionConfig::default()),
        PodAdmission::new(PodAdmissionConfig::default()),
        NodeOwnedResources::new(["tunnelreports.k8s.ovn.org"]),
        Arc::new(NoNodes),
        Metrics::shared(),
    ))
}

fn node_review(user: &str, node: &str, new_annotations: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "uid-1",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "subResource": "status",
            "operation": "UPDATE",
            "userInfo": {"username": user},
            "object": {"kind": "Node", "metadata": {"name": node, "annotations": new_annotations}},
            "oldObject": {"kind": "Node", "metadata": {"name": node}}
        }
    }))
    .expect("json")
}

struct Running {
    addr: SocketAddr,
    handle: ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Running {
    async fn stop(self) {
        self.handle.shutdown(Duration::from_secs(1));
        let _ = self.task.await;
    }
}

async fn start(state: Arc<WebhookState>, certs: &CertReloader) -> Running {
    let (handle, task) = serve_tls(router(state), "127.0.0.1:0".parse().expect("addr"), certs);
    let addr = handle.local_addr().await.expect("listening");
    Running { addr, handle, task }
}

#[tokio::test]
async fn serves_reviews_over_tls() {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tmp");
    let (ca, cert, key) = pki("a");
    write_pair(dir.path(), &cert, &key);
    let certs = CertReloader::from_dir(dir.path(), TlsMinVersion::Tls12)
        .await
        .expect("certs");
    let st = state();
    let srv = start(st.clone(), &certs).await;
    let cfg = client_config(&[ca.as_bytes()]).expect("client cfg");
    let mut c = Conn::connect_tls(srv.addr, "localhost", cfg)
        .await
        .expect("connect");

    let (code, body) = c
        .request(
            "POST",
            "/node",
            &node_review("system:ovn-node:node1", "node2", json!({})),
        )
        .await
        .expect("request");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["response"]["uid"], "uid-1");
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 403);
    assert_eq!(
        v["response"]["status"]["message"],
        "ovnkube-node on node: \"node1\" is not allowed to modify nodes \"node2\" annotations"
    );

    // same connection (keep-alive): an allowed one
    let (_, body) = c
        .request(
            "POST",
            "/node",
            &node_review(
                "system:ovn-node:node1",
                "node1",
                json!({"k8s.ovn.org/host-cidrs": "[]"}),
            ),
        )
        .await
        .expect("request");
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["response"]["allowed"], true);

    // garbage → 400 inside a well-formed AdmissionReview, never a panic or a dropped connection
    for path in ["/node", "/pod", "/node-owned"] {
        let (code, body) = c
            .request("POST", path, b"{not json")
            .await
            .expect("request");
        assert_eq!(code, 200);
        let v: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 400);
    }

    let (code, _) = c.request("GET", "/healthz", b"").await.expect("healthz");
    assert_eq!(code, 200);
    let (code, _) = c.request("GET", "/readyz", b"").await.expect("readyz");
    assert_eq!(code, 503);
    st.set_ready(true);
    let (code, _) = c.request("GET", "/readyz", b"").await.expect("readyz");
    assert_eq!(code, 200);

    let text = st.metrics.encode();
    assert!(
        text.contains(
            "ovnkube_identity_webhook_requests_total{webhook=\"node\",result=\"denied\"} 1"
        ),
        "{text}"
    );
    assert!(text.contains(
        "ovnkube_identity_webhook_requests_total{webhook=\"node\",result=\"allowed\"} 1"
    ));
    assert!(text.contains(
        "ovnkube_identity_webhook_denies_total{webhook=\"node\",reason=\"other_node\"} 1"
    ));
    assert!(
        text.contains(
            "ovnkube_identity_webhook_denies_total{webhook=\"pod\",reason=\"malformed\"} 1"
        )
    );
    srv.stop().await;
}

#[tokio::test]
async fn reloads_certificate_without_dropping_connections() {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tmp");
    let (ca_a, cert_a, key_a) = pki("a");
    let (ca_b, cert_b, key_b) = pki("b");
    write_pair(dir.path(), &cert_a, &key_a);
    let certs = CertReloader::from_dir(dir.path(), TlsMinVersion::Tls12)
        .await
        .expect("certs");
    let srv = start(state(), &certs).await;
    let cfg = client_config(&[ca_a.as_bytes(), ca_b.as_bytes()]).expect("client cfg");
    let der = |pem_str: &str| pem::parse(pem_str).expect("pem").into_contents();

    let mut old = Conn::connect_tls(srv.addr, "localhost", cfg.clone())
        .await
        .expect("connect");
    assert_eq!(
        old.peer_certificate().expect("peer").as_ref(),
        der(&cert_a).as_slice()
    );
    assert!(!certs.reload_if_changed().await.expect("no change"));

    write_pair(dir.path(), &cert_b, &key_b);
    assert!(certs.reload_if_changed().await.expect("reload"));

    // the old connection keeps working
    let (code, _) = old.request("GET", "/healthz", b"").await.expect("old conn");
    assert_eq!(code, 200);
    // new connections get the new certificate
    let new = Conn::connect_tls(srv.addr, "localhost", cfg.clone())
        .await
        .expect("connect");
    assert_eq!(
        new.peer_certificate().expect("peer").as_ref(),
        der(&cert_b).as_slice()
    );

    // a broken pair is refused and the current certificate stays
    std::fs::write(dir.path().join("tls.key"), "garbage").expect("write");
    assert!(certs.reload_if_changed().await.is_err());
    let again = Conn::connect_tls(srv.addr, "localhost", cfg)
        .await
        .expect("connect");
    assert_eq!(
        again.peer_certificate().expect("peer").as_ref(),
        der(&cert_b).as_slice()
    );
    srv.stop().await;
}

#[tokio::test]
async fn tls13_minimum_refuses_tls12_clients() {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tmp");
    let (ca, cert, key) = pki("a");
    write_pair(dir.path(), &cert, &key);
    let certs = CertReloader::from_dir(dir.path(), TlsMinVersion::Tls13)
        .await
        .expect("certs");
    let srv = start(state(), &certs).await;
    let mut store = rustls::RootCertStore::empty();
    for c in rustls_pki_types::pem::PemObject::pem_slice_iter(ca.as_bytes()) {
        store.add(c.expect("ca")).expect("add");
    }
    let tls12_only = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_protocol_versions(&[&rustls::version::TLS12])
        .expect("versions")
        .with_root_certificates(store)
        .with_no_client_auth(),
    );
    assert!(
        Conn::connect_tls(srv.addr, "localhost", tls12_only)
            .await
            .is_err()
    );
    let ok = client_config(&[ca.as_bytes()]).expect("cfg");
    assert!(Conn::connect_tls(srv.addr, "localhost", ok).await.is_ok());
    srv.stop().await;
}

#[tokio::test]
async fn metrics_endpoint() {
    let metrics = Metrics::shared();
    metrics.csr_decision("approved");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_metrics(metrics, listener, async move {
        let _ = rx.await;
    }));
    let mut c = Conn::connect_plain(addr).await.expect("connect");
    let (code, body) = c.request("GET", "/metrics", b"").await.expect("get");
    assert_eq!(code, 200);
    let text = String::from_utf8(body).expect("utf8");
    assert!(text.contains("ovnkube_identity_csr_decisions_total{decision=\"approved\"} 1"));
    let _ = tx.send(());
    drop(c);
    let _ = task.await;
}

#[tokio::test]
async fn bare_baseline_answers_allowed() {
    crate::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tmp");
    let (ca, cert, key) = pki("a");
    write_pair(dir.path(), &cert, &key);
    let certs = CertReloader::from_dir(dir.path(), TlsMinVersion::Tls12)
        .await
        .expect("certs");
    let (addr, task) =
        crate::bare::bind("127.0.0.1:0".parse().expect("addr"), certs.server_config())
            .await
            .expect("bind");
    let mut c = Conn::connect_tls(
        addr,
        "localhost",
        client_config(&[ca.as_bytes()]).expect("cfg"),
    )
    .await
    .expect("connect");
    let (code, body) = c
        .request(
            "POST",
            "/node",
            &node_review("system:ovn-node:node1", "node2", json!({})),
        )
        .await
        .expect("request");
    assert_eq!(code, 200);
    let v: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(v["response"]["allowed"], true);
    task.abort();
    let _ = task.await;
}
