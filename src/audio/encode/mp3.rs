//! MP3 encoding (LAME): the rates an MP3 stream can carry and the constant bitrate for each.

use std::num::NonZeroU32;

use mp3lame_encoder::{Bitrate, Builder, FlushGap, Mode, MonoPcm, Quality};

use crate::audio::AudioError;
use crate::audio::format::AudioFormat;

use super::{Finished, Patch};

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
    /// Bytes handed out so far: whole mode patches the Info tag over the first frame only when
    /// that frame is all there.
    sent: u64,
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
        // With the tag on, LAME's first frame is a placeholder of `lame_tag_size()` bytes that
        // can only be filled in once the stream has ended; a streamed placeholder would stay
        // empty, so streams go without it.
        b.set_to_write_vbr_tag(!streaming)
            .map_err(|e| mp3_err("info tag", e))?;
        let encoder = b.build().map_err(|e| mp3_err("init", e))?;
        Ok(Self {
            encoder,
            streaming,
            sent: 0,
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
        self.sent += out.len() as u64;
        Ok(out)
    }

    pub(super) fn finish(mut self) -> Result<Finished, AudioError> {
        let mut tail = Vec::with_capacity(7200);
        self.encoder
            .flush_to_vec::<FlushGap>(&mut tail)
            .map_err(|e| mp3_err("flush", e))?;
        let mut done = Finished::tail(tail);
        if !self.streaming {
            let mut tag = Vec::with_capacity(self.encoder.lame_tag_size());
            if self.encoder.lame_tag_encode_to_vec(&mut tag).is_some() {
                // Over LAME's placeholder frame, which follows the ID3v2 tag (if any).
                let at = self.encoder.id3v2_tag_size() as u64;
                let total = self.sent + done.tail.len() as u64;
                if at + tag.len() as u64 <= total {
                    done.patches.push(Patch {
                        offset: at,
                        bytes: tag,
                    });
                }
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What whole-mode MP3 was before it was made progressively: every byte held, the tag
    /// copied over the first frame at the end.
    fn held(rate: u32, pieces: &[&[f32]]) -> Vec<u8> {
        let mut e = Mp3Encoder::new(rate, false).unwrap();
        let mut out = Vec::new();
        for p in pieces {
            out.extend(e.push(p).unwrap());
        }
        e.encoder.flush_to_vec::<FlushGap>(&mut out).unwrap();
        let mut tag = Vec::with_capacity(e.encoder.lame_tag_size());
        e.encoder.lame_tag_encode_to_vec(&mut tag).unwrap();
        let at = e.encoder.id3v2_tag_size();
        out[at..at + tag.len()].copy_from_slice(&tag);
        out
    }

    #[test]
    fn progressive_whole_files_are_byte_identical_to_held_ones() {
        for rate in [16_000, 24_000, 44_100] {
            let x: Vec<f32> = (0..rate as usize * 2)
                .map(|i| 0.3 * (i as f32 * 0.02).sin())
                .collect();
            let pieces: Vec<&[f32]> = x.chunks(3000).collect();
            let want = held(rate, &pieces);
            let mut e = Mp3Encoder::new(rate, false).unwrap();
            let mut out = Vec::new();
            for p in &pieces {
                out.extend(e.push(p).unwrap());
            }
            let done = e.finish().unwrap();
            assert_eq!(done.patches.len(), 1, "the Info tag");
            // The placeholder went out with the first frames, before the tail.
            let p = &done.patches[0];
            assert!(p.offset + p.bytes.len() as u64 <= out.len() as u64);
            done.complete(&mut out).unwrap();
            assert!(out == want, "{rate} Hz");
        }
    }
}
