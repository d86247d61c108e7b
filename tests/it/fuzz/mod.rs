//! Fuzz targets for every parser that reads bytes from outside the sidecar: request paths and query strings,
//! client acks, WebSocket frame headers, frame streams and close frames, Zero's refusal of a protocol version, the
//! commit inspector, litestream's
//! metrics page (parsed, stripped and clamped), `sidecar.toml` with its environment overrides, `host:port` and
//! backup URLs, the state file, and the `/status` answer the `status` command reads.
//!
//! Each target runs `FUZZ_CASES` cases (default [`DEFAULT_CASES`], the short run `make test` does; `make fuzz` runs
//! a million) of arbitrary bytes mixed with inputs built the way the real peers write them, then mutated. A case
//! fails when a parser panics, returns an error without a message, breaks a property stated next to its target,
//! or holds more heap at its peak than a bound linear in the input: a header claiming 100 MiB must not cost
//! 100 MiB. The peak is measured on the parser's own thread, so the harness and other tests do not count; the
//! counting allocator comes from the `allocation-counter` crate because the crate forbids the `unsafe` code an
//! allocator needs. Each target prints its case count, time and seed; `FUZZ_SEED` reruns a seed, a failure prints
//! the input proptest shrank it to, and nothing is persisted to disk. `FUZZ_PEAKS=1` also prints, per parser, the
//! highest peak seen, to show the room each bound leaves.

use crate::support::lexi;
use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Debug;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BytesMut;
use fastwebsockets::OpCode;
use futures_util::FutureExt;
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::{select, Index};
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use tokio::io::{AsyncRead, ReadBuf};

use litestream_sidecar::cleanup::state;
use litestream_sidecar::config::{self, ConfigError};
use litestream_sidecar::litestream::config::Filter;
use litestream_sidecar::litestream::{destination as backup, filter, page};
use litestream_sidecar::net::address;
use litestream_sidecar::net::ws::{self, Assembler, Inbox, PeerClose, ReadError, Reads};
use litestream_sidecar::ops::{status, status_cli};
use litestream_sidecar::protocol::inspect;
use litestream_sidecar::protocol::{self, Route, SubscriberContext, Version};

/// Cases per target in the short run: the whole file takes a few seconds in a debug build.
const DEFAULT_CASES: u32 = 2_000;

mod addresses;
mod client_acks;
mod commit_inspector;
mod config_file;
mod litestream_page;
mod request_paths;
mod state_file;
mod status_answer;
mod ws_frames;

// Shared by the page and frame targets.
use commit_inspector::{change_frame, ws_choice};

// ---------------------------------------------------------------------------------------------------------------
// The harness

fn cases() -> u32 {
    match std::env::var("FUZZ_CASES") {
        Ok(text) => text
            .replace('_', "")
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("FUZZ_CASES={text:?} is not a number of cases")),
        Err(_) => DEFAULT_CASES,
    }
}

/// A new seed each run unless `FUZZ_SEED` repeats one: every run explores further, and any run can be replayed.
fn seed() -> u64 {
    match std::env::var("FUZZ_SEED") {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("FUZZ_SEED={text:?} is not a u64")),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u128(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos(),
            );
            hasher.finish()
        }
    }
}

/// Cases run before a target is measured: libraries build some tables once per process on first use (the regular
/// expressions of `prometheus_parse`, for one), and that is no cost of any input.
const WARM_UP: u32 = 200;

thread_local! {
    static WARMING_UP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Panics seen while this thread runs a target, or `None` outside of one.
    static PANICS: std::cell::Cell<Option<u32>> = const { std::cell::Cell::new(None) };
    /// With `FUZZ_PEAKS` set: per parser, the highest peak seen and the highest peak per input byte beyond the
    /// fixed part of its bound, to show how much room each bound leaves.
    static PEAKS: std::cell::RefCell<Vec<(&'static str, u64, u64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Shows only the first panic of a target, with its place: shrinking a panic repeats it hundreds of times, and
/// proptest reports the smallest input that still panics, with the message, at the end.
fn show_first_panic_only() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let show = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| match PANICS.get() {
            None => show(info),
            Some(seen) => {
                PANICS.set(Some(seen + 1));
                if seen == 0 {
                    show(info);
                    eprintln!("(the same panic while shrinking is not shown again)");
                }
            }
        }));
    });
}

fn fuzz<S>(target: &str, strategy: S, test: impl Fn(S::Value) -> Result<(), TestCaseError>)
where
    S: Strategy,
    S::Value: Debug,
{
    show_first_panic_only();
    let (cases, seed) = (cases(), seed());
    let run = |cases: u32| {
        let mut runner = TestRunner::new(Config {
            cases,
            rng_seed: RngSeed::Fixed(seed),
            failure_persistence: None,
            // A failure found late in a long run is shrunk in bounded time.
            max_shrink_iters: 20_000,
            ..Config::default()
        });
        PANICS.set(Some(0));
        let result = runner.run(&strategy, &test);
        PANICS.set(None);
        if let Err(failure) = result {
            panic!("fuzz {target}: {failure}\nreplay with FUZZ_SEED={seed} FUZZ_CASES={cases}");
        }
    };
    WARMING_UP.set(true);
    run(WARM_UP.min(cases));
    WARMING_UP.set(false);
    let started = Instant::now();
    run(cases);
    eprintln!(
        "fuzz {target}: {cases} cases in {:.1?} (FUZZ_SEED={seed})",
        started.elapsed()
    );
    for (what, peak, per_byte) in PEAKS.take() {
        eprintln!("  {what}: highest peak {peak} bytes, at most {per_byte} per input byte beyond the fixed part");
    }
}

/// Runs `parse` and fails the case when its peak heap use on this thread exceeds `fixed + per_byte × input_len`.
/// What `parse` returns is still held at its end, so it counts too.
fn bounded<T>(
    what: &'static str,
    input_len: usize,
    (fixed, per_byte): (usize, usize),
    parse: impl FnOnce() -> T,
) -> Result<T, TestCaseError> {
    // A panic is caught inside the measurement and raised again after it: one that crossed it would leave the
    // counter's nesting open, and after 64 such cases (shrinking a panic tries many) the counter itself panics.
    let mut out = None;
    let info = allocation_counter::measure(|| {
        out = Some(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
            parse,
        )))
    });
    let out = match out.expect("measure runs its closure") {
        Ok(out) => out,
        Err(panic) => std::panic::resume_unwind(panic),
    };
    let limit = fixed + per_byte * input_len;
    if std::env::var_os("FUZZ_PEAKS").is_some() && !WARMING_UP.get() {
        let beyond = info.bytes_max.saturating_sub(fixed as u64) / (input_len.max(1) as u64);
        PEAKS.with_borrow_mut(|peaks| match peaks.iter_mut().find(|(w, ..)| *w == what) {
            Some((_, peak, per_byte)) => {
                *peak = (*peak).max(info.bytes_max);
                *per_byte = (*per_byte).max(beyond);
            }
            None => peaks.push((what, info.bytes_max, beyond)),
        });
    }
    prop_assert!(
        info.bytes_max <= limit as u64 || WARMING_UP.get(),
        "{what}: peak heap {} bytes for {input_len} input bytes, over the bound {limit}",
        info.bytes_max
    );
    Ok(out)
}

/// Bytes that print as a byte string when a case fails, not as a column of numbers.
#[derive(Clone, PartialEq, Eq)]
struct Text(Vec<u8>);

impl Debug for Text {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

impl std::ops::Deref for Text {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.0
    }
}

fn message_is_clear(what: &str, message: &str) -> Result<(), TestCaseError> {
    prop_assert!(!message.trim().is_empty(), "{what}: an empty error message");
    Ok(())
}

/// Every byte value, weighted towards bytes the parsers give meaning to.
fn byte(interesting: &'static [u8]) -> impl Strategy<Value = u8> + Clone {
    prop_oneof![any::<u8>(), select(interesting)]
}

fn bytes(interesting: &'static [u8], max: usize) -> impl Strategy<Value = Vec<u8>> + Clone {
    vec(byte(interesting), 0..max)
}

/// One edit of a well-formed input.
#[derive(Debug, Clone)]
enum Mutation {
    Set(Index, u8),
    Insert(Index, Vec<u8>),
    Delete(Index, usize),
    Duplicate(Index, usize),
    Truncate(Index),
}

fn mutation(interesting: &'static [u8]) -> impl Strategy<Value = Mutation> + Clone {
    prop_oneof![
        3 => (any::<Index>(), byte(interesting)).prop_map(|(at, b)| Mutation::Set(at, b)),
        3 => (any::<Index>(), vec(byte(interesting), 1..8)).prop_map(|(at, b)| Mutation::Insert(at, b)),
        2 => (any::<Index>(), 1usize..16).prop_map(|(at, n)| Mutation::Delete(at, n)),
        1 => (any::<Index>(), 1usize..64).prop_map(|(at, n)| Mutation::Duplicate(at, n)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(mut input: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let len = input.len();
        let at = |i: &Index| if len == 0 { 0 } else { i.index(len + 1) };
        match m {
            Mutation::Set(i, b) if len > 0 => input[i.index(len)] = *b,
            Mutation::Set(..) => input.push(0),
            Mutation::Insert(i, b) => {
                let at = at(i);
                input.splice(at..at, b.iter().copied());
            }
            Mutation::Delete(i, n) => {
                let at = at(i);
                input.drain(at..(at + n).min(len));
            }
            Mutation::Duplicate(i, n) => {
                let at = at(i);
                let copy = input[at..(at + n).min(len)].to_vec();
                input.splice(at..at, copy);
            }
            Mutation::Truncate(i) => input.truncate(at(i)),
        }
    }
    input
}

/// `base`, then one to four edits.
fn mutated(
    base: impl Strategy<Value = Vec<u8>> + Clone,
    interesting: &'static [u8],
) -> impl Strategy<Value = Vec<u8>> + Clone {
    (base, vec(mutation(interesting), 1..5)).prop_map(|(input, edits)| mutate(input, &edits))
}

fn lossy(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Watermarks as Zero writes them, and some it never would.
fn watermark() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => any::<u64>().prop_map(lexi),
        1 => "[0-9a-z]{0,14}",
        1 => select(&["", "0", "100", "0z", "718sh0nk8", "Z1", "a\"b", "a\\b", "\u{e9}t\u{e9}"][..]).prop_map(String::from),
    ]
}
