//! Zero's change-streamer wire protocol, without I/O: which paths exist, which protocol versions are served,
//! the exact rejection texts Zero uses, the snapshot status frame, strict ack decoding, and how a `/changes`
//! query string is read and forwarded (docs/protocol.md, "Paths and versions" to "The change stream").

pub mod inspect;
pub mod shard;

use std::borrow::Cow;

/// Protocol versions whose `/snapshot` status this sidecar can produce. v3 is Zero 0.20; v4+ add fields the
/// status carries when the change DB is known.
pub const SNAPSHOT_VERSIONS: std::ops::RangeInclusive<u64> = 3..=6;

/// Protocol versions the `/changes` relay forwards. The upstream change-streamer decides whether it serves the
/// version (Zero 0.20 serves v1-v3 and closes others with 1002); the sidecar refuses only what no Zero release
/// up to v6 speaks.
pub const CHANGES_VERSIONS: std::ops::RangeInclusive<u64> = 1..=6;

/// WebSocket close codes used by the sidecar (RFC 6455, section 7.4.1).
pub mod close {
    pub const GOING_AWAY: u16 = 1001;
    pub const PROTOCOL_ERROR: u16 = 1002;
    pub const UNSUPPORTED_DATA: u16 = 1003;
    pub const INVALID_PAYLOAD: u16 = 1007;
    pub const MESSAGE_TOO_BIG: u16 = 1009;
    pub const INTERNAL_ERROR: u16 = 1011;
}

/// What a request path asks for. Only `GET` reaches [`route`]; the server answers other methods itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `/`: liveness, always 200.
    Root,
    /// `/keepalive`: readiness.
    Keepalive,
    /// `/metrics`: the sidecar's own metrics.
    Metrics,
    /// `/status`: the sidecar's state as JSON, for people and scripts.
    Status,
    /// `/replication/{segment}/snapshot`.
    Snapshot(Version),
    /// `/replication/{segment}/changes`.
    Changes(Version),
    NotFound,
}

/// The `:version` path segment as Zero reads it: `v` and digits, or something Zero calls an invalid path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Version {
    Number(u64),
    /// The segment did not match `v\d+`; carries the pathname for Zero's `invalid path` message.
    Invalid(String),
}

/// Matches paths as Zero's Fastify routes do (docs/protocol.md, "Paths and versions"): exactly
/// `/replication/:segment/(snapshot|changes)`, one segment, no trailing slash; then the version is read from the
/// segment.
pub fn route(path: &str) -> Route {
    match path {
        "/" => return Route::Root,
        "/keepalive" => return Route::Keepalive,
        "/metrics" => return Route::Metrics,
        "/status" => return Route::Status,
        _ => {}
    }
    let Some(rest) = path.strip_prefix("/replication/") else {
        return Route::NotFound;
    };
    let Some((segment, action)) = rest.split_once('/') else {
        return Route::NotFound;
    };
    if segment.is_empty() {
        return Route::NotFound;
    }
    let version = parse_version(segment, path);
    match action {
        "snapshot" => Route::Snapshot(version),
        "changes" => Route::Changes(version),
        _ => Route::NotFound,
    }
}

fn parse_version(segment: &str, path: &str) -> Version {
    match segment.strip_prefix('v') {
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            // Zero uses `Number(digits)`; absurdly long numbers saturate, which is still unsupported.
            Version::Number(digits.parse().unwrap_or(u64::MAX))
        }
        _ => Version::Invalid(path.to_string()),
    }
}

/// Zero's rejection text for an unsupported protocol version.
pub fn unsupported_version(version: u64, supported: &std::ops::RangeInclusive<u64>) -> String {
    format!(
        "Error: Cannot service client at protocol v{version}. Supported protocols: [v{} ... v{}]",
        supported.start(),
        supported.end()
    )
}

/// Zero's rejection text for a path whose version segment is not `v\d+`.
pub fn invalid_path(path: &str) -> String {
    format!("Error: invalid path: {path}")
}

pub const MISSING_TASK_ID: &str = "Error: Missing taskID in snapshot request";

/// Reads a query parameter as Zero does (docs/protocol.md, "Subscription parameters"): form-urlencoded, first
/// occurrence wins, and an empty value counts as absent.
pub fn query_param(query: Option<&str>, name: &str) -> Option<String> {
    let query = query?;
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.into_owned())
        .filter(|value| !value.is_empty())
}

/// Why a `/snapshot` request is refused before the upgrade, with Zero's own message as the body.
pub fn check_snapshot(version: &Version, query: Option<&str>) -> Result<(u64, String), String> {
    let version = match version {
        Version::Invalid(path) => return Err(invalid_path(path)),
        Version::Number(n) if !SNAPSHOT_VERSIONS.contains(n) => {
            return Err(unsupported_version(*n, &SNAPSHOT_VERSIONS))
        }
        Version::Number(n) => *n,
    };
    let task_id = query_param(query, "taskID").ok_or_else(|| MISSING_TASK_ID.to_string())?;
    Ok((version, task_id))
}

/// Why a `/changes` request is refused before the upgrade: Zero's message for a path or version no Zero
/// release serves. Everything else (missing parameters, wrong replica version) is the upstream's to decide.
pub fn check_changes(version: &Version) -> Result<(), String> {
    match version {
        Version::Invalid(path) => Err(invalid_path(path)),
        Version::Number(n) if !CHANGES_VERSIONS.contains(n) => {
            Err(unsupported_version(*n, &CHANGES_VERSIONS))
        }
        Version::Number(_) => Ok(()),
    }
}

/// What a `/changes` subscriber says about itself in its query string, read as Zero's server reads it
/// (docs/protocol.md, "Subscription parameters"): form-urlencoded, the first occurrence of a key wins, an empty value
/// counts as absent, unknown keys are ignored. Nothing here rejects a subscription: that is the upstream's decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriberContext {
    pub id: Option<String>,
    pub task_id: Option<String>,
    pub mode: Mode,
    pub replica_version: Option<String>,
    pub watermark: Option<String>,
    /// `initial=true` exactly: the watermark comes from a freshly restored or synced replica.
    pub initial: bool,
}

/// A subscriber's `mode`: exactly `backup` is the replication-manager's own backup replicator; anything else,
/// or nothing, is `serving`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    #[default]
    Serving,
    Backup,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Serving => "serving",
            Mode::Backup => "backup",
        }
    }
}

/// Reads the subscriber context of a `/changes` query string (pure; see [`SubscriberContext`]).
pub fn parse_subscriber_context(query: Option<&str>) -> SubscriberContext {
    let mut id = None;
    let mut task_id = None;
    let mut mode = None;
    let mut replica_version = None;
    let mut watermark = None;
    let mut initial = None;
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
        let slot = match &*key {
            "id" => &mut id,
            "taskID" => &mut task_id,
            "mode" => &mut mode,
            "replicaVersion" => &mut replica_version,
            "watermark" => &mut watermark,
            "initial" => &mut initial,
            _ => continue,
        };
        // URLSearchParams.get: the first occurrence, even an empty one, is the value.
        if slot.is_none() {
            *slot = Some(value.into_owned());
        }
    }
    let present = |v: Option<String>| v.filter(|v| !v.is_empty());
    SubscriberContext {
        id: present(id),
        task_id: present(task_id),
        mode: match mode.as_deref() {
            Some("backup") => Mode::Backup,
            _ => Mode::Serving,
        },
        replica_version: present(replica_version),
        watermark: present(watermark),
        initial: initial.as_deref() == Some("true"),
    }
}

/// The query string to forward upstream when the sidecar, not Zero, owns change-log cleanup (docs/protocol.md,
/// "Two purgers"): the value of the `initial` parameter Zero reads (its first occurrence) becomes `false` when it
/// reads as `true`, which keeps Zero from scheduling its own purge (docs/protocol.md, "The purge-on-subscribe
/// signal"). Every other byte, percent-encoding and key order included, is kept; a query whose `initial` is absent
/// or not exactly `true` comes back unchanged.
pub fn suppress_initial(query: &str) -> Cow<'_, str> {
    let mut start = 0;
    for segment in query.split('&') {
        let at = start;
        start += segment.len() + 1;
        if segment.is_empty() {
            continue;
        }
        let Some((key, value)) = url::form_urlencoded::parse(segment.as_bytes()).next() else {
            continue;
        };
        if key != "initial" {
            continue;
        }
        if value != "true" {
            return Cow::Borrowed(query);
        }
        // A value "true" needs an '='; everything after the first '=' is the raw value.
        let value_at = at + segment.find('=').expect("a non-empty value follows '='") + 1;
        let mut rewritten = String::with_capacity(query.len() + 1);
        rewritten.push_str(&query[..value_at]);
        rewritten.push_str("false");
        rewritten.push_str(&query[at + segment.len()..]);
        return Cow::Owned(rewritten);
    }
    Cow::Borrowed(query)
}

/// The v3 snapshot status, id first and without whitespace so that every Zero client version accepts it
/// (docs/protocol.md, "Frames and acks" and "The snapshot status").
pub fn snapshot_status_v3(backup_url: &str) -> String {
    let url = serde_json::to_string(backup_url).expect("a string serializes");
    format!(r#"{{"id":1,"msg":["status",{{"tag":"status","backupURL":{url}}}]}}"#)
}

/// The v4+ snapshot status: v3's fields plus the change-streamer's `replicaVersion` and `minWatermark`, the
/// earliest watermark catch-up can start from (docs/protocol.md, "The snapshot status").
pub fn snapshot_status_v4(backup_url: &str, replica_version: &str, min_watermark: &str) -> String {
    let json = |s: &str| serde_json::to_string(s).expect("a string serializes");
    format!(
        r#"{{"id":1,"msg":["status",{{"tag":"status","backupURL":{},"replicaVersion":{},"minWatermark":{}}}]}}"#,
        json(backup_url),
        json(replica_version),
        json(min_watermark)
    )
}

/// Decodes a client ack exactly as Zero's server does: a JSON object with the single key `ack` holding a number.
/// Anything else, extra keys included, is an error (docs/protocol.md, "Frames and acks").
pub fn decode_ack(text: &[u8]) -> Result<u64, AckError> {
    // The relay reads one ack per message relayed: the exact form clients send needs no JSON parser.
    if let Some(id) = plain_ack(text) {
        return Ok(id);
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Ack {
        ack: serde_json::Number,
    }
    // serde would also accept `[1]` for a struct; Zero's schema wants an object.
    if text.trim_ascii_start().first() != Some(&b'{') {
        return Err(AckError("not a JSON object".into()));
    }
    let ack: Ack = serde_json::from_slice(text).map_err(|e| AckError(e.to_string()))?;
    ack.ack
        .as_u64()
        .ok_or_else(|| AckError(format!("ack {} is not a message id", ack.ack)))
}

/// `{"ack":N}` exactly as `JSON.stringify` writes it, N a JSON integer (no leading zero) that fits in a u64.
fn plain_ack(text: &[u8]) -> Option<u64> {
    let digits = text.strip_prefix(b"{\"ack\":")?.strip_suffix(b"}")?;
    match digits {
        [b'0'] => Some(0),
        [b'1'..=b'9', rest @ ..] if rest.len() < 20 => digits.iter().try_fold(0u64, |n, &d| {
            let d = d.checked_sub(b'0').filter(|d| *d < 10)?;
            n.checked_mul(10)?.checked_add(u64::from(d))
        }),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ack: {0}")]
pub struct AckError(pub String);

/// Cuts a close reason to the 123 bytes a close frame allows, the way Zero's `closeWithError` does: keep at most
/// 120 characters, then drop characters until the text plus `...` fits (docs/protocol.md, "Rejections and close
/// codes").
pub fn close_reason(reason: &str) -> String {
    const MAX: usize = 123;
    if reason.len() <= MAX {
        return reason.to_string();
    }
    let mut cut: String = reason.chars().take(120).collect();
    while cut.len() + 3 > MAX {
        cut.pop();
    }
    cut.push_str("...");
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_zeros_patterns() {
        assert_eq!(route("/"), Route::Root);
        assert_eq!(route("/keepalive"), Route::Keepalive);
        assert_eq!(route("/status"), Route::Status);
        assert_eq!(
            route("/replication/v3/snapshot"),
            Route::Snapshot(Version::Number(3))
        );
        assert_eq!(
            route("/replication/v12/changes"),
            Route::Changes(Version::Number(12))
        );
        assert_eq!(
            route("/replication/three/snapshot"),
            Route::Snapshot(Version::Invalid("/replication/three/snapshot".into()))
        );
        assert_eq!(
            route("/replication/v/changes"),
            Route::Changes(Version::Invalid("/replication/v/changes".into()))
        );
        for path in [
            "/replication/v3/snapshot/",
            "/replication//snapshot",
            "/replication/v3/x/snapshot",
            "/replication/v3/snapshots",
            "/prefix/replication/v3/snapshot",
            "/replication/v3",
            "/keepalive/",
            "",
        ] {
            assert_eq!(route(path), Route::NotFound, "{path}");
        }
        assert_eq!(
            route("/replication/v99999999999999999999999/snapshot"),
            Route::Snapshot(Version::Number(u64::MAX))
        );
    }

    #[test]
    fn snapshot_checks_in_zeros_order() {
        let v = |n| Version::Number(n);
        assert_eq!(
            check_snapshot(&v(3), Some("taskID=t1")),
            Ok((3, "t1".into()))
        );
        assert_eq!(
            check_snapshot(&v(6), Some("taskID=a%2Fb+c")),
            Ok((6, "a/b c".into()))
        );
        assert_eq!(
            check_snapshot(&v(3), Some("taskID=first&taskID=second")),
            Ok((3, "first".into()))
        );
        assert_eq!(check_snapshot(&v(3), None), Err(MISSING_TASK_ID.into()));
        assert_eq!(
            check_snapshot(&v(3), Some("taskID=")),
            Err(MISSING_TASK_ID.into())
        );
        assert_eq!(
            check_snapshot(&v(3), Some("%%%&&=")),
            Err(MISSING_TASK_ID.into())
        );
        assert_eq!(
            check_snapshot(&v(7), Some("taskID=t1")),
            Err(
                "Error: Cannot service client at protocol v7. Supported protocols: [v3 ... v6]"
                    .into()
            )
        );
        assert_eq!(
            check_snapshot(&v(2), None),
            Err(
                "Error: Cannot service client at protocol v2. Supported protocols: [v3 ... v6]"
                    .into()
            )
        );
        assert_eq!(
            check_snapshot(&Version::Invalid("/replication/x/snapshot".into()), None),
            Err("Error: invalid path: /replication/x/snapshot".into())
        );
    }

    #[test]
    fn changes_versions_one_to_six_are_forwarded() {
        for n in 1..=6 {
            assert_eq!(check_changes(&Version::Number(n)), Ok(()));
        }
        assert_eq!(
            check_changes(&Version::Number(0)),
            Err(
                "Error: Cannot service client at protocol v0. Supported protocols: [v1 ... v6]"
                    .into()
            )
        );
        assert_eq!(
            check_changes(&Version::Number(7)),
            Err(
                "Error: Cannot service client at protocol v7. Supported protocols: [v1 ... v6]"
                    .into()
            )
        );
        assert_eq!(
            check_changes(&Version::Invalid("/replication/vx/changes".into())),
            Err("Error: invalid path: /replication/vx/changes".into())
        );
    }

    #[test]
    fn subscriber_context_is_read_like_zero() {
        let q = "taskID=0042ea&id=serving-replicator-4242&mode=serving&watermark=718sh0nk8\
                 &replicaVersion=618ocqq8&initial=true";
        assert_eq!(
            parse_subscriber_context(Some(q)),
            SubscriberContext {
                id: Some("serving-replicator-4242".into()),
                task_id: Some("0042ea".into()),
                mode: Mode::Serving,
                replica_version: Some("618ocqq8".into()),
                watermark: Some("718sh0nk8".into()),
                initial: true,
            }
        );
        // Percent-decoding and '+'; the first occurrence wins even when it is empty; unknown keys are ignored.
        let ctx = parse_subscriber_context(Some(
            "id=rm-1%2Fbackup+1&taskID=&taskID=t2&mode=backup&initial=TRUE&x=1&id=second",
        ));
        assert_eq!(ctx.id.as_deref(), Some("rm-1/backup 1"));
        assert_eq!(ctx.task_id, None);
        assert_eq!(ctx.mode, Mode::Backup);
        assert!(!ctx.initial);
        assert_eq!(ctx.watermark, None);
        assert_eq!(parse_subscriber_context(None), SubscriberContext::default());
        assert_eq!(
            parse_subscriber_context(Some("&&=&%%")),
            SubscriberContext::default()
        );
        assert_eq!(
            parse_subscriber_context(Some("mode=Backup&initial=1")).mode,
            Mode::Serving
        );
        assert!(parse_subscriber_context(Some("initial=tru%65")).initial);
        assert!(!parse_subscriber_context(Some("initial=&initial=true")).initial);
    }

    #[test]
    fn only_the_initial_value_zero_reads_is_rewritten() {
        let q = "taskID=t1&id=rm-1%2Fbackup-replicator-1234&mode=backup&watermark=0a&replicaVersion=01&initial=true";
        assert_eq!(
            suppress_initial(q),
            "taskID=t1&id=rm-1%2Fbackup-replicator-1234&mode=backup&watermark=0a&replicaVersion=01&initial=false"
        );
        assert_eq!(suppress_initial("initial=true&id=x"), "initial=false&id=x");
        assert_eq!(suppress_initial("initial=tru%65"), "initial=false");
        assert_eq!(
            suppress_initial("%69nitial=true&a=b"),
            "%69nitial=false&a=b"
        );
        assert_eq!(
            suppress_initial("&&initial=true&&initial=true"),
            "&&initial=false&&initial=true"
        );
        for unchanged in [
            "",
            "id=x",
            "initial=false",
            "initial=",
            "initial",
            "initial=TRUE",
            "initial=true1",
            "initial=&initial=true",
            "initials=true",
            "x=initial%3Dtrue",
        ] {
            assert!(
                matches!(suppress_initial(unchanged), Cow::Borrowed(s) if s == unchanged),
                "{unchanged}"
            );
        }
    }

    #[test]
    fn status_frame_is_id_first_without_whitespace() {
        assert_eq!(
            snapshot_status_v3("s3://acme-zero/replica"),
            r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica"}]}"#
        );
        assert_eq!(
            snapshot_status_v3("file:///a \"b\"\\"),
            r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"file:///a \"b\"\\"}]}"#
        );
    }

    #[test]
    fn v4_status_adds_replica_version_and_min_watermark() {
        assert_eq!(
            snapshot_status_v4("s3://acme-zero/replica", "618ocqq8", "718sh0nk8"),
            r#"{"id":1,"msg":["status",{"tag":"status","backupURL":"s3://acme-zero/replica","replicaVersion":"618ocqq8","minWatermark":"718sh0nk8"}]}"#
        );
    }

    #[test]
    fn acks_are_strict() {
        assert_eq!(decode_ack(br#"{"ack":1}"#), Ok(1));
        assert_eq!(decode_ack(br#" { "ack" : 42 } "#), Ok(42));
        assert_eq!(decode_ack(br#"{"ack":0}"#), Ok(0));
        assert_eq!(decode_ack(br#"{"ack":18446744073709551615}"#), Ok(u64::MAX));
        for bad in [
            &br#"{"ack":1,"x":2}"#[..],
            br#"{"ack":"1"}"#,
            br#"{"ack":-1}"#,
            br#"{"ack":1.5}"#,
            br#"{"ack":01}"#,
            br#"{"ack":18446744073709551616}"#,
            br#"{"ack":1}}"#,
            br#"{"ack":}"#,
            br#"{}"#,
            br#"[1]"#,
            b"ack 1",
            b"",
        ] {
            assert!(decode_ack(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn close_reasons_are_cut_like_zeros() {
        assert_eq!(close_reason("short"), "short");
        let exact = "x".repeat(123);
        assert_eq!(close_reason(&exact), exact);
        let long = "y".repeat(200);
        assert_eq!(close_reason(&long), format!("{}...", "y".repeat(120)));
        // Multi-byte characters: 120 chars would be 240 bytes, so characters are dropped until it fits.
        let wide = "é".repeat(100);
        let cut = close_reason(&wide);
        assert!(cut.len() <= 123 && cut.ends_with("..."), "{cut}");
        assert_eq!(cut, format!("{}...", "é".repeat(60)));
    }
}
