//! The metrics page as the proxy hands it to Zero's own BackupMonitor (docs/protocol.md, "Two purgers"): without the progress family
//! ([`strip_progress_family`], `hide` mode) or with it clamped to what the sidecar has already purged below
//! ([`clamp_progress_family`], `clamp` mode). Pure: no clock, no I/O.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use super::page::{line_kind, parse_progress, parse_sample, render_series, PROGRESS_FAMILY};
use super::Filter;

#[cfg(test)]
mod tests;

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
/// Without a purge yet the family is removed as in `hide` mode. A page without such a sample (a stock litestream,
/// whose backups restore drills prove) gets one all the same when `fallback` says so: `db` from `filter.db` or the
/// page's `litestream_db_size` sample, `name` from `filter.name` or `fallback.name` (the replica's type).
///
/// Zero's own cleanup then sees a live, advancing backup — its upload verification, its one-hour check, its
/// backup-lag metric and a readiness gate waiting for the first backed-up watermark all work — while the purge it
/// may schedule can only delete rows the sidecar has already deleted.
pub fn clamp_progress_family<'a>(
    page: &'a [u8],
    filter: &Filter,
    through: Option<(&str, SystemTime)>,
    fallback: Option<&Fallback>,
) -> Cow<'a, [u8]> {
    let stripped = strip_progress_family(page);
    let Some((watermark, backed_up_at)) = through else {
        return stripped;
    };
    let text = std::str::from_utf8(page).ok();
    // The replica's own sample, as the monitor reads it: the clamped one names the same `db` and `name`.
    let real = text
        .and_then(|text| parse_progress(text, filter).ok())
        .and_then(|parsed| parsed.progress.into_iter().next())
        .map(|real| (real.db, real.name));
    let made = || {
        let fallback = fallback?;
        let db = filter
            .db
            .clone()
            .or_else(|| text.and_then(db_size_label))
            .unwrap_or_default();
        let name = filter.name.clone().unwrap_or_else(|| fallback.name.clone());
        Some((db, name))
    };
    let Some((db, name)) = real.or_else(made) else {
        return stripped;
    };
    let labels: BTreeMap<String, String> = [("db", db), ("name", name)]
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

/// Labels for a clamped sample on a page that has none of its own (`cleanup.requires = "restore"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback {
    /// The replica's type, as litestream names a replica by default: `file`, `s3`, ...
    pub name: String,
}

/// The `db` label of the first `litestream_db_size` sample, read as the monitor reads samples.
fn db_size_label(page: &str) -> Option<String> {
    page.lines()
        .filter_map(|line| line.strip_prefix("litestream_db_size"))
        .filter(|rest| rest.starts_with(['{', ' ', '\t']))
        .find_map(|rest| parse_sample(rest).ok()?.0.remove("db"))
}
