//! Litestream metrics pages: extracting the watermarks from a 1 MiB page, and the proxy's filtering of it.

use std::time::{Duration, Instant};

use litestream_sidecar::litestream::filter::strip_progress_family;
use litestream_sidecar::litestream::page::parse_progress;
use litestream_sidecar::litestream::Filter;

use crate::util::{ms, percentile, Report};

const FORK_PAGE: &str = include_str!("../../tests/fixtures/litestream/zero-fork.prom");
const RUNS: usize = 200;

/// The real fork page padded to 1 MiB with more series of the kinds litestream exports.
fn page_of_one_mib() -> String {
    let mut page = String::from(FORK_PAGE);
    let mut i = 0;
    while page.len() < 1 << 20 {
        page.push_str(&format!(
            "# HELP litestream_wal_bytes_{i} Total number of bytes written to shadow WAL\n\
             # TYPE litestream_wal_bytes_{i} counter\n\
             litestream_wal_bytes_{i}{{db=\"/var/lib/zero/replica-{i}.db\",name=\"s3\"}} 1.2345678e+09\n"
        ));
        i += 1;
    }
    page
}

fn time(runs: usize, mut f: impl FnMut()) -> Vec<Duration> {
    let mut samples: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples
}

pub async fn run(report: &mut Report) {
    println!("litestream metrics pages");
    let page = page_of_one_mib();
    let filter = Filter::default();
    let parse = time(RUNS, || {
        let parsed = parse_progress(std::hint::black_box(&page), &filter).expect("page parses");
        assert_eq!(parsed.progress.len(), 1);
    });
    let p99 = percentile(&parse, 0.99);
    report.add(
        format!("watermarks from a {} KiB page, p50", page.len() >> 10),
        ms(percentile(&parse, 0.5)),
        "",
        None,
    );
    report.add(
        format!("watermarks from a {} KiB page, p99", page.len() >> 10),
        ms(p99),
        "<= 5 ms",
        Some(p99 <= Duration::from_millis(5)),
    );
    let strip = time(RUNS, || {
        let stripped = strip_progress_family(std::hint::black_box(page.as_bytes()));
        assert!(stripped.len() < page.len());
    });
    report.add(
        "metrics proxy: progress family removed from 1 MiB, p99",
        ms(percentile(&strip, 0.99)),
        "",
        None,
    );
}
