//! Which protocol versions a request may use, when the upstream change-streamer's own range is part of the answer
//! (docs/protocol.md, "Protocol versions the upstream serves"): Zero's refusal text read back into a range, and the
//! check that refuses a version before any status with the text the upstream would have sent.

use std::ops::RangeInclusive;
use std::time::SystemTime;

use tokio::time::Instant;

/// Protocol versions, both ends included.
pub type Versions = RangeInclusive<u64>;

/// Zero's refusal of a protocol version, read back from its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRefusal {
    /// The version the refused client asked for.
    pub version: u64,
    /// What the refusing server says it serves.
    pub supported: Versions,
}

/// Reads Zero's refusal `Cannot service client at protocol vX. Supported protocols: [vA ... vB]`, as its close
/// reason carries it (`Error: ` first, since it is a thrown error's text) or without that prefix. Strict otherwise:
/// exactly Zero's words, decimal numbers as JavaScript prints them (no sign, no leading zero), `A <= B`, and `X`
/// outside `A..B`, since anything else is not a refusal of `X` and must not teach the sidecar a range.
pub fn parse_refusal(reason: &str) -> Option<VersionRefusal> {
    let text = reason.strip_prefix("Error: ").unwrap_or(reason);
    let rest = text.strip_prefix("Cannot service client at protocol v")?;
    let (version, rest) = rest.split_once(". Supported protocols: [v")?;
    let (min, rest) = rest.split_once(" ... v")?;
    let max = rest.strip_suffix(']')?;
    let (version, min, max) = (number(version)?, number(min)?, number(max)?);
    let supported = min..=max;
    (min <= max && !supported.contains(&version)).then_some(VersionRefusal { version, supported })
}

/// A version number as JavaScript's `String(n)` writes a small integer.
fn number(digits: &str) -> Option<u64> {
    let plain = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" || !digits.starts_with('0'));
    plain.then(|| digits.parse().ok()).flatten()
}

/// Checks `version` against what a route can serve: `own`, the versions the sidecar itself can serve on it, within
/// `upstream`, the upstream's range when known. Refused with Zero's text naming the versions that remain, so that a
/// client below a Zero 1.10 upstream's floor reads exactly what that upstream would have said; when nothing
/// remains, the text names the upstream's range, which is all the client could do anything with.
pub fn check_version(
    version: u64,
    own: &Versions,
    upstream: Option<&Versions>,
) -> Result<(), String> {
    let (served, named) = match upstream {
        None => (Some(own.clone()), own.clone()),
        Some(upstream) => match intersect(own, upstream) {
            Some(both) => (Some(both.clone()), both),
            None => (None, upstream.clone()),
        },
    };
    match served {
        Some(served) if served.contains(&version) => Ok(()),
        _ => Err(super::unsupported_version(version, &named)),
    }
}

/// The versions in both ranges, if any.
pub fn intersect(a: &Versions, b: &Versions) -> Option<Versions> {
    let both = *a.start().max(b.start())..=*a.end().min(b.end());
    (!both.is_empty()).then_some(both)
}

/// Who said what the upstream serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// `upstream.protocols`.
    Config,
    /// The refusal of the sidecar's own `/replication/v0/changes` probe.
    Probe,
    /// The refusal of a relayed subscription.
    Refusal,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Probe => "probe",
            Source::Refusal => "refusal",
        }
    }
}

/// What is known now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Known {
    /// The upstream's range; `None` while unknown (`auto` before the upstream has said it).
    pub versions: Option<Versions>,
    pub source: Option<Source>,
    /// Since when `versions` has been what it is (wall clock).
    pub since: Option<SystemTime>,
    /// When the upstream last said it: a client refused on an older range has it asked again
    /// ([`crate::streamer::protocols::RECHECK_AFTER`]).
    pub confirmed: Option<Instant>,
    /// A probe is under way.
    pub probing: bool,
    /// Why the last probe learned nothing, while it is the last.
    pub probe_error: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeros_refusals_are_read_with_or_without_the_error_prefix() {
        let refusal = |version, supported| Some(VersionRefusal { version, supported });
        assert_eq!(
            parse_refusal(
                "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]"
            ),
            refusal(3, 4..=6)
        );
        assert_eq!(
            parse_refusal("Cannot service client at protocol v0. Supported protocols: [v1 ... v3]"),
            refusal(0, 1..=3)
        );
        assert_eq!(
            parse_refusal(
                "Error: Cannot service client at protocol v7. Supported protocols: [v1 ... v6]"
            ),
            refusal(7, 1..=6)
        );
        // What the sidecar writes itself reads back the same.
        assert_eq!(
            parse_refusal(&crate::protocol::unsupported_version(2, &(3..=6))),
            refusal(2, 3..=6)
        );
    }

    #[test]
    fn anything_but_zeros_exact_words_is_not_a_refusal() {
        for reason in [
            "",
            "Error: ",
            "Error: invalid path: /replication/x/changes",
            "Error: Missing taskID in snapshot request",
            // Another prefix, doubled, or in other case.
            "Error: Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]",
            "error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]",
            "Exception: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]",
            " Cannot service client at protocol v3. Supported protocols: [v4 ... v6]",
            // Trailing text, a missing bracket, other spacing.
            "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6] ",
            "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]]",
            "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6",
            "Error: Cannot service client at protocol v3. Supported protocols: [v4 .. v6]",
            "Error: Cannot service client at protocol v3. Supported protocols: [v4...v6]",
            "Error: Cannot service client at protocol v3.  Supported protocols: [v4 ... v6]",
            // Numbers JavaScript would not print, or not numbers at all.
            "Error: Cannot service client at protocol vNaN. Supported protocols: [v4 ... v6]",
            "Error: Cannot service client at protocol v1e+21. Supported protocols: [v4 ... v6]",
            "Error: Cannot service client at protocol v03. Supported protocols: [v4 ... v6]",
            "Error: Cannot service client at protocol v3. Supported protocols: [v04 ... v6]",
            "Error: Cannot service client at protocol v3. Supported protocols: [v+4 ... v6]",
            "Error: Cannot service client at protocol v3. Supported protocols: [v-4 ... v6]",
            "Error: Cannot service client at protocol v3. Supported protocols: [v ... v6]",
            "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v99999999999999999999]",
            "Error: Cannot service client at protocol v3. Supported protocols: [4 ... 6]",
            // An empty range, or a version the range contains: not a refusal of that version.
            "Error: Cannot service client at protocol v3. Supported protocols: [v6 ... v4]",
            "Error: Cannot service client at protocol v5. Supported protocols: [v4 ... v6]",
            // Cut to fit a close frame.
            "Error: Cannot service client at protocol v3. Supported protocols: [v4 ...",
        ] {
            assert_eq!(parse_refusal(reason), None, "{reason:?}");
        }
    }

    #[test]
    fn a_version_is_served_where_the_sidecar_and_the_upstream_both_serve_it() {
        let text = |v, range: Versions| Err(crate::protocol::unsupported_version(v, &range));
        // Unknown upstream: the sidecar's own range.
        assert_eq!(check_version(3, &(3..=6), None), Ok(()));
        assert_eq!(check_version(2, &(3..=6), None), text(2, 3..=6));
        // Zero 1.10: v3 refused with what that upstream itself says.
        assert_eq!(check_version(3, &(3..=6), Some(&(4..=6))), text(3, 4..=6));
        assert_eq!(check_version(4, &(3..=6), Some(&(4..=6))), Ok(()));
        assert_eq!(check_version(3, &(1..=6), Some(&(4..=6))), text(3, 4..=6));
        assert_eq!(check_version(0, &(1..=6), Some(&(4..=6))), text(0, 4..=6));
        assert_eq!(check_version(7, &(1..=6), Some(&(4..=6))), text(7, 4..=6));
        // Zero 0.20: /snapshot only at v3, /changes at v1 to v3.
        assert_eq!(check_version(3, &(3..=6), Some(&(1..=3))), Ok(()));
        assert_eq!(check_version(4, &(3..=6), Some(&(1..=3))), text(4, 3..=3));
        assert_eq!(check_version(1, &(1..=6), Some(&(1..=3))), Ok(()));
        assert_eq!(check_version(4, &(1..=6), Some(&(1..=3))), text(4, 1..=3));
        // Zero 1.9 serves everything the sidecar does.
        for v in 3..=6 {
            assert_eq!(check_version(v, &(3..=6), Some(&(1..=6))), Ok(()));
        }
        // A later Zero: the sidecar still serves only what it can produce.
        assert_eq!(check_version(7, &(1..=6), Some(&(4..=7))), text(7, 4..=6));
        // Nothing in common: everything refused, naming the upstream's range.
        assert_eq!(check_version(1, &(3..=6), Some(&(1..=2))), text(1, 1..=2));
        assert_eq!(check_version(7, &(1..=6), Some(&(7..=9))), text(7, 7..=9));
    }

    #[test]
    fn ranges_meet_where_they_overlap() {
        assert_eq!(intersect(&(3..=6), &(1..=3)), Some(3..=3));
        assert_eq!(intersect(&(1..=6), &(4..=9)), Some(4..=6));
        assert_eq!(intersect(&(3..=6), &(1..=2)), None);
        assert_eq!(intersect(&(3..=6), &(7..=7)), None);
    }
}
