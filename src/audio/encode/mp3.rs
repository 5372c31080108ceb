//! MP3 encoding (LAME): the rates an MP3 stream can carry and the constant bitrate for each.

use std::num::NonZeroU32;

use mp3lame_encoder::{Bitrate, Builder, FlushGap, Mode, MonoPcm, Quality};

use crate::audio::AudioError;
use crate::audio::format::AudioFormat;

/// Rates an MP3 stream can carry; LAME resamples other input rates to one of these.
const MP3_RATES: [u32; 9] = [8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000];

/// Constant bitrate by rate: MPEG-2.5 (≤12 kHz) tops out at 64 kbps and MPEG-2 (≤24 kHz) at
/// 160 kbps; these leave speech transparent-sounding in mono without wasting bandwidth.
pub fn mp3_bitrate_kbps(sample_rate: u32) -> u32 {
    match sample_rate {
        ..=12_000 => 32,
        12_001..=24_000 => 64,
        _ => 96,
    }
}

/// LAME's -q 7 ("fast, ok quality"): measured on 24 kHz speech at these bitrates
/// (benches/audio.rs, tests/audio_formats.rs) it encodes in ~0.6x the time of the default -q 5
/// with the same SNR to within half a dB, which keeps a short request's encoding inside the
/// server's overhead budget. The bitrate, not the search effort, is what bounds speech quality
/// here.
const MP3_QUALITY: Quality = Quality::Ok;

fn bitrate(kbps: u32) -> Bitrate {
    match kbps {
        32 => Bitrate::Kbps32,
        64 => Bitrate::Kbps64,
        _ => Bitrate::Kbps96,
    }
}

fn mp3_err(message: &str, e: impl std::error::Error + Send + Sync + 'static) -> AudioError {
    AudioError::codec_source(AudioFormat::Mp3, message, e)
}

pub(super) struct Mp3Encoder {
    encoder: mp3lame_encoder::Encoder,
    streaming: bool,
    /// Whole mode: everything, so the Info tag can be patched into the first frame at the end.
    held: Vec<u8>,
}

impl Mp3Encoder {
    pub(super) fn new(sample_rate: u32, streaming: bool) -> Result<Self, AudioError> {
        let mut b = Builder::new()
            .ok_or_else(|| AudioError::codec(AudioFormat::Mp3, "LAME allocation failed"))?;
        b.set_num_channels(1).map_err(|e| mp3_err("channels", e))?;
        b.set_sample_rate(sample_rate)
            .map_err(|e| mp3_err("sample rate", e))?;
        let out_rate = MP3_RATES
            .contains(&sample_rate)
            .then(|| NonZeroU32::new(sample_rate))
            .flatten();
        b.set_output_sample_rate(out_rate)
            .map_err(|e| mp3_err("output sample rate", e))?;
        b.set_mode(Mode::Mono).map_err(|e| mp3_err("mode", e))?;
        b.set_brate(bitrate(mp3_bitrate_kbps(sample_rate)))
            .map_err(|e| mp3_err("bitrate", e))?;
        b.set_quality(MP3_QUALITY)
            .map_err(|e| mp3_err("quality", e))?;
        // The Info tag can only be filled in once the stream has ended; a streamed placeholder
        // would stay empty, so streams go without it.
        b.set_to_write_vbr_tag(!streaming)
            .map_err(|e| mp3_err("info tag", e))?;
        let encoder = b.build().map_err(|e| mp3_err("init", e))?;
        Ok(Self {
            encoder,
            streaming,
            held: Vec::new(),
        })
    }

    pub(super) fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        let mut out = Vec::with_capacity(mp3lame_encoder::max_required_buffer_size(samples.len()));
        // LAME takes at most an int's worth of samples per call; pieces keep buffers small too.
        for piece in samples.chunks(1 << 16) {
            out.reserve(mp3lame_encoder::max_required_buffer_size(piece.len()));
            self.encoder
                .encode_to_vec(MonoPcm(piece), &mut out)
                .map_err(|e| mp3_err("encode", e))?;
        }
        if self.streaming {
            Ok(out)
        } else {
            self.held.extend(out);
            Ok(Vec::new())
        }
    }

    pub(super) fn finish(mut self) -> Result<Vec<u8>, AudioError> {
        let mut out = std::mem::take(&mut self.held);
        out.reserve(7200);
        self.encoder
            .flush_to_vec::<FlushGap>(&mut out)
            .map_err(|e| mp3_err("flush", e))?;
        if !self.streaming {
            let mut tag = Vec::with_capacity(self.encoder.lame_tag_size());
            if self.encoder.lame_tag_encode_to_vec(&mut tag).is_some() {
                let at = self.encoder.id3v2_tag_size();
                if let Some(first_frame) = out.get_mut(at..at + tag.len()) {
                    first_frame.copy_from_slice(&tag);
                }
            }
        }
        Ok(out)
    }
}
