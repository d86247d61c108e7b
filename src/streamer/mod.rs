//! The change-streamer endpoints Zero's view-syncers use, from their upgrade on:
//! - `/snapshot`: reservations, served by the sidecar itself ([`crate::cleanup::reservations`] keeps them).
//! - [`relay`]: `/changes`, relayed to Zero's change-streamer while each subscriber's acks are watched.
//! - [`wakeup`]: how many bytes of a subscriber's acks are worth waking the relay for, without I/O.

pub mod relay;
pub mod wakeup;
