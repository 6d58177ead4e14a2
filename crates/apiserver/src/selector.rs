//! Label and field selectors (string forms from query parameters, and `LabelSelector` objects).

use serde_json::Value;
use std::collections::BTreeMap;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
pub enum Req {
    /// `key` (exists).
    Exists(String),
    /// `!key`.
    NotExists(String),
    /// `key in (..)` / `key=v`.
    In(String, Vec<String>),
    /// `key notin (..)` / `key!=v`.
    NotIn(String, Vec<String>),
    /// `key>n`.
    Gt(String, i64),
    /// `key<n`.
    Lt(String, i64),
}

/// A parsed label selector (AND of requirements); empty matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(pub Vec<Req>);

/// Selector parse error (answered as 400 BadRequest).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

fn valid_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && s.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
}

/// Whether `k` is a valid qualified label key.
pub fn valid_label_key(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|p| {
                    !p.is_empty()
                        && p.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !p.starts_with('-')
                        && !p.ends_with('-')
                })
                && valid_name_part(name)
        }
        None => valid_name_part(k),
    }
}

/// Whether `v` is a valid label value (may be empty).
pub fn valid_label_value(v: &str) -> bool {
    v.is_empty() || valid_name_part(v)
}

fn check_key(k: &str) -> Result<String, SelectorError> {
    if valid_label_key(k) {
        Ok(k.to_string())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: invalid label key \"{k}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

fn check_val(v: &str) -> Result<String, SelectorError> {
    if valid_label_value(v) {
        Ok(v.to_string())
    } else {
        Err(SelectorError(format!(
            "unable to parse requirement: values[0]: Invalid value: \"{v}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"
        )))
    }
}

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Result<Vec<String>, SelectorError> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(SelectorError(format!(
                        "unable to parse requirement: unbalanced ')' in \"{s}\""
                    )));
                }
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    if depth != 0 {
        return Err(SelectorError(format!(
            "unable to parse requirement: unbalanced '(' in \"{s}\""
        )));
    }
    out.push(cur);
    Ok(out)
}

fn parse_set(rest: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            SelectorError(format!(
                "unable to parse requirement: found '{rest}', expected: '('"
            ))
        })?;
    inner.split(',').map(|v| check_val(v.trim())).collect()
}

/// Parse a string label selector (`a=b,c!=d,e in (f,g),!h`).
pub fn parse_label_selector(s: &str) -> Result<LabelSelector, SelectorError> {
    let s = s.trim();
    if s.is_empty() {
        return Ok(LabelSelector::default());
    }
    let mut reqs = Vec::new();
    for part in split_top(s)? {
        let p = part.trim();
        if p.is_empty() {
            return Err(SelectorError(format!(
                "unable to parse requirement: found '', expected: identifier in \"{s}\""
            )));
        }
        if let Some(k) = p.strip_prefix('!') {
            reqs.push(Req::NotExists(check_key(k.trim())?));
        } else if let Some((k, v)) = p.split_once("!=") {
            reqs.push(Req::NotIn(check_key(k.trim())?, vec![check_val(v.trim())?]));
        } else if let Some((k, v)) = p.split_once("==") {
            reqs.push(Req::In(check_key(k.trim())?, vec![check_val(v.trim())?]));
        } else if let Some((k, v)) = p.split_once('=') {
            reqs.push(Req::In(check_key(k.trim())?, vec![check_val(v.trim())?]));
        } else if let Some(idx) = p.find(" notin ").or_else(|| p.find(" notin(")) {
            let (k, rest) = p.split_at(idx);
            reqs.push(Req::NotIn(
                check_key(k.trim())?,
                parse_set(&rest[" notin".len()..])?,
            ));
        } else if let Some(idx) = p.find(" in ").or_else(|| p.find(" in(")) {
            let (k, rest) = p.split_at(idx);
            reqs.push(Req::In(
                check_key(k.trim())?,
                parse_set(&rest[" in".len()..])?,
            ));
        } else if let Some((k, v)) = p.split_once('>') {
            let n = v.trim().parse().map_err(|_| {
                SelectorError(format!(
                    "unable to parse requirement: invalid integer \"{v}\""
                ))
            })?;
            reqs.push(Req::Gt(check_key(k.trim())?, n));
        } else if let Some((k, v)) = p.split_once('<') {
            let n = v.trim().parse().map_err(|_| {
                SelectorError(format!(
                    "unable to parse requirement: invalid integer \"{v}\""
                ))
            })?;
            reqs.push(Req::Lt(check_key(k.trim())?, n));
        } else {
            reqs.push(Req::Exists(check_key(p)?));
        }
    }
    Ok(LabelSelector(reqs))
}

/// Parse a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
pub fn from_label_selector_object(v: &Value) -> Result<LabelSelector, SelectorError> {
    let mut reqs = Vec::new();
    if let Some(m) = v["matchLabels"].as_object() {
        for (k, val) in m {
            reqs.push(Req::In(
                k.clone(),
                vec![val.as_str().unwrap_or_default().to_string()],
            ));
        }
    }
    for e in v["matchExpressions"].as_array().into_iter().flatten() {
        let key = e["key"].as_str().unwrap_or_default().to_string();
        let values: Vec<String> = e["values"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        let r = match e["operator"].as_str() {
            Some("In") => Req::In(key, values),
            Some("NotIn") => Req::NotIn(key, values),
            Some("Exists") => Req::Exists(key),
            Some("DoesNotExist") => Req::NotExists(key),
            other => {
                return Err(SelectorError(format!(
                    "{other:?} is not a valid label selector operator"
                )));
            }
        };
        reqs.push(r);
    }
    Ok(LabelSelector(reqs))
}

impl LabelSelector {
    /// Match against a label map.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| match r {
            Req::Exists(k) => labels.contains_key(k),
            Req::NotExists(k) => !labels.contains_key(k),
            Req::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Req::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Req::Gt(k, n) => labels
                .get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Req::Lt(k, n) => labels
                .get(k)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        })
    }

    /// Match an object's `metadata.labels`.
    pub fn matches_object(&self, obj: &Value) -> bool {
        self.0.is_empty() || self.matches(&labels_of(obj))
    }
}

/// `metadata.labels` as a map.
pub fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj["metadata"]["labels"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// A field selector: AND of `path (=|!=) value`.
#[derive(Debug, Clone, Default)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

/// Parse a field selector, accepting only the fields `allowed` permits.
pub fn parse_field_selector(
    s: &str,
    allowed: &dyn Fn(&str) -> bool,
) -> Result<FieldSelector, SelectorError> {
    let mut out = Vec::new();
    if s.trim().is_empty() {
        return Ok(FieldSelector(out));
    }
    for part in s.split(',') {
        let part = part.trim();
        let (k, eq, v) = if let Some((k, v)) = part.split_once("!=") {
            (k, false, v)
        } else if let Some((k, v)) = part.split_once("==") {
            (k, true, v)
        } else if let Some((k, v)) = part.split_once('=') {
            (k, true, v)
        } else {
            return Err(SelectorError(format!(
                "invalid selector: '{s}'; can't understand '{part}'"
            )));
        };
        let k = k.trim();
        if !allowed(k) {
            return Err(SelectorError(format!("field label not supported: {k}")));
        }
        out.push((k.to_string(), eq, v.trim().to_string()));
    }
    Ok(FieldSelector(out))
}

/// Value at a dotted path, rendered as a string the way field selectors compare it.
pub fn field_value(obj: &Value, path: &str) -> String {
    let mut cur = obj;
    for seg in path.split('.') {
        cur = &cur[seg];
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        other => other.to_string(),
    }
}

impl FieldSelector {
    /// Whether the object satisfies every term.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(k, eq, v)| (field_value(obj, k) == *v) == *eq)
    }
    /// The exact `metadata.name` asked for, if any (fast path).
    pub fn exact_name(&self) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, eq, _)| k == "metadata.name" && *eq)
            .map(|(_, _, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn set_based() {
        let s = parse_label_selector("env in (prod, dev),!legacy,tier!=db,app").expect("parse");
        assert!(s.matches(&labels(&[("env", "prod"), ("app", "x")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("app", "x"), ("legacy", "")])));
        assert!(!s.matches(&labels(&[("env", "qa"), ("app", "x")])));
        assert!(!s.matches(&labels(&[("env", "dev"), ("app", "x"), ("tier", "db")])));
        let s = parse_label_selector("k notin (a)").expect("parse");
        assert!(s.matches(&labels(&[])));
        assert!(!s.matches(&labels(&[("k", "a")])));
    }

    #[test]
    fn invalid() {
        assert!(parse_label_selector("a=b=c").is_err());
        assert!(parse_label_selector("in (").is_err());
        assert!(parse_label_selector("-bad").is_err());
        assert!(parse_label_selector("a,,b").is_err());
        assert!(parse_label_selector("x in (a").is_err());
    }

    #[test]
    fn fields() {
        let obj = serde_json::json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n1"}});
        let f =
            parse_field_selector("spec.nodeName=n1,metadata.name!=b", &|_| true).expect("parse");
        assert!(f.matches(&obj));
        assert!(parse_field_selector("foo", &|_| true).is_err());
        assert!(parse_field_selector("x=1", &|k| k != "x").is_err());
    }
}
