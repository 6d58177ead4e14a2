//! End-to-end tests of `ovnk sandbox` through its command line and kubectl, as a user drives
//! it: real OVN daemons per node, pods as network namespaces, real Geneve traffic. They need
//! root (network namespaces) and the Debian OVN/OVS packages; CI runs them in the `sandbox`
//! nextest group, one at a time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

const OVNK: &str = env!("CARGO_BIN_EXE_ovnk");

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("spawning a command")
}

fn ovnk(args: &[&str]) -> Output {
    run(Command::new(OVNK).args(args).env("RUST_BACKTRACE", "0"))
}

#[track_caller]
fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl --kubeconfig KC ARGS…`, with `input` on its stdin when given.
fn kubectl_as(kubeconfig: &Path, args: &[&str], input: Option<&str>) -> Output {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    let mut stdin = child.stdin.take().expect("stdin");
    if let Some(input) = input {
        stdin
            .write_all(input.as_bytes())
            .expect("write kubectl's stdin");
    }
    drop(stdin);
    child.wait_with_output().expect("kubectl output")
}

/// A sandbox brought up in a temp dir and always brought down (even when the test fails).
struct Sandbox {
    dir: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Sandbox {
    fn up(nodes: u32) -> Self {
        record_panic_messages();
        let tmp = tempfile::Builder::new()
            .prefix("ovnk-sbx-")
            .tempdir()
            .expect("temp dir");
        let dir = tmp.path().to_owned();
        let sb = Self { dir, _tmp: tmp };
        let n = nodes.to_string();
        ok(
            ovnk(&["sandbox", "up", "--dir", sb.d(), "--nodes", &n, "--quiet"]),
            "sandbox up",
        );
        sb
    }
    fn d(&self) -> &str {
        self.dir.to_str().expect("utf-8 temp dir")
    }
    fn kubectl(&self, args: &[&str]) -> Output {
        kubectl_as(&self.dir.join("kubeconfig"), args, None)
    }
    fn kubectl_stdin(&self, args: &[&str], input: &str) -> Output {
        kubectl_as(&self.dir.join("kubeconfig"), args, Some(input))
    }
    fn status(&self) -> Value {
        let s = ok(
            ovnk(&["sandbox", "status", "--dir", self.d(), "--json"]),
            "status",
        );
        serde_json::from_str(&s).expect("status --json is JSON")
    }
    fn connectivity(&self) -> Value {
        let s = ok(
            ovnk(&["sandbox", "connectivity", "--dir", self.d(), "--json"]),
            "connectivity",
        );
        serde_json::from_str(&s).expect("connectivity --json is JSON")
    }
    /// node name → tunnel peer names, from `status --json`.
    fn tunnels(&self) -> Vec<(String, Vec<String>)> {
        let s = self.status();
        s["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| {
                let t = n["tunnels"]
                    .as_array()
                    .expect("tunnels")
                    .iter()
                    .map(|x| x.as_str().expect("name").to_owned())
                    .collect();
                (n["name"].as_str().expect("name").to_owned(), t)
            })
            .collect()
    }
    #[track_caller]
    fn wait_for(&self, what: &str, timeout: Duration, mut f: impl FnMut(&Self) -> bool) {
        self.wait_ok(what, timeout, |s| {
            if f(s) { Ok(()) } else { Err(String::new()) }
        });
    }
    /// Polls `f` until it is `Ok`; on timeout the failure names the last `Err`.
    #[track_caller]
    fn wait_ok(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&Self) -> Result<(), String>,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let Err(why) = f(self) else { return };
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}{}{why}",
                if why.is_empty() { "" } else { ": " }
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    #[track_caller]
    fn create_pods(&self, per_node: u32, nodes: u32) {
        let mut yaml = String::new();
        for k in 1..=nodes {
            for i in 1..=per_node {
                yaml.push_str(&format!(
                    "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: p{k}-{i}\n  namespace: default\n  labels: {{app: probe}}\nspec:\n  nodeName: node{k}\n  containers:\n  - name: c\n    image: sandbox/probe\n"
                ));
            }
        }
        ok(
            self.kubectl_stdin(&["apply", "-f", "-"], &yaml),
            "kubectl apply pods",
        );
        let want = (per_node * nodes) as usize;
        self.wait_for("pods ready", Duration::from_secs(90), |s| {
            let st = s.status();
            st["pods"]
                .as_array()
                .is_some_and(|p| p.iter().filter(|p| p["ready"] == true).count() == want)
        });
    }
    /// Writes a kubeconfig for `user` in `group` (signed by the sandbox CA) and returns its path.
    fn kubeconfig_for(&self, user: &str, group: &str) -> PathBuf {
        let kc = ok(
            ovnk(&[
                "sandbox",
                "kubeconfig",
                "--dir",
                self.d(),
                "--user",
                user,
                "--group",
                group,
            ]),
            "kubeconfig",
        );
        let path = self
            .dir
            .join(format!("{}.kubeconfig", user.replace(':', "_")));
        std::fs::write(&path, kc).expect("write kubeconfig");
        path
    }
    fn sock(&self, node: &str, db: &str) -> String {
        format!(
            "unix:{}",
            self.dir
                .join("nodes")
                .join(node)
                .join(format!("{db}.sock"))
                .display()
        )
    }
}

/// The message of the panic that failed this test, kept so that `Drop` can repeat it after
/// the sandbox's own diagnostics: CI shows only the last lines of a failed test's output.
static PANIC_MESSAGE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

fn record_panic_messages() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = info
                .location()
                .map(|l| format!(" at {l}"))
                .unwrap_or_default();
            if let Ok(mut m) = PANIC_MESSAGE.lock() {
                m.get_or_insert(format!("{msg}{at}"));
            }
            default(info);
        }));
    });
}

fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Sandbox {
    /// On failure: the last lines of the supervisor's and each agent's log, then the status,
    /// (`Drop` prints the failure itself last, on one line).
    fn diagnose(&self) {
        eprintln!(
            "--- supervisor.log (tail)\n{}",
            tail(&self.dir.join("supervisor.log"), 15)
        );
        if let Ok(nodes) = std::fs::read_dir(self.dir.join("nodes")) {
            let mut nodes: Vec<PathBuf> = nodes.flatten().map(|e| e.path()).collect();
            nodes.sort();
            for n in nodes {
                eprintln!(
                    "--- {}/agent.log (tail)\n{}",
                    n.display(),
                    tail(&n.join("agent.log"), 8)
                );
            }
        }
        let st = ovnk(&["sandbox", "status", "--dir", self.d()]);
        eprintln!("--- status\n{}", String::from_utf8_lossy(&st.stdout));
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            self.diagnose();
        }
        let out = ovnk(&["sandbox", "down", "--dir", self.d()]);
        if !out.status.success() {
            eprintln!(
                "sandbox down failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        if failed {
            let msg = PANIC_MESSAGE
                .lock()
                .ok()
                .and_then(|m| m.clone())
                .unwrap_or_default();
            eprintln!("TEST FAILED: {}", msg.replace('\n', " ⏎ "));
        }
    }
}

/// A TCP connection from namespace `ns` to `dst`'s probe port, reading what the probe answers
/// (at most 200 bytes), given up after `timeout_s` seconds.
fn tcp_probe(ns: &str, dst: &str, timeout_s: u32) -> Output {
    run(Command::new("ip").args([
        "netns",
        "exec",
        ns,
        "timeout",
        &timeout_s.to_string(),
        "bash",
        "-c",
        &format!("exec 3<>/dev/tcp/{dst}/8080 && head -c 200 <&3"),
    ]))
}

/// `tool --db=DB --bare --columns=COLUMN find TABLE CONDITIONS…` (no condition: every row).
#[track_caller]
fn column(tool: &str, db: &str, column: &str, table: &str, conditions: &[&str]) -> String {
    let col = format!("--columns={column}");
    let mut args = vec!["--bare", col.as_str(), "find", table];
    args.extend_from_slice(conditions);
    ctl(tool, db, &args)
}

#[track_caller]
fn ctl(tool: &str, db: &str, args: &[&str]) -> String {
    ok(
        run(Command::new(tool).arg(format!("--db={db}")).args(args)),
        &format!("{tool} {args:?}"),
    )
}

/// Every row (table, uuid) of the tables the node agent writes, from one node's NB and SB.
fn owned_rows(sb: &Sandbox, node: &str) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for (tool, db, tables) in [
        (
            "ovn-nbctl",
            sb.sock(node, "nb"),
            &[
                "Logical_Switch",
                "Logical_Switch_Port",
                "Logical_Router",
                "Logical_Router_Port",
                "Logical_Router_Static_Route",
                "Logical_Router_Policy",
            ][..],
        ),
        ("ovn-sbctl", sb.sock(node, "sb"), &["Chassis", "Encap"][..]),
    ] {
        for t in tables {
            let s = column(tool, &db, "_uuid", t, &[]);
            for u in s.split_whitespace() {
                out.insert((t.to_string(), u.to_owned()));
            }
        }
    }
    out
}

fn names(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn four_nodes_full_mesh_connectivity_external_and_node_delete() {
    let sb = Sandbox::up(4);
    // every node holds exactly 3 tunnels, to the other three
    for (node, tunnels) in sb.tunnels() {
        let mut want: Vec<String> = (1..=4).map(|k| format!("node{k}")).collect();
        want.retain(|n| *n != node);
        assert_eq!(tunnels, want, "tunnels of {node}");
    }
    // `up` on a running sandbox refuses
    let again = ovnk(&["sandbox", "up", "--dir", sb.d(), "--nodes", "4"]);
    assert!(!again.status.success());
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("already running"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    sb.create_pods(2, 4);
    let c = sb.connectivity();
    let pairs = c["pairs"].as_array().expect("pairs");
    assert_eq!(pairs.len(), 8 * 7, "every ordered pod pair is probed");
    let bad: Vec<&Value> = pairs
        .iter()
        .filter(|p| p["tcp"] != true || p["icmp"] != true)
        .collect();
    assert!(bad.is_empty(), "unreachable pairs: {bad:?}");
    let ext = c["external"].as_array().expect("external");
    assert_eq!(ext.len(), 8);
    assert!(
        ext.iter().all(|e| e["tcp"] == true),
        "pod → external: {ext:?}"
    );

    // delete node4: the others drop its tunnel and every record of it; its pods go
    ok(
        sb.kubectl(&["delete", "node", "node4"]),
        "kubectl delete node",
    );
    sb.wait_for(
        "node4 gone from every tunnel mesh",
        Duration::from_secs(30),
        |s| {
            s.tunnels()
                .iter()
                .filter(|(n, _)| n != "node4")
                .all(|(_, t)| !t.contains(&"node4".to_owned()) && t.len() == 2)
        },
    );
    sb.wait_for("node4's pods deleted", Duration::from_secs(30), |s| {
        s.status()["pods"]
            .as_array()
            .is_some_and(|p| p.iter().all(|p| p["node"] != "node4"))
    });
    // The agents remove a deleted peer tunnel-first (OVS, then SB, then NB), so the NB rows may
    // still be on their way when the tunnels are already gone: wait for them, naming what is left.
    let leftovers = |sb: &Sandbox| -> Result<(), String> {
        let mut left = Vec::new();
        for node in ["node1", "node2", "node3"] {
            let chassis = column(
                "ovn-sbctl",
                &sb.sock(node, "sb"),
                "hostname",
                "Chassis",
                &[],
            );
            if chassis.contains("node4") {
                left.push(format!("{node} SB Chassis node4"));
            }
            let nbdb = sb.sock(node, "nb");
            let lsps = column("ovn-nbctl", &nbdb, "name", "Logical_Switch_Port", &[]);
            if lsps.contains("tstor-node4") {
                left.push(format!("{node} NB tstor-node4"));
            }
            let routes = column(
                "ovn-nbctl",
                &nbdb,
                "external_ids",
                "Logical_Router_Static_Route",
                &[],
            );
            if routes.contains("ic-node=node4") {
                left.push(format!("{node} NB routes to node4"));
            }
        }
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("still there: {left:?}"))
        }
    };
    sb.wait_ok(
        "every record of node4 gone from nodes 1-3",
        Duration::from_secs(30),
        leftovers,
    );

    // add it back: full mesh again
    let node4 = "apiVersion: v1\nkind: Node\nmetadata:\n  name: node4\n  labels:\n    kubernetes.io/hostname: node4\n";
    ok(
        sb.kubectl_stdin(&["create", "-f", "-"], node4),
        "kubectl create node",
    );
    sb.wait_for("full mesh again", Duration::from_secs(60), |s| {
        s.tunnels().iter().all(|(_, t)| t.len() == 3)
    });
}

#[test]
fn agent_sigkill_restart_converges_without_flaps() {
    let sb = Sandbox::up(3);
    sb.create_pods(1, 3);
    let before = owned_rows(&sb, "node1");
    let tunnels_before = column(
        "ovs-vsctl",
        &sb.sock("node1", "conf"),
        "_uuid",
        "Interface",
        &["type=geneve"],
    );

    // a probe across the restart: node1's pod connects to node2's and node3's pods every 50 ms
    let st = sb.status();
    let pods = st["pods"].as_array().expect("pods").clone();
    let netns1 = pods
        .iter()
        .find(|p| p["name"] == "p1-1")
        .and_then(|p| p["netns"].as_str())
        .expect("p1-1 netns")
        .to_owned();
    let ip_of = |name: &str| -> String {
        pods.iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["ip"].as_str())
            .expect("pod ip")
            .to_owned()
    };
    let (ip2, ip3) = (ip_of("p2-1"), ip_of("p3-1"));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let prober = std::thread::spawn(move || {
        let mut attempts = 0u32;
        let mut failures = Vec::new();
        while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
            for ip in [&ip2, &ip3] {
                let out = tcp_probe(&netns1, ip, 2);
                attempts += 1;
                if !out.status.success() {
                    failures.push(ip.clone());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        (attempts, failures)
    });

    std::thread::sleep(Duration::from_millis(500));
    let pid: i32 = std::fs::read_to_string(sb.dir.join("pids").join("node1-agent.pid"))
        .expect("agent pid file")
        .trim()
        .parse()
        .expect("pid");
    ok(
        run(Command::new("kill").args(["-9", &pid.to_string()])),
        "kill -9 agent",
    );
    // the supervisor restarts it (as a kubelet restarts a DaemonSet pod)
    sb.wait_for("a new node1 agent", Duration::from_secs(20), |s| {
        std::fs::read_to_string(s.dir.join("pids").join("node1-agent.pid"))
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok())
            .is_some_and(|p| p != pid)
    });
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (attempts, failures) = prober.join().expect("prober");
    assert!(attempts > 10, "the probe ran ({attempts} attempts)");
    assert!(
        failures.is_empty(),
        "probes failed across the restart: {failures:?}"
    );

    let after = owned_rows(&sb, "node1");
    assert_eq!(
        before, after,
        "the restarted agent neither duplicated nor replaced rows"
    );
    let tunnels_after = column(
        "ovs-vsctl",
        &sb.sock("node1", "conf"),
        "_uuid",
        "Interface",
        &["type=geneve"],
    );
    assert_eq!(tunnels_before, tunnels_after, "no tunnel was re-created");
    assert_eq!(names(&["node2", "node3"]), sb.tunnels()[0].1);
}

fn leftovers(dir: &Path, id: &str) -> (Vec<String>, Vec<String>) {
    let ns: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(&format!("ok-{id}-")))
                .collect()
        })
        .unwrap_or_default();
    let needle = dir.to_string_lossy().into_owned();
    let procs: Vec<String> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .chars()
                .all(|c| c.is_ascii_digit())
        })
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains(&needle).then_some(cmd)
        })
        .collect();
    (ns, procs)
}

#[test]
fn down_after_interrupted_up_leaves_nothing() {
    let tmp = tempfile::Builder::new()
        .prefix("ovnk-sbx-")
        .tempdir()
        .expect("temp dir");
    let d = tmp.path().to_str().expect("utf-8").to_owned();
    let mut up = Command::new(OVNK)
        .args(["sandbox", "up", "--dir", &d, "--nodes", "3", "--quiet"])
        .spawn()
        .expect("up");
    // interrupt once the node stacks are being started
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let p = std::fs::read_to_string(tmp.path().join("progress")).unwrap_or_default();
        if p.contains("OVN stack up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "up never got to the node stacks: {p}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let sup: i32 = std::fs::read_to_string(tmp.path().join("pids").join("supervisor.pid"))
        .expect("supervisor pid")
        .trim()
        .parse()
        .expect("pid");
    // the worst case: both `up` and the supervisor die without any cleanup
    let _ = up.kill();
    let _ = up.wait();
    ok(
        run(Command::new("kill").args(["-9", &sup.to_string()])),
        "kill -9 supervisor",
    );
    let st: Value = serde_json::from_str(
        &std::fs::read_to_string(tmp.path().join("sandbox.json")).expect("sandbox.json"),
    )
    .expect("json");
    let id = st["layout"]["id"].as_str().expect("id").to_owned();
    let (ns, procs) = leftovers(tmp.path(), &id);
    assert!(
        !ns.is_empty() && !procs.is_empty(),
        "the interrupted up left things to clean"
    );

    ok(ovnk(&["sandbox", "down", "--dir", &d]), "sandbox down");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (ns, procs) = leftovers(tmp.path(), &id);
        if ns.is_empty() && procs.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: namespaces {ns:?}, processes {procs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The zone model of the trust-zones test: a node's zones, from its labels (TrustZones
/// `tenant-a` ⇐ `tenant=a`, `tenant-b` ⇐ `tenant=b`, while they exist) and its annotation.
#[derive(Clone)]
struct ZoneWorld {
    labels: Vec<(String, Option<&'static str>)>,
    annotated: Vec<(String, Vec<&'static str>)>,
    trust_zones: Vec<(&'static str, &'static str)>,
}

impl ZoneWorld {
    fn zones(&self, node: &str) -> BTreeSet<String> {
        let mut z = BTreeSet::new();
        if let Some((_, Some(l))) = self.labels.iter().find(|(n, _)| n == node) {
            for (tz, want) in &self.trust_zones {
                if want == l {
                    z.insert(tz.to_string());
                }
            }
        }
        if let Some((_, a)) = self.annotated.iter().find(|(n, _)| n == node) {
            z.extend(a.iter().map(|s| s.to_string()));
        }
        z
    }
    fn connected(&self, a: &str, b: &str) -> bool {
        let (za, zb) = (self.zones(a), self.zones(b));
        (za.is_empty() && zb.is_empty()) || za.intersection(&zb).next().is_some()
    }
    fn peers(&self, node: &str, all: &[String]) -> Vec<String> {
        all.iter()
            .filter(|n| *n != node && self.connected(node, n))
            .cloned()
            .collect()
    }
}

/// Waits until every node's tunnels, every node's SB/NB remote records and the pod matrix
/// equal what the zone model says.
fn assert_zones_converge(sb: &Sandbox, world: &ZoneWorld, nodes: &[String], step: &str) {
    sb.wait_for(
        &format!("{step}: tunnel matrix"),
        Duration::from_secs(30),
        |s| s.tunnels().iter().all(|(n, t)| *t == world.peers(n, nodes)),
    );
    for n in nodes {
        let want: BTreeSet<String> = world.peers(n, nodes).into_iter().collect();
        let sbdb = sb.sock(n, "sb");
        let hosts: BTreeSet<String> = column(
            "ovn-sbctl",
            &sbdb,
            "hostname",
            "Chassis",
            &["other_config:is-remote=true"],
        )
        .split_whitespace()
        .map(str::to_owned)
        .collect();
        assert_eq!(hosts, want, "{step}: remote Chassis rows in {n}'s SB");
        let nbdb = sb.sock(n, "nb");
        let remote_ports: BTreeSet<String> = column(
            "ovn-nbctl",
            &nbdb,
            "name",
            "Logical_Switch_Port",
            &["type=remote"],
        )
        .split_whitespace()
        .filter_map(|p| p.strip_prefix("tstor-").map(str::to_owned))
        .collect();
        assert_eq!(
            remote_ports, want,
            "{step}: remote transit ports in {n}'s NB"
        );
        let routed: BTreeSet<String> = column(
            "ovn-nbctl",
            &nbdb,
            "external_ids",
            "Logical_Router_Static_Route",
            &[],
        )
        .split_whitespace()
        .filter_map(|kv| {
            kv.strip_prefix("ic-node=")
                .map(|v| v.trim_matches('"').to_owned())
        })
        .collect();
        assert_eq!(routed, want, "{step}: static routes in {n}'s NB");
    }
    let c = sb.connectivity();
    let pod_node = |p: &str| -> String {
        // pods are named z<K>, one per node
        format!("node{}", p.trim_start_matches("default/z"))
    };
    for p in c["pairs"].as_array().expect("pairs") {
        let (from, to) = (
            pod_node(p["from"].as_str().expect("from")),
            pod_node(p["to"].as_str().expect("to")),
        );
        let want = world.connected(&from, &to);
        assert_eq!(p["tcp"] == true, want, "{step}: TCP {from} → {to}: {p}");
        assert_eq!(p["icmp"] == true, want, "{step}: ICMP {from} → {to}: {p}");
    }
}

#[test]
fn trust_zones_and_transport_zones_isolate_tenants() {
    let nodes: Vec<String> = (1..=7).map(|k| format!("node{k}")).collect();
    let sb = Sandbox::up(7);
    let tz = |name: &str, value: &str| {
        format!(
            "apiVersion: k8s.ovn.org/v1alpha1\nkind: TrustZone\nmetadata:\n  name: {name}\nspec:\n  nodeSelector:\n    matchLabels:\n      tenant: {value}\n"
        )
    };
    // tenant A by label (TrustZone), tenant B by label and by annotation, a gateway node in
    // both, two zone-less nodes
    ok(
        sb.kubectl_stdin(
            &["apply", "-f", "-"],
            &(tz("tenant-a", "a") + "---\n" + &tz("tenant-b", "b")),
        ),
        "TrustZones",
    );
    for (n, l) in [
        ("node1", "a"),
        ("node2", "a"),
        ("node3", "b"),
        ("node5", "a"),
    ] {
        ok(
            sb.kubectl(&["label", "node", n, &format!("tenant={l}")]),
            "label",
        );
    }
    for n in ["node4", "node5"] {
        ok(
            sb.kubectl(&[
                "annotate",
                "node",
                n,
                r#"k8s.ovn.org/transport-zones=["tenant-b"]"#,
            ]),
            "annotate",
        );
    }
    let mut world = ZoneWorld {
        labels: vec![
            ("node1".into(), Some("a")),
            ("node2".into(), Some("a")),
            ("node3".into(), Some("b")),
            ("node5".into(), Some("a")),
        ],
        annotated: vec![
            ("node4".into(), vec!["tenant-b"]),
            ("node5".into(), vec!["tenant-b"]),
        ],
        trust_zones: vec![("tenant-a", "a"), ("tenant-b", "b")],
    };
    let mut yaml = String::new();
    for k in 1..=7 {
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: z{k}, namespace: default}}\nspec:\n  nodeName: node{k}\n  containers: [{{name: c, image: sandbox/probe}}]\n"
        ));
    }
    ok(sb.kubectl_stdin(&["apply", "-f", "-"], &yaml), "pods");
    sb.wait_for("7 pods ready", Duration::from_secs(60), |s| {
        s.status()["pods"]
            .as_array()
            .is_some_and(|p| p.iter().filter(|p| p["ready"] == true).count() == 7)
    });
    assert_zones_converge(&sb, &world, &nodes, "initial");

    // cross-zone traffic fails by every path, same-zone traffic by the same paths works
    let st = sb.status();
    let pod = |name: &str| -> (String, String) {
        let p = st["pods"]
            .as_array()
            .expect("pods")
            .iter()
            .find(|p| p["name"] == name)
            .expect("pod")
            .clone();
        (
            p["netns"].as_str().expect("netns").to_owned(),
            p["ip"].as_str().expect("ip").to_owned(),
        )
    };
    let (ns1, _) = pod("z1");
    let (_, ip2) = pod("z2"); // tenant A, like z1
    let (_, ip3) = pod("z3"); // tenant B
    let tcp = |ns: &str, ip: &str| -> bool { tcp_probe(ns, ip, 3).status.success() };
    // (1) pod to pod
    assert!(tcp(&ns1, &ip2) && !tcp(&ns1, &ip3));
    // (2) through the node's management port and kernel: route the peer via 10.244.x.2
    let mgmt = |ip: &str| -> String {
        let mut o: Vec<&str> = ip.split('.').collect();
        o[3] = "2";
        o.join(".")
    };
    let (_, ip1) = pod("z1");
    for ip in [&ip2, &ip3] {
        ok(
            run(Command::new("ip").args([
                "-n",
                &ns1,
                "route",
                "replace",
                &format!("{ip}/32"),
                "via",
                &mgmt(&ip1),
            ])),
            "pod route via mgmt",
        );
    }
    assert!(tcp(&ns1, &ip2), "same zone through the kernel path");
    assert!(
        !tcp(&ns1, &ip3),
        "cross-zone through node1's management port and kernel"
    );
    for ip in [&ip2, &ip3] {
        ok(
            run(Command::new("ip").args(["-n", &ns1, "route", "del", &format!("{ip}/32")])),
            "del route",
        );
    }
    // (3) from node1's own network namespace (host network: the kernel routes the cluster
    // CIDR into OVN through the management port)
    let layout_id = {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(sb.dir.join("sandbox.json")).expect("sandbox.json"),
        )
        .expect("json");
        v["layout"]["id"].as_str().expect("id").to_owned()
    };
    let node1_ns = format!("ok-{layout_id}-node1");
    assert!(tcp(&node1_ns, &ip2), "same zone from node1's host network");
    assert!(
        !tcp(&node1_ns, &ip3),
        "cross-zone from node1's host network"
    );
    // (4) from the external namespace, entering the cluster at node1 (zone A). There is no
    // positive control here: a reply would leave through the pod's own node and be SNATed,
    // so only the negative is meaningful — OVN on node1 must drop it.
    let ext = format!("ok-{layout_id}-ext");
    ok(
        run(Command::new("ip").args([
            "-n",
            &ext,
            "route",
            "replace",
            &format!("{ip3}/32"),
            "via",
            "172.18.0.11",
        ])),
        "external route via node1",
    );
    assert!(!tcp(&ext, &ip3), "cross-zone from outside through node1");

    // relabel node2 from A to B
    ok(
        sb.kubectl(&["label", "node", "node2", "tenant=b", "--overwrite"]),
        "relabel",
    );
    world.labels[1].1 = Some("b");
    assert_zones_converge(&sb, &world, &nodes, "relabel node2 a→b");
    // delete TrustZone tenant-a: node1 becomes zone-less, node5 keeps tenant-b
    ok(
        sb.kubectl(&["delete", "trustzone", "tenant-a"]),
        "delete TrustZone",
    );
    world.trust_zones.retain(|(z, _)| *z != "tenant-a");
    assert_zones_converge(&sb, &world, &nodes, "delete TrustZone tenant-a");
    // annotate a zone-less node
    ok(
        sb.kubectl(&[
            "annotate",
            "node",
            "node6",
            r#"k8s.ovn.org/transport-zones=["tenant-b"]"#,
        ]),
        "annotate node6",
    );
    world.annotated.push(("node6".into(), vec!["tenant-b"]));
    assert_zones_converge(&sb, &world, &nodes, "annotate node6");
}

#[test]
fn rogue_node_cannot_put_itself_into_a_zone() {
    let sb = Sandbox::up(2);
    let tz = "apiVersion: k8s.ovn.org/v1alpha1\nkind: TrustZone\nmetadata:\n  name: tenant-a\nspec:\n  nodeSelector:\n    matchLabels:\n      tenant: a\n";
    ok(sb.kubectl_stdin(&["apply", "-f", "-"], tz), "TrustZone");
    // the CRD schema refuses an operator the API does not have
    let bad = "apiVersion: k8s.ovn.org/v1alpha1\nkind: TrustZone\nmetadata:\n  name: typo\nspec:\n  nodeSelector:\n    matchExpressions:\n    - {key: tenant, operator: Near, values: [a]}\n";
    let out = sb.kubectl_stdin(&["apply", "-f", "-"], bad);
    assert!(
        !out.status.success(),
        "a TrustZone with operator Near was accepted"
    );
    // the identity service protects the selector's key once it has seen the TrustZone
    sb.wait_for(
        "the webhook to protect `tenant`",
        Duration::from_secs(20),
        |s| {
            std::fs::read_to_string(s.dir.join("identity.log")).is_ok_and(|l| {
                l.lines()
                    .any(|l| l.contains("protected") && l.contains("tenant"))
            })
        },
    );
    for (user, group) in [
        ("system:node:node1", "system:nodes"),
        ("system:ovn-node:node1", "system:ovn-nodes"),
    ] {
        let path = sb.kubeconfig_for(user, group);
        let as_node = |args: &[&str]| -> Output { kubectl_as(&path, args, None) };
        let refused = |out: &Output, what: &str| -> String {
            assert!(!out.status.success(), "{user}: {what} was allowed");
            String::from_utf8_lossy(&out.stderr).into_owned()
        };
        let by_webhook = |err: String, what: &str| {
            assert!(
                err.contains("denied") || err.contains("not allowed"),
                "{user}: {what}: not refused by the identity webhook: {err}"
            );
        };
        // through the Node itself (RBAC or the webhook may refuse) …
        refused(
            &as_node(&["label", "node", "node1", "tenant=a"]),
            "label tenant=a",
        );
        refused(
            &as_node(&[
                "annotate",
                "node",
                "node1",
                r#"k8s.ovn.org/transport-zones=["tenant-a"]"#,
            ]),
            "annotate transport-zones",
        );
        // … and through nodes/status, which both identities may update: a PUT of the current
        // Node with the zone label / annotation added, refused by the webhook
        let current: Value = serde_json::from_str(&ok(
            sb.kubectl(&["get", "node", "node1", "-o", "json"]),
            "get node",
        ))
        .expect("node json");
        let mut with_label = current.clone();
        with_label["metadata"]["labels"]["tenant"] = Value::from("a");
        let mut with_annotation = current.clone();
        with_annotation["metadata"]["annotations"]["k8s.ovn.org/transport-zones"] =
            Value::from(r#"["tenant-a"]"#);
        for (obj, what) in [
            (with_label, "status label"),
            (with_annotation, "status annotation"),
        ] {
            let file = sb.dir.join("node1-status.json");
            std::fs::write(&file, obj.to_string()).expect("write");
            let out = as_node(&[
                "replace",
                "--raw",
                "/api/v1/nodes/node1/status",
                "-f",
                file.to_str().expect("utf-8"),
            ]);
            by_webhook(refused(&out, what), what);
        }
        // a kubelet's own label write reaches the webhook too
        if user.starts_with("system:node:") {
            let out = as_node(&["label", "node", "node1", "tenant=a"]);
            by_webhook(refused(&out, "label"), "label");
        }
    }
    // the kubelet may still set labels nobody selects on (control: the denials above are about
    // the zone keys, not about labels in general)
    let path = sb.kubeconfig_for("system:node:node1", "system:nodes");
    ok(
        kubectl_as(&path, &["label", "node", "node1", "rack=r1"], None),
        "kubelet sets an unselected label",
    );
    // and neither node joined the zone
    let zones = sb.status()["nodes"].as_array().expect("nodes").clone();
    assert!(
        zones
            .iter()
            .all(|n| n["tunnels"].as_array().is_some_and(|t| t.len() == 1))
    );
    let labels = ok(
        sb.kubectl(&["get", "node", "node1", "-o", "jsonpath={.metadata.labels}"]),
        "labels",
    );
    assert!(!labels.contains("\"tenant\""), "{labels}");
}

/// The packet counters of the fwmark test's own nft table in a node namespace: rule comment →
/// packets.
fn fwmark_counters(netns: &str, table: &str) -> std::collections::BTreeMap<String, u64> {
    let out = ok(
        run(Command::new("ip").args([
            "netns", "exec", netns, "nft", "-j", "list", "table", "inet", table,
        ])),
        "nft list (test table)",
    );
    let v: Value = serde_json::from_str(&out).expect("nft -j is JSON");
    let mut m = std::collections::BTreeMap::new();
    for o in v["nftables"].as_array().expect("nftables") {
        let r = &o["rule"];
        let (Some(c), Some(expr)) = (r["comment"].as_str(), r["expr"].as_array()) else {
            continue;
        };
        let n = expr
            .iter()
            .find_map(|e| e["counter"]["packets"].as_u64())
            .expect("rule has a counter");
        m.insert(c.to_owned(), n);
    }
    m
}

/// The source addresses in ovnk's ServiceFWMark table (`inet ovnk-fwmark`) of a node namespace.
fn fwmark_elements(netns: &str) -> String {
    let out = run(Command::new("ip").args([
        "netns",
        "exec",
        netns,
        "nft",
        "-j",
        "list",
        "table",
        "inet",
        "ovnk-fwmark",
    ]));
    if !out.status.success() {
        return String::new();
    }
    let v: Value = serde_json::from_str(&String::from_utf8_lossy(&out.stdout)).expect("JSON");
    v["nftables"]
        .as_array()
        .expect("nftables")
        .iter()
        .filter(|o| o["map"].is_object())
        .map(|o| o["map"]["elem"].to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn service_fwmark_marks_real_pod_traffic_on_the_node() {
    const MARK: u32 = 1500; // in the schema's 1000..2000, not 1008 (OVN-K's 0x3f0)
    const T: &str = "fwmark-e2e";
    let sb = Sandbox::up(2);
    let pod = |name: &str, node: &str, app: &str| {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: default\n  labels: {{app: {app}}}\nspec:\n  nodeName: {node}\n  containers: [{{name: c, image: sandbox/probe}}]\n"
        )
    };
    let yaml = pod("web-1a", "node1", "web")
        + &pod("web-1b", "node1", "web")
        + &pod("web-2a", "node2", "web")
        + &pod("other-1", "node1", "other")
        + "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web\n  namespace: default\nspec:\n  selector: {app: web}\n  ports: [{port: 8080, targetPort: 8080, protocol: TCP}]\n";
    ok(
        sb.kubectl_stdin(&["apply", "-f", "-"], &yaml),
        "pods and Service",
    );
    sb.wait_for("4 pods ready", Duration::from_secs(90), |s| {
        s.status()["pods"]
            .as_array()
            .is_some_and(|p| p.iter().filter(|p| p["ready"] == true).count() == 4)
    });
    let st = sb.status();
    let pods = st["pods"].as_array().expect("pods").clone();
    let get = |name: &str, key: &str| -> String {
        pods.iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p[key].as_str())
            .unwrap_or_else(|| panic!("{name}: no {key} in status: {pods:?}"))
            .to_owned()
    };
    let id = {
        let v: Value = serde_json::from_str(
            &std::fs::read_to_string(sb.dir.join("sandbox.json")).expect("sandbox.json"),
        )
        .expect("json");
        v["layout"]["id"].as_str().expect("id").to_owned()
    };
    let node1 = format!("ok-{id}-node1");
    let endpoints = ["web-1a", "web-1b"];
    let (other_ip, remote_ip) = (get("other-1", "ip"), get("web-2a", "ip"));

    // the test's own table in node1: what leaves towards the outside (postrouting, before SNAT)
    // and what arrives for node1 itself (input), counted by source and mark
    let mut rules = String::new();
    rules.push_str(&format!(
        "add rule inet {T} post meta mark {MARK} counter comment \"marked\"\n"
    ));
    for n in endpoints {
        let ip = get(n, "ip");
        rules.push_str(&format!(
            "add rule inet {T} post ip saddr {ip} counter comment \"{n}\"\n\
             add rule inet {T} post ip saddr {ip} meta mark {MARK} counter comment \"{n}-marked\"\n"
        ));
    }
    rules.push_str(&format!(
        "add rule inet {T} post ip saddr {other_ip} counter comment \"other\"\n\
         add rule inet {T} post ip saddr {other_ip} meta mark {MARK} counter comment \"other-marked\"\n\
         add rule inet {T} in ip saddr {remote_ip} counter comment \"remote\"\n\
         add rule inet {T} in ip saddr {remote_ip} meta mark {MARK} counter comment \"remote-marked\"\n"
    ));
    let script = format!(
        "add table inet {T}\n\
         add chain inet {T} post {{ type filter hook postrouting priority 0; policy accept; }}\n\
         add chain inet {T} in {{ type filter hook input priority 0; policy accept; }}\n{rules}"
    );
    let f = sb.dir.join("fwmark-e2e.nft");
    std::fs::write(&f, script).expect("write nft script");
    ok(
        run(Command::new("ip").args([
            "netns",
            "exec",
            &node1,
            "nft",
            "-f",
            f.to_str().expect("utf-8"),
        ])),
        "the test's nft table in node1",
    );

    let tcp = |ns: &str, dst: &str| -> Output { tcp_probe(ns, dst, 3) };
    let to_external = |name: &str| {
        let out = ok(
            tcp(&get(name, "netns"), "172.18.0.1"),
            &format!("{name} → external"),
        );
        assert!(
            out.contains("172.18.0.11"),
            "{name} → external left node1 SNATed: {out}"
        );
    };
    // node2's pod → node1's own management address: arrives in node1's kernel through OVN
    let node1_mgmt = {
        let mut o: Vec<String> = get("web-1a", "ip").split('.').map(str::to_owned).collect();
        o[3] = "2".into();
        o.join(".")
    };
    let remote_to_node1 = || {
        // only the packets matter (node1 may refuse the connection)
        let _ = tcp(&get("web-2a", "netns"), &node1_mgmt);
    };

    ok(
        sb.kubectl_stdin(
            &["apply", "-f", "-"],
            &format!(
                "apiVersion: k8s.ovn.org/v1\nkind: ServiceFWMark\nmetadata:\n  name: web\n  namespace: default\nspec:\n  fwmark: {MARK}\n"
            ),
        ),
        "ServiceFWMark",
    );
    let quoted = |ip: &str| format!("\"{ip}\"");
    sb.wait_for(
        "node1's ovnk table marks its two endpoints",
        Duration::from_secs(60),
        |_| {
            let e = fwmark_elements(&node1);
            endpoints.iter().all(|n| e.contains(&quoted(&get(n, "ip"))))
        },
    );
    let e = fwmark_elements(&node1);
    assert!(
        !e.contains(&quoted(&other_ip)) && !e.contains(&quoted(&remote_ip)),
        "node1 marks only its own endpoints: {e}"
    );
    sb.wait_for("ServiceFWMark Ready=True", Duration::from_secs(60), |s| {
        let out = s.kubectl(&["get", "servicefwmark", "web", "-n", "default", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
    });

    let before = fwmark_counters(&node1, T);
    for n in endpoints {
        to_external(n);
    }
    to_external("other-1");
    remote_to_node1();
    let after = fwmark_counters(&node1, T);
    let grew = |k: &str| after[k] > before[k];
    eprintln!("counters with the ServiceFWMark: before {before:?} after {after:?}");
    for n in endpoints {
        assert!(grew(n), "{n}'s traffic went through node1: {after:?}");
        assert!(
            grew(&format!("{n}-marked")),
            "{n}'s traffic is marked: {after:?}"
        );
    }
    assert!(grew("marked"));
    assert!(
        grew("other"),
        "the non-selected pod's traffic went through node1"
    );
    assert_eq!(
        after["other-marked"], 0,
        "the non-selected pod is never marked"
    );
    assert!(grew("remote"), "node2's pod reached node1's kernel");
    assert_eq!(
        after["remote-marked"], 0,
        "node2's pod is never marked on node1"
    );

    // delete the ServiceFWMark: node1's table holds no pod any more, the marks stop
    ok(
        sb.kubectl(&["delete", "servicefwmark", "web", "-n", "default"]),
        "delete ServiceFWMark",
    );
    sb.wait_for(
        "node1's ovnk table without the endpoints",
        Duration::from_secs(60),
        |_| {
            let e = fwmark_elements(&node1);
            [endpoints[0], endpoints[1], "other-1", "web-2a"]
                .iter()
                .all(|n| !e.contains(&quoted(&get(n, "ip"))))
        },
    );
    let before = fwmark_counters(&node1, T);
    for n in endpoints {
        to_external(n);
    }
    remote_to_node1();
    let after = fwmark_counters(&node1, T);
    eprintln!("counters without the ServiceFWMark: before {before:?} after {after:?}");
    for n in endpoints {
        assert!(
            grew_by(&before, &after, n),
            "{n}'s traffic went through node1"
        );
    }
    assert_eq!(
        after["marked"], before["marked"],
        "nothing is marked any more"
    );
    assert_eq!(after["remote-marked"], 0);

    // a reserved value (OVN-K's 0x3f0) passes the schema but is never applied: MarkValid=False
    // from the status writer and a Warning Event from each node naming the object
    ok(
        sb.kubectl_stdin(
            &["apply", "-f", "-"],
            "apiVersion: k8s.ovn.org/v1\nkind: ServiceFWMark\nmetadata:\n  name: web\n  namespace: default\nspec:\n  fwmark: 1008\n",
        ),
        "ServiceFWMark with a reserved mark",
    );
    sb.wait_for("MarkValid=False", Duration::from_secs(60), |s| {
        let out = s.kubectl(&["get", "servicefwmark", "web", "-n", "default", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        v["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["type"] == "MarkValid"
                    && c["status"] == "False"
                    && c["reason"] == "ReservedMarkCollision"
            })
        })
    });
    sb.wait_for(
        "a FWMarkNotApplied Event from each node",
        Duration::from_secs(60),
        |s| {
            let out = s.kubectl(&["get", "events.events.k8s.io", "-n", "default", "-o", "json"]);
            let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            let nodes: BTreeSet<String> = v["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|e| {
                    e["type"] == "Warning"
                        && e["reason"] == "FWMarkNotApplied"
                        && e["regarding"]["kind"] == "ServiceFWMark"
                        && e["regarding"]["name"] == "web"
                        && e["note"]
                            .as_str()
                            .is_some_and(|n| n.contains("default/web"))
                })
                .filter_map(|e| e["reportingInstance"].as_str().map(str::to_owned))
                .collect();
            nodes.len() == 2
        },
    );
    let e = fwmark_elements(&node1);
    assert!(
        [endpoints[0], endpoints[1]]
            .iter()
            .all(|n| !e.contains(&quoted(&get(n, "ip")))),
        "a reserved mark is not applied on node1: {e}"
    );
}

fn grew_by(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
    k: &str,
) -> bool {
    after[k] > before[k]
}

/// A CSR PEM for `cn` in `system:ovn-nodes`, with `sans` DNS names (none for a correct one).
fn csr_pem(cn: &str, sans: &[&str]) -> String {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("params");
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::OrganizationName, "system:ovn-nodes");
    dn.push(rcgen::DnType::CommonName, cn);
    params.distinguished_name = dn;
    params
        .serialize_request(&key)
        .expect("csr")
        .pem()
        .expect("pem")
}

#[test]
fn node_identity_bootstrap_rotation_webhook_and_approver() {
    use base64::Engine as _;
    // short-lived certificates so that rotation happens during the test
    let tmp = tempfile::Builder::new()
        .prefix("ovnk-sbx-")
        .tempdir()
        .expect("temp dir");
    let dir = tmp.path().to_owned();
    let sb = Sandbox { dir, _tmp: tmp };
    ok(
        ovnk(&[
            "sandbox",
            "up",
            "--dir",
            sb.d(),
            "--nodes",
            "2",
            "--quiet",
            "--node-cert-duration",
            "12s",
        ]),
        "sandbox up",
    );
    // every agent bootstraps (CSR as system:node:<node>) and then rotates at least twice (CSRs
    // made with its own certificate, as system:ovn-node:<node>), all approved and issued
    sb.wait_for("two rotations per node", Duration::from_secs(60), |s| {
        let out = s.kubectl(&["get", "csr", "-o", "json"]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        let items = v["items"].as_array().cloned().unwrap_or_default();
        ["node1", "node2"].iter().all(|n| {
            let issued = |user: &str| {
                items
                    .iter()
                    .filter(|c| {
                        c["spec"]["username"] == user && c["status"]["certificate"].is_string()
                    })
                    .count()
            };
            issued(&format!("system:node:{n}")) >= 1 && issued(&format!("system:ovn-node:{n}")) >= 2
        })
    });
    // the agents keep working across rotations
    assert!(sb.tunnels().iter().all(|(_, t)| t.len() == 1));

    let kubeconfig = |user: &str, group: &str| sb.kubeconfig_for(user, group);
    let ovn1 = kubeconfig("system:ovn-node:node1", "system:ovn-nodes");
    let put_status = |kc: &Path, path: &str, obj: &Value| -> Output {
        let file = sb.dir.join("put.json");
        std::fs::write(&file, obj.to_string()).expect("write");
        kubectl_as(
            kc,
            &[
                "replace",
                "--raw",
                path,
                "-f",
                file.to_str().expect("utf-8"),
            ],
            None,
        )
    };
    let node = |name: &str| -> Value {
        serde_json::from_str(&ok(
            sb.kubectl(&["get", "node", name, "-o", "json"]),
            "get node",
        ))
        .expect("json")
    };
    let refused = |out: Output, want: &str, what: &str| {
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{what} was allowed");
        assert!(err.contains(want), "{what}: expected {want:?} in: {err}");
    };
    // its own node's allowed annotation: allowed
    let mut n1 = node("node1");
    n1["metadata"]["annotations"]["k8s.ovn.org/host-cidrs"] = Value::from(r#"["172.18.0.11/16"]"#);
    ok(
        put_status(&ovn1, "/api/v1/nodes/node1/status", &n1),
        "own allowed annotation",
    );
    // node2, a label, a non-listed annotation, the zone annotation: denied with upstream's
    // messages (ovnk's own for the zone annotation)
    let denials = [
        (
            "node2",
            "annotations",
            "k8s.ovn.org/host-cidrs",
            r#"["172.18.0.99/16"]"#,
            "ovnkube-node on node: \"node1\" is not allowed to modify nodes \"node2\"",
            "changing node2",
        ),
        (
            "node1",
            "labels",
            "rack",
            "r9",
            "is not allowed to modify anything other than annotations",
            "a label",
        ),
        (
            "node1",
            "annotations",
            "example.com/x",
            "1",
            "is not allowed to set the following annotations: [example.com/x]",
            "a non-listed annotation",
        ),
        (
            "node1",
            "annotations",
            "k8s.ovn.org/transport-zones",
            r#"["x"]"#,
            "k8s.ovn.org/transport-zones",
            "the zone annotation",
        ),
    ];
    for (target, field, key, value, want, what) in denials {
        let mut obj = node(target);
        obj["metadata"][field][key] = Value::from(value);
        refused(
            put_status(&ovn1, &format!("/api/v1/nodes/{target}/status"), &obj),
            want,
            what,
        );
    }
    // another node's pod
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: on2, namespace: default}\nspec:\n  nodeName: node2\n  containers: [{name: c, image: sandbox/probe}]\n";
    ok(sb.kubectl_stdin(&["apply", "-f", "-"], pod), "pod on node2");
    sb.wait_for("pod on node2 annotated", Duration::from_secs(30), |s| {
        s.kubectl(&[
            "get",
            "pod",
            "on2",
            "-o",
            "jsonpath={.metadata.annotations}",
        ])
        .stdout
        .windows(12)
        .any(|w| w == b"pod-networks")
    });
    let mut p: Value = serde_json::from_str(&ok(
        sb.kubectl(&["get", "pod", "on2", "-o", "json"]),
        "get pod",
    ))
    .expect("json");
    p["metadata"]["annotations"]["k8s.ovn.org/pod-networks"] = Value::from("{}");
    refused(
        put_status(&ovn1, "/api/v1/namespaces/default/pods/on2/status", &p),
        "node1",
        "another node's pod",
    );

    // the approver denies bad CSRs (submitted with node1's kubelet identity) with an Event
    let kubelet1 = kubeconfig("system:node:node1", "system:nodes");
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let cases = [
        (
            "other-node",
            csr_pem("system:ovn-node:node2", &[]),
            "[\"digital signature\",\"client auth\"]",
            600,
        ),
        (
            "sans",
            csr_pem("system:ovn-node:node1", &["evil.example.com"]),
            "[\"digital signature\",\"client auth\"]",
            600,
        ),
        (
            "usages",
            csr_pem("system:ovn-node:node1", &[]),
            "[\"digital signature\",\"server auth\"]",
            600,
        ),
        (
            "two-years",
            csr_pem("system:ovn-node:node1", &[]),
            "[\"digital signature\",\"client auth\"]",
            63_072_000,
        ),
    ];
    for (name, pem, usages, secs) in &cases {
        let obj = format!(
            r#"{{"apiVersion":"certificates.k8s.io/v1","kind":"CertificateSigningRequest","metadata":{{"name":"bad-{name}"}},"spec":{{"request":"{}","signerName":"kubernetes.io/kube-apiserver-client","usages":{usages},"expirationSeconds":{secs}}}}}"#,
            b64(pem)
        );
        let out = kubectl_as(&kubelet1, &["create", "-f", "-"], Some(&obj));
        ok(out, &format!("creating CSR bad-{name}"));
    }
    for (name, _, _, _) in &cases {
        let csr = format!("bad-{name}");
        sb.wait_for(&format!("{csr} denied"), Duration::from_secs(30), |s| {
            let out = s.kubectl(&[
                "get",
                "csr",
                &csr,
                "-o",
                "jsonpath={.status.conditions[*].type}",
            ]);
            String::from_utf8_lossy(&out.stdout).contains("Denied")
        });
        let cert = ok(
            sb.kubectl(&["get", "csr", &csr, "-o", "jsonpath={.status.certificate}"]),
            "cert",
        );
        assert!(cert.is_empty(), "{csr} was issued a certificate");
        sb.wait_for(
            &format!("an Event for {csr}"),
            Duration::from_secs(30),
            |s| {
                let out = s.kubectl(&[
                    "get",
                    "events",
                    "-A",
                    "--field-selector",
                    &format!("involvedObject.name={csr}"),
                    "-o",
                    "name",
                ]);
                !out.stdout.is_empty()
            },
        );
    }
}
