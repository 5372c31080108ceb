//! Text front end: normalisation, sentence splitting and espeak-ng phonemes.
//!
//! The phoneme path reproduces what NeuTTS (neutts 1.4.1) feeds its model byte for byte:
//! phonemizer 3.4.0's `EspeakBackend(lang, preserve_punctuation=True, with_stress=True,
//! words_mismatch='ignore', language_switch='remove-flags')` over espeak-ng 1.52, then the
//! vendor's whitespace folding (and "-" removal for French). The one deliberate difference:
//! phonemizer drops the rest of a sentence after a "." glued to the next character
//! ("12.5", "v2.0.1"); here the whole sentence is phonemized.
//!
//! The stage's error, [`TextError`], is defined here at its root so the parts (languages, the
//! espeak-ng binding, normalisation) report through it without depending on one another.

mod espeak;
mod language;
pub mod markup;
mod normalize;
mod phonemizer;
mod punctuation;
mod py;
mod split;
#[cfg(test)]
mod testutil;
mod tn;

pub use language::Language;
pub use normalize::{normalize, normalize_bpe};
pub use phonemizer::Phonemizer;
pub use split::{SentenceStream, split_clauses, split_sentences};
pub use tn::{GRAMMARS, Normalized, Normalizer, TnError};

use std::path::PathBuf;

use language::SUPPORTED;

/// Errors of the text front end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    #[error("unsupported language \"{0}\"; supported: {SUPPORTED}")]
    UnsupportedLanguage(String),

    #[error("nothing speakable: the text has no letter or digit")]
    NothingSpeakable,

    #[error(
        "espeak-ng library not found; tried: {}. Run `scripts/setup.sh` (it installs espeak-ng \
         1.52 from the neutts wheel into .onebit/neutts), or set ONEBIT_ESPEAK_LIB",
        tried.join("; ")
    )]
    EspeakNotFound { tried: Vec<String> },

    /// A failure to load espeak-ng seen earlier in this process, reported again.
    #[error("{0}")]
    Unavailable(String),

    #[error("cannot load the espeak-ng library {lib}: {}", chain(source))]
    EspeakLoad {
        lib: String,
        #[source]
        source: libloading::Error,
    },

    #[error("espeak-ng data directory {} is not usable: {reason}", path.display())]
    EspeakData { path: PathBuf, reason: String },

    #[error("espeak_Initialize failed for {lib} (returned {code})")]
    EspeakInit { lib: String, code: i32 },

    #[error(
        "espeak-ng library {lib} is already initialised with data {current}; a process can only \
         use one data directory per library (asked for {requested})"
    )]
    DataDirConflict {
        lib: String,
        current: String,
        requested: String,
    },

    #[error("espeak-ng has no voice for language {0}")]
    VoiceNotFound(Language),

    #[error("espeak-ng could not select voice {voice} for {language} (error {code})")]
    VoiceSelect {
        language: Language,
        voice: String,
        code: i32,
    },
}

/// libloading's errors say "dlopen failed" and keep the loader's reason in their source.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}
