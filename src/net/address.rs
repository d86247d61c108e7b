//! What a `host:port` is and when two name the same endpoint: one home for the config's checks and for the
//! `ownerAddress` comparisons of discovery and the purge. A leaf: it depends on no other module of the crate.

use std::net::SocketAddr;

/// `host:port`: an IP literal (IPv6 in brackets) or a DNS name, resolved when binding or connecting.
pub fn parse_host_port(text: &str) -> Result<(String, u16), String> {
    let text = text.trim();
    let bad = || {
        format!("{text:?} is not host:port, e.g. \"127.0.0.1:4849\", \"[::1]:4850\" or \"localhost:4850\"")
    };
    if let Ok(addr) = text.parse::<SocketAddr>() {
        return Ok((addr.ip().to_string(), addr.port()));
    }
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let is_dns_name = !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        });
    if !is_dns_name {
        return Err(bad());
    }
    Ok((host.to_string(), port))
}

/// Accepts `127.0.0.1:4849`, `[::1]:4849` or `change-streamer.internal:4849`, port 0 excluded: what the relay
/// connects to and sends as the `Host` header.
pub fn validate_host_port(text: &str) -> Result<String, String> {
    match parse_host_port(text)? {
        (_, 0) => Err(format!("{:?} needs a port other than 0", text.trim())),
        _ => Ok(text.trim().to_string()),
    }
}

/// An address as Zero writes it to `ownerAddress`: `host:port`, or from Zero 0.22 on also `ws://host:port` or
/// `wss://host:port` (`ZERO_CHANGE_STREAMER_PROTOCOL`), kept as given.
pub fn validate_owner_address(text: &str) -> Result<String, String> {
    validate_host_port(host_port(text))
        .map(|_| text.trim().to_string())
        .map_err(|problem| format!("{problem} (a ws:// or wss:// prefix is allowed)"))
}

/// `host:port` of an address as Zero writes it: bare, or with a `ws://`/`wss://` prefix from Zero 0.22 on.
pub fn host_port(address: &str) -> &str {
    let address = address.trim();
    let address = address
        .strip_prefix("ws://")
        .or_else(|| address.strip_prefix("wss://"))
        .unwrap_or(address);
    address.trim_end_matches('/')
}

/// Whether two addresses name the same endpoint (host compared case-insensitively).
pub fn same_address(a: &str, b: &str) -> bool {
    host_port(a).eq_ignore_ascii_case(host_port(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_addresses_may_carry_a_websocket_scheme() {
        for ok in [
            "10.0.0.5:4849",
            "ws://10.0.0.5:4849",
            "wss://rm.internal:4849/",
        ] {
            assert_eq!(validate_owner_address(ok), Ok(ok.to_string()));
        }
        for bad in [
            "http://10.0.0.5:4849",
            "ws://10.0.0.5",
            "wss://:4849",
            "ws://10.0.0.5:0",
        ] {
            assert!(validate_owner_address(bad).is_err(), "{bad}");
        }
        assert!(same_address("wss://RM.internal:4849/", "rm.internal:4849"));
    }

    #[test]
    fn host_port_forms() {
        assert_eq!(
            parse_host_port("localhost:4850"),
            Ok(("localhost".into(), 4850))
        );
        assert_eq!(parse_host_port("[::1]:4850"), Ok(("::1".into(), 4850)));
        assert_eq!(parse_host_port("127.0.0.1:0"), Ok(("127.0.0.1".into(), 0)));
        for bad in [
            "4850",
            "localhost",
            ":4850",
            "::1:4850",
            "host:99999",
            "a b:1",
        ] {
            assert!(parse_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn upstream_addresses_are_host_and_port() {
        for good in [
            "127.0.0.1:4849",
            "[::1]:4849",
            "localhost:4849",
            "change-streamer.zero.internal:4849",
        ] {
            assert_eq!(validate_host_port(good).as_deref(), Ok(good), "{good}");
        }
        for bad in [
            "",
            "localhost",
            "127.0.0.1",
            ":4849",
            "host:0",
            "host:65536",
            "http://host:4849",
            "host/path:4849",
            "-bad:4849",
            "a..b:4849",
            "::1:4849",
            "host name:4849",
        ] {
            assert!(validate_host_port(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn addresses_compare_by_host_and_port() {
        assert!(same_address("10.0.0.5:4851", "10.0.0.5:4851"));
        assert!(same_address(
            "wss://Sidecar.example:4851",
            "sidecar.example:4851"
        ));
        assert!(same_address("ws://[::1]:4851/", "[::1]:4851"));
        assert!(!same_address("10.0.0.5:4851", "10.0.0.5:4849"));
        assert!(!same_address("10.0.0.5:4851", "10.0.0.6:4851"));
        // Zero writes bare or ws/wss addresses only.
        assert!(!same_address("http://10.0.0.5:4851", "10.0.0.5:4851"));
    }
}
