//! The `Model` trait and the macro that declares typed tables.

use ovsdb::cache::Columns;
use ovsdb::{Datum, NamedRow, RowData, RowRef, TableNeeds, Txn, Uuid};

/// A typed row of one table.
pub trait Model: Sized + Clone + PartialEq + std::fmt::Debug + Send {
    const TABLE: &'static str;
    /// The columns this model reads, with the shape it expects (checked against the server).
    const NEEDS: TableNeeds;
    fn uuid(&self) -> Uuid;
    /// Builds the typed row from a cached row.
    fn from_row(r: RowRef<'_>) -> Result<Self, ModelError> {
        let idx = Self::column_positions(r.columns);
        Self::from_values(r.uuid, r.row.values(), &idx)
    }
    /// Where each of [`NEEDS`](Self::NEEDS)' columns sits in a table's monitored columns:
    /// resolve once per table, then convert many rows with [`from_values`](Self::from_values).
    fn column_positions(columns: &Columns) -> Vec<Option<usize>> {
        Self::NEEDS
            .columns
            .iter()
            .map(|(c, _)| columns.index_of(c))
            .collect()
    }
    /// Builds the typed row from a row's values, given [`column_positions`](Self::column_positions).
    fn from_values(
        uuid: Uuid,
        values: &[Datum],
        positions: &[Option<usize>],
    ) -> Result<Self, ModelError>;
    /// The columns ovnk writes (read-only columns, owned by other daemons, left out).
    fn to_row(&self) -> RowData;
    /// The writable columns whose value in `self` differs from `current`: the smallest
    /// `update` that turns `current` into `self`.
    fn diff(&self, current: &Self) -> RowData;
    /// Writes the writable columns that are not empty sets or maps, and not named in `skip`,
    /// as entries of `map` in RFC 7047 notation: the row of an `insert`, serialized straight
    /// from the fields (no [`RowData`] is built).
    fn serialize_columns<M: serde::ser::SerializeMap>(
        &self,
        map: &mut M,
        skip: &[&str],
    ) -> Result<(), M::Error>;
}

/// The row of an insert of `model`, plus `extra` columns that replace the model's own (e.g. a
/// reference to a row inserted earlier in the same transaction).
pub struct InsertRow<'a, T> {
    pub model: &'a T,
    pub extra: &'a [(&'a str, Datum)],
}

impl<T: Model> serde::Serialize for InsertRow<'_, T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(None)?;
        let skip: Vec<&str> = self.extra.iter().map(|(c, _)| *c).collect();
        self.model.serialize_columns(&mut map, &skip)?;
        for (column, value) in self.extra {
            if !value.is_empty() {
                map.serialize_entry(column, value)?;
            }
        }
        map.end()
    }
}

/// Typed inserts on a [`Txn`].
pub trait TxnExt {
    /// Inserts `model` (its writable, non-empty columns) with `extra` columns replacing the
    /// model's own, serializing the fields straight into the transaction.
    fn insert_model<M: Model>(&mut self, model: &M, extra: &[(&str, Datum)]) -> NamedRow;
}

impl TxnExt for Txn {
    fn insert_model<M: Model>(&mut self, model: &M, extra: &[(&str, Datum)]) -> NamedRow {
        self.insert_serialized(M::TABLE, &InsertRow { model, extra })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{table} row {uuid}: column {column}: {message}")]
pub struct ModelError {
    pub table: &'static str,
    pub uuid: Uuid,
    pub column: &'static str,
    pub message: String,
}

/// Declares a typed table. Columns marked `ro` are read but never written by ovnk.
#[macro_export]
macro_rules! model {
    (
        $(#[$meta:meta])*
        $table:literal => pub struct $name:ident {
            $( $(#[$fmeta:meta])* $field:ident : $ty:ty = $col:literal $([$ro:ident])? ),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq)]
        pub struct $name {
            /// The row's `_uuid` (nil for a row not yet inserted).
            pub uuid: ::ovsdb::Uuid,
            $( $(#[$fmeta])* pub $field: $ty, )*
        }

        impl $crate::Model for $name {
            const TABLE: &'static str = $table;
            const NEEDS: ::ovsdb::TableNeeds = ::ovsdb::TableNeeds {
                table: $table,
                columns: &[ $( ($col, <$ty as $crate::value::ColumnValue>::SHAPE) ),* ],
            };
            fn uuid(&self) -> ::ovsdb::Uuid {
                self.uuid
            }
            fn from_values(
                uuid: ::ovsdb::Uuid,
                values: &[::ovsdb::Datum],
                positions: &[Option<usize>],
            ) -> Result<Self, $crate::ModelError> {
                // Fields are listed in NEEDS order, and struct fields evaluate in order.
                let mut pos = positions.iter();
                Ok($name {
                    uuid,
                    $( $field: match pos.next().copied().flatten().and_then(|i| values.get(i)) {
                        Some(d) => <$ty as $crate::value::ColumnValue>::from_datum(d).map_err(|message| $crate::ModelError {
                            table: $table, uuid, column: $col, message,
                        })?,
                        None => return Err($crate::ModelError {
                            table: $table, uuid, column: $col, message: "column is not monitored".into(),
                        }),
                    }, )*
                })
            }
            fn to_row(&self) -> ::ovsdb::RowData {
                let mut row = ::ovsdb::RowData::new();
                $( if !$crate::model!(@ro $($ro)?) {
                    row.insert($col.to_owned(), <$ty as $crate::value::ColumnValue>::to_datum(&self.$field));
                } )*
                row
            }
            fn serialize_columns<SM: $crate::serde::ser::SerializeMap>(
                &self,
                map: &mut SM,
                skip: &[&str],
            ) -> Result<(), SM::Error> {
                $( if !$crate::model!(@ro $($ro)?)
                    && !<$ty as $crate::value::ColumnValue>::is_empty_value(&self.$field)
                    && !skip.contains(&$col)
                {
                    map.serialize_entry($col, &$crate::value::AsOvsdb(&self.$field))?;
                } )*
                Ok(())
            }
            fn diff(&self, current: &Self) -> ::ovsdb::RowData {
                let mut row = ::ovsdb::RowData::new();
                $( if !$crate::model!(@ro $($ro)?) && self.$field != current.$field {
                    row.insert($col.to_owned(), <$ty as $crate::value::ColumnValue>::to_datum(&self.$field));
                } )*
                row
            }
        }
    };
    (@ro ro) => { true };
    (@ro) => { false };
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use ovsdb::{Datum, Txn, Uuid};
    use proptest::prelude::*;

    use super::{Model, TxnExt};
    use crate::{Acl, Chassis, ChassisPrivate, LogicalSwitchPort};

    /// The typed insert must send exactly what the `RowData` insert sends.
    fn same_insert<M: Model>(m: &M, extra: &[(&str, Datum)]) -> Result<(), TestCaseError> {
        let mut a = Txn::new("db");
        a.insert_model(m, extra);
        let mut b = Txn::new("db");
        let mut row = m.to_row();
        for (c, d) in extra {
            row.insert((*c).to_owned(), d.clone());
        }
        b.insert(M::TABLE, row);
        prop_assert_eq!(a.params(), b.params());
        Ok(())
    }

    fn text() -> impl Strategy<Value = String> {
        // quotes, backslashes, control and non-ASCII characters included
        proptest::string::string_regex("[a-z\"\\\\\n\u{1}é ]{0,6}").expect("regex")
    }
    fn map() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(text(), text(), 0..3)
    }
    fn strings() -> impl Strategy<Value = BTreeSet<String>> {
        proptest::collection::btree_set(text(), 0..3)
    }
    fn uuids() -> impl Strategy<Value = BTreeSet<Uuid>> {
        proptest::collection::btree_set(any::<u128>().prop_map(Uuid::from_u128), 0..3)
    }

    proptest! {
        #[test]
        fn typed_insert_equals_row_insert(
            (s1, s2, s3) in (text(), text(), text()),
            (m1, m2) in (map(), map()),
            (set1, set2) in (strings(), strings()),
            refs in uuids(),
            opt in proptest::option::of(text()),
            optb in proptest::option::of(any::<bool>()),
            optu in proptest::option::of(any::<u128>().prop_map(Uuid::from_u128)),
            n in any::<i64>(),
            b in any::<bool>(),
        ) {
            same_insert(&Acl {
                name: opt.clone(),
                priority: n,
                direction: s1.clone(),
                match_: s2.clone(),
                action: s3.clone(),
                log: b,
                severity: opt.clone(),
                options: m1.clone(),
                external_ids: m2.clone(),
                ..Default::default()
            }, &[])?;
            same_insert(&LogicalSwitchPort {
                name: s1.clone(),
                kind: s2.clone(),
                addresses: set1.clone(),
                port_security: set2.clone(),
                options: m1.clone(),
                enabled: optb,
                up: Some(true), // read-only: written by neither
                ..Default::default()
            }, &[])?;
            same_insert(&Chassis {
                name: s1.clone(),
                hostname: s3.clone(),
                encaps: refs.clone(),
                transport_zones: set1.clone(),
                other_config: m2.clone(),
                ..Default::default()
            }, &[("encaps", Datum::empty_set()), ("hostname", Datum::from("h"))])?;
            same_insert(&ChassisPrivate {
                name: s2.clone(),
                chassis: optu,
                external_ids: m1.clone(),
                ..Default::default()
            }, &[])?;
        }
    }
}
