//! The configuration reference (docs/configuration.md) against the configuration file it describes (sidecar.toml):
//! every key of sidecar.toml is documented with the same default, and every documented key is in sidecar.toml.

use std::collections::BTreeMap;
use std::path::Path;

/// A documented key: its section, name, and the default cell's first `code` span as a TOML value.
type Documented = BTreeMap<(String, String), toml::Value>;

fn read(path: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The first span between backticks in `cell`.
fn first_code_span(cell: &str) -> Option<&str> {
    let (_, rest) = cell.split_once('`')?;
    let (code, _) = rest.split_once('`')?;
    Some(code)
}

/// Reads a TOML value written alone, as `"10s"`, `1024`, `true` or `[]`.
fn toml_value(text: &str) -> Result<toml::Value, String> {
    let table: toml::Table = format!("v = {text}")
        .parse()
        .map_err(|e| format!("{text:?} is no TOML value: {e}"))?;
    Ok(table["v"].clone())
}

/// The key tables of docs/configuration.md: under a heading `### [section]`, rows `| `key` | default | meaning |`.
/// A required key's default cell reads "none, required …" and ends with sidecar.toml's example value, after
/// "example: " in backticks; that is the value compared.
fn documented_keys(markdown: &str) -> Result<Documented, String> {
    let mut keys = Documented::new();
    let mut section: Option<String> = None;
    for (number, line) in markdown.lines().enumerate() {
        let at = || format!("docs/configuration.md:{}", number + 1);
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#').trim();
            section = heading
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .map(str::to_string);
            continue;
        }
        let Some(section) = &section else { continue };
        let Some(row) = line.strip_prefix('|') else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(key) = cells
            .first()
            .and_then(|c| c.strip_prefix('`'))
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue; // The header and separator rows.
        };
        let default = cells
            .get(1)
            .and_then(|cell| {
                first_code_span(
                    cell.split_once("example: ")
                        .map_or(*cell, |(_, example)| example),
                )
            })
            .ok_or_else(|| format!("{}: `{key}` has no default in backticks", at()))?;
        let value = toml_value(default).map_err(|e| format!("{}: `{key}`: {e}", at()))?;
        if keys
            .insert((section.clone(), key.to_string()), value)
            .is_some()
        {
            return Err(format!("{}: [{section}] {key} is documented twice", at()));
        }
    }
    Ok(keys)
}

#[test]
fn configuration_reference_matches_sidecar_toml() {
    let file: toml::Table = read("sidecar.toml").parse().expect("sidecar.toml parses");
    let documented = documented_keys(&read("docs/configuration.md")).unwrap();
    assert!(
        documented.len() > 50,
        "docs/configuration.md documents only {} keys: are its tables still `### [section]` then `| `key` | default | meaning |`?",
        documented.len()
    );

    let mut problems = Vec::new();
    let mut in_file = std::collections::BTreeSet::new();
    for (section, keys) in &file {
        let toml::Value::Table(keys) = keys else {
            problems.push(format!("sidecar.toml: {section} is not a section"));
            continue;
        };
        for (key, value) in keys {
            in_file.insert((section.clone(), key.clone()));
            match documented.get(&(section.clone(), key.clone())) {
                None => problems.push(format!(
                    "[{section}] {key} is in sidecar.toml but not in docs/configuration.md"
                )),
                Some(doc) if doc != value => problems.push(format!(
                    "[{section}] {key}: sidecar.toml has {value}, docs/configuration.md says {doc}"
                )),
                Some(_) => {}
            }
        }
    }
    for (section, key) in documented.keys() {
        if !in_file.contains(&(section.clone(), key.clone())) {
            problems.push(format!(
                "[{section}] {key} is in docs/configuration.md but not in sidecar.toml"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_reference_reader_finds_what_it_should() {
    let markdown = "### [a]\n\n| Key | Default | Meaning |\n|---|---|---|\n\
                    | `x` | `\"10s\"` | a duration |\n| `y` | none, required unless `x` is set (example: `[]`) | a list |\n\
                    ## Elsewhere\n| `z` | `1` | outside any section |\n";
    let keys = documented_keys(markdown).unwrap();
    assert_eq!(
        keys.keys().cloned().collect::<Vec<_>>(),
        [("a".into(), "x".into()), ("a".into(), "y".into())]
    );
    assert_eq!(
        keys[&("a".into(), "x".into())],
        toml_value("\"10s\"").unwrap()
    );
    assert_eq!(keys[&("a".into(), "y".into())], toml_value("[]").unwrap());
    assert!(documented_keys("### [a]\n| `x` | 10s | no backticks |\n").is_err());
    assert!(documented_keys("### [a]\n| `x` | `1` | |\n| `x` | `1` | |\n").is_err());
}
