//! `[log]`: how the sidecar logs.

use serde::{Deserialize, Serialize};

use crate::keys;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

keys::section! {
    /// `[log]`
    pub struct LogConfig(s) {
        /// "text" for people, "json" for log collectors; both carry the same fields.
        format: LogFormat = key("text", |text: String| match text.as_str() {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("{other:?} is neither \"text\" nor \"json\"")),
        }),
        /// Log filter (tracing EnvFilter syntax). The RUST_LOG environment variable wins when set.
        filter: String = key("warn,litestream_sidecar=info", |text: String| {
            log_filter(&text).map(|_| text)
        }),
    }
}

/// The filter of `log.filter` or `RUST_LOG`, each comma-separated directive trimmed first: tracing-subscriber finds
/// a directive's parts in its trimmed text but cuts them from the untrimmed one, which garbles a directive after
/// `, ` and panics when a cut falls inside a multi-byte character.
pub fn log_filter(directives: &str) -> Result<tracing_subscriber::EnvFilter, String> {
    let trimmed: Vec<&str> = directives.split(',').map(str::trim).collect();
    tracing_subscriber::EnvFilter::try_new(trimmed.join(",")).map_err(|e| e.to_string())
}
