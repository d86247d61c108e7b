//! The configuration: the `sidecar.toml` file and `LITESTREAM_SIDECAR__SECTION__KEY` environment overrides, merged
//! and handed to each component, which reads its own section ([`crate::keys`]).
//!
//! Loading and validation are separate so that `--check-config` can report every problem at once and tests can
//! build a config from a string. Nothing here touches the network.

use std::path::{Path, PathBuf};

use crate::cleanup::change_db::config::ChangeDbConfig;
use crate::cleanup::config::CleanupConfig;
use crate::cleanup::discovery::DiscoveryConfig;
use crate::keys::{KeyError, Section};
use crate::litestream::config::{BackupConfig, LitestreamConfig};
use crate::net::config::ServerConfig;
use crate::ops::hidden_gauge::never_ready;
use crate::ops::log::LogConfig;
use crate::protocol::shard::ZeroConfig;
use crate::streamer::config::{Protocols, RelayConfig, UpstreamConfig};

pub mod reference;

/// Prefix of the environment variables that override file keys: `LITESTREAM_SIDECAR__LITESTREAM__BACKUP_URL`
/// overrides `[litestream] backup_url`.
pub const ENV_PREFIX: &str = "LITESTREAM_SIDECAR";
/// Separator between prefix, section and key in environment variable names.
pub const ENV_SEPARATOR: &str = "__";
/// Files tried in order when no `--config` is given.
pub const DEFAULT_PATHS: [&str; 2] = ["./sidecar.toml", "/etc/litestream-sidecar/sidecar.toml"];

/// The validated configuration the daemon runs with: one part per component, each read by its component.
#[derive(Debug, Clone)]
pub struct Config {
    pub server: ServerConfig,
    pub litestream: LitestreamConfig,
    pub backup: BackupConfig,
    pub zero: ZeroConfig,
    pub change_db: ChangeDbConfig,
    pub cleanup: CleanupConfig,
    pub discovery: DiscoveryConfig,
    pub upstream: UpstreamConfig,
    pub relay: RelayConfig,
    pub log: LogConfig,
}

/// The file as written, under the environment's overrides: sections of keys, not yet read.
#[derive(Debug, Clone, Default)]
pub struct RawConfig {
    sections: toml::Table,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {source}")]
    File {
        path: PathBuf,
        source: Box<config::ConfigError>,
    },
    #[error("config: {0}")]
    Load(Box<config::ConfigError>),
    #[error("{} invalid config key(s):\n{}", .0.len(), list(.0))]
    Invalid(Vec<KeyError>),
}

fn list(errors: &[KeyError]) -> String {
    errors
        .iter()
        .map(|e| format!("  {e}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl RawConfig {
    /// Has every component read its section; returns all problems, not just the first.
    pub fn validate(&self) -> Result<Config, ConfigError> {
        self.read().0
    }

    /// The effective configuration as TOML, every key with its value or default, secrets and credentials hidden.
    pub fn to_redacted_toml(&self) -> String {
        toml::to_string(&self.effective()).expect("config serializes")
    }

    /// Every key's effective value, as [`RawConfig::to_redacted_toml`] prints it.
    pub fn effective(&self) -> toml::Table {
        self.read().1
    }

    fn read(&self) -> (Result<Config, ConfigError>, toml::Table) {
        let mut reader = Reader {
            sections: self.sections.clone(),
            problems: Vec::new(),
            shown: toml::Table::new(),
        };
        let server = reader.section("server", ServerConfig::read);
        let litestream = reader.section("litestream", LitestreamConfig::read);
        let backup_url = litestream.as_ref().map(|l| l.backup_url.as_str());
        let backup = reader.section("backup", |s| BackupConfig::read(s, backup_url));
        let zero = reader.section("zero", ZeroConfig::read);
        let change_db = reader.section("change_db", ChangeDbConfig::read);
        let drills = backup.as_ref().is_none_or(|b| b.drill_interval.is_some());
        let cleanup = reader.section("cleanup", |s| CleanupConfig::read(s, drills));
        let tls_listener = server.as_ref().is_some_and(|s| s.tls.is_some());
        let discovery = reader.section("discovery", |s| DiscoveryConfig::read(s, tls_listener));
        let upstream = reader.section("upstream", UpstreamConfig::read);
        let relay = reader.section("relay", RelayConfig::read);
        let log = reader.section("log", LogConfig::read);
        if let (Some(litestream), Some(upstream)) = (&litestream, &upstream) {
            if let Protocols::Fixed(versions) = &upstream.protocols {
                if let Some(problem) = never_ready(litestream.proxy_mode, versions) {
                    reader.problems.push(KeyError {
                        key: "litestream.proxy_mode".into(),
                        problem: format!(
                            "with upstream.protocols = \"{}..{}\": {problem}",
                            versions.start(),
                            versions.end()
                        ),
                    });
                }
            }
        }
        for name in reader.sections.keys() {
            reader.problems.push(KeyError {
                key: name.clone(),
                problem: "unknown section".into(),
            });
        }
        let config = (|| {
            Some(Config {
                server: server?,
                litestream: litestream?,
                backup: backup?,
                zero: zero?,
                change_db: change_db?,
                cleanup: cleanup?,
                discovery: discovery?,
                upstream: upstream?,
                relay: relay?,
                log: log?,
            })
        })();
        let result = match config {
            Some(config) if reader.problems.is_empty() => Ok(config),
            _ => Err(ConfigError::Invalid(reader.problems)),
        };
        (result, reader.shown)
    }
}

/// What the sections still unread, the problems found and the effective values read so far.
struct Reader {
    sections: toml::Table,
    problems: Vec<KeyError>,
    shown: toml::Table,
}

impl Reader {
    fn section<T>(
        &mut self,
        name: &'static str,
        read: impl FnOnce(&mut Section<'_>) -> Option<T>,
    ) -> Option<T> {
        let table = match self.sections.remove(name) {
            None => toml::Table::new(),
            Some(toml::Value::Table(table)) => table,
            Some(_) => {
                self.problems.push(KeyError {
                    key: name.into(),
                    problem: "must be a section of keys".into(),
                });
                toml::Table::new()
            }
        };
        let mut section = Section::new(name, table, &mut self.problems);
        let value = read(&mut section);
        let shown = section.finish();
        self.shown.insert(name.into(), toml::Value::Table(shown));
        value
    }
}

/// Which file to read: the explicit one (must exist), else the first default that exists, else none (environment
/// and defaults only, as in a container).
pub fn resolve_path(explicit: Option<&Path>) -> Option<PathBuf> {
    match explicit {
        Some(path) => Some(path.to_path_buf()),
        None => DEFAULT_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file()),
    }
}

/// Reads the file (if any) and the process environment into a [`RawConfig`].
pub fn load(path: Option<&Path>) -> Result<RawConfig, ConfigError> {
    let text = match path {
        None => None,
        Some(path) => {
            let unreadable = |reason: String| ConfigError::File {
                path: path.to_path_buf(),
                source: Box::new(config::ConfigError::Message(reason)),
            };
            if !path.is_file() {
                return Err(unreadable("no such file".into()));
            }
            Some(std::fs::read_to_string(path).map_err(|e| unreadable(e.to_string()))?)
        }
    };
    build(text.as_deref(), None).map_err(|source| match path {
        Some(path) => ConfigError::File {
            path: path.to_path_buf(),
            source: Box::new(source),
        },
        None => ConfigError::Load(Box::new(source)),
    })
}

/// Builds a [`RawConfig`] from TOML text and an explicit set of environment variables, through the same steps as
/// [`load`]: tests use it so they never touch the process environment.
pub fn from_toml_str(
    text: &str,
    env: Option<std::collections::HashMap<String, String>>,
) -> Result<RawConfig, ConfigError> {
    build(Some(text), env).map_err(|e| ConfigError::Load(Box::new(e)))
}

/// The file's text (if any) under the environment's overrides (`None`: the process environment).
fn build(
    text: Option<&str>,
    env: Option<std::collections::HashMap<String, String>>,
) -> Result<RawConfig, config::ConfigError> {
    let mut builder = config::Config::builder();
    if let Some(text) = text {
        builder = builder.add_source(config::File::from_str(text, config::FileFormat::Toml));
    }
    let sections = builder
        .add_source(environment(env))
        .build()
        .and_then(|c| c.try_deserialize())?;
    Ok(RawConfig { sections })
}

fn environment(source: Option<std::collections::HashMap<String, String>>) -> config::Environment {
    config::Environment::with_prefix(ENV_PREFIX)
        .prefix_separator(ENV_SEPARATOR)
        .separator(ENV_SEPARATOR)
        .source(source)
}

#[cfg(test)]
mod tests;
