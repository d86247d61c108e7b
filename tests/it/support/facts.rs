//! What tests read of a running sidecar, and the waits for it: `/status` and `/metrics` (the facts it reports), the
//! monitor's decisions, and polls of any other condition. Every wait is a hang guard, never a timing assertion.

use super::*;

/// Polls `check` until it holds; a hang guard, not a timing assertion.
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls an async `check` until it holds; a hang guard, not a timing assertion.
pub async fn eventually_async<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(what, Duration::from_secs(20), check).await;
}

/// [`eventually_async`] with a guard of its own, for waits that include a reconnect's backoff or a start-up hold.
pub async fn within<F, Fut>(what: &str, guard: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + guard;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads with `read` until `check` holds of the reading, and returns that reading; a hang guard, not a timing
/// assertion. A test waits here for a fact, not for the log line that reports it: the line is written before or
/// after the fact becomes visible, while `/status` and `/metrics` are the fact. On timeout the panic shows the last
/// reading, so a failure says what the sidecar reported instead.
pub async fn until<T, F, Fut>(
    what: &str,
    guard: Duration,
    mut read: F,
    check: impl Fn(&T) -> bool,
) -> T
where
    T: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + guard;
    loop {
        let reading = read().await;
        if check(&reading) {
            return reading;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {guard:?} waiting for {what}; the last reading:\n{reading:#}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET /status` of the sidecar at `addr`, parsed.
pub async fn status_at(addr: SocketAddr) -> serde_json::Value {
    let (status, body) = http(addr, "GET", "/status").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("/status is JSON")
}

/// Polls `GET /status` at `addr` until `check` holds of it ([`until`]), and returns that document.
pub async fn wait_for_status(
    addr: SocketAddr,
    what: &str,
    guard: Duration,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    until(what, guard, || status_at(addr), check).await
}

/// Waits until a process started on a port of its config answers `GET /status` there: it listens, and serves.
pub async fn wait_until_serving(addr: SocketAddr, guard: Duration) -> serde_json::Value {
    within("the sidecar to listen", guard, || async {
        TcpStream::connect(addr).await.is_ok()
    })
    .await;
    status_at(addr).await
}

/// The monitor's decision once it has checked `ticks` more times after the sidecar read the shard's memory from the
/// change DB. Until it has, every check holds for it (`state_unreadable`), for as long as a loaded machine takes to
/// connect and read; a decision counted from the start would then be that hold, not the one a test asks about.
pub async fn decisions(sidecar: &Sidecar, ticks: u64) -> Decision {
    within(
        "the shard's memory read from the change DB",
        Duration::from_secs(60),
        || async { sidecar.status.get().memory != litestream_sidecar::cleanup::Memory::Loading },
    )
    .await;
    let target = sidecar.status.get().checks + ticks;
    eventually("monitor checks", || sidecar.status.get().checks >= target).await;
    sidecar.status.get().last_decision.expect("a decision")
}

/// Waits until the monitor decides `expected`, then asserts that the next check decides it again: a settled state,
/// never one read in passing. After a purge whose rows were seen gone, a fixed number of checks is not enough: the
/// purging check may still be finishing, and a purge that stopped early (its gauge or ceiling moved between
/// batches) is decided again by the next check even when nothing is left to delete.
pub async fn settles_on(sidecar: &Sidecar, expected: Decision) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let decision = decisions(sidecar, 1).await;
        if decision == expected {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the decision {expected:?}; the last was {decision:?}"
        );
    }
    assert_eq!(decisions(sidecar, 1).await, expected, "a check later");
}

/// `GET /metrics`, parsed.
pub async fn scrape(sidecar: &Sidecar) -> prometheus_parse::Scrape {
    let (status, body) = http(sidecar.addr, "GET", "/metrics").await;
    assert_eq!(status, 200, "{body}");
    prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string())))
        .expect("a metrics page")
}

/// The value of `name`'s first sample (with `label`, if given); a histogram's count.
pub fn value(
    scrape: &prometheus_parse::Scrape,
    name: &str,
    label: Option<(&str, &str)>,
) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && label.is_none_or(|(k, v)| s.labels.get(k) == Some(v)))
        .map(|s| match s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            prometheus_parse::Value::Histogram(ref buckets) => {
                buckets.last().map_or(0.0, |b| b.count)
            }
            ref other => panic!("{name}: {other:?}"),
        })
}
