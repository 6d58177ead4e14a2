//! The underlay and each node's OVN stack, as `../shared/reference/ovn-sandbox.md` describes:
//! NB, SB and local Open_vSwitch ovsdb-servers, ovn-northd and ovn-controller in the root
//! namespace on unix sockets under the node's directory; ovs-vswitchd (userspace datapath)
//! inside the node's namespace, with the underlay IP on the `br-phy` netdev bridge.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::layout::{
    self, EXTERNAL_IP, FABRIC_BRIDGE, FABRIC_PREFIX_LEN, Layout, NODE_UPLINK, PHYS_BRIDGE,
};
use crate::netns;
use crate::procs::Procs;

const NB_SCHEMA: &str = "/usr/share/ovn/ovn-nb.ovsschema";
const SB_SCHEMA: &str = "/usr/share/ovn/ovn-sb.ovsschema";
const OVS_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

/// One node of the sandbox.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// `nodeK`.
    pub name: String,
    /// K.
    pub index: u32,
    /// Its network namespace.
    pub netns: String,
    /// Its state directory.
    pub dir: PathBuf,
    /// Its underlay / encap address.
    pub ip: std::net::Ipv4Addr,
}

impl NodeSpec {
    /// Node K of `layout`.
    pub fn new(layout: &Layout, index: u32) -> Self {
        let name = layout::node_name(index);
        Self {
            netns: layout.node_netns(&name),
            dir: layout.node_dir(&name),
            ip: layout::node_ip(index),
            name,
            index,
        }
    }
    /// `unix:<dir>/<db>.sock`.
    pub fn socket(&self, db: &str) -> String {
        format!("unix:{}", self.dir.join(format!("{db}.sock")).display())
    }
}

/// Creates the fabric namespace (a bridge) and the external namespace on it.
pub async fn create_fabric(layout: &Layout) -> anyhow::Result<()> {
    let fab = layout.fabric_netns();
    let ext = layout.external_netns();
    netns::add(&fab).await?;
    netns::ip(&fab, &["link", "add", FABRIC_BRIDGE, "type", "bridge"]).await?;
    netns::ip(&fab, &["link", "set", FABRIC_BRIDGE, "up"]).await?;
    netns::add(&ext).await?;
    netns::ip(
        &ext,
        &[
            "link", "add", "eth0", "type", "veth", "peer", "name", "ext", "netns", &fab,
        ],
    )
    .await?;
    netns::ip(&fab, &["link", "set", "ext", "master", FABRIC_BRIDGE, "up"]).await?;
    let cidr = format!("{EXTERNAL_IP}/{FABRIC_PREFIX_LEN}");
    netns::ip(&ext, &["addr", "add", &cidr, "dev", "eth0"]).await?;
    netns::ip(&ext, &["link", "set", "eth0", "up"]).await?;
    netns::tx_checksum_off(&ext, "eth0").await?;
    Ok(())
}

/// Waits until the unix socket at `path` accepts a connection (the file appears at `bind`,
/// a moment before the daemon `listen`s: a connect in between is refused).
async fn wait_socket(path: &Path, what: &str, timeout: Duration) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let err = match tokio::net::UnixStream::connect(path).await {
            Ok(_) => return Ok(()),
            Err(e) => e,
        };
        if tokio::time::Instant::now() > deadline {
            bail!(
                "{what}: {} did not accept connections within {timeout:?} ({err})",
                path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn ovs_env(cmd: &mut Command, dir: &Path) {
    for k in [
        "OVS_RUNDIR",
        "OVS_LOGDIR",
        "OVS_DBDIR",
        "OVN_RUNDIR",
        "OVN_LOGDIR",
        "OVN_DBDIR",
        "OVN_SYSCONFDIR",
    ] {
        cmd.env(k, dir);
    }
}

async fn start_db(procs: &Procs, node: &NodeSpec, db: &str, schema: &str) -> anyhow::Result<()> {
    let d = &node.dir;
    let file = d.join(format!("{db}.db"));
    if !file.exists() {
        netns::run("ovsdb-tool", &["create", &file.to_string_lossy(), schema]).await?;
    }
    let sock = d.join(format!("{db}.sock"));
    let _ = std::fs::remove_file(&sock);
    let mut cmd = Command::new("ovsdb-server");
    cmd.arg(&file)
        .arg(format!("--remote=punix:{}", sock.display()))
        .arg(format!(
            "--unixctl={}",
            d.join(format!("{db}.ctl")).display()
        ))
        .arg(format!(
            "--log-file={}",
            d.join(format!("{db}.log")).display()
        ))
        .args(["-vsyslog:off", "-vconsole:off", "--no-chdir"]);
    ovs_env(&mut cmd, d);
    procs.spawn(
        &format!("{}-{db}", node.name),
        &mut cmd,
        &d.join("stderr.log"),
    )?;
    wait_socket(
        &sock,
        &format!("{} {db} ovsdb-server", node.name),
        Duration::from_secs(10),
    )
    .await
}

/// Starts node `node`'s namespace, underlay link and OVN stack (everything but the agent).
pub async fn start_node(layout: &Layout, procs: &Procs, node: &NodeSpec) -> anyhow::Result<()> {
    let d = &node.dir;
    std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    let fab = layout.fabric_netns();
    let ns = &node.netns;

    // namespace and underlay link into the fabric bridge
    netns::add(ns).await?;
    netns::ip(
        ns,
        &[
            "link",
            "add",
            NODE_UPLINK,
            "type",
            "veth",
            "peer",
            "name",
            &node.name,
            "netns",
            &fab,
        ],
    )
    .await?;
    netns::ip(
        &fab,
        &["link", "set", &node.name, "master", FABRIC_BRIDGE, "up"],
    )
    .await?;
    netns::ip(ns, &["link", "set", NODE_UPLINK, "up"]).await?;

    // databases, in parallel
    let (nb, sb, conf) = tokio::join!(
        start_db(procs, node, "nb", NB_SCHEMA),
        start_db(procs, node, "sb", SB_SCHEMA),
        start_db(procs, node, "conf", OVS_SCHEMA),
    );
    nb?;
    sb?;
    conf?;

    let nb_sock = node.socket("nb");
    let sb_sock = node.socket("sb");
    let conf_sock = node.socket("conf");
    netns::run("ovn-nbctl", &["--db", &nb_sock, "init"]).await?;
    netns::run(
        "ovs-vsctl",
        &[
            "--db",
            &conf_sock,
            "--no-wait",
            "init",
            "--",
            "set",
            "open_vswitch",
            ".",
            &format!("external-ids:ovn-remote={sb_sock}"),
            "external-ids:ovn-bridge-datapath-type=netdev",
            "external-ids:ovn-remote-probe-interval=0",
            "external-ids:ovn-openflow-probe-interval=0",
        ],
    )
    .await?;

    // ovn-northd
    let mut cmd = Command::new("ovn-northd");
    cmd.arg(format!("--ovnnb-db={nb_sock}"))
        .arg(format!("--ovnsb-db={sb_sock}"))
        .arg(format!("--unixctl={}", d.join("northd.ctl").display()))
        .arg(format!("--log-file={}", d.join("northd.log").display()))
        .args(["-vsyslog:off", "-vconsole:off", "--no-chdir"]);
    ovs_env(&mut cmd, d);
    procs.spawn(
        &format!("{}-northd", node.name),
        &mut cmd,
        &d.join("stderr.log"),
    )?;

    // ovs-vswitchd inside the node's namespace (`ip netns exec` execs, so the pid is vswitchd's)
    let ctl = d.join("vswitchd.ctl");
    let _ = std::fs::remove_file(&ctl);
    let mut cmd = Command::new("ip");
    cmd.args([
        "netns",
        "exec",
        ns,
        "ovs-vswitchd",
        &conf_sock,
        "--disable-system",
    ])
    .arg(format!("--unixctl={}", ctl.display()))
    .arg(format!("--log-file={}", d.join("vswitchd.log").display()))
    .args(["-vsyslog:off", "-vconsole:off", "--no-chdir"]);
    ovs_env(&mut cmd, d);
    procs.spawn(
        &format!("{}-vswitchd", node.name),
        &mut cmd,
        &d.join("stderr.log"),
    )?;
    wait_socket(
        &ctl,
        &format!("{} ovs-vswitchd", node.name),
        Duration::from_secs(10),
    )
    .await?;

    // underlay bridge: the node's IP lives on br-phy's internal port (userspace tunnelling
    // learns its routes and neighbours from there)
    netns::run(
        "ovs-vsctl",
        &[
            "--db",
            &conf_sock,
            "--timeout=10",
            "--",
            "--may-exist",
            "add-br",
            PHYS_BRIDGE,
            "--",
            "set",
            "bridge",
            PHYS_BRIDGE,
            "datapath_type=netdev",
            "--",
            "--may-exist",
            "add-port",
            PHYS_BRIDGE,
            NODE_UPLINK,
        ],
    )
    .await?;
    let cidr = format!("{}/{FABRIC_PREFIX_LEN}", node.ip);
    netns::ip(ns, &["addr", "add", &cidr, "dev", PHYS_BRIDGE]).await?;
    netns::ip(ns, &["link", "set", PHYS_BRIDGE, "up"]).await?;
    netns::ip(
        ns,
        &[
            "route",
            "add",
            "default",
            "via",
            &EXTERNAL_IP.to_string(),
            "dev",
            PHYS_BRIDGE,
        ],
    )
    .await?;
    netns::tx_checksum_off(ns, NODE_UPLINK).await?;

    // ovn-controller (its control socket is ovn-controller.<pid>.ctl in OVN_RUNDIR)
    let mut cmd = Command::new("ovn-controller");
    cmd.arg(&conf_sock)
        .arg(format!("--log-file={}", d.join("controller.log").display()))
        .args(["-vsyslog:off", "-vconsole:off", "--no-chdir"]);
    ovs_env(&mut cmd, d);
    procs.spawn(
        &format!("{}-controller", node.name),
        &mut cmd,
        &d.join("stderr.log"),
    )?;
    Ok(())
}

/// Stops node `name`'s processes in the safe order (agent, ovn-controller while its databases
/// are up, vswitchd, northd, databases).
pub async fn stop_node(procs: &Procs, name: &str) {
    let mut names = procs.names(&format!("{name}-"));
    names.sort_by_key(|n| crate::procs::stop_rank(n));
    for n in names {
        procs.stop(&n, Duration::from_secs(5)).await;
    }
}
