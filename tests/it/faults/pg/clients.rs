//! Reservation clients that vanish without a close: one whose connection is dropped (closed or reset under the
//! WebSocket, as when its process dies or its host goes away), and one that goes silent with its socket open (a
//! process stopped with SIGSTOP, a host that froze). The first is released as soon as the socket says so; the
//! second only at `server.peer_timeout`, since until then it may just be slow — and meanwhile its rows stay. Every
//! step asserts the rows left in `changeLog`, and other reservations are served throughout.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use litestream_sidecar::cleanup::{Bound, Decision, HoldReason};
use tokio::task::JoinHandle;
use tokio_tungstenite::tungstenite::Message;

use crate::support::pg::{expected_rows, TestSchema};
use crate::support::process::Reaped;
use crate::support::*;

/// A view-syncer's reservation read on its own task, so pings are answered (tungstenite queues the pong and sends
/// it with the next read). It vanishes without a WebSocket close: [`Vanishing::reset`] or dropping it.
struct Vanishing {
    texts: Arc<Mutex<Vec<String>>>,
    reset: Option<tokio::sync::oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Vanishing {
    async fn open(sidecar: &Sidecar, task_id: &str) -> Vanishing {
        let mut ws = connect(&sidecar.snapshot_url(task_id)).await;
        let texts = Arc::new(Mutex::new(Vec::new()));
        let (reset, mut reset_rx) = tokio::sync::oneshot::channel::<()>();
        let seen = texts.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut reset_rx => {
                        // SO_LINGER 0: closing sends RST instead of FIN, as a crashed host's stack may.
                        if let tokio_tungstenite::MaybeTlsStream::Plain(tcp) = ws.get_ref() {
                            tcp.set_zero_linger().unwrap();
                        }
                        return;
                    }
                    message = ws.next() => match message {
                        Some(Ok(Message::Text(text))) => seen.lock().unwrap().push(text.to_string()),
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => return,
                    },
                }
            }
        });
        let vanishing = Vanishing {
            texts,
            reset: Some(reset),
            task,
        };
        eventually("the status", || !vanishing.texts.lock().unwrap().is_empty()).await;
        assert_eq!(*vanishing.texts.lock().unwrap(), [V3_STATUS]);
        vanishing
    }

    /// Closes the TCP connection with a reset.
    fn reset(mut self) {
        let _ = self.reset.take().unwrap().send(());
    }

    fn is_running(&self) -> bool {
        !self.task.is_finished()
    }
}

impl Drop for Vanishing {
    /// Closes the TCP connection with a FIN, no WebSocket close before it.
    fn drop(&mut self) {
        if self.reset.is_none() {
            return;
        }
        self.task.abort();
    }
}

/// A reservation client that answers pings until it is stopped, then holds its socket open and answers nothing.
enum Stoppable {
    /// A `node` process with its built-in WebSocket client, stopped with SIGSTOP: the kernel still acknowledges
    /// every byte, nothing reads or answers them.
    Node { child: Reaped },
    /// Where `node --experimental-websocket` is unavailable: the same in process, a raw client that stops reading.
    InProcess {
        stop: tokio::sync::watch::Sender<bool>,
        task: JoinHandle<()>,
    },
}

const NODE_CLIENT: &str = "const ws = new WebSocket(process.argv[1]); \
                           ws.onmessage = (m) => console.log(m.data); \
                           ws.onclose = (e) => { console.log('closed ' + e.code); process.exit(0); };";

impl Stoppable {
    async fn open(sidecar: &Sidecar, task_id: &str) -> Stoppable {
        let node = Command::new("node")
            .args([
                "--experimental-websocket",
                "-e",
                "process.exit(typeof WebSocket === 'function' ? 0 : 1)",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if node {
            let mut child = Reaped(
                Command::new("node")
                    .args(["--experimental-websocket", "-e", NODE_CLIENT])
                    .arg(sidecar.snapshot_url(task_id))
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("spawn node"),
            );
            let stdout = child.0.stdout.take().unwrap();
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(stdout).read_line(&mut line);
                let _ = tx.send(line);
            });
            // A hang guard: node starts slowly on a loaded machine.
            let status = tokio::time::timeout(Duration::from_secs(60), rx)
                .await
                .expect("node's client gets its status within 60 s")
                .unwrap();
            assert_eq!(status.trim_end(), V3_STATUS);
            return Stoppable::Node { child };
        }
        eprintln!("node --experimental-websocket unavailable: the silent client runs in process");
        let mut raw = RawClient::connect(
            sidecar.addr,
            &format!("/replication/v3/snapshot?taskID={task_id}"),
        )
        .await;
        let (opcode, status) = raw.read_frame().await.expect("the status");
        assert_eq!(
            (opcode, String::from_utf8(status).unwrap().as_str()),
            (0x1, V3_STATUS)
        );
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.changed() => {
                        // Keeps the socket open and reads nothing until the test ends.
                        std::future::pending::<()>().await;
                    }
                    frame = raw.read_frame() => match frame {
                        Some((0x9, payload)) => raw.write_frame(true, 0xA, &payload).await,
                        Some(_) => {}
                        None => return,
                    },
                }
            }
        });
        Stoppable::InProcess { stop, task }
    }

    /// From now on nothing answers.
    fn stop(&self) {
        match self {
            Stoppable::Node { child } => {
                let stopped = Command::new("kill")
                    .args(["-STOP", &child.id().to_string()])
                    .status()
                    .unwrap();
                assert!(stopped.success());
            }
            Stoppable::InProcess { stop, .. } => {
                stop.send(true).unwrap();
            }
        }
    }
}

impl Drop for Stoppable {
    fn drop(&mut self) {
        if let Stoppable::InProcess { task, .. } = self {
            task.abort();
        }
    }
}

fn open_tasks(sidecar: &Sidecar) -> Vec<(String, Option<String>)> {
    let mut open: Vec<_> = sidecar
        .registry
        .open_reservations()
        .into_iter()
        .map(|r| (r.task_id, r.floor))
        .collect();
    open.sort();
    open
}

fn floors(open: &[(&str, &str)]) -> Vec<(String, Option<String>)> {
    open.iter()
        .map(|(task, floor)| (task.to_string(), Some(floor.to_string())))
        .collect()
}

fn rows_from(watermarks: &[&str]) -> Vec<(String, i64)> {
    expected_rows(watermarks, 4)
}

/// Reservations whose clients vanish: two dropped under the WebSocket (a FIN, a reset) are released by their
/// sockets at once, but their slots keep their floors (a view-syncer restores without its snapshot socket) until
/// their tasks subscribe, and only then cleanup moves up to the next floor; then a client stops answering
/// (SIGSTOP), the peer timeout drops its socket, and its slot still holds until its task subscribes, while a
/// reservation opened meanwhile is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_of_vanished_clients_hold_rows_until_the_socket_or_the_peer_timeout_says_they_are_gone(
) {
    let db = TestSchema::create(Some(5), None).await;
    let all = ["0a", "0b", "0c", "0d", "0e", "0f", "0g"];
    for w in all {
        db.insert_transaction(w, 2).await;
    }
    let litestream = MetricsServer::start(&progress_page(&[("0b", seconds_ago(600.0))])).await;
    let sidecar = start_aged(
        config(&format!(
            "{}[litestream]\nmetrics_url = \"{}\"\ncheck_interval = \"1s\"\n\
             [server]\nping_interval = \"1s\"\npeer_timeout = \"3s\"\n\
             [cleanup]\nwithout_subscribers = \"after_grace\"\nreconnect_grace = \"1s\"\n",
            db.config(),
            litestream.url()
        )),
        Duration::from_secs(600),
    )
    .await;

    // Nothing holds it: cleanup purges below the aged backup.
    eventually_async("purged below 0b", || async {
        sidecar.status.get().last_purged() == Some("0b")
    })
    .await;
    assert_eq!(db.rows().await, rows_from(&all[1..]));

    // Two restores from 0b begin, then one from 0d once litestream has it; another backup follows.
    let fin = Vanishing::open(&sidecar, "fin").await;
    let reset = Vanishing::open(&sidecar, "reset").await;
    litestream.set_page(&progress_page(&[
        ("0b", seconds_ago(600.0)),
        ("0d", seconds_ago(600.0)),
    ]));
    eventually("0d seen", || {
        sidecar.registry.newest_backup().as_deref() == Some("0d")
    })
    .await;
    let stopped = Stoppable::open(&sidecar, "stopped").await;
    litestream.set_page(&progress_page(&[
        ("0b", seconds_ago(600.0)),
        ("0d", seconds_ago(600.0)),
        ("0e", seconds_ago(600.0)),
    ]));
    eventually("0e seen", || {
        sidecar.registry.newest_backup().as_deref() == Some("0e")
    })
    .await;
    assert_eq!(
        open_tasks(&sidecar),
        floors(&[("fin", "0b"), ("reset", "0b"), ("stopped", "0d")])
    );
    assert_eq!(
        decisions(&sidecar, 1).await,
        Decision::Hold(HoldReason::ReservationFloor)
    );
    assert_eq!(db.rows().await, rows_from(&all[1..]));

    // (a) Dropped under the WebSocket: their sockets are released as soon as they end, long before any peer
    // timeout (both answered every ping, and "stopped", opened after them, is still held); their slots are not.
    drop(fin);
    assert!(reset.is_running());
    reset.reset();
    eventually("the dropped sockets released", || {
        open_tasks(&sidecar) == floors(&[("stopped", "0d")])
    })
    .await;
    decisions(&sidecar, 2).await;
    assert_eq!(sidecar.status.get().last_purged(), Some("0b"));
    assert_eq!(
        db.rows().await,
        rows_from(&all[1..]),
        "purged below a closed reservation's floor"
    );
    // Their restores done, their tasks subscribe: their slots end.
    for task in ["fin", "reset"] {
        sidecar.registry.end_by_subscription(
            task,
            sidecar.registry.ticket(),
            tokio::time::Instant::now(),
        );
    }
    eventually_async("purged up to the floor left", || async {
        sidecar.status.get().last_purged() == Some("0d")
    })
    .await;
    assert_eq!(db.rows().await, rows_from(&all[3..]));
    assert!(matches!(
        sidecar.status.get().last_decision,
        Some(Decision::Purge { ref before, bound: Bound::Reservation { ref task_id, .. } })
            if before == "0d" && task_id == "stopped"
    ));
    // It has outlived a peer timeout by answering pings: what follows is its silence, not its age.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(open_tasks(&sidecar), floors(&[("stopped", "0d")]));

    // (b) Silent with its socket open: as long as it is held, nothing at or above its floor goes, and a new
    // reservation is served meanwhile; then the peer timeout drops it and cleanup goes past its old floor.
    stopped.stop();
    let other = Vanishing::open(&sidecar, "other").await;
    let guard = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(
            tokio::time::Instant::now() < guard,
            "timed out waiting for the silent client to be dropped"
        );
        let held = open_tasks(&sidecar)
            .iter()
            .any(|(task, _)| task == "stopped");
        let rows = db.rows().await;
        if !held {
            break;
        }
        assert_eq!(rows, rows_from(&all[3..]), "purged below a held floor");
        assert_ne!(
            sidecar.status.get().last_decision,
            Some(Decision::Purge {
                before: "0e".into(),
                bound: Bound::Backup
            })
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open_tasks(&sidecar), floors(&[("other", "0e")]));
    // Its slot still holds its floor until its task subscribes.
    decisions(&sidecar, 2).await;
    assert_eq!(
        db.rows().await,
        rows_from(&all[3..]),
        "purged below a dropped reservation's floor"
    );
    sidecar.registry.end_by_subscription(
        "stopped",
        sidecar.registry.ticket(),
        tokio::time::Instant::now(),
    );
    eventually_async("purged past the silent client's floor", || async {
        sidecar.status.get().last_purged() == Some("0e")
    })
    .await;
    assert_eq!(db.rows().await, rows_from(&all[4..]));
    // The other reservation was served throughout and still is.
    assert_eq!(open_tasks(&sidecar), floors(&[("other", "0e")]));
    assert!(other.is_running());
    drop(stopped);
    drop(other);
    sidecar.stop().await;
    db.drop().await;
}
