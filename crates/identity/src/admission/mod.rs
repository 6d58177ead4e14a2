//! Pure admission logic (no I/O): AdmissionReview v1 decoding, the node, pod and node-owned
//! object checks, and the response encoding.
//!
//! Every check returns a [`Verdict`]: allowed, or denied with a [`DenyReason`] (a stable label
//! for metrics) and the exact message returned to the API server.

pub mod node;
pub mod owned;
pub mod pod;
pub mod review;
pub mod semantic;

pub use review::{AdmissionRequest, Operation, ReviewError, UserInfo};

/// Why a request was denied; a stable, low-cardinality label for the `denies` metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DenyReason {
    /// A non-ovnkube user touched an allow-listed annotation without being an extra allowed user.
    UserNotAllowed,
    /// An allow-listed annotation's value check failed.
    ValueCheck,
    /// A node identity acted on another node's object (node, pod or node-owned object).
    OtherNode,
    /// A node identity set an annotation outside its allow-list.
    AnnotationNotAllowed,
    /// A node identity changed something other than annotations.
    NotOnlyAnnotations,
    /// ovnk addition: a node identity set or changed a protected key (transport zones, trust-zone labels).
    ProtectedKey,
    /// The node needed by a pod check could not be looked up.
    NodeLookup,
    /// The AdmissionReview could not be decoded or lacks a required field.
    Malformed,
}

impl DenyReason {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DenyReason::UserNotAllowed => "user_not_allowed",
            DenyReason::ValueCheck => "value_check",
            DenyReason::OtherNode => "other_node",
            DenyReason::AnnotationNotAllowed => "annotation_not_allowed",
            DenyReason::NotOnlyAnnotations => "not_only_annotations",
            DenyReason::ProtectedKey => "protected_key",
            DenyReason::NodeLookup => "node_lookup",
            DenyReason::Malformed => "malformed",
        }
    }
}

/// The outcome of a check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Denied { reason: DenyReason, message: String },
}

impl Verdict {
    pub(crate) fn deny(reason: DenyReason, message: impl Into<String>) -> Self {
        Verdict::Denied {
            reason,
            message: message.into(),
        }
    }

    /// True when allowed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allowed)
    }

    /// The deny message, if denied.
    pub fn message(&self) -> Option<&str> {
        match self {
            Verdict::Allowed => None,
            Verdict::Denied { message, .. } => Some(message),
        }
    }
}

/// How an annotation (or label) changed between the old and the new object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change<'a> {
    /// Not in the old object; carries the new value.
    Added(&'a str),
    /// In both, with a different value; carries the new value.
    Changed(&'a str),
    /// Only in the old object; carries the old value.
    Removed(&'a str),
}

/// Diffs two string maps (`None` = absent map). Keys come out sorted.
pub fn map_diff<'a>(
    old: Option<&'a serde_json::Map<String, serde_json::Value>>,
    new: Option<&'a serde_json::Map<String, serde_json::Value>>,
) -> Vec<(&'a str, Change<'a>)> {
    let mut out: Vec<(&str, Change)> = Vec::new();
    let as_str = |v: &'a serde_json::Value| v.as_str().unwrap_or_default();
    if let Some(new) = new {
        for (k, v) in new {
            match old.and_then(|o| o.get(k)) {
                None => out.push((k, Change::Added(as_str(v)))),
                Some(ov) if ov != v => out.push((k, Change::Changed(as_str(v)))),
                Some(_) => {}
            }
        }
    }
    if let Some(old) = old {
        for (k, v) in old {
            if new.is_none_or(|n| !n.contains_key(k)) {
                out.push((k, Change::Removed(as_str(v))));
            }
        }
    }
    out.sort_by(|a, b| a.0.cmp(b.0));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_added_changed_removed() {
        let old = json!({"a": "1", "b": "2", "c": "3"});
        let new = json!({"a": "1", "b": "20", "d": "4"});
        let d = map_diff(old.as_object(), new.as_object());
        assert_eq!(
            d,
            vec![
                ("b", Change::Changed("20")),
                ("c", Change::Removed("3")),
                ("d", Change::Added("4")),
            ]
        );
        assert!(map_diff(None, None).is_empty());
        assert_eq!(map_diff(None, new.as_object()).len(), 3);
    }
}
