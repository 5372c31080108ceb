//! Cloning: a voice made from reference audio and its exact transcript through a NeuCodec
//! encoder. `voices add` and any other front end (an HTTP upload, say) share it: they decode the
//! audio their own way and hand the samples here.

use std::path::{Path, PathBuf};

use crate::audio::decode::DecodedAudio;
use crate::codec::CodecError;
use crate::codec::encoder::{CodecEncoder, ENCODER_NEEDED, ENCODER_SAMPLE_RATE};
use crate::text::Language;

#[cfg(doc)]
use super::length_warning;
use super::{Voice, VoiceError, validate_name};

/// Share of clipped samples above which the reference is worth a warning.
const CLIPPING_WARN_RATIO: f64 = 0.001;

#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    #[error(transparent)]
    Voice(#[from] VoiceError),
    #[error("the transcript is empty: pass the exact words of the reference")]
    EmptyTranscript,
    #[error("language {given:?}: {msg}")]
    Language { given: String, msg: String },
    #[error(
        "no encoder: neither an encoder path nor an \"encoder\" in {} is given; {ENCODER_NEEDED}",
        .codec_json.display()
    )]
    NoEncoder { codec_json: PathBuf },
    #[error("the reference audio is {got} Hz; the encoder needs {ENCODER_SAMPLE_RATE} Hz")]
    SampleRate { got: u32 },
    #[error("the encoder gave no codes: the reference is too short")]
    NoCodes,
    #[error(transparent)]
    Codec(#[from] CodecError),
}

/// What a new voice is called and says.
#[derive(Debug, Clone)]
pub struct CloneSpec {
    pub name: String,
    /// The exact words of the reference.
    pub transcript: String,
    /// espeak language of the transcript (en-us, de, fr-fr, es).
    pub language: String,
    pub license: String,
    /// Where the reference came from, for the voice file.
    pub source: String,
}

impl CloneSpec {
    /// Checks the name, transcript and language before any audio is decoded or encoded; returns
    /// the language in its canonical spelling.
    pub fn check(&self) -> Result<String, CloneError> {
        validate_name(&self.name)?;
        if self.transcript.trim().is_empty() {
            return Err(CloneError::EmptyTranscript);
        }
        self.language
            .parse::<Language>()
            .map(|l| l.as_str().to_owned())
            .map_err(|e| CloneError::Language {
                given: self.language.clone(),
                msg: e.to_string(),
            })
    }
}

/// A cloned voice and what the caller should tell its user.
#[derive(Debug, Clone)]
pub struct Cloned {
    pub voice: Voice,
    /// Clipping in the reference.
    pub warnings: Vec<String>,
}

/// The encoder to use: the one given, else the `encoder` named by `codec_dir/codec.json`.
pub fn find_encoder(given: Option<&Path>, codec_dir: &Path) -> Result<PathBuf, CloneError> {
    if let Some(e) = given {
        return Ok(e.to_path_buf());
    }
    crate::package::CodecPackage::load(codec_dir)
        .ok()
        .and_then(|p| p.encoder)
        .ok_or_else(|| CloneError::NoEncoder {
            codec_json: codec_dir.join("codec.json"),
        })
}

/// Encodes 16 kHz reference audio into a voice. Whether the reference fits a model's context is
/// the model's front end's judgement (`synth::FrontEnd::check_reference`); without a model,
/// [`length_warning`] judges its length.
pub fn clone_voice(
    spec: &CloneSpec,
    audio: &DecodedAudio,
    encoder: &mut CodecEncoder,
) -> Result<Cloned, CloneError> {
    let language = spec.check()?;
    if audio.sample_rate != ENCODER_SAMPLE_RATE {
        return Err(CloneError::SampleRate {
            got: audio.sample_rate,
        });
    }
    let mut warnings = Vec::new();
    let clipped = audio.clipping.ratio();
    if clipped > CLIPPING_WARN_RATIO {
        warnings.push(format!(
            "{:.2}% of the reference is clipped; a distorted reference gives a distorted voice",
            clipped * 100.0
        ));
    }
    let codes = encoder.encode(&audio.samples)?;
    if codes.is_empty() {
        return Err(CloneError::NoCodes);
    }
    let voice = Voice {
        name: spec.name.clone(),
        language,
        transcript: spec.transcript.trim().to_owned(),
        codes,
        source: spec.source.clone(),
        license: spec.license.clone(),
        custom: None,
    };
    Ok(Cloned { voice, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, transcript: &str, language: &str) -> CloneSpec {
        CloneSpec {
            name: name.into(),
            transcript: transcript.into(),
            language: language.into(),
            license: String::new(),
            source: String::new(),
        }
    }

    #[test]
    fn the_spec_is_checked_before_any_audio() {
        assert_eq!(spec("me", "Hello.", "fr").check().unwrap(), "fr-fr");
        assert!(matches!(
            spec("../me", "Hello.", "en-us").check(),
            Err(CloneError::Voice(VoiceError::BadName(_)))
        ));
        assert!(matches!(
            spec("me", " \n", "en-us").check(),
            Err(CloneError::EmptyTranscript)
        ));
        match spec("me", "Hello.", "klingon").check() {
            Err(CloneError::Language { given, .. }) => assert_eq!(given, "klingon"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_encoder_comes_from_the_flag_else_codec_json() {
        let dir = std::env::temp_dir().join(format!("onebit-clone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let given = Path::new("/x/enc.onnx");
        assert_eq!(find_encoder(Some(given), &dir).unwrap(), given);
        match find_encoder(None, &dir) {
            Err(CloneError::NoEncoder { codec_json }) => {
                assert_eq!(codec_json, dir.join("codec.json"))
            }
            other => panic!("{other:?}"),
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
