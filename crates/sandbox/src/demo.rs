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
    Ok(())
}
