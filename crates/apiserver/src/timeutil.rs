//! Timestamps in the Kubernetes wire format (RFC 3339, second precision, UTC).

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// Now, formatted as `2006-01-02T15:04:05Z`.
pub fn now_rfc3339() -> String {
    format_rfc3339(OffsetDateTime::now_utc())
}

/// Format a time as `2006-01-02T15:04:05Z`.
pub fn format_rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// Microsecond precision (`MicroTime`), e.g. for Events' `eventTime`.
pub fn now_micro() -> String {
    let t = OffsetDateTime::now_utc();
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

/// Parse an RFC 3339 timestamp; `None` when malformed.
pub fn parse_rfc3339(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// Human age like kubectl prints (`5s`, `3m`, `2h`, `4d`).
pub fn age(ts: &str) -> String {
    let Some(t) = parse_rfc3339(ts) else {
        return "<unknown>".into();
    };
    let secs = (OffsetDateTime::now_utc() - t).whole_seconds().max(0);
    if secs < 120 {
        format!("{secs}s")
    } else if secs < 7200 {
        format!("{}m", secs / 60)
    } else if secs < 2 * 86400 {
        format!("{}h", secs / 3600)
    } else {
        format!("{}d", secs / 86400)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let s = now_rfc3339();
        assert!(parse_rfc3339(&s).is_some());
        assert!(s.ends_with('Z'));
        assert_eq!(age("garbage"), "<unknown>");
    }
}
