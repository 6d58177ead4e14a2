//! API errors rendered as Kubernetes `Status` objects.

use http::StatusCode;
use serde_json::{Value, json};

/// An error answered to a client as a `meta/v1 Status`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// Machine-readable reason (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Optional `details` member.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }
    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }
    /// 404 NotFound for a named object.
    pub fn not_found(resource: &str, group: &str, name: &str) -> Self {
        let qualified = qualified(resource, group);
        let mut e = Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"));
        e.details = Some(json!({"name": name, "group": group, "kind": resource}));
        e
    }
    /// 404 for a path that serves nothing.
    pub fn no_route(path: &str) -> Self {
        let mut e = Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        );
        e.details = Some(
            json!({"causes": [{"reason": "UnexpectedServerResponse", "message": format!("404 page not found: {path}")}]}),
        );
        e
    }
    /// 409 AlreadyExists.
    pub fn already_exists(resource: &str, group: &str, name: &str) -> Self {
        let qualified = qualified(resource, group);
        let mut e = Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        );
        e.details = Some(json!({"name": name, "group": group, "kind": resource}));
        e
    }
    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(resource: &str, group: &str, name: &str) -> Self {
        let qualified = qualified(resource, group);
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        );
        e.details = Some(json!({"name": name, "group": group, "kind": resource}));
        e
    }
    /// 422 Invalid with field causes.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let msgs: Vec<String> = causes
            .iter()
            .map(|(f, m)| {
                if f.is_empty() {
                    m.clone()
                } else {
                    format!("{f}: {m}")
                }
            })
            .collect();
        let message = if msgs.len() == 1 {
            format!("{qualified} \"{name}\" is invalid: {}", msgs[0])
        } else {
            format!("{qualified} \"{name}\" is invalid: [{}]", msgs.join(", "))
        };
        let mut e = Self::new(422, "Invalid", message);
        e.details = Some(json!({
            "name": name, "group": group, "kind": kind,
            "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>()
        }));
        e
    }
    /// 403 Forbidden.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }
    /// 401 Unauthorized.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }
    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }
    /// 410 Expired (too-old resourceVersion or continue token).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }
    /// 413 RequestEntityTooLarge.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, "RequestEntityTooLarge", message)
    }
    /// 415 UnsupportedMediaType.
    pub fn unsupported_media(message: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", message)
    }
    /// 406 NotAcceptable.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }
    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }
    /// 504 Timeout.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }
    /// Use a custom code/reason (webhook denials).
    pub fn custom(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self::new(code, reason, message)
    }

    /// HTTP status for this error.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// The `Status` object.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }
}

fn qualified(resource: &str, group: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// Result alias for request handling.
pub type ApiResult<T> = Result<T, ApiError>;
