//! NeuCodec decoding: speech codes -> 24 kHz mono samples through the decoder ONNX; [`encoder`]
//! goes the other way (16 kHz audio -> codes) for cloning voices.
//!
//! Sessions are set up by [`crate::runtime::session`] with the caller's [`ThreadPlan`], the same
//! way as the backbone's; the codec never depends on the engine. The decoder session is loaded
//! once and reused for every request. Its contract is checked at load
//! with a one-frame probe, so a wrong model fails at startup rather than on the first request.

pub mod encoder;
pub mod stream;

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Condvar, Mutex, PoisonError};

use ort::session::Session;
use ort::value::{Tensor, TensorElementType, ValueType};

use crate::package::CodecPackage;
use crate::runtime::{ThreadPlan, Turns, session};

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
    /// The intra-op threads it was loaded with (`None`: ONNX Runtime's default).
    threads: Option<usize>,
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
            threads: threads.intra_threads,
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

/// Decoder sessions that run side by side: each call takes a free one and gives it back, and
/// waits while every one is busy, so requests take turns per window, never per request.
///
/// One session is right on few cores: there two runs at once lose to taking turns (0.78x on 2
/// cores). On many cores one run cannot fill them and several at once win (8 streaming windows
/// 1.8x faster than in turn on 16 cores): docs/performance.md, "The codec beside the batch".
/// Each session holds its own copy of the decoder's weights.
pub struct CodecPool {
    free: Mutex<Vec<CodecDecoder>>,
    returned: Condvar,
    sessions: usize,
    threads: Option<usize>,
    hop: usize,
    /// Every run waits its turn with the backbone's (a small CPU: `--cpu-turns`).
    turns: Option<Arc<Turns>>,
}

/// Sessions when none are asked for: one per 4 of the codec's threads from 8 threads up (the
/// fastest split measured on 16 cores), never more than the `streams` that can run at once.
pub fn default_sessions(threads: Option<usize>, streams: usize) -> usize {
    match threads {
        Some(t) if t >= 8 => (t / 4).min(streams).max(1),
        _ => 1,
    }
}

impl CodecPool {
    /// Loads `sessions` decoders, sharing `threads` out among them.
    pub fn load(
        env: &ort::environment::Environment,
        pkg: &CodecPackage,
        threads: &ThreadPlan,
        sessions: usize,
    ) -> Result<Self, CodecError> {
        let plan = threads.split(sessions.max(1));
        let decoders = (0..sessions.max(1))
            .map(|_| CodecDecoder::load(env, pkg, &plan))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self::of(decoders))
    }

    fn of(decoders: Vec<CodecDecoder>) -> Self {
        let hop = decoders.first().map_or(0, CodecDecoder::hop);
        let threads = decoders.first().and_then(|d| d.threads);
        Self {
            sessions: decoders.len(),
            free: Mutex::new(decoders),
            returned: Condvar::new(),
            threads,
            hop,
            turns: None,
        }
    }

    /// Decodes `codes` in one run on the next free session: `codes.len() * hop` samples.
    pub fn decode(&self, codes: &[u32]) -> Result<Vec<f32>, CodecError> {
        let mut lease = self.take();
        match &self.turns {
            Some(turns) => turns.codec(codes.len(), || lease.decode(codes)),
            None => lease.decode(codes),
        }
    }

    /// Makes every [`decode`](Self::decode) take turns with the backbone runs that share `turns`.
    pub fn take_turns(&mut self, turns: Arc<Turns>) {
        self.turns = Some(turns);
    }

    /// A free session, waiting for one while all are busy.
    pub fn take(&self) -> Lease<'_> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(d) = free.pop() {
                return Lease {
                    pool: self,
                    decoder: Some(d),
                };
            }
            free = self
                .returned
                .wait(free)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// A free session, if one is.
    pub fn try_take(&self) -> Option<Lease<'_>> {
        let d = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()?;
        Some(Lease {
            pool: self,
            decoder: Some(d),
        })
    }

    pub fn sessions(&self) -> usize {
        self.sessions
    }

    /// Samples per code.
    pub fn hop(&self) -> usize {
        self.hop
    }

    /// "2 sessions x 8 threads", for logs and `bench`.
    pub fn describe(&self) -> String {
        format!(
            "{} session{} x {} threads",
            self.sessions,
            if self.sessions == 1 { "" } else { "s" },
            self.threads
                .map_or_else(|| "ORT-default".to_owned(), |n| n.to_string())
        ) + if self.turns.is_some() {
            ", taking turns with the backbone"
        } else {
            ""
        }
    }
}

impl From<CodecDecoder> for CodecPool {
    fn from(d: CodecDecoder) -> Self {
        Self::of(vec![d])
    }
}

/// A session taken from a [`CodecPool`]; it goes back when dropped (a panic in a run included:
/// a failed run leaves no state behind in the session).
pub struct Lease<'p> {
    pool: &'p CodecPool,
    decoder: Option<CodecDecoder>,
}

impl Deref for Lease<'_> {
    type Target = CodecDecoder;
    fn deref(&self) -> &CodecDecoder {
        self.decoder.as_ref().expect("held until drop")
    }
}

impl DerefMut for Lease<'_> {
    fn deref_mut(&mut self) -> &mut CodecDecoder {
        self.decoder.as_mut().expect("held until drop")
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if let Some(d) = self.decoder.take() {
            self.pool
                .free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(d);
            self.pool.returned.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::default_sessions;

    #[test]
    fn many_threads_split_into_sessions_of_four_at_most_one_per_stream() {
        assert_eq!(default_sessions(Some(2), 4), 1);
        assert_eq!(default_sessions(Some(4), 4), 1);
        assert_eq!(default_sessions(Some(8), 4), 2);
        assert_eq!(default_sessions(Some(16), 4), 4);
        assert_eq!(default_sessions(Some(16), 8), 4);
        assert_eq!(default_sessions(Some(16), 2), 2);
        assert_eq!(default_sessions(Some(16), 1), 1);
        assert_eq!(default_sessions(None, 4), 1);
    }
}
