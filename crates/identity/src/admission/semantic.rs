//! Semantic equality of JSON objects, close to `apiequality.Semantic.DeepEqual` for the parts
//! the checks compare: absent, `null`, empty object and empty array are equal.

use serde_json::Value;

fn is_empty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(m)) => m.is_empty(),
        Some(Value::Array(a)) => a.is_empty(),
        Some(Value::String(s)) => s.is_empty(),
        Some(Value::Bool(b)) => !b,
        Some(Value::Number(n)) => n.as_f64() == Some(0.0),
    }
}

/// Semantic equality; Go zero values (absent, null, "", false, 0, {}, []) compare equal.
pub fn semantic_eq(a: Option<&Value>, b: Option<&Value>) -> bool {
    if is_empty(a) && is_empty(b) {
        return true;
    }
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => objects_eq_except(x, y, &[]),
        (Some(Value::Array(x)), Some(Value::Array(y))) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y.iter())
                    .all(|(p, q)| semantic_eq(Some(p), Some(q)))
        }
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// Semantic equality of two objects, ignoring the keys in `skip`.
pub fn objects_eq_except(
    a: &serde_json::Map<String, Value>,
    b: &serde_json::Map<String, Value>,
    skip: &[&str],
) -> bool {
    // One pass over `a` compares shared keys; a second pass over `b` only looks at keys `a`
    // lacks (they must be empty). Linear in the size of the trees.
    a.iter()
        .filter(|(k, _)| !skip.contains(&k.as_str()))
        .all(|(k, v)| semantic_eq(Some(v), b.get(k)))
        && b.iter()
            .filter(|(k, _)| !skip.contains(&k.as_str()) && !a.contains_key(*k))
            .all(|(_, v)| is_empty(Some(v)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empties_are_equal() {
        assert!(semantic_eq(Some(&json!({"a": {}})), Some(&json!({}))));
        assert!(semantic_eq(
            Some(&json!({"a": []})),
            Some(&json!({"a": null}))
        ));
        assert!(semantic_eq(None, Some(&json!({}))));
        assert!(!semantic_eq(Some(&json!({"a": 1})), Some(&json!({}))));
        assert!(!semantic_eq(Some(&json!([1, 2])), Some(&json!([2, 1]))));
    }

    #[test]
    fn skip_keys() {
        let a = json!({"name": "x", "annotations": {"a": "1"}});
        let b = json!({"name": "x", "annotations": {"a": "2"}});
        assert!(objects_eq_except(
            a.as_object().expect("object"),
            b.as_object().expect("object"),
            &["annotations"]
        ));
    }
}
