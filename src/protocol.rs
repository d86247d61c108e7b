//! Zero's change-streamer wire protocol, without I/O: which paths exist, which protocol versions are served,
//! the exact rejection texts Zero uses, the snapshot status frame, and strict ack decoding (PROTOCOL.md §3-§5).

/// Protocol versions whose `/snapshot` status this sidecar can produce. v3 is Zero 0.20; v4+ add fields the
/// status carries when the change DB is known.
pub const SNAPSHOT_VERSIONS: std::ops::RangeInclusive<u64> = 3..=6;

/// WebSocket close codes used by the sidecar (RFC 6455 §7.4.1).
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

/// Matches paths as Zero's Fastify routes do (PROTOCOL.md §3.2): exactly `/replication/:segment/(snapshot|changes)`,
/// one segment, no trailing slash; then the version is read from the segment.
pub fn route(path: &str) -> Route {
    match path {
        "/" => return Route::Root,
        "/keepalive" => return Route::Keepalive,
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

/// Reads a query parameter as Zero does (PROTOCOL.md §6.1): form-urlencoded, first occurrence wins, and an empty
/// value counts as absent.
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

/// The v3 snapshot status, id first and without whitespace so that every Zero client version accepts it
/// (PROTOCOL.md §4.1, §5.2).
pub fn snapshot_status_v3(backup_url: &str) -> String {
    let url = serde_json::to_string(backup_url).expect("a string serializes");
    format!(r#"{{"id":1,"msg":["status",{{"tag":"status","backupURL":{url}}}]}}"#)
}

/// The v4+ snapshot status: v3's fields plus the change-streamer's `replicaVersion` and `minWatermark`, the
/// earliest watermark catch-up can start from (PROTOCOL.md §5.2, §12).
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
/// Anything else, extra keys included, is an error (PROTOCOL.md §4.1).
pub fn decode_ack(text: &[u8]) -> Result<u64, AckError> {
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

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid ack: {0}")]
pub struct AckError(pub String);

/// Cuts a close reason to the 123 bytes a close frame allows, the way Zero's `closeWithError` does: keep at most
/// 120 characters, then drop characters until the text plus `...` fits (PROTOCOL.md §3.3).
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
        for bad in [
            &br#"{"ack":1,"x":2}"#[..],
            br#"{"ack":"1"}"#,
            br#"{"ack":-1}"#,
            br#"{"ack":1.5}"#,
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
