//! Audio stage: output formats and encoders, resampling, time-stretch, and decoding of uploaded
//! reference audio for voice cloning.

pub mod decode;
pub mod encode;
pub mod error;
pub mod format;
pub mod pcm;
pub mod pipeline;
pub mod resample;
pub mod stretch;

pub use self::encode::{EncodeMode, Encoder, encode};
pub use self::error::AudioError;
pub use self::format::{AudioFormat, SUPPORTED_FORMATS};
pub use self::pipeline::{OutputPipeline, OutputSpec};
pub use self::resample::check_output_rate;
pub use self::resample::{StreamResampler, resample};
pub use self::stretch::{TimeStretcher, check_speed, time_stretch};
