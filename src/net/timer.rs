//! A one-shot timer that fires when it is due, to the microsecond, for the relay's ack wake-up limit.
//!
//! Tokio's timers tick in whole milliseconds: a 1 ms sleep ends 1 to 2 ms later, and that rounding alone is as long
//! as a relayed subscriber's acks may come after a direct one's (docs/protocol.md, "Relayed subscribers dropped as
//! too far behind"). A `timerfd` is the kernel's high-resolution timer behind a file descriptor that the runtime's
//! `epoll` already waits on: no thread, no busy wait, and it ends the wait as soon as it expires. One per relayed
//! subscription whose acks are gathered, made when the first wait starts.
//!
//! Registering a file descriptor with the runtime is `unsafe` (the runtime must be able to trust it stays open and
//! the same): the one place besides [`super::sockopt`].
#![allow(unsafe_code)]

use std::io;
use std::time::Duration;

use rustix::fd::OwnedFd;
use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;

/// A one-shot timer on the monotonic clock.
pub struct PreciseTimer {
    fd: AsyncFd<OwnedFd>,
}

impl PreciseTimer {
    /// A disarmed timer. Fails like any file descriptor can (the process's limit), and outside a Tokio runtime.
    pub fn new() -> io::Result<PreciseTimer> {
        let fd = timerfd_create(
            TimerfdClockId::Monotonic,
            TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
        )?;
        // SAFETY: `fd` is owned by the AsyncFd from here on: it stays open, and the same timer, until the AsyncFd
        // deregisters it and drops it.
        let fd = unsafe { AsyncFd::register(fd) }.map_err(io::Error::from)?;
        Ok(PreciseTimer { fd })
    }

    /// Arms the timer to fire `after` from now, replacing any earlier deadline and forgetting an expiry not
    /// waited for yet.
    pub fn arm(&self, after: Duration) -> io::Result<()> {
        // A zero it_value would disarm a timerfd: the shortest wait that still fires is a nanosecond.
        let value = after.max(Duration::from_nanos(1));
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let spec = Itimerspec {
            it_interval: zero,
            it_value: Timespec {
                tv_sec: value.as_secs().try_into().unwrap_or(i64::MAX),
                tv_nsec: value.subsec_nanos().into(),
            },
        };
        timerfd_settime(self.fd.get_ref(), TimerfdTimerFlags::empty(), &spec)?;
        Ok(())
    }

    /// Resolves once the timer has fired since it was last armed. Cancel-safe: dropping the future loses nothing,
    /// a later call still sees the expiry.
    pub async fn fired(&self) -> io::Result<()> {
        loop {
            let mut ready = self.fd.readable().await?;
            let mut expirations = [0u8; 8];
            match rustix::io::read(self.fd.get_ref(), &mut expirations) {
                Ok(_) => return Ok(()),
                Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                Err(err) => return Err(err.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[tokio::test]
    async fn fires_once_when_due() {
        let timer = PreciseTimer::new().unwrap();
        let start = Instant::now();
        timer.arm(Duration::from_micros(300)).unwrap();
        timer.fired().await.unwrap();
        assert!(start.elapsed() >= Duration::from_micros(300));

        // Fired once: nothing more until armed again.
        let again = tokio::time::timeout(Duration::from_millis(20), timer.fired()).await;
        assert!(again.is_err(), "a one-shot timer fired twice");
    }

    #[tokio::test]
    async fn a_new_deadline_replaces_the_earlier_one_and_its_expiry() {
        let timer = PreciseTimer::new().unwrap();
        let start = Instant::now();
        timer.arm(Duration::from_millis(1)).unwrap();
        timer.arm(Duration::from_millis(30)).unwrap();
        timer.fired().await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(30));

        // Expired unwaited, then armed again: the old expiry does not end the new wait.
        timer.arm(Duration::from_micros(100)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let start = Instant::now();
        timer.arm(Duration::from_millis(30)).unwrap();
        timer.fired().await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(30));
    }

    #[tokio::test]
    async fn an_expiry_nobody_waited_for_is_kept_for_the_next_wait() {
        let timer = PreciseTimer::new().unwrap();
        timer.arm(Duration::from_micros(100)).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        let kept = tokio::time::timeout(Duration::from_millis(20), timer.fired()).await;
        assert!(kept.is_ok(), "the expiry was lost");
        let again = tokio::time::timeout(Duration::from_millis(20), timer.fired()).await;
        assert!(again.is_err(), "a one-shot timer fired twice");
    }
}
