use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use rcgen::{
    CertificateParams, CertificateSigningRequestParams, DistinguishedName, DnType, IsCa, Issuer,
    KeyPair,
};

use super::*;

/// Wall clock driven by tokio's paused time, plus manual jumps (suspend / clock changes).
#[derive(Clone)]
struct TestClock {
    base: SystemTime,
    start: tokio::time::Instant,
    jump: Arc<Mutex<Duration>>,
}

impl TestClock {
    fn new() -> Self {
        TestClock {
            base: UNIX_EPOCH + Duration::from_secs(1_800_000_000),
            start: tokio::time::Instant::now(),
            jump: Arc::new(Mutex::new(Duration::ZERO)),
        }
    }
    fn jump(&self, d: Duration) {
        if let Ok(mut j) = self.jump.lock() {
            *j += d;
        }
    }
}

impl Clock for TestClock {
    fn now(&self) -> SystemTime {
        let j = self.jump.lock().map(|j| *j).unwrap_or_default();
        self.base + self.start.elapsed() + j
    }
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send {
        tokio::time::sleep(d)
    }
}

/// In-memory CSR API + CA signing with rcgen, validity taken from the test clock.
#[derive(Clone)]
struct FakeCa {
    clock: TestClock,
    issuer: Arc<Issuer<'static, KeyPair>>,
    /// (auth CN or "bootstrap", requested CN) per submission
    log: Arc<Mutex<Vec<(String, String, i32)>>>,
    requests: Arc<Mutex<Vec<String>>>,
    fail_next: Arc<AtomicU32>,
    deny_all: Arc<Mutex<bool>>,
    /// issue certificates for this CN instead of the requested one
    override_cn: Arc<Mutex<Option<String>>>,
}

impl FakeCa {
    fn new(clock: TestClock) -> Self {
        let key = KeyPair::generate().expect("ca key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, "test-ca");
        params.distinguished_name = dn;
        FakeCa {
            clock,
            issuer: Arc::new(Issuer::new(params, key)),
            log: Arc::default(),
            requests: Arc::default(),
            fail_next: Arc::default(),
            deny_all: Arc::default(),
            override_cn: Arc::default(),
        }
    }

    fn submissions(&self) -> Vec<(String, String, i32)> {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

fn cn_of_csr(pem_str: &str) -> String {
    let p = CertificateSigningRequestParams::from_pem(pem_str).expect("csr");
    p.params
        .distinguished_name
        .get(&DnType::CommonName)
        .map(|v| match v {
            rcgen::DnValue::Utf8String(s) => s.clone(),
            other => format!("{other:?}"),
        })
        .unwrap_or_default()
}

impl CsrApi for FakeCa {
    async fn submit(
        &self,
        auth: Option<&CertBundle>,
        csr: &CsrSubmission,
    ) -> Result<String, CertError> {
        if self.fail_next.load(Ordering::SeqCst) > 0 {
            self.fail_next.fetch_sub(1, Ordering::SeqCst);
            return Err(CertError::Api("injected failure".into()));
        }
        assert_eq!(csr.signer_name, "kubernetes.io/kube-apiserver-client");
        assert_eq!(csr.usages, ["digital signature", "client auth"]);
        let who = auth
            .map(|a| a.common_name.clone())
            .unwrap_or_else(|| "bootstrap".into());
        let mut log = self
            .log
            .lock()
            .map_err(|_| CertError::Api("poisoned".into()))?;
        log.push((who, cn_of_csr(&csr.request_pem), csr.expiration_seconds));
        let mut reqs = self
            .requests
            .lock()
            .map_err(|_| CertError::Api("poisoned".into()))?;
        reqs.push(csr.request_pem.clone());
        Ok(format!("csr-{}", reqs.len()))
    }

    async fn wait_signed(
        &self,
        _auth: Option<&CertBundle>,
        name: &str,
    ) -> Result<String, CertError> {
        if self.deny_all.lock().map(|d| *d).unwrap_or(false) {
            return Err(CertError::Denied {
                name: name.into(),
                message: "no".into(),
            });
        }
        let idx: usize = name.trim_start_matches("csr-").parse().expect("idx");
        let (pem_str, exp) = {
            let reqs = self.requests.lock().expect("lock");
            let log = self.log.lock().expect("lock");
            (reqs[idx - 1].clone(), log[idx - 1].2)
        };
        let mut csr = CertificateSigningRequestParams::from_pem(&pem_str).expect("csr");
        if let Some(cn) = self.override_cn.lock().expect("lock").clone() {
            csr.params.distinguished_name.push(DnType::CommonName, cn);
        }
        let now = self
            .clock
            .now()
            .duration_since(UNIX_EPOCH)
            .expect("after epoch");
        let epoch = rcgen::date_time_ymd(1970, 1, 1);
        csr.params.not_before = epoch + Duration::from_secs(now.as_secs());
        csr.params.not_after = epoch + Duration::from_secs(now.as_secs() + exp as u64);
        let cert = csr.signed_by(&*self.issuer).expect("sign");
        Ok(cert.pem())
    }
}

fn cfg(dir: &Path, node: &str) -> CertManagerConfig {
    CertManagerConfig::new(node, dir, Duration::from_secs(600))
}

#[test]
fn deadline_is_70_to_90_percent() {
    let nb = UNIX_EPOCH + Duration::from_secs(1000);
    let na = nb + Duration::from_secs(1000);
    assert_eq!(
        rotation_deadline(nb, na, 0.0),
        nb + Duration::from_secs(700)
    );
    assert_eq!(
        rotation_deadline(nb, na, 0.5),
        nb + Duration::from_secs(800)
    );
    assert!(rotation_deadline(nb, na, 0.999_999) < nb + Duration::from_secs(900));
    assert_eq!(
        rotation_deadline(nb, na, 7.0),
        nb + Duration::from_secs(900)
    );
}

#[test]
fn backoff_sequence() {
    let secs: Vec<u64> = (0..8).map(|a| retry_delay(a, 0.0).as_secs()).collect();
    assert_eq!(secs, vec![2, 4, 8, 16, 32, 32, 32, 32]);
    assert!(retry_delay(0, 1.0) <= Duration::from_millis(2200));
}

#[test]
fn validity_window() {
    let nb = UNIX_EPOCH + Duration::from_secs(1000);
    let b = CertBundle {
        cert_pem: String::new(),
        key_pem: String::new(),
        common_name: "x".into(),
        not_before: nb,
        not_after: nb + Duration::from_secs(10),
    };
    assert!(matches!(
        check_validity(nb - Duration::from_secs(1), &b),
        Err(CertError::NotYetValid { .. })
    ));
    assert!(check_validity(nb, &b).is_ok());
    assert!(matches!(
        check_validity(nb + Duration::from_secs(10), &b),
        Err(CertError::Expired { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn bootstraps_then_rotates_with_the_current_cert() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    let mut rx = mgr.subscribe();
    let first = mgr.start().await.expect("bootstrap");
    assert_eq!(first.common_name, "system:ovn-node:node1");
    assert_eq!(first.lifetime(), Duration::from_secs(600));
    assert!(rx.borrow_and_update().is_some());
    // the stored file is the combined PEM behind the -current symlink
    let stored =
        std::fs::read_to_string(dir.path().join("ovnkube-client-current.pem")).expect("stored");
    let parsed = CertBundle::from_combined_pem(&stored).expect("parse");
    assert_eq!(
        (
            parsed.common_name.as_str(),
            parsed.not_before,
            parsed.not_after
        ),
        (
            first.common_name.as_str(),
            first.not_before,
            first.not_after
        )
    );
    assert!(
        std::fs::symlink_metadata(dir.path().join("ovnkube-client-current.pem"))
            .expect("meta")
            .file_type()
            .is_symlink()
    );

    // run until two rotations happened
    let run = mgr.run(first.clone());
    tokio::pin!(run);
    let mut seen = Vec::new();
    while seen.len() < 2 {
        tokio::select! {
            r = &mut run => panic!("run ended: {r:?}"),
            _ = rx.changed() => {
                let b = rx.borrow_and_update().clone().expect("cert");
                seen.push(b);
            }
        }
    }
    let subs = ca.submissions();
    assert_eq!(subs.len(), 3);
    assert_eq!(subs[0].0, "bootstrap");
    assert_eq!(
        subs[1].0, "system:ovn-node:node1",
        "rotation authenticates with the current cert"
    );
    assert!(
        subs.iter()
            .all(|s| s.1 == "system:ovn-node:node1" && s.2 == 600)
    );
    // each rotation happened in [70 %, 90 %) of the previous lifetime
    let mut prev = first.clone();
    for b in &seen {
        let at = b.not_before.duration_since(prev.not_before).expect("later");
        assert!(
            at >= Duration::from_secs(420) && at <= Duration::from_secs(541),
            "{at:?}"
        );
        prev = b.clone();
    }
    // a new key each time
    assert_ne!(seen[0].key_pem, first.key_pem);
    assert_ne!(seen[1].key_pem, seen[0].key_pem);
    // old files are cleaned up: one target + the symlink
    let files = std::fs::read_dir(dir.path()).expect("dir").count();
    assert_eq!(files, 2);
}

#[tokio::test(start_paused = true)]
async fn reuses_a_valid_stored_cert() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    let first = {
        let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
        mgr.start().await.expect("bootstrap")
    };
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    let again = mgr.start().await.expect("start");
    assert_eq!(
        (again.not_before, again.not_after),
        (first.not_before, first.not_after)
    );
    assert_eq!(ca.submissions().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn renamed_node_bootstraps_again() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    CertManager::new(cfg(dir.path(), "old-name"), ca.clone(), clock.clone())
        .start()
        .await
        .expect("bootstrap");
    let mgr = CertManager::new(cfg(dir.path(), "new-name"), ca.clone(), clock.clone());
    assert_eq!(
        mgr.load_stored().expect("load"),
        Stored::OtherNode("system:ovn-node:old-name".into())
    );
    assert!(
        !dir.path().join("ovnkube-client-current.pem").exists(),
        "stale cert deleted"
    );
    let b = mgr.start().await.expect("bootstrap again");
    assert_eq!(b.common_name, "system:ovn-node:new-name");
    let subs = ca.submissions();
    assert_eq!(
        subs.last().map(|s| s.0.as_str()),
        Some("bootstrap"),
        "from the bootstrap identity"
    );
}

#[tokio::test(start_paused = true)]
async fn corrupt_stored_cert_bootstraps_again() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("ovnkube-client-current.pem"), "garbage").expect("write");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    assert!(matches!(
        mgr.load_stored().expect("load"),
        Stored::Corrupt(_)
    ));
    assert!(mgr.start().await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn expired_stored_cert_bootstraps_again_at_start() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone())
        .start()
        .await
        .expect("bootstrap");
    clock.jump(Duration::from_secs(3600));
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    assert_eq!(mgr.load_stored().expect("load"), Stored::Expired);
    mgr.start().await.expect("bootstrap again");
    assert_eq!(ca.submissions()[1].0, "bootstrap");
}

#[tokio::test(start_paused = true)]
async fn not_yet_valid_stored_cert_is_an_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone())
        .start()
        .await
        .expect("bootstrap");
    // a manager whose clock is an hour behind
    let behind = TestClock {
        base: clock.base - Duration::from_secs(3600),
        ..clock.clone()
    };
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca, behind);
    assert!(matches!(
        mgr.start().await,
        Err(CertError::NotYetValid { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn watchdog_fires_after_suspend() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    let first = mgr.start().await.expect("bootstrap");
    let run = mgr.run(first);
    tokio::pin!(run);
    // let it settle into its sleep, then "suspend" past the expiry
    tokio::select! {
        r = &mut run => panic!("ended early: {r:?}"),
        _ = tokio::time::sleep(Duration::from_secs(30)) => {}
    }
    clock.jump(Duration::from_secs(3600));
    let r = run.await;
    assert!(matches!(r, Err(CertError::Expired { .. })), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn watchdog_fires_when_clock_goes_back() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    let first = mgr.start().await.expect("bootstrap");
    let jumped = TestClock {
        base: clock.base - Duration::from_secs(7200),
        ..clock.clone()
    };
    let mgr2 = CertManager::new(cfg(dir.path(), "node1"), ca, jumped);
    let r = mgr2.run(first).await;
    assert!(matches!(r, Err(CertError::NotYetValid { .. })), "{r:?}");
}

#[tokio::test(start_paused = true)]
async fn watchdog_fires_while_rotation_keeps_failing() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    let first = mgr.start().await.expect("bootstrap");
    if let Ok(mut d) = ca.deny_all.lock() {
        *d = true;
    }
    let r = mgr.run(first).await;
    assert!(matches!(r, Err(CertError::Expired { .. })), "{r:?}");
    // several retries happened between the deadline and expiry (backoff, not a hot loop)
    let n = ca.submissions().len();
    assert!((3..=20).contains(&n), "{n}");
}

#[tokio::test(start_paused = true)]
async fn bootstrap_retries_then_succeeds() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    ca.fail_next.store(3, Ordering::SeqCst);
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    mgr.start().await.expect("bootstrap after retries");
    assert_eq!(ca.submissions().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn bootstrap_gives_up_after_timeout() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    if let Ok(mut d) = ca.deny_all.lock() {
        *d = true;
    }
    let mgr = CertManager::new(cfg(dir.path(), "node1"), ca.clone(), clock.clone());
    assert!(matches!(
        mgr.start().await,
        Err(CertError::BootstrapTimeout(_))
    ));
}

#[tokio::test(start_paused = true)]
async fn issued_cert_for_wrong_cn_is_rejected() {
    let dir = tempfile::tempdir().expect("tmp");
    let clock = TestClock::new();
    let ca = FakeCa::new(clock.clone());
    if let Ok(mut o) = ca.override_cn.lock() {
        *o = Some("system:ovn-node:node2".into());
    }
    let mut c = cfg(dir.path(), "node1");
    c.bootstrap_timeout = Duration::from_secs(5);
    let mgr = CertManager::new(c, ca, clock);
    assert!(matches!(
        mgr.start().await,
        Err(CertError::BootstrapTimeout(_))
    ));
    assert!(!dir.path().join("ovnkube-client-current.pem").exists());
}

#[test]
fn generated_csr_passes_the_approver() {
    use crate::csr::checks::{ApproverPolicy, CsrDecision, CsrView, NodeExistence, evaluate};
    let (_key, req) = new_key_and_csr("system:ovn-node:node1").expect("csr");
    let groups = vec!["system:nodes".to_string()];
    let usages = vec!["digital signature".to_string(), "client auth".to_string()];
    let view = CsrView {
        name: "csr-1",
        signer_name: KUBE_APISERVER_CLIENT_SIGNER,
        username: "system:node:node1",
        groups: &groups,
        usages: &usages,
        expiration_seconds: Some(600),
        request: req.as_bytes(),
        signed: false,
        approved_or_denied: false,
    };
    assert_eq!(
        evaluate(&ApproverPolicy::default(), &view, &|_| {
            NodeExistence::Exists
        }),
        CsrDecision::Approve
    );
}

#[test]
fn kube_config_uses_cert_file() {
    let base = kube::Config::new("https://127.0.0.1:6443".parse().expect("url"));
    let c = config_with_cert_file(&base, Path::new("/certs/ovnkube-client-current.pem"));
    assert_eq!(
        c.auth_info.client_certificate.as_deref(),
        Some("/certs/ovnkube-client-current.pem")
    );
    assert_eq!(
        c.auth_info.client_key.as_deref(),
        Some("/certs/ovnkube-client-current.pem")
    );
    assert_eq!(c.cluster_url, base.cluster_url);
}

#[test]
fn durations() {
    assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
    assert_eq!(parse_duration("600s"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("24h"), Ok(Duration::from_secs(86400)));
    for bad in ["", "10", "m", "10x", "0s", "-5m"] {
        assert!(parse_duration(bad).is_err(), "{bad}");
    }
}

#[test]
fn node_cert_args() {
    use clap::Parser;
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: NodeCertArgs,
    }
    let c = Cli::try_parse_from(["ovnk"]).expect("parses");
    assert_eq!(c.args.cert_duration, DEFAULT_CERT_DURATION);
    assert!(!c.args.enabled());
    let c = Cli::try_parse_from([
        "ovnk",
        "--bootstrap-kubeconfig=/k",
        "--cert-dir=/c",
        "--cert-duration=24h",
    ])
    .expect("parses");
    assert!(c.args.enabled());
    assert_eq!(c.args.cert_duration, Duration::from_secs(86400));
    assert!(Cli::try_parse_from(["ovnk", "--cert-duration=soon"]).is_err());
}
