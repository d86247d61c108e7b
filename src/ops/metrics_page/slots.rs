//! The shard's slots in the change DB, whichever sidecar holds them: what bounds every purge.

use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::cleanup::slots::{SlotKind, SlotLimit};
use crate::cleanup::status::Status;

use super::{KindLabel, Page};

pub(super) fn register(page: &mut Page, status: &Status) {
    let live = |kind| {
        status
            .slots
            .iter()
            .filter(move |s| s.live && s.kind == kind)
    };
    // Closed here, kept across a restart, or another sidecar's: honoured until their task subscribes or their
    // restore limit passes.
    let kept = live(SlotKind::Reservation)
        .filter(|s| !(s.connected && s.holder == status.holder))
        .count();
    page.gauge(
        "reservations_kept",
        "Live reservation slots of the shard with no socket open on this sidecar (closed, kept across a restart, \
         or another sidecar's): honoured until their task subscribes or their restore limit passes",
        kept as f64,
    );
    let slots = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    let oldest = Family::<KindLabel, Gauge<f64, AtomicU64>>::default();
    for kind in [SlotKind::Reservation, SlotKind::Subscriber] {
        let label = KindLabel {
            kind: kind.as_str(),
        };
        slots.get_or_create(&label).set(live(kind).count() as f64);
        oldest
            .get_or_create(&label)
            .set(live(kind).map(|s| s.age.as_secs_f64()).fold(0.0, f64::max));
    }
    page.add(
        "slots",
        "Live slots of the shard in the change DB, whichever sidecar holds them: what bounds every purge",
        slots,
    );
    page.add(
        "slot_oldest_seconds",
        "Age of the shard's oldest live slot of each kind, whichever sidecar holds it",
        oldest,
    );
    page.flag(
        "slot_malformed",
        "1 while a live slot is not well formed (a floor that is not a watermark, or of another replica): nothing \
         is purged until it is mended or expires",
        matches!(status.bounding_slot, Some(SlotLimit::Malformed { .. })),
    );
}
