//! FLAC encoding (flacenc, pure Rust): 16-bit mono frames, streamable as they are made.

use flacenc::bitsink::MemSink;
use flacenc::component::{BitRepr, Stream, StreamInfo};
use flacenc::error::{Verified, Verify};
use flacenc::source::{Fill, FrameBuf, MemSource};

use crate::audio::AudioError;
use crate::audio::format::AudioFormat;
use crate::audio::pcm::f32_to_i16;

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
    sample_rate: u32,
    streaming: bool,
    config: Verified<flacenc::config::Encoder>,
    stream_info: StreamInfo,
    header_sent: bool,
    frame_number: usize,
    framebuf: FrameBuf,
    /// Streaming: samples not yet in a full block. Whole: every sample.
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
            sample_rate,
            streaming,
            config,
            stream_info,
            header_sent: false,
            frame_number: 0,
            framebuf,
            pending: Vec::new(),
        })
    }

    /// `fLaC` + STREAMINFO with total samples, MD5 and frame sizes left 0 ("unknown"), which the
    /// format allows for streams whose length is not known up front.
    fn streaming_header(&self) -> Result<Vec<u8>, AudioError> {
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
        to_bytes(&frame)
    }

    pub(super) fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        self.pending
            .extend(samples.iter().map(|&x| i32::from(f32_to_i16(x))));
        if !self.streaming {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        if !self.header_sent {
            out.extend(self.streaming_header()?);
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

    pub(super) fn finish(mut self) -> Result<Vec<u8>, AudioError> {
        if self.streaming {
            let mut out = Vec::new();
            if !self.header_sent {
                out.extend(self.streaming_header()?);
            }
            let pending = std::mem::take(&mut self.pending);
            if !pending.is_empty() {
                out.extend(self.encode_frame(&pending)?);
            }
            return Ok(out);
        }
        // Whole file: the library fills in total samples, MD5 and frame sizes.
        let source = MemSource::from_samples(&self.pending, 1, BITS, self.sample_rate as usize);
        let mut stream = flacenc::encode_with_fixed_block_size(&self.config, source, BLOCK_SIZE)
            .map_err(|e| flac_err("encode", e))?;
        // flacenc counts the short last block in the minimum block size; the format excludes it,
        // and symphonia refuses a fixed-block stream whose minimum differs from its maximum.
        stream
            .stream_info_mut()
            .set_block_sizes(BLOCK_SIZE, BLOCK_SIZE)
            .map_err(|e| flac_err("block size", e))?;
        to_bytes(&stream)
    }
}
