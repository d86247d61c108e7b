//! What the periodic loops share: [`Cell`], a value one task writes and others read (the monitor's and the
//! discovery loop's state, read by `/keepalive`, `/metrics`, systemd's status line and tests), and [`Every`], the
//! rhythm of such a loop.

use std::sync::{Arc, Mutex, MutexGuard};

/// Cheap to clone; readers get a copy, so the lock is held only for the copy and never across an `.await`.
#[derive(Debug, Default)]
pub struct Cell<T>(Arc<Mutex<T>>);

impl<T> Clone for Cell<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T: Clone> Cell<T> {
    pub fn get(&self) -> T {
        self.lock().clone()
    }

    /// Reads what `f` takes from the value under the lock, without copying the rest: for a reader that needs one
    /// field of a large state.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.lock())
    }

    pub fn update(&self, f: impl FnOnce(&mut T)) {
        f(&mut self.lock());
    }

    fn lock(&self) -> MutexGuard<'_, T> {
        // A panic while holding this lock leaves plain data behind; keep serving with it.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The rhythm of a periodic loop: the first tick at once, then every `period`; a tick that comes late (a slow
/// check) delays the next rather than bunching them up.
pub struct Every(tokio::time::Interval);

impl Every {
    pub fn new(period: std::time::Duration) -> Self {
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        Self(interval)
    }

    /// Waits for the next tick; `false` once `shutdown` is cancelled (checked first).
    pub async fn tick(&mut self, shutdown: &tokio_util::sync::CancellationToken) -> bool {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => false,
            _ = self.0.tick() => true,
        }
    }
}
