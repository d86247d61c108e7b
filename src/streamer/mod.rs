//! The change-streamer endpoints Zero's view-syncers use, from their upgrade on:
//! - [`snapshot`]: `/snapshot`, the reservation's WebSocket, served by the sidecar itself (the cleanup side's
//!   registry keeps the reservations).
//! - [`relay`]: `/changes`, relayed to Zero's change-streamer while each subscriber's acks are watched.
//! - [`wakeup`]: how many bytes of a subscriber's acks are worth waking the relay for, without I/O.
//! - [`protocols`]: which protocol versions the upstream serves, configured or learned; both endpoints check it.

pub mod config;
pub mod protocols;
pub mod relay;
pub mod snapshot;
pub mod wakeup;
