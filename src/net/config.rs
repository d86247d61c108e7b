//! `[server]`: the main listener and what its connections may cost.

use std::net::SocketAddr;
use std::time::Duration;

use crate::keys::{self, Section};
use crate::net::allow::AllowList;
use crate::net::tls::ServerTlsFiles;

/// Zero's client drops a socket that has seen neither a ping nor a message within 33 s of opening it
/// (docs/protocol.md, "Liveness"), so a longer ping interval would lose every idle reservation.
const MAX_PING_INTERVAL: Duration = Duration::from_secs(30);
/// Zero's `ws` peers accept 100 MiB messages; a smaller limit would break large transactions.
const MIN_MESSAGE_BYTES: u64 = 100 << 20;
/// Far above what one replication-manager's view-syncers open (one reservation and one subscription each), and
/// under the file-descriptor limit the sidecar raises itself to where the system allows.
const DEFAULT_MAX_CONNECTIONS: u64 = 16_384;
/// Zero's requests carry a path, a query of a few short parameters and a dozen headers: well under 4 KiB.
const DEFAULT_MAX_HEADER_BYTES: u64 = 16 << 10;
/// hyper's smallest read buffer: it refuses a smaller limit.
const MIN_HEADER_BYTES: u64 = 8 << 10;

keys::section! {
    /// `[server]`: the listener view-syncers connect to.
    pub struct ServerConfig(s) {
        /// Where view-syncers reach the sidecar; default port 4851 sits next to Zero's 4848-4850.
        listen: SocketAddr = key("0.0.0.0:4851", keys::socket_addr),
        /// How often every downstream WebSocket is pinged.
        ping_interval: Duration = key("10s", |text: String| {
            keys::duration(text.clone()).and_then(|d| {
                if d < Duration::from_millis(10) || d > MAX_PING_INTERVAL {
                    Err(format!(
                        "{text:?} is outside 10ms..=30s (Zero's client drops a socket silent for 33 s)"
                    ))
                } else {
                    Ok(d)
                }
            })
        }),
        /// A downstream peer from which nothing (pong or any frame) arrived for this long is dropped, as seen at a
        /// ping time. Longer than `ping_interval`, so that one lost pong or a short network stall drops nobody.
        /// Zero's server drops a client only after a whole 30 s ping interval without a pong or message, about
        /// 60 s after its last sign of life at worst: the default is no stricter.
        peer_timeout: Duration = key("60s", |text: String| {
            keys::duration(text.clone()).and_then(|d| match ping_interval {
                Some(ping) if d <= ping => Err(format!(
                    "{text:?} must be longer than server.ping_interval ({ping:?}), or a peer is dropped before it \
                     could answer a ping"
                )),
                _ => Ok(d),
            })
        }),
        /// Largest WebSocket message or frame accepted; larger ones close with 1009.
        max_message_bytes: usize = key(128u64 << 20, |n: u64| {
            if n < MIN_MESSAGE_BYTES {
                Err(format!("{n} is below {MIN_MESSAGE_BYTES} (Zero sends messages up to 100 MiB)"))
            } else {
                usize::try_from(n).map_err(|e| e.to_string())
            }
        }),
        /// How long shutdown waits for connections to close before exiting anyway.
        shutdown_grace: Duration = key("10s", keys::duration),
        /// Who may open `/snapshot` and `/changes`; the plain endpoints stay open to everyone.
        allow: AllowList = key(Vec::<String>::new(), |list: Vec<String>| AllowList::parse(&list)),
        /// Connections open at once on the main listener, WebSockets included; past it new ones get a 503.
        max_connections: usize = key(DEFAULT_MAX_CONNECTIONS, |n: u64| match usize::try_from(n) {
            Ok(0) | Err(_) => Err(format!("{n} is not a number of connections from 1 up")),
            Ok(n) => Ok(n),
        }),
        /// A request head must arrive whole within this long of the connection opening or of the previous
        /// response, so it is also how long a plain HTTP connection may sit idle.
        header_read_timeout: Duration = key("10s", |text: String| {
            keys::duration(text.clone()).and_then(|d| {
                if d < Duration::from_millis(100) {
                    Err(format!(
                        "{text:?} is shorter than 100ms: clients on a slow link could not send a request"
                    ))
                } else {
                    Ok(d)
                }
            })
        }),
        /// Largest request line plus headers; a longer head gets a 431 and the connection is closed.
        max_header_bytes: usize = key(DEFAULT_MAX_HEADER_BYTES, |n: u64| {
            if (MIN_HEADER_BYTES..=(1 << 20)).contains(&n) {
                Ok(n as usize)
            } else {
                Err(format!("{n} is outside {MIN_HEADER_BYTES}..=1048576"))
            }
        }),
        /// Threads that run the sidecar's work. One (the default) runs everything on one thread with no hand-offs
        /// between threads, which relays cheapest beside Zero on a small machine; more spread many busy
        /// subscribers over cores.
        worker_threads: usize = key(1u64, |n: u64| match n {
            1..=256 => Ok(n as usize),
            n => Err(format!("{n} is not a number of threads from 1 to 256")),
        }),
        /// When set, the listener speaks TLS only: view-syncers are given one URL, so it is either `ws://` or
        /// `wss://` (`tls_cert_file` and `tls_key_file`, which come in pairs).
        tls: Option<ServerTlsFiles> = from(tls_files(s)),
    }
}

/// `tls_cert_file` and `tls_key_file`: both or neither.
fn tls_files(s: &mut Section<'_>) -> Option<Option<ServerTlsFiles>> {
    let cert = s.value("tls_cert_file", String::new())?;
    let key = s.value("tls_key_file", String::new())?;
    match (cert.trim(), key.trim()) {
        ("", "") => Some(None),
        (_, "") => s.problem(
            "tls_key_file",
            "must be set with server.tls_cert_file".into(),
        ),
        ("", _) => s.problem(
            "tls_cert_file",
            "must be set with server.tls_key_file".into(),
        ),
        (cert, key) => Some(Some(ServerTlsFiles {
            cert_file: cert.into(),
            key_file: key.into(),
        })),
    }
}
