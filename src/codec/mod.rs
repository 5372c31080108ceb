//! NeuCodec decoding: speech codes -> 24 kHz mono samples through the decoder ONNX; [`encoder`]
//! goes the other way (16 kHz audio -> codes) for cloning voices.
//!
//! Sessions are set up by [`crate::runtime::session`] with the caller's [`ThreadPlan`], the same
//! way as the backbone's; the codec never depends on the engine. The decoder session is loaded
//! once and reused for every request. Its contract is checked at load
//! with a one-frame probe, so a wrong model fails at startup rather than on the first request.

pub mod encoder;
pub mod stream;

use ort::session::Session;
use ort::value::{Tensor, TensorElementType, ValueType};

use crate::package::CodecPackage;
use crate::runtime::{ThreadPlan, session};

#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("codec model {path}: {msg}")]
    Contract { path: String, msg: String },
    /// ONNX Runtime's own error message (opaque text: its C API gives nothing more).
    #[error("codec: onnx runtime: {0}")]
    Runtime(String),
    /// The session ran but its output named in the contract was not among the results.
    #[error("codec: the {graph} gave no output {output:?}")]
    NoOutput { graph: &'static str, output: String },
    /// The decoder returned a length other than `codes * hop`: later audio would shift, so it is
    /// refused rather than padded.
    #[error("codec: {codes} codes decoded to {got} samples, expected {expected}")]
    WrongLength {
        codes: usize,
        expected: usize,
        got: usize,
    },
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

impl From<crate::runtime::session::SessionError> for CodecError {
    fn from(e: crate::runtime::session::SessionError) -> Self {
        CodecError::Runtime(e.to_string())
    }
}

impl From<ort::Error> for CodecError {
    fn from(e: ort::Error) -> Self {
        CodecError::Runtime(e.to_string())
    }
}

/// A session with one rank-3 input and one rank-3 output, as both NeuCodec graphs have.
pub(crate) struct SingleIo {
    pub session: Session,
    pub input: String,
    pub output: String,
    pub output_type: TensorElementType,
}

/// Opens `path` and checks its one input and one output are rank-3 tensors of an allowed element
/// type; `(types, description)` per side, the description naming what was expected.
pub(crate) fn open_single_io(
    env: &ort::environment::Environment,
    path: &std::path::Path,
    threads: &ThreadPlan,
    input: (&[TensorElementType], &str),
    output: (&[TensorElementType], &str),
) -> Result<SingleIo, CodecError> {
    let contract = |msg: String| CodecError::Contract {
        path: path.display().to_string(),
        msg,
    };
    let session = session::builder(env, threads)?
        .commit_from_file(path)
        .map_err(|e| contract(format!("cannot load: {e}")))?;
    let ([i], [o]) = (session.inputs(), session.outputs()) else {
        return Err(contract(format!(
            "expected one input {} and one output {}, found {} and {}",
            input.1,
            output.1,
            session.inputs().len(),
            session.outputs().len()
        )));
    };
    let check =
        |outlet: &ort::value::Outlet, (types, desc): (&[TensorElementType], &str), side: &str| {
            match outlet.dtype() {
                ValueType::Tensor { ty, shape, .. } if shape.len() == 3 && types.contains(ty) => {
                    Ok(*ty)
                }
                other => Err(contract(format!(
                    "{side} {} is {other:?}, expected {desc}",
                    outlet.name()
                ))),
            }
        };
    check(i, input, "input")?;
    let output_type = check(o, output, "output")?;
    let (input, output) = (i.name().to_owned(), o.name().to_owned());
    Ok(SingleIo {
        session,
        input,
        output,
        output_type,
    })
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
        threads: &ThreadPlan,
    ) -> Result<Self, CodecError> {
        let path = pkg.decoder.display().to_string();
        let contract = |msg: String| CodecError::Contract {
            path: path.clone(),
            msg,
        };
        let io = open_single_io(
            env,
            &pkg.decoder,
            threads,
            (&[TensorElementType::Int32], "int32 codes [B,1,F]"),
            (&[TensorElementType::Float32], "float32 [B,1,F*480]"),
        )?;
        let mut me = Self {
            input: io.input,
            output: io.output,
            session: io.session,
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
            .ok_or_else(|| CodecError::NoOutput {
                graph: "decoder",
                output: self.output.clone(),
            })?;
        let (_, samples) = out.try_extract_tensor::<f32>()?;
        if samples.len() != codes.len() * self.hop {
            return Err(CodecError::WrongLength {
                codes: codes.len(),
                expected: codes.len() * self.hop,
                got: samples.len(),
            });
        }
        Ok(samples.to_vec())
    }
}
