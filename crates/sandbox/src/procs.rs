//! The processes a sandbox starts: spawned in the foreground as children of the supervisor (so
//! they are reaped at once, never left as zombies), each recorded in `DIR/pids/<name>.pid` the
//! moment it exists, and stopped by PID. A record is only acted on when `/proc/<pid>/cmdline`
//! still names the sandbox directory, so a recycled PID is never signalled.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// A started child process.
struct Entry {
    child: Child,
    pid: u32,
}

/// The supervisor's table of children, by name.
pub struct Procs {
    dir: PathBuf,
    pid_dir: PathBuf,
    children: Mutex<BTreeMap<String, Entry>>,
}

impl Procs {
    /// A table recording pids under `pid_dir`; `dir` is the sandbox directory every child's
    /// command line mentions.
    pub fn new(dir: &Path, pid_dir: PathBuf) -> std::io::Result<Self> {
        std::fs::create_dir_all(&pid_dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            pid_dir,
            children: Mutex::new(BTreeMap::new()),
        })
    }

    /// Spawns `cmd` as child `name`, its stdout and stderr appended to `log`.
    pub fn spawn(&self, name: &str, cmd: &mut Command, log: &Path) -> std::io::Result<u32> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .kill_on_drop(false);
        let child = cmd.spawn().map_err(|e| {
            std::io::Error::new(
                e.kind(),
                format!("starting {name} ({:?}): {e}", cmd.as_std().get_program()),
            )
        })?;
        let pid = child
            .id()
            .ok_or_else(|| std::io::Error::other(format!("{name} exited at once")))?;
        if let Err(e) = std::fs::write(self.pid_dir.join(format!("{name}.pid")), format!("{pid}\n"))
        {
            // an unrecorded child could outlive a crash unnoticed: stop it now
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            return Err(std::io::Error::new(
                e.kind(),
                format!("recording the pid of {name}: {e}"),
            ));
        }
        if let Ok(mut m) = self.children.lock() {
            m.insert(name.to_owned(), Entry { child, pid });
        }
        Ok(pid)
    }

    /// The pid of child `name`, if it was started and not stopped.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.children.lock().ok()?.get(name).map(|e| e.pid)
    }

    /// Whether child `name` has exited (reaping it if so). Unknown names count as exited.
    pub fn exited(&self, name: &str) -> Option<std::process::ExitStatus> {
        let mut m = self.children.lock().ok()?;
        let e = m.get_mut(name)?;
        e.child.try_wait().ok().flatten()
    }

    /// Names of the children whose name starts with `prefix`.
    pub fn names(&self, prefix: &str) -> Vec<String> {
        self.children
            .lock()
            .map(|m| {
                m.keys()
                    .filter(|k| k.starts_with(prefix))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Stops child `name`: SIGTERM, then SIGKILL after `grace`; reaps it and removes its record.
    pub async fn stop(&self, name: &str, grace: Duration) {
        let entry = self.children.lock().ok().and_then(|mut m| m.remove(name));
        let Some(mut e) = entry else { return };
        let _ = kill(Pid::from_raw(e.pid as i32), Signal::SIGTERM);
        if tokio::time::timeout(grace, e.child.wait()).await.is_err() {
            tracing::warn!(
                name,
                pid = e.pid,
                "did not exit after SIGTERM; sending SIGKILL"
            );
            let _ = e.child.kill().await;
        }
        let _ = std::fs::remove_file(self.pid_dir.join(format!("{name}.pid")));
    }

    /// Forgets a child that exited by itself (after [`Procs::exited`] said so).
    pub fn forget(&self, name: &str) {
        if let Ok(mut m) = self.children.lock() {
            m.remove(name);
        }
        let _ = std::fs::remove_file(self.pid_dir.join(format!("{name}.pid")));
    }

    /// The sandbox directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Whether `pid` is a live (not zombie) process whose command line mentions `needle`.
///
/// A live process's command line reads empty for a moment while it execs (and while it exits,
/// before it is a zombie); such a read is repeated for up to ~50 ms instead of being taken
/// for "not our process".
pub fn alive_with(pid: u32, needle: &str) -> bool {
    for _ in 0..25 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return false;
        };
        // state is the field after the parenthesised command name
        let zombie = stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'));
        if zombie {
            return false;
        }
        match std::fs::read(format!("/proc/{pid}/cmdline")) {
            Ok(c) if c.is_empty() => std::thread::sleep(std::time::Duration::from_millis(2)),
            Ok(c) => return String::from_utf8_lossy(&c).contains(needle),
            Err(_) => return false,
        }
    }
    false
}

/// Stops every process recorded under `pid_dir` that is still alive and still names `dir` in
/// its command line (SIGTERM, then SIGKILL after `grace`), removing the records. Returns the
/// names of the processes it had to stop.
pub async fn sweep_recorded(pid_dir: &Path, dir: &Path, grace: Duration) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(rd) = std::fs::read_dir(pid_dir) else {
        return Vec::new();
    };
    let mut found: Vec<(String, u32, PathBuf)> = Vec::new();
    for e in rd.filter_map(|e| e.ok()) {
        let path = e.path();
        let Some(name) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".pid"))
            .map(str::to_owned)
        else {
            continue;
        };
        let pid = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok());
        match pid {
            Some(pid) if alive_with(pid, &needle) => found.push((name, pid, path)),
            _ => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    // node agents and controllers before the daemons they talk to
    found.sort_by_key(|(n, _, _)| stop_rank(n));
    let mut stopped = Vec::new();
    for (name, pid, path) in found {
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        let deadline = tokio::time::Instant::now() + grace;
        while alive_with(pid, &needle) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if alive_with(pid, &needle) {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        let _ = std::fs::remove_file(path);
        stopped.push(name);
    }
    stopped
}

/// Stops every other process whose command line names `dir` (SIGTERM, then SIGKILL after
/// `grace`): the safety net behind [`sweep_recorded`] for a child whose pid record was lost.
/// Returns their pids.
pub async fn sweep_by_cmdline(dir: &Path, grace: Duration) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let pids: Vec<u32> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| *p != me && alive_with(*p, &needle) && is_sandbox_role(*p))
        .collect();
    for p in &pids {
        let _ = kill(Pid::from_raw(*p as i32), Signal::SIGTERM);
    }
    let deadline = tokio::time::Instant::now() + grace;
    while pids.iter().any(|p| alive_with(*p, &needle)) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for p in &pids {
        if alive_with(*p, &needle) {
            let _ = kill(Pid::from_raw(*p as i32), Signal::SIGKILL);
        }
    }
    pids
}

/// Whether `pid` is one of the programs a sandbox starts (an OVN/OVS daemon, or ovnk as
/// supervisor, agent, cluster manager or identity service) — never a user's shell or wrapper
/// that happens to mention the directory.
fn is_sandbox_role(pid: u32) -> bool {
    let Ok(raw) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<String> = raw
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let prog = args
        .first()
        .and_then(|a| a.rsplit('/').next())
        .unwrap_or_default();
    match prog {
        "ovsdb-server" | "ovn-northd" | "ovn-controller" | "ovs-vswitchd" => true,
        "ovnk" => args.iter().skip(1).any(|a| {
            matches!(
                a.as_str(),
                "supervise" | "node" | "cluster-manager" | "identity"
            )
        }),
        _ => false,
    }
}

/// Shutdown order by role, from the suffix of a child's name (`node1-agent`, `node1-sb`, …):
/// agents and the cluster manager first, then ovn-controller (while its databases are up),
/// ovs-vswitchd, ovn-northd, and the database servers last.
pub fn stop_rank(name: &str) -> u8 {
    let role = name.rsplit('-').next().unwrap_or(name);
    match role {
        "supervisor" => 0,
        "agent" | "manager" => 1,
        "identity" => 2,
        "controller" => 3,
        "vswitchd" => 4,
        "northd" => 5,
        "nb" | "sb" | "conf" => 6,
        _ => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_order() {
        let mut v = vec![
            "node1-sb",
            "node1-controller",
            "cluster-manager",
            "node1-vswitchd",
            "node1-agent",
            "node1-northd",
        ];
        v.sort_by_key(|n| stop_rank(n));
        assert_eq!(
            v,
            vec![
                "cluster-manager",
                "node1-agent",
                "node1-controller",
                "node1-vswitchd",
                "node1-northd",
                "node1-sb"
            ]
        );
    }

    #[test]
    fn only_sandbox_programs_are_swept_by_command_line() {
        // the test binary itself mentions no role and is no OVN daemon
        assert!(!is_sandbox_role(std::process::id()));
        assert!(!is_sandbox_role(u32::MAX - 1));
    }

    #[test]
    fn alive_checks_cmdline() {
        let me = std::process::id();
        assert!(alive_with(me, ""));
        assert!(!alive_with(me, "no-such-needle-in-any-cmdline-0b1d"));
        assert!(!alive_with(u32::MAX - 1, ""));
    }
}
