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
        /// Address view-syncers connect to (advertise this host's address and port to Zero). Zero's own ports are 4848
        /// (sync), 4849 (change-streamer) and 4850 (litestream metrics), so the sidecar defaults to 4851.
        listen: SocketAddr = key("0.0.0.0:4851", keys::socket_addr),
        /// How often every WebSocket the sidecar serves (reservations, relayed subscribers) is pinged. At most 30s:
        /// Zero's client drops a socket that has heard nothing for 33s.
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
        /// A peer from which nothing (pong or any frame) arrived for this long is dropped, as seen at the next ping, so
        /// within peer_timeout + ping_interval of its last sign of life. Must be longer than ping_interval. 60s is
        /// Zero's own leniency: its server drops a client only after a whole 30s ping interval without an answer (about
        /// 60s at worst). A stricter value costs view-syncers their reservation on a short network stall, and Zero 0.20
        /// never asks for a dropped reservation again.
        peer_timeout: Duration = key("60s", |text: String| {
            keys::duration(text.clone()).and_then(|d| match ping_interval {
                Some(ping) if d <= ping => Err(format!(
                    "{text:?} must be longer than server.ping_interval ({ping:?}), or a peer is dropped before it \
                     could answer a ping"
                )),
                _ => Ok(d),
            })
        }),
        /// Largest WebSocket message (and single frame) relayed on /changes, in bytes; larger ones close with 1009. At
        /// least 104857600 (100 MiB), the limit Zero itself uses. Buffers grow as a frame's bytes arrive, never from
        /// what its header claims. /snapshot clients only send acks: their frames are held to 4 KiB whatever this says.
        max_message_bytes: usize = key(128u64 << 20, |n: u64| {
            if n < MIN_MESSAGE_BYTES {
                Err(format!("{n} is below {MIN_MESSAGE_BYTES} (Zero sends messages up to 100 MiB)"))
            } else {
                usize::try_from(n).map_err(|e| e.to_string())
            }
        }),
        /// How long shutdown waits for open connections after closing them (1001) before exiting anyway.
        shutdown_grace: Duration = key("10s", keys::duration),
        /// Who may open /replication/v{N}/snapshot and /changes: CIDR blocks or single addresses. Anyone else gets HTTP
        /// 403 before any upgrade (logged, and counted in
        /// litestream_sidecar_connections_refused_total{reason="not_allowed"}). /, /keepalive, /metrics and /status
        /// stay open to all. [] = everyone: the network decides, as it does for Zero's own change-streamer. As an
        /// environment variable: one comma-separated string.
        /// Recommended: loopback and the private ranges your view-syncers run in, e.g.
        /// allow = ["127.0.0.0/8", "::1", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fd00::/8"]
        allow: AllowList = key(Vec::<String>::new(), |list: Vec<String>| AllowList::parse(&list)),
        /// Connections open at once on this listener, reservations and relayed subscribers included. Past it a new
        /// connection gets HTTP 503 and is closed (counted as reason="max_connections"). The sidecar raises its
        /// open-file limit to the hard limit at start; it warns if that still leaves too few for this many connections.
        max_connections: usize = key(DEFAULT_MAX_CONNECTIONS, |n: u64| match usize::try_from(n) {
            Ok(0) | Err(_) => Err(format!("{n} is not a number of connections from 1 up")),
            Ok(n) => Ok(n),
        }),
        /// A request head (request line and headers) must arrive whole within this long of the connection opening, or
        /// of the previous response on a kept-alive connection: a slow or silent client is dropped, and so is a plain
        /// HTTP connection left idle this long.
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
        /// Largest request head in bytes (request line plus headers); a longer one gets HTTP 431. 8192 to 1048576.
        max_header_bytes: usize = key(DEFAULT_MAX_HEADER_BYTES, |n: u64| {
            if (MIN_HEADER_BYTES..=(1 << 20)).contains(&n) {
                Ok(n as usize)
            } else {
                Err(format!("{n} is outside {MIN_HEADER_BYTES}..=1048576"))
            }
        }),
        /// Threads the sidecar runs on. 1 runs everything on one thread, with no hand-offs between threads: the
        /// cheapest relay per message beside Zero on a small machine. Raise it (up to 256) when one core no longer
        /// keeps up with the subscribers' traffic, or when many TLS handshakes at once would delay relayed frames
        /// behind them.
        worker_threads: usize = key(1u64, |n: u64| match n {
            1..=256 => Ok(n as usize),
            n => Err(format!("{n} is not a number of threads from 1 to 256")),
        }),
        /// When set, the listener speaks TLS only: view-syncers are given one URL, so it is either `ws://` or
        /// `wss://` (`tls_cert_file` and `tls_key_file`, which come in pairs).
        tls: Option<ServerTlsFiles> = from(tls_files(s)) reads {
            /// TLS on the listen address: PEM files of the certificate (then any intermediates) and of its private key
            /// (PKCS#8, PKCS#1 or SEC1; may be the same file). Both or neither; when set, the listener speaks TLS only,
            /// and view-syncers (Zero 0.22 and later) connect with `ZERO_CHANGE_STREAMER_URI=wss://<host>:4851/`. Read
            /// at start and again on SIGHUP: new connections get the new certificate, open ones keep theirs, and a pair
            /// that cannot be loaded (missing file, key not matching the certificate) is logged and the previous one
            /// kept. "" = plain.
            tls_cert_file,
            /// See tls_cert_file.
            tls_key_file,
        },
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
