//! host:port, owner addresses and backup URLs.

use super::*;

fn address_text() -> impl Strategy<Value = String> + Clone {
    let host = prop_oneof![
        any::<[u8; 4]>().prop_map(|ip| std::net::Ipv4Addr::from(ip).to_string()),
        any::<[u16; 8]>().prop_map(|ip| format!("[{}]", std::net::Ipv6Addr::from(ip))),
        any::<[u16; 8]>().prop_map(|ip| std::net::Ipv6Addr::from(ip).to_string()),
        vec("[a-zA-Z0-9-]{0,66}", 1..4).prop_map(|labels| labels.join(".")),
        select(
            &[
                "localhost",
                "",
                "0.0.0.0",
                "[::]",
                "-a.b",
                "a-.b",
                "a..b",
                "[::1",
                "\u{e9}.com",
                "%31.0.0.1"
            ][..]
        )
        .prop_map(String::from),
    ];
    let port = prop_oneof![
        any::<u16>().prop_map(|p| p.to_string()),
        select(&["0", "65536", "", "abc", "+1", "-1", "04849", "99999999999"][..])
            .prop_map(String::from),
    ];
    (
        select(&["", "", "ws://", "wss://", "http://", "WS://"][..]),
        host,
        select(&[":", ":", "::", ""][..]),
        port,
        select(&["", "", "/", "//", "/x", " "][..]),
        select(&["", "", " ", "\t", "\n"][..]),
    )
        .prop_map(|(scheme, host, colon, port, suffix, pad)| {
            format!("{pad}{scheme}{host}{colon}{port}{suffix}{pad}")
        })
}

/// Address checks copy at most the address into a message a few times over.
#[test]
fn host_port() {
    const BOUND: (usize, usize) = (1024, 8);
    let input = prop_oneof![
        1 => bytes(b"[]:./0123456789abcdefws", 80).prop_map(lossy),
        4 => address_text(),
        1 => mutated(address_text().prop_map(String::into_bytes), b"[]:./-0123456789").prop_map(lossy),
    ];
    fuzz("host_port", (input, address_text()), |(text, other)| {
        let len = text.len();
        match bounded("parse_host_port", len, BOUND, || {
            address::parse_host_port(&text)
        })? {
            Ok((host, _)) => prop_assert!(!host.is_empty()),
            Err(message) => message_is_clear("parse_host_port", &message)?,
        }
        match bounded("validate_host_port", len, BOUND, || {
            address::validate_host_port(&text)
        })? {
            Ok(valid) => {
                prop_assert_eq!(valid.as_str(), text.trim());
                prop_assert!(address::parse_host_port(&valid).is_ok_and(|(_, port)| port != 0));
            }
            Err(message) => message_is_clear("validate_host_port", &message)?,
        }
        match bounded("validate_owner_address", len, BOUND, || {
            address::validate_owner_address(&text)
        })? {
            Ok(valid) => {
                prop_assert_eq!(valid.as_str(), text.trim());
                prop_assert!(address::validate_host_port(address::host_port(&valid)).is_ok());
            }
            Err(message) => message_is_clear("validate_owner_address", &message)?,
        }
        let same = bounded("same_address", len + other.len(), (0, 0), || {
            address::same_address(&text, &other)
        })?;
        prop_assert_eq!(same, address::same_address(&other, &text));
        prop_assert!(address::same_address(&text, &text));
        Ok(())
    });
}

fn backup_url() -> impl Strategy<Value = String> + Clone {
    (
        select(
            &[
                "s3://", "file://", "file:///", "gcs://", "S3://", "", "s3:", "abs://",
            ][..],
        ),
        "[a-zA-Z0-9%/._ -]{0,24}",
        select(&["", "", "/", "?x=1", "#f", "%", "%zz", "%2F"][..]),
    )
        .prop_map(|(scheme, rest, tail)| format!("{scheme}{rest}{tail}"))
}

/// A URL is parsed once and its path decoded: a few copies, percent-encoding at most tripling one.
#[test]
fn backup_location() {
    let input = prop_oneof![
        1 => bytes(b":/%?#.s3file", 80).prop_map(lossy),
        4 => backup_url(),
        1 => mutated(backup_url().prop_map(String::into_bytes), b":/%?#").prop_map(lossy),
    ];
    fuzz("backup_location", input, |text| {
        match bounded("Location::parse", text.len(), (1024, 12), || {
            backup::Location::parse(&text)
        })? {
            Ok(backup::Location::S3 { bucket, .. }) => prop_assert!(!bucket.is_empty()),
            Ok(backup::Location::Local(path)) => prop_assert!(path.is_absolute()),
            Err(message) => message_is_clear("Location::parse", &message)?,
        }
        Ok(())
    });
}
