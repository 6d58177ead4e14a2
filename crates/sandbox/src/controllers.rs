//! The kube-controller-manager share the sandbox runs in-process (EndpointSlices, pod GC for
//! deleted Nodes, a trivial scheduler); the controllers themselves live in the cluster-manager
//! crate.

/// Runs the sandbox controllers until the task is aborted.
pub async fn run(client: kube::Client) {
    // wired to cluster_manager::kcm::run_kcm once that crate lands
    let _ = client;
    futures::future::pending::<()>().await;
}
