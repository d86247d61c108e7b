//! The configuration reference: a key's meaning is written once, as its doc comment where its section is declared
//! ([`crate::keys::section`]), and `sidecar.toml` and docs/configuration.md repeat it: [`check`] says where either
//! differs, word for word, and [`rewrite`] writes it there (`cargo run --example config_reference -- --write`).
//!
//! In docs/configuration.md a key's meaning is its row's Meaning cell: the doc comment's markdown on one line. In
//! `sidecar.toml` it is the comment directly above the key, with no blank line between: the doc comment's lines
//! under `# `, each link shown as its label alone, so a link's label names where it points
//! (`[docs/protocol.md, "Discovery"](protocol.md#discovery)`). Line breaks and runs of spaces are not compared, so
//! either file may be wrapped by hand. Everything else in the two files, the defaults included (which
//! `config::tests` and the `docs` integration tests compare), is written by hand.

mod markdown;
mod sidecar_toml;

pub use markdown::{rows, Row};

use crate::cleanup::change_db::config::ChangeDbConfig;
use crate::cleanup::config::CleanupConfig;
use crate::cleanup::discovery::DiscoveryConfig;
use crate::keys::KeyDoc;
use crate::litestream::config::{BackupConfig, LitestreamConfig};
use crate::net::config::ServerConfig;
use crate::ops::log::LogConfig;
use crate::protocol::shard::ZeroConfig;
use crate::streamer::config::{RelayConfig, UpstreamConfig};

/// The command that rewrites both files from the declarations; every report of a difference ends with it.
pub const REWRITE: &str = "cargo run --example config_reference -- --write";
/// The configuration file with every key, relative to the repository.
pub const TOML_PATH: &str = "sidecar.toml";
/// The configuration reference, relative to the repository.
pub const MARKDOWN_PATH: &str = "docs/configuration.md";

/// A section of the configuration as its component declares it.
#[derive(Debug, Clone)]
pub struct Declared {
    pub name: &'static str,
    /// The source file of the declaration, named in reports.
    pub file: &'static str,
    pub keys: Vec<KeyDoc>,
}

/// Every section the sidecar reads, in the order of `sidecar.toml`.
pub fn declared() -> Vec<Declared> {
    fn section(name: &'static str, file: &'static str, keys: Vec<KeyDoc>) -> Declared {
        Declared { name, file, keys }
    }
    vec![
        section("server", ServerConfig::DECLARED_IN, ServerConfig::keys()),
        section(
            "litestream",
            LitestreamConfig::DECLARED_IN,
            LitestreamConfig::keys(),
        ),
        section("backup", BackupConfig::DECLARED_IN, BackupConfig::keys()),
        section("zero", ZeroConfig::DECLARED_IN, ZeroConfig::keys()),
        section(
            "change_db",
            ChangeDbConfig::DECLARED_IN,
            ChangeDbConfig::keys(),
        ),
        section("cleanup", CleanupConfig::DECLARED_IN, CleanupConfig::keys()),
        section(
            "discovery",
            DiscoveryConfig::DECLARED_IN,
            DiscoveryConfig::keys(),
        ),
        section(
            "upstream",
            UpstreamConfig::DECLARED_IN,
            UpstreamConfig::keys(),
        ),
        section("relay", RelayConfig::DECLARED_IN, RelayConfig::keys()),
        section("log", LogConfig::DECLARED_IN, LogConfig::keys()),
    ]
}

/// The doc comment's lines as written, without the space `///` leaves before each.
fn doc_lines(key: &KeyDoc) -> impl Iterator<Item = &'static str> {
    key.doc
        .iter()
        .map(|line| line.strip_prefix(' ').unwrap_or(line).trim_end())
}

/// The meaning as docs/configuration.md's Meaning cell writes it: the doc comment's markdown on one line.
pub fn markdown_meaning(key: &KeyDoc) -> String {
    normalise(&doc_lines(key).collect::<Vec<_>>().join("\n"))
}

/// The meaning as `sidecar.toml`'s comment writes it, line by line without `# `: the doc comment's lines, each link
/// shown as its label.
pub fn comment_lines(key: &KeyDoc) -> Vec<String> {
    let text = doc_lines(key).collect::<Vec<_>>().join("\n");
    link_labels(&text).lines().map(str::to_string).collect()
}

/// `text` with each markdown link `[label](target)` written as its label alone.
pub fn link_labels(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        // A label holds no bracket, and its target follows at once and holds no space.
        let link = after.find(']').and_then(|close| {
            let label = &after[..close];
            let target = after[close + 1..].strip_prefix('(')?;
            let end = target.find(')')?;
            let plain = !label.contains('[') && !target[..end].contains(char::is_whitespace);
            plain.then_some((label, close + 2 + end + 1))
        });
        shown.push_str(&rest[..open]);
        match link {
            Some((label, length)) => {
                shown.push_str(label);
                rest = &after[length..];
            }
            None => {
                shown.push('[');
                rest = after;
            }
        }
    }
    shown.push_str(rest);
    shown
}

/// `text` with every run of whitespace, line breaks included, as one space: what the files' wrapping leaves alone.
pub fn normalise(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Where `found` first departs from `expected`, word by word (line breaks and runs of spaces do not count): the
/// words around that place in each, or `None` when they are the same.
pub fn first_difference(expected: &str, found: &str) -> Option<(String, String)> {
    let expected: Vec<&str> = expected.split_whitespace().collect();
    let found: Vec<&str> = found.split_whitespace().collect();
    if expected == found {
        return None;
    }
    let at = expected
        .iter()
        .zip(&found)
        .take_while(|(a, b)| a == b)
        .count();
    let excerpt = |words: &[&str]| {
        let start = at.saturating_sub(6);
        let end = (at + 10).min(words.len());
        let mut text = words[start..end].join(" ");
        if start > 0 {
            text.insert_str(0, "… ");
        }
        if end < words.len() {
            text.push_str(" …");
        }
        if start == end {
            text.push_str("(nothing)");
        }
        text
    };
    Some((excerpt(&expected), excerpt(&found)))
}

/// Every way `sidecar.toml` (`toml`) and docs/configuration.md (`markdown`) do not say what `declared` says, one
/// problem per key and file, each naming its key; empty when both are in step.
pub fn check(declared: &[Declared], toml: &str, markdown: &str) -> Vec<String> {
    let mut problems = Vec::new();
    for section in declared {
        for key in &section.keys {
            if markdown_meaning(key).contains('|') {
                problems.push(format!(
                    "[{}] {}: the doc comment in {} holds a '|', which would split its row in {MARKDOWN_PATH}",
                    section.name, key.name, section.file
                ));
            }
        }
    }
    let toml_found = sidecar_toml::meanings(toml);
    compare(
        declared,
        TOML_PATH,
        &toml_found,
        toml_meaning,
        &mut problems,
    );
    let markdown_found = markdown::meanings(markdown);
    compare(
        declared,
        MARKDOWN_PATH,
        &markdown_found,
        markdown_meaning,
        &mut problems,
    );
    problems
}

fn toml_meaning(key: &KeyDoc) -> String {
    normalise(&comment_lines(key).join("\n"))
}

/// A key's meaning as one file writes it: section, key and text.
type Found = Vec<(String, String, String)>;

fn compare(
    declared: &[Declared],
    path: &str,
    found: &Found,
    expected: fn(&KeyDoc) -> String,
    problems: &mut Vec<String>,
) {
    let find = |section: &str, key: &str| {
        found
            .iter()
            .find(|(s, k, _)| s == section && k == key)
            .map(|(_, _, text)| text)
    };
    for section in declared {
        for key in &section.keys {
            let (name, file) = (section.name, section.file);
            let Some(text) = find(name, key.name) else {
                problems.push(format!(
                    "[{name}] {}: missing from {path} (declared in {file})",
                    key.name
                ));
                continue;
            };
            if let Some((said, written)) = first_difference(&expected(key), text) {
                problems.push(format!(
                    "[{name}] {}: {path} does not say what its doc comment in {file} says:\n    \
                     doc comment: {said}\n    {path}: {written}",
                    key.name
                ));
            }
        }
    }
    for (section, key, _) in found {
        let known = declared
            .iter()
            .any(|d| d.name == section && d.keys.iter().any(|k| k.name == key));
        if !known {
            problems.push(format!(
                "[{section}] {key}: in {path}, but no section declares it"
            ));
        }
    }
}

/// What [`check`] found, as one message that ends with the command that fixes it.
pub fn report(problems: &[String]) -> String {
    format!(
        "{} key meaning(s) of {TOML_PATH} or {MARKDOWN_PATH} differ from their declarations (the doc comment of \
         each key in its `keys::section!`):\n{}\nEdit the doc comment if the meaning should change, then rewrite \
         both files from the declarations with `{REWRITE}`.",
        problems.len(),
        problems.join("\n")
    )
}

/// `sidecar.toml` (`toml`) and docs/configuration.md (`markdown`) saying what `declared` says: each key's meaning
/// written anew, a key missing added after the key declared before it with its value in `defaults` (the effective
/// config with nothing set), and a key no section declares removed. The rest of each file is kept as it is.
pub fn rewrite(
    declared: &[Declared],
    toml: &str,
    markdown: &str,
    defaults: &toml::Table,
) -> (String, String) {
    (
        sidecar_toml::rewrite(declared, toml, defaults),
        markdown::rewrite(declared, markdown, defaults),
    )
}

/// The value of `section.key` in `defaults`, as written in TOML.
fn default_of(defaults: &toml::Table, section: &str, key: &str) -> String {
    defaults
        .get(section)
        .and_then(|s| s.get(key))
        .map_or_else(|| "\"\"".to_string(), |value| value.to_string())
}

/// A file's lines with some replaced and some added: what both rewrites produce.
struct Edit<'a> {
    lines: Vec<&'a str>,
    /// Line index → what stands there instead (nothing: the line is removed).
    replaced: std::collections::BTreeMap<usize, Vec<String>>,
    /// Line index → what follows it.
    added: std::collections::BTreeMap<usize, Vec<String>>,
    appended: Vec<String>,
}

impl<'a> Edit<'a> {
    fn new(text: &'a str) -> Self {
        Self {
            lines: text.lines().collect(),
            replaced: Default::default(),
            added: Default::default(),
            appended: Vec::new(),
        }
    }

    fn replace(&mut self, lines: std::ops::Range<usize>, with: Vec<String>) {
        for line in lines.clone() {
            self.replaced.insert(line, Vec::new());
        }
        if let Some(first) = self.replaced.get_mut(&lines.start) {
            *first = with;
        }
    }

    fn add_after(&mut self, line: usize, lines: Vec<String>) {
        self.added.entry(line).or_default().extend(lines);
    }

    fn finish(self) -> String {
        let mut text = String::new();
        let mut push = |line: &str| {
            text.push_str(line);
            text.push('\n');
        };
        for (i, line) in self.lines.iter().enumerate() {
            match self.replaced.get(&i) {
                Some(with) => with.iter().for_each(|l| push(l)),
                None => push(line),
            }
            if let Some(added) = self.added.get(&i) {
                added.iter().for_each(|l| push(l));
            }
        }
        self.appended.iter().for_each(|l| push(l));
        text
    }
}

#[cfg(test)]
mod tests;
