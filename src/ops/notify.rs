//! systemd's notify protocol (`Type=notify`): READY=1 once the sidecar listens, STATUS= lines saying what it waits
//! for, WATCHDOG=1 keep-alives, STOPPING=1 on shutdown. Without `NOTIFY_SOCKET` (not under systemd) every call
//! is a no-op.

use std::time::Duration;

use sd_notify::NotifyState;
use tokio_util::sync::CancellationToken;
use tracing::debug;

fn send(states: &[NotifyState]) {
    if let Err(err) = sd_notify::notify(states) {
        debug!(error = %err, "systemd notify failed");
    }
}

pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn status(status: &str) {
    send(&[NotifyState::Status(status)]);
}

pub fn stopping() {
    send(&[NotifyState::Stopping, NotifyState::Status("shutting down")]);
}

/// Refreshes STATUS= when `current()` changes, and — when systemd set `WatchdogSec=` — sends WATCHDOG=1 at half
/// that period. It runs as a task on the same runtime as everything else, so a wedged runtime stops the
/// keep-alives and systemd restarts the service.
pub async fn run(shutdown: CancellationToken, current: impl Fn() -> String) {
    let watchdog = sd_notify::watchdog_enabled();
    let period = watchdog
        .map(|d| d / 2)
        .unwrap_or(Duration::from_secs(1))
        .min(Duration::from_secs(1));
    let mut ticker = tokio::time::interval(period.max(Duration::from_millis(10)));
    let mut last = String::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let line = current();
        if line != last {
            status(&line);
            last = line;
        }
        if watchdog.is_some() {
            send(&[NotifyState::Watchdog]);
        }
    }
}
