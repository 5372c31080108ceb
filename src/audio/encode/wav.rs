//! WAV (16-bit mono PCM): the header with the real length for a whole file (a placeholder sent
//! first, patched at the end), or the unknown-length header a stream sends.

use crate::audio::AudioError;
use crate::audio::format::AudioFormat;
use crate::audio::pcm::push_s16le;

use super::{Finished, Patch};

const HEADER_LEN: usize = 44;
/// Size fields of a streamed WAV: the length is unknown when the header leaves, and the maximum
/// value is what streaming servers (ffmpeg's pipe output among them) send so players read to EOF.
const UNKNOWN_SIZE: u32 = u32::MAX;

/// 16-bit mono PCM WAV header. `data_len` is `None` when streaming.
fn header(sample_rate: u32, data_len: Option<u32>) -> [u8; HEADER_LEN] {
    let (riff_len, data_len) = match data_len {
        Some(n) => (n + 36, n),
        None => (UNKNOWN_SIZE, UNKNOWN_SIZE),
    };
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(b"RIFF");
    h[4..8].copy_from_slice(&riff_len.to_le_bytes());
    h[8..12].copy_from_slice(b"WAVE");
    h[12..16].copy_from_slice(b"fmt ");
    h[16..20].copy_from_slice(&16u32.to_le_bytes());
    h[20..22].copy_from_slice(&1u16.to_le_bytes()); // PCM
    h[22..24].copy_from_slice(&1u16.to_le_bytes()); // mono
    h[24..28].copy_from_slice(&sample_rate.to_le_bytes());
    h[28..32].copy_from_slice(&(sample_rate * 2).to_le_bytes()); // byte rate
    h[32..34].copy_from_slice(&2u16.to_le_bytes()); // block align
    h[34..36].copy_from_slice(&16u16.to_le_bytes()); // bits per sample
    h[36..40].copy_from_slice(b"data");
    h[40..44].copy_from_slice(&data_len.to_le_bytes());
    h
}

/// The data length as the header's field, when the container can hold it (the RIFF length adds
/// the 36 bytes of header after it).
fn data_len_field(len: u64) -> Result<u32, AudioError> {
    u32::try_from(len)
        .ok()
        .filter(|n| n.checked_add(36).is_some())
        .ok_or(AudioError::TooLongForContainer {
            format: AudioFormat::Wav,
            what: "audio",
        })
}

pub(super) struct WavEncoder {
    sample_rate: u32,
    streaming: bool,
    header_sent: bool,
    /// Bytes of samples so far.
    data_len: u64,
}

impl WavEncoder {
    pub(super) fn new(sample_rate: u32, streaming: bool) -> Self {
        Self {
            sample_rate,
            streaming,
            header_sent: false,
            data_len: 0,
        }
    }

    pub(super) fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        let mut out = Vec::with_capacity(HEADER_LEN + samples.len() * 2);
        if !self.streaming {
            // Refused as soon as it cannot fit, not after gigabytes more were written somewhere.
            self.data_len += samples.len() as u64 * 2;
            data_len_field(self.data_len)?;
        }
        if !self.header_sent {
            // A whole file's header is a placeholder of length 0 until `finish` patches it.
            let len = (!self.streaming).then_some(0);
            out.extend_from_slice(&header(self.sample_rate, len));
            self.header_sent = true;
        }
        push_s16le(samples, &mut out);
        Ok(out)
    }

    pub(super) fn finish(self) -> Result<Finished, AudioError> {
        if self.streaming {
            return Ok(Finished::tail(if self.header_sent {
                Vec::new()
            } else {
                header(self.sample_rate, None).to_vec()
            }));
        }
        let header = header(self.sample_rate, Some(data_len_field(self.data_len)?)).to_vec();
        Ok(if self.header_sent {
            Finished {
                tail: Vec::new(),
                patches: vec![Patch {
                    offset: 0,
                    bytes: header,
                }],
            }
        } else {
            Finished::tail(header)
        })
    }
}
