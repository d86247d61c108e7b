//! The metrics proxy on Zero's litestream port: litestream's page with the `litestream_replica_progress` family
//! reduced to the change log's oldest watermark (`clamp`, the default) or removed (`hide`), byte for byte
//! otherwise.
//!
//! Zero's replication-manager polls `http://localhost:{ZERO_LITESTREAM_PORT}/metrics` and purges the change log on
//! its own, blind to the reservations the sidecar holds. Behind this proxy the only watermark it sees is one below
//! which the log holds no row, so a purge it schedules deletes nothing and the sidecar alone decides cleanup
//! (docs/protocol.md, "Two purgers"), while its readiness gate, backup verification and backup-lag metric see a
//! live backup. When litestream cannot be read the proxy answers 502, as a dead litestream would look to Zero.
//!
//! [`bind`] opens its listeners; [`crate::server::serve_http`] serves them with the [`Proxy`] handler.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::{debug, warn};

use crate::cleanup::change_db::ChangeDb;
use crate::litestream::config::{Filter, ProxyMode};
use crate::litestream::filter::{clamp_progress_family, strip_progress_family};
use crate::net::client::HttpClient;
use crate::net::http::plain;
use crate::server::Handler;

/// The Prometheus text format litestream serves by default.
const CONTENT_TYPE_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Binds every address `host:port` resolves to: Zero fetches `localhost`, which may be 127.0.0.1, ::1 or both.
pub async fn bind(listen: &str) -> std::io::Result<Vec<TcpListener>> {
    let mut addrs: Vec<SocketAddr> = tokio::net::lookup_host(listen).await?.collect();
    addrs.sort();
    addrs.dedup();
    let mut listeners = Vec::with_capacity(addrs.len());
    for addr in addrs {
        match TcpListener::bind(addr).await {
            Ok(listener) => listeners.push(listener),
            // ::1 may resolve on a host without IPv6; serving the other addresses is still right.
            Err(err) if addr.is_ipv6() && !listeners.is_empty() => {
                warn!(%addr, error = %err, "metrics proxy cannot listen on this address; skipped");
            }
            Err(err) => {
                return Err(std::io::Error::new(
                    err.kind(),
                    format!("metrics proxy on {addr}: {err}"),
                ));
            }
        }
    }
    if listeners.is_empty() {
        return Err(std::io::Error::other(format!(
            "{listen} resolves to no address"
        )));
    }
    Ok(listeners)
}

/// How long `clamp` waits for the change log's oldest watermark before serving the page without a gauge.
const FLOOR_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The proxy's [`Handler`] for [`crate::server::serve_http`]: `GET /metrics` is litestream's page, filtered.
pub struct Proxy {
    pub scraper: HttpClient,
    pub mode: ProxyMode,
    pub filter: Filter,
    /// Where `clamp` reads the time of the newest backup that restores.
    pub status: crate::cleanup::status::StatusHandle,
    /// Where `clamp` reads the change log's oldest watermark, at every scrape.
    pub change_db: Option<ChangeDb>,
    /// Labels for the sample `clamp` makes when litestream has no gauge of its own (a stock litestream).
    pub fallback: crate::litestream::filter::Fallback,
}

impl Proxy {
    /// The watermark and time `clamp` shows, if there is a backup to speak of: see [`clamp_point`]. The change log
    /// is read at each scrape rather than from the cleanup loop's last reading, so that a resync (which may start
    /// the new log below the old one) can never leave a stale, higher watermark on the page.
    async fn clamp_point(&self) -> Option<(String, SystemTime)> {
        let db = self.change_db.as_ref()?;
        let read = async {
            let replica_version = db.replica_version().await.ok()??;
            let oldest = db.min_watermark().await.ok()?;
            Some(LogFloor {
                oldest,
                replica_version,
            })
        };
        let floor = match tokio::time::timeout(FLOOR_READ_TIMEOUT, read).await {
            Ok(floor) => floor,
            Err(_) => {
                debug!("metrics proxy: the change log did not answer; no gauge on this page");
                None
            }
        };
        let backed_up_at = self.status.read(backup_time);
        clamp_point(floor, backed_up_at)
    }
}

/// The change log's bounds as `clamp` reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogFloor {
    /// `min(watermark)`; `None` when the log is empty.
    pub oldest: Option<String>,
    pub replica_version: String,
}

/// The time of the newest backup a restore reaches: the newest object of the destination's restorable chain as
/// the last listing found it, or, when the destination is not listed (`backup.verify = false`), the time of the
/// backup the sidecar tracks. `None` while there is no such backup: Zero then sees no gauge, as on a fresh stack
/// whose first snapshot is still uploading.
fn backup_time(status: &crate::cleanup::status::Status) -> Option<SystemTime> {
    if status.backup.verifying {
        status.backup.listing.as_ref()?.chain_newest()
    } else {
        status.newest_backup.as_ref().map(|(_, at)| *at)
    }
}

/// What `clamp` shows: the change log's oldest watermark (the replica version when the log is empty), below which
/// the log holds no row, so a purge Zero schedules from it deletes nothing; with the time of a backup that
/// restores, which Zero's upload verification finds in the destination (docs/protocol.md, "Two purgers").
///
/// It meets Zero 1.10's readiness gate: after an initial sync the log is seeded at the replica version, which is
/// also the replica's `stateVersion` then, so the first watermark shown is at least that (docs/protocol.md,
/// "Zero 1.10"). It only rises as rows are purged (by the sidecar: nothing else deletes below it), and never
/// stands above a row the log still holds.
pub fn clamp_point(
    floor: Option<LogFloor>,
    backed_up_at: Option<SystemTime>,
) -> Option<(String, SystemTime)> {
    let floor = floor?;
    let watermark = floor.oldest.unwrap_or(floor.replica_version);
    Some((watermark, backed_up_at?))
}

impl Handler for Proxy {
    async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        _peer: SocketAddr,
    ) -> Response<Full<Bytes>> {
        if req.method() != Method::GET && req.method() != Method::HEAD {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is served\n");
        }
        if req.uri().path() != "/metrics" {
            return plain(
                StatusCode::NOT_FOUND,
                "not found: the metrics are at /metrics\n",
            );
        }
        match self.scraper.fetch().await {
            Ok(page) => {
                let filtered = match self.mode {
                    ProxyMode::Hide => strip_progress_family(&page),
                    ProxyMode::Clamp => {
                        let point = self.clamp_point().await;
                        let through = point.as_ref().map(|(w, at)| (w.as_str(), *at));
                        clamp_progress_family(&page, &self.filter, through, Some(&self.fallback))
                    }
                };
                let body = match filtered {
                    std::borrow::Cow::Borrowed(_) => page,
                    std::borrow::Cow::Owned(stripped) => Bytes::from(stripped),
                };
                let mut response = Response::new(Full::new(body));
                response
                    .headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE_TEXT));
                response
            }
            Err(err) => {
                debug!(error = %err, "metrics proxy: litestream unreadable");
                plain(
                    StatusCode::BAD_GATEWAY,
                    format!("litestream metrics unavailable: {err}\n"),
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn floor(oldest: Option<&str>) -> Option<LogFloor> {
        Some(LogFloor {
            oldest: oldest.map(str::to_owned),
            replica_version: "01".into(),
        })
    }

    #[test]
    fn the_gauge_is_the_logs_oldest_watermark_with_the_backups_time() {
        assert_eq!(
            clamp_point(floor(Some("0c")), Some(at(7))),
            Some(("0c".into(), at(7)))
        );
    }

    #[test]
    fn an_empty_log_shows_the_replica_version() {
        assert_eq!(
            clamp_point(floor(None), Some(at(7))),
            Some(("01".into(), at(7)))
        );
    }

    #[test]
    fn no_gauge_without_a_backup_or_without_the_log() {
        assert_eq!(clamp_point(floor(Some("0c")), None), None);
        assert_eq!(clamp_point(None, Some(at(7))), None);
    }
}
