//! Encoders from f32 mono samples to the output formats, fed in pieces.
//!
//! Every [`Encoder::push`] returns the bytes whose place in the output is fixed, so they can be
//! sent or stored as they come and nothing grows with the length of the audio.
//!
//! In [`EncodeMode::Streaming`] those bytes are final: a WAV or FLAC header says the length is
//! unknown, MP3 goes without its Info tag. In [`EncodeMode::Whole`] the output is one complete
//! file whose front says what only its end knows: WAV's length, FLAC's STREAMINFO (total samples,
//! MD5, frame sizes), MP3's LAME/Info tag (encoder delay and padding, so decoders trim to the
//! exact duration). There the front goes out first as a placeholder of the right size and
//! [`Encoder::finish`] returns, besides the last bytes, the [`Patch`]es that overwrite it. Whoever
//! holds the output (a file, a spool, a `Vec`) applies them; [`encode`] and
//! [`Finished::complete`] assemble the whole file in memory. PCM and Opus output is the same in
//! both modes and never patched.

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
    /// Output is one complete file: what `push` and `finish` return, with `finish`'s patches
    /// applied.
    Whole,
    /// Output is sent while it is produced; headers that need the length say "unknown".
    Streaming,
}

/// Bytes that overwrite earlier output: what only the end of the stream knows, written over the
/// placeholder that went out first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Patch {
    /// From the start of the output.
    pub offset: u64,
    pub bytes: Vec<u8>,
}

/// The end of an encoding: the last bytes, then the patches. A patch's offset counts from the
/// start of the whole output, the tail included, so the tail is appended before patches apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Finished {
    pub tail: Vec<u8>,
    pub patches: Vec<Patch>,
}

impl Finished {
    /// The last bytes, nothing to patch.
    pub fn tail(tail: Vec<u8>) -> Self {
        Self {
            tail,
            patches: Vec::new(),
        }
    }

    /// Completes `out`, which holds every byte pushed so far: appends the tail, applies the
    /// patches.
    pub fn complete(self, out: &mut Vec<u8>) -> Result<(), AudioError> {
        out.extend_from_slice(&self.tail);
        for p in &self.patches {
            apply_patch(out, p.offset, &p.bytes)?;
        }
        Ok(())
    }
}

/// Writes `bytes` over `out` at `offset`. A patch past the end of `out` is an error: it can only
/// mean bytes were lost or reordered on the way.
pub fn apply_patch(out: &mut [u8], offset: u64, bytes: &[u8]) -> Result<(), AudioError> {
    let range = usize::try_from(offset)
        .ok()
        .and_then(|start| Some(start..start.checked_add(bytes.len())?))
        .filter(|r| r.end <= out.len())
        .ok_or_else(|| {
            AudioError::Internal(format!(
                "a patch of {} bytes at offset {offset} is past the end of the {} bytes written",
                bytes.len(),
                out.len()
            ))
        })?;
    out[range].copy_from_slice(bytes);
    Ok(())
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
    /// bytes ready to send, possibly none. Everything encoded so far goes out (Opus closes its
    /// Ogg page).
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        self.push_inner(samples, true)
    }

    /// [`push`](Self::push) of a part of what the caller means as one push, more of it coming
    /// at once: the output is byte for byte that of one push of all the parts (Opus keeps its
    /// Ogg page open, whose layout would otherwise follow the cuts), only handed out earlier.
    pub fn push_part(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        self.push_inner(samples, false)
    }

    fn push_inner(&mut self, samples: &[f32], end_page: bool) -> Result<Vec<u8>, AudioError> {
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
            Inner::Opus(e) => e.push(samples, end_page),
        }
    }

    /// Ends the stream: the remaining bytes, and in whole mode the patches of the placeholder
    /// WAV, FLAC and MP3 sent first.
    pub fn finish(self) -> Result<Finished, AudioError> {
        match self.inner {
            Inner::Wav(e) => e.finish(),
            Inner::Pcm => Ok(Finished::default()),
            Inner::Flac(e) => e.finish(),
            Inner::Mp3(e) => e.finish(),
            Inner::Opus(e) => e.finish().map(Finished::tail),
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
    encoder.finish()?.complete(&mut out)?;
    Ok(out)
}
