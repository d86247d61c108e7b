//! What operators read:
//! - [`metrics`]: the sidecar's own Prometheus metrics: instruments, the state read at scrape time, the page.
//! - [`status`]: `GET /status` (the state as JSON) and the table `litestream-sidecar status` prints from it.
//! - [`notify`]: systemd's readiness, status and watchdog notifications.

pub mod metrics;
pub mod notify;
pub mod status;
