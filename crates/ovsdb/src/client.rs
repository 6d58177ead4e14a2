//! The OVSDB client: one background task per connection endpoint owns the socket, answers the
//! server's `echo`, probes an idle server, dispatches replies, applies monitor updates to the
//! caches, and reconnects with backoff.
//!
//! Reads during a reconnect are well defined: a [`Db`]'s cache always holds the last
//! consistent replica. A full resynchronisation is built into a fresh cache and swapped in at
//! once when the monitor reply has been applied, so readers never see a half-rebuilt replica,
//! and rows deleted while the client was away disappear at the swap. [`Db::synced`] tells
//! whether the replica is live (monitor active on the current connection) or may be stale.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock, RwLockReadGuard};
use std::time::Duration;

use futures::StreamExt;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_util::codec::FramedRead;

use crate::cache::{DbCache, IndexSpec, TableUpdates, UpdateError};
use crate::codec::{DEFAULT_MAX_MESSAGE_BYTES, FrameError, JsonFramer};
use crate::datum::short;
use crate::rpc::{self, Incoming};
use crate::schema::{DbSchema, SchemaError};
use crate::txn::{Condition, Txn, TxnError, TxnResults};

const ZERO_TXN_ID: &str = "00000000-0000-0000-0000-000000000000";

/// Where the server listens: `unix:PATH` or `tcp:HOST:PORT` (ovsdb-server's syntax).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Unix(PathBuf),
    Tcp(String),
}

impl FromStr for Endpoint {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                return Err(Error::Endpoint(format!("{s:?}: empty socket path")));
            }
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if let Some(hp) = s.strip_prefix("tcp:") {
            // tcp:IP:PORT, with [v6] brackets allowed as ovsdb-server writes them.
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| Error::Endpoint(format!("{s:?}: expected tcp:HOST:PORT")))?;
            port.parse::<u16>()
                .map_err(|_| Error::Endpoint(format!("{s:?}: bad port {port:?}")))?;
            return Ok(Endpoint::Tcp(format!("{host}:{port}")));
        }
        if s.starts_with("ssl:") {
            return Err(Error::Endpoint(format!(
                "{s:?}: ssl: endpoints are not supported yet (use unix: or tcp:)"
            )));
        }
        Err(Error::Endpoint(format!(
            "{s:?}: expected unix:PATH or tcp:HOST:PORT"
        )))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(hp) => write!(f, "tcp:{hp}"),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Largest message accepted from the server.
    pub max_message_bytes: usize,
    /// Send an `echo` after this long without hearing from the server, and drop the
    /// connection if another such period passes unanswered. `None` disables the probe.
    pub inactivity_probe: Option<Duration>,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    /// How long [`Client::connect`] waits for the first connection.
    pub connect_timeout: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            inactivity_probe: Some(Duration::from_secs(5)),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(4),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad endpoint {0}")]
    Endpoint(String),
    #[error("not connected to {0}")]
    NotConnected(String),
    #[error("connection to {endpoint} lost: {reason}")]
    Disconnected { endpoint: String, reason: String },
    #[error("{method} failed: {error}")]
    Rpc { method: String, error: String },
    #[error("{0}")]
    Txn(#[from] TxnError),
    #[error("{0}")]
    Schema(#[from] SchemaError),
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("client is closed")]
    Closed,
}

/// The state of the connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConnState {
    Connecting,
    Connected,
    /// Waiting to reconnect; the reason the last attempt or connection ended.
    Backoff(String),
    Closed,
}

/// How a monitor's replica was last synchronised, for observers and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SyncState {
    /// The replica reflects the server as of the current connection.
    pub synced: bool,
    /// Bumped on every applied change (initial load, update, resync).
    pub generation: u64,
    /// Full resynchronisations (cache rebuilt from a complete reply).
    pub full_syncs: u64,
    /// Resumptions with `monitor_cond_since` that found our last transaction id.
    pub resumes: u64,
    /// Which monitor method the server accepted last.
    pub method: Option<&'static str>,
}

/// Tables (and optionally columns and conditions) to replicate from one database.
#[derive(Clone, Debug, Default)]
pub struct MonitorSpec {
    pub tables: Vec<MonitorTable>,
}

#[derive(Clone, Debug)]
pub struct MonitorTable {
    pub name: String,
    /// `None` monitors every column.
    pub columns: Option<Vec<String>>,
    /// Rows matching any of these (monitor_cond semantics); empty = all rows.
    pub conditions: Vec<Condition>,
}

impl MonitorSpec {
    /// Every monitored table exists in `schema` of database `db`; otherwise an error naming the
    /// missing ones.
    fn check_tables(&self, db: &str, schema: &DbSchema) -> Result<(), Error> {
        let missing: Vec<&str> = self
            .tables
            .iter()
            .filter(|t| schema.table(&t.name).is_none())
            .map(|t| t.name.as_str())
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(Error::Schema(SchemaError(format!(
            "database {db} has no table(s) {}",
            missing.join(", ")
        ))))
    }

    pub fn tables<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Self {
        MonitorSpec {
            tables: names
                .into_iter()
                .map(|n| MonitorTable {
                    name: n.as_ref().to_owned(),
                    columns: None,
                    conditions: Vec::new(),
                })
                .collect(),
        }
    }

    fn requests(&self) -> Value {
        let mut o = serde_json::Map::new();
        for t in &self.tables {
            let mut r = serde_json::Map::new();
            if let Some(c) = &t.columns {
                r.insert("columns".into(), json!(c));
            }
            if !t.conditions.is_empty() {
                r.insert(
                    "where".into(),
                    Value::Array(t.conditions.iter().map(Condition::to_json).collect()),
                );
            }
            o.insert(t.name.clone(), json!([Value::Object(r)]));
        }
        Value::Object(o)
    }
}

/// One monitored database: its schema and its replica.
#[derive(Debug)]
pub struct Db {
    name: String,
    schema: Arc<DbSchema>,
    cache: RwLock<DbCache>,
    sync: watch::Sender<SyncState>,
}

impl Db {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn schema(&self) -> &Arc<DbSchema> {
        &self.schema
    }
    /// Read access to the replica. Hold the guard briefly; updates wait for it.
    pub fn cache(&self) -> RwLockReadGuard<'_, DbCache> {
        self.cache.read().unwrap_or_else(|p| p.into_inner())
    }
    /// Adds a client-side index (maintained across updates and resyncs).
    pub fn add_index(&self, table: &str, spec: IndexSpec) {
        let mut c = self.cache.write().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = c.table_mut(table) {
            t.add_index(spec);
        }
    }
    pub fn sync_state(&self) -> SyncState {
        self.sync.borrow().clone()
    }
    pub fn synced(&self) -> bool {
        self.sync.borrow().synced
    }
    /// A receiver that changes whenever the replica changes.
    pub fn subscribe(&self) -> watch::Receiver<SyncState> {
        self.sync.subscribe()
    }
    /// Waits until the replica is live on the current connection.
    pub async fn wait_synced(&self) {
        let mut rx = self.sync.subscribe();
        let _ = rx.wait_for(|s| s.synced).await;
    }
    /// Waits until `pred` holds on the replica, checking after every change.
    pub async fn wait_until(&self, mut pred: impl FnMut(&DbCache) -> bool) {
        let mut rx = self.sync.subscribe();
        loop {
            if pred(&self.cache()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    fn bump(&self, f: impl FnOnce(&mut SyncState)) {
        self.sync.send_modify(|s| {
            f(s);
            s.generation += 1;
        });
    }
}

/// Request parameters: a JSON value, or an array already serialized (large transactions are
/// encoded once, on the caller's task, without an intermediate copy).
enum Params {
    Value(Value),
    Raw(Vec<u8>),
}

enum Cmd {
    Request {
        method: String,
        params: Params,
        reply: oneshot::Sender<Result<Box<RawValue>, Error>>,
    },
    Monitor {
        db: Arc<Db>,
        spec: MonitorSpec,
        done: oneshot::Sender<Result<(), Error>>,
    },
    Cancel {
        db: String,
        done: oneshot::Sender<Result<(), Error>>,
    },
    /// `get_schema` and the monitor request sent back to back: the schema is parsed and
    /// checked while the server builds the monitor reply.
    MonitorChecked(Box<Checked>),
}

/// Checks a database's schema before its monitor is registered.
pub type SchemaCheck = Box<dyn FnOnce(&DbSchema) -> Result<(), Error> + Send>;

struct Checked {
    db: String,
    spec: MonitorSpec,
    check: SchemaCheck,
    /// The registered database, sent as soon as the schema passed the check.
    handle: oneshot::Sender<Arc<Db>>,
    done: oneshot::Sender<Result<(), Error>>,
}

/// A handle to the connection; cheap to clone. The connection closes when the last handle
/// is dropped (or on [`Client::close`]).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Endpoint,
    cmd: mpsc::UnboundedSender<Cmd>,
    state: watch::Receiver<ConnState>,
    dbs: RwLock<HashMap<String, Arc<Db>>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.inner.endpoint)
            .finish()
    }
}

impl Client {
    /// Starts the connection task and returns at once; it connects in the background.
    pub fn start(endpoint: &str, opts: ClientOptions) -> Result<Client, Error> {
        let endpoint: Endpoint = endpoint.parse()?;
        let (cmd_tx, cmd_rx) = mpsc::unbounded_channel();
        let (state_tx, state_rx) = watch::channel(ConnState::Connecting);
        let actor = Actor {
            endpoint: endpoint.clone(),
            opts,
            cmd_rx,
            state: state_tx,
            monitors: BTreeMap::new(),
        };
        tokio::spawn(actor.run());
        Ok(Client {
            inner: Arc::new(Inner {
                endpoint,
                cmd: cmd_tx,
                state: state_rx,
                dbs: RwLock::new(HashMap::new()),
            }),
        })
    }

    /// Starts the connection task and waits for the first connection (up to
    /// `opts.connect_timeout`).
    pub async fn connect(endpoint: &str, opts: ClientOptions) -> Result<Client, Error> {
        let timeout = opts.connect_timeout;
        let c = Client::start(endpoint, opts)?;
        match tokio::time::timeout(timeout, c.wait_connected()).await {
            Ok(Ok(())) => Ok(c),
            Ok(Err(e)) => Err(e),
            Err(_) => {
                let reason = match c.state() {
                    ConnState::Backoff(r) => r,
                    s => format!("{s:?}"),
                };
                Err(Error::NotConnected(format!(
                    "{} after {timeout:?}: {reason}",
                    c.inner.endpoint
                )))
            }
        }
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.endpoint
    }
    pub fn state(&self) -> ConnState {
        self.inner.state.borrow().clone()
    }
    pub fn state_watch(&self) -> watch::Receiver<ConnState> {
        self.inner.state.clone()
    }

    pub async fn wait_connected(&self) -> Result<(), Error> {
        let mut rx = self.inner.state.clone();
        let s = rx
            .wait_for(|s| matches!(s, ConnState::Connected | ConnState::Closed))
            .await
            .map_err(|_| Error::Closed)?;
        if *s == ConnState::Closed {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// Sends one request and waits for its reply.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value, Error> {
        let raw = self.request_params(method, Params::Value(params)).await?;
        serde_json::from_str(raw.get()).map_err(|e| Error::Protocol(format!("{method} reply: {e}")))
    }

    async fn request_params(&self, method: &str, params: Params) -> Result<Box<RawValue>, Error> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .cmd
            .send(Cmd::Request {
                method: method.to_owned(),
                params,
                reply: tx,
            })
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)?
    }

    pub async fn echo(&self) -> Result<(), Error> {
        self.request("echo", json!(["ovnk"])).await.map(|_| ())
    }

    pub async fn list_dbs(&self) -> Result<Vec<String>, Error> {
        let v = self.request("list_dbs", json!([])).await?;
        serde_json::from_value(v.clone())
            .map_err(|_| Error::Protocol(format!("list_dbs reply {}", short(&v))))
    }

    pub async fn get_schema(&self, db: &str) -> Result<DbSchema, Error> {
        let v = self.request("get_schema", json!([db])).await?;
        Ok(DbSchema::parse(&v)?)
    }

    /// Runs a transaction and checks its results op by op.
    pub async fn transact(&self, txn: &Txn) -> Result<TxnResults, Error> {
        let v = self
            .request_params("transact", Params::Raw(txn.params_bytes()))
            .await?;
        Ok(txn.check_results(&v)?)
    }

    /// Starts replicating `spec` from `db` and waits for the initial contents. The monitor
    /// is re-established after every reconnect. One monitor per database per client.
    pub async fn monitor(&self, db: &str, spec: MonitorSpec) -> Result<Arc<Db>, Error> {
        let schema = Arc::new(self.get_schema(db).await?);
        self.monitor_with_schema(db, schema, spec).await
    }

    /// [`monitor`](Self::monitor) with a schema the caller already fetched (and checked).
    pub async fn monitor_with_schema(
        &self,
        db: &str,
        schema: Arc<DbSchema>,
        spec: MonitorSpec,
    ) -> Result<Arc<Db>, Error> {
        spec.check_tables(db, &schema)?;
        let tables: Vec<(String, Option<Vec<String>>)> = spec
            .tables
            .iter()
            .map(|t| (t.name.clone(), t.columns.clone()))
            .collect();
        let handle = Arc::new(Db {
            name: db.to_owned(),
            cache: RwLock::new(DbCache::new(schema.clone(), &tables)),
            schema,
            sync: watch::channel(SyncState::default()).0,
        });
        let (tx, rx) = oneshot::channel();
        self.inner
            .cmd
            .send(Cmd::Monitor {
                db: handle.clone(),
                spec,
                done: tx,
            })
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)??;
        self.inner
            .dbs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(db.to_owned(), handle.clone());
        Ok(handle)
    }

    /// [`monitor`](Self::monitor) with the schema checked by `check` first, without waiting
    /// for the schema before asking for the monitor: both requests go out back to back and
    /// the schema is parsed and checked while the server builds the monitor reply. When the
    /// check fails the monitor is cancelled and the check's error returned.
    pub async fn monitor_checked(
        &self,
        db: &str,
        spec: MonitorSpec,
        check: SchemaCheck,
    ) -> Result<Arc<Db>, Error> {
        let (handle_tx, mut handle_rx) = oneshot::channel();
        let (tx, rx) = oneshot::channel();
        self.inner
            .cmd
            .send(Cmd::MonitorChecked(Box::new(Checked {
                db: db.to_owned(),
                spec,
                check,
                handle: handle_tx,
                done: tx,
            })))
            .map_err(|_| Error::Closed)?;
        rx.await.map_err(|_| Error::Closed)??;
        let handle = handle_rx.try_recv().map_err(|_| Error::Closed)?;
        self.inner
            .dbs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(db.to_owned(), handle.clone());
        Ok(handle)
    }

    /// Stops replicating `db`.
    pub async fn monitor_cancel(&self, db: &str) -> Result<(), Error> {
        let (tx, rx) = oneshot::channel();
        self.inner
            .cmd
            .send(Cmd::Cancel {
                db: db.to_owned(),
                done: tx,
            })
            .map_err(|_| Error::Closed)?;
        let r = rx.await.map_err(|_| Error::Closed)?;
        self.inner
            .dbs
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(db);
        r
    }

    pub fn db(&self, name: &str) -> Option<Arc<Db>> {
        self.inner
            .dbs
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
    }
}

// ---------------------------------------------------------------------------------------------
// The connection task.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Method {
    CondSince,
    Cond,
}

struct MonitorReg {
    db: Arc<Db>,
    spec: MonitorSpec,
    method: Method,
    last_txn_id: Option<String>,
    waiters: Vec<oneshot::Sender<Result<(), Error>>>,
    /// The monitor reply for the current connection has been applied.
    live: bool,
    /// Notifications that arrived before the monitor reply on this connection.
    buffered: Vec<(String, Box<RawValue>)>,
}

enum Pending {
    User {
        method: String,
        reply: oneshot::Sender<Result<Box<RawValue>, Error>>,
    },
    Monitor {
        db: String,
        method: Method,
    },
    Cancel {
        done: oneshot::Sender<Result<(), Error>>,
    },
    /// The schema of a [`Cmd::MonitorChecked`]; `monitor_id` is its monitor request.
    Schema {
        checked: Box<Checked>,
        monitor_id: u64,
    },
    /// A reply nobody waits for.
    Ignore,
    Echo,
}

type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

struct Actor {
    endpoint: Endpoint,
    opts: ClientOptions,
    cmd_rx: mpsc::UnboundedReceiver<Cmd>,
    state: watch::Sender<ConnState>,
    monitors: BTreeMap<String, MonitorReg>,
}

enum SessionEnd {
    /// Every client handle is gone.
    Closed,
    Lost(String),
}

impl Actor {
    async fn run(mut self) {
        let mut backoff = self.opts.backoff_initial;
        loop {
            self.state.send_replace(ConnState::Connecting);
            let reason = match self.connect().await {
                Ok((rd, wr)) => {
                    tracing::debug!(endpoint = %self.endpoint, "connected");
                    backoff = self.opts.backoff_initial;
                    self.state.send_replace(ConnState::Connected);
                    match self.session(rd, wr).await {
                        SessionEnd::Closed => break,
                        SessionEnd::Lost(r) => {
                            tracing::info!(endpoint = %self.endpoint, reason = %r, "connection lost; reconnecting");
                            r
                        }
                    }
                }
                Err(e) => format!("connect: {e}"),
            };
            for reg in self.monitors.values_mut() {
                reg.live = false;
                reg.buffered.clear();
                reg.db.bump(|s| s.synced = false);
            }
            self.state.send_replace(ConnState::Backoff(reason.clone()));
            // Wait out the backoff while still answering commands.
            let wake = Instant::now() + jitter(backoff);
            loop {
                tokio::select! {
                    _ = tokio::time::sleep_until(wake) => break,
                    cmd = self.cmd_rx.recv() => match cmd {
                        None => {
                            self.state.send_replace(ConnState::Closed);
                            return;
                        }
                        Some(cmd) => self.command_while_down(cmd, &reason),
                    }
                }
            }
            backoff = (backoff * 2).min(self.opts.backoff_max);
        }
        self.state.send_replace(ConnState::Closed);
    }

    async fn connect(&self) -> std::io::Result<(BoxRead, BoxWrite)> {
        let fut = async {
            match &self.endpoint {
                Endpoint::Unix(p) => {
                    let s = tokio::net::UnixStream::connect(p).await?;
                    let (r, w) = s.into_split();
                    Ok::<(BoxRead, BoxWrite), std::io::Error>((
                        Box::new(r) as BoxRead,
                        Box::new(w) as BoxWrite,
                    ))
                }
                Endpoint::Tcp(hp) => {
                    let s = tokio::net::TcpStream::connect(hp).await?;
                    s.set_nodelay(true)?;
                    let (r, w) = s.into_split();
                    Ok((Box::new(r) as BoxRead, Box::new(w) as BoxWrite))
                }
            }
        };
        tokio::time::timeout(self.opts.connect_timeout, fut)
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))?
    }

    fn command_while_down(&mut self, cmd: Cmd, reason: &str) {
        match cmd {
            Cmd::Request { reply, .. } => {
                let _ = reply.send(Err(Error::NotConnected(format!(
                    "{} ({reason})",
                    self.endpoint
                ))));
            }
            Cmd::Monitor { db, spec, done } => self.register(db, spec, done),
            Cmd::Cancel { db, done } => {
                self.monitors.remove(&db);
                let _ = done.send(Ok(()));
            }
            Cmd::MonitorChecked(c) => {
                let _ = c.done.send(Err(Error::NotConnected(format!(
                    "{} ({reason})",
                    self.endpoint
                ))));
            }
        }
    }

    fn register(
        &mut self,
        db: Arc<Db>,
        spec: MonitorSpec,
        done: oneshot::Sender<Result<(), Error>>,
    ) {
        let name = db.name.clone();
        if self.monitors.contains_key(&name) {
            let _ = done.send(Err(Error::Protocol(format!(
                "database {name} is already monitored by this client"
            ))));
            return;
        }
        self.monitors.insert(
            name,
            MonitorReg {
                db,
                spec,
                method: Method::CondSince,
                last_txn_id: None,
                waiters: vec![done],
                live: false,
                buffered: Vec::new(),
            },
        );
    }

    async fn session(&mut self, rd: BoxRead, mut wr: BoxWrite) -> SessionEnd {
        let mut frames =
            FramedRead::with_capacity(rd, JsonFramer::new(self.opts.max_message_bytes), 256 * 1024);
        let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let mut writer = tokio::spawn(async move {
            while let Some(buf) = out_rx.recv().await {
                wr.write_all(&buf).await?;
            }
            wr.shutdown().await
        });
        let mut pending: HashMap<u64, Pending> = HashMap::new();
        // Request ids are per connection: a reply can only come back on the connection it was sent on.
        let mut out = Outbox {
            tx: out_tx,
            next_id: 1,
        };

        // (Re-)issue every registered monitor.
        let names: Vec<String> = self.monitors.keys().cloned().collect();
        for name in names {
            if let Some(reg) = self.monitors.get(&name) {
                let (id, method) = send_monitor(&mut out, &name, reg);
                pending.insert(id, Pending::Monitor { db: name, method });
            }
        }

        let probe = self.opts.inactivity_probe;
        let mut last_rx = Instant::now();
        let mut echo_sent: Option<Instant> = None;
        let mut tick = tokio::time::interval(
            probe
                .map(|p| p / 4)
                .unwrap_or(Duration::from_secs(3600))
                .max(Duration::from_millis(10)),
        );
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

        let end = loop {
            tokio::select! {
                frame = frames.next() => {
                    let msg = match frame {
                        None => break SessionEnd::Lost("server closed the connection".into()),
                        Some(Err(FrameError::Io(e))) => break SessionEnd::Lost(format!("read: {e}")),
                        Some(Err(e)) => {
                            tracing::warn!(endpoint = %self.endpoint, error = %e, "unreadable message from server; dropping the connection");
                            break SessionEnd::Lost(e.to_string());
                        }
                        Some(Ok(v)) => v,
                    };
                    last_rx = Instant::now();
                    echo_sent = None;
                    if let Err(reason) = self.handle(&msg, &mut pending, &mut out) {
                        break SessionEnd::Lost(reason);
                    }
                }
                cmd = self.cmd_rx.recv() => match cmd {
                    None => break SessionEnd::Closed,
                    Some(Cmd::Request { method, params, reply }) => {
                        let id = match params {
                            Params::Value(p) => out.send(&method, p),
                            Params::Raw(p) => out.send_raw(&method, &p),
                        };
                        pending.insert(id, Pending::User { method, reply });
                    }
                    Some(Cmd::Monitor { db, spec, done }) => {
                        let name = db.name.clone();
                        self.register(db, spec, done);
                        if let Some(reg) = self.monitors.get(&name).filter(|r| !r.live) {
                            let (id, method) = send_monitor(&mut out, &name, reg);
                            pending.insert(id, Pending::Monitor { db: name, method });
                        }
                    }
                    Some(Cmd::MonitorChecked(c)) => {
                        if self.monitors.contains_key(&c.db) {
                            let _ = c.done.send(Err(Error::Protocol(format!(
                                "database {} is already monitored by this client",
                                c.db
                            ))));
                        } else {
                            let sid = out.send("get_schema", json!([c.db]));
                            let mid = out.send(
                                "monitor_cond_since",
                                json!([c.db, c.db, c.spec.requests(), ZERO_TXN_ID]),
                            );
                            pending.insert(mid, Pending::Monitor { db: c.db.clone(), method: Method::CondSince });
                            pending.insert(sid, Pending::Schema { checked: c, monitor_id: mid });
                        }
                    }
                    Some(Cmd::Cancel { db, done }) => {
                        if self.monitors.remove(&db).is_some() {
                            let id = out.send("monitor_cancel", json!([db]));
                            pending.insert(id, Pending::Cancel { done });
                        } else {
                            let _ = done.send(Ok(()));
                        }
                    }
                },
                _ = tick.tick(), if probe.is_some() => {
                    let p = probe.unwrap_or_default();
                    match echo_sent {
                        Some(sent) if sent.elapsed() >= p => {
                            break SessionEnd::Lost(format!("inactivity probe: no reply for {:?}", last_rx.elapsed()));
                        }
                        None if last_rx.elapsed() >= p => {
                            let id = out.send("echo", json!([]));
                            pending.insert(id, Pending::Echo);
                            echo_sent = Some(Instant::now());
                        }
                        _ => {}
                    }
                }
                res = &mut writer => {
                    let reason = match res {
                        Ok(Ok(())) => "writer stopped".to_string(),
                        Ok(Err(e)) => format!("write: {e}"),
                        Err(e) => format!("writer task: {e}"),
                    };
                    break SessionEnd::Lost(reason);
                }
            }
        };
        writer.abort();
        let reason = match &end {
            SessionEnd::Closed => "client closed".to_string(),
            SessionEnd::Lost(r) => r.clone(),
        };
        for (_, p) in pending.drain() {
            match p {
                Pending::User { reply, .. } => {
                    let _ = reply.send(Err(Error::Disconnected {
                        endpoint: self.endpoint.to_string(),
                        reason: reason.clone(),
                    }));
                }
                Pending::Cancel { done } => {
                    let _ = done.send(Ok(()));
                }
                Pending::Schema { checked, .. } => {
                    let _ = checked.done.send(Err(Error::Disconnected {
                        endpoint: self.endpoint.to_string(),
                        reason: reason.clone(),
                    }));
                }
                Pending::Monitor { .. } | Pending::Echo | Pending::Ignore => {}
            }
        }
        end
    }

    /// Handles one message. An `Err` drops the connection (with the reason).
    fn handle(
        &mut self,
        bytes: &[u8],
        pending: &mut HashMap<u64, Pending>,
        out: &mut Outbox,
    ) -> Result<(), String> {
        let msg = match Incoming::parse(bytes) {
            Ok(m) => m,
            Err(e @ rpc::ParseError::InvalidJson { .. }) => {
                tracing::warn!(endpoint = %self.endpoint, error = %e, "unreadable message from server; dropping the connection");
                return Err(e.to_string());
            }
            Err(e) => {
                tracing::warn!(endpoint = %self.endpoint, error = %e, "ignoring a malformed message");
                return Ok(());
            }
        };
        match msg {
            Incoming::Request { id, method, params } => {
                if method == "echo" {
                    let id = Value::to_string(&id);
                    let params = params.map(RawValue::get).unwrap_or("[]");
                    out.bytes(
                        format!("{{\"id\":{id},\"result\":{params},\"error\":null}}").into_bytes(),
                    );
                } else {
                    tracing::debug!(%method, "ignoring a request from the server");
                    out.raw(&json!({"id": id, "result": null, "error": format!("unknown method {method}")}));
                }
            }
            Incoming::StrayResponse { id } => {
                tracing::warn!(endpoint = %self.endpoint, id = %short(&id), "reply for an id this client never used; ignored");
            }
            Incoming::Response { id, result, error } => match pending.remove(&id) {
                None => {
                    tracing::warn!(endpoint = %self.endpoint, id, "reply for an unknown request id; ignored")
                }
                Some(Pending::Echo | Pending::Ignore) => {}
                Some(Pending::Schema {
                    checked,
                    monitor_id,
                }) => {
                    self.schema_reply(*checked, monitor_id, result, error, pending, out);
                }
                Some(Pending::Cancel { done }) => {
                    let _ = done.send(match error_of(error) {
                        None => Ok(()),
                        Some(error) => Err(Error::Rpc {
                            method: "monitor_cancel".into(),
                            error,
                        }),
                    });
                }
                Some(Pending::User { method, reply }) => {
                    let r = match error_of(error) {
                        None => Ok(result.map(RawValue::to_owned).unwrap_or_else(null_raw)),
                        Some(error) => Err(Error::Rpc { method, error }),
                    };
                    let _ = reply.send(r);
                }
                Some(Pending::Monitor { db, method }) => {
                    return self.monitor_reply(&db, method, result, error, pending, out);
                }
            },
            Incoming::Notification { method, params } => match &*method {
                "update2" | "update3" => {
                    let Some(params) = params else {
                        tracing::warn!(%method, "notification without params; ignored");
                        return Ok(());
                    };
                    // params = [monitor-id, (last-txn-id,) updates]; only the id is read here.
                    let monid = serde_json::from_str::<Vec<&RawValue>>(params.get())
                        .ok()
                        .and_then(|p| {
                            p.first()
                                .and_then(|id| serde_json::from_str::<String>(id.get()).ok())
                        });
                    let Some(monid) = monid else {
                        tracing::warn!(%method, "notification without a monitor id; ignored");
                        return Ok(());
                    };
                    let Some(reg) = self.monitors.get_mut(&monid) else {
                        tracing::debug!(%monid, "update for a cancelled monitor; ignored");
                        return Ok(());
                    };
                    if !reg.live {
                        reg.buffered.push((method.into_owned(), params.to_owned()));
                        return Ok(());
                    }
                    return apply_notification(reg, &method, params);
                }
                other => tracing::debug!(method = other, "ignoring a notification"),
            },
        }
        Ok(())
    }

    /// The schema of a [`Cmd::MonitorChecked`] arrived (its monitor reply is still to come):
    /// check it and register the monitor, or give up on the monitor.
    fn schema_reply(
        &mut self,
        c: Checked,
        monitor_id: u64,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
        pending: &mut HashMap<u64, Pending>,
        out: &mut Outbox,
    ) {
        let checked = match error_of(error) {
            Some(error) => Err(Error::Rpc {
                method: "get_schema".into(),
                error,
            }),
            None => serde_json::from_str::<Value>(result.map(RawValue::get).unwrap_or("null"))
                .map_err(|e| Error::Protocol(format!("get_schema reply: {e}")))
                .and_then(|v| Ok(DbSchema::parse(&v)?))
                .and_then(|schema| {
                    c.spec.check_tables(&c.db, &schema)?;
                    (c.check)(&schema)?;
                    Ok(schema)
                }),
        };
        let schema = match checked {
            Ok(s) => Arc::new(s),
            Err(e) => {
                // The monitor request is already out: drop its reply and cancel it.
                pending.insert(monitor_id, Pending::Ignore);
                let id = out.send("monitor_cancel", json!([c.db]));
                pending.insert(id, Pending::Ignore);
                let _ = c.done.send(Err(e));
                return;
            }
        };
        let tables: Vec<(String, Option<Vec<String>>)> = c
            .spec
            .tables
            .iter()
            .map(|t| (t.name.clone(), t.columns.clone()))
            .collect();
        let handle = Arc::new(Db {
            name: c.db.clone(),
            cache: RwLock::new(DbCache::new(schema.clone(), &tables)),
            schema,
            sync: watch::channel(SyncState::default()).0,
        });
        let _ = c.handle.send(handle.clone());
        // Registered before its reply arrives (replies come in request order).
        self.register(handle, c.spec, c.done);
    }

    fn monitor_reply(
        &mut self,
        db: &str,
        method: Method,
        result: Option<&RawValue>,
        error: Option<&RawValue>,
        pending: &mut HashMap<u64, Pending>,
        out: &mut Outbox,
    ) -> Result<(), String> {
        let Some(reg) = self.monitors.get_mut(db) else {
            return Ok(());
        };
        if let Some(text) = error_of(error) {
            if method == Method::CondSince && text.contains("unknown method") {
                tracing::info!(
                    db,
                    "server lacks monitor_cond_since; falling back to monitor_cond"
                );
                reg.method = Method::Cond;
                let (id, m) = send_monitor(out, db, reg);
                pending.insert(
                    id,
                    Pending::Monitor {
                        db: db.to_owned(),
                        method: m,
                    },
                );
                return Ok(());
            }
            let err = format!("monitor of {db} refused: {text}");
            tracing::error!(db, error = %text, "monitor refused");
            for w in reg.waiters.drain(..) {
                let _ = w.send(Err(Error::Rpc {
                    method: "monitor".into(),
                    error: text.clone(),
                }));
            }
            self.monitors.remove(db);
            return Err(err);
        }
        let result = result.map(RawValue::get).unwrap_or("{}");
        // One walk of the reply splits it into rows; the rows are then decoded (in parallel
        // when there are many) straight into the replica.
        let (found, txn_id, updates): (bool, Option<String>, TableUpdates<'_>) = match method {
            Method::CondSince => match serde_json::from_str::<(bool, String, TableUpdates)>(result)
            {
                Ok((found, id, upd)) => (found, Some(id), upd),
                Err(e) => return Err(format!("malformed monitor_cond_since reply: {e}")),
            },
            Method::Cond => match serde_json::from_str::<TableUpdates>(result) {
                Ok(upd) => (false, None, upd),
                Err(e) => return Err(format!("malformed monitor_cond reply: {e}")),
            },
        };
        let res = if found {
            let mut cache = reg.db.cache.write().unwrap_or_else(|p| p.into_inner());
            cache.apply_table_updates(updates).map(|_| ())
        } else {
            // Build the new replica aside and swap it in whole.
            let mut fresh = reg
                .db
                .cache
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .empty_like();
            let r = fresh.apply_table_updates(updates).map(|_| ());
            if r.is_ok() {
                let old = std::mem::replace(
                    &mut *reg.db.cache.write().unwrap_or_else(|p| p.into_inner()),
                    fresh,
                );
                // Freeing a large replica is not the reader's business: do it off this task.
                if old.table_names().next().is_some() {
                    tokio::task::spawn_blocking(move || drop(old));
                }
            }
            r
        };
        if let Err(e) = res {
            reg.last_txn_id = None;
            return Err(format!("initial contents of {db}: {e}"));
        }
        reg.last_txn_id = txn_id.filter(|id| id != ZERO_TXN_ID);
        reg.live = true;
        let method_name = match method {
            Method::CondSince => "monitor_cond_since",
            Method::Cond => "monitor_cond",
        };
        reg.db.bump(|s| {
            s.synced = true;
            s.method = Some(method_name);
            if found {
                s.resumes += 1;
            } else {
                s.full_syncs += 1;
            }
        });
        tracing::debug!(db, found, method = method_name, "monitor established");
        for (m, p) in std::mem::take(&mut reg.buffered) {
            apply_notification(reg, &m, &p)?;
        }
        for w in reg.waiters.drain(..) {
            let _ = w.send(Ok(()));
        }
        Ok(())
    }
}

fn apply_notification(reg: &mut MonitorReg, method: &str, params: &RawValue) -> Result<(), String> {
    let parsed = match method {
        "update3" => {
            serde_json::from_str::<(serde::de::IgnoredAny, String, TableUpdates)>(params.get())
                .map(|(_, id, upd)| (upd, Some(id)))
        }
        _ => serde_json::from_str::<(serde::de::IgnoredAny, TableUpdates)>(params.get())
            .map(|(_, upd)| (upd, None)),
    };
    let (updates, txn_id) = match parsed {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(method, error = %e, "malformed update notification; ignored");
            return Ok(());
        }
    };
    let res = {
        let mut cache = reg.db.cache.write().unwrap_or_else(|p| p.into_inner());
        cache.apply_table_updates(updates)
    };
    match res {
        Ok(_) => {
            if let Some(id) = txn_id {
                reg.last_txn_id = Some(id);
            }
            reg.db.bump(|_| {});
            Ok(())
        }
        Err(e @ UpdateError::Inconsistent(_)) => {
            // Start over from a complete dump on the next connection.
            reg.last_txn_id = None;
            Err(e.to_string())
        }
        Err(e) => {
            tracing::warn!(db = %reg.db.name, error = %e, "invalid update ignored");
            reg.db.bump(|_| {});
            Ok(())
        }
    }
}

fn null_raw() -> Box<RawValue> {
    RawValue::from_string("null".into()).unwrap_or_else(|_| unreachable!("null is valid JSON"))
}

/// The error of a reply, as text, or `None` when it succeeded.
fn error_of(e: Option<&RawValue>) -> Option<String> {
    let e = e?;
    let v: Value = serde_json::from_str(e.get()).unwrap_or(Value::Null);
    match v {
        Value::Null => None,
        Value::String(s) => Some(s),
        Value::Object(o) => {
            let err = o
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_owned();
            Some(match o.get("details").and_then(Value::as_str) {
                Some(d) => format!("{err}: {d}"),
                None => err,
            })
        }
        other => Some(short(&other)),
    }
}

struct Outbox {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    next_id: u64,
}

impl Outbox {
    fn send(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.raw(&rpc::request(id, method, params));
        id
    }
    /// A request whose params are already-serialized JSON.
    fn send_raw(&mut self, method: &str, params: &[u8]) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut buf = Vec::with_capacity(params.len() + method.len() + 48);
        buf.extend_from_slice(format!("{{\"id\":{id},\"method\":").as_bytes());
        buf.extend_from_slice(Value::String(method.to_owned()).to_string().as_bytes());
        buf.extend_from_slice(b",\"params\":");
        buf.extend_from_slice(params);
        buf.push(b'}');
        let _ = self.tx.send(buf);
        id
    }

    fn bytes(&mut self, buf: Vec<u8>) {
        // A closed writer is noticed by the session loop.
        let _ = self.tx.send(buf);
    }

    fn raw(&mut self, v: &Value) {
        match serde_json::to_vec(v) {
            Ok(buf) => {
                // A closed writer is noticed by the session loop.
                let _ = self.tx.send(buf);
            }
            Err(e) => tracing::error!(error = %e, "could not encode a message"),
        }
    }
}

fn send_monitor(out: &mut Outbox, db: &str, reg: &MonitorReg) -> (u64, Method) {
    let requests = reg.spec.requests();
    let id = match reg.method {
        Method::CondSince => {
            let last = reg
                .last_txn_id
                .clone()
                .unwrap_or_else(|| ZERO_TXN_ID.to_owned());
            out.send("monitor_cond_since", json!([db, db, requests, last]))
        }
        Method::Cond => out.send("monitor_cond", json!([db, db, requests])),
    };
    (id, reg.method)
}

fn jitter(d: Duration) -> Duration {
    use rand::Rng;
    let f: f64 = rand::rng().random_range(0.8..1.2);
    d.mul_f64(f)
}
