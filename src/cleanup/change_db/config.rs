//! `[change_db]`: where Zero's change DB is.

use crate::keys;

keys::section! {
    /// `[change_db]`
    pub struct ChangeDbConfig(s) {
        /// PostgreSQL connection string of Zero's change DB (ZERO_CHANGE_DB), URL or key=value form. Prefer setting it
        /// through LITESTREAM_SIDECAR__CHANGE_DB__URL from a root-only environment file; the password is never logged.
        url: tokio_postgres::Config = key(
            "postgres://zero@127.0.0.1:5432/zero",
            |text: String| {
                text.parse::<tokio_postgres::Config>()
                    .map_err(|e| format!("not a PostgreSQL connection string: {e}"))
            },
            hide = redact_db_url,
        ),
    }
}

/// Hides the password of a `postgres://` URL or a `password=` pair of a key-value connection string.
pub fn redact_db_url(text: &str) -> String {
    if let Ok(mut url) = url::Url::parse(text) {
        if url.password().is_some() {
            let _ = url.set_password(Some("REDACTED"));
        }
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if k == "password" {
                    "REDACTED".into()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        if pairs.iter().any(|(k, _)| k == "password") {
            url.query_pairs_mut().clear().extend_pairs(pairs);
        }
        return url.to_string();
    }
    text.split_whitespace()
        .map(|pair| match pair.split_once('=') {
            Some((key, _)) if key.trim() == "password" => "password=REDACTED".to_string(),
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}
