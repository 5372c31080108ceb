//! NeuCodec encoding: 16 kHz mono samples -> speech codes through an encoder ONNX.
//!
//! The vendor ships the NeuCodec encoder as a (gated) PyTorch model only; users who want to clone
//! voices from audio export it to ONNX themselves. Any model with this I/O works:
//! one input float32 `[B,1,T]` (16 kHz mono), one output int32 or int64 `[B,1,F]` at 50 codes per
//! second (320 samples per code). The contract is checked at load with a one-second probe.

use std::path::Path;

use ort::session::Session;
use ort::value::{Tensor, TensorElementType};

use super::CodecError;
use crate::package::{CODEC_HOP, CODEC_SAMPLE_RATE, SPEECH_CODES};

/// The encoder's input rate.
pub const ENCODER_SAMPLE_RATE: u32 = 16_000;
/// Input samples per code (16 kHz / 50 codes per second): the encoder makes codes at the
/// decoder's rate.
pub const ENCODER_HOP: usize =
    ENCODER_SAMPLE_RATE as usize * CODEC_HOP / CODEC_SAMPLE_RATE as usize;

/// What the user must bring when no encoder is configured.
pub const ENCODER_NEEDED: &str = "cloning a voice from audio needs a NeuCodec encoder ONNX: one \
input float32 [1,1,T] of 16 kHz mono samples, one output int32/int64 codes [1,1,F] at 50 codes/s \
(values 0..65535). The NeuCodec encoder is a gated PyTorch model (neuphonic/neucodec on Hugging \
Face): accept its licence, export its encoder to ONNX with that I/O, and pass it with --encoder \
FILE (or ONEBIT_CODEC_ENCODER, or an \"encoder\" entry in the model's codec/codec.json). Codes \
made elsewhere can be imported with `onebit-tts voices import`";

/// The NeuCodec encoder session.
pub struct CodecEncoder {
    session: Session,
    input: String,
    output: String,
    wide: bool,
}

impl CodecEncoder {
    pub fn load(
        env: &ort::environment::Environment,
        path: &Path,
        threads: &crate::runtime::ThreadPlan,
    ) -> Result<Self, CodecError> {
        let shown = path.display().to_string();
        let contract = |msg: String| CodecError::Contract {
            path: shown.clone(),
            msg,
        };
        if !path.is_file() {
            return Err(contract("no such file".into()));
        }
        let io = super::open_single_io(
            env,
            path,
            threads,
            (
                &[TensorElementType::Float32],
                "float32 [B,1,T] (16 kHz audio)",
            ),
            (
                &[TensorElementType::Int32, TensorElementType::Int64],
                "int32 or int64 codes [B,1,F]",
            ),
        )?;
        let wide = io.output_type == TensorElementType::Int64;
        let mut me = Self {
            input: io.input,
            output: io.output,
            session: io.session,
            wide,
        };
        let second = ENCODER_SAMPLE_RATE as usize;
        let probe = me
            .encode(&vec![0.0; second])
            .map_err(|e| contract(format!("one second of silence did not encode: {e}")))?;
        let expected = second / ENCODER_HOP;
        if probe.len().abs_diff(expected) > 1 {
            return Err(contract(format!(
                "one second of 16 kHz audio encoded to {} codes, expected {expected} (50 codes/s)",
                probe.len()
            )));
        }
        Ok(me)
    }

    /// Encodes 16 kHz mono samples in one run.
    pub fn encode(&mut self, samples: &[f32]) -> Result<Vec<u32>, CodecError> {
        if samples.is_empty() {
            return Ok(Vec::new());
        }
        let input = Tensor::from_array(([1usize, 1, samples.len()], samples.to_vec()))?;
        let outputs = self.session.run(vec![(self.input.as_str(), input)])?;
        let out = outputs
            .get(self.output.as_str())
            .ok_or_else(|| CodecError::NoOutput {
                graph: "encoder",
                output: self.output.clone(),
            })?;
        if self.wide {
            let (_, codes) = out.try_extract_tensor::<i64>()?;
            check_codes(codes.iter().copied())
        } else {
            let (_, codes) = out.try_extract_tensor::<i32>()?;
            check_codes(codes.iter().map(|&c| i64::from(c)))
        }
    }
}

/// Codes as u32, or the first one outside 0..65535.
pub fn check_codes(codes: impl IntoIterator<Item = i64>) -> Result<Vec<u32>, CodecError> {
    codes
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            if (0..i64::from(SPEECH_CODES)).contains(&c) {
                Ok(c as u32)
            } else {
                Err(CodecError::EncodedOutOfRange { index: i, code: c })
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_outside_the_codebook_are_refused() {
        assert_eq!(check_codes([0, 65_535, 7]).unwrap(), vec![0, 65_535, 7]);
        for (codes, msg) in [
            (
                vec![1, 65_536],
                "the encoder gave code 65536 at index 1, outside 0..65535",
            ),
            (
                vec![-1],
                "the encoder gave code -1 at index 0, outside 0..65535",
            ),
        ] {
            assert_eq!(check_codes(codes).unwrap_err().to_string(), msg);
        }
    }
}
