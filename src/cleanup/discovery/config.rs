//! `[discovery]`: how view-syncers find the sidecar, and what the address table must say for it to purge.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::keys;
use crate::net::address::{host_port, parse_host_port, validate_owner_address};

/// `mode`: whether the sidecar only reads `ownerAddress` or may replace it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryMode {
    /// Read `ownerAddress` and report; the operator points `ZERO_CHANGE_STREAMER_ADDRESS` at the sidecar.
    #[default]
    Verify,
    /// Replace the co-located change-streamer's address with the sidecar's (row-lock schemas only).
    Adopt,
    /// View-syncers reach the sidecar through `ZERO_CHANGE_STREAMER_URI` (Zero 0.22 and later) and `ownerAddress`
    /// keeps the replication-manager's own address (`upstream.advertised_address`): cleanup runs only while it
    /// does, for as long as the same replication-manager task (`owner`) holds it.
    Owner,
    /// No discovery: nothing is read, and cleanup does not depend on registration.
    Off,
}

keys::section! {
    /// `[discovery]`; `tls_listener`: whether the main listener speaks TLS (`server.tls_cert_file` is set).
    pub struct DiscoveryConfig(s, tls_listener: bool) {
        mode: DiscoveryMode = key(DiscoveryMode::Verify),
        /// `host:port` view-syncers use to reach the sidecar: what `ownerAddress` must say.
        advertise_address: String = key("", |text: String| match (mode, text.trim()) {
            (Some(DiscoveryMode::Off | DiscoveryMode::Owner), "") => Ok(String::new()),
            (_, "") => Err(
                "must be set (the host:port view-syncers reach the sidecar at) unless mode = \"off\" or \"owner\""
                    .into(),
            ),
            (mode, address) => advertisable(address)
                .and_then(|()| match (tls_listener, mode) {
                    (true, Some(mode)) => advertised_with_tls(mode, address),
                    _ => Ok(()),
                })
                .map(|()| address.to_string()),
        }),
        /// How often the address table is read.
        interval: Duration = key("5s", |text: String| keys::at_least(text, Duration::from_millis(100))),
    }
}

/// An address other hosts can connect to.
fn advertisable(address: &str) -> Result<(), String> {
    match validate_owner_address(address).and_then(|_| parse_host_port(host_port(address))) {
        Ok((host, _)) if matches!(host.as_str(), "0.0.0.0" | "::") => Err(format!(
            "{address:?} is not an address other hosts can connect to"
        )),
        Ok(_) => Ok(()),
        Err(problem) => Err(problem),
    }
}

/// With a TLS listener, what `ownerAddress` tells view-syncers must make them speak TLS: Zero's clients use `ws://`
/// for a bare address, so the sidecar may write only a `wss://` one (`adopt`), and a `ws://` one is wrong in any
/// mode.
fn advertised_with_tls(mode: DiscoveryMode, address: &str) -> Result<(), String> {
    let bare = !address.contains("://");
    if address.starts_with("ws://") || (bare && mode == DiscoveryMode::Adopt) {
        return Err(format!(
            "{address:?} would have view-syncers speak plain WebSocket to a TLS listener (server.tls_cert_file is set): \
             write wss://{}",
            host_port(address)
        ));
    }
    Ok(())
}
