//! Structural-schema validation, defaulting and pruning for custom resources.

use serde_json::{Map, Value};
use std::collections::HashMap;

/// Validation failures: `(field path, message)`.
pub type Causes = Vec<(String, String)>;

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("\"{s}\""),
        Value::Object(_) => "\"object\"".into(),
        Value::Array(_) => "\"array\"".into(),
        other => other.to_string(),
    }
}

/// Validate, default and prune a whole custom resource against its `openAPIV3Schema`.
/// `old` is the stored object on update (for transition rules).
pub fn validate_object(schema: &Value, obj: &mut Value, old: Option<&Value>) -> Causes {
    let mut causes = Vec::new();
    let Some(props) = schema["properties"].as_object() else {
        return causes;
    };
    let Some(m) = obj.as_object_mut() else {
        causes.push((String::new(), "object must be a JSON object".into()));
        return causes;
    };
    let preserve = schema["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true);
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        match props.get(&k) {
            Some(ps) => {
                if m.get(&k).is_some_and(Value::is_null) && ps["nullable"].as_bool() != Some(true) {
                    m.remove(&k);
                    continue;
                }
                if let Some(v) = m.get_mut(&k) {
                    let oldv = old.and_then(|o| o.get(&k));
                    walk(ps, v, oldv, &k, &mut causes);
                }
            }
            None if !preserve => {
                m.remove(&k);
            }
            None => {}
        }
    }
    for (k, ps) in props {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if !m.contains_key(k)
            && let Some(d) = ps.get("default")
        {
            m.insert(k.clone(), d.clone());
        }
    }
    for r in schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !m.contains_key(r) {
            causes.push((r.to_string(), "Required value".into()));
        }
    }
    causes
}

fn walk(s: &Value, v: &mut Value, old: Option<&Value>, path: &str, causes: &mut Causes) {
    if v.is_null() {
        if s["nullable"].as_bool() != Some(true) && s.get("type").is_some() {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: \"null\": {path} in body must be of type {}: \"null\"",
                    s["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    let int_or_string = s["x-kubernetes-int-or-string"].as_bool() == Some(true);
    if int_or_string {
        if !(v.is_string() || v.is_i64() || v.is_u64()) {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: {}: {path} in body must be of type integer-or-string: {}",
                    show(v),
                    show(v)
                ),
            ));
        }
    } else if let Some(t) = s["type"].as_str() {
        let actual = type_name(v);
        let ok = actual == t
            || (t == "number" && actual == "integer")
            || (t == "integer"
                && v.as_f64().is_some_and(|f| f.fract() == 0.0)
                && actual == "number");
        if !ok {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: \"{actual}\": {path} in body must be of type {t}: {}",
                    show(v)
                ),
            ));
            return;
        }
    }
    if let Some(en) = s["enum"].as_array()
        && !en.contains(v)
    {
        let list: Vec<String> = en.iter().map(show).collect();
        causes.push((
            path.into(),
            format!(
                "Unsupported value: {}: supported values: {}",
                show(v),
                list.join(", ")
            ),
        ));
    }
    if let Some(f) = v.as_f64() {
        if let Some(min) = s["minimum"].as_f64() {
            let excl = s["exclusiveMinimum"].as_bool() == Some(true);
            if f < min || (excl && f == min) {
                let rel = if excl {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                causes.push((
                    path.into(),
                    format!(
                        "Invalid value: {v}: {path} in body should be {rel} {}",
                        s["minimum"]
                    ),
                ));
            }
        }
        if let Some(max) = s["maximum"].as_f64() {
            let excl = s["exclusiveMaximum"].as_bool() == Some(true);
            if f > max || (excl && f == max) {
                let rel = if excl {
                    "less than"
                } else {
                    "less than or equal to"
                };
                causes.push((
                    path.into(),
                    format!(
                        "Invalid value: {v}: {path} in body should be {rel} {}",
                        s["maximum"]
                    ),
                ));
            }
        }
    }
    if let Some(st) = v.as_str() {
        let n = st.chars().count() as u64;
        if let Some(max) = s["maxLength"].as_u64()
            && n > max
        {
            causes.push((
                path.into(),
                format!("Too long: may not be more than {max} bytes"),
            ));
        }
        if let Some(min) = s["minLength"].as_u64()
            && n < min
        {
            causes.push((
                path.into(),
                format!(
                    "Invalid value: \"{st}\": {path} in body should be at least {min} chars long"
                ),
            ));
        }
        if let Some(p) = s["pattern"].as_str() {
            match regex::Regex::new(p) {
                Ok(re) if !re.is_match(st) => causes.push((
                    path.into(),
                    format!("Invalid value: \"{st}\": {path} in body should match '{p}'"),
                )),
                Ok(_) => {}
                Err(_) => causes.push((
                    path.into(),
                    format!("schema pattern '{p}' is not supported"),
                )),
            }
        }
    }
    match v {
        Value::Object(m) => walk_object(s, m, old, path, causes),
        Value::Array(a) => {
            if let Some(max) = s["maxItems"].as_u64()
                && a.len() as u64 > max
            {
                causes.push((
                    path.into(),
                    format!("Too many: {}: must have at most {max} items", a.len()),
                ));
            }
            if let Some(min) = s["minItems"].as_u64()
                && (a.len() as u64) < min
            {
                causes.push((
                    path.into(),
                    format!(
                        "Invalid value: {}: {path} in body should have at least {min} items",
                        a.len()
                    ),
                ));
            }
            if let Some(items) = s.get("items") {
                for (i, it) in a.iter_mut().enumerate() {
                    walk(items, it, None, &format!("{path}[{i}]"), causes);
                }
            }
        }
        _ => {}
    }
    cel_rules(s, v, old, path, causes);
}

fn walk_object(
    s: &Value,
    m: &mut Map<String, Value>,
    old: Option<&Value>,
    path: &str,
    causes: &mut Causes,
) {
    let preserve = s["x-kubernetes-preserve-unknown-fields"].as_bool() == Some(true);
    let props = s["properties"].as_object();
    let addl = s.get("additionalProperties");
    let keys: Vec<String> = m.keys().cloned().collect();
    for k in keys {
        let sub = format!("{path}.{k}");
        let ps = props
            .and_then(|p| p.get(&k))
            .or(addl.filter(|a| a.is_object()));
        match ps {
            Some(ps) => {
                if m.get(&k).is_some_and(Value::is_null) && ps["nullable"].as_bool() != Some(true) {
                    m.remove(&k);
                    continue;
                }
                if let Some(v) = m.get_mut(&k) {
                    walk(ps, v, old.and_then(|o| o.get(&k)), &sub, causes);
                }
            }
            None => {
                let allowed = preserve || addl.and_then(Value::as_bool) == Some(true);
                if !allowed {
                    m.remove(&k);
                }
            }
        }
    }
    if let Some(props) = props {
        for (k, ps) in props {
            if !m.contains_key(k)
                && let Some(d) = ps.get("default")
            {
                m.insert(k.clone(), d.clone());
            }
        }
    }
    for r in s["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !m.contains_key(r) {
            causes.push((format!("{path}.{r}"), "Required value".into()));
        }
    }
    if let Some(max) = s["maxProperties"].as_u64()
        && m.len() as u64 > max
    {
        causes.push((
            path.into(),
            format!("Too many: {}: must have at most {max} items", m.len()),
        ));
    }
}

fn cel_rules(s: &Value, v: &Value, old: Option<&Value>, path: &str, causes: &mut Causes) {
    for rule in s["x-kubernetes-validations"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let Some(src) = rule["rule"].as_str() else {
            continue;
        };
        let uses_old = src.contains("oldSelf");
        if uses_old && old.is_none() && rule["optionalOldSelf"].as_bool() != Some(true) {
            continue; // transition rules only run on update
        }
        let expr = match crate::cel::parse(src, &["self", "oldSelf"]) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(rule = src, error = %e, "x-kubernetes-validations rule outside the supported CEL subset; skipped");
                continue;
            }
        };
        let mut env = HashMap::new();
        env.insert("self".to_string(), v.clone());
        if let Some(o) = old {
            env.insert("oldSelf".to_string(), o.clone());
        }
        let ok = crate::cel::eval_bool(&expr, &env);
        if ok != Ok(true) {
            let msg = rule["message"]
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| format!("failed rule: {src}"));
            let field = rule["fieldPath"]
                .as_str()
                .map(|f| format!("{path}{f}"))
                .unwrap_or_else(|| path.to_string());
            causes.push((field, format!("Invalid value: \"{}\": {msg}", type_name(v))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn validates_and_prunes() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["mark"],
            "properties": {"mark": {"type": "integer", "minimum": 1, "maximum": 10},
                           "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                           "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                           "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            "x-kubernetes-validations": [{"rule": "self.mark != 7", "message": "seven is unlucky"}]}}});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "a"},
            "spec": {"mark": 3, "junk": 1, "free": {"anything": true}}, "extra": 1});
        assert!(validate_object(&schema, &mut obj, None).is_empty());
        assert!(obj.get("extra").is_none());
        assert!(obj["spec"].get("junk").is_none());
        assert_eq!(obj["spec"]["mode"], "a");
        assert_eq!(obj["spec"]["free"]["anything"], true);
        let mut bad = json!({"spec": {"mark": 11, "mode": "c", "name": "ABCDEFG"}});
        let c = validate_object(&schema, &mut bad, None);
        assert_eq!(c.len(), 4, "{c:?}");
        let mut bad = json!({"spec": {"mark": "x"}});
        assert_eq!(validate_object(&schema, &mut bad, None).len(), 1);
        let mut bad = json!({"spec": {"mark": 7}});
        let c = validate_object(&schema, &mut bad, None);
        assert!(c[0].1.contains("unlucky"));
        let mut bad = json!({"spec": {}});
        assert_eq!(validate_object(&schema, &mut bad, None)[0].0, "spec.mark");
    }
}
