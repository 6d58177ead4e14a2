//! `ovnk sandbox …` subcommands.

use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::layout::{self, Layout};
use crate::netns;
use crate::state::{self, SandboxState};

/// `ovnk sandbox <command>`.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start a cluster: the API server, the cluster manager, and per node a network namespace
    /// with its own OVN stack and node agent. Returns when every Node is Ready and the Geneve
    /// mesh is up.
    Up(UpArgs),
    /// Stop everything a sandbox started (by PID, in order) and delete its namespaces; also
    /// cleans up after a crashed or interrupted `up`.
    Down(DirArgs),
    /// Per node: namespace, chassis, encap IP, readiness and the tunnels in its own OVS
    /// database; per pod: node, IP, readiness.
    Status(ReportArgs),
    /// Pod-to-pod reachability (TCP connect and ICMP echo) and pod-to-external, measured with
    /// real packets.
    Connectivity(ConnectivityArgs),
    /// Run a command inside a pod's network namespace.
    Exec(ExecArgs),
    /// A narrated walkthrough on a fresh sandbox: nodes, pods, the tunnel mesh, connectivity.
    Demo(DemoArgs),
    /// (internal) The long-lived supervisor `up` starts.
    #[command(hide = true)]
    Supervise(DirArgs),
    #[command(flatten)]
    Apiserver(apiserver::cli::Command),
}

/// `--dir`.
#[derive(Args, Debug, Clone)]
pub struct DirArgs {
    /// The sandbox's state directory (databases, sockets, logs, kubeconfig).
    #[arg(long, env = "OVNK_SANDBOX_DIR")]
    pub dir: PathBuf,
}

/// `up`.
#[derive(Args, Debug, Clone)]
pub struct UpArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Number of nodes (`node1`…`nodeN`).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=200))]
    pub nodes: u32,
    /// Give up if the cluster is not ready after this many seconds.
    #[arg(long, default_value_t = 180)]
    pub timeout: u64,
    /// Print only the final line (no progress).
    #[arg(long)]
    pub quiet: bool,
    /// Lifetime of the node agents' client certificates (`10m`, `30s`, …). Below 10m the
    /// sandbox API server's minimum CSR lifetime is lowered to match (for rotation tests).
    #[arg(long, default_value = "10m", value_parser = identity::certmgr::parse_duration)]
    pub node_cert_duration: Duration,
}

/// `status`.
#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `connectivity`.
#[derive(Args, Debug, Clone)]
pub struct ConnectivityArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// Print one JSON object instead of a matrix.
    #[arg(long)]
    pub json: bool,
    /// Per-probe timeout in milliseconds (TCP retransmits its SYN after 1 s, so keep it above
    /// that for a fair verdict on a cold path).
    #[arg(long, default_value_t = 2000)]
    pub timeout_ms: u64,
}

/// `exec`.
#[derive(Args, Debug, Clone)]
pub struct ExecArgs {
    #[command(flatten)]
    pub dir: DirArgs,
    /// The pod, as NAMESPACE/NAME.
    pub pod: String,
    /// The command and its arguments (after `--`).
    #[arg(last = true, required = true)]
    pub cmd: Vec<String>,
}

/// `demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// State directory (default: a new temporary directory).
    #[arg(long, env = "OVNK_SANDBOX_DIR")]
    pub dir: Option<PathBuf>,
    /// Number of nodes (5 or more to see the trust-zones part).
    #[arg(long, default_value_t = 5)]
    pub nodes: u32,
    /// Leave the sandbox running at the end (stop it with `ovnk sandbox down --dir DIR`).
    #[arg(long)]
    pub keep: bool,
}

/// Runs a subcommand.
pub async fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Up(a) => up(&a).await.map(|_| ()),
        Command::Down(a) => down(&absolute(&a.dir)?).await,
        Command::Status(a) => {
            let st = SandboxState::load(&absolute(&a.dir.dir)?)?;
            let s = crate::report::status(&st).await?;
            if a.json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                print_status(&s);
            }
            Ok(())
        }
        Command::Connectivity(a) => {
            let st = SandboxState::load(&absolute(&a.dir.dir)?)?;
            let c = crate::report::connectivity(&st, Duration::from_millis(a.timeout_ms)).await?;
            if a.json {
                println!("{}", serde_json::to_string(&c)?);
            } else {
                print_connectivity(&c);
            }
            Ok(())
        }
        Command::Exec(a) => exec(&a).await,
        Command::Demo(a) => crate::demo::run(a).await,
        Command::Supervise(a) => crate::supervisor::supervise(&absolute(&a.dir)?).await,
        Command::Apiserver(apiserver::cli::Command::Kubeconfig(mut k))
            if Layout::state_file(&k.dir).exists() =>
        {
            // a full sandbox keeps its API server's CA under DIR/apiserver
            k.dir = k.dir.join("apiserver");
            apiserver::cli::run(apiserver::cli::Command::Kubeconfig(k)).await
        }
        Command::Apiserver(c) => apiserver::cli::run(c).await,
    }
}

/// The directory as an absolute path (created if missing).
pub fn absolute(dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    dir.canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))
}

/// `up`: returns the time to ready.
pub async fn up(a: &UpArgs) -> anyhow::Result<Duration> {
    let started = std::time::Instant::now();
    let dir = absolute(&a.dir.dir)?;
    if let Some(pid) = state::running_supervisor(&dir) {
        bail!(
            "a sandbox is already running in {} (supervisor pid {pid}); stop it with `ovnk sandbox down --dir {}`",
            dir.display(),
            dir.display()
        );
    }
    if Layout::state_file(&dir).exists() {
        // leftovers of an earlier run that was not brought down
        down_quiet(&dir).await?;
    }
    let layout = Layout::new(dir.clone());
    let st = SandboxState {
        nodes: (1..=a.nodes).map(layout::node_name).collect(),
        node_cert_seconds: a.node_cert_duration.as_secs().max(1),
        layout,
    };
    std::fs::create_dir_all(st.layout.pid_dir())?;
    st.save()?;
    let _ = std::fs::remove_file(state::progress_file(&dir));
    std::fs::write(state::progress_file(&dir), "")?;

    let bin = std::env::current_exe().context("finding the ovnk binary")?;
    let log = std::fs::File::create(dir.join("supervisor.log"))?;
    let mut cmd = std::process::Command::new(bin);
    cmd.args(["sandbox", "supervise", "--dir"])
        .arg(&dir)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // its own process group: a Ctrl-C on `up` must not take the cluster down with it
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("starting the sandbox supervisor")?;
    let pid = child.id();
    std::fs::write(state::supervisor_pid_file(&dir), format!("{pid}\n"))?;
    if !a.quiet {
        eprintln!(
            "sandbox {} in {} ({} nodes), supervisor pid {pid}",
            st.layout.id,
            dir.display(),
            a.nodes
        );
    }

    let mut f = std::fs::File::open(state::progress_file(&dir))?;
    let mut pos = 0u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(a.timeout);
    loop {
        f.seek(std::io::SeekFrom::Start(pos))?;
        let mut reader = std::io::BufReader::new(&f);
        let mut line = String::new();
        while reader.read_line(&mut line)? > 0 {
            if !line.ends_with('\n') {
                break;
            }
            pos += line.len() as u64;
            let l = line.trim_end();
            if let Some(step) = l.strip_prefix("step ") {
                if !a.quiet {
                    eprintln!("  … {step}");
                }
            } else if l.starts_with("ready") {
                let took = started.elapsed();
                println!(
                    "sandbox ready: {} nodes in {:.1}s; kubectl --kubeconfig {}",
                    a.nodes,
                    took.as_secs_f64(),
                    dir.join("kubeconfig").display()
                );
                return Ok(took);
            } else if let Some(err) = l.strip_prefix("error ") {
                down_quiet(&dir).await?;
                bail!("sandbox failed to start: {err}\n(logs: {})", dir.display());
            }
            line.clear();
        }
        // our own child: its exit status is authoritative (no /proc race while it execs)
        if let Some(status) = child
            .try_wait()
            .context("waiting for the sandbox supervisor")?
        {
            let tail = tail_file(&dir.join("supervisor.log"), 20);
            down_quiet(&dir).await?;
            bail!(
                "the sandbox supervisor exited during start-up ({status}); last log lines:\n{tail}"
            );
        }
        if std::time::Instant::now() > deadline {
            down_quiet(&dir).await?;
            bail!(
                "the sandbox was not ready after {}s (logs in {})",
                a.timeout,
                dir.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn tail_file(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `down`.
pub async fn down(dir: &Path) -> anyhow::Result<()> {
    if !Layout::state_file(dir).exists() {
        println!("no sandbox in {}: nothing to do", dir.display());
        return Ok(());
    }
    let report = down_quiet(dir).await?;
    println!("{report}");
    Ok(())
}

async fn down_quiet(dir: &Path) -> anyhow::Result<String> {
    let st = SandboxState::load(dir)?;
    let mut notes = Vec::new();
    if let Some(pid) = state::running_supervisor(dir) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while crate::procs::alive_with(pid, &dir.to_string_lossy())
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        notes.push(format!("stopped supervisor {pid}"));
    }
    let swept =
        crate::procs::sweep_recorded(&st.layout.pid_dir(), dir, Duration::from_secs(5)).await;
    if !swept.is_empty() {
        notes.push(format!("stopped leftover processes: {}", swept.join(", ")));
    }
    let unrecorded = crate::procs::sweep_by_cmdline(dir, Duration::from_secs(5)).await;
    if !unrecorded.is_empty() {
        notes.push(format!(
            "stopped unrecorded processes naming {}: {unrecorded:?}",
            dir.display()
        ));
    }
    let leftover = netns::list(&st.layout.netns_prefix());
    for ns in &leftover {
        netns::del(ns).await?;
    }
    if !leftover.is_empty() {
        notes.push(format!("deleted {} network namespaces", leftover.len()));
    }
    let _ = std::fs::remove_file(state::supervisor_pid_file(dir));
    Ok(format!(
        "sandbox {} in {} is down{}",
        st.layout.id,
        dir.display(),
        if notes.is_empty() {
            String::new()
        } else {
            format!(" ({})", notes.join("; "))
        }
    ))
}

async fn exec(a: &ExecArgs) -> anyhow::Result<()> {
    let st = SandboxState::load(&absolute(&a.dir.dir)?)?;
    let (ns, name) = a
        .pod
        .split_once('/')
        .with_context(|| format!("{:?}: give the pod as NAMESPACE/NAME", a.pod))?;
    let client = crate::report::admin_client(&st.layout).await?;
    let pod = Api::<Pod>::namespaced(client, ns)
        .get(name)
        .await
        .with_context(|| format!("pod {}", a.pod))?;
    let uid = pod.metadata.uid.unwrap_or_default();
    let netns_name = st.layout.pod_netns(&uid);
    if !netns::exists(&netns_name) {
        bail!(
            "pod {} has no network namespace (not running yet, or hostNetwork)",
            a.pod
        );
    }
    let status = tokio::process::Command::new("ip")
        .args(["netns", "exec", &netns_name])
        .args(&a.cmd)
        .status()
        .await
        .context("running ip netns exec")?;
    if !status.success() {
        std::process::exit(status.code().unwrap_or(1));
    }
    Ok(())
}

fn print_status(s: &crate::report::Status) {
    println!(
        "{:<8} {:<6} {:<14} {:<38} TUNNELS",
        "NODE", "READY", "ENCAP-IP", "CHASSIS"
    );
    for n in &s.nodes {
        println!(
            "{:<8} {:<6} {:<14} {:<38} {}",
            n.name,
            n.ready,
            n.encap_ip,
            n.chassis.as_deref().unwrap_or("-"),
            n.tunnels.join(",")
        );
    }
    println!();
    println!("{:<30} {:<8} {:<14} READY", "POD", "NODE", "IP");
    for p in &s.pods {
        println!(
            "{:<30} {:<8} {:<14} {}",
            format!("{}/{}", p.namespace, p.name),
            p.node.as_deref().unwrap_or("-"),
            p.ip.as_deref().unwrap_or("-"),
            p.ready
        );
    }
}

/// Prints the matrix: one row per source pod, `T`/`I` for TCP/ICMP success, `.` for failure.
pub fn print_connectivity(c: &crate::report::Connectivity) {
    let mut names: Vec<&str> = c.pairs.iter().map(|p| p.from.as_str()).collect();
    names.extend(c.pairs.iter().map(|p| p.to.as_str()));
    names.sort();
    names.dedup();
    let w = names.iter().map(|n| n.len()).max().unwrap_or(4).max(4);
    print!("{:<w$}", "FROM \\ TO");
    for (i, _) in names.iter().enumerate() {
        print!(" {:>4}", format!("#{}", i + 1));
    }
    println!("  EXTERNAL");
    for (i, from) in names.iter().enumerate() {
        print!("{:<w$}", format!("#{} {from}", i + 1));
        for to in &names {
            let cell = if from == to {
                "-".to_owned()
            } else {
                match c.pairs.iter().find(|p| p.from == *from && p.to == *to) {
                    Some(p) => format!(
                        "{}{}",
                        if p.tcp { "T" } else { "." },
                        if p.icmp { "I" } else { "." }
                    ),
                    None => "?".to_owned(),
                }
            };
            print!(" {cell:>4}");
        }
        match c.external.iter().find(|e| e.from == *from) {
            Some(e) if e.tcp => println!("  T (seen as {})", e.seen_as.as_deref().unwrap_or("?")),
            Some(_) => println!("  ."),
            None => println!("  ?"),
        }
    }
    println!("(T = TCP connect ok, I = ICMP echo ok, . = failed)");
}
