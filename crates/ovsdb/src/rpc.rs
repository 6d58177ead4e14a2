//! JSON-RPC 1.0 messages as OVSDB uses them (no `"jsonrpc"` member; notifications have
//! `"id": null`).

use serde_json::{Value, json};

use crate::datum::short;

#[derive(Debug, Clone, PartialEq)]
pub enum Incoming {
    /// A reply to one of our requests (our ids are integers).
    Response {
        id: u64,
        result: Value,
        error: Value,
    },
    /// A reply whose id we never issued.
    StrayResponse { id: Value },
    /// A request from the server (`echo`).
    Request {
        id: Value,
        method: String,
        params: Value,
    },
    /// A notification (`update`, `update2`, `update3`, `locked`, …).
    Notification { method: String, params: Value },
}

impl Incoming {
    pub fn parse(mut v: Value) -> Result<Incoming, String> {
        let Some(o) = v.as_object_mut() else {
            return Err(format!("message is not an object: {}", short(&v)));
        };
        let id = o.remove("id").unwrap_or(Value::Null);
        if let Some(m) = o.remove("method") {
            let method = m
                .as_str()
                .ok_or_else(|| format!("method is not a string: {}", short(&m)))?
                .to_owned();
            let params = o.remove("params").unwrap_or(Value::Null);
            return Ok(if id.is_null() {
                Incoming::Notification { method, params }
            } else {
                Incoming::Request { id, method, params }
            });
        }
        if !o.contains_key("result") && !o.contains_key("error") {
            return Err(format!(
                "message is neither a request nor a reply: {}",
                short(&v)
            ));
        }
        let result = o.remove("result").unwrap_or(Value::Null);
        let error = o.remove("error").unwrap_or(Value::Null);
        Ok(match id.as_u64() {
            Some(id) => Incoming::Response { id, result, error },
            None => Incoming::StrayResponse { id },
        })
    }
}

pub fn request(id: u64, method: &str, params: Value) -> Value {
    json!({"id": id, "method": method, "params": params})
}

pub fn response(id: Value, result: Value) -> Value {
    json!({"id": id, "result": result, "error": null})
}
