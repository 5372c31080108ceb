use std::path::PathBuf;

use super::language::{Language, SUPPORTED};

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
