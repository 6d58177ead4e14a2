//! The pure core of the TrustZone status controller: from one zone's membership, its selector
//! and the members' TunnelReports, the `status` the cluster manager publishes on the TrustZone.
//! No I/O; the shell in [`crate::zone_controller`] feeds it and writes the result.
//!
//! - `status.members` / `memberCount`: the member Nodes, from either carrier (the TrustZone's
//!   selector or the `k8s.ovn.org/transport-zones` annotation naming the zone).
//! - `Ready`: every member's TunnelReport lists every other member. A member without a report
//!   observes nothing. Reasons: [`REASON_ALL_TUNNELS`], [`REASON_TUNNELS_MISSING`],
//!   [`REASON_NO_MEMBERS`], [`REASON_INVALID_SELECTOR`].
//! - `SelectorProtected`: whether a node could add itself to the zone by setting a selected label
//!   on its own Node with its kubelet credentials (NodeRestriction's rules).
//!
//! A condition keeps its `lastTransitionTime` while its status does not change.

use std::collections::{BTreeSet, HashMap, HashSet};

use k8s_api::trust_zone::{
    CONDITION_READY, CONDITION_SELECTOR_PROTECTED, REASON_ALL_TUNNELS, TrustZoneStatus,
    kubelet_may_set_label, selector_keys,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};

/// `Ready=False`: some member does not observe a tunnel to some other member.
pub const REASON_TUNNELS_MISSING: &str = "TunnelsMissing";
/// `Ready=False`: no Node is in the zone.
pub const REASON_NO_MEMBERS: &str = "NoMembers";
/// `Ready=False`: `spec.nodeSelector` cannot be evaluated (it then selects no Node).
pub const REASON_INVALID_SELECTOR: &str = "InvalidSelector";
/// `SelectorProtected=True`: the identity webhook protects every key the selector reads.
pub const REASON_PROTECTED_BY_WEBHOOK: &str = "ProtectedByWebhook";
/// `SelectorProtected=True`: no key the selector reads is settable by a kubelet.
pub const REASON_NO_KUBELET_SETTABLE_KEYS: &str = "NoKubeletSettableKeys";
/// `SelectorProtected=False`: a node can add itself to the zone by labelling its own Node.
pub const REASON_KUBELET_SETTABLE_KEYS: &str = "KubeletSettableKeys";

/// How many items (missing tunnels, silent members, keys) a message names before summarising.
pub const MAX_LISTED: usize = 10;

/// The peers each node reports (TunnelReport `spec.peers`), by node name.
pub type Reports = HashMap<String, BTreeSet<String>>;

/// What the status of one zone is computed from.
#[derive(Clone, Copy, Debug)]
pub struct ZoneSnapshot<'a> {
    /// The TrustZone's `metadata.generation` (copied to each condition's `observedGeneration`).
    pub generation: Option<i64>,
    /// The member Nodes from either carrier, sorted and unique.
    pub members: &'a [String],
    /// `spec.nodeSelector`.
    pub selector: &'a LabelSelector,
    /// Why the selector cannot be evaluated, if it cannot.
    pub selector_error: Option<&'a str>,
}

/// Settings of the status computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusOptions {
    /// ovnk's identity webhook protects every label key a TrustZone selector reads
    /// (`--zone-labels-protected-by-webhook`).
    pub labels_protected_by_webhook: bool,
}

impl Default for StatusOptions {
    fn default() -> Self {
        Self {
            labels_protected_by_webhook: true,
        }
    }
}

/// A condition before its transition time is known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `True` or `False`.
    pub status: bool,
    /// CamelCase reason.
    pub reason: &'static str,
    /// Human-readable detail.
    pub message: String,
}

/// The status of one zone. `previous` is the status currently published (its transition times
/// are kept for conditions whose status did not change); `now` stamps the others.
pub fn zone_status(
    zone: &ZoneSnapshot<'_>,
    reports: &Reports,
    opts: &StatusOptions,
    previous: Option<&TrustZoneStatus>,
    now: &Time,
) -> TrustZoneStatus {
    let conditions = [
        (CONDITION_READY, ready(zone, reports)),
        (
            CONDITION_SELECTOR_PROTECTED,
            selector_protected(zone.selector, opts),
        ),
    ]
    .into_iter()
    .map(|(type_, v)| condition(type_, v, zone.generation, previous, now))
    .collect();
    TrustZoneStatus {
        members: zone.members.to_vec(),
        member_count: i64::try_from(zone.members.len()).unwrap_or(i64::MAX),
        conditions,
    }
}

fn condition(
    type_: &str,
    v: Verdict,
    generation: Option<i64>,
    previous: Option<&TrustZoneStatus>,
    now: &Time,
) -> Condition {
    let status = if v.status { "True" } else { "False" };
    let last_transition_time = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: v.reason.to_owned(),
        message: v.message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// The `Ready` condition: every member observes a tunnel to every other member.
///
/// Cost: O(Σ over members of |report|) hash lookups, plus O(|members|) per listed pair; it
/// never enumerates all |members|² pairs.
pub fn ready(zone: &ZoneSnapshot<'_>, reports: &Reports) -> Verdict {
    let members = zone.members;
    let n = members.len();
    if let Some(err) = zone.selector_error {
        let from_annotation = if n == 0 {
            String::new()
        } else {
            format!(
                "; {n} member{} from the k8s.ovn.org/transport-zones annotation",
                plural(n)
            )
        };
        return Verdict {
            status: false,
            reason: REASON_INVALID_SELECTOR,
            message: format!("spec.nodeSelector selects no Node: {err}{from_annotation}"),
        };
    }
    match n {
        0 => {
            return Verdict {
                status: false,
                reason: REASON_NO_MEMBERS,
                message: "no Node is a member: the selector matches no Node and no Node names \
                          this zone in its k8s.ovn.org/transport-zones annotation"
                    .into(),
            };
        }
        1 => {
            return Verdict {
                status: true,
                reason: REASON_ALL_TUNNELS,
                message: "1 member: no tunnel to establish".into(),
            };
        }
        _ => {}
    }
    let set: HashSet<&str> = members.iter().map(String::as_str).collect();
    let empty = BTreeSet::new();
    let mut missing_total: u64 = 0;
    let mut listed: Vec<String> = Vec::new();
    let mut silent: Vec<&str> = Vec::new();
    for a in members {
        let report = reports.get(a);
        if report.is_none() {
            silent.push(a);
        }
        let seen = report.unwrap_or(&empty);
        let present = seen
            .iter()
            .filter(|b| *b != a && set.contains(b.as_str()))
            .count();
        let missing = (n - 1).saturating_sub(present);
        missing_total += missing as u64;
        if missing > 0 && listed.len() < MAX_LISTED {
            listed.extend(
                members
                    .iter()
                    .filter(|b| *b != a && !seen.contains(*b))
                    .take(MAX_LISTED - listed.len())
                    .map(|b| format!("{a}→{b}")),
            );
        }
    }
    let total = (n as u64) * (n as u64 - 1);
    if missing_total == 0 {
        return Verdict {
            status: true,
            reason: REASON_ALL_TUNNELS,
            message: format!("all {total} tunnels between {n} members established"),
        };
    }
    let mut message = format!(
        "{missing_total} of {total} tunnels missing: {}",
        list(&listed, missing_total)
    );
    if !silent.is_empty() {
        message.push_str(&format!(
            "; no TunnelReport from {}",
            list(&silent, silent.len() as u64)
        ));
    }
    Verdict {
        status: false,
        reason: REASON_TUNNELS_MISSING,
        message,
    }
}

/// The `SelectorProtected` condition.
pub fn selector_protected(selector: &LabelSelector, opts: &StatusOptions) -> Verdict {
    let keys = selector_keys(selector);
    let settable: Vec<&String> = keys.iter().filter(|k| kubelet_may_set_label(k)).collect();
    if settable.is_empty() {
        let message = if keys.is_empty() {
            "spec.nodeSelector reads no label (it selects every Node)".to_owned()
        } else {
            format!(
                "no label key of spec.nodeSelector can be set by a kubelet on its own Node: {}",
                list(&keys, keys.len() as u64)
            )
        };
        return Verdict {
            status: true,
            reason: REASON_NO_KUBELET_SETTABLE_KEYS,
            message,
        };
    }
    let names = list(&settable, settable.len() as u64);
    if opts.labels_protected_by_webhook {
        Verdict {
            status: true,
            reason: REASON_PROTECTED_BY_WEBHOOK,
            message: format!(
                "a kubelet could set {names} on its own Node; the ovnk identity webhook denies \
                 node identities changing {}",
                if settable.len() == 1 { "it" } else { "them" }
            ),
        }
    } else {
        Verdict {
            status: false,
            reason: REASON_KUBELET_SETTABLE_KEYS,
            message: format!(
                "a node can add itself to this zone: its kubelet may set {names} on its own Node \
                 and no webhook protects {}. Select on labels NodeRestriction protects \
                 (e.g. node-restriction.kubernetes.io/...) or run the ovnk identity webhook",
                if settable.len() == 1 { "it" } else { "them" }
            ),
        }
    }
}

/// `a, b, c` — at most [`MAX_LISTED`] items, then `… (N more)` where `total` is the full count.
fn list<S: AsRef<str>>(items: &[S], total: u64) -> String {
    let shown: Vec<&str> = items.iter().take(MAX_LISTED).map(AsRef::as_ref).collect();
    let mut s = shown.join(", ");
    let more = total.saturating_sub(shown.len() as u64);
    if more > 0 {
        s.push_str(&format!(", … ({more} more)"));
    }
    s
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// How two statuses differ, ignoring transition times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Equal but for transition times: nothing to write.
    None,
    /// Only condition messages differ (e.g. the count of missing tunnels while still missing):
    /// the shell may delay such a write to bound status churn.
    MessageOnly,
    /// Members, a condition's type, status, reason or observedGeneration differ.
    Significant,
}

/// Compares a computed status with the published one (None: nothing published yet).
pub fn change(published: Option<&TrustZoneStatus>, computed: &TrustZoneStatus) -> Change {
    let Some(p) = published else {
        return Change::Significant;
    };
    if p.members != computed.members
        || p.member_count != computed.member_count
        || p.conditions.len() != computed.conditions.len()
    {
        return Change::Significant;
    }
    let mut message_differs = false;
    for (a, b) in p.conditions.iter().zip(&computed.conditions) {
        if (&a.type_, &a.status, &a.reason, a.observed_generation)
            != (&b.type_, &b.status, &b.reason, b.observed_generation)
        {
            return Change::Significant;
        }
        message_differs |= a.message != b.message;
    }
    if message_differs {
        Change::MessageOnly
    } else {
        Change::None
    }
}

/// The JSON merge patch that replaces the whole status with `s` (an empty member list is
/// written as `null`, so the merge removes a previous list).
pub fn status_patch(s: &TrustZoneStatus) -> serde_json::Value {
    let members = if s.members.is_empty() {
        serde_json::Value::Null
    } else {
        serde_json::json!(s.members)
    };
    serde_json::json!({
        "status": {
            "members": members,
            "memberCount": s.member_count,
            "conditions": s.conditions,
        }
    })
}

/// `now`, truncated to whole seconds (the precision a `Time` is serialised with), so a status
/// read back from the API server compares equal to the one written.
pub fn now_seconds() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

#[cfg(test)]
#[path = "zone_status_tests.rs"]
mod tests;
