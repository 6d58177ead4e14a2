//! A metadata-only Node cache (reflector) shared by the approver and the pod webhook.

use std::future::Future;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PartialObjectMeta};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::admission::pod::{NODE_SUBNETS, NodeLookup};

/// Read handle to the Node metadata cache.
#[derive(Clone)]
pub struct NodeCache {
    store: Store<PartialObjectMeta<Node>>,
}

impl std::fmt::Debug for NodeCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCache").finish_non_exhaustive()
    }
}

impl NodeCache {
    /// Starts watching Node metadata. Returns the cache and the future that drives the watch
    /// (spawn it; it runs until dropped).
    pub fn start(client: Client) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (store, writer) = reflector::store();
        let api: Api<PartialObjectMeta<Node>> = Api::all(client);
        let driver = watcher(api, watcher::Config::default())
            .default_backoff()
            .reflect(writer)
            .for_each(|ev| async move {
                if let Err(e) = ev {
                    tracing::warn!(error = %e, "node watch error");
                }
            });
        (NodeCache { store }, driver)
    }

    /// A cache over an existing store (tests, or a store shared with another reflector).
    pub fn from_store(store: Store<PartialObjectMeta<Node>>) -> Self {
        NodeCache { store }
    }

    /// Waits until the initial list has been received.
    pub async fn wait_until_ready(&self) -> bool {
        self.store.wait_until_ready().await.is_ok()
    }

    /// Whether `name` is in the cache.
    pub fn contains(&self, name: &str) -> bool {
        self.store.get(&ObjectRef::new(name)).is_some()
    }
}

impl NodeLookup for NodeCache {
    fn node_subnets_annotation(&self, node: &str) -> Result<Option<String>, String> {
        match self.store.get(&ObjectRef::new(node)) {
            None => Err(format!("node \"{node}\" not found")),
            Some(n) => Ok(n
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(NODE_SUBNETS))
                .cloned()),
        }
    }
}
