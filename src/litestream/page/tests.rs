use std::net::SocketAddr;

use http_body_util::Full;
use hyper::Response;

use super::*;
use crate::net::client::tests::{fixture_server, serve};
use bytes::Bytes;

fn client(addr: SocketAddr, max_bytes: usize) -> HttpClient {
    let url: Uri = format!("http://{addr}/metrics").parse().unwrap();
    HttpClient::new(url, Duration::from_secs(5), max_bytes).unwrap()
}

pub(crate) const FORK: &str = include_str!("../../../tests/fixtures/litestream/zero-fork.prom");
pub(crate) const UPSTREAM: &str =
    include_str!("../../../tests/fixtures/litestream/upstream-0.5.17.prom");
pub(crate) const TYPE_GAUGE: &str = "# TYPE litestream_replica_progress gauge\n";

pub(crate) fn parse(page: &str) -> Parsed {
    parse_progress(page, &Filter::default()).expect("parses")
}

/// A page with the gauge's TYPE line and one sample line per `samples` entry (`labels`, `value`).
pub(crate) fn page(samples: &[(&str, &str)]) -> String {
    let mut page = String::from(TYPE_GAUGE);
    for (labels, value) in samples {
        page.push_str(&format!(
            "litestream_replica_progress{{{labels}}} {value}\n"
        ));
    }
    page
}

pub(crate) fn at(secs: f64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs_f64(secs)
}

pub(crate) fn filter(db: Option<&str>, name: Option<&str>) -> Filter {
    Filter {
        db: db.map(Into::into),
        name: name.map(Into::into),
    }
}

pub(crate) const S3: &str = r#"db="/data/replica.db",name="s3",watermark="0a""#;

// --- lexi-versions

#[test]
fn lexi_version_accepts_canonical_forms() {
    for s in [
        "00",
        "0a",
        "0z",
        "110",
        "2zzz",
        "618ocqq8",
        "718sh0nk8",
        "5bt456o",
        "c3w5e11264sgsg",
    ] {
        assert!(is_lexi_version(s), "{s}");
    }
    let longest = format!("z{}", "z".repeat(36));
    assert!(is_lexi_version(&longest));
}

#[test]
fn lexi_version_rejects_malformed_strings() {
    let too_long = format!("z{}", "1".repeat(37));
    for s in [
        "",
        "0",
        "1a",
        "0A",
        "01x",
        "100",
        "2zz",
        "0-",
        " 0a",
        "0a ",
        "\u{e9}0",
        "A0",
        too_long.as_str(),
    ] {
        assert!(!is_lexi_version(s), "{s:?}");
    }
}

// --- the fixtures

#[test]
fn fork_page_yields_its_one_progress_sample() {
    let parsed = parse(FORK);
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(
        parsed.progress,
        vec![Progress {
            watermark: "5bt456o".into(),
            backed_up_at: at(1.7646785643512912e9),
            db: "/var/lib/zero/replica.db".into(),
            name: "s3".into(),
        }]
    );
}

#[test]
fn pages_tell_when_litestream_started_and_how_big_the_database_is() {
    let fork = parse(FORK);
    assert_eq!(fork.process_started, Some(1.7962147507e9));
    assert_eq!(fork.db_bytes, Some(148_480_000));
    let upstream = parse(UPSTREAM);
    assert!(upstream.process_started.is_some());
    // Two databases: the larger one bounds a restore; HELP, TYPE and unusable values are not facts.
    let page = "# HELP process_start_time_seconds x\n# TYPE process_start_time_seconds gauge\n\
                litestream_db_size{db=\"/a\"} 4096\nlitestream_db_size{db=\"/b\"} 8.192e+03\n\
                litestream_db_size{db=\"/c\"} NaN\nprocess_start_time_seconds -1\n";
    let parsed = parse(page);
    assert_eq!(parsed.db_bytes, Some(8192));
    assert_eq!(parsed.process_started, None);
    assert_eq!(parse(TYPE_GAUGE).db_bytes, None);
}

#[test]
fn fork_page_time_round_trips_to_the_exact_float() {
    let parsed = parse(FORK);
    let since_epoch = parsed.progress[0]
        .backed_up_at
        .duration_since(UNIX_EPOCH)
        .unwrap();
    assert_eq!(since_epoch.as_secs_f64(), 1.7646785643512912e9);
    assert_eq!(since_epoch.as_secs(), 1_764_678_564);
}

#[test]
fn upstream_page_has_no_progress_and_no_warning() {
    let parsed = parse(UPSTREAM);
    assert!(parsed.progress.is_empty(), "{:?}", parsed.progress);
    assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
}

#[test]
fn crlf_page_parses_like_lf() {
    let crlf = FORK.replace('\n', "\r\n");
    assert_eq!(parse(&crlf), parse(FORK));
}

// --- bad values

#[test]
fn unusable_values_become_warnings() {
    for (value, expect) in [
        ("NaN", "NaN"),
        ("+Inf", "infinite"),
        ("-Inf", "infinite"),
        ("Inf", "infinite"),
        ("-1.7e9", "before 1970"),
        ("0", "time 0"),
        ("-0", "time 0"),
        ("0e0", "time 0"),
        ("1", "before 2001"),
        ("9.99e8", "before 2001"),
        ("1e300", "out of range"),
        ("abc", "not a number"),
        ("0x1p4", "not a number"),
    ] {
        let parsed = parse(&page(&[(S3, value)]));
        assert_eq!(parsed.progress, vec![], "{value}");
        assert_eq!(parsed.warnings.len(), 1, "{value}: {:?}", parsed.warnings);
        assert!(
            parsed.warnings[0].contains(expect),
            "{value}: {}",
            parsed.warnings[0]
        );
        assert!(
            parsed.warnings[0].starts_with("line 2: "),
            "{}",
            parsed.warnings[0]
        );
    }
}

#[test]
fn go_float_forms_are_read_exactly() {
    for (value, secs) in [
        ("1.746600000123456e+09", 1.746600000123456e9),
        ("1746600000.5", 1_746_600_000.5),
        ("1746600000", 1_746_600_000.0),
        ("+1.7466e9", 1.7466e9),
        ("1.7466E+09", 1.7466e9),
    ] {
        let parsed = parse(&page(&[(S3, value)]));
        assert_eq!(parsed.warnings, Vec::<String>::new(), "{value}");
        assert_eq!(parsed.progress[0].backed_up_at, at(secs), "{value}");
    }
}

// --- bad watermarks and labels

#[test]
fn invalid_watermark_becomes_a_warning() {
    for watermark in ["0", "1a", "0A", "100", "not-a-version"] {
        let labels = format!(r#"db="/d",name="s3",watermark="{watermark}""#);
        let parsed = parse(&page(&[(&labels, "1.7e9")]));
        assert_eq!(parsed.progress, vec![]);
        assert_eq!(parsed.warnings.len(), 1);
        assert!(
            parsed.warnings[0].contains("is not a lexi-version"),
            "{}",
            parsed.warnings[0]
        );
    }
}

#[test]
fn missing_or_empty_watermark_becomes_a_warning() {
    for labels in [r#"db="/d",name="s3""#, r#"db="/d",name="s3",watermark="""#] {
        let parsed = parse(&page(&[(labels, "1.7e9")]));
        assert_eq!(parsed.progress, vec![]);
        assert_eq!(parsed.warnings.len(), 1);
        assert!(
            parsed.warnings[0].contains("no watermark label"),
            "{}",
            parsed.warnings[0]
        );
    }
    let parsed = parse(&format!("{TYPE_GAUGE}litestream_replica_progress 1.7e9\n"));
    assert_eq!(parsed.progress, vec![]);
    assert!(parsed.warnings[0].contains("no watermark label"));
}

#[test]
fn missing_db_and_name_read_as_empty() {
    let parsed = parse(&page(&[(r#"watermark="0a""#, "1.7e9")]));
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(
        (
            parsed.progress[0].db.as_str(),
            parsed.progress[0].name.as_str()
        ),
        ("", "")
    );
}

#[test]
fn escaped_label_values_are_decoded() {
    let labels = r#"db="/srv/a \"b\"\\c\nd",name="s3",watermark="0a""#;
    let parsed = parse(&page(&[(labels, "1.7e9")]));
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(parsed.progress[0].db, "/srv/a \"b\"\\c\nd");
}

#[test]
fn label_values_may_hold_separators_and_braces() {
    let labels = r#"db="/srv/x,y=z{1}/r\\\\.db",name="s3",watermark="0a""#;
    let parsed = parse(&page(&[(labels, "1.7e9")]));
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(parsed.progress[0].db, r"/srv/x,y=z{1}/r\\.db");
}

#[test]
fn non_ascii_label_values_are_kept() {
    let parsed = parse(&page(&[(
        r#"db="/données/réplica.db",name="s3",watermark="0a""#,
        "1.7e9",
    )]));
    assert_eq!(parsed.progress[0].db, "/données/réplica.db");
}

/// Why the family is not read through `prometheus_parse::Scrape`: its label values keep escapes, and a comma
/// inside a value splits it.
#[test]
fn prometheus_parse_keeps_label_escapes_undecoded() {
    let page = "# TYPE m gauge\nm{db=\"a\\\"b\",path=\"x,y\"} 1\n";
    let scrape = prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))).unwrap();
    assert_eq!(scrape.samples[0].labels.get("db"), Some("a\\\"b"));
    assert_eq!(scrape.samples[0].labels.get("path"), Some("x"));
}

#[test]
fn labels_tolerate_blanks_trailing_comma_and_any_order() {
    let line =
        "litestream_replica_progress { watermark = \"0a\" ,\tname=\"s3\", db=\"/d\", } 1.7e9\n";
    let parsed = parse(&format!("{TYPE_GAUGE}{line}"));
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(parsed.progress[0].name, "s3");
}

#[test]
fn timestamp_after_the_value_is_accepted_and_ignored() {
    let parsed = parse(&page(&[(S3, "1.7e9 1395066363000")]));
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(parsed.progress[0].backed_up_at, at(1.7e9));
}

#[test]
fn malformed_sample_lines_become_warnings() {
    for (line, problem) in [
        (
            r#"litestream_replica_progress{db="/d",watermark="0a" 1.7e9"#,
            "expected ',' or '}'",
        ),
        (
            r#"litestream_replica_progress{db="/d",watermark="0a"#,
            "unterminated label value",
        ),
        (
            r#"litestream_replica_progress{db="/d",watermark="0a","#,
            "unterminated label set",
        ),
        (r#"litestream_replica_progress{db=/d} 1.7e9"#, "not quoted"),
        (
            r#"litestream_replica_progress{db"/d"} 1.7e9"#,
            "expected '='",
        ),
        (
            r#"litestream_replica_progress{9db="/d"} 1.7e9"#,
            "invalid label name",
        ),
        (
            r#"litestream_replica_progress{db="a\tb",watermark="0a"} 1.7e9"#,
            "invalid escape",
        ),
        (
            r#"litestream_replica_progress{db="a",db="b",watermark="0a"} 1.7e9"#,
            "label given twice",
        ),
        (r#"litestream_replica_progress{watermark="0a"}"#, "no value"),
        (
            r#"litestream_replica_progress{watermark="0a"} 1.7e9 soon"#,
            "invalid timestamp",
        ),
        (
            r#"litestream_replica_progress{watermark="0a"} 1.7e9 1 2"#,
            "unexpected text",
        ),
    ] {
        let parsed = parse(&format!("{TYPE_GAUGE}{line}\n"));
        assert_eq!(parsed.progress, vec![], "{line}");
        assert_eq!(parsed.warnings.len(), 1, "{line}: {:?}", parsed.warnings);
        assert!(
            parsed.warnings[0].contains(problem),
            "{line}: {}",
            parsed.warnings[0]
        );
        assert!(
            parsed.warnings[0].starts_with("line 2: malformed"),
            "{}",
            parsed.warnings[0]
        );
    }
}

// --- type

#[test]
fn family_of_another_type_yields_nothing_and_one_warning() {
    let page = "# TYPE litestream_replica_progress counter\n\
                litestream_replica_progress{watermark=\"0a\"} 1.7e9\n\
                litestream_replica_progress{watermark=\"0b\"} 1.7e9\n";
    let parsed = parse(page);
    assert_eq!(parsed.progress, vec![]);
    assert_eq!(parsed.warnings.len(), 1, "{:?}", parsed.warnings);
    assert!(parsed.warnings[0]
        .contains("2 litestream_replica_progress sample(s) ignored: TYPE \"counter\""));
}

#[test]
fn untyped_family_yields_nothing_and_one_warning() {
    for page in [
        "litestream_replica_progress{watermark=\"0a\"} 1.7e9\n",
        "litestream_replica_progress{watermark=\"0a\"} 1.7e9\n# TYPE litestream_replica_progress gauge\n",
    ] {
        let parsed = parse(page);
        assert_eq!(parsed.progress, vec![]);
        assert_eq!(parsed.warnings.len(), 1, "{:?}", parsed.warnings);
        assert!(parsed.warnings[0].contains("no TYPE line before them"), "{}", parsed.warnings[0]);
    }
    let parsed = parse("# TYPE litestream_replica_progress untyped\nlitestream_replica_progress{watermark=\"0a\"} 1.7e9\n");
    assert_eq!(parsed.progress, vec![]);
    assert!(parsed.warnings[0].contains("TYPE \"untyped\""));
}

#[test]
fn type_keyword_is_case_insensitive_like_go_and_zero() {
    let parsed = parse("# TYPE litestream_replica_progress GAUGE\nlitestream_replica_progress{watermark=\"0a\"} 1.7e9\n");
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(parsed.progress.len(), 1);
}

#[test]
fn similarly_named_families_are_not_read() {
    let page = "# TYPE litestream_replica_progress_total gauge\n\
                litestream_replica_progress_total{watermark=\"0a\"} 1.7e9\n\
                # TYPE litestream_replica_progressx gauge\n\
                litestream_replica_progressx{watermark=\"0a\"} 1.7e9\n";
    assert_eq!(parse(page), Parsed::default());
}

// --- duplicates and several series

#[test]
fn duplicated_series_is_dropped_entirely_with_one_warning() {
    let other = r#"db="/data/replica.db",name="file",watermark="0b""#;
    // The same label set, written in another order.
    let reordered = r#"watermark="0a",name="s3",db="/data/replica.db""#;
    let parsed = parse(&page(&[
        (S3, "1.7e9"),
        (other, "1.7e9"),
        (reordered, "1.8e9"),
    ]));
    assert_eq!(parsed.progress.len(), 1);
    assert_eq!(parsed.progress[0].name, "file");
    assert_eq!(parsed.warnings.len(), 1, "{:?}", parsed.warnings);
    assert!(
        parsed.warnings[0].starts_with("line 2: series "),
        "{}",
        parsed.warnings[0]
    );
    assert!(
        parsed.warnings[0].contains("appears 2 times (lines 2, 4)"),
        "{}",
        parsed.warnings[0]
    );
}

#[test]
fn duplicate_is_dropped_even_when_one_copy_is_invalid() {
    let parsed = parse(&page(&[(S3, "0"), (S3, "1.7e9")]));
    assert_eq!(parsed.progress, vec![]);
    assert_eq!(parsed.warnings.len(), 1);
    assert!(parsed.warnings[0].contains("appears 2 times"));
}

#[test]
fn one_replica_with_two_watermarks_keeps_both() {
    let newer = r#"db="/data/replica.db",name="s3",watermark="0b""#;
    let parsed = parse(&page(&[(S3, "1.7e9"), (newer, "1.8e9")]));
    assert_eq!(parsed.warnings, Vec::<String>::new());
    let got: Vec<_> = parsed
        .progress
        .iter()
        .map(|p| (p.watermark.as_str(), p.backed_up_at))
        .collect();
    assert_eq!(got, vec![("0a", at(1.7e9)), ("0b", at(1.8e9))]);
}

// --- filter

#[test]
fn filter_keeps_only_matching_db_and_name() {
    let samples = [
        (r#"db="/a.db",name="s3",watermark="0a""#, "1.7e9"),
        (r#"db="/a.db",name="file",watermark="0b""#, "1.7e9"),
        (r#"db="/b.db",name="s3",watermark="0c""#, "1.7e9"),
    ];
    let page = page(&samples);
    let watermarks = |f: Filter| -> Vec<String> {
        let parsed = parse_progress(&page, &f).unwrap();
        assert_eq!(parsed.warnings, Vec::<String>::new());
        parsed.progress.into_iter().map(|p| p.watermark).collect()
    };
    assert_eq!(watermarks(Filter::default()), ["0a", "0b", "0c"]);
    assert_eq!(watermarks(filter(Some("/a.db"), None)), ["0a", "0b"]);
    assert_eq!(watermarks(filter(None, Some("s3"))), ["0a", "0c"]);
    assert_eq!(watermarks(filter(Some("/a.db"), Some("file"))), ["0b"]);
}

#[test]
fn filtered_out_samples_are_not_checked() {
    let bad_other = r#"db="/other.db",name="s3",watermark="nope""#;
    let parsed = parse_progress(
        &page(&[(S3, "1.7e9"), (bad_other, "0")]),
        &filter(Some("/data/replica.db"), None),
    )
    .unwrap();
    assert_eq!(parsed.warnings, Vec::<String>::new());
    assert_eq!(parsed.progress.len(), 1);
}

#[test]
fn filter_matching_nothing_is_reported() {
    let parsed = parse_progress(FORK, &filter(Some("/var/lib/zero/other.db"), None)).unwrap();
    assert_eq!(parsed.progress, vec![]);
    assert_eq!(parsed.warnings.len(), 1);
    assert!(
        parsed.warnings[0].contains("none of the 1"),
        "{}",
        parsed.warnings[0]
    );
}

// --- whole pages

#[test]
fn page_that_is_not_prometheus_text_is_a_parse_error() {
    for page in [
        "<html><body>502 Bad Gateway</body></html>\n",
        "{\"error\": \"nope\"}",
        "Not Found\n",
        "litestream_replica_progress{watermark=\"0a\"\n",
    ] {
        let err = parse_progress(page, &Filter::default()).unwrap_err();
        assert!(matches!(err, ScrapeError::Parse(_)), "{page}: {err}");
        assert!(!err.is_transient());
    }
}

#[test]
fn empty_or_comment_only_page_is_ok_and_empty() {
    for page in ["", "\n\n", "# just a comment\n"] {
        assert_eq!(parse(page), Parsed::default(), "{page:?}");
    }
}

#[test]
fn garbage_beside_valid_lines_is_ignored() {
    let page = format!("<html>\n{FORK}");
    assert_eq!(parse(&page).progress.len(), 1);
}

// --- scrape

#[tokio::test]
async fn scrape_parses_the_served_fork_page() {
    let addr = serve(fixture_server).await;
    let parsed = scrape(&client(addr, 1 << 20), &Filter::default())
        .await
        .unwrap();
    assert_eq!(parsed.progress.len(), 1);
    assert_eq!(parsed.progress[0].watermark, "5bt456o");
}

#[tokio::test]
async fn non_utf8_page_fails_scrape_but_not_fetch() {
    let addr = serve(|_| Response::new(Full::new(Bytes::from_static(b"m 1\n\xff\xfe\n")))).await;
    let client = client(addr, 1 << 20);
    assert_eq!(client.fetch().await.unwrap().len(), 7);
    let err = scrape(&client, &Filter::default()).await.unwrap_err();
    assert!(matches!(err, ScrapeError::NotUtf8 { .. }), "{err}");
}
