//! `sidecar.toml`'s keys and the comments directly above them.

use std::ops::Range;

use super::{comment_lines, default_of, Declared, Edit, Found};

/// A key of the file: its section, its name, its comment's lines and its own lines (a value may span several).
struct Key {
    section: String,
    name: String,
    comment: Range<usize>,
    lines: Range<usize>,
}

/// `[name]` of a section header line.
fn header(line: &str) -> Option<&str> {
    let name = line.trim().strip_prefix('[')?.strip_suffix(']')?;
    (!name.starts_with('[')).then(|| name.trim())
}

/// The key a line sets, as `key = value` does.
fn key_of(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let bare = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    bare.then_some(key)
}

fn keys(lines: &[&str]) -> Vec<Key> {
    let mut keys = Vec::new();
    let mut section: Option<String> = None;
    let mut comment_from: Option<usize> = None;
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.starts_with('#') {
            comment_from.get_or_insert(i);
            i += 1;
            continue;
        }
        let comment = comment_from.take().unwrap_or(i)..i;
        if let Some(name) = header(line) {
            section = Some(name.to_string());
        } else if let (Some(section), Some(name)) = (&section, key_of(line)) {
            // A value ends on the first line that completes it as TOML.
            let end = (i + 1..=lines.len())
                .find(|&end| lines[i..end].join("\n").parse::<toml::Table>().is_ok())
                .unwrap_or(i + 1);
            keys.push(Key {
                section: section.clone(),
                name: name.to_string(),
                comment,
                lines: i..end,
            });
            i = end;
            continue;
        }
        i += 1;
    }
    keys
}

/// Each key's comment, without its `#`s.
pub(super) fn meanings(text: &str) -> Found {
    let lines: Vec<&str> = text.lines().collect();
    keys(&lines)
        .into_iter()
        .map(|key| {
            let comment: Vec<&str> = lines[key.comment]
                .iter()
                .map(|line| line.trim().trim_start_matches('#'))
                .collect();
            (key.section, key.name, comment.join("\n"))
        })
        .collect()
}

fn comment(meaning: Vec<String>) -> impl Iterator<Item = String> {
    meaning.into_iter().map(|line| match line.as_str() {
        "" => "#".to_string(),
        line => format!("# {line}"),
    })
}

/// See [`super::rewrite`].
pub(super) fn rewrite(declared: &[Declared], text: &str, defaults: &toml::Table) -> String {
    let mut edit = Edit::new(text);
    let keys = keys(&edit.lines);
    let declaration = |section: &str, name: &str| {
        declared
            .iter()
            .filter(|d| d.name == section)
            .flat_map(|d| &d.keys)
            .find(|k| k.name == name)
    };
    for key in &keys {
        let whole = key.comment.start..key.lines.end;
        match declaration(&key.section, &key.name) {
            Some(doc) => {
                let own = edit.lines[key.lines.clone()].iter().map(|l| l.to_string());
                edit.replace(whole, comment(comment_lines(doc)).chain(own).collect());
            }
            None => edit.replace(whole, Vec::new()),
        }
    }
    for section in declared {
        let header_line = edit
            .lines
            .iter()
            .position(|line| header(line) == Some(section.name));
        let mut after = header_line;
        let mut appended = Vec::new();
        for doc in &section.keys {
            let present = keys
                .iter()
                .find(|k| k.section == section.name && k.name == doc.name);
            if let Some(key) = present {
                after = Some(key.lines.end - 1);
                continue;
            }
            let value = default_of(defaults, section.name, doc.name);
            let lines = comment(comment_lines(doc)).chain([format!("{} = {value}", doc.name)]);
            match after {
                Some(line) => edit.add_after(line, lines.collect()),
                None => appended.extend(lines),
            }
        }
        if !appended.is_empty() {
            edit.appended.push(String::new());
            edit.appended.push(format!("[{}]", section.name));
            edit.appended.extend(appended);
        }
    }
    edit.finish()
}
