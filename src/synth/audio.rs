//! Codes to audio: decoding each piece, the joins between pieces.

use crate::codec::stream::StreamError;
use crate::codec::{CodecDecoder, CodecError};

use super::SynthError;

/// Pause inserted between pieces of a long text, and the fade that keeps the joins click-free.
pub const PIECE_PAUSE_S: f32 = 0.2;
pub(super) const PIECE_FADE_S: f32 = 0.01;

/// Linear fades over the first `fade_in` and last `fade_out` samples.
pub(super) fn fade_edges(samples: &mut [f32], fade_in: usize, fade_out: usize) {
    let n = samples.len();
    let fi = fade_in.min(n);
    for (i, s) in samples.iter_mut().take(fi).enumerate() {
        *s *= i as f32 / fi as f32;
    }
    let fo = fade_out.min(n);
    for i in 0..fo {
        samples[n - 1 - i] *= i as f32 / fo as f32;
    }
}

pub(super) fn as_i32(codes: &[u32]) -> Vec<i32> {
    codes.iter().map(|&c| c as i32).collect()
}

pub(super) fn decode_i32(codec: &mut CodecDecoder, codes: &[i32]) -> Result<Vec<f32>, CodecError> {
    let codes: Vec<u32> = codes.iter().map(|&c| c as u32).collect();
    codec.decode(&codes)
}

pub(super) fn stream_error(e: StreamError<CodecError>) -> SynthError {
    match e {
        StreamError::Decode(e) => SynthError::Codec(e),
        other => SynthError::Codec(CodecError::Runtime(other.to_string())),
    }
}
