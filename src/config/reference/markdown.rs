//! docs/configuration.md's key tables: under a heading `### [section]`, rows `| `key` | default | meaning |`.

use super::{default_of, markdown_meaning, Declared, Edit, Found};

/// A row of a key table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Its line, counted from 0.
    pub line: usize,
    pub section: String,
    pub key: String,
    /// Its cells, trimmed: the key in backticks, the default, the meaning.
    pub cells: Vec<String>,
}

/// The section a heading names: `[name]` in any heading; other headings end the section before them.
fn heading(line: &str) -> Option<Option<&str>> {
    let heading = line.strip_prefix('#')?.trim_start_matches('#').trim();
    Some(heading.strip_prefix('[').and_then(|h| h.strip_suffix(']')))
}

/// Every row of a key under a section heading; the header and separator rows name no key in backticks.
pub fn rows(markdown: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    let mut section: Option<&str> = None;
    for (line, text) in markdown.lines().enumerate() {
        if let Some(named) = heading(text) {
            section = named;
            continue;
        }
        let (Some(section), Some(row)) = (section, text.strip_prefix('|')) else {
            continue;
        };
        let cells: Vec<String> = row.split('|').map(|c| c.trim().to_string()).collect();
        let key = cells
            .first()
            .and_then(|c| c.strip_prefix('`'))
            .and_then(|c| c.strip_suffix('`'));
        if let Some(key) = key {
            rows.push(Row {
                line,
                section: section.to_string(),
                key: key.to_string(),
                cells: cells.clone(),
            });
        }
    }
    rows
}

/// Each key's Meaning cell.
pub(super) fn meanings(text: &str) -> Found {
    rows(text)
        .into_iter()
        .map(|row| {
            let meaning = row.cells.get(2).cloned().unwrap_or_default();
            (row.section, row.key, meaning)
        })
        .collect()
}

fn row(key: &str, default: &str, meaning: &str) -> String {
    format!("| {key} | {default} | {meaning} |")
}

/// See [`super::rewrite`].
pub(super) fn rewrite(declared: &[Declared], text: &str, defaults: &toml::Table) -> String {
    let mut edit = Edit::new(text);
    let rows = rows(text);
    let declaration = |section: &str, name: &str| {
        declared
            .iter()
            .filter(|d| d.name == section)
            .flat_map(|d| &d.keys)
            .find(|k| k.name == name)
    };
    for found in &rows {
        let line = found.line..found.line + 1;
        match declaration(&found.section, &found.key) {
            Some(doc) => {
                let default = found.cells.get(1).map_or("", String::as_str);
                let written = row(&found.cells[0], default, &markdown_meaning(doc));
                edit.replace(line, vec![written]);
            }
            None => edit.replace(line, Vec::new()),
        }
    }
    let table_head = ["| Key | Default | Meaning |", "|---|---|---|"];
    for section in declared {
        let heading_line = edit
            .lines
            .iter()
            .position(|line| heading(line) == Some(Some(section.name)));
        // Rows go after the table's separator; a section without a table gets one.
        let separator = heading_line.and_then(|h| {
            edit.lines[h + 1..]
                .iter()
                .take_while(|line| heading(line).is_none())
                .position(|line| line.starts_with("|-") || line.starts_with("| -"))
                .map(|at| h + 1 + at)
        });
        let mut after = separator;
        let mut new_table = Vec::new();
        for doc in &section.keys {
            let present = rows
                .iter()
                .find(|r| r.section == section.name && r.key == doc.name);
            if let Some(found) = present {
                after = Some(found.line);
                continue;
            }
            let default = format!("`{}`", default_of(defaults, section.name, doc.name));
            let written = row(&format!("`{}`", doc.name), &default, &markdown_meaning(doc));
            match after {
                Some(line) => edit.add_after(line, vec![written]),
                None => new_table.push(written),
            }
        }
        if new_table.is_empty() {
            continue;
        }
        let mut table = vec![String::new()];
        table.extend(table_head.map(String::from));
        table.extend(new_table);
        match heading_line {
            Some(line) => edit.add_after(line, table),
            None => {
                edit.appended.push(String::new());
                edit.appended.push(format!("### [{}]", section.name));
                edit.appended.extend(table);
            }
        }
    }
    edit.finish()
}
