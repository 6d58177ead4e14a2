//! Typed rows for the OVN Northbound, Southbound and Open_vSwitch tables ovnk touches.
//!
//! Each table is declared once with [`model!`]; the declaration yields the struct, its
//! conversion from and to OVSDB rows, the minimal-update diff, and the list of columns checked
//! against the server's schema at connect ([`connect_db`]): a missing table or column, or one of
//! another type, is a clear error naming it; extra server columns are fine.
//!
//! Reads go through [`TypedCache`] on a replica, with client-side indexes by `name` and by
//! `external_ids` keys ([`by_name`], [`by_external_id`]).

pub mod model;
pub mod tables;
pub mod value;

use std::sync::Arc;

use ovsdb::{Client, Db, DbCache, Error, IndexSpec, MonitorSpec, MonitorTable, TableNeeds, Uuid};

pub use model::{InsertRow, Model, ModelError, TxnExt};
#[doc(hidden)]
pub use serde;
pub use tables::*;

pub const NB_DB: &str = "OVN_Northbound";
pub const SB_DB: &str = "OVN_Southbound";
pub const OVS_DB: &str = "Open_vSwitch";

/// The `external_ids` key that marks rows ovnk owns; its value names the owning object.
pub const OWNER_KEY: &str = "k8s.ovn.org/owner";
/// The `external_ids` key that names the kind of the owning object.
pub const OWNER_TYPE_KEY: &str = "k8s.ovn.org/owner-type";

/// What ovnk needs of each database.
pub fn nb_needs() -> Vec<TableNeeds> {
    vec![
        NbGlobal::NEEDS,
        LogicalSwitch::NEEDS,
        LogicalSwitchPort::NEEDS,
        LogicalRouter::NEEDS,
        LogicalRouterPort::NEEDS,
        LogicalRouterStaticRoute::NEEDS,
        LogicalRouterPolicy::NEEDS,
        AddressSet::NEEDS,
        PortGroup::NEEDS,
        Acl::NEEDS,
    ]
}
pub fn sb_needs() -> Vec<TableNeeds> {
    vec![
        SbGlobal::NEEDS,
        Chassis::NEEDS,
        ChassisPrivate::NEEDS,
        Encap::NEEDS,
        PortBinding::NEEDS,
    ]
}
pub fn ovs_needs() -> Vec<TableNeeds> {
    vec![
        OpenVSwitch::NEEDS,
        Bridge::NEEDS,
        Port::NEEDS,
        Interface::NEEDS,
    ]
}

/// An index of rows by `name`.
pub fn by_name() -> IndexSpec {
    IndexSpec::column("name")
}
/// An index of rows by one `external_ids` key.
pub fn by_external_id(key: &str) -> IndexSpec {
    IndexSpec::map_key("external_ids", key)
}

/// Checks the server's schema for `needs`, then monitors exactly those tables and columns,
/// adding a `name` index where the table has that column and an index on [`OWNER_KEY`] where
/// it has `external_ids`.
pub async fn connect_db(client: &Client, db: &str, needs: &[TableNeeds]) -> Result<Arc<Db>, Error> {
    let spec = MonitorSpec {
        tables: needs
            .iter()
            .map(|t| MonitorTable {
                name: t.table.to_owned(),
                columns: Some(t.columns.iter().map(|(c, _)| (*c).to_owned()).collect()),
                conditions: Vec::new(),
            })
            .collect(),
    };
    // The schema is fetched and checked while the server builds the monitor reply.
    let owned: Vec<TableNeeds> = needs.to_vec();
    let check: ovsdb::SchemaCheck = Box::new(move |schema| Ok(schema.check(&owned)?));
    let handle = client.monitor_checked(db, spec, check).await?;
    for t in needs {
        if t.columns.iter().any(|(c, _)| *c == "name") {
            handle.add_index(t.table, by_name());
        }
        if t.columns.iter().any(|(c, _)| *c == "external_ids") {
            handle.add_index(t.table, by_external_id(OWNER_KEY));
        }
    }
    Ok(handle)
}

/// Typed reads of a replica. Rows that do not convert are skipped with a log line naming
/// the row and column (a bad row never hides the others).
pub trait TypedCache {
    fn list<M: Model>(&self) -> Vec<M>;
    fn get<M: Model>(&self, uuid: &Uuid) -> Option<M>;
    /// Rows whose indexed value equals `value` (the index must have been added).
    fn find<M: Model>(&self, index: &IndexSpec, value: &str) -> Vec<M>;
    /// The rows named `name`, through the `name` index.
    fn named<M: Model>(&self, name: &str) -> Vec<M> {
        self.find(&by_name(), name)
    }
}

fn convert<M: Model>(r: ovsdb::RowRef<'_>) -> Option<M> {
    log_bad(M::from_row(r))
}

fn log_bad<M: Model>(r: Result<M, ModelError>) -> Option<M> {
    match r {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, "skipping a row that does not fit its model");
            None
        }
    }
}

/// Below this many rows per thread, converting on other threads costs more than it saves.
const PARALLEL_LIST_MIN_ROWS: usize = 2048;

impl TypedCache for DbCache {
    fn list<M: Model>(&self) -> Vec<M> {
        let Some(t) = self.table(M::TABLE) else {
            return Vec::new();
        };
        let pos = M::column_positions(t.columns());
        let rows: Vec<ovsdb::RowRef<'_>> = t.rows().collect();
        // A big table (a full resync, thousands of nodes) converts on all cores.
        ovsdb::par_map_chunks(&rows, PARALLEL_LIST_MIN_ROWS, |chunk| {
            chunk
                .iter()
                .filter_map(|r| log_bad(M::from_values(r.uuid, r.row.values(), &pos)))
                .collect()
        })
    }
    fn get<M: Model>(&self, uuid: &Uuid) -> Option<M> {
        self.table(M::TABLE)?.get(uuid).and_then(convert)
    }
    fn find<M: Model>(&self, index: &IndexSpec, value: &str) -> Vec<M> {
        let Some(t) = self.table(M::TABLE) else {
            return Vec::new();
        };
        match t.find_str(index, value) {
            Some(rows) => rows.into_iter().filter_map(convert).collect(),
            None => {
                tracing::warn!(
                    table = M::TABLE,
                    ?index,
                    "lookup through an index that was never added; scanning"
                );
                t.rows()
                    .filter(|r| {
                        let d = r.get(&index.column);
                        match &index.key {
                            Some(k) => {
                                d.and_then(|d| d.map_get(k)).and_then(|a| a.as_str()) == Some(value)
                            }
                            None => {
                                d.and_then(|d| d.as_scalar()).and_then(|a| a.as_str())
                                    == Some(value)
                            }
                        }
                    })
                    .filter_map(convert)
                    .collect()
            }
        }
    }
}
