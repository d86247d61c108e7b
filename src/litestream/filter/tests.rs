use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::litestream::page::tests::{parse, FORK, UPSTREAM};

// --- strip_progress_family

fn strip(page: &str) -> String {
    String::from_utf8(strip_progress_family(page.as_bytes()).into_owned()).unwrap()
}

#[test]
fn strip_removes_exactly_lines_103_to_105_of_the_fork_page() {
    let expected: String = FORK
        .split_inclusive('\n')
        .enumerate()
        .filter(|(index, _)| !(102..=104).contains(index))
        .map(|(_, line)| line)
        .collect();
    assert_eq!(strip(FORK), expected);
    assert_eq!(
        FORK.len() - expected.len(),
        FORK.split_inclusive('\n')
            .skip(102)
            .take(3)
            .map(str::len)
            .sum::<usize>()
    );
    let stripped = parse(&expected);
    assert!(stripped.progress.is_empty() && stripped.warnings.is_empty());
    assert_eq!(stripped.db_bytes, parse(FORK).db_bytes);
}

// --- clamp_progress_family

fn clamp(page: &str, filter: &Filter, through: Option<(&str, SystemTime)>) -> String {
    String::from_utf8(clamp_progress_family(page.as_bytes(), filter, through, None).into_owned())
        .unwrap()
}

#[test]
fn clamp_shows_one_sample_at_the_purged_watermark_with_its_backup_time() {
    let at = UNIX_EPOCH + Duration::from_millis(1_764_700_000_250);
    let page = clamp(FORK, &Filter::default(), Some(("0b", at)));
    // Everything else is kept byte for byte; the family is appended after it.
    assert!(page.starts_with(&strip(FORK)), "{page}");
    let parsed = parse(&page);
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(parsed.progress.len(), 1, "{page}");
    let progress = &parsed.progress[0];
    assert_eq!(progress.watermark, "0b");
    assert_eq!(progress.backed_up_at, at);
    // The real sample's other labels stay, so Zero reads it as the same replica.
    let real = parse(FORK).progress.remove(0);
    assert_eq!((&progress.db, &progress.name), (&real.db, &real.name));
    assert_eq!(page.matches(PROGRESS_FAMILY).count(), 3, "{page}");
}

#[test]
fn clamp_hides_the_family_until_something_is_purged_or_when_no_sample_matches() {
    assert_eq!(clamp(FORK, &Filter::default(), None), strip(FORK));
    let other = Filter {
        db: Some("/elsewhere.db".into()),
        name: None,
    };
    assert_eq!(
        clamp(
            FORK,
            &other,
            Some(("0b", UNIX_EPOCH + Duration::from_secs(1_764_700_000)))
        ),
        strip(FORK)
    );
    // An upstream litestream 0.5 page has no family to clamp: nothing is invented.
    assert_eq!(
        clamp(UPSTREAM, &Filter::default(), Some(("0b", UNIX_EPOCH))),
        UPSTREAM
    );
}

#[test]
fn clamp_goes_before_an_openmetrics_eof() {
    let page = format!("{FORK}# EOF\n");
    let clamped = clamp(
        &page,
        &Filter::default(),
        Some(("0b", UNIX_EPOCH + Duration::from_secs(1_764_700_000))),
    );
    assert!(clamped.ends_with("1764700000\n# EOF\n"), "{clamped}");
}

#[test]
fn strip_leaves_the_upstream_page_untouched_and_borrowed() {
    let stripped = strip_progress_family(UPSTREAM.as_bytes());
    assert!(matches!(stripped, Cow::Borrowed(_)));
    assert_eq!(&*stripped, UPSTREAM.as_bytes());
}

#[test]
fn strip_keeps_crlf_endings() {
    let crlf = FORK.replace('\n', "\r\n");
    assert_eq!(strip(&crlf), strip(FORK).replace('\n', "\r\n"));
}

#[test]
fn strip_keeps_a_missing_final_newline() {
    assert_eq!(strip("a 1\nb 2"), "a 1\nb 2");
    assert_eq!(
        strip("a 1\nlitestream_replica_progress{watermark=\"0a\"} 1"),
        "a 1\n"
    );
    assert_eq!(strip("litestream_replica_progress 1\nb 2"), "b 2");
    assert_eq!(strip("litestream_replica_progress 1"), "");
}

#[test]
fn strip_keeps_similarly_named_families_and_comments() {
    let kept = "# HELP litestream_replica_progress_total x\n\
                # TYPE litestream_replica_progress_total counter\n\
                litestream_replica_progress_total{db=\"/d\"} 3\n\
                litestream_replica_progressx 1\n\
                xlitestream_replica_progress 1\n\
                # litestream_replica_progress is hidden from Zero\n\
                # HELPER litestream_replica_progress\n\
                litestream_replica_progress\n";
    assert_eq!(strip(kept), kept);
}

#[test]
fn strip_removes_loosely_written_family_lines() {
    let page = "a 1\n\
                #\tTYPE  litestream_replica_progress gauge\n\
                # HELP litestream_replica_progress\n\
                \x20 litestream_replica_progress{watermark=\"0a\"} 1\n\
                litestream_replica_progress\t1\n\
                b 2\n";
    assert_eq!(strip(page), "a 1\nb 2\n");
}

/// Lines to build pages from, and whether each belongs to the family.
const LINES: &[(&str, bool)] = &[
    (
        "# HELP litestream_replica_progress The last replicated watermark and time of replication",
        true,
    ),
    ("# TYPE litestream_replica_progress gauge", true),
    (
        "litestream_replica_progress{db=\"/d\",name=\"s3\",watermark=\"0a\"} 1.7e9",
        true,
    ),
    ("litestream_replica_progress 1", true),
    ("litestream_replica_progress\t2", true),
    ("  litestream_replica_progress{} 3", true),
    ("# HELP litestream_replica_progress_total x", false),
    ("# TYPE litestream_replica_progress_total counter", false),
    ("litestream_replica_progress_total 3", false),
    ("litestream_replica_progressx 1", false),
    ("litestream_replica_progress", false),
    ("# a comment about litestream_replica_progress", false),
    ("litestream_db_size{db=\"/d\"} 1.4848e+08", false),
    ("", false),
    ("#", false),
    ("\u{e9}litestream_replica_progress 1", false),
];

proptest! {
    #[test]
    fn strip_equals_filtering_the_family_lines(
        picks in proptest::collection::vec((0..LINES.len(), any::<bool>()), 0..40),
        final_newline in any::<bool>(),
    ) {
        let mut page = String::new();
        let mut expected = String::new();
        for (index, &(pick, crlf)) in picks.iter().enumerate() {
            let (text, family) = LINES[pick];
            let ending = match (index + 1 == picks.len() && !final_newline, crlf) {
                (true, _) => "",
                (false, true) => "\r\n",
                (false, false) => "\n",
            };
            let line = format!("{text}{ending}");
            page.push_str(&line);
            if !family {
                expected.push_str(&line);
            }
        }
        prop_assert_eq!(strip(&page), expected);
    }
}

#[test]
fn a_page_without_a_gauge_gets_a_clamped_sample_only_with_a_fallback() {
    let page = "# HELP litestream_db_size The current size of the real DB\n# TYPE litestream_db_size gauge\n\
                litestream_db_size{db=\"/var/lib/zero/replica.db\"} 16384\n";
    let at = UNIX_EPOCH + Duration::from_secs(1_746_600_000);
    let filter = Filter::default();
    let fallback = Fallback { name: "s3".into() };
    assert_eq!(
        String::from_utf8(
            clamp_progress_family(page.as_bytes(), &filter, Some(("0b", at)), None).into_owned()
        )
        .unwrap(),
        page
    );
    let made = String::from_utf8(
        clamp_progress_family(page.as_bytes(), &filter, Some(("0b", at)), Some(&fallback))
            .into_owned(),
    )
    .unwrap();
    assert_eq!(
        made,
        format!(
            "{page}# HELP litestream_replica_progress The last replicated watermark and time of replication\n\
             # TYPE litestream_replica_progress gauge\n\
             litestream_replica_progress{{db=\"/var/lib/zero/replica.db\",name=\"s3\",watermark=\"0b\"}} 1746600000\n"
        )
    );
    // Nothing purged yet: nothing shown.
    assert_eq!(
        String::from_utf8(
            clamp_progress_family(page.as_bytes(), &filter, None, Some(&fallback)).into_owned()
        )
        .unwrap(),
        page
    );
}
