//! Transactions (RFC 7047 §5.2): operations built client-side and sent as one `transact`.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Value, json};
use uuid::Uuid;

use crate::datum::{Atom, Datum, short};

/// Column values of an inserted or updated row.
pub type RowData = BTreeMap<String, Datum>;

/// A `<condition>`: `[column, function, value]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Condition {
    pub column: String,
    pub function: &'static str,
    pub value: Datum,
}

impl Condition {
    pub fn eq(column: &str, value: impl Into<Datum>) -> Self {
        Condition {
            column: column.into(),
            function: "==",
            value: value.into(),
        }
    }
    pub fn ne(column: &str, value: impl Into<Datum>) -> Self {
        Condition {
            column: column.into(),
            function: "!=",
            value: value.into(),
        }
    }
    pub fn includes(column: &str, value: impl Into<Datum>) -> Self {
        Condition {
            column: column.into(),
            function: "includes",
            value: value.into(),
        }
    }
    pub fn excludes(column: &str, value: impl Into<Datum>) -> Self {
        Condition {
            column: column.into(),
            function: "excludes",
            value: value.into(),
        }
    }
    /// `_uuid == u`
    pub fn uuid(u: Uuid) -> Self {
        Condition::eq("_uuid", Datum::scalar(u))
    }
    pub fn to_json(&self) -> Value {
        json!([self.column, self.function, self.value.to_json()])
    }
}

/// A `<mutation>`: `[column, mutator, value]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Mutation {
    pub column: String,
    pub mutator: &'static str,
    pub value: Datum,
}

impl Mutation {
    pub fn insert(column: &str, value: impl Into<Datum>) -> Self {
        Mutation {
            column: column.into(),
            mutator: "insert",
            value: value.into(),
        }
    }
    pub fn delete(column: &str, value: impl Into<Datum>) -> Self {
        Mutation {
            column: column.into(),
            mutator: "delete",
            value: value.into(),
        }
    }
    pub fn add(column: &str, n: i64) -> Self {
        Mutation {
            column: column.into(),
            mutator: "+=",
            value: Datum::scalar(n),
        }
    }
    pub fn to_json(&self) -> Value {
        json!([self.column, self.mutator, self.value.to_json()])
    }
}

impl From<Atom> for Datum {
    fn from(a: Atom) -> Self {
        Datum::scalar(a)
    }
}
impl From<&str> for Datum {
    fn from(s: &str) -> Self {
        Datum::scalar(s)
    }
}
impl From<String> for Datum {
    fn from(s: String) -> Self {
        Datum::scalar(s)
    }
}
impl From<i64> for Datum {
    fn from(i: i64) -> Self {
        Datum::scalar(i)
    }
}
impl From<bool> for Datum {
    fn from(b: bool) -> Self {
        Datum::scalar(b)
    }
}
impl From<Uuid> for Datum {
    fn from(u: Uuid) -> Self {
        Datum::scalar(u)
    }
}

/// One operation, kept with a short description for error messages.
#[derive(Clone, Debug)]
pub struct Op {
    pub json: Value,
    pub summary: String,
}

/// A transaction on one database. Build it, then pass it to [`crate::Client::transact`].
#[derive(Clone, Debug)]
pub struct Txn {
    db: String,
    ops: Vec<Op>,
    named: usize,
}

/// A reference to a row inserted earlier in the same transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedRow {
    pub name: String,
    /// Index of the insert op, to find the real UUID in the results.
    pub op_index: usize,
}

impl NamedRow {
    pub fn atom(&self) -> Atom {
        Atom::NamedUuid(self.name.clone())
    }
}

impl From<&NamedRow> for Datum {
    fn from(n: &NamedRow) -> Self {
        Datum::scalar(n.atom())
    }
}

fn row_json(row: &RowData) -> Value {
    Value::Object(row.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
}

fn where_json(conds: &[Condition]) -> Value {
    Value::Array(conds.iter().map(Condition::to_json).collect())
}

impl Txn {
    pub fn new(db: &str) -> Self {
        Txn {
            db: db.to_owned(),
            ops: Vec::new(),
            named: 0,
        }
    }
    pub fn db(&self) -> &str {
        &self.db
    }
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }
    pub fn len(&self) -> usize {
        self.ops.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    fn push(&mut self, json: Value, summary: String) -> usize {
        self.ops.push(Op { json, summary });
        self.ops.len() - 1
    }

    /// `insert` with a generated `uuid-name`; the returned handle references the new row.
    pub fn insert(&mut self, table: &str, row: RowData) -> NamedRow {
        self.named += 1;
        let name = format!("row{}", self.named);
        let op_index = self.push(
            json!({"op": "insert", "table": table, "uuid-name": name, "row": row_json(&row)}),
            format!("insert into {table}"),
        );
        NamedRow { name, op_index }
    }

    pub fn update(&mut self, table: &str, conds: &[Condition], row: RowData) -> usize {
        self.push(
            json!({"op": "update", "table": table, "where": where_json(conds), "row": row_json(&row)}),
            format!("update {table} where {}", describe_where(conds)),
        )
    }

    pub fn mutate(&mut self, table: &str, conds: &[Condition], mutations: &[Mutation]) -> usize {
        self.push(
            json!({"op": "mutate", "table": table, "where": where_json(conds),
                   "mutations": mutations.iter().map(Mutation::to_json).collect::<Vec<_>>()}),
            format!("mutate {table} where {}", describe_where(conds)),
        )
    }

    pub fn delete(&mut self, table: &str, conds: &[Condition]) -> usize {
        self.push(
            json!({"op": "delete", "table": table, "where": where_json(conds)}),
            format!("delete from {table} where {}", describe_where(conds)),
        )
    }

    pub fn select(&mut self, table: &str, conds: &[Condition], columns: Option<&[&str]>) -> usize {
        let mut op = json!({"op": "select", "table": table, "where": where_json(conds)});
        if let (Some(c), Some(o)) = (columns, op.as_object_mut()) {
            o.insert("columns".into(), json!(c));
        }
        self.push(
            op,
            format!("select from {table} where {}", describe_where(conds)),
        )
    }

    /// `wait` with timeout 0: the transaction aborts unless the rows matching `conds`, projected
    /// on `columns`, are (`until_equal`) or are not exactly `rows`. This is optimistic
    /// concurrency: assert what was read, then write.
    pub fn wait(
        &mut self,
        table: &str,
        conds: &[Condition],
        columns: &[&str],
        rows: &[RowData],
        until_equal: bool,
    ) -> usize {
        self.push(
            json!({"op": "wait", "table": table, "where": where_json(conds), "columns": columns,
                   "until": if until_equal { "==" } else { "!=" }, "timeout": 0,
                   "rows": rows.iter().map(row_json).collect::<Vec<_>>()}),
            format!("wait on {table} where {}", describe_where(conds)),
        )
    }

    pub fn comment(&mut self, text: &str) -> usize {
        self.push(json!({"op": "comment", "comment": text}), "comment".into())
    }

    /// The `params` of the `transact` request.
    pub fn params(&self) -> Value {
        let mut p = Vec::with_capacity(self.ops.len() + 1);
        p.push(Value::String(self.db.clone()));
        p.extend(self.ops.iter().map(|o| o.json.clone()));
        Value::Array(p)
    }

    /// Checks a `transact` reply op by op.
    pub fn check_results(&self, result: &Value) -> Result<TxnResults, TxnError> {
        let arr = result.as_array().ok_or_else(|| {
            TxnError::Malformed(format!(
                "transact result is not an array: {}",
                short(result)
            ))
        })?;
        for (i, r) in arr.iter().enumerate() {
            if let Some(err) = r.get("error").filter(|e| !e.is_null()) {
                let error = err.as_str().unwrap_or("unknown error").to_owned();
                let details = r
                    .get("details")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned();
                return Err(match self.ops.get(i) {
                    Some(op) => TxnError::Op {
                        index: i,
                        op: op.summary.clone(),
                        error,
                        details,
                    },
                    None => TxnError::Commit { error, details },
                });
            }
        }
        if arr.len() < self.ops.len() {
            return Err(TxnError::Malformed(format!(
                "{} results for {} operations and no error reported",
                arr.len(),
                self.ops.len()
            )));
        }
        Ok(TxnResults {
            results: arr[..self.ops.len()].to_vec(),
        })
    }
}

fn describe_where(conds: &[Condition]) -> String {
    if conds.is_empty() {
        return "(all rows)".into();
    }
    conds
        .iter()
        .map(|c| format!("{} {} {}", c.column, c.function, short(&c.value.to_json())))
        .collect::<Vec<_>>()
        .join(" and ")
}

/// Per-op results of a successful transaction.
#[derive(Clone, Debug)]
pub struct TxnResults {
    pub results: Vec<Value>,
}

impl TxnResults {
    /// The UUID the server gave a row inserted as `named`.
    pub fn uuid_of(&self, named: &NamedRow) -> Option<Uuid> {
        let u = self.results.get(named.op_index)?.get("uuid")?;
        match u.as_array()?.as_slice() {
            [Value::String(tag), Value::String(s)] if tag == "uuid" => Uuid::parse_str(s).ok(),
            _ => None,
        }
    }
    /// The `count` of an update/mutate/delete op.
    pub fn count(&self, op_index: usize) -> Option<u64> {
        self.results.get(op_index)?.get("count")?.as_u64()
    }
    /// The rows of a select op.
    pub fn rows(&self, op_index: usize) -> Option<&Vec<Value>> {
        self.results.get(op_index)?.get("rows")?.as_array()
    }
}

/// A failed transaction, naming the operation that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TxnError {
    #[error("operation {index} ({op}) failed: {error}{}", details_suffix(details))]
    Op {
        index: usize,
        op: String,
        error: String,
        details: String,
    },
    #[error("transaction failed at commit: {error}{}", details_suffix(details))]
    Commit { error: String, details: String },
    #[error("malformed transact reply: {0}")]
    Malformed(String),
}

impl TxnError {
    /// The OVSDB error string (`"constraint violation"`, `"timed out"`, …).
    pub fn kind(&self) -> &str {
        match self {
            TxnError::Op { error, .. } | TxnError::Commit { error, .. } => error,
            TxnError::Malformed(_) => "malformed reply",
        }
    }
}

fn details_suffix(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(": {d}")
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.summary)
    }
}
