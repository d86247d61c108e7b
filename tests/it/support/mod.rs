//! Test harness, a file for each thing it runs or stands in for: the real sidecar in this process on 127.0.0.1:0
//! (`sidecar`: its config, start and stop), what tests read of a running sidecar and the waits for it (`facts`),
//! and what the sidecar talks to: view-syncers (`clients`), Zero's change-streamer behind the relay (`upstream`),
//! litestream's metrics page with the fork's gauge (`gauge`), the real litestream and its destination
//! (`litestream`), an S3 server (`moto`), PostgreSQL (`pg`, `cluster`), and the sidecar as its own process
//! (`process`). Here: the watermarks and subscribers every part speaks of.

pub mod cluster;
pub mod litestream;
pub mod moto;
pub mod pg;
pub mod process;

mod clients;
mod facts;
mod gauge;
mod sidecar;
mod upstream;

pub use clients::*;
pub use facts::*;
pub use gauge::*;
pub use sidecar::*;
pub use upstream::*;

use std::net::SocketAddr;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use litestream_sidecar::cleanup::reservations::Registry;
use litestream_sidecar::cleanup::subscribers::SubscriberInfo;
use litestream_sidecar::cleanup::subscribers::Subscribers;
use litestream_sidecar::cleanup::Decision;
use litestream_sidecar::protocol::Mode;
use litestream_sidecar::{config, App, Config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_util::sync::CancellationToken;

/// LexiVersion of `n` (docs/protocol.md, "Watermarks"): base 36 with a length prefix, so byte order is numeric order.
pub fn lexi(n: u64) -> String {
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut digits = Vec::new();
    let mut rest = n;
    loop {
        digits.push(DIGITS[(rest % 36) as usize]);
        rest /= 36;
        if rest == 0 {
            break;
        }
    }
    digits.push(DIGITS[digits.len() - 1]);
    digits.reverse();
    String::from_utf8(digits).unwrap()
}

/// A subscriber in serving mode at `watermark`, of no task, as the relay registers it.
pub fn subscriber(id: &str, watermark: &str) -> SubscriberInfo {
    SubscriberInfo {
        id: id.into(),
        task_id: None,
        mode: Mode::Serving,
        replica_version: "1rs".into(),
        watermark: watermark.into(),
    }
}
