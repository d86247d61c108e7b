//! The backup destination as the monitor last listed it (`backup.verify`; the page has none of this while it is off).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::cleanup::status::BackupStatus;
use crate::litestream::destination::ErrorKind;

use super::{epoch_seconds, KindLabel, Page};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LayoutLabel {
    layout: &'static str,
}

/// Every [`crate::litestream::layout::Layout::kind`], each a series of `backup_layout` from the first listing on.
pub(super) const LAYOUTS: [&str; 6] = [
    "empty",
    "restorable",
    "no_snapshot",
    "index_gap",
    "unreadable_name",
    "ltx",
];

pub(super) fn register(page: &mut Page, backup: &BackupStatus) {
    page.flag(
        "backup_verified",
        "1 when the backup destination's newest generation restores and holds an object written at or after \
         litestream's newest claimed backup time, else 0",
        backup.verified,
    );
    // The newest object at the last listing that found one.
    if let Some(newest) = backup
        .listing
        .as_ref()
        .and_then(|listing| listing.newest)
        .and_then(epoch_seconds)
    {
        page.gauge(
            "backup_destination_newest_timestamp_seconds",
            "Last-modified time of the newest object in the backup destination (epoch seconds)",
            newest,
        );
    }
    page.flag(
        "backup_stale",
        "1 while the backup destination's newest object is more than backup.stale_after older than \
         litestream's newest claimed backup",
        backup.stale.is_some(),
    );
    let errors = Family::<KindLabel, Counter>::default();
    for kind in ErrorKind::ALL {
        errors
            .get_or_create(&KindLabel {
                kind: kind.as_str(),
            })
            .inc_by(backup.errors.get(&kind).copied().unwrap_or(0));
    }
    page.add(
        "backup_verification_errors",
        "Listings of the backup destination that failed, by kind (timeout, denied, not_found, other)",
        errors,
    );
    // Every layout has a series once something was listed, so that an alert on a broken one sees it end; none
    // before that.
    let layout = Family::<LayoutLabel, Gauge>::default();
    if let Some(listing) = &backup.listing {
        let current = listing.layout.kind();
        for kind in LAYOUTS {
            layout
                .get_or_create(&LayoutLabel { layout: kind })
                .set((kind == current) as i64);
        }
    }
    page.add(
        "backup_layout",
        "1 for what the last listing of the backup destination says of a restore of its newest generation \
         (empty, restorable, no_snapshot, index_gap, unreadable_name, ltx), 0 for the others; no series before \
         a listing",
        layout,
    );
}
