//! How many bytes from a subscriber are worth waking up for (the socket's `SO_RCVLOWAT`), decided without I/O.
//!
//! Zero's client acks every message in its own frame, `{"ack":N}`, in id order, each as soon as it has finished the
//! message (docs/protocol.md, "Frames and acks"). A relay woken for each of those frames does a read, a write upstream
//! and a sleep per message; most of a relay's CPU on Zero's traffic is that. But the relay knows how many messages it
//! has passed down that are not acknowledged yet, and how long their acks are at least: so it can ask the kernel not to
//! wake it before the subscriber has acked all of them (up to a cap), and then read and forward them together. Every
//! ack still reaches the upstream, in order; they leave in fewer, fuller writes.
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
//!   stalls mid-transaction still has its acks forwarded.

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
}

impl AckWakeups {
    pub fn new(cap: u64) -> Self {
        Self {
            cap,
            confirmed: false,
            off: cap == 0,
            relayed: 0,
            acked: 0,
            awaiting_pong: false,
            woken_by_limit: false,
        }
    }

    /// A whole message was passed down; `payload` is (the start of) its text, `None` for a binary message.
    pub fn relayed(&mut self, payload: Option<&[u8]>) {
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

    /// Bytes were read from the subscriber: a wait cut short by the limit is over.
    pub fn read(&mut self) {
        self.woken_by_limit = false;
    }

    /// The caller's wait limit passed with the threshold raised.
    pub fn waited_too_long(&mut self) {
        self.woken_by_limit = true;
    }

    /// The threshold to set now, in bytes (1 wakes for anything), or `None` to leave it as it is: with nothing
    /// in flight no ack is awaited, but the next transaction's acks are likely as long as the last one's, and
    /// leaving the mark spares setting it twice per transaction. Whatever else the subscriber sends meanwhile (a
    /// close) is read after the wait limit at most; a pong it owes is not kept waiting at all.
    pub fn threshold(&self) -> Option<u64> {
        if self.off || !self.confirmed || self.awaiting_pong || self.woken_by_limit {
            return Some(1);
        }
        if self.acked >= self.relayed {
            return None;
        }
        Some(ack_bytes(self.acked + 1, self.relayed).clamp(1, self.cap))
    }
}

#[cfg(test)]
mod tests;
