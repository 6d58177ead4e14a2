//! The agent's real run loop end to end: the embedded API server, real NB/SB/Open_vSwitch
//! ovsdb-servers, ovn-northd, ovn-controller, and ovs-vswitchd (userspace datapath) in a
//! network namespace this test creates. Needs root (CI runs it as root).

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::cluster::*;
use common::*;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use node::NodeArgs;
use ovsdb_harness::{OvsdbServer, Schema};
use serde_json::json;

#[tokio::test]
async fn agent_runs_against_apiserver_and_real_ovn() {
    init_logs();
    apiserver::install_crypto_provider();
    let api = apiserver::ApiServer::start(apiserver::ServerConfig::default())
        .await
        .expect("apiserver");
    let admin = api.admin_client().await.expect("admin");
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &node_obj("node1", 1, false))
        .await
        .expect("node1");
    nodes
        .create(&PostParams::default(), &node_obj("node2", 2, true))
        .await
        .expect("node2");
    nodes
        .create(&PostParams::default(), &node_obj("node3", 3, false))
        .await
        .expect("node3");

    let nb = OvsdbServer::start(Schema::Northbound).expect("nb");
    let sb = OvsdbServer::start(Schema::Southbound).expect("sb");
    let ovs = OvsdbServer::start(Schema::Vswitch).expect("ovs");
    let _northd = Northd::start(&nb, &sb);
    ovs_init(&ovs, &sb);
    let db = format!("--db={}", ovs.endpoint());

    // The node's namespace: an underlay interface with the encap IP, vswitchd inside.
    let ns = Netns::create("e2e");
    // ... and an "external" namespace behind it.
    let ext = Netns::create("ext");
    ns.ip(&[
        "link", "add", "ul0", "type", "veth", "peer", "name", "ext0", "netns", &ext.name,
    ]);
    ext.ip(&["addr", "add", "172.16.0.254/24", "dev", "ext0"]);
    ext.ip(&["link", "set", "ext0", "up"]);
    ns.ip(&["addr", "add", "172.16.0.1/24", "dev", "ul0"]);
    ns.ip(&["link", "set", "ul0", "up"]);
    let run = tempfile::tempdir().expect("rundir");
    let rd = run.path().display().to_string();
    let _vswitchd = start_vswitchd(&ns, &ovs, &rd);
    let _controller = start_controller(&ovs, &rd);

    let args = NodeArgs {
        node: "node1".into(),
        kubeconfig: None,
        nb_address: nb.endpoint(),
        sb_address: sb.endpoint(),
        ovs_address: ovs.endpoint(),
        netns: Some(ns.name.clone()),
        encap_ip: Some("172.16.0.1".parse().expect("ip")),
        gateway_interface: Some("ul0".into()),
        mtu: 1400,
        cluster_cidr: "10.244.0.0/16".parse().expect("cidr"),
        transit_cidr: "100.88.0.0/16".parse().expect("cidr"),
        join_cidr: "100.64.0.0/16".parse().expect("cidr"),
        no_kernel: false,
        enforcement: Default::default(),
    };
    // The agent runs with its own node identity and only the repository's node RBAC.
    install_node_rbac(&admin).await;
    let me = api
        .client("system:ovn-node:node1", &["system:ovn-nodes"])
        .await
        .expect("node client");
    let agent = tokio::spawn(node::run_with(me.clone(), args.clone()));

    // node annotations written by the agent
    eventually("node1 annotations", || async {
        let n = nodes.get("node1").await.expect("get");
        let a = n.metadata.annotations.unwrap_or_default();
        a.get("k8s.ovn.org/node-encap-ips").map(String::as_str) == Some(r#"["172.16.0.1"]"#)
            && a.get("k8s.ovn.org/node-primary-ifaddr").map(String::as_str)
                == Some(r#"{"ipv4":"172.16.0.1/24"}"#)
            && a.get("k8s.ovn.org/node-mgmt-port-mac-addresses")
                .map(String::as_str)
                == Some(r#"{"default":"0a:58:0a:f4:01:02"}"#)
            && a.contains_key("k8s.ovn.org/node-chassis-id")
    })
    .await;
    // the remote node: chassis, port, binding, and ovn-controller's tunnel
    eventually("tunnel to node2", || async {
        ovs_tunnels(&ovs) == vec!["172.16.0.2".to_owned()]
    })
    .await;
    assert!(nb_has(&nb, "Logical_Switch_Port", "tstor-node2"));
    assert!(
        !nb_has(&nb, "Logical_Switch_Port", "tstor-node3"),
        "node3 has no chassis id yet"
    );
    eventually("Port_Binding.chassis of tstor-node2", || async {
        let out = ovsdb_harness::run(
            "ovn-sbctl",
            &[
                &format!("--db={}", sb.endpoint()),
                "--bare",
                "--columns=chassis",
                "find",
                "Port_Binding",
                "logical_port=tstor-node2",
            ],
        )
        .unwrap_or_default();
        !out.trim().is_empty()
    })
    .await;

    // kernel side
    eventually("management port configured", || async {
        ns.exec("ip", &["-4", "addr", "show", "dev", "ovn-k8s-mp0"])
            .is_some_and(|o| o.contains("10.244.1.2/24"))
    })
    .await;
    let link = ns.ip(&["link", "show", "dev", "ovn-k8s-mp0"]);
    assert!(
        link.contains("0a:58:0a:f4:01:02") && link.contains("mtu 1400"),
        "{link}"
    );
    let routes = ns.ip(&["route", "show", "10.244.0.0/16"]);
    assert!(
        routes.contains("via 10.244.1.1 dev ovn-k8s-mp0"),
        "{routes}"
    );
    eventually("the SNAT table", || async {
        ns.exec("nft", &["list", "table", "inet", "ovnk-gateway"])
            .is_some_and(|t| t.contains("snat ip to 172.16.0.1"))
    })
    .await;
    assert_eq!(
        ns.exec("sysctl", &["-n", "net.ipv4.ip_forward"])
            .map(|s| s.trim().to_owned())
            .as_deref(),
        Some("1")
    );

    // a pod: address published, LSP created
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let p: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"nodeName": "node1", "containers": [{"name": "c", "image": "x"}]},
    }))
    .expect("pod");
    pods.create(&PostParams::default(), &p)
        .await
        .expect("create pod");
    eventually("pod annotation", || async {
        pods.get("web")
            .await
            .ok()
            .and_then(|p| p.metadata.annotations)
            .and_then(|a| a.get("k8s.ovn.org/pod-networks").cloned())
            .is_some_and(|v| {
                v.contains(r#""ip_addresses":["10.244.1.3/24"]"#)
                    && v.contains(r#""mac_address":"0a:58:0a:f4:01:03""#)
            })
    })
    .await;
    eventually("pod LSP", || async {
        nb_has(&nb, "Logical_Switch_Port", "default_web")
    })
    .await;

    // Wire the pod like the sandbox's kubelet does, then: egress through the management port
    // and the node's kernel, SNATed to the node IP.
    let podns = Netns::create("pod");
    ns.ip(&[
        "link",
        "add",
        "vweb",
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &podns.name,
    ]);
    ns.ip(&["link", "set", "vweb", "up"]);
    podns.ip(&[
        "link",
        "set",
        "eth0",
        "address",
        "0a:58:0a:f4:01:03",
        "mtu",
        "1400",
        "up",
    ]);
    podns.ip(&["addr", "add", "10.244.1.3/24", "dev", "eth0"]);
    podns.ip(&["route", "add", "default", "via", "10.244.1.1"]);
    let _ = podns.exec("ethtool", &["-K", "eth0", "tx", "off"]);
    ovsdb_harness::run(
        "ovs-vsctl",
        &[
            &db,
            "--no-wait",
            "add-port",
            "br-int",
            "vweb",
            "--",
            "set",
            "Interface",
            "vweb",
            "external_ids:iface-id=default_web",
        ],
    )
    .expect("add-port");
    eventually("ovn-installed on the pod port", || async {
        ovsdb_harness::run(
            "ovs-vsctl",
            &[&db, "--no-wait", "get", "Interface", "vweb", "external_ids"],
        )
        .is_ok_and(|o| o.contains("ovn-installed"))
    })
    .await;
    eventually("pod pings the external namespace", || async {
        podns
            .exec("ping", &["-c", "1", "-W", "1", "172.16.0.254"])
            .is_some()
    })
    .await;
    let listener = Proc {
        name: "listener",
        child: Command::new("ip")
            .args(["netns", "exec", &ext.name, "python3", "-c",
                   "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('172.16.0.254',8080));s.listen();c,a=s.accept();print(a[0],flush=True)"])
            .stdout(Stdio::piped()).stderr(Stdio::null())
            .spawn().expect("listener"),
    };
    eventually("TCP from the pod to the external namespace", || async {
        podns.exec("python3", &["-c", "import socket;socket.create_connection(('172.16.0.254',8080),timeout=2).close()"]).is_some()
    })
    .await;
    let out = listener_output(listener);
    assert_eq!(out.trim(), "172.16.0.1", "egress is SNATed to the node IP");
    // Cluster destinations OVN has no route for are dropped inside OVN; others go to the
    // management port or the transit switch.
    let trace = |dst: &str| {
        ovsdb_harness::run("ovn-trace", &[&format!("--db={}", sb.endpoint()), "--minimal", "node1",
            &format!("inport == \"default_web\" && eth.src == 0a:58:0a:f4:01:03 && eth.dst == 0a:58:0a:f4:01:01 && ip4.src == 10.244.1.3 && ip4.dst == {dst} && ip.ttl == 64 && icmp4.type == 8")])
            .expect("ovn-trace")
    };
    let t = trace("8.8.8.8");
    assert!(
        t.contains("eth.dst = 0a:58:0a:f4:01:02;") && t.contains("output(\"k8s-node1\");"),
        "{t}"
    );
    let t = trace("10.244.9.5");
    assert!(!t.contains("output("), "dropped inside OVN: {t}");
    let t = trace("10.244.2.5");
    assert!(t.contains("output(\"tstor-node2\");"), "{t}");

    // node3 gets its chassis id: tunnel; bad zones on node3 later: Event, and disconnected
    nodes.patch("node3", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {
        "k8s.ovn.org/node-chassis-id": "ch-node3", "k8s.ovn.org/node-encap-ips": "[\"172.16.0.3\"]"}}}))).await.expect("patch");
    eventually("tunnel to node3", || async {
        ovs_tunnels(&ovs) == vec!["172.16.0.2".to_owned(), "172.16.0.3".to_owned()]
    })
    .await;
    nodes
        .patch(
            "node3",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
        "k8s.ovn.org/transport-zones": "[\"Not_Valid\"]"}}})),
        )
        .await
        .expect("patch");
    let events: Api<Event> = Api::all(admin.clone());
    eventually("InvalidAnnotation event on node3", || async {
        events
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items.iter().any(|e| {
                    e.reason.as_deref() == Some("InvalidAnnotation")
                        && e.involved_object.name.as_deref() == Some("node3")
                })
            })
            .unwrap_or(false)
    })
    .await;
    // an invalid annotation means no zones: node3 stays connected
    assert_eq!(ovs_tunnels(&ovs).len(), 2);

    // restart the agent (the task is dropped mid-run, as after SIGKILL): same rows, no flap
    let before_nb = summary(&nb);
    let before_sb = summary(&sb);
    let ch_uuid = ovsdb_harness::run(
        "ovn-sbctl",
        &[
            &format!("--db={}", sb.endpoint()),
            "--bare",
            "--columns=_uuid",
            "find",
            "Chassis",
            "name=ch-node2",
        ],
    )
    .expect("uuid");
    agent.abort();
    let _ = agent.await;
    let agent = tokio::spawn(node::run_with(me.clone(), args.clone()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(summary(&nb), before_nb);
    assert_eq!(summary(&sb), before_sb);
    let ch_uuid2 = ovsdb_harness::run(
        "ovn-sbctl",
        &[
            &format!("--db={}", sb.endpoint()),
            "--bare",
            "--columns=_uuid",
            "find",
            "Chassis",
            "name=ch-node2",
        ],
    )
    .expect("uuid");
    assert_eq!(
        ch_uuid, ch_uuid2,
        "the remote chassis row survived the restart"
    );
    assert_eq!(ovs_tunnels(&ovs).len(), 2);

    // delete node2: its tunnel and records go; delete the pod: its port goes
    nodes
        .delete("node2", &DeleteParams::default())
        .await
        .expect("delete node2");
    eventually("node2 removed", || async {
        ovs_tunnels(&ovs) == vec!["172.16.0.3".to_owned()]
            && !nb_has(&nb, "Logical_Switch_Port", "tstor-node2")
            && !summary(&nb).iter().any(|l| l.contains("node2"))
            && !summary(&sb).iter().any(|l| l.contains("node2"))
    })
    .await;
    pods.delete("web", &DeleteParams::default())
        .await
        .expect("delete pod");
    eventually("pod LSP removed", || async {
        !nb_has(&nb, "Logical_Switch_Port", "default_web")
    })
    .await;

    agent.abort();
    let _ = agent.await;
}
