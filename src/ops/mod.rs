//! What operators read:
//! - [`metrics`]: the sidecar's own Prometheus instruments, updated on the hot paths.
//! - [`metrics_page`]: `GET /metrics`: the state read at scrape time and the page rendered from it.
//! - [`status`]: `GET /status`: the state as one JSON report.
//! - [`status_cli`]: `litestream-sidecar status`: fetching that report and printing it as tables.
//! - [`notify`]: systemd's readiness, status and watchdog notifications.
//! - [`hidden_gauge`]: a Zero 1.10 replication-manager kept unready by `proxy_mode = "hide"`, said.

pub mod drill_cli;
pub mod hidden_gauge;
pub mod log;
pub mod metrics;
pub mod metrics_page;
pub mod notify;
pub mod status;
pub mod status_cli;
