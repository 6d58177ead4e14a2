//! The object store: every object of every kind, one resourceVersion counter, a bounded log of
//! recent changes for watches, and snapshot persistence in the state dir.

use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Notify, broadcast};

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    /// Created.
    Added,
    /// Updated.
    Modified,
    /// Deleted.
    Deleted,
}

impl ChangeType {
    /// Watch event type string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One committed change.
#[derive(Debug)]
pub struct Change {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Storage key of the kind.
    pub storage: String,
    /// Namespace ("" when cluster-scoped).
    pub namespace: String,
    /// Kind of change.
    pub kind: ChangeType,
    /// The object after the change (the last state for deletes).
    pub obj: Arc<Value>,
    /// The object before the change.
    pub old: Option<Arc<Value>>,
}

/// Store failures.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StoreError {
    /// Create of an existing object.
    #[error("already exists")]
    AlreadyExists,
    /// Missing object.
    #[error("not found")]
    NotFound,
    /// The object changed since it was read.
    #[error("conflict")]
    Conflict,
    /// Watch/continue from a compacted resourceVersion.
    #[error("too old resource version: {requested} ({floor})")]
    Expired {
        /// What the client asked for.
        requested: u64,
        /// Oldest resumable version.
        floor: u64,
    },
}

type Key = (String, String);

struct Inner {
    rv: u64,
    floor: u64,
    objects: HashMap<String, BTreeMap<Key, Arc<Value>>>,
    log: VecDeque<Arc<Change>>,
    log_cap: usize,
}

/// A watch subscription: backlog of changes after the requested version, then live changes.
pub struct Subscription {
    /// Changes already committed after the requested version.
    pub backlog: Vec<Arc<Change>>,
    /// Live changes.
    pub rx: broadcast::Receiver<Arc<Change>>,
    /// The store's version when subscribed.
    pub rv: u64,
}

/// The store.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<Change>>,
    /// Signalled on every commit (persistence task).
    pub dirty: Notify,
    path: Option<PathBuf>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

/// Parse a resourceVersion string.
pub fn parse_rv(s: &str) -> Option<u64> {
    s.parse().ok()
}

/// The `metadata.resourceVersion` of an object as a number (0 when absent).
pub fn rv_of(obj: &Value) -> u64 {
    obj["metadata"]["resourceVersion"]
        .as_str()
        .and_then(parse_rv)
        .unwrap_or(0)
}

fn key_of(obj: &Value) -> Key {
    (
        obj["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

impl Store {
    /// A store persisted in `state.json` under `dir` (loaded if present), or in memory only.
    pub fn open(dir: Option<&Path>, log_cap: usize) -> std::io::Result<Self> {
        let path = dir.map(|d| d.join("state.json"));
        let mut inner = Inner {
            rv: 1,
            floor: 1,
            objects: HashMap::new(),
            log: VecDeque::new(),
            log_cap,
        };
        if let Some(p) = &path
            && p.exists()
        {
            let bytes = std::fs::read(p)?;
            let v: Value = serde_json::from_slice(&bytes)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
            inner.rv = v["resourceVersion"].as_u64().unwrap_or(1);
            inner.floor = inner.rv;
            for e in v["objects"].as_array().into_iter().flatten() {
                let Some(storage) = e["storage"].as_str() else {
                    continue;
                };
                let obj = e["object"].clone();
                inner
                    .objects
                    .entry(storage.to_string())
                    .or_default()
                    .insert(key_of(&obj), Arc::new(obj));
            }
        }
        let (tx, _) = broadcast::channel(1 << 16);
        Ok(Self {
            inner: Mutex::new(inner),
            tx,
            dirty: Notify::new(),
            path,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Oldest version a watch can resume from.
    pub fn floor(&self) -> u64 {
        self.lock().floor
    }

    /// Drop the change log (watches from older versions get 410 Expired).
    pub fn compact(&self) {
        let mut g = self.lock();
        g.floor = g.rv;
        g.log.clear();
    }

    /// Get one object.
    pub fn get(&self, storage: &str, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.lock()
            .objects
            .get(storage)
            .and_then(|m| m.get(&(ns.to_string(), name.to_string())).cloned())
    }

    /// All objects of a kind (optionally in one namespace), sorted by (namespace, name), and the
    /// store's version.
    pub fn list(&self, storage: &str, ns: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let g = self.lock();
        let items = match g.objects.get(storage) {
            None => Vec::new(),
            Some(m) => match ns {
                Some(ns) => m
                    .range((ns.to_string(), String::new())..)
                    .take_while(|((n, _), _)| n == ns)
                    .map(|(_, v)| v.clone())
                    .collect(),
                None => m.values().cloned().collect(),
            },
        };
        (items, g.rv)
    }

    fn commit(
        &self,
        g: &mut Inner,
        storage: &str,
        kind: ChangeType,
        obj: Arc<Value>,
        old: Option<Arc<Value>>,
        rv: u64,
    ) {
        let ch = Arc::new(Change {
            rv,
            storage: storage.to_string(),
            namespace: obj["metadata"]["namespace"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            kind,
            obj,
            old,
        });
        g.log.push_back(ch.clone());
        while g.log.len() > g.log_cap {
            if let Some(c) = g.log.pop_front() {
                g.floor = c.rv;
            }
        }
        let _ = self.tx.send(ch);
        self.dirty.notify_one();
    }

    /// Create; assigns the next resourceVersion.
    pub fn create(&self, storage: &str, mut obj: Value) -> Result<Arc<Value>, StoreError> {
        let mut g = self.lock();
        let key = key_of(&obj);
        if g.objects.get(storage).is_some_and(|m| m.contains_key(&key)) {
            return Err(StoreError::AlreadyExists);
        }
        g.rv += 1;
        let rv = g.rv;
        set_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        g.objects
            .entry(storage.to_string())
            .or_default()
            .insert(key, obj.clone());
        self.commit(&mut g, storage, ChangeType::Added, obj.clone(), None, rv);
        Ok(obj)
    }

    /// Replace if the stored version is still `expected_rv`.
    pub fn update(
        &self,
        storage: &str,
        expected_rv: u64,
        mut obj: Value,
    ) -> Result<Arc<Value>, StoreError> {
        let mut g = self.lock();
        let key = key_of(&obj);
        let old = g
            .objects
            .get(storage)
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or(StoreError::NotFound)?;
        if rv_of(&old) != expected_rv {
            return Err(StoreError::Conflict);
        }
        g.rv += 1;
        let rv = g.rv;
        set_rv(&mut obj, rv);
        let obj = Arc::new(obj);
        g.objects
            .entry(storage.to_string())
            .or_default()
            .insert(key, obj.clone());
        self.commit(
            &mut g,
            storage,
            ChangeType::Modified,
            obj.clone(),
            Some(old),
            rv,
        );
        Ok(obj)
    }

    /// Delete if the stored version is still `expected_rv` (any version when `None`).
    pub fn delete(
        &self,
        storage: &str,
        ns: &str,
        name: &str,
        expected_rv: Option<u64>,
    ) -> Result<Arc<Value>, StoreError> {
        let mut g = self.lock();
        let key = (ns.to_string(), name.to_string());
        let old = g
            .objects
            .get(storage)
            .and_then(|m| m.get(&key))
            .cloned()
            .ok_or(StoreError::NotFound)?;
        if expected_rv.is_some_and(|e| e != rv_of(&old)) {
            return Err(StoreError::Conflict);
        }
        if let Some(m) = g.objects.get_mut(storage) {
            m.remove(&key);
        }
        g.rv += 1;
        let rv = g.rv;
        let mut last = (*old).clone();
        set_rv(&mut last, rv);
        let last = Arc::new(last);
        self.commit(
            &mut g,
            storage,
            ChangeType::Deleted,
            last.clone(),
            Some(old),
            rv,
        );
        Ok(last)
    }

    /// Subscribe to changes after `from` (`None`: from now).
    pub fn subscribe(&self, from: Option<u64>) -> Result<Subscription, StoreError> {
        let g = self.lock();
        let rx = self.tx.subscribe();
        let backlog = match from {
            None => Vec::new(),
            Some(rv) if rv < g.floor => {
                return Err(StoreError::Expired {
                    requested: rv,
                    floor: g.floor,
                });
            }
            Some(rv) => g.log.iter().filter(|c| c.rv > rv).cloned().collect(),
        };
        Ok(Subscription {
            backlog,
            rx,
            rv: g.rv,
        })
    }

    /// Subscribe to changes from now on, together with a consistent snapshot of one kind.
    pub fn subscribe_with_snapshot(
        &self,
        storage: &str,
        ns: Option<&str>,
    ) -> (Vec<Arc<Value>>, Subscription) {
        let g = self.lock();
        let rx = self.tx.subscribe();
        let items = match g.objects.get(storage) {
            None => Vec::new(),
            Some(m) => m
                .values()
                .filter(|v| ns.is_none_or(|ns| v["metadata"]["namespace"].as_str() == Some(ns)))
                .cloned()
                .collect(),
        };
        (
            items,
            Subscription {
                backlog: Vec::new(),
                rx,
                rv: g.rv,
            },
        )
    }

    /// Every stored object with its storage key (for persistence and GC scans).
    pub fn all(&self) -> (Vec<(String, Arc<Value>)>, u64) {
        let g = self.lock();
        let mut out = Vec::new();
        for (s, m) in &g.objects {
            for v in m.values() {
                out.push((s.clone(), v.clone()));
            }
        }
        (out, g.rv)
    }

    /// Write `state.json` (atomically via rename). No-op for in-memory stores.
    pub fn persist(&self) -> std::io::Result<()> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let (all, rv) = self.all();
        let objects: Vec<Value> = all
            .iter()
            .map(|(s, o)| json!({"storage": s, "object": &**o}))
            .collect();
        let doc = json!({"resourceVersion": rv, "objects": objects});
        let tmp = path.with_extension("json.tmp");
        std::fs::write(
            &tmp,
            serde_json::to_vec(&doc).map_err(std::io::Error::other)?,
        )?;
        std::fs::rename(&tmp, path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crud_and_watch_log() {
        let s = Store::open(None, 3).expect("store");
        let a = s
            .create("/nodes", json!({"metadata": {"name": "a"}}))
            .expect("create");
        assert_eq!(
            s.create("/nodes", json!({"metadata": {"name": "a"}})),
            Err(StoreError::AlreadyExists)
        );
        let rv = rv_of(&a);
        let sub = s.subscribe(Some(rv)).expect("sub");
        assert!(sub.backlog.is_empty());
        assert_eq!(
            s.update("/nodes", rv + 5, json!({"metadata": {"name": "a"}})),
            Err(StoreError::Conflict)
        );
        s.update(
            "/nodes",
            rv,
            json!({"metadata": {"name": "a", "labels": {"x": "y"}}}),
        )
        .expect("update");
        assert_eq!(s.subscribe(Some(rv)).expect("sub").backlog.len(), 1);
        for i in 0..5 {
            s.create("/nodes", json!({"metadata": {"name": format!("n{i}")}}))
                .expect("create");
        }
        assert!(matches!(
            s.subscribe(Some(rv)),
            Err(StoreError::Expired { .. })
        ));
        s.delete("/nodes", "", "a", None).expect("delete");
        assert!(s.get("/nodes", "", "a").is_none());
    }
}
