//! Database schemas as returned by `get_schema` (RFC 7047 §3.2).

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::datum::short;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicType {
    Integer,
    Real,
    Boolean,
    String,
    Uuid,
}

impl AtomicType {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "integer" => AtomicType::Integer,
            "real" => AtomicType::Real,
            "boolean" => AtomicType::Boolean,
            "string" => AtomicType::String,
            "uuid" => AtomicType::Uuid,
            _ => return None,
        })
    }
}

impl fmt::Display for AtomicType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AtomicType::Integer => "integer",
            AtomicType::Real => "real",
            AtomicType::Boolean => "boolean",
            AtomicType::String => "string",
            AtomicType::Uuid => "uuid",
        })
    }
}

/// `<base-type>`: an atomic type plus the constraints ovnk cares about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseType {
    pub atomic: AtomicType,
    /// For uuid columns, the table the reference points into.
    pub ref_table: Option<String>,
    /// `refType: weak` (a weak reference is cleared when its target row goes away).
    pub weak: bool,
}

impl BaseType {
    pub fn of(atomic: AtomicType) -> Self {
        BaseType {
            atomic,
            ref_table: None,
            weak: false,
        }
    }
}

/// `<type>` of a column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ColumnType {
    pub key: BaseType,
    pub value: Option<BaseType>,
    pub min: u64,
    /// `u64::MAX` for "unlimited".
    pub max: u64,
}

impl ColumnType {
    /// A column holding exactly one atom.
    pub fn scalar(atomic: AtomicType) -> Self {
        ColumnType {
            key: BaseType::of(atomic),
            value: None,
            min: 1,
            max: 1,
        }
    }
    pub fn optional(atomic: AtomicType) -> Self {
        ColumnType {
            key: BaseType::of(atomic),
            value: None,
            min: 0,
            max: 1,
        }
    }
    pub fn set(atomic: AtomicType) -> Self {
        ColumnType {
            key: BaseType::of(atomic),
            value: None,
            min: 0,
            max: u64::MAX,
        }
    }
    pub fn map(key: AtomicType, value: AtomicType) -> Self {
        ColumnType {
            key: BaseType::of(key),
            value: Some(BaseType::of(value)),
            min: 0,
            max: u64::MAX,
        }
    }
    pub fn is_map(&self) -> bool {
        self.value.is_some()
    }

    fn parse(v: &Value) -> Result<Self, SchemaError> {
        if let Value::String(_) = v {
            return Ok(ColumnType {
                key: parse_base(v)?,
                value: None,
                min: 1,
                max: 1,
            });
        }
        let o = v
            .as_object()
            .ok_or_else(|| SchemaError(format!("bad column type {}", short(v))))?;
        let key = parse_base(
            o.get("key")
                .ok_or_else(|| SchemaError("column type without key".into()))?,
        )?;
        let value = o.get("value").map(parse_base).transpose()?;
        let min = match o.get("min") {
            None => 1,
            Some(m) => m
                .as_u64()
                .ok_or_else(|| SchemaError(format!("bad min {m}")))?,
        };
        let max = match o.get("max") {
            None => 1,
            Some(Value::String(s)) if s == "unlimited" => u64::MAX,
            Some(m) => m
                .as_u64()
                .ok_or_else(|| SchemaError(format!("bad max {m}")))?,
        };
        Ok(ColumnType {
            key,
            value,
            min,
            max,
        })
    }
}

fn parse_base(v: &Value) -> Result<BaseType, SchemaError> {
    let bad = || SchemaError(format!("bad base type {}", short(v)));
    match v {
        Value::String(s) => Ok(BaseType::of(AtomicType::parse(s).ok_or_else(bad)?)),
        Value::Object(o) => {
            let atomic = o
                .get("type")
                .and_then(Value::as_str)
                .and_then(AtomicType::parse)
                .ok_or_else(bad)?;
            Ok(BaseType {
                atomic,
                ref_table: o.get("refTable").and_then(Value::as_str).map(str::to_owned),
                weak: o.get("refType").and_then(Value::as_str) == Some("weak"),
            })
        }
        _ => Err(bad()),
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSchema {
    pub name: String,
    pub columns: BTreeMap<String, ColumnType>,
    pub is_root: bool,
    pub indexes: Vec<Vec<String>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DbSchema {
    pub name: String,
    pub version: String,
    pub tables: BTreeMap<String, TableSchema>,
}

impl DbSchema {
    pub fn parse(v: &Value) -> Result<Self, SchemaError> {
        let o = v
            .as_object()
            .ok_or_else(|| SchemaError("schema is not an object".into()))?;
        let name = o
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| SchemaError("schema without name".into()))?;
        let version = o
            .get("version")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        let tables_json = o
            .get("tables")
            .and_then(Value::as_object)
            .ok_or_else(|| SchemaError("schema without tables".into()))?;
        let mut tables = BTreeMap::new();
        for (tname, t) in tables_json {
            let cols = t
                .get("columns")
                .and_then(Value::as_object)
                .ok_or_else(|| SchemaError(format!("table {tname} without columns")))?;
            let mut columns = BTreeMap::new();
            for (cname, c) in cols {
                let ty = c
                    .get("type")
                    .ok_or_else(|| SchemaError(format!("{tname}.{cname} without type")))?;
                let ty = ColumnType::parse(ty)
                    .map_err(|e| SchemaError(format!("{tname}.{cname}: {}", e.0)))?;
                columns.insert(cname.clone(), ty);
            }
            let indexes = t
                .get("indexes")
                .and_then(Value::as_array)
                .map(|ix| {
                    ix.iter()
                        .filter_map(Value::as_array)
                        .map(|cols| {
                            cols.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_owned)
                                .collect()
                        })
                        .collect()
                })
                .unwrap_or_default();
            tables.insert(
                tname.clone(),
                TableSchema {
                    name: tname.clone(),
                    columns,
                    is_root: t.get("isRoot").and_then(Value::as_bool).unwrap_or(false),
                    indexes,
                },
            );
        }
        Ok(DbSchema {
            name: name.to_owned(),
            version,
            tables,
        })
    }

    pub fn table(&self, name: &str) -> Option<&TableSchema> {
        self.tables.get(name)
    }

    /// Checks that every `(table, column, type)` the caller needs exists with a compatible type.
    /// Extra tables and columns on the server are fine.
    pub fn check(&self, needs: &[TableNeeds]) -> Result<(), SchemaError> {
        let mut problems = Vec::new();
        for t in needs {
            let Some(ts) = self.tables.get(t.table) else {
                problems.push(format!("table {} is missing", t.table));
                continue;
            };
            for (col, want) in t.columns {
                match ts.columns.get(*col) {
                    None => problems.push(format!("column {}.{} is missing", t.table, col)),
                    Some(have) if !compatible(have, want) => problems.push(format!(
                        "column {}.{} has type {} but ovnk needs {}",
                        t.table,
                        col,
                        describe(have),
                        want
                    )),
                    Some(_) => {}
                }
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(SchemaError(format!(
                "database {} (schema version {}) does not fit: {}",
                self.name,
                self.version,
                problems.join("; ")
            )))
        }
    }
}

/// What a typed model needs of one table.
#[derive(Clone, Copy, Debug)]
pub struct TableNeeds {
    pub table: &'static str,
    pub columns: &'static [(&'static str, ColumnShape)],
}

/// The shape a typed field expects of its column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColumnShape {
    Scalar(AtomicType),
    Optional(AtomicType),
    Set(AtomicType),
    Map(AtomicType, AtomicType),
}

fn compatible(have: &ColumnType, want: &ColumnShape) -> bool {
    match *want {
        ColumnShape::Scalar(a) => {
            have.value.is_none() && have.key.atomic == a && have.min == 1 && have.max == 1
        }
        ColumnShape::Optional(a) => have.value.is_none() && have.key.atomic == a && have.max == 1,
        ColumnShape::Set(a) => have.value.is_none() && have.key.atomic == a,
        ColumnShape::Map(k, v) => {
            have.key.atomic == k && have.value.as_ref().map(|b| b.atomic) == Some(v)
        }
    }
}

fn describe(t: &ColumnType) -> String {
    match &t.value {
        Some(v) => format!("map<{},{}>", t.key.atomic, v.atomic),
        None if t.min == 1 && t.max == 1 => t.key.atomic.to_string(),
        None if t.max == 1 => format!("optional<{}>", t.key.atomic),
        None => format!("set<{}>", t.key.atomic),
    }
}

fn describe_shape(s: &ColumnShape) -> String {
    match s {
        ColumnShape::Scalar(a) => a.to_string(),
        ColumnShape::Optional(a) => format!("optional<{a}>"),
        ColumnShape::Set(a) => format!("set<{a}>"),
        ColumnShape::Map(k, v) => format!("map<{k},{v}>"),
    }
}

impl fmt::Display for ColumnShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe_shape(self))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schema: {0}")]
pub struct SchemaError(pub String);
