//! Leader election on a Lease against the embedded API server: one leader at a time, and a
//! candidate takes over once the leader is gone and its lease expired.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cluster_manager::leader::{LeaseConfig, run_as_leader};
use common::*;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use tokio::task::JoinHandle;

struct Running(Arc<AtomicUsize>);
impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A candidate whose work records, when it starts, how many leaders run at once.
fn candidate(
    c: &Client,
    id: &str,
    running: Arc<AtomicUsize>,
    seen_max: Arc<AtomicUsize>,
) -> JoinHandle<anyhow::Result<()>> {
    let cfg = LeaseConfig {
        namespace: "kube-system".into(),
        name: "cm-test".into(),
        identity: id.into(),
        lease_duration: Duration::from_secs(2),
        retry_period: Duration::from_millis(300),
    };
    let c = c.clone();
    tokio::spawn(run_as_leader(c, cfg, move || async move {
        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
        seen_max.fetch_max(now, Ordering::SeqCst);
        let _guard = Running(running);
        std::future::pending::<()>().await;
        Ok(())
    }))
}

async fn holder(c: &Client) -> Option<(String, i32)> {
    let api: Api<Lease> = Api::namespaced(c.clone(), "kube-system");
    let spec = api.get_opt("cm-test").await.ok()??.spec?;
    Some((spec.holder_identity?, spec.lease_transitions.unwrap_or(0)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_at_a_time_and_takeover_after_expiry() {
    let (_s, c) = server().await;
    let running = Arc::new(AtomicUsize::new(0));
    let seen_max = Arc::new(AtomicUsize::new(0));
    let a = candidate(&c, "a", running.clone(), seen_max.clone());
    eventually("a leads", || async {
        (running.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert_eq!(holder(&c).await, Some(("a".into(), 0)));
    let b = candidate(&c, "b", running.clone(), seen_max.clone());
    // b keeps following while a renews: the lease stays a's across several of b's rounds.
    for _ in 0..3 {
        eventually("lease renewed by a", || async {
            matches!(holder(&c).await, Some((h, _)) if h == "a").then_some(())
        })
        .await;
    }
    a.abort();
    let _ = a.await;
    eventually("b takes over", || async {
        matches!(holder(&c).await, Some((h, 1)) if h == "b").then_some(())
    })
    .await;
    eventually("b's work runs", || async {
        (running.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    assert_eq!(
        seen_max.load(Ordering::SeqCst),
        1,
        "never two leaders at once"
    );
    b.abort();
}
