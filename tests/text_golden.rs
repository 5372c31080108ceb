//! Parity with the vendor's phonemes (../shared/golden/phonemes.json, `phones_bundled_espeak`).
//!
//! Where the vendor's output stops early (phonemizer cuts the sentence at a "." glued to the next
//! character and the vendor keeps the first piece) ours must equal it up to the cut and then go
//! on to cover the rest of the sentence.

use std::env;
use std::io::Write;
use std::path::PathBuf;

use onebit_tts::text::{Language, Phonemizer, normalize};

const TEST: &str = "golden parity";

fn say(line: &str) {
    // Straight to stderr: libtest captures print!/eprint!, and a skip must be visible.
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn in_ci() -> bool {
    env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

fn shared_dir() -> Option<PathBuf> {
    if let Some(dir) = env::var_os("ONEBIT_SHARED").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        return dir.join("golden/phonemes.json").is_file().then_some(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|a| a.join("shared"))
        .find(|s| s.join("golden/phonemes.json").is_file())
}

/// The 1.52 parity build, or `None` after a skip; under CI a missing one fails the test.
fn parity_phonemizer() -> Option<Phonemizer> {
    let why = match Phonemizer::discover() {
        Ok(p) if p.version().starts_with("1.52") => return Some(p),
        Ok(p) => format!(
            "espeak-ng {} at {} is not the 1.52 parity build",
            p.version(),
            p.library().display()
        ),
        Err(e) => e.to_string(),
    };
    if in_ci() {
        panic!("{TEST}: the goldens are present but espeak-ng 1.52 is not: {why}");
    }
    say(&format!("skipped: {TEST} (espeak-ng 1.52 absent: {why})"));
    None
}

fn strip_stress(s: &str) -> String {
    s.chars()
        .filter(|c| !matches!(c, 'ˈ' | 'ˌ' | ' '))
        .collect()
}

/// The text after the first "." glued to a following non-space character, if any.
fn after_glued_dot(text: &str) -> Option<&str> {
    let ((i, _), _) = text
        .char_indices()
        .zip(text.chars().skip(1))
        .find(|((_, c), next)| *c == '.' && !next.is_whitespace())?;
    Some(&text[i + 1..])
}

/// Checks the "do better" path; returns why it failed.
fn check_do_better(
    p: &Phonemizer,
    text: &str,
    lang: Language,
    ours: &str,
    golden: &str,
) -> Result<(), String> {
    let rest = after_glued_dot(text).ok_or("differs and has no glued \".\"")?;
    // The vendor re-attaches the sentence's final mark to the truncated piece.
    let cut = golden.trim_end_matches(['.', '!', '?', '…', '"', ')', ' ']);
    if !ours.starts_with(cut) || !ours[cut.len()..].starts_with(' ') {
        return Err(format!(
            "does not start with the golden up to the cut {cut:?}"
        ));
    }
    let flat = strip_stress(ours);
    for word in rest
        .split(|c: char| !c.is_alphabetic())
        .filter(|w| w.chars().count() >= 3)
    {
        let alone = p.phonemize(word, lang).map_err(|e| e.to_string())?;
        if !flat.contains(&strip_stress(&alone)) {
            return Err(format!("word {word:?} ({alone}) not covered"));
        }
    }
    let last = text
        .trim_end()
        .chars()
        .last()
        .filter(|c| ".!?".contains(*c));
    if let Some(last) = last.filter(|&c| !ours.ends_with(c)) {
        return Err(format!("does not end with the sentence's {last:?}"));
    }
    Ok(())
}

#[test]
fn golden_parity() {
    let Some(shared) = shared_dir() else {
        say(&format!("skipped: {TEST} (../shared absent)"));
        return;
    };
    let Some(p) = parity_phonemizer() else {
        return;
    };
    let raw = std::fs::read_to_string(shared.join("golden/phonemes.json")).expect("read goldens");
    let doc: serde_json::Value = serde_json::from_str(&raw).expect("parse goldens");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(!cases.is_empty(), "no golden cases");

    let (mut exact, mut better, mut failed) = (0, Vec::new(), Vec::new());
    for case in cases {
        let text = case["text"].as_str().expect("text");
        let code = case["lang"].as_str().expect("lang");
        let golden = case["phones_bundled_espeak"]
            .as_str()
            .expect("phones_bundled_espeak");
        let lang: Language = code.parse().expect("golden language");
        let ours = p.phonemize(text, lang).expect("phonemize");
        // The service phonemizes normalised text; for these clean inputs it must not matter.
        let normalized = normalize(text).expect("normalize");
        let ours_normalized = p
            .phonemize(&normalized, lang)
            .expect("phonemize normalised");
        if ours_normalized != ours {
            failed.push(format!("[{code}] {text:?}: normalising changed the phonemes\n  raw  {ours}\n  norm {ours_normalized}"));
            continue;
        }
        if ours == golden {
            exact += 1;
            continue;
        }
        match check_do_better(&p, text, lang, &ours, golden) {
            Ok(()) => better.push(format!(
                "[{code}] {text:?}\n    golden {golden}\n    ours   {ours}"
            )),
            Err(why) => failed.push(format!(
                "[{code}] {text:?}: {why}\n  ours   {ours}\n  golden {golden}"
            )),
        }
    }
    say(&format!(
        "{TEST}: {} cases, {exact} identical, {} complete where the vendor truncates, {} failed (espeak-ng {})",
        cases.len(),
        better.len(),
        failed.len(),
        p.version()
    ));
    for b in &better {
        say(&format!("  do-better {b}"));
    }
    assert!(
        failed.is_empty(),
        "{} golden cases failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
}
