//! Reading litestream's metrics page: the `litestream_replica_progress` gauge of the rocicorp fork
//! (docs/protocol.md, "litestream's progress gauge"), and the `process_start_time_seconds` and `litestream_db_size` samples the monitor reads. Pure except
//! [`scrape`], which fetches the page first.
//!
//! The progress family is parsed by hand, not through `prometheus_parse::Scrape`: that crate keeps escape sequences
//! in label values undecoded (`\"` stays two characters), splits label sets at every `,` and `=` (even inside quoted
//! values), drops a sample whose label value contains `}`, and never reports an error. `db` is a file path, so any of
//! these would corrupt it. `prometheus_parse::LineInfo` still classifies every other line, to tell a metrics page
//! from something else (an HTML error page, say).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hyper::Uri;

use super::Filter;
use crate::net::client::{HttpClient, HttpError};

#[cfg(test)]
pub(crate) mod tests;

/// The gauge the rocicorp fork exports after every upload that carries the watermark (docs/protocol.md,
/// "litestream's progress gauge").
pub const PROGRESS_FAMILY: &str = "litestream_replica_progress";

/// Backup times before this (2001-09-09, epoch seconds) cannot come from an upload by the fork, which sets the gauge
/// to the host's current time. Such a time would make the watermark look older than the cleanup delay at once, the
/// way a scrape of a fresh series at 0 does (docs/protocol.md, "A gauge read at time zero"), so it is refused like
/// 0.
pub const MIN_PLAUSIBLE_BACKUP_SECS: f64 = 1e9;

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
pub(super) enum LineKind {
    Help,
    Type,
    Sample,
}

/// Classifies a line (its terminator may be included) and returns where the family name ends.
///
/// Looser than the text format where Zero's parser or Go's is looser: leading blanks (both trim lines), `#` and the
/// keyword separated by any blanks (Go's parser), so nothing Zero could read as the gauge slips past the proxy.
pub(super) fn line_kind(line: &[u8]) -> Option<(LineKind, usize)> {
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
pub(super) fn parse_sample(rest: &str) -> Result<(BTreeMap<String, String>, &str), &'static str> {
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
pub(super) fn render_series(labels: &BTreeMap<String, String>) -> String {
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

/// Why a scrape produced no parse: the page could not be fetched, or it is not a metrics page.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error(transparent)]
    Fetch(#[from] HttpError),
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
            Self::Fetch(err) => err.is_transient(),
            Self::NotUtf8 { .. } | Self::Parse(_) => false,
        }
    }
}

/// Fetches the page through `client`, then [`parse_progress`].
pub async fn scrape(client: &HttpClient, filter: &Filter) -> Result<Parsed, ScrapeError> {
    let page = client.fetch().await?;
    let page = std::str::from_utf8(&page).map_err(|_| ScrapeError::NotUtf8 {
        url: client.url().clone(),
    })?;
    parse_progress(page, filter)
}
