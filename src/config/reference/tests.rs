use super::*;
use crate::config::RawConfig;

#[test]
fn rewrapped_lines_are_the_same_meaning_and_a_changed_word_is_not() {
    let declared =
        "A peer from which nothing arrived for this long\nis dropped, as seen at the next ping.";
    let rewrapped = "  A peer from which nothing\narrived   for this long is dropped, as seen at the next ping. ";
    assert_eq!(first_difference(declared, rewrapped), None);
    assert_eq!(normalise(declared), normalise(rewrapped));

    let changed =
        "A peer from which nothing arrived for this long is closed, as seen at the next ping.";
    let (said, written) = first_difference(declared, changed).unwrap();
    assert!(said.contains("is dropped,"), "{said}");
    assert!(written.contains("is closed,"), "{written}");
    // Around the first word that differs, not the whole text.
    assert!(said.starts_with("… "), "{said}");

    let cut = "A peer from which nothing arrived";
    let (said, written) = first_difference(declared, cut).unwrap();
    assert!(said.contains("for this long"), "{said}");
    assert_eq!(written, "A peer from which nothing arrived");
    assert_eq!(
        first_difference("", "anything"),
        Some(("(nothing)".to_string(), "anything".to_string()))
    );
}

#[test]
fn links_show_as_their_labels_and_brackets_stay() {
    assert_eq!(
        link_labels(
            "the shard's row ([docs/protocol.md, \"Discovery\"](protocol.md#discovery)); more"
        ),
        "the shard's row (docs/protocol.md, \"Discovery\"); more"
    );
    assert_eq!(
        link_labels("a label [across\nlines](a.md#x) and [] = everyone, e.g. allow = [\"::1\"]"),
        "a label across\nlines and [] = everyone, e.g. allow = [\"::1\"]"
    );
    assert_eq!(link_labels("[a [b](c.md) d](e)"), "[a b d](e)");
    assert_eq!(link_labels("[not](a link) [x]"), "[not](a link) [x]");
}

/// Every key the sections read is declared with a meaning, and nothing else is.
#[test]
fn the_declared_keys_are_the_keys_read() {
    let effective = RawConfig::default().effective();
    let declared = declared();
    let names = |d: &[Declared]| d.iter().map(|s| s.name.to_string()).collect::<Vec<_>>();
    let mut sections = names(&declared);
    sections.sort();
    assert_eq!(sections, effective.keys().cloned().collect::<Vec<_>>());
    for section in &declared {
        let mut keys: Vec<&str> = section.keys.iter().map(|k| k.name).collect();
        keys.sort_unstable();
        let read: Vec<&str> = effective[section.name]
            .as_table()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, read, "[{}] in {}", section.name, section.file);
        assert!(
            section.file.ends_with(".rs") && section.file.starts_with("src/"),
            "{}",
            section.file
        );
        for key in &section.keys {
            assert!(
                !markdown_meaning(key).is_empty(),
                "[{}] {}",
                section.name,
                key.name
            );
        }
    }
}

const DOC_X: &[&str] = &[" One key, see [docs/a.md, \"A\"](a.md#a), and", "   more."];
const DOC_Y: &[&str] = &[" Another."];

fn example() -> Vec<Declared> {
    vec![Declared {
        name: "s",
        file: "src/s.rs",
        keys: vec![
            KeyDoc {
                name: "x",
                doc: DOC_X,
            },
            KeyDoc {
                name: "y",
                doc: DOC_Y,
            },
        ],
    }]
}

const TOML: &str = "# Header.\n\n[s]\n# One key, see docs/a.md, \"A\", and\n#   more.\nx = 1\n# Another.\ny = [\n  \"a\",\n]\n";
const MARKDOWN: &str =
    "# Reference\n\nProse.\n\n### [s]\n\n| Key | Default | Meaning |\n|---|---|---|\n\
                        | `x` | `1` | One key, see [docs/a.md, \"A\"](a.md#a), and more. |\n\
                        | `y` | `[]` | Another. |\n\nMore prose.\n";

fn defaults() -> toml::Table {
    "[s]\nx = 1\ny = [\"a\"]\n".parse().unwrap()
}

#[test]
fn files_in_step_pass_and_are_rewritten_as_they_are() {
    assert_eq!(check(&example(), TOML, MARKDOWN), Vec::<String>::new());
    let (toml, markdown) = rewrite(&example(), TOML, MARKDOWN, &defaults());
    assert_eq!(toml, TOML);
    assert_eq!(markdown, MARKDOWN);
    // Wrapped otherwise by hand: still in step.
    let rewrapped = TOML.replace("and\n#   more.", "and more.");
    assert_eq!(
        check(&example(), &rewrapped, MARKDOWN),
        Vec::<String>::new()
    );
}

#[test]
fn a_changed_word_a_missing_key_and_a_stray_key_are_named_and_rewritten() {
    let cases = [
        (
            TOML.replace("#   more.", "#   less."),
            MARKDOWN.to_string(),
            "[s] x: sidecar.toml does not say",
        ),
        (
            TOML.to_string(),
            MARKDOWN.replace("Another.", "Other."),
            "[s] y: docs/configuration.md does not say",
        ),
        (
            TOML.replace("# Another.\ny = [\n  \"a\",\n]\n", ""),
            MARKDOWN.to_string(),
            "[s] y: missing from sidecar.toml",
        ),
        (
            TOML.to_string(),
            MARKDOWN.replace(
                "| `x` | `1` | One key, see [docs/a.md, \"A\"](a.md#a), and more. |\n",
                "",
            ),
            "[s] x: missing from docs/configuration.md",
        ),
        (
            TOML.replace("x = 1\n", "x = 1\n# Gone.\nz = 2\n"),
            MARKDOWN.to_string(),
            "[s] z: in sidecar.toml, but no section declares it",
        ),
        (
            TOML.to_string(),
            MARKDOWN.replace("|---|---|---|\n", "|---|---|---|\n| `z` | `2` | Gone. |\n"),
            "[s] z: in docs/configuration.md, but no section declares it",
        ),
    ];
    for (toml, markdown, expected) in cases {
        let problems = check(&example(), &toml, &markdown);
        assert_eq!(problems.len(), 1, "{problems:#?}");
        assert!(problems[0].starts_with(expected), "{problems:#?}");
        assert!(report(&problems).contains(REWRITE));
        let (toml, markdown) = rewrite(&example(), &toml, &markdown, &defaults());
        assert_eq!(
            check(&example(), &toml, &markdown),
            Vec::<String>::new(),
            "{toml}\n{markdown}"
        );
    }
    // A missing key comes back after the key declared before it, at its default.
    let toml = TOML.replace("# Another.\ny = [\n  \"a\",\n]\n", "");
    let (toml, _) = rewrite(&example(), &toml, MARKDOWN, &defaults());
    assert!(toml.ends_with("x = 1\n# Another.\ny = [\"a\"]\n"), "{toml}");
}

#[test]
fn a_missing_section_is_added_with_its_keys() {
    let (toml, markdown) = rewrite(&example(), "# Header.\n", "# Reference\n", &defaults());
    assert_eq!(check(&example(), &toml, &markdown), Vec::<String>::new());
    assert!(toml.starts_with("# Header.\n\n[s]\n# One key"), "{toml}");
    assert!(
        markdown.contains("### [s]\n\n| Key | Default | Meaning |\n|---|---|---|\n| `x` | `1` |"),
        "{markdown}"
    );
}

#[test]
fn a_meaning_with_a_pipe_is_refused() {
    let mut declared = example();
    declared[0].keys[1].doc = &[" a | b"];
    let problems = check(&declared, TOML, MARKDOWN);
    assert!(
        problems.iter().any(|p| p.contains("holds a '|'")),
        "{problems:#?}"
    );
}
