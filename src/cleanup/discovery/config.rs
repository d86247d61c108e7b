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
        /// How view-syncers find the sidecar: the shard's "ownerAddress" in the change DB ([docs/protocol.md,
        /// "Discovery"](protocol.md#discovery); the modes in [docs/deploy-zero-0.20.md, "Discovery:
        /// ownerAddress"](deploy-zero-0.20.md#discovery-owneraddress)).
        /// "verify" (recommended): never writes; set Zero's ZERO_CHANGE_STREAMER_ADDRESS to advertise_address and the
        ///   sidecar checks that the row names it. Cleanup runs only while it does.
        /// "adopt": replaces the co-located change-streamer's address (upstream.advertised_address) with
        ///   advertise_address, and puts it back on shutdown. Only against Zero 0.26+ change DBs (dataVersion >= 6):
        ///   with Zero 0.20-0.25 an outside write to that row can stop the replication-manager, so the sidecar refuses
        ///   and behaves as "verify".
        /// "owner" (Zero 0.22 and later, the topology Zero's docs recommend): view-syncers reach the sidecar through
        ///   `ZERO_CHANGE_STREAMER_URI=ws://<this host>:4851/` (wss:// with server.tls_cert_file) and ownerAddress
        ///   keeps the replication-manager's own address (upstream.advertised_address). Never writes; cleanup runs only
        ///   while ownerAddress names that replication-manager and the same task ("owner") has held it for
        ///   reconnect_grace plus the cleanup delay, and every purge batch checks both again. advertise_address is not
        ///   needed.
        /// "off": no discovery and no ownership guard (tests; not for production).
        mode: DiscoveryMode = key(DiscoveryMode::Verify),
        /// host:port view-syncers use to reach this sidecar (this host's address and server.listen's port). Required
        /// unless mode is "owner" or "off". A ws:// or wss:// prefix, as Zero 0.22+ writes ownerAddress, is allowed.
        /// With server.tls_cert_file set, ws:// is refused, and mode = "adopt" needs wss:// (Zero's clients take a bare
        /// address as ws://).
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
