//! The `onebit-tts` command line. Errors end here: one line on stderr and a non-zero exit.

use std::io::{IsTerminal, Read};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};

use onebit_tts::engine::{CancelToken, GenerationParams, KvMode, OrtOptions, SamplingParams};
use onebit_tts::metrics;
use onebit_tts::package::ModelPackage;
use onebit_tts::prompt::InputFormat;
use onebit_tts::synth::{
    FrontEnd, SpeechRequest, SynthConfig, SynthEvent, Synthesizer, resolve_dir,
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
    /// Intra-op threads of the backbone session (default: the package's config, else ONNX Runtime's).
    #[arg(long, env = "ONEBIT_THREADS")]
    threads: Option<usize>,
    /// KV cache handling (default: the package's search.past_present_share_buffer).
    #[arg(long, value_parser = parse_kv)]
    kv: Option<KvMode>,
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
    /// Synthesise text to a WAV file.
    Say {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        generation: GenArgs,
        #[arg(long, short = 'v')]
        voice: String,
        /// Output file.
        #[arg(short, long, default_value = "out.wav")]
        output: PathBuf,
        /// The text; read from stdin when absent.
        text: Option<String>,
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
enum ModelsCmd {
    /// Validate a package and print its summary.
    Check {
        dir: PathBuf,
        #[arg(long)]
        codec: Option<PathBuf>,
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
}

fn default_model() -> PathBuf {
    let real = resolve_dir(Path::new("models/neutts-air"));
    if real.join("genai_config.json").exists() {
        real
    } else {
        resolve_dir(Path::new("models/tiny"))
    }
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
            kv_mode: m.kv,
            prefill_chunk: None,
        },
        codec_threads: m.threads,
        max_input_chars: 0,
    }
}

fn request(voice: &str, text: String, g: &GenArgs) -> Result<SpeechRequest> {
    Ok(SpeechRequest {
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

fn say(
    model: &ModelArgs,
    g: &GenArgs,
    voice: &str,
    output: &Path,
    text: Option<String>,
    quiet: bool,
) -> Result<()> {
    let text = read_text(text)?;
    let req = request(voice, text, g)?;
    let cfg = synth_config(model);
    let synth = Synthesizer::load(&cfg)?;
    let bar = if quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(0)
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} {pos}/~{len} codes {msg} [{elapsed_precise}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let started = std::time::Instant::now();
    let mut samples: Vec<f32> = Vec::new();
    let report = synth.synthesize(&req, &CancelToken::new(), &mut |ev| {
        match ev {
            SynthEvent::Started {
                estimated_codes, ..
            } => bar.set_length(estimated_codes as u64),
            SynthEvent::Code { index, .. } => {
                let n = index as u64 + 1;
                if n > bar.length().unwrap_or(0) {
                    bar.set_length(n);
                }
                bar.set_position(n);
                if n % 10 == 0 {
                    let rate = n as f64 / started.elapsed().as_secs_f64().max(1e-9);
                    bar.set_message(format!(
                        "{rate:.1} codes/s ({:.2}x the 50/s line)",
                        rate / 50.0
                    ));
                }
            }
            SynthEvent::Audio(chunk) => samples.extend_from_slice(chunk),
        }
        ControlFlow::Continue(())
    })?;
    bar.finish_and_clear();
    let t = std::time::Instant::now();
    let file =
        std::fs::File::create(output).with_context(|| format!("creating {}", output.display()))?;
    onebit_tts::audio::write_wav(std::io::BufWriter::new(file), &samples, report.sample_rate)?;
    let encode = t.elapsed();
    let secs = report.audio_seconds();
    let cps = metrics::codes_per_second(report.codes.len(), report.timings.decode);
    eprintln!(
        "wrote {} — {:.2} s of audio, {} codes, {:.1} codes/s ({:.2}x real time), RTF {:.3}, seed {}, prompt {} tokens, encode {:.1} ms",
        output.display(),
        secs,
        report.codes.len(),
        cps,
        cps / 50.0,
        metrics::rtf(report.timings.total + encode, secs),
        report.seed,
        report.prompt_tokens,
        encode.as_secs_f64() * 1e3,
    );
    Ok(())
}

fn prompt_cmd(model: &ModelArgs, g: &GenArgs, voice: &str, text: String, json: bool) -> Result<()> {
    // The prompt needs no runtime: only the package, the voice and the front end.
    let front = FrontEnd::load(&synth_config(model))?;
    let req = request(voice, text, g)?;
    let (ids, prepared, _) = front.build_prompt(&req)?;
    if json {
        let v = serde_json::json!({ "text": prepared, "ids": ids, "tokens": ids.len() });
        println!("{v}");
    } else {
        println!("text:   {prepared}\ntokens: {}\nids:    {ids:?}", ids.len());
    }
    Ok(())
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Say {
            model,
            generation,
            voice,
            output,
            text,
        } => say(&model, &generation, &voice, &output, text, cli.quiet),
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
            Ok(())
        }
        Cmd::Voices { cmd } => {
            let (extra, name) = match cmd {
                VoicesCmd::List { voices } => (voices, None),
                VoicesCmd::Show { name, voices } => (voices, Some(name)),
            };
            let store = onebit_tts::voice::VoiceStore::open(&voice_dirs(&extra))?;
            match name {
                None => {
                    for (v, path) in store.iter() {
                        println!(
                            "{:<16} {:<6} {:>6.2} s  {}",
                            v.name,
                            v.language,
                            v.seconds(),
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default = if cli.quiet { "warn" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("ONEBIT_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default},ort=warn")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
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
