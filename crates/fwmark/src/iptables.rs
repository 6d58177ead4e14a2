//! iptables backend: the seed's layout.
//!
//! ```text
//! *mangle
//! -A PREROUTING -j OVN-KUBE-SERVICE-FWMARK
//! -A OVN-KUBE-SERVICE-FWMARK -s 100.100.100.100/32 -m comment --comment default/service1 -j MARK --set-xmark 0x3e8/0xffffffff
//! ```
//!
//! Each sync reads `iptables-save -t mangle` (and `ip6tables-save`), compares ovnk's chain and
//! the PREROUTING jumps to it *semantically* (parsed rules as a set, not text), and when they
//! differ writes the whole chain plus exactly one jump with one `iptables-restore --noflush`
//! run per family (atomic per table). Declaring the chain in the restore input flushes it;
//! nothing outside the chain and the jump is touched.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::exec::{self, ExecError, Runner, Tool};
use crate::plan::Desired;

/// ovnk's chain in table mangle.
pub const CHAIN: &str = "OVN-KUBE-SERVICE-FWMARK";

/// Errors of the iptables backend.
#[derive(Debug, thiserror::Error)]
pub enum IptError {
    #[error(transparent)]
    Exec(#[from] ExecError),
}

/// One rule of ovnk's chain, as compared (semantically).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Rule {
    pub source: IpAddr,
    pub value: u32,
    pub mask: u32,
    pub comment: String,
}

impl Rule {
    /// Tokens after `-A OVN-KUBE-SERVICE-FWMARK` (also used by the bench's per-rule path).
    pub fn spec(&self) -> Vec<String> {
        let prefix = if self.source.is_ipv4() { 32 } else { 128 };
        vec![
            "-s".into(),
            format!("{}/{prefix}", self.source),
            "-m".into(),
            "comment".into(),
            "--comment".into(),
            self.comment.clone(),
            "-j".into(),
            "MARK".into(),
            "--set-xmark".into(),
            format!("{:#x}/{:#x}", self.value, self.mask),
        ]
    }
}

/// Comments are `<namespace>/<name>`; anything outside the DNS-name alphabet is replaced so a
/// crafted name can never break the restore input.
fn comment_of(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '/' | '_') {
                c
            } else {
                '_'
            }
        })
        .take(250)
        .collect()
}

/// The rules of one family for `desired`, in chain order (by owner, then address).
pub fn desired_rules(desired: &Desired, v4: bool) -> Vec<Rule> {
    let mut rules: Vec<(String, Rule)> = desired
        .family(v4)
        .map(|(ip, e)| {
            let comment = comment_of(&e.owner.to_string());
            (
                comment.clone(),
                Rule {
                    source: *ip,
                    value: e.mark.value(),
                    mask: e.mark.mask(),
                    comment,
                },
            )
        })
        .collect();
    rules.sort();
    rules.into_iter().map(|(_, r)| r).collect()
}

/// ovnk's part of one family's `iptables-save -t mangle`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChainState {
    pub chain_exists: bool,
    /// PREROUTING rules that jump to [`CHAIN`], as their spec after `-A PREROUTING`.
    pub jumps: Vec<Vec<String>>,
    /// Parsed rules of [`CHAIN`].
    pub rules: Vec<Rule>,
    /// Rules of [`CHAIN`] ovnk cannot have written.
    pub unknown_rules: usize,
}

impl ChainState {
    /// Exactly one plain jump, and the chain holds exactly `want` (order-insensitive: every
    /// rule only sets a mark for a distinct source, so order does not change the result).
    pub fn matches(&self, want: &[Rule]) -> bool {
        let plain = [String::from("-j"), CHAIN.to_string()];
        self.chain_exists
            && self.unknown_rules == 0
            && self.jumps.len() == 1
            && self.jumps[0] == plain
            && self.rules.len() == want.len()
            && self.rules.iter().collect::<BTreeSet<_>>() == want.iter().collect::<BTreeSet<_>>()
    }
}

/// Split an iptables-save line into words, honouring double quotes.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if quoted => {
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    out.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            c => {
                cur.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(cur);
    }
    out
}

fn parse_u32(s: &str) -> Option<u32> {
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

fn parse_rule(w: &[String]) -> Option<Rule> {
    let (mut source, mut comment, mut xmark, mut target) = (None, None, None, None);
    let mut i = 0;
    while i < w.len() {
        let next = w.get(i + 1).map(String::as_str);
        match (w[i].as_str(), next) {
            ("-s", Some(v)) => source = Some(v),
            ("-m", Some("comment")) => {}
            ("--comment", Some(v)) => comment = Some(v),
            ("-j", Some(v)) => target = Some(v),
            ("--set-xmark", Some(v)) => xmark = Some(v),
            _ => return None,
        }
        i += 2;
    }
    let source = source?;
    let (addr, len) = source.split_once('/').unwrap_or((source, ""));
    let addr: IpAddr = addr.parse().ok()?;
    let full = if addr.is_ipv4() { "32" } else { "128" };
    if !(len.is_empty() || len == full) || target != Some("MARK") {
        return None;
    }
    let (v, m) = xmark?.split_once('/')?;
    Some(Rule {
        source: addr,
        value: parse_u32(v)?,
        mask: parse_u32(m)?,
        comment: comment.unwrap_or_default().to_string(),
    })
}

/// Parse one family's `iptables-save -t mangle` output.
pub fn parse_save(text: &str) -> ChainState {
    let mut st = ChainState::default();
    let mut in_mangle = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('*') {
            in_mangle = line == "*mangle";
            continue;
        }
        if !in_mangle {
            continue;
        }
        if let Some(rest) = line.strip_prefix(':') {
            if rest.split_whitespace().next() == Some(CHAIN) {
                st.chain_exists = true;
            }
            continue;
        }
        let w = words(line);
        if w.len() < 2 || w[0] != "-A" {
            continue;
        }
        let spec = &w[2..];
        if w[1] == "PREROUTING" {
            if spec.windows(2).any(|p| p[0] == "-j" && p[1] == CHAIN) {
                st.jumps.push(spec.to_vec());
            }
        } else if w[1] == CHAIN {
            match parse_rule(spec) {
                Some(r) => st.rules.push(r),
                None => st.unknown_rules += 1,
            }
        }
    }
    st
}

fn quote(w: &str) -> String {
    if !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:".contains(c))
    {
        w.to_string()
    } else {
        format!("\"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""))
    }
}

/// The `iptables-restore --noflush` input that takes `live` to `want`.
pub fn restore_input(live: &ChainState, want: &[Rule]) -> String {
    let mut s = String::from("*mangle\n");
    let _ = writeln!(s, ":{CHAIN} - [0:0]");
    for r in want {
        let spec: Vec<String> = r.spec().iter().map(|w| quote(w)).collect();
        let _ = writeln!(s, "-A {CHAIN} {}", spec.join(" "));
    }
    let plain = [String::from("-j"), CHAIN.to_string()];
    if !(live.jumps.len() == 1 && live.jumps[0] == plain) {
        for j in &live.jumps {
            let spec: Vec<String> = j.iter().map(|w| quote(w)).collect();
            let _ = writeln!(s, "-D PREROUTING {}", spec.join(" "));
        }
        let _ = writeln!(s, "-I PREROUTING 1 -j {CHAIN}");
    }
    s.push_str("COMMIT\n");
    s
}

/// The input that removes ovnk's chain and jumps.
pub fn cleanup_input(live: &ChainState) -> Option<String> {
    if !live.chain_exists && live.jumps.is_empty() {
        return None;
    }
    let mut s = String::from("*mangle\n");
    let _ = writeln!(s, ":{CHAIN} - [0:0]");
    for j in &live.jumps {
        let spec: Vec<String> = j.iter().map(|w| quote(w)).collect();
        let _ = writeln!(s, "-D PREROUTING {}", spec.join(" "));
    }
    let _ = writeln!(s, "-X {CHAIN}");
    s.push_str("COMMIT\n");
    Some(s)
}

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Families whose chain was rewritten (0 when the live state already matched).
    pub families_written: usize,
    pub rules: usize,
}

#[derive(Debug)]
struct Family {
    restore: PathBuf,
    save: PathBuf,
}

/// The iptables backend.
#[derive(Debug)]
pub struct IptablesBackend {
    runner: Runner,
    v4: Family,
    v6: Family,
}

impl IptablesBackend {
    /// A backend using `iptables-restore`/`-save` and `ip6tables-restore`/`-save` found in
    /// `bin_dir` or `$PATH`; errors clearly when one is missing.
    pub fn new(runner: Runner, bin_dir: Option<&Path>) -> Result<Self, IptError> {
        Ok(Self {
            runner,
            v4: Family {
                restore: exec::find(Tool::IptablesRestore, bin_dir)?,
                save: exec::find(Tool::IptablesSave, bin_dir)?,
            },
            v6: Family {
                restore: exec::find(Tool::Ip6tablesRestore, bin_dir)?,
                save: exec::find(Tool::Ip6tablesSave, bin_dir)?,
            },
        })
    }

    fn family(&self, v4: bool) -> &Family {
        if v4 { &self.v4 } else { &self.v6 }
    }

    /// Parsed live state of one family.
    pub fn live(&self, v4: bool) -> Result<ChainState, IptError> {
        let out = self
            .runner
            .run(&self.family(v4).save, &["-t", "mangle"], None)?;
        Ok(parse_save(&String::from_utf8_lossy(&out)))
    }

    /// Make both families equal `desired`: one restore per family that differs.
    pub fn sync(&mut self, desired: &Desired) -> Result<SyncStats, IptError> {
        let mut stats = SyncStats::default();
        for v4 in [true, false] {
            let want = desired_rules(desired, v4);
            stats.rules += want.len();
            let live = self.live(v4)?;
            if live.matches(&want) {
                continue;
            }
            let input = restore_input(&live, &want);
            self.runner.run(
                &self.family(v4).restore,
                &["--noflush", "-w"],
                Some(input.as_bytes()),
            )?;
            stats.families_written += 1;
        }
        Ok(stats)
    }

    /// Remove ovnk's chain and jumps from both families (backend switch).
    pub fn cleanup(&mut self) -> Result<bool, IptError> {
        let mut any = false;
        for v4 in [true, false] {
            let live = self.live(v4)?;
            if let Some(input) = cleanup_input(&live) {
                self.runner.run(
                    &self.family(v4).restore,
                    &["--noflush", "-w"],
                    Some(input.as_bytes()),
                )?;
                any = true;
            }
        }
        Ok(any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAVE: &str = r#"# Generated by iptables-save v1.8.9 (nf_tables)
*mangle
:PREROUTING ACCEPT [0:0]
:OVN-KUBE-SERVICE-FWMARK - [0:0]
-A PREROUTING -j OVN-KUBE-SERVICE-FWMARK
-A PREROUTING -s 1.2.3.4/32 -j ACCEPT
-A OVN-KUBE-SERVICE-FWMARK -s 100.100.100.100/32 -m comment --comment default/service1 -j MARK --set-xmark 0x3e8/0xffffffff
-A OVN-KUBE-SERVICE-FWMARK -s 10.244.0.3/32 -m comment --comment "default/service1" -j MARK --set-xmark 0x3e8/0xffffffff
COMMIT
"#;

    fn rule(ip: &str) -> Rule {
        Rule {
            source: ip.parse().expect("ip"),
            value: 1000,
            mask: 0xffff_ffff,
            comment: "default/service1".into(),
        }
    }

    #[test]
    fn parses_and_compares_semantically() {
        let st = parse_save(SAVE);
        assert!(st.chain_exists);
        assert_eq!(st.jumps.len(), 1);
        assert_eq!(st.unknown_rules, 0);
        // order does not matter, quoting does not matter
        assert!(st.matches(&[rule("10.244.0.3"), rule("100.100.100.100")]));
        assert!(!st.matches(&[rule("10.244.0.3")]));
    }

    #[test]
    fn duplicate_jumps_are_reduced_to_one() {
        let text = SAVE.replace(
            "-A PREROUTING -s 1.2.3.4/32 -j ACCEPT",
            "-A PREROUTING -s 1.2.3.4/32 -j ACCEPT\n-A PREROUTING -j OVN-KUBE-SERVICE-FWMARK",
        );
        let st = parse_save(&text);
        assert_eq!(st.jumps.len(), 2);
        let want = [rule("10.244.0.3"), rule("100.100.100.100")];
        assert!(!st.matches(&want));
        let input = restore_input(&st, &want);
        assert_eq!(
            input
                .matches("-D PREROUTING -j OVN-KUBE-SERVICE-FWMARK")
                .count(),
            2
        );
        assert_eq!(
            input
                .matches("-I PREROUTING 1 -j OVN-KUBE-SERVICE-FWMARK")
                .count(),
            1
        );
        assert!(!input.contains("1.2.3.4"));
    }

    #[test]
    fn foreign_rule_in_our_chain_forces_rewrite() {
        let text = SAVE.replace(
            "COMMIT",
            "-A OVN-KUBE-SERVICE-FWMARK -p tcp -j ACCEPT\nCOMMIT",
        );
        let st = parse_save(&text);
        assert_eq!(st.unknown_rules, 1);
        assert!(!st.matches(&[rule("10.244.0.3"), rule("100.100.100.100")]));
    }

    #[test]
    fn comments_are_sanitised() {
        assert_eq!(comment_of("ns/a b\"c"), "ns/a_b_c");
        let w = words(r#"-A X --comment "a \"b\" c" -j MARK"#);
        assert_eq!(w[3], r#"a "b" c"#);
    }
}
