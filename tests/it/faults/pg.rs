//! Faults around a sidecar that purges a real PostgreSQL change log: the change DB itself restarting or gone
//! (on a cluster of the test's own), litestream misbehaving, the sidecar killed or restarted, clients that vanish
//! and an upstream that goes away.

mod clients;
mod litestream;
mod postgres;
mod sidecar;
mod upstream;
