//! `litestream-sidecar drill`: one restore drill now, in this process, with the daemon's config, and its outcome
//! printed. The restored replica's version is compared with the change DB's when the change DB answers within
//! [`DB_WAIT`]; without it the drill still proves that the backup restores and passes the check. What it restored
//! is compared with what litestream's gauge claims now, as the daemon reads it (covered by a listing of the
//! destination with `backup.verify`): a restore that reaches less is a broken backup (`restored_less`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cleanup::change_db::config::ChangeDbConfig;
use crate::cleanup::config::Requires;
use crate::litestream::config::{BackupConfig, LitestreamConfig};
use crate::litestream::drill::{Claim, Claims, Failure, Proof};
use crate::protocol::shard::ZeroConfig;

/// How long the change DB gets to answer before the drill runs without comparing replica versions.
pub const DB_WAIT: Duration = Duration::from_secs(10);

/// What `drill` found: the proof or the failure, and the change DB's replica version if it was read.
pub struct Outcome {
    pub result: Result<Proof, Failure>,
    /// `None`: the change DB did not answer (or has no replica yet), so versions were not compared.
    pub compared_with: Option<String>,
    /// What the restored watermark was compared with, in words.
    pub claimed: String,
}

/// What the backup claims now ([`Claims::gauge`]), and the same in words; no claim where the gauge is not read
/// (`cleanup.requires = "restore"`), cannot be read, or is not covered by the destination yet.
pub async fn gauge_claim(litestream: &LitestreamConfig, backup: &BackupConfig) -> (Claims, String) {
    let client = match crate::net::client::HttpClient::new(
        litestream.metrics_url.clone(),
        litestream.scrape_timeout,
        litestream.max_page_bytes,
    ) {
        Ok(client) => client,
        Err(err) => return (Claims::default(), format!("no claim: {err}")),
    };
    let parsed = match crate::litestream::page::scrape(&client, &litestream.filter).await {
        Ok(parsed) => parsed,
        Err(err) => {
            return (
                Claims::default(),
                format!("no claim: litestream's page cannot be read ({err})"),
            )
        }
    };
    let Some(newest) = parsed
        .progress
        .iter()
        .max_by(|a, b| a.watermark.cmp(&b.watermark))
    else {
        return (
            Claims::default(),
            "no claim: litestream's page has no backed-up watermark".to_string(),
        );
    };
    let Some(location) = backup.location.as_ref() else {
        let claim = Claim {
            watermark: newest.watermark.clone(),
            generation: None,
        };
        let said = format!(
            "litestream's claim {} (backup.verify off)",
            newest.watermark
        );
        return (claim_only(claim), said);
    };
    let listed = match crate::litestream::destination::Destination::open(
        location,
        &backup.s3,
        backup.list_timeout,
        std::env::vars(),
    )
    .map(|d| d.restoring_with(backup.restore_with))
    {
        Ok(destination) => destination.list().await.map_err(|err| err.to_string()),
        Err(err) => Err(err),
    };
    match listed.as_ref().map(|listing| listing.layout.chain()) {
        Ok(Some(chain)) if chain.newest >= newest.backed_up_at => {
            let said = format!(
                "litestream's claim {}, covered by generation {}",
                newest.watermark, chain.generation
            );
            let claim = Claim {
                watermark: newest.watermark.clone(),
                generation: Some(chain.generation.clone()),
            };
            (claim_only(claim), said)
        }
        Ok(_) => (
            Claims::default(),
            format!(
                "no claim: litestream's claim {} is not covered by the destination's objects yet",
                newest.watermark
            ),
        ),
        Err(err) => (
            Claims::default(),
            format!("no claim: the destination cannot be listed ({err})"),
        ),
    }
}

fn claim_only(claim: Claim) -> Claims {
    Claims {
        gauge: Some(claim),
        proof: None,
    }
}

/// Runs one drill of the backup at `backup_url` (`litestream.backup_url`).
pub async fn run(
    backup: &BackupConfig,
    litestream: &LitestreamConfig,
    requires: Requires,
    change_db: &ChangeDbConfig,
    zero: &ZeroConfig,
) -> Outcome {
    let backup_url = litestream.backup_url.as_str();
    let shutdown = CancellationToken::new();
    let change_db = crate::cleanup::change_db::ChangeDb::start(
        change_db.url.clone(),
        zero,
        crate::cleanup::change_db::Options::default(),
        shutdown.clone(),
    );
    // The change DB is asked while the drill runs: a dead one costs no time beyond the drill's own, and none at
    // all when the drill fails.
    let asked = tokio::spawn(async move {
        let version = tokio::time::timeout(DB_WAIT, async {
            change_db.ready().await;
            change_db.replica_version().await.ok().flatten()
        })
        .await
        .ok()
        .flatten();
        shutdown.cancel();
        version
    });
    // Read before the restore starts: the restore must reach what was claimed by then.
    let (claims, claimed) = match requires {
        Requires::Listing => gauge_claim(litestream, backup).await,
        Requires::Restore => (
            Claims::default(),
            "no claim: cleanup.requires = \"restore\" reads no gauge".to_string(),
        ),
    };
    let result = backup.drill(backup_url).run(None, None, &claims).await;
    let version = match &result {
        Ok(_) => asked.await.ok().flatten(),
        Err(_) => None,
    };
    let result = match (result, &version) {
        (Ok(proof), Some(current)) if &proof.replica_version != current => {
            Err(Failure::OtherReplica {
                restored: proof.replica_version,
                current: current.clone(),
            })
        }
        (result, _) => result,
    };
    Outcome {
        result,
        compared_with: version,
        claimed,
    }
}

/// The outcome as an operator reads it.
pub fn render(outcome: &Outcome) -> String {
    let compared = match &outcome.compared_with {
        Some(version) => format!("the change DB's replica version {version}"),
        None => "nothing: the change DB did not answer".to_string(),
    };
    match &outcome.result {
        Ok(proof) => format!(
            "drill passed: the backup restores to watermark {}{} (replica version {}, compared with {compared}; \
             claimed: {})\n\
             restore {:.1} s, check {:.1} s, {} bytes\n",
            proof.watermark,
            proof
                .generation
                .as_deref()
                .map(|g| format!(" from generation {g}"))
                .unwrap_or_default(),
            proof.replica_version,
            outcome.claimed,
            proof.restore_took.as_secs_f64(),
            proof.check_took.as_secs_f64(),
            proof.bytes,
        ),
        Err(failure) => format!("drill FAILED ({}): {failure}\n", failure.kind()),
    }
}
