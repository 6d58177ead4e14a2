//! The kube-controller-manager share the sandbox runs in-process: EndpointSlices, pod GC for
//! deleted Nodes and a trivial scheduler. The controllers live in
//! `cluster_manager::kcm`; this only keeps them running.

use std::time::Duration;

/// Runs the sandbox controllers until the task is aborted, restarting them if they stop.
pub async fn run(client: kube::Client) {
    loop {
        if let Err(e) = cluster_manager::kcm::run_kcm(client.clone()).await {
            tracing::warn!(error = %e, "sandbox controllers stopped; restarting");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
