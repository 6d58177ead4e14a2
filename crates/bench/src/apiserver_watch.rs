//! `ovnk-bench apiserver-watch`: watch fan-out of the embedded API server (a test component).
//! Creates N Nodes, opens W concurrent watchers (each its own client and TLS connection), applies
//! U label updates, and measures delivered events/s and the delivery latency (update issued →
//! event received by a watcher).

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Parameters.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Nodes created before watching.
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Concurrent watchers.
    #[arg(long, default_value_t = 20)]
    pub watchers: usize,
    /// Label updates.
    #[arg(long, default_value_t = 1000)]
    pub updates: usize,
    /// Updates in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
}

/// Run the bench; the last line printed is one JSON object.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(run_async(args))
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

async fn run_async(args: Args) -> anyhow::Result<()> {
    apiserver::install_crypto_provider();
    let server = apiserver::ApiServer::start(apiserver::ServerConfig::default()).await?;
    let admin = server.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let t0 = Instant::now();
    futures::stream::iter(0..args.nodes)
        .map(|i| {
            let nodes = nodes.clone();
            async move {
                let n: Node = serde_json::from_value(serde_json::json!({"metadata": {"name": format!("node-{i:05}"), "labels": {"bench": "0"}}}))?;
                nodes.create(&PostParams::default(), &n).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    println!(
        "created {} nodes in {:.2}s",
        args.nodes,
        t0.elapsed().as_secs_f64()
    );
    let rv = nodes
        .list(&ListParams::default().limit(1))
        .await?
        .metadata
        .resource_version
        .unwrap_or_default();

    // Update i is issued at sent[i]; watchers report (i, received-at).
    let sent: Arc<Vec<std::sync::Mutex<Option<Instant>>>> = Arc::new(
        (0..args.updates)
            .map(|_| std::sync::Mutex::new(None))
            .collect(),
    );
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(usize, Instant)>();
    let mut watchers = Vec::new();
    for _ in 0..args.watchers {
        let client = server.admin_client().await?;
        let api: Api<Node> = Api::all(client);
        let mut stream = api
            .watch(&WatchParams::default().timeout(290), &rv)
            .await?
            .boxed();
        let tx = tx.clone();
        let want = args.updates;
        watchers.push(tokio::spawn(async move {
            let mut got = 0;
            while got < want {
                match stream.try_next().await {
                    Ok(Some(WatchEvent::Modified(n))) => {
                        let now = Instant::now();
                        if let Some(seq) = n
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("bench"))
                            .and_then(|s| s.parse::<usize>().ok())
                            && seq >= 1
                        {
                            let _ = tx.send((seq - 1, now));
                            got += 1;
                        }
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => break,
                }
            }
        }));
    }
    drop(tx);
    // Let every watch connect before the first update.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let start = Instant::now();
    futures::stream::iter(0..args.updates)
        .map(|i| {
            let nodes = nodes.clone();
            let sent = sent.clone();
            let n = args.nodes.max(1);
            async move {
                let name = format!("node-{:05}", (i * 7919) % n);
                if let Ok(mut s) = sent[i].lock() {
                    *s = Some(Instant::now());
                }
                let patch =
                    serde_json::json!({"metadata": {"labels": {"bench": (i + 1).to_string()}}});
                nodes
                    .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                    .await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await?;
    let writes_done = start.elapsed();
    let mut latencies = Vec::with_capacity(args.updates * args.watchers);
    let mut last = start;
    let expected = args.updates * args.watchers;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while latencies.len() < expected {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some((seq, at))) => {
                let issued = sent.get(seq).and_then(|m| m.lock().ok().and_then(|g| *g));
                if let Some(issued) = issued {
                    latencies.push(at.saturating_duration_since(issued).as_secs_f64() * 1000.0);
                }
                last = last.max(at);
            }
            _ => break,
        }
    }
    for w in watchers {
        w.abort();
    }
    let elapsed = last
        .saturating_duration_since(start)
        .as_secs_f64()
        .max(1e-9);
    latencies.sort_by(|a, b| a.total_cmp(b));
    let events = latencies.len();
    let events_per_s = events as f64 / elapsed;
    let p50 = percentile(&latencies, 0.50);
    let p99 = percentile(&latencies, 0.99);
    println!(
        "{} watchers x {} updates on {} nodes: {events}/{expected} events delivered in {elapsed:.3}s (writes done in {:.3}s)",
        args.watchers,
        args.updates,
        args.nodes,
        writes_done.as_secs_f64()
    );
    println!("events/s {events_per_s:.0}, delivery latency p50 {p50:.2} ms, p99 {p99:.2} ms");
    server.shutdown().await?;
    println!(
        "{}",
        serde_json::json!({
            "bench": "apiserver-watch", "nodes": args.nodes, "watchers": args.watchers, "updates": args.updates,
            "events": events, "expected_events": expected, "events_per_s": (events_per_s * 10.0).round() / 10.0,
            "p50_ms": (p50 * 1000.0).round() / 1000.0, "p99_ms": (p99 * 1000.0).round() / 1000.0
        })
    );
    Ok(())
}
