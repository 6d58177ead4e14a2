//! Conversions between Rust field types and OVSDB datums.

use std::collections::{BTreeMap, BTreeSet};

use ovsdb::{Atom, AtomicType, ColumnShape, Datum, Uuid};
use serde::ser::{SerializeTuple, Serializer};

/// A Rust type that can hold one column.
pub trait ColumnValue: Sized {
    const SHAPE: ColumnShape;
    fn from_datum(d: &Datum) -> Result<Self, String>;
    fn to_datum(&self) -> Datum;
    /// An empty set or map (an insert leaves such a column to its default).
    fn is_empty_value(&self) -> bool {
        false
    }
    /// Writes the value in RFC 7047 notation, as [`to_datum`](Self::to_datum)'s datum would
    /// serialize, without building the datum.
    fn serialize_value<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
}

/// An atom type usable as a scalar, an optional, a set element or a map key/value.
pub trait AtomValue: Sized + Ord + Clone {
    const ATOMIC: AtomicType;
    fn from_atom(a: &Atom) -> Option<Self>;
    fn to_atom(&self) -> Atom;
    /// Writes the atom in RFC 7047 notation.
    fn serialize_atom<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error>;
}

/// A column value as RFC 7047 JSON (see [`ColumnValue::serialize_value`]).
pub struct AsOvsdb<'a, T>(pub &'a T);

impl<T: ColumnValue> serde::Serialize for AsOvsdb<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_value(s)
    }
}

struct AtomOf<'a, T>(&'a T);

impl<T: AtomValue> serde::Serialize for AtomOf<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize_atom(s)
    }
}

/// `["set", [atoms…]]`.
fn serialize_set<'a, S: Serializer, T: AtomValue + 'a>(
    s: S,
    atoms: impl Iterator<Item = &'a T> + Clone,
) -> Result<S::Ok, S::Error> {
    struct Seq<I>(I);
    impl<'a, T: AtomValue + 'a, I: Iterator<Item = &'a T> + Clone> serde::Serialize for Seq<I> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.clone().map(AtomOf))
        }
    }
    let mut t = s.serialize_tuple(2)?;
    t.serialize_element("set")?;
    t.serialize_element(&Seq(atoms))?;
    t.end()
}

impl AtomValue for String {
    const ATOMIC: AtomicType = AtomicType::String;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_str().map(str::to_owned)
    }
    fn to_atom(&self) -> Atom {
        Atom::String(self.clone())
    }
    fn serialize_atom<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self)
    }
}
impl AtomValue for i64 {
    const ATOMIC: AtomicType = AtomicType::Integer;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_integer()
    }
    fn to_atom(&self) -> Atom {
        Atom::Integer(*self)
    }
    fn serialize_atom<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_i64(*self)
    }
}
impl AtomValue for bool {
    const ATOMIC: AtomicType = AtomicType::Boolean;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_bool()
    }
    fn to_atom(&self) -> Atom {
        Atom::Boolean(*self)
    }
    fn serialize_atom<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(*self)
    }
}
impl AtomValue for Uuid {
    const ATOMIC: AtomicType = AtomicType::Uuid;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_uuid()
    }
    fn to_atom(&self) -> Atom {
        Atom::Uuid(*self)
    }
    fn serialize_atom<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element("uuid")?;
        t.serialize_element(&self.hyphenated())?;
        t.end()
    }
}

fn wrong<T>(d: &Datum, shape: ColumnShape) -> Result<T, String> {
    Err(format!("expected {shape}, got {}", d.to_json()))
}

macro_rules! scalar {
    ($t:ty) => {
        impl ColumnValue for $t {
            const SHAPE: ColumnShape = ColumnShape::Scalar(<$t as AtomValue>::ATOMIC);
            fn from_datum(d: &Datum) -> Result<Self, String> {
                match d.as_scalar().and_then(<$t>::from_atom) {
                    Some(v) => Ok(v),
                    None => wrong(d, Self::SHAPE),
                }
            }
            fn to_datum(&self) -> Datum {
                Datum::scalar(self.to_atom())
            }
            fn serialize_value<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                self.serialize_atom(s)
            }
        }
    };
}
scalar!(String);
scalar!(i64);
scalar!(bool);
scalar!(Uuid);

impl<T: AtomValue> ColumnValue for Option<T> {
    const SHAPE: ColumnShape = ColumnShape::Optional(T::ATOMIC);
    fn from_datum(d: &Datum) -> Result<Self, String> {
        match d.as_set() {
            Some(s) if s.is_empty() => Ok(None),
            Some(s) if s.len() == 1 => match s.iter().next().and_then(T::from_atom) {
                Some(v) => Ok(Some(v)),
                None => wrong(d, Self::SHAPE),
            },
            _ => wrong(d, Self::SHAPE),
        }
    }
    fn to_datum(&self) -> Datum {
        match self {
            Some(v) => Datum::scalar(v.to_atom()),
            None => Datum::empty_set(),
        }
    }
    fn is_empty_value(&self) -> bool {
        self.is_none()
    }
    fn serialize_value<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Some(v) => v.serialize_atom(s),
            None => serialize_set(s, std::iter::empty::<&T>()),
        }
    }
}

impl<T: AtomValue> ColumnValue for BTreeSet<T> {
    const SHAPE: ColumnShape = ColumnShape::Set(T::ATOMIC);
    fn from_datum(d: &Datum) -> Result<Self, String> {
        let Some(s) = d.as_set() else {
            return wrong(d, Self::SHAPE);
        };
        s.iter()
            .map(|a| T::from_atom(a).ok_or(()))
            .collect::<Result<_, _>>()
            .or_else(|_| wrong(d, Self::SHAPE))
    }
    fn to_datum(&self) -> Datum {
        Datum::Set(self.iter().map(AtomValue::to_atom).collect())
    }
    fn is_empty_value(&self) -> bool {
        self.is_empty()
    }
    fn serialize_value<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.first() {
            Some(only) if self.len() == 1 => only.serialize_atom(s),
            _ => serialize_set(s, self.iter()),
        }
    }
}

impl<K: AtomValue, V: AtomValue> ColumnValue for BTreeMap<K, V> {
    const SHAPE: ColumnShape = ColumnShape::Map(K::ATOMIC, V::ATOMIC);
    fn from_datum(d: &Datum) -> Result<Self, String> {
        let Some(m) = d.as_map() else {
            return wrong(d, Self::SHAPE);
        };
        m.iter()
            .map(|(k, v)| Ok((K::from_atom(k).ok_or(())?, V::from_atom(v).ok_or(())?)))
            .collect::<Result<_, ()>>()
            .or_else(|_| wrong(d, Self::SHAPE))
    }
    fn to_datum(&self) -> Datum {
        Datum::Map(
            self.iter()
                .map(|(k, v)| (k.to_atom(), v.to_atom()))
                .collect(),
        )
    }
    fn is_empty_value(&self) -> bool {
        self.is_empty()
    }
    fn serialize_value<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Pairs<'a, K, V>(&'a BTreeMap<K, V>);
        impl<K: AtomValue, V: AtomValue> serde::Serialize for Pairs<'_, K, V> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.0.iter().map(|(k, v)| (AtomOf(k), AtomOf(v))))
            }
        }
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element("map")?;
        t.serialize_element(&Pairs(self))?;
        t.end()
    }
}
