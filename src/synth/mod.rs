//! The one path from text to audio. The CLI `say`, the server and `bench` all call
//! [`Synthesizer::synthesize`]; each stage's timing is reported through [`StageTimings`].
//!
//! This module owns the request and its outcome; the stages live in its children:
//! [`load`] (which engine, where, from which config), [`plan`] (text to pieces and their prompts,
//! and each piece's code limit), `run` (the generation loop over the pieces), `audio` (codes to
//! encoded bytes: decoding, the joins between pieces, the output pipeline) and [`timing`] (where
//! each piece lies in the audio; captions).

mod audio;
pub mod codes;
pub mod door;
pub mod load;
pub mod plan;
mod run;
pub mod timing;

use std::path::{Path, PathBuf};

use crate::audio::OutputSpec;
use crate::codec::stream::Windows;
use crate::codec::{CodecError, CodecPool};
use crate::engine::device::Device;
use crate::engine::{
    Candidates, Engine, EngineError, GenerationParams, Scheduler, SchedulerOptions, SchedulerStats,
    StopReason, WorkerHandle,
};
use crate::metrics::StageTimings;
use crate::npu::Residency;
use crate::package::ModelPackage;
use crate::prompt::{InputFormat, PromptError};
use crate::text::{Language, TextError};
use crate::voice::{Voice, VoiceError, VoiceStore};

pub use audio::{AudioTally, PIECE_PAUSE_S};
pub use codes::{
    CODES_FORMAT, CODES_FORMAT_FIRST, CODES_FORMAT_WINDOWS, CodesError, Decoding, PieceCodes,
    SpeechCodes,
};
pub use load::{EngineKind, SynthConfig, device_label, load_codec, load_engine, resolve_dir};
pub use plan::{
    BUDGET_CHARS_PER_SECOND, BUDGET_FACTOR, BUDGET_FLOOR_CODES, FrontEnd, Piece, Plan, code_budget,
};
pub use timing::{CaptionFormat, PieceTiming, Timeline, TimingError, WordTiming};

pub use door::{
    Cause, DEFAULT_MAX_INPUT_CHARS, DEFAULT_QUEUE_DEPTH, Door, Ended, Event, Events, Limits, Load,
    Permit, Refusal, Submit, Ticket,
};

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(transparent)]
    Voice(#[from] VoiceError),
    #[error(transparent)]
    Prompt(#[from] PromptError),
    /// The request's emotion is not one the model has ([`ModelPackage::emotion`]).
    #[error(transparent)]
    Emotion(#[from] crate::package::neuphonic::EmotionError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Codec(#[from] CodecError),
    #[error("the input has {got} characters; the limit is {limit} (max_input_chars)")]
    InputTooLong { got: usize, limit: usize },
    #[error("the input text is empty")]
    EmptyInput,
    #[error(
        "the word {word:?} alone needs {needed} tokens (prompt with the voice's reference plus its expected codes); the model's budget is {budget} tokens per piece"
    )]
    WordTooLong {
        word: String,
        needed: usize,
        budget: usize,
    },
    #[error(transparent)]
    Audio(#[from] crate::audio::AudioError),
    #[error(transparent)]
    Codes(#[from] CodesError),
    #[error(transparent)]
    Markup(#[from] crate::text::markup::MarkupError),
    #[error(transparent)]
    Lexicon(#[from] crate::text::markup::LexiconError),
    #[error(
        "pronunciations in IPA need a model that reads phonemes; this request's input format is {0}"
    )]
    IpaNeedsPhonemes(InputFormat),
    #[error(
        "a lexicon gives pronunciations in IPA, which need a model that reads phonemes; this request's input format is {0}"
    )]
    LexiconNeedsPhonemes(InputFormat),
    #[error(
        "the markup's pauses add up to {seconds} s; a request may pause for at most {} s in all",
        plan::MAX_TOTAL_PAUSE.as_secs()
    )]
    PausesTooLong { seconds: f64 },
    #[error("the request was cancelled before it started ({0})")]
    Cancelled(door::Cause),
    /// The front door was full or closed.
    #[error("{0}")]
    NotAdmitted(String),
}

/// One request.
#[derive(Debug, Clone, Default)]
pub struct SpeechRequest {
    pub text: String,
    pub voice: String,
    /// Defaults to the model's language (the package's record of it), else the voice's.
    pub language: Option<Language>,
    /// Defaults to the package's input format.
    pub input_format: Option<InputFormat>,
    /// An emotion the model has, as [`ModelPackage::emotion`] let it through (never
    /// "neutral": that is `None`).
    pub emotion: Option<String>,
    pub generation: GenerationParams,
    /// Format, rate, speed, and whether audio streams while codes are generated.
    pub output: OutputSpec,
    /// How the text is read: normalisation, markup, pronunciations.
    pub reading: Reading,
}

/// How a request's text is read before phonemization.
#[derive(Debug, Clone)]
pub struct Reading {
    /// Written-to-spoken normalisation ("$5" → "five dollars"); on unless turned off.
    pub normalize: bool,
    /// Pause and pronunciation markup in the text ([`crate::text::markup`]); off unless asked,
    /// so ordinary text with brackets is never read as markup.
    pub markup: bool,
    /// Words spoken with given IPA, over the server's lexicon.
    pub lexicon: Option<std::sync::Arc<crate::text::markup::Lexicon>>,
}

impl Default for Reading {
    fn default() -> Self {
        Self {
            normalize: true,
            markup: false,
            lexicon: None,
        }
    }
}

/// What the caller sees while a request runs.
#[derive(Debug)]
pub enum SynthEvent<'a> {
    /// The prompt is built; `estimated_codes` is a guess from the phoneme count for progress bars.
    Started {
        prompt_tokens: usize,
        estimated_codes: usize,
    },
    /// A piece of a long text starts (pieces are sentences or clauses grouped to fit the budget).
    Piece {
        index: usize,
        count: usize,
        text: &'a str,
        prompt_tokens: usize,
        /// Codes this piece may generate at most: its text's code budget, bounded by the context
        /// after its prompt and by what is left of the request's max_new_tokens.
        max_new_tokens: usize,
    },
    /// One more code was generated (index counts over the whole request).
    Code { index: usize, code: u32 },
    /// Encoded audio bytes of the requested format, in order.
    Audio(&'a [u8]),
    /// A piece's samples have all gone into the output: where it lies there, exact to the
    /// sample, with estimated word times. A streamed request has handed out their bytes in the
    /// `Audio` events before this one, so a streaming consumer can send each piece's captions as
    /// its audio goes (a whole file's container may hold bytes back until its end).
    Timing(&'a PieceTiming),
    /// Bytes that overwrite the output at `offset` (counted from its first byte), sent after the
    /// last `Audio`: a whole (not streamed) WAV, FLAC or MP3 says at its front what only its end
    /// knows (length, STREAMINFO, Info tag), so a placeholder of the same size goes out first
    /// and this replaces it. Whoever keeps the bytes applies it ([`crate::audio::apply_patch`]
    /// for a `Vec`); a streamed response never has one.
    Patch { offset: u64, bytes: &'a [u8] },
}

/// What one request produced.
#[derive(Debug, Clone)]
pub struct SynthesisReport {
    pub codes: Vec<u32>,
    pub prompt_tokens: usize,
    /// Of those, tokens whose KV came from the voice-prefix cache (not prefilled).
    pub cached_tokens: usize,
    pub seed: u64,
    /// Why the request ended: cancelled; else `Length` when any piece stopped at its limit
    /// (text budget, context or max_new_tokens) or pieces were left out; else the last stop id.
    pub stop: StopReason,
    /// Decoded samples at the codec rate (before any speed change or resampling).
    pub samples: usize,
    pub sample_rate: u32,
    pub speed: f32,
    pub bytes: usize,
    /// The pieces that ran, in order: one unless the text was longer than the budget allows.
    pub pieces: Vec<PieceOutcome>,
    /// Pieces the text was cut into; more than ran when max_new_tokens ran out or the request
    /// was cancelled (the joins of the audio were planned for these).
    pub planned_pieces: usize,
    /// Where each piece whose audio all went out lies in the output, in seconds (captions).
    pub timeline: Timeline,
    pub timings: StageTimings,
    /// On the NPU: commands its driver counted as completed for this request, summed over its
    /// pieces (`None`: not on the NPU, or no piece could be counted).
    pub npu_commands: Option<u64>,
}

/// What one piece of a request was given and made.
#[derive(Debug, Clone, PartialEq)]
pub struct PieceOutcome {
    pub text: String,
    pub prompt_ids: Vec<u32>,
    /// The piece's code limit (see [`plan::code_budget`]).
    pub max_new_tokens: usize,
    /// The seed its sampler ran with.
    pub seed: u64,
    pub stop: StopReason,
    pub codes: Vec<u32>,
    /// Silence before the piece's audio asked for by markup (else the join's default).
    pub pause_before: Option<std::time::Duration>,
    /// Silence after it (markup at the end of the text).
    pub pause_after: Option<std::time::Duration>,
}

impl SynthesisReport {
    /// Seconds of audio delivered (after the speed change).
    pub fn audio_seconds(&self) -> f64 {
        self.samples as f64 / f64::from(self.sample_rate) / f64::from(self.speed)
    }

    /// The run's rates and stage times.
    pub fn numbers(&self) -> crate::metrics::RunNumbers {
        let mut n = crate::metrics::RunNumbers::new(
            self.codes.len(),
            self.stop.finish_reason(),
            self.prompt_tokens,
            self.cached_tokens,
            self.audio_seconds(),
            &self.timings,
        );
        n.npu_commands = self.npu_commands;
        n
    }

    /// Codes were made on `--device npu`, yet the NPU's driver counted no command for them: the
    /// model ran on the CPU for this request.
    pub fn npu_idle(&self) -> bool {
        self.npu_commands == Some(0) && !self.codes.is_empty()
    }
}

/// The loaded model, codec and voices; shared by every request. The engine lives on the
/// scheduler's thread: requests run side by side, each on its caller's thread for the front end
/// and the audio, with their generations batched there.
pub struct Synthesizer {
    front: FrontEnd,
    scheduler: Scheduler,
    codec: CodecPool,
    candidates: Candidates,
    device: Device,
    /// The engine's worker child, readable without asking the scheduler (for /health).
    worker: Option<WorkerHandle>,
    /// Tokens per piece: the package's budget, or the engine's when smaller (a static KV cache).
    budget: usize,
    /// The in-process engine's description (a worker's is read live from its handle).
    description: String,
    /// Wait before the one retry of a whole-file request that failed transiently; `None`: no
    /// retry. On the NPU [`crate::engine::worker::NPU_RETRY_DELAY`], elsewhere none.
    retry: Option<std::time::Duration>,
    /// The window layout of streamed decoding (`--stream-windows`).
    windows: Windows,
}

impl Synthesizer {
    pub fn load(cfg: &SynthConfig) -> Result<Self, crate::Error> {
        let front = FrontEnd::load(cfg)?;
        let mut engine = load_engine(cfg, front.package())?;
        // The codec's default sessions follow the streams that will really run at once.
        let streams = Scheduler::places(engine.as_mut(), &cfg.scheduler);
        let mut codec = load_codec(cfg, &front.package().codec, streams)?;
        let here_on_cpu = engine.device() == Device::Cpu && engine.worker().is_none();
        let cores = crate::runtime::CpuTopology::detect().usable_cores();
        let threads = |explicit| {
            crate::runtime::ThreadPlan::for_process(cfg.ort.threads, explicit, None)
                .intra_threads
                .unwrap_or(cores)
        };
        let threads = threads(cfg.ort.intra_threads) + threads(cfg.codec_threads);
        if cfg.cpu_turns.resolve(here_on_cpu, cores, threads) {
            let turns = std::sync::Arc::new(crate::runtime::Turns::new());
            if engine.take_turns(turns.clone()) {
                codec.take_turns(turns);
            } else {
                tracing::info!(
                    "--cpu-turns: the backbone does not run in this process ({}), so it and \
                     the codec overlap",
                    engine.describe()
                );
            }
        }
        let mut me = Self::from_parts(front, engine, codec, cfg.scheduler)?;
        me.windows = cfg.stream_windows;
        Ok(me)
    }

    /// Assembles a synthesizer from loaded parts (other backbones, tests).
    pub fn from_parts(
        front: FrontEnd,
        engine: Box<dyn Engine>,
        codec: impl Into<CodecPool>,
        scheduler: SchedulerOptions,
    ) -> Result<Self, crate::Error> {
        let pkg = front.package();
        let candidates = Candidates::of(pkg);
        let device = engine.device();
        let worker = engine.worker();
        let description = engine.describe();
        let budget = engine.budget().map_or(pkg.genai.token_budget(), |b| {
            b.min(pkg.genai.token_budget())
        });
        let scheduler = Scheduler::start(engine, candidates.clone(), scheduler)?;
        Ok(Self {
            retry: (device == Device::Npu).then_some(crate::engine::worker::NPU_RETRY_DELAY),
            budget,
            front,
            scheduler,
            codec: codec.into(),
            candidates,
            device,
            worker,
            description,
            windows: Windows::VENDOR,
        })
    }

    /// Requests whose generations run side by side at most (1: the engine runs one at a time).
    pub fn max_batch(&self) -> usize {
        self.scheduler.max_batch()
    }

    /// The scheduler's live numbers (batch size, steps).
    pub fn scheduler_stats(&self) -> &SchedulerStats {
        self.scheduler.stats()
    }

    /// The window layout streamed requests decode in.
    pub fn stream_windows(&self) -> Windows {
        self.windows
    }

    /// Decode streamed requests in `windows` instead (for synthesizers built from parts).
    pub fn set_stream_windows(&mut self, windows: Windows) {
        self.windows = windows;
    }

    /// The codec's sessions and threads ("2 sessions x 8 threads").
    pub fn codec_description(&self) -> String {
        self.codec.describe()
    }

    /// Where the backbone runs.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The worker child behind the engine, if it runs in one.
    pub fn worker(&self) -> Option<&WorkerHandle> {
        self.worker.as_ref()
    }

    /// The NPU residency verdict of the worker's latest load (`None` off the NPU).
    pub fn residency(&self) -> Option<Residency> {
        self.worker.as_ref().and_then(WorkerHandle::residency)
    }

    /// The ONNX Runtime library the backbone runs on and why that one: the worker's when there is
    /// a worker, else this process's.
    pub fn runtime(&self) -> Option<String> {
        if let Some(w) = &self.worker {
            return w.loaded().and_then(|l| l.runtime);
        }
        crate::runtime::info()
            .map(|i| format!("{} ({}; {})", i.path.display(), i.version, i.source))
    }

    /// Where the backbone runs, as far as it was observed: an NPU load is "npu" only while its
    /// residency is proven, else "cpu fallback" (it was let through by --allow-cpu-fallback).
    /// Every rate printed next to this label is labelled truthfully.
    pub fn device_label(&self) -> String {
        device_label(self.device, self.residency().as_ref())
    }

    /// Where one request ran, as observed: [`Synthesizer::device_label`], except that a request
    /// for which the NPU completed no command is "cpu fallback" whatever the load proved.
    pub fn ran_on(&self, report: &SynthesisReport) -> String {
        if report.npu_idle() {
            "cpu fallback".to_owned()
        } else {
            self.device_label()
        }
    }

    pub fn front_end(&self) -> &FrontEnd {
        &self.front
    }

    pub fn package(&self) -> &ModelPackage {
        self.front.package()
    }

    /// The voices now (a snapshot: a voice added later is in the next call's).
    pub fn voices(&self) -> std::sync::Arc<VoiceStore> {
        self.front.voices()
    }

    /// Saves a new voice in `dir` (atomically, never replacing a file) and makes it usable by
    /// every request from now on. Refuses a name any installed voice has, wherever it lives.
    pub fn install_voice(&self, voice: &Voice, dir: &Path) -> Result<PathBuf, VoiceError> {
        if let Some(path) = self.voices().path_of(&voice.name) {
            return Err(VoiceError::Exists(path.to_path_buf()));
        }
        let path = VoiceStore::save(dir, voice, false)?;
        self.front
            .update_voices(|s| s.insert(voice.clone(), path.clone()));
        Ok(path)
    }

    /// Deletes a voice whose file is in `dir` and stops offering it; a voice read from another
    /// directory (a shipped one) is refused.
    pub fn uninstall_voice(&self, name: &str, dir: &Path) -> Result<Voice, VoiceError> {
        let store = self.voices();
        let voice = store.get(name)?.clone();
        let path = store.path_of(&voice.name).unwrap_or(dir).to_path_buf();
        let same = |a: &Path| match (std::fs::canonicalize(a), std::fs::canonicalize(dir)) {
            (Ok(a), Ok(b)) => a == b,
            _ => a == dir,
        };
        // Only a voice made over HTTP (with its custom record) in the store goes: a store set to
        // the shipped voices' folder must not let a client delete them.
        if voice.custom.is_none() || !path.parent().is_some_and(same) {
            return Err(VoiceError::NotRemovable {
                name: voice.name,
                path,
                dir: dir.to_path_buf(),
            });
        }
        VoiceStore::remove(dir, &voice.name)?;
        self.front.update_voices(|s| {
            s.forget(&voice.name);
        });
        Ok(voice)
    }

    pub fn candidates(&self) -> &Candidates {
        &self.candidates
    }

    /// The engine as it is now: a worker's pid and load are read live (a respawned worker is
    /// the one named).
    pub fn engine_description(&self) -> String {
        self.worker
            .as_ref()
            .and_then(WorkerHandle::describe)
            .unwrap_or_else(|| self.description.clone())
    }

    /// Retries a whole-file request once after `delay` when it fails transiently
    /// ([`crate::engine::EngineError::is_transient`]); `None` turns retries off.
    pub fn with_retry(mut self, delay: Option<std::time::Duration>) -> Self {
        self.retry = delay;
        self
    }
}
