//! `ovnk sandbox demo`: a narrated walkthrough on a fresh sandbox.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

use crate::cli::{DemoArgs, DirArgs, UpArgs};
use crate::state::SandboxState;

fn say(s: &str) {
    println!("\n== {s}");
}

/// Runs the demo.
pub async fn run(a: DemoArgs) -> anyhow::Result<()> {
    let tmp;
    let dir = match &a.dir {
        Some(d) => d.clone(),
        None => {
            tmp = std::env::temp_dir().join(format!("ovnk-demo-{}", std::process::id()));
            tmp
        }
    };
    say(&format!(
        "Starting a {}-node OVN Interconnect cluster in {} (each node: its own NB/SB, ovn-northd, ovn-controller, ovs-vswitchd in a network namespace, and an ovnk node agent)",
        a.nodes,
        dir.display()
    ));
    let up = UpArgs {
        dir: DirArgs { dir: dir.clone() },
        nodes: a.nodes,
        timeout: 180,
        quiet: false,
        node_cert_duration: Duration::from_secs(600),
    };
    crate::cli::up(&up).await?;
    let result = walkthrough(&dir, a.nodes).await;
    if a.keep && result.is_ok() {
        println!(
            "\nThe sandbox keeps running. Try:\n  kubectl --kubeconfig {0}/kubeconfig get nodes,pods -A -o wide\n  ovnk sandbox status --dir {0}\n  ovnk sandbox down --dir {0}",
            dir.display()
        );
    } else {
        say("Tearing the sandbox down");
        crate::cli::down(&crate::cli::absolute(&dir)?).await?;
        if a.dir.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
    result
}

async fn walkthrough(dir: &std::path::Path, nodes: u32) -> anyhow::Result<()> {
    let st = SandboxState::load(&crate::cli::absolute(dir)?)?;
    let client = crate::report::admin_client(&st.layout).await?;
    say("Nodes and the Geneve tunnels each node's own Open_vSwitch database holds");
    let s = crate::report::status(&st).await?;
    for n in &s.nodes {
        println!(
            "  {} ready={} encap={} chassis={} tunnels -> [{}]",
            n.name,
            n.ready,
            n.encap_ip,
            n.chassis.as_deref().unwrap_or("-"),
            n.tunnels.join(", ")
        );
    }

    say(
        "Creating one pod per node (the node agent allocates its IP and logical switch port; the sandbox kubelet wires a network namespace into br-int)",
    );
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    for k in 1..=nodes {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("web-{k}"), "labels": {"app": "web"}},
            "spec": {"nodeName": format!("node{k}"), "containers": [{"name": "web", "image": "sandbox/probe"}]},
        }))?;
        pods.create(&PostParams::default(), &pod)
            .await
            .with_context(|| format!("creating pod web-{k}"))?;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = crate::report::status(&st).await?;
        let ready = s.pods.iter().filter(|p| p.ready).count();
        if ready >= nodes as usize {
            for p in &s.pods {
                println!(
                    "  {}/{} on {} ip {}",
                    p.namespace,
                    p.name,
                    p.node.as_deref().unwrap_or("-"),
                    p.ip.as_deref().unwrap_or("-")
                );
            }
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "pods not running after 60s ({ready}/{nodes})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    say(
        "Connectivity measured with real packets (TCP connect to each pod's listener, ICMP echo), and to the external namespace through each node's management port and SNAT",
    );
    let c = crate::report::connectivity(&st, Duration::from_millis(2000)).await?;
    crate::cli::print_connectivity(&c);
    let ok = c.pairs.iter().all(|p| p.tcp && p.icmp) && c.external.iter().all(|e| e.tcp);
    anyhow::ensure!(
        ok,
        "some pods cannot reach each other or the external namespace"
    );
    if nodes >= 5 {
        zones(&st, &client, nodes).await?;
    } else {
        println!("\n(trust zones are shown with --nodes 5 or more)");
    }
    Ok(())
}

/// Two tenants and a gateway: tenant A by label + TrustZone, tenant B by the transport-zones
/// annotation, node5 in both.
async fn zones(st: &SandboxState, client: &kube::Client, nodes: u32) -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Patch, PatchParams};
    say(
        "Trust zones: TrustZone tenant-a selects tenant=a (node1, node2, node5); the transport-zones annotation puts node3, node4 and node5 into tenant-b; the rest stay zone-less",
    );
    let tz: k8s_api::trust_zone::TrustZone = serde_json::from_value(serde_json::json!({
        "apiVersion": "k8s.ovn.org/v1alpha1", "kind": "TrustZone",
        "metadata": {"name": "tenant-a"},
        "spec": {"nodeSelector": {"matchLabels": {"tenant": "a"}}},
    }))?;
    Api::<k8s_api::trust_zone::TrustZone>::all(client.clone())
        .patch(
            "tenant-a",
            &PatchParams::apply("ovnk-demo").force(),
            &Patch::Apply(&tz),
        )
        .await
        .context("creating TrustZone tenant-a")?;
    let node_api = Api::<Node>::all(client.clone());
    for (n, label, ann) in [
        ("node1", true, false),
        ("node2", true, false),
        ("node3", false, true),
        ("node4", false, true),
        ("node5", true, true),
    ] {
        let mut meta = serde_json::Map::new();
        if label {
            meta.insert("labels".into(), serde_json::json!({"tenant": "a"}));
        }
        if ann {
            meta.insert(
                "annotations".into(),
                serde_json::json!({"k8s.ovn.org/transport-zones": "[\"tenant-b\"]"}),
            );
        }
        node_api
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::json!({"metadata": meta})),
            )
            .await
            .with_context(|| format!("labelling {n}"))?;
    }
    let zone_of = |k: u32| -> &'static str {
        match k {
            1 | 2 => "a",
            3 | 4 => "b",
            5 => "ab",
            _ => "",
        }
    };
    let connected = |a: u32, b: u32| -> bool {
        let (za, zb) = (zone_of(a), zone_of(b));
        (za.is_empty() && zb.is_empty()) || za.chars().any(|c| zb.contains(c))
    };
    let idx = |name: &str| -> u32 { crate::layout::node_index(name).unwrap_or(0) };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let s = crate::report::status(st).await?;
        let good = s.nodes.iter().all(|n| {
            let want: Vec<String> = (1..=nodes)
                .filter(|k| *k != idx(&n.name) && connected(idx(&n.name), *k))
                .map(crate::layout::node_name)
                .collect();
            n.tunnels == want
        });
        if good {
            for n in &s.nodes {
                println!(
                    "  {} zones=[{}] tunnels -> [{}]",
                    n.name,
                    match zone_of(idx(&n.name)) {
                        "a" => "tenant-a",
                        "b" => "tenant-b",
                        "ab" => "tenant-a, tenant-b",
                        _ => "",
                    },
                    n.tunnels.join(", ")
                );
            }
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the tunnel mesh did not follow the zones within 60s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    say(
        "Connectivity now: tenant A and tenant B pods cannot reach each other; the gateway node5 reaches both",
    );
    let c = crate::report::connectivity(st, Duration::from_millis(2000)).await?;
    crate::cli::print_connectivity(&c);
    let pod_idx = |p: &str| -> u32 { p.trim_start_matches("default/web-").parse().unwrap_or(0) };
    let wrong: Vec<String> = c
        .pairs
        .iter()
        .filter(|p| (p.tcp && p.icmp) != connected(pod_idx(&p.from), pod_idx(&p.to)))
        .map(|p| format!("{} → {}", p.from, p.to))
        .collect();
    anyhow::ensure!(
        wrong.is_empty(),
        "the matrix does not follow the zones: {wrong:?}"
    );
    println!("  every pair matches the zones: same zone (or both zone-less) ⇔ reachable");

    say(
        "TrustZone status, written by the cluster manager from each member's TunnelReport (what the node observes in its own Open_vSwitch database)",
    );
    let tzs = Api::<k8s_api::trust_zone::TrustZone>::all(client.clone());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let z = tzs.get("tenant-a").await?;
        let status = z.status.unwrap_or_default();
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == k8s_api::trust_zone::CONDITION_READY)
            .cloned();
        let done = ready.as_ref().is_some_and(|c| c.status == "True");
        if done || tokio::time::Instant::now() > deadline {
            println!("  tenant-a members: [{}]", status.members.join(", "));
            if let Some(c) = ready {
                println!(
                    "  Ready={} reason={} message={:?}",
                    c.status, c.reason, c.message
                );
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}
