//! Network namespaces and the commands that shape them (`ip`, `ethtool`, `ovs-vsctl`), plus
//! [`in_netns`], which runs a closure on a thread that has entered a namespace, so sockets made
//! there belong to it (a pod's listener, a probe) without a helper process.

use std::fs::File;
use std::process::Stdio;

use nix::sched::{CloneFlags, setns};

/// A command that failed.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    #[error("running `{cmd}`: {source} (is the Debian package that provides it installed?)")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`{cmd}` failed ({status}): {stderr}")]
    Failed {
        cmd: String,
        status: String,
        stderr: String,
    },
}

fn render(prog: &str, args: &[&str]) -> String {
    let mut s = prog.to_owned();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Runs a command to completion and returns its stdout.
pub async fn run(prog: &str, args: &[&str]) -> Result<String, CmdError> {
    let out = tokio::process::Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|source| CmdError::Spawn {
            cmd: render(prog, args),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(CmdError::Failed {
            cmd: render(prog, args),
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        })
    }
}

/// `ip -n <ns> <args…>` (or plain `ip` when `ns` is empty).
pub async fn ip(ns: &str, args: &[&str]) -> Result<String, CmdError> {
    if ns.is_empty() {
        return run("ip", args).await;
    }
    let mut v = vec!["-n", ns];
    v.extend_from_slice(args);
    run("ip", &v).await
}

/// Runs `prog args…` inside `ns` (`ip netns exec`).
pub async fn exec_in(ns: &str, prog: &str, args: &[&str]) -> Result<String, CmdError> {
    let mut v = vec!["netns", "exec", ns, prog];
    v.extend_from_slice(args);
    run("ip", &v).await
}

/// Creates a network namespace with its loopback up. An existing one is an error.
pub async fn add(ns: &str) -> Result<(), CmdError> {
    ip("", &["netns", "add", ns]).await?;
    ip(ns, &["link", "set", "lo", "up"]).await?;
    Ok(())
}

/// Deletes a network namespace (and with it every link inside); a missing one is fine.
pub async fn del(ns: &str) -> Result<(), CmdError> {
    if exists(ns) {
        ip("", &["netns", "del", ns]).await?;
    }
    Ok(())
}

/// Whether `/run/netns/<ns>` exists.
pub fn exists(ns: &str) -> bool {
    std::path::Path::new("/run/netns").join(ns).exists()
}

/// Names of every network namespace starting with `prefix`.
pub fn list(prefix: &str) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir("/run/netns") else {
        return Vec::new();
    };
    let mut v: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

/// Turns transmit checksum offload off on `dev` in `ns`. Packets a veth sends with a partial
/// checksum reach ovs-vswitchd's userspace datapath (AF_PACKET) unfinished and are forwarded
/// with a bad checksum; TCP then never gets past the handshake.
pub async fn tx_checksum_off(ns: &str, dev: &str) -> Result<(), CmdError> {
    exec_in(ns, "ethtool", &["-K", dev, "tx", "off"])
        .await
        .map(|_| ())
}

/// Runs `f` on a fresh thread that has entered network namespace `ns`; sockets `f` creates
/// stay in that namespace for their whole life. The calling thread is never moved.
pub fn in_netns<T, F>(ns: &str, f: F) -> std::io::Result<T>
where
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let path = std::path::Path::new("/run/netns").join(ns);
    let file = File::open(&path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("opening {}: {e}", path.display())))?;
    let handle = std::thread::Builder::new()
        .name(format!("netns-{ns}"))
        .spawn(move || {
            setns(&file, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            f()
        })?;
    handle
        .join()
        .map_err(|_| std::io::Error::other("a thread inside a network namespace panicked"))?
}

/// Async wrapper of [`in_netns`] that keeps the runtime's threads free while `f` runs.
pub async fn in_netns_async<T, F>(ns: &str, f: F) -> std::io::Result<T>
where
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let ns = ns.to_owned();
    tokio::task::spawn_blocking(move || in_netns(&ns, f))
        .await
        .map_err(|e| std::io::Error::other(format!("netns task: {e}")))?
}
