//! The in-memory replica of monitored tables, fed by monitor replies and update2/update3
//! notifications, with client-side indexes on a column or on one key of a map column.

use std::collections::HashMap;
use std::sync::Arc;

use indexmap::IndexMap;
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
    /// In insertion order (a replaced or changed row moves to the end), so a scan of the
    /// table reads row data in the order it was allocated.
    rows: IndexMap<Uuid, Row>,
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
            rows: IndexMap::new(),
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
                if let Some(old) = self.rows.swap_remove(&uuid) {
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
                let Some(mut row) = self.rows.swap_remove(&uuid) else {
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
            RowChange::Delete => match self.rows.swap_remove(&uuid) {
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

    /// Applies decoded row updates in order. An inconsistency stops the batch (the replica
    /// can no longer be trusted); a row that does not fit is skipped with a log line.
    fn apply_rows(&mut self, rows: DecodedRows) -> Applied {
        let mut out = Applied::default();
        if self.rows.is_empty() {
            // An initial fill: size the table once.
            self.rows.reserve(rows.len());
        }
        for (uuid, change) in rows {
            let r = change
                .map_err(|e| self.err(uuid, e))
                .and_then(|c| self.apply_row_change(uuid, c));
            match r {
                Ok(()) => out.applied += 1,
                Err(e @ UpdateError::Inconsistent(_)) => {
                    out.inconsistent = Some(e);
                    break;
                }
                Err(e) => {
                    tracing::warn!(table = %self.name, error = %e, "skipping an invalid row update");
                    out.first_err.get_or_insert(e);
                }
            }
        }
        out
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

/// One table's row updates, decoded (or the reason a row could not be), in message order.
type DecodedRows = Vec<(Uuid, Result<RowChange, String>)>;

/// What [`TableCache::apply_rows`] did.
#[derive(Default)]
struct Applied {
    applied: usize,
    first_err: Option<UpdateError>,
    inconsistent: Option<UpdateError>,
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
                rows: IndexMap::new(),
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
        let collected: TableUpdates<'_> = serde_json::from_str(updates.get()).map_err(|e| {
            UpdateError::Invalid(format!("table updates are not an object of tables: {e}"))
        })?;
        self.apply_table_updates(collected)
    }

    /// Applies updates already split into rows by [`TableUpdates`] (which a caller can
    /// deserialize as part of a larger message, so the text is walked once before decoding).
    pub fn apply_table_updates(&mut self, u: TableUpdates<'_>) -> Result<usize, UpdateError> {
        let mut first_err = u.errors.into_iter().next().map(UpdateError::Invalid);
        // Each table of the message resolved once; rows of unmonitored tables are skipped.
        let monitored: Vec<bool> = u
            .tables
            .iter()
            .map(|t| {
                let known = self.tables.contains_key(t.as_ref());
                if !known {
                    tracing::warn!(db = %self.schema.name, table = %t, "update for a table that is not monitored; ignored");
                }
                known
            })
            .collect();
        let items: Vec<(&str, Uuid, &str)> = u
            .rows
            .iter()
            .filter(|(t, _, _)| monitored[*t as usize])
            .map(|(t, uuid, raw)| (u.tables[*t as usize].as_ref(), *uuid, *raw))
            .collect();
        let decoded = self.decode_rows(&items);
        // Each table's rows, in message order; tables are independent, so a large update
        // spanning several tables is applied to them in parallel.
        let mut per_table: HashMap<&str, DecodedRows> = HashMap::new();
        for ((table, uuid, _), change) in items.iter().zip(decoded) {
            per_table.entry(table).or_default().push((*uuid, change));
        }
        let jobs: Vec<(&mut TableCache, DecodedRows)> = self
            .tables
            .iter_mut()
            .filter_map(|(name, tc)| per_table.remove(name.as_str()).map(|rows| (tc, rows)))
            .collect();
        let apply = |(tc, rows): (&mut TableCache, DecodedRows)| tc.apply_rows(rows);
        let outcomes = if items.len() >= 2 * PARALLEL_DECODE_MIN_ROWS {
            par_each(jobs, apply)
        } else {
            jobs.into_iter().map(apply).collect()
        };
        let mut n = 0;
        for o in outcomes {
            n += o.applied;
            if let Some(e) = o.inconsistent {
                // The replica can no longer be trusted: the caller resynchronises.
                return Err(e);
            }
            if let Some(e) = o.first_err {
                first_err.get_or_insert(e);
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
        par_map_chunks(items, PARALLEL_DECODE_MIN_ROWS, decode)
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

/// A `<table-updates2>` object split into its rows, each row's update kept as its JSON text
/// for decoding later (in parallel). Deserializing it walks the text once; a table whose rows
/// are not an object, or a row key that is not a UUID, is recorded in `errors` and the other
/// tables and rows are kept.
#[derive(Debug, Default)]
pub struct TableUpdates<'de> {
    tables: Vec<std::borrow::Cow<'de, str>>,
    /// (index into `tables`, row, `<row-update2>` text)
    rows: Vec<(u32, Uuid, &'de str)>,
    errors: Vec<String>,
}

impl<'de> serde::Deserialize<'de> for TableUpdates<'de> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Tables;
        impl<'de> Visitor<'de> for Tables {
            type Value = TableUpdates<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a <table-updates2> object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Self::Value, A::Error> {
                let mut u = TableUpdates::default();
                while let Some(table) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                    let index = u.tables.len() as u32;
                    m.next_value_seed(TableRows {
                        index,
                        table: &table,
                        u: &mut u,
                    })?;
                    u.tables.push(table);
                }
                Ok(u)
            }
        }
        d.deserialize_map(Tables)
    }
}

/// The rows of one table of a [`TableUpdates`], appended to it.
struct TableRows<'a, 'de> {
    index: u32,
    table: &'a str,
    u: &'a mut TableUpdates<'de>,
}

impl<'de> DeserializeSeed<'de> for TableRows<'_, 'de> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

macro_rules! not_an_object {
    ($($visit:ident: $t:ty),*) => {$(
        fn $visit<E>(self, _: $t) -> Result<(), E> {
            self.not_an_object();
            Ok(())
        }
    )*};
}

impl TableRows<'_, '_> {
    fn not_an_object(self) {
        self.u
            .errors
            .push(format!("rows of table {}: not an object", self.table));
    }
}

impl<'de> Visitor<'de> for TableRows<'_, 'de> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object of rows")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
        while let Some(key) = m.next_key::<std::borrow::Cow<'de, str>>()? {
            let raw: &'de RawValue = m.next_value()?;
            match Uuid::parse_str(&key) {
                Ok(uuid) => self.u.rows.push((self.index, uuid, raw.get())),
                Err(_) => self.u.errors.push(format!(
                    "table {}: row key {key:?} is not a UUID",
                    self.table
                )),
            }
        }
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> Result<(), A::Error> {
        while s.next_element::<IgnoredAny>()?.is_some() {}
        self.not_an_object();
        Ok(())
    }
    // Scalars where the rows should be: recorded, and the other tables kept.
    not_an_object!(visit_bool: bool, visit_i64: i64, visit_u64: u64, visit_f64: f64, visit_str: &str);
    fn visit_unit<E>(self) -> Result<(), E> {
        self.not_an_object();
        Ok(())
    }
}

/// `f` over `items` in order, the work split across the available cores (at most 8) when
/// each would get at least `min_per_thread` items.
pub fn par_map_chunks<T: Sync, R: Send>(
    items: &[T],
    min_per_thread: usize,
    f: impl Fn(&[T]) -> Vec<R> + Sync,
) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map(usize::from)
        .unwrap_or(1)
        .min(items.len() / min_per_thread.max(1))
        .min(8);
    if threads < 2 {
        return f(items);
    }
    let chunks: Vec<&[T]> = items.chunks(items.len().div_ceil(threads)).collect();
    par_each(chunks, f).into_iter().flatten().collect()
}

/// `f` over each job, each on its own thread (this thread takes the first); the results in
/// job order. A panic in a job is resumed here.
fn par_each<J: Send, R: Send>(jobs: Vec<J>, f: impl Fn(J) -> R + Sync) -> Vec<R> {
    let f = &f;
    std::thread::scope(|s| {
        let mut jobs = jobs.into_iter();
        let first = jobs.next();
        let handles: Vec<_> = jobs.map(|j| s.spawn(move || f(j))).collect();
        let mut out: Vec<R> = first.map(f).into_iter().collect();
        for h in handles {
            match h.join() {
                Ok(r) => out.push(r),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
        out
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SCHEMA: &str = r#"{"name":"Two","version":"1.0.0","tables":{
      "A":{"columns":{"name":{"type":"string"},"n":{"type":"integer"},
                      "tags":{"type":{"key":"string","min":0,"max":"unlimited"}}},"isRoot":true},
      "B":{"columns":{"peer":{"type":{"key":"uuid","min":0,"max":1}},
                      "opts":{"type":{"key":"string","value":"string","min":0,"max":"unlimited"}}},
           "isRoot":true}}}"#;

    fn cache() -> DbCache {
        let v: Value = serde_json::from_str(SCHEMA).expect("schema json");
        let schema = Arc::new(DbSchema::parse(&v).expect("schema"));
        let mut c = DbCache::new(schema, &[("A".into(), None), ("B".into(), None)]);
        if let Some(t) = c.table_mut("A") {
            t.add_index(IndexSpec::column("name"));
        }
        c
    }

    fn uuid(i: usize) -> String {
        format!("{i:08x}-0000-4000-8000-000000000000")
    }

    fn apply(c: &mut DbCache, v: Value) -> Result<usize, UpdateError> {
        let raw = serde_json::value::to_raw_value(&v).expect("raw");
        c.apply_updates2_raw(&raw)
    }

    /// A large update over two tables (applied to both tables at once, its rows decoded on
    /// several threads) leaves the same replica, index included, as the same rows applied
    /// one update at a time.
    #[test]
    fn large_update_over_two_tables_equals_row_by_row() {
        let n = PARALLEL_DECODE_MIN_ROWS + 7;
        let (mut a, mut b) = (serde_json::Map::new(), serde_json::Map::new());
        for i in 0..n {
            a.insert(
                uuid(i),
                json!({"initial": {"name": format!("a{i}"), "n": i, "tags": ["set", ["x", format!("t{}", i % 7)]]}}),
            );
            b.insert(
                uuid(n + i),
                json!({"initial": {"peer": ["uuid", uuid(i)], "opts": ["map", [["k", format!("v{i}")]]]}}),
            );
        }
        let mut whole = cache();
        let applied = apply(&mut whole, json!({"A": a.clone(), "B": b.clone()})).expect("apply");
        assert_eq!(applied, 2 * n);

        let mut one_by_one = cache();
        for (table, rows) in [("A", a), ("B", b)] {
            for (u, row) in rows {
                apply(&mut one_by_one, json!({table: {u: row}})).expect("apply one");
            }
        }
        assert_eq!(whole.dump(), one_by_one.dump());
        let t = whole.table("A").expect("A");
        let found = t
            .find_str(&IndexSpec::column("name"), "a77")
            .expect("index");
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].uuid.to_string(), uuid(77));
    }

    /// A table whose rows are not an object, a row key that is not a UUID and a table that is
    /// not monitored are each skipped; the good rows around them are applied.
    #[test]
    fn bad_tables_and_row_keys_do_not_stop_the_good_rows() {
        let mut c = cache();
        let text = json!({
            "Unmonitored": {uuid(9): {"insert": {"x": 1}}},
            "A": {uuid(1): {"insert": {"name": "one"}}, "not-a-uuid": {"insert": {"name": "x"}}},
            "B": ["not", "an", "object"],
        });
        assert_eq!(apply(&mut c, text), Ok(1));
        assert_eq!(c.table("A").map(TableCache::len), Some(1));
        assert_eq!(c.table("B").map(TableCache::len), Some(0));

        // Every table malformed: nothing applied, and the error names the table.
        let err = apply(&mut c, json!({"B": "garbage"})).expect_err("nothing applied");
        assert!(err.to_string().contains("rows of table B"), "{err}");
        // Not an object of tables at all.
        let err = apply(&mut c, json!(["A"])).expect_err("not an object");
        assert!(err.to_string().contains("not an object of tables"), "{err}");
    }

    /// A modify of a row the replica lacks, inside a large two-table update, is reported as
    /// an inconsistency (the client then resynchronises) even though the rest applied.
    #[test]
    fn inconsistency_in_a_large_update_is_reported() {
        let n = PARALLEL_DECODE_MIN_ROWS + 7;
        let mut a = serde_json::Map::new();
        for i in 0..n {
            a.insert(uuid(i), json!({"insert": {"name": format!("a{i}")}}));
        }
        let mut b = serde_json::Map::new();
        for i in 0..n {
            b.insert(uuid(n + i), json!({"insert": {}}));
        }
        b.insert(
            uuid(10 * n),
            json!({"modify": {"opts": ["map", [["k", "v"]]]}}),
        );
        let mut c = cache();
        match apply(&mut c, json!({"A": a, "B": b})) {
            Err(UpdateError::Inconsistent(m)) => assert!(m.contains("table B"), "{m}"),
            other => panic!("expected an inconsistency, got {other:?}"),
        }
    }
}
