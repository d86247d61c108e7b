//! The protocol versions the upstream serves (docs/protocol.md, "Protocol versions the upstream serves"): learned
//! from its refusal of the sidecar's probe or of a relayed subscription, or configured; a client outside them is
//! refused before any snapshot status, and its subscription before the upstream is dialed.

use std::time::Duration;

use crate::support::*;

const V3_REFUSED_BY_1_10: &str =
    "Error: Cannot service client at protocol v3. Supported protocols: [v4 ... v6]";

/// Zero 1.10's change-streamer: v4 to v6.
const ZERO_1_10: Serves = Serves {
    versions: 4..=6,
    answers_probes: true,
};

/// Zero 0.20's: v1 to v3.
const ZERO_0_20: Serves = Serves {
    versions: 1..=3,
    answers_probes: true,
};

async fn status_json(sidecar: &Sidecar) -> serde_json::Value {
    let (status, body) = http(sidecar.addr, "GET", "/status").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn learned(sidecar: &Sidecar, versions: std::ops::RangeInclusive<u64>) {
    let protocols = sidecar.protocols.clone();
    eventually(&format!("{versions:?} learned"), || {
        protocols.versions() == Some(versions.clone())
    })
    .await;
}

#[tokio::test]
async fn behind_a_zero_1_10_upstream_v3_is_refused_before_any_status_or_dial() {
    let mut upstream = Upstream::serving(ZERO_1_10).await;
    let sidecar = start(upstream.config("")).await;
    learned(&sidecar, 4..=6).await;

    assert_eq!(
        refused(&sidecar.snapshot_url("vs-old")).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    assert_eq!(sidecar.registry.len(), 0, "no reservation was opened");
    let path = changes_path(3, "vs-old", "serving-replicator-1", "0a", true);
    assert_eq!(
        refused(&sidecar.url(&path)).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    // Below and above the range, Zero 1.10's words too.
    assert_eq!(
        refused(&sidecar.url("/replication/v7/changes?id=a")).await,
        (
            400,
            "Error: Cannot service client at protocol v7. Supported protocols: [v4 ... v6]".into()
        )
    );
    // The upstream saw the probe and nothing else.
    assert!(upstream.none_arrives().await);
    assert_eq!(upstream.refused_targets(), ["/replication/v0/changes"]);

    // A version it serves is relayed as before.
    let path = changes_path(6, "vs-new", "serving-replicator-2", "0a", false);
    let url = sidecar.url(&path);
    let (_client, conn) = tokio::join!(connect(&url), upstream.accept());
    assert_eq!(conn.target, path);

    let json = status_json(&sidecar).await;
    let protocols = &json["upstream"]["protocols"];
    assert_eq!(protocols["setting"], "auto", "{json:#}");
    assert_eq!(
        (&protocols["min"], &protocols["max"]),
        (&4.into(), &6.into())
    );
    assert_eq!(protocols["source"], "probe");
    sidecar.stop().await;
}

/// The first requests after a start wait for the first probe instead of being served on an unknown range.
#[tokio::test]
async fn a_snapshot_right_after_start_is_decided_by_the_first_probe() {
    let upstream = Upstream::serving(ZERO_1_10).await;
    let sidecar = start(upstream.config("")).await;
    assert_eq!(
        refused(&sidecar.snapshot_url("vs-early")).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    assert_eq!(sidecar.registry.len(), 0);
    sidecar.stop().await;
}

/// An upstream that does not answer the probe teaches its range by refusing a relayed subscription.
#[tokio::test]
async fn a_relayed_refusal_teaches_the_range_when_the_probe_learns_nothing() {
    let upstream = Upstream::serving(Serves {
        answers_probes: false,
        ..ZERO_1_10
    })
    .await;
    let sidecar = start(upstream.config("")).await;
    let path = changes_path(3, "vs-old", "serving-replicator-1", "0a", true);

    // Not known yet: relayed, and the upstream's refusal reaches the subscriber as it sent it.
    let mut client = connect(&sidecar.url(&path)).await;
    assert_eq!(
        expect_close(&mut client).await,
        Some((1002, V3_REFUSED_BY_1_10.to_string()))
    );
    learned(&sidecar, 4..=6).await;

    // From now on refused before the upgrade: no status, no dial.
    assert_eq!(
        refused(&sidecar.snapshot_url("vs-old")).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    assert_eq!(sidecar.registry.len(), 0);
    assert_eq!(
        refused(&sidecar.url(&path)).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    let v3_dials = upstream
        .refused_targets()
        .iter()
        .filter(|target| target.starts_with("/replication/v3/"))
        .count();
    assert_eq!(v3_dials, 1, "{:?}", upstream.refused_targets());
    let json = status_json(&sidecar).await;
    assert_eq!(
        json["upstream"]["protocols"]["source"], "refusal",
        "{json:#}"
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn a_configured_range_works_without_any_upstream() {
    let sidecar = start(config(
        "[upstream]\naddress = \"127.0.0.1:9\"\nprotocols = \"4..6\"\n",
    ))
    .await;
    assert_eq!(
        refused(&sidecar.snapshot_url("vs-old")).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    assert_eq!(
        refused(&sidecar.url(&changes_path(3, "vs-old", "a", "0a", true))).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    // A version in the range passes the check, then finds no upstream.
    let (status, body) = refused(&sidecar.url(&changes_path(6, "vs-new", "a", "0a", true))).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(sidecar.registry.len(), 0);
    let json = status_json(&sidecar).await;
    let protocols = &json["upstream"]["protocols"];
    assert_eq!(protocols["setting"], "4..6", "{json:#}");
    assert_eq!(protocols["source"], "config");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_zero_0_20_upstream_keeps_serving_v3() {
    let mut upstream = Upstream::serving(ZERO_0_20).await;
    let sidecar = start(upstream.config("")).await;
    learned(&sidecar, 1..=3).await;

    let mut reservation = connect(&sidecar.snapshot_url("vs-1")).await;
    assert_eq!(next_text(&mut reservation).await, V3_STATUS);
    let path = changes_path(3, "vs-1", "serving-replicator-1", "0a", false);
    let url = sidecar.url(&path);
    let (_client, conn) = tokio::join!(connect(&url), upstream.accept());
    assert_eq!(conn.target, path);
    // A v4 view-syncer would be refused on /changes by this upstream: it gets no status either.
    assert_eq!(
        refused(&sidecar.url("/replication/v4/snapshot?taskID=vs-2")).await,
        (
            400,
            "Error: Cannot service client at protocol v4. Supported protocols: [v3 ... v3]".into()
        )
    );
    sidecar.stop().await;
}

/// A Zero upgrade: the upstream goes away and another release comes back at its address. The lost subscription
/// has the sidecar ask again, and the new range replaces the old one.
#[tokio::test]
async fn an_upstream_replaced_by_another_release_is_learned_again() {
    let mut upstream = Upstream::serving(ZERO_0_20).await;
    let addr = upstream.addr;
    let sidecar = start(upstream.config("")).await;
    learned(&sidecar, 1..=3).await;
    let path = changes_path(3, "vs-1", "serving-replicator-1", "0a", false);
    let url = sidecar.url(&path);
    let (mut client, conn) = tokio::join!(connect(&url), upstream.accept());

    upstream.stop();
    drop((conn, upstream));
    assert_eq!(
        expect_close(&mut client).await.map(|(code, _)| code),
        Some(1011)
    );
    let _upstream = Upstream::serving_at(addr, ZERO_1_10).await;
    let protocols = sidecar.protocols.clone();
    within("the new release's range", Duration::from_secs(30), || {
        let protocols = protocols.clone();
        async move { protocols.versions() == Some(4..=6) }
    })
    .await;
    assert_eq!(
        refused(&sidecar.snapshot_url("vs-2")).await,
        (400, V3_REFUSED_BY_1_10.to_string())
    );
    sidecar.stop().await;
}

/// `proxy_mode = "hide"` in front of an upstream that serves v4 to v6 (Zero 1.10) keeps its replication-manager from
/// becoming ready after an initial sync (docs/deploy-zero-1.9.md, "Zero 1.10"). Known before serving, from the
/// upstream's answer to the start's probe: refused, with why. Learned once serving (the upstream came up later):
/// said in `/status`. Neither for `clamp`, or for an upstream that serves older versions.
#[tokio::test]
async fn hide_in_front_of_zero_1_10_is_refused_at_start_or_said_in_status() {
    const HIDE: &str = "[litestream]\nproxy_mode = \"hide\"\n";
    let upstream = Upstream::serving(ZERO_1_10).await;
    let refused = start(upstream.config(HIDE)).await;
    match refused.ended().await {
        Err(litestream_sidecar::Error::NeverReady(why)) => {
            assert!(
                why.contains("proxy_mode = \"hide\"") && why.contains("v4..v6"),
                "{why}"
            );
            assert!(why.contains("set proxy_mode = \"clamp\""), "{why}");
        }
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(
        upstream.refused_targets(),
        ["/replication/v0/changes"],
        "asked once"
    );

    // The upstream starts after the sidecar: nothing to refuse at start, said once learned.
    let addr = upstream.addr;
    drop(upstream);
    let sidecar = start(Upstream::config_for(addr, HIDE)).await;
    let json = status_json(&sidecar).await;
    assert!(json["upstream"]["readiness_warning"].is_null(), "{json:#}");
    let _upstream = Upstream::serving_at(addr, ZERO_1_10).await;
    learned(&sidecar, 4..=6).await;
    let json = status_json(&sidecar).await;
    let warning = json["upstream"]["readiness_warning"].as_str();
    assert!(
        warning.is_some_and(|w| w.contains("proxy_mode = \"hide\"") && w.contains("v4..v6")),
        "{json:#}"
    );
    sidecar.stop().await;

    for (serves, mode) in [(ZERO_1_10, "clamp"), (ZERO_0_20, "hide")] {
        let versions = serves.versions.clone();
        let upstream = Upstream::serving(serves).await;
        let extra = format!("[litestream]\nproxy_mode = \"{mode}\"\n");
        let sidecar = start(upstream.config(&extra)).await;
        learned(&sidecar, versions.clone()).await;
        let json = status_json(&sidecar).await;
        assert!(
            json["upstream"]["readiness_warning"].is_null(),
            "{mode} before {versions:?}: {json:#}"
        );
        sidecar.stop().await;
    }
}
