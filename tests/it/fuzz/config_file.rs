//! sidecar.toml and the environment.

use super::*;

const REFERENCE_TOML: &str = include_str!("../../../sidecar.toml");

/// Every key of `sidecar.toml`, by section.
const KEYS: &[(&str, &[&str])] = &[
    (
        "server",
        &[
            "listen",
            "ping_interval",
            "peer_timeout",
            "max_message_bytes",
            "shutdown_grace",
            "allow",
            "max_connections",
            "header_read_timeout",
            "max_header_bytes",
            "tls_cert_file",
            "tls_key_file",
        ],
    ),
    (
        "litestream",
        &[
            "backup_url",
            "metrics_url",
            "check_interval",
            "scrape_timeout",
            "max_page_bytes",
            "db",
            "name",
            "proxy_listen",
            "proxy_mode",
        ],
    ),
    (
        "backup",
        &[
            "verify",
            "stale_after",
            "list_timeout",
            "endpoint",
            "region",
            "force_path_style",
            "allow_http",
        ],
    ),
    ("zero", &["app_id", "shard_num"]),
    ("change_db", &["url"]),
    (
        "cleanup",
        &[
            "enabled",
            "initial_delay",
            "reservations",
            "reconnect_grace",
            "without_subscribers",
            "batch_rows",
            "state_file",
        ],
    ),
    ("discovery", &["mode", "advertise_address", "interval"]),
    (
        "upstream",
        &[
            "address",
            "advertised_address",
            "connect_timeout",
            "silence_timeout",
            "tls",
            "tls_ca_file",
            "tls_server_name",
            "protocols",
        ],
    ),
    (
        "relay",
        &[
            "suppress_upstream_cleanup",
            "max_buffered_bytes",
            "max_pending_commits",
            "write_stall_timeout",
        ],
    ),
    ("log", &["format", "filter"]),
];

/// Values of the kinds the keys take, valid and not: durations, sizes, addresses, URLs, modes, filters.
const TEXT_VALUES: &[&str] = &[
    "",
    " ",
    "30s",
    "0s",
    "10ms",
    "1h 30m",
    "250ms",
    "31s",
    "60",
    "5 parsecs",
    "-1s",
    "18446744073709551615s",
    "0.0.0.0:4851",
    "[::1]:4851",
    "10.0.0.0/8",
    "10.1.2.3/8",
    "::1/129",
    "fd00::/8, 127.0.0.1",
    "127.0.0.1:0",
    "localhost:4850",
    "ws://10.0.0.5:4849",
    "wss://rm.internal:4849/",
    "host:99999",
    ":1",
    "[::]:1",
    "s3://bucket/zero/replica",
    "file:///backups/replica",
    "gcs://b/p",
    "s3://",
    "file://relative",
    "http://127.0.0.1:4860/metrics",
    "http://user:pw@127.0.0.1:4860/metrics",
    "https://127.0.0.1/metrics",
    "http://localhost:4850/metrics",
    "https://minio.internal:9000",
    "http://minio:9000",
    "https://x/path",
    "postgres://zero:hunter2@127.0.0.1:5432/zero",
    "host=/tmp password=x",
    "postgres://[::1",
    "hide",
    "clamp",
    "auto",
    "4..6",
    "v1..v3",
    "6..4",
    "0..9",
    "pin",
    "pause",
    "hold",
    "after_grace",
    "verify",
    "adopt",
    "owner",
    "off",
    "text",
    "json",
    "zero",
    "Zero",
    "a-b",
    "info",
    "litestream_sidecar=debug,info",
    "info, \u{e9}\u{e9}=debug",
    "[[[",
    "=x",
    "\u{e9}",
    "\u{0}",
    "a\tb",
    "18446744073709551615",
    "-9223372036854775808",
    "9223372036854775808",
    "true",
    "1e3",
];

fn toml_value() -> impl Strategy<Value = String> + Clone {
    let text = prop_oneof![
        4 => select(TEXT_VALUES).prop_map(String::from),
        1 => "\\PC{0,12}",
    ];
    prop_oneof![
        5 => text.clone().prop_map(|s| toml_string(&s)),
        1 => text.prop_filter_map("a literal string has no quote or newline", |s| {
            (!s.contains(['\'', '\n', '\r'])).then(|| format!("'{s}'"))
        }),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        2 => select(&["0", "1", "2", "1000", "1024", "104857600", "134217728", "4096", "1000000", "1000001", "-1", "4294967296", "0x10", "1_000", "9223372036854775807"][..]).prop_map(String::from),
        1 => select(&["true", "false", "1.5", "nan", "inf", "[]", "[1, 2]", "{}", "{ a = 1 }", "1979-05-27T07:32:00Z", "\"\"\"\nx\"\"\""][..]).prop_map(String::from),
    ]
}

fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_document() -> impl Strategy<Value = String> + Clone {
    let key = (0..KEYS.len(), any::<Index>()).prop_map(|(section, key)| {
        let (section, keys) = KEYS[section];
        (section, *key.get(keys))
    });
    let line = prop_oneof![
        12 => (key, toml_value()).prop_map(|((section, key), value)| (section.to_string(), format!("{key} = {value}"))),
        1 => (0..KEYS.len(), "[a-z_]{1,8}", toml_value()).prop_map(|(section, key, value)| (KEYS[section].0.to_string(), format!("{key} = {value}"))),
        1 => ("[a-z_]{1,8}", toml_value()).prop_map(|(section, value)| (section, format!("x = {value}"))),
    ];
    (vec(line, 0..12), any::<bool>()).prop_map(|(lines, dotted)| {
        let mut doc = String::new();
        let mut current = String::new();
        for (section, line) in lines {
            if dotted {
                doc.push_str(&format!("{section}.{line}\n"));
                continue;
            }
            if section != current {
                doc.push_str(&format!("[{section}]\n"));
                current = section;
            }
            doc.push_str(&line);
            doc.push('\n');
        }
        doc
    })
}

fn env_map() -> impl Strategy<Value = HashMap<String, String>> + Clone {
    let real = (0..KEYS.len(), any::<Index>(), any::<bool>()).prop_map(|(section, key, lower)| {
        let (section, keys) = KEYS[section];
        let name = format!("LITESTREAM_SIDECAR__{}__{}", section, key.get(keys)).to_uppercase();
        if lower {
            name.to_lowercase()
        } else {
            name
        }
    });
    let name = prop_oneof![
        8 => real,
        1 => select(&[
            "LITESTREAM_SIDECAR__NOPE", "LITESTREAM_SIDECAR__SERVER", "LITESTREAM_SIDECAR____",
            "LITESTREAM_SIDECARX", "LITESTREAM_SIDECAR__SERVER__LISTEN__X", "LITESTREAM_SIDECAR_SERVER_LISTEN",
            "PATH", "",
        ][..]).prop_map(String::from),
    ];
    let value = prop_oneof![
        4 => select(TEXT_VALUES).prop_map(String::from),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => "\\PC{0,12}",
    ];
    vec((name, value), 0..5).prop_map(|pairs| pairs.into_iter().collect())
}

fn config_input() -> impl Strategy<Value = (String, HashMap<String, String>)> + Clone {
    let text = prop_oneof![
        1 => bytes(b"[]=\"'.#\n \\", 200).prop_map(lossy),
        4 => toml_document(),
        1 => toml_document().prop_map(|doc| format!("{REFERENCE_TOML}{doc}")),
        2 => mutated(Just(REFERENCE_TOML.as_bytes().to_vec()), b"[]=\"'.#\n \\0123456789").prop_map(lossy),
    ];
    (text, prop_oneof![1 => Just(HashMap::new()), 2 => env_map()])
}

/// Peak heap of loading `sidecar.toml` and its overrides per input byte. The TOML parser and then the config crate
/// each build a tree of the document, the config crate's recording where every value came from: a nested inline
/// table (`{b=`, 3 bytes) costs about 1 KiB across them, the worst shape found (some 330 bytes a byte).
const CONFIG_PER_BYTE: usize = 400;

/// An empty document loads in well under 1 KiB; an error message naming a key and its expected type is a few
/// more.
const CONFIG_FIXED: usize = 16 << 10;

/// Loading, validating, and printing what `--check-config` prints.
#[test]
fn config_file() {
    fuzz("config_file", config_input(), |(text, env)| {
        let len = text.len() + env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        let overrides = env.clone();
        let raw = match bounded(
            "config::from_toml_str",
            len,
            (CONFIG_FIXED, CONFIG_PER_BYTE),
            || config::from_toml_str(&text, Some(overrides)),
        )? {
            Ok(raw) => raw,
            Err(err) => return message_is_clear("config::from_toml_str", &err.to_string()),
        };
        match bounded("RawConfig::validate", len, (CONFIG_FIXED, 8), || {
            raw.validate()
        })? {
            Ok(_) => {
                bounded(
                    "RawConfig::to_redacted_toml",
                    len,
                    (CONFIG_FIXED, 16),
                    || raw.to_redacted_toml(),
                )?;
            }
            Err(ConfigError::Invalid(problems)) => {
                prop_assert!(!problems.is_empty());
                for problem in &problems {
                    message_is_clear(&problem.key, &problem.problem)?;
                }
            }
            Err(other) => prop_assert!(false, "validate failed without naming a key: {other}"),
        }
        Ok(())
    });
}
