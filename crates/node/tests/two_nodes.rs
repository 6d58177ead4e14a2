//! Two nodes, each with its own NB/SB/northd/ovn-controller/vswitchd and its own agent, joined
//! by an underlay veth: pods on different nodes reach each other over a real Geneve tunnel.
//! Needs root.

mod common;

use std::time::Duration;

use common::cluster::*;
use common::*;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use serde_json::json;

#[tokio::test]
async fn pods_on_two_nodes_talk_over_geneve() {
    init_logs();
    apiserver::install_crypto_provider();
    let api = apiserver::ApiServer::start(apiserver::ServerConfig::default())
        .await
        .expect("apiserver");
    let admin = api.admin_client().await.expect("admin");
    install_node_rbac(&admin).await;
    let nodes: Api<Node> = Api::all(admin.clone());
    for k in [1, 2] {
        nodes
            .create(
                &PostParams::default(),
                &node_obj(&format!("node{k}"), k, false),
            )
            .await
            .expect("node");
    }
    let (n1, n2) = NodeStack::start_pair().await;
    let mut agents = Vec::new();
    for n in [&n1, &n2] {
        let me = api
            .client(
                &format!("system:ovn-node:{}", n.name),
                &["system:ovn-nodes"],
            )
            .await
            .expect("node client");
        agents.push(tokio::spawn(node::run_with(me, n.args("br-phy"))));
    }
    eventually("tunnels both ways", || async {
        ovs_tunnels(&n1.ovs) == vec!["172.16.0.2".to_owned()]
            && ovs_tunnels(&n2.ovs) == vec!["172.16.0.1".to_owned()]
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    for (name, node) in [("a", "node1"), ("b", "node2")] {
        let p: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        }))
        .expect("pod");
        pods.create(&PostParams::default(), &p)
            .await
            .expect("create pod");
    }
    for name in ["a", "b"] {
        eventually("pod annotation", || async {
            pods.get(name)
                .await
                .ok()
                .and_then(|p| p.metadata.annotations)
                .is_some_and(|a| a.contains_key("k8s.ovn.org/pod-networks"))
        })
        .await;
    }
    let a = n1
        .wire_pod("default_a", "va", "10.244.1.3".parse().expect("ip"))
        .await;
    let b = n2
        .wire_pod("default_b", "vb", "10.244.2.3".parse().expect("ip"))
        .await;
    eventually("pod a pings pod b across nodes", || async {
        a.exec("ping", &["-c", "1", "-W", "1", "10.244.2.3"])
            .is_some()
    })
    .await;
    let _listener = Proc {
        name: "listener",
        child: std::process::Command::new("ip")
            .args(["netns", "exec", &b.name, "python3", "-c",
                   "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('10.244.2.3',8080));s.listen();\nwhile True:\n c,a=s.accept();c.sendall(b'x'*200000);c.close()"])
            .stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null())
            .spawn().expect("listener"),
    };
    eventually("TCP with full-size segments from pod b to pod a", || async {
        a.exec("python3", &["-c", "import socket;c=socket.create_connection(('10.244.2.3',8080),timeout=3);n=0\nwhile True:\n d=c.recv(65536)\n if not d: break\n n+=len(d)\nassert n==200000,n"]).is_some()
    })
    .await;
    // node to remote pod goes through OVN too (mgmt port route)
    eventually("node1 reaches pod b", || async {
        n1.ns
            .exec("ping", &["-c", "1", "-W", "1", "10.244.2.3"])
            .is_some()
    })
    .await;
    // Restart node1's agent (dropped mid-run, as after SIGKILL) while a probe runs: no loss.
    let probe = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            &a.name,
            "ping",
            "-c",
            "60",
            "-i",
            "0.05",
            "-W",
            "1",
            "10.244.2.3",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("ping");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let first = agents.remove(0);
    first.abort();
    let _ = first.await;
    let me = api
        .client("system:ovn-node:node1", &["system:ovn-nodes"])
        .await
        .expect("node client");
    agents.push(tokio::spawn(node::run_with(me, n1.args("br-phy"))));
    let out = tokio::task::spawn_blocking(move || probe.wait_with_output())
        .await
        .expect("join")
        .expect("ping output");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains(" 0% packet loss"), "{text}");
    for ag in agents {
        ag.abort();
        let _ = ag.await;
    }
    tokio::time::sleep(Duration::from_millis(10)).await;
}
