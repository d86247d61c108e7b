//! The cleanup loop, where I/O and the policy meet. Every `check_interval` it observes (litestream's page into the
//! backlog, the change DB's replica version, the purger lock, the shard's slots, the destination's listing, the
//! refusal checks), asks [`cleanup::decide`], publishes what it now knows, and acts: purges the change log when the
//! answer is yes. One purge at a time: the loop awaits each before the next tick.
//!
//! What the loop knows lives in one owner without I/O, [`Knowledge`], whose transitions say what happened; the
//! files here do the reading ([`observe`], [`refusals`]), the gathering ([`gather`]), the purge ([`purge`]) and the
//! logging of what changed ([`throttle`]).
//!
//! Failures never purge: a scrape that fails keeps what is known and tries again next interval; a purge that
//! fails leaves the last purged watermark where it was.

mod gather;
pub mod knowledge;
mod observe;
mod purge;
mod refusals;
#[cfg(test)]
mod tests;
mod throttle;

use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::cleanup::change_db::ChangeDb;
use crate::cleanup::config::{CleanupConfig, Requires};
use crate::cleanup::discovery::DiscoveryConfig;
use crate::cleanup::handles::{Handles, Hooks};
use crate::cleanup::reservations::Registry;
use crate::cleanup::subscribers::Subscribers;
use crate::cleanup::unservable::LogWatch;
use crate::cleanup::{self, Inputs, LastPurge};
use crate::litestream::config::{BackupConfig, LitestreamConfig};
use crate::litestream::destination;
use crate::net::client::HttpClient;

pub use knowledge::Knowledge;
use throttle::Said;

/// Reading the change DB (its size, the lock, the slots, the refusal checks) never delays a check by more than this.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How far a running purge may still go, asked before each of its batches. Reservations are read first, then
/// subscribers, as [`Monitor::run`] gathers them: a relay registers its subscriber before it ends the reservation
/// the subscription takes over from, so a restore that finishes between the two reads is seen in one of them.
pub fn purge_limit(
    mode: cleanup::ReservationMode,
    registry: &Registry,
    subscribers: &Subscribers,
    reconnect_grace: Duration,
) -> cleanup::Ceiling {
    let reservations = registry.for_policy();
    let now = Instant::now();
    let tracked = subscribers.for_policy(now, reconnect_grace);
    cleanup::purge_ceiling(mode, &reservations, &tracked, now, reconnect_grace)
}

/// What the previous run left: where its purges and litestream's gauge had got to, for which replica, and whether
/// it said which restores were in flight.
#[derive(Debug, Clone, Default)]
pub struct Resumed {
    pub last_purge: Option<LastPurge>,
    pub highest_backup: Option<String>,
    pub replica_version: Option<String>,
    /// Since when nothing says which restores were in flight (a start without a state file, or with one that did
    /// not keep reservations): cleanup holds for `cleanup.hold_without_state` from then, across restarts too.
    pub restores_unknown_since: Option<SystemTime>,
}

/// The parts of the config the loop acts on: its own section and those whose keys decide what it reads and checks.
#[derive(Clone, Copy)]
pub struct MonitorConfig<'a> {
    pub cleanup: &'a CleanupConfig,
    pub litestream: &'a LitestreamConfig,
    pub backup: &'a BackupConfig,
    pub discovery: &'a DiscoveryConfig,
    /// `upstream.advertised_address`: what `ownerAddress` says while the replication-manager holds it.
    pub upstream_address: &'a str,
}

pub struct Monitor {
    handles: Handles,
    change_db: ChangeDb,
    cleanup: CleanupConfig,
    litestream: LitestreamConfig,
    backup: BackupConfig,
    discovery_config: DiscoveryConfig,
    /// The replication-manager's own `ownerAddress`, which purges check in mode `owner`.
    upstream_address: String,
    scraper: HttpClient,
    /// When the sidecar started: restores that began before a restart are covered by waiting the cleanup delay.
    started: Instant,
    /// Where the shard's memory comes from once the keeper has read it from the change DB; `None`: it is
    /// [`Monitor::resumed`] already.
    resumed_from: Option<tokio::sync::watch::Receiver<Option<Resumed>>>,
    /// What the shard remembers (the last purge, the highest backup, the replica version).
    resumed: Resumed,
    /// The wall clock at an instant of this run: the base of [`cleanup::Guards::steady_now`].
    anchor: (Instant, SystemTime),
    /// `None`: `backup.verify` is off. `Err`: the client could not be built (an unusable `AWS_*` variable, say),
    /// reported as a failed listing at every check.
    destination: Option<Result<destination::Destination, String>>,
    /// How long a relayed commit may stay absent from the change log before the log counts as not written.
    log_unwritten_after: Duration,
    knowledge: Knowledge,
    said: Said,
    log_watch: LogWatch,
}

impl Monitor {
    pub fn new(
        config: MonitorConfig<'_>,
        handles: &Handles,
        change_db: ChangeDb,
        started: Instant,
        hooks: &Hooks,
    ) -> Self {
        let litestream = config.litestream;
        let scraper = HttpClient::new(
            litestream.metrics_url.clone(),
            litestream.scrape_timeout,
            litestream.max_page_bytes,
        )
        .expect("metrics_url was validated as an http URL");
        let destination = config.backup.location.as_ref().map(|location| {
            destination::Destination::open(
                location,
                &config.backup.s3,
                config.backup.list_timeout,
                match &hooks.backup_env {
                    Some(env) => env.clone(),
                    None => std::env::vars().collect(),
                },
            )
            .map(|d| d.restoring_with(config.backup.restore_with))
        });
        Self {
            handles: handles.clone(),
            change_db,
            cleanup: config.cleanup.clone(),
            litestream: litestream.clone(),
            backup: config.backup.clone(),
            discovery_config: config.discovery.clone(),
            upstream_address: config.upstream_address.to_string(),
            scraper,
            started,
            resumed: Resumed::default(),
            resumed_from: None,
            anchor: (Instant::now(), SystemTime::now()),
            knowledge: Knowledge::new(destination.is_some()),
            destination,
            log_unwritten_after: hooks.log_unwritten_after,
            said: Said::default(),
            log_watch: LogWatch::default(),
        }
    }

    /// Continues from what the previous run left in the state file.
    pub fn resuming(mut self, resumed: Resumed) -> Self {
        self.resumed = resumed;
        self
    }

    /// Starts checking only once `resumed` has the shard's memory (the keeper reads it from the change DB): a
    /// check before it would decide without the last purge, the highest backup or the replica version.
    pub fn resuming_from(mut self, resumed: tokio::sync::watch::Receiver<Option<Resumed>>) -> Self {
        self.resumed_from = Some(resumed);
        self
    }

    /// Checks every `check_interval` until `shutdown`: observe, decide, publish, act. A purge in progress finishes
    /// its current batch first.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut waiting = self.resumed_from.take();
        if waiting.is_none() {
            let resumed = self.resumed.clone();
            self.resume(&resumed);
        }
        self.publish();
        let mut every = crate::shared::Every::new(self.litestream.check_interval);
        while every.tick(&shutdown).await {
            let now = Instant::now();
            // Checks run from the start (statuses need litestream's position), but decide nothing before the
            // shard's memory is read: the status says `loading` until then.
            let read = waiting.as_ref().and_then(|from| from.borrow().clone());
            if let Some(resumed) = read {
                waiting = None;
                self.resume(&resumed);
            }
            self.read_replica(now).await;
            self.read_replica_backups(now).await;
            self.watch_log(now).await;
            match self.cleanup.requires {
                Requires::Listing => self.scrape(now).await,
                Requires::Restore => {
                    self.read_size_of_page().await;
                    self.take_proofs();
                }
            }
            self.claim_purger().await;
            self.read_slots().await;
            let destination = self.verify(now).await;
            let other_generation = match self.cleanup.requires {
                // The backlog holds proofs, which name their generation themselves.
                Requires::Restore => Vec::new(),
                Requires::Listing => self.knowledge.claims_of_other_generations(),
            };
            let observed = self.gather(now);
            let guards = self.guards(now);
            self.settle_unknown_restores(&guards, now);
            let backlog = self.knowledge.backlog();
            let decision = cleanup::decide(&Inputs {
                now,
                wall_now: SystemTime::now(),
                started: self.started,
                ownership: observed.ownership,
                cleanup_delay: observed.cleanup_delay,
                reconnect_grace: self.cleanup.reconnect_grace,
                mode: self.cleanup.reservations,
                without_subscribers: self.cleanup.without_subscribers,
                backups: backlog.backups(),
                reservations: &observed.reservations,
                subscribers: &observed.subscribers,
                last_purged: backlog.last_purged(),
                highest_backup: backlog.highest(),
                current_backup: backlog.current().map(|b| b.watermark.as_str()),
                destination,
                other_generation: &other_generation,
                guards,
            });
            debug!(
                ?decision,
                reservations = %observed.reservation_list(),
                "cleanup decision"
            );
            self.publish();
            self.act(decision, &observed, &shutdown).await;
            self.read_size().await;
            self.handles.status.update(|s| s.checks += 1);
        }
    }

    /// Takes in the shard's memory (see [`Knowledge::on_resumed`]).
    fn resume(&mut self, resumed: &Resumed) {
        if let Some((remembered, current)) = self.knowledge.on_resumed(resumed, SystemTime::now()) {
            tracing::warn!(
                %remembered,
                %current,
                "the shard's memory is of another replica: a resync happened while no sidecar ran; cleanup \
                 holds until a backup of this one has aged"
            );
        }
    }

    /// Hands what the loop knows to its readers, in one write.
    fn publish(&self) {
        self.handles.status.update(|s| self.knowledge.publish(s));
    }
}
