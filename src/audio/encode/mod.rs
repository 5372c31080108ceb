//! Encoders from f32 mono samples to the output formats, fed in pieces.
//!
//! In [`EncodeMode::Streaming`] every call returns the bytes that are final so far, so they can be
//! sent as they come. In [`EncodeMode::Whole`] WAV and FLAC hold everything until
//! [`Encoder::finish`] so the header can carry the exact length (and FLAC its MD5), and MP3 holds
//! everything so the LAME/Info tag with the encoder delay and padding can be written into the first
//! frame (which makes decoders trim to the exact duration); PCM and Opus output is the same in both
//! modes.

mod flac;
mod mp3;
mod opus;
mod wav;

use super::AudioError;
use super::format::AudioFormat;
use super::pcm::push_s16le;
use super::resample::check_output_rate;

pub use self::mp3::mp3_bitrate_kbps;
pub use self::opus::{OPUS_BITRATE, OPUS_FRAME_SAMPLES, OPUS_RATE};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncodeMode {
    /// Output is one complete file, returned by `finish` (and, for PCM and Opus, by `push`).
    Whole,
    /// Output is sent while it is produced; headers that need the length say "unknown".
    Streaming,
}

enum Inner {
    Wav(wav::WavEncoder),
    Pcm,
    Flac(Box<flac::FlacEncoder>),
    Mp3(mp3::Mp3Encoder),
    Opus(Box<opus::OpusEncoder>),
}

/// A streaming encoder for one response.
pub struct Encoder {
    format: AudioFormat,
    sample_rate: u32,
    mode: EncodeMode,
    samples_in: u64,
    inner: Inner,
}

impl std::fmt::Debug for Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Encoder")
            .field("format", &self.format)
            .field("sample_rate", &self.sample_rate)
            .field("mode", &self.mode)
            .field("samples_in", &self.samples_in)
            .finish()
    }
}

impl Encoder {
    /// `sample_rate` is the rate of the samples that will be pushed (8000..=48000 Hz).
    pub fn new(
        format: AudioFormat,
        sample_rate: u32,
        mode: EncodeMode,
    ) -> Result<Self, AudioError> {
        check_output_rate(sample_rate)?;
        let streaming = mode == EncodeMode::Streaming;
        let inner = match format {
            AudioFormat::Wav => Inner::Wav(wav::WavEncoder::new(sample_rate, streaming)),
            AudioFormat::Pcm => Inner::Pcm,
            AudioFormat::Flac => {
                Inner::Flac(Box::new(flac::FlacEncoder::new(sample_rate, streaming)?))
            }
            AudioFormat::Mp3 => Inner::Mp3(mp3::Mp3Encoder::new(sample_rate, streaming)?),
            AudioFormat::Opus => Inner::Opus(Box::new(opus::OpusEncoder::new(sample_rate)?)),
        };
        Ok(Self {
            format,
            sample_rate,
            mode,
            samples_in: 0,
            inner,
        })
    }

    pub fn format(&self) -> AudioFormat {
        self.format
    }

    pub fn sample_rate(&self) -> u32 {
        self.sample_rate
    }

    pub fn mode(&self) -> EncodeMode {
        self.mode
    }

    pub fn content_type(&self) -> &'static str {
        self.format.content_type()
    }

    /// Samples pushed so far.
    pub fn samples_in(&self) -> u64 {
        self.samples_in
    }

    /// Encodes `samples` (mono, nominally in [-1, 1]; louder samples are clipped) and returns the
    /// bytes ready to send, possibly none.
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        self.samples_in += samples.len() as u64;
        match &mut self.inner {
            Inner::Wav(e) => e.push(samples),
            Inner::Pcm => {
                let mut out = Vec::new();
                push_s16le(samples, &mut out);
                Ok(out)
            }
            Inner::Flac(e) => e.push(samples),
            Inner::Mp3(e) => e.push(samples),
            Inner::Opus(e) => e.push(samples),
        }
    }

    /// Ends the stream and returns the remaining bytes (in whole mode, the whole file for WAV,
    /// FLAC and MP3).
    pub fn finish(self) -> Result<Vec<u8>, AudioError> {
        match self.inner {
            Inner::Wav(e) => e.finish(),
            Inner::Pcm => Ok(Vec::new()),
            Inner::Flac(e) => e.finish(),
            Inner::Mp3(e) => e.finish(),
            Inner::Opus(e) => e.finish(),
        }
    }
}

/// Encodes a whole clip in one call.
pub fn encode(
    format: AudioFormat,
    sample_rate: u32,
    samples: &[f32],
) -> Result<Vec<u8>, AudioError> {
    let mut encoder = Encoder::new(format, sample_rate, EncodeMode::Whole)?;
    let mut out = encoder.push(samples)?;
    out.extend(encoder.finish()?);
    Ok(out)
}
