//! Shared helpers of the unit tests that need espeak-ng or the vendor goldens.

use std::env;
use std::io::Write;
use std::path::PathBuf;

use super::Phonemizer;

/// Printed on the real stderr so the skip shows without `--nocapture`.
pub(crate) fn skip(test: &str, why: &str) {
    let _ = writeln!(std::io::stderr(), "skipped: {test} ({why})");
}

fn in_ci() -> bool {
    env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// `$ONEBIT_SHARED`, else the first `shared/` with goldens beside the crate or an ancestor.
pub(crate) fn shared_dir() -> Option<PathBuf> {
    if let Some(dir) = env::var_os("ONEBIT_SHARED").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return dir.join("golden/phonemes.json").is_file().then_some(dir);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    root.ancestors()
        .map(|a| a.join("shared"))
        .find(|s| s.join("golden/phonemes.json").is_file())
}

/// A phonemizer, or `None` after printing a skip; missing espeak-ng fails the test under CI.
pub(crate) fn phonemizer(test: &str) -> Option<Phonemizer> {
    match Phonemizer::discover() {
        Ok(p) => Some(p),
        Err(e) if in_ci() => panic!("{test}: espeak-ng is required under CI: {e}"),
        Err(e) => {
            skip(test, &format!("espeak-ng absent: {e}"));
            None
        }
    }
}

/// Like [`phonemizer`], but only the 1.52 build the goldens were made with will do.
pub(crate) fn phonemizer_for_goldens(test: &str) -> Option<Phonemizer> {
    let p = phonemizer(test)?;
    if p.version().starts_with("1.52") {
        return Some(p);
    }
    let why = format!(
        "espeak-ng {} is not the 1.52 parity build; run scripts/setup.sh",
        p.version()
    );
    if in_ci() {
        panic!("{test}: {why}");
    }
    skip(test, &why);
    None
}

pub(crate) struct GoldenCase {
    pub lang: String,
    pub text: String,
    pub phones: String,
}

/// The cases of `golden/phonemes.json` with their parity target, or `None` after a skip.
pub(crate) fn golden_cases(test: &str) -> Option<Vec<GoldenCase>> {
    let Some(shared) = shared_dir() else {
        skip(test, "../shared absent");
        return None;
    };
    let raw = std::fs::read_to_string(shared.join("golden/phonemes.json")).expect("read goldens");
    let doc: serde_json::Value = serde_json::from_str(&raw).expect("parse goldens");
    let cases = doc["cases"].as_array().expect("cases array");
    let field = |c: &serde_json::Value, k: &str| {
        c[k].as_str()
            .unwrap_or_else(|| panic!("case without {k}"))
            .to_string()
    };
    Some(
        cases
            .iter()
            .map(|c| GoldenCase {
                lang: field(c, "lang"),
                text: field(c, "text"),
                phones: field(c, "phones_bundled_espeak"),
            })
            .collect(),
    )
}
