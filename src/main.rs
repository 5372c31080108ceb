//! The `onebit-tts` command line. Errors end here: one line on stderr and a non-zero exit.

use std::io::{IsTerminal, Read};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use onebit_tts::audio::{AudioFormat, OutputSpec};
use onebit_tts::engine::{
    CancelToken, DeviceChoice, GenerationParams, KvMode, OgaOptions, OrtOptions, SamplingParams,
    ThreadPolicy,
};
use onebit_tts::metrics;
use onebit_tts::package::{ModelPackage, optimize};
use onebit_tts::prompt::InputFormat;
use onebit_tts::server::ServeArgs;
use onebit_tts::synth::{
    EngineKind, FrontEnd, SpeechRequest, SynthConfig, SynthEvent, Synthesizer, resolve_dir,
};
use onebit_tts::text::Language;

#[derive(Parser)]
#[command(
    name = "onebit-tts",
    version,
    about = "NeuTTS-air speech synthesis on ONNX Runtime"
)]
struct Cli {
    /// Less output: no progress bars, warnings and errors only.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// More log lines: INFO for every command (say and the other one-shot commands log
    /// warnings only by default; serve logs INFO). ONEBIT_LOG or RUST_LOG (an EnvFilter) win.
    #[arg(long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// Model package directory (genai_config.json, model.onnx, tokenizer.json, codec/).
    /// Default: models/neutts-air when present, else the generated test package models/tiny.
    #[arg(long, env = "ONEBIT_MODEL")]
    model: Option<PathBuf>,
    /// NeuCodec decoder package directory (default: MODEL/codec).
    #[arg(long, env = "ONEBIT_CODEC")]
    codec: Option<PathBuf>,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, the RyzenAI venv, .onebit/, python3's onnxruntime).
    #[arg(long, env = "ONEBIT_ORT_LIB")]
    ort_lib: Option<PathBuf>,
    /// Extra voice directory (repeatable); the repo's voices/ is always read.
    #[arg(long = "voices", env = "ONEBIT_VOICES", value_delimiter = ':')]
    voices: Vec<PathBuf>,
    /// Intra-op threads of the backbone and codec sessions (default: the package's config, else
    /// one per physical core this process may use, at most 16).
    #[arg(long, env = "ONEBIT_THREADS")]
    threads: Option<usize>,
    /// Thread defaults: tuned (threads = usable physical cores within the affinity mask and CPU
    /// quota, pool threads pinned one per core on SMT machines, no spin-waiting) or ort (ONNX
    /// Runtime's own: every physical core of the machine, spinning).
    #[arg(long, env = "ONEBIT_THREAD_POLICY", default_value = "tuned", value_parser = parse_thread_policy)]
    thread_policy: ThreadPolicy,
    /// Spin-waiting of the pool threads: on (the tuned default: fastest on an otherwise idle
    /// machine; spinning stops between runs) or off (for machines shared with other busy
    /// processes, where spinning wastes the time slices the other pool threads need).
    #[arg(long, env = "ONEBIT_SPIN", value_parser = parse_on_off)]
    spin: Option<bool>,
    /// KV cache handling: shared (one buffer bound as past and present, grown by doubling; the
    /// default) or growing (a new present tensor per step).
    #[arg(long, value_parser = parse_kv)]
    kv: Option<KvMode>,
    /// Generation loop: ort (ours, in-process ONNX Runtime) or oga (onnxruntime-genai).
    #[arg(long, env = "ONEBIT_ENGINE", default_value = "ort")]
    engine: EngineKind,
    /// Path of libonnxruntime-genai.so for --engine oga (else the RyzenAI venv, .onebit/oga/lib,
    /// python3's onnxruntime_genai).
    #[arg(long, env = "ONEBIT_OGA_LIB")]
    oga_lib: Option<PathBuf>,
    /// Where the backbone runs: auto (npu when genai_config.json declares RyzenAI and
    /// ONEBIT_RYZENAI_ROOT is set, else cpu), cpu, cuda, or npu (always in a worker child).
    #[arg(long, env = "ONEBIT_DEVICE", default_value = "auto")]
    device: DeviceChoice,
    /// Run the backbone in a worker child (`onebit-tts worker`) whatever the device.
    #[arg(long)]
    isolate: bool,
    /// Refuse to start unless the backbone is proven resident on the NPU (no CPU fallback, and
    /// `auto` may not resolve to the CPU).
    #[arg(long)]
    require_npu: bool,
    /// With --device npu: serve even when NPU residency is not proven (nodes the provider
    /// declines run on the CPU); such runs are labelled "cpu fallback", never "npu".
    #[arg(long)]
    allow_cpu_fallback: bool,
    /// With --device npu: ONNX Runtime's strict mode (session.disable_cpu_ep_fallback=1): the
    /// load fails when the provider does not take every node.
    #[arg(long)]
    npu_strict: bool,
    /// The RyzenAI provider library (sets RYZENAI_EP_PATH for the worker).
    #[arg(long, env = "ONEBIT_EP_LIBRARY")]
    ep_library: Option<PathBuf>,
    /// Allow SIGKILL of a worker that outlives ONEBIT_BACKEND_STOP_GRACE_S after SIGTERM
    /// (CPU/CUDA workers only: a worker holding the NPU is never SIGKILLed).
    #[arg(long)]
    allow_kill: bool,
    /// Seconds a worker child may take from its start to reporting the model loaded before it
    /// counts as hung and is stopped (a first NPU load compiles the model: minutes).
    #[arg(long, env = "ONEBIT_LOAD_TIMEOUT_S", value_name = "SECONDS", default_value_t = 900,
          value_parser = clap::value_parser!(u64).range(1..))]
    load_timeout: u64,
    /// Seconds a worker child may go without the next code (or the end) of a request before it
    /// counts as hung: the request fails and the next one starts a new worker.
    #[arg(long, env = "ONEBIT_STEP_TIMEOUT_S", value_name = "SECONDS", default_value_t = 120,
          value_parser = clap::value_parser!(u64).range(1..))]
    step_timeout: u64,
}

fn parse_thread_policy(s: &str) -> Result<ThreadPolicy, String> {
    ThreadPolicy::parse(s)
        .ok_or_else(|| format!("unknown thread policy {s:?} (supported: tuned, ort)"))
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

fn parse_kv(s: &str) -> Result<KvMode, String> {
    match s {
        "growing" => Ok(KvMode::Growing),
        "shared" => Ok(KvMode::Shared),
        _ => Err(format!(
            "unknown KV mode {s:?} (supported: growing, shared)"
        )),
    }
}

#[derive(Args, Clone)]
struct GenArgs {
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    #[arg(long, default_value_t = 50)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Makes a take reproducible; without it a seed is drawn and printed.
    #[arg(long)]
    seed: Option<u64>,
    /// The end token cannot win before this many codes (vendor default 50).
    #[arg(long, default_value_t = onebit_tts::engine::DEFAULT_MIN_NEW_TOKENS)]
    min_new_tokens: usize,
    #[arg(long)]
    max_new_tokens: Option<usize>,
    /// Language of the text (en-us, de, fr-fr, es); default: the voice's.
    #[arg(long)]
    lang: Option<String>,
    /// Prompt format override (phonemes, bpe); default: the model's.
    #[arg(long)]
    input_format: Option<String>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Synthesise text to an audio file.
    Say {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        generation: GenArgs,
        #[command(flatten)]
        out: OutArgs,
        #[arg(long, short = 'v')]
        voice: String,
        /// Output file.
        #[arg(short, long, default_value = "out.wav")]
        output: PathBuf,
        /// The text; read from stdin when absent.
        text: Option<String>,
    },
    /// Serve the OpenAI-compatible API (POST /v1/audio/speech).
    Serve {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        args: ServeArgs,
    },
    /// Measure synthesis speed against the real-time line (50 codes/s).
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        args: BenchArgs,
    },
    /// Check this machine for the NPU route's known blockers (PASS/WARN/FAIL/SKIP per check).
    Doctor {
        #[arg(long)]
        json: bool,
        /// Also run `npu probe` on this package (settings from the environment, as `npu probe`
        /// takes them) for the residency line: PASS only when residency is proven. Without it
        /// that line is SKIP: the doctor starts nothing on the NPU unless asked.
        #[arg(long, value_name = "PKG")]
        model: Option<PathBuf>,
    },
    /// The NPU route: `npu probe` sets the RyzenAI session up exactly as --device npu does and
    /// reports what it observed.
    Npu {
        #[command(subcommand)]
        cmd: NpuCmd,
    },
    /// Print the prompt (prepared text, ids, token count) for a text.
    Prompt {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        generation: GenArgs,
        #[arg(long, short = 'v')]
        voice: String,
        #[arg(long)]
        json: bool,
        text: String,
    },
    /// The engine worker child (started by the server itself; framed messages on stdin/stdout).
    #[command(hide = true)]
    Worker,
    /// Model packages.
    Models {
        #[command(subcommand)]
        cmd: ModelsCmd,
    },
    /// Reference voices.
    Voices {
        #[command(subcommand)]
        cmd: VoicesCmd,
    },
}

#[derive(Subcommand)]
enum NpuCmd {
    /// Build the RyzenAI session in a worker child with the NPU environment, run one prefill and
    /// a few decode steps, and report the runtime, provider library, EP devices, options, custom
    /// ops route, node placement and residency with its evidence. Exit 0: residency proven;
    /// 2: ran but not proven; 3: could not set up.
    Probe {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum ModelsCmd {
    /// Validate a package and print its summary.
    Check {
        dir: PathBuf,
        #[arg(long)]
        codec: Option<PathBuf>,
    },
    /// Write a faster copy of a package: the lm_head projects the last position only and only
    /// the speech ids and stop ids (a graph edit of the decoder ONNX; see docs).
    Optimize {
        src: PathBuf,
        /// A new (or empty) directory.
        dst: PathBuf,
        /// Keep logits for every position (the prefill computes them all).
        #[arg(long)]
        no_last_position: bool,
        /// Keep the head's full vocabulary.
        #[arg(long)]
        no_speech_head: bool,
    },
}

#[derive(Subcommand)]
enum VoicesCmd {
    /// List the voices.
    List {
        #[arg(long = "voices", env = "ONEBIT_VOICES", value_delimiter = ':')]
        voices: Vec<PathBuf>,
    },
    /// Show one voice.
    Show {
        name: String,
        #[arg(long = "voices", env = "ONEBIT_VOICES", value_delimiter = ':')]
        voices: Vec<PathBuf>,
    },
    /// Import voices: torch .pt (+ NAME.txt), .npy, JSON code lists, voice files, or a folder of them.
    Import {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Voice name (default: the file's stem).
        #[arg(long)]
        name: Option<String>,
        /// Exact transcript of the reference (default: NAME.txt beside the codes).
        #[arg(long)]
        text: Option<String>,
        /// LANG for all, or NAME=LANG for one (repeatable).
        #[arg(long = "language")]
        languages: Vec<String>,
        #[arg(long)]
        source: Option<String>,
        #[arg(long)]
        license: Option<String>,
        /// Replace voices that already exist.
        #[arg(long)]
        force: bool,
        /// Where to store them (default: the repo's voices/).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Check each reference against this package's context budget.
        #[arg(long, env = "ONEBIT_MODEL")]
        model: Option<PathBuf>,
    },
    /// Clone a voice from reference audio through a NeuCodec encoder ONNX.
    Add(AddArgs),
    /// Remove a voice from a voice directory.
    Remove {
        name: String,
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Args)]
struct AddArgs {
    /// Voice name (letters, digits, '-', '_').
    name: String,
    /// Reference audio (wav, flac, mp3, ogg/vorbis; any rate, mono or stereo; 3-15 s is best).
    #[arg(long)]
    audio: PathBuf,
    /// Exact transcript of the reference audio.
    #[arg(long)]
    text: String,
    /// NeuCodec encoder ONNX: float32 [1,1,T] 16 kHz audio in, int codes [1,1,F] at 50/s out
    /// (default: the `encoder` of the model's codec/codec.json).
    #[arg(long, env = "ONEBIT_CODEC_ENCODER")]
    encoder: Option<PathBuf>,
    /// espeak language of the transcript: en-us, de, fr-fr, es.
    #[arg(long, default_value = onebit_tts::voice::import::DEFAULT_LANGUAGE)]
    language: String,
    #[arg(long)]
    license: Option<String>,
    /// Replace a voice that already exists.
    #[arg(long)]
    force: bool,
    /// Where to store it (default: the repo's voices/).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Model package whose codec.json may name the encoder; given explicitly, the reference is
    /// also checked against its context budget.
    #[arg(long, env = "ONEBIT_MODEL")]
    model: Option<PathBuf>,
    /// NeuCodec package directory (default: MODEL/codec).
    #[arg(long, env = "ONEBIT_CODEC")]
    codec: Option<PathBuf>,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, the RyzenAI venv, .onebit/, python3's onnxruntime).
    #[arg(long, env = "ONEBIT_ORT_LIB")]
    ort_lib: Option<PathBuf>,
    /// Intra-op threads of the encoder session (default: one per usable physical core).
    #[arg(long, env = "ONEBIT_THREADS")]
    threads: Option<usize>,
    /// Thread defaults: tuned (one per usable core, pinned on SMT, no spinning) or ort.
    #[arg(long, env = "ONEBIT_THREAD_POLICY", default_value = "tuned", value_parser = parse_thread_policy)]
    thread_policy: ThreadPolicy,
}

/// `voices add`: decode and resample the reference, encode it, save the voice.
fn voices_add(a: AddArgs) -> Result<()> {
    use onebit_tts::codec::encoder::{CodecEncoder, ENCODER_NEEDED, ENCODER_SAMPLE_RATE};
    use onebit_tts::voice::{Voice, VoiceError, VoiceStore};

    onebit_tts::voice::validate_name(&a.name)?;
    if a.text.trim().is_empty() {
        bail!("the transcript is empty: pass the exact words of the reference with --text");
    }
    let language = a
        .language
        .parse::<Language>()
        .map_err(|e| anyhow::anyhow!("--language: {e}"))?
        .as_str()
        .to_owned();
    let dir = a.dir.clone().unwrap_or_else(store_dir);
    let target = dir.join(format!("{}.json", a.name));
    if !a.force && target.exists() {
        return Err(VoiceError::Exists(target).into());
    }

    let model_dir = a
        .model
        .as_deref()
        .map(resolve_dir)
        .unwrap_or_else(default_model);
    let encoder = match a.encoder.clone() {
        Some(e) => e,
        None => {
            let codec_dir = a
                .codec
                .as_deref()
                .map(resolve_dir)
                .unwrap_or_else(|| model_dir.join("codec"));
            let pkg = onebit_tts::package::CodecPackage::load(&codec_dir).ok();
            match pkg.and_then(|p| p.encoder) {
                Some(e) => e,
                None => bail!(
                    "no encoder: neither --encoder, ONEBIT_CODEC_ENCODER nor an \"encoder\" in {} is set; {ENCODER_NEEDED}",
                    codec_dir.join("codec.json").display()
                ),
            }
        }
    };

    let audio = onebit_tts::audio::decode::decode_path(&a.audio)
        .with_context(|| format!("{}", a.audio.display()))?;
    if audio.sample_rate != ENCODER_SAMPLE_RATE {
        bail!(
            "{}: the audio stage gave {} Hz, the encoder needs {ENCODER_SAMPLE_RATE} Hz",
            a.audio.display(),
            audio.sample_rate
        );
    }
    println!(
        "audio:    {}: {:.2} s, {} Hz, {} channel{} -> {} samples at {} Hz mono; clipped {} of {} samples ({:.2}%)",
        a.audio.display(),
        audio.duration_secs,
        audio.original_sample_rate,
        audio.original_channels,
        if audio.original_channels == 1 {
            ""
        } else {
            "s"
        },
        audio.samples.len(),
        audio.sample_rate,
        audio.clipping.clipped_samples,
        audio.clipping.total_samples,
        audio.clipping.ratio() * 100.0
    );
    if audio.clipping.ratio() > 0.001 {
        eprintln!(
            "warning: {:.2}% of the reference is clipped; a distorted reference gives a distorted voice",
            audio.clipping.ratio() * 100.0
        );
    }

    let env = onebit_tts::runtime::environment(a.ort_lib.as_deref())?;
    let threads = onebit_tts::engine::ThreadPlan::new(
        a.thread_policy,
        &onebit_tts::engine::CpuTopology::detect(),
        a.threads,
        None,
    );
    let mut enc = CodecEncoder::load(env, &encoder, &threads)?;
    let codes = enc.encode(&audio.samples)?;
    println!(
        "encoder:  {} -> {} codes ({:.2} s at 50 codes/s)",
        encoder.display(),
        codes.len(),
        codes.len() as f32 / 50.0
    );
    if codes.is_empty() {
        bail!(
            "{}: the encoder gave no codes; the reference is too short",
            a.audio.display()
        );
    }

    let voice = Voice {
        name: a.name.clone(),
        language,
        transcript: a.text.trim().to_owned(),
        codes,
        source: format!(
            "encoded from {} with {}",
            file_name(&a.audio),
            file_name(&encoder)
        ),
        license: a.license.clone().unwrap_or_default(),
    };
    let warning = match a.model.as_deref().map(resolve_dir) {
        Some(dir) => onebit_tts::voice::check_budget(
            &voice,
            ModelPackage::load(&dir, a.codec.as_deref())?
                .genai
                .token_budget(),
        )?,
        None => onebit_tts::voice::length_warning(&voice),
    };
    if let Some(w) = warning {
        eprintln!("warning: {w}");
    }
    let path = VoiceStore::save(&dir, &voice, a.force)?;
    println!(
        "added {:<16} {:<6} {:>4} codes ({:.2} s) -> {}",
        voice.name,
        voice.language,
        voice.codes.len(),
        voice.seconds(),
        path.display()
    );
    Ok(())
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

fn default_model() -> PathBuf {
    let real = resolve_dir(Path::new("models/neutts-air"));
    if real.join("genai_config.json").exists() {
        real
    } else {
        resolve_dir(Path::new("models/tiny"))
    }
}

/// Where `voices import` writes by default: the checkout's voices/.
fn store_dir() -> PathBuf {
    resolve_dir(Path::new("voices"))
}

fn progress_bar(quiet: bool, len: u64, template: &str) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn voice_dirs(extra: &[PathBuf]) -> Vec<PathBuf> {
    let mut dirs = onebit_tts::voice::default_dirs();
    for d in extra {
        if !dirs.contains(d) {
            dirs.push(d.clone());
        }
    }
    dirs
}

fn synth_config(m: &ModelArgs) -> SynthConfig {
    SynthConfig {
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
            prefill_chunk: None,
            device: Default::default(),
            npu_strict: m.npu_strict,
        },
        codec_threads: m.threads,
        max_input_chars: 0,
        engine: m.engine,
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
    }
}

fn request(voice: &str, text: String, g: &GenArgs, output: OutputSpec) -> Result<SpeechRequest> {
    Ok(SpeechRequest {
        output,
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

fn read_text(text: Option<String>) -> Result<String> {
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
struct OutArgs {
    /// Output format (wav, pcm, flac, mp3, opus); default: from the output file's extension, else wav.
    #[arg(long)]
    format: Option<String>,
    /// Output sample rate, 8000..48000 (default 24000, the codec's).
    #[arg(long)]
    sample_rate: Option<u32>,
    /// Speaking speed 0.25..4.0 (time-stretch, pitch kept).
    #[arg(long, default_value_t = 1.0)]
    speed: f32,
}

fn output_spec(o: &OutArgs, path: &Path) -> Result<OutputSpec> {
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

fn say(
    model: &ModelArgs,
    g: &GenArgs,
    out: &OutArgs,
    voice: &str,
    output: &Path,
    text: Option<String>,
    quiet: bool,
) -> Result<()> {
    let text = read_text(text)?;
    let spec = output_spec(out, output)?;
    let req = request(voice, text, g, spec)?;
    let cfg = synth_config(model);
    let synth = Synthesizer::load(&cfg)?;
    let bar = progress_bar(
        quiet,
        0,
        "{spinner} {prefix} {pos}/~{len} codes {msg} [{elapsed_precise}]",
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let started = std::time::Instant::now();
    // Written to a temporary name and renamed at the end, so a failed run never leaves a cut file
    // under the requested name.
    let tmp = output.with_extension(format!(
        "{}.partial",
        output.extension().and_then(|e| e.to_str()).unwrap_or("out")
    ));
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?,
    );
    let mut write_err: Option<std::io::Error> = None;
    let result = synth.synthesize(&req, &CancelToken::new(), &mut |ev| {
        match ev {
            SynthEvent::Started {
                estimated_codes, ..
            } => bar.set_length(estimated_codes as u64),
            SynthEvent::Piece { index, count, .. } if count > 1 => {
                bar.set_prefix(format!("piece {}/{count}", index + 1));
            }
            SynthEvent::Piece { .. } => {}
            SynthEvent::Code { index, .. } => {
                let n = index as u64 + 1;
                if n > bar.length().unwrap_or(0) {
                    bar.set_length(n);
                }
                bar.set_position(n);
                if n.is_multiple_of(10) {
                    let rate = n as f64 / started.elapsed().as_secs_f64().max(1e-9);
                    bar.set_message(format!(
                        "{rate:.1} codes/s ({:.2}x the 50/s line)",
                        rate / 50.0
                    ));
                }
            }
            SynthEvent::Audio(bytes) => {
                if let Err(e) = std::io::Write::write_all(&mut file, bytes) {
                    write_err = Some(e);
                    return ControlFlow::Break(());
                }
            }
        }
        ControlFlow::Continue(())
    });
    bar.finish_and_clear();
    let finished = (|| -> Result<_> {
        let report = result?;
        if let Some(e) = write_err {
            return Err(e).with_context(|| format!("writing {}", tmp.display()));
        }
        std::io::Write::flush(&mut file).with_context(|| format!("writing {}", tmp.display()))?;
        drop(file);
        std::fs::rename(&tmp, output)
            .with_context(|| format!("renaming to {}", output.display()))?;
        Ok(report)
    })();
    let report = match finished {
        Ok(r) => r,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };
    let secs = report.audio_seconds();
    let cps = metrics::codes_per_second(report.codes.len(), report.timings.decode);
    eprintln!(
        "wrote {} — {:.2} s of audio, {} codes, finish {}, {:.1} codes/s ({:.2}x real time) on {}, RTF {:.3}, seed {}, prompt {} tokens",
        output.display(),
        secs,
        report.codes.len(),
        report.stop.finish_reason(),
        cps,
        cps / 50.0,
        synth.device_label(),
        metrics::rtf(report.timings.total, secs),
        report.seed,
        report.prompt_tokens,
    );
    Ok(())
}

fn serve(model: &ModelArgs, args: &ServeArgs) -> Result<()> {
    // Checked before the model loads (minutes, for a large one): keys, limits, exposure.
    let mut server_cfg = args.config(String::new())?;
    let mut cfg = synth_config(model);
    cfg.max_input_chars = args.max_input_chars;
    let synth = std::sync::Arc::new(Synthesizer::load(&cfg)?);
    tracing::info!(
        package = %synth.package().dir.display(),
        engine = %synth.engine_description(),
        device = %synth.device_label(),
        voices = synth.voices().names().len(),
        "model loaded"
    );
    server_cfg.device = synth.device_label();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(onebit_tts::server::serve(synth, server_cfg))
        .context("server")?;
    // The runtime (and with it the last handle on the synthesizer) goes before main returns.
    drop(rt);
    tracing::info!("stopped");
    Ok(())
}

/// The worker `npu probe` starts: the package's session set up exactly as --device npu does.
fn probe_config(model: &ModelArgs) -> Result<onebit_tts::engine::WorkerConfig> {
    use onebit_tts::engine::{Device, OrtOptions, WorkerConfig};
    let cfg = synth_config(model);
    let pkg = onebit_tts::package::BackbonePackage::load(&cfg.package_dir)?;
    let declared = pkg.genai.model.decoder.session_options.declares_ryzenai();
    let mut wcfg = WorkerConfig::from_process(
        cfg.package_dir.clone(),
        cfg.ort_lib.clone(),
        OrtOptions {
            device: Device::Npu,
            ..cfg.ort.clone()
        },
        declared,
        None,
    )?;
    wcfg.ep_library = cfg.ep_library.clone();
    wcfg.timeouts = cfg.worker_timeouts;
    wcfg.oga = cfg.oga_options();
    Ok(wcfg)
}

/// `doctor [--model PKG]`: with a package, `npu probe` runs first so that the residency line
/// is measured rather than skipped.
fn doctor_cmd(json: bool, model: Option<PathBuf>) -> Result<()> {
    use onebit_tts::npu::doctor::{self, DoctorInputs, Probed, RealHost};
    let mut inputs = DoctorInputs::from_process();
    if let Some(pkg) = model {
        /// The model options with everything but --model from the environment.
        #[derive(Parser)]
        struct FromEnv {
            #[command(flatten)]
            model: ModelArgs,
        }
        let args = ModelArgs {
            model: Some(pkg),
            ..FromEnv::try_parse_from(["onebit-tts"])?.model
        };
        // A package that cannot even be read is a failed setup, reported on the
        // residency line with the rest of the report.
        let residency = match probe_config(&args) {
            Ok(cfg) => onebit_tts::engine::worker::probe::probe(cfg).residency,
            Err(e) => onebit_tts::npu::Residency::failed(format!("{e:#}")),
        };
        inputs.probed = Some(Probed {
            package: synth_config(&args).package_dir.display().to_string(),
            residency,
        });
    }
    let report = doctor::run(&inputs, &RealHost::default());
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if report.exit_code() == 0 {
        Ok(())
    } else {
        Err(Silent.into())
    }
}

fn npu_probe(model: &ModelArgs, json: bool) -> Result<()> {
    use onebit_tts::engine::worker::probe;
    let report = probe::probe(probe_config(model)?);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    match report.exit_code() {
        0 => Ok(()),
        code => Err(ExitWith(code).into()),
    }
}

fn prompt_cmd(model: &ModelArgs, g: &GenArgs, voice: &str, text: String, json: bool) -> Result<()> {
    // The prompt needs no runtime: only the package, the voice and the front end.
    let front = FrontEnd::load(&synth_config(model))?;
    let req = request(voice, text, g, OutputSpec::default())?;
    let budget = front.package().genai.token_budget();
    let (pieces, _) = front.plan(&req, budget, req.generation.min_new_tokens)?;
    if json {
        let list: Vec<_> = pieces
            .iter()
            .map(|p| {
                serde_json::json!({"text": p.text, "prepared": p.prepared, "ids": p.ids,
                "tokens": p.ids.len(), "estimated_codes": p.estimated_codes})
            })
            .collect();
        // One piece prints as one object (the common case, and what parity scripts read).
        let v = match list.as_slice() {
            [one] => one.clone(),
            _ => serde_json::json!({ "pieces": list, "budget": budget }),
        };
        println!("{v}");
    } else {
        for (i, p) in pieces.iter().enumerate() {
            println!(
                "piece {}/{}\ntext:     {}\nprepared: {}\ntokens:   {} (+~{} codes of a {budget}-token budget)\nids:      {:?}",
                i + 1,
                pieces.len(),
                p.text,
                p.prepared,
                p.ids.len(),
                p.estimated_codes,
                p.ids
            );
        }
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Say {
            model,
            generation,
            out,
            voice,
            output,
            text,
        } => say(&model, &generation, &out, &voice, &output, text, cli.quiet),
        Cmd::Serve { model, args } => serve(&model, &args),
        Cmd::Bench { model, args } => bench(&model, &args, cli.quiet),
        Cmd::Worker => unreachable!("main runs the worker before anything else"),
        Cmd::Npu {
            cmd: NpuCmd::Probe { model, json },
        } => npu_probe(&model, json),
        Cmd::Doctor { json, model } => doctor_cmd(json, model),
        Cmd::Prompt {
            model,
            generation,
            voice,
            json,
            text,
        } => prompt_cmd(&model, &generation, &voice, text, json),
        Cmd::Models {
            cmd: ModelsCmd::Check { dir, codec },
        } => {
            let pkg = ModelPackage::load(&resolve_dir(&dir), codec.as_deref())?;
            println!("{}", pkg.summary());
            check_head(&pkg)
        }
        Cmd::Models {
            cmd:
                ModelsCmd::Optimize {
                    src,
                    dst,
                    no_last_position,
                    no_speech_head,
                },
        } => {
            let levers = optimize::Levers {
                last_position: !no_last_position,
                speech_head: !no_speech_head,
            };
            let report = optimize::optimize(&resolve_dir(&src), &dst, levers)?;
            println!("{}", report.summary());
            let pkg = ModelPackage::load(&dst, None)?;
            check_head(&pkg)
        }
        Cmd::Voices {
            cmd:
                VoicesCmd::Import {
                    paths,
                    name,
                    text,
                    languages,
                    source,
                    license,
                    force,
                    dir,
                    model,
                },
        } => {
            let mut opts = onebit_tts::voice::ImportOptions {
                name,
                transcript: text,
                source,
                license,
                ..Default::default()
            };
            for l in &languages {
                opts.add_language(l);
            }
            let bar = progress_bar(
                cli.quiet,
                paths.len() as u64,
                "{spinner} importing {pos}/{len} {msg}",
            );
            let voices = onebit_tts::voice::import_paths(&paths, &opts)?;
            let budget = match model.as_deref().map(resolve_dir) {
                Some(dir) => Some(ModelPackage::load(&dir, None)?.genai.token_budget()),
                None => None,
            };
            let dir = dir.unwrap_or_else(store_dir);
            bar.set_length(voices.len() as u64);
            for v in &voices {
                bar.set_message(v.name.clone());
                let warning = match budget {
                    Some(b) => onebit_tts::voice::check_budget(v, b)?,
                    None => onebit_tts::voice::length_warning(v),
                };
                if let Some(w) = warning {
                    bar.suspend(|| eprintln!("warning: {w}"));
                }
                let path = onebit_tts::voice::VoiceStore::save(&dir, v, force)?;
                bar.inc(1);
                bar.suspend(|| {
                    println!(
                        "imported {:<16} {:<6} {:>4} codes ({:.2} s) -> {}",
                        v.name,
                        v.language,
                        v.codes.len(),
                        v.seconds(),
                        path.display()
                    )
                });
            }
            bar.finish_and_clear();
            Ok(())
        }
        Cmd::Voices {
            cmd: VoicesCmd::Add(args),
        } => voices_add(args),
        Cmd::Voices {
            cmd: VoicesCmd::Remove { name, dir },
        } => {
            let path =
                onebit_tts::voice::VoiceStore::remove(&dir.unwrap_or_else(store_dir), &name)?;
            println!("removed {}", path.display());
            Ok(())
        }
        Cmd::Voices { cmd } => {
            let (extra, name) = match cmd {
                VoicesCmd::List { voices } => (voices, None),
                VoicesCmd::Show { name, voices } => (voices, Some(name)),
                VoicesCmd::Import { .. } | VoicesCmd::Add(_) | VoicesCmd::Remove { .. } => {
                    unreachable!("handled above")
                }
            };
            let store = onebit_tts::voice::VoiceStore::open(&voice_dirs(&extra))?;
            match name {
                None => {
                    for (v, path) in store.iter() {
                        let license = if v.license.is_empty() {
                            "licence unknown"
                        } else {
                            v.license.as_str()
                        };
                        println!(
                            "{:<16} {:<6} {:>6.2} s  {:<44} {}",
                            v.name,
                            v.language,
                            v.seconds(),
                            license,
                            path.display()
                        );
                    }
                }
                Some(name) => {
                    let v = store.get(&name)?;
                    println!(
                        "name:       {}\nlanguage:   {}\ncodes:      {} ({:.2} s)\ntranscript: {}\nsource:     {}\nlicense:    {}",
                        v.name,
                        v.language,
                        v.codes.len(),
                        v.seconds(),
                        v.transcript,
                        v.source,
                        v.license
                    );
                }
            }
            Ok(())
        }
    }
}

#[derive(Args, Clone)]
struct BenchArgs {
    /// Runs per case (median ± half-range are reported).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Voices to run (repeatable; default: the first voice, or `test`).
    #[arg(long = "voice")]
    voice: Vec<String>,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Write an SVG: codes/s over the run against the 50/s line, and stage shares.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Measure the backbone alone: prefill and decode speed at fixed prompt lengths.
    #[arg(long)]
    engine_only: bool,
    /// Prompt lengths for --engine-only.
    #[arg(long, value_delimiter = ',', default_value = "128,512,2048")]
    prompt_lens: Vec<usize>,
    /// Codes generated per --engine-only run.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// With --engine-only: run the peers' own loops on the same prompts in the same run:
    /// onnxruntime-genai, and llama.cpp when its Q4_0 GGUF is there (see --llama-gguf).
    #[arg(long)]
    peers: bool,
    /// The package the peer runs (default: --model). onnxruntime-genai cannot run a speech-only
    /// head, so compare an optimized package against its source here.
    #[arg(long)]
    peer_model: Option<PathBuf>,
    /// The llama.cpp peer's model (default: PEER_MODEL-q4_0.gguf beside the peer package). Make
    /// it with scripts/setup-llama-peer.sh, then tools/onnx_to_gguf.py PEER_MODEL.
    #[arg(long)]
    llama_gguf: Option<PathBuf>,
    /// Sampling temperature of the synthesis runs (vendor default 1.0; 0 is greedy).
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
}

fn bench(model: &ModelArgs, args: &BenchArgs, quiet: bool) -> Result<()> {
    use onebit_tts::bench;
    let cfg = synth_config(model);
    let bar = progress_bar(
        quiet,
        0,
        "{spinner} {msg} [{pos}/{len}] [{elapsed_precise}]",
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut progress = |msg: &str, done: usize, total: usize| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(msg.to_owned());
    };
    if args.engine_only {
        let front = FrontEnd::load(&cfg)?;
        let pkg = front.package();
        let mut engine = onebit_tts::synth::load_engine(&cfg, pkg)?;
        let candidates = onebit_tts::engine::Candidates::of(pkg);
        let text_ids: Vec<u32> = pkg
            .tokenizer
            .encode("user: Convert the text to speech: ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ.", false)
            .map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?
            .get_ids()
            .to_vec();
        let budget = pkg.genai.token_budget();
        let lens: Vec<usize> = args
            .prompt_lens
            .iter()
            .copied()
            .filter(|&n| n + args.new_tokens <= budget)
            .collect();
        let ours = bench::engine_only(
            engine.as_mut(),
            &candidates,
            &text_ids,
            &lens,
            args.new_tokens,
            args.runs,
            &mut progress,
        )?;
        let mut peers: Vec<PeerRun> = Vec::new();
        let mut llama_note = None;
        if args.peers {
            let peer_dir = args
                .peer_model
                .as_deref()
                .map(resolve_dir)
                .unwrap_or_else(|| pkg.dir.clone());
            let prompts: Vec<Vec<u32>> = lens
                .iter()
                .map(|&n| bench::synthetic_prompt(&candidates, &text_ids, n))
                .collect();
            let threads = model.threads;
            bar.set_message("onnxruntime-genai (peer) on the same prompts");
            peers.push(run_peer(
                &Peer::oga(&peer_dir)?,
                &prompts,
                args.new_tokens,
                args.runs,
                threads,
            )?);
            match Peer::llama(args.llama_gguf.as_deref(), &peer_dir)? {
                Ok(llama) => {
                    bar.set_message("llama.cpp (peer) on the same prompts");
                    peers.push(run_peer(
                        &llama,
                        &prompts,
                        args.new_tokens,
                        args.runs,
                        threads,
                    )?);
                }
                Err(note) => llama_note = Some(note),
            }
        }
        bar.finish_and_clear();
        let rss = bench::peak_rss_mb();
        let files = bench::files_mb(&pkg.dir);
        // Never an NPU rate without proof: an unproven NPU load is labelled "cpu fallback".
        let residency = engine.worker().and_then(|w| w.residency());
        let device = onebit_tts::synth::device_label(engine.device(), residency.as_ref());
        if args.json {
            // "onnxruntime_genai" / "llama_cpp": [prefill ms, decode tok/s] per prompt length, as
            // before; "peers": who ran, on what, and how far its greedy tokens agree with ours.
            let pairs = |key: &str| {
                peers.iter().find(|p| p.key == key).map(|p| {
                    p.per_prompt
                        .iter()
                        .map(|r| (r.prefill_ms, r.decode_tok_per_s))
                        .collect::<Vec<_>>()
                })
            };
            let about: serde_json::Map<String, serde_json::Value> = peers
                .iter()
                .map(|p| {
                    let agree: Vec<usize> = ours
                        .iter()
                        .zip(&p.per_prompt)
                        .map(|(o, r)| leading_agreement(&o.last_ids, &r.tokens))
                        .collect();
                    (
                        p.key.to_owned(),
                        serde_json::json!({"version": p.version, "model": p.model,
                            "settings": p.settings, "greedy_agreement": agree}),
                    )
                })
                .collect();
            println!(
                "{}",
                serde_json::json!({"engine": engine.describe(), "device": device, "residency": residency,
                    "machine": bench::machine(), "ours": ours,
                    "onnxruntime_genai": pairs("onnxruntime_genai"), "llama_cpp": pairs("llama_cpp"),
                    "peers": about, "llama_cpp_note": llama_note,
                    "peak_rss_mb": rss, "model_files_mb": files})
            );
            return Ok(());
        }
        println!(
            "engine {}\ndevice {device}\nmachine {}\n",
            engine.describe(),
            bench::machine()
        );
        // Stat's Display ignores width, so each cell is formatted first, then padded.
        let cell = |st: bench::Stat, p: usize| format!("{:.p$} ± {:.p$}", st.median, st.half_range);
        let mut rows: Vec<Vec<String>> = vec![
            ["prompt", "prefill ms", "prefill tok/s", "decode codes/s"]
                .map(String::from)
                .to_vec(),
        ];
        for p in &peers {
            rows[0].push(format!("{} decode tok/s", p.label));
            rows[0].push(format!("x {}", p.short));
            rows[0].push(format!("prefill x {}", p.short));
        }
        for (i, r) in ours.iter().enumerate() {
            let mut row = vec![
                r.prompt_tokens.to_string(),
                cell(r.prefill_ms, 1),
                cell(r.prefill_tok_per_s, 0),
                cell(r.decode_codes_per_s, 1),
            ];
            for p in &peers {
                let pr = &p.per_prompt[i];
                row.push(format!("{:.1}", pr.decode_tok_per_s.median));
                row.push(format!(
                    "{:.2}",
                    r.decode_codes_per_s.median / pr.decode_tok_per_s.median
                ));
                row.push(format!("{:.2}", pr.prefill_ms.median / r.prefill_ms.median));
            }
            rows.push(row);
        }
        let widths: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        for row in &rows {
            let line: Vec<String> = row
                .iter()
                .zip(&widths)
                .map(|(s, &w)| format!("{s:>w$}"))
                .collect();
            println!("{}", line.join("  "));
        }
        println!(
            "\npeak RSS {rss:.0} MiB (this process; each peer runs in its own); model files {files:.0} MiB; {} new codes per run, median ± half-range of {} runs",
            args.new_tokens, args.runs
        );
        for p in &peers {
            let agree: Vec<String> = ours
                .iter()
                .zip(&p.per_prompt)
                .map(|(o, r)| {
                    format!(
                        "{}/{}",
                        leading_agreement(&o.last_ids, &r.tokens),
                        o.last_ids.len()
                    )
                })
                .collect();
            println!(
                "{}: {} on {}; greedy tokens equal to ours from the start: {}",
                p.label,
                p.version,
                p.model.display(),
                agree.join(", ")
            );
        }
        if let Some(note) = llama_note {
            println!("{note}");
        }
        return Ok(());
    }
    let synth = Synthesizer::load(&cfg)?;
    let voices = if args.voice.is_empty() {
        let names = synth.voices().names();
        vec![if names.iter().any(|n| n == "test") {
            "test".to_owned()
        } else {
            names.first().cloned().unwrap_or_else(|| "test".into())
        }]
    } else {
        args.voice.clone()
    };
    let sampling = onebit_tts::engine::SamplingParams {
        temperature: args.temperature,
        ..Default::default()
    };
    let report = bench::run(&synth, &voices, args.runs, sampling, &mut progress)?;
    bar.finish_and_clear();
    if let Some(p) = &args.plot {
        std::fs::write(p, bench::svg::render(&report))
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.table());
    }
    Ok(())
}

/// The command that makes the llama.cpp peer's model from a package.
fn llama_howto(peer_dir: &Path) -> String {
    format!(
        "scripts/setup-llama-peer.sh && .onebit/venv/bin/python tools/onnx_to_gguf.py {}",
        peer_dir.display()
    )
}

/// A peer engine: its own generation loop, run by a script of benches/peers/ in its own process
/// on the same prompts (stdin/stdout JSON, see benches/peers/oga_bench.py).
struct Peer {
    /// Key in the JSON report.
    key: &'static str,
    /// Name in the table and messages.
    label: &'static str,
    /// Ratio column suffix (`x oga`).
    short: &'static str,
    python: PathBuf,
    /// Relative to the checkout (resolved like a model directory).
    script: PathBuf,
    model: PathBuf,
    /// How to install what the peer needs, for error messages.
    setup: String,
}

impl Peer {
    /// onnxruntime-genai's greedy loop on an onnxruntime-genai package.
    fn oga(dir: &Path) -> Result<Self> {
        let python = onebit_tts::paths::in_homes("venv/bin/python")
            .into_iter()
            .find(|p| p.exists())
            .context("the onnxruntime-genai peer needs .onebit/venv (scripts/setup.sh)")?;
        Ok(Self {
            key: "onnxruntime_genai",
            label: "oga",
            short: "oga",
            python,
            script: "benches/peers/oga_bench.py".into(),
            model: dir.to_path_buf(),
            setup: "scripts/setup.sh".into(),
        })
    }

    /// llama.cpp's loop on a Q4_0 GGUF: `--llama-gguf`, else `PEER_DIR-q4_0.gguf` beside the peer
    /// package (what tools/onnx_to_gguf.py writes by default). `Ok(Err(note))` when no GGUF was
    /// asked for and none is there: the bench runs without it and prints the note.
    fn llama(gguf: Option<&Path>, peer_dir: &Path) -> Result<std::result::Result<Self, String>> {
        let howto = llama_howto(peer_dir);
        let model = match gguf {
            Some(p) => {
                let p = resolve_dir(p);
                if !p.is_file() {
                    bail!(
                        "--llama-gguf {}: no such file; make the llama.cpp peer's model with: {howto} [--out FILE]",
                        p.display()
                    );
                }
                p
            }
            None => {
                let name = peer_dir
                    .file_name()
                    .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
                let p = peer_dir.with_file_name(format!("{name}-q4_0.gguf"));
                if !p.is_file() {
                    return Ok(Err(format!(
                        "llama.cpp peer not run: no {} (and no --llama-gguf); to add it: {howto}",
                        p.display()
                    )));
                }
                p
            }
        };
        let python = onebit_tts::paths::in_homes("llama/venv/bin/python")
            .into_iter()
            .find(|p| p.exists())
            .with_context(|| {
                format!(
                    "the llama.cpp peer needs llama.cpp built into .onebit/llama (scripts/setup-llama-peer.sh) for {}",
                    model.display()
                )
            })?;
        Ok(Ok(Self {
            key: "llama_cpp",
            label: "llama.cpp",
            short: "llama",
            python,
            script: "benches/peers/llama_bench.py".into(),
            model,
            setup: "scripts/setup-llama-peer.sh".into(),
        }))
    }
}

/// One peer's measurements, per prompt length.
struct PeerRun {
    key: &'static str,
    label: &'static str,
    short: &'static str,
    model: PathBuf,
    version: String,
    settings: serde_json::Value,
    per_prompt: Vec<PeerResult>,
}

struct PeerResult {
    prefill_ms: onebit_tts::bench::Stat,
    decode_tok_per_s: onebit_tts::bench::Stat,
    /// The new ids of the peer's last run (empty when its script does not say).
    tokens: Vec<u32>,
}

/// Runs a peer's script on the prompts: exactly `new_tokens` greedy tokens, one warm-up and
/// `runs` measured runs per prompt.
fn run_peer(
    peer: &Peer,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    runs: usize,
    threads: Option<usize>,
) -> Result<PeerRun> {
    use std::io::Write as _;
    let script = resolve_dir(&peer.script);
    let mut child = std::process::Command::new(&peer.python)
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .with_context(|| {
            format!(
                "starting the {} peer ({} {})",
                peer.label,
                peer.python.display(),
                script.display()
            )
        })?;
    let req = serde_json::json!({"model": peer.model, "prompts": prompts, "new_tokens": new_tokens,
        "runs": runs, "threads": threads});
    child
        .stdin
        .take()
        .context("peer stdin")?
        .write_all(req.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!(
            "the {} peer failed ({}) on {}; its messages are above (setup: {})",
            peer.label,
            out.status,
            peer.model.display(),
            peer.setup
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("reading the {} peer's output", peer.label))?;
    let results = v["results"]
        .as_array()
        .with_context(|| format!("the {} peer's output has no results", peer.label))?;
    if results.len() != prompts.len() {
        bail!(
            "the {} peer answered {} of {} prompts",
            peer.label,
            results.len(),
            prompts.len()
        );
    }
    let per_prompt = results
        .iter()
        .map(|r| {
            let f = |k: &str| -> Vec<f64> {
                r[k].as_array()
                    .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
                    .unwrap_or_default()
            };
            PeerResult {
                prefill_ms: onebit_tts::bench::Stat::of(
                    &f("prefill_s").iter().map(|s| s * 1e3).collect::<Vec<_>>(),
                ),
                decode_tok_per_s: onebit_tts::bench::Stat::of(&f("decode_tok_per_s")),
                tokens: r["tokens"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_u64().map(|t| t as u32))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    Ok(PeerRun {
        key: peer.key,
        label: peer.label,
        short: peer.short,
        model: peer.model.clone(),
        version: v["version"].as_str().unwrap_or("?").to_owned(),
        settings: v["settings"].clone(),
        per_prompt,
    })
}

/// How many tokens two greedy runs share from the start.
fn leading_agreement(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// An error already reported on stdout (doctor's FAIL lines): exit 1 without an extra line.
/// Prints the decoder's lm_head as the graph has it and checks it against onebit_logits.json.
fn check_head(pkg: &ModelPackage) -> Result<()> {
    let logits = &pkg.genai.model.decoder.outputs.logits;
    match optimize::inspect(&pkg.decoder_path, logits) {
        Ok(head) => {
            println!("lm_head      {}", head.describe());
            let want = pkg.logits.width(pkg.genai.model.vocab_size);
            if head.n != want || head.last_position != pkg.logits.last_position_only {
                bail!(
                    "{}: the graph's lm_head ({}) does not match the package's logits ({})",
                    pkg.decoder_path.display(),
                    head.describe(),
                    pkg.logits.describe(pkg.genai.model.vocab_size)
                );
            }
            Ok(())
        }
        Err(e) if !pkg.logits.is_optimized() => {
            println!("lm_head      not optimizable: {e}");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Ends the process with this status, having said what it had to say already.
#[derive(Debug)]
struct ExitWith(u8);
impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}
impl std::error::Error for ExitWith {}

#[derive(Debug)]
struct Silent;
impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("checks failed")
    }
}
impl std::error::Error for Silent {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A one-shot command's user wants its progress and summary, not the server's INFO lines;
    // the server (and the worker, whose lines the parent re-logs) keeps them.
    let long_running = matches!(cli.cmd, Cmd::Serve { .. } | Cmd::Worker);
    let default = if cli.verbose || (long_running && !cli.quiet) {
        "info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("ONEBIT_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_env("RUST_LOG"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default},ort=warn")));
    if matches!(cli.cmd, Cmd::Worker) {
        // Plain `LEVEL message` lines: the parent adds the time and re-logs each at its level.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(false)
            .without_time()
            .init();
        // No other thread exists yet: the worker blocks its signals before it starts any.
        return onebit_tts::engine::worker::child::main();
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colour codes only for a person at a terminal, not in a log file or a test's pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Silent>() => ExitCode::FAILURE,
        Err(e) if e.is::<ExitWith>() => {
            ExitCode::from(e.downcast_ref::<ExitWith>().map_or(1, |x| x.0))
        }
        Err(e) => {
            // One line: the chain joined, so scripts can grep it.
            let msg = e
                .chain()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": ");
            eprintln!("error: {}", msg.replace('\n', "\n       "));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn leading_agreement_counts_the_common_start() {
        assert_eq!(leading_agreement(&[1, 2, 3], &[1, 2, 3]), 3);
        assert_eq!(leading_agreement(&[1, 2, 3], &[1, 9, 3]), 1);
        assert_eq!(leading_agreement(&[1, 2, 3], &[]), 0);
        assert_eq!(leading_agreement(&[1, 2], &[1, 2, 3]), 2);
    }

    #[test]
    fn llama_peer_default_gguf_sits_beside_the_package() {
        let dir = std::env::temp_dir().join(format!("onebit-llama-peer-{}", std::process::id()));
        let pkg = dir.join("pkg");
        std::fs::create_dir_all(&pkg).unwrap();
        // No GGUF asked for and none there: a note on how to make it, not an error.
        let slash = PathBuf::from(format!("{}/", pkg.display()));
        for p in [&pkg, &slash] {
            match Peer::llama(None, p).unwrap() {
                Err(note) => {
                    assert!(
                        note.contains(&dir.join("pkg-q4_0.gguf").display().to_string()),
                        "{note}"
                    );
                    assert!(note.contains("scripts/setup-llama-peer.sh"), "{note}");
                    assert!(note.contains("tools/onnx_to_gguf.py"), "{note}");
                }
                Ok(_) => panic!("no GGUF exists"),
            }
        }
        // A GGUF asked for that is not there: an error saying how to make it.
        let e = Peer::llama(Some(&dir.join("missing.gguf")), &pkg)
            .err()
            .expect("missing --llama-gguf is an error")
            .to_string();
        assert!(
            e.contains("missing.gguf") && e.contains("scripts/setup-llama-peer.sh"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_peer_reads_the_peer_contract_and_reports_failures() {
        let dir = std::env::temp_dir().join(format!("onebit-run-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.sh");
        std::fs::write(
            &ok,
            r#"cat > /dev/null
echo '{"version": "fake 1", "settings": {"threads": 2}, "results": [
 {"prompt_tokens": 3, "prefill_s": [0.5, 0.25, 0.75], "decode_tok_per_s": [10, 30, 20], "tokens": [7, 8]},
 {"prompt_tokens": 5, "prefill_s": [1.0], "decode_tok_per_s": [5]}]}'
"#,
        )
        .unwrap();
        let peer = |script: &Path| Peer {
            key: "fake",
            label: "fake",
            short: "fake",
            python: PathBuf::from("/bin/sh"),
            script: script.to_path_buf(),
            model: dir.clone(),
            setup: "nothing".into(),
        };
        let prompts = vec![vec![1, 2, 3], vec![1, 2, 3, 4, 5]];
        let r = run_peer(&peer(&ok), &prompts, 2, 3, None).unwrap();
        assert_eq!(r.version, "fake 1");
        assert_eq!(r.settings["threads"], 2);
        assert_eq!(r.per_prompt.len(), 2);
        assert_eq!(r.per_prompt[0].prefill_ms.median, 500.0);
        assert_eq!(r.per_prompt[0].decode_tok_per_s.median, 20.0);
        assert_eq!(r.per_prompt[0].tokens, vec![7, 8]);
        assert!(r.per_prompt[1].tokens.is_empty());
        // one prompt short: refused
        let three = vec![vec![1], vec![2], vec![3]];
        let e = run_peer(&peer(&ok), &three, 2, 3, None).err().unwrap();
        assert!(e.to_string().contains("answered 2 of 3"), "{e}");
        // a failing script: its exit status and the setup hint
        let bad = dir.join("bad.sh");
        std::fs::write(&bad, "cat > /dev/null; echo boom >&2; exit 3\n").unwrap();
        let e = run_peer(&peer(&bad), &prompts, 2, 3, None).err().unwrap();
        assert!(
            e.to_string().contains("fake peer failed") && e.to_string().contains("nothing"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// clap checks a command's definition (duplicate argument ids, ...) only in debug builds and
    /// only when that subcommand is parsed; this checks every subcommand at once.
    #[test]
    fn every_subcommand_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
