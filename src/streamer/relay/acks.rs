//! Ack tracking: which commits a subscriber has been sent and not yet acknowledged, for the cleanup policy.

use std::collections::VecDeque;

use tokio::time::Instant;
use tracing::info;

use crate::cleanup::subscribers::{SubscriberHandle, SubscriberInfo};
use crate::protocol::SubscriberContext;

use super::RelayContext;

/// Registers the subscriber with the watermark it subscribed from, if its query said where it stands.
pub(super) fn track(ctx: &RelayContext, subscription: &SubscriberContext) -> Option<AckTracker> {
    let (Some(id), Some(replica_version), Some(watermark)) = (
        &subscription.id,
        &subscription.replica_version,
        &subscription.watermark,
    ) else {
        return None;
    };
    info!(
        id = %id,
        task_id = subscription.task_id.as_deref().unwrap_or(""),
        mode = subscription.mode.as_str(),
        watermark = %watermark,
        "subscribed"
    );
    let handle = ctx.handles.subscribers.connect(SubscriberInfo {
        id: id.clone(),
        task_id: subscription.task_id.clone(),
        mode: subscription.mode,
        replica_version: replica_version.clone(),
        watermark: watermark.clone(),
    });
    Some(AckTracker::new(
        handle,
        ctx.settings.relay.max_pending_commits,
    ))
}

/// Commits sent to one subscriber and not yet acknowledged, in id order (docs/protocol.md, "A subscriber's
/// acknowledged watermark"), with when each was relayed: the oldest one's age is how far the subscriber lags.
pub(super) struct AckTracker {
    handle: SubscriberHandle,
    pub(super) pending: VecDeque<(u64, String, Instant)>,
    max_pending: usize,
}

impl AckTracker {
    pub(super) fn new(handle: SubscriberHandle, max_pending: usize) -> Self {
        Self {
            handle,
            pending: VecDeque::new(),
            max_pending,
        }
    }

    /// Commit `id` was relayed at `now` (the time of the read that brought it: a clock read per commit would cost
    /// more than the precision is worth).
    pub(super) fn sent_commit(&mut self, id: u64, watermark: String, now: Instant) {
        if self.pending.len() >= self.max_pending {
            merge_half(&mut self.pending);
        }
        self.handle.sent(&watermark, now);
        self.pending.push_back((id, watermark, now));
    }

    /// An ack of message `id` means every message up to it was consumed (acks come in order): the newest commit
    /// at or before it is durable on the subscriber.
    pub(super) fn acked(&mut self, id: u64) {
        let mut newest = None;
        while self
            .pending
            .front()
            .is_some_and(|(commit, _, _)| *commit <= id)
        {
            newest = self.pending.pop_front().map(|(_, watermark, _)| watermark);
        }
        if let Some(watermark) = newest {
            let oldest_pending = self.pending.front().map(|(_, _, at)| *at);
            self.handle.ack_with_pending(&watermark, oldest_pending);
        }
    }
}

/// Drops every other pending commit, always keeping the newest: an ack then advances to the newest kept commit
/// at or before it, which lags the exact one by at most a few commits and never leads it.
pub(super) fn merge_half<T>(pending: &mut VecDeque<T>) {
    let keep = pending.len() % 2;
    let mut index = 0;
    pending.retain(|_| {
        index += 1;
        index % 2 == keep
    });
}
