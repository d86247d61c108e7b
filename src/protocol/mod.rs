//! Zero's change-streamer wire protocol, without I/O: which paths exist, which protocol versions are served,
//! the exact rejection texts Zero uses, the snapshot status frame, strict ack decoding, and how a `/changes`
//! query string is read and forwarded (docs/protocol.md, "Paths and versions" to "The change stream").

pub mod inspect;
pub mod shard;
pub mod versions;

use std::borrow::Cow;

/// Protocol versions whose `/snapshot` status this sidecar can produce. v3 is Zero 0.20; v4+ add fields the
/// status carries when the change DB is known. Narrowed further to what the upstream serves, once known.
pub const SNAPSHOT_VERSIONS: std::ops::RangeInclusive<u64> = 3..=6;

/// Protocol versions the `/changes` relay forwards: what some Zero release up to v6 speaks, narrowed to what the
/// upstream change-streamer serves once that is known (Zero 0.20 serves v1-v3, 1.10 v4-v6); while it is not, the
/// upstream decides, and closes the others with 1002.
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

/// Why a `/snapshot` request is refused before the upgrade, with Zero's own message as the body. `upstream` is the
/// range the upstream change-streamer serves, when known: a status is only worth handing a client whose
/// subscription that upstream will then accept (docs/protocol.md, "Protocol versions the upstream serves").
pub fn check_snapshot(
    version: &Version,
    query: Option<&str>,
    upstream: Option<&versions::Versions>,
) -> Result<(u64, String), String> {
    let version = match version {
        Version::Invalid(path) => return Err(invalid_path(path)),
        Version::Number(n) => *n,
    };
    versions::check_version(version, &SNAPSHOT_VERSIONS, upstream)?;
    let task_id = query_param(query, "taskID").ok_or_else(|| MISSING_TASK_ID.to_string())?;
    Ok((version, task_id))
}

/// Why a `/changes` request is refused before the upgrade: Zero's message for a path or a version no Zero release
/// serves, or that the upstream (`upstream`, when known) does not serve. Everything else (missing parameters, wrong
/// replica version) is the upstream's to decide.
pub fn check_changes(
    version: &Version,
    upstream: Option<&versions::Versions>,
) -> Result<(), String> {
    match version {
        Version::Invalid(path) => Err(invalid_path(path)),
        Version::Number(n) => versions::check_version(*n, &CHANGES_VERSIONS, upstream),
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
/// earliest watermark catch-up can start from, and, when known, `replicaSize`: the replica's size in bytes, from
/// which a Zero 1.10 view-syncer reports its restore's progress (older ones read the status with unknown keys
/// allowed, and ignore it: docs/protocol.md, "The snapshot status").
pub fn snapshot_status_v4(
    backup_url: &str,
    replica_version: &str,
    min_watermark: &str,
    replica_size: Option<u64>,
) -> String {
    let json = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let size = replica_size
        .map(|bytes| format!(r#","replicaSize":{bytes}"#))
        .unwrap_or_default();
    format!(
        r#"{{"id":1,"msg":["status",{{"tag":"status","backupURL":{},"replicaVersion":{},"minWatermark":{}{size}}}]}}"#,
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
mod tests;
