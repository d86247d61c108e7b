//! The configuration reference (docs/configuration.md) against the configuration file it describes (sidecar.toml)
//! and the keys' declarations: every key of sidecar.toml is documented with the same default, every documented key
//! is in sidecar.toml, and both say what each key's doc comment says (`config::reference`).

use std::collections::BTreeMap;
use std::path::Path;

use litestream_sidecar::config::reference;
use litestream_sidecar::config::RawConfig;

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

/// The key tables of docs/configuration.md (`reference::rows`): under a heading `### [section]`, rows
/// `| `key` | default | meaning |`. A required key's default cell reads "none, required …" and ends with
/// sidecar.toml's example value, after "example: " in backticks; that is the value compared.
fn documented_keys(markdown: &str) -> Result<Documented, String> {
    let mut keys = Documented::new();
    for row in reference::rows(markdown) {
        let at = format!("docs/configuration.md:{}", row.line + 1);
        let (section, key) = (row.section, row.key);
        let default = row
            .cells
            .get(1)
            .and_then(|cell| {
                first_code_span(
                    cell.split_once("example: ")
                        .map_or(cell.as_str(), |(_, example)| example),
                )
            })
            .ok_or_else(|| format!("{at}: `{key}` has no default in backticks"))?;
        let value = toml_value(default).map_err(|e| format!("{at}: `{key}`: {e}"))?;
        if keys.insert((section.clone(), key.clone()), value).is_some() {
            return Err(format!("{at}: [{section}] {key} is documented twice"));
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

/// Both files say what each key's doc comment says (`cargo run --example config_reference -- --check`, which
/// `make lint` runs, checks the same).
#[test]
fn every_meaning_is_its_declaration() {
    let problems = reference::check(
        &reference::declared(),
        &read(reference::TOML_PATH),
        &read(reference::MARKDOWN_PATH),
    );
    assert!(problems.is_empty(), "{}", reference::report(&problems));
}

/// The committed files, with one thing broken at a time: each break is named with its key and file, and rewriting
/// mends it.
#[test]
fn a_meaning_changed_or_a_key_left_out_in_either_file_is_named() {
    let declared = reference::declared();
    let (toml, markdown) = (read("sidecar.toml"), read("docs/configuration.md"));
    let edited = |text: &str, from: &str, to: &str| {
        assert!(text.contains(from), "{from:?} is no longer in the file");
        text.replacen(from, to, 1)
    };
    let interval_row = "| `interval` | `\"5s\"` | How often the address table is read. |\n";
    let cases = [
        (
            edited(
                &toml,
                "# How long shutdown waits",
                "# How long a shutdown waits",
            ),
            markdown.clone(),
            "[server] shutdown_grace: sidecar.toml does not say",
        ),
        (
            toml.clone(),
            edited(
                &markdown,
                "Rows deleted per statement",
                "Rows removed per statement",
            ),
            "[cleanup] batch_rows: docs/configuration.md does not say",
        ),
        (
            edited(
                &toml,
                "# How often the address table is read.\ninterval = \"5s\"\n",
                "",
            ),
            markdown.clone(),
            "[discovery] interval: missing from sidecar.toml",
        ),
        (
            toml.clone(),
            edited(&markdown, interval_row, ""),
            "[discovery] interval: missing from docs/configuration.md",
        ),
        (
            edited(&toml, "[log]\n", "[log]\n# Not read.\nlevel = \"info\"\n"),
            markdown.clone(),
            "[log] level: in sidecar.toml, but no section declares it",
        ),
    ];
    let defaults = RawConfig::default().effective();
    let (in_step_toml, in_step_markdown) =
        reference::rewrite(&declared, &toml, &markdown, &defaults);
    for (broken_toml, broken_markdown, expected) in cases {
        let problems = reference::check(&declared, &broken_toml, &broken_markdown);
        assert_eq!(problems.len(), 1, "{}", reference::report(&problems));
        assert!(problems[0].starts_with(expected), "{}", problems[0]);
        let report = reference::report(&problems);
        assert!(report.contains(reference::REWRITE), "{report}");
        let (mended_toml, mended_markdown) =
            reference::rewrite(&declared, &broken_toml, &broken_markdown, &defaults);
        assert_eq!(mended_toml, in_step_toml, "{expected}");
        assert_eq!(mended_markdown, in_step_markdown, "{expected}");
    }
    // Wrapped anew by hand, a comment still says the same.
    let rewrapped = edited(
        &toml,
        "# A subscriber that disconnected still holds cleanup back at its last acknowledged watermark for this long\n# (Zero's",
        "# A subscriber that disconnected still holds cleanup back\n#    at its last acknowledged watermark for this long (Zero's",
    );
    assert_eq!(
        reference::check(&declared, &rewrapped, &markdown),
        Vec::<String>::new()
    );
}
