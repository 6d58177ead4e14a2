//! `ovnk-bench sandbox`: time for `ovnk sandbox up --nodes N` to ready, the time from a Pod
//! create to that pod answering a TCP connect from a pod on another node (p50 over 20 pods),
//! and the memory of one node's whole stack (OVN daemons, ovs-vswitchd, node agent).
//!
//! Targets (issue 4): up ≤ 10 s for 10 nodes; pod reachable p50 ≤ 1 s.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

/// Arguments.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Nodes in the sandbox.
    #[arg(long, default_value_t = 10)]
    nodes: u32,
    /// Pods created one after another for the reachability figure.
    #[arg(long, default_value_t = 20)]
    pods: u32,
    /// The `ovnk` binary (default: next to this one).
    #[arg(long)]
    ovnk: Option<PathBuf>,
    /// Keep the sandbox directory (default: a temp dir, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let ovnk = match a.ovnk.clone() {
        Some(p) => p,
        None => std::env::current_exe()?
            .parent()
            .context("bench binary has no directory")?
            .join("ovnk"),
    };
    anyhow::ensure!(
        ovnk.exists(),
        "{} not found: build it (cargo build --release -p ovnk) or pass --ovnk",
        ovnk.display()
    );
    let tmp = tempfile::Builder::new()
        .prefix("ovnk-bench-sbx-")
        .tempdir()?;
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    let d = dir.to_string_lossy().into_owned();

    println!("sandbox up --nodes {} …", a.nodes);
    let t0 = Instant::now();
    let out = Command::new(&ovnk)
        .args([
            "sandbox",
            "up",
            "--dir",
            &d,
            "--nodes",
            &a.nodes.to_string(),
            "--quiet",
        ])
        .output()?;
    let up_s = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "sandbox up failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    println!("  ready in {up_s:.2} s (target ≤ 10 s)");

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(measure(&dir, &a));
    let down = Command::new(&ovnk)
        .args(["sandbox", "down", "--dir", &d])
        .output()?;
    if !down.status.success() {
        eprintln!("sandbox down: {}", String::from_utf8_lossy(&down.stderr));
    }
    let (p50, p90, mem) = result?;
    println!(
        "  pod create → reachable from another node: p50 {p50:.3} s, p90 {p90:.3} s over {} pods (target p50 ≤ 1 s)",
        a.pods
    );
    println!(
        "  per-node memory (OVN daemons + ovs-vswitchd + agent): {:.1} MiB RSS, {:.1} MiB PSS",
        mem.0, mem.1
    );
    println!(
        "{}",
        serde_json::json!({
            "bench": "sandbox",
            "nodes": a.nodes,
            "up_s": up_s,
            "pod_reachable_p50_s": p50,
            "pod_reachable_p90_s": p90,
            "pods": a.pods,
            "node_rss_mib": mem.0,
            "node_pss_mib": mem.1,
        })
    );
    Ok(())
}

async fn measure(dir: &std::path::Path, a: &Args) -> anyhow::Result<(f64, f64, (f64, f64))> {
    let st = sandbox::state::SandboxState::load(dir)?;
    let client = sandbox::report::admin_client(&st.layout).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    // the source: a pod on node1
    let src = make_pod("bench-src", "node1")?;
    pods.create(&PostParams::default(), &src).await?;
    let src_ns = wait_running(&pods, "bench-src", &st).await?.1;

    let mut times = Vec::new();
    for i in 0..a.pods {
        // targets on every node but node1, round robin
        let node = format!("node{}", 2 + i % a.nodes.saturating_sub(1).max(1));
        let name = format!("bench-{i}");
        let t0 = Instant::now();
        pods.create(&PostParams::default(), &make_pod(&name, &node)?)
            .await?;
        let ip = wait_ip(&pods, &name).await?;
        loop {
            let r = sandbox::probe::probe_from(
                &src_ns,
                &[ip],
                sandbox::layout::PROBE_PORT,
                false,
                Duration::from_millis(100),
            )
            .await?;
            if r.first().is_some_and(|p| p.tcp) {
                break;
            }
            if t0.elapsed() > Duration::from_secs(30) {
                bail!("pod {name} never became reachable");
            }
        }
        times.push(t0.elapsed().as_secs_f64());
    }
    times.sort_by(|x, y| x.total_cmp(y));
    let p50 = times[times.len() / 2];
    let p90 = times[(times.len() * 9 / 10).min(times.len() - 1)];
    Ok((p50, p90, node_memory(&st.layout.pid_dir(), a.nodes)))
}

fn make_pod(name: &str, node: &str) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "sandbox/probe"}]},
    }))?)
}

async fn wait_ip(pods: &Api<Pod>, name: &str) -> anyhow::Result<IpAddr> {
    // the address is known as soon as the node agent has annotated the pod
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = pods.get(name).await?;
        if let Some(v) = p
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k8s_api::annotations::POD_NETWORKS))
            && let Ok(m) = k8s_api::annotations::parse_pod_networks(v)
            && let Some(ip) = m.get("default").and_then(|n| n.ip_addresses.first())
        {
            return Ok(ip.addr());
        }
        if Instant::now() > deadline {
            bail!("pod {name} got no address");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_running(
    pods: &Api<Pod>,
    name: &str,
    st: &sandbox::state::SandboxState,
) -> anyhow::Result<(IpAddr, String)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = pods.get(name).await?;
        let ip = p
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|s| s.parse().ok());
        if let Some(ip) = ip {
            let uid = p.metadata.uid.unwrap_or_default();
            return Ok((ip, st.layout.pod_netns(&uid)));
        }
        if Instant::now() > deadline {
            bail!("pod {name} not running after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Average RSS and PSS (MiB) of node1…nodeN's processes (`DIR/pids/nodeK-*.pid`).
fn node_memory(pid_dir: &std::path::Path, nodes: u32) -> (f64, f64) {
    let mut rss = 0u64;
    let mut pss = 0u64;
    if let Ok(rd) = std::fs::read_dir(pid_dir) {
        for e in rd.filter_map(|e| e.ok()) {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("node") {
                continue;
            }
            let Some(pid) = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) else {
                continue;
            };
            for line in text.lines() {
                let mut it = line.split_whitespace();
                let (Some(k), Some(v)) = (it.next(), it.next()) else {
                    continue;
                };
                let v: u64 = v.parse().unwrap_or(0);
                match k {
                    "Rss:" => rss += v,
                    "Pss:" => pss += v,
                    _ => {}
                }
            }
        }
    }
    let n = f64::from(nodes.max(1));
    (rss as f64 / 1024.0 / n, pss as f64 / 1024.0 / n)
}
