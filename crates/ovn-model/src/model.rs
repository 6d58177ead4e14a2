//! The `Model` trait and the macro that declares typed tables.

use ovsdb::cache::Columns;
use ovsdb::{Datum, RowData, RowRef, TableNeeds, Uuid};

/// A typed row of one table.
pub trait Model: Sized + Clone + PartialEq + std::fmt::Debug {
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
