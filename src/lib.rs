//! onebit-tts: NeuTTS-air speech synthesis on ONNX Runtime.
//!
//! Data flow, one module per stage: [`text`] (normalise, phonemise) -> [`prompt`] (token ids) ->
//! [`engine`] (backbone, speech codes) -> [`codec`] (NeuCodec, samples) -> [`audio`] (formats).
//! [`package`] loads and validates model packages, [`voice`] holds reference voices, and
//! [`synth::Synthesizer`] is the one path from text to audio that the CLI, server and benchmark use.

pub mod audio;
pub mod bench;
pub mod codec;
pub mod engine;
pub mod metrics;
pub mod native;
pub mod npu;
pub mod package;
pub mod paths;
pub mod prompt;
pub mod runtime;
pub mod server;
pub mod synth;
#[cfg(test)]
pub(crate) mod testutil;
pub mod text;
pub mod voice;

pub use synth::{SpeechRequest, SynthConfig, SynthError, Synthesizer};

/// Errors of any stage, for callers that do not care which.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error(transparent)]
    Package(#[from] package::PackageError),
    #[error(transparent)]
    Engine(#[from] engine::EngineError),
    #[error(transparent)]
    Codec(#[from] codec::CodecError),
    #[error(transparent)]
    Voice(#[from] voice::VoiceError),
    #[error(transparent)]
    Text(#[from] text::TextError),
    #[error(transparent)]
    Prompt(#[from] prompt::PromptError),
    #[error(transparent)]
    Audio(#[from] audio::AudioError),
    #[error("cannot read the lexicon {}: {source}", path.display())]
    LexiconRead {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("lexicon {}: {source}", path.display())]
    Lexicon {
        path: std::path::PathBuf,
        #[source]
        source: text::markup::LexiconError,
    },
}
