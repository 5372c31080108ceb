//! The one path from text to audio. The CLI `say`, the server and `bench` all call
//! [`Synthesizer::synthesize`]; each stage's timing is reported through [`StageTimings`].

use std::cell::Cell;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::audio::{OutputPipeline, OutputSpec};
use crate::codec::stream::{StreamDecoder, StreamError, decode_whole};
use crate::codec::{CodecDecoder, CodecError};
use crate::engine::device::{self, Device, DeviceChoice};
use crate::engine::{
    self, CancelToken, Candidates, Engine, EngineError, GenerationParams, LocalEngine, OgaOptions,
    OrtOptions, ResidencyGate, StopReason, WorkerConfig, WorkerEngine, WorkerHandle,
    WorkerTimeouts,
};
use crate::metrics::StageTimings;
use crate::npu::Residency;
use crate::package::ModelPackage;
use crate::prompt::{self, InputFormat, PromptError, PromptInput};
use crate::text::{self, Language, Phonemizer, TextError};
use crate::voice::{Voice, VoiceError, VoiceStore};

/// Longest input text accepted by default, in characters.
pub const DEFAULT_MAX_INPUT_CHARS: usize = 20_000;

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error(transparent)]
    Text(#[from] TextError),
    #[error(transparent)]
    Voice(#[from] VoiceError),
    #[error(transparent)]
    Prompt(#[from] PromptError),
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
    #[error("the engine is unavailable: a previous request panicked inside it")]
    Poisoned,
}

/// How to build a [`Synthesizer`].
#[derive(Debug, Clone, Default)]
pub struct SynthConfig {
    pub package_dir: PathBuf,
    pub codec_dir: Option<PathBuf>,
    pub ort_lib: Option<PathBuf>,
    pub voice_dirs: Vec<PathBuf>,
    pub ort: OrtOptions,
    pub codec_threads: Option<usize>,
    /// 0 means [`DEFAULT_MAX_INPUT_CHARS`].
    pub max_input_chars: usize,
    /// Which generation loop runs the backbone.
    pub engine: EngineKind,
    /// The oga engine's library and settings; its threads and KV mode default to `ort`'s.
    pub oga: OgaOptions,
    /// Where the backbone runs (`--device`); `ort.device` is replaced by what this resolves to.
    pub device: DeviceChoice,
    /// Run the backbone in a worker child whatever the device (the NPU always is).
    pub isolate: bool,
    /// Refuse to start unless the backbone is proven resident on the NPU (also refuses `auto`
    /// resolving to the CPU).
    pub require_npu: bool,
    /// `--device npu` serves even when residency is not proven (the backbone then runs, at least
    /// partly, on the CPU and is labelled "cpu fallback"); without it such a load is refused.
    pub allow_cpu_fallback: bool,
    /// The RyzenAI provider library for the worker (RYZENAI_EP_PATH); `None`: the environment
    /// rules' choice.
    pub ep_library: Option<PathBuf>,
    /// Let the parent SIGKILL a worker that outlives the stop grace (never one holding the NPU).
    pub allow_kill: bool,
    /// The program started as `<exe> worker`; `None`: this executable.
    pub worker_exe: Option<PathBuf>,
    /// How long a worker may take to load, and to make each step of a request, before it counts
    /// as hung (`--load-timeout`, `--step-timeout`).
    pub worker_timeouts: WorkerTimeouts,
}

impl SynthConfig {
    /// With `--engine oga`: onnxruntime-genai's settings, its runtime, threads and KV mode
    /// defaulting to the ort engine's; `None` for our own loop.
    pub fn oga_options(&self) -> Option<OgaOptions> {
        (self.engine == EngineKind::Oga).then(|| {
            let mut opts = self.oga.clone();
            opts.ort_lib = opts.ort_lib.or_else(|| self.ort_lib.clone());
            opts.intra_threads = opts.intra_threads.or(self.ort.intra_threads);
            opts.kv_mode = opts.kv_mode.or(self.ort.kv_mode);
            opts
        })
    }
}

/// The backbone's generation loop: our own over ONNX Runtime (default), or onnxruntime-genai's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EngineKind {
    #[default]
    Ort,
    Oga,
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ort" => Ok(Self::Ort),
            "oga" => Ok(Self::Oga),
            _ => Err(format!("unknown engine {s:?} (supported: ort, oga)")),
        }
    }
}

/// Loads the engine a config asks for over a loaded package: resolves `--device`, then runs the
/// backbone in this process (cpu, cuda) or in a worker child (npu, or any device with
/// `isolate`). On the NPU the worker's residency gate applies to this load and every respawn:
/// only a proven residency serves, unless `allow_cpu_fallback` (never with `require_npu`).
pub fn load_engine(cfg: &SynthConfig, pkg: &ModelPackage) -> Result<Box<dyn Engine>, crate::Error> {
    let declared = pkg.genai.model.decoder.session_options.declares_ryzenai();
    let root = std::env::var_os(crate::npu::env::RYZENAI_ROOT_VAR)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let decision = device::resolve(cfg.device, declared, root.as_deref());
    tracing::info!("device: {} ({})", decision.device, decision.why);
    if cfg.require_npu && decision.device != Device::Npu {
        return Err(EngineError::Device(format!(
            "--require-npu: the backbone would run on {} ({}); refusing to fall back",
            decision.device, decision.why
        ))
        .into());
    }
    if decision.device == Device::Npu && !declared {
        tracing::warn!(
            "--device npu: {} declares no RyzenAI provider in genai_config.json, so the worker \
             gets no NPU environment; this is not an NPU package",
            pkg.dir.display()
        );
    }
    let ort = OrtOptions {
        device: decision.device,
        ..cfg.ort.clone()
    };
    let oga = cfg.oga_options();
    if decision.device == Device::Npu || cfg.isolate {
        let mut wcfg = WorkerConfig::from_process(
            pkg.dir.clone(),
            cfg.ort_lib.clone(),
            ort,
            declared,
            cfg.worker_exe.clone(),
        )?;
        wcfg.stop.allow_kill = cfg.allow_kill;
        wcfg.timeouts = cfg.worker_timeouts;
        wcfg.gate = (decision.device == Device::Npu).then_some(ResidencyGate {
            require_npu: cfg.require_npu,
            allow_cpu_fallback: cfg.allow_cpu_fallback,
        });
        wcfg.ep_library = cfg.ep_library.clone();
        wcfg.oga = oga;
        let mut worker = WorkerEngine::new(wcfg);
        worker.start()?;
        return Ok(Box::new(worker));
    }
    match oga {
        None => {
            let env = crate::runtime::environment(cfg.ort_lib.as_deref())?;
            let backbone = engine::OrtBackbone::load(env, pkg, &ort)?;
            Ok(Box::new(LocalEngine(Box::new(backbone))))
        }
        Some(opts) => {
            let backbone = engine::OgaBackbone::load(pkg, &opts)?;
            Ok(Box::new(LocalEngine(Box::new(backbone))))
        }
    }
}

/// Where a backbone runs, as far as it was observed: an NPU load is "npu" only with proven
/// residency, else "cpu fallback" (it was let through by --allow-cpu-fallback).
pub fn device_label(device: Device, residency: Option<&Residency>) -> String {
    match device {
        Device::Npu => match residency {
            Some(r) if r.is_proven() => "npu".to_owned(),
            _ => "cpu fallback".to_owned(),
        },
        other => other.to_string(),
    }
}

/// One request.
#[derive(Debug, Clone, Default)]
pub struct SpeechRequest {
    pub text: String,
    pub voice: String,
    /// Defaults to the voice's language.
    pub language: Option<Language>,
    /// Defaults to the package's input format.
    pub input_format: Option<InputFormat>,
    pub emotion: Option<String>,
    pub generation: GenerationParams,
    /// Format, rate, speed, and whether audio streams while codes are generated.
    pub output: OutputSpec,
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
}

/// What one request produced.
#[derive(Debug, Clone)]
pub struct SynthesisReport {
    pub codes: Vec<u32>,
    pub prompt_tokens: usize,
    pub seed: u64,
    /// Why the request ended: cancelled; else `Length` when any piece stopped at its limit
    /// (text budget, context or max_new_tokens) or pieces were left out; else the last stop id.
    pub stop: StopReason,
    /// Decoded samples at the codec rate (before any speed change or resampling).
    pub samples: usize,
    pub sample_rate: u32,
    pub speed: f32,
    pub bytes: usize,
    /// Pieces the text was cut into (1 unless it was longer than the budget allows).
    pub pieces: usize,
    pub timings: StageTimings,
}

impl SynthesisReport {
    /// Seconds of audio delivered (after the speed change).
    pub fn audio_seconds(&self) -> f64 {
        self.samples as f64 / f64::from(self.sample_rate) / f64::from(self.speed)
    }
}

/// Text to prompt ids: the package's tokenizer, the voices and the phonemizer. Needs no runtime,
/// so `onebit-tts prompt` can use it alone.
pub struct FrontEnd {
    pkg: ModelPackage,
    phonemizer: OnceLock<Result<Phonemizer, String>>,
    voices: VoiceStore,
    max_input_chars: usize,
}

impl FrontEnd {
    pub fn new(pkg: ModelPackage, voices: VoiceStore, max_input_chars: usize) -> Self {
        Self {
            pkg,
            phonemizer: OnceLock::new(),
            voices,
            max_input_chars: if max_input_chars == 0 {
                DEFAULT_MAX_INPUT_CHARS
            } else {
                max_input_chars
            },
        }
    }

    /// Loads the package and voices a config names.
    pub fn load(cfg: &SynthConfig) -> Result<Self, crate::Error> {
        let pkg = ModelPackage::load(&cfg.package_dir, cfg.codec_dir.as_deref())?;
        let voices = VoiceStore::open(&cfg.voice_dirs)?;
        Ok(Self::new(pkg, voices, cfg.max_input_chars))
    }

    pub fn package(&self) -> &ModelPackage {
        &self.pkg
    }

    pub fn voices(&self) -> &VoiceStore {
        &self.voices
    }

    fn phonemizer(&self) -> Result<&Phonemizer, TextError> {
        self.phonemizer
            .get_or_init(|| Phonemizer::discover().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| TextError::Unavailable(e.clone()))
    }

    /// Text in the model's input format for one piece of text.
    fn prepare_text(
        &self,
        text: &str,
        format: InputFormat,
        lang: Language,
    ) -> Result<String, TextError> {
        match format {
            InputFormat::Phonemes => {
                let clean = text::normalize(text)?;
                self.phonemizer()?.phonemize(&clean, lang)
            }
            InputFormat::Bpe => text::normalize_bpe(text),
        }
    }
}

/// One piece of a request's text with its prompt.
#[derive(Debug, Clone)]
pub struct Piece {
    /// The piece's source text (normalised).
    pub text: String,
    /// The text in the model's input format (phonemes or normalised BPE text).
    pub prepared: String,
    pub ids: Vec<u32>,
    /// Codes this piece is expected to need, from the voice's speaking rate.
    pub estimated_codes: usize,
    /// Codes this piece may make at most, from its text ([`code_budget`]).
    pub max_codes: usize,
}

/// Speaking rate the code budget assumes, in characters of prepared text (phonemes, or the
/// normalised text of a BPE model) per second. The vendor's five reference voices speak 16-23
/// transcript characters per second (dave 172 in 7.4 s, mateo 103 in 6.4 s) and an espeak
/// phoneme string is about as long as its text, so 15 is a slow reader.
pub const BUDGET_CHARS_PER_SECOND: f64 = 15.0;
/// How much longer than that estimate a piece may run: room for pauses, slow voices and a
/// model that drawls, while a model that never says its end token stops within a few times the
/// text's length instead of at the context limit (79 s of audio for "hi").
pub const BUDGET_FACTOR: f64 = 3.0;
/// Codes every piece may make whatever its length (2 s): a one-word piece's onset and release
/// are most of its audio.
pub const BUDGET_FLOOR_CODES: usize = 100;

/// The most codes a piece of prepared text may generate: 50 codes/s x its estimated seconds x
/// [`BUDGET_FACTOR`] + [`BUDGET_FLOOR_CODES`], i.e. 10 codes per character plus 100 ("hi", four
/// phoneme characters, gets 140 codes: 2.8 s).
pub fn code_budget(prepared: &str) -> usize {
    let seconds = prepared.chars().count() as f64 / BUDGET_CHARS_PER_SECOND;
    (seconds * crate::package::CODES_PER_SECOND * BUDGET_FACTOR).ceil() as usize
        + BUDGET_FLOOR_CODES
}

/// Pause inserted between pieces of a long text, and the fade that keeps the joins click-free.
pub const PIECE_PAUSE_S: f32 = 0.2;
const PIECE_FADE_S: f32 = 0.01;

impl FrontEnd {
    /// Splits a request's text into pieces whose prompt plus expected codes fit the model's token
    /// budget, in order. A text that fits whole is one piece phonemized whole, exactly as the
    /// vendor does; longer ones are cut at sentences, then clauses, then words.
    pub fn plan(
        &self,
        req: &SpeechRequest,
        budget: usize,
        min_new: usize,
    ) -> Result<(Vec<Piece>, &Voice), SynthError> {
        let chars = req.text.chars().count();
        if chars > self.max_input_chars {
            return Err(SynthError::InputTooLong {
                got: chars,
                limit: self.max_input_chars,
            });
        }
        if req.text.trim().is_empty() {
            return Err(SynthError::EmptyInput);
        }
        let voice = self.voices.get(&req.voice)?;
        let lang = match req.language {
            Some(l) => l,
            None => voice.language.parse()?,
        };
        let format = req.input_format.unwrap_or(self.pkg.input_format);
        let ref_text = self.prepare_text(&voice.transcript, format, lang)?;
        // Speaking rate of this voice: codes per character of its prepared transcript, with a
        // margin so a piece rarely runs into the budget.
        let rate = voice.codes.len() as f64 / ref_text.chars().count().max(1) as f64;
        let estimate = |prepared: &str| {
            ((prepared.chars().count() as f64 * rate * 1.3).ceil() as usize).max(min_new)
        };
        let build = |prepared: &str| {
            prompt::build(
                &self.pkg.tokenizer,
                &self.pkg.vocab,
                &PromptInput {
                    format,
                    ref_text: &ref_text,
                    text: prepared,
                    ref_codes: &voice.codes,
                    emotion: req.emotion.as_deref(),
                },
            )
        };
        let whole = text::normalize(&req.text)?;
        let prepared = self.prepare_text(&whole, format, lang)?;
        let ids = build(&prepared)?;
        let est = estimate(&prepared);
        if ids.len() + est <= budget {
            return Ok((
                vec![Piece {
                    text: whole,
                    max_codes: code_budget(&prepared),
                    prepared,
                    ids,
                    estimated_codes: est,
                }],
                voice,
            ));
        }

        // Units small enough to fit alone, each with its prepared text.
        let fits = |prepared: &str| -> Result<(bool, usize), SynthError> {
            let n = build(prepared)?.len() + estimate(prepared);
            Ok((n <= budget, n))
        };
        // A unit with no letter or digit (only emoji or symbols) has nothing to speak: it is
        // dropped with a warning instead of failing a request that has speakable text elsewhere
        // (`whole` has some, or normalising it above would have failed).
        let prepare = |t: &str| -> Result<Option<String>, SynthError> {
            match self.prepare_text(t, format, lang) {
                Ok(p) => Ok(Some(p)),
                Err(TextError::NothingSpeakable) => {
                    tracing::warn!("skipping {t:?}: nothing to speak in it (no letter or digit)");
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        };
        let mut units: Vec<(String, String)> = Vec::new();
        for sentence in text::split_sentences(&whole) {
            let Some(p) = prepare(&sentence)? else {
                continue;
            };
            if fits(&p)?.0 {
                units.push((sentence, p));
                continue;
            }
            for clause in text::split_clauses(&sentence) {
                let Some(p) = prepare(&clause)? else {
                    continue;
                };
                if fits(&p)?.0 {
                    units.push((clause, p));
                    continue;
                }
                // Group words greedily; a single word that cannot fit is an error, never a cut.
                // `cur` is empty or speakable, so only a lone word can be dropped.
                let mut cur = String::new();
                for word in clause.split_whitespace() {
                    let cand = if cur.is_empty() {
                        word.to_owned()
                    } else {
                        format!("{cur} {word}")
                    };
                    let Some(cp) = prepare(&cand)? else {
                        continue;
                    };
                    if fits(&cp)?.0 {
                        cur = cand;
                        continue;
                    }
                    if cur.is_empty() {
                        let (_, needed) = fits(&cp)?;
                        return Err(SynthError::WordTooLong {
                            word: word.to_owned(),
                            needed,
                            budget,
                        });
                    }
                    if let Some(p) = prepare(&cur)? {
                        units.push((std::mem::take(&mut cur), p));
                    }
                    let Some(wp) = prepare(word)? else {
                        continue;
                    };
                    cur = word.to_owned();
                    let (ok, needed) = fits(&wp)?;
                    if !ok {
                        return Err(SynthError::WordTooLong {
                            word: word.to_owned(),
                            needed,
                            budget,
                        });
                    }
                }
                if !cur.is_empty()
                    && let Some(p) = prepare(&cur)?
                {
                    units.push((cur, p));
                }
            }
        }
        // Merge neighbours while they fit: longer pieces keep the prosody of whole sentences.
        let mut pieces: Vec<Piece> = Vec::new();
        let mut cur: Option<(String, String)> = None;
        for (t, p) in units {
            cur = Some(match cur.take() {
                None => (t, p),
                Some((ct, cp)) => {
                    let mp = format!("{cp} {p}");
                    if fits(&mp)?.0 {
                        (format!("{ct} {t}"), mp)
                    } else {
                        let ids = build(&cp)?;
                        let estimated_codes = estimate(&cp);
                        pieces.push(Piece {
                            text: ct,
                            max_codes: code_budget(&cp),
                            prepared: cp,
                            ids,
                            estimated_codes,
                        });
                        (t, p)
                    }
                }
            });
        }
        if let Some((ct, cp)) = cur {
            let ids = build(&cp)?;
            let estimated_codes = estimate(&cp);
            pieces.push(Piece {
                text: ct,
                max_codes: code_budget(&cp),
                prepared: cp,
                ids,
                estimated_codes,
            });
        }
        Ok((pieces, voice))
    }
}

/// The loaded model, codec and voices; shared by every request.
pub struct Synthesizer {
    front: FrontEnd,
    engine: Mutex<Box<dyn Engine>>,
    codec: Mutex<CodecDecoder>,
    candidates: Candidates,
    device: Device,
    /// The engine's worker child, readable without the engine lock (for /health).
    worker: Option<WorkerHandle>,
    /// Tokens per piece: the package's budget, or the engine's when smaller (a static KV cache).
    budget: usize,
}

impl Synthesizer {
    pub fn load(cfg: &SynthConfig) -> Result<Self, crate::Error> {
        let front = FrontEnd::load(cfg)?;
        let engine = load_engine(cfg, front.package())?;
        let env = crate::runtime::environment(cfg.ort_lib.as_deref())?;
        let threads = crate::runtime::ThreadPlan::for_process(
            cfg.ort.threads,
            cfg.codec_threads,
            cfg.ort.spin,
        );
        let codec = CodecDecoder::load(env, &front.package().codec, &threads)?;
        Ok(Self::from_parts(front, engine, codec))
    }

    /// Assembles a synthesizer from loaded parts (other backbones, tests).
    pub fn from_parts(front: FrontEnd, engine: Box<dyn Engine>, codec: CodecDecoder) -> Self {
        let pkg = front.package();
        let candidates = Candidates::of(pkg);
        let device = engine.device();
        let worker = engine.worker();
        let budget = engine.budget().map_or(pkg.genai.token_budget(), |b| {
            b.min(pkg.genai.token_budget())
        });
        Self {
            budget,
            front,
            engine: Mutex::new(engine),
            codec: Mutex::new(codec),
            candidates,
            device,
            worker,
        }
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

    pub fn front_end(&self) -> &FrontEnd {
        &self.front
    }

    pub fn package(&self) -> &ModelPackage {
        self.front.package()
    }

    pub fn voices(&self) -> &VoiceStore {
        self.front.voices()
    }

    pub fn candidates(&self) -> &Candidates {
        &self.candidates
    }

    pub fn engine_description(&self) -> String {
        self.engine
            .lock()
            .map(|b| b.describe())
            .unwrap_or_else(|_| "unavailable".into())
    }

    /// Synthesises one request. `sink` sees progress and audio in order and may stop the request.
    ///
    /// Streaming requests decode in the vendor's overlapping windows while codes are generated, so
    /// the first audio leaves after 30 codes; whole requests decode each piece once, as the vendor's
    /// non-streaming path does. Long texts run piece by piece into one continuous output.
    pub fn synthesize(
        &self,
        req: &SpeechRequest,
        cancel: &CancelToken,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<SynthesisReport, SynthError> {
        let t0 = Instant::now();
        let mut timings = StageTimings::default();
        let budget = self.budget;
        let (pieces, voice) = self
            .front
            .plan(req, budget, req.generation.min_new_tokens)?;
        timings.front_end = t0.elapsed();
        let rate = self.package().codec.sample_rate;
        // Setting up the encoder (LAME, libopus, ...) is part of encoding's cost.
        let t = Instant::now();
        let mut pipeline = OutputPipeline::new(&req.output, rate)?;
        timings.encode += t.elapsed();
        let estimated_codes = pieces.iter().map(|p| p.estimated_codes).sum();
        if sink(SynthEvent::Started {
            prompt_tokens: pieces.iter().map(|p| p.ids.len()).sum(),
            estimated_codes,
        })
        .is_break()
        {
            cancel.cancel();
        }

        let mut codec = self.codec.lock().map_err(|_| SynthError::Poisoned)?;
        let mut engine = self.engine.lock().map_err(|_| SynthError::Poisoned)?;
        let reference: Vec<i32> = voice.codes.iter().map(|&c| c as i32).collect();
        let pause = vec![0.0f32; (PIECE_PAUSE_S * rate as f32) as usize];
        let fade = (PIECE_FADE_S * rate as f32) as usize;
        let mut out = SynthesisReport {
            codes: Vec::new(),
            prompt_tokens: 0,
            seed: 0,
            stop: StopReason::Length,
            samples: 0,
            sample_rate: rate,
            speed: req.output.speed,
            bytes: 0,
            pieces: pieces.len(),
            timings,
        };
        // Read by the retry decision while the code callback holds `out`.
        let bytes_sent = Cell::new(0usize);
        let mut retried = false;
        // Pushes samples through the output pipeline and hands the bytes to the sink; false when
        // the caller wants to stop.
        let emit = |samples: &[f32],
                    out: &mut SynthesisReport,
                    pipeline: &mut OutputPipeline,
                    sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>|
         -> Result<bool, SynthError> {
            out.samples += samples.len();
            let t = Instant::now();
            let bytes = pipeline.push(samples)?;
            out.timings.encode += t.elapsed();
            if bytes.is_empty() {
                return Ok(true);
            }
            if out.timings.first_audio.is_none() {
                out.timings.first_audio = Some(t0.elapsed());
            }
            out.bytes += bytes.len();
            bytes_sent.set(out.bytes);
            Ok(sink(SynthEvent::Audio(&bytes)).is_continue())
        };

        let many = pieces.len() > 1;
        // The request's max_new_tokens bounds the whole request: what is left of it carries over
        // from piece to piece.
        let mut left = req.generation.max_new_tokens;
        // Some piece ended at its limit rather than at the end token.
        let mut cut = false;
        for (i, piece) in pieces.iter().enumerate() {
            if cancel.is_cancelled() {
                out.stop = StopReason::Cancelled;
                break;
            }
            if left == Some(0) {
                tracing::warn!(
                    "max_new_tokens ({}) used up after {i} of {} pieces: the rest is not spoken (finish reason length)",
                    req.generation.max_new_tokens.unwrap_or_default(),
                    pieces.len()
                );
                cut = true;
                break;
            }
            let (limit, limited_by) =
                piece_limit(piece, budget, req.generation.min_new_tokens, left);
            let mut params = req.generation.clone();
            params.max_new_tokens = Some(limit);
            if let Some(seed) = params.sampling.seed {
                // Each piece gets its own stream, still fixed by the request's seed.
                params.sampling.seed = Some(seed.wrapping_add(i as u64));
            }
            if sink(SynthEvent::Piece {
                index: i,
                count: pieces.len(),
                text: &piece.text,
                prompt_tokens: piece.ids.len(),
                max_new_tokens: limit,
            })
            .is_break()
            {
                out.stop = StopReason::Cancelled;
                break;
            }
            if i > 0 && !emit(&pause, &mut out, &mut pipeline, sink)? {
                out.stop = StopReason::Cancelled;
                break;
            }
            // Fades only where pieces meet, so a one-piece request is the plain decoder output.
            let fade_in = if i > 0 { fade } else { 0 };
            let fade_out = if many && i + 1 < pieces.len() {
                fade
            } else {
                0
            };
            let mut first_chunk = true;
            let mut failure: Option<SynthError> = None;
            let mut stream = req.output.streaming.then(|| {
                StreamDecoder::new(|codes: &[i32]| decode_i32(&mut codec, codes), &reference)
            });
            let base = out.codes.len();
            let mut stopped_by_sink = false;
            let made = Cell::new(0usize);
            let mut on_code = |code: u32| {
                let index = base + made.get();
                made.set(made.get() + 1);
                if sink(SynthEvent::Code { index, code }).is_break() {
                    stopped_by_sink = true;
                    return ControlFlow::Break(());
                }
                let Some(stream) = stream.as_mut() else {
                    return ControlFlow::Continue(());
                };
                let t = Instant::now();
                let step = stream.push(code as i32);
                out.timings.codec += t.elapsed();
                match step {
                    Ok(Some(mut samples)) => {
                        if first_chunk {
                            fade_edges(&mut samples, fade_in, 0);
                            first_chunk = false;
                        }
                        match emit(&samples, &mut out, &mut pipeline, sink) {
                            Ok(true) => ControlFlow::Continue(()),
                            Ok(false) => {
                                stopped_by_sink = true;
                                ControlFlow::Break(())
                            }
                            Err(e) => {
                                failure = Some(e);
                                ControlFlow::Break(())
                            }
                        }
                    }
                    Ok(None) => ControlFlow::Continue(()),
                    Err(e) => {
                        failure = Some(stream_error(e));
                        ControlFlow::Break(())
                    }
                }
            };
            // One retry per request, after the engine's delay, for a failure the engine says a
            // retry may cure (the NPU's one-off first-dispatch timeout, a worker that died) — and
            // only for a whole-file request before any byte went out: a stream is never retried.
            // The sink then sees this piece's codes again from its first index.
            let generation = loop {
                let err = match engine.generate(
                    &self.candidates,
                    &piece.ids,
                    &params,
                    cancel,
                    &mut on_code,
                ) {
                    Ok(g) => break g,
                    Err(e) => e,
                };
                let safe = !retried
                    && !req.output.streaming
                    && bytes_sent.get() == 0
                    && !cancel.is_cancelled();
                let Some(delay) = safe.then(|| engine.retry_delay(&err)).flatten() else {
                    return Err(err.into());
                };
                tracing::warn!(
                    "{} request failed: {err}; retrying it once in {:.1} s (not streamed, no audio sent yet)",
                    engine.device(),
                    delay.as_secs_f64()
                );
                std::thread::sleep(delay);
                retried = true;
                made.set(0);
            };
            if let Some(e) = failure.take() {
                return Err(e);
            }
            out.timings.prefill += generation.prefill;
            out.timings.decode += generation.decode;
            out.prompt_tokens += generation.prompt_tokens;
            if i == 0 {
                out.seed = generation.seed;
            }
            out.stop = generation.stop;
            out.codes.extend_from_slice(&generation.codes);
            if generation.stop == StopReason::Cancelled || stopped_by_sink {
                out.stop = StopReason::Cancelled;
                break;
            }
            left = left.map(|l| l.saturating_sub(generation.codes.len()));
            if generation.stop == StopReason::Length {
                tracing::warn!(
                    "piece {}/{} ended at {limit} codes ({limited_by}) without its end token (finish reason length): {:?}",
                    i + 1,
                    pieces.len(),
                    piece.text
                );
                cut = true;
            }
            let t = Instant::now();
            let mut rest = match stream {
                Some(stream) => stream.finish().map_err(stream_error)?,
                None => decode_whole(
                    |codes: &[i32]| decode_i32(&mut codec, codes),
                    &as_i32(&generation.codes),
                )
                .map_err(stream_error)?,
            };
            out.timings.codec += t.elapsed();
            fade_edges(&mut rest, if first_chunk { fade_in } else { 0 }, fade_out);
            if !emit(&rest, &mut out, &mut pipeline, sink)? {
                out.stop = StopReason::Cancelled;
                break;
            }
        }
        if cut && out.stop != StopReason::Cancelled {
            out.stop = StopReason::Length;
        }
        if out.stop != StopReason::Cancelled {
            let t = Instant::now();
            let bytes = pipeline.finish()?;
            out.timings.encode += t.elapsed();
            if !bytes.is_empty() {
                if out.timings.first_audio.is_none() {
                    out.timings.first_audio = Some(t0.elapsed());
                }
                out.bytes += bytes.len();
                let _ = sink(SynthEvent::Audio(&bytes));
            }
        }
        out.timings.front_end = timings.front_end;
        out.timings.total = t0.elapsed();
        Ok(out)
    }
}

/// The most codes a piece may generate, and what sets it: its text's [`code_budget`] (raised
/// to an explicit `min_new_tokens`, which the end token cannot beat anyway), the model's context
/// after the prompt, and what is left of the request's `max_new_tokens`, whichever is least.
fn piece_limit(
    piece: &Piece,
    context: usize,
    min_new: usize,
    left: Option<usize>,
) -> (usize, &'static str) {
    let mut limit = (piece.max_codes.max(min_new), "its text's code budget");
    let room = context.saturating_sub(piece.ids.len());
    if room < limit.0 {
        limit = (room, "the model's context");
    }
    if let Some(l) = left
        && l < limit.0
    {
        limit = (l, "the request's max_new_tokens");
    }
    limit
}

/// Linear fades over the first `fade_in` and last `fade_out` samples.
fn fade_edges(samples: &mut [f32], fade_in: usize, fade_out: usize) {
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

fn as_i32(codes: &[u32]) -> Vec<i32> {
    codes.iter().map(|&c| c as i32).collect()
}

fn decode_i32(codec: &mut CodecDecoder, codes: &[i32]) -> Result<Vec<f32>, CodecError> {
    let codes: Vec<u32> = codes.iter().map(|&c| c as u32).collect();
    codec.decode(&codes)
}

fn stream_error(e: StreamError<CodecError>) -> SynthError {
    match e {
        StreamError::Decode(e) => SynthError::Codec(e),
        other => SynthError::Codec(CodecError::Runtime(other.to_string())),
    }
}

/// Resolves a model directory given on the command line or by default: an existing path as given,
/// else relative to the checkout that holds `.onebit` (so the binary works from any directory).
pub fn resolve_dir(p: &Path) -> PathBuf {
    if p.is_absolute() || p.exists() {
        return p.to_path_buf();
    }
    for home in crate::paths::onebit_homes() {
        if let Some(repo) = home.parent() {
            let cand = repo.join(p);
            if cand.exists() {
                return cand;
            }
        }
    }
    p.to_path_buf()
}
