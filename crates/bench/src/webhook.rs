//! `ovnk-bench webhook`: the ovnk admission webhook (`/node`, full node checks on a realistic
//! `nodes/status` AdmissionReview from `system:ovn-node:<node>`) against a bare rustls + hyper
//! server that decodes the same AdmissionReview and answers allowed. Same in-process HTTP/1.1
//! keep-alive TLS load generator, same machine, same run, loopback only.

use std::sync::Arc;
use std::time::Duration;

use identity::admission::node::{NodeAdmission, NodeAdmissionConfig};
use identity::admission::owned::NodeOwnedResources;
use identity::admission::pod::{PodAdmission, PodAdmissionConfig};
use identity::loadgen::{self, Target};
use identity::metrics::Metrics;
use identity::tls::{CertReloader, TlsMinVersion};
use identity::webhook::{NoNodes, WebhookState, router, serve_tls};
use serde_json::{Value, json};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Seconds per closed-loop throughput slice.
    #[arg(long, default_value_t = 0.5)]
    pub slice_seconds: f64,
    /// Concurrent keep-alive connections in the throughput runs.
    #[arg(long, default_value_t = 8)]
    pub connections: usize,
    /// Rate of the open-loop latency run (requests/s).
    #[arg(long, default_value_t = 2000.0)]
    pub rate: f64,
    /// Seconds of the open-loop latency run.
    #[arg(long, default_value_t = 5.0)]
    pub latency_seconds: f64,
    /// Connections used by the open-loop latency run.
    #[arg(long, default_value_t = 16)]
    pub latency_connections: usize,
    /// Alternating throughput slices per server (totals are summed).
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
}

/// A kind-like worker Node as ovnkube-node sees it, with the usual OVN annotations.
fn node(host_cidrs: &str) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "ovn-worker",
            "uid": "1c7c5a9e-36a4-4e8e-8f43-7d3c2b1f0a11",
            "resourceVersion": "123456",
            "creationTimestamp": "2026-11-21T10:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": "ovn-worker",
                "kubernetes.io/os": "linux", "k8s.ovn.org/egress-assignable": ""
            },
            "annotations": {
                "k8s.ovn.org/host-cidrs": host_cidrs,
                "k8s.ovn.org/l3-gateway-config": "{\"default\":{\"mode\":\"shared\",\"bridge-id\":\"breth0\",\"interface-id\":\"breth0_ovn-worker\",\"mac-address\":\"02:42:ac:12:00:03\",\"ip-addresses\":[\"172.18.0.3/16\"],\"next-hops\":[\"172.18.0.1\"],\"node-port-enable\":\"true\",\"vlan-id\":\"0\"}}",
                "k8s.ovn.org/node-chassis-id": "b1f96182-2bdd-42b6-88f9-9a1fc1c85ece",
                "k8s.ovn.org/node-encap-ips": "[\"172.18.0.3\"]",
                "k8s.ovn.org/node-id": "3",
                "k8s.ovn.org/node-masquerade-subnet": "{\"ipv4\":\"169.254.169.0/29\",\"ipv6\":\"fd69::/125\"}",
                "k8s.ovn.org/node-mgmt-port-mac-addresses": "{\"default\":\"ca:53:88:23:bc:98\"}",
                "k8s.ovn.org/node-primary-ifaddr": "{\"ipv4\":\"172.18.0.3/16\"}",
                "k8s.ovn.org/node-subnets": "{\"default\":[\"10.244.1.0/24\"]}",
                "k8s.ovn.org/node-transit-switch-port-ifaddr": "{\"ipv4\":\"100.88.0.3/16\"}",
                "k8s.ovn.org/zone-name": "ovn-worker",
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            },
            "managedFields": [
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": "2026-11-21T10:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}},
                {"manager": "ovnkube", "operation": "Update", "apiVersion": "v1", "time": "2026-11-21T10:00:05Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {}}}, "subresource": "status"}
            ]
        },
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"], "providerID": "kind://docker/ovn/ovn-worker"},
        "status": {
            "addresses": [{"type": "InternalIP", "address": "172.18.0.3"}, {"type": "Hostname", "address": "ovn-worker"}],
            "allocatable": {"cpu": "8", "ephemeral-storage": "100Gi", "hugepages-2Mi": "0", "memory": "16Gi", "pods": "110"},
            "capacity": {"cpu": "8", "ephemeral-storage": "100Gi", "hugepages-2Mi": "0", "memory": "16Gi", "pods": "110"},
            "conditions": [
                {"type": "MemoryPressure", "status": "False", "reason": "KubeletHasSufficientMemory", "message": "kubelet has sufficient memory available", "lastHeartbeatTime": "2026-11-21T10:00:00Z", "lastTransitionTime": "2026-11-21T09:00:00Z"},
                {"type": "DiskPressure", "status": "False", "reason": "KubeletHasNoDiskPressure", "message": "kubelet has no disk pressure", "lastHeartbeatTime": "2026-11-21T10:00:00Z", "lastTransitionTime": "2026-11-21T09:00:00Z"},
                {"type": "PIDPressure", "status": "False", "reason": "KubeletHasSufficientPID", "message": "kubelet has sufficient PID available", "lastHeartbeatTime": "2026-11-21T10:00:00Z", "lastTransitionTime": "2026-11-21T09:00:00Z"},
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status", "lastHeartbeatTime": "2026-11-21T10:00:00Z", "lastTransitionTime": "2026-11-21T09:00:30Z"}
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "images": [
                {"names": ["registry.k8s.io/etcd@sha256:0000", "registry.k8s.io/etcd:3.5.15-0"], "sizeBytes": 56909194},
                {"names": ["localhost/ovn-daemonset-fedora:dev"], "sizeBytes": 488123456},
                {"names": ["registry.k8s.io/kube-proxy:v1.33.0"], "sizeBytes": 30000000},
                {"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}
            ],
            "nodeInfo": {"architecture": "amd64", "bootID": "4c2c4d0e-0000-4000-8000-000000000003", "containerRuntimeVersion": "containerd://2.0.0", "kernelVersion": "6.1.0", "kubeProxyVersion": "", "kubeletVersion": "v1.33.0", "machineID": "0123456789abcdef0123456789abcdef", "operatingSystem": "linux", "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": "0123-4567"}
        }
    })
}

fn review_body() -> Vec<u8> {
    let body = json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "Node"},
            "resource": {"group": "", "version": "v1", "resource": "nodes"},
            "subResource": "status",
            "requestKind": {"group": "", "version": "v1", "kind": "Node"},
            "requestResource": {"group": "", "version": "v1", "resource": "nodes"},
            "requestSubResource": "status",
            "name": "ovn-worker",
            "operation": "UPDATE",
            "userInfo": {"username": "system:ovn-node:ovn-worker", "groups": ["system:ovn-nodes", "system:authenticated"]},
            "object": node("[\"172.18.0.3/16\",\"fc00:f853:ccd:e793::3/64\"]"),
            "oldObject": node("[\"172.18.0.3/16\"]"),
            "dryRun": false,
            "options": {"kind": "UpdateOptions", "apiVersion": "meta.k8s.io/v1"}
        }
    });
    serde_json::to_vec(&body).unwrap_or_default()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    identity::install_crypto_provider();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench(args))
}

async fn bench(args: Args) -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("ovnk-bench-webhook-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let (ca, cert, key) = loadgen::localhost_pki()?;
    std::fs::write(dir.join("tls.crt"), &cert)?;
    std::fs::write(dir.join("tls.key"), &key)?;
    let result = measure(&args, &dir, &ca).await;
    let _ = std::fs::remove_dir_all(&dir);
    result
}

async fn measure(args: &Args, dir: &std::path::Path, ca: &str) -> anyhow::Result<()> {
    let certs = CertReloader::from_dir(dir, TlsMinVersion::Tls12).await?;
    let state = Arc::new(WebhookState::new(
        NodeAdmission::new(&NodeAdmissionConfig {
            enable_interconnect: true,
            ..Default::default()
        }),
        PodAdmission::new(PodAdmissionConfig::default()),
        NodeOwnedResources::default(),
        Arc::new(NoNodes),
        Metrics::shared(),
    ));
    let (handle, task) = serve_tls(router(state.clone()), "127.0.0.1:0".parse()?, &certs);
    let webhook_addr = handle
        .local_addr()
        .await
        .ok_or_else(|| anyhow::anyhow!("webhook did not start"))?;
    let (bare_addr, bare_task) =
        identity::bare::bind("127.0.0.1:0".parse()?, certs.server_config()).await?;

    let body = Arc::new(review_body());
    let tls = loadgen::client_config(&[ca.as_bytes()])?;
    let target = |addr, path: &str| Target {
        addr,
        server_name: "localhost".into(),
        tls: tls.clone(),
        path: path.into(),
        body: body.clone(),
    };
    let webhook = target(webhook_addr, "/node");
    let bare = target(bare_addr, "/");

    // sanity: the webhook allows this review after running every node check
    let mut c = loadgen::Conn::connect_tls(webhook_addr, "localhost", tls.clone()).await?;
    let (code, resp) = c.request("POST", "/node", &body).await?;
    let v: Value = serde_json::from_slice(&resp)?;
    anyhow::ensure!(
        code == 200 && v["response"]["allowed"] == true,
        "webhook did not allow the review: {v}"
    );
    drop(c);
    println!(
        "review body: {} bytes (nodes/status UPDATE by system:ovn-node:ovn-worker, host-cidrs changed)",
        body.len()
    );

    // Throughput: many short closed-loop slices, alternating webhook/bare (and swapping which
    // goes first each round), summed per server. Both see the same background load, which on a
    // shared 2-core machine matters more than anything else.
    let slice = Duration::from_secs_f64(args.slice_seconds);
    loadgen::closed_loop(&webhook, args.connections, Duration::from_millis(300)).await?;
    loadgen::closed_loop(&bare, args.connections, Duration::from_millis(300)).await?;
    let (mut w_ok, mut w_time, mut b_ok, mut b_time) = (0u64, 0.0f64, 0u64, 0.0f64);
    let (mut w_err, mut b_err) = (0u64, 0u64);
    let mut ratios = Vec::new();
    for round in 0..args.rounds.max(1) {
        let (w, b) = if round % 2 == 0 {
            let w = loadgen::closed_loop(&webhook, args.connections, slice).await?;
            let b = loadgen::closed_loop(&bare, args.connections, slice).await?;
            (w, b)
        } else {
            let b = loadgen::closed_loop(&bare, args.connections, slice).await?;
            let w = loadgen::closed_loop(&webhook, args.connections, slice).await?;
            (w, b)
        };
        w_ok += w.ok;
        w_err += w.errors;
        w_time += w.elapsed.as_secs_f64();
        b_ok += b.ok;
        b_err += b.errors;
        b_time += b.elapsed.as_secs_f64();
        if b.throughput_rps() > 0.0 {
            ratios.push(w.throughput_rps() / b.throughput_rps());
        }
    }
    let best_w = if w_time > 0.0 {
        w_ok as f64 / w_time
    } else {
        0.0
    };
    let best_b = if b_time > 0.0 {
        b_ok as f64 / b_time
    } else {
        0.0
    };
    ratios.sort_by(|a, b| a.total_cmp(b));
    let median_ratio = ratios.get(ratios.len() / 2).copied().unwrap_or(0.0);
    println!(
        "throughput over {} alternating {:.2} s slices x {} connections: webhook {:.0} req/s ({} errors), bare {:.0} req/s ({} errors), per-slice ratio median {:.3} (min {:.3}, max {:.3})",
        args.rounds,
        args.slice_seconds,
        args.connections,
        best_w,
        w_err,
        best_b,
        b_err,
        median_ratio,
        ratios.first().copied().unwrap_or(0.0),
        ratios.last().copied().unwrap_or(0.0)
    );

    let lat = loadgen::open_loop(
        &webhook,
        args.rate,
        args.latency_connections,
        Duration::from_secs_f64(args.latency_seconds),
    )
    .await?;
    let lat_bare = loadgen::open_loop(
        &bare,
        args.rate,
        args.latency_connections,
        Duration::from_secs_f64(args.latency_seconds),
    )
    .await?;
    println!(
        "open loop {:.0} req/s for {:.1} s: webhook p50 {:.3} ms p99 {:.3} ms max {:.3} ms ({} ok, {} errors); bare p99 {:.3} ms",
        args.rate,
        args.latency_seconds,
        lat.quantile_ms(0.5),
        lat.quantile_ms(0.99),
        lat.quantile_ms(1.0),
        lat.ok,
        lat.errors,
        lat_bare.quantile_ms(0.99)
    );
    println!(
        "  the same, every request timed from its scheduled send (the load generator's own timer lateness included): webhook p99 {:.3} ms, bare p99 {:.3} ms",
        lat.quantile_from_schedule_ms(0.99),
        lat_bare.quantile_from_schedule_ms(0.99)
    );

    handle.shutdown(Duration::from_secs(1));
    let _ = task.await;
    bare_task.abort();
    let _ = bare_task.await;

    let ratio = if best_b > 0.0 { best_w / best_b } else { 0.0 };
    let out = json!({
        "throughput_rps": (best_w * 10.0).round() / 10.0,
        "bare_throughput_rps": (best_b * 10.0).round() / 10.0,
        "throughput_ratio": (ratio * 1000.0).round() / 1000.0,
        "throughput_ratio_median_slice": (median_ratio * 1000.0).round() / 1000.0,
        "p99_ms_at_2000rps": (lat.quantile_ms(0.99) * 1000.0).round() / 1000.0,
        "p50_ms_at_2000rps": (lat.quantile_ms(0.5) * 1000.0).round() / 1000.0,
        "bare_p99_ms_at_2000rps": (lat_bare.quantile_ms(0.99) * 1000.0).round() / 1000.0,
        "p99_ms_at_2000rps_from_schedule": (lat.quantile_from_schedule_ms(0.99) * 1000.0).round() / 1000.0,
        "bare_p99_ms_at_2000rps_from_schedule": (lat_bare.quantile_from_schedule_ms(0.99) * 1000.0).round() / 1000.0,
        "rate_rps": args.rate,
        "connections": args.connections,
        "body_bytes": body.len(),
    });
    println!("{out}");
    Ok(())
}
