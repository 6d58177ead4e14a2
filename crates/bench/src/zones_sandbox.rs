//! The sandbox half of `ovnk-bench zones`: in a real 10-node sandbox with two TrustZones, the
//! time from a Node label change (an API write, as `kubectl label` makes) until every node's
//! own Open_vSwitch database holds exactly the tunnels the zones call for (p50 over 20 changes),
//! and how many tunnels exist against the full mesh.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Map, Value, json};

/// Runs the sandbox part with `nodes` nodes and `changes` label flips; adds its keys to `out`.
pub fn figures(ovnk: &Path, nodes: u32, changes: u32, out: &mut Map<String, Value>) -> Result<()> {
    let tmp = tempfile::Builder::new()
        .prefix("ovnk-bench-zones-")
        .tempdir()?;
    let d = tmp.path().to_string_lossy().into_owned();
    println!("sandbox: up --nodes {nodes} …");
    let up = Command::new(ovnk)
        .args([
            "sandbox",
            "up",
            "--dir",
            &d,
            "--nodes",
            &nodes.to_string(),
            "--quiet",
        ])
        .output()?;
    if !up.status.success() {
        bail!("sandbox up: {}", String::from_utf8_lossy(&up.stderr));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let r = rt.block_on(measure(tmp.path(), nodes, changes));
    let down = Command::new(ovnk)
        .args(["sandbox", "down", "--dir", &d])
        .output()?;
    if !down.status.success() {
        eprintln!("sandbox down: {}", String::from_utf8_lossy(&down.stderr));
    }
    let (p50, p90, tunnels) = r?;
    let full = u64::from(nodes) * u64::from(nodes - 1);
    println!(
        "sandbox: label change → every node's tunnels correct: p50 {p50:.3} s, p90 {p90:.3} s over {changes} changes (target p50 ≤ 1 s)"
    );
    println!(
        "sandbox: tunnels built {tunnels} = exactly the connected pairs, vs {full} for a full mesh"
    );
    out.insert("converge_p50_s".into(), json!(p50));
    out.insert("converge_p90_s".into(), json!(p90));
    out.insert("converge_changes".into(), json!(changes));
    out.insert("sandbox_nodes".into(), json!(nodes));
    out.insert("tunnels".into(), json!(tunnels));
    out.insert("full_mesh_tunnels".into(), json!(full));
    Ok(())
}

async fn measure(dir: &Path, nodes: u32, changes: u32) -> Result<(f64, f64, u64)> {
    let st = sandbox::state::SandboxState::load(dir)?;
    let client = sandbox::report::admin_client(&st.layout).await?;
    // one live replica of every node's Open_vSwitch database
    let mut dbs = Vec::new();
    let mut clients = Vec::new();
    for k in 1..=nodes {
        let spec = sandbox::stack::NodeSpec::new(&st.layout, k);
        let c = ovsdb::Client::connect(&spec.socket("conf"), ovsdb::ClientOptions::default())
            .await
            .with_context(|| format!("node{k}: Open_vSwitch database"))?;
        let db = ovn_model::connect_db(&c, ovn_model::OVS_DB, &ovn_model::ovs_needs()).await?;
        clients.push(c);
        dbs.push((format!("node{k}"), db));
    }
    let by_ip: Arc<BTreeMap<String, String>> = Arc::new(
        (1..=nodes)
            .map(|k| (sandbox::layout::node_ip(k).to_string(), format!("node{k}")))
            .collect(),
    );
    let tz = |name: &str, value: &str| -> Result<k8s_api::trust_zone::TrustZone> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "k8s.ovn.org/v1alpha1", "kind": "TrustZone",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"zone": value}}},
        }))?)
    };
    let tzs = Api::<k8s_api::trust_zone::TrustZone>::all(client.clone());
    let pp = PatchParams::apply("ovnk-bench").force();
    tzs.patch("zone-a", &pp, &Patch::Apply(&tz("zone-a", "a")?))
        .await?;
    tzs.patch("zone-b", &pp, &Patch::Apply(&tz("zone-b", "b")?))
        .await?;
    let node_api = Api::<Node>::all(client.clone());
    let mut zone: BTreeMap<String, char> = BTreeMap::new();
    for k in 1..=nodes {
        let z = if k <= nodes / 2 { 'a' } else { 'b' };
        zone.insert(format!("node{k}"), z);
        label(&node_api, &format!("node{k}"), z).await?;
    }
    let wait = |zone: BTreeMap<String, char>| {
        let dbs = &dbs;
        let by_ip = by_ip.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                let good = dbs.iter().all(|(n, db)| {
                    let mut have: Vec<String> = sandbox::supervisor::geneve_peers(db)
                        .into_iter()
                        .map(|ip| by_ip.get(&ip).cloned().unwrap_or(ip))
                        .collect();
                    have.sort();
                    let mut want: Vec<String> = zone
                        .iter()
                        .filter(|(o, z)| *o != n && Some(**z) == zone.get(n).copied())
                        .map(|(o, _)| o.clone())
                        .collect();
                    want.sort();
                    have == want
                });
                if good {
                    return Ok(());
                }
                if Instant::now() > deadline {
                    bail!("tunnels did not follow the zones within 60 s");
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    };
    wait(zone.clone()).await?;
    let tunnels: u64 = dbs
        .iter()
        .map(|(_, db)| sandbox::supervisor::geneve_peers(db).len() as u64)
        .sum();

    let mut times = Vec::new();
    for i in 0..changes {
        let n = format!("node{}", 1 + i % nodes);
        let z = zone.get(&n).copied().unwrap_or('a');
        let flipped = if z == 'a' { 'b' } else { 'a' };
        zone.insert(n.clone(), flipped);
        let t0 = Instant::now();
        label(&node_api, &n, flipped).await?;
        wait(zone.clone()).await?;
        times.push(t0.elapsed().as_secs_f64());
    }
    drop(clients);
    times.sort_by(|a, b| a.total_cmp(b));
    let p50 = times[times.len() / 2];
    let p90 = times[(times.len() * 9 / 10).min(times.len() - 1)];
    Ok((p50, p90, tunnels))
}

async fn label(api: &Api<Node>, node: &str, zone: char) -> Result<()> {
    let patch = json!({"metadata": {"labels": {"zone": zone.to_string()}}});
    api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("labelling {node}"))?;
    Ok(())
}
