//! The model: routes, limits, policies and the routing table as plain data. Config compiles
//! into it once; every other layer reads it; it depends on none of them.

pub mod consumer;
pub mod identity;
pub mod limit;
pub mod outcome;
pub mod params;
pub mod path;
pub mod policy;
pub mod route;
pub mod table;
pub mod tls;
