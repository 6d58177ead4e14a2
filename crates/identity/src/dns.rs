//! RFC 1123 subdomain validation with Kubernetes' error texts
//! (`k8s.io/apimachinery/pkg/util/validation.IsDNS1123Subdomain`).

const MAX_LEN: usize = 253;
const REGEX_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
characters, '-' or '.', and must start and end with an alphanumeric character (e.g. \
'example.com', regex used for validation is \
'[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// Returns the list of validation errors (empty when `value` is a valid DNS-1123 subdomain).
pub fn dns1123_subdomain_errors(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > MAX_LEN {
        errs.push(format!("must be no more than {MAX_LEN} characters"));
    }
    if !is_subdomain_syntax(value) {
        errs.push(REGEX_MSG.to_string());
    }
    errs
}

/// True when `value` is a valid DNS-1123 subdomain.
pub fn is_dns1123_subdomain(value: &str) -> bool {
    value.len() <= MAX_LEN && is_subdomain_syntax(value)
}

fn is_subdomain_syntax(value: &str) -> bool {
    !value.is_empty() && value.split('.').all(is_label)
}

fn is_label(label: &str) -> bool {
    let bytes = label.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            alnum(first) && alnum(last) && bytes.iter().all(|b| alnum(b) || *b == b'-')
        }
        _ => false,
    }
}

/// Formats a list the way Go's `%v` prints a `[]string`: `[a b c]`.
pub fn go_list<S: AsRef<str>>(items: &[S]) -> String {
    let mut out = String::from("[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(item.as_ref());
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("node1", true)]
    #[case("worker-1.example.com", true)]
    #[case("Node1", false)]
    #[case("-node", false)]
    #[case("node-", false)]
    #[case("a..b", false)]
    #[case("", false)]
    #[case("node_1", false)]
    fn subdomain(#[case] v: &str, #[case] ok: bool) {
        assert_eq!(is_dns1123_subdomain(v), ok);
        assert_eq!(dns1123_subdomain_errors(v).is_empty(), ok);
    }

    #[test]
    fn too_long() {
        let v = "a".repeat(254);
        assert_eq!(
            dns1123_subdomain_errors(&v),
            vec!["must be no more than 253 characters".to_string()]
        );
    }

    #[test]
    fn go_list_format() {
        assert_eq!(go_list(&["a", "b"]), "[a b]");
        assert_eq!(go_list::<&str>(&[]), "[]");
    }
}
