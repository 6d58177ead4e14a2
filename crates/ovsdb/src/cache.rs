//! The in-memory replica of monitored tables, fed by monitor replies and update2/update3
//! notifications, with client-side indexes on a column or on one key of a map column.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use serde_json::Value;
use uuid::Uuid;

use crate::datum::{Atom, Datum, DatumError, short};
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
    indexes: HashMap<IndexSpec, HashMap<Atom, BTreeSet<Uuid>>>,
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
        let mut idx: HashMap<Atom, BTreeSet<Uuid>> = HashMap::new();
        if let Some(col) = self.columns.index_of(&spec.column) {
            for (u, r) in &self.rows {
                if let Some(a) = index_value(&spec, &r.values[col]) {
                    idx.entry(a.clone()).or_default().insert(*u);
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
                set.remove(uuid);
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
                idx.entry(a.clone()).or_default().insert(uuid);
            }
        }
    }

    /// Applies one `<row-update2>` for `uuid`.
    fn apply_row_update2(&mut self, uuid: Uuid, upd: &Value) -> Result<(), UpdateError> {
        let obj = upd.as_object().ok_or_else(|| {
            self.err(uuid, format!("row update is not an object: {}", short(upd)))
        })?;
        if let Some(row) = obj.get("initial").or_else(|| obj.get("insert")) {
            let new = self.parse_full_row(uuid, row)?;
            if let Some(old) = self.rows.remove(&uuid) {
                self.index_remove(&uuid, &old);
            }
            self.index_add(uuid, &new.values);
            self.rows.insert(uuid, new);
        } else if let Some(diff) = obj.get("modify") {
            let diff = diff
                .as_object()
                .ok_or_else(|| self.err(uuid, "modify is not an object".into()))?;
            let Some(mut row) = self.rows.remove(&uuid) else {
                return Err(UpdateError::Inconsistent(format!(
                    "modify of row {uuid} in table {} that the cache does not hold",
                    self.name
                )));
            };
            self.index_remove(&uuid, &row);
            let mut result = Ok(());
            for (col, v) in diff {
                let Some(i) = self.columns.index_of(col) else {
                    continue;
                };
                let ty = &self.columns.types[i];
                match Datum::from_json(v, ty).and_then(|d| row.values[i].apply_diff(d, ty)) {
                    Ok(()) => {}
                    Err(e) => {
                        result = Err(self.err(uuid, format!("column {col}: {e}")));
                        break;
                    }
                }
            }
            self.index_add(uuid, &row.values);
            self.rows.insert(uuid, row);
            result?;
        } else if obj.contains_key("delete") {
            match self.rows.remove(&uuid) {
                Some(old) => self.index_remove(&uuid, &old),
                None => {
                    return Err(UpdateError::Inconsistent(format!(
                        "delete of row {uuid} in table {} that the cache does not hold",
                        self.name
                    )));
                }
            }
        } else {
            return Err(self.err(
                uuid,
                format!("row update has no known member: {}", short(upd)),
            ));
        }
        Ok(())
    }

    /// Applies one v1 `<row-update>` (`old`/`new`), used by the plain `monitor` method.
    fn apply_row_update1(&mut self, uuid: Uuid, upd: &Value) -> Result<(), UpdateError> {
        match upd.get("new") {
            Some(new) if !new.is_null() => {
                let new = self.parse_full_row(uuid, new)?;
                if let Some(old) = self.rows.remove(&uuid) {
                    self.index_remove(&uuid, &old);
                }
                self.index_add(uuid, &new.values);
                self.rows.insert(uuid, new);
            }
            _ => {
                if let Some(old) = self.rows.remove(&uuid) {
                    self.index_remove(&uuid, &old);
                }
            }
        }
        Ok(())
    }

    fn parse_full_row(&self, uuid: Uuid, row: &Value) -> Result<Row, UpdateError> {
        let obj = row
            .as_object()
            .ok_or_else(|| self.err(uuid, format!("row is not an object: {}", short(row))))?;
        let mut values: Vec<Datum> = self.columns.types.iter().map(Datum::default_for).collect();
        for (col, v) in obj {
            let Some(i) = self.columns.index_of(col) else {
                continue;
            };
            values[i] = Datum::from_json(v, &self.columns.types[i])
                .map_err(|e| self.err(uuid, format!("column {col}: {e}")))?;
        }
        Ok(Row {
            values: values.into_boxed_slice(),
        })
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
    /// skipped with a log line; a modify/delete of a row the cache lacks is an inconsistency
    /// (the caller resynchronises).
    pub fn apply_updates2(&mut self, updates: &Value) -> Result<usize, UpdateError> {
        self.apply(updates, false)
    }

    /// Applies a v1 `<table-updates>` object (`old`/`new` rows).
    pub fn apply_updates1(&mut self, updates: &Value) -> Result<usize, UpdateError> {
        self.apply(updates, true)
    }

    fn apply(&mut self, updates: &Value, v1: bool) -> Result<usize, UpdateError> {
        let obj = updates.as_object().ok_or_else(|| {
            UpdateError::Invalid(format!(
                "table updates are not an object: {}",
                short(updates)
            ))
        })?;
        let mut n = 0;
        let mut first_err = None;
        for (table, rows) in obj {
            let Some(tc) = self.tables.get_mut(table) else {
                tracing::warn!(db = %self.schema.name, table = %table, "update for a table that is not monitored; ignored");
                continue;
            };
            let Some(rows) = rows.as_object() else {
                first_err.get_or_insert(UpdateError::Invalid(format!(
                    "rows of table {table} are not an object"
                )));
                continue;
            };
            for (u, upd) in rows {
                let Ok(uuid) = Uuid::parse_str(u) else {
                    first_err.get_or_insert(UpdateError::Invalid(format!(
                        "table {table}: row key {u:?} is not a UUID"
                    )));
                    continue;
                };
                let r = if v1 {
                    tc.apply_row_update1(uuid, upd)
                } else {
                    tc.apply_row_update2(uuid, upd)
                };
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
        }
        match first_err {
            Some(e) if n == 0 => Err(e),
            _ => Ok(n),
        }
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
