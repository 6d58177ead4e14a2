//! `ovnk-bench zones` (issue 5), the node side: 5,000 nodes and 100 TrustZones with random
//! labels (seeded), some nodes also in annotation zones and some in none.
//!
//! - `plan_ms`: one node's full plan (`node::plan::plan`), node zones from an up-to-date
//!   `zones::ZoneIndex`; median over many runs.
//! - `index_update_ms`: one label change applied to the index; median.
//! - `ops_per_label_change` vs `minimal_ops_per_label_change`: the OVSDB operations the node's
//!   apply layer produces on an affected node (real ovsdb-servers) for one label change that
//!   disconnects a peer plus one that reconnects it, against the number of rows that must
//!   change, counted independently from the two desired row sets.
//!
//! [`figures`] returns the figures as a JSON map so that the sandbox part of the benchmark
//! (convergence, tunnel counts) can add its keys to the same final line.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use node::apply::{nb_txn, sb_txn};
use node::plan::{Desired, LocalNode, plan};
use node::snapshot::{NodeInfo, Snapshot};
use ovsdb::{Client, Db};
use ovsdb_harness::{OvsdbServer, Schema};
use serde_json::{Map, Value, json};
use zones::ZoneIndex;

/// Flags of `ovnk-bench zones`.
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// Nodes in the cluster.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// TrustZones.
    #[arg(long, default_value_t = 100)]
    pub zones: usize,
    /// Runs per timing (the median is reported).
    #[arg(long, default_value_t = 300)]
    pub runs: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 5)]
    pub seed: u64,
    /// Nodes of the sandbox used for the convergence figure.
    #[arg(long, default_value_t = 10)]
    pub sandbox_nodes: u32,
    /// Label changes timed in the sandbox.
    #[arg(long, default_value_t = 20)]
    pub changes: u32,
    /// Skip the sandbox part (it needs root and the OVN packages).
    #[arg(long)]
    pub skip_sandbox: bool,
    /// The `ovnk` binary (default: next to this one).
    #[arg(long)]
    pub ovnk: Option<std::path::PathBuf>,
}

/// splitmix64: a small deterministic RNG (no dependency needed for a benchmark's labels).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n.max(1) as u64).unwrap_or(0)
    }
}

/// The generated cluster: labels and annotation zones per node, selectors per TrustZone.
struct Cluster {
    labels: Vec<BTreeMap<String, String>>,
    annotated: Vec<BTreeSet<String>>,
    selectors: Vec<LabelSelector>,
    tenants: usize,
}

fn name(i: usize) -> String {
    format!("node{i}")
}

fn generate(a: &Args) -> Cluster {
    let mut rng = Rng(a.seed);
    // 80% of the TrustZones are one tenant each; the rest select a tier or two racks within a
    // random tenant (overlapping zones: those nodes are in two).
    let tenants = (a.zones * 4 / 5).max(1);
    let mut labels = Vec::with_capacity(a.nodes);
    let mut annotated = Vec::with_capacity(a.nodes);
    for _ in 0..a.nodes {
        let mut l = BTreeMap::new();
        // 3% carry no tenant label (zone-less unless annotated)
        if rng.below(100) >= 3 {
            l.insert("tenant".to_owned(), format!("t{}", rng.below(tenants)));
        }
        l.insert("rack".to_owned(), format!("r{}", rng.below(40)));
        l.insert(
            "tier".to_owned(),
            ["web", "db", "batch"][rng.below(3)].to_owned(),
        );
        labels.push(l);
        // 5% are gateways, also in an annotation zone
        let mut z = BTreeSet::new();
        if rng.below(100) < 5 {
            z.insert(format!("gw-{}", rng.below(10)));
        }
        annotated.push(z);
    }
    let selectors = (0..a.zones)
        .map(|i| {
            let by = |k: &str, v: String| BTreeMap::from([(k.to_owned(), v)]);
            let tenant = if i < tenants { i } else { rng.below(tenants) };
            match (i < tenants, rng.below(2)) {
                (true, _) => LabelSelector {
                    match_labels: Some(by("tenant", format!("t{tenant}"))),
                    ..Default::default()
                },
                (false, 0) => LabelSelector {
                    match_labels: Some(by("tier", ["web", "db", "batch"][rng.below(3)].into())),
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "tenant".into(),
                        operator: "In".into(),
                        values: Some(vec![format!("t{tenant}")]),
                    }]),
                },
                (false, _) => LabelSelector {
                    match_labels: Some(by("tenant", format!("t{tenant}"))),
                    match_expressions: Some(vec![LabelSelectorRequirement {
                        key: "rack".into(),
                        operator: "In".into(),
                        values: Some(vec![
                            format!("r{}", rng.below(40)),
                            format!("r{}", rng.below(40)),
                        ]),
                    }]),
                },
            }
        })
        .collect();
    Cluster {
        labels,
        annotated,
        selectors,
        tenants,
    }
}

fn build_index(c: &Cluster) -> Result<ZoneIndex> {
    let mut ix = ZoneIndex::new();
    for (i, s) in c.selectors.iter().enumerate() {
        ix.upsert_trust_zone(&format!("tz{i}"), s.clone())
            .map_err(|e| anyhow::anyhow!("generated selector: {e}"))?;
    }
    for i in 0..c.labels.len() {
        ix.upsert_node(&name(i), c.labels[i].clone(), c.annotated[i].clone());
    }
    Ok(ix)
}

/// A node with every annotation the plan needs; addresses derived from its index.
fn node_info(i: usize, zones: BTreeSet<String>) -> NodeInfo {
    let id = u32::try_from(i + 1).unwrap_or(u32::MAX);
    let [_, b, c, d] = id.to_be_bytes();
    let encap = IpAddr::V4(Ipv4Addr::new(172, 16 + b, c, d));
    NodeInfo {
        name: name(i),
        id: Some(id),
        subnet: format!("10.{c}.{d}.0/24").parse().ok(),
        transit: format!("100.88.{c}.{d}/16").parse().ok(),
        join: format!("100.64.{c}.{d}/16").parse().ok(),
        chassis_id: Some(format!("ch-{i}")),
        encap_ips: vec![encap],
        zones,
        internal_ip: Some(encap),
        errors: Vec::new(),
    }
}

fn snapshot(ix: &ZoneIndex, n: usize) -> Snapshot {
    Snapshot {
        nodes: (0..n)
            .map(|i| {
                let z = ix.zones_of(&name(i)).cloned().unwrap_or_default();
                (name(i), node_info(i, z))
            })
            .collect(),
        pods: Vec::new(),
    }
}

fn local(i: usize) -> LocalNode {
    LocalNode {
        name: name(i),
        system_id: format!("ch-{i}"),
        encap_ip: None,
        primary_ifaddr: None,
        gateway_interface: Some("br-phy".into()),
        mtu: 1400,
        cluster_cidr: "10.0.0.0/8".parse().unwrap_or_default(),
        transit_cidr: "100.88.0.0/16".parse().unwrap_or_default(),
        join_cidr: "100.64.0.0/16".parse().unwrap_or_default(),
        enforcement: Default::default(),
    }
}

fn median_ms(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v.get(v.len() / 2)
        .map(|d| d.as_secs_f64() * 1e3)
        .unwrap_or(f64::NAN)
}

/// The minimal number of OVSDB rows that change between two desired states, counted from
/// the row sets alone: every inserted or changed child row is one row; a parent whose set of
/// children changes is one row (its reference column, which also garbage-collects removed
/// children); a removed root row (SB Chassis) is one row, its Encaps going with it; an
/// inserted Chassis is one row plus one per Encap. Port_Binding rows (made by northd, bound
/// by a later reconcile) are not part of either count.
pub fn minimal_rows_changed(a: &Desired, b: &Desired) -> usize {
    fn children<K: Ord, V: PartialEq>(x: &BTreeMap<K, V>, y: &BTreeMap<K, V>) -> usize {
        let inserted_or_changed = y
            .iter()
            .filter(|(k, v)| x.get(k).is_none_or(|old| old != *v))
            .count();
        let parent = usize::from(!x.keys().eq(y.keys()));
        inserted_or_changed + parent
    }
    let mut n = 0;
    if let (Some(na), Some(nb)) = (&a.nb, &b.nb) {
        for sw in &nb.switches {
            let old = na.switches.iter().find(|s| s.name == sw.name);
            let x: BTreeMap<_, _> = old
                .map(|s| s.ports.iter().map(|p| (&p.name, p)).collect())
                .unwrap_or_default();
            let y: BTreeMap<_, _> = sw.ports.iter().map(|p| (&p.name, p)).collect();
            n += children(&x, &y);
        }
        let key = |r: &node::plan::Route| (r.ip_prefix.clone(), r.nexthop.clone());
        let x: BTreeMap<_, _> = na.router.routes.iter().map(|r| (key(r), r)).collect();
        let y: BTreeMap<_, _> = nb.router.routes.iter().map(|r| (key(r), r)).collect();
        n += children(&x, &y);
        let x: BTreeMap<_, _> = na.router.ports.iter().map(|p| (&p.name, p)).collect();
        let y: BTreeMap<_, _> = nb.router.ports.iter().map(|p| (&p.name, p)).collect();
        n += children(&x, &y);
    }
    if let (Some(sa), Some(sb)) = (&a.sb, &b.sb) {
        let x: BTreeMap<_, _> = sa.chassis.iter().map(|c| (&c.name, c)).collect();
        let y: BTreeMap<_, _> = sb.chassis.iter().map(|c| (&c.name, c)).collect();
        for (k, c) in &y {
            match x.get(k) {
                None => n += 1 + c.encap_ips.len(),
                Some(old) if old.encap_ips != c.encap_ips => n += 1 + c.encap_ips.len(),
                Some(old) if old != c => n += 1,
                Some(_) => {}
            }
        }
        n += x.keys().filter(|k| !y.contains_key(*k)).count();
    }
    let ovs = |d: &Desired| d.ovs.external_ids.clone();
    n += usize::from(ovs(a) != ovs(b));
    n
}

struct Dbs {
    nb: (Client, Arc<Db>),
    sb: (Client, Arc<Db>),
    _servers: (OvsdbServer, OvsdbServer),
}

async fn replica(srv: &OvsdbServer) -> Result<(Client, Arc<Db>)> {
    let c = Client::connect(&srv.endpoint(), ovsdb::ClientOptions::default()).await?;
    let needs = if srv.db_name() == ovn_model::NB_DB {
        ovn_model::nb_needs()
    } else {
        ovn_model::sb_needs()
    };
    let db = ovn_model::connect_db(&c, srv.db_name(), &needs).await?;
    db.wait_synced().await;
    Ok((c, db))
}

impl Dbs {
    async fn start() -> Result<Self> {
        let nb = OvsdbServer::start(Schema::Northbound).context("NB ovsdb-server")?;
        let sb = OvsdbServer::start(Schema::Southbound).context("SB ovsdb-server")?;
        Ok(Dbs {
            nb: replica(&nb).await?,
            sb: replica(&sb).await?,
            _servers: (nb, sb),
        })
    }

    /// Applies `d` (one transaction per database) and returns the number of operations sent.
    async fn apply(&self, d: &Desired, node: &str) -> Result<usize> {
        let (Some(nbd), Some(sbd)) = (&d.nb, &d.sb) else {
            anyhow::bail!("plan has no NB/SB part");
        };
        let t = nb_txn(nbd, &self.nb.1.cache());
        let (s, _) = sb_txn(sbd, &self.sb.1.cache(), node);
        let ops = t.len() + s.len();
        for (txn, (client, db)) in [(&t, &self.nb), (&s, &self.sb)] {
            if txn.is_empty() {
                continue;
            }
            client.transact(txn).await?;
            let which = txn.db() == ovn_model::NB_DB;
            let done = |c: &ovsdb::DbCache| {
                if which {
                    nb_txn(nbd, c).is_empty()
                } else {
                    sb_txn(sbd, c, node).0.is_empty()
                }
            };
            if tokio::time::timeout(Duration::from_secs(30), db.wait_until(done))
                .await
                .is_err()
            {
                let c = db.cache();
                let left = if which {
                    nb_txn(nbd, &c)
                } else {
                    sb_txn(sbd, &c, node).0
                };
                let first: Vec<String> = left
                    .ops()
                    .iter()
                    .take(3)
                    .map(|o| o.summary.clone())
                    .collect();
                anyhow::bail!(
                    "the {} replica did not catch up: still {} ops, e.g. {first:?}",
                    txn.db(),
                    left.len()
                );
            }
        }
        Ok(ops)
    }
}

/// The figures of the node side of `ovnk-bench zones`.
pub async fn figures(a: &Args) -> Result<Map<String, Value>> {
    let c = generate(a);
    let t = Instant::now();
    let mut ix = build_index(&c)?;
    let build_ms = t.elapsed().as_secs_f64() * 1e3;
    let zoneless = (0..a.nodes)
        .filter(|i| ix.zones_of(&name(*i)).is_some_and(BTreeSet::is_empty))
        .count();
    println!(
        "zones: {} nodes, {} TrustZones, {zoneless} zone-less nodes; index built in {build_ms:.1} ms",
        a.nodes, a.zones
    );

    // The local node L: the first node with exactly one TrustZone and no annotation zone; a
    // peer P of L in that zone, also in no other zone.
    let one_zone = |i: usize| {
        c.annotated[i].is_empty() && ix.trust_zones_of(&name(i)).is_some_and(|z| z.len() == 1)
    };
    let l = (0..a.nodes)
        .find(|i| one_zone(*i))
        .context("no node with exactly one zone")?;
    let lz = ix.zones_of(&name(l)).cloned().unwrap_or_default();
    let p = (0..a.nodes)
        .find(|i| *i != l && one_zone(*i) && ix.zones_of(&name(*i)) == Some(&lz))
        .context("no peer in the local node's zone")?;

    // ---- plan_ms
    let snap = snapshot(&ix, a.nodes);
    let me = local(l);
    let d0 = plan(&snap, &me);
    let mut samples = Vec::with_capacity(a.runs);
    for _ in 0..a.runs {
        let t = Instant::now();
        let d = plan(&snap, &me);
        samples.push(t.elapsed());
        std::hint::black_box(d);
    }
    let plan_ms = median_ms(samples);
    println!(
        "plan: node{l} in {lz:?} connects to {} of {} nodes; median {plan_ms:.3} ms over {} runs (target <= 2 ms)",
        d0.remotes.len(),
        a.nodes,
        a.runs
    );

    // ---- index_update_ms: P's tenant label flips between two values, one change at a time
    let original = c.labels[p].clone();
    let mut other = original.clone();
    let away = (0..c.tenants)
        .map(|t| format!("t{t}"))
        .find(|t| {
            let mut probe = ix.clone();
            let mut l2 = original.clone();
            l2.insert("tenant".into(), t.clone());
            probe.upsert_node(&name(p), l2, BTreeSet::new());
            probe
                .zones_of(&name(p))
                .is_some_and(|z| !z.is_empty() && z.is_disjoint(&lz))
        })
        .context("no tenant value that disconnects the peer")?;
    other.insert("tenant".into(), away.clone());
    let mut samples = Vec::with_capacity(a.runs);
    for k in 0..a.runs {
        let labels = if k % 2 == 0 { &other } else { &original };
        let labels = labels.clone();
        let t = Instant::now();
        ix.upsert_node(&name(p), labels, BTreeSet::new());
        samples.push(t.elapsed());
    }
    ix.upsert_node(&name(p), original.clone(), BTreeSet::new());
    let index_update_ms = median_ms(samples);
    println!("index: one label change applied in median {index_update_ms:.4} ms (target <= 1 ms)");

    // ---- ops per label change, on L, against real ovsdb-servers
    let dbs = Dbs::start().await?;
    let initial = dbs.apply(&d0, &name(l)).await?;
    println!("apply: node{l}'s initial state is {initial} operations");
    anyhow::ensure!(
        dbs.apply(&d0, &name(l)).await? == 0,
        "a second apply of the same plan is not empty"
    );
    let plan_after = |ix: &ZoneIndex| {
        let mut s = snap.clone();
        if let Some(n) = s.nodes.get_mut(&name(p)) {
            n.zones = ix.zones_of(&name(p)).cloned().unwrap_or_default();
        }
        plan(&s, &me)
    };
    ix.upsert_node(&name(p), other, BTreeSet::new());
    let d1 = plan_after(&ix);
    anyhow::ensure!(
        !d1.remotes.contains(&name(p)),
        "the label change did not disconnect the peer"
    );
    // a peer's label change leaves this node's own OVS settings alone (no OVS operation)
    anyhow::ensure!(d0.ovs == d1.ovs, "the local OVS settings changed");
    let disconnect = dbs.apply(&d1, &name(l)).await?;
    let min_disconnect = minimal_rows_changed(&d0, &d1);
    ix.upsert_node(&name(p), original, BTreeSet::new());
    let d2 = plan_after(&ix);
    let connect = dbs.apply(&d2, &name(l)).await?;
    let min_connect = minimal_rows_changed(&d1, &d2);
    println!(
        "label change on node{p} (peer of node{l}): disconnect {disconnect} ops (minimal {min_disconnect}), \
         reconnect {connect} ops (minimal {min_connect})"
    );

    let mut m = Map::new();
    m.insert("nodes".into(), json!(a.nodes));
    m.insert("trust_zones".into(), json!(a.zones));
    m.insert("plan_ms".into(), json!(round(plan_ms)));
    m.insert("plan_remotes".into(), json!(d0.remotes.len()));
    m.insert("index_update_ms".into(), json!(round(index_update_ms)));
    m.insert("ops_per_label_change".into(), json!(disconnect + connect));
    m.insert(
        "minimal_ops_per_label_change".into(),
        json!(min_disconnect + min_connect),
    );
    m.insert("ops_disconnect".into(), json!(disconnect));
    m.insert("ops_connect".into(), json!(connect));
    Ok(m)
}

fn round(v: f64) -> f64 {
    (v * 10_000.0).round() / 10_000.0
}

/// `ovnk-bench zones`: prints the figures, the JSON line last.
pub fn run(a: Args) -> Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let mut m = rt.block_on(figures(&a))?;
    drop(rt);
    if !a.skip_sandbox {
        let ovnk = match &a.ovnk {
            Some(p) => p.clone(),
            None => std::env::current_exe()?
                .parent()
                .map(|d| d.join("ovnk"))
                .unwrap_or_default(),
        };
        crate::zones_sandbox::figures(&ovnk, a.sandbox_nodes, a.changes, &mut m)?;
    }
    println!("{}", Value::Object(m));
    Ok(())
}
