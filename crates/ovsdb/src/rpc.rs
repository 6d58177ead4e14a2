//! JSON-RPC 1.0 messages as OVSDB uses them (no `"jsonrpc"` member; notifications have
//! `"id": null`). Incoming messages are parsed into borrowed raw parts: a large `result` or
//! `params` is decoded once, by whoever consumes it, straight from the received bytes.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    id: Option<Value>,
    #[serde(default, borrow)]
    method: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    params: Option<&'a RawValue>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
}

#[derive(Debug)]
pub enum Incoming<'a> {
    /// A reply to one of our requests (our ids are integers).
    Response {
        id: u64,
        result: Option<&'a RawValue>,
        error: Option<&'a RawValue>,
    },
    /// A reply whose id we never issued.
    StrayResponse { id: Value },
    /// A request from the server (`echo`).
    Request {
        id: Value,
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
    /// A notification (`update2`, `update3`, `locked`, …).
    Notification {
        method: Cow<'a, str>,
        params: Option<&'a RawValue>,
    },
}

/// Why a message could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// Not JSON at all: the stream cannot be trusted any more.
    #[error("invalid JSON in message of {len} bytes: {source}")]
    InvalidJson {
        len: usize,
        source: serde_json::Error,
    },
    /// JSON, but not a JSON-RPC message: ignored.
    #[error("not a JSON-RPC message: {0}")]
    NotRpc(String),
}

impl<'a> Incoming<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Incoming<'a>, ParseError> {
        let w: Wire<'a> = serde_json::from_slice(bytes).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => ParseError::NotRpc(e.to_string()),
            _ => ParseError::InvalidJson {
                len: bytes.len(),
                source: e,
            },
        })?;
        if let Some(method) = w.method {
            return Ok(match w.id {
                None => Incoming::Notification {
                    method,
                    params: w.params,
                },
                Some(id) => Incoming::Request {
                    id,
                    method,
                    params: w.params,
                },
            });
        }
        match w.id {
            Some(Value::Number(n)) if n.as_u64().is_some() => Ok(Incoming::Response {
                id: n.as_u64().unwrap_or_default(),
                result: w.result,
                error: w.error,
            }),
            Some(id) => Ok(Incoming::StrayResponse { id }),
            None => Err(ParseError::NotRpc(
                "message has neither a method nor an id".into(),
            )),
        }
    }
}

pub fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"id": id, "method": method, "params": params})
}
