//! Prometheus metrics (prometheus-client, explicit registry, OpenMetrics text).

use std::fmt::Write as _;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::admission::DenyReason;

/// Which webhook path served a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Webhook {
    Node,
    Pod,
    NodeOwned,
}

impl Webhook {
    pub fn as_str(self) -> &'static str {
        match self {
            Webhook::Node => "node",
            Webhook::Pod => "pod",
            Webhook::NodeOwned => "node-owned",
        }
    }
}

/// Result of one admission request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReviewResult {
    Allowed,
    Denied,
    Invalid,
}

impl EncodeLabelValue for Webhook {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

impl EncodeLabelValue for ReviewResult {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(match self {
            ReviewResult::Allowed => "allowed",
            ReviewResult::Denied => "denied",
            ReviewResult::Invalid => "invalid",
        })
    }
}

impl EncodeLabelValue for DenyReason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RequestLabels {
    pub webhook: Webhook,
    pub result: ReviewResult,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DenyLabels {
    pub webhook: Webhook,
    pub reason: DenyReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WebhookLabels {
    pub webhook: Webhook,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct CsrLabels {
    pub decision: String,
}

/// All identity metrics, registered in one registry.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub denies: Family<DenyLabels, Counter>,
    pub latency: Family<WebhookLabels, Histogram>,
    pub csr_decisions: Family<CsrLabels, Counter>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ovnkube_identity");
        let requests = Family::<RequestLabels, Counter>::default();
        let denies = Family::<DenyLabels, Counter>::default();
        let latency = Family::<WebhookLabels, Histogram>::new_with_constructor(|| {
            // 50 µs .. ~3.3 s
            Histogram::new(exponential_buckets(0.00005, 2.0, 17))
        });
        let csr_decisions = Family::<CsrLabels, Counter>::default();
        registry.register(
            "webhook_requests",
            "Admission requests served, by webhook and result",
            requests.clone(),
        );
        registry.register(
            "webhook_denies",
            "Admission requests denied, by webhook and reason",
            denies.clone(),
        );
        registry.register(
            "webhook_request_duration_seconds",
            "Time to decode, check and encode one admission request",
            latency.clone(),
        );
        registry.register(
            "csr_decisions",
            "CSR approver decisions (approved, denied, ignored, retried)",
            csr_decisions.clone(),
        );
        Metrics {
            registry,
            requests,
            denies,
            latency,
            csr_decisions,
        }
    }

    /// Shared handle.
    pub fn shared() -> Arc<Self> {
        Arc::new(Self::new())
    }

    /// Counts one CSR decision.
    pub fn csr_decision(&self, decision: &str) {
        self.csr_decisions
            .get_or_create(&CsrLabels {
                decision: decision.to_string(),
            })
            .inc();
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            let _ = writeln!(out, "# encoding error");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_contains_families() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                webhook: Webhook::Node,
                result: ReviewResult::Denied,
            })
            .inc();
        m.denies
            .get_or_create(&DenyLabels {
                webhook: Webhook::Node,
                reason: DenyReason::OtherNode,
            })
            .inc();
        m.latency
            .get_or_create(&WebhookLabels {
                webhook: Webhook::Pod,
            })
            .observe(0.001);
        m.csr_decision("approved");
        let text = m.encode();
        assert!(text.contains(
            "ovnkube_identity_webhook_requests_total{webhook=\"node\",result=\"denied\"} 1"
        ));
        assert!(text.contains(
            "ovnkube_identity_webhook_denies_total{webhook=\"node\",reason=\"other_node\"} 1"
        ));
        assert!(text.contains("ovnkube_identity_webhook_request_duration_seconds_bucket"));
        assert!(text.contains("ovnkube_identity_csr_decisions_total{decision=\"approved\"} 1"));
    }
}
