//! Cleanup: what litestream backed up, the purges, the holds and the registration; and the signals that stop
//! cleanup or serving, with the time of the last purge.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::cleanup::change_db::FailureClass;
use crate::cleanup::status::Status;
use crate::cleanup::unservable::Reason;
use crate::cleanup::{HoldReason, Memory};

use super::{epoch_seconds, Clock, HandleFigures, Page};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ClassLabel {
    class: &'static str,
}

pub(super) fn purges(page: &mut Page, status: &Status, handles: &HandleFigures, clock: Clock) {
    let backup = Family::<Vec<(&'static str, String)>, Gauge>::default();
    if let Some((watermark, _)) = &status.newest_backup {
        backup
            .get_or_create(&vec![("watermark", watermark.clone())])
            .set(1);
    }
    page.add(
        "backup_watermark",
        "The newest watermark litestream reports backed up (value 1; the watermark is the label)",
        backup,
    );
    if let Some((_, backed_up_at)) = &status.newest_backup {
        page.gauge(
            "backup_age_seconds",
            "Seconds since the newest backed-up watermark was backed up",
            clock
                .wall
                .duration_since(*backed_up_at)
                .unwrap_or_default()
                .as_secs_f64(),
        );
    }
    page.gauge(
        "cleanup_delay_seconds",
        "How long a backup must exist before the change-log rows it covers may be purged",
        handles.cleanup_delay.as_secs_f64(),
    );
    page.counter("purge_runs", "Change-log purges run", status.purges);
    page.counter("purged_rows", "Change-log rows purged", status.purged_rows);
    page.counter(
        "purge_failures",
        "Change-log purges that ended in an error",
        status.purge_failures.total,
    );
    page.integer(
        "purge_consecutive_failures",
        "Change-log purges in a row that ended in an error; 0 once one succeeds",
        status.purge_failures.consecutive as i64,
    );
    let last_class = status.purge_failures.last.as_ref().map(|last| last.class);
    let failing = Family::<ClassLabel, Gauge>::default();
    for class in FailureClass::ALL {
        failing
            .get_or_create(&ClassLabel {
                class: class.as_str(),
            })
            .set((last_class == Some(class)) as i64);
    }
    page.add(
        "purge_failing",
        "1 for the class of the last purge's error while purges keep failing, else 0",
        failing,
    );
    let holds = Family::<ReasonLabel, Counter>::default();
    for reason in HoldReason::ALL {
        holds
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .inc_by(status.holds.get(&reason).copied().unwrap_or(0));
    }
    page.add(
        "cleanup_holds",
        "Cleanup checks that did not purge, by reason",
        holds,
    );
    if let Some(registered) = handles.registered {
        page.flag(
            "registered",
            "1 when the shard's ownerAddress names this sidecar",
            registered,
        );
    }
    page.flag(
        "change_db_up",
        "1 when the change DB answers with Zero's schema",
        handles.change_db_up,
    );
    page.counter(
        "litestream_scrape_errors",
        "Failed scrapes of litestream's metrics page",
        status.scrape_errors,
    );
    // Only the reason in force has a series: an alert on `> N` then names the reason, and a reason that gave way
    // to another does not linger at its last value.
    let held = Family::<ReasonLabel, Gauge<f64, AtomicU64>>::default();
    if let Some(since) = &status.held_since {
        held.get_or_create(&ReasonLabel {
            reason: since.reason.as_str(),
        })
        .set(
            clock
                .now
                .saturating_duration_since(since.since)
                .as_secs_f64(),
        );
    }
    page.add(
        "cleanup_held_seconds",
        "Seconds cleanup has been held for the current reason; no series while it purges",
        held,
    );
    if let Some(read) = &status.change_log {
        page.gauge(
            "change_log_rows",
            "Rows in the change log: counted up to 10000, PostgreSQL's estimate (pg_class.reltuples) above",
            read.size.rows as f64,
        );
    }
    if let Some(standby) = status.standby {
        page.flag(
            "purger",
            "1 while this sidecar holds the shard's purger lock, 0 while another one does (standby)",
            !standby,
        );
    }
    // `cleanup.state_file = "none"` counts as not kept.
    page.flag(
        "state_kept",
        "1 while this sidecar's slots and the shard's memory in the change DB are current; 0 while they cannot be \
         written or read, or before they were first read (cleanup holds)",
        status.memory == Memory::Kept,
    );
}

pub(super) fn signals(page: &mut Page, status: &Status, handles: &HandleFigures) {
    page.flag(
        "backup_position_known",
        "1 while litestream's page shows where its backup stands; 0 after it restarted, lost its samples or could \
         not be read (cleanup holds)",
        status.backup_unknown.is_none(),
    );
    page.flag(
        "backup_below_last_purge",
        "1 when litestream's first backed-up watermark after a start was below the last purge: a restore of that \
         backup cannot catch up",
        status.backup_below_purge.is_some(),
    );
    // Every reason has a series from the start, so that an alert sees one end rather than vanish.
    let unservable = Family::<ReasonLabel, Gauge>::default();
    for reason in Reason::ALL {
        unservable
            .get_or_create(&ReasonLabel {
                reason: reason.as_str(),
            })
            .set(status.unservable.has(reason) as i64);
    }
    page.add(
        "unservable",
        "1 while the sidecar refuses this deployment for the reason (ltx: the backup destination holds litestream 0.5 \
         files; backup_path: Zero records per-replica or v5 backups, ZERO_LITESTREAM_BACKUP_USING_V5; \
         log_not_written: relayed commits never reach the change log), else 0; cleanup and v4+ snapshot statuses \
         hold meanwhile",
        unservable,
    );
    page.flag(
        "upstream_up",
        "1 when the relay's last attempt to reach the upstream change-streamer succeeded (1 before any attempt)",
        handles.upstream_up,
    );
    // 0 before the first: "never" in a form alert rules can test for, rather than a series that appears late. A
    // purge remembered from an earlier run (or another sidecar) is not this run's.
    let last_purge = status
        .last_purge
        .as_ref()
        .and_then(|purge| purge.run.as_ref())
        .and_then(|run| epoch_seconds(run.completed_at));
    page.gauge(
        "last_purge_timestamp_seconds",
        "Wall-clock time (epoch seconds) of the last complete change-log purge of this run; 0 before the first",
        last_purge.unwrap_or(0.0),
    );
}
