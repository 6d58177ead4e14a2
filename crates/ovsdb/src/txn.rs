//! Transactions (RFC 7047 §5.2): operations built client-side and sent as one `transact`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
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

impl serde::Serialize for Condition {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.column, self.function, &self.value).serialize(s)
    }
}

impl serde::Serialize for Mutation {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        (&self.column, self.mutator, &self.value).serialize(s)
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

/// One operation, serialized when it is built, kept with a short description for error
/// messages.
#[derive(Clone, Debug)]
pub struct Op {
    /// The operation's JSON text.
    pub json: String,
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

#[derive(Serialize)]
struct OpJson<'a> {
    op: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    table: Option<&'a str>,
    #[serde(rename = "uuid-name", skip_serializing_if = "Option::is_none")]
    uuid_name: Option<&'a str>,
    #[serde(rename = "where", skip_serializing_if = "Option::is_none")]
    conds: Option<&'a [Condition]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    row: Option<&'a RowData>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mutations: Option<&'a [Mutation]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    columns: Option<&'a [&'a str]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    until: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rows: Option<&'a [RowData]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    comment: Option<&'a str>,
}

impl<'a> OpJson<'a> {
    fn new(op: &'static str, table: Option<&'a str>) -> Self {
        OpJson {
            op,
            table,
            uuid_name: None,
            conds: None,
            row: None,
            mutations: None,
            columns: None,
            until: None,
            timeout: None,
            rows: None,
            comment: None,
        }
    }
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

    fn push(&mut self, op: &OpJson<'_>, summary: String) -> usize {
        // Serializing plain data (strings, numbers, datums) into a String cannot fail.
        let json = serde_json::to_string(op).unwrap_or_default();
        self.ops.push(Op { json, summary });
        self.ops.len() - 1
    }

    /// `insert` with a generated `uuid-name`; the returned handle references the new row.
    /// Empty set and map columns are left out: the server gives an omitted column its
    /// default, which for such columns is the same empty value (and it has less to parse).
    pub fn insert(&mut self, table: &str, mut row: RowData) -> NamedRow {
        row.retain(|_, d| match d {
            Datum::Set(s) => !s.is_empty(),
            Datum::Map(m) => !m.is_empty(),
        });
        self.named += 1;
        let name = format!("row{}", self.named);
        let mut op = OpJson::new("insert", Some(table));
        op.uuid_name = Some(&name);
        op.row = Some(&row);
        let op_index = self.push(&op, format!("insert into {table}"));
        NamedRow { name, op_index }
    }

    /// Inserts a row given as anything that serializes to a JSON object of column → value in
    /// RFC 7047 notation (e.g. a typed row), without building a [`RowData`]. Unlike
    /// [`insert`](Self::insert), empty sets and maps are written as given.
    pub fn insert_serialized(&mut self, table: &str, row: &impl Serialize) -> NamedRow {
        #[derive(Serialize)]
        struct InsertOp<'a, R> {
            op: &'static str,
            table: &'a str,
            #[serde(rename = "uuid-name")]
            uuid_name: &'a str,
            row: &'a R,
        }
        self.named += 1;
        let name = format!("row{}", self.named);
        let op = InsertOp {
            op: "insert",
            table,
            uuid_name: &name,
            row,
        };
        let json = serde_json::to_string(&op).unwrap_or_default();
        self.ops.push(Op {
            json,
            summary: format!("insert into {table}"),
        });
        NamedRow {
            name,
            op_index: self.ops.len() - 1,
        }
    }

    pub fn update(&mut self, table: &str, conds: &[Condition], row: RowData) -> usize {
        let mut op = OpJson::new("update", Some(table));
        op.conds = Some(conds);
        op.row = Some(&row);
        self.push(
            &op,
            format!("update {table} where {}", describe_where(conds)),
        )
    }

    pub fn mutate(&mut self, table: &str, conds: &[Condition], mutations: &[Mutation]) -> usize {
        let mut op = OpJson::new("mutate", Some(table));
        op.conds = Some(conds);
        op.mutations = Some(mutations);
        self.push(
            &op,
            format!("mutate {table} where {}", describe_where(conds)),
        )
    }

    pub fn delete(&mut self, table: &str, conds: &[Condition]) -> usize {
        let mut op = OpJson::new("delete", Some(table));
        op.conds = Some(conds);
        self.push(
            &op,
            format!("delete from {table} where {}", describe_where(conds)),
        )
    }

    pub fn select(&mut self, table: &str, conds: &[Condition], columns: Option<&[&str]>) -> usize {
        let mut op = OpJson::new("select", Some(table));
        op.conds = Some(conds);
        op.columns = columns;
        self.push(
            &op,
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
        let mut op = OpJson::new("wait", Some(table));
        op.conds = Some(conds);
        op.columns = Some(columns);
        op.until = Some(if until_equal { "==" } else { "!=" });
        op.timeout = Some(0);
        op.rows = Some(rows);
        self.push(
            &op,
            format!("wait on {table} where {}", describe_where(conds)),
        )
    }

    pub fn comment(&mut self, text: &str) -> usize {
        let mut op = OpJson::new("comment", None);
        op.comment = Some(text);
        self.push(&op, "comment".into())
    }

    /// The `params` of the `transact` request as JSON (for inspection).
    pub fn params(&self) -> Value {
        serde_json::from_slice(&self.params_bytes()).unwrap_or(Value::Null)
    }

    /// The `params` of the `transact` request, serialized (the ops are already JSON text).
    pub fn params_bytes(&self) -> Vec<u8> {
        let len: usize = self.ops.iter().map(|o| o.json.len() + 1).sum();
        let mut buf = Vec::with_capacity(len + self.db.len() + 8);
        buf.push(b'[');
        buf.extend_from_slice(Value::String(self.db.clone()).to_string().as_bytes());
        for op in &self.ops {
            buf.push(b',');
            buf.extend_from_slice(op.json.as_bytes());
        }
        buf.push(b']');
        buf
    }

    /// Checks a `transact` reply op by op.
    pub fn check_results(&self, result: &RawValue) -> Result<TxnResults, TxnError> {
        // Ops after a failing one are answered with `null`.
        let outcomes: Vec<Option<OpOutcome>> = serde_json::from_str(result.get()).map_err(|e| {
            TxnError::Malformed(format!(
                "transact result is not an array of op results: {e}"
            ))
        })?;
        let mut outcomes: Vec<OpOutcome> = outcomes
            .into_iter()
            .map(Option::unwrap_or_default)
            .collect();
        for (i, r) in outcomes.iter().enumerate() {
            if let Some(error) = &r.error {
                let error = error.clone();
                let details = r.details.clone().unwrap_or_default();
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
        if outcomes.len() < self.ops.len() {
            return Err(TxnError::Malformed(format!(
                "{} results for {} operations and no error reported",
                outcomes.len(),
                self.ops.len()
            )));
        }
        outcomes.truncate(self.ops.len());
        Ok(TxnResults { results: outcomes })
    }
}

/// The result of one operation.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct OpOutcome {
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub details: Option<String>,
    /// `["uuid", "…"]` of an inserted row.
    #[serde(default)]
    pub uuid: Option<(String, String)>,
    #[serde(default)]
    pub count: Option<u64>,
    #[serde(default)]
    pub rows: Option<Vec<Value>>,
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
    pub results: Vec<OpOutcome>,
}

impl TxnResults {
    /// The UUID the server gave a row inserted as `named`.
    pub fn uuid_of(&self, named: &NamedRow) -> Option<Uuid> {
        match self.results.get(named.op_index)?.uuid.as_ref()? {
            (tag, s) if tag == "uuid" => Uuid::parse_str(s).ok(),
            _ => None,
        }
    }
    /// The `count` of an update/mutate/delete op.
    pub fn count(&self, op_index: usize) -> Option<u64> {
        self.results.get(op_index)?.count
    }
    /// The rows of a select op.
    pub fn rows(&self, op_index: usize) -> Option<&Vec<Value>> {
        self.results.get(op_index)?.rows.as_ref()
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
