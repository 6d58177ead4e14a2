//! The one writer of `ServiceFWMark.status.conditions`.
//!
//! Conditions are cluster facts (does the Service exist, is the mark valid, does another
//! ServiceFWMark claim the same source with another mark), so they are computed once from the
//! cluster snapshot by [`crate::plan::plan_status`] and written by a single component (run it
//! in a leader-elected / single-replica process, e.g. the cluster manager), never by the nodes:
//! N nodes writing the same status would fight and multiply API writes by N.
//!
//! [`merge_conditions`] keeps `lastTransitionTime` when a condition's status does not change,
//! and [`needs_update`] compares ignoring timestamps, so an unchanged cluster causes no writes.

use std::sync::Arc;
use std::time::Duration;

use k8s_api::service_fwmark::ServiceFWMark;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::Notify;

use crate::controller::Stores;
use crate::plan::{self, ConditionReport};

/// Field manager used for status patches.
pub const FIELD_MANAGER: &str = "ovnk-fwmark-status";

/// New conditions from `reports`, keeping `lastTransitionTime` of conditions whose status is
/// unchanged.
pub fn merge_conditions(
    old: &[Condition],
    reports: &[ConditionReport],
    now: &Time,
    generation: Option<i64>,
) -> Vec<Condition> {
    reports
        .iter()
        .map(|r| {
            let status = if r.status { "True" } else { "False" };
            let last = old
                .iter()
                .find(|c| c.type_ == r.type_ && c.status == status)
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| now.clone());
            Condition {
                type_: r.type_.to_string(),
                status: status.to_string(),
                reason: r.reason.clone(),
                message: r.message.clone(),
                observed_generation: generation,
                last_transition_time: last,
            }
        })
        .collect()
}

/// Whether `new` differs from `old` other than in timestamps.
pub fn needs_update(old: &[Condition], new: &[Condition]) -> bool {
    let strip = |c: &[Condition]| {
        c.iter()
            .map(|c| {
                (
                    c.type_.clone(),
                    c.status.clone(),
                    c.reason.clone(),
                    c.message.clone(),
                    c.observed_generation,
                )
            })
            .collect::<Vec<_>>()
    };
    strip(old) != strip(new)
}

/// Run the status writer until the process ends. Errors on one object are logged and do not
/// stop the others; they are retried on the next change or after `resync`.
pub async fn run_status_writer(client: Client, resync: Duration) {
    let notify = Arc::new(Notify::new());
    let stores = Stores::start(&client, &notify);
    stores.ready(Duration::from_secs(10)).await;
    loop {
        let snap = stores.snapshot();
        let reports = plan::plan_status(&snap);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        for obj in stores.marks.state() {
            let (Some(ns), Some(name)) = (&obj.metadata.namespace, &obj.metadata.name) else {
                continue;
            };
            let key = plan::ServiceKey::new(ns.clone(), name.clone());
            let Some(rep) = reports.get(&key) else {
                continue;
            };
            let old = obj
                .status
                .as_ref()
                .map(|s| s.conditions.clone())
                .unwrap_or_default();
            let new = merge_conditions(&old, rep, &now, obj.metadata.generation);
            if !needs_update(&old, &new) {
                continue;
            }
            let api: Api<ServiceFWMark> = Api::namespaced(client.clone(), ns);
            let patch = serde_json::json!({"status": {"conditions": new}});
            if let Err(e) = api
                .patch_status(
                    name,
                    &PatchParams::apply(FIELD_MANAGER),
                    &Patch::Merge(&patch),
                )
                .await
            {
                tracing::warn!(servicefwmark = %key, error = %e, "status update failed");
            }
        }
        tokio::select! {
            _ = notify.notified() => {}
            _ = tokio::time::sleep(resync) => {}
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(t: &'static str, ok: bool) -> ConditionReport {
        ConditionReport {
            type_: t,
            status: ok,
            reason: "R".into(),
            message: "m".into(),
        }
    }

    #[test]
    fn transition_time_kept_when_status_unchanged() {
        let t0 = Time(k8s_openapi::jiff::Timestamp::from_second(1).expect("ts"));
        let t1 = Time(k8s_openapi::jiff::Timestamp::from_second(2).expect("ts"));
        let first = merge_conditions(&[], &[report("A", true), report("B", false)], &t0, Some(1));
        let second = merge_conditions(
            &first,
            &[report("A", true), report("B", true)],
            &t1,
            Some(1),
        );
        assert_eq!(second[0].last_transition_time, t0);
        assert_eq!(second[1].last_transition_time, t1);
        assert!(needs_update(&first, &second));
        let third = merge_conditions(
            &second,
            &[report("A", true), report("B", true)],
            &t1,
            Some(1),
        );
        assert!(!needs_update(&second, &third));
    }
}
