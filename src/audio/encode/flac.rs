//! FLAC encoding (flacenc, pure Rust): 16-bit mono frames, sent as they are made; a whole file's
//! STREAMINFO is patched in at the end.

use flacenc::bitsink::MemSink;
use flacenc::component::{BitRepr, Stream, StreamInfo};
use flacenc::error::{Verified, Verify};
use flacenc::source::{Context, Fill, FrameBuf};

use crate::audio::AudioError;
use crate::audio::format::AudioFormat;
use crate::audio::pcm::f32_to_i16;

use super::{Finished, Patch};

/// libFLAC's default block size; at 24 kHz a frame is 170 ms, well under a streamed chunk.
const BLOCK_SIZE: usize = 4096;
const BITS: usize = 16;

fn flac_err(message: &str, e: impl std::fmt::Display) -> AudioError {
    AudioError::codec(AudioFormat::Flac, format!("{message}: {e}"))
}

fn to_bytes<T: BitRepr>(item: &T) -> Result<Vec<u8>, AudioError> {
    let mut sink = MemSink::<u8>::new();
    item.write(&mut sink)
        .map_err(|e| flac_err("serialize", e))?;
    Ok(sink.into_inner())
}

pub(super) struct FlacEncoder {
    streaming: bool,
    config: Verified<flacenc::config::Encoder>,
    /// Streaming: as the header says it (lengths and MD5 unknown). Whole: updated with every
    /// frame, as `flacenc::encode_with_fixed_block_size` updates its stream's, so that the
    /// STREAMINFO patched in at the end is the one that function would have written.
    stream_info: StreamInfo,
    /// Whole: the MD5 of the samples, in flacenc's own way.
    context: Context,
    samples: u64,
    header_sent: bool,
    frame_number: usize,
    framebuf: FrameBuf,
    /// Samples not yet in a full block.
    pending: Vec<i32>,
}

impl FlacEncoder {
    pub(super) fn new(sample_rate: u32, streaming: bool) -> Result<Self, AudioError> {
        let config = flacenc::config::Encoder::default()
            .into_verified()
            .map_err(|(_, e)| flac_err("config", e))?;
        let mut stream_info = StreamInfo::new(sample_rate as usize, 1, BITS)
            .map_err(|e| flac_err("stream info", e))?;
        stream_info
            .set_block_sizes(BLOCK_SIZE, BLOCK_SIZE)
            .map_err(|e| flac_err("block size", e))?;
        let framebuf =
            FrameBuf::with_size(1, BLOCK_SIZE).map_err(|e| flac_err("frame buffer", e))?;
        Ok(Self {
            streaming,
            config,
            stream_info,
            context: Context::new(BITS, 1),
            samples: 0,
            header_sent: false,
            frame_number: 0,
            framebuf,
            pending: Vec::new(),
        })
    }

    /// `fLaC` + STREAMINFO. Streaming: total samples, MD5 and frame sizes left 0 ("unknown"),
    /// which the format allows for streams whose length is not known up front. Whole: the same
    /// 42 bytes stand in until `finish` patches the real ones over them.
    fn header(&self) -> Result<Vec<u8>, AudioError> {
        to_bytes(&Stream::with_stream_info(self.stream_info.clone()))
    }

    fn encode_frame(&mut self, samples: &[i32]) -> Result<Vec<u8>, AudioError> {
        self.framebuf
            .fill_interleaved(samples)
            .map_err(|e| flac_err("fill", e))?;
        let frame = flacenc::encode_fixed_size_frame(
            &self.config,
            &self.framebuf,
            self.frame_number,
            &self.stream_info,
        )
        .map_err(|e| flac_err("encode", e))?;
        self.frame_number += 1;
        if !self.streaming {
            self.stream_info.update_frame_info(&frame);
        }
        to_bytes(&frame)
    }

    pub(super) fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        let start = self.pending.len();
        self.pending
            .extend(samples.iter().map(|&x| i32::from(f32_to_i16(x))));
        if !self.streaming {
            self.context
                .fill_interleaved(&self.pending[start..])
                .map_err(|e| flac_err("checksum", e))?;
            self.samples += samples.len() as u64;
        }
        let mut out = Vec::new();
        if !self.header_sent {
            out.extend(self.header()?);
            self.header_sent = true;
        }
        let full = self.pending.len() / BLOCK_SIZE * BLOCK_SIZE;
        let pending = std::mem::take(&mut self.pending);
        for block in pending[..full].chunks_exact(BLOCK_SIZE) {
            out.extend(self.encode_frame(block)?);
        }
        self.pending = pending[full..].to_vec();
        Ok(out)
    }

    pub(super) fn finish(mut self) -> Result<Finished, AudioError> {
        let mut tail = Vec::new();
        if !self.header_sent {
            tail.extend(self.header()?);
        }
        let pending = std::mem::take(&mut self.pending);
        if !pending.is_empty() {
            tail.extend(self.encode_frame(&pending)?);
        }
        if self.streaming {
            return Ok(Finished::tail(tail));
        }
        let info = &mut self.stream_info;
        info.set_md5_digest(&self.context.md5_digest());
        let total = usize::try_from(self.samples).map_err(|_| AudioError::TooLongForContainer {
            format: AudioFormat::Flac,
            what: "audio",
        })?;
        info.set_total_samples(total);
        // flacenc counts the short last block in the minimum block size; the format excludes it,
        // and symphonia refuses a fixed-block stream whose minimum differs from its maximum.
        info.set_block_sizes(BLOCK_SIZE, BLOCK_SIZE)
            .map_err(|e| flac_err("block size", e))?;
        let header = self.header()?;
        if self.header_sent {
            Ok(Finished {
                tail,
                patches: vec![Patch {
                    offset: 0,
                    bytes: header,
                }],
            })
        } else {
            // Nothing went out yet: the placeholder at the front of the tail is replaced here.
            super::apply_patch(&mut tail, 0, &header)?;
            Ok(Finished::tail(tail))
        }
    }
}

#[cfg(test)]
mod tests {
    use flacenc::source::MemSource;

    use super::*;

    /// What whole-mode FLAC was before it was made progressively: flacenc's one-call encoder over
    /// every sample, with the block sizes set as the format wants them.
    fn one_call(rate: u32, samples: &[f32]) -> Vec<u8> {
        let pcm: Vec<i32> = samples.iter().map(|&x| i32::from(f32_to_i16(x))).collect();
        let config = flacenc::config::Encoder::default().into_verified().unwrap();
        let source = MemSource::from_samples(&pcm, 1, BITS, rate as usize);
        let mut stream =
            flacenc::encode_with_fixed_block_size(&config, source, BLOCK_SIZE).unwrap();
        stream
            .stream_info_mut()
            .set_block_sizes(BLOCK_SIZE, BLOCK_SIZE)
            .unwrap();
        to_bytes(&stream).unwrap()
    }

    #[test]
    fn progressive_whole_files_are_byte_identical_to_flacenc_one_call() {
        // Lengths around the block size (empty, short, exact, one over, several blocks) pushed
        // in pieces that straddle blocks, and all at once.
        for len in [0, 1, 4095, 4096, 4097, 3 * 4096 + 123] {
            let x: Vec<f32> = (0..len)
                .map(|i| 0.4 * (i as f32 * 0.031).sin() + 0.05 * ((i * 7919) % 13) as f32 / 13.0)
                .collect();
            let want = one_call(24_000, &x);
            for piece in [len.max(1), 1000, 4096, 5000] {
                let mut e = FlacEncoder::new(24_000, false).unwrap();
                let mut out = Vec::new();
                for p in x.chunks(piece) {
                    out.extend(e.push(p).unwrap());
                }
                let done = e.finish().unwrap();
                // Only the STREAMINFO is ever patched: every frame is final when it leaves.
                assert!(
                    done.patches
                        .iter()
                        .all(|p| p.offset == 0 && p.bytes.len() == 42)
                );
                done.complete(&mut out).unwrap();
                assert!(out == want, "{len} samples in pieces of {piece}");
            }
        }
    }
}
