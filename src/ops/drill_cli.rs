//! `litestream-sidecar drill`: one restore drill now, in this process, with the daemon's config, and its outcome
//! printed. The restored replica's version is compared with the change DB's when the change DB answers within
//! [`DB_WAIT`]; without it the drill still proves that the backup restores and passes the check.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::cleanup::change_db::config::ChangeDbConfig;
use crate::litestream::config::BackupConfig;
use crate::litestream::drill::{Failure, Proof};
use crate::protocol::shard::ZeroConfig;

/// How long the change DB gets to answer before the drill runs without comparing replica versions.
pub const DB_WAIT: Duration = Duration::from_secs(10);

/// What `drill` found: the proof or the failure, and the change DB's replica version if it was read.
pub struct Outcome {
    pub result: Result<Proof, Failure>,
    /// `None`: the change DB did not answer (or has no replica yet), so versions were not compared.
    pub compared_with: Option<String>,
}

/// Runs one drill of the backup at `backup_url` (`litestream.backup_url`).
pub async fn run(
    backup: &BackupConfig,
    backup_url: &str,
    change_db: &ChangeDbConfig,
    zero: &ZeroConfig,
) -> Outcome {
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
    let result = backup.drill(backup_url).run(None, None).await;
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
            "drill passed: the backup restores to watermark {} (replica version {}, compared with {compared})\n\
             restore {:.1} s, check {:.1} s, {} bytes\n",
            proof.watermark,
            proof.replica_version,
            proof.restore_took.as_secs_f64(),
            proof.check_took.as_secs_f64(),
            proof.bytes,
        ),
        Err(failure) => format!("drill FAILED ({}): {failure}\n", failure.kind()),
    }
}
