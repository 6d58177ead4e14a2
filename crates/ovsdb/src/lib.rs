//! An OVSDB client (RFC 7047 with the ovsdb-server(7) extensions), with no OVN knowledge.
//!
//! - [`codec`]: O(n) streaming framing of back-to-back JSON-RPC messages, with a size cap;
//! - [`datum`] and [`schema`]: typed atoms/datums checked against the server's schema, and
//!   the update2 diff semantics;
//! - [`cache`]: the replica of monitored tables, with indexes on columns and map keys;
//! - [`txn`]: transactions built as operation lists, results checked op by op;
//! - [`client`]: the connection (unix/tcp), `monitor_cond_since` with fallback to
//!   `monitor_cond`, echo handling, an inactivity probe, and reconnect with backoff that
//!   resumes when the server still has our last transaction and resynchronises otherwise.

pub mod atomset;
pub mod cache;
pub mod client;
pub mod codec;
pub mod datum;
pub mod rpc;
pub mod schema;
pub mod txn;

pub use atomset::{AtomMap, AtomSet};
pub use cache::{
    DbCache, IndexSpec, RowRef, TableCache, TableUpdates, UpdateError, par_map_chunks,
};
pub use client::{
    Client, ClientOptions, ConnState, Db, Endpoint, Error, MonitorSpec, MonitorTable, SchemaCheck,
    SyncState,
};
pub use datum::{Atom, Datum, DatumError};
pub use schema::{AtomicType, ColumnShape, ColumnType, DbSchema, SchemaError, TableNeeds};
pub use txn::{Condition, Mutation, NamedRow, RowData, Txn, TxnError, TxnResults};
pub use uuid::Uuid;
