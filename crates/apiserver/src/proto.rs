//! Decoding of the Kubernetes protobuf envelope for the few request bodies kubectl sends as
//! protobuf (its typed clients: `create namespace|configmap|secret|serviceaccount|service|role|
//! clusterrole|rolebinding|clusterrolebinding`, `certificate approve|deny`). Responses are always JSON. Unknown fields are skipped.

use base64::Engine;
use serde_json::{Map, Value, json};

/// The 4-byte magic prefix of protobuf-encoded Kubernetes objects.
pub const MAGIC: &[u8] = b"k8s\x00";

#[derive(Clone, Copy)]
enum Kind {
    Str,
    Bytes,
    Int,
    Bool,
    Time,
    Msg(&'static [Field]),
    StrMap,
    BytesMap,
    IntOrString,
}

struct Field {
    tag: u64,
    name: &'static str,
    kind: Kind,
    repeated: bool,
}

const fn f(tag: u64, name: &'static str, kind: Kind) -> Field {
    Field {
        tag,
        name,
        kind,
        repeated: false,
    }
}

const fn r(tag: u64, name: &'static str, kind: Kind) -> Field {
    Field {
        tag,
        name,
        kind,
        repeated: true,
    }
}

const OWNER_REF: &[Field] = &[
    f(1, "kind", Kind::Str),
    f(3, "name", Kind::Str),
    f(4, "uid", Kind::Str),
    f(5, "apiVersion", Kind::Str),
    f(6, "controller", Kind::Bool),
    f(7, "blockOwnerDeletion", Kind::Bool),
];

const OBJECT_META: &[Field] = &[
    f(1, "name", Kind::Str),
    f(2, "generateName", Kind::Str),
    f(3, "namespace", Kind::Str),
    f(5, "uid", Kind::Str),
    f(6, "resourceVersion", Kind::Str),
    f(7, "generation", Kind::Int),
    f(8, "creationTimestamp", Kind::Time),
    f(11, "labels", Kind::StrMap),
    f(12, "annotations", Kind::StrMap),
    r(13, "ownerReferences", Kind::Msg(OWNER_REF)),
    r(14, "finalizers", Kind::Str),
];

const NAMESPACE: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(2, "spec", Kind::Msg(&[r(1, "finalizers", Kind::Str)])),
    f(3, "status", Kind::Msg(&[f(1, "phase", Kind::Str)])),
];

const CONFIGMAP: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(2, "data", Kind::StrMap),
    f(3, "binaryData", Kind::BytesMap),
    f(4, "immutable", Kind::Bool),
];

const SECRET: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(2, "data", Kind::BytesMap),
    f(3, "type", Kind::Str),
    f(4, "stringData", Kind::StrMap),
    f(5, "immutable", Kind::Bool),
];

const SERVICE_ACCOUNT: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(4, "automountServiceAccountToken", Kind::Bool),
];

const POLICY_RULE: &[Field] = &[
    r(1, "verbs", Kind::Str),
    r(2, "apiGroups", Kind::Str),
    r(3, "resources", Kind::Str),
    r(4, "resourceNames", Kind::Str),
    r(5, "nonResourceURLs", Kind::Str),
];

const ROLE: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    r(2, "rules", Kind::Msg(POLICY_RULE)),
];

const BINDING: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    r(
        2,
        "subjects",
        Kind::Msg(&[
            f(1, "kind", Kind::Str),
            f(2, "apiGroup", Kind::Str),
            f(3, "name", Kind::Str),
            f(4, "namespace", Kind::Str),
        ]),
    ),
    f(
        3,
        "roleRef",
        Kind::Msg(&[
            f(1, "apiGroup", Kind::Str),
            f(2, "kind", Kind::Str),
            f(3, "name", Kind::Str),
        ]),
    ),
];

const SERVICE_PORT: &[Field] = &[
    f(1, "name", Kind::Str),
    f(2, "protocol", Kind::Str),
    f(3, "port", Kind::Int),
    f(4, "targetPort", Kind::IntOrString),
    f(5, "nodePort", Kind::Int),
    f(6, "appProtocol", Kind::Str),
];

const SERVICE: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Kind::Msg(&[
            r(1, "ports", Kind::Msg(SERVICE_PORT)),
            f(2, "selector", Kind::StrMap),
            f(3, "clusterIP", Kind::Str),
            f(4, "type", Kind::Str),
            r(5, "externalIPs", Kind::Str),
            f(7, "sessionAffinity", Kind::Str),
            f(10, "externalName", Kind::Str),
            f(11, "externalTrafficPolicy", Kind::Str),
            f(13, "publishNotReadyAddresses", Kind::Bool),
        ]),
    ),
];

const RESOURCE_ATTRIBUTES: &[Field] = &[
    f(1, "namespace", Kind::Str),
    f(2, "verb", Kind::Str),
    f(3, "group", Kind::Str),
    f(4, "version", Kind::Str),
    f(5, "resource", Kind::Str),
    f(6, "subresource", Kind::Str),
    f(7, "name", Kind::Str),
];

const NON_RESOURCE_ATTRIBUTES: &[Field] = &[f(1, "path", Kind::Str), f(2, "verb", Kind::Str)];

const ACCESS_REVIEW: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Kind::Msg(&[
            f(1, "resourceAttributes", Kind::Msg(RESOURCE_ATTRIBUTES)),
            f(
                2,
                "nonResourceAttributes",
                Kind::Msg(NON_RESOURCE_ATTRIBUTES),
            ),
            f(3, "user", Kind::Str),
            r(4, "groups", Kind::Str),
            f(6, "uid", Kind::Str),
        ]),
    ),
];

const CSR_CONDITION: &[Field] = &[
    f(1, "type", Kind::Str),
    f(2, "reason", Kind::Str),
    f(3, "message", Kind::Str),
    f(4, "lastUpdateTime", Kind::Time),
    f(5, "lastTransitionTime", Kind::Time),
    f(6, "status", Kind::Str),
];

const CSR: &[Field] = &[
    f(1, "metadata", Kind::Msg(OBJECT_META)),
    f(
        2,
        "spec",
        Kind::Msg(&[
            f(1, "request", Kind::Bytes),
            f(2, "username", Kind::Str),
            f(3, "uid", Kind::Str),
            r(4, "groups", Kind::Str),
            r(5, "usages", Kind::Str),
            f(7, "signerName", Kind::Str),
            f(8, "expirationSeconds", Kind::Int),
        ]),
    ),
    f(
        3,
        "status",
        Kind::Msg(&[
            r(1, "conditions", Kind::Msg(CSR_CONDITION)),
            f(2, "certificate", Kind::Bytes),
        ]),
    ),
];

/// Decoding failures (answered as 415/400).
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    /// Not a Kubernetes protobuf envelope, or truncated.
    #[error("invalid protobuf body: {0}")]
    Malformed(&'static str),
    /// A kind this server cannot decode from protobuf.
    #[error("protobuf bodies are not supported for {0}; send JSON")]
    Unsupported(String),
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .b
                .get(self.pos)
                .ok_or(ProtoError::Malformed("truncated varint"))?;
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtoError::Malformed("varint too long"))
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or(ProtoError::Malformed("truncated field"))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn done(&self) -> bool {
        self.pos >= self.b.len()
    }
}

enum Raw<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn fields(b: &[u8]) -> Result<Vec<(u64, Raw<'_>)>, ProtoError> {
    let mut rd = Reader { b, pos: 0 };
    let mut out = Vec::new();
    while !rd.done() {
        let key = rd.varint()?;
        let raw = match key & 7 {
            0 => Raw::Varint(rd.varint()?),
            1 => {
                rd.take(8)?;
                Raw::Fixed
            }
            2 => {
                let n =
                    usize::try_from(rd.varint()?).map_err(|_| ProtoError::Malformed("length"))?;
                Raw::Bytes(rd.take(n)?)
            }
            5 => {
                rd.take(4)?;
                Raw::Fixed
            }
            _ => return Err(ProtoError::Malformed("unsupported wire type")),
        };
        out.push((key >> 3, raw));
    }
    Ok(out)
}

fn string(b: &[u8]) -> Result<String, ProtoError> {
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::Malformed("invalid UTF-8"))
}

fn time_of(b: &[u8]) -> Result<Value, ProtoError> {
    if b.is_empty() {
        return Ok(json!(""));
    }
    let mut secs = 0i64;
    for (tag, raw) in fields(b)? {
        if let (1, Raw::Varint(v)) = (tag, raw) {
            secs = v as i64;
        }
    }
    let t = time::OffsetDateTime::from_unix_timestamp(secs)
        .map_err(|_| ProtoError::Malformed("time out of range"))?;
    Ok(json!(crate::timeutil::format_rfc3339(t)))
}

fn int_or_string(b: &[u8]) -> Result<Value, ProtoError> {
    let (mut ty, mut int, mut st) = (0u64, 0i64, String::new());
    for (tag, raw) in fields(b)? {
        match (tag, raw) {
            (1, Raw::Varint(v)) => ty = v,
            (2, Raw::Varint(v)) => int = v as i64,
            (3, Raw::Bytes(x)) => st = string(x)?,
            _ => {}
        }
    }
    Ok(if ty == 1 { json!(st) } else { json!(int) })
}

fn map_entry(b: &[u8], bytes: bool) -> Result<(String, Value), ProtoError> {
    let mut k = String::new();
    let mut v = Value::String(String::new());
    for (tag, raw) in fields(b)? {
        match (tag, raw) {
            (1, Raw::Bytes(x)) => k = string(x)?,
            (2, Raw::Bytes(x)) if bytes => {
                v = json!(base64::engine::general_purpose::STANDARD.encode(x))
            }
            (2, Raw::Bytes(x)) => v = json!(string(x)?),
            _ => {}
        }
    }
    Ok((k, v))
}

fn message(b: &[u8], schema: &[Field], depth: usize) -> Result<Value, ProtoError> {
    if depth > 16 {
        return Err(ProtoError::Malformed("nested too deeply"));
    }
    let mut m = Map::new();
    for (tag, raw) in fields(b)? {
        let Some(fd) = schema.iter().find(|fd| fd.tag == tag) else {
            continue;
        };
        let v = match (fd.kind, raw) {
            (Kind::Str, Raw::Bytes(x)) => json!(string(x)?),
            (Kind::Bytes, Raw::Bytes(x)) => {
                json!(base64::engine::general_purpose::STANDARD.encode(x))
            }
            (Kind::Int, Raw::Varint(x)) => json!(x as i64),
            (Kind::Bool, Raw::Varint(x)) => json!(x != 0),
            (Kind::Time, Raw::Bytes(x)) => time_of(x)?,
            (Kind::IntOrString, Raw::Bytes(x)) => int_or_string(x)?,
            (Kind::Msg(sub), Raw::Bytes(x)) => message(x, sub, depth + 1)?,
            (Kind::StrMap | Kind::BytesMap, Raw::Bytes(x)) => {
                let (k, v) = map_entry(x, matches!(fd.kind, Kind::BytesMap))?;
                let entry = m.entry(fd.name).or_insert_with(|| json!({}));
                if let Some(o) = entry.as_object_mut() {
                    o.insert(k, v);
                }
                continue;
            }
            _ => return Err(ProtoError::Malformed("unexpected wire type")),
        };
        let empty = match &v {
            Value::String(x) => x.is_empty(),
            Value::Number(n) => n.as_i64() == Some(0),
            Value::Bool(b) => !b,
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        if fd.repeated {
            let entry = m.entry(fd.name).or_insert_with(|| json!([]));
            if let Some(a) = entry.as_array_mut() {
                a.push(v);
            }
        } else if !empty {
            // Go's protobuf writes zero values that JSON would omit.
            m.insert(fd.name.to_string(), v);
        }
    }
    Ok(Value::Object(m))
}

/// Decode a protobuf envelope into the JSON form of the object.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body
        .strip_prefix(MAGIC)
        .ok_or(ProtoError::Malformed("missing k8s magic"))?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (tag, r) in fields(rest)? {
        match (tag, r) {
            (1, Raw::Bytes(tm)) => {
                for (t, x) in fields(tm)? {
                    match (t, x) {
                        (1, Raw::Bytes(s)) => api_version = string(s)?,
                        (2, Raw::Bytes(s)) => kind = string(s)?,
                        _ => {}
                    }
                }
            }
            (2, Raw::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    let schema = match (api_version.as_str(), kind.as_str()) {
        ("v1", "Namespace") => NAMESPACE,
        ("v1", "ConfigMap") => CONFIGMAP,
        ("v1", "Secret") => SECRET,
        ("v1", "ServiceAccount") => SERVICE_ACCOUNT,
        ("certificates.k8s.io/v1", "CertificateSigningRequest") => CSR,
        ("v1", "Service") => SERVICE,
        ("authorization.k8s.io/v1", "SelfSubjectAccessReview" | "SubjectAccessReview") => {
            ACCESS_REVIEW
        }
        ("rbac.authorization.k8s.io/v1", "Role" | "ClusterRole") => ROLE,
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => BINDING,
        _ => {
            return Err(ProtoError::Unsupported(format!(
                "{api_version}, Kind={kind}"
            )));
        }
    };
    let mut v = message(raw, schema, 0)?;
    if let Some(m) = v.as_object_mut() {
        m.insert("apiVersion".into(), json!(api_version));
        m.insert("kind".into(), json!(kind));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }

    fn ld(tag: u64, bytes: &[u8], out: &mut Vec<u8>) {
        varint(tag << 3 | 2, out);
        varint(bytes.len() as u64, out);
        out.extend_from_slice(bytes);
    }

    #[test]
    fn decodes_a_namespace() {
        let mut label = Vec::new();
        ld(1, b"team", &mut label);
        ld(2, b"a", &mut label);
        let mut meta = Vec::new();
        ld(1, b"ns1", &mut meta);
        ld(11, &label, &mut meta);
        let mut ns = Vec::new();
        ld(1, &meta, &mut ns);
        let mut tm = Vec::new();
        ld(1, b"v1", &mut tm);
        ld(2, b"Namespace", &mut tm);
        let mut body = MAGIC.to_vec();
        ld(1, &tm, &mut body);
        ld(2, &ns, &mut body);
        let v = decode(&body).expect("decode");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns1", "labels": {"team": "a"}}})
        );
        assert!(decode(&body[..body.len() - 3]).is_err());
        assert!(decode(b"nope").is_err());
    }
}
