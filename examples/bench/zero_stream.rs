//! Zero 1.9.0's own `/changes` frames, as its change-streamer sent them to a v6 subscriber, for the relay benchmark to
//! replay instead of frames it makes up: the text Zero writes (its field order, its watermarks and LSNs, its message
//! sizes) is what the sidecar relays in production, so a replay of it measures the relay on what it really carries.
//!
//! `zero-1.9-stream.jsonl` beside this file holds one frame's text a line, byte for byte, from the status Zero sends
//! first through the last commit of the recorded workload: 500 transactions each inserting one row, 500 each
//! updating one row, then one inserting 3,000 rows (a status Zero sends with a lag report may come between
//! transactions). `tests/interop/lib/record-stream.mjs` recorded it against a real Zero 1.9.0 replication-manager;
//! its header says how to record it again.

/// The recording, one frame's text a line.
const STREAM: &str = include_str!("zero-1.9-stream.jsonl");

/// Every recorded frame's text, in the order Zero sent them: the status first.
pub fn messages() -> Vec<&'static str> {
    STREAM.lines().collect()
}

/// The tag of a frame's message: `msg[0]` of `{"id":…,"msg":[tag, …]}` ("status", "begin", "data", "commit", …).
fn tag(message: &str) -> String {
    let frame: serde_json::Value = serde_json::from_str(message).expect("a recorded frame is JSON");
    frame["msg"][0]
        .as_str()
        .unwrap_or_else(|| panic!("a recorded frame without a message tag: {message}"))
        .to_owned()
}

/// The transactions of `messages` after its first message (the status): each one from a message tagged `begin`
/// through the `commit` (or `rollback`) that ends it. A message between transactions (a later status) belongs to
/// none; a data message outside a transaction, a `begin` inside one or a transaction left open panics: the
/// recording is not what Zero sends.
pub fn transactions<'m, 'a>(messages: &'m [&'a str]) -> Vec<&'m [&'a str]> {
    let mut out = Vec::new();
    let mut open = None;
    for (i, message) in messages.iter().enumerate().skip(1) {
        match (tag(message).as_str(), open) {
            ("begin", None) => open = Some(i),
            ("begin", Some(start)) => {
                panic!("message {i} begins a transaction inside the one begun at {start}")
            }
            ("commit" | "rollback", Some(start)) => {
                out.push(&messages[start..=i]);
                open = None;
            }
            (_, Some(_)) => {}
            ("status", None) => {}
            (other, None) => panic!("message {i} ({other}) is outside any transaction"),
        }
    }
    if let Some(start) = open {
        panic!("the transaction begun at message {start} has no commit");
    }
    out
}
