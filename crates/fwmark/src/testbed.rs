//! Network-namespace test bed for the real-kernel tests and the bench (not used by the agent).
//!
//! Everything happens in namespaces created here with unique names; each [`Netns`] deletes its
//! namespace when dropped, also when a test panics. The root namespace is never touched: veth
//! pairs are created inside the namespaces (`ip -n <ns> link add … peer … netns <other>`).
//!
//! [`Topology`]:
//!
//! ```text
//!  ep ──(veth)── node ──(veth)── dst-main     (main table: 198.51.100.0/24 / 2001:db8:100::/64)
//!                    └──(veth)── dst-marked   (table 100, selected by `ip rule fwmark 1000`)
//! ```
//!
//! Both destination namespaces own the probe address (198.51.100.1 / 2001:db8:100::1) and
//! count UDP packets to [`PROBE_PORT`] with an nft counter, so a test can tell which route a
//! packet took.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::exec::{self, ExecError, Runner, Tool};

/// UDP port the destination namespaces count.
pub const PROBE_PORT: u16 = 9999;
/// The routing table the mark selects.
pub const MARK_TABLE: u32 = 100;

/// Errors setting up the test bed.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    #[error("network-namespace tests must run as root (euid {0}); refusing to skip silently")]
    NotRoot(u32),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error("{0}")]
    Other(String),
}

/// Fails (never skips) unless running as root.
pub fn require_root() -> Result<(), TestbedError> {
    let status = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| TestbedError::Other(format!("reading /proc/self/status: {e}")))?;
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|u| u.parse::<u32>().ok())
        .ok_or_else(|| TestbedError::Other("no Uid line in /proc/self/status".into()))?;
    if euid != 0 {
        return Err(TestbedError::NotRoot(euid));
    }
    Ok(())
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace this process created; deleted on drop.
#[derive(Debug)]
pub struct Netns {
    name: String,
    ip: std::path::PathBuf,
}

impl Netns {
    /// Create `ovnkfw-<tag>-<pid>-<n>`.
    pub fn create(tag: &str) -> Result<Self, TestbedError> {
        require_root()?;
        let ip = exec::find(Tool::Ip, None)?;
        let n = COUNTER.fetch_add(1, Ordering::SeqCst);
        let name = format!("ovnkfw-{tag}-{}-{n}", std::process::id());
        Runner::host().run(&ip, &["netns", "add", &name], None)?;
        let ns = Self { name, ip };
        ns.sh(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A runner for commands inside this namespace.
    pub fn runner(&self) -> Result<Runner, TestbedError> {
        Ok(Runner::in_netns(self.name.clone())?)
    }

    /// `ip -n <ns> <args>`.
    pub fn sh(&self, args: &[&str]) -> Result<String, TestbedError> {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        let out = Runner::host().run(&self.ip, &full, None)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// `ip netns exec <ns> <program> <args>`, with optional stdin.
    pub fn exec(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<String, TestbedError> {
        let out = self
            .runner()?
            .run(std::path::Path::new(program), args, stdin)?;
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    fn sysctl(&self, key: &str, value: &str) -> Result<(), TestbedError> {
        self.exec("sysctl", &["-q", "-w", &format!("{key}={value}")], None)?;
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Err(e) = Runner::host().run(&self.ip, &["netns", "del", &self.name], None) {
            eprintln!("warning: deleting netns {}: {e}", self.name);
        }
    }
}

/// Addresses of one family in the [`Topology`].
#[derive(Clone, Debug)]
pub struct Plan {
    pub v6: bool,
    /// The endpoint address (on `ep`), marked by the tests.
    pub endpoint: IpAddr,
    /// Another address on `ep`, never marked.
    pub other: IpAddr,
    /// The probe destination, owned by both destination namespaces.
    pub probe: IpAddr,
}

/// ep → node → {dst-main, dst-marked}.
#[derive(Debug)]
pub struct Topology {
    pub plan: Plan,
    // Field order = drop order: the namespaces go away at the end.
    pub node: Netns,
    pub ep: Netns,
    pub dst_main: Netns,
    pub dst_marked: Netns,
}

impl Topology {
    /// Build the topology for IPv4 (`v6 == false`) or IPv6, with `ip rule fwmark <mark> lookup
    /// 100` in the node namespace.
    pub fn build(v6: bool, mark: u32) -> Result<Self, TestbedError> {
        let node = Netns::create("node")?;
        let ep = Netns::create("ep")?;
        let dst_main = Netns::create("dmain")?;
        let dst_marked = Netns::create("dmark")?;
        let parse = |s: &str| -> Result<IpAddr, TestbedError> {
            s.parse()
                .map_err(|e| TestbedError::Other(format!("{s}: {e}")))
        };
        let (fam, ep_net, main_net, mark_net, probe, pfx, host) = if v6 {
            (
                "-6",
                "fd10:1::",
                "fd20:1::",
                "fd30:1::",
                "2001:db8:100::1",
                "64",
                "128",
            )
        } else {
            (
                "-4",
                "10.10.1.",
                "10.20.1.",
                "10.30.1.",
                "198.51.100.1",
                "24",
                "32",
            )
        };
        let a = |net: &str, h: u8| format!("{net}{h}");
        let plan = Plan {
            v6,
            endpoint: parse(&a(ep_net, 2))?,
            other: parse(&a(ep_net, 3))?,
            probe: parse(probe)?,
        };
        for ns in [&node, &ep, &dst_main, &dst_marked] {
            for k in [
                "net.ipv4.conf.all.rp_filter",
                "net.ipv4.conf.default.rp_filter",
                // no duplicate address detection: link-local addresses usable at once, so
                // neighbour discovery works for the first probe
                "net.ipv6.conf.all.accept_dad",
                "net.ipv6.conf.default.accept_dad",
            ] {
                ns.sysctl(k, "0")?;
            }
        }
        node.sysctl("net.ipv4.ip_forward", "1")?;
        node.sysctl("net.ipv6.conf.all.forwarding", "1")?;

        // veth pairs, created inside the namespaces
        for (peer_ns, local, remote, net) in [
            (&ep, "to-ep", "up0", ep_net),
            (&dst_main, "to-main", "up0", main_net),
            (&dst_marked, "to-mark", "up0", mark_net),
        ] {
            node.sh(&[
                "link",
                "add",
                local,
                "type",
                "veth",
                "peer",
                "name",
                remote,
                "netns",
                peer_ns.name(),
            ])?;
            node.sh(&[
                "addr",
                "add",
                &format!("{}/{pfx}", a(net, 1)),
                "dev",
                local,
                "nodad",
            ])?;
            node.sh(&["link", "set", local, "up"])?;
            peer_ns.sh(&[
                "addr",
                "add",
                &format!("{}/{pfx}", a(net, 2)),
                "dev",
                remote,
                "nodad",
            ])?;
            peer_ns.sh(&["link", "set", remote, "up"])?;
            peer_ns.sh(&[fam, "route", "add", "default", "via", &a(net, 1)])?;
        }
        ep.sh(&[
            "addr",
            "add",
            &format!("{}/{pfx}", plan.other),
            "dev",
            "up0",
            "nodad",
        ])?;

        let probe_net = if v6 {
            "2001:db8:100::/64"
        } else {
            "198.51.100.0/24"
        };
        node.sh(&[fam, "route", "add", probe_net, "via", &a(main_net, 2)])?;
        let table = MARK_TABLE.to_string();
        node.sh(&[
            fam,
            "route",
            "add",
            probe_net,
            "via",
            &a(mark_net, 2),
            "table",
            &table,
        ])?;
        node.sh(&[
            fam,
            "rule",
            "add",
            "fwmark",
            &mark.to_string(),
            "lookup",
            &table,
        ])?;

        for d in [&dst_main, &dst_marked] {
            d.sh(&[
                "addr",
                "add",
                &format!("{probe}/{host}"),
                "dev",
                "lo",
                "nodad",
            ])?;
            let rules = format!(
                "table inet probe {{ chain input {{ type filter hook input priority 0; policy accept; \
                 udp dport {PROBE_PORT} counter drop; }}; }}"
            );
            d.exec("nft", &["-f", "-"], Some(rules.as_bytes()))?;
        }
        // wait (bounded) until no IPv6 address is tentative any more
        for _ in 0..50 {
            let mut tentative = false;
            for ns in [&node, &ep, &dst_main, &dst_marked] {
                tentative |= !ns
                    .sh(&["-6", "addr", "show", "tentative"])?
                    .trim()
                    .is_empty();
            }
            if !tentative {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Ok(Self {
            plan,
            node,
            ep,
            dst_main,
            dst_marked,
        })
    }

    /// Add more addresses to the endpoint namespace's interface.
    pub fn add_ep_address(&self, ip: IpAddr) -> Result<(), TestbedError> {
        let pfx = if ip.is_ipv4() { 32 } else { 128 };
        self.ep
            .sh(&["addr", "add", &format!("{ip}/{pfx}"), "dev", "up0", "nodad"])?;
        Ok(())
    }

    /// Packets counted so far by (dst-main, dst-marked).
    pub fn counts(&self) -> Result<(u64, u64), TestbedError> {
        Ok((count(&self.dst_main)?, count(&self.dst_marked)?))
    }
}

fn count(ns: &Netns) -> Result<u64, TestbedError> {
    let out = ns.exec("nft", &["-j", "list", "table", "inet", "probe"], None)?;
    let v: serde_json::Value =
        serde_json::from_str(&out).map_err(|e| TestbedError::Other(e.to_string()))?;
    let n = v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("rule"))
        .flat_map(|r| r["expr"].as_array().cloned().unwrap_or_default())
        .find_map(|e| {
            e.pointer("/counter/packets")
                .and_then(serde_json::Value::as_u64)
        })
        .ok_or_else(|| TestbedError::Other("no counter in probe table".into()))?;
    Ok(n)
}

/// Send `count` UDP datagrams from `src` to `dst`:[`PROBE_PORT`] (run inside the ep namespace).
pub fn send_udp(src: IpAddr, dst: IpAddr, count: u64) -> std::io::Result<u64> {
    let sock = std::net::UdpSocket::bind((src, 0))?;
    let payload = [0u8; 32];
    let mut sent = 0;
    for _ in 0..count {
        if sock.send_to(&payload, (dst, PROBE_PORT)).is_ok() {
            sent += 1;
        }
    }
    Ok(sent)
}

/// Send UDP datagrams from `src` to `dst` for `dur`; returns how many were sent.
pub fn blast_udp(src: IpAddr, dst: IpAddr, dur: std::time::Duration) -> std::io::Result<u64> {
    let sock = std::net::UdpSocket::bind((src, 0))?;
    sock.connect((dst, PROBE_PORT))?;
    let payload = [0u8; 32];
    let start = std::time::Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < dur {
        for _ in 0..256 {
            if sock.send(&payload).is_ok() {
                sent += 1;
            }
        }
    }
    Ok(sent)
}
