//! Keeps the state file current: written within moments of every change of the open reservations, and of whatever
//! else it keeps (see [`crate::cleanup::state`]: subscribers' acks among it) within a second.
//!
//! A status is sent only once its reservation is on disk ([`Registry::durable`]): a view-syncer that starts to
//! restore must not depend on a reservation a restart would forget. When the file cannot be written, statuses still
//! go out, but cleanup holds ([`Memory::Unwritable`]) until a write succeeds again: a restart then would forget the
//! restores in flight.

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::cleanup::reservations::{Registry, Written};
use crate::cleanup::state::{self, Saved, StateError};
use crate::cleanup::status::StatusHandle;
use crate::cleanup::Memory;

/// How often what the monitor keeps (the last purge, the highest watermark, the replica version) is compared with
/// what was written; reservations are written at once.
const RECHECK: Duration = Duration::from_secs(1);

pub struct Keeper {
    pub path: PathBuf,
    pub registry: Registry,
    pub subscribers: crate::cleanup::subscribers::Subscribers,
    /// `cleanup.reconnect_grace`: which departed subscribers are still tracked.
    pub reconnect_grace: Duration,
    pub status: StatusHandle,
}

impl Keeper {
    /// Writes until `shutdown`, then once more, so that a clean stop leaves everything it knew.
    pub async fn run(self, shutdown: CancellationToken) {
        let mut changes = self.registry.changes();
        let mut written: Option<Saved> = None;
        let mut failing = false;
        loop {
            let version = *changes.borrow_and_update();
            let saved = self.gather();
            if written.as_ref() == Some(&saved) {
                self.registry.set_written(Written::Through(version));
            } else {
                match self.write(saved.clone()).await {
                    Ok(()) => {
                        if std::mem::take(&mut failing) {
                            info!(path = %self.path.display(), "state file written again; cleanup may resume");
                        }
                        written = Some(saved);
                        self.registry.set_written(Written::Through(version));
                        self.status.update(|s| {
                            s.memory = Memory::Kept;
                            s.state_problem = None;
                        });
                    }
                    Err(err) => {
                        if !std::mem::replace(&mut failing, true) {
                            warn!(
                                error = %err,
                                "cannot write the state file: cleanup holds, as a restart now would forget the \
                                 restores in flight; retrying every second"
                            );
                        }
                        self.registry.set_written(Written::NotKept);
                        let problem = err.to_string();
                        self.status.update(|s| {
                            s.memory = Memory::Unwritable;
                            s.state_problem = Some(problem);
                        });
                    }
                }
            }
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                changed = changes.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
        let saved = self.gather();
        if written.as_ref() != Some(&saved) {
            if let Err(err) = self.write(saved).await {
                warn!(error = %err, "state file not written at shutdown");
            }
        }
    }

    fn gather(&self) -> Saved {
        let (last_purge, highest_backup, replica_version, restores_unknown_since) =
            self.status.read(|s| {
                (
                    s.purged_through.clone(),
                    s.highest_backup.clone(),
                    s.replica_version.clone(),
                    s.restores_unknown_since,
                )
            });
        Saved {
            cleanup_delay: self.registry.cleanup_delay(),
            last_purge,
            highest_backup,
            replica_version,
            reservations: self.registry.to_keep(),
            subscribers: self
                .subscribers
                .to_keep(tokio::time::Instant::now(), self.reconnect_grace),
            knows_reservations: true,
            restores_unknown_since,
        }
    }

    async fn write(&self, saved: Saved) -> Result<(), StateError> {
        let path = self.path.clone();
        tokio::task::spawn_blocking(move || state::store(&path, &saved))
            .await
            .unwrap_or_else(|join| {
                Err(StateError::Write {
                    path: self.path.clone(),
                    source: std::io::Error::other(join.to_string()),
                })
            })
    }
}
