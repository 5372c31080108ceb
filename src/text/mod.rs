//! Text front end: normalisation, sentence splitting and espeak-ng phonemes.
//!
//! The phoneme path reproduces what NeuTTS (neutts 1.4.1) feeds its model byte for byte:
//! phonemizer 3.4.0's `EspeakBackend(lang, preserve_punctuation=True, with_stress=True,
//! words_mismatch='ignore', language_switch='remove-flags')` over espeak-ng 1.52, then the
//! vendor's whitespace folding (and "-" removal for French). The one deliberate difference:
//! phonemizer drops the rest of a sentence after a "." glued to the next character
//! ("12.5", "v2.0.1"); here the whole sentence is phonemized.

mod error;
mod espeak;
mod language;
mod normalize;
mod phonemizer;
mod punctuation;
mod py;
mod split;
#[cfg(test)]
mod testutil;

pub use error::TextError;
pub use language::Language;
pub use normalize::{normalize, normalize_bpe};
pub use phonemizer::Phonemizer;
pub use split::{split_clauses, split_sentences};
