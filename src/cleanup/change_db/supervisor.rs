//! Keeps the change DB's one connection up: connects (TCP, TLS, authentication, the session's `lock_timeout`),
//! reconnects after every loss with capped exponential backoff, closes on shutdown, and logs each change of state
//! once.
//!
//! Kept apart from the operations in `mod.rs`: they see only a connected client, or
//! [`DbError::Unavailable`](super::DbError::Unavailable) with the reason recorded here, never the connection's life
//! cycle.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_postgres::config::Host;
use tokio_postgres::{Client, NoTls};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::tls::ChangeDbTls;
use super::{with_cause, Inner, Options};

/// Connection state as the supervisor sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Link {
    Connecting,
    Up,
    Down(String),
    Closed,
}

/// The last state logged, so each change is logged once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Logged {
    Nothing,
    Up,
    Down,
    SchemaMissing,
}

impl Inner {
    pub(super) fn down_reason(&self) -> String {
        match &*self.link.borrow() {
            Link::Connecting => "connecting".into(),
            Link::Up => "connection closed".into(),
            Link::Down(reason) => reason.clone(),
            Link::Closed => "shut down".into(),
        }
    }

    /// Logs a change of state, once. `Up` after `SchemaMissing` means the schema appeared.
    pub(super) fn note(&self, now: Logged) {
        let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
        let before = std::mem::replace(&mut *logged, now);
        drop(logged);
        match (before, now) {
            (a, b) if a == b => {}
            (Logged::SchemaMissing, Logged::Up) => {
                info!(schema = %self.schema, "change DB schema found")
            }
            (_, Logged::Up) => {
                info!(db = %self.target, schema = %self.schema, "change DB connected")
            }
            (_, Logged::SchemaMissing) => warn!(
                schema = %self.schema,
                "change DB schema missing: Zero has not initialised the change DB yet"
            ),
            (_, Logged::Down) | (_, Logged::Nothing) => {}
        }
    }

    pub(super) fn set_down(&self, reason: String, retry_in: Duration) {
        let changed = {
            let mut logged = self.logged.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *logged, Logged::Down) != Logged::Down
        };
        if changed {
            warn!(db = %self.target, reason = %reason, retry_in = ?retry_in, "change DB down");
        } else {
            debug!(db = %self.target, reason = %reason, retry_in = ?retry_in, "change DB still down");
        }
        self.link.send_replace(Link::Down(reason));
    }
}

/// `host=… port=… dbname=… user=…` for logs: never the password.
pub(super) fn target(pg: &tokio_postgres::Config) -> String {
    let mut hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    if hosts.is_empty() {
        hosts = pg.get_hostaddrs().iter().map(|a| a.to_string()).collect();
    }
    let ports: Vec<String> = pg.get_ports().iter().map(|p| p.to_string()).collect();
    format!(
        "host={} port={} dbname={} user={}",
        if hosts.is_empty() {
            "localhost".into()
        } else {
            hosts.join(",")
        },
        if ports.is_empty() {
            "5432".into()
        } else {
            ports.join(",")
        },
        pg.get_dbname().unwrap_or("(default)"),
        pg.get_user().unwrap_or("(default)"),
    )
}

/// The next reconnection delay: doubled, at most `max`.
fn next_backoff(current: Duration, max: Duration) -> Duration {
    current.saturating_mul(2).min(max)
}

type ConnectionTask = JoinHandle<Result<(), tokio_postgres::Error>>;

/// Connects, reconnects after every loss with capped exponential backoff, and closes on shutdown.
pub(super) async fn supervise(
    inner: Arc<Inner>,
    pg: tokio_postgres::Config,
    tls: ChangeDbTls,
    options: Options,
    shutdown: CancellationToken,
) {
    let setup = format!(
        "SET lock_timeout = {}",
        options.lock_timeout.as_millis().max(1)
    );
    let mut delay = options.backoff_min;
    loop {
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => break,
            attempt = tokio::time::timeout(options.connect_timeout, open(&pg, &tls, &setup)) => attempt,
        };
        let reason = match attempt {
            Ok(Ok((client, mut connection))) => {
                *inner.client.lock().await = Some(client);
                *inner.byte_order.lock().unwrap_or_else(|e| e.into_inner()) = None;
                inner.link.send_replace(Link::Up);
                inner.note(Logged::Up);
                delay = options.backoff_min;
                let ended = tokio::select! {
                    _ = shutdown.cancelled() => None,
                    ended = &mut connection => Some(ended),
                };
                // Waits for an operation in flight: its connection task keeps running meanwhile.
                let client = inner.client.lock().await.take();
                match ended {
                    None => {
                        if let Some(client) = client {
                            release_on_shutdown(&inner, client).await;
                        }
                        let _ = tokio::time::timeout(Duration::from_secs(5), connection).await;
                        break;
                    }
                    Some(Ok(Ok(()))) => "connection closed by the server".to_string(),
                    Some(Ok(Err(e))) => with_cause(&e),
                    Some(Err(e)) => format!("connection task failed: {e}"),
                }
            }
            Ok(Err(e)) => with_cause(&e),
            Err(_) => format!("connecting timed out after {:?}", options.connect_timeout),
        };
        inner.set_down(reason, delay);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(delay) => {}
        }
        delay = next_backoff(delay, options.backoff_max);
    }
    inner.client.lock().await.take();
    inner.link.send_replace(Link::Closed);
    debug!(db = %inner.target, "change DB connection closed");
}

/// Releases the purger lock before the session closes. Closing releases it too; this only makes the hand-over
/// explicit, so it is bounded and its failure is not reported.
async fn release_on_shutdown(inner: &Inner, client: Client) {
    match tokio::time::timeout(Duration::from_secs(1), inner.release_purger_lock(&client)).await {
        Ok(Ok(true)) => info!(schema = %inner.schema, "purger lock released"),
        Ok(Ok(false)) => {}
        Ok(Err(e)) => debug!(error = %with_cause(&e), "releasing the purger lock on shutdown"),
        Err(_) => debug!("releasing the purger lock on shutdown timed out"),
    }
}

/// One connection with its driver task spawned, and the session set up.
async fn open(
    pg: &tokio_postgres::Config,
    tls: &ChangeDbTls,
    setup: &str,
) -> Result<(Client, ConnectionTask), tokio_postgres::Error> {
    let (client, task) = match tls {
        ChangeDbTls::Off => {
            let (client, connection) = pg.connect(NoTls).await?;
            (client, tokio::spawn(connection))
        }
        ChangeDbTls::Rustls(make) => {
            let (client, connection) = pg.connect(make.clone()).await?;
            (client, tokio::spawn(connection))
        }
    };
    client.batch_execute(setup).await?;
    Ok((client, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let max = Duration::from_secs(10);
        let mut d = Options::default().backoff_min;
        let mut seen = vec![d];
        for _ in 0..10 {
            d = next_backoff(d, max);
            seen.push(d);
        }
        assert_eq!(seen[1], Duration::from_millis(200));
        assert_eq!(seen[6], Duration::from_millis(6400));
        assert_eq!(seen[7], max);
        assert_eq!(*seen.last().unwrap(), max);
    }

    #[test]
    fn log_target_never_shows_the_password() {
        let pg: tokio_postgres::Config = "postgres://zero:s3cret@db.internal:6432/zero_cdc"
            .parse()
            .unwrap();
        let shown = target(&pg);
        assert_eq!(
            shown,
            "host=db.internal port=6432 dbname=zero_cdc user=zero"
        );
        assert!(!shown.contains("s3cret"));
    }
}
