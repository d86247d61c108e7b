//! Request paths and query strings.

use super::*;

const QUERY_KEYS: &[&str] = &[
    "id",
    "taskID",
    "mode",
    "replicaVersion",
    "watermark",
    "initial",
    "Initial",
    "%69nitial",
    "initial%00",
    "task%49D",
    "initia",
    "",
    "x",
];
const QUERY_VALUES: &[&str] = &[
    "",
    "true",
    "false",
    "TRUE",
    "tru%65",
    "true1",
    "backup",
    "serving",
    "Backup",
    "718sh0nk8",
    "%",
    "%%",
    "%zz",
    "a+b",
    "a%2Fb",
    "%C3%A9",
    "%FF",
    "=",
    "==",
    "\u{e9}",
    "%00",
];

fn query() -> impl Strategy<Value = String> + Clone {
    let key = prop_oneof![
        3 => select(QUERY_KEYS).prop_map(String::from),
        1 => "[a-zA-Z0-9%+=._~-]{0,8}",
    ];
    let value = prop_oneof![
        3 => select(QUERY_VALUES).prop_map(String::from),
        1 => "[a-zA-Z0-9%+=._~/ -]{0,12}",
        1 => watermark(),
    ];
    let separator = select(&["&", "&", "&", "&&", ";", ""][..]);
    vec((key, proptest::option::of(value), separator), 0..8).prop_map(|parts| {
        let mut query = String::new();
        for (key, value, separator) in parts {
            query.push_str(&key);
            if let Some(value) = value {
                query.push('=');
                query.push_str(&value);
            }
            query.push_str(separator);
        }
        query
    })
}

fn path() -> impl Strategy<Value = String> + Clone {
    let segment = prop_oneof![
        any::<u64>().prop_map(|n| format!("v{n}")),
        (0u64..8).prop_map(|n| format!("v{n}")),
        "v[0-9]{15,40}",
        "[vV]?[0-9a-z%.]{0,6}",
    ];
    let action = select(
        &[
            "snapshot",
            "changes",
            "snapshots",
            "",
            "changes/",
            "x/changes",
        ][..],
    );
    prop_oneof![
        1 => select(&["/", "/keepalive", "/metrics", "/status", "", "/replication/", "/keepalive/"][..])
            .prop_map(String::from),
        4 => (segment, action).prop_map(|(segment, action)| format!("/replication/{segment}/{action}")),
        1 => "/[a-z/%.0-9]{0,24}",
    ]
}

/// A request target: `path` or `path?query`.
fn request_target() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        1 => bytes(b"/?&=%+v0123456789", 200).prop_map(lossy),
        1 => any::<String>(),
        4 => (path(), proptest::option::of(query())).prop_map(|(path, query)| match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        }),
        1 => mutated(
            (path(), query()).prop_map(|(path, query)| format!("{path}?{query}").into_bytes()),
            b"/?&=%+",
        ).prop_map(lossy),
    ]
}

/// Route, version checks, subscriber context and the `initial` rewrite: each allocates at most a few copies of
/// the target (the path in an invalid-path message, decoded values, the rewritten query).
#[test]
fn request_path() {
    const BOUND: (usize, usize) = (1024, 4);
    fuzz("request_path", request_target(), |target| {
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (target.as_str(), None),
        };
        let len = target.len();
        let route = bounded("route", len, BOUND, || protocol::route(path))?;
        if let Route::Snapshot(version) | Route::Changes(version) = &route {
            prop_assert!(path.starts_with("/replication/"));
            if let Version::Invalid(invalid) = version {
                prop_assert_eq!(invalid, path);
            }
            match bounded("check_snapshot", len, BOUND, || {
                protocol::check_snapshot(version, query, None)
            })? {
                Ok((n, task_id)) => {
                    prop_assert!(protocol::SNAPSHOT_VERSIONS.contains(&n));
                    prop_assert!(!task_id.is_empty());
                }
                Err(message) => message_is_clear("check_snapshot", &message)?,
            }
            if let Err(message) = bounded("check_changes", len, BOUND, || {
                protocol::check_changes(version, None)
            })? {
                message_is_clear("check_changes", &message)?;
            }
            // A known upstream range only narrows what is accepted, and only by the version.
            for upstream in [1..=3, 4..=6, 7..=9] {
                let narrowed = protocol::check_snapshot(version, query, Some(&upstream));
                if let Ok((n, _)) = &narrowed {
                    prop_assert!(upstream.contains(n));
                    prop_assert_eq!(&narrowed, &protocol::check_snapshot(version, query, None));
                }
                let narrowed = protocol::check_changes(version, Some(&upstream));
                if narrowed.is_ok() {
                    prop_assert!(protocol::check_changes(version, None).is_ok());
                }
            }
        }
        let context = bounded("parse_subscriber_context", len, BOUND, || {
            protocol::parse_subscriber_context(query)
        })?;
        // Both read a parameter as Zero does: its first occurrence, empty counting as absent.
        prop_assert_eq!(&context.id, &protocol::query_param(query, "id"));
        prop_assert_eq!(&context.task_id, &protocol::query_param(query, "taskID"));
        prop_assert_eq!(
            &context.watermark,
            &protocol::query_param(query, "watermark")
        );
        prop_assert_eq!(
            &context.replica_version,
            &protocol::query_param(query, "replicaVersion")
        );
        if let Some(query) = query {
            // Rewritten exactly when Zero would read `initial=true`, and then Zero reads `false` and all else
            // unchanged.
            match bounded("suppress_initial", len, BOUND, || {
                protocol::suppress_initial(query)
            })? {
                Cow::Borrowed(kept) => {
                    prop_assert!(!context.initial);
                    prop_assert_eq!(kept, query);
                }
                Cow::Owned(rewritten) => {
                    prop_assert!(context.initial);
                    prop_assert_eq!(
                        protocol::parse_subscriber_context(Some(&rewritten)),
                        SubscriberContext {
                            initial: false,
                            ..context
                        }
                    );
                }
            }
        }
        Ok(())
    });
}
