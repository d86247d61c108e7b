//! Litestream's metrics page.

use super::*;

const ZERO_FORK_PAGE: &str = include_str!("../../fixtures/litestream/zero-fork.prom");
const UPSTREAM_PAGE: &str = include_str!("../../fixtures/litestream/upstream-0.5.17.prom");
const FAMILY: &str = page::PROGRESS_FAMILY;

fn label_value() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        3 => select(&["/var/lib/zero/replica.db", "s3", "file", "", "/d"][..]).prop_map(String::from),
        3 => watermark(),
        1 => select(&[r"a\\b", r#"a\"b"#, r"a\nb", r"bad\t", "}{,=", "a b", "\u{e9}"][..]).prop_map(String::from),
        1 => "[ -~]{0,12}".prop_map(|s| s.replace('\\', r"\\").replace('"', r#"\""#)),
    ]
}

fn sample_line() -> impl Strategy<Value = String> + Clone {
    let name = prop_oneof![
        4 => select(&["db", "name", "watermark"][..]),
        1 => select(&["mode", "_x", "1bad", "", "db "][..]),
    ];
    let labels = vec((name, label_value(), ws_choice()), 0..5).prop_map(|labels| {
        let labels: Vec<String> = labels
            .into_iter()
            .map(|(name, value, s)| format!("{name}{s}={s}\"{value}\""))
            .collect();
        labels
    });
    let value = prop_oneof![
        3 => (1_000_000_000u64..4_000_000_000).prop_map(|s| format!("{s}")),
        2 => select(&[
            "1.7646785643512912e+09", "0", "-0", "NaN", "+Inf", "-Inf", "1e8", "-5", "abc", "", "1e400",
            "0x10", "9999999999999999999999",
        ][..]).prop_map(String::from),
        1 => any::<f64>().prop_map(|f| f.to_string()),
    ];
    let timestamp =
        prop_oneof![4 => Just(""), 1 => select(&[" 1764678564000", " -1", " x", " 1 2"][..])];
    (
        ws_choice(),
        proptest::option::of(labels),
        select(&[" ", "\t", "  "][..]),
        value,
        timestamp,
        any::<bool>(),
    )
        .prop_map(|(lead, labels, gap, value, timestamp, trailing_comma)| {
            let labels = labels.map_or(String::new(), |labels| {
                let comma = if trailing_comma && !labels.is_empty() {
                    ","
                } else {
                    ""
                };
                format!("{{{}{comma}}}", labels.join(","))
            });
            format!("{lead}{FAMILY}{labels}{gap}{value}{timestamp}")
        })
}

fn family_line() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => sample_line(),
        1 => select(&[
            "# HELP litestream_replica_progress The last replicated watermark and time of replication",
            "#HELP\tlitestream_replica_progress",
            "# TYPE litestream_replica_progress gauge",
            "# TYPE litestream_replica_progress GAUGE",
            "# TYPE litestream_replica_progress counter",
            "# TYPE litestream_replica_progress",
            "  # TYPE litestream_replica_progress  gauge ",
            "# TYPE litestream_replica_progress_total counter",
            "litestream_replica_progress",
            "litestream_replica_progressx 1",
            "# EOF",
            "<html>",
            "",
        ][..]).prop_map(String::from),
    ]
}

/// Litestream's pages with family lines put anywhere, lines ending in LF or CRLF, sometimes no final newline.
fn page() -> impl Strategy<Value = Vec<u8>> + Clone {
    let built = (
        select(&[ZERO_FORK_PAGE, UPSTREAM_PAGE, ""][..]),
        prop_oneof![3 => Just(0usize), 1 => 0usize..200],
        vec((any::<Index>(), family_line()), 0..8),
        select(&["\n", "\n", "\r\n"][..]),
        any::<bool>(),
    )
        .prop_map(|(fixture, drop_lines, insert, ending, final_newline)| {
            let mut lines: Vec<String> =
                fixture.lines().skip(drop_lines).map(String::from).collect();
            for (at, line) in insert {
                let at = at.index(lines.len() + 1);
                lines.insert(at, line);
            }
            let mut page = lines.join(ending);
            if final_newline && !page.is_empty() {
                page.push_str(ending);
            }
            page.into_bytes()
        });
    prop_oneof![
        1 => bytes(b"{}\"=,\\ \t\n\r#litestream_replica_progress", 400),
        1 => vec(family_line(), 0..12).prop_map(|lines| lines.join("\n").into_bytes()),
        4 => built.clone(),
        2 => mutated(built, b"{}\"=,\\ \t\n\r#"),
    ]
}

fn filter() -> impl Strategy<Value = Filter> + Clone {
    (
        proptest::option::of(select(&["/var/lib/zero/replica.db", "/d", ""][..])),
        proptest::option::of(select(&["s3", "file"][..])),
    )
        .prop_map(|(db, name)| Filter {
            db: db.map(String::from),
            name: name.map(String::from),
        })
}

/// The fixed part of the page bounds. `prometheus_parse` classifies lines with regular expressions whose lazy DFAs
/// keep the states they discover for all later calls, on every thread: the cache grows as new kinds of lines come,
/// up to the regex crate's own cap, which is no cost of any one page.
const PAGE_FIXED: usize = 256 << 10;

/// Peak heap of [`page::parse_progress`] per input byte. A sample line of the family as short as
/// `litestream_replica_progress{a=""} 1` (35 bytes) holds a label map (a B-tree node of about 540 bytes), its
/// candidate entry and an entry in the duplicate index; a malformed one a warning quoting up to 160 bytes of it.
const PARSE_PER_BYTE: usize = 32;

/// Parse, strip and clamp; the proxy's output is a copy of the page with the family cut out and at most one
/// sample added.
#[test]
fn litestream_page() {
    let purged_at = UNIX_EPOCH + Duration::from_secs(1_764_678_564);
    fuzz(
        "litestream_page",
        (page().prop_map(Text), filter()),
        |(page, filter)| {
            let len = page.len();
            let stripped = bounded("strip_progress_family", len, (64, 1), || {
                filter::strip_progress_family(&page)
            })?;
            prop_assert!(stripped.len() <= len);
            prop_assert!(matches!(
                filter::strip_progress_family(&stripped),
                Cow::Borrowed(_)
            ));
            let hidden = filter::clamp_progress_family(&page, &filter, None, None);
            prop_assert_eq!(&hidden[..], &stripped[..]);
            let clamped = bounded(
                "clamp_progress_family",
                len,
                (PAGE_FIXED, PARSE_PER_BYTE + 4),
                || {
                    filter::clamp_progress_family(
                        &page,
                        &filter,
                        Some(("5bt456o", purged_at)),
                        None,
                    )
                },
            )?;
            let Ok(text) = std::str::from_utf8(&page) else {
                prop_assert_eq!(&clamped[..], &stripped[..]);
                return Ok(());
            };
            let parsed = bounded("parse_progress", len, (PAGE_FIXED, PARSE_PER_BYTE), || {
                page::parse_progress(text, &filter)
            })?;
            let parsed = match parsed {
                Ok(parsed) => parsed,
                Err(err) => {
                    message_is_clear("parse_progress", &err.to_string())?;
                    prop_assert!(matches!(err, page::ScrapeError::Parse(_)));
                    prop_assert_eq!(&clamped[..], &stripped[..]);
                    return Ok(());
                }
            };
            for warning in &parsed.warnings {
                message_is_clear("parse_progress warning", warning)?;
            }
            for progress in &parsed.progress {
                prop_assert!(page::is_lexi_version(&progress.watermark));
                prop_assert!(
                    progress.backed_up_at
                        >= UNIX_EPOCH + Duration::from_secs_f64(page::MIN_PLAUSIBLE_BACKUP_SECS)
                );
                prop_assert!(filter.matches(&progress.db, &progress.name));
            }
            // What the proxy serves shows no progress, or exactly the purged watermark for the replica's own series.
            if let Ok(stripped) = std::str::from_utf8(&stripped) {
                if let Ok(seen) = page::parse_progress(stripped, &filter) {
                    prop_assert!(seen.progress.is_empty(), "{:?}", seen.progress);
                }
            }
            // Without a sample of its own the replica gets none: the family is only removed.
            let Some(real) = parsed.progress.first() else {
                prop_assert_eq!(&clamped[..], &stripped[..]);
                return Ok(());
            };
            let clamped_text = std::str::from_utf8(&clamped).expect("a UTF-8 page stays UTF-8");
            let seen = page::parse_progress(clamped_text, &filter).map_err(|e| {
                TestCaseError::fail(format!("the clamped page does not parse: {e}"))
            })?;
            prop_assert_eq!(seen.progress.len(), 1, "{:?}", seen);
            let shown = &seen.progress[0];
            prop_assert_eq!(shown.watermark.as_str(), "5bt456o");
            prop_assert_eq!(&shown.db, &real.db);
            prop_assert_eq!(&shown.name, &real.name);
            let off = shown
                .backed_up_at
                .duration_since(purged_at)
                .unwrap_or_else(|e| e.duration());
            prop_assert!(off < Duration::from_millis(1));
            Ok(())
        },
    );
}
