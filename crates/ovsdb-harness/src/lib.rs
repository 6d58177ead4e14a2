//! Real `ovsdb-server` processes for tests and benchmarks.
//!
//! Each [`OvsdbServer`] lives in its own temp dir, listens on a unix socket there, runs in the
//! foreground as a child of the calling process (so it is reaped, never left as a zombie), and
//! is stopped by PID when dropped. Any number can run in parallel.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// Where Debian's packages install the schemas.
pub const NB_SCHEMA: &str = "/usr/share/ovn/ovn-nb.ovsschema";
pub const SB_SCHEMA: &str = "/usr/share/ovn/ovn-sb.ovsschema";
pub const VSWITCH_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Schema {
    Northbound,
    Southbound,
    Vswitch,
    File(PathBuf),
}

impl Schema {
    pub fn path(&self) -> PathBuf {
        match self {
            Schema::Northbound => NB_SCHEMA.into(),
            Schema::Southbound => SB_SCHEMA.into(),
            Schema::Vswitch => VSWITCH_SCHEMA.into(),
            Schema::File(p) => p.clone(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error(
        "{0} not found on PATH: install the Debian packages openvswitch-switch and ovn-central (scripts/install-deps does)"
    )]
    MissingBinary(&'static str),
    #[error("schema {0} not found: install ovn-central / openvswitch-common")]
    MissingSchema(PathBuf),
    #[error("{what}: {source}")]
    Io { what: String, source: io::Error },
    #[error("{cmd} failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("ovsdb-server did not become ready within {0:?}; log:\n{1}")]
    NotReady(Duration, String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> HarnessError {
    let what = what.into();
    move |source| HarnessError::Io { what, source }
}

/// A running (or stopped) ovsdb-server with one database.
#[derive(Debug)]
pub struct OvsdbServer {
    dir: tempfile::TempDir,
    db_file: PathBuf,
    db_name: String,
    clustered: bool,
    child: Option<Child>,
}

impl OvsdbServer {
    /// A standalone database in a new temp dir.
    pub fn start(schema: Schema) -> Result<Self, HarnessError> {
        Self::create(schema, false)
    }

    /// A one-member clustered (raft) database: it keeps transaction history, so
    /// `monitor_cond_since` can resume.
    pub fn start_clustered(schema: Schema) -> Result<Self, HarnessError> {
        Self::create(schema, true)
    }

    fn create(schema: Schema, clustered: bool) -> Result<Self, HarnessError> {
        let schema_path = schema.path();
        if !schema_path.exists() {
            return Err(HarnessError::MissingSchema(schema_path));
        }
        let text = fs::read_to_string(&schema_path)
            .map_err(io_err(format!("read {}", schema_path.display())))?;
        let db_name = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("name").and_then(|n| n.as_str()).map(str::to_owned))
            .unwrap_or_else(|| "unknown".into());
        let dir = tempfile::Builder::new()
            .prefix("ovsdb-")
            .tempdir()
            .map_err(io_err("create temp dir"))?;
        let db_file = dir.path().join("db.db");
        let schema_arg = schema_path.to_string_lossy().into_owned();
        let db_arg = db_file.to_string_lossy().into_owned();
        if clustered {
            let port = free_port()?;
            run(
                "ovsdb-tool",
                &[
                    "create-cluster",
                    &db_arg,
                    &schema_arg,
                    &format!("tcp:127.0.0.1:{port}"),
                ],
            )?;
        } else {
            run("ovsdb-tool", &["create", &db_arg, &schema_arg])?;
        }
        let mut s = OvsdbServer {
            dir,
            db_file,
            db_name,
            clustered,
            child: None,
        };
        s.launch()?;
        Ok(s)
    }

    /// Starts the server again on the same database file (after [`kill`](Self::kill) or
    /// [`stop`](Self::stop)).
    pub fn restart(&mut self) -> Result<(), HarnessError> {
        self.stop();
        self.launch()
    }

    fn launch(&mut self) -> Result<(), HarnessError> {
        let d = self.dir.path();
        let sock = self.socket_path();
        let _ = fs::remove_file(&sock);
        let log = d.join("ovsdb-server.log");
        let child = Command::new("ovsdb-server")
            .arg(&self.db_file)
            .arg(format!("--remote=punix:{}", sock.display()))
            // Also TCP on loopback, on a port the kernel picks (see `tcp_endpoint`).
            .arg("--remote=ptcp:0:127.0.0.1")
            .arg(format!(
                "--unixctl={}",
                d.join("ovsdb-server.ctl").display()
            ))
            .arg(format!("--log-file={}", log.display()))
            .arg("-vsyslog:off")
            .arg("-vconsole:off")
            .arg("--no-chdir")
            .env("OVS_RUNDIR", d)
            .env("OVS_LOGDIR", d)
            .env("OVS_DBDIR", d)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                io::ErrorKind::NotFound => HarnessError::MissingBinary("ovsdb-server"),
                _ => HarnessError::Io {
                    what: "spawn ovsdb-server".into(),
                    source: e,
                },
            })?;
        self.child = Some(child);
        let limit = Duration::from_secs(15);
        let start = Instant::now();
        while start.elapsed() < limit {
            // the socket file appears at bind, a moment before listen: connect to be sure
            if std::os::unix::net::UnixStream::connect(&sock).is_ok()
                && (!self.clustered
                    || self.log().contains("became leader")
                    || start.elapsed() > Duration::from_secs(3))
            {
                return Ok(());
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                self.child = None;
                return Err(HarnessError::Command {
                    cmd: format!("ovsdb-server ({status})"),
                    stderr: self.log(),
                });
            }
            sleep(Duration::from_millis(5));
        }
        Err(HarnessError::NotReady(limit, self.log()))
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
    pub fn socket_path(&self) -> PathBuf {
        self.dir.path().join("db.sock")
    }
    /// `unix:PATH` for clients.
    pub fn endpoint(&self) -> String {
        format!("unix:{}", self.socket_path().display())
    }
    /// `tcp:127.0.0.1:PORT` of the loopback TCP listener (the port is only in the log).
    pub fn tcp_endpoint(&self) -> Option<String> {
        let log = self.log();
        let port = log
            .lines()
            .rev()
            .filter_map(|l| l.split("listening on port ").nth(1))
            .find_map(|p| p.trim().parse::<u16>().ok())?;
        Some(format!("tcp:127.0.0.1:{port}"))
    }

    pub fn db_name(&self) -> &str {
        &self.db_name
    }
    pub fn is_clustered(&self) -> bool {
        self.clustered
    }
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.path().join("ovsdb-server.log")).unwrap_or_default()
    }

    /// SIGKILL, as a crash: leaves the pidfile-less socket behind, keeps the data.
    pub fn kill(&mut self) {
        self.signal_and_reap(libc::SIGKILL);
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        self.signal_and_reap(libc::SIGTERM);
    }

    fn signal_and_reap(&mut self, sig: i32) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = i32::try_from(c.id()) {
                // SAFETY: kill(2) has no memory-safety preconditions; the PID is our own child.
                #[allow(unsafe_code)]
                unsafe {
                    libc::kill(pid, sig);
                }
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match c.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = c.kill();
                        let _ = c.wait();
                        break;
                    }
                    Ok(None) => sleep(Duration::from_millis(2)),
                }
            }
        }
    }

    /// A dump of `tables` made by `ovsdb-client dump -f json`, independent of ovnk's client:
    /// `{table: {uuid: {column: wire-datum}}}` (every column, `_uuid`/`_version` left out).
    pub fn dump(&self, tables: &[&str]) -> Result<serde_json::Value, HarnessError> {
        let mut out = serde_json::Map::new();
        for t in tables {
            let ep = self.endpoint();
            let text = run(
                "ovsdb-client",
                &["-f", "json", "dump", &ep, &self.db_name, t],
            )?;
            let v: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| HarnessError::Command {
                    cmd: "ovsdb-client dump".into(),
                    stderr: e.to_string(),
                })?;
            let mut rows = serde_json::Map::new();
            // One table object, or an array of them (one per table dumped).
            let tabs = match v {
                serde_json::Value::Array(a) => a,
                other => vec![other],
            };
            for tab in tabs {
                let headings: Vec<String> = tab
                    .get("headings")
                    .and_then(|h| h.as_array())
                    .map(|h| {
                        h.iter()
                            .filter_map(|x| x.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                for row in tab
                    .get("data")
                    .and_then(|d| d.as_array())
                    .into_iter()
                    .flatten()
                {
                    let Some(cells) = row.as_array() else {
                        continue;
                    };
                    let mut obj = serde_json::Map::new();
                    let mut uuid = String::new();
                    for (h, c) in headings.iter().zip(cells) {
                        match h.as_str() {
                            "_uuid" => {
                                uuid = c.get(1).and_then(|u| u.as_str()).unwrap_or("").to_owned()
                            }
                            "_version" => {}
                            _ => {
                                obj.insert(h.clone(), c.clone());
                            }
                        }
                    }
                    rows.insert(uuid, serde_json::Value::Object(obj));
                }
            }
            out.insert((*t).to_owned(), serde_json::Value::Object(rows));
        }
        Ok(serde_json::Value::Object(out))
    }
}

impl Drop for OvsdbServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Runs a command to completion, returning its stdout.
pub fn run(cmd: &'static str, args: &[&str]) -> Result<String, HarnessError> {
    let out = Command::new(cmd)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => HarnessError::MissingBinary(cmd),
            _ => HarnessError::Io {
                what: format!("run {cmd}"),
                source: e,
            },
        })?;
    if !out.status.success() {
        return Err(HarnessError::Command {
            cmd: format!("{cmd} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn free_port() -> Result<u16, HarnessError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(io_err("bind a free port"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(io_err("local addr"))
}
