//! The CSR approver controller (kube-rs). Thin shell around [`super::checks::evaluate`].
//!
//! - Watches all CSRs; CSRs that are not ours (CN prefix, signer) are ignored.
//! - Writes the decision through the `approval` subresource with a PUT carrying the
//!   resourceVersion it read, so two replicas cannot both decide: the loser gets 409 Conflict,
//!   which is not an error (the next watch event shows the winner's decision).
//! - Publishes an Event (`CSRApproved` / `CSRDenied`) after a successful write.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Client, Resource};

use super::checks::{
    ApproverPolicy, CONTROLLER_NAME, CsrDecision, CsrView, NodeExistence, evaluate,
};
use crate::metrics::Metrics;
use crate::nodecache::NodeCache;

/// Approver errors (all retried).
#[derive(Debug, thiserror::Error)]
pub enum ApproverError {
    #[error("CSR {name}: {message}")]
    Retry { name: String, message: String },
    #[error("CSR {name}: writing the approval: {source}")]
    Write {
        name: String,
        #[source]
        source: kube::Error,
    },
}

struct Ctx {
    api: Api<CertificateSigningRequest>,
    nodes_api: Api<Node>,
    nodes: NodeCache,
    policy: ApproverPolicy,
    recorder: Recorder,
    metrics: Arc<Metrics>,
}

/// Runs the approver until `shutdown` resolves. `nodes` must be driven by the caller.
pub async fn run(
    client: Client,
    policy: ApproverPolicy,
    nodes: NodeCache,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    // The controller wants a Sync future; forward through a oneshot.
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let forward = tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(());
    });
    tokio::select! {
        ready = nodes.wait_until_ready() => {
            if !ready {
                tracing::error!("node cache never became ready; CSR approver not started");
                return;
            }
        }
        _ = &mut stop_rx => return,
    }
    let reporter = Reporter {
        controller: CONTROLLER_NAME.to_string(),
        instance: std::env::var("POD_NAME").ok(),
    };
    let ctx = Arc::new(Ctx {
        api: Api::all(client.clone()),
        nodes_api: Api::all(client.clone()),
        nodes,
        policy,
        recorder: Recorder::new(client.clone(), reporter),
        metrics,
    });
    tracing::info!("CSR approver started");
    Controller::new(
        Api::<CertificateSigningRequest>::all(client),
        watcher::Config::default(),
    )
    .graceful_shutdown_on(async move {
        let _ = stop_rx.await;
    })
    .run(reconcile, error_policy, ctx)
    .for_each(|res| async move {
        if let Err(e) = res {
            tracing::debug!(error = %e, "reconcile failed");
        }
    })
    .await;
    forward.abort();
    tracing::info!("CSR approver stopped");
}

fn error_policy(csr: Arc<CertificateSigningRequest>, err: &ApproverError, _: Arc<Ctx>) -> Action {
    tracing::warn!(csr = csr.metadata.name.as_deref().unwrap_or_default(), error = %err, "CSR will be retried");
    Action::requeue(Duration::from_secs(5))
}

/// Extracts the node part of the CN of a CSR's PEM request, if parsable.
fn requested_node(pem_bytes: &[u8]) -> Option<String> {
    use x509_parser::prelude::FromDer;
    let der = pem::parse(pem_bytes).ok()?.into_contents();
    let (_, req) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&der).ok()?;
    let cn = req
        .certification_request_info
        .subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?;
    cn.rsplit_once(':').map(|(_, n)| n.to_string())
}

async fn reconcile(
    csr: Arc<CertificateSigningRequest>,
    ctx: Arc<Ctx>,
) -> Result<Action, ApproverError> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let spec = &csr.spec;
    let status = csr.status.as_ref();
    let signed = status
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty());
    let decided = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Approved" || c.type_ == "Denied")
        });
    let groups = spec.groups.clone().unwrap_or_default();
    let usages = spec.usages.clone().unwrap_or_default();
    let username = spec.username.clone().unwrap_or_default();

    // Node existence: the cache first, then a live GET before ever denying for a missing node.
    let existence = match requested_node(&spec.request.0) {
        Some(node) if ctx.nodes.contains(&node) => NodeExistence::Exists,
        Some(node) => match ctx.nodes_api.get_opt(&node).await {
            Ok(Some(_)) => NodeExistence::Exists,
            Ok(None) => NodeExistence::Missing,
            Err(e) => NodeExistence::Unknown(e.to_string()),
        },
        None => NodeExistence::Missing,
    };
    let view = CsrView {
        name: &name,
        signer_name: &spec.signer_name,
        username: &username,
        groups: &groups,
        usages: &usages,
        expiration_seconds: spec.expiration_seconds.map(i64::from),
        request: &spec.request.0,
        signed,
        approved_or_denied: decided,
    };
    let decision = evaluate(&ctx.policy, &view, &|_| existence.clone());
    match decision {
        CsrDecision::Ignore => {
            tracing::trace!(csr = %name, "ignoring CSR");
            Ok(Action::await_change())
        }
        CsrDecision::AlreadyHandled => Ok(Action::await_change()),
        CsrDecision::Retry(message) => {
            ctx.metrics.csr_decision("retried");
            Err(ApproverError::Retry { name, message })
        }
        CsrDecision::Approve => {
            let cond = condition(
                "Approved",
                "AutoApproved",
                format!("Auto-approved CSR {name:?}"),
            );
            if write(&ctx, &csr, cond).await? {
                ctx.metrics.csr_decision("approved");
                tracing::info!(csr = %name, user = %username, "approved CSR");
                publish(
                    &ctx,
                    &csr,
                    EventType::Normal,
                    "CSRApproved",
                    "Approving",
                    format!("CSR {name:?} has been approved"),
                )
                .await;
            }
            Ok(Action::await_change())
        }
        CsrDecision::Deny(message) => {
            let cond = condition("Denied", "CSRDenied", message.clone());
            if write(&ctx, &csr, cond).await? {
                ctx.metrics.csr_decision("denied");
                tracing::warn!(csr = %name, user = %username, reason = %message, "denied CSR");
                publish(
                    &ctx,
                    &csr,
                    EventType::Warning,
                    "CSRDenied",
                    "Denying",
                    format!("The CSR {name:?} has been denied: {message}"),
                )
                .await;
            }
            Ok(Action::await_change())
        }
    }
}

fn condition(type_: &str, reason: &str, message: String) -> CertificateSigningRequestCondition {
    CertificateSigningRequestCondition {
        type_: type_.to_string(),
        status: "True".to_string(),
        reason: Some(reason.to_string()),
        message: Some(message),
        last_update_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        last_transition_time: None,
    }
}

/// PUT to the approval subresource. `Ok(false)` when another writer won (409).
async fn write(
    ctx: &Ctx,
    csr: &CertificateSigningRequest,
    cond: CertificateSigningRequestCondition,
) -> Result<bool, ApproverError> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let mut updated = csr.clone();
    let status = updated.status.get_or_insert_with(Default::default);
    status.conditions.get_or_insert_with(Vec::new).push(cond);
    match ctx
        .api
        .replace_subresource("approval", &name, &PostParams::default(), &updated)
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => {
            tracing::debug!(csr = %name, "approval conflict: another writer decided first");
            Ok(false)
        }
        Err(source) => Err(ApproverError::Write { name, source }),
    }
}

async fn publish(
    ctx: &Ctx,
    csr: &CertificateSigningRequest,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &csr.object_ref(&())).await {
        tracing::warn!(error = %e, "publishing CSR event failed");
    }
}

#[cfg(test)]
#[path = "controller_tests.rs"]
mod tests;
