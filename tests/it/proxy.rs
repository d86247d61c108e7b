//! The metrics proxy Zero's BackupMonitor reads: litestream's page without the watermark gauge.

use crate::support::*;

const FORK: &str = include_str!("../fixtures/litestream/zero-fork.prom");
const UPSTREAM: &str = include_str!("../fixtures/litestream/upstream-0.5.17.prom");

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http(addr, "GET", path).await
}

#[tokio::test]
async fn the_fork_page_passes_through_without_the_progress_family() {
    let litestream = MetricsServer::start(FORK).await;
    let sidecar = start(config(&format!(
        "[litestream]\nmetrics_url = \"{}\"\n",
        litestream.url()
    )))
    .await;
    let (status, body) = get(sidecar.proxy_addr, "/metrics").await;
    assert_eq!(status, 200);
    let expected: String = FORK
        .split_inclusive('\n')
        .enumerate()
        .filter(|(i, _)| !(102..=104).contains(i))
        .map(|(_, line)| line)
        .collect();
    assert_eq!(body, expected);
    assert!(!body.contains("litestream_replica_progress"));
    assert!(
        body.contains("litestream_replica_validation_total") || body.contains("litestream_db_size")
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_page_without_the_family_passes_through_byte_for_byte() {
    let litestream = MetricsServer::start(UPSTREAM).await;
    let sidecar = start(config(&format!(
        "[litestream]\nmetrics_url = \"{}\"\n",
        litestream.url()
    )))
    .await;
    assert_eq!(
        get(sidecar.proxy_addr, "/metrics").await,
        (200, UPSTREAM.to_string())
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn litestream_down_or_failing_is_a_502() {
    let litestream = MetricsServer::start(FORK).await;
    let sidecar = start(config(&format!(
        "[litestream]\nmetrics_url = \"{}\"\n",
        litestream.url()
    )))
    .await;
    litestream.set_status(500);
    let (status, body) = get(sidecar.proxy_addr, "/metrics").await;
    assert_eq!(status, 502, "{body}");
    litestream.stop();
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (status, body) = get(sidecar.proxy_addr, "/metrics").await;
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("litestream"), "{body}");
    // The proxy itself stays up.
    assert_eq!(get(sidecar.proxy_addr, "/other").await.0, 404);
    sidecar.stop().await;
}

#[tokio::test]
async fn localhost_is_served_on_every_address_it_resolves_to() {
    let listeners = litestream_sidecar::proxy::bind("localhost:0")
        .await
        .unwrap();
    let resolved: Vec<std::net::SocketAddr> = tokio::net::lookup_host("localhost:0")
        .await
        .unwrap()
        .collect();
    let mut bound: Vec<_> = listeners
        .iter()
        .map(|l| l.local_addr().unwrap().ip())
        .collect();
    bound.sort();
    let mut expected: Vec<_> = resolved.iter().map(|a| a.ip()).collect();
    expected.sort();
    expected.dedup();
    // Where ::1 resolves but IPv6 is off, it is skipped with a warning; 127.0.0.1 is always there.
    assert!(
        bound.iter().all(|ip| expected.contains(ip)),
        "{bound:?} vs {expected:?}"
    );
    assert!(bound.contains(&"127.0.0.1".parse().unwrap()), "{bound:?}");
}
