//! OVSDB atoms and datums (RFC 7047 §5.1) and the update2 "modify" diff of ovsdb-server(7).
//!
//! Every column value is held as a set or a map, as OVSDB itself models it: a scalar column is a
//! set with exactly one element, an optional column a set with zero or one.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use serde_json::{Value, json};
use uuid::Uuid;

use smallvec::SmallVec;

use crate::atomset::{AtomMap, AtomSet};
use crate::schema::{AtomicType, BaseType, ColumnType};

/// A real number with a total order, so atoms can live in ordered sets.
#[derive(Clone, Copy, Debug)]
pub struct Real(pub f64);

impl PartialEq for Real {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0) == Ordering::Equal
    }
}
impl Eq for Real {}
impl PartialOrd for Real {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Real {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}
impl Hash for Real {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.to_bits().hash(state);
    }
}

/// One OVSDB atom.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Atom {
    Integer(i64),
    Real(Real),
    Boolean(bool),
    String(String),
    Uuid(Uuid),
    /// A `named-uuid` reference to a row inserted in the same transaction (requests only).
    NamedUuid(String),
}

impl Atom {
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Atom::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_uuid(&self) -> Option<Uuid> {
        match self {
            Atom::Uuid(u) => Some(*u),
            _ => None,
        }
    }
    pub fn as_integer(&self) -> Option<i64> {
        match self {
            Atom::Integer(i) => Some(*i),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Atom::Boolean(b) => Some(*b),
            _ => None,
        }
    }

    /// The default atom of a type (RFC 7047 §5.1: 0, 0.0, false, "", the all-zero UUID).
    pub fn default_for(ty: AtomicType) -> Atom {
        match ty {
            AtomicType::Integer => Atom::Integer(0),
            AtomicType::Real => Atom::Real(Real(0.0)),
            AtomicType::Boolean => Atom::Boolean(false),
            AtomicType::String => Atom::String(String::new()),
            AtomicType::Uuid => Atom::Uuid(Uuid::nil()),
        }
    }

    /// Parses a wire atom, checking it against `base`.
    pub fn from_json(v: &Value, base: &BaseType) -> Result<Atom, DatumError> {
        let bad = || DatumError::new(format!("expected {} atom, got {}", base.atomic, short(v)));
        let atom = match (base.atomic, v) {
            (AtomicType::Integer, Value::Number(n)) => Atom::Integer(n.as_i64().ok_or_else(bad)?),
            (AtomicType::Real, Value::Number(n)) => Atom::Real(Real(n.as_f64().ok_or_else(bad)?)),
            (AtomicType::Boolean, Value::Bool(b)) => Atom::Boolean(*b),
            (AtomicType::String, Value::String(s)) => Atom::String(s.clone()),
            (AtomicType::Uuid, Value::Array(a)) if a.len() == 2 => match (&a[0], &a[1]) {
                (Value::String(tag), Value::String(u)) if tag == "uuid" => {
                    Atom::Uuid(Uuid::parse_str(u).map_err(|_| bad())?)
                }
                (Value::String(tag), Value::String(n)) if tag == "named-uuid" => {
                    Atom::NamedUuid(n.clone())
                }
                _ => return Err(bad()),
            },
            _ => return Err(bad()),
        };
        Ok(atom)
    }

    pub fn to_json(&self) -> Value {
        match self {
            Atom::Integer(i) => json!(i),
            Atom::Real(r) => json!(r.0),
            Atom::Boolean(b) => json!(b),
            Atom::String(s) => json!(s),
            Atom::Uuid(u) => json!(["uuid", u.to_string()]),
            Atom::NamedUuid(n) => json!(["named-uuid", n]),
        }
    }
}

impl fmt::Display for Atom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Atom::Integer(i) => write!(f, "{i}"),
            Atom::Real(r) => write!(f, "{}", r.0),
            Atom::Boolean(b) => write!(f, "{b}"),
            Atom::String(s) => write!(f, "{s:?}"),
            Atom::Uuid(u) => write!(f, "{u}"),
            Atom::NamedUuid(n) => write!(f, "@{n}"),
        }
    }
}

impl From<&str> for Atom {
    fn from(s: &str) -> Self {
        Atom::String(s.to_owned())
    }
}
impl From<String> for Atom {
    fn from(s: String) -> Self {
        Atom::String(s)
    }
}
impl From<i64> for Atom {
    fn from(i: i64) -> Self {
        Atom::Integer(i)
    }
}
impl From<bool> for Atom {
    fn from(b: bool) -> Self {
        Atom::Boolean(b)
    }
}
impl From<Uuid> for Atom {
    fn from(u: Uuid) -> Self {
        Atom::Uuid(u)
    }
}

/// A column value: a set of atoms or a map between atoms.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Datum {
    Set(AtomSet),
    Map(AtomMap),
}

impl Default for Datum {
    fn default() -> Self {
        Datum::Set(AtomSet::new())
    }
}

impl Datum {
    pub fn empty_set() -> Datum {
        Datum::Set(AtomSet::new())
    }
    pub fn empty_map() -> Datum {
        Datum::Map(AtomMap::new())
    }
    pub fn scalar(a: impl Into<Atom>) -> Datum {
        Datum::Set(AtomSet::single(a.into()))
    }
    pub fn set<A: Into<Atom>>(items: impl IntoIterator<Item = A>) -> Datum {
        Datum::Set(items.into_iter().map(Into::into).collect())
    }
    pub fn map<K: Into<Atom>, V: Into<Atom>>(items: impl IntoIterator<Item = (K, V)>) -> Datum {
        Datum::Map(
            items
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        )
    }
    /// A string-to-string map, the shape of every `external_ids`/`options` column.
    pub fn str_map<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> Datum {
        Datum::map(items)
    }

    /// The default value of a column type: empty when `min == 0`, else the default atom (pair).
    pub fn default_for(ty: &ColumnType) -> Datum {
        if ty.min == 0 {
            return if ty.value.is_some() {
                Datum::empty_map()
            } else {
                Datum::empty_set()
            };
        }
        match &ty.value {
            Some(v) => Datum::Map(AtomMap::from([(
                Atom::default_for(ty.key.atomic),
                Atom::default_for(v.atomic),
            )])),
            None => Datum::Set(AtomSet::single(Atom::default_for(ty.key.atomic))),
        }
    }

    /// Parses a wire datum (a bare atom, `["set",[…]]` or `["map",[[k,v],…]]`) of type `ty`.
    pub fn from_json(v: &Value, ty: &ColumnType) -> Result<Datum, DatumError> {
        match &ty.value {
            Some(vt) => {
                let pairs = tagged(v, "map").ok_or_else(|| {
                    DatumError::new(format!("expected [\"map\",[…]], got {}", short(v)))
                })?;
                let mut m = Vec::with_capacity(pairs.len());
                for p in pairs {
                    let pair = p.as_array().filter(|a| a.len() == 2).ok_or_else(|| {
                        DatumError::new(format!("map entry must be [key, value], got {}", short(p)))
                    })?;
                    m.push((
                        Atom::from_json(&pair[0], &ty.key)?,
                        Atom::from_json(&pair[1], vt)?,
                    ));
                }
                Ok(Datum::Map(AtomMap::from_unsorted(m)))
            }
            None => match tagged(v, "set") {
                Some(items) => {
                    let mut s = SmallVec::with_capacity(items.len());
                    for it in items {
                        s.push(Atom::from_json(it, &ty.key)?);
                    }
                    Ok(Datum::Set(AtomSet::from_unsorted(s)))
                }
                None => Ok(Datum::Set(AtomSet::single(Atom::from_json(v, &ty.key)?))),
            },
        }
    }

    /// Wire form: a one-element set is sent as its bare atom.
    pub fn to_json(&self) -> Value {
        match self {
            Datum::Set(s) if s.len() == 1 => s.first().map(Atom::to_json).unwrap_or(Value::Null),
            Datum::Set(s) => json!(["set", s.iter().map(Atom::to_json).collect::<Vec<_>>()]),
            Datum::Map(m) => json!([
                "map",
                m.iter()
                    .map(|(k, v)| json!([k.to_json(), v.to_json()]))
                    .collect::<Vec<_>>()
            ]),
        }
    }

    /// An empty set or map.
    pub fn is_empty(&self) -> bool {
        match self {
            Datum::Set(s) => s.is_empty(),
            Datum::Map(m) => m.is_empty(),
        }
    }

    pub fn as_set(&self) -> Option<&AtomSet> {
        match self {
            Datum::Set(s) => Some(s),
            Datum::Map(_) => None,
        }
    }
    pub fn as_map(&self) -> Option<&AtomMap> {
        match self {
            Datum::Map(m) => Some(m),
            Datum::Set(_) => None,
        }
    }
    /// The only atom of a one-element set.
    pub fn as_scalar(&self) -> Option<&Atom> {
        match self {
            Datum::Set(s) if s.len() == 1 => s.first(),
            _ => None,
        }
    }
    /// Looks up a string key in a map datum.
    pub fn map_get(&self, key: &str) -> Option<&Atom> {
        match self {
            // Probed with the &str itself: no key atom is allocated (this runs per row per
            // index on every update).
            Datum::Map(m) => m.get_str(key),
            Datum::Set(_) => None,
        }
    }

    /// Applies an update2 "modify" diff of a column of type `ty` (ovsdb-server(7) §4.1.14):
    /// columns holding at most one value are replaced; sets take the symmetric difference;
    /// maps delete keys given with their current value, replace keys given with another value
    /// and insert new keys.
    pub fn apply_diff(&mut self, diff: Datum, ty: &ColumnType) -> Result<(), DatumError> {
        if ty.max <= 1 {
            *self = diff;
            return Ok(());
        }
        match (self, diff) {
            (Datum::Set(old), Datum::Set(d)) => {
                old.toggle_all(d);
                Ok(())
            }
            (Datum::Map(old), Datum::Map(d)) => {
                old.apply_diff(d);
                Ok(())
            }
            _ => Err(DatumError::new(
                "diff kind (set/map) does not match the column".into(),
            )),
        }
    }
}

fn tagged<'a>(v: &'a Value, tag: &str) -> Option<&'a Vec<Value>> {
    match v.as_array()?.as_slice() {
        [Value::String(t), Value::Array(items)] if t == tag => Some(items),
        _ => None,
    }
}

/// A short rendering of untrusted JSON for error messages.
pub(crate) fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 {
        let cut = (0..=80).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
        format!("{}…", &s[..cut])
    } else {
        s
    }
}

/// A datum that does not fit its column type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DatumError(pub String);

impl DatumError {
    pub fn new(msg: String) -> Self {
        DatumError(msg)
    }
}

// ---------------------------------------------------------------------------------------------
// Direct (de)serialization: ops are written and updates read without a `serde_json::Value` tree.

impl serde::Serialize for Atom {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        match self {
            Atom::Integer(i) => s.serialize_i64(*i),
            Atom::Real(r) => s.serialize_f64(r.0),
            Atom::Boolean(b) => s.serialize_bool(*b),
            Atom::String(x) => s.serialize_str(x),
            Atom::Uuid(u) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("uuid")?;
                t.serialize_element(&u.hyphenated())?;
                t.end()
            }
            Atom::NamedUuid(n) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("named-uuid")?;
                t.serialize_element(n)?;
                t.end()
            }
        }
    }
}

struct Pairs<'a>(&'a AtomMap);

impl serde::Serialize for Pairs<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter())
    }
}

impl serde::Serialize for Datum {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        match self {
            Datum::Set(set) if set.len() == 1 => match set.first() {
                Some(a) => a.serialize(s),
                None => s.serialize_unit(),
            },
            Datum::Set(set) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("set")?;
                t.serialize_element(set)?;
                t.end()
            }
            Datum::Map(m) => {
                let mut t = s.serialize_tuple(2)?;
                t.serialize_element("map")?;
                t.serialize_element(&Pairs(m))?;
                t.end()
            }
        }
    }
}

/// Reads one wire atom of a known base type.
pub(crate) struct AtomSeed<'t>(pub &'t BaseType);

impl<'de> serde::de::DeserializeSeed<'de> for AtomSeed<'_> {
    type Value = Atom;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Atom, D::Error> {
        d.deserialize_any(AtomVisitor(self.0))
    }
}

struct AtomVisitor<'t>(&'t BaseType);

fn type_err<E: serde::de::Error>(want: AtomicType, got: &str) -> E {
    E::custom(format!("expected {want} atom, got {got}"))
}

impl<'de> serde::de::Visitor<'de> for AtomVisitor<'_> {
    type Value = Atom;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "an OVSDB {} atom", self.0.atomic)
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Atom, E> {
        match self.0.atomic {
            AtomicType::Integer => Ok(Atom::Integer(v)),
            AtomicType::Real => Ok(Atom::Real(Real(v as f64))),
            t => Err(type_err(t, &v.to_string())),
        }
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Atom, E> {
        match (self.0.atomic, i64::try_from(v)) {
            (AtomicType::Integer, Ok(i)) => Ok(Atom::Integer(i)),
            (AtomicType::Real, _) => Ok(Atom::Real(Real(v as f64))),
            (t, _) => Err(type_err(t, &v.to_string())),
        }
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Atom, E> {
        match self.0.atomic {
            AtomicType::Real => Ok(Atom::Real(Real(v))),
            t => Err(type_err(t, &v.to_string())),
        }
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Atom, E> {
        match self.0.atomic {
            AtomicType::Boolean => Ok(Atom::Boolean(v)),
            t => Err(type_err(t, &v.to_string())),
        }
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Atom, E> {
        match self.0.atomic {
            AtomicType::String => Ok(Atom::String(v.to_owned())),
            t => Err(type_err(t, &format!("{v:?}"))),
        }
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Atom, E> {
        match self.0.atomic {
            AtomicType::String => Ok(Atom::String(v)),
            t => Err(type_err(t, &format!("{v:?}"))),
        }
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Atom, A::Error> {
        use serde::de::Error;
        if self.0.atomic != AtomicType::Uuid {
            return Err(type_err(self.0.atomic, "an array"));
        }
        let tag: std::borrow::Cow<'de, str> = seq
            .next_element()?
            .ok_or_else(|| A::Error::custom("empty uuid array"))?;
        let val: std::borrow::Cow<'de, str> = seq
            .next_element()?
            .ok_or_else(|| A::Error::custom("uuid array without value"))?;
        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(A::Error::custom("uuid array with more than 2 elements"));
        }
        match &*tag {
            "uuid" => Uuid::parse_str(&val)
                .map(Atom::Uuid)
                .map_err(|_| A::Error::custom(format!("bad uuid {val:?}"))),
            "named-uuid" => Ok(Atom::NamedUuid(val.into_owned())),
            other => Err(A::Error::custom(format!(
                "expected uuid atom, got [{other:?}, …]"
            ))),
        }
    }
}

/// Reads a wire datum of a known column type.
pub(crate) struct DatumSeed<'t>(pub &'t ColumnType);

impl<'de> serde::de::DeserializeSeed<'de> for DatumSeed<'_> {
    type Value = Datum;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Datum, D::Error> {
        d.deserialize_any(DatumVisitor(self.0))
    }
}

struct DatumVisitor<'t>(&'t ColumnType);

impl DatumVisitor<'_> {
    fn bare<E: serde::de::Error>(self, a: Result<Atom, E>) -> Result<Datum, E> {
        if self.0.value.is_some() {
            return Err(E::custom("expected [\"map\",[…]], got a bare atom"));
        }
        a.map(|a| Datum::Set(AtomSet::single(a)))
    }
}

impl<'de> serde::de::Visitor<'de> for DatumVisitor<'_> {
    type Value = Datum;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an OVSDB datum")
    }
    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Datum, E> {
        let a = AtomVisitor(&self.0.key).visit_i64(v);
        self.bare(a)
    }
    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Datum, E> {
        let a = AtomVisitor(&self.0.key).visit_u64(v);
        self.bare(a)
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Datum, E> {
        let a = AtomVisitor(&self.0.key).visit_f64(v);
        self.bare(a)
    }
    fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Datum, E> {
        let a = AtomVisitor(&self.0.key).visit_bool(v);
        self.bare(a)
    }
    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Datum, E> {
        let a = AtomVisitor(&self.0.key).visit_str(v);
        self.bare(a)
    }
    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Datum, E> {
        let a = AtomVisitor(&self.0.key).visit_string(v);
        self.bare(a)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Datum, A::Error> {
        use serde::de::Error;
        let tag: std::borrow::Cow<'de, str> = seq
            .next_element()?
            .ok_or_else(|| A::Error::custom("empty array datum"))?;
        let d = match (&*tag, &self.0.value) {
            ("set", None) => Datum::Set(
                seq.next_element_seed(SetSeed(&self.0.key))?
                    .ok_or_else(|| A::Error::custom("[\"set\"] without elements"))?,
            ),
            ("map", Some(v)) => Datum::Map(
                seq.next_element_seed(PairsSeed(&self.0.key, v))?
                    .ok_or_else(|| A::Error::custom("[\"map\"] without pairs"))?,
            ),
            ("uuid" | "named-uuid", None) if self.0.key.atomic == AtomicType::Uuid => {
                let val: std::borrow::Cow<'de, str> = seq
                    .next_element()?
                    .ok_or_else(|| A::Error::custom("uuid array without value"))?;
                let a = if &*tag == "uuid" {
                    Atom::Uuid(
                        Uuid::parse_str(&val)
                            .map_err(|_| A::Error::custom(format!("bad uuid {val:?}")))?,
                    )
                } else {
                    Atom::NamedUuid(val.into_owned())
                };
                Datum::Set(AtomSet::single(a))
            }
            (t, Some(_)) => {
                return Err(A::Error::custom(format!(
                    "expected [\"map\",[…]], got [{t:?}, …]"
                )));
            }
            (t, None) => {
                return Err(A::Error::custom(format!(
                    "expected a {} set or atom, got [{t:?}, …]",
                    self.0.key.atomic
                )));
            }
        };
        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(A::Error::custom("datum array with more than 2 elements"));
        }
        Ok(d)
    }
}

struct SetSeed<'t>(&'t BaseType);

impl<'de> serde::de::DeserializeSeed<'de> for SetSeed<'_> {
    type Value = AtomSet;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for SetSeed<'_> {
    type Value = AtomSet;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of atoms")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = SmallVec::new();
        while let Some(a) = seq.next_element_seed(AtomSeed(self.0))? {
            out.push(a);
        }
        Ok(AtomSet::from_unsorted(out))
    }
}

struct PairsSeed<'t>(&'t BaseType, &'t BaseType);

impl<'de> serde::de::DeserializeSeed<'de> for PairsSeed<'_> {
    type Value = AtomMap;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for PairsSeed<'_> {
    type Value = AtomMap;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an array of [key, value] pairs")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(kv) = seq.next_element_seed(PairSeed(self.0, self.1))? {
            out.push(kv);
        }
        Ok(AtomMap::from_unsorted(out))
    }
}

struct PairSeed<'t>(&'t BaseType, &'t BaseType);

impl<'de> serde::de::DeserializeSeed<'de> for PairSeed<'_> {
    type Value = (Atom, Atom);
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for PairSeed<'_> {
    type Value = (Atom, Atom);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a [key, value] pair")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        let k = seq
            .next_element_seed(AtomSeed(self.0))?
            .ok_or_else(|| A::Error::custom("map entry must be [key, value]"))?;
        let v = seq
            .next_element_seed(AtomSeed(self.1))?
            .ok_or_else(|| A::Error::custom("map entry must be [key, value]"))?;
        if seq.next_element::<serde::de::IgnoredAny>()?.is_some() {
            return Err(A::Error::custom("map entry must be [key, value]"));
        }
        Ok((k, v))
    }
}

impl Datum {
    /// Parses a wire datum of type `ty` straight from its JSON text.
    pub fn from_json_str(text: &str, ty: &ColumnType) -> Result<Datum, DatumError> {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_str(text);
        let d = DatumSeed(ty)
            .deserialize(&mut de)
            .map_err(|e| DatumError::new(e.to_string()))?;
        de.end().map_err(|e| DatumError::new(e.to_string()))?;
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{AtomicType, ColumnType};
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn arb_atom(t: AtomicType) -> BoxedStrategy<Atom> {
        match t {
            AtomicType::Integer => any::<i64>().prop_map(Atom::Integer).boxed(),
            AtomicType::Real => (-1e9f64..1e9).prop_map(|f| Atom::Real(Real(f))).boxed(),
            AtomicType::Boolean => any::<bool>().prop_map(Atom::Boolean).boxed(),
            AtomicType::String => "[a-c\"\\\\{}\\[\\] ]{0,4}".prop_map(Atom::String).boxed(),
            AtomicType::Uuid => prop_oneof![Just(0u128), Just(1u128), any::<u128>()]
                .prop_map(|u| Atom::Uuid(Uuid::from_u128(u)))
                .boxed(),
        }
    }

    fn arb_type() -> impl Strategy<Value = ColumnType> {
        let atomic = prop_oneof![
            Just(AtomicType::Integer),
            Just(AtomicType::Real),
            Just(AtomicType::Boolean),
            Just(AtomicType::String),
            Just(AtomicType::Uuid),
        ];
        (atomic.clone(), atomic, 0..4u8).prop_map(|(k, v, kind)| match kind {
            0 => ColumnType::scalar(k),
            1 => ColumnType::optional(k),
            2 => ColumnType::set(k),
            _ => ColumnType::map(k, v),
        })
    }

    /// A datum that satisfies the column type's min/max.
    fn arb_datum(ty: &ColumnType) -> BoxedStrategy<Datum> {
        let (min, max) = (ty.min as usize, ty.max.min(6) as usize);
        match &ty.value {
            Some(v) => proptest::collection::btree_map(
                arb_atom(ty.key.atomic),
                arb_atom(v.atomic),
                min..=max,
            )
            .prop_map(|m| Datum::Map(m.into()))
            .boxed(),
            None => proptest::collection::btree_set(arb_atom(ty.key.atomic), min..=max)
                .prop_map(|s| Datum::Set(s.into()))
                .boxed(),
        }
    }

    fn type_and_two() -> impl Strategy<Value = (ColumnType, Datum, Datum)> {
        arb_type().prop_flat_map(|ty| {
            let a = arb_datum(&ty);
            let b = arb_datum(&ty);
            (Just(ty), a, b)
        })
    }

    /// The server's diff, written from the definition in ovsdb-server(7) §4.1.14.
    fn model_diff(old: &Datum, new: &Datum, ty: &ColumnType) -> Datum {
        if ty.max <= 1 {
            return new.clone();
        }
        match (old, new) {
            (Datum::Set(o), Datum::Set(n)) => {
                let o: BTreeSet<&Atom> = o.iter().collect();
                let n: BTreeSet<&Atom> = n.iter().collect();
                Datum::set(o.symmetric_difference(&n).map(|a| (*a).clone()))
            }
            (Datum::Map(o), Datum::Map(n)) => {
                let o: BTreeMap<&Atom, &Atom> = o.iter().collect();
                let n: BTreeMap<&Atom, &Atom> = n.iter().collect();
                let mut d: BTreeMap<Atom, Atom> = BTreeMap::new();
                for (&k, &v) in &o {
                    match n.get(k) {
                        None => {
                            d.insert(k.clone(), v.clone());
                        }
                        Some(&nv) if nv != v => {
                            d.insert(k.clone(), nv.clone());
                        }
                        Some(_) => {}
                    }
                }
                for (&k, &v) in &n {
                    if !o.contains_key(k) {
                        d.insert(k.clone(), v.clone());
                    }
                }
                Datum::Map(d.into())
            }
            _ => unreachable!("generated datums match their type"),
        }
    }

    proptest! {
        #[test]
        fn wire_encoding_round_trips((ty, d, _) in type_and_two()) {
            let json = d.to_json();
            // What the server sends is text: go through it.
            let text = serde_json::to_string(&json).expect("ser");
            let back: Value = serde_json::from_str(&text).expect("de");
            prop_assert_eq!(Datum::from_json(&back, &ty).expect("parse"), d.clone());
            // The direct paths agree with the Value paths.
            let direct = serde_json::to_string(&d).expect("serialize");
            prop_assert_eq!(&direct, &text);
            prop_assert_eq!(Datum::from_json_str(&direct, &ty).expect("seed parse"), d);
        }

        #[test]
        fn applying_the_server_diff_yields_the_new_value((ty, old, new) in type_and_two()) {
            let diff = model_diff(&old, &new, &ty);
            // The diff travels on the wire too.
            let diff = Datum::from_json(&diff.to_json(), &ty).expect("parse diff");
            let mut got = old.clone();
            got.apply_diff(diff, &ty).expect("apply");
            prop_assert_eq!(got, new);
        }
    }

    #[test]
    fn optional_column_diff_replaces_even_when_emptied() {
        let ty = ColumnType::optional(AtomicType::String);
        let mut d = Datum::scalar("a");
        d.apply_diff(Datum::empty_set(), &ty).expect("apply");
        assert_eq!(d, Datum::empty_set());
        d.apply_diff(Datum::scalar("b"), &ty).expect("apply");
        assert_eq!(d, Datum::scalar("b"));
    }

    #[test]
    fn map_diff_deletes_replaces_and_inserts() {
        let ty = ColumnType::map(AtomicType::String, AtomicType::String);
        let mut d = Datum::str_map([("a", "1"), ("b", "2"), ("c", "3")]);
        d.apply_diff(Datum::str_map([("a", "1"), ("b", "9"), ("z", "0")]), &ty)
            .expect("apply");
        assert_eq!(d, Datum::str_map([("b", "9"), ("c", "3"), ("z", "0")]));
    }

    #[test]
    fn type_mismatches_are_errors_not_panics() {
        let ty = ColumnType::scalar(AtomicType::Integer);
        assert!(Datum::from_json(&serde_json::json!("x"), &ty).is_err());
        assert!(
            Datum::from_json(
                &serde_json::json!(["uuid", "not-a-uuid"]),
                &ColumnType::scalar(AtomicType::Uuid)
            )
            .is_err()
        );
        let m = ColumnType::map(AtomicType::String, AtomicType::String);
        assert!(Datum::from_json(&serde_json::json!(["map", [["a"]]]), &m).is_err());
        assert!(Datum::from_json(&serde_json::json!(["set", ["a"]]), &m).is_err());
        assert!(Datum::from_json(&serde_json::json!(1.5), &ty).is_err());
        for bad in [
            r#""x""#,
            r#"["uuid"]"#,
            r#"["set",[1],2]"#,
            r#"["map",[[1,2]]]"#,
            r#"{"a":1}"#,
            "null",
        ] {
            assert!(Datum::from_json_str(bad, &ty).is_err(), "{bad}");
        }
        assert!(Datum::from_json_str(r#"["map",[["a"]]]"#, &m).is_err());
        assert!(Datum::from_json_str(r#"["map",[["a","b","c"]]]"#, &m).is_err());
        assert!(
            Datum::from_json_str(r#"["uuid","zz"]"#, &ColumnType::scalar(AtomicType::Uuid))
                .is_err()
        );
    }
}
