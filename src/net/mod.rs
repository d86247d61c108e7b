//! The network edge, below every endpoint:
//! - [`address`]: what a `host:port` is and when two addresses name the same endpoint.
//! - [`allow`]: which peers may connect at all.
//! - [`client`]: the HTTP GET client (litestream's metrics page, `/status` for the `status` subcommand).
//! - [`admission`]: connection limits, the refusal past them, and counts of connections turned away.
//! - [`head`]: the request head, read before hyper sees it.
//! - [`sockopt`]: the socket a request came in on, and the option the ack threshold is set with (`unsafe`).
//! - [`timer`]: a timer to the microsecond, where Tokio's millisecond ticks are too coarse (the ack wake-up limit;
//!   `unsafe` to register).
//! - [`tls`]: TLS for the listener (reloaded on SIGHUP), toward the upstream, and for `status`.
//! - `http`: the answers the router and the handlers write themselves: plain text, and WebSocket upgrades.
//! - [`upgraded`]: a relayed WebSocket's socket taken back from hyper, plain TCP read and written directly.
//! - [`ws`]: WebSocket plumbing shared by the handlers (cancel-safe reads and flushes, limits, liveness, closing).

pub mod address;
pub mod admission;
pub mod allow;
pub mod client;
pub mod config;
pub mod head;
pub(crate) mod http;
pub(crate) mod sockopt;
pub(crate) mod timer;
pub mod tls;
pub mod upgraded;
pub mod ws;
