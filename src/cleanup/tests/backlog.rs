//! The backlog of backed-up watermarks on its own: what it keeps of each page of samples, and how it follows the
//! gauge going back and recovering.

use super::*;

fn watermarks(backlog: &Backlog) -> Vec<&str> {
    backlog
        .backups()
        .iter()
        .map(|b| b.watermark.as_str())
        .collect()
}

#[test]
fn a_gauge_going_back_forgets_the_backups_above_it_until_it_reaches_its_high() {
    let mut backlog = Backlog::default();
    let first = backlog.observe(&seen(&[backup("0b", 300)]));
    assert_eq!((first.added, first.gauge), (1, Some(GaugeMove::Steady)));
    backlog.observe(&seen(&[backup("0d", 200)]));
    backlog.purged("0b");
    assert_eq!(watermarks(&backlog), ["0b", "0d"]);
    assert_eq!(backlog.regression(), None);

    // Litestream restarted on an older generation: it reports 0c.
    let back = backlog.observe(&seen(&[backup("0c", 50)]));
    assert_eq!(
        back.gauge,
        Some(GaugeMove::Regressed {
            highest: "0d".into(),
            current: "0c".into(),
            dropped: 1
        })
    );
    assert_eq!(back.added, 1);
    assert_eq!(watermarks(&backlog), ["0b", "0c"]);
    assert_eq!(backlog.regression(), Some(("0d", "0c")));
    assert_eq!(backlog.current(), Some(&backup("0c", 50)));
    assert_eq!(backlog.highest(), Some("0d"));
    // Said once: the same value again is no news, and a scrape without a usable sample changes nothing.
    assert_eq!(
        backlog.observe(&seen(&[backup("0c", 40)])).gauge,
        Some(GaugeMove::Steady)
    );
    assert_eq!(backlog.observe(&[]).gauge, None);
    assert_eq!(backlog.regression(), Some(("0d", "0c")));
    // Lower still is news again; the floor of what is tracked follows it down, the last purge stays.
    assert_eq!(
        backlog.observe(&seen(&[backup("0a", 30)])).gauge,
        Some(GaugeMove::Regressed {
            highest: "0d".into(),
            current: "0a".into(),
            dropped: 2
        })
    );
    assert_eq!(watermarks(&backlog), Vec::<&str>::new());
    assert_eq!(backlog.last_purged(), Some("0b"));
    // At or below the last purge it is not tracked, but it is still where the gauge is, with the page's time.
    assert_eq!(backlog.current(), Some(&backup("0a", 30)));

    // Between the old high and now: still below it.
    assert_eq!(
        backlog.observe(&seen(&[backup("0c", 20)])).gauge,
        Some(GaugeMove::Steady)
    );
    assert_eq!(backlog.regression(), Some(("0d", "0c")));
    // The old high again, as a new upload: tracked with its new time, not the forgotten one.
    assert_eq!(
        backlog.observe(&seen(&[backup("0d", 10)])).gauge,
        Some(GaugeMove::Recovered {
            highest: "0d".into(),
            current: "0d".into()
        })
    );
    assert_eq!(backlog.regression(), None);
    assert_eq!(backlog.backups(), [backup("0c", 20), backup("0d", 10)]);
    assert_eq!(
        backlog.observe(&seen(&[backup("0e", 5)])).gauge,
        Some(GaugeMove::Steady)
    );
    assert_eq!(backlog.highest(), Some("0e"));
}

#[test]
fn the_gauge_is_the_newest_sample_of_a_page() {
    let mut backlog = Backlog::default();
    // Two replicas: the one ahead is where the gauge is (docs/protocol.md, "A watermark counted once one replica has it").
    backlog.observe(&seen(&[backup("0c", 20), backup("0e", 10)]));
    assert_eq!(backlog.current(), Some(&backup("0e", 10)));
    assert_eq!(backlog.regression(), None);
    // The replica ahead is gone from the page: what is left is below the high.
    let gone = backlog.observe(&seen(&[backup("0c", 20)]));
    assert!(matches!(gone.gauge, Some(GaugeMove::Regressed { .. })));
    assert_eq!(watermarks(&backlog), ["0c"]);
}

fn seen(backups: &[Backup]) -> Vec<(&str, SystemTime)> {
    backups
        .iter()
        .map(|b| (b.watermark.as_str(), b.backed_up_at))
        .collect()
}

#[test]
fn newest_backup_is_the_byte_wise_maximum() {
    let mut backlog = Backlog::default();
    assert_eq!(backlog.newest(), None);
    backlog.record(seen(&[backup("0z", 3), backup("110", 2), backup("09", 1)]));
    assert_eq!(backlog.newest(), Some(&backup("110", 2)));
}

#[test]
fn first_sighting_of_a_watermark_wins() {
    let mut backlog = Backlog::default();
    assert_eq!(backlog.record(seen(&[backup("0a", 300)])), 1);
    assert_eq!(
        backlog.record(seen(&[backup("0a", 200), backup("0b", 100)])),
        1
    );
    assert_eq!(backlog.backups(), [backup("0a", 300), backup("0b", 100)]);
}

#[test]
fn nothing_at_or_below_the_last_purge_is_tracked_again() {
    let mut backlog = Backlog::default();
    backlog.record(seen(&[backup("0a", 3), backup("0b", 2), backup("0c", 1)]));
    backlog.purged("0b");
    assert_eq!(backlog.last_purged(), Some("0b"));
    let left: Vec<_> = backlog
        .backups()
        .iter()
        .map(|b| b.watermark.as_str())
        .collect();
    assert_eq!(left, ["0b", "0c"]);
    assert_eq!(
        backlog.record(seen(&[backup("0a", 9), backup("0b", 9), backup("0d", 9)])),
        1
    );
    // Byte-wise order: "110" (36) is after "0z" (35).
    backlog.purged("0z");
    assert_eq!(backlog.record(seen(&[backup("110", 10)])), 1);
}
