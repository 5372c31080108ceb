//! NeuCodec decoding: speech codes -> 24 kHz mono samples through the decoder ONNX; [`encoder`]
//! goes the other way (16 kHz audio -> codes) for cloning voices.
//!
//! The decoder session is loaded once and reused for every request. Its contract is checked at load
//! with a one-frame probe, so a wrong model fails at startup rather than on the first request.

pub mod encoder;
pub mod stream;

use ort::session::Session;
use ort::value::{Tensor, TensorElementType, ValueType};

use crate::package::CodecPackage;

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("codec model {path}: {msg}")]
    Contract { path: String, msg: String },
    #[error("codec: onnx runtime: {0}")]
    Runtime(String),
    #[error("code {0} is outside 0..65535")]
    CodeOutOfRange(u32),
    #[error("the encoder gave code {code} at index {index}, outside 0..65535")]
    EncodedOutOfRange { index: usize, code: i64 },
}

impl From<ort::Error<ort::session::builder::SessionBuilder>> for CodecError {
    fn from(e: ort::Error<ort::session::builder::SessionBuilder>) -> Self {
        CodecError::Runtime(e.to_string())
    }
}

impl From<ort::Error> for CodecError {
    fn from(e: ort::Error) -> Self {
        CodecError::Runtime(e.to_string())
    }
}

/// The NeuCodec decoder session.
pub struct CodecDecoder {
    session: Session,
    input: String,
    output: String,
    hop: usize,
}

impl CodecDecoder {
    pub fn load(
        env: &ort::environment::Environment,
        pkg: &CodecPackage,
        threads: Option<usize>,
    ) -> Result<Self, CodecError> {
        let path = pkg.decoder.display().to_string();
        let contract = |msg: String| CodecError::Contract {
            path: path.clone(),
            msg,
        };
        let mut builder = Session::builder(env)?;
        if let Some(n) = threads {
            builder = builder.with_intra_threads(n)?;
        }
        let session = builder
            .commit_from_file(&pkg.decoder)
            .map_err(|e| contract(format!("cannot load: {e}")))?;
        let [input] = session.inputs() else {
            return Err(contract(format!(
                "expected one input `codes` int32 [B,1,F], found {}",
                session.inputs().len()
            )));
        };
        let [output] = session.outputs() else {
            return Err(contract(format!(
                "expected one output float32 [B,1,F*{}], found {}",
                pkg.hop_length,
                session.outputs().len()
            )));
        };
        match input.dtype() {
            ValueType::Tensor {
                ty: TensorElementType::Int32,
                shape,
                ..
            } if shape.len() == 3 => {}
            other => {
                return Err(contract(format!(
                    "input {} is {other:?}, expected int32 [B,1,F]",
                    input.name()
                )));
            }
        }
        match output.dtype() {
            ValueType::Tensor {
                ty: TensorElementType::Float32,
                shape,
                ..
            } if shape.len() == 3 => {}
            other => {
                return Err(contract(format!(
                    "output {} is {other:?}, expected float32 [B,1,F*480]",
                    output.name()
                )));
            }
        }
        let mut me = Self {
            input: input.name().to_owned(),
            output: output.name().to_owned(),
            session,
            hop: pkg.hop_length,
        };
        let probe = me.decode(&[0, 1])?;
        if probe.len() != 2 * me.hop {
            return Err(contract(format!(
                "2 codes decoded to {} samples, expected {} (hop {})",
                probe.len(),
                2 * me.hop,
                me.hop
            )));
        }
        Ok(me)
    }

    /// Samples per code.
    pub fn hop(&self) -> usize {
        self.hop
    }

    /// Decodes `codes` in one run: `codes.len() * hop` samples.
    pub fn decode(&mut self, codes: &[u32]) -> Result<Vec<f32>, CodecError> {
        if codes.is_empty() {
            return Ok(Vec::new());
        }
        let mut data = Vec::with_capacity(codes.len());
        for &c in codes {
            if c >= crate::package::SPEECH_CODES {
                return Err(CodecError::CodeOutOfRange(c));
            }
            data.push(c as i32);
        }
        let input = Tensor::from_array(([1usize, 1, codes.len()], data))?;
        let outputs = self.session.run(vec![(self.input.as_str(), input)])?;
        let out = outputs
            .get(self.output.as_str())
            .ok_or_else(|| CodecError::Runtime("decoder gave no output".into()))?;
        let (_, samples) = out.try_extract_tensor::<f32>()?;
        if samples.len() != codes.len() * self.hop {
            return Err(CodecError::Runtime(format!(
                "{} codes decoded to {} samples, expected {}",
                codes.len(),
                samples.len(),
                codes.len() * self.hop
            )));
        }
        Ok(samples.to_vec())
    }
}
