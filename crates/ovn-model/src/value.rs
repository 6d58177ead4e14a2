//! Conversions between Rust field types and OVSDB datums.

use std::collections::{BTreeMap, BTreeSet};

use ovsdb::{Atom, AtomicType, ColumnShape, Datum, Uuid};

/// A Rust type that can hold one column.
pub trait ColumnValue: Sized {
    const SHAPE: ColumnShape;
    fn from_datum(d: &Datum) -> Result<Self, String>;
    fn to_datum(&self) -> Datum;
}

/// An atom type usable as a scalar, an optional, a set element or a map key/value.
pub trait AtomValue: Sized + Ord + Clone {
    const ATOMIC: AtomicType;
    fn from_atom(a: &Atom) -> Option<Self>;
    fn to_atom(&self) -> Atom;
}

impl AtomValue for String {
    const ATOMIC: AtomicType = AtomicType::String;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_str().map(str::to_owned)
    }
    fn to_atom(&self) -> Atom {
        Atom::String(self.clone())
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
}
impl AtomValue for bool {
    const ATOMIC: AtomicType = AtomicType::Boolean;
    fn from_atom(a: &Atom) -> Option<Self> {
        a.as_bool()
    }
    fn to_atom(&self) -> Atom {
        Atom::Boolean(*self)
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
}
