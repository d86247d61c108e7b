//! Restore drills as the drill task last ran them (it runs whatever the configuration; only its schedule can be
//! off).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;

use crate::cleanup::status::{DrillOutcome, DrillStatus};
use crate::litestream::drill::{Failure, Proof};

use super::{epoch_seconds, KindLabel, Page};

pub(super) fn register(page: &mut Page, drills: &DrillStatus, last_proof: Option<&Proof>) {
    page.gauge(
        "drill_interval_seconds",
        "backup.drill_interval: how often a restore drill runs; 0 when drills run only on demand (\"off\")",
        drills.interval.map_or(0.0, |interval| interval.as_secs_f64()),
    );
    page.flag(
        "drill_running",
        "1 while a restore drill runs",
        drills.running_since.is_some(),
    );
    page.counter(
        "drill_runs",
        "Restore drills finished, whatever their outcome",
        drills.runs,
    );
    // A restore that reached less than the claim stands until a drill reaches it again, whatever the drills in
    // between found.
    let failing_kind = match (&drills.restored_less, &drills.last) {
        (Some(failure), _) | (None, Some(DrillOutcome::Failed { failure, .. })) => {
            Some(failure.kind())
        }
        (None, Some(DrillOutcome::Proved(_)) | None) => None,
    };
    let failures = Family::<KindLabel, Counter>::default();
    let failing = Family::<KindLabel, Gauge>::default();
    for kind in Failure::KINDS {
        failures
            .get_or_create(&KindLabel { kind })
            .inc_by(drills.failures.get(kind).copied().unwrap_or(0));
        failing
            .get_or_create(&KindLabel { kind })
            .set((failing_kind == Some(kind)) as i64);
    }
    page.add(
        "drill_failures",
        "Restore drills that proved nothing, by kind: the backup's (restore, nothing, check, not_a_replica, \
         other_replica, restored_less) or the drill's own (timeout, disk, setup)",
        failures,
    );
    page.add(
        "drill_failing",
        "1 for the kind of the latest restore drill's failure while the latest drill failed (restored_less: until a \
         drill restores as far as that claim again), else 0",
        failing,
    );
    // 0 before the first, as last_purge_timestamp_seconds.
    page.gauge(
        "drill_last_success_timestamp_seconds",
        "Wall-clock time (epoch seconds) the latest restore drill that proved the backup finished; 0 before the \
         first of this run",
        last_proof
            .and_then(|proof| epoch_seconds(proof.finished))
            .unwrap_or(0.0),
    );
    if let Some(proof) = last_proof {
        page.add(
            "drill_proven_watermark",
            "What the latest restore drill that proved the backup restored (value 1; the labels are the restored \
             replica's stateVersion and replicaVersion)",
            Info::new(vec![
                ("watermark", proof.watermark.clone()),
                ("replica_version", proof.replica_version.clone()),
            ]),
        );
        page.gauge(
            "drill_restore_seconds",
            "Seconds litestream restore took in the latest restore drill that proved the backup",
            proof.restore_took.as_secs_f64(),
        );
        page.gauge(
            "drill_check_seconds",
            "Seconds SQLite's check of the restored database (backup.drill_check) took in the latest restore drill \
             that proved the backup",
            proof.check_took.as_secs_f64(),
        );
        page.integer(
            "drill_restored_bytes",
            "Size in bytes of the database restored by the latest restore drill that proved the backup",
            i64::try_from(proof.bytes).unwrap_or(i64::MAX),
        );
    }
}
