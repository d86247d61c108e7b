//! Litestream's metrics page: reading the `litestream_replica_progress` gauge of the rocicorp fork
//! (docs/protocol.md, "litestream's progress gauge"), and removing that family from the page the metrics proxy hands
//! to Zero's own BackupMonitor (docs/protocol.md, "Two purgers").
//!
//! Pure parts first: [`is_lexi_version`], [`parse_progress`] and [`strip_progress_family`] read no clock and do no
//! I/O. [`Scraper`] is the I/O shell: one plain HTTP/1.1 GET per call, no connection reuse. Not owned here: how
//! often to scrape, what to do with the progress (the monitor loop and [`crate::cleanup`]), serving the proxy.
//!
//! The progress family is parsed by hand, not through `prometheus_parse::Scrape`: that crate keeps escape sequences
//! in label values undecoded (`\"` stays two characters), splits label sets at every `,` and `=` (even inside quoted
//! values), drops a sample whose label value contains `}`, and never reports an error. `db` is a file path, so any of
//! these would corrupt it. `prometheus_parse::LineInfo` still classifies every other line, to tell a metrics page
//! from something else (an HTML error page, say).

pub mod config;
pub mod destination;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Empty};
use hyper::header::{HeaderValue, ACCEPT, CONTENT_LENGTH, HOST, USER_AGENT};
use hyper::http::uri::Scheme;
use hyper::{Request, StatusCode, Uri};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tracing::debug;

pub use config::Filter;

/// The gauge the rocicorp fork exports after every upload that carries the watermark (docs/protocol.md,
/// "litestream's progress gauge").
pub const PROGRESS_FAMILY: &str = "litestream_replica_progress";

/// Backup times before this (2001-09-09, epoch seconds) cannot come from an upload by the fork, which sets the gauge
/// to the host's current time. Such a time would make the watermark look older than the cleanup delay at once, the
/// way a scrape of a fresh series at 0 does (docs/protocol.md, "A gauge read at time zero"), so it is refused like
/// 0.
pub const MIN_PLAUSIBLE_BACKUP_SECS: f64 = 1e9;

/// Most a `Content-Length` header may pre-allocate, in bytes.
const INITIAL_CAPACITY: u64 = 1 << 20;

/// Longest piece of a raw line quoted in a warning.
const QUOTE_LIMIT: usize = 160;

// ---------------------------------------------------------------------------------------------------------------
// Lexi-versions

/// Whether `s` is a canonical LexiVersion (docs/protocol.md, "Watermarks"; Zero's `types/lexi-version.ts`): a
/// base-36 length prefix
/// equal to the digit count minus one, then that many lowercase base-36 digits, without leading zeros.
///
/// Watermarks are only ever compared as strings, and that order is numeric only for canonical forms: `"100"` (0
/// written long) sorts after `"0z"` (35). Zero never writes such forms, so one on the metrics page is garbage.
pub fn is_lexi_version(s: &str) -> bool {
    let Some((&prefix, digits)) = s.as_bytes().split_first() else {
        return false;
    };
    let Some(len_minus_one) = base36_digit(prefix) else {
        return false;
    };
    digits.len() == usize::from(len_minus_one) + 1
        && digits.iter().all(|&d| base36_digit(d).is_some())
        && (digits.len() == 1 || digits[0] != b'0')
}

fn base36_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'z' => Some(b - b'a' + 10),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Parsing the progress gauge

/// One replica's last upload as the fork reports it: `watermark` is durable in the backup since `backed_up_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// The replica's `_zero.replicationState.stateVersion` in the uploaded pages; a valid lexi-version.
    pub watermark: String,
    /// When the upload finished, by litestream's host clock (the gauge's value, epoch seconds).
    pub backed_up_at: SystemTime,
    /// Label `db`: absolute path of the SQLite replica; empty if the label is absent.
    pub db: String,
    /// Label `name`: the litestream replica (`s3`, `file`, …); empty if the label is absent.
    pub name: String,
}

/// What one page said. A sample that fails a check becomes a warning, never a [`Progress`]: the caller logs the
/// warnings and carries on with what is left, which at worst delays cleanup.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Parsed {
    /// Accepted samples, in page order.
    pub progress: Vec<Progress>,
    /// One line per problem, each naming the page line.
    pub warnings: Vec<String>,
    /// `process_start_time_seconds`: when the litestream process serving the page started. A new value is a
    /// restart, after which the gauge says nothing until litestream has uploaded again.
    pub process_started: Option<f64>,
    /// The largest `litestream_db_size`: how big a restore is, which bounds how long one may take.
    pub db_bytes: Option<u64>,
}

/// Reads every `litestream_replica_progress` sample that passes `filter` and the checks below.
///
/// Like Zero's BackupMonitor, only samples under `# TYPE litestream_replica_progress gauge` with a non-empty
/// `watermark` label count. Stricter than Zero, these become warnings instead: a watermark that is not a
/// lexi-version; a value that is NaN, infinite, negative, 0 (a fresh series read before its time is set) or
/// before [`MIN_PLAUSIBLE_BACKUP_SECS`]; a malformed line; a family of another type.
///
/// A series (the same full label set) that appears more than once is an invalid page, and no copy of it is kept:
/// the copies agree on the watermark, so they can only disagree on the time, and picking one would be a guess.
/// Dropping it means the backup counts only once a later page shows it cleanly, which delays cleanup and never
/// hastens it. Two series of one replica with different watermarks are both kept (each is a true report).
///
/// Errors only with [`ScrapeError::Parse`] when nothing on a non-blank page is a Prometheus text-format line. A
/// page without the family (upstream litestream 0.5) is `Ok` with no progress and no warning.
pub fn parse_progress(page: &str, filter: &Filter) -> Result<Parsed, ScrapeError> {
    let mut warnings = Vec::new();
    let mut candidates = Vec::new();
    // The TYPE line in force, as in prometheus-parse: it applies to the family's samples after it.
    let mut family_type: Option<(usize, &str)> = None;
    // Lines of samples ignored for their type: (sample line, TYPE line, type) and sample lines without a TYPE.
    let mut not_gauge: Vec<(usize, usize, &str)> = Vec::new();
    let mut untyped: Vec<usize> = Vec::new();
    let mut saw_metric_line = false;
    let mut first_unrecognised: Option<(usize, &str)> = None;

    let mut process_started = None;
    let mut db_bytes: Option<u64> = None;
    for (index, line) in page.lines().enumerate() {
        let number = index + 1;
        let line = line.strip_suffix('\r').unwrap_or(line);
        if let Some(fact) = page_fact(line) {
            match fact {
                PageFact::ProcessStarted(secs) => process_started = Some(secs),
                PageFact::DbBytes(bytes) => {
                    db_bytes = Some(db_bytes.map_or(bytes, |b| b.max(bytes)))
                }
            }
            saw_metric_line = true;
            continue;
        }
        let Some((kind, name_end)) = line_kind(line.as_bytes()) else {
            // Other families only tell whether this is a metrics page at all; once one line has shown that, the
            // rest need no parsing (the expensive part on a large page).
            if saw_metric_line {
                continue;
            }
            match prometheus_parse::LineInfo::parse(line) {
                prometheus_parse::LineInfo::Doc { .. }
                | prometheus_parse::LineInfo::Type { .. } => {
                    saw_metric_line = true;
                }
                prometheus_parse::LineInfo::Sample { value, .. }
                    if parse_value(value).is_some() =>
                {
                    saw_metric_line = true;
                }
                prometheus_parse::LineInfo::Empty => {}
                _ if line.trim_start().starts_with('#') => {}
                _ => {
                    first_unrecognised.get_or_insert((number, line));
                }
            }
            continue;
        };
        let rest = &line[name_end..];
        match kind {
            LineKind::Help => saw_metric_line = true,
            LineKind::Type => {
                saw_metric_line = true;
                let ty = rest.trim_matches(is_blank);
                if let Some((earlier, _)) = family_type {
                    warnings.push(format!(
                        "line {number}: second TYPE line for {PROGRESS_FAMILY} (first at line {earlier}); \
                         the later one applies"
                    ));
                }
                family_type = Some((number, ty));
            }
            LineKind::Sample => match parse_sample(rest) {
                Err(problem) => {
                    first_unrecognised.get_or_insert((number, line));
                    warnings.push(format!(
                        "line {number}: malformed {PROGRESS_FAMILY} sample ({problem}): {}",
                        quote(line)
                    ));
                }
                Ok((labels, value)) => {
                    saw_metric_line = true;
                    match family_type {
                        Some((_, ty)) if ty.eq_ignore_ascii_case("gauge") => {
                            candidates.push(Candidate {
                                line: number,
                                labels,
                                value,
                            });
                        }
                        Some((type_line, ty)) => not_gauge.push((number, type_line, ty)),
                        None => untyped.push(number),
                    }
                }
            },
        }
    }

    if !saw_metric_line {
        if let Some((number, line)) = first_unrecognised {
            return Err(ScrapeError::Parse(format!(
                "not a Prometheus text-format page: no metric line; line {number}: {}",
                quote(line)
            )));
        }
    }
    if let Some(&(first, type_line, ty)) = not_gauge.first() {
        warnings.push(format!(
            "line {first}: {} {PROGRESS_FAMILY} sample(s) ignored: TYPE {ty:?} (line {type_line}), not gauge",
            not_gauge.len(),
        ));
    }
    if let Some(&first) = untyped.first() {
        warnings.push(format!(
            "line {first}: {} {PROGRESS_FAMILY} sample(s) ignored: no TYPE line before them",
            untyped.len(),
        ));
    }

    let total = candidates.len();
    candidates.retain(|c| c.matches(filter));
    if total > 0 && candidates.is_empty() {
        warnings.push(format!(
            "none of the {total} {PROGRESS_FAMILY} sample(s) matches the filter (db {}, name {})",
            describe_wanted(filter.db.as_deref()),
            describe_wanted(filter.name.as_deref()),
        ));
    }

    let mut lines_per_series: HashMap<&BTreeMap<String, String>, Vec<usize>> = HashMap::new();
    for c in &candidates {
        lines_per_series.entry(&c.labels).or_default().push(c.line);
    }
    let mut progress = Vec::new();
    for c in &candidates {
        let lines = &lines_per_series[&c.labels];
        if lines.len() > 1 {
            if lines[0] == c.line {
                let list = lines
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ");
                warnings.push(format!(
                    "line {}: series {} appears {} times (lines {list}): all copies ignored",
                    c.line,
                    render_series(&c.labels),
                    lines.len(),
                ));
            }
            continue;
        }
        match c.to_progress() {
            Ok(p) => progress.push(p),
            Err(problem) => warnings.push(format!(
                "line {}: {} {problem}",
                c.line,
                render_series(&c.labels)
            )),
        }
    }
    Ok(Parsed {
        progress,
        warnings,
        process_started,
        db_bytes,
    })
}

/// A sample of another family that the monitor reads.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PageFact {
    ProcessStarted(f64),
    DbBytes(u64),
}

/// `process_start_time_seconds` and `litestream_db_size` samples with a finite, non-negative value; anything else
/// (including those families' HELP and TYPE lines) is `None`, left to the family scan.
fn page_fact(line: &str) -> Option<PageFact> {
    let trimmed = line.trim_start();
    let fact: fn(f64) -> PageFact = if trimmed.starts_with("process_start_time_seconds") {
        PageFact::ProcessStarted
    } else if trimmed.starts_with("litestream_db_size") {
        // Sizes are whole bytes; a fraction from a float rendering is rounded down.
        |v| PageFact::DbBytes(v as u64)
    } else {
        return None;
    };
    match prometheus_parse::LineInfo::parse(trimmed) {
        prometheus_parse::LineInfo::Sample {
            metric_name, value, ..
        } if metric_name == "process_start_time_seconds" || metric_name == "litestream_db_size" => {
            parse_value(value)
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(fact)
        }
        _ => None,
    }
}

fn describe_wanted(want: Option<&str>) -> String {
    want.map_or_else(|| "any".to_owned(), |v| format!("{v:?}"))
}

/// A well-formed gauge sample not yet checked.
struct Candidate<'a> {
    line: usize,
    labels: BTreeMap<String, String>,
    value: &'a str,
}

impl Candidate<'_> {
    fn label(&self, name: &str) -> &str {
        self.labels.get(name).map_or("", String::as_str)
    }

    fn matches(&self, filter: &Filter) -> bool {
        filter.matches(self.label("db"), self.label("name"))
    }

    fn to_progress(&self) -> Result<Progress, String> {
        let watermark = self.label("watermark");
        if watermark.is_empty() {
            return Err("has no watermark label".to_owned());
        }
        if !is_lexi_version(watermark) {
            return Err(format!("watermark {watermark:?} is not a lexi-version"));
        }
        let Some(secs) = parse_value(self.value) else {
            return Err(format!("value {:?} is not a number", self.value));
        };
        let backed_up_at =
            backup_time(secs).map_err(|why| format!("value {}: {why}", self.value))?;
        Ok(Progress {
            watermark: watermark.to_owned(),
            backed_up_at,
            db: self.label("db").to_owned(),
            name: self.label("name").to_owned(),
        })
    }
}

/// Go's `%g` output parses exactly with Rust's correctly rounded `f64` parser; so do `NaN` and `±Inf`.
fn parse_value(text: &str) -> Option<f64> {
    text.parse::<f64>().ok()
}

fn backup_time(secs: f64) -> Result<SystemTime, &'static str> {
    if secs.is_nan() {
        return Err("NaN is not a time");
    }
    if secs.is_infinite() {
        return Err("an infinite time");
    }
    // Checked before the sign, so -0 reads as time 0 too (docs/protocol.md, "A gauge read at time zero").
    if secs == 0.0 {
        return Err("time 0: a new series read before litestream set its time");
    }
    if secs < 0.0 {
        return Err("a time before 1970");
    }
    if secs < MIN_PLAUSIBLE_BACKUP_SECS {
        return Err("a time before 2001, not from a real upload");
    }
    Duration::try_from_secs_f64(secs)
        .ok()
        .and_then(|since_epoch| UNIX_EPOCH.checked_add(since_epoch))
        .ok_or("a time out of range")
}

/// Which line of the family a page line is. Shared by the parser and the proxy so both agree on the family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LineKind {
    Help,
    Type,
    Sample,
}

/// Classifies a line (its terminator may be included) and returns where the family name ends.
///
/// Looser than the text format where Zero's parser or Go's is looser: leading blanks (both trim lines), `#` and the
/// keyword separated by any blanks (Go's parser), so nothing Zero could read as the gauge slips past the proxy.
fn line_kind(line: &[u8]) -> Option<(LineKind, usize)> {
    let family = PROGRESS_FAMILY.as_bytes();
    let start = skip_blanks(line, 0);
    if line.get(start) == Some(&b'#') {
        let keyword = skip_blanks(line, start + 1);
        let kind = match line.get(keyword..keyword + 4)? {
            b"HELP" => LineKind::Help,
            b"TYPE" => LineKind::Type,
            _ => return None,
        };
        let name = skip_blanks(line, keyword + 4);
        if name == keyword + 4 || !line[name..].starts_with(family) {
            return None;
        }
        let end = name + family.len();
        match line.get(end) {
            None | Some(b' ' | b'\t' | b'\r' | b'\n') => Some((kind, end)),
            Some(_) => None,
        }
    } else {
        if !line[start..].starts_with(family) {
            return None;
        }
        let end = start + family.len();
        match line.get(end) {
            Some(b'{' | b' ' | b'\t') => Some((LineKind::Sample, end)),
            _ => None,
        }
    }
}

fn is_blank(c: char) -> bool {
    c == ' ' || c == '\t'
}

fn skip_blanks(bytes: &[u8], mut at: usize) -> usize {
    while matches!(bytes.get(at), Some(b' ' | b'\t')) {
        at += 1;
    }
    at
}

/// Parses what follows the metric name of a sample line: an optional label set, the value, an optional timestamp.
///
/// Label values are decoded per the text format (`\\`, `\"`, `\n`; any other escape is an error, as in Go's
/// parser) and may contain `,`, `=`, `{` and `}`. Returns the labels and the value's text.
fn parse_sample(rest: &str) -> Result<(BTreeMap<String, String>, &str), &'static str> {
    let b = rest.as_bytes();
    let mut labels = BTreeMap::new();
    let mut i = skip_blanks(b, 0);
    if b.get(i) == Some(&b'{') {
        i += 1;
        loop {
            i = skip_blanks(b, i);
            match b.get(i) {
                Some(b'}') => {
                    i += 1;
                    break;
                }
                None => return Err("unterminated label set"),
                Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {}
                Some(_) => return Err("invalid label name"),
            }
            let name_start = i;
            while matches!(b.get(i), Some(c) if c.is_ascii_alphanumeric() || *c == b'_') {
                i += 1;
            }
            let name = &rest[name_start..i];
            i = skip_blanks(b, i);
            if b.get(i) != Some(&b'=') {
                return Err("expected '=' after a label name");
            }
            i = skip_blanks(b, i + 1);
            if b.get(i) != Some(&b'"') {
                return Err("label value not quoted");
            }
            i += 1;
            let mut value = String::new();
            // Slices below start and end next to ASCII bytes, so they fall on char boundaries.
            let mut run = i;
            loop {
                match b.get(i) {
                    None => return Err("unterminated label value"),
                    Some(b'"') => {
                        value.push_str(&rest[run..i]);
                        i += 1;
                        break;
                    }
                    Some(b'\\') => {
                        value.push_str(&rest[run..i]);
                        value.push(match b.get(i + 1) {
                            Some(b'\\') => '\\',
                            Some(b'"') => '"',
                            Some(b'n') => '\n',
                            _ => return Err("invalid escape sequence in a label value"),
                        });
                        i += 2;
                        run = i;
                    }
                    Some(_) => i += 1,
                }
            }
            if labels.insert(name.to_owned(), value).is_some() {
                return Err("label given twice");
            }
            i = skip_blanks(b, i);
            match b.get(i) {
                Some(b',') => i += 1,
                Some(b'}') => {
                    i += 1;
                    break;
                }
                _ => return Err("expected ',' or '}' after a label value"),
            }
        }
    }
    let mut tokens = rest[i..].split(is_blank).filter(|t| !t.is_empty());
    let value = tokens.next().ok_or("no value")?;
    if let Some(timestamp) = tokens.next() {
        if timestamp.parse::<i64>().is_err() {
            return Err("invalid timestamp");
        }
    }
    if tokens.next().is_some() {
        return Err("unexpected text after the timestamp");
    }
    Ok((labels, value))
}

/// The series as the text format writes it, labels sorted and re-escaped, for warnings.
fn render_series(labels: &BTreeMap<String, String>) -> String {
    let mut out = format!("{PROGRESS_FAMILY}{{");
    for (index, (name, value)) in labels.iter().enumerate() {
        if index > 0 {
            out.push(',');
        }
        let _ = write!(out, "{name}=\"");
        for c in value.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
    out
}

/// `line` for a warning, cut to [`QUOTE_LIMIT`] bytes at a char boundary.
fn quote(line: &str) -> String {
    if line.len() <= QUOTE_LIMIT {
        return format!("{line:?}");
    }
    let mut end = QUOTE_LIMIT;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}…", &line[..end])
}

// ---------------------------------------------------------------------------------------------------------------
// The metrics proxy

/// `page` without the progress family: its `# HELP` and `# TYPE` lines and every sample line named exactly
/// `litestream_replica_progress` (then `{`, a space or a tab), each with its line ending. Every other byte is kept,
/// line endings (LF or CRLF) and a missing final newline included; `Borrowed` when nothing matched.
///
/// Zero's BackupMonitor reads the page through the proxy: with the family gone it finds no gauge and schedules no
/// purge of its own, so the sidecar is the only cleanup authority (docs/protocol.md, "Two purgers"). Lines are
/// matched
/// generously (see `line_kind`), because a line the proxy lets through that Zero reads as the gauge would bring
/// Zero's reservation-blind cleanup back.
pub fn strip_progress_family(page: &[u8]) -> Cow<'_, [u8]> {
    let mut out: Option<Vec<u8>> = None;
    // Start of the run of kept lines not yet copied: whole runs are copied at once.
    let mut kept_from = 0;
    let mut start = 0;
    while start < page.len() {
        let end = page[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(page.len(), |at| start + at + 1);
        if line_kind(&page[start..end]).is_some() {
            let buf = out.get_or_insert_with(|| Vec::with_capacity(page.len()));
            buf.extend_from_slice(&page[kept_from..start]);
            kept_from = end;
        }
        start = end;
    }
    match out {
        None => Cow::Borrowed(page),
        Some(mut buf) => {
            buf.extend_from_slice(&page[kept_from..]);
            Cow::Owned(buf)
        }
    }
}

/// `page` with the progress family replaced by one sample that says `through` was backed up at its backup time:
/// the watermark the sidecar has already purged below. Its `db` and `name` are those of the first sample
/// [`parse_progress`] takes; the rest of the page is kept byte for byte, as [`strip_progress_family`] keeps it.
/// Without a purge yet, or without such a sample, the family is removed as in `hide` mode.
///
/// Zero's own cleanup then sees a live, advancing backup — its upload verification, its one-hour check, its
/// backup-lag metric and a readiness gate waiting for the first backed-up watermark all work — while the purge it
/// may schedule can only delete rows the sidecar has already deleted.
pub fn clamp_progress_family<'a>(
    page: &'a [u8],
    filter: &Filter,
    through: Option<(&str, SystemTime)>,
) -> Cow<'a, [u8]> {
    let stripped = strip_progress_family(page);
    let Some((watermark, backed_up_at)) = through else {
        return stripped;
    };
    // The replica's own sample, as the monitor reads it: the clamped one names the same `db` and `name`.
    let Some(real) = std::str::from_utf8(page)
        .ok()
        .and_then(|text| parse_progress(text, filter).ok())
        .and_then(|parsed| parsed.progress.into_iter().next())
    else {
        return stripped;
    };
    let labels: BTreeMap<String, String> = [("db", real.db), ("name", real.name)]
        .into_iter()
        .filter(|(_, value)| !value.is_empty())
        .map(|(key, value)| (key.to_owned(), value))
        .chain([("watermark".to_owned(), watermark.to_owned())])
        .collect();
    let secs = backed_up_at
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let family = format!(
        "# HELP {PROGRESS_FAMILY} The last replicated watermark and time of replication\n\
         # TYPE {PROGRESS_FAMILY} gauge\n{} {secs}\n",
        render_series(&labels)
    );
    let mut out = stripped.into_owned();
    if !out.is_empty() && !out.ends_with(b"\n") {
        out.push(b'\n');
    }
    // An OpenMetrics page ends with `# EOF`: the family goes before it.
    let at = if out.ends_with(b"# EOF\n") {
        out.len() - b"# EOF\n".len()
    } else {
        out.len()
    };
    out.splice(at..at, family.into_bytes());
    Cow::Owned(out)
}

// ---------------------------------------------------------------------------------------------------------------
// Errors

/// Why a scrape produced no page or no parse.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The URL cannot be scraped by [`Scraper`]; `url` has any credentials removed.
    #[error("scrape {url}: {reason}")]
    InvalidUrl { url: String, reason: &'static str },
    #[error("scrape {url}: HTTP status {status}")]
    Http { url: Uri, status: StatusCode },
    /// Connecting, writing the request or reading the response failed; the message includes hyper's cause.
    #[error("scrape {url}: {source}")]
    Io { url: Uri, source: std::io::Error },
    #[error("scrape {url}: no complete response within {after:?}")]
    Timeout { url: Uri, after: Duration },
    #[error("scrape {url}: body larger than {limit} bytes")]
    TooLarge { url: Uri, limit: usize },
    #[error("scrape {url}: body is not UTF-8")]
    NotUtf8 { url: Uri },
    #[error("metrics page: {0}")]
    Parse(String),
}

impl ScrapeError {
    /// Worth retrying on the next tick without a human: litestream restarting, slow or briefly failing. The rest
    /// (a bad URL, a 404, an oversized or foreign page) will not fix itself.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Http { status, .. } => {
                status.is_server_error()
                    || *status == StatusCode::TOO_MANY_REQUESTS
                    || *status == StatusCode::REQUEST_TIMEOUT
            }
            Self::Io { .. } | Self::Timeout { .. } => true,
            Self::InvalidUrl { .. }
            | Self::TooLarge { .. }
            | Self::NotUtf8 { .. }
            | Self::Parse(_) => false,
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The I/O shell

/// Scrapes one litestream metrics URL. Cheap to clone; holds no connection between calls.
#[derive(Debug, Clone)]
pub struct Scraper {
    url: Uri,
    /// Host for `connect`, IPv6 brackets removed.
    connect_host: String,
    port: u16,
    /// The origin-form target sent on the request line.
    target: Uri,
    host_header: HeaderValue,
    /// Bounds connect, request and the whole body together.
    timeout: Duration,
    /// Largest body accepted, in bytes.
    max_bytes: usize,
    /// Set for `status` toward a daemon whose listener speaks TLS; litestream is always plain HTTP.
    tls: Option<ScrapeTls>,
}

/// TLS for a [`Scraper`]: the connector and the name sent as SNI.
#[derive(Clone)]
struct ScrapeTls(
    tokio_rustls::TlsConnector,
    rustls::pki_types::ServerName<'static>,
);

impl std::fmt::Debug for ScrapeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ScrapeTls").field(&self.1).finish()
    }
}

impl Scraper {
    /// Only `http://` URLs: litestream serves plain HTTP, on localhost in Zero's deployment.
    pub fn new(url: Uri, timeout: Duration, max_bytes: usize) -> Result<Self, ScrapeError> {
        let invalid = |reason| ScrapeError::InvalidUrl {
            url: redacted(&url),
            reason,
        };
        match url.scheme() {
            Some(scheme) if *scheme == Scheme::HTTP => {}
            Some(scheme) if *scheme == Scheme::HTTPS => {
                return Err(invalid("https is not supported, only http"))
            }
            _ => return Err(invalid("only http:// URLs are supported")),
        }
        let Some(authority) = url.authority() else {
            return Err(invalid("no host"));
        };
        if authority.as_str().contains('@') {
            return Err(invalid("credentials in the URL are not supported"));
        }
        let host = authority.host();
        if host.is_empty() {
            return Err(invalid("no host"));
        }
        let connect_host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host)
            .to_owned();
        let host_header = HeaderValue::from_str(authority.as_str())
            .map_err(|_| invalid("host is not a valid header"))?;
        let target = url
            .path_and_query()
            .map_or_else(|| Uri::from_static("/"), |pq| Uri::from(pq.clone()));
        Ok(Self {
            port: authority.port_u16().unwrap_or(80),
            url,
            connect_host,
            target,
            host_header,
            timeout,
            max_bytes,
            tls: None,
        })
    }

    /// Speaks TLS through `connector` after connecting; the URL keeps its `http://` scheme, as the request does.
    pub fn with_tls(mut self, connector: tokio_rustls::TlsConnector) -> Self {
        let name = rustls::pki_types::ServerName::try_from(self.connect_host.clone())
            .unwrap_or_else(|_| {
                rustls::pki_types::ServerName::try_from("localhost").expect("a DNS name")
            });
        self.tls = Some(ScrapeTls(connector, name));
        self
    }

    /// The page's raw bytes, for the proxy to forward untouched. Any 2xx counts; the body is read whole.
    pub async fn fetch(&self) -> Result<Bytes, ScrapeError> {
        match tokio::time::timeout(self.timeout, self.fetch_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(ScrapeError::Timeout {
                url: self.url.clone(),
                after: self.timeout,
            }),
        }
    }

    /// [`Scraper::fetch`], then [`parse_progress`].
    pub async fn scrape(&self, filter: &Filter) -> Result<Parsed, ScrapeError> {
        let page = self.fetch().await?;
        let page = std::str::from_utf8(&page).map_err(|_| ScrapeError::NotUtf8 {
            url: self.url.clone(),
        })?;
        parse_progress(page, filter)
    }

    async fn fetch_unbounded(&self) -> Result<Bytes, ScrapeError> {
        let stream = TcpStream::connect((self.connect_host.as_str(), self.port))
            .await
            .map_err(|source| self.io_error(source))?;
        match &self.tls {
            None => self.exchange(stream).await,
            Some(ScrapeTls(connector, name)) => {
                let stream = connector
                    .connect(name.clone(), stream)
                    .await
                    .map_err(|source| self.io_error(source))?;
                self.exchange(stream).await
            }
        }
    }

    /// The request and its answer over an open connection, plain or TLS.
    async fn exchange<S>(&self, stream: S) -> Result<Bytes, ScrapeError>
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|err| self.hyper_error(&err))?;
        // Aborted on every way out (done, error, timeout): a peer that never answers must not keep the task and
        // socket alive after the scrape has given up.
        let _connection = AbortOnDrop(tokio::spawn(async move {
            if let Err(err) = connection.await {
                debug!(error = %err, "metrics connection ended");
            }
        }));

        let request = Request::get(self.target.clone())
            .header(HOST, self.host_header.clone())
            .header(ACCEPT, "text/plain")
            .header(
                USER_AGENT,
                concat!("litestream-sidecar/", env!("CARGO_PKG_VERSION")),
            )
            .body(Empty::<Bytes>::new())
            .expect("request built from validated parts");
        let response = sender
            .send_request(request)
            .await
            .map_err(|err| self.hyper_error(&err))?;
        let status = response.status();
        if !status.is_success() {
            return Err(ScrapeError::Http {
                url: self.url.clone(),
                status,
            });
        }
        let too_large = || ScrapeError::TooLarge {
            url: self.url.clone(),
            limit: self.max_bytes,
        };
        let declared = response
            .headers()
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|len| len > self.max_bytes as u64) {
            return Err(too_large());
        }

        let mut body = response.into_body();
        // A declared length only sizes the first allocation, and only up to a point: the frames decide.
        let mut page =
            BytesMut::with_capacity(declared.map_or(0, |len| len.min(INITIAL_CAPACITY) as usize));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| self.hyper_error(&err))?;
            if let Ok(data) = frame.into_data() {
                if page.len() + data.len() > self.max_bytes {
                    return Err(too_large());
                }
                page.extend_from_slice(&data);
            }
        }
        debug!(url = %self.url, bytes = page.len(), "metrics page fetched");
        Ok(page.freeze())
    }

    fn io_error(&self, source: std::io::Error) -> ScrapeError {
        ScrapeError::Io {
            url: self.url.clone(),
            source,
        }
    }

    /// hyper's `Display` omits the cause ("connection error" alone), so the chain is spelled out here; the io kind
    /// underneath, if any, is kept.
    fn hyper_error(&self, err: &hyper::Error) -> ScrapeError {
        let mut message = err.to_string();
        let mut kind = std::io::ErrorKind::Other;
        let mut cause = std::error::Error::source(err);
        while let Some(inner) = cause {
            let _ = write!(message, ": {inner}");
            if let Some(io) = inner.downcast_ref::<std::io::Error>() {
                kind = io.kind();
            }
            cause = inner.source();
        }
        self.io_error(std::io::Error::new(kind, message))
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `url` as text without any `user:password@`, for error messages.
fn redacted(url: &Uri) -> String {
    let text = url.to_string();
    match url.authority().map(|a| a.as_str()) {
        Some(authority) if authority.contains('@') => {
            let host_port = authority.rsplit('@').next().unwrap_or_default();
            text.replacen(authority, &format!("***@{host_port}"), 1)
        }
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::net::SocketAddr;
    use std::sync::Arc;
    use std::time::Instant;

    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper::service::service_fn;
    use hyper::Response;
    use proptest::prelude::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    const FORK: &str = include_str!("../../tests/fixtures/litestream/zero-fork.prom");
    const UPSTREAM: &str = include_str!("../../tests/fixtures/litestream/upstream-0.5.17.prom");
    const TYPE_GAUGE: &str = "# TYPE litestream_replica_progress gauge\n";

    fn parse(page: &str) -> Parsed {
        parse_progress(page, &Filter::default()).expect("parses")
    }

    /// A page with the gauge's TYPE line and one sample line per `samples` entry (`labels`, `value`).
    fn page(samples: &[(&str, &str)]) -> String {
        let mut page = String::from(TYPE_GAUGE);
        for (labels, value) in samples {
            page.push_str(&format!(
                "litestream_replica_progress{{{labels}}} {value}\n"
            ));
        }
        page
    }

    fn at(secs: f64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs_f64(secs)
    }

    fn filter(db: Option<&str>, name: Option<&str>) -> Filter {
        Filter {
            db: db.map(Into::into),
            name: name.map(Into::into),
        }
    }

    const S3: &str = r#"db="/data/replica.db",name="s3",watermark="0a""#;

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
        let scrape =
            prometheus_parse::Scrape::parse(page.lines().map(|l| Ok(l.to_owned()))).unwrap();
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
        String::from_utf8(clamp_progress_family(page.as_bytes(), filter, through).into_owned())
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
        ("# HELP litestream_replica_progress The last replicated watermark and time of replication", true),
        ("# TYPE litestream_replica_progress gauge", true),
        ("litestream_replica_progress{db=\"/d\",name=\"s3\",watermark=\"0a\"} 1.7e9", true),
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

    // --- Scraper

    /// Serves each connection with `respond`; the task ends with the test's runtime.
    async fn serve<F>(respond: F) -> SocketAddr
    where
        F: Fn(Request<Incoming>) -> Response<Full<Bytes>> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let respond = Arc::new(respond);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let respond = respond.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let response = respond(req);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        addr
    }

    /// Answers each connection with `response` written as is, after the request head; `None` never answers.
    async fn serve_raw(response: Option<&'static [u8]>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((mut stream, _)) = listener.accept().await {
                let Some(response) = response else {
                    held.push(stream);
                    continue;
                };
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = stream.write_all(response).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        addr
    }

    fn scraper(addr: SocketAddr, max_bytes: usize) -> Scraper {
        let url: Uri = format!("http://{addr}/metrics").parse().unwrap();
        Scraper::new(url, Duration::from_secs(5), max_bytes).unwrap()
    }

    fn fixture_server(req: Request<Incoming>) -> Response<Full<Bytes>> {
        let host_ok = req
            .headers()
            .get(HOST)
            .is_some_and(|h| h.as_bytes().starts_with(b"127.0.0.1:"));
        let accept_ok = req.headers().get(ACCEPT).is_some_and(|h| h == "text/plain");
        let status = match (req.uri().path(), host_ok && accept_ok) {
            ("/metrics", true) => StatusCode::OK,
            ("/metrics", false) => StatusCode::BAD_REQUEST,
            _ => StatusCode::NOT_FOUND,
        };
        let body = if status == StatusCode::OK {
            Bytes::from_static(FORK.as_bytes())
        } else {
            Bytes::new()
        };
        Response::builder()
            .status(status)
            .body(Full::new(body))
            .unwrap()
    }

    #[tokio::test]
    async fn fetch_returns_the_page_byte_for_byte() {
        let addr = serve(fixture_server).await;
        let page = scraper(addr, 1 << 20).fetch().await.unwrap();
        assert_eq!(page, FORK.as_bytes());
    }

    #[tokio::test]
    async fn scrape_parses_the_served_fork_page() {
        let addr = serve(fixture_server).await;
        let parsed = scraper(addr, 1 << 20)
            .scrape(&Filter::default())
            .await
            .unwrap();
        assert_eq!(parsed.progress.len(), 1);
        assert_eq!(parsed.progress[0].watermark, "5bt456o");
    }

    #[tokio::test]
    async fn server_error_is_a_transient_http_error() {
        let addr = serve(|_| {
            Response::builder()
                .status(500)
                .body(Full::new(Bytes::from("boom")))
                .unwrap()
        })
        .await;
        let err = scraper(addr, 1 << 20).fetch().await.unwrap_err();
        assert!(
            matches!(
                err,
                ScrapeError::Http {
                    status: StatusCode::INTERNAL_SERVER_ERROR,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.is_transient());
        assert_eq!(
            err.to_string(),
            format!("scrape http://{addr}/metrics: HTTP status 500 Internal Server Error")
        );
    }

    #[tokio::test]
    async fn not_found_is_not_transient() {
        let addr = serve(fixture_server).await;
        let url: Uri = format!("http://{addr}/wrong").parse().unwrap();
        let err = Scraper::new(url, Duration::from_secs(5), 1 << 20)
            .unwrap()
            .fetch()
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ScrapeError::Http {
                    status: StatusCode::NOT_FOUND,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.is_transient());
    }

    #[tokio::test]
    async fn body_over_the_limit_is_too_large() {
        let addr = serve(fixture_server).await;
        let err = scraper(addr, FORK.len() - 1).fetch().await.unwrap_err();
        assert!(
            matches!(err, ScrapeError::TooLarge { limit, .. } if limit == FORK.len() - 1),
            "{err}"
        );
        assert!(!err.is_transient());
        assert_eq!(
            scraper(addr, FORK.len()).fetch().await.unwrap().len(),
            FORK.len()
        );
    }

    #[tokio::test]
    async fn chunked_body_over_the_limit_is_too_large() {
        const CHUNKED: &[u8] = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n\
                                 6\r\nabcdef\r\n6\r\nghijkl\r\n0\r\n\r\n";
        let addr = serve_raw(Some(CHUNKED)).await;
        let err = scraper(addr, 11).fetch().await.unwrap_err();
        assert!(
            matches!(err, ScrapeError::TooLarge { limit: 11, .. }),
            "{err}"
        );
        assert_eq!(
            scraper(addr, 12).fetch().await.unwrap(),
            &b"abcdefghijkl"[..]
        );
    }

    #[tokio::test]
    async fn truncated_body_is_an_io_error() {
        const SHORT: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this";
        let addr = serve_raw(Some(SHORT)).await;
        let err = scraper(addr, 1 << 20).fetch().await.unwrap_err();
        assert!(matches!(err, ScrapeError::Io { .. }), "{err}");
        assert!(err.is_transient());
    }

    #[tokio::test]
    async fn silent_server_times_out() {
        let addr = serve_raw(None).await;
        let url: Uri = format!("http://{addr}/metrics").parse().unwrap();
        let scraper = Scraper::new(url, Duration::from_millis(200), 1 << 20).unwrap();
        let started = Instant::now();
        let err = scraper.fetch().await.unwrap_err();
        assert!(
            matches!(err, ScrapeError::Timeout { after, .. } if after == Duration::from_millis(200)),
            "{err}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(err.is_transient());
    }

    #[tokio::test]
    async fn closed_port_is_an_io_error() {
        let addr = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap()
            .local_addr()
            .unwrap();
        let err = scraper(addr, 1 << 20).fetch().await.unwrap_err();
        match &err {
            ScrapeError::Io { source, .. } => {
                assert_eq!(source.kind(), std::io::ErrorKind::ConnectionRefused)
            }
            other => panic!("expected Io, got {other}"),
        }
        assert!(err.is_transient());
        assert!(
            err.to_string()
                .starts_with(&format!("scrape http://{addr}/metrics: ")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn non_utf8_page_fails_scrape_but_not_fetch() {
        let addr =
            serve(|_| Response::new(Full::new(Bytes::from_static(b"m 1\n\xff\xfe\n")))).await;
        let scraper = scraper(addr, 1 << 20);
        assert_eq!(scraper.fetch().await.unwrap().len(), 7);
        let err = scraper.scrape(&Filter::default()).await.unwrap_err();
        assert!(matches!(err, ScrapeError::NotUtf8 { .. }), "{err}");
    }

    #[test]
    fn only_plain_http_urls_are_accepted() {
        let new = |url: &str| Scraper::new(url.parse().unwrap(), Duration::from_secs(1), 1);
        let reason = |url: &str| match new(url).unwrap_err() {
            ScrapeError::InvalidUrl { reason, .. } => reason,
            other => panic!("{other}"),
        };
        assert!(reason("https://localhost:4850/metrics").contains("https"));
        assert!(reason("localhost:4850").contains("http://"));
        assert!(reason("/metrics").contains("http://"));
        assert!(reason("http://user:secret@localhost:4850/metrics").contains("credentials"));
        let err = new("http://user:secret@localhost:4850/metrics")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("secret"), "{err}");

        let ok = new("http://[::1]:4860/metrics").unwrap();
        assert_eq!(
            (
                ok.connect_host.as_str(),
                ok.port,
                ok.host_header.to_str().unwrap()
            ),
            ("::1", 4860, "[::1]:4860")
        );
        let ok = new("http://localhost").unwrap();
        assert_eq!((ok.port, ok.target.to_string().as_str()), (80, "/"));
        assert_eq!(
            new("http://h:1/m?x=1").unwrap().target.to_string(),
            "/m?x=1"
        );
    }
}
