//! AdmissionReview v1 decoding and response encoding.
//!
//! Our own serde types (rather than `kube::core::admission`) keep the objects as raw JSON, which
//! the checks compare semantically, and make every missing field a typed [`ReviewError`] instead
//! of a panic. Responses follow controller-runtime: allowed → `status.code=200`; denied →
//! `allowed=false, status.code=403, status.reason="Forbidden"`; a request that cannot be decoded
//! → `allowed=false, status.code=400`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{DenyReason, Verdict};

/// Errors decoding an AdmissionReview; each becomes a 400 rejection.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReviewError {
    #[error("could not decode AdmissionReview: {0}")]
    Json(String),
    #[error("unsupported AdmissionReview apiVersion {0:?}, expected admission.k8s.io/v1")]
    ApiVersion(String),
    #[error("AdmissionReview has no request")]
    NoRequest,
    #[error("AdmissionReview request has no uid")]
    NoUid,
    #[error("unsupported operation {0:?}")]
    Operation(String),
    #[error("{0} request has no object")]
    NoObject(&'static str),
    #[error("{0} request has no oldObject")]
    NoOldObject(&'static str),
    #[error("expected an object of kind {expected}, got {got:?}")]
    WrongKind { expected: &'static str, got: String },
    #[error("object is not a JSON object")]
    NotAnObject,
}

/// Admission operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Operation {
    Create,
    Update,
    Delete,
    Connect,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
            Operation::Delete => "DELETE",
            Operation::Connect => "CONNECT",
        }
    }
}

/// `request.userInfo`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawReview {
    api_version: Option<String>,
    request: Option<RawRequest>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequest {
    uid: Option<String>,
    #[serde(default)]
    kind: GroupVersionKind,
    #[serde(default)]
    resource: GroupVersionResource,
    #[serde(default)]
    sub_resource: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    operation: String,
    #[serde(default)]
    user_info: UserInfo,
    #[serde(default)]
    object: Option<Value>,
    #[serde(default)]
    old_object: Option<Value>,
}

/// A decoded `request` of an AdmissionReview v1.
#[derive(Debug, Clone, PartialEq)]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    pub sub_resource: String,
    pub name: String,
    pub namespace: String,
    pub operation: Operation,
    pub user_info: UserInfo,
    /// `request.object` (`None` or `null` for DELETE).
    pub object: Option<Value>,
    /// `request.oldObject` (set for UPDATE and DELETE).
    pub old_object: Option<Value>,
}

/// Decodes the body of an AdmissionReview v1 request. Never panics.
///
/// On failure also returns the request uid when it could be read, so the 400 answer can carry it.
pub fn decode(body: &[u8]) -> Result<AdmissionRequest, (String, ReviewError)> {
    let raw: RawReview = serde_json::from_slice(body)
        .map_err(|e| (uid_of(body), ReviewError::Json(e.to_string())))?;
    if let Some(v) = raw.api_version.as_deref()
        && v != "admission.k8s.io/v1"
    {
        return Err((String::new(), ReviewError::ApiVersion(v.to_string())));
    }
    let req = raw.request.ok_or((String::new(), ReviewError::NoRequest))?;
    let uid = match req.uid {
        Some(u) if !u.is_empty() => u,
        _ => return Err((String::new(), ReviewError::NoUid)),
    };
    let operation = match req.operation.as_str() {
        "CREATE" => Operation::Create,
        "UPDATE" => Operation::Update,
        "DELETE" => Operation::Delete,
        "CONNECT" => Operation::Connect,
        other => return Err((uid, ReviewError::Operation(other.to_string()))),
    };
    let non_null = |v: Option<Value>| v.filter(|v| !v.is_null());
    Ok(AdmissionRequest {
        uid,
        kind: req.kind,
        resource: req.resource,
        sub_resource: req.sub_resource.unwrap_or_default(),
        name: req.name.unwrap_or_default(),
        namespace: req.namespace.unwrap_or_default(),
        operation,
        user_info: req.user_info,
        object: non_null(req.object),
        old_object: non_null(req.old_object),
    })
}

/// Best effort: the uid of a review whose full decoding failed.
fn uid_of(body: &[u8]) -> String {
    #[derive(Deserialize)]
    struct R {
        request: Option<U>,
    }
    #[derive(Deserialize)]
    struct U {
        uid: Option<String>,
    }
    serde_json::from_slice::<R>(body)
        .ok()
        .and_then(|r| r.request)
        .and_then(|u| u.uid)
        .unwrap_or_default()
}

impl AdmissionRequest {
    /// The new object as a JSON map, checked to be of `kind`.
    pub fn object_of_kind(
        &self,
        kind: &'static str,
    ) -> Result<&serde_json::Map<String, Value>, ReviewError> {
        let obj = self
            .object
            .as_ref()
            .ok_or(ReviewError::NoObject(self.operation.as_str()))?;
        as_kind(obj, kind)
    }

    /// The old object as a JSON map, checked to be of `kind`.
    pub fn old_object_of_kind(
        &self,
        kind: &'static str,
    ) -> Result<&serde_json::Map<String, Value>, ReviewError> {
        let obj = self
            .old_object
            .as_ref()
            .ok_or(ReviewError::NoOldObject(self.operation.as_str()))?;
        as_kind(obj, kind)
    }
}

fn as_kind<'a>(
    obj: &'a Value,
    kind: &'static str,
) -> Result<&'a serde_json::Map<String, Value>, ReviewError> {
    let map = obj.as_object().ok_or(ReviewError::NotAnObject)?;
    match map.get("kind").and_then(Value::as_str) {
        // The API server always sends kind; accept its absence in hand-written reviews.
        None => Ok(map),
        Some(k) if k == kind => Ok(map),
        Some(k) => Err(ReviewError::WrongKind {
            expected: kind,
            got: k.to_string(),
        }),
    }
}

/// Result of a full review, ready to encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Allowed,
    /// 403 Forbidden.
    Denied {
        reason: DenyReason,
        message: String,
    },
    /// 400: the review could not be decoded.
    Invalid {
        message: String,
    },
}

impl From<Verdict> for Outcome {
    fn from(v: Verdict) -> Self {
        match v {
            Verdict::Allowed => Outcome::Allowed,
            Verdict::Denied { reason, message } => Outcome::Denied { reason, message },
        }
    }
}

impl From<ReviewError> for Outcome {
    fn from(e: ReviewError) -> Self {
        Outcome::Invalid {
            message: e.to_string(),
        }
    }
}

impl Outcome {
    /// The deny reason label (`malformed` for invalid reviews).
    pub fn deny_reason(&self) -> Option<DenyReason> {
        match self {
            Outcome::Allowed => None,
            Outcome::Denied { reason, .. } => Some(*reason),
            Outcome::Invalid { .. } => Some(DenyReason::Malformed),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReviewOut<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: ResponseOut<'a>,
}

#[derive(Serialize)]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    status: StatusOut<'a>,
}

#[derive(Serialize)]
struct StatusOut<'a> {
    code: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
}

/// Encodes the AdmissionReview v1 response for `uid`.
pub fn encode(uid: &str, outcome: &Outcome) -> Vec<u8> {
    let (allowed, status) = match outcome {
        Outcome::Allowed => (
            true,
            StatusOut {
                code: 200,
                reason: None,
                message: None,
            },
        ),
        Outcome::Denied { message, .. } => (
            false,
            StatusOut {
                code: 403,
                reason: Some("Forbidden"),
                message: Some(message),
            },
        ),
        Outcome::Invalid { message } => (
            false,
            StatusOut {
                code: 400,
                reason: Some("BadRequest"),
                message: Some(message),
            },
        ),
    };
    let review = ReviewOut {
        api_version: "admission.k8s.io/v1",
        kind: "AdmissionReview",
        response: ResponseOut {
            uid,
            allowed,
            status,
        },
    };
    // Serialising these plain structs cannot fail; fall back to a fixed body just in case.
    serde_json::to_vec(&review).unwrap_or_else(|_| {
        br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"","allowed":false}}"#.to_vec()
    })
}

/// Helpers shared by the checks.
pub(crate) fn meta(
    obj: &serde_json::Map<String, Value>,
) -> Option<&serde_json::Map<String, Value>> {
    obj.get("metadata").and_then(Value::as_object)
}

pub(crate) fn meta_map<'a>(
    obj: &'a serde_json::Map<String, Value>,
    field: &str,
) -> Option<&'a serde_json::Map<String, Value>> {
    meta(obj)
        .and_then(|m| m.get(field))
        .and_then(Value::as_object)
}

pub(crate) fn name_of(obj: &serde_json::Map<String, Value>) -> &str {
    meta(obj)
        .and_then(|m| m.get("name"))
        .and_then(Value::as_str)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case(b"".as_slice())]
    #[case(b"garbage".as_slice())]
    #[case(b"[]".as_slice())]
    #[case(br#"{"request": 5}"#.as_slice())]
    #[case(br#"{"request": {"uid": "u"}}"#.as_slice())]
    fn garbage_is_json_error(#[case] body: &[u8]) {
        assert!(matches!(decode(body), Err((_, ReviewError::Json(_)))));
    }

    #[rstest]
    #[case(br#"{"apiVersion":"admission.k8s.io/v1"}"#.as_slice(), ReviewError::NoRequest)]
    #[case(br#"{"apiVersion":"admission.k8s.io/v1beta1","request":{"uid":"u","operation":"UPDATE"}}"#.as_slice(),
        ReviewError::ApiVersion("admission.k8s.io/v1beta1".into()))]
    #[case(br#"{"request":{"operation":"UPDATE"}}"#.as_slice(), ReviewError::NoUid)]
    #[case(br#"{"request":{"uid":"u","operation":"PATCH"}}"#.as_slice(), ReviewError::Operation("PATCH".into()))]
    fn structural_errors(#[case] body: &[u8], #[case] want: ReviewError) {
        match decode(body) {
            Err((_, e)) => assert_eq!(e, want),
            Ok(r) => panic!("decoded {r:?}"),
        }
    }

    #[test]
    fn uid_survives_json_error() {
        let body = br#"{"request":{"uid":"abc","operation":7}}"#;
        let (uid, _) = decode(body).expect_err("must fail");
        assert_eq!(uid, "abc");
    }

    #[test]
    fn encode_shapes() {
        let v: Value = serde_json::from_slice(&encode("u1", &Outcome::Allowed)).expect("json");
        assert_eq!(v["response"]["uid"], "u1");
        assert_eq!(v["response"]["allowed"], true);
        assert_eq!(v["response"]["status"]["code"], 200);
        let d = Outcome::Denied {
            reason: DenyReason::OtherNode,
            message: "no".into(),
        };
        let v: Value = serde_json::from_slice(&encode("u2", &d)).expect("json");
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["response"]["allowed"], false);
        assert_eq!(v["response"]["status"]["code"], 403);
        assert_eq!(v["response"]["status"]["reason"], "Forbidden");
        assert_eq!(v["response"]["status"]["message"], "no");
        let i = Outcome::Invalid {
            message: "bad".into(),
        };
        let v: Value = serde_json::from_slice(&encode("", &i)).expect("json");
        assert_eq!(v["response"]["status"]["code"], 400);
        assert_eq!(v["response"]["allowed"], false);
    }
}
