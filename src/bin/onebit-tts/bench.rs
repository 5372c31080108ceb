//! `bench`: synthesis speed against the real-time line, or the backbone alone with its peers.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use onebit_tts::synth::{Door, Limits, Synthesizer};

use crate::args::{ModelArgs, progress_bar, synth_config};

#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Runs per case (median ± half-range are reported).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Voices to run (repeatable; default: the first voice, or `test`).
    #[arg(long = "voice")]
    pub voice: Vec<String>,
    /// Print the report as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG: codes/s over the run against the 50/s line, and stage shares.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Measure the backbone alone: prefill and decode speed at fixed prompt lengths.
    #[arg(long)]
    pub engine_only: bool,
    /// Prompt lengths for --engine-only.
    #[arg(long, value_delimiter = ',', default_value = "128,512,2048")]
    pub prompt_lens: Vec<usize>,
    /// Codes generated per --engine-only run.
    #[arg(long, default_value_t = 128)]
    pub new_tokens: usize,
    /// Run the peers in the same run, after ours, each in its own process. With --engine-only:
    /// onnxruntime-genai's and llama.cpp's own loops on the same prompts (llama.cpp when its Q4_0
    /// GGUF is there, see --llama-gguf). Without: the vendor's own streaming pipeline (neutts's
    /// infer_stream on llama.cpp with that GGUF and this package's codec) on the same texts and
    /// voices, as many codes per case as ours made, --runs runs after a warm-up, --temperature,
    /// --threads; set up with scripts/setup-neutts-peer.sh. Not with --concurrency.
    #[arg(long, conflicts_with = "concurrency")]
    pub peers: bool,
    /// The package the engine-only peers run (default: --model); its PEER_MODEL-q4_0.gguf is the
    /// default GGUF of the llama.cpp peers. onnxruntime-genai cannot run a speech-only head, so
    /// compare an optimized package against its source here.
    #[arg(long)]
    pub peer_model: Option<PathBuf>,
    /// The GGUF of the llama.cpp peers: llama.cpp's loop and the vendor's pipeline (default:
    /// PEER_MODEL-q4_0.gguf beside the peer package). Make it with scripts/setup-llama-peer.sh,
    /// then tools/onnx_to_gguf.py PEER_MODEL.
    #[arg(long)]
    pub llama_gguf: Option<PathBuf>,
    /// With --engine-only: also run our loop on these packages (each with the engine its format
    /// takes: ONNX with ort, GGUF with llama) on the same prompts, in the same run and table,
    /// e.g. a model's GGUF beside its ONNX package. They must share --model's vocabulary.
    #[arg(
        long = "also-model",
        value_delimiter = ',',
        requires = "engine_only",
        conflicts_with = "concurrency"
    )]
    pub also_model: Vec<PathBuf>,
    /// Sampling temperature of the synthesis runs (vendor default 1.0; 0 is greedy).
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Run requests at once, at each of these levels (e.g. 1,2,4,8): aggregate and per-stream
    /// codes/s, time to first audio under load, and the ratio to one request. With
    /// --engine-only, the backbone's scheduler alone on a synthetic prompt.
    #[arg(long, value_delimiter = ',', value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=64))]
    pub concurrency: Vec<usize>,
    /// Prompt length of the --engine-only --concurrency streams (a voice's reference is ~400
    /// tokens).
    #[arg(long, default_value_t = 512)]
    pub load_prompt_len: usize,
}

pub fn bench(model: &ModelArgs, args: &BenchArgs, quiet: bool) -> Result<()> {
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
    if !args.concurrency.is_empty() {
        let mut levels = args.concurrency.clone();
        levels.sort_unstable();
        levels.dedup();
        let report = if args.engine_only {
            bench::load::engine_load(
                &cfg,
                &levels,
                args.load_prompt_len,
                args.new_tokens,
                args.runs,
                &mut progress,
            )?
        } else {
            // The scheduler needs a place for every stream of the largest level.
            let mut cfg = cfg.clone();
            cfg.scheduler.max_batch = cfg.scheduler.max_batch.max(levels[levels.len() - 1]);
            let synth = std::sync::Arc::new(Synthesizer::load(&cfg)?);
            let voice = first_voice(&synth, &args.voice);
            // Every stream of the largest level has a place: none waits in line.
            let door = Door::new(synth, Limits::default());
            let sampling = onebit_tts::engine::SamplingParams {
                temperature: args.temperature,
                ..Default::default()
            };
            bench::load::pipeline_load(&door, &voice, &levels, args.runs, sampling, &mut progress)?
        };
        bar.finish_and_clear();
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else {
            print!("{}", report.table());
        }
        return Ok(());
    }
    if args.engine_only {
        let opts = bench::peers::EngineBench {
            prompt_lens: args.prompt_lens.clone(),
            new_tokens: args.new_tokens,
            runs: args.runs,
            peers: args.peers,
            peer_model: args.peer_model.clone(),
            llama_gguf: args.llama_gguf.clone(),
            peer_threads: model.threads,
            also: args.also_model.clone(),
        };
        let report = bench::peers::run_engine_bench(&cfg, &opts, &mut progress)?;
        bar.finish_and_clear();
        if args.json {
            println!("{}", report.to_json());
        } else {
            print!("{}", report.table());
        }
        return Ok(());
    }
    let synth = std::sync::Arc::new(Synthesizer::load(&cfg)?);
    let voices = if args.voice.is_empty() {
        vec![first_voice(&synth, &[])]
    } else {
        args.voice.clone()
    };
    let sampling = onebit_tts::engine::SamplingParams {
        temperature: args.temperature,
        ..Default::default()
    };
    // Found before our runs: a missing setup is refused before minutes of measuring.
    let vendor = if args.peers {
        let peer_dir = bench::peers::peer_dir(args.peer_model.as_deref(), &synth.package().dir);
        Some(bench::vendor::VendorPeer::find(
            args.llama_gguf.as_deref(),
            &peer_dir,
        )?)
    } else {
        None
    };
    let door = Door::new(synth.clone(), Limits::default());
    let mut report = bench::run(&door, &voices, args.runs, sampling, &mut progress)?;
    match vendor {
        Some(Ok(peer)) => {
            let opts = bench::vendor::VendorOptions {
                runs: args.runs,
                temperature: args.temperature,
                threads: model.threads,
                // As ours ran: a cache only some engines and settings have.
                voice_cache: report.runs.iter().any(|r| r.numbers.cached_tokens > 0),
            };
            report.vendor = Some(peer.run(&synth, &report, opts, &mut progress)?);
        }
        Some(Err(note)) => report.vendor_note = Some(note),
        None => {}
    }
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

/// The voice a bench runs when none is named: `test` when there is one, else the first.
fn first_voice(synth: &Synthesizer, named: &[String]) -> String {
    if let Some(v) = named.first() {
        return v.clone();
    }
    let names = synth.voices().names();
    if names.iter().any(|n| n == "test") {
        "test".to_owned()
    } else {
        names.first().cloned().unwrap_or_else(|| "test".into())
    }
}
