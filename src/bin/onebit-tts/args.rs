//! The options several commands share (model, generation, output) and how they become the
//! library's settings.

use std::io::{IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use onebit_tts::audio::{AudioFormat, OutputSpec};
use onebit_tts::engine::{
    DeviceChoice, GenerationParams, KvMode, OgaOptions, OrtOptions, SamplingParams, ThreadPolicy,
};
use onebit_tts::package::ModelPackage;
use onebit_tts::prompt::InputFormat;
use onebit_tts::synth::{EngineKind, SpeechRequest, SynthConfig, resolve_dir};
use onebit_tts::text::Language;

#[derive(Args, Clone)]
pub struct ModelArgs {
    /// Model package directory (genai_config.json, model.onnx, tokenizer.json, codec/; or a
    /// GGUF package). Default: the first real package present of models/neutts-air,
    /// models/neutts-air-q4, models/neutts-air-q8 (`models pull` makes the GGUF ones), else the
    /// generated test package models/tiny.
    #[arg(long, env = "ONEBIT_MODEL")]
    pub model: Option<PathBuf>,
    /// NeuCodec decoder package directory (default: MODEL/codec).
    #[arg(long, env = "ONEBIT_CODEC")]
    pub codec: Option<PathBuf>,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, the RyzenAI venv, .onebit/, python3's onnxruntime).
    #[arg(long, env = "ONEBIT_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
    /// Pronunciation lexicon: a file of `word<TAB>IPA` lines; those words are spoken with that
    /// IPA (a request's own lexicon wins over it).
    #[arg(long, env = "ONEBIT_LEXICON")]
    pub lexicon: Option<PathBuf>,
    /// Extra voice directory (repeatable); the repo's voices/ is always read.
    #[arg(long = "voices", env = "ONEBIT_VOICES", value_delimiter = ':')]
    pub voices: Vec<PathBuf>,
    /// Intra-op threads of the backbone and codec sessions (default: the package's config, else
    /// one per physical core this process may use, at most 16).
    #[arg(long, env = "ONEBIT_THREADS")]
    pub threads: Option<usize>,
    /// Thread defaults: tuned (threads = usable physical cores within the affinity mask and CPU
    /// quota, pool threads pinned one per core on SMT machines, no spin-waiting) or ort (ONNX
    /// Runtime's own: every physical core of the machine, spinning).
    #[arg(long, env = "ONEBIT_THREAD_POLICY", default_value = "tuned", value_parser = parse_thread_policy)]
    pub thread_policy: ThreadPolicy,
    /// Spin-waiting of the pool threads: on (the tuned default: fastest on an otherwise idle
    /// machine; spinning stops between runs) or off (for machines shared with other busy
    /// processes, where spinning wastes the time slices the other pool threads need).
    #[arg(long, env = "ONEBIT_SPIN", value_parser = parse_on_off)]
    pub spin: Option<bool>,
    /// KV cache handling: shared (one buffer bound as past and present, grown by doubling; the
    /// default) or growing (a new present tensor per step).
    #[arg(long, value_parser = parse_kv)]
    pub kv: Option<KvMode>,
    /// Generation loop: auto (ort for an ONNX package, llama for a GGUF one), ort (ours over
    /// in-process ONNX Runtime), oga (onnxruntime-genai) or llama (ours over llama.cpp).
    #[arg(long, env = "ONEBIT_ENGINE", default_value = "auto")]
    pub engine: EngineKind,
    /// --engine llama: fast (llama.cpp's defaults: f16 KV, flash attention) or exact (a float32
    /// KV cache, no flash attention: the ONNX route's float32 logits within rounding; slower).
    #[arg(long, env = "ONEBIT_LLAMA_ATTENTION", default_value = "fast")]
    pub llama_attention: onebit_tts::engine::LlamaAttention,
    /// Path of libonnxruntime-genai.so for --engine oga (else the RyzenAI venv, .onebit/oga/lib,
    /// python3's onnxruntime_genai).
    #[arg(long, env = "ONEBIT_OGA_LIB")]
    pub oga_lib: Option<PathBuf>,
    /// Where the backbone runs: auto (npu when genai_config.json declares RyzenAI and
    /// ONEBIT_RYZENAI_ROOT is set, else cpu), cpu, cuda, or npu (always in a worker child); with
    /// --engine llama: auto (the first GPU the build sees, else cpu), cpu, vulkan, rocm, cuda.
    #[arg(long, env = "ONEBIT_DEVICE", default_value = "auto")]
    pub device: DeviceChoice,
    /// Run the backbone in a worker child (`onebit-tts worker`) whatever the device.
    #[arg(long)]
    pub isolate: bool,
    /// Refuse to start unless the backbone is proven resident on the NPU (no CPU fallback, and
    /// `auto` may not resolve to the CPU).
    #[arg(long)]
    pub require_npu: bool,
    /// With --device npu: serve even when NPU residency is not proven (nodes the provider
    /// declines run on the CPU); such runs are labelled "cpu fallback", never "npu".
    #[arg(long)]
    pub allow_cpu_fallback: bool,
    /// With --device npu: ONNX Runtime's strict mode (session.disable_cpu_ep_fallback=1): the
    /// load fails when the provider does not take every node.
    #[arg(long)]
    pub npu_strict: bool,
    /// The RyzenAI provider library (sets RYZENAI_EP_PATH for the worker).
    #[arg(long, env = "ONEBIT_EP_LIBRARY")]
    pub ep_library: Option<PathBuf>,
    /// Allow SIGKILL of a worker that outlives ONEBIT_BACKEND_STOP_GRACE_S after SIGTERM
    /// (CPU/CUDA workers only: a worker holding the NPU is never SIGKILLed).
    #[arg(long)]
    pub allow_kill: bool,
    /// Seconds a worker child may take from its start to reporting the model loaded before it
    /// counts as hung and is stopped (a first NPU load compiles the model: minutes).
    #[arg(long, env = "ONEBIT_LOAD_TIMEOUT_S", value_name = "SECONDS", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub load_timeout: u64,
    /// Seconds a worker child may go without the next code (or the end) of a request before it
    /// counts as hung: the request fails and the next one starts a new worker.
    #[arg(long, env = "ONEBIT_STEP_TIMEOUT_S", value_name = "SECONDS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub step_timeout: u64,
    /// Most requests whose codes are generated side by side in one batch (continuous batching:
    /// requests join and leave between decode steps). 1 runs one request at a time. Packages
    /// whose graph fixes the batch at 1 (AMD's NPU packages), growing KV and --engine oga run one
    /// at a time whatever this says.
    #[arg(long, env = "ONEBIT_MAX_BATCH", value_name = "N",
          default_value_t = onebit_tts::engine::scheduler::DEFAULT_MAX_BATCH,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub max_batch: usize,
    /// Prompt tokens prefilled per turn while other requests are generating (their decode steps
    /// go on between the chunks).
    #[arg(long, env = "ONEBIT_PREFILL_CHUNK", value_name = "TOKENS",
          default_value_t = onebit_tts::engine::scheduler::DEFAULT_PREFILL_CHUNK,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub prefill_chunk: usize,
    /// A seeded request makes the same audio whatever runs beside it, on every CPU: a lone
    /// request's decode steps are padded to two rows (ONNX Runtime's int4 kernels round one row
    /// differently from several on some CPUs) and prompts are prefilled in the same chunks alone
    /// as beside others. Costs a lone request about an eighth of its rate (docs/performance.md);
    /// --engine ort with a shared KV buffer, else requests run one at a time.
    #[arg(long, env = "ONEBIT_BATCH_INVARIANT")]
    pub batch_invariant: bool,
    /// Most prompt tokens one backbone run takes when a prompt is prefilled alone (--engine ort);
    /// 0: the whole prompt in one run. Default: 256 on the CPU (measured faster than one run of
    /// 512-2048 tokens, the same logits), one run elsewhere.
    #[arg(long, env = "ONEBIT_PREFILL_RUN", value_name = "TOKENS")]
    pub prefill_run: Option<usize>,
    /// MiB of KV rows kept for voice prefixes (the instruction and the voice's transcript, which
    /// every request of a voice begins with): a request of a voice seen before prefills only
    /// its text and the reference codes. 0 turns it off; off with --batch-invariant. About 24
    /// KiB per token on the NeuTTS-air shape (docs/performance.md measures it).
    #[arg(long, env = "ONEBIT_PREFIX_CACHE_MIB", value_name = "MIB",
          default_value_t = onebit_tts::engine::scheduler::DEFAULT_PREFIX_CACHE_MIB)]
    pub prefix_cache_mib: usize,
    /// Intra-op threads of the NeuCodec decoder sessions, when they should differ from the
    /// backbone's --threads (docs/performance.md measures splits).
    #[arg(long, env = "ONEBIT_CODEC_THREADS", value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub codec_threads: Option<usize>,
    /// The backbone and the codec take turns on the CPU (a decode step or short prefill chunk
    /// and a codec window never run at once) instead of overlapping: auto (on when the backbone
    /// runs in this process on the CPU, fewer than 4 physical cores are usable and the two
    /// pools' threads together exceed them, where it was measured faster), on, off.
    #[arg(long, env = "ONEBIT_CPU_TURNS", default_value = "auto")]
    pub cpu_turns: onebit_tts::runtime::TurnsMode,
    /// Window layout of streamed decoding: `vendor` (the default: 50 codes of look-back, 25-code
    /// chunks, the vendor's samples exactly) or LOOKBACK:CHUNK[:FIRST] in codes, which changes the
    /// samples (measured: docs/performance.md): less look-back or longer chunks decode fewer
    /// frames per code; a first chunk of FIRST codes (default 25) is out after FIRST + 5 codes
    /// instead of 30, so the first audio comes sooner.
    #[arg(long, env = "ONEBIT_STREAM_WINDOWS", default_value = "vendor")]
    pub stream_windows: onebit_tts::codec::stream::Windows,
    /// NeuCodec decoder sessions that decode side by side, the threads shared out among them
    /// (each holds its own copy of the decoder). Default: 1 below 8 threads, else one per 4
    /// threads, at most the requests that run side by side (--max-batch; `say` decodes one
    /// stream: 1) (measured: docs/performance.md).
    #[arg(long, env = "ONEBIT_CODEC_SESSIONS", value_name = "N",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub codec_sessions: Option<usize>,
}

pub fn parse_thread_policy(s: &str) -> Result<ThreadPolicy, String> {
    ThreadPolicy::parse(s)
        .ok_or_else(|| format!("unknown thread policy {s:?} (supported: tuned, ort)"))
}

pub fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

pub fn parse_kv(s: &str) -> Result<KvMode, String> {
    match s {
        "growing" => Ok(KvMode::Growing),
        "shared" => Ok(KvMode::Shared),
        _ => Err(format!(
            "unknown KV mode {s:?} (supported: growing, shared)"
        )),
    }
}

#[derive(Args, Clone)]
pub struct GenArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 50)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Makes a take reproducible; without it a seed is drawn and printed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The end token cannot win before this many codes (vendor default 50).
    #[arg(long, default_value_t = onebit_tts::engine::DEFAULT_MIN_NEW_TOKENS)]
    pub min_new_tokens: usize,
    #[arg(long)]
    pub max_new_tokens: Option<usize>,
    /// Language of the text (en-us, de, fr-fr, es); default: the model's (a pulled German,
    /// French or Spanish Nano records its own), else the voice's. `--language` is accepted too
    /// (one name across the commands, the other as an alias).
    #[arg(long, visible_alias = "language")]
    pub lang: Option<String>,
    /// Prompt format override (phonemes, bpe); default: the model's.
    #[arg(long)]
    pub input_format: Option<String>,
    /// One of the model's emotions (NeuTTS-2E: angry, disgusted, fearful, happy, neutral, sad,
    /// surprised; `models check` lists a package's); "neutral" is none.
    #[arg(long)]
    pub emotion: Option<String>,
    /// Read the text as written: no written-to-spoken normalisation ("$5" stays "$5" for
    /// espeak-ng, which reads it "dollar five").
    #[arg(long)]
    pub no_normalize: bool,
    /// Read pause and pronunciation markup in the text: `[pause:0.5s]`, `<break time="500ms"/>`,
    /// `[word](/IPA/)` (docs/api.md).
    #[arg(long)]
    pub markup: bool,
}

/// Where the real NeuTTS-air packages go (`models build`, `models pull`), in the order the
/// default model takes them.
pub const REAL_MODEL_DIRS: [&str; 3] = [
    "models/neutts-air",
    "models/neutts-air-q4",
    "models/neutts-air-q8",
];

/// The first of [`REAL_MODEL_DIRS`] that holds a package's backbone.
pub fn real_model() -> Option<PathBuf> {
    REAL_MODEL_DIRS
        .iter()
        .map(|p| resolve_dir(Path::new(p)))
        .find(|dir| {
            dir.join("genai_config.json").exists()
                || onebit_tts::package::gguf::find_in(dir).is_ok_and(|g| g.is_some())
        })
}

pub fn default_model() -> PathBuf {
    real_model().unwrap_or_else(|| resolve_dir(Path::new("models/tiny")))
}

pub fn progress_bar(quiet: bool, len: u64, template: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

pub fn voice_dirs(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = onebit_tts::voice::default_dirs();
    for d in extra {
        if !dirs.contains(d) {
            dirs.push(d.clone());
        }
    }
    dirs
}

pub fn synth_config(m: &ModelArgs) -> SynthConfig {
    let mut cfg = SynthConfig {
        package_dir: m
            .model
            .as_deref()
            .map(resolve_dir)
            .unwrap_or_else(default_model),
        codec_dir: m.codec.clone(),
        ort_lib: m.ort_lib.clone(),
        voice_dirs: voice_dirs(&m.voices),
        ort: OrtOptions {
            intra_threads: m.threads,
            threads: m.thread_policy,
            spin: m.spin,
            kv_mode: m.kv,
            kv_capacity: None,
            prefill_chunk: m.prefill_run,
            device: Default::default(),
            npu_strict: m.npu_strict,
        },
        codec_threads: m.codec_threads.or(m.threads),
        stream_windows: m.stream_windows,
        cpu_turns: m.cpu_turns,
        codec_sessions: m.codec_sessions,
        lexicon: m.lexicon.clone(),
        engine: m.engine,
        llama_attention: m.llama_attention,
        oga: OgaOptions {
            lib: m.oga_lib.clone(),
            ..OgaOptions::default()
        },
        device: m.device,
        isolate: m.isolate,
        require_npu: m.require_npu,
        allow_cpu_fallback: m.allow_cpu_fallback,
        ep_library: m.ep_library.clone(),
        allow_kill: m.allow_kill,
        worker_exe: None,
        worker_timeouts: onebit_tts::engine::WorkerTimeouts {
            load: Duration::from_secs(m.load_timeout),
            step: Duration::from_secs(m.step_timeout),
        },
        scheduler: onebit_tts::engine::SchedulerOptions {
            max_batch: m.max_batch,
            prefill_chunk: m.prefill_chunk,
            batch_invariant: m.batch_invariant,
            prefix_cache_mib: m.prefix_cache_mib,
        },
    };
    cfg.package_dir = cfg.backbone_dir();
    cfg
}

/// The request the options ask for, but its emotion: that is the model's to check, once it is
/// loaded ([`emotion`]).
pub fn request(
    voice: &str,
    text: String,
    g: &GenArgs,
    output: OutputSpec,
) -> Result<SpeechRequest> {
    Ok(SpeechRequest {
        output,
        reading: onebit_tts::synth::Reading {
            normalize: !g.no_normalize,
            markup: g.markup,
            lexicon: None,
        },
        text,
        voice: voice.to_owned(),
        language: g.lang.as_deref().map(str::parse::<Language>).transpose()?,
        input_format: g
            .input_format
            .as_deref()
            .map(str::parse::<InputFormat>)
            .transpose()
            .map_err(anyhow::Error::msg)?,
        emotion: None,
        generation: GenerationParams {
            sampling: SamplingParams {
                temperature: g.temperature,
                top_k: g.top_k,
                top_p: g.top_p,
                seed: g.seed,
            },
            min_new_tokens: g.min_new_tokens,
            max_new_tokens: g.max_new_tokens,
        },
    })
}

/// The emotion the options ask for, as the loaded model `pkg` can speak it.
pub fn emotion(pkg: &ModelPackage, g: &GenArgs) -> Result<Option<String>> {
    Ok(pkg.emotion(g.emotion.as_deref())?)
}

pub fn read_text(text: Option<String>) -> Result<String> {
    match text {
        Some(t) => Ok(t),
        None => {
            if std::io::stdin().is_terminal() {
                bail!("no text given: pass it as an argument or on stdin");
            }
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("reading text from stdin")?;
            Ok(s)
        }
    }
}

#[derive(Args, Clone)]
pub struct OutArgs {
    /// Output format (wav, pcm, flac, mp3, opus); default: from the output file's extension, else wav.
    #[arg(long)]
    pub format: Option<String>,
    /// Output sample rate, 8000..48000 (default 24000, the codec's).
    #[arg(long)]
    pub sample_rate: Option<u32>,
    /// Speaking speed 0.25..4.0 (time-stretch, pitch kept).
    #[arg(long, default_value_t = 1.0)]
    pub speed: f32,
}

pub fn output_spec(o: &OutArgs, path: &Path) -> Result<OutputSpec> {
    let format = match &o.format {
        Some(f) => f.parse::<AudioFormat>()?,
        // An extension that names no format is refused: writing WAV under it would mislabel
        // the file. `.raw` is the usual name for headerless samples, i.e. pcm.
        None => match path.extension().map(|e| e.to_string_lossy()) {
            None => AudioFormat::Wav,
            Some(ext) if ext.eq_ignore_ascii_case("raw") => AudioFormat::Pcm,
            Some(ext) => ext.parse::<AudioFormat>().map_err(|_| {
                anyhow::anyhow!(
                    "{}: unknown output extension {ext:?}; name the file .mp3, .opus, .flac, .wav, .pcm (or .raw), or give --format ({})",
                    path.display(),
                    onebit_tts::audio::SUPPORTED_FORMATS
                )
            })?,
        },
    };
    let spec = OutputSpec {
        format,
        sample_rate: o
            .sample_rate
            .unwrap_or(onebit_tts::package::CODEC_SAMPLE_RATE),
        speed: o.speed,
        streaming: false,
    };
    onebit_tts::audio::check_speed(spec.speed)?;
    onebit_tts::audio::check_output_rate(spec.sample_rate)?;
    Ok(spec)
}
