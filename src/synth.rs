//! The one path from text to audio. The CLI `say`, the server and `bench` all call
//! [`Synthesizer::synthesize`]; each stage's timing is reported through [`StageTimings`].

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use crate::audio::{OutputPipeline, OutputSpec};
use crate::codec::stream::{StreamDecoder, StreamError, decode_whole};
use crate::codec::{CodecDecoder, CodecError};
use crate::engine::{
    self, CancelToken, Candidates, Engine, EngineError, GenerationParams, LocalEngine, OrtOptions,
    StopReason,
};
use crate::metrics::StageTimings;
use crate::package::{ModelPackage, SPEECH_CODES};
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

/// Loads the engine a config asks for over a loaded package.
pub fn load_engine(cfg: &SynthConfig, pkg: &ModelPackage) -> Result<Box<dyn Engine>, crate::Error> {
    match cfg.engine {
        EngineKind::Ort => {
            let env = crate::runtime::environment(cfg.ort_lib.as_deref())?;
            let backbone = engine::OrtBackbone::load(env, pkg, &cfg.ort)?;
            Ok(Box::new(LocalEngine(Box::new(backbone))))
        }
        EngineKind::Oga => Err(crate::Error::Engine(EngineError::Params(
            "the oga engine is not built yet".into(),
        ))),
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
    /// One more code was generated.
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
    pub stop: StopReason,
    /// Decoded samples at the codec rate (before any speed change or resampling).
    pub samples: usize,
    pub sample_rate: u32,
    pub speed: f32,
    pub bytes: usize,
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

    /// The prompt ids for a request, the prepared text (phonemes or normalised text) and the voice.
    pub fn build_prompt(
        &self,
        req: &SpeechRequest,
    ) -> Result<(Vec<u32>, String, &Voice), SynthError> {
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
        let text = self.prepare_text(&req.text, format, lang)?;
        let ids = prompt::build(
            &self.pkg.tokenizer,
            &self.pkg.vocab,
            &PromptInput {
                format,
                ref_text: &ref_text,
                text: &text,
                ref_codes: &voice.codes,
                emotion: req.emotion.as_deref(),
            },
        )?;
        Ok((ids, text, voice))
    }
}

/// The loaded model, codec and voices; shared by every request.
pub struct Synthesizer {
    front: FrontEnd,
    engine: Mutex<Box<dyn Engine>>,
    codec: Mutex<CodecDecoder>,
    candidates: Candidates,
}

impl Synthesizer {
    pub fn load(cfg: &SynthConfig) -> Result<Self, crate::Error> {
        let front = FrontEnd::load(cfg)?;
        let engine = load_engine(cfg, front.package())?;
        let env = crate::runtime::environment(cfg.ort_lib.as_deref())?;
        let codec = CodecDecoder::load(env, &front.package().codec, cfg.codec_threads)?;
        Ok(Self::from_parts(front, engine, codec))
    }

    /// Assembles a synthesizer from loaded parts (other backbones, tests).
    pub fn from_parts(front: FrontEnd, engine: Box<dyn Engine>, codec: CodecDecoder) -> Self {
        let pkg = front.package();
        let candidates = Candidates {
            speech_first: pkg.vocab.first,
            speech_count: SPEECH_CODES,
            stop_ids: pkg.stop_ids.clone(),
        };
        Self {
            front,
            engine: Mutex::new(engine),
            codec: Mutex::new(codec),
            candidates,
        }
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
    /// the first audio leaves after 30 codes; whole requests decode once at the end, as the vendor's
    /// non-streaming path does.
    pub fn synthesize(
        &self,
        req: &SpeechRequest,
        cancel: &CancelToken,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<SynthesisReport, SynthError> {
        let t0 = Instant::now();
        let mut timings = StageTimings::default();
        let (ids, text, voice) = self.front.build_prompt(req)?;
        timings.front_end = t0.elapsed();
        let rate = self.package().codec.sample_rate;
        // Setting up the encoder (LAME, libopus, ...) is part of encoding's cost.
        let t = Instant::now();
        let mut pipeline = OutputPipeline::new(&req.output, rate)?;
        timings.encode += t.elapsed();
        // Speaking rate of this voice: codes per character of its transcript.
        let ref_chars = voice.transcript.chars().count().max(1);
        let estimated_codes = (text.chars().count() * voice.codes.len()).div_ceil(ref_chars);
        if sink(SynthEvent::Started {
            prompt_tokens: ids.len(),
            estimated_codes,
        })
        .is_break()
        {
            cancel.cancel();
        }

        let mut codec = self.codec.lock().map_err(|_| SynthError::Poisoned)?;
        let mut samples_out = 0usize;
        let mut bytes_out = 0usize;
        let mut failure: Option<SynthError> = None;
        // Hands encoded bytes to the sink; false when the caller wants to stop.
        let mut emit =
            |bytes: Vec<u8>,
             timings: &mut StageTimings,
             sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>| {
                if bytes.is_empty() {
                    return true;
                }
                if timings.first_audio.is_none() {
                    timings.first_audio = Some(t0.elapsed());
                }
                bytes_out += bytes.len();
                sink(SynthEvent::Audio(&bytes)).is_continue()
            };

        let generation = {
            let mut engine = self.engine.lock().map_err(|_| SynthError::Poisoned)?;
            let reference: Vec<i32> = voice.codes.iter().map(|&c| c as i32).collect();
            let mut stream = req.output.streaming.then(|| {
                StreamDecoder::new(|codes: &[i32]| decode_i32(&mut codec, codes), &reference)
            });
            let mut index = 0;
            let generation = engine.generate(
                &self.candidates,
                &ids,
                &req.generation,
                cancel,
                &mut |code| {
                    if sink(SynthEvent::Code { index, code }).is_break() {
                        return ControlFlow::Break(());
                    }
                    index += 1;
                    let Some(stream) = stream.as_mut() else {
                        return ControlFlow::Continue(());
                    };
                    let t = Instant::now();
                    let step = stream.push(code as i32);
                    timings.codec += t.elapsed();
                    match step {
                        Ok(Some(samples)) => {
                            samples_out += samples.len();
                            let t = Instant::now();
                            let bytes = pipeline.push(&samples);
                            timings.encode += t.elapsed();
                            match bytes {
                                Ok(b) => {
                                    if emit(b, &mut timings, sink) {
                                        ControlFlow::Continue(())
                                    } else {
                                        ControlFlow::Break(())
                                    }
                                }
                                Err(e) => {
                                    failure = Some(e.into());
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
                },
            )?;
            if let Some(e) = failure.take() {
                return Err(e);
            }
            let t = Instant::now();
            let rest = match stream {
                Some(stream) => stream.finish().map_err(stream_error)?,
                None => decode_whole(
                    |codes: &[i32]| decode_i32(&mut codec, codes),
                    &as_i32(&generation.codes),
                )
                .map_err(stream_error)?,
            };
            timings.codec += t.elapsed();
            if generation.stop != StopReason::Cancelled {
                samples_out += rest.len();
                let t = Instant::now();
                let mut bytes = pipeline.push(&rest)?;
                bytes.extend(pipeline.finish()?);
                timings.encode += t.elapsed();
                emit(bytes, &mut timings, sink);
            }
            generation
        };
        timings.prefill = generation.prefill;
        timings.decode = generation.decode;
        timings.total = t0.elapsed();
        Ok(SynthesisReport {
            prompt_tokens: generation.prompt_tokens,
            seed: generation.seed,
            stop: generation.stop,
            samples: samples_out,
            sample_rate: rate,
            speed: req.output.speed,
            bytes: bytes_out,
            codes: generation.codes,
            timings,
        })
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
