//! nftables backend (default).
//!
//! Layout, all inside ovnk's own table `inet <table>` (default `ovnk-fwmark`):
//!
//! ```text
//! table inet ovnk-fwmark {
//!   map src-v4 { type ipv4_addr : verdict; elements = { 10.244.0.3 : goto mark-1000, … } }
//!   map src-v6 { type ipv6_addr : verdict; … }
//!   chain mark-1000 { meta mark set (meta mark & ~mask) | 1000 comment "ovnk:0x3e8/0xffffffff" }
//!   chain prerouting { type filter hook prerouting priority mangle; policy accept;
//!     ip saddr vmap @src-v4 comment "ovnk:v4"
//!     ip6 saddr vmap @src-v6 comment "ovnk:v6" }
//! }
//! ```
//!
//! A verdict map to one small chain per mark value is used because nft 1.0.6 cannot set a
//! masked mark from a map. Every sync that changes something is one `nft -f -` run fed a batch in
//! nft's text syntax (one command per line), i.e. one kernel transaction; nft parses that text
//! faster than the same batch as JSON (`nft -j -f -`). The live table is read as JSON
//! (`nft -j list table`). After the first sync the backend diffs against what it last applied,
//! so changing one endpoint sends one element delete and/or add (O(1) in the number of
//! entries). The first sync
//! (and any sync after an error or [`NftBackend::resync`]) reads the live table first and
//! removes whatever is stale.
//!
//! The table name goes into the text unquoted (nft 1.0.6 takes no quoted names), so
//! [`NftBackend::new`] refuses a name that is not a plain identifier ([`validate_table_name`])
//! or that nft's parser reads as one of its keywords (`ip`, `mark`, `counter`, `auto-merge`, …).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::exec::{self, ExecError, Runner, Tool};
use crate::mark::{FULL_MASK, Mark};
use crate::plan::Desired;

/// Default table name (family `inet`).
pub const DEFAULT_TABLE: &str = "ovnk-fwmark";
/// The base chain.
pub const BASE_CHAIN: &str = "prerouting";
/// Map name for IPv4 sources.
pub const MAP_V4: &str = "src-v4";
/// Map name for IPv6 sources.
pub const MAP_V6: &str = "src-v6";
/// Hook priority: `mangle` (-150), like the iptables mangle table.
pub const PRIORITY: i64 = -150;
const COMMENT_V4: &str = "ovnk:v4";
const COMMENT_V6: &str = "ovnk:v6";

/// Errors of the nftables backend.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("cannot parse `nft -j list table` output: {0}")]
    Parse(String),
    #[error("invalid nft table name {name:?} (--fwmark-nft-table): {reason}")]
    InvalidTable { name: String, reason: String },
}

/// Longest table name the kernel takes (`NFT_NAME_MAXLEN` 256 includes the terminating NUL).
pub const TABLE_NAME_MAX: usize = 255;

/// Check that `name` can stand unquoted in nft's text syntax: an ASCII letter or `_`, then ASCII
/// letters, digits, `_`, `-` and `.`, at most [`TABLE_NAME_MAX`] characters. (nft's scanner also
/// takes a few more forms, e.g. `a/b`, that ovnk does not need.) This does not catch nft's
/// keywords; [`NftBackend::new`] asks nft itself about those.
pub fn validate_table_name(name: &str) -> Result<(), NftError> {
    let bad = |reason: String| NftError::InvalidTable {
        name: name.to_string(),
        reason,
    };
    let mut chars = name.chars();
    match chars.next() {
        None => return Err(bad("empty".into())),
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        Some(c) => {
            return Err(bad(format!(
                "must start with an ASCII letter or `_`, not {c:?}"
            )));
        }
    }
    if let Some(c) = chars.find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))) {
        return Err(bad(format!(
            "{c:?} is not allowed; use ASCII letters, digits, `_`, `-` and `.`"
        )));
    }
    if name.len() > TABLE_NAME_MAX {
        return Err(bad(format!(
            "{} characters, at most {TABLE_NAME_MAX} allowed",
            name.len()
        )));
    }
    Ok(())
}

/// The name of the chain that sets mark `value`.
pub fn mark_chain(value: u32) -> String {
    format!("mark-{value}")
}

/// The comment on a mark chain's rule; it records value and mask, so a mask change is seen.
pub fn mark_comment(mark: Mark) -> String {
    format!("ovnk:{:#x}/{:#x}", mark.value(), mark.mask())
}

/// What ovnk's table holds (as far as the sync cares).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TableState {
    pub exists: bool,
    /// Base chain, both maps and both vmap rules are exactly as ovnk makes them, and nothing
    /// else foreign is in the table.
    pub base_ok: bool,
    /// Mark chains: name → comment of its single rule (`None` when not exactly one rule).
    pub chains: BTreeMap<String, Option<String>>,
    /// Map elements: source → mark value of the target chain `mark-<value>`.
    pub elems: BTreeMap<IpAddr, u32>,
}

/// What one sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub recreated: bool,
    pub elements_added: usize,
    pub elements_deleted: usize,
    pub chains_written: usize,
    pub chains_deleted: usize,
    /// Number of commands in the transaction (0: nothing to do, nft not run).
    pub commands: usize,
}

/// The nftables backend.
#[derive(Debug)]
pub struct NftBackend {
    nft: PathBuf,
    runner: Runner,
    table: String,
    cache: Option<TableState>,
}

impl NftBackend {
    /// A backend using `nft` found in `bin_dir` or `$PATH`; errors clearly when it is missing or
    /// when `table` is not a name nft's text syntax takes unquoted (see [`validate_table_name`];
    /// nft keywords such as `ip` or `counter` are found by a check-only `nft -c` run).
    pub fn new(runner: Runner, bin_dir: Option<&Path>, table: &str) -> Result<Self, NftError> {
        validate_table_name(table)?;
        let backend = Self {
            nft: exec::find(Tool::Nft, bin_dir)?,
            runner,
            table: table.to_string(),
            cache: None,
        };
        backend.check_table_name()?;
        Ok(backend)
    }

    /// Ask nft whether it parses the table name as a name: `nft -c` (check only, nothing is
    /// applied) of `add table inet <table>`. A keyword is a syntax error; any other failure
    /// (e.g. no permission) is left for the first sync to report.
    fn check_table_name(&self) -> Result<(), NftError> {
        let probe = format!("add table inet {}\n", self.table);
        match self
            .runner
            .run(&self.nft, &["-c", "-f", "-"], Some(probe.as_bytes()))
        {
            Err(ExecError::Failed { stderr, .. }) if stderr.contains("syntax error") => {
                let first = stderr.lines().next().unwrap_or_default();
                let reason = first.split_once("Error: ").map_or(first, |(_, m)| m);
                Err(NftError::InvalidTable {
                    name: self.table.clone(),
                    reason: format!("nft reads it as a keyword ({reason}); choose another name"),
                })
            }
            Err(e) => {
                tracing::debug!(error = %e, table = %self.table, "nft table name check did not run");
                Ok(())
            }
            Ok(_) => Ok(()),
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// Forget what was applied: the next sync reads the live table again.
    pub fn resync(&mut self) {
        self.cache = None;
    }

    /// `nft -j list table inet <table>` as JSON, `None` when the table does not exist.
    pub fn list(&self) -> Result<Option<Value>, NftError> {
        match self.runner.run(
            &self.nft,
            &["-j", "list", "table", "inet", &self.table],
            None,
        ) {
            Ok(out) => serde_json::from_slice(&out)
                .map(Some)
                .map_err(|e| NftError::Parse(e.to_string())),
            Err(ExecError::Failed { stderr, .. })
                if stderr.contains("No such file or directory") =>
            {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Read the live table.
    pub fn live(&self) -> Result<TableState, NftError> {
        match self.list()? {
            None => Ok(TableState::default()),
            Some(v) => parse_table(&v),
        }
    }

    /// Make the live table equal `desired`, in one transaction.
    pub fn sync(&mut self, desired: &Desired) -> Result<SyncStats, NftError> {
        let from_cache = self.cache.is_some();
        match self.sync_once(desired) {
            Ok(s) => Ok(s),
            Err(e) if from_cache => {
                // What we believed was live is not: read the table and try once more.
                tracing::warn!(error = %e, table = %self.table, "nft sync failed, resyncing from the live table");
                self.cache = None;
                self.sync_once(desired)
            }
            Err(e) => Err(e),
        }
    }

    fn sync_once(&mut self, desired: &Desired) -> Result<SyncStats, NftError> {
        let mut live = match self.cache.take() {
            Some(c) => c,
            None => self.live()?,
        };
        let (batch, stats, delta) = build_batch(&self.table, &live, desired);
        if !batch.is_empty() {
            self.runner
                .run(&self.nft, &["-f", "-"], Some(batch.as_bytes()))?;
        }
        // the cache follows the change, in O(changes)
        if stats.recreated {
            live = TableState {
                exists: true,
                base_ok: true,
                ..TableState::default()
            };
        }
        for ip in &delta.deleted {
            live.elems.remove(ip);
        }
        live.elems.extend(delta.added);
        live.chains = delta.chains;
        self.cache = Some(live);
        Ok(stats)
    }

    /// Delete ovnk's table (backend switch). Absent table is fine.
    pub fn cleanup(&mut self) -> Result<bool, NftError> {
        self.cache = None;
        if self.list()?.is_none() {
            return Ok(false);
        }
        self.runner
            .run(&self.nft, &["delete", "table", "inet", &self.table], None)?;
        Ok(true)
    }
}

/// The table state that results from applying `desired`.
#[cfg(test)]
fn state_of(desired: &Desired) -> TableState {
    let mut chains = BTreeMap::new();
    let mut elems = BTreeMap::new();
    let mut marks = BTreeSet::new();
    for (ip, e) in &desired.entries {
        if marks.insert(e.mark) {
            chains.insert(mark_chain(e.mark.value()), Some(mark_comment(e.mark)));
        }
        elems.insert(*ip, e.mark.value());
    }
    TableState {
        exists: true,
        base_ok: true,
        chains,
        elems,
    }
}

/// The statement of a mark chain's rule: `meta mark set 1000`, or with a narrower mask
/// `meta mark set meta mark & <!mask> | <value>` (the kernel gets the same bitwise expression as
/// from nft's JSON `{"|": [{"&": [meta mark, !mask]}, value]}`).
fn push_mark_stmt(out: &mut String, mark: Mark) {
    if mark.mask() == FULL_MASK {
        let _ = write!(out, "meta mark set {}", mark.value());
    } else {
        let _ = write!(
            out,
            "meta mark set meta mark & {:#x} | {:#x}",
            !mark.mask(),
            mark.value()
        );
    }
}

/// Append `ip` as nft reads it: IPv4 dotted quad written directly (no `fmt` per octet: this runs
/// once per element), IPv6 in its standard text form.
fn push_ip(out: &mut String, ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, o) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push('.');
                }
                if o >= 100 {
                    out.push(char::from(b'0' + o / 100));
                }
                if o >= 10 {
                    out.push(char::from(b'0' + o / 10 % 10));
                }
                out.push(char::from(b'0' + o % 10));
            }
        }
        IpAddr::V6(v6) => {
            let _ = write!(out, "{v6}");
        }
    }
}

/// One `<verb> element inet <table> <map> { e1, e2, … }` line; nothing when `items` is empty.
fn push_elements<T>(
    out: &mut String,
    verb: &str,
    table: &str,
    map: &str,
    items: &[T],
    mut item: impl FnMut(&mut String, &T),
) {
    if items.is_empty() {
        return;
    }
    let _ = write!(out, "{verb} element inet {table} {map} {{ ");
    for (i, it) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        item(out, it);
    }
    out.push_str(" }\n");
}

/// How a batch changes the table state, so the cache is updated in O(changes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    /// Sources whose element is deleted, sorted (IPv4 before IPv6).
    pub deleted: Vec<IpAddr>,
    /// Elements added (source, mark value), sorted by source (IPv4 before IPv6).
    pub added: Vec<(IpAddr, u32)>,
    /// Mark chains after the batch: name → rule comment.
    pub chains: BTreeMap<String, Option<String>>,
}

/// The commands that take `live` to `desired` in nft's text syntax (one command per line, for
/// `nft -f -`), what they do, and how they change the state. Order: table (re)creation when the
/// base is not ovnk's, mark chains written, element deletes, element adds (one command per map
/// and direction), chains no longer referenced deleted. `table` must pass [`validate_table_name`].
pub fn build_batch(
    table: &str,
    live: &TableState,
    desired: &Desired,
) -> (String, SyncStats, Delta) {
    debug_assert!(validate_table_name(table).is_ok(), "{table:?}");
    let mut delta = Delta::default();
    let mut stats = SyncStats::default();

    // one merge walk over both sorted maps: O(n) comparisons, O(changes) allocations
    let empty = TableState::default();
    let recreate = !(live.exists && live.base_ok);
    let base = if recreate { &empty } else { live };
    let mut lv = base.elems.iter().peekable();
    let mut dv = desired
        .entries
        .iter()
        .map(|(ip, e)| (ip, e.mark.value()))
        .peekable();
    loop {
        let (del_ip, add_el) = match (lv.peek(), dv.peek()) {
            (None, None) => break,
            (Some(&(l, _)), None) => {
                lv.next();
                (Some(*l), None)
            }
            (None, Some(&(d, v))) => {
                dv.next();
                (None, Some((*d, v)))
            }
            (Some(&(l, lval)), Some(&(d, v))) => match l.cmp(d) {
                std::cmp::Ordering::Less => {
                    lv.next();
                    (Some(*l), None)
                }
                std::cmp::Ordering::Greater => {
                    dv.next();
                    (None, Some((*d, v)))
                }
                std::cmp::Ordering::Equal => {
                    let changed = *lval != v;
                    lv.next();
                    dv.next();
                    if changed {
                        (Some(*l), Some((*d, v)))
                    } else {
                        (None, None)
                    }
                }
            },
        };
        if let Some(ip) = del_ip {
            delta.deleted.push(ip);
        }
        if let Some(el) = add_el {
            delta.added.push(el);
        }
    }
    // `IpAddr` orders every IPv4 address before every IPv6 one: each list splits in two.
    let del_split = delta.deleted.partition_point(IpAddr::is_ipv4);
    let add_split = delta.added.partition_point(|(ip, _)| ip.is_ipv4());
    let (del_v4, del_v6) = delta.deleted.split_at(del_split);
    let (add_v4, add_v6) = delta.added.split_at(add_split);

    // mark chains needed (distinct marks first: few, and no string per entry)
    let marks: BTreeSet<Mark> = desired.entries.values().map(|e| e.mark).collect();
    let needed: BTreeMap<String, Mark> = marks
        .into_iter()
        .map(|m| (mark_chain(m.value()), m))
        .collect();

    // one allocation: longest texts are 15 (IPv4) and 39 (IPv6) characters, ", " between
    // elements and ` : goto mark-<u32>` after an added one
    let per_table_cmd = 32 + table.len();
    let capacity = 8 * per_table_cmd
        + 256
        + (needed.len() + base.chains.len()) * (2 * per_table_cmd + 96)
        + del_v4.len() * 17
        + del_v6.len() * 41
        + add_v4.len() * (17 + 22)
        + add_v6.len() * (41 + 22);
    let mut out = String::with_capacity(capacity);

    if recreate {
        if live.exists {
            let _ = writeln!(out, "delete table inet {table}");
        }
        stats.recreated = true;
        let _ = writeln!(out, "add table inet {table}");
        for (name, ty) in [(MAP_V4, "ipv4_addr"), (MAP_V6, "ipv6_addr")] {
            let _ = writeln!(
                out,
                "add map inet {table} {name} {{ type {ty} : verdict; }}"
            );
        }
        let _ = writeln!(
            out,
            "add chain inet {table} {BASE_CHAIN} {{ type filter hook prerouting priority {PRIORITY}; policy accept; }}"
        );
        for (proto, map, comment) in [("ip", MAP_V4, COMMENT_V4), ("ip6", MAP_V6, COMMENT_V6)] {
            let _ = writeln!(
                out,
                "add rule inet {table} {BASE_CHAIN} {proto} saddr vmap @{map} comment \"{comment}\""
            );
        }
    }

    for (name, mark) in &needed {
        let comment = mark_comment(*mark);
        match base.chains.get(name) {
            Some(Some(c)) if *c == comment => {
                delta.chains.insert(name.clone(), Some(comment));
                continue;
            }
            Some(_) => {
                let _ = writeln!(out, "flush chain inet {table} {name}");
            }
            None => {
                let _ = writeln!(out, "add chain inet {table} {name}");
            }
        }
        let _ = write!(out, "add rule inet {table} {name} ");
        push_mark_stmt(&mut out, *mark);
        let _ = writeln!(out, " comment \"{comment}\"");
        delta.chains.insert(name.clone(), Some(comment));
        stats.chains_written += 1;
    }

    // element deletes, then adds, one command per map and direction
    for (map, ips) in [(MAP_V4, del_v4), (MAP_V6, del_v6)] {
        push_elements(&mut out, "delete", table, map, ips, push_ip);
        stats.elements_deleted += ips.len();
    }
    // ` : goto mark-<value>` written once per mark, not once per element
    let goto: BTreeMap<u32, String> = needed
        .iter()
        .map(|(name, m)| (m.value(), format!(" : goto {name}")))
        .collect();
    for (map, els) in [(MAP_V4, add_v4), (MAP_V6, add_v6)] {
        push_elements(&mut out, "add", table, map, els, |o, (ip, v)| {
            push_ip(o, ip);
            match goto.get(v) {
                Some(g) => o.push_str(g),
                None => {
                    let _ = write!(o, " : goto {}", mark_chain(*v));
                }
            }
        });
        stats.elements_added += els.len();
    }

    // chains no longer referenced
    for name in base.chains.keys() {
        if !needed.contains_key(name) {
            let _ = writeln!(out, "delete chain inet {table} {name}");
            stats.chains_deleted += 1;
        }
    }
    // every command is one line, and no name or comment holds a newline
    stats.commands = out.bytes().filter(|&b| b == b'\n').count();
    (out, stats, delta)
}

fn str_of<'a>(v: &'a Value, k: &str) -> Option<&'a str> {
    v.get(k).and_then(Value::as_str)
}

/// Parse `nft -j list table inet <t>` output into a [`TableState`].
pub fn parse_table(v: &Value) -> Result<TableState, NftError> {
    let items = v
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| NftError::Parse("no `nftables` array".into()))?;
    let mut st = TableState {
        exists: true,
        ..TableState::default()
    };
    let mut base_chain_ok = false;
    let mut maps_ok = BTreeSet::new();
    let mut foreign = false;
    let mut base_rules: Vec<Option<String>> = Vec::new();
    let mut chain_rules: BTreeMap<String, Vec<Option<String>>> = BTreeMap::new();
    for item in items {
        if let Some(c) = item.get("chain") {
            let name = str_of(c, "name").unwrap_or_default().to_string();
            if name == BASE_CHAIN {
                base_chain_ok = str_of(c, "type") == Some("filter")
                    && str_of(c, "hook") == Some("prerouting")
                    && c.get("prio").and_then(Value::as_i64) == Some(PRIORITY)
                    && str_of(c, "policy") == Some("accept");
            } else if name.starts_with("mark-") && c.get("hook").is_none() {
                chain_rules.entry(name).or_default();
            } else {
                foreign = true;
            }
        } else if let Some(r) = item.get("rule") {
            let chain = str_of(r, "chain").unwrap_or_default();
            let comment = str_of(r, "comment").map(str::to_string);
            if chain == BASE_CHAIN {
                base_rules.push(comment);
            } else {
                chain_rules
                    .entry(chain.to_string())
                    .or_default()
                    .push(comment);
            }
        } else if let Some(m) = item.get("map") {
            let name = str_of(m, "name").unwrap_or_default();
            let want_type = match name {
                MAP_V4 => "ipv4_addr",
                MAP_V6 => "ipv6_addr",
                _ => {
                    foreign = true;
                    continue;
                }
            };
            if str_of(m, "type") == Some(want_type) && str_of(m, "map") == Some("verdict") {
                maps_ok.insert(name.to_string());
            }
            for el in m
                .get("elem")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let pair = el.as_array();
                let key = pair.and_then(|p| p.first());
                let key = key
                    .and_then(|k| k.as_str().map(str::to_string))
                    .or_else(|| {
                        key.and_then(|k| k.pointer("/elem/val"))
                            .and_then(Value::as_str)
                            .map(str::to_string)
                    });
                let target = pair
                    .and_then(|p| p.get(1))
                    .and_then(|t| t.pointer("/goto/target"))
                    .and_then(Value::as_str);
                let value = target
                    .and_then(|t| t.strip_prefix("mark-"))
                    .and_then(|v| v.parse::<u32>().ok());
                match (key.and_then(|k| k.parse::<IpAddr>().ok()), value) {
                    (Some(ip), Some(v)) => {
                        st.elems.insert(ip, v);
                    }
                    // An element ovnk cannot have written: rebuild the table.
                    _ => foreign = true,
                }
            }
        } else if item.get("set").is_some()
            || item.get("flowtable").is_some()
            || item.get("counter").is_some()
            || item.get("quota").is_some()
            || item.get("ct helper").is_some()
            || item.get("limit").is_some()
        {
            foreign = true;
        }
    }
    for (name, rules) in chain_rules {
        let comment = match rules.as_slice() {
            [one] => one.clone(),
            _ => None,
        };
        st.chains.insert(name, comment);
    }
    st.base_ok = !foreign
        && base_chain_ok
        && maps_ok.len() == 2
        && base_rules == [Some(COMMENT_V4.to_string()), Some(COMMENT_V6.to_string())];
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mark::validate;
    use crate::plan::{Entry, ServiceKey};

    fn desired(items: &[(&str, i64)]) -> Desired {
        let mut d = Desired::default();
        for (ip, v) in items {
            d.entries.insert(
                ip.parse().expect("ip"),
                Entry {
                    mark: validate(*v, FULL_MASK).expect("mark"),
                    owner: ServiceKey::new("ns", "svc"),
                },
            );
        }
        d
    }

    fn desired_masked(items: &[(&str, i64, u32)]) -> Desired {
        let mut d = Desired::default();
        for (ip, v, mask) in items {
            d.entries.insert(
                ip.parse().expect("ip"),
                Entry {
                    mark: validate(*v, *mask).expect("mark"),
                    owner: ServiceKey::new("ns", "svc"),
                },
            );
        }
        d
    }

    fn lines(b: &str) -> Vec<&str> {
        b.lines().collect()
    }

    #[test]
    fn empty_table_is_created_whole() {
        let (b, s, _) = build_batch("t", &TableState::default(), &desired(&[("10.0.0.1", 1000)]));
        assert!(s.recreated);
        assert_eq!(s.elements_added, 1);
        assert_eq!(s.commands, 9, "{b}");
        assert_eq!(
            lines(&b),
            [
                "add table inet t",
                "add map inet t src-v4 { type ipv4_addr : verdict; }",
                "add map inet t src-v6 { type ipv6_addr : verdict; }",
                "add chain inet t prerouting { type filter hook prerouting priority -150; policy accept; }",
                "add rule inet t prerouting ip saddr vmap @src-v4 comment \"ovnk:v4\"",
                "add rule inet t prerouting ip6 saddr vmap @src-v6 comment \"ovnk:v6\"",
                "add chain inet t mark-1000",
                "add rule inet t mark-1000 meta mark set 1000 comment \"ovnk:0x3e8/0xffffffff\"",
                "add element inet t src-v4 { 10.0.0.1 : goto mark-1000 }",
            ]
        );
        assert!(b.ends_with('\n'), "{b}");
    }

    #[test]
    fn one_endpoint_change_is_one_delete_and_one_add() {
        let before = desired(&[("10.0.0.1", 1000), ("10.0.0.2", 1000), ("fd00::1", 1000)]);
        let after = desired(&[("10.0.0.1", 1000), ("10.0.0.3", 1000), ("fd00::1", 1000)]);
        let (b, s, d) = build_batch("t", &state_of(&before), &after);
        assert_eq!(
            (s.elements_added, s.elements_deleted, s.commands),
            (1, 1, 2),
            "{b}"
        );
        assert_eq!(
            b,
            "delete element inet t src-v4 { 10.0.0.2 }\n\
             add element inet t src-v4 { 10.0.0.3 : goto mark-1000 }\n"
        );
        assert_eq!(d.deleted, vec!["10.0.0.2".parse::<IpAddr>().expect("ip")]);
        assert_eq!(
            d.added,
            vec![("10.0.0.3".parse::<IpAddr>().expect("ip"), 1000)]
        );
        let (b, s, _) = build_batch("t", &state_of(&after), &after);
        assert!(b.is_empty() && s.commands == 0);
    }

    #[test]
    fn moving_an_ip_to_another_mark_and_dropping_a_chain() {
        let before = desired(&[("10.0.0.1", 1000)]);
        let after = desired(&[("10.0.0.1", 1001)]);
        let (b, s, _) = build_batch("t", &state_of(&before), &after);
        assert_eq!(
            (
                s.elements_added,
                s.elements_deleted,
                s.chains_written,
                s.chains_deleted
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(
            lines(&b),
            [
                "add chain inet t mark-1001",
                "add rule inet t mark-1001 meta mark set 1001 comment \"ovnk:0x3e9/0xffffffff\"",
                "delete element inet t src-v4 { 10.0.0.1 }",
                "add element inet t src-v4 { 10.0.0.1 : goto mark-1001 }",
                "delete chain inet t mark-1000",
            ]
        );
        assert_eq!(s.commands, 5);
    }

    #[test]
    fn mixed_v4_v6_batch_is_exactly_this_text() {
        // live: two v4 and two v6 sources on marks 1000 (full mask) and 1500, plus a stale chain
        let mut live = state_of(&desired(&[
            ("10.0.0.1", 1000),
            ("10.0.0.2", 1000),
            ("fd00::1", 1000),
            ("fd00::2", 1500),
        ]));
        live.chains
            .insert("mark-1999".into(), Some("ovnk:0x7cf/0xffffffff".into()));
        // desired: the node mask narrows to 0xffff (chain mark-1000 is rewritten), 10.0.0.2 and
        // fd00::2 leave, 10.0.0.3 and fd00::3 arrive, 10.0.0.1 moves to 1200; 1500 and 1999 go
        let after = desired_masked(&[
            ("10.0.0.1", 1200, 0xffff),
            ("10.0.0.3", 1000, 0xffff),
            ("fd00::1", 1000, 0xffff),
            ("fd00::3", 1200, 0xffff),
        ]);
        let (b, s, d) = build_batch("ovnk-fwmark", &live, &after);
        let golden = "\
flush chain inet ovnk-fwmark mark-1000
add rule inet ovnk-fwmark mark-1000 meta mark set meta mark & 0xffff0000 | 0x3e8 comment \"ovnk:0x3e8/0xffff\"
add chain inet ovnk-fwmark mark-1200
add rule inet ovnk-fwmark mark-1200 meta mark set meta mark & 0xffff0000 | 0x4b0 comment \"ovnk:0x4b0/0xffff\"
delete element inet ovnk-fwmark src-v4 { 10.0.0.1, 10.0.0.2 }
delete element inet ovnk-fwmark src-v6 { fd00::2 }
add element inet ovnk-fwmark src-v4 { 10.0.0.1 : goto mark-1200, 10.0.0.3 : goto mark-1000 }
add element inet ovnk-fwmark src-v6 { fd00::3 : goto mark-1200 }
delete chain inet ovnk-fwmark mark-1500
delete chain inet ovnk-fwmark mark-1999
";
        assert_eq!(b, golden);
        assert_eq!(
            s,
            SyncStats {
                recreated: false,
                elements_added: 3,
                elements_deleted: 3,
                chains_written: 2,
                chains_deleted: 2,
                commands: 10,
            }
        );
        let ip = |s: &str| s.parse::<IpAddr>().expect("ip");
        assert_eq!(d.deleted, [ip("10.0.0.1"), ip("10.0.0.2"), ip("fd00::2")]);
        assert_eq!(
            d.added,
            [
                (ip("10.0.0.1"), 1200),
                (ip("10.0.0.3"), 1000),
                (ip("fd00::3"), 1200)
            ]
        );
        assert_eq!(d.chains, state_of(&after).chains);

        // the same desired state over a table that is not ovnk's: deleted and made anew, whole
        let foreign = TableState {
            exists: true,
            base_ok: false,
            ..live
        };
        let (b, s, _) = build_batch("ovnk-fwmark", &foreign, &after);
        let golden = "\
delete table inet ovnk-fwmark
add table inet ovnk-fwmark
add map inet ovnk-fwmark src-v4 { type ipv4_addr : verdict; }
add map inet ovnk-fwmark src-v6 { type ipv6_addr : verdict; }
add chain inet ovnk-fwmark prerouting { type filter hook prerouting priority -150; policy accept; }
add rule inet ovnk-fwmark prerouting ip saddr vmap @src-v4 comment \"ovnk:v4\"
add rule inet ovnk-fwmark prerouting ip6 saddr vmap @src-v6 comment \"ovnk:v6\"
add chain inet ovnk-fwmark mark-1000
add rule inet ovnk-fwmark mark-1000 meta mark set meta mark & 0xffff0000 | 0x3e8 comment \"ovnk:0x3e8/0xffff\"
add chain inet ovnk-fwmark mark-1200
add rule inet ovnk-fwmark mark-1200 meta mark set meta mark & 0xffff0000 | 0x4b0 comment \"ovnk:0x4b0/0xffff\"
add element inet ovnk-fwmark src-v4 { 10.0.0.1 : goto mark-1200, 10.0.0.3 : goto mark-1000 }
add element inet ovnk-fwmark src-v6 { fd00::1 : goto mark-1000, fd00::3 : goto mark-1200 }
";
        assert_eq!(b, golden);
        assert!(s.recreated);
        assert_eq!(
            (
                s.elements_added,
                s.elements_deleted,
                s.chains_written,
                s.chains_deleted,
                s.commands
            ),
            (4, 0, 2, 0, 13)
        );
    }

    #[test]
    fn ip_text_is_the_standard_form() {
        let mut probes: Vec<IpAddr> = ["0.0.0.0", "255.255.255.255", "10.0.100.9", "1.20.0.200"]
            .iter()
            .map(|s| s.parse().expect("ip"))
            .collect();
        // every octet value in every position, and a spread of whole addresses
        probes
            .extend((0..=255u32).map(|o| IpAddr::from(std::net::Ipv4Addr::from(o * 0x0101_0101))));
        probes.extend(
            (0..u32::MAX)
                .step_by(7_919_999)
                .map(|a| IpAddr::from(std::net::Ipv4Addr::from(a))),
        );
        probes.extend(
            ["fd00::1", "::", "::ffff:10.0.0.1", "2001:db8:0:1:2:3:4:5"]
                .iter()
                .map(|s| s.parse::<IpAddr>().expect("ip")),
        );
        for ip in probes {
            let mut out = String::new();
            push_ip(&mut out, &ip);
            assert_eq!(out, ip.to_string());
        }
    }

    #[test]
    fn table_names_must_be_plain_identifiers() {
        for ok in [
            "ovnk-fwmark",
            "t",
            "_x",
            "a.b",
            "A_b-9.z",
            &"n".repeat(TABLE_NAME_MAX),
        ] {
            assert!(validate_table_name(ok).is_ok(), "{ok:?}");
        }
        for (bad, why) in [
            ("", "empty"),
            ("1abc", "must start with"),
            ("-x", "must start with"),
            (".x", "must start with"),
            ("a b", "' ' is not allowed"),
            ("a\"b", "'\"' is not allowed"),
            ("a;b", "';' is not allowed"),
            ("a\nadd table inet b", "'\\n' is not allowed"),
            ("a/b", "'/' is not allowed"),
            ("a:b", "':' is not allowed"),
            ("a$b", "'$' is not allowed"),
            ("tablé", "'é' is not allowed"),
        ] {
            let err = validate_table_name(bad).expect_err(bad).to_string();
            assert!(
                err.contains(&format!("{bad:?}")) && err.contains(why),
                "{bad:?}: {err}"
            );
        }
        let long = "n".repeat(TABLE_NAME_MAX + 1);
        let err = validate_table_name(&long)
            .expect_err("too long")
            .to_string();
        assert!(err.contains("256 characters, at most 255"), "{err}");
    }

    #[test]
    fn parse_roundtrip_of_listing() {
        let listing = serde_json::json!({"nftables": [
            {"metainfo": {"version": "1.0.6"}},
            {"table": {"family": "inet", "name": "t", "handle": 1}},
            {"map": {"family": "inet", "name": "src-v4", "table": "t", "type": "ipv4_addr",
                     "map": "verdict", "elem": [["10.0.0.1", {"goto": {"target": "mark-1000"}}]]}},
            {"map": {"family": "inet", "name": "src-v6", "table": "t", "type": "ipv6_addr",
                     "map": "verdict"}},
            {"chain": {"family": "inet", "table": "t", "name": "mark-1000"}},
            {"chain": {"family": "inet", "table": "t", "name": "prerouting", "type": "filter",
                       "hook": "prerouting", "prio": -150, "policy": "accept"}},
            {"rule": {"chain": "mark-1000", "comment": "ovnk:0x3e8/0xffffffff", "expr": []}},
            {"rule": {"chain": "prerouting", "comment": "ovnk:v4", "expr": []}},
            {"rule": {"chain": "prerouting", "comment": "ovnk:v6", "expr": []}}
        ]});
        let st = parse_table(&listing).expect("parses");
        assert!(st.base_ok);
        assert_eq!(st, state_of(&desired(&[("10.0.0.1", 1000)])));
    }
}
