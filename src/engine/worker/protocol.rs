//! The engine worker's wire protocol: framed JSON messages over the child's stdin (requests) and
//! a private copy of its stdout (replies).
//!
//! A frame is a 4-byte little-endian length followed by that many bytes of one JSON message
//! (at most [`MAX_FRAME`]). JSON keeps the stream readable in a hex dump and costs nothing at
//! 50-70 codes a second. Every message is an object with a `"type"` tag:
//!
//! Parent -> worker ([`Request`]):
//! - `load {package_dir, ort_lib, ort: {intra_threads, kv_mode, prefill_chunk, device, ...},
//!   roots, evidence_steps}`: load the backbone only (no tokenizer, no codec) on the device;
//! - `generate {id, prompt, candidates, params}`: one generation; the worker streams `code`s;
//! - `cancel {id}`: stop generation `id` within one step (it still ends with `done`);
//! - `shutdown`: release the model and exit (end of stdin means the same).
//!
//! Worker -> parent ([`Reply`]):
//! - `hello {protocol, pid, version, env}`: first, before anything is loaded; `env` is the NPU
//!   environment as the worker sees it (XILINX_XRT, LD_LIBRARY_PATH, RYZENAI_EP_PATH);
//! - `loaded {engine, device, providers, runtime, placement, provider_setup, residency}`: the
//!   backbone is ready; `providers` are the execution providers the session was built with,
//!   `placement` where ONNX Runtime put the nodes, and on the NPU what the provider was given and
//!   the residency verdict from the worker's own evidence (an evidence run of a few steps);
//! - `code {id, code}`: one speech code (0..65535), as it is made;
//! - `done {id, summary}`: the generation ended (stop reason, counts, seed, timings, and on the
//!   NPU the commands its driver counted as completed for it);
//! - `error {id, error}`: a request failed (`id` null: the load failed).
//!
//! The worker's logs go to its stderr, one line each, which the parent forwards into its own log.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::{
    Candidates, Device, EngineError, Generation, GenerationParams, OgaOptions, OrtOptions,
    ProviderSetup, StopReason,
};
use crate::npu::SystemRoots;
use crate::npu::residency::{Placement, Residency};

/// Bumped when a message changes shape; `hello` carries it and the parent refuses a mismatch.
/// 2: `loaded`'s placement carries node names' weights; `done` carries NPU command counts.
pub const PROTOCOL_VERSION: u32 = 2;
/// Largest frame either side accepts (a prompt of the whole 4K budget is ~40 KB).
pub const MAX_FRAME: usize = 16 << 20;

/// The variables the worker reports in `hello` (the ones the NPU environment rules set, and
/// XRT's configuration file).
pub const REPORTED_ENV: [&str; 5] = [
    crate::npu::env::XILINX_XRT_VAR,
    crate::npu::env::LD_LIBRARY_PATH_VAR,
    crate::npu::env::RYZENAI_EP_PATH_VAR,
    crate::npu::env::RYZEN_AI_INSTALLATION_PATH_VAR,
    crate::npu::doctor::XRT_INI_PATH_VAR,
];

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Request {
    // Boxed: a load carries all the session settings; it is sent once per worker.
    Load(Box<Load>),
    Generate(Generate),
    Cancel { id: u64 },
    Shutdown,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Load {
    pub package_dir: PathBuf,
    /// libonnxruntime.so to load (else the worker's own search: ORT_DYLIB_PATH, the venv, ...).
    pub ort_lib: Option<PathBuf>,
    /// Session options, including the device.
    pub ort: OrtOptions,
    /// Where /sys, /dev and /proc are for the residency evidence (tests fake them).
    #[serde(default)]
    pub roots: SystemRoots,
    /// On the NPU: decode steps of the evidence run after the load (device busy time must grow
    /// across them for residency to be proven).
    #[serde(default = "default_evidence_steps")]
    pub evidence_steps: usize,
    /// Run onnxruntime-genai's loop (`--engine oga`) instead of ours; it attaches the package's
    /// providers itself, the RyzenAI provider included.
    #[serde(default)]
    pub oga: Option<OgaOptions>,
}

/// Enough steps for the device's busy counter to move, few enough to cost nothing next to a load.
pub const EVIDENCE_STEPS: usize = 8;

fn default_evidence_steps() -> usize {
    EVIDENCE_STEPS
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Generate {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub candidates: Candidates,
    pub params: GenerationParams,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Hello(Hello),
    // Boxed: the residency evidence makes it far larger than the per-code messages.
    Loaded(Box<Loaded>),
    Code { id: u64, code: u32 },
    Done { id: u64, summary: Summary },
    Error { id: Option<u64>, error: WireError },
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub pid: u32,
    /// The crate version of the worker binary.
    pub version: String,
    /// [`REPORTED_ENV`] as the worker sees them (`None`: unset).
    pub env: BTreeMap<String, Option<String>>,
}

impl Hello {
    pub fn from_process() -> Self {
        Hello {
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").into(),
            env: REPORTED_ENV
                .iter()
                .map(|k| {
                    (
                        (*k).to_owned(),
                        std::env::var_os(k).map(|v| v.to_string_lossy().into_owned()),
                    )
                })
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Loaded {
    /// The backbone's own description.
    pub engine: String,
    pub device: Device,
    /// Execution providers the session was built with, in priority order.
    pub providers: Vec<String>,
    /// The ONNX Runtime library the worker loaded and its version.
    pub runtime: Option<String>,
    /// Where ONNX Runtime placed the graph's nodes (`None`: it could not say).
    #[serde(default)]
    pub placement: Option<Placement>,
    /// On the NPU: everything the RyzenAI provider was given.
    #[serde(default)]
    pub provider_setup: Option<ProviderSetup>,
    /// On the NPU: the residency verdict from the worker's own evidence.
    #[serde(default)]
    pub residency: Option<Residency>,
    /// On the NPU: whether the worker refuses fork and exec now that its session exists
    /// (`npu::fork_guard::REFUSED`, or why the guard could not be installed).
    #[serde(default)]
    pub fork_guard: Option<String>,
    /// Most tokens one sequence may hold (a static KV cache may hold fewer than the config says).
    #[serde(default)]
    pub budget: Option<usize>,
}

/// How a generation ended; the codes themselves went out as `code` messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Codes generated (equal to the `code` messages sent for this id).
    pub codes: usize,
    pub stop: StopReason,
    pub prompt_tokens: usize,
    pub seed: u64,
    pub prefill_us: u64,
    pub decode_us: u64,
    /// On the NPU: commands its driver counted as completed for the worker during this
    /// generation (`None`: not on the NPU, or the counters could not be read).
    #[serde(default)]
    pub npu_commands: Option<u64>,
}

impl Summary {
    pub fn of(g: &Generation) -> Self {
        Summary {
            codes: g.codes.len(),
            stop: g.stop,
            prompt_tokens: g.prompt_tokens,
            seed: g.seed,
            prefill_us: micros(g.prefill),
            decode_us: micros(g.decode),
            npu_commands: g.npu_commands,
        }
    }

    /// The generation these codes and this summary describe.
    pub fn into_generation(self, codes: Vec<u32>, stop: StopReason) -> Generation {
        Generation {
            codes,
            stop,
            prompt_tokens: self.prompt_tokens,
            seed: self.seed,
            prefill: Duration::from_micros(self.prefill_us),
            decode: Duration::from_micros(self.decode_us),
            // The child's backbone has the cores to itself: it takes no turns with a codec.
            turn_wait: crate::runtime::TurnWait::default(),
            npu_commands: self.npu_commands,
            // The worker runs one request at a time, with no prefix cache.
            cached_tokens: 0,
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// [`EngineError`] on the wire: the kinds callers map differently (400 vs 503) keep their kind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "detail", rename_all = "snake_case")]
pub enum WireError {
    PromptTooLong {
        prompt: usize,
        budget: usize,
    },
    StaticKvFull {
        prompt: usize,
        capacity: usize,
    },
    EmptyPrompt,
    Runtime(String),
    Graph(String),
    Sample(String),
    Params(String),
    Device(String),
    /// Anything else, as its message (package errors, protocol misuse).
    Other(String),
}

impl From<&EngineError> for WireError {
    fn from(e: &EngineError) -> Self {
        match e {
            EngineError::PromptTooLong { prompt, budget } => WireError::PromptTooLong {
                prompt: *prompt,
                budget: *budget,
            },
            EngineError::StaticKvFull { prompt, capacity } => WireError::StaticKvFull {
                prompt: *prompt,
                capacity: *capacity,
            },
            EngineError::EmptyPrompt => WireError::EmptyPrompt,
            EngineError::Runtime(m) => WireError::Runtime(m.clone()),
            EngineError::Graph(m) => WireError::Graph(m.clone()),
            EngineError::Sample(s) => WireError::Sample(s.to_string()),
            EngineError::Params(m) => WireError::Params(m.clone()),
            EngineError::Sampling(s) => WireError::Params(s.to_string()),
            EngineError::Device(m) => WireError::Device(m.clone()),
            other => WireError::Other(other.to_string()),
        }
    }
}

impl From<WireError> for EngineError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::PromptTooLong { prompt, budget } => {
                EngineError::PromptTooLong { prompt, budget }
            }
            WireError::StaticKvFull { prompt, capacity } => {
                EngineError::StaticKvFull { prompt, capacity }
            }
            WireError::EmptyPrompt => EngineError::EmptyPrompt,
            WireError::Runtime(m) => EngineError::Runtime(m),
            WireError::Graph(m) => EngineError::Graph(m),
            // The sampler's errors carry numbers only a local run has; the message is kept.
            WireError::Sample(m) => EngineError::Runtime(format!("sampling: {m}")),
            WireError::Params(m) => EngineError::Params(m),
            WireError::Device(m) => EngineError::Device(m),
            WireError::Other(m) => EngineError::Worker(m),
        }
    }
}

/// Writes one frame and flushes.
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    if body.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("message of {} bytes exceeds {MAX_FRAME}", body.len()),
        ));
    }
    let len = u32::try_from(body.len()).map_err(io::Error::other)?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()
}

/// Reads one frame. `Ok(None)` at end of stream on a frame boundary; end of stream inside a
/// frame, an oversized length or bad JSON are errors.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    let mut got = 0;
    while got < len.len() {
        match r.read(&mut len[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "end of stream inside a frame header",
                ));
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {n} bytes exceeds {MAX_FRAME} (not a worker stream?)"),
        ));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SamplingParams;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        let msgs = vec![
            Request::Load(Box::new(Load {
                package_dir: "/m".into(),
                ort_lib: None,
                ort: OrtOptions {
                    device: Device::Npu,
                    ..OrtOptions::default()
                },
                roots: SystemRoots::under("/fake"),
                evidence_steps: 3,
                oga: None,
            })),
            Request::Generate(Generate {
                id: 7,
                prompt: vec![1, 2, 3],
                candidates: Candidates {
                    speech_first: 684,
                    speech_count: 65_536,
                    stop_ids: vec![683, 656],
                },
                params: GenerationParams {
                    sampling: SamplingParams {
                        temperature: 0.7,
                        top_k: 50,
                        top_p: 0.95,
                        seed: Some(u64::MAX),
                    },
                    min_new_tokens: 50,
                    max_new_tokens: None,
                },
            }),
            Request::Cancel { id: 7 },
            Request::Shutdown,
        ];
        let mut buf = Vec::new();
        for m in &msgs {
            write_frame(&mut buf, m).expect("write");
        }
        let mut r = &buf[..];
        let mut back = Vec::new();
        while let Some(m) = read_frame::<_, Request>(&mut r).expect("read") {
            back.push(m);
        }
        assert_eq!(format!("{msgs:?}"), format!("{back:?}"));
        // The f32 knobs and the u64 seed survive exactly.
        let Request::Generate(g) = &back[1] else {
            panic!("order")
        };
        assert_eq!(g.params.sampling.temperature, 0.7f32);
        assert_eq!(g.params.sampling.seed, Some(u64::MAX));
    }

    #[test]
    fn torn_and_oversized_frames_are_errors() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &Reply::Code { id: 1, code: 5 }).expect("write");
        let json = String::from_utf8_lossy(&buf[4..]).into_owned();
        assert_eq!(json, r#"{"type":"code","id":1,"code":5}"#);
        let torn = &buf[..buf.len() - 1];
        assert!(read_frame::<_, Reply>(&mut &torn[..]).is_err());
        assert!(read_frame::<_, Reply>(&mut &buf[..2]).is_err());
        let huge = (MAX_FRAME as u32 + 1).to_le_bytes();
        assert!(read_frame::<_, Reply>(&mut &huge[..]).is_err());
    }

    #[test]
    fn errors_keep_their_kind() {
        let e = EngineError::PromptTooLong {
            prompt: 5000,
            budget: 4096,
        };
        let back = EngineError::from(WireError::from(&e));
        assert!(matches!(
            back,
            EngineError::PromptTooLong {
                prompt: 5000,
                budget: 4096
            }
        ));
        let e = EngineError::StaticKvFull {
            prompt: 600,
            capacity: 512,
        };
        let back = EngineError::from(WireError::from(&e));
        assert_eq!(back.to_string(), e.to_string());
        let back = EngineError::from(WireError::from(&EngineError::Device("No RyzenAI".into())));
        assert_eq!(back.to_string(), "device: No RyzenAI");
    }
}
