//! Keeps the webhook's protected label keys equal to the keys every TrustZone selector reads
//! (plus the ones given on the command line), so a node can never put itself into a zone by
//! labelling its own Node.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_api::trust_zone::{TrustZone, selector_keys};
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};

use crate::webhook::WebhookState;

/// The protected keys: `fixed` ∪ the keys of every TrustZone's selector.
pub fn protected_keys<'a>(
    fixed: &BTreeSet<String>,
    zones: impl IntoIterator<Item = &'a TrustZone>,
) -> BTreeSet<String> {
    let mut keys = fixed.clone();
    for z in zones {
        keys.extend(selector_keys(&z.spec.node_selector));
    }
    keys
}

/// Watches TrustZones and updates `state` on every change, until the task is dropped. A
/// missing CRD is retried with backoff (logged once).
pub async fn run(client: kube::Client, state: Arc<WebhookState>, fixed: BTreeSet<String>) {
    let (reader, writer) = reflector::store::<TrustZone>();
    let stream = watcher(Api::<TrustZone>::all(client), watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .touched_objects();
    futures::pin_mut!(stream);
    let mut warned = false;
    let mut last = BTreeSet::new();
    state.set_protected_labels(fixed.clone());
    while let Some(ev) = stream.next().await {
        if let Err(e) = ev {
            if !warned {
                tracing::warn!(error = %e, "watching TrustZones (protected label keys stay as they are; retrying)");
                warned = true;
            }
            continue;
        }
        let zones = reader.state();
        let keys = protected_keys(&fixed, zones.iter().map(|z| z.as_ref()));
        if keys != last {
            tracing::info!(keys = ?keys, "label keys protected from node identities");
            state.set_protected_labels(keys.clone());
            last = keys;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_api::trust_zone::TrustZoneSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    #[test]
    fn union_of_selector_keys_and_fixed() {
        let z = |k: &str| {
            TrustZone::new(
                k,
                TrustZoneSpec {
                    node_selector: LabelSelector {
                        match_labels: Some([(k.to_owned(), "x".to_owned())].into()),
                        ..Default::default()
                    },
                },
            )
        };
        let fixed: BTreeSet<String> = ["static".to_owned()].into();
        let zones = [z("tenant"), z("example.com/zone")];
        let keys = protected_keys(&fixed, zones.iter());
        assert_eq!(
            keys.into_iter().collect::<Vec<_>>(),
            vec!["example.com/zone", "static", "tenant"]
        );
    }
}
