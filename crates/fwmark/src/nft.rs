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
//! masked mark from a map. Every sync is one `nft -j -f -` run, i.e. one kernel transaction.
//! After the first sync the backend diffs against what it last applied, so changing one
//! endpoint sends one element delete and/or add (O(1) in the number of entries). The first sync
//! (and any sync after an error or [`NftBackend::resync`]) reads the live table first and
//! removes whatever is stale.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

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
    /// A backend using `nft` found in `bin_dir` or `$PATH`; errors clearly when it is missing.
    pub fn new(runner: Runner, bin_dir: Option<&Path>, table: &str) -> Result<Self, NftError> {
        Ok(Self {
            nft: exec::find(Tool::Nft, bin_dir)?,
            runner,
            table: table.to_string(),
            cache: None,
        })
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
            let doc = json!({ "nftables": batch });
            let text = serde_json::to_vec(&doc).map_err(|e| NftError::Parse(e.to_string()))?;
            self.runner
                .run(&self.nft, &["-j", "-f", "-"], Some(&text))?;
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

fn mark_expr(mark: Mark) -> Value {
    let meta = json!({"meta": {"key": "mark"}});
    let value = if mark.mask() == FULL_MASK {
        json!(mark.value())
    } else {
        json!({"|": [{"&": [meta, !mark.mask()]}, mark.value()]})
    };
    json!({"mangle": {"key": {"meta": {"key": "mark"}}, "value": value}})
}

/// The commands that take `live` to `desired`.
/// How a batch changes the table state, so the cache is updated in O(changes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Delta {
    pub deleted: Vec<IpAddr>,
    pub added: Vec<(IpAddr, u32)>,
    /// Mark chains after the batch: name → rule comment.
    pub chains: BTreeMap<String, Option<String>>,
}

/// The commands that take `live` to `desired`, what they do, and how they change the state.
pub fn build_batch(
    table: &str,
    live: &TableState,
    desired: &Desired,
) -> (Vec<Value>, SyncStats, Delta) {
    let mut delta = Delta::default();
    let mut cmds: Vec<Value> = Vec::new();
    let mut stats = SyncStats::default();
    let empty = TableState::default();
    let live = if live.exists && live.base_ok {
        live
    } else {
        if live.exists {
            cmds.push(json!({"delete": {"table": {"family": "inet", "name": table}}}));
        }
        stats.recreated = true;
        cmds.push(json!({"add": {"table": {"family": "inet", "name": table}}}));
        for (name, ty) in [(MAP_V4, "ipv4_addr"), (MAP_V6, "ipv6_addr")] {
            cmds.push(
                json!({"add": {"map": {"family": "inet", "table": table, "name": name,
                "type": ty, "map": "verdict"}}}),
            );
        }
        cmds.push(
            json!({"add": {"chain": {"family": "inet", "table": table, "name": BASE_CHAIN,
            "type": "filter", "hook": "prerouting", "prio": PRIORITY, "policy": "accept"}}}),
        );
        for (proto, map, comment) in [("ip", MAP_V4, COMMENT_V4), ("ip6", MAP_V6, COMMENT_V6)] {
            cmds.push(
                json!({"add": {"rule": {"family": "inet", "table": table, "chain": BASE_CHAIN,
                "comment": comment,
                "expr": [{"vmap": {"key": {"payload": {"protocol": proto, "field": "saddr"}},
                                   "data": format!("@{map}")}}]}}}),
            );
        }
        &empty
    };

    // mark chains needed (distinct marks first: few, and no string per entry)
    let marks: BTreeSet<Mark> = desired.entries.values().map(|e| e.mark).collect();
    let needed: BTreeMap<String, Mark> = marks
        .into_iter()
        .map(|m| (mark_chain(m.value()), m))
        .collect();
    for (name, mark) in &needed {
        let comment = mark_comment(*mark);
        delta.chains.insert(name.clone(), Some(comment.clone()));
        let rule = json!({"add": {"rule": {"family": "inet", "table": table, "chain": name,
            "comment": comment, "expr": [mark_expr(*mark)]}}});
        match live.chains.get(name) {
            Some(Some(c)) if *c == comment => continue,
            Some(_) => cmds.push(
                json!({"flush": {"chain": {"family": "inet", "table": table, "name": name}}}),
            ),
            None => cmds
                .push(json!({"add": {"chain": {"family": "inet", "table": table, "name": name}}})),
        }
        cmds.push(rule);
        stats.chains_written += 1;
    }

    // element deletes, then adds, one command per map and direction
    let mut del: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    let mut add: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    // one merge walk over both sorted maps: O(n) comparisons, O(changes) allocations
    let mut lv = live.elems.iter().peekable();
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
            del[usize::from(ip.is_ipv6())].push(json!(ip.to_string()));
            delta.deleted.push(ip);
        }
        if let Some((ip, v)) = add_el {
            add[usize::from(ip.is_ipv6())]
                .push(json!([ip.to_string(), {"goto": {"target": mark_chain(v)}}]));
            delta.added.push((ip, v));
        }
    }
    for (i, map) in [MAP_V4, MAP_V6].into_iter().enumerate() {
        if !del[i].is_empty() {
            stats.elements_deleted += del[i].len();
            cmds.push(
                json!({"delete": {"element": {"family": "inet", "table": table,
                "name": map, "elem": std::mem::take(&mut del[i])}}}),
            );
        }
    }
    for (i, map) in [MAP_V4, MAP_V6].into_iter().enumerate() {
        if !add[i].is_empty() {
            stats.elements_added += add[i].len();
            cmds.push(json!({"add": {"element": {"family": "inet", "table": table,
                "name": map, "elem": std::mem::take(&mut add[i])}}}));
        }
    }

    // chains no longer referenced
    for name in live.chains.keys() {
        if !needed.contains_key(name) {
            cmds.push(
                json!({"delete": {"chain": {"family": "inet", "table": table, "name": name}}}),
            );
            stats.chains_deleted += 1;
        }
    }
    stats.commands = cmds.len();
    (cmds, stats, delta)
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

    #[test]
    fn empty_table_is_created_whole() {
        let (b, s, _) = build_batch("t", &TableState::default(), &desired(&[("10.0.0.1", 1000)]));
        assert!(s.recreated);
        assert_eq!(s.elements_added, 1);
        assert_eq!(b.len(), 9, "{b:#?}");
    }

    #[test]
    fn one_endpoint_change_is_one_delete_and_one_add() {
        let before = desired(&[("10.0.0.1", 1000), ("10.0.0.2", 1000), ("fd00::1", 1000)]);
        let after = desired(&[("10.0.0.1", 1000), ("10.0.0.3", 1000), ("fd00::1", 1000)]);
        let (b, s, d) = build_batch("t", &state_of(&before), &after);
        assert_eq!(
            (s.elements_added, s.elements_deleted, s.commands),
            (1, 1, 2),
            "{b:#?}"
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
        let (_, s, _) = build_batch("t", &state_of(&before), &after);
        assert_eq!(
            (
                s.elements_added,
                s.elements_deleted,
                s.chains_written,
                s.chains_deleted
            ),
            (1, 1, 1, 1)
        );
    }

    #[test]
    fn parse_roundtrip_of_listing() {
        let listing = json!({"nftables": [
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
