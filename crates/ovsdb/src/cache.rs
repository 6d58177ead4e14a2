//! The in-memory replica of monitored tables, fed by monitor replies and update2/update3
//! notifications, with client-side indexes on a column or on one key of a map column.

use std::collections::HashMap;
use std::sync::Arc;

use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;
use uuid::Uuid;

use crate::datum::{Atom, Datum, DatumError, DatumSeed};
use crate::schema::{ColumnType, DbSchema, TableSchema};

/// A client-side index: rows by the value of a scalar column, or by the value stored under
/// `key` in a map column (e.g. `external_ids:k8s.ovn.org/owner`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IndexSpec {
    pub column: String,
    pub key: Option<String>,
}

impl IndexSpec {
    pub fn column(column: &str) -> Self {
        IndexSpec {
            column: column.to_owned(),
            key: None,
        }
    }
    pub fn map_key(column: &str, key: &str) -> Self {
        IndexSpec {
            column: column.to_owned(),
            key: Some(key.to_owned()),
        }
    }
}

/// One cached row: values in the order of the table's monitored columns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    values: Box<[Datum]>,
}

impl Row {
    pub fn values(&self) -> &[Datum] {
        &self.values
    }
}

/// The monitored columns of one table.
#[derive(Debug)]
pub struct Columns {
    pub names: Vec<String>,
    pub types: Vec<ColumnType>,
    by_name: HashMap<String, usize>,
}

impl Columns {
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }
}

#[derive(Debug)]
pub struct TableCache {
    name: String,
    columns: Arc<Columns>,
    rows: HashMap<Uuid, Row>,
    indexes: HashMap<IndexSpec, HashMap<Atom, Vec<Uuid>>>,
}

/// A row seen through its table's column list.
#[derive(Clone, Copy, Debug)]
pub struct RowRef<'a> {
    pub uuid: Uuid,
    pub row: &'a Row,
    pub columns: &'a Columns,
}

impl<'a> RowRef<'a> {
    /// The value of `column`, or `None` when the column is not monitored.
    pub fn get(&self, column: &str) -> Option<&'a Datum> {
        self.columns.index_of(column).map(|i| &self.row.values[i])
    }
    /// Renders the row as a JSON object (`_uuid` plus every monitored column), as a dump would.
    pub fn to_json(&self) -> Value {
        let mut o = serde_json::Map::new();
        o.insert("_uuid".into(), Atom::Uuid(self.uuid).to_json());
        for (n, v) in self.columns.names.iter().zip(self.row.values.iter()) {
            o.insert(n.clone(), v.to_json());
        }
        Value::Object(o)
    }
}

impl TableCache {
    pub fn new(schema: &TableSchema, columns: Option<&[String]>) -> Self {
        let names: Vec<String> = match columns {
            Some(c) => c
                .iter()
                .filter(|n| schema.columns.contains_key(*n))
                .cloned()
                .collect(),
            None => schema.columns.keys().cloned().collect(),
        };
        let types = names
            .iter()
            .filter_map(|n| schema.columns.get(n).cloned())
            .collect();
        let by_name = names
            .iter()
            .enumerate()
            .map(|(i, n)| (n.clone(), i))
            .collect();
        TableCache {
            name: schema.name.clone(),
            columns: Arc::new(Columns {
                names,
                types,
                by_name,
            }),
            rows: HashMap::new(),
            indexes: HashMap::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn columns(&self) -> &Columns {
        &self.columns
    }
    pub fn len(&self) -> usize {
        self.rows.len()
    }
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
    pub fn get(&self, uuid: &Uuid) -> Option<RowRef<'_>> {
        self.rows.get(uuid).map(|row| RowRef {
            uuid: *uuid,
            row,
            columns: &self.columns,
        })
    }
    pub fn rows(&self) -> impl Iterator<Item = RowRef<'_>> {
        self.rows.iter().map(|(u, row)| RowRef {
            uuid: *u,
            row,
            columns: &self.columns,
        })
    }
    pub fn uuids(&self) -> impl Iterator<Item = &Uuid> {
        self.rows.keys()
    }

    /// Adds an index (built from the current rows, then maintained on every change).
    pub fn add_index(&mut self, spec: IndexSpec) {
        if self.indexes.contains_key(&spec) {
            return;
        }
        let mut idx: HashMap<Atom, Vec<Uuid>> = HashMap::new();
        if let Some(col) = self.columns.index_of(&spec.column) {
            for (u, r) in &self.rows {
                if let Some(a) = index_value(&spec, &r.values[col]) {
                    idx.entry(a.clone()).or_default().push(*u);
                }
            }
        }
        self.indexes.insert(spec, idx);
    }

    pub fn index_specs(&self) -> impl Iterator<Item = &IndexSpec> {
        self.indexes.keys()
    }

    /// Rows whose indexed value equals `value`. `None` when no such index was added.
    pub fn find(&self, spec: &IndexSpec, value: &Atom) -> Option<Vec<RowRef<'_>>> {
        let idx = self.indexes.get(spec)?;
        Some(
            idx.get(value)
                .into_iter()
                .flatten()
                .filter_map(|u| self.get(u))
                .collect(),
        )
    }

    /// Rows whose string column/key equals `value`, through an index.
    pub fn find_str(&self, spec: &IndexSpec, value: &str) -> Option<Vec<RowRef<'_>>> {
        self.find(spec, &Atom::String(value.to_owned()))
    }

    fn index_remove(&mut self, uuid: &Uuid, row: &Row) {
        for (spec, idx) in self.indexes.iter_mut() {
            let Some(col) = self.columns.index_of(&spec.column) else {
                continue;
            };
            if let Some(a) = index_value(spec, &row.values[col])
                && let Some(set) = idx.get_mut(a)
            {
                set.retain(|u| u != uuid);
                if set.is_empty() {
                    idx.remove(a);
                }
            }
        }
    }

    fn index_add(&mut self, uuid: Uuid, row_values: &[Datum]) {
        for (spec, idx) in self.indexes.iter_mut() {
            let Some(col) = self.columns.index_of(&spec.column) else {
                continue;
            };
            if let Some(a) = index_value(spec, &row_values[col]) {
                idx.entry(a.clone()).or_default().push(uuid);
            }
        }
    }

    /// Applies one `<row-update2>` for `uuid`, read straight from its JSON text.
    /// Decodes one `<row-update2>` against the table's column types.
    fn decode_row_update2(columns: &Columns, raw: &str) -> Result<RowChange, String> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_str(raw);
        RowUpdateSeed(columns)
            .deserialize(&mut de)
            .map_err(|e| e.to_string())
    }

    /// Applies one decoded row update for `uuid`.
    fn apply_row_change(&mut self, uuid: Uuid, change: RowChange) -> Result<(), UpdateError> {
        match change {
            RowChange::Full(cols) => {
                let mut values: Vec<Datum> =
                    self.columns.types.iter().map(Datum::default_for).collect();
                for (i, d) in cols {
                    values[i] = d;
                }
                if let Some(old) = self.rows.remove(&uuid) {
                    self.index_remove(&uuid, &old);
                }
                self.index_add(uuid, &values);
                self.rows.insert(
                    uuid,
                    Row {
                        values: values.into_boxed_slice(),
                    },
                );
            }
            RowChange::Modify(cols) => {
                let Some(mut row) = self.rows.remove(&uuid) else {
                    return Err(UpdateError::Inconsistent(format!(
                        "modify of row {uuid} in table {} that the cache does not hold",
                        self.name
                    )));
                };
                self.index_remove(&uuid, &row);
                let mut result = Ok(());
                for (i, d) in cols {
                    let ty = &self.columns.types[i];
                    if let Err(e) = row.values[i].apply_diff(d, ty) {
                        result =
                            Err(self.err(uuid, format!("column {}: {e}", self.columns.names[i])));
                        break;
                    }
                }
                self.index_add(uuid, &row.values);
                self.rows.insert(uuid, row);
                result?;
            }
            RowChange::Delete => match self.rows.remove(&uuid) {
                Some(old) => self.index_remove(&uuid, &old),
                None => {
                    return Err(UpdateError::Inconsistent(format!(
                        "delete of row {uuid} in table {} that the cache does not hold",
                        self.name
                    )));
                }
            },
        }
        Ok(())
    }

    fn err(&self, uuid: Uuid, msg: String) -> UpdateError {
        UpdateError::Invalid(format!("table {} row {uuid}: {msg}", self.name))
    }
}

fn index_value<'a>(spec: &IndexSpec, d: &'a Datum) -> Option<&'a Atom> {
    match &spec.key {
        Some(k) => d.map_get(k),
        None => d.as_scalar(),
    }
}

/// Below this many rows per thread, decoding a batch on other threads costs more than it saves.
const PARALLEL_DECODE_MIN_ROWS: usize = 2048;

/// The replica of one database.
#[derive(Debug)]
pub struct DbCache {
    schema: Arc<DbSchema>,
    tables: HashMap<String, TableCache>,
}

impl DbCache {
    /// An empty cache for `tables` (table → monitored columns, `None` for all).
    pub fn new(schema: Arc<DbSchema>, tables: &[(String, Option<Vec<String>>)]) -> Self {
        let mut t = HashMap::new();
        for (name, cols) in tables {
            if let Some(ts) = schema.table(name) {
                t.insert(name.clone(), TableCache::new(ts, cols.as_deref()));
            }
        }
        DbCache { schema, tables: t }
    }

    /// An empty cache with the same tables, columns and index definitions as `self`.
    pub fn empty_like(&self) -> Self {
        let mut tables = HashMap::new();
        for (name, tc) in &self.tables {
            let mut fresh = TableCache {
                name: tc.name.clone(),
                columns: tc.columns.clone(),
                rows: HashMap::new(),
                indexes: HashMap::new(),
            };
            for spec in tc.indexes.keys() {
                fresh.add_index(spec.clone());
            }
            tables.insert(name.clone(), fresh);
        }
        DbCache {
            schema: self.schema.clone(),
            tables,
        }
    }

    pub fn schema(&self) -> &DbSchema {
        &self.schema
    }
    pub fn table(&self, name: &str) -> Option<&TableCache> {
        self.tables.get(name)
    }
    pub fn table_mut(&mut self, name: &str) -> Option<&mut TableCache> {
        self.tables.get_mut(name)
    }
    pub fn table_names(&self) -> impl Iterator<Item = &String> {
        self.tables.keys()
    }

    /// Applies a `<table-updates2>` object. Rows of tables this cache does not monitor are
    /// skipped with a log line, and so is a row that does not fit its table (the others are
    /// applied); a modify/delete of a row the cache lacks is an inconsistency (the caller
    /// resynchronises).
    pub fn apply_updates2(&mut self, updates: &Value) -> Result<usize, UpdateError> {
        let raw = serde_json::value::to_raw_value(updates)
            .map_err(|e| UpdateError::Invalid(format!("table updates: {e}")))?;
        self.apply_updates2_raw(&raw)
    }

    /// [`apply_updates2`](Self::apply_updates2) from the JSON text as received (no
    /// intermediate JSON tree: each row is decoded against its column types directly).
    pub fn apply_updates2_raw(&mut self, updates: &RawValue) -> Result<usize, UpdateError> {
        let tables: Vec<(&str, &RawValue)> = parse_object(updates.get()).map_err(|e| {
            UpdateError::Invalid(format!("table updates are not an object of tables: {e}"))
        })?;
        let mut first_err = None;
        // (table, uuid, raw row update) for every row of a monitored table.
        let mut items: Vec<(&str, Uuid, &str)> = Vec::new();
        for (table, rows) in tables {
            if !self.tables.contains_key(table) {
                tracing::warn!(db = %self.schema.name, table = %table, "update for a table that is not monitored; ignored");
                continue;
            }
            let rows: Vec<(&str, &RawValue)> = match parse_object(rows.get()) {
                Ok(r) => r,
                Err(e) => {
                    first_err
                        .get_or_insert(UpdateError::Invalid(format!("rows of table {table}: {e}")));
                    continue;
                }
            };
            for (u, upd) in rows {
                match Uuid::parse_str(u) {
                    Ok(uuid) => items.push((table, uuid, upd.get())),
                    Err(_) => {
                        first_err.get_or_insert(UpdateError::Invalid(format!(
                            "table {table}: row key {u:?} is not a UUID"
                        )));
                    }
                }
            }
        }
        let decoded = self.decode_rows(&items);
        let mut n = 0;
        for ((table, uuid, _), change) in items.iter().zip(decoded) {
            let Some(tc) = self.tables.get_mut(*table) else {
                continue;
            };
            let r = change
                .map_err(|e| tc.err(*uuid, e))
                .and_then(|c| tc.apply_row_change(*uuid, c));
            match r {
                Ok(()) => n += 1,
                // An inconsistency means the replica can no longer be trusted: stop here.
                Err(e @ UpdateError::Inconsistent(_)) => return Err(e),
                Err(e) => {
                    tracing::warn!(db = %self.schema.name, error = %e, "skipping an invalid row update");
                    first_err.get_or_insert(e);
                }
            }
        }
        match first_err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
    }

    /// Decodes every row update. Rows decode independently, so a large batch (an initial
    /// monitor reply) is split across the available cores; the results keep their order.
    fn decode_rows(&self, items: &[(&str, Uuid, &str)]) -> Vec<Result<RowChange, String>> {
        let decode = |chunk: &[(&str, Uuid, &str)]| -> Vec<Result<RowChange, String>> {
            chunk
                .iter()
                .map(|(t, _, raw)| match self.tables.get(*t) {
                    Some(tc) => TableCache::decode_row_update2(&tc.columns, raw),
                    None => Err("table is not monitored".into()),
                })
                .collect()
        };
        let threads = std::thread::available_parallelism()
            .map(usize::from)
            .unwrap_or(1)
            .min(items.len() / PARALLEL_DECODE_MIN_ROWS)
            .min(8);
        if threads < 2 {
            return decode(items);
        }
        let chunk = items.len().div_ceil(threads);
        std::thread::scope(|s| {
            let mut parts = items.chunks(chunk);
            // This thread decodes the first chunk while the others decode the rest.
            let first = parts.next().unwrap_or_default();
            let handles: Vec<_> = parts.map(|c| s.spawn(move || decode(c))).collect();
            let mut out = decode(first);
            for h in handles {
                match h.join() {
                    Ok(v) => out.extend(v),
                    Err(p) => std::panic::resume_unwind(p),
                }
            }
            out
        })
    }

    /// A JSON dump of every cached row, `{table: {uuid: row}}`, for comparisons and debugging.
    pub fn dump(&self) -> Value {
        let mut o = serde_json::Map::new();
        for (name, tc) in &self.tables {
            let mut rows = serde_json::Map::new();
            for r in tc.rows() {
                rows.insert(r.uuid.to_string(), r.to_json());
            }
            o.insert(name.clone(), Value::Object(rows));
        }
        Value::Object(o)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    #[error("invalid update: {0}")]
    Invalid(String),
    #[error("cache inconsistent with the server: {0}")]
    Inconsistent(String),
}

impl From<DatumError> for UpdateError {
    fn from(e: DatumError) -> Self {
        UpdateError::Invalid(e.0)
    }
}

/// The members of a JSON object, borrowed from its text (keys must be unescaped, as table
/// names and UUIDs are).
fn parse_object(text: &str) -> Result<Vec<(&str, &RawValue)>, serde_json::Error> {
    struct Members;
    impl<'de> Visitor<'de> for Members {
        type Value = Vec<(&'de str, &'de RawValue)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
            let mut out = Vec::with_capacity(m.size_hint().unwrap_or(0));
            while let Some(k) = m.next_key::<&str>()? {
                out.push((k, m.next_value::<&RawValue>()?));
            }
            Ok(out)
        }
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let v = serde::Deserializer::deserialize_map(&mut de, Members)?;
    de.end()?;
    Ok(v)
}

enum RowChange {
    /// `initial` or `insert`: the non-default columns.
    Full(Vec<(usize, Datum)>),
    /// `modify`: the changed columns as diffs.
    Modify(Vec<(usize, Datum)>),
    Delete,
}

struct RowUpdateSeed<'c>(&'c Columns);

impl<'de> DeserializeSeed<'de> for RowUpdateSeed<'_> {
    type Value = RowChange;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<RowChange, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowUpdateSeed<'_> {
    type Value = RowChange;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a <row-update2> object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RowChange, A::Error> {
        use serde::de::Error;
        let mut change = None;
        while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
            let c = match &*k {
                "initial" | "insert" => RowChange::Full(m.next_value_seed(RowSeed(self.0))?),
                "modify" => RowChange::Modify(m.next_value_seed(RowSeed(self.0))?),
                "delete" => {
                    m.next_value::<IgnoredAny>()?;
                    RowChange::Delete
                }
                other => {
                    return Err(A::Error::custom(format!(
                        "unknown row update member {other:?}"
                    )));
                }
            };
            if change.replace(c).is_some() {
                return Err(A::Error::custom("row update with more than one member"));
            }
        }
        change.ok_or_else(|| A::Error::custom("empty row update"))
    }
}

/// A `<row>`: monitored columns decoded against their types, others skipped.
struct RowSeed<'c>(&'c Columns);

impl<'de> DeserializeSeed<'de> for RowSeed<'_> {
    type Value = Vec<(usize, Datum)>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RowSeed<'_> {
    type Value = Vec<(usize, Datum)>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a <row> object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let mut out = Vec::with_capacity(m.size_hint().unwrap_or(8));
        while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
            match self.0.index_of(&k) {
                Some(i) => {
                    let d = m
                        .next_value_seed(DatumSeed(&self.0.types[i]))
                        .map_err(|e| A::Error::custom(format!("column {k}: {e}")))?;
                    out.push((i, d));
                }
                None => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(out)
    }
}
