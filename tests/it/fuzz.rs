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

// ---------------------------------------------------------------------------------------------------------------
// Request paths and query strings

const QUERY_KEYS: &[&str] = &[
    "id",
    "taskID",
    "mode",
    "replicaVersion",
    "watermark",
    "initial",
    "Initial",
    "%69nitial",
    "initial%00",
    "task%49D",
    "initia",
    "",
    "x",
];
const QUERY_VALUES: &[&str] = &[
    "",
    "true",
    "false",
    "TRUE",
    "tru%65",
    "true1",
    "backup",
    "serving",
    "Backup",
    "718sh0nk8",
    "%",
    "%%",
    "%zz",
    "a+b",
    "a%2Fb",
    "%C3%A9",
    "%FF",
    "=",
    "==",
    "\u{e9}",
    "%00",
];

fn query() -> impl Strategy<Value = String> + Clone {
    let key = prop_oneof![
        3 => select(QUERY_KEYS).prop_map(String::from),
        1 => "[a-zA-Z0-9%+=._~-]{0,8}",
    ];
    let value = prop_oneof![
        3 => select(QUERY_VALUES).prop_map(String::from),
        1 => "[a-zA-Z0-9%+=._~/ -]{0,12}",
        1 => watermark(),
    ];
    let separator = select(&["&", "&", "&", "&&", ";", ""][..]);
    vec((key, proptest::option::of(value), separator), 0..8).prop_map(|parts| {
        let mut query = String::new();
        for (key, value, separator) in parts {
            query.push_str(&key);
            if let Some(value) = value {
                query.push('=');
                query.push_str(&value);
            }
            query.push_str(separator);
        }
        query
    })
}

fn path() -> impl Strategy<Value = String> + Clone {
    let segment = prop_oneof![
        any::<u64>().prop_map(|n| format!("v{n}")),
        (0u64..8).prop_map(|n| format!("v{n}")),
        "v[0-9]{15,40}",
        "[vV]?[0-9a-z%.]{0,6}",
    ];
    let action = select(
        &[
            "snapshot",
            "changes",
            "snapshots",
            "",
            "changes/",
            "x/changes",
        ][..],
    );
    prop_oneof![
        1 => select(&["/", "/keepalive", "/metrics", "/status", "", "/replication/", "/keepalive/"][..])
            .prop_map(String::from),
        4 => (segment, action).prop_map(|(segment, action)| format!("/replication/{segment}/{action}")),
        1 => "/[a-z/%.0-9]{0,24}",
    ]
}

/// A request target: `path` or `path?query`.
fn request_target() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        1 => bytes(b"/?&=%+v0123456789", 200).prop_map(lossy),
        1 => any::<String>(),
        4 => (path(), proptest::option::of(query())).prop_map(|(path, query)| match query {
            Some(query) => format!("{path}?{query}"),
            None => path,
        }),
        1 => mutated(
            (path(), query()).prop_map(|(path, query)| format!("{path}?{query}").into_bytes()),
            b"/?&=%+",
        ).prop_map(lossy),
    ]
}

/// Route, version checks, subscriber context and the `initial` rewrite: each allocates at most a few copies of
/// the target (the path in an invalid-path message, decoded values, the rewritten query).
#[test]
fn request_path() {
    const BOUND: (usize, usize) = (1024, 4);
    fuzz("request_path", request_target(), |target| {
        let (path, query) = match target.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (target.as_str(), None),
        };
        let len = target.len();
        let route = bounded("route", len, BOUND, || protocol::route(path))?;
        if let Route::Snapshot(version) | Route::Changes(version) = &route {
            prop_assert!(path.starts_with("/replication/"));
            if let Version::Invalid(invalid) = version {
                prop_assert_eq!(invalid, path);
            }
            match bounded("check_snapshot", len, BOUND, || {
                protocol::check_snapshot(version, query, None)
            })? {
                Ok((n, task_id)) => {
                    prop_assert!(protocol::SNAPSHOT_VERSIONS.contains(&n));
                    prop_assert!(!task_id.is_empty());
                }
                Err(message) => message_is_clear("check_snapshot", &message)?,
            }
            if let Err(message) = bounded("check_changes", len, BOUND, || {
                protocol::check_changes(version, None)
            })? {
                message_is_clear("check_changes", &message)?;
            }
            // A known upstream range only narrows what is accepted, and only by the version.
            for upstream in [1..=3, 4..=6, 7..=9] {
                let narrowed = protocol::check_snapshot(version, query, Some(&upstream));
                if let Ok((n, _)) = &narrowed {
                    prop_assert!(upstream.contains(n));
                    prop_assert_eq!(&narrowed, &protocol::check_snapshot(version, query, None));
                }
                let narrowed = protocol::check_changes(version, Some(&upstream));
                if narrowed.is_ok() {
                    prop_assert!(protocol::check_changes(version, None).is_ok());
                }
            }
        }
        let context = bounded("parse_subscriber_context", len, BOUND, || {
            protocol::parse_subscriber_context(query)
        })?;
        // Both read a parameter as Zero does: its first occurrence, empty counting as absent.
        prop_assert_eq!(&context.id, &protocol::query_param(query, "id"));
        prop_assert_eq!(&context.task_id, &protocol::query_param(query, "taskID"));
        prop_assert_eq!(
            &context.watermark,
            &protocol::query_param(query, "watermark")
        );
        prop_assert_eq!(
            &context.replica_version,
            &protocol::query_param(query, "replicaVersion")
        );
        if let Some(query) = query {
            // Rewritten exactly when Zero would read `initial=true`, and then Zero reads `false` and all else
            // unchanged.
            match bounded("suppress_initial", len, BOUND, || {
                protocol::suppress_initial(query)
            })? {
                Cow::Borrowed(kept) => {
                    prop_assert!(!context.initial);
                    prop_assert_eq!(kept, query);
                }
                Cow::Owned(rewritten) => {
                    prop_assert!(context.initial);
                    prop_assert_eq!(
                        protocol::parse_subscriber_context(Some(&rewritten)),
                        SubscriberContext {
                            initial: false,
                            ..context
                        }
                    );
                }
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------------------------
// Client acks

fn ack() -> impl Strategy<Value = Vec<u8>> + Clone {
    let number = prop_oneof![
        3 => any::<u64>().prop_map(|n| n.to_string()),
        1 => select(&[
            "0", "-1", "-0", "01", "1.5", "1e3", "18446744073709551615", "18446744073709551616",
            "\"1\"", "null", "true", "[1]", "{}", "", "99999999999999999999999",
        ][..]).prop_map(String::from),
    ];
    let space = select(&["", "", "", " ", "\n", "\t ", "\r\n"][..]);
    let extra = select(&["", "", "", ",\"x\":1", ",\"ack\":2", ",", "}"][..]);
    let plain = (number, space, extra)
        .prop_map(|(n, s, extra)| format!("{s}{{{s}\"ack\"{s}:{s}{n}{s}{extra}}}{s}").into_bytes());
    prop_oneof![
        2 => bytes(b"{}\"ack:0123456789-. ", 48),
        4 => plain.clone(),
        2 => mutated(plain, b"{}\":,0123456789 "),
    ]
}

/// An ack is at most a JSON object's worth of copies: serde_json's scratch for escaped keys, and the error text.
#[test]
fn client_ack() {
    fuzz("client_ack", ack().prop_map(Text), |text| {
        match bounded("decode_ack", text.len(), (512, 2), || {
            protocol::decode_ack(&text)
        })? {
            Ok(id) => {
                // Exactly an object with the single key `ack` holding that number.
                let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                    TestCaseError::fail(format!("accepted an ack that is not JSON: {e}"))
                })?;
                let object = value
                    .as_object()
                    .ok_or_else(|| TestCaseError::fail("not an object"))?;
                prop_assert_eq!(object.len(), 1);
                prop_assert_eq!(object.get("ack").and_then(|v| v.as_u64()), Some(id));
            }
            Err(err) => message_is_clear("decode_ack", &err.to_string())?,
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------------------------
// WebSocket frames

/// One frame as a peer may put it on the wire, honest or not.
#[derive(Debug, Clone)]
struct FrameSpec {
    fin: bool,
    /// The three reserved bits.
    rsv: u8,
    opcode: u8,
    /// Whether a mask is sent; a peer sending the wrong kind breaks the protocol.
    masked: bool,
    mask: [u8; 4],
    payload: Vec<u8>,
    /// A length other than the payload's: more (a frame that never completes) or less.
    claimed: Option<u64>,
    /// 0: the shortest length encoding; 1: 16 bits; 2: 64 bits (allowed, if wasteful).
    encoding: u8,
}

impl FrameSpec {
    fn is_valid(&self, from_client: bool, limit: usize) -> bool {
        let control = self.opcode >= 8;
        self.rsv == 0
            && matches!(self.opcode, 0 | 1 | 2 | 8 | 9 | 10)
            && self.masked == from_client
            && self.claimed.is_none()
            && (!control || (self.fin && self.payload.len() <= 125))
            && self.payload.len() <= limit
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.push((u8::from(self.fin) << 7) | ((self.rsv & 7) << 4) | (self.opcode & 0x0f));
        let len = self.claimed.unwrap_or(self.payload.len() as u64);
        let mask_bit = if self.masked { 0x80 } else { 0 };
        match (self.encoding, len) {
            (0, 0..=125) => out.push(mask_bit | len as u8),
            (0 | 1, 0..=0xffff) => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(len as u16).to_be_bytes());
            }
            _ => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&len.to_be_bytes());
            }
        }
        if self.masked {
            out.extend_from_slice(&self.mask);
            out.extend(
                self.payload
                    .iter()
                    .enumerate()
                    .map(|(i, b)| b ^ self.mask[i % 4]),
            );
        } else {
            out.extend_from_slice(&self.payload);
        }
    }
}

fn close_payload() -> impl Strategy<Value = Vec<u8>> + Clone {
    let code = prop_oneof![
        select(
            &[1000u16, 1001, 1002, 1003, 1005, 1006, 1007, 1011, 1015, 2999, 3000, 4999, 5000][..]
        ),
        any::<u16>(),
    ];
    let reason = prop_oneof![
        "[a-z ]{0,20}".prop_map(String::into_bytes),
        "\\PC{0,10}".prop_map(String::into_bytes),
        vec(any::<u8>(), 0..8),
        Just(vec![b'x'; 124]),
    ];
    prop_oneof![
        1 => vec(any::<u8>(), 0..3),
        4 => (code, reason).prop_map(|(code, reason)| {
            let mut payload = code.to_be_bytes().to_vec();
            payload.extend_from_slice(&reason);
            payload
        }),
    ]
}

/// Payloads: what the peers send (acks, change-stream messages), any bytes, and sometimes a lot of them.
fn frame_payload() -> impl Strategy<Value = Vec<u8>> + Clone {
    prop_oneof![
        4 => vec(any::<u8>(), 0..64),
        2 => any::<u64>().prop_map(|n| format!("{{\"ack\":{n}}}").into_bytes()),
        2 => change_frame().prop_map(|(text, _)| text.into_bytes()),
        1 => vec(any::<u8>(), 126..2000),
        1 => (1usize..70_000).prop_map(|n| vec![b'a'; n]),
    ]
}

fn frame_spec(from_client: bool) -> impl Strategy<Value = FrameSpec> + Clone {
    let opcode = prop_oneof![
        8 => select(&[0u8, 1, 2][..]),
        3 => select(&[8u8, 9, 10][..]),
        1 => 0u8..16,
    ];
    let claimed = prop_oneof![
        12 => Just(None),
        1 => (0u64..100_000).prop_map(Some),
        1 => select(&[100u64 << 20, 128 << 20, (128 << 20) + 1, 1 << 40, u64::MAX][..]).prop_map(Some),
        1 => any::<u64>().prop_map(Some),
    ];
    (
        prop_oneof![3 => Just(true), 1 => Just(false)],
        prop_oneof![20 => Just(0u8), 1 => 0u8..8],
        opcode,
        prop_oneof![20 => Just(from_client), 1 => Just(!from_client)],
        any::<[u8; 4]>(),
        frame_payload(),
        close_payload(),
        claimed,
        prop_oneof![6 => Just(0u8), 1 => 1u8..3],
    )
        .prop_map(
            move |(fin, rsv, opcode, masked, mask, payload, close, claimed, encoding)| {
                let control = opcode >= 8;
                FrameSpec {
                    // Mostly honest control frames: final, and a close carries a code and reason.
                    fin: fin || (control && rsv == 0),
                    rsv,
                    opcode,
                    masked,
                    mask,
                    payload: match opcode {
                        8 => close,
                        9 | 10 => payload.into_iter().take(125).collect(),
                        _ => payload,
                    },
                    claimed,
                    encoding,
                }
            },
        )
}

/// Bytes a peer sends, cut into the reads that deliver them.
#[derive(Debug, Clone)]
struct Stream {
    from_client: bool,
    limit: usize,
    bytes: Text,
    chunks: Vec<usize>,
    /// Every frame is valid and whole and nothing was mutated: what both readers must find, in order.
    frames: Option<Vec<(bool, u8, Text)>>,
}

fn stream() -> impl Strategy<Value = Stream> + Clone {
    let limit = select(&[125usize, 4096, 128 << 20][..]);
    let chunks = vec(
        prop_oneof![1usize..8, 8usize..512, Just(1usize << 20)],
        1..8,
    );
    let specs = any::<bool>()
        .prop_flat_map(|from_client| (Just(from_client), vec(frame_spec(from_client), 0..6)));
    let framed =
        (specs, limit.clone(), chunks.clone()).prop_map(|((from_client, specs), limit, chunks)| {
            let mut bytes = Vec::new();
            for spec in &specs {
                spec.encode(&mut bytes);
            }
            let frames = specs
                .iter()
                .all(|s| s.is_valid(from_client, limit))
                .then(|| {
                    specs
                        .iter()
                        .map(|s| (s.fin, s.opcode, Text(s.payload.clone())))
                        .collect()
                });
            Stream {
                from_client,
                limit,
                bytes: Text(bytes),
                chunks,
                frames,
            }
        });
    let broken = (
        framed.clone(),
        vec(mutation(b"\x00\x7e\x7f\x80\x81\x82\x88\x89\x8a\xff"), 1..5),
    )
        .prop_map(|(stream, edits)| Stream {
            bytes: Text(mutate(stream.bytes.0, &edits)),
            frames: None,
            ..stream
        });
    let arbitrary = (
        any::<bool>(),
        limit,
        bytes(b"\x00\x7e\x7f\x80\x81\x82\x88\x89\x8a\xff", 300),
        chunks,
    )
        .prop_map(|(from_client, limit, bytes, chunks)| Stream {
            from_client,
            limit,
            bytes: Text(bytes),
            chunks,
            frames: None,
        });
    prop_oneof![4 => framed, 2 => broken, 1 => arbitrary]
}

/// A socket whose reads return the stream's bytes in the given chunk sizes, then end. Never pending, so a read
/// completes on its first poll.
struct Chunked<'a> {
    bytes: &'a [u8],
    chunks: &'a [usize],
    reads: usize,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let chunk = self.chunks[self.reads % self.chunks.len()];
        let n = chunk.min(self.bytes.len()).min(buf.remaining());
        buf.put_slice(&self.bytes[..n]);
        self.bytes = &self.bytes[n..];
        self.reads += 1;
        Poll::Ready(Ok(()))
    }
}

fn now<F: Future>(future: F) -> F::Output {
    future
        .now_or_never()
        .expect("a read from a socket that is never pending completes at once")
}

/// Frames as read, hashed in order without keeping them (keeping them would count against the bound).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Digest(u64, usize);

impl Digest {
    fn frame(&mut self, fin: bool, opcode: OpCode, payload: impl IntoIterator<Item = u8>) {
        let mut h = self.0 ^ 0xcbf2_9ce4_8422_2325;
        for b in [u8::from(fin), opcode as u8].into_iter().chain(payload) {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
        h = (h ^ 0xff).wrapping_mul(0x0100_0000_01b3);
        *self = Digest(h, self.1 + 1);
    }
}

/// What each side does with a whole message: a reservation decodes acks; the relay inspects commits going down
/// and acks coming up.
fn on_message(from_client: bool, opcode: OpCode, message: &[u8]) {
    if opcode == OpCode::Text {
        if from_client {
            let _ = protocol::decode_ack(message);
        } else {
            let _ = inspect::inspect(message);
        }
    }
}

/// A reservation's reader: whole frames one at a time, messages policed.
fn read_frames(stream: &Stream) -> Result<(Digest, Option<ReadError>), TestCaseError> {
    let mut inbox = Inbox::new(stream.from_client, stream.limit, Reads::Small);
    let mut assembler = Assembler::new(stream.limit);
    let mut socket = Chunked {
        bytes: &stream.bytes,
        chunks: &stream.chunks,
        reads: 0,
    };
    let mut digest = Digest::default();
    let mut policed = true;
    let end = loop {
        let frame = match now(inbox.read_frame(&mut socket)) {
            Ok(frame) => frame,
            Err(end) => break end,
        };
        digest.frame(frame.fin, frame.opcode, frame.payload.iter().copied());
        match frame.opcode {
            OpCode::Close => match ws::read_close(frame.payload) {
                PeerClose::Valid { .. } => {}
                PeerClose::Invalid(with) => message_is_clear("read_close", &with.reason)?,
            },
            OpCode::Ping | OpCode::Pong => {}
            opcode if policed => {
                let pushed = assembler.push_checked(frame.fin, opcode, &frame.payload, |op, m| {
                    on_message(stream.from_client, op, m)
                });
                if let Err(with) = pushed {
                    message_is_clear("push_checked", &with.reason)?;
                    policed = false;
                }
            }
            _ => {}
        }
    };
    Ok((
        digest,
        match end {
            ReadError::Gone => None,
            protocol => Some(protocol),
        },
    ))
}

/// The relay's reader: the frames of each read walked in place, data frames passed on as received, control
/// frames taken out to answer, the rest of a frame waited for.
fn walk_frames(stream: &Stream) -> Result<(Digest, bool), TestCaseError> {
    let mut inbox = Inbox::new(stream.from_client, stream.limit, Reads::Bulk);
    let mut assembler = Assembler::new(stream.limit);
    let mut socket = Chunked {
        bytes: &stream.bytes,
        chunks: &stream.chunks,
        reads: 0,
    };
    let mut digest = Digest::default();
    let mut scratch = Vec::new();
    loop {
        let read = now(inbox.fill(&mut socket)).expect("the test socket never fails");
        if read == 0 {
            return Ok((digest, true));
        }
        let mut frames = 0;
        loop {
            let header = match inbox.header_at(frames) {
                Ok(Some(header)) => header,
                Ok(None) => break,
                Err(with) => {
                    prop_assert!(matches!(with.code, 1002 | 1009), "close code {}", with.code);
                    message_is_clear("header_at", &with.reason)?;
                    return Ok((digest, false));
                }
            };
            let end = frames + header.frame_len();
            if inbox.buffered().len() < end {
                if frames > 0 {
                    drop(inbox.take_frames(std::mem::take(&mut frames)));
                }
                inbox.wait_for(&header);
                break;
            }
            if header.is_control() {
                if frames > 0 {
                    drop(inbox.take_frames(std::mem::take(&mut frames)));
                }
                let frame = inbox.take_frame(&header);
                digest.frame(frame.fin, frame.opcode, frame.payload.iter().copied());
                if frame.opcode == OpCode::Close {
                    if let PeerClose::Invalid(with) = ws::read_close(frame.payload) {
                        message_is_clear("read_close", &with.reason)?;
                    }
                }
                continue;
            }
            let payload = &inbox.buffered()[frames + header.len..end];
            let key = header.mask.unwrap_or_default();
            digest.frame(
                header.fin,
                header.opcode,
                payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]),
            );
            // The relay unmasks a client's frame into scratch space only when it may be part of an ack.
            let payload = match header.mask {
                Some(key) if payload.len() <= 4096 => {
                    scratch.clear();
                    scratch.extend_from_slice(payload);
                    fastwebsockets::unmask(&mut scratch, key);
                    &scratch[..]
                }
                _ => payload,
            };
            assembler.push(header.fin, header.opcode, payload, |op, m| {
                on_message(stream.from_client, op, m)
            });
            frames = end;
        }
        if frames > 0 {
            drop(inbox.take_frames(frames));
        }
    }
}

/// Both readers over one stream. Their memory follows the bytes that arrived, never a frame's claimed length: the
/// read buffer at most doubles per wait (starting from 32 KiB and a read's room of up to 32 KiB), a fragmented
/// message is copied once into a buffer that doubles, and a reallocation briefly holds old and new. Hence 192 KiB
/// plus 8 bytes per input byte; before the buffer grew with the bytes, one header claiming 100 MiB cost 100 MiB.
#[test]
fn ws_frames() {
    const BOUND: (usize, usize) = (192 << 10, 8);
    fuzz("ws_frames", stream(), |stream| {
        let len = stream.bytes.len();
        let (read, end) = bounded("Inbox::read_frame", len, BOUND, || read_frames(&stream))??;
        let (walked, whole) = bounded("Inbox::header_at", len, BOUND, || walk_frames(&stream))??;
        if let Some(ReadError::Protocol(with)) = &end {
            prop_assert!(matches!(with.code, 1002 | 1009), "close code {}", with.code);
            message_is_clear("read_frame", &with.reason)?;
        }
        if let Some(frames) = &stream.frames {
            let mut expected = Digest::default();
            for (fin, opcode, payload) in frames {
                let opcode = OpCode::try_from(*opcode).expect("a valid opcode");
                expected.frame(*fin, opcode, payload.iter().copied());
            }
            prop_assert!(end.is_none(), "a valid stream ended with {end:?}");
            prop_assert!(whole, "a valid stream was refused");
            prop_assert_eq!(read, expected, "read_frame");
            prop_assert_eq!(walked, expected, "header_at");
        }
        Ok(())
    });
}

fn header_bytes() -> impl Strategy<Value = (Text, bool, usize)> + Clone {
    let limit = select(&[0usize, 125, 1000, 128 << 20, usize::MAX][..]);
    let from_spec = any::<bool>()
        .prop_flat_map(|from_client| (Just(from_client), frame_spec(from_client), any::<Index>()))
        .prop_map(|(from_client, spec, cut)| {
            let mut bytes = Vec::new();
            FrameSpec {
                payload: Vec::new(),
                claimed: Some(spec.claimed.unwrap_or(spec.payload.len() as u64)),
                ..spec
            }
            .encode(&mut bytes);
            // Sometimes only part of the header has arrived.
            let keep = if cut.index(4) == 0 {
                cut.index(bytes.len() + 1)
            } else {
                bytes.len()
            };
            bytes.truncate(keep);
            (bytes, from_client)
        });
    (
        prop_oneof![(vec(any::<u8>(), 0..16), any::<bool>()), from_spec,],
        limit,
    )
        .prop_map(|((bytes, from_client), limit)| (Text(bytes), from_client, limit))
}

/// A header is read in place: nothing is allocated but an error's reason.
#[test]
fn ws_header() {
    fuzz(
        "ws_header",
        header_bytes(),
        |(bytes, from_client, limit)| {
            match bounded("parse_header", bytes.len(), (256, 0), || {
                ws::parse_header(&bytes, from_client, limit)
            })? {
                Ok(Some(header)) => {
                    prop_assert!(matches!(header.len, 2 | 4 | 6 | 8 | 10 | 14));
                    prop_assert!(header.len <= bytes.len());
                    prop_assert!(header.payload_len <= limit);
                    prop_assert_eq!(header.mask.is_some(), from_client);
                    if header.is_control() {
                        prop_assert!(header.fin && header.payload_len <= 125);
                    }
                    prop_assert!(header.frame_len() >= header.payload_len);
                }
                // A header is at most 14 bytes: with 14 it is whole or wrong.
                Ok(None) => prop_assert!(bytes.len() < 14),
                Err(with) => {
                    prop_assert!(matches!(with.code, 1002 | 1009), "close code {}", with.code);
                    message_is_clear("parse_header", &with.reason)?;
                }
            }
            Ok(())
        },
    );
}

/// A close frame's payload is validated in place; only an error's reason is allocated.
#[test]
fn ws_close() {
    let payload = prop_oneof![close_payload(), vec(any::<u8>(), 0..200)].prop_map(Text);
    fuzz("ws_close", payload, |payload| {
        let frame = BytesMut::from(&payload[..]);
        match bounded("read_close", payload.len(), (256, 0), || {
            ws::read_close(frame)
        })? {
            PeerClose::Valid {
                code,
                payload: echo,
            } => {
                prop_assert!(payload.len() <= 125);
                prop_assert_eq!(&echo[..], &payload[..]);
                match code {
                    None => prop_assert!(payload.is_empty()),
                    Some(code) => {
                        prop_assert_eq!(code, u16::from_be_bytes([payload[0], payload[1]]));
                        prop_assert!(std::str::from_utf8(&payload[2..]).is_ok());
                    }
                }
            }
            PeerClose::Invalid(with) => {
                prop_assert!(matches!(with.code, 1002 | 1007), "close code {}", with.code);
                message_is_clear("read_close", &with.reason)?;
            }
        }
        Ok(())
    });
}

/// Close reasons as an upstream sends them: Zero's refusal of a version, other reasons, and mutations of both.
fn close_reason() -> impl Strategy<Value = String> + Clone {
    let number = prop_oneof![
        4 => (0u64..10).prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => select(&["", "00", "07", "NaN", "1e+21", "-1", "+4", " 4"][..]).prop_map(String::from),
    ];
    let refusal =
        (number.clone(), number.clone(), number, any::<bool>()).prop_map(|(v, a, b, prefix)| {
            format!(
                "{}Cannot service client at protocol v{v}. Supported protocols: [v{a} ... v{b}]",
                if prefix { "Error: " } else { "" }
            )
        });
    prop_oneof![
        4 => refusal.clone(),
        1 => select(&["", "Error: invalid path: /replication/x/changes", "Error: upstream connection lost"][..])
            .prop_map(String::from),
        1 => any::<String>(),
        2 => mutated(refusal.prop_map(String::into_bytes), b"v.[] 0123456789").prop_map(lossy),
    ]
}

/// Zero's refusal read back: nothing is allocated, and what is read is what Zero would have written.
#[test]
fn version_refusal() {
    fuzz("version_refusal", close_reason(), |reason| {
        let read = bounded("parse_refusal", reason.len(), (0, 0), || {
            protocol::versions::parse_refusal(&reason)
        })?;
        if let Some(refusal) = read {
            prop_assert!(refusal.supported.start() <= refusal.supported.end());
            prop_assert!(!refusal.supported.contains(&refusal.version));
            let written = protocol::unsupported_version(refusal.version, &refusal.supported);
            prop_assert!(
                written == reason || written.strip_prefix("Error: ") == Some(reason.as_str()),
                "{reason:?} read as {refusal:?}"
            );
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------------------------
// The commit inspector

/// Whitespace as JSON allows it between tokens, usually none.
fn ws_choice() -> impl Strategy<Value = &'static str> + Clone {
    prop_oneof![6 => Just(""), 1 => select(&[" ", "\n", "\t", " \r\n  "][..])]
}

/// A JSON string literal: mostly plain, sometimes with escapes and characters that look like structure.
fn json_string() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => "[a-zA-Z0-9_/.:-]{0,16}".prop_map(|s| format!("\"{s}\"")),
        1 => "\\PC{0,8}".prop_map(|s| serde_json::to_string(&s).expect("a string serializes")),
        1 => select(&[r#""]}{[,""#, r#""a\"b""#, r#""\\""#, r#""\u0041\n""#, r#""\/""#][..]).prop_map(String::from),
    ]
}

/// A JSON value of the kinds row data holds, nested a little.
fn json_value() -> impl Strategy<Value = String> + Clone {
    let leaf = prop_oneof![
        json_string(),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter_map("JSON has no NaN or infinity", |f| {
            f.is_finite()
                .then(|| serde_json::to_string(&f).expect("a number serializes"))
        }),
        select(
            &[
                "true",
                "false",
                "null",
                "1e400",
                "-0",
                "12345678901234567890123"
            ][..]
        )
        .prop_map(String::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(|items| format!("[{}]", items.join(","))),
            vec((json_string(), inner), 0..4).prop_map(|fields| {
                let fields: Vec<String> = fields
                    .into_iter()
                    .map(|(k, v)| format!("{k}:{v}"))
                    .collect();
                format!("{{{}}}", fields.join(","))
            }),
        ]
    })
}

/// A change-stream frame as Zero's change-streamer writes it (`{"id":N,"msg":[tag, …]}`, either key order) and
/// the commit it carries, if it is one.
fn change_frame() -> impl Strategy<Value = (String, Option<(u64, String)>)> + Clone {
    let body = (json_value(), json_value());
    let message = prop_oneof![
        3 => (body.clone(), watermark()).prop_map(|((a, _), w)| (
            format!(
                r#"["commit",{{"tag":"commit","flags":0,"commitLsn":"16/B374D9A0","extra":{a}}},{{"watermark":{}}}]"#,
                serde_json::to_string(&w).expect("a string serializes")
            ),
            Some(w),
        )),
        1 => (body.clone(), watermark()).prop_map(|((a, _), w)| (
            format!(
                r#"["begin",{{"tag":"begin","json":"p","x":{a}}},{{"commitWatermark":{}}}]"#,
                serde_json::to_string(&w).expect("a string serializes")
            ),
            None,
        )),
        3 => body.clone().prop_map(|(a, b)| (
            format!(r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"t"}},"new":{a},"old":{b}}}]"#),
            None,
        )),
        1 => select(&[
            r#"["rollback",{"tag":"rollback"}]"#,
            r#"["status",{"tag":"status"}]"#,
            r#"["error",{"type":"error","message":"x"}]"#,
            r#"["commitx",{},{"watermark":"0a"}]"#,
        ][..]).prop_map(|m| (m.to_string(), None)),
    ];
    (
        message,
        any::<u64>(),
        any::<bool>(),
        ws_choice(),
        ws_choice(),
    )
        .prop_map(|((message, watermark), id, id_first, a, b)| {
            let text = if id_first {
                format!("{a}{{{b}\"id\"{a}:{b}{id}{a},{b}\"msg\"{a}:{b}{message}{a}}}{b}")
            } else {
                format!("{a}{{{b}\"msg\"{a}:{b}{message}{a},{b}\"id\"{a}:{b}{id}{a}}}{b}")
            };
            (text, watermark.map(|w| (id, w)))
        })
}

/// What the inspector must say about a frame, if the frame is of Zero's shape.
#[derive(Debug, Clone)]
struct Relayed {
    frame: Text,
    /// `Some`: unmutated, so known to be this commit (`Some(Some(…))`) or another message (`Some(None)`).
    expected: Option<Option<(u64, String)>>,
}

fn relayed() -> impl Strategy<Value = Relayed> + Clone {
    prop_oneof![
        1 => bytes(b"{}[]\",:0123456789 commitwatermarkid\\", 200).prop_map(|frame| Relayed { frame: Text(frame), expected: None }),
        4 => change_frame().prop_map(|(text, commit)| Relayed { frame: Text(text.into_bytes()), expected: Some(commit) }),
        3 => mutated(
            change_frame().prop_map(|(text, _)| text.into_bytes()),
            b"{}[]\",:0123456789 \\",
        ).prop_map(|frame| Relayed { frame: Text(frame), expected: None }),
    ]
}

/// The inspector scans in place and parses only what ack tracking needs: at most the message tag and watermark
/// are copied, plus serde_json's scratch for an escaped string.
#[test]
fn commit_inspector() {
    fuzz(
        "commit_inspector",
        relayed(),
        |Relayed { frame, expected }| {
            let found = bounded("inspect", frame.len(), (512, 4), || {
                inspect::inspect(&frame)
            })?;
            match expected {
                Some(Some((id, watermark))) => {
                    prop_assert_eq!(found, inspect::Downstream::Commit { id, watermark })
                }
                Some(None) => prop_assert_eq!(found, inspect::Downstream::Other),
                None => {
                    // A commit found in valid JSON is the commit the JSON holds.
                    if let (inspect::Downstream::Commit { id, watermark }, Ok(value)) =
                        (&found, serde_json::from_slice::<serde_json::Value>(&frame))
                    {
                        prop_assert_eq!(value["id"].as_u64(), Some(*id));
                        prop_assert_eq!(value["msg"][0].as_str(), Some("commit"));
                        prop_assert_eq!(
                            value["msg"][2]["watermark"].as_str(),
                            Some(watermark.as_str())
                        );
                    }
                }
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Litestream's metrics page

const ZERO_FORK_PAGE: &str = include_str!("../fixtures/litestream/zero-fork.prom");
const UPSTREAM_PAGE: &str = include_str!("../fixtures/litestream/upstream-0.5.17.prom");
const FAMILY: &str = page::PROGRESS_FAMILY;

fn label_value() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        3 => select(&["/var/lib/zero/replica.db", "s3", "file", "", "/d"][..]).prop_map(String::from),
        3 => watermark(),
        1 => select(&[r"a\\b", r#"a\"b"#, r"a\nb", r"bad\t", "}{,=", "a b", "\u{e9}"][..]).prop_map(String::from),
        1 => "[ -~]{0,12}".prop_map(|s| s.replace('\\', r"\\").replace('"', r#"\""#)),
    ]
}

fn sample_line() -> impl Strategy<Value = String> + Clone {
    let name = prop_oneof![
        4 => select(&["db", "name", "watermark"][..]),
        1 => select(&["mode", "_x", "1bad", "", "db "][..]),
    ];
    let labels = vec((name, label_value(), ws_choice()), 0..5).prop_map(|labels| {
        let labels: Vec<String> = labels
            .into_iter()
            .map(|(name, value, s)| format!("{name}{s}={s}\"{value}\""))
            .collect();
        labels
    });
    let value = prop_oneof![
        3 => (1_000_000_000u64..4_000_000_000).prop_map(|s| format!("{s}")),
        2 => select(&[
            "1.7646785643512912e+09", "0", "-0", "NaN", "+Inf", "-Inf", "1e8", "-5", "abc", "", "1e400",
            "0x10", "9999999999999999999999",
        ][..]).prop_map(String::from),
        1 => any::<f64>().prop_map(|f| f.to_string()),
    ];
    let timestamp =
        prop_oneof![4 => Just(""), 1 => select(&[" 1764678564000", " -1", " x", " 1 2"][..])];
    (
        ws_choice(),
        proptest::option::of(labels),
        select(&[" ", "\t", "  "][..]),
        value,
        timestamp,
        any::<bool>(),
    )
        .prop_map(|(lead, labels, gap, value, timestamp, trailing_comma)| {
            let labels = labels.map_or(String::new(), |labels| {
                let comma = if trailing_comma && !labels.is_empty() {
                    ","
                } else {
                    ""
                };
                format!("{{{}{comma}}}", labels.join(","))
            });
            format!("{lead}{FAMILY}{labels}{gap}{value}{timestamp}")
        })
}

fn family_line() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        4 => sample_line(),
        1 => select(&[
            "# HELP litestream_replica_progress The last replicated watermark and time of replication",
            "#HELP\tlitestream_replica_progress",
            "# TYPE litestream_replica_progress gauge",
            "# TYPE litestream_replica_progress GAUGE",
            "# TYPE litestream_replica_progress counter",
            "# TYPE litestream_replica_progress",
            "  # TYPE litestream_replica_progress  gauge ",
            "# TYPE litestream_replica_progress_total counter",
            "litestream_replica_progress",
            "litestream_replica_progressx 1",
            "# EOF",
            "<html>",
            "",
        ][..]).prop_map(String::from),
    ]
}

/// Litestream's pages with family lines put anywhere, lines ending in LF or CRLF, sometimes no final newline.
fn page() -> impl Strategy<Value = Vec<u8>> + Clone {
    let built = (
        select(&[ZERO_FORK_PAGE, UPSTREAM_PAGE, ""][..]),
        prop_oneof![3 => Just(0usize), 1 => 0usize..200],
        vec((any::<Index>(), family_line()), 0..8),
        select(&["\n", "\n", "\r\n"][..]),
        any::<bool>(),
    )
        .prop_map(|(fixture, drop_lines, insert, ending, final_newline)| {
            let mut lines: Vec<String> =
                fixture.lines().skip(drop_lines).map(String::from).collect();
            for (at, line) in insert {
                let at = at.index(lines.len() + 1);
                lines.insert(at, line);
            }
            let mut page = lines.join(ending);
            if final_newline && !page.is_empty() {
                page.push_str(ending);
            }
            page.into_bytes()
        });
    prop_oneof![
        1 => bytes(b"{}\"=,\\ \t\n\r#litestream_replica_progress", 400),
        1 => vec(family_line(), 0..12).prop_map(|lines| lines.join("\n").into_bytes()),
        4 => built.clone(),
        2 => mutated(built, b"{}\"=,\\ \t\n\r#"),
    ]
}

fn filter() -> impl Strategy<Value = Filter> + Clone {
    (
        proptest::option::of(select(&["/var/lib/zero/replica.db", "/d", ""][..])),
        proptest::option::of(select(&["s3", "file"][..])),
    )
        .prop_map(|(db, name)| Filter {
            db: db.map(String::from),
            name: name.map(String::from),
        })
}

/// The fixed part of the page bounds. `prometheus_parse` classifies lines with regular expressions whose lazy DFAs
/// keep the states they discover for all later calls, on every thread: the cache grows as new kinds of lines come,
/// up to the regex crate's own cap, which is no cost of any one page.
const PAGE_FIXED: usize = 256 << 10;

/// Peak heap of [`page::parse_progress`] per input byte. A sample line of the family as short as
/// `litestream_replica_progress{a=""} 1` (35 bytes) holds a label map (a B-tree node of about 540 bytes), its
/// candidate entry and an entry in the duplicate index; a malformed one a warning quoting up to 160 bytes of it.
const PARSE_PER_BYTE: usize = 32;

/// Parse, strip and clamp; the proxy's output is a copy of the page with the family cut out and at most one
/// sample added.
#[test]
fn litestream_page() {
    let purged_at = UNIX_EPOCH + Duration::from_secs(1_764_678_564);
    fuzz(
        "litestream_page",
        (page().prop_map(Text), filter()),
        |(page, filter)| {
            let len = page.len();
            let stripped = bounded("strip_progress_family", len, (64, 1), || {
                filter::strip_progress_family(&page)
            })?;
            prop_assert!(stripped.len() <= len);
            prop_assert!(matches!(
                filter::strip_progress_family(&stripped),
                Cow::Borrowed(_)
            ));
            let hidden = filter::clamp_progress_family(&page, &filter, None, None);
            prop_assert_eq!(&hidden[..], &stripped[..]);
            let clamped = bounded(
                "clamp_progress_family",
                len,
                (PAGE_FIXED, PARSE_PER_BYTE + 4),
                || {
                    filter::clamp_progress_family(
                        &page,
                        &filter,
                        Some(("5bt456o", purged_at)),
                        None,
                    )
                },
            )?;
            let Ok(text) = std::str::from_utf8(&page) else {
                prop_assert_eq!(&clamped[..], &stripped[..]);
                return Ok(());
            };
            let parsed = bounded("parse_progress", len, (PAGE_FIXED, PARSE_PER_BYTE), || {
                page::parse_progress(text, &filter)
            })?;
            let parsed = match parsed {
                Ok(parsed) => parsed,
                Err(err) => {
                    message_is_clear("parse_progress", &err.to_string())?;
                    prop_assert!(matches!(err, page::ScrapeError::Parse(_)));
                    prop_assert_eq!(&clamped[..], &stripped[..]);
                    return Ok(());
                }
            };
            for warning in &parsed.warnings {
                message_is_clear("parse_progress warning", warning)?;
            }
            for progress in &parsed.progress {
                prop_assert!(page::is_lexi_version(&progress.watermark));
                prop_assert!(
                    progress.backed_up_at
                        >= UNIX_EPOCH + Duration::from_secs_f64(page::MIN_PLAUSIBLE_BACKUP_SECS)
                );
                prop_assert!(filter.matches(&progress.db, &progress.name));
            }
            // What the proxy serves shows no progress, or exactly the purged watermark for the replica's own series.
            if let Ok(stripped) = std::str::from_utf8(&stripped) {
                if let Ok(seen) = page::parse_progress(stripped, &filter) {
                    prop_assert!(seen.progress.is_empty(), "{:?}", seen.progress);
                }
            }
            // Without a sample of its own the replica gets none: the family is only removed.
            let Some(real) = parsed.progress.first() else {
                prop_assert_eq!(&clamped[..], &stripped[..]);
                return Ok(());
            };
            let clamped_text = std::str::from_utf8(&clamped).expect("a UTF-8 page stays UTF-8");
            let seen = page::parse_progress(clamped_text, &filter).map_err(|e| {
                TestCaseError::fail(format!("the clamped page does not parse: {e}"))
            })?;
            prop_assert_eq!(seen.progress.len(), 1, "{:?}", seen);
            let shown = &seen.progress[0];
            prop_assert_eq!(shown.watermark.as_str(), "5bt456o");
            prop_assert_eq!(&shown.db, &real.db);
            prop_assert_eq!(&shown.name, &real.name);
            let off = shown
                .backed_up_at
                .duration_since(purged_at)
                .unwrap_or_else(|e| e.duration());
            prop_assert!(off < Duration::from_millis(1));
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------------------------
// sidecar.toml and the environment

const REFERENCE_TOML: &str = include_str!("../../sidecar.toml");

/// Every key of `sidecar.toml`, by section.
const KEYS: &[(&str, &[&str])] = &[
    (
        "server",
        &[
            "listen",
            "ping_interval",
            "peer_timeout",
            "max_message_bytes",
            "shutdown_grace",
            "allow",
            "max_connections",
            "header_read_timeout",
            "max_header_bytes",
            "tls_cert_file",
            "tls_key_file",
        ],
    ),
    (
        "litestream",
        &[
            "backup_url",
            "metrics_url",
            "check_interval",
            "scrape_timeout",
            "max_page_bytes",
            "db",
            "name",
            "proxy_listen",
            "proxy_mode",
        ],
    ),
    (
        "backup",
        &[
            "verify",
            "stale_after",
            "list_timeout",
            "endpoint",
            "region",
            "force_path_style",
            "allow_http",
        ],
    ),
    ("zero", &["app_id", "shard_num"]),
    ("change_db", &["url"]),
    (
        "cleanup",
        &[
            "enabled",
            "initial_delay",
            "reservations",
            "reconnect_grace",
            "without_subscribers",
            "batch_rows",
            "state_file",
        ],
    ),
    ("discovery", &["mode", "advertise_address", "interval"]),
    (
        "upstream",
        &[
            "address",
            "advertised_address",
            "connect_timeout",
            "silence_timeout",
            "tls",
            "tls_ca_file",
            "tls_server_name",
            "protocols",
        ],
    ),
    (
        "relay",
        &[
            "suppress_upstream_cleanup",
            "max_buffered_bytes",
            "max_pending_commits",
            "write_stall_timeout",
        ],
    ),
    ("log", &["format", "filter"]),
];

/// Values of the kinds the keys take, valid and not: durations, sizes, addresses, URLs, modes, filters.
const TEXT_VALUES: &[&str] = &[
    "",
    " ",
    "30s",
    "0s",
    "10ms",
    "1h 30m",
    "250ms",
    "31s",
    "60",
    "5 parsecs",
    "-1s",
    "18446744073709551615s",
    "0.0.0.0:4851",
    "[::1]:4851",
    "10.0.0.0/8",
    "10.1.2.3/8",
    "::1/129",
    "fd00::/8, 127.0.0.1",
    "127.0.0.1:0",
    "localhost:4850",
    "ws://10.0.0.5:4849",
    "wss://rm.internal:4849/",
    "host:99999",
    ":1",
    "[::]:1",
    "s3://bucket/zero/replica",
    "file:///backups/replica",
    "gcs://b/p",
    "s3://",
    "file://relative",
    "http://127.0.0.1:4860/metrics",
    "http://user:pw@127.0.0.1:4860/metrics",
    "https://127.0.0.1/metrics",
    "http://localhost:4850/metrics",
    "https://minio.internal:9000",
    "http://minio:9000",
    "https://x/path",
    "postgres://zero:hunter2@127.0.0.1:5432/zero",
    "host=/tmp password=x",
    "postgres://[::1",
    "hide",
    "clamp",
    "auto",
    "4..6",
    "v1..v3",
    "6..4",
    "0..9",
    "pin",
    "pause",
    "hold",
    "after_grace",
    "verify",
    "adopt",
    "owner",
    "off",
    "text",
    "json",
    "zero",
    "Zero",
    "a-b",
    "info",
    "litestream_sidecar=debug,info",
    "info, \u{e9}\u{e9}=debug",
    "[[[",
    "=x",
    "\u{e9}",
    "\u{0}",
    "a\tb",
    "18446744073709551615",
    "-9223372036854775808",
    "9223372036854775808",
    "true",
    "1e3",
];

fn toml_value() -> impl Strategy<Value = String> + Clone {
    let text = prop_oneof![
        4 => select(TEXT_VALUES).prop_map(String::from),
        1 => "\\PC{0,12}",
    ];
    prop_oneof![
        5 => text.clone().prop_map(|s| toml_string(&s)),
        1 => text.prop_filter_map("a literal string has no quote or newline", |s| {
            (!s.contains(['\'', '\n', '\r'])).then(|| format!("'{s}'"))
        }),
        2 => any::<i64>().prop_map(|n| n.to_string()),
        2 => select(&["0", "1", "2", "1000", "1024", "104857600", "134217728", "4096", "1000000", "1000001", "-1", "4294967296", "0x10", "1_000", "9223372036854775807"][..]).prop_map(String::from),
        1 => select(&["true", "false", "1.5", "nan", "inf", "[]", "[1, 2]", "{}", "{ a = 1 }", "1979-05-27T07:32:00Z", "\"\"\"\nx\"\"\""][..]).prop_map(String::from),
    ]
}

fn toml_string(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_document() -> impl Strategy<Value = String> + Clone {
    let key = (0..KEYS.len(), any::<Index>()).prop_map(|(section, key)| {
        let (section, keys) = KEYS[section];
        (section, *key.get(keys))
    });
    let line = prop_oneof![
        12 => (key, toml_value()).prop_map(|((section, key), value)| (section.to_string(), format!("{key} = {value}"))),
        1 => (0..KEYS.len(), "[a-z_]{1,8}", toml_value()).prop_map(|(section, key, value)| (KEYS[section].0.to_string(), format!("{key} = {value}"))),
        1 => ("[a-z_]{1,8}", toml_value()).prop_map(|(section, value)| (section, format!("x = {value}"))),
    ];
    (vec(line, 0..12), any::<bool>()).prop_map(|(lines, dotted)| {
        let mut doc = String::new();
        let mut current = String::new();
        for (section, line) in lines {
            if dotted {
                doc.push_str(&format!("{section}.{line}\n"));
                continue;
            }
            if section != current {
                doc.push_str(&format!("[{section}]\n"));
                current = section;
            }
            doc.push_str(&line);
            doc.push('\n');
        }
        doc
    })
}

fn env_map() -> impl Strategy<Value = HashMap<String, String>> + Clone {
    let real = (0..KEYS.len(), any::<Index>(), any::<bool>()).prop_map(|(section, key, lower)| {
        let (section, keys) = KEYS[section];
        let name = format!("LITESTREAM_SIDECAR__{}__{}", section, key.get(keys)).to_uppercase();
        if lower {
            name.to_lowercase()
        } else {
            name
        }
    });
    let name = prop_oneof![
        8 => real,
        1 => select(&[
            "LITESTREAM_SIDECAR__NOPE", "LITESTREAM_SIDECAR__SERVER", "LITESTREAM_SIDECAR____",
            "LITESTREAM_SIDECARX", "LITESTREAM_SIDECAR__SERVER__LISTEN__X", "LITESTREAM_SIDECAR_SERVER_LISTEN",
            "PATH", "",
        ][..]).prop_map(String::from),
    ];
    let value = prop_oneof![
        4 => select(TEXT_VALUES).prop_map(String::from),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => "\\PC{0,12}",
    ];
    vec((name, value), 0..5).prop_map(|pairs| pairs.into_iter().collect())
}

fn config_input() -> impl Strategy<Value = (String, HashMap<String, String>)> + Clone {
    let text = prop_oneof![
        1 => bytes(b"[]=\"'.#\n \\", 200).prop_map(lossy),
        4 => toml_document(),
        1 => toml_document().prop_map(|doc| format!("{REFERENCE_TOML}{doc}")),
        2 => mutated(Just(REFERENCE_TOML.as_bytes().to_vec()), b"[]=\"'.#\n \\0123456789").prop_map(lossy),
    ];
    (text, prop_oneof![1 => Just(HashMap::new()), 2 => env_map()])
}

/// Peak heap of loading `sidecar.toml` and its overrides per input byte. The TOML parser and then the config crate
/// each build a tree of the document, the config crate's recording where every value came from: a nested inline
/// table (`{b=`, 3 bytes) costs about 1 KiB across them, the worst shape found (some 330 bytes a byte).
const CONFIG_PER_BYTE: usize = 400;

/// An empty document loads in well under 1 KiB; an error message naming a key and its expected type is a few
/// more.
const CONFIG_FIXED: usize = 16 << 10;

/// Loading, validating, and printing what `--check-config` prints.
#[test]
fn config_file() {
    fuzz("config_file", config_input(), |(text, env)| {
        let len = text.len() + env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        let overrides = env.clone();
        let raw = match bounded(
            "config::from_toml_str",
            len,
            (CONFIG_FIXED, CONFIG_PER_BYTE),
            || config::from_toml_str(&text, Some(overrides)),
        )? {
            Ok(raw) => raw,
            Err(err) => return message_is_clear("config::from_toml_str", &err.to_string()),
        };
        match bounded("RawConfig::validate", len, (CONFIG_FIXED, 8), || {
            raw.validate()
        })? {
            Ok(_) => {
                bounded(
                    "RawConfig::to_redacted_toml",
                    len,
                    (CONFIG_FIXED, 16),
                    || raw.to_redacted_toml(),
                )?;
            }
            Err(ConfigError::Invalid(problems)) => {
                prop_assert!(!problems.is_empty());
                for problem in &problems {
                    message_is_clear(&problem.key, &problem.problem)?;
                }
            }
            Err(other) => prop_assert!(false, "validate failed without naming a key: {other}"),
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------------------------
// host:port, owner addresses and backup URLs

fn address_text() -> impl Strategy<Value = String> + Clone {
    let host = prop_oneof![
        any::<[u8; 4]>().prop_map(|ip| std::net::Ipv4Addr::from(ip).to_string()),
        any::<[u16; 8]>().prop_map(|ip| format!("[{}]", std::net::Ipv6Addr::from(ip))),
        any::<[u16; 8]>().prop_map(|ip| std::net::Ipv6Addr::from(ip).to_string()),
        vec("[a-zA-Z0-9-]{0,66}", 1..4).prop_map(|labels| labels.join(".")),
        select(
            &[
                "localhost",
                "",
                "0.0.0.0",
                "[::]",
                "-a.b",
                "a-.b",
                "a..b",
                "[::1",
                "\u{e9}.com",
                "%31.0.0.1"
            ][..]
        )
        .prop_map(String::from),
    ];
    let port = prop_oneof![
        any::<u16>().prop_map(|p| p.to_string()),
        select(&["0", "65536", "", "abc", "+1", "-1", "04849", "99999999999"][..])
            .prop_map(String::from),
    ];
    (
        select(&["", "", "ws://", "wss://", "http://", "WS://"][..]),
        host,
        select(&[":", ":", "::", ""][..]),
        port,
        select(&["", "", "/", "//", "/x", " "][..]),
        select(&["", "", " ", "\t", "\n"][..]),
    )
        .prop_map(|(scheme, host, colon, port, suffix, pad)| {
            format!("{pad}{scheme}{host}{colon}{port}{suffix}{pad}")
        })
}

/// Address checks copy at most the address into a message a few times over.
#[test]
fn host_port() {
    const BOUND: (usize, usize) = (1024, 8);
    let input = prop_oneof![
        1 => bytes(b"[]:./0123456789abcdefws", 80).prop_map(lossy),
        4 => address_text(),
        1 => mutated(address_text().prop_map(String::into_bytes), b"[]:./-0123456789").prop_map(lossy),
    ];
    fuzz("host_port", (input, address_text()), |(text, other)| {
        let len = text.len();
        match bounded("parse_host_port", len, BOUND, || {
            address::parse_host_port(&text)
        })? {
            Ok((host, _)) => prop_assert!(!host.is_empty()),
            Err(message) => message_is_clear("parse_host_port", &message)?,
        }
        match bounded("validate_host_port", len, BOUND, || {
            address::validate_host_port(&text)
        })? {
            Ok(valid) => {
                prop_assert_eq!(valid.as_str(), text.trim());
                prop_assert!(address::parse_host_port(&valid).is_ok_and(|(_, port)| port != 0));
            }
            Err(message) => message_is_clear("validate_host_port", &message)?,
        }
        match bounded("validate_owner_address", len, BOUND, || {
            address::validate_owner_address(&text)
        })? {
            Ok(valid) => {
                prop_assert_eq!(valid.as_str(), text.trim());
                prop_assert!(address::validate_host_port(address::host_port(&valid)).is_ok());
            }
            Err(message) => message_is_clear("validate_owner_address", &message)?,
        }
        let same = bounded("same_address", len + other.len(), (0, 0), || {
            address::same_address(&text, &other)
        })?;
        prop_assert_eq!(same, address::same_address(&other, &text));
        prop_assert!(address::same_address(&text, &text));
        Ok(())
    });
}

fn backup_url() -> impl Strategy<Value = String> + Clone {
    (
        select(
            &[
                "s3://", "file://", "file:///", "gcs://", "S3://", "", "s3:", "abs://",
            ][..],
        ),
        "[a-zA-Z0-9%/._ -]{0,24}",
        select(&["", "", "/", "?x=1", "#f", "%", "%zz", "%2F"][..]),
    )
        .prop_map(|(scheme, rest, tail)| format!("{scheme}{rest}{tail}"))
}

/// A URL is parsed once and its path decoded: a few copies, percent-encoding at most tripling one.
#[test]
fn backup_location() {
    let input = prop_oneof![
        1 => bytes(b":/%?#.s3file", 80).prop_map(lossy),
        4 => backup_url(),
        1 => mutated(backup_url().prop_map(String::into_bytes), b":/%?#").prop_map(lossy),
    ];
    fuzz("backup_location", input, |text| {
        match bounded("Location::parse", text.len(), (1024, 12), || {
            backup::Location::parse(&text)
        })? {
            Ok(backup::Location::S3 { bucket, .. }) => prop_assert!(!bucket.is_empty()),
            Ok(backup::Location::Local(path)) => prop_assert!(path.is_absolute()),
            Err(message) => message_is_clear("Location::parse", &message)?,
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------------------------
// The state file

fn state_text() -> impl Strategy<Value = Vec<u8>> + Clone {
    let number = prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        select(
            &[
                "1",
                "2",
                "0",
                "-1",
                "1.5",
                "18446744073709551616",
                "null",
                "\"1\""
            ][..]
        )
        .prop_map(String::from),
    ];
    let last_purge = prop_oneof![
        Just("null".to_string()),
        (watermark(), number.clone()).prop_map(|(w, at)| format!(
            r#"{{"watermark":{},"backed_up_at_ms":{at}}}"#,
            serde_json::to_string(&w).expect("a string serializes")
        )),
    ];
    let file = (
        prop_oneof![3 => Just("1".to_string()), 1 => number.clone()],
        number,
        proptest::option::of(last_purge),
        select(&["", "", r#","extra":1"#][..]),
    )
        .prop_map(|(version, delay, last_purge, extra)| {
            let last_purge = last_purge.map_or(String::new(), |p| format!(r#","last_purge":{p}"#));
            format!(r#"{{"version":{version},"cleanup_delay_ms":{delay}{last_purge}{extra}}}"#)
                .into_bytes()
        });
    prop_oneof![
        1 => bytes(b"{}[]\",:0123456789 ", 100),
        4 => file.clone(),
        2 => mutated(file, b"{}[]\",:0123456789 "),
    ]
}

/// A state file is small JSON read whole: a watermark copy, serde_json's scratch, and an error message.
#[test]
fn state_file() {
    fuzz("state_file", state_text().prop_map(Text), |text| {
        match bounded("state::decode", text.len(), (1024, 4), || {
            state::decode(&text)
        })? {
            Ok(saved) => {
                if let Some(purge) = &saved.last_purge {
                    prop_assert!(!purge.watermark.is_empty());
                }
            }
            Err(reason) => message_is_clear("state::decode", &reason)?,
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------------------------
// The `/status` answer the `status` command reads

fn report() -> impl Strategy<Value = status::Report> + Clone {
    let text = prop_oneof![
        6 => "[a-z0-9 -]{0,12}",
        1 => "\\PC{0,20}",
        1 => (0usize..500).prop_map(|n| "w".repeat(n)),
    ];
    let seconds = prop_oneof![
        any::<f64>().prop_filter("JSON has no NaN or infinity", |f| f.is_finite()),
        select(&[0.0, -1.0, 59.5, 3600.0, 1e20, f64::MAX][..]),
    ];
    let subscriber = (
        text.clone(),
        proptest::option::of(text.clone()),
        seconds.clone(),
        any::<bool>(),
    )
        .prop_map(
            |(id, task_id, lag_seconds, caught_up)| status::SubscriberEntry {
                id,
                task_id,
                lag_seconds,
                caught_up,
                ..Default::default()
            },
        );
    let reservation = (
        text.clone(),
        seconds.clone(),
        proptest::option::of(text.clone()),
    )
        .prop_map(|(task_id, age_seconds, floor)| status::ReservationEntry {
            task_id,
            age_seconds,
            floor,
            ..Default::default()
        });
    let backup = (text.clone(), proptest::option::of(seconds.clone())).prop_map(
        |(watermark, age_seconds)| status::BackupEntry {
            watermark,
            age_seconds,
            ..Default::default()
        },
    );
    (
        text,
        seconds,
        vec(backup, 0..8),
        vec(reservation, 0..8),
        vec(subscriber, 0..16),
    )
        .prop_map(
            |(version, uptime_seconds, backups, reservations, subscribers)| status::Report {
                version,
                uptime_seconds,
                backups,
                reservations,
                subscribers,
                ..Default::default()
            },
        )
}

/// Peak heap of reading a `/status` answer per input byte: `{}` and its comma (3 bytes) become a subscriber entry of
/// 224 bytes, and the list of them holds its old and its new buffer (3 times the entries) while it grows.
const READ_PER_BYTE: usize = 256;

/// Peak heap of rendering a report per input byte of its answer: each entry becomes a row of six cells (about 160
/// bytes while the table is built, 3 bytes of answer at least) and a line of the table, whose columns are padded to
/// at most 64 characters, in a text that doubles as it grows.
const RENDER_PER_BYTE: usize = 128;

/// Pieces of a subscriber list: many small entries, some with long ids.
const ENTRIES: &[&[u8]] = &[b",{}", b",{}", b",{}", br#",{"id":"xxxxxxxxxxxxxxxx"}"#];

#[test]
fn status_answer() {
    let answer = report().prop_map(|r| serde_json::to_vec(&r).expect("a report serializes"));
    let input = prop_oneof![
        1 => bytes(b"{}[]\",:0123456789 ", 200),
        // One long id among many entries: a table whose columns followed it would grow with the square of this.
        1 => (0usize..2000, vec(select(ENTRIES), 0..600)).prop_map(|(long, parts)| {
            let mut answer = format!(r#"{{"subscribers":[{{"id":"{}"}}"#, "w".repeat(long)).into_bytes();
            answer.extend(parts.concat());
            answer.extend_from_slice(b"]}");
            answer
        }),
        4 => answer.clone(),
        2 => mutated(answer, b"{}[]\",:0123456789 "),
    ];
    fuzz("status_answer", input.prop_map(Text), |body| {
        match bounded(
            "status_cli::read_report",
            body.len(),
            (4096, READ_PER_BYTE),
            || status_cli::read_report(&body),
        )? {
            Ok((_, report)) => {
                let shown = bounded(
                    "status_cli::render",
                    body.len(),
                    (16 << 10, RENDER_PER_BYTE),
                    || status_cli::render(&report),
                )?;
                prop_assert!(!shown.is_empty());
            }
            Err(err) => message_is_clear("status_cli::read_report", &err.to_string())?,
        }
        Ok(())
    });
}
