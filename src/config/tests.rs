use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::*;
use crate::cleanup::change_db::config::redact_db_url;
use crate::cleanup::config::{
    default_state_file, ReservationMode, RestoreLimit, WithoutSubscribers,
};
use crate::keys::without_userinfo;
use crate::net::tls::ServerTlsFiles;
use crate::ops::log::log_filter;
const MINIMAL: &str =
        "[litestream]\nbackup_url = \"s3://bucket/replica\"\n[discovery]\nadvertise_address = \"10.0.0.5:4851\"\n";

fn errors_of(text: &str) -> Vec<KeyError> {
    match from_toml_str(text, Some(Default::default()))
        .unwrap()
        .validate()
    {
        Err(ConfigError::Invalid(errors)) => errors,
        other => panic!("expected invalid config, got {other:?}"),
    }
}

fn keys(errors: &[KeyError]) -> Vec<&str> {
    errors.iter().map(|e| e.key.as_str()).collect()
}

#[test]
fn reference_file_is_valid_and_matches_the_defaults() {
    let text = include_str!("../../sidecar.toml");
    let raw = from_toml_str(text, Some(Default::default())).unwrap();
    let config = raw.validate().unwrap();
    assert_eq!(config.server.listen, "0.0.0.0:4851".parse().unwrap());
    assert_eq!(config.server.ping_interval, Duration::from_secs(10));
    assert_eq!(config.server.peer_timeout, Duration::from_secs(60));
    assert_eq!(config.server.max_message_bytes, 128 << 20);
    assert_eq!(config.relay.write_stall_timeout, Duration::from_secs(60));
    // Every default written in the reference file is the code's default: only backup_url has none.
    let mut from_file = toml::Value::Table(raw.effective());
    let mut defaults = toml::Value::Table(RawConfig::default().effective());
    for (section, key) in [
        ("litestream", "backup_url"),
        ("discovery", "advertise_address"),
    ] {
        from_file[section][key] = "".into();
        defaults[section][key] = "".into();
    }
    assert_eq!(from_file, defaults);
}

/// Every key the code accepts is written in the reference file, under a comment saying what it is for.
#[test]
fn reference_file_documents_every_key() {
    let text = include_str!("../../sidecar.toml");
    let written: toml::Table = text.parse().unwrap();
    let accepted = toml::Value::Table(RawConfig::default().effective());
    let accepted = accepted.as_table().unwrap();
    let sections = |t: &toml::Table| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(sections(&written), sections(accepted), "sections");
    for (section, keys) in accepted {
        let keys = keys.as_table().unwrap();
        let in_file = written[section].as_table().unwrap();
        assert_eq!(sections(in_file), sections(keys), "keys of [{section}]");
        // The line before each key is a comment (the key's documentation).
        let body = text.split(&format!("[{section}]\n")).nth(1).unwrap();
        for key in keys.keys() {
            let at = body
                .find(&format!("\n{key} = "))
                .unwrap_or_else(|| panic!("{section}.{key}"));
            let previous = body[..at].lines().last().unwrap_or("");
            assert!(
                previous.starts_with('#'),
                "{section}.{key} has no comment above it"
            );
        }
    }
}

#[test]
fn default_port_is_none_of_zeros() {
    let port = RawConfig::default().effective()["server"]["listen"]
        .as_str()
        .unwrap()
        .parse::<SocketAddr>()
        .unwrap()
        .port();
    assert!(![4848, 4849, 4850].contains(&port));
}

#[test]
fn minimal_file_is_valid() {
    let config = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.litestream.backup_url, "s3://bucket/replica");
    assert_eq!(config.zero.cdc_schema(), "zero_0/cdc");
}

#[test]
fn every_problem_is_reported_with_its_key() {
    let errors = errors_of(
        r#"
            [server]
            listen = "localhost"
            ping_interval = "31s"
            max_message_bytes = 1000
            shutdown_grace = "soon"
            [litestream]
            backup_url = ""
            [zero]
            app_id = "Zero-App"
            shard_num = -1
            [cleanup]
            initial_delay = "30"
            [upstream]
            address = "localhost"
            connect_timeout = "0s"
            silence_timeout = "33"
            [relay]
            max_buffered_bytes = 100
            max_pending_commits = 1
            ack_batch_window = "1s"
            ack_wakeup_bytes = 16385
            ack_wakeup_wait = "2s"
            [log]
            format = "xml"
            "#,
    );
    assert_eq!(
        keys(&errors),
        [
            "server.listen",
            "server.ping_interval",
            "server.max_message_bytes",
            "server.shutdown_grace",
            "litestream.backup_url",
            "zero.app_id",
            "zero.shard_num",
            "cleanup.initial_delay",
            "discovery.advertise_address",
            "upstream.address",
            "upstream.connect_timeout",
            "upstream.silence_timeout",
            "relay.max_buffered_bytes",
            "relay.max_pending_commits",
            "relay.ack_batch_window",
            "relay.ack_wakeup_bytes",
            "relay.ack_wakeup_wait",
            "log.format",
        ]
    );
    let app_id = errors.iter().find(|e| e.key == "zero.app_id").unwrap();
    assert!(app_id.problem.contains("^[a-z0-9_]+$"), "{app_id}");
}

#[test]
fn log_filters_with_spaces_and_wide_characters_are_read_not_panicked_on() {
    // tracing-subscriber alone panics on this one (a cut inside 'é').
    assert!(log_filter(" \u{e9}\u{e9}=info").is_ok());
    let filter = log_filter("info, litestream_sidecar=debug").unwrap();
    assert_eq!(filter.to_string(), "litestream_sidecar=debug,info");
    let errors = errors_of(&format!(
        "{MINIMAL}[log]\nfilter = \" \u{e9}\u{e9}=info,=\"\n"
    ));
    assert_eq!(keys(&errors), ["log.filter"]);
}

#[test]
fn unknown_keys_are_refused() {
    let errors = errors_of(&format!(
        "{MINIMAL}backup_ulr = \"x\"\n[litestream_]\nx = 1\n"
    ));
    assert_eq!(keys(&errors), ["discovery.backup_ulr", "litestream_"]);
    assert_eq!(errors[0].problem, "unknown key");
    assert_eq!(errors[1].problem, "unknown section");
}

#[test]
fn environment_overrides_the_file() {
    let env = [
        (
            "LITESTREAM_SIDECAR__LITESTREAM__BACKUP_URL",
            "file:///backups/replica",
        ),
        ("LITESTREAM_SIDECAR__ZERO__SHARD_NUM", "3"),
        ("LITESTREAM_SIDECAR__SERVER__PING_INTERVAL", "15s"),
        ("UNRELATED", "ignored"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let config = from_toml_str(MINIMAL, Some(env))
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.litestream.backup_url, "file:///backups/replica");
    assert_eq!(config.zero.shard_num, 3);
    assert_eq!(config.zero.cdc_schema(), "zero_3/cdc");
    assert_eq!(config.server.ping_interval, Duration::from_secs(15));
}

#[test]
fn access_and_connection_limits_parse_from_the_file_or_the_environment() {
    let text =
        format!("{MINIMAL}[server]\nallow = [\"10.0.0.0/8\", \"::1\"]\nmax_connections = 100\n");
    let config = from_toml_str(&text, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert!(config.server.allow.allows("10.1.1.1".parse().unwrap()));
    assert!(!config.server.allow.allows("192.168.1.1".parse().unwrap()));
    assert_eq!(config.server.max_connections, 100);
    assert_eq!(config.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(config.server.max_header_bytes, 16 << 10);

    let env = [(
        "LITESTREAM_SIDECAR__SERVER__ALLOW".to_string(),
        "127.0.0.0/8, 192.168.0.0/16 ::1".to_string(),
    )];
    let config = from_toml_str(MINIMAL, Some(env.into_iter().collect()))
        .unwrap()
        .validate()
        .unwrap();
    for (ip, allowed) in [
        ("127.0.0.1", true),
        ("192.168.7.7", true),
        ("::1", true),
        ("10.0.0.1", false),
    ] {
        assert_eq!(
            config.server.allow.allows(ip.parse().unwrap()),
            allowed,
            "{ip}"
        );
    }
    let defaults = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert!(
        defaults.server.allow.is_open(),
        "no list: everyone, as before"
    );

    let errors = errors_of(&format!(
            "{MINIMAL}[server]\nallow = [\"10.0.0.0/8\", \"10.1.0.0/8\", \"example.com\"]\nmax_connections = 0\n\
             header_read_timeout = \"1ms\"\nmax_header_bytes = 100\n"
        ));
    assert_eq!(
        keys(&errors),
        [
            "server.allow",
            "server.max_connections",
            "server.header_read_timeout",
            "server.max_header_bytes"
        ]
    );
    let allow = errors[0].to_string();
    assert!(
        allow.contains("did you mean 10.0.0.0/8?") && allow.contains("\"example.com\""),
        "{allow}"
    );
}

#[test]
fn userinfo_is_hidden_wherever_it_sits() {
    for (text, shown) in [
        ("http://u:p@host:1/x", "http://***@host:1/x"),
        ("https://a@b@host/", "https://***@host/"),
        (
            "s3://KEY:SECRET@bucket/path/x@y",
            "s3://***@bucket/path/x@y",
        ),
        ("minio:secret@127.0.0.1", "***@127.0.0.1"),
        ("http://host/p?u=a@b", "http://host/p?u=a@b"),
        ("s3://bucket/replica", "s3://bucket/replica"),
        ("", ""),
    ] {
        assert_eq!(without_userinfo(text), shown, "{text}");
    }
}

#[test]
fn passwords_are_redacted() {
    assert_eq!(
        redact_db_url("postgres://zero:s3cret@db:5432/zero?sslmode=require"),
        "postgres://zero:REDACTED@db:5432/zero?sslmode=require"
    );
    assert_eq!(
        redact_db_url("postgres://db/zero?user=zero&password=s3cret"),
        "postgres://db/zero?user=zero&password=REDACTED"
    );
    assert_eq!(
        redact_db_url("host=db user=zero password=s3cret dbname=zero"),
        "host=db user=zero password=REDACTED dbname=zero"
    );
    let raw = from_toml_str(
        &format!("{MINIMAL}[change_db]\nurl = \"postgres://zero:s3cret@db/zero\"\n"),
        Some(Default::default()),
    )
    .unwrap();
    let shown = raw.to_redacted_toml();
    assert!(!shown.contains("s3cret"), "{shown}");
    assert!(shown.contains("REDACTED"), "{shown}");
    assert!(!format!("{:?}", raw.validate().unwrap()).contains("s3cret"));
}

#[test]
fn scraping_the_proxy_itself_is_refused() {
    let errors = errors_of(
        "[litestream]\nbackup_url = \"s3://b\"\nmetrics_url = \"http://localhost:4850/metrics\"\n\
             [discovery]\nmode = \"off\"\n",
    );
    assert_eq!(keys(&errors), ["litestream.metrics_url"]);
    let errors = errors_of(
            "[litestream]\nbackup_url = \"s3://b\"\nmetrics_url = \"https://x/metrics\"\nproxy_listen = \"4850\"\n\
             check_interval = \"500ms\"\n[cleanup]\nbatch_rows = 0\nreservations = \"pin\"\n\
             [discovery]\nadvertise_address = \"0.0.0.0:4851\"\n",
        );
    assert_eq!(
        keys(&errors),
        [
            "litestream.proxy_listen",
            "litestream.metrics_url",
            "litestream.check_interval",
            "cleanup.batch_rows",
            "discovery.advertise_address"
        ]
    );
}

#[test]
fn reservation_mode_is_pin_or_pause() {
    let config = from_toml_str(
        &format!("{MINIMAL}[cleanup]\nreservations = \"pause\"\n"),
        Some(Default::default()),
    )
    .unwrap()
    .validate()
    .unwrap();
    assert_eq!(config.cleanup.reservations, ReservationMode::Pause);
    let errors = errors_of(&format!("{MINIMAL}[cleanup]\nreservations = \"stop\"\n"));
    assert_eq!(keys(&errors), ["cleanup.reservations"]);
    assert!(errors[0].problem.contains("stop"), "{errors:?}");
}

#[test]
fn without_subscribers_holds_unless_told_otherwise() {
    let parse = |extra: &str| {
        from_toml_str(&format!("{MINIMAL}{extra}"), Some(Default::default()))
            .unwrap()
            .validate()
            .map(|config| config.cleanup.without_subscribers)
    };
    assert_eq!(parse("").unwrap(), WithoutSubscribers::Hold);
    assert_eq!(
        parse("[cleanup]\nwithout_subscribers = \"after_grace\"\n").unwrap(),
        WithoutSubscribers::AfterGrace
    );
    let err = parse("[cleanup]\nwithout_subscribers = \"always\"\n").unwrap_err();
    assert!(err.to_string().contains("always"), "{err}");
}

#[test]
fn reservation_mode_parses_lowercase_and_defaults_to_pin() {
    #[derive(Deserialize)]
    struct Cfg {
        reservations: ReservationMode,
    }
    let parse = |s: &str| toml::from_str::<Cfg>(s).map(|c| c.reservations);
    assert_eq!(
        parse(r#"reservations = "pin""#).unwrap(),
        ReservationMode::Pin
    );
    assert_eq!(
        parse(r#"reservations = "pause""#).unwrap(),
        ReservationMode::Pause
    );
    assert!(parse(r#"reservations = "Pause""#).is_err());
    assert_eq!(ReservationMode::default(), ReservationMode::Pin);
}

#[test]
fn relay_defaults_suppress_zeros_cleanup() {
    let config = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert!(config.relay.suppress_upstream_cleanup);
    assert_eq!(config.upstream.address, "127.0.0.1:4849");
    assert_eq!(config.upstream.advertised_address, "127.0.0.1:4849");
    assert_eq!(config.upstream.silence_timeout, Duration::from_secs(33));
    assert_eq!(config.relay.max_buffered_bytes, 64 << 10);

    let env = [
        (
            "LITESTREAM_SIDECAR__RELAY__SUPPRESS_UPSTREAM_CLEANUP",
            "false",
        ),
        ("LITESTREAM_SIDECAR__RELAY__MAX_BUFFERED_BYTES", "131072"),
        ("LITESTREAM_SIDECAR__UPSTREAM__ADDRESS", "zero-rm:4849"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let config = from_toml_str(MINIMAL, Some(env))
        .unwrap()
        .validate()
        .unwrap();
    assert!(!config.relay.suppress_upstream_cleanup);
    assert_eq!(config.relay.max_buffered_bytes, 128 << 10);
    assert_eq!(config.upstream.address, "zero-rm:4849");
}

#[test]
fn one_thread_and_no_ack_batching_by_default() {
    let config = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.server.worker_threads, 1);
    assert_eq!(config.relay.ack_batch_window, Duration::ZERO);
    assert_eq!(config.relay.ack_wakeup_bytes, 1024);
    assert_eq!(config.relay.ack_wakeup_wait, Duration::from_micros(500));

    let config = from_toml_str(
            &format!(
                "{MINIMAL}[server]\nworker_threads = 4\n[relay]\nack_batch_window = \"2ms\"\nack_wakeup_bytes = 0\n"
            ),
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.server.worker_threads, 4);
    assert_eq!(config.relay.ack_batch_window, Duration::from_millis(2));
    assert_eq!(config.relay.ack_wakeup_bytes, 0);

    let errors = errors_of(&format!(
        "{MINIMAL}[server]\nworker_threads = 0\n[relay]\nack_batch_window = \"21ms\"\n"
    ));
    assert_eq!(
        keys(&errors),
        ["server.worker_threads", "relay.ack_batch_window"]
    );
    let errors = errors_of(&format!("{MINIMAL}[server]\nworker_threads = 257\n"));
    assert_eq!(keys(&errors), ["server.worker_threads"]);
}

#[test]
fn peers_get_at_least_zeros_leniency_by_default() {
    let config = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    // Zero drops a client about 60 s after its last pong or message at worst (docs/protocol.md, "Liveness").
    assert!(config.server.peer_timeout >= Duration::from_secs(60));
    assert!(config.server.peer_timeout > config.server.ping_interval);
    assert_eq!(config.relay.write_stall_timeout, Duration::from_secs(60));

    let parse = |extra: &str| {
        from_toml_str(&format!("{MINIMAL}{extra}"), Some(Default::default()))
            .unwrap()
            .validate()
    };
    let config = parse("[server]\nping_interval = \"1s\"\npeer_timeout = \"4s\"\n").unwrap();
    assert_eq!(config.server.peer_timeout, Duration::from_secs(4));
    for (ping, timeout) in [("10s", "10s"), ("10s", "5s"), ("1s", "500ms")] {
        let errors = errors_of(&format!(
            "{MINIMAL}[server]\nping_interval = \"{ping}\"\npeer_timeout = \"{timeout}\"\n"
        ));
        assert_eq!(keys(&errors), ["server.peer_timeout"], "{ping} {timeout}");
        assert!(
            errors[0]
                .problem
                .contains("longer than server.ping_interval"),
            "{}",
            errors[0]
        );
    }
    // A timeout shorter than the default ping interval is refused too, with nothing else set.
    assert_eq!(
        keys(&errors_of(&format!(
            "{MINIMAL}[server]\npeer_timeout = \"5s\"\n"
        ))),
        ["server.peer_timeout"]
    );
    assert_eq!(
        keys(&errors_of(&format!(
            "{MINIMAL}[relay]\nwrite_stall_timeout = \"0s\"\n"
        ))),
        ["relay.write_stall_timeout"]
    );
}

#[test]
fn backup_verification_is_on_by_default_and_checked_clearly() {
    let config = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert!(config.backup.verify);
    assert_eq!(
        config.backup.drill_interval,
        Some(Duration::from_secs(3600))
    );
    assert_eq!(
        config.cleanup.requires,
        crate::cleanup::config::Requires::Listing
    );
    assert_eq!(config.backup.stale_after, Duration::from_secs(900));
    assert_eq!(
        config.backup.location,
        Some(crate::litestream::destination::Location::S3 {
            bucket: "bucket".into(),
            prefix: "replica".into()
        })
    );
    let errors = errors_of(
        "[litestream]\nbackup_url = \"gcs://b/r\"\n[discovery]\nmode = \"off\"\n\
             [backup]\nendpoint = \"http://127.0.0.1:9000\"\nslack = \"5m\"\n",
    );
    assert_eq!(
        keys(&errors),
        ["backup.slack", "litestream.backup_url", "backup.endpoint"]
    );
    assert!(
        errors[1].problem.contains("backup.verify = false"),
        "{errors:?}"
    );
    assert!(errors[2].problem.contains("allow_http"), "{errors:?}");
    // Not verified, a gcs:// destination is fine; a loopback http endpoint needs allow_http.
    let ok = from_toml_str(
        "[litestream]\nbackup_url = \"gcs://b/r\"\n[discovery]\nmode = \"off\"\n\
             [backup]\nverify = false\nendpoint = \"http://127.0.0.1:9000/\"\nallow_http = true\n",
        Some(Default::default()),
    )
    .unwrap()
    .validate()
    .unwrap();
    assert_eq!(ok.backup.location, None);
    assert_eq!(
        ok.backup.s3.endpoint.as_deref(),
        Some("http://127.0.0.1:9000")
    );
}

#[test]
fn durations_need_units() {
    assert_eq!(
        crate::keys::duration("30s".into()),
        Ok(Duration::from_secs(30))
    );
    assert_eq!(
        crate::keys::duration("250ms".into()),
        Ok(Duration::from_millis(250))
    );
    assert_eq!(
        crate::keys::duration("1h 30m".into()),
        Ok(Duration::from_secs(5400))
    );
    assert!(crate::keys::duration("30".into()).is_err());
    assert!(crate::keys::duration("".into()).is_err());
}

#[test]
fn the_state_is_kept_by_default_in_systemds_state_directory_or_var_lib() {
    let path = std::path::PathBuf::from;
    assert_eq!(
        default_state_file(None),
        path("/var/lib/litestream-sidecar/state.json")
    );
    assert_eq!(
        default_state_file(Some("")),
        path("/var/lib/litestream-sidecar/state.json")
    );
    assert_eq!(
        default_state_file(Some("/run/state/sidecar")),
        path("/run/state/sidecar/state.json")
    );
    assert_eq!(
        default_state_file(Some("/var/lib/a:/var/lib/b")),
        path("/var/lib/a/state.json")
    );
    let cleanup = |text: &str| {
        from_toml_str(
            &format!("{MINIMAL}[cleanup]\n{text}"),
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .map(|c| c.cleanup)
    };
    // Opting out is explicit.
    assert_eq!(cleanup("state_file = \"none\"\n").unwrap().state_file, None);
    assert_eq!(
        cleanup("state_file = \"/srv/s.json\"\n")
            .unwrap()
            .state_file,
        Some(path("/srv/s.json"))
    );
    let defaults = cleanup("").unwrap();
    assert!(defaults.state_file.is_some());
    assert_eq!(defaults.restore_limit, RestoreLimit::Auto);
    assert_eq!(defaults.hold_without_state, RestoreLimit::Auto);
    let set = cleanup("restore_limit = \"3h\"\nhold_without_state = \"0s\"\n").unwrap();
    assert_eq!(
        set.restore_limit,
        RestoreLimit::Fixed(Duration::from_secs(3 * 3600))
    );
    assert_eq!(set.hold_without_state, RestoreLimit::Fixed(Duration::ZERO));
    let err = cleanup("restore_limit = \"soon\"\n").unwrap_err();
    assert!(
        format!("{err:?}").contains("cleanup.restore_limit"),
        "{err:?}"
    );
}

#[test]
fn an_automatic_restore_limit_is_an_hour_per_50_gib_and_at_least_an_hour() {
    let hour = Duration::from_secs(3600);
    assert_eq!(RestoreLimit::Auto.for_size(None), hour);
    assert_eq!(RestoreLimit::Auto.for_size(Some(0)), hour);
    assert_eq!(RestoreLimit::Auto.for_size(Some(50 << 30)), hour);
    assert_eq!(RestoreLimit::Auto.for_size(Some((50 << 30) + 1)), 2 * hour);
    assert_eq!(RestoreLimit::Auto.for_size(Some(189 << 30)), 4 * hour);
    let fixed = RestoreLimit::Fixed(Duration::from_secs(90));
    assert_eq!(fixed.for_size(Some(1 << 40)), Duration::from_secs(90));
}

#[test]
fn tls_is_off_by_default_and_its_files_come_in_pairs() {
    let config = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(config.server.tls, None);
    assert_eq!(config.upstream.tls, None);

    let both = format!(
            "{MINIMAL}[server]\ntls_cert_file = \" /etc/s/cert.pem \"\ntls_key_file = \"/etc/s/key.pem\"\n"
        );
    let config = from_toml_str(&both, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(
        config.server.tls,
        Some(ServerTlsFiles {
            cert_file: "/etc/s/cert.pem".into(),
            key_file: "/etc/s/key.pem".into(),
        })
    );
    let errors = errors_of(&format!(
        "{MINIMAL}[server]\ntls_key_file = \"/etc/s/key.pem\"\n"
    ));
    assert_eq!(keys(&errors), ["server.tls_cert_file"]);
    assert!(errors[0].problem.contains("tls_key_file"), "{errors:?}");
    let errors = errors_of(&format!(
        "{MINIMAL}[server]\ntls_cert_file = \"/etc/s/cert.pem\"\n"
    ));
    assert_eq!(keys(&errors), ["server.tls_key_file"]);
}

#[test]
fn a_tls_listener_is_never_advertised_as_plain() {
    let tls = "[server]\ntls_cert_file = \"c.pem\"\ntls_key_file = \"k.pem\"\n";
    let with = |mode: &str, address: &str| {
        format!(
            "[litestream]\nbackup_url = \"s3://b/r\"\n{tls}[discovery]\nmode = \"{mode}\"\n\
                 advertise_address = \"{address}\"\n"
        )
    };
    for (mode, address) in [
        ("verify", "10.0.0.5:4851"),
        ("verify", "wss://sidecar.internal:4851"),
        ("adopt", "wss://10.0.0.5:4851"),
        ("owner", ""),
    ] {
        let text = with(mode, address);
        let result = from_toml_str(&text, Some(Default::default()))
            .unwrap()
            .validate();
        assert!(result.is_ok(), "{mode} {address}: {result:?}");
    }
    for (mode, address) in [
        ("verify", "ws://10.0.0.5:4851"),
        ("adopt", "10.0.0.5:4851"),
        ("adopt", "ws://10.0.0.5:4851"),
    ] {
        let errors = errors_of(&with(mode, address));
        assert_eq!(
            keys(&errors),
            ["discovery.advertise_address"],
            "{mode} {address}"
        );
        assert!(
            errors[0].problem.contains("wss://10.0.0.5:4851"),
            "{errors:?}"
        );
    }
}

#[test]
fn upstream_tls_names_the_address_host_unless_told_otherwise() {
    let tls = |extra: &str| {
        from_toml_str(
            &format!("{MINIMAL}[upstream]\naddress = \"rm.internal:4849\"\ntls = true\n{extra}"),
            Some(Default::default()),
        )
        .unwrap()
        .validate()
    };
    let upstream = tls("").unwrap().upstream.tls.unwrap();
    assert_eq!(upstream.server_name.to_str(), "rm.internal");
    assert_eq!(upstream.ca_file, None);
    let upstream = tls("tls_ca_file = \"/etc/ca.pem\"\ntls_server_name = \"10.1.2.3\"\n")
        .unwrap()
        .upstream
        .tls
        .unwrap();
    assert_eq!(upstream.server_name.to_str(), "10.1.2.3");
    assert_eq!(upstream.ca_file, Some("/etc/ca.pem".into()));
    let upstream = from_toml_str(
        &format!("{MINIMAL}[upstream]\naddress = \"[::1]:4849\"\ntls = true\n"),
        Some(Default::default()),
    )
    .unwrap()
    .validate()
    .unwrap()
    .upstream
    .tls
    .unwrap();
    assert_eq!(upstream.server_name.to_str(), "::1");

    let errors = errors_of(&format!(
        "{MINIMAL}[upstream]\ntls = true\ntls_server_name = \"not a name\"\n"
    ));
    assert_eq!(keys(&errors), ["upstream.tls_server_name"]);
    for key in ["tls_ca_file", "tls_server_name"] {
        let errors = errors_of(&format!("{MINIMAL}[upstream]\n{key} = \"x\"\n"));
        assert_eq!(keys(&errors), [format!("upstream.{key}")]);
        assert!(errors[0].problem.contains("upstream.tls = true"));
    }
}

#[test]
fn upstream_protocols_are_learned_or_a_range() {
    use crate::streamer::config::Protocols;
    let protocols = |value: &str| {
        from_toml_str(
            &format!("{MINIMAL}[upstream]\nprotocols = \"{value}\"\n"),
            Some(Default::default()),
        )
        .unwrap()
        .validate()
        .map(|config| config.upstream.protocols)
    };
    let default = from_toml_str(MINIMAL, Some(Default::default()))
        .unwrap()
        .validate()
        .unwrap();
    assert_eq!(default.upstream.protocols, Protocols::Auto);
    assert_eq!(protocols("auto").unwrap(), Protocols::Auto);
    assert_eq!(protocols("4..6").unwrap(), Protocols::Fixed(4..=6));
    assert_eq!(protocols("v4..v6").unwrap(), Protocols::Fixed(4..=6));
    assert_eq!(protocols(" 3..3 ").unwrap(), Protocols::Fixed(3..=3));
    // A later Zero's range is taken; the sidecar still serves only what it can.
    assert_eq!(protocols("4..7").unwrap(), Protocols::Fixed(4..=7));
    for (value, says) in [
        ("Auto", "neither \"auto\" nor a range"),
        ("4", "neither"),
        ("4-6", "neither"),
        ("4...6", "neither"),
        ("4..=6", "neither"),
        ("+4..6", "neither"),
        ("..6", "neither"),
        ("[v4 ... v6]", "neither"),
        ("6..4", "is empty: v6 is above v4"),
        ("0..3", "start at v1"),
        ("7..9", "no version the sidecar relays (v1 to v6)"),
    ] {
        let errors = errors_of(&format!("{MINIMAL}[upstream]\nprotocols = \"{value}\"\n"));
        assert_eq!(keys(&errors), ["upstream.protocols"], "{value}");
        assert!(errors[0].problem.contains(says), "{value}: {}", errors[0]);
    }
}

/// `hide` in front of an upstream the operator says is Zero 1.10 or later cannot work: refused at start, with why.
#[test]
fn hide_in_front_of_a_v4_floor_is_refused() {
    let with = |mode: &str, protocols: Option<&str>| {
        let mut text = MINIMAL.replace(
            "[litestream]\n",
            &format!("[litestream]\nproxy_mode = \"{mode}\"\n"),
        );
        if let Some(range) = protocols {
            text.push_str(&format!("[upstream]\nprotocols = \"{range}\"\n"));
        }
        text
    };
    let errors = errors_of(&with("hide", Some("4..6")));
    assert_eq!(keys(&errors), ["litestream.proxy_mode"]);
    assert!(
        errors[0].problem.contains("upstream.protocols = \"4..6\"")
            && errors[0]
                .problem
                .contains("will not answer / or /keepalive")
            && errors[0].problem.contains("set proxy_mode = \"clamp\""),
        "{}",
        errors[0]
    );
    for accepted in [
        with("hide", Some("1..6")),
        with("hide", None),
        with("clamp", Some("4..6")),
    ] {
        from_toml_str(&accepted, Some(Default::default()))
            .unwrap()
            .validate()
            .unwrap_or_else(|e| panic!("{accepted}: {e}"));
    }
}
