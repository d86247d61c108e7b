//! A relayed subscriber beside a direct one on the same upstream: how much later its acks reach the upstream.
//!
//! Zero 1.10 drops a subscriber that keeps missing its flow-control deadline, which is proportional to how long the
//! majority took to ack; a relay that holds acks back would make its subscribers the ones dropped (docs/protocol.md,
//! "Relayed subscribers dropped as too far behind"). Here a stand-in change-streamer (threads of this process,
//! blocking sockets) sends numbered messages, `{"id":N,"msg":…}`, in transactions (begin, rows, commit) that come in
//! bursts with short idle gaps, to two subscribers: one connected directly, one through the relay under test. Like
//! Zero's change-streamer it pipelines messages and, each time the bytes sent since its last wait reach the stream's
//! high-water mark, waits for both subscribers to ack the message it has just sent before sending more. The
//! subscribers ack like Zero's client: one `{"ack":N}` frame per message, written once the message is processed,
//! each taking the same processing time for the same message.
//!
//! Every arrival is the kernel's receive timestamp (`SO_TIMESTAMPNS`), not the time a thread of this bench got to
//! read it: on a shared 2-core machine a bench thread can wait milliseconds for a CPU, and that is not the relay's
//! doing. A subscriber's processing starts when its message arrived or when the previous one's was due to end,
//! whichever is later, and ends at a fixed time after that, so that both subscribers ack at the same moment unless
//! their messages arrived at different ones. What is left between the two is what the relay adds (its own wake-ups
//! and scheduling included), plus the times a subscriber thread woke later than its ack was due. The control, two
//! direct subscribers, shows how much of that is this machine.
//!
//! The stand-ins are Zero's replication-manager and view-syncers, which do not share the relay's CPU: on a machine
//! with two CPUs or more the relays run on the last one and this process on the others (`BENCH_LAGGARD_PIN=0`
//! lets them all share), and the threads that wait for a socket or a timer (the ack readers and the subscribers) run
//! at real-time priority when allowed, so that a burst of the stand-in change-streamer's writes does not delay their
//! wake-ups. Without that, on two shared cores, the stand-ins' own scheduling set the p99 of every relay, a plain one
//! included (1.0 to 1.7 ms), and hid what the relay itself adds.
//!
//! Printed, per configuration: the relayed ack's arrival minus the direct one's, per message id, p50 / p99 / max,
//! over every ack and over the acks the upstream waited for, and the same for the time on the way (from the
//! upstream's write of the message to the ack's arrival, less the subscriber's time from the message's arrival to
//! its ack). The target is p99 ≤ 1 ms over every ack's arrival. Once with the sidecar's defaults (acks gathered in
//! the kernel, `relay.ack_wakeup_bytes`), once woken for every ack (`ack_wakeup_bytes = 0`), once through a plain
//! TCP byte relay (one more process on the path, nothing held), and once with no relay, interleaved, with each
//! relay's CPU per message.
//!
//! The receive timestamps come with `recvmsg` control messages, and CPUs and priorities are set with `libc` calls,
//! which no safe crate of ours makes: hence the `unsafe` here, in the bench only.
#![allow(unsafe_code)]

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_tungstenite::tungstenite;

use crate::relay::{fake_upstream, PlainRelay};
use crate::util::{cpu_time_of, Daemon, Report};

/// Messages per run, the status included.
const MESSAGES: usize = 12_000;
/// Runs per configuration, interleaved.
const RUNS: usize = 3;
/// Bytes sent between two flow-control waits: the writable high-water mark Zero's change-streamer reads
/// (`getDefaultHighWaterMark`), 64 KiB on Node 22, which Zero 1.9 and later require.
const FLUSH_BYTES: usize = 64 << 10;
/// The target: relayed acks at most this much later than direct ones, at p99.
const TARGET: Duration = Duration::from_millis(1);

/// A time on the realtime clock, in nanoseconds: the clock of the kernel's receive timestamps.
type Nanos = i64;

/// One message of the stream: its frame, what processing it costs a subscriber, and the idle gap after it.
struct Planned {
    frame: Vec<u8>,
    cost: Duration,
    gap: Duration,
}

/// A configuration under test: its name, where the second subscriber connects, the process whose CPU is its
/// relay's, and its figures.
struct Setup {
    name: &'static str,
    addr: SocketAddr,
    pid: Option<u32>,
    figures: Figures,
}

pub async fn run(report: &mut Report) {
    println!("relayed beside direct (laggard)");
    let plan = Arc::new(plan(MESSAGES));
    let busy: Duration = plan.iter().map(|m| m.cost).sum();
    let idle: Duration = plan.iter().map(|m| m.gap).sum();
    println!(
        "  {MESSAGES} messages (begin, 1-12 rows, commit; bursts of 1-20 transactions), {:.0} us processing per \
         message on average, {:.1} s idle between bursts; flow-control wait every {} KiB; {RUNS} runs each",
        busy.as_secs_f64() * 1e6 / MESSAGES as f64,
        idle.as_secs_f64(),
        FLUSH_BYTES >> 10
    );
    let (upstream_addr, mut upstream) = fake_upstream().await;
    let config = format!(
        "[server]\nlisten = \"{{addr}}\"\n[litestream]\nbackup_url = \"s3://bench/replica\"\n\
         proxy_listen = \"127.0.0.1:0\"\n[discovery]\nmode = \"off\"\n[upstream]\naddress = \"{upstream_addr}\"\n"
    );
    let defaults = Daemon::start(&config);
    let every_ack = Daemon::start(&format!("{config}[relay]\nack_wakeup_bytes = 0\n"));
    // Any relay is one more process on the path, to be scheduled on a shared machine: the plain byte relay shows
    // what that alone costs.
    let plain = PlainRelay::start(upstream_addr);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpus = Cpus::of_this_machine();
    if cpus.pin {
        let stand_ins = match cpus.count {
            2 => "0".to_string(),
            n => format!("0-{}", n - 2),
        };
        println!(
            "  relays on CPU {}, the stand-ins on CPU {stand_ins}",
            cpus.count - 1
        );
    }
    cpus.pin_stand_ins();
    for pid in [defaults.child.id(), every_ack.child.id(), plain.child.id()] {
        cpus.pin_relay(pid);
    }
    let setup = |name, addr: &str, pid| Setup {
        name,
        addr: addr.parse().unwrap(),
        pid,
        figures: Figures::default(),
    };
    let mut setups = [
        setup(
            "sidecar defaults",
            &defaults.addr,
            Some(defaults.child.id()),
        ),
        setup(
            "sidecar woken for every ack",
            &every_ack.addr,
            Some(every_ack.child.id()),
        ),
        setup(
            "plain TCP relay",
            &plain.addr.to_string(),
            Some(plain.child.id()),
        ),
        setup("no relay (both direct)", &upstream_addr.to_string(), None),
    ];
    for run in 0..RUNS {
        for setup in setups.iter_mut() {
            let before = setup.pid.map(cpu_time_of);
            let outcome = one_run(upstream_addr, setup.addr, &mut upstream, &plan, run).await;
            if let (Some(pid), Some(before)) = (setup.pid, before) {
                setup.figures.cpu += cpu_time_of(pid) - before;
            }
            setup.figures.add(&outcome);
        }
    }
    println!(
        "  relayed - direct, per message id ({} ids, {} of them awaited by the upstream):",
        setups[0].figures.arrival.len(),
        setups[0].figures.awaited.len()
    );
    for Setup {
        name, pid, figures, ..
    } in setups.iter_mut()
    {
        figures.sort();
        let late = figures
            .arrival
            .iter()
            .filter(|d| **d > nanos(TARGET))
            .count();
        report.add(
            format!("ack arrival, p50 / p99 / max: {name}"),
            spread(&figures.arrival),
            "",
            None,
        );
        report.add(
            format!("  the acks the upstream waited for: {name}"),
            spread(&figures.awaited),
            "",
            None,
        );
        report.add(
            format!("  time on the way: {name}"),
            spread(&figures.on_the_way),
            "",
            None,
        );
        report.add(
            format!("  acks over 1 ms later: {name}"),
            format!("{late} of {}", figures.arrival.len()),
            "",
            None,
        );
        if pid.is_some() {
            report.add(
                format!("  relay CPU per message: {name}"),
                format!(
                    "{:.2} us",
                    figures.cpu.as_secs_f64() * 1e6 / (MESSAGES * RUNS) as f64
                ),
                "",
                None,
            );
        }
    }
    let p99 = percentile(&setups[0].figures.arrival, 0.99);
    let pass = p99 <= nanos(TARGET);
    report.add(
        "relayed ack p99 behind the direct one, sidecar defaults",
        format!("{} {}", signed_ms(p99), if pass { "PASS" } else { "FAIL" }),
        "<= 1 ms",
        Some(pass),
    );
    for (i, what) in [
        (1, "the sidecar woken for every ack"),
        (2, "a plain TCP relay"),
        (3, "no relay (this machine)"),
    ] {
        report.add(
            format!("  the same with {what}, for reference"),
            signed_ms(percentile(&setups[i].figures.arrival, 0.99)),
            "",
            None,
        );
    }
    let plain_p99 = percentile(&setups[2].figures.arrival, 0.99);
    report.add(
        "relayed ack p99 behind the direct one, sidecar / plain TCP relay",
        format!("{:.2}", p99 as f64 / plain_p99.max(1) as f64),
        "",
        None,
    );
    let cpu = |i: usize| setups[i].figures.cpu.as_secs_f64();
    report.add(
        "sidecar CPU per message, wake-up on / off",
        format!("{:.2}", cpu(0) / cpu(1)),
        "",
        None,
    );
}

/// Per-id differences (nanoseconds, relayed minus direct) and CPU over a configuration's runs.
#[derive(Default)]
struct Figures {
    /// When the ack reached the upstream.
    arrival: Vec<i64>,
    /// The same, for the acks the upstream waited for.
    awaited: Vec<i64>,
    /// From the upstream's write of a message to its ack's arrival, less the subscriber's time from the message's
    /// arrival to its ack: what the path adds, without the subscribers' late wake-ups.
    on_the_way: Vec<i64>,
    cpu: Duration,
}

impl Figures {
    fn add(&mut self, outcome: &Outcome) {
        let [direct, relayed] = &outcome.sides;
        let ids = 1..=outcome.count;
        self.arrival
            .extend(ids.clone().map(|id| relayed.acked[id] - direct.acked[id]));
        self.awaited.extend(
            outcome
                .awaited
                .iter()
                .map(|&id| relayed.acked[id] - direct.acked[id]),
        );
        self.on_the_way
            .extend(ids.map(|id| relayed.on_the_way(id) - direct.on_the_way(id)));
    }

    fn sort(&mut self) {
        self.arrival.sort_unstable();
        self.awaited.sort_unstable();
        self.on_the_way.sort_unstable();
    }
}

/// One run: per subscriber (0: direct, 1: the other), the times of each message id, and the ids the upstream
/// waited for.
struct Outcome {
    count: usize,
    sides: [Side; 2],
    awaited: Vec<usize>,
}

/// One subscriber's times by message id (index 0 unused).
#[derive(Default)]
struct Side {
    /// The upstream's write of the message.
    written: Vec<Nanos>,
    /// The message's arrival at the subscriber.
    arrived: Vec<Nanos>,
    /// The subscriber's write of the ack.
    sent: Vec<Nanos>,
    /// The ack's arrival at the upstream.
    acked: Vec<Nanos>,
}

impl Side {
    fn on_the_way(&self, id: usize) -> i64 {
        (self.acked[id] - self.written[id]) - (self.sent[id] - self.arrived[id])
    }
}

async fn one_run(
    upstream_addr: SocketAddr,
    relay: SocketAddr,
    upstream: &mut tokio::sync::mpsc::UnboundedReceiver<tokio::net::TcpStream>,
    plan: &Arc<Vec<Planned>>,
    run: usize,
) -> Outcome {
    // One subscriber at a time, so that the first upstream connection is the direct one's.
    let mut subscribers = Vec::new();
    let mut conns = Vec::new();
    for (i, addr) in [upstream_addr, relay].into_iter().enumerate() {
        let plan = plan.clone();
        let id = format!("laggard-{run}-{i}");
        let (connected_tx, connected) = tokio::sync::oneshot::channel();
        subscribers.push(std::thread::spawn(move || {
            subscriber(addr, &id, &plan, connected_tx)
        }));
        let conn = upstream.recv().await.expect("upstream connection");
        connected.await.expect("subscribed");
        let conn = conn.into_std().unwrap();
        conn.set_nonblocking(false).unwrap();
        conns.push(conn);
    }
    let plan = plan.clone();
    tokio::task::spawn_blocking(move || {
        let mut outcome = change_streamer(conns, &plan);
        for (side, subscriber) in outcome.sides.iter_mut().zip(subscribers) {
            let (arrived, sent) = subscriber.join().expect("subscriber");
            side.arrived = arrived;
            side.sent = sent;
        }
        outcome
    })
    .await
    .unwrap()
}

/// The newest ack each subscriber sent, and a wake-up for the sender.
type Acked = Arc<(Mutex<[usize; 2]>, Condvar)>;

/// The stand-in change-streamer on both connections (0: direct, 1: the other): sends the plan, waiting for both
/// acks of every message that brings the bytes sent since the last wait to [`FLUSH_BYTES`], and of the last.
fn change_streamer(conns: Vec<TcpStream>, plan: &[Planned]) -> Outcome {
    let acked: Acked = Arc::new((Mutex::new([0; 2]), Condvar::new()));
    let readers: Vec<_> = conns
        .iter()
        .enumerate()
        .map(|(side, conn)| {
            let conn = conn.try_clone().unwrap();
            enable_timestamps(&conn);
            let acked = acked.clone();
            let count = plan.len();
            std::thread::spawn(move || read_acks(conn, side, count, &acked))
        })
        .collect();
    let mut writers: Vec<TcpStream> = conns;
    let mut written = [vec![0; plan.len() + 1], vec![0; plan.len() + 1]];
    let mut awaited = Vec::new();
    let mut unflushed = 0;
    for (index, message) in plan.iter().enumerate() {
        let id = index + 1;
        // Alternating which subscriber is written first, so that neither is always second.
        let order = if id % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            writers[side].write_all(&message.frame).unwrap();
            written[side][id] = now();
        }
        unflushed += message.frame.len();
        if unflushed >= FLUSH_BYTES || id == plan.len() {
            unflushed = 0;
            awaited.push(id);
            let (lock, wake) = &*acked;
            let mut newest = lock.lock().unwrap();
            while newest.iter().any(|&n| n < id) {
                newest = wake.wait(newest).unwrap();
            }
        }
        if !message.gap.is_zero() {
            std::thread::sleep(message.gap);
        }
    }
    for writer in &mut writers {
        // A close frame: the subscribers stop reading, the relay passes it on.
        let _ = writer.write_all(&[0x88, 0x02, 0x03, 0xe8]);
    }
    let mut sides = readers
        .into_iter()
        .zip(written)
        .map(|(reader, written)| Side {
            written,
            acked: reader.join().expect("ack reader"),
            ..Side::default()
        });
    Outcome {
        count: plan.len(),
        sides: [sides.next().unwrap(), sides.next().unwrap()],
        awaited,
    }
}

/// Reads one connection's acks (masked text frames, `{"ack":N}`) until all `count` have come, each with the time
/// the kernel received it.
fn read_acks(conn: TcpStream, side: usize, count: usize, acked: &Acked) -> Vec<Nanos> {
    real_time();
    let mut times = vec![0; count + 1];
    let mut reader = Stamped::new(conn);
    for (id, time) in times.iter_mut().enumerate().skip(1) {
        let (opcode, payload, at) = reader.frame();
        assert_eq!(opcode, 0x1, "an ack");
        let text = std::str::from_utf8(&payload).expect("utf-8");
        let n: usize = text
            .strip_prefix(r#"{"ack":"#)
            .and_then(|rest| rest.strip_suffix('}'))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("not an ack: {text}"));
        assert_eq!(n, id, "acks come in order");
        *time = at;
        let (lock, wake) = &**acked;
        lock.lock().unwrap()[side] = id;
        wake.notify_all();
    }
    times
}

/// A blocking socket read frame by frame, each frame with the kernel's receive time of its last byte.
struct Stamped {
    conn: TcpStream,
}

impl Stamped {
    fn new(conn: TcpStream) -> Stamped {
        enable_timestamps(&conn);
        Stamped { conn }
    }

    /// The next frame, masked or not: its opcode, its payload and when it arrived.
    fn frame(&mut self) -> (u8, Vec<u8>, Nanos) {
        let mut head = [0u8; 2];
        self.exact(&mut head);
        let masked = head[1] & 0x80 != 0;
        let len = match head[1] & 0x7f {
            126 => {
                let mut ext = [0u8; 2];
                self.exact(&mut ext);
                u16::from_be_bytes(ext) as usize
            }
            127 => {
                let mut ext = [0u8; 8];
                self.exact(&mut ext);
                u64::from_be_bytes(ext) as usize
            }
            n => n as usize,
        };
        let mut key = [0u8; 4];
        if masked {
            self.exact(&mut key);
        }
        let mut payload = vec![0u8; len];
        let mut at = self.exact(&mut payload);
        if len == 0 {
            at = now();
        }
        if masked {
            payload
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b ^= key[i % 4]);
        }
        (head[0] & 0x0f, payload, at)
    }

    /// Fills `buf`, returning the receive time of the last segment read (0 when `buf` is empty).
    fn exact(&mut self, buf: &mut [u8]) -> Nanos {
        let mut filled = 0;
        let mut at = 0;
        while filled < buf.len() {
            let (n, stamp) = recv_stamped(&self.conn, &mut buf[filled..]);
            assert!(n > 0, "the connection closed mid-run");
            filled += n;
            at = stamp.unwrap_or_else(now);
        }
        at
    }
}

fn enable_timestamps(conn: &TcpStream) {
    let on: libc::c_int = 1;
    // SAFETY: a valid socket and an int option of the right size.
    let rc = unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_TIMESTAMPNS,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_TIMESTAMPNS: {}", std::io::Error::last_os_error());
}

/// One `recvmsg`: the bytes read, and the kernel's receive time of the last segment they came from.
fn recv_stamped(conn: &TcpStream, buf: &mut [u8]) -> (usize, Option<Nanos>) {
    let mut control = [0u64; 16];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: zeroed msghdr is valid; every pointer set below outlives the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: as above.
    let n = unsafe { libc::recvmsg(conn.as_raw_fd(), &mut msg, 0) };
    assert!(n >= 0, "recvmsg: {}", std::io::Error::last_os_error());
    let mut stamp = None;
    // SAFETY: walking the control buffer the kernel filled, with the libc macros.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
            {
                let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast());
                stamp = Some(ts.tv_sec * 1_000_000_000 + ts.tv_nsec);
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    (n as usize, stamp)
}

fn now() -> Nanos {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    nanos(since)
}

/// A subscriber on its own thread: reads each message, processes it for its planned time, acks it in a frame of
/// its own, as Zero's client does once it moves on to the next message (docs/protocol.md, "Frames and acks").
/// Returns when each message arrived and when each ack was written.
fn subscriber(
    addr: SocketAddr,
    id: &str,
    plan: &[Planned],
    connected: tokio::sync::oneshot::Sender<()>,
) -> (Vec<Nanos>, Vec<Nanos>) {
    // Sleeps as short as asked: the default timer slack of 50 us would be most of a row's processing time.
    // SAFETY: prctl with an integer argument.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    real_time();
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let url = format!(
        "ws://{addr}/replication/v3/changes?taskID=&id={id}&mode=serving&watermark=0a&replicaVersion=01&initial=false"
    );
    // The handshake only: nothing is sent before both subscribers are connected, so nothing is left buffered in
    // the client, and the frames are read here with their arrival times.
    let (ws, _) = tungstenite::client(url, stream).expect("subscribe");
    let mut conn = ws.get_ref().try_clone().unwrap();
    let mut reader = Stamped::new(ws.get_ref().try_clone().unwrap());
    let _ = connected.send(());
    let mut arrived = vec![0; plan.len() + 1];
    let mut sent = vec![0; plan.len() + 1];
    // When the previous message's processing was due to end.
    let mut finished = 0;
    let mut seen = 0;
    while seen < plan.len() {
        let (opcode, payload, at) = reader.frame();
        match opcode {
            0x1 => {
                let text = std::str::from_utf8(&payload).expect("utf-8");
                let id: usize = text
                    .strip_prefix(r#"{"id":"#)
                    .and_then(|rest| rest.split_once(','))
                    .and_then(|(n, _)| n.parse().ok())
                    .expect("a numbered message");
                assert_eq!(id, seen + 1, "messages come in order");
                seen = id;
                arrived[id] = at;
                // Processing starts when the message arrived (not when this thread got to read it) or when the
                // previous one's was due to end, and ends a fixed time later.
                finished = finished.max(at) + nanos(plan[id - 1].cost);
                let wait = finished - now();
                if wait > 0 {
                    std::thread::sleep(Duration::from_nanos(wait as u64));
                }
                conn.write_all(&client_frame(0x1, format!(r#"{{"ack":{id}}}"#).as_bytes()))
                    .expect("ack");
                sent[id] = now();
            }
            // The relay's keepalive.
            0x9 => conn.write_all(&client_frame(0xa, &payload)).expect("pong"),
            0xa => {}
            other => panic!("unexpected opcode {other}"),
        }
    }
    // The upstream's close follows; answering it ends the connection.
    let _ = conn.write_all(&client_frame(0x8, &[0x03, 0xe8]));
    (arrived, sent)
}

/// A masked client frame (RFC 6455, section 5.3), short payloads only.
fn client_frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
    assert!(payload.len() < 126);
    let key = [0x5a, 0x11, 0xc3, 0x7e];
    let mut frame = vec![0x80 | opcode, 0x80 | payload.len() as u8];
    frame.extend_from_slice(&key);
    frame.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    frame
}

/// The stream: the status, then transactions of a begin, 1-12 rows and a commit, in bursts of 1-20 transactions
/// with an idle gap of 1-4 ms after each burst. Processing: 5 us per begin, 20-100 us per row, 100-400 us per
/// commit, and one message in 500 takes 1-3 ms more.
fn plan(count: usize) -> Vec<Planned> {
    let mut rng = 0x5eed_u64;
    let mut next = move |n: u64| splitmix(&mut rng) % n;
    let us = Duration::from_micros;
    let mut out = vec![Planned {
        frame: encode(1, r#"["status",{"tag":"status"}]"#),
        cost: Duration::ZERO,
        gap: Duration::ZERO,
    }];
    let mut tx = 0u64;
    'bursts: loop {
        let transactions = 1 + next(20);
        for _ in 0..transactions {
            tx += 1;
            let watermark = format!("7{tx:010}");
            let rows = 1 + next(12);
            let mut messages = vec![(
                format!(
                    r#"["begin",{{"tag":"begin","commitLsn":"16/B374D9A0","commitTime":1746600001234567,"xid":{tx},"json":"s"}},{{"commitWatermark":"{watermark}"}}]"#
                ),
                us(20),
            )];
            for row in 0..rows {
                messages.push((
                    format!(
                        r#"["data",{{"tag":"insert","relation":{{"schema":"public","name":"issue","keyColumns":["id"],"replicaIdentity":"default"}},"new":{{"id":"i{tx}-{row}","big":9007199254740993,"title":"{}"}}}}]"#,
                        "x".repeat(60 + next(200) as usize)
                    ),
                    us(100 + next(300)),
                ));
            }
            messages.push((
                format!(
                    r#"["commit",{{"tag":"commit","flags":0,"commitLsn":"16/B374D9A0","commitEndLsn":"16/B374D9D0","commitTime":1746600001234567}},{{"watermark":"{watermark}"}}]"#
                ),
                us(300 + next(700)),
            ));
            for (msg, mut cost) in messages {
                if next(500) == 0 {
                    cost += us(1_000 + next(2_000));
                }
                let id = out.len() + 1;
                out.push(Planned {
                    frame: encode(id, &msg),
                    cost,
                    gap: Duration::ZERO,
                });
                if out.len() == count {
                    break 'bursts;
                }
            }
        }
        out.last_mut().unwrap().gap = us(1_000 + next(3_000));
    }
    out
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Message `id` as Zero 1.6 and later frame it (`{"id":N,"msg":…}`), in an unmasked text frame.
fn encode(id: usize, msg: &str) -> Vec<u8> {
    let text = format!(r#"{{"id":{id},"msg":{msg}}}"#);
    let mut frame = vec![0x81];
    match text.len() {
        n @ 0..=125 => frame.push(n as u8),
        n @ 126..=0xffff => {
            frame.push(126);
            frame.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            frame.push(127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(text.as_bytes());
    frame
}

fn nanos(d: Duration) -> i64 {
    d.as_nanos().try_into().unwrap_or(i64::MAX)
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn signed_ms(ns: i64) -> String {
    format!("{:.3} ms", ns as f64 / 1e6)
}

fn spread(sorted: &[i64]) -> String {
    format!(
        "{} / {} / {}",
        signed_ms(percentile(sorted, 0.5)),
        signed_ms(percentile(sorted, 0.99)),
        signed_ms(sorted.last().copied().unwrap_or(0))
    )
}

/// Which CPUs the relays run on and which the bench's own threads do: the last CPU for the relays, the others for
/// the stand-ins, when there are at least two and `BENCH_LAGGARD_PIN` is not `0`.
#[derive(Clone, Copy)]
struct Cpus {
    count: usize,
    pin: bool,
}

impl Cpus {
    fn of_this_machine() -> Cpus {
        let count = std::thread::available_parallelism().map_or(1, |n| n.get());
        let pin = count >= 2 && std::env::var("BENCH_LAGGARD_PIN").as_deref() != Ok("0");
        Cpus { count, pin }
    }

    /// Pins every thread of this process to the stand-ins' CPUs; the threads it starts later inherit them.
    fn pin_stand_ins(self) {
        if self.pin {
            pin_process(std::process::id(), 0..self.count - 1);
        }
    }

    /// Pins every thread of process `pid` to the relays' CPU.
    fn pin_relay(self, pid: u32) {
        if self.pin {
            pin_process(pid, self.count - 1..self.count);
        }
    }
}

/// Gives the calling thread (an ack reader or a subscriber: threads that sleep until their socket or their timer
/// wakes them) real-time priority, so that its wake-ups are not queued behind the stand-in change-streamer's bursts
/// on the same CPU, as they would not be on machines of their own. Without the privilege it stays as it is, and the
/// run says so once.
fn real_time() {
    static WARNED: std::sync::Once = std::sync::Once::new();
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: a valid sched_param for the calling thread.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        WARNED.call_once(|| {
            println!("  note: the stand-ins run at normal priority ({err}); their own late wake-ups add to every row")
        });
    }
}

fn pin_process(pid: u32, cpus: std::ops::Range<usize>) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the process's threads");
    for task in tasks {
        let name = task.unwrap().file_name();
        let tid: libc::pid_t = name
            .to_str()
            .and_then(|t| t.parse().ok())
            .expect("a thread id");
        // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it for indexes below CPU_SETSIZE.
        let rc = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for cpu in cpus.clone() {
                libc::CPU_SET(cpu, &mut set);
            }
            libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
        };
        assert_eq!(
            rc,
            0,
            "sched_setaffinity: {}",
            std::io::Error::last_os_error()
        );
    }
}
