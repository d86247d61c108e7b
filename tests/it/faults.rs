//! The fault suite: faults injected into a running sidecar (a restarted or vanished PostgreSQL, upstream or
//! litestream, a killed sidecar, clients that vanish or stall), each case asserting what an operator cares about —
//! the rows left in `changeLog` (none purged that a reservation, a subscriber or the newest transaction needed),
//! reservations and subscriptions still served, the hold reason reported, and recovery without a restart.
//!
//! One module per kind of fault; every case is bounded in time and cleans up what it started, also when it fails.
//!
//! The cases that need PostgreSQL are in [`pg`].

mod pg;
mod relay;
