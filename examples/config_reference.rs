//! Keeps `sidecar.toml` and docs/configuration.md saying what each config key's doc comment says
//! (`litestream_sidecar::config::reference`).
//!
//! `--check` lists every key whose meaning differs in either file, or is missing from it, and exits 1 (`make lint`
//! runs it); `--write` rewrites both files from the doc comments: each meaning anew, a missing key added at its
//! default, a key no section declares removed, everything else kept.

use std::path::Path;
use std::process::ExitCode;

use litestream_sidecar::config::reference::{self, MARKDOWN_PATH, TOML_PATH};
use litestream_sidecar::config::RawConfig;

fn main() -> ExitCode {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| {
        std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let (toml, markdown) = (read(TOML_PATH), read(MARKDOWN_PATH));
    let declared = reference::declared();
    match std::env::args().nth(1).as_deref() {
        Some("--check") => {
            let problems = reference::check(&declared, &toml, &markdown);
            if problems.is_empty() {
                return ExitCode::SUCCESS;
            }
            eprintln!("{}", reference::report(&problems));
            ExitCode::FAILURE
        }
        Some("--write") => {
            let defaults = RawConfig::default().effective();
            let (new_toml, new_markdown) =
                reference::rewrite(&declared, &toml, &markdown, &defaults);
            for (path, old, new) in [
                (TOML_PATH, toml, new_toml),
                (MARKDOWN_PATH, markdown, new_markdown),
            ] {
                if old != new {
                    std::fs::write(root.join(path), new).unwrap_or_else(|e| panic!("{path}: {e}"));
                    println!("rewrote {path}");
                }
            }
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: cargo run --example config_reference -- --check | --write");
            ExitCode::from(2)
        }
    }
}
