//! The one way ovnk's controllers follow a resource: a reflector store kept by a watcher with
//! the default backoff, waking the controller's reconcile loop on every change.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;

/// Starts watching `api` (filtered by `config`) into a store, and notifies `notify` after every
/// applied change. Watch errors are logged with the resource kind and retried with backoff; the
/// task ends with the runtime.
pub fn spawn_reflector<K>(api: Api<K>, config: watcher::Config, notify: Arc<Notify>) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let (reader, writer) = reflector::store();
    let kind = K::kind(&K::DynamicType::default()).to_string();
    let stream = watcher(api, config)
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(_) => notify.notify_one(),
                Err(e) => tracing::warn!(kind = %kind, error = %e, "watch error (retrying)"),
            }
        }
    });
    reader
}
