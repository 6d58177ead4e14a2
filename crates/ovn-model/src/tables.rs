//! The tables ovnk touches. Column names and types follow the schemas shipped with OVN 23.03
//! (NB 7.0.0, SB 20.27.0) and Open vSwitch 3.1 (8.3.1); newer servers may add columns.

use std::collections::{BTreeMap, BTreeSet};

use ovsdb::Uuid;

use crate::model;

type Map = BTreeMap<String, String>;
type Strings = BTreeSet<String>;
type Refs = BTreeSet<Uuid>;

// ---------------------------------------------------------------- OVN_Northbound

model! {
    /// The NB database's single global row.
    "NB_Global" => pub struct NbGlobal {
        name: String = "name",
        nb_cfg: i64 = "nb_cfg",
        sb_cfg: i64 = "sb_cfg" [ro],
        hv_cfg: i64 = "hv_cfg" [ro],
        external_ids: Map = "external_ids",
        options: Map = "options",
    }
}

model! {
    "Logical_Switch" => pub struct LogicalSwitch {
        name: String = "name",
        ports: Refs = "ports",
        acls: Refs = "acls",
        other_config: Map = "other_config",
        external_ids: Map = "external_ids",
    }
}

model! {
    "Logical_Switch_Port" => pub struct LogicalSwitchPort {
        name: String = "name",
        /// `type` in the schema.
        kind: String = "type",
        addresses: Strings = "addresses",
        port_security: Strings = "port_security",
        options: Map = "options",
        external_ids: Map = "external_ids",
        enabled: Option<bool> = "enabled",
        /// Set by ovn-northd.
        up: Option<bool> = "up" [ro],
        /// Set by ovn-northd.
        dynamic_addresses: Option<String> = "dynamic_addresses" [ro],
    }
}

model! {
    "Logical_Router" => pub struct LogicalRouter {
        name: String = "name",
        ports: Refs = "ports",
        static_routes: Refs = "static_routes",
        policies: Refs = "policies",
        nat: Refs = "nat",
        enabled: Option<bool> = "enabled",
        options: Map = "options",
        external_ids: Map = "external_ids",
    }
}

model! {
    "Logical_Router_Port" => pub struct LogicalRouterPort {
        name: String = "name",
        mac: String = "mac",
        networks: Strings = "networks",
        peer: Option<String> = "peer",
        enabled: Option<bool> = "enabled",
        options: Map = "options",
        external_ids: Map = "external_ids",
    }
}

model! {
    "Logical_Router_Static_Route" => pub struct LogicalRouterStaticRoute {
        ip_prefix: String = "ip_prefix",
        nexthop: String = "nexthop",
        route_table: String = "route_table",
        policy: Option<String> = "policy",
        output_port: Option<String> = "output_port",
        options: Map = "options",
        external_ids: Map = "external_ids",
    }
}

model! {
    "Logical_Router_Policy" => pub struct LogicalRouterPolicy {
        priority: i64 = "priority",
        /// `match` in the schema.
        match_: String = "match",
        action: String = "action",
        nexthops: Strings = "nexthops",
        options: Map = "options",
        external_ids: Map = "external_ids",
    }
}

model! {
    "Address_Set" => pub struct AddressSet {
        name: String = "name",
        addresses: Strings = "addresses",
        external_ids: Map = "external_ids",
    }
}

model! {
    "Port_Group" => pub struct PortGroup {
        name: String = "name",
        ports: Refs = "ports",
        acls: Refs = "acls",
        external_ids: Map = "external_ids",
    }
}

model! {
    "ACL" => pub struct Acl {
        name: Option<String> = "name",
        priority: i64 = "priority",
        direction: String = "direction",
        /// `match` in the schema.
        match_: String = "match",
        action: String = "action",
        log: bool = "log",
        severity: Option<String> = "severity",
        meter: Option<String> = "meter",
        options: Map = "options",
        external_ids: Map = "external_ids",
    }
}

// ---------------------------------------------------------------- OVN_Southbound

model! {
    "SB_Global" => pub struct SbGlobal {
        nb_cfg: i64 = "nb_cfg" [ro],
        options: Map = "options",
        external_ids: Map = "external_ids",
    }
}

model! {
    /// A hypervisor. In IC mode ovnk writes the remote nodes' rows itself.
    "Chassis" => pub struct Chassis {
        name: String = "name",
        hostname: String = "hostname",
        encaps: Refs = "encaps",
        transport_zones: Strings = "transport_zones",
        other_config: Map = "other_config",
        external_ids: Map = "external_ids",
        /// Set by ovn-controller.
        nb_cfg: i64 = "nb_cfg" [ro],
    }
}

model! {
    "Chassis_Private" => pub struct ChassisPrivate {
        name: String = "name",
        chassis: Option<Uuid> = "chassis",
        nb_cfg: i64 = "nb_cfg" [ro],
        nb_cfg_timestamp: i64 = "nb_cfg_timestamp" [ro],
        external_ids: Map = "external_ids",
    }
}

model! {
    /// A tunnel endpoint of a Chassis (a non-root table: it lives as long as a Chassis refers
    /// to it, so it is found through its owner).
    "Encap" => pub struct Encap {
        /// `type` in the schema.
        kind: String = "type",
        ip: String = "ip",
        chassis_name: String = "chassis_name",
        options: Map = "options",
    }
}

model! {
    /// Written by ovn-northd; ovnk only sets `chassis` of remote ports (OVN 23.03 leaves it empty).
    "Port_Binding" => pub struct PortBinding {
        logical_port: String = "logical_port" [ro],
        /// `type` in the schema.
        kind: String = "type" [ro],
        datapath: Uuid = "datapath" [ro],
        tunnel_key: i64 = "tunnel_key" [ro],
        chassis: Option<Uuid> = "chassis",
        requested_chassis: Option<Uuid> = "requested_chassis" [ro],
        options: Map = "options" [ro],
        mac: Strings = "mac" [ro],
        up: Option<bool> = "up" [ro],
        external_ids: Map = "external_ids",
    }
}

// ---------------------------------------------------------------- Open_vSwitch

model! {
    "Open_vSwitch" => pub struct OpenVSwitch {
        bridges: Refs = "bridges" [ro],
        external_ids: Map = "external_ids",
        other_config: Map = "other_config",
        ovs_version: Option<String> = "ovs_version" [ro],
        cur_cfg: i64 = "cur_cfg" [ro],
        next_cfg: i64 = "next_cfg" [ro],
    }
}

model! {
    "Bridge" => pub struct Bridge {
        name: String = "name",
        datapath_type: String = "datapath_type",
        ports: Refs = "ports",
        fail_mode: Option<String> = "fail_mode",
        other_config: Map = "other_config",
        external_ids: Map = "external_ids",
    }
}

model! {
    "Port" => pub struct Port {
        name: String = "name",
        interfaces: Refs = "interfaces",
        other_config: Map = "other_config",
        external_ids: Map = "external_ids",
    }
}

model! {
    /// Tunnel ports made by ovn-controller show up here as `type=geneve` interfaces.
    "Interface" => pub struct Interface {
        name: String = "name",
        /// `type` in the schema.
        kind: String = "type",
        options: Map = "options",
        external_ids: Map = "external_ids",
        mtu_request: Option<i64> = "mtu_request",
        /// The requested MAC (internal interfaces).
        mac: Option<String> = "mac",
        /// Set by ovs-vswitchd: the MAC in use.
        mac_in_use: Option<String> = "mac_in_use" [ro],
        ofport: Option<i64> = "ofport" [ro],
        admin_state: Option<String> = "admin_state" [ro],
        link_state: Option<String> = "link_state" [ro],
        error: Option<String> = "error" [ro],
    }
}
