//! `models build`: a Hugging Face checkpoint (safetensors, config.json, tokenizer files) made into
//! an ONNX package by onnxruntime-genai's model builder, run from the project venv. The builder
//! writes the graph and genai_config.json; the package then takes the checkpoint's own
//! tokenizer.json and config.json (the builder re-saves the tokenizer through transformers, and
//! our front end must read the file the model was trained with) and the NeuCodec decoder. It is
//! checked as `models check` does, made faster with `models optimize` (int4 exports), and only
//! then renamed into place, as `models pull` does.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

pub use super::install::Placed;
use super::neuphonic::{LANGUAGE_FILE, LanguageRecord};
use super::optimize::{self, Levers, OptimizeError};
use super::{ModelPackage, PackageError};
use super::{install, pull};

/// What the build records beside the package.
pub const MANIFEST: &str = super::install::BUILT;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Int4,
    Int8,
    Fp16,
    Fp32,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Int4 => "int4",
            Precision::Int8 => "int8",
            Precision::Fp16 => "fp16",
            Precision::Fp32 => "fp32",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Cpu,
    Cuda,
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Cpu => "cpu",
            Target::Cuda => "cuda",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(
        "fp16 for cpu is refused: onnxruntime-genai's builder exports it without \
         GroupQueryAttention, and ONNX Runtime's CPU provider fails that graph at the first \
         decode step; on cpu use int4, int8 or fp32 (fp16 is for cuda)"
    )]
    Fp16OnCpu,
    #[error(
        "--block-size sets the quantisation block of int4/int8 weights; a {0} export has no \
         quantised weights (use --precision int4 or int8, or drop --block-size)"
    )]
    BlockSizeNeedsIntegers(&'static str),
    #[error("{}: not a checkpoint directory: {missing}", .dir.display())]
    NotACheckpoint { dir: PathBuf, missing: String },
    #[error(
        "models build runs onnxruntime-genai's model builder, which needs torch and transformers \
         in the project venv ({detail}): run scripts/setup.sh --build-tools"
    )]
    ToolsMissing { detail: String },
    #[error("onnxruntime-genai's model builder failed ({status}){}", if .tail.is_empty() { String::new() } else { format!(":\n{}", .tail) })]
    Builder { status: String, tail: String },
    #[error(transparent)]
    Install(#[from] install::InstallError),
    #[error("the built package does not pass `models check` (nothing was put in place): {0}")]
    Check(#[from] PackageError),
    #[error(transparent)]
    Optimize(#[from] OptimizeError),
    #[error("{}: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BuildError + '_ {
    move |err| BuildError::Io {
        path: path.to_path_buf(),
        err,
    }
}

#[derive(Debug, Clone)]
pub enum CodecSource {
    /// A codec package directory (model.onnx or codec.json's decoder, an optional encoder).
    Package(PathBuf),
    /// Files `models pull` fetched from a codec repository.
    Pulled(pull::CodecFiles),
}

#[derive(Debug, Clone)]
pub struct BuildOptions {
    pub precision: Precision,
    pub target: Target,
    /// The NeuCodec decoder to put in `codec/`.
    pub codec: CodecSource,
    /// Run `models optimize` on an int4 export.
    pub optimize: bool,
    pub force: bool,
    /// Show the builder's own output (its progress) on stderr.
    pub show_builder: bool,
    /// Where the checkpoint came from, for build.json (a repository and commit).
    pub source: Option<String>,
    /// Weights per scale of the int4/int8 MatMulNBits weights (the builder's `block_size`;
    /// `None`: its default, 32).
    pub block_size: Option<BlockSize>,
}

/// A MatMulNBits block size the builder takes. Larger blocks mean fewer scales to read and a
/// coarser quantisation (measured: docs/performance.md, "The int4 block size").
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BlockSize {
    #[value(name = "16")]
    B16,
    #[value(name = "32")]
    B32,
    #[value(name = "64")]
    B64,
    #[value(name = "128")]
    B128,
    #[value(name = "256")]
    B256,
}

impl BlockSize {
    pub fn get(self) -> u32 {
        match self {
            BlockSize::B16 => 16,
            BlockSize::B32 => 32,
            BlockSize::B64 => 64,
            BlockSize::B128 => 128,
            BlockSize::B256 => 256,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BuildReport {
    pub dir: PathBuf,
    pub summary: String,
    pub placed: Placed,
    /// Why the package was not optimized, when it was not.
    pub not_optimized: Option<String>,
}

#[derive(Serialize)]
struct Manifest<'a> {
    checkpoint: String,
    source: Option<&'a str>,
    precision: Precision,
    target: Target,
    /// The MatMulNBits block size asked of the builder (absent: its default).
    #[serde(skip_serializing_if = "Option::is_none")]
    block_size: Option<u32>,
    builder: String,
    optimized: bool,
}

/// The venv python that has the builder, torch and transformers, and the builder's version.
fn builder_python() -> Result<(PathBuf, String), BuildError> {
    let Some(python) = crate::paths::in_homes("venv/bin/python")
        .into_iter()
        .find(|p| p.exists())
    else {
        return Err(BuildError::ToolsMissing {
            detail: "no .onebit/venv".into(),
        });
    };
    let probe = Command::new(&python)
        .args([
            "-c",
            "import torch, transformers, onnxruntime_genai.models.builder as b, \
             onnxruntime_genai as g; print(g.__version__)",
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(io(&python))?;
    if !probe.status.success() {
        let err = String::from_utf8_lossy(&probe.stderr);
        let last = err.lines().last().unwrap_or("").trim().to_owned();
        return Err(BuildError::ToolsMissing {
            detail: format!("{}: {last}", python.display()),
        });
    }
    let version = String::from_utf8_lossy(&probe.stdout).trim().to_owned();
    Ok((python, version))
}

fn check_checkpoint(dir: &Path) -> Result<(), BuildError> {
    let missing = |what: &str| BuildError::NotACheckpoint {
        dir: dir.to_path_buf(),
        missing: what.to_owned(),
    };
    for f in ["config.json", "tokenizer.json"] {
        if !dir.join(f).is_file() {
            return Err(missing(&format!("no {f}")));
        }
    }
    let has_weights = std::fs::read_dir(dir).map_err(io(dir))?.flatten().any(|e| {
        let n = e.file_name();
        let n = n.to_string_lossy();
        n.ends_with(".safetensors") || n.ends_with(".bin")
    });
    if !has_weights {
        return Err(missing("no weights (*.safetensors or *.bin)"));
    }
    Ok(())
}

/// What can be refused before anything is fetched or built: the precision for the target and
/// the package directory. fp16 for cpu: the builder (0.18) makes it with MultiHeadAttention
/// over a repeat_kv subgraph whose output it declares `sequence_length` long where the past is
/// included; ONNX Runtime 1.31's CPU provider then fails the first decode step ("Shape mismatch
/// attempting to re-use buffer"). Measured, not assumed: docs/models.md.
pub fn precheck(dir: &Path, opts: &BuildOptions) -> Result<(), BuildError> {
    if opts.precision == Precision::Fp16 && opts.target == Target::Cpu {
        return Err(BuildError::Fp16OnCpu);
    }
    if opts.block_size.is_some() && !matches!(opts.precision, Precision::Int4 | Precision::Int8) {
        return Err(BuildError::BlockSizeNeedsIntegers(opts.precision.as_str()));
    }
    install::check_replaceable(dir, opts.force)?;
    Ok(())
}

/// Builds `checkpoint` into a package at `dir`.
pub fn build(
    checkpoint: &Path,
    dir: &Path,
    opts: &BuildOptions,
) -> Result<BuildReport, BuildError> {
    check_checkpoint(checkpoint)?;
    precheck(dir, opts)?;
    let (python, version) = builder_python()?;
    let work = install::work_dir(dir, "build")?;
    let result = build_in(checkpoint, &work, &python, &version, opts);
    let outcome = result.and_then(|(ready, not_optimized, summary)| {
        let placed = install::install(&ready, dir)?;
        Ok(BuildReport {
            dir: dir.to_path_buf(),
            summary: summary.replace(&ready.display().to_string(), &dir.display().to_string()),
            placed,
            not_optimized,
        })
    });
    let _ = std::fs::remove_dir_all(&work);
    outcome
}

/// Runs the builder into `work/raw`, completes the package there and optimizes it into
/// `work/opt`; returns the directory that is the finished package, why it was not optimized
/// (if it was not) and its checked summary.
fn build_in(
    checkpoint: &Path,
    work: &Path,
    python: &Path,
    version: &str,
    opts: &BuildOptions,
) -> Result<(PathBuf, Option<String>, String), BuildError> {
    let raw = work.join("raw");
    let mut cmd = Command::new(python);
    cmd.args(["-m", "onnxruntime_genai.models.builder", "-i"])
        .arg(checkpoint)
        .arg("-o")
        .arg(&raw)
        .args(["-p", opts.precision.as_str(), "-e", opts.target.as_str()])
        .arg("-c")
        .arg(work.join("cache"))
        .stdin(Stdio::null());
    if let Some(b) = opts.block_size {
        cmd.arg("--extra_options")
            .arg(format!("block_size={}", b.get()));
    }
    tracing::info!("running {cmd:?}");
    let (status, tail) = if opts.show_builder {
        let status = cmd.status().map_err(io(python))?;
        (status, String::new())
    } else {
        let out = cmd.output().map_err(io(python))?;
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(15)..].join("\n");
        (out.status, tail)
    };
    if !status.success() {
        return Err(BuildError::Builder {
            status: status.to_string(),
            tail,
        });
    }
    // The checkpoint's own files over the builder's re-saved ones.
    for f in ["tokenizer.json", "config.json", "tokenizer_config.json"] {
        let from = checkpoint.join(f);
        if from.is_file() {
            let to = raw.join(f);
            let _ = std::fs::remove_file(&to);
            crate::paths::link_or_copy(&from, &to).map_err(io(&to))?;
        }
    }
    copy_codec(&opts.codec, &raw.join("codec"))?;
    let (ready, not_optimized) = match (opts.optimize, opts.precision) {
        (false, _) => (raw.clone(), Some("--no-optimize".to_owned())),
        (true, Precision::Int4) => {
            let opt = work.join("opt");
            // The optimizer loads and checks the export first, as `models check` does.
            optimize::optimize(&raw, &opt, Levers::default()).map_err(|e| match e {
                OptimizeError::Package(e) => BuildError::Check(e),
                e => BuildError::Optimize(e),
            })?;
            (opt, None)
        }
        // The optimizer cuts the int4 export's MatMulNBits head (docs/models.md).
        (true, p) => (
            raw.clone(),
            Some(format!(
                "models optimize takes int4 exports, not {}",
                p.as_str()
            )),
        ),
    };
    let manifest = Manifest {
        checkpoint: checkpoint.display().to_string(),
        source: opts.source.as_deref(),
        precision: opts.precision,
        target: opts.target,
        block_size: opts.block_size.map(BlockSize::get),
        builder: format!("onnxruntime-genai {version}"),
        optimized: not_optimized.is_none(),
    };
    // A checkpoint pulled by name has the language the vendor's map gives its repository.
    let repo = opts
        .source
        .as_deref()
        .map(|s| s.split('@').next().unwrap_or(s));
    if let Some(rec) = repo.and_then(LanguageRecord::of_repo) {
        rec.write(&ready).map_err(io(&ready.join(LANGUAGE_FILE)))?;
    }
    // The one check of the package as it will be installed.
    let summary = ModelPackage::load(&ready, None)?.summary();
    let path = ready.join(MANIFEST);
    install::write_json(&path, &manifest).map_err(io(&path))?;
    Ok((ready, not_optimized, summary))
}

/// The codec's files into `to`: a package's decoder (with its external data), encoder and
/// codec.json, or the pulled files with a codec.json naming a decoder not called model.onnx.
fn copy_codec(from: &CodecSource, to: &Path) -> Result<(), BuildError> {
    std::fs::create_dir_all(to).map_err(io(to))?;
    let link = |src: &Path, name: &str| {
        let dst = to.join(name);
        crate::paths::link_or_copy(src, &dst)
            .map(drop)
            .map_err(io(&dst))
    };
    match from {
        CodecSource::Pulled(c) => {
            for (src, name) in &c.files {
                link(src, name)?;
            }
            if c.decoder != "model.onnx" {
                let json = serde_json::json!({
                    "sample_rate": super::CODEC_SAMPLE_RATE,
                    "hop_length": super::CODEC_HOP,
                    "decoder": c.decoder,
                });
                let path = to.join("codec.json");
                install::write_json(&path, &json).map_err(io(&path))?;
            }
        }
        CodecSource::Package(dir) => {
            let codec = super::CodecPackage::load(dir)?;
            let named = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
            let mut keep: Vec<String> = [Some(&codec.decoder), codec.encoder.as_ref()]
                .into_iter()
                .flatten()
                .filter_map(|p| named(p))
                .collect();
            keep.push("codec.json".into());
            for e in std::fs::read_dir(&codec.dir)
                .map_err(io(&codec.dir))?
                .flatten()
            {
                let name = e.file_name().to_string_lossy().into_owned();
                let wanted = keep
                    .iter()
                    .any(|k| name == *k || super::is_external_data_of(k, &name));
                if wanted && e.path().is_file() {
                    link(&e.path(), &name)?;
                }
            }
        }
    }
    Ok(())
}
