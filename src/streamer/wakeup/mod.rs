//! How many bytes from a subscriber are worth waking up for (the socket's `SO_RCVLOWAT`), decided without I/O.
//!
//! Zero's client acks every message in its own frame, `{"ack":N}`, in id order, each as soon as it has finished the
//! message (docs/protocol.md, "Frames and acks"). A relay woken for each of those frames does a read, a write upstream
//! and a sleep per message; most of a relay's CPU on Zero's traffic is that. But the relay knows how many messages it
//! has passed down that are not acknowledged yet, and how long their acks are at least: so it can ask the kernel not to
//! wake it before the subscriber has acked several of them, and then read and forward them together. Every ack still
//! reaches the upstream, in order; they leave in fewer, fuller writes.
//!
//! An ack held that way reaches the upstream later than a direct subscriber's would, and Zero 1.10 drops a subscriber
//! whose acks keep coming later than the majority's (docs/protocol.md, "Relayed subscribers dropped as too far
//! behind"). So the acks awaited together are bounded three ways:
//! - they never go past the newest message relayed: that one's ack is the one Zero waits for when it waits (it sends
//!   nothing more until it has it), and it is always the last of its wait, never held for a later one;
//! - at most [`MAX_ACKS_AWAITED`] of them: the subscriber's TCP sends only a congestion window of segments before
//!   this side acknowledges them, and a socket that does not deliver what it received acknowledges small segments
//!   only on its delayed-ACK timer, tens of milliseconds later. While the relay writes downstream its segments carry
//!   the acknowledgements; while Zero waits for an ack nothing goes down, and a wait for more acks than the window
//!   lets through would last until that timer;
//! - only as many as the subscriber is seen to send within the budget, the caller's wait limit: the first ack of a
//!   wait is expected to wait for the last no longer than that, and the limit (a timer to the microsecond) cuts
//!   short a wait that would. The time the subscriber takes per ack is measured from the reads
//!   ([`AckWakeups::read`]); until it is, and for a subscriber slower than the budget, the relay is woken for each
//!   ack, with no mark to set and no limit to arm: one ack comes in a segment of its own.
//!
//! A wait is only worth its fixed costs (arming the limit's timer, which in a virtual machine is one of the dearest
//! things the relay does; setting the mark; a wake-up for nothing when the limit passes) when it saves several
//! reads: acks are awaited together only while at least the caller's backlog of messages is in flight (a
//! subscriber catching up, a large transaction), and each is read as it comes in a live transaction of a few
//! messages, which is also where Zero waits for them.
//!
//! Waiting for bytes that never come would stall the subscription, so the threshold is only raised while the
//! subscriber has been seen to follow that protocol, and it drops back to one byte (wake for anything) as soon as
//! anything else may be on its way:
//! - until the subscriber's first ack shows one ack per message, and for good once an ack skips or repeats an id,
//!   or it sends anything but acks (a later protocol with cumulative or batched acks, or another client);
//! - for good once a message passed down is not one of Zero's single messages (`{"msg":…` or `{"id":…`): a
//!   stream that batches messages or announces other ack rules;
//! - while a ping to the subscriber waits for its pong, so that its liveness is judged on what it sent;
//! - and after the caller's wait limit ([`AckWakeups::waited_too_long`]), until the next read: a subscriber that
//!   stalls mid-transaction, or takes longer than it was seen to, still has its acks forwarded.

use std::time::Duration;

use tokio::time::Instant;

/// Most acks awaited at once. Linux starts a connection's congestion window at 10 segments and restarts it there
/// after an idle spell (RFC 6928, RFC 5681 section 4.1), and Zero's client sends each ack in a segment of its own;
/// 8 leaves room for a segment the last read left unacknowledged and for a pong.
pub const MAX_ACKS_AWAITED: u64 = 8;

/// Length of the shortest frame a client can ack message `id` with: a masked text frame (2 header bytes and a
/// 4-byte key) carrying `{"ack":<id>}` (8 bytes and the digits).
pub fn ack_frame_len(id: u64) -> u64 {
    2 + 4 + 8 + u64::from(id.checked_ilog10().unwrap_or(0) + 1)
}

/// At least how many bytes the acks of messages `first..=last` take, in the shortest form a client can send
/// them. Empty when `first > last`.
pub fn ack_bytes(first: u64, last: u64) -> u64 {
    if first > last {
        return 0;
    }
    // Sum over each run of ids with the same number of digits.
    let mut total = 0;
    let mut from = first;
    while from <= last {
        let digits = from.checked_ilog10().unwrap_or(0);
        let run_end = 10u64
            .checked_pow(digits + 1)
            .map_or(u64::MAX, |next| next - 1)
            .min(last);
        total += (run_end - from + 1) * ack_frame_len(from);
        if run_end == u64::MAX {
            break;
        }
        from = run_end + 1;
    }
    total
}

/// Whether a downstream message is one of Zero's single messages, the kind acked one by one: it opens with `msg`
/// (Zero 0.20) or `id` (Zero 1.6 and later).
pub fn is_single_message(payload: &[u8]) -> bool {
    payload.starts_with(br#"{"msg":"#) || payload.starts_with(br#"{"id":"#)
}

/// One relayed subscription's ack-wakeup state.
#[derive(Debug, Clone)]
pub struct AckWakeups {
    /// Largest threshold asked for, in bytes; 0 turns the feature off.
    cap: u64,
    /// How long the first ack of a wait is expected to wait for the last at most.
    budget: Duration,
    /// Fewest messages in flight for which acks are awaited together.
    backlog: u64,
    /// The subscriber acked message 1 with `{"ack":1}`: it follows one ack per message.
    confirmed: bool,
    /// Something broke the one-ack-per-message pattern: never raised again on this connection.
    off: bool,
    /// Whole messages passed down: Zero numbers them 1, 2, 3… per connection.
    relayed: u64,
    /// The newest ack read from the subscriber.
    acked: u64,
    awaiting_pong: bool,
    /// The wait limit passed since the threshold was raised: one byte until the next read.
    woken_by_limit: bool,
    /// The time the subscriber takes per ack, as last seen: it rises with each slower sample at once and falls back
    /// an eighth of the way per faster one. `None` until measured.
    pace: Option<Duration>,
    /// Since when the subscriber has been working on the acks not read yet: the last read, or the message relayed
    /// when it had nothing left to ack.
    since: Option<Instant>,
    /// The newest ack at the last read.
    acked_at_read: u64,
}

impl AckWakeups {
    /// `cap`: `relay.ack_wakeup_bytes`; `wait`: `relay.ack_wakeup_wait`, after which the caller reads anyway
    /// ([`AckWakeups::waited_too_long`]). It is also the budget: what the subscriber is seen to send within it is
    /// awaited, and an ack slower than usual is read at the limit, so that no ack waits longer whatever the pace.
    /// `backlog`: `relay.ack_wakeup_backlog`, the fewest messages in flight worth a wait.
    pub fn new(cap: u64, wait: Duration, backlog: u64) -> Self {
        Self {
            cap,
            budget: wait,
            backlog: backlog.max(1),
            confirmed: false,
            off: cap == 0,
            relayed: 0,
            acked: 0,
            awaiting_pong: false,
            woken_by_limit: false,
            pace: None,
            since: None,
            acked_at_read: 0,
        }
    }

    /// A whole message was passed down at `now`; `payload` is (the start of) its text, `None` for a binary message.
    pub fn relayed(&mut self, payload: Option<&[u8]>, now: Instant) {
        if self.acked >= self.relayed {
            // The subscriber had nothing to do: its next ack is this message's work, not the idle time before it.
            self.since = Some(now);
        }
        self.relayed += 1;
        if !payload.is_some_and(is_single_message) {
            self.off = true;
        }
    }

    /// Whole messages passed down so far: the id of the newest, as Zero numbers them.
    pub fn messages_relayed(&self) -> u64 {
        self.relayed
    }

    /// The subscriber acked message `id`.
    pub fn acked(&mut self, id: u64) {
        if id != self.acked + 1 || id > self.relayed {
            self.off = true;
        }
        self.acked = id;
        if id == 1 {
            self.confirmed = true;
        }
    }

    /// The subscriber sent a data frame that is not an ack.
    pub fn not_an_ack(&mut self) {
        self.off = true;
    }

    /// A ping went to the subscriber: wake for its pong.
    pub fn pinged(&mut self) {
        self.awaiting_pong = true;
    }

    pub fn ponged(&mut self) {
        self.awaiting_pong = false;
    }

    /// A read from the subscriber ended at `now`: a wait cut short by the limit is over, and the acks it brought
    /// measure the subscriber's pace. They took at most the time since the subscriber began on them: an idle spell
    /// or a late wake-up only makes the pace look slower, which awaits fewer acks. A read without acks (a pong)
    /// leaves the measurement running.
    pub fn read(&mut self, now: Instant) {
        self.woken_by_limit = false;
        let acks = self.acked.saturating_sub(self.acked_at_read);
        if acks == 0 {
            return;
        }
        self.acked_at_read = self.acked;
        if let Some(since) = self.since {
            let sample =
                now.saturating_duration_since(since) / u32::try_from(acks).unwrap_or(u32::MAX);
            self.pace = Some(match self.pace {
                Some(pace) if sample < pace => pace - (pace - sample) / 8,
                _ => sample,
            });
        }
        self.since = Some(now);
    }

    /// The caller's wait limit passed with the threshold raised.
    pub fn waited_too_long(&mut self) {
        self.woken_by_limit = true;
    }

    /// How many acks one wait may cover: as many as the subscriber is seen to send within the budget after the
    /// first, at most [`MAX_ACKS_AWAITED`], and one until its pace is known.
    fn acks_per_wait(&self) -> u64 {
        let by_pace = match self.pace {
            None => 1,
            Some(pace) if pace.is_zero() => u64::MAX,
            Some(pace) => {
                let within = self.budget.as_nanos() / pace.as_nanos();
                1 + u64::try_from(within).unwrap_or(u64::MAX)
            }
        };
        by_pace.min(MAX_ACKS_AWAITED)
    }

    /// The threshold to set now, in bytes (1 wakes for anything), or `None` to leave it as it is: with nothing
    /// in flight no ack is awaited, but the next transaction's acks are likely as long as the last one's, and
    /// leaving the mark spares setting it twice per transaction. Whatever else the subscriber sends meanwhile (a
    /// close) is read after the wait limit at most; a pong it owes is not kept waiting at all. `partial`: bytes of
    /// a frame already read but not whole yet, which count toward the first ack awaited.
    pub fn threshold(&self, partial: u64) -> Option<u64> {
        if self.off || !self.confirmed || self.awaiting_pong || self.woken_by_limit {
            return Some(1);
        }
        if self.acked >= self.relayed {
            return None;
        }
        if self.relayed - self.acked < self.backlog {
            // Too few in flight to repay a wait's fixed costs: each ack as it comes.
            return Some(1);
        }
        let last = self
            .relayed
            .min(self.acked.saturating_add(self.acks_per_wait()));
        if last == self.acked + 1 {
            // One ack comes in one segment: waiting for it is waking for anything, without the mark to set and
            // the limit to arm around each wait.
            return Some(1);
        }
        Some(
            ack_bytes(self.acked + 1, last)
                .saturating_sub(partial)
                .clamp(1, self.cap),
        )
    }

    /// Whether acks read at `held_since` and held since may wait at `now` for the next read (the relay's ack
    /// batching): only if the next read is expected within the budget of the first, at the subscriber's pace.
    pub fn may_hold(&self, held_since: Instant, now: Instant) -> bool {
        let Some(pace) = self.pace else {
            return false;
        };
        let acks = match self.threshold(0) {
            Some(1) | None => 1,
            Some(_) => self
                .acks_per_wait()
                .min(self.relayed.saturating_sub(self.acked)),
        };
        let next_read = pace.saturating_mul(u32::try_from(acks).unwrap_or(u32::MAX));
        now.saturating_duration_since(held_since) + next_read <= self.budget
    }
}

#[cfg(test)]
mod tests;
