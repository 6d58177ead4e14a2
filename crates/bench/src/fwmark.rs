//! `ovnk-bench fwmark`: ServiceFWMark backends at 10,000 sources, all in one node namespace.
//!
//! 1. Program 10,000 sources from empty, then change one: nft vs iptables-restore vs one
//!    `iptables` command per rule (the naive way, bench only).
//! 2. nft one-source update at 10,000 entries vs at 100 entries.
//! 3. UDP packets/s forwarded through the node namespace holding 10,000 marked sources, nft map
//!    vs iptables chain (the probe source is the last rule of the chain).
//!
//! Needs root; creates its own namespaces and deletes them at the end.

use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use ::fwmark::backend::{Backend, BackendKind};
use ::fwmark::mark::{FULL_MASK, validate};
use ::fwmark::plan::{Desired, Entry, ServiceKey};
use ::fwmark::testbed::Topology;
use anyhow::{Context, bail};

const TABLE: &str = "ovnk-fwmark";
const MARK: i64 = 1000;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Number of marked sources.
    #[arg(long, default_value_t = 10_000)]
    entries: usize,
    /// Seconds of UDP traffic per packet-rate measurement.
    #[arg(long, default_value_t = 3)]
    pps_seconds: u64,
    /// Update repetitions averaged for the one-source update times.
    #[arg(long, default_value_t = 20)]
    updates: usize,
    /// Skip the naive one-`iptables`-per-rule programming (about half a minute).
    #[arg(long)]
    skip_per_rule: bool,
    /// Internal: send UDP from this source (runs inside the endpoint namespace).
    #[arg(long, hide = true, requires = "blast_dst")]
    blast_src: Option<IpAddr>,
    #[arg(long, hide = true)]
    blast_dst: Option<IpAddr>,
    #[arg(long, hide = true, default_value_t = 3000)]
    blast_ms: u64,
}

fn synthetic(i: usize) -> IpAddr {
    // 10.0.0.0/16 sorts before the endpoint 10.10.1.2, which therefore ends the chain.
    let i = u32::try_from(i + 1).unwrap_or(u32::MAX);
    IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | i))
}

fn desired(n: usize, endpoint: Option<IpAddr>) -> anyhow::Result<Desired> {
    let mark = validate(MARK, FULL_MASK)?;
    let owner = ServiceKey::new("default", "bench");
    let mut d = Desired::default();
    let synth = n - usize::from(endpoint.is_some());
    for i in 0..synth {
        d.entries.insert(
            synthetic(i),
            Entry {
                mark,
                owner: owner.clone(),
            },
        );
    }
    if let Some(ep) = endpoint {
        d.entries.insert(ep, Entry { mark, owner });
    }
    Ok(d)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Average time of `reps` one-source updates (swap one synthetic source for a new one and back).
fn one_update(backend: &mut Backend, base: &Desired, reps: usize) -> anyhow::Result<f64> {
    let owner = ServiceKey::new("default", "bench");
    let mark = validate(MARK, FULL_MASK)?;
    let mut total = Duration::ZERO;
    let victim = synthetic(0);
    for r in 0..reps {
        let mut d = base.clone();
        d.entries.remove(&victim);
        d.entries.insert(
            IpAddr::V4(Ipv4Addr::new(10, 5, (r / 250) as u8, (r % 250) as u8 + 1)),
            Entry {
                mark,
                owner: owner.clone(),
            },
        );
        let t = Instant::now();
        backend.sync(&d)?;
        total += t.elapsed();
        backend.sync(base)?; // back, untimed
    }
    Ok(ms(total) / reps.max(1) as f64)
}

fn pps(t: &Topology, seconds: u64) -> anyhow::Result<f64> {
    let exe = std::env::current_exe()?;
    let exe = exe.to_string_lossy().into_owned();
    let (_, before) = t.counts()?;
    let ms_s = (seconds * 1000).to_string();
    let start = Instant::now();
    let sent = t.ep.exec(
        &exe,
        &[
            "fwmark",
            "--blast-src",
            &t.plan.endpoint.to_string(),
            "--blast-dst",
            &t.plan.probe.to_string(),
            "--blast-ms",
            &ms_s,
        ],
        None,
    )?;
    let elapsed = start.elapsed().as_secs_f64();
    let (main, after) = t.counts()?;
    if main != 0 {
        bail!("{main} probe packets took the unmarked route");
    }
    let got = after - before;
    println!(
        "  sent {} datagrams, {got} arrived at the marked route's destination in {elapsed:.2}s",
        sent.trim()
    );
    Ok(got as f64 / seconds as f64)
}

fn per_rule(t: &Topology, d: &Desired) -> anyhow::Result<f64> {
    use ::fwmark::iptables::{CHAIN, desired_rules};
    let mut lines = String::new();
    for r in desired_rules(d, true) {
        lines.push_str(&format!("-A {CHAIN} {}\n", r.spec().join(" ")));
    }
    t.node
        .exec("iptables", &["-w", "-t", "mangle", "-N", CHAIN], None)?;
    t.node.exec(
        "iptables",
        &["-w", "-t", "mangle", "-I", "PREROUTING", "1", "-j", CHAIN],
        None,
    )?;
    let start = Instant::now();
    // one `iptables` process per rule, run directly inside the node namespace
    t.node.exec(
        "sh",
        &[
            "-c",
            "while read -r a; do iptables -w -t mangle $a || exit 1; done",
        ],
        Some(lines.as_bytes()),
    )?;
    Ok(ms(start.elapsed()))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if let (Some(src), Some(dst)) = (args.blast_src, args.blast_dst) {
        let n = ::fwmark::testbed::blast_udp(src, dst, Duration::from_millis(args.blast_ms))?;
        println!("{n}");
        return Ok(());
    }
    ::fwmark::testbed::require_root()?;
    if args.entries < 200 {
        bail!("--entries must be at least 200");
    }
    let t = Topology::build(false, MARK as u32).context("building namespaces")?;
    let runner = t.node.runner()?;
    let ep = t.plan.endpoint;
    let full = desired(args.entries, Some(ep))?;
    let small = desired(100, Some(ep))?;
    println!(
        "fwmark bench: {} sources, node netns {}",
        args.entries,
        t.node.name()
    );

    // nft: full program from empty, one-source update at N and at 100
    let mut nft = Backend::start(BackendKind::Nftables, runner.clone(), None, TABLE)?;
    let start = Instant::now();
    nft.sync(&full)?;
    let nft_full_ms = ms(start.elapsed());
    let nft_upd_big = one_update(&mut nft, &full, args.updates)?;
    println!(
        "nft: full program {nft_full_ms:.1} ms; one-source update at {}: {nft_upd_big:.2} ms",
        args.entries
    );
    println!("packet rate, nft map with {} sources:", args.entries);
    let pps_nft = pps(&t, args.pps_seconds)?;
    println!("  {pps_nft:.0} packets/s");
    let mut nft_small = Backend::start(BackendKind::Nftables, runner.clone(), None, TABLE)?;
    nft_small.sync(&small)?;
    let nft_upd_small = one_update(&mut nft_small, &small, args.updates)?;
    let ratio = nft_upd_big / nft_upd_small;
    println!(
        "nft: one-source update at 100: {nft_upd_small:.2} ms; ratio {}/100 = {ratio:.2}",
        args.entries
    );

    // iptables-restore: full program from empty (switching removes the nft table), update
    let mut ipt = Backend::start(BackendKind::Iptables, runner.clone(), None, TABLE)?;
    let start = Instant::now();
    ipt.sync(&full)?;
    let ipt_full_ms = ms(start.elapsed());
    let ipt_upd = one_update(&mut ipt, &full, args.updates.min(5))?;
    println!(
        "iptables-restore: full program {ipt_full_ms:.1} ms; one-source update {ipt_upd:.1} ms"
    );
    println!(
        "packet rate, iptables chain with {} rules (probe source last):",
        args.entries
    );
    let pps_ipt = pps(&t, args.pps_seconds)?;
    println!(
        "  {pps_ipt:.0} packets/s (nft/iptables = {:.1}x)",
        pps_nft / pps_ipt.max(1.0)
    );

    // naive: one iptables command per rule
    let per_rule_ms = if args.skip_per_rule {
        None
    } else {
        // start from empty: remove the restore-made chain first
        let _ = Backend::start(BackendKind::Nftables, runner.clone(), None, TABLE)?;
        let _ = t
            .node
            .exec("nft", &["delete", "table", "inet", TABLE], None);
        let v = per_rule(&t, &full)?;
        println!("iptables, one command per rule: full program {v:.0} ms");
        Some(v)
    };

    let json = serde_json::json!({
        "entries": args.entries,
        "nft_full_ms": nft_full_ms,
        "iptables_restore_full_ms": ipt_full_ms,
        "iptables_per_rule_full_ms": per_rule_ms,
        "nft_update_ms_at_entries": nft_upd_big,
        "nft_update_ms_at_100": nft_upd_small,
        "nft_update_ratio_10k_vs_100": ratio,
        "iptables_restore_update_ms": ipt_upd,
        "pps_nft": pps_nft,
        "pps_iptables": pps_ipt,
    });
    drop(t);
    println!("{json}");
    Ok(())
}
