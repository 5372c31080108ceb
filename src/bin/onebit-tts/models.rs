//! `models`: pull, check and optimize model packages.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Subcommand;
use indicatif::ProgressBar;

use onebit_tts::package::build::{self, BuildOptions, CodecSource, Precision};
use onebit_tts::package::hub::{FetchProgress, Hub, HubConfig};
use onebit_tts::package::pull::{self, Conversion, Outcome, Placed, PullOptions, Target};
use onebit_tts::package::{ModelPackage, convert, optimize};
use onebit_tts::synth::resolve_dir;

use crate::args::progress_bar;

#[derive(Subcommand)]
pub enum ModelsCmd {
    /// Fetch a model from the Hugging Face Hub into its cache (~/.cache/huggingface/hub, or
    /// $HF_HOME/hub) and put a ready package in models/NAME when the files make one: neutts-air-q4
    /// and -q8 (GGUF, --engine llama), neutts-air-npu (AMD's package, --device npu), neutts-air
    /// (the checkpoint, for building), the same for neutts-nano, neutts-nano-german,
    /// neutts-nano-french, neutts-nano-spanish and neutts-2e (each with -q4 and -q8), or any
    /// owner/name id. A German, French or Spanish Nano records its language (its text is read
    /// in it without --lang); NeuTTS-2E takes --emotion, its speakers are the voices emily,
    /// paul, sophie and steven. HF_ENDPOINT and HF_TOKEN are honoured; an interrupted download
    /// resumes on the next run.
    Pull {
        /// A short name (neutts-air-q4, neutts-air-q8, neutts-air-npu, neutts-air,
        /// neutts-nano-q4, neutts-nano-q8, neutts-nano, neutts-nano-german-q4,
        /// neutts-nano-german-q8, neutts-nano-german, the same for -french and -spanish,
        /// neutts-2e-q4, neutts-2e-q8, neutts-2e) or a repository id owner/name.
        name: String,
        /// Branch, tag or commit.
        #[arg(long, default_value = "main")]
        revision: String,
        /// The package directory (default models/NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Replace a directory that `models pull` did not make.
        #[arg(long)]
        force: bool,
        /// The GGUF file to take from a repository that holds several.
        #[arg(long)]
        file: Option<String>,
        /// The codec decoder's repository (e.g. the vendor's int8 variant).
        #[arg(long, default_value = pull::CODEC_REPO)]
        codec_repo: String,
        /// Keep a GGUF package as pulled: no conversion for --engine ort (`models convert`
        /// makes it later).
        #[arg(long)]
        no_convert: bool,
    },
    /// Get the real model for the main job: a NeuTTS-air package already in models/
    /// (neutts-air, neutts-air-q4, neutts-air-q8) is kept; otherwise the vendor's GGUF build is
    /// pulled. When neither works it says why and the commands that finish the job, and exits
    /// non-zero (`say` then uses the test package).
    Setup {
        /// The GGUF build to pull when no real package is there.
        #[arg(long, default_value = "neutts-air-q4", value_parser = ["neutts-air-q4", "neutts-air-q8"])]
        name: String,
        /// Only look: never ask the hub.
        #[arg(long)]
        no_pull: bool,
    },
    /// Build an ONNX package from a checkpoint with onnxruntime-genai's model builder (needs
    /// `scripts/setup.sh --build-tools`): the checkpoint's tokenizer and config and the NeuCodec
    /// decoder go beside the graph; then `models check` and (int4) `models optimize`.
    Build {
        /// A checkpoint directory (config.json, tokenizer.json, safetensors), or a name
        /// `models pull` fetches one by (neutts-air, owner/name).
        src: String,
        /// The package directory (default models/NAME, NAME from the source).
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "int4")]
        precision: Precision,
        /// The execution provider the export targets.
        #[arg(long, value_enum, default_value = "cpu")]
        execution: build::Target,
        /// The NeuCodec decoder package directory (default: pulled from --codec-repo).
        #[arg(long)]
        codec: Option<PathBuf>,
        #[arg(long, default_value = pull::CODEC_REPO)]
        codec_repo: String,
        /// Keep the builder's full-vocabulary, every-position head.
        #[arg(long)]
        no_optimize: bool,
        /// Replace a directory that neither `models pull` nor `models build` made.
        #[arg(long)]
        force: bool,
        /// Weights per scale of int4/int8 weights (the builder's default: 32, as the vendor's
        /// Q4_0). Larger blocks decode and prefill faster on a CPU at a coarser quantisation
        /// (measured: docs/performance.md, "The int4 block size").
        #[arg(long, value_enum)]
        block_size: Option<build::BlockSize>,
    },
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
    /// Turn a GGUF package (the vendor's Q4/Q8 builds, what llama.cpp makes) into an ONNX package
    /// for --engine ort, with no torch: Q4_0/Q8_0/float weights kept bit for bit, other types
    /// requantised and reported, the speech-only last-position head of `models optimize`.
    Convert {
        /// The GGUF package directory (a *.gguf with its tokenizer, config and codec).
        src: PathBuf,
        /// A new (or empty) directory.
        dst: PathBuf,
        /// Requantise the head to 4 bits (fewer bytes read per step than the Q8_0 head
        /// llama.cpp's quantizer writes by default; no longer the GGUF's exact weights).
        #[arg(long)]
        head_int4: bool,
    },
}

/// Prints the decoder's lm_head as the graph has it and checks it against onebit_logits.json.
pub fn check_head(pkg: &ModelPackage) -> Result<()> {
    println!("lm_head      {}", optimize::check_head(pkg)?);
    Ok(())
}

/// One bar per file download (a resumed one starts where its `.part` ended).
struct Bars {
    quiet: bool,
    bar: Option<ProgressBar>,
}

impl FetchProgress for Bars {
    fn start(&mut self, file: &str, size: u64, already: u64) {
        let bar = self.bar.get_or_insert_with(|| {
            progress_bar(
                self.quiet,
                size,
                "{msg:30!} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            )
        });
        bar.set_length(size);
        bar.set_position(already);
        bar.set_message(file.rsplit('/').next().unwrap_or(file).to_owned());
    }
    fn advance(&mut self, bytes: u64) {
        if let Some(b) = &self.bar {
            b.inc(bytes);
        }
    }
    fn done(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
    fn step(&mut self, what: &str, done: usize, total: usize) {
        let bar = self.bar.get_or_insert_with(|| {
            progress_bar(
                self.quiet,
                total as u64,
                "{msg:30!} [{bar:30}] {pos}/{len} {elapsed}",
            )
        });
        bar.set_message(what.to_owned());
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    }
}

fn pull_cmd(target: &str, opts: PullOptions, quiet: bool) -> Result<()> {
    let target = Target::parse(target)?;
    let hub = Hub::new(HubConfig::from_env())?;
    let mut bars = Bars { quiet, bar: None };
    let report = pull::pull(&hub, &target, &opts, &mut bars)?;
    bars.done();
    for s in &report.sources {
        println!(
            "{:<40} {} {} file(s), {} downloaded ({} bytes){}",
            s.repo,
            &s.commit[..s.commit.len().min(12)],
            s.fetched,
            s.downloaded,
            s.bytes_downloaded,
            if s.offline {
                ", hub unreachable: from the cache"
            } else {
                ""
            }
        );
    }
    match &report.outcome {
        Outcome::Package {
            dir,
            summary,
            placed,
            conversion,
        } => {
            let what = match placed {
                Placed::New => "in place",
                Placed::Replaced => "updated",
                Placed::UpToDate => "already up to date",
            };
            println!("{summary}");
            let twin = dir.join(pull::CONVERTED_DIR);
            match conversion {
                Conversion::None => {}
                Conversion::Converted(report) => {
                    println!("{report}");
                    println!(
                        "converted for --engine ort: {} (on a CPU say and serve run it; --engine llama runs the GGUF)",
                        twin.display()
                    );
                }
                Conversion::Kept => println!("converted for --engine ort: {}", twin.display()),
                Conversion::Failed(why) => println!(
                    "not converted for --engine ort ({why}): the GGUF runs with --engine llama"
                ),
            }
            println!("package {}: {what}", dir.display());
        }
        Outcome::Checkpoint { snapshot, .. } => {
            println!("checkpoint {}", snapshot.display());
            println!(
                "a checkpoint runs once built: onebit-tts models build {}",
                report.target.repo
            );
        }
        Outcome::Files { snapshot } => println!("files {}", snapshot.display()),
    }
    Ok(())
}

fn setup_cmd(name: &str, no_pull: bool, quiet: bool) -> Result<()> {
    let dirs = crate::args::REAL_MODEL_DIRS.join(", ");
    if let Some(dir) = crate::args::real_model() {
        println!("real model: {} (kept)", dir.display());
        convert_kept(&dir, quiet);
        return Ok(());
    }
    if no_pull {
        anyhow::bail!(
            "no real model in {dirs} (--no-pull: the hub was not asked); `onebit-tts models \
             pull {name}` gets one, and until then `say` uses the generated test package \
             models/tiny, which speaks no words"
        );
    }
    pull_cmd(name, PullOptions::default(), quiet).with_context(|| {
        format!(
            "no real model in {dirs} and `onebit-tts models pull {name}` did not finish (why \
             follows); once that is fixed, or where the Hugging Face Hub is reachable (or \
             HF_ENDPOINT names a mirror), run it again, or put a package in models/neutts-air \
             (docs/models.md); until then `say` uses the generated test package models/tiny, \
             which speaks no words"
        )
    })?;
    let dir = crate::args::real_model()
        .context("the pulled package is not where the default model looks (a bug)")?;
    println!("real model: {}", dir.display());
    Ok(())
}

/// A kept GGUF package pulled before pulls converted gets its conversion for our engine, as a
/// pull makes it now; a failure leaves the GGUF package as it is (it runs with --engine llama).
fn convert_kept(dir: &std::path::Path, quiet: bool) {
    let twin = dir.join(pull::CONVERTED_DIR);
    if dir.join("genai_config.json").exists() || twin.join("genai_config.json").is_file() {
        return;
    }
    let bar = progress_bar(quiet, 0, "{msg:30!} [{bar:30}] {pos}/{len} {elapsed}");
    bar.set_message("converting for --engine ort");
    let result = convert::convert(dir, &twin, Default::default(), &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    match result {
        Ok(_) => println!("converted for --engine ort: {}", twin.display()),
        Err(e) => {
            println!("not converted for --engine ort ({e}): the GGUF runs with --engine llama")
        }
    }
}

struct BuildArgs {
    src: String,
    out: Option<PathBuf>,
    codec: Option<PathBuf>,
    codec_repo: String,
    opts: BuildOptions,
}

fn build_cmd(a: BuildArgs, quiet: bool) -> Result<()> {
    let BuildArgs {
        src,
        out,
        codec,
        codec_repo,
        mut opts,
    } = a;
    let given = PathBuf::from(&src);
    let name = if given.is_dir() {
        given
            .canonicalize()?
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    } else {
        Target::parse(&src)?.name
    };
    let dir = out.unwrap_or_else(|| PathBuf::from("models").join(&name));
    // Refused before gigabytes are fetched.
    build::precheck(&dir, &opts)?;
    let mut bars = Bars { quiet, bar: None };
    let hub = || -> Result<Hub> { Ok(Hub::new(HubConfig::from_env())?) };
    let (checkpoint, pulled_codec) = if given.is_dir() {
        (given, None)
    } else {
        let pull_opts = PullOptions {
            codec_repo: codec_repo.clone(),
            ..PullOptions::default()
        };
        let report = pull::pull(&hub()?, &Target::parse(&src)?, &pull_opts, &mut bars)?;
        bars.done();
        let Outcome::Checkpoint { snapshot, codec } = report.outcome else {
            anyhow::bail!(
                "{} is not a checkpoint (config.json and safetensors weights)",
                report.target.repo
            );
        };
        let commit = report
            .sources
            .first()
            .map(|s| s.commit.as_str())
            .unwrap_or("");
        opts.source = Some(format!("{}@{commit}", report.target.repo));
        (snapshot, Some(codec))
    };
    opts.codec = match (codec, pulled_codec) {
        (Some(dir), _) => CodecSource::Package(resolve_dir(&dir)),
        (None, Some(files)) => CodecSource::Pulled(files),
        (None, None) => {
            let files = pull::pull_codec(&hub()?, &codec_repo, &mut bars)?;
            bars.done();
            CodecSource::Pulled(files)
        }
    };
    if !quiet {
        eprintln!(
            "building {} ({}) with onnxruntime-genai's model builder",
            checkpoint.display(),
            opts.precision.as_str()
        );
    }
    let report = build::build(&checkpoint, &dir, &opts)?;
    println!("{}", report.summary);
    if let Some(why) = &report.not_optimized {
        println!("not optimized: {why}");
    }
    let what = match report.placed {
        Placed::New => "in place",
        Placed::Replaced => "replaced",
        Placed::UpToDate => "already up to date",
    };
    println!("package {}: {what}", report.dir.display());
    Ok(())
}

pub fn run(cmd: ModelsCmd, quiet: bool) -> Result<()> {
    match cmd {
        ModelsCmd::Build {
            src,
            out,
            precision,
            execution,
            codec,
            codec_repo,
            no_optimize,
            force,
            block_size,
        } => build_cmd(
            BuildArgs {
                src,
                out,
                codec,
                codec_repo,
                opts: BuildOptions {
                    precision,
                    target: execution,
                    // Set by build_cmd once the source is known.
                    codec: CodecSource::Package(PathBuf::new()),
                    optimize: !no_optimize,
                    force,
                    show_builder: !quiet,
                    source: None,
                    block_size,
                },
            },
            quiet,
        ),
        ModelsCmd::Setup { name, no_pull } => setup_cmd(&name, no_pull, quiet),
        ModelsCmd::Pull {
            name,
            revision,
            dir,
            force,
            file,
            codec_repo,
            no_convert,
        } => pull_cmd(
            &name,
            PullOptions {
                revision,
                dir,
                force,
                file,
                codec_repo,
                convert: !no_convert,
            },
            quiet,
        ),
        ModelsCmd::Check { dir, codec } => {
            let pkg = ModelPackage::load(&resolve_dir(&dir), codec.as_deref())?;
            println!("{}", pkg.summary());
            check_head(&pkg)
        }
        ModelsCmd::Optimize {
            src,
            dst,
            no_last_position,
            no_speech_head,
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
        ModelsCmd::Convert {
            src,
            dst,
            head_int4,
        } => {
            let options = convert::ConvertOptions {
                head: if head_int4 {
                    convert::HeadBits::Int4
                } else {
                    convert::HeadBits::AsStored
                },
            };
            let bar = progress_bar(quiet, 0, "{msg:10} [{bar:30}] {pos}/{len} {elapsed}");
            bar.set_message("converting");
            let report = convert::convert(&resolve_dir(&src), &dst, options, &mut |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            });
            bar.finish_and_clear();
            // convert loaded the package back before it took its name.
            println!("{}", report?.summary());
            Ok(())
        }
    }
}
