//! Audio stage: output formats and encoders, resampling, time-stretch, and decoding of uploaded
//! reference audio for voice cloning. The stage's error, [`AudioError`], is defined here, at the
//! stage's root, so that every part (a format's name, an encoder, the resampler) reports through
//! it without the parts depending on one another.

pub mod decode;
pub mod encode;
pub mod format;
pub mod pcm;
pub mod pipeline;
pub mod resample;
pub mod stretch;

pub use self::encode::{EncodeMode, Encoder, Finished, Patch, apply_patch, encode};
pub use self::format::{AudioFormat, SUPPORTED_FORMATS};
pub use self::pipeline::{OutputPipeline, OutputSpec};
pub use self::resample::check_output_rate;
pub use self::resample::{StreamResampler, resample};
pub use self::stretch::{TimeStretcher, check_speed, time_stretch};

use std::error::Error as StdError;

/// Boxed error of an underlying codec library, kept as the `source` of [`AudioError::Codec`].
pub type CodecError = Box<dyn StdError + Send + Sync + 'static>;

/// Every failure of the audio stage. Variants that come from user input (format name, rate,
/// speed, uploaded audio) carry what was wrong so an HTTP layer can answer 400 with the message.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("unknown audio format {name:?}; supported: {supported}")]
    UnknownFormat {
        name: String,
        supported: &'static str,
    },
    #[error("audio format {name:?} is not available: {reason}; supported: {supported}")]
    UnsupportedFormat {
        name: String,
        reason: &'static str,
        supported: &'static str,
    },
    #[error("sample rate {rate} Hz is outside the supported range {min}..={max} Hz")]
    SampleRateOutOfRange { rate: u32, min: u32, max: u32 },
    #[error("speed {speed} is outside the supported range {min}..={max}")]
    SpeedOutOfRange { speed: f32, min: f32, max: f32 },
    #[error("audio input is empty")]
    EmptyInput,
    #[error("audio input is not a recognized format (wav, flac, mp3, ogg/vorbis): {0}")]
    UnrecognizedInput(String),
    #[error("audio input has no decodable audio track")]
    NoAudioTrack,
    #[error("audio input is corrupt: {0}")]
    CorruptInput(String),
    #[error("audio input is longer than the {max_seconds} s limit")]
    InputTooLong { max_seconds: u32 },
    #[error("cannot read audio input: {0}")]
    Io(#[from] std::io::Error),
    #[error("{what} is too long for the {format} container")]
    TooLongForContainer {
        format: AudioFormat,
        what: &'static str,
    },
    #[error("resampler setup failed")]
    ResamplerSetup(#[source] rubato::ResamplerConstructionError),
    #[error("resampling failed")]
    Resample(#[source] rubato::ResampleError),
    #[error("internal audio error: {0}")]
    Internal(String),
    #[error("{format} encoder failed: {message}")]
    Codec {
        format: AudioFormat,
        message: String,
        #[source]
        source: Option<CodecError>,
    },
}

impl AudioError {
    pub(crate) fn codec(format: AudioFormat, message: impl Into<String>) -> Self {
        Self::Codec {
            format,
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn codec_source(
        format: AudioFormat,
        message: impl Into<String>,
        source: impl StdError + Send + Sync + 'static,
    ) -> Self {
        Self::Codec {
            format,
            message: message.into(),
            source: Some(Box::new(source)),
        }
    }
}
