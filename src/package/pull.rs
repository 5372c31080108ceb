//! `models pull NAME`: fetches the public repositories a model needs from the Hugging Face Hub
//! (through [`super::hub`], into the hub's cache) and, when they make a package, puts it
//! together in `models/NAME/`: a GGUF build (the GGUF, the checkpoint's tokenizer.json and
//! config.json, the NeuCodec decoder) or an ONNX package such as AMD's NPU package (its files and
//! the codec). A checkpoint (safetensors) is fetched for `models build`. The package directory
//! is assembled beside its final name, validated as `models check` does, and only then renamed
//! into place: a failed pull leaves no half package, and a package is never replaced by a
//! worse one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use super::CONVERTED_DIR;
use super::ModelPackage;
use super::hub::{FetchProgress, Fetched, Hub, HubError, RepoFile, Snapshot};
pub use super::install::Placed;
use super::install::{InstallError, check_replaceable, install, work_dir, write_json};
use super::neuphonic::{LANGUAGE_FILE, LanguageRecord};

/// The vendor's NeuCodec decoder in ONNX (`codes` int32 [B,1,F] -> float32 [B,1,F*480]).
pub const CODEC_REPO: &str = "neuphonic/neucodec-onnx-decoder";

/// Short names for the vendor's and AMD's repositories: (name, repository, what it is). The
/// vendor's ids are those its neutts 1.4.1 wheel (PyPI) lists: the README's model table
/// (`neuphonic/neutts-nano-{german,french,spanish}` with `-{q4,q8}-gguf`, `neuphonic/neutts-2e`
/// with `neuphonic/neutts-2e-{q4,q8}-gguf`) and neutts/neutts.py's `BACKBONE_LANGUAGE_MAP`.
pub const KNOWN: &[(&str, &str, &str)] = &[
    (
        "neutts-air-q4",
        "neuphonic/neutts-air-q4-gguf",
        "Q4 GGUF build, ready for --engine llama (CPU, Vulkan, ROCm, CUDA)",
    ),
    (
        "neutts-air-q8",
        "neuphonic/neutts-air-q8-gguf",
        "Q8 GGUF build, ready for --engine llama",
    ),
    (
        "neutts-air-npu",
        "amd/neutts-air_rai_1.8.0_npu_4K",
        "AMD's RyzenAI package, ready for --device npu",
    ),
    (
        "neutts-air",
        "neuphonic/neutts-air",
        "the checkpoint (safetensors) that `models build` turns into an ONNX package",
    ),
    (
        "neutts-nano-q4",
        "neuphonic/neutts-nano-q4-gguf",
        "NeuTTS-nano, Q4 GGUF build, ready for --engine llama",
    ),
    (
        "neutts-nano-q8",
        "neuphonic/neutts-nano-q8-gguf",
        "NeuTTS-nano, Q8 GGUF build, ready for --engine llama",
    ),
    (
        "neutts-nano",
        "neuphonic/neutts-nano",
        "NeuTTS-nano's checkpoint, for `models build`",
    ),
    (
        "neutts-nano-german-q4",
        "neuphonic/neutts-nano-german-q4-gguf",
        "NeuTTS-nano German, Q4 GGUF build, ready for --engine llama (speaks German)",
    ),
    (
        "neutts-nano-german-q8",
        "neuphonic/neutts-nano-german-q8-gguf",
        "NeuTTS-nano German, Q8 GGUF build, ready for --engine llama",
    ),
    (
        "neutts-nano-german",
        "neuphonic/neutts-nano-german",
        "NeuTTS-nano German's checkpoint, for `models build`",
    ),
    (
        "neutts-nano-french-q4",
        "neuphonic/neutts-nano-french-q4-gguf",
        "NeuTTS-nano French, Q4 GGUF build, ready for --engine llama (speaks French)",
    ),
    (
        "neutts-nano-french-q8",
        "neuphonic/neutts-nano-french-q8-gguf",
        "NeuTTS-nano French, Q8 GGUF build, ready for --engine llama",
    ),
    (
        "neutts-nano-french",
        "neuphonic/neutts-nano-french",
        "NeuTTS-nano French's checkpoint, for `models build`",
    ),
    (
        "neutts-nano-spanish-q4",
        "neuphonic/neutts-nano-spanish-q4-gguf",
        "NeuTTS-nano Spanish, Q4 GGUF build, ready for --engine llama (speaks Spanish)",
    ),
    (
        "neutts-nano-spanish-q8",
        "neuphonic/neutts-nano-spanish-q8-gguf",
        "NeuTTS-nano Spanish, Q8 GGUF build, ready for --engine llama",
    ),
    (
        "neutts-nano-spanish",
        "neuphonic/neutts-nano-spanish",
        "NeuTTS-nano Spanish's checkpoint, for `models build`",
    ),
    (
        "neutts-2e-q4",
        "neuphonic/neutts-2e-q4-gguf",
        "NeuTTS-2E (English, emotions; speakers emily, paul, sophie, steven), Q4 GGUF build, \
         ready for --engine llama",
    ),
    (
        "neutts-2e-q8",
        "neuphonic/neutts-2e-q8-gguf",
        "NeuTTS-2E, Q8 GGUF build, ready for --engine llama",
    ),
    (
        "neutts-2e",
        "neuphonic/neutts-2e",
        "NeuTTS-2E's checkpoint, for `models build`",
    ),
];

/// The file that records what a pulled package was made from.
pub const MANIFEST: &str = super::install::PULLED;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error(transparent)]
    Hub(#[from] HubError),
    #[error(
        "{name:?} is neither a known name ({}) nor a repository id (owner/name)",
        KNOWN.iter().map(|k| k.0).collect::<Vec<_>>().join(", ")
    )]
    UnknownName { name: String },
    #[error("{repo} has no {what}")]
    MissingFile { repo: String, what: String },
    #[error("{repo} holds several GGUF files ({}): choose one with --file", .files.join(", "))]
    SeveralGguf { repo: String, files: Vec<String> },
    #[error(transparent)]
    Install(#[from] InstallError),
    #[error("the pulled files do not make a working package (nothing was put in place): {0}")]
    Check(#[from] super::PackageError),
    #[error("{}: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PullError + '_ {
    move |err| PullError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// What the user asked for, resolved to repositories.
#[derive(Debug, Clone)]
pub struct Target {
    /// The package directory's default name (models/NAME).
    pub name: String,
    pub repo: String,
}

impl Target {
    pub fn parse(name: &str) -> Result<Self, PullError> {
        if let Some(k) = KNOWN.iter().find(|k| k.0 == name) {
            return Ok(Self {
                name: k.0.to_owned(),
                repo: k.1.to_owned(),
            });
        }
        let mut parts = name.split('/');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(owner), Some(repo), None)
                if !owner.is_empty() && !repo.is_empty() && valid_id(owner) && valid_id(repo) =>
            {
                Ok(Self {
                    name: repo.to_owned(),
                    repo: name.to_owned(),
                })
            }
            _ => Err(PullError::UnknownName {
                name: name.to_owned(),
            }),
        }
    }
}

fn valid_id(part: &str) -> bool {
    part.bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !part.starts_with('.')
}

#[derive(Debug, Clone)]
pub struct PullOptions {
    pub revision: String,
    /// The package directory (default models/NAME).
    pub dir: Option<PathBuf>,
    /// Replace a directory that `models pull` did not make.
    pub force: bool,
    /// The GGUF file to take from a repository that holds several.
    pub file: Option<String>,
    /// The codec repository (the vendor's int8 variant, say).
    pub codec_repo: String,
    /// Convert a GGUF package for our ONNX Runtime engine (`CONVERTED_DIR` inside it).
    pub convert: bool,
}

impl Default for PullOptions {
    fn default() -> Self {
        Self {
            revision: "main".into(),
            dir: None,
            force: false,
            file: None,
            codec_repo: CODEC_REPO.into(),
            convert: true,
        }
    }
}

/// What a repository's listing makes of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// genai_config.json: an ONNX package (AMD's NPU package, an onnxruntime-genai build).
    OnnxPackage,
    /// One `*.gguf` file: a GGUF build for --engine llama.
    GgufPackage,
    /// config.json and safetensors weights: a checkpoint for `models build`.
    Checkpoint,
    /// Anything else: fetched into the cache, nothing assembled.
    Files,
}

fn kind_of(snap: &Snapshot) -> Kind {
    let has = |p: &str| snap.file(p).is_some();
    if has("genai_config.json") {
        Kind::OnnxPackage
    } else if snap.files.iter().any(|f| f.path.ends_with(".gguf")) {
        Kind::GgufPackage
    } else if has("config.json") && snap.files.iter().any(|f| f.path.ends_with(".safetensors")) {
        Kind::Checkpoint
    } else {
        Kind::Files
    }
}

/// One file of the package and where it came from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ManifestFile {
    /// Its path in the package.
    pub to: String,
    pub repo: String,
    pub commit: String,
    pub path: String,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub name: String,
    pub files: Vec<ManifestFile>,
}

#[derive(Debug, Clone)]
pub struct SourceReport {
    pub repo: String,
    pub commit: String,
    /// Listed from the cache: the hub was not reachable.
    pub offline: bool,
    pub fetched: usize,
    pub downloaded: usize,
    pub bytes_downloaded: u64,
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Package {
        dir: PathBuf,
        summary: String,
        placed: Placed,
        conversion: Conversion,
    },
    /// A checkpoint in the cache and the codec's files: `models build` makes the package.
    Checkpoint {
        snapshot: PathBuf,
        codec: CodecFiles,
    },
    Files {
        snapshot: PathBuf,
    },
}

/// What became of a pulled GGUF's conversion for our ONNX Runtime engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conversion {
    /// Not a GGUF package, or `--no-convert`.
    None,
    /// Converted now (the report's summary), or already there.
    Converted(String),
    Kept,
    /// The GGUF could not be converted (it still runs with `--engine llama`): why.
    Failed(String),
}

/// The codec decoder's files in the cache and their names in a package's `codec/`.
#[derive(Debug, Clone)]
pub struct CodecFiles {
    /// The decoder's file name (codec.json names it when it is not `model.onnx`).
    pub decoder: String,
    pub files: Vec<(PathBuf, String)>,
}

impl CodecFiles {
    fn of(files: &[(Fetched, ManifestFile)], decoder: String) -> Self {
        Self {
            decoder,
            files: files
                .iter()
                .filter_map(|(f, m)| {
                    m.to.strip_prefix("codec/")
                        .map(|name| (f.path.clone(), name.to_owned()))
                })
                .collect(),
        }
    }
}

/// The codec decoder of `repo` fetched into the cache (for `models build` of a checkpoint
/// directory).
pub fn pull_codec(
    hub: &Hub,
    repo: &str,
    progress: &mut dyn FetchProgress,
) -> Result<CodecFiles, PullError> {
    let snap = hub.snapshot(repo, "main")?;
    let mut g = Gather {
        hub,
        progress,
        sources: Vec::new(),
        files: Vec::new(),
    };
    let decoder = g.take_codec(&snap)?;
    Ok(CodecFiles::of(&g.files, decoder))
}

#[derive(Debug, Clone)]
pub struct PullReport {
    pub target: Target,
    pub kind: Kind,
    pub sources: Vec<SourceReport>,
    pub outcome: Outcome,
}

struct Gather<'a> {
    hub: &'a Hub,
    progress: &'a mut dyn FetchProgress,
    sources: Vec<SourceReport>,
    files: Vec<(Fetched, ManifestFile)>,
}

impl Gather<'_> {
    fn source(&mut self, snap: &Snapshot) -> usize {
        if let Some(i) = self.sources.iter().position(|s| s.repo == snap.repo) {
            return i;
        }
        self.sources.push(SourceReport {
            repo: snap.repo.clone(),
            commit: snap.commit.clone(),
            offline: snap.offline,
            fetched: 0,
            downloaded: 0,
            bytes_downloaded: 0,
        });
        self.sources.len() - 1
    }

    fn take(&mut self, snap: &Snapshot, file: &RepoFile, to: String) -> Result<(), PullError> {
        let i = self.source(snap);
        let got = self.hub.fetch(snap, file, self.progress)?;
        let s = &mut self.sources[i];
        s.fetched += 1;
        if got.downloaded {
            s.downloaded += 1;
            s.bytes_downloaded += got.size;
        }
        let entry = ManifestFile {
            to,
            repo: snap.repo.clone(),
            commit: snap.commit.clone(),
            path: file.path.clone(),
            size: got.size,
            sha256: got.sha256.clone(),
        };
        self.files.push((got, entry));
        Ok(())
    }

    fn take_named(
        &mut self,
        snap: &Snapshot,
        path: &str,
        to: String,
        required: bool,
    ) -> Result<(), PullError> {
        match snap.file(path) {
            Some(f) => self.take(snap, &f.clone(), to),
            None if required => Err(PullError::MissingFile {
                repo: snap.repo.clone(),
                what: path.to_owned(),
            }),
            None => Ok(()),
        }
    }

    fn take_all(&mut self, snap: &Snapshot) -> Result<(), PullError> {
        for f in snap.files.clone() {
            // Git's own bookkeeping is not part of the model, and the package's records are
            // ours to write.
            if f.path == ".gitattributes" || f.path == MANIFEST || f.path == super::install::BUILT {
                continue;
            }
            let to = f.path.clone();
            self.take(snap, &f, to)?;
        }
        Ok(())
    }

    /// The codec decoder into `codec/`: `model.onnx` (or the repository's only `*.onnx`) and
    /// the external-data files beside it, under their own names (the graph refers to them so).
    fn take_codec(&mut self, snap: &Snapshot) -> Result<String, PullError> {
        let onnx: Vec<&RepoFile> = snap
            .files
            .iter()
            .filter(|f| f.path.ends_with(".onnx") && !f.path.contains('/'))
            .collect();
        let decoder = match onnx.iter().find(|f| f.path == "model.onnx") {
            Some(f) => (*f).clone(),
            None if onnx.len() == 1 => onnx[0].clone(),
            None => {
                return Err(PullError::MissingFile {
                    repo: snap.repo.clone(),
                    what: "decoder ONNX (model.onnx, or a single *.onnx)".into(),
                });
            }
        };
        let data: Vec<RepoFile> = snap
            .files
            .iter()
            .filter(|f| super::is_external_data_of(&decoder.path, &f.path))
            .cloned()
            .collect();
        self.take(snap, &decoder, format!("codec/{}", decoder.path))?;
        for f in data {
            let to = format!("codec/{}", f.path);
            self.take(snap, &f, to)?;
        }
        Ok(decoder.path)
    }
}

/// Pulls `target`: lists its repository, fetches what its kind needs and, for a package, puts
/// it in place.
pub fn pull(
    hub: &Hub,
    target: &Target,
    opts: &PullOptions,
    progress: &mut dyn FetchProgress,
) -> Result<PullReport, PullError> {
    let snap = hub.snapshot(&target.repo, &opts.revision)?;
    let kind = kind_of(&snap);
    let mut g = Gather {
        hub,
        progress,
        sources: Vec::new(),
        files: Vec::new(),
    };
    // The codec decoder's file name, when the package takes the codec repository's.
    let mut codec_json = None;
    match kind {
        Kind::OnnxPackage => {
            g.take_all(&snap)?;
            if snap.file("codec/model.onnx").is_none() {
                let codec = hub.snapshot(&opts.codec_repo, "main")?;
                codec_json = Some(g.take_codec(&codec)?);
            }
        }
        Kind::GgufPackage => {
            let ggufs: Vec<&RepoFile> = snap
                .files
                .iter()
                .filter(|f| f.path.ends_with(".gguf"))
                .collect();
            let gguf = match (&opts.file, ggufs.as_slice()) {
                (Some(want), _) => {
                    ggufs
                        .iter()
                        .find(|f| &f.path == want)
                        .copied()
                        .ok_or_else(|| PullError::MissingFile {
                            repo: snap.repo.clone(),
                            what: format!(
                                "{want} (its GGUF files: {})",
                                ggufs
                                    .iter()
                                    .map(|f| f.path.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            ),
                        })?
                }
                (None, [one]) => *one,
                (None, many) => {
                    return Err(PullError::SeveralGguf {
                        repo: snap.repo.clone(),
                        files: many.iter().map(|f| f.path.clone()).collect(),
                    });
                }
            }
            .clone();
            let name = gguf
                .path
                .rsplit('/')
                .next()
                .unwrap_or(&gguf.path)
                .to_owned();
            g.take(&snap, &gguf, name)?;
            // The vendor's GGUF repositories carry the weights only: the tokenizer (our front
            // end builds the prompt) and config come from the checkpoint they were made from.
            let tok_snap = match snap.file("tokenizer.json") {
                Some(_) => snap.clone(),
                None => {
                    let base = checkpoint_of(&snap.repo).ok_or_else(|| PullError::MissingFile {
                        repo: snap.repo.clone(),
                        what: "tokenizer.json (and its name does not say its checkpoint)".into(),
                    })?;
                    hub.snapshot(&base, "main")?
                }
            };
            g.take_named(&tok_snap, "tokenizer.json", "tokenizer.json".into(), true)?;
            g.take_named(&tok_snap, "config.json", "config.json".into(), false)?;
            g.take_named(
                &tok_snap,
                "tokenizer_config.json",
                "tokenizer_config.json".into(),
                false,
            )?;
            let codec = hub.snapshot(&opts.codec_repo, "main")?;
            codec_json = Some(g.take_codec(&codec)?);
        }
        Kind::Checkpoint => {
            g.take_all(&snap)?;
            let codec = hub.snapshot(&opts.codec_repo, "main")?;
            codec_json = Some(g.take_codec(&codec)?);
        }
        Kind::Files => g.take_all(&snap)?,
    }
    let Gather { sources, files, .. } = g;
    let snapshot = hub.snapshot_dir(&snap.repo, &snap.commit);
    let outcome = match kind {
        Kind::Checkpoint => Outcome::Checkpoint {
            snapshot,
            codec: CodecFiles::of(&files, codec_json.clone().unwrap_or_default()),
        },
        Kind::Files => Outcome::Files { snapshot },
        Kind::OnnxPackage | Kind::GgufPackage => {
            let dir = opts
                .dir
                .clone()
                .unwrap_or_else(|| Path::new("models").join(&target.name));
            let manifest = Manifest {
                name: target.name.clone(),
                files: files.iter().map(|(_, m)| m.clone()).collect(),
            };
            // The vendor phonemizes in the language its map gives the backbone's repository
            // (a repository's own record, if it ships one, is a file like the others).
            let language = LanguageRecord::of_repo(&snap.repo)
                .filter(|_| !files.iter().any(|(_, m)| m.to == LANGUAGE_FILE));
            let (summary, placed, conversion) = place(
                &dir,
                &Assembly {
                    files: &files,
                    manifest: &manifest,
                    codec_json: codec_json.as_deref(),
                    language: language.as_ref(),
                    convert: opts.convert && kind == Kind::GgufPackage,
                },
                opts.force,
                progress,
            )?;
            Outcome::Package {
                dir,
                summary,
                placed,
                conversion,
            }
        }
    };
    Ok(PullReport {
        target: target.clone(),
        kind,
        sources,
        outcome,
    })
}

/// The checkpoint a vendor GGUF repository was built from, by the vendor's naming
/// (`owner/NAME-q4-gguf` from `owner/NAME`).
fn checkpoint_of(repo: &str) -> Option<String> {
    let base = repo.strip_suffix("-gguf")?;
    let base = match base.rsplit_once('-') {
        Some((b, quant))
            if quant.len() >= 2
                && quant.as_bytes()[0].eq_ignore_ascii_case(&b'q')
                && quant[1..].bytes().all(|c| c.is_ascii_digit()) =>
        {
            b
        }
        _ => base,
    };
    Some(base.to_owned())
}

/// What a package is assembled from.
struct Assembly<'a> {
    files: &'a [(Fetched, ManifestFile)],
    manifest: &'a Manifest,
    /// The codec decoder's file name, when codec/codec.json must name it.
    codec_json: Option<&'a str>,
    language: Option<&'a LanguageRecord>,
    /// Convert the GGUF for our ONNX Runtime engine.
    convert: bool,
}

/// Assembles the package beside `dir`, checks it, converts a GGUF package for our ONNX Runtime
/// engine (into [`CONVERTED_DIR`]; a failure keeps the GGUF package and says why), and renames
/// it into place.
fn place(
    dir: &Path,
    a: &Assembly<'_>,
    force: bool,
    progress: &mut dyn FetchProgress,
) -> Result<(String, Placed, Conversion), PullError> {
    // A package pulled before the language was recorded is brought up to date (a repository's
    // own record is one of its files, which the manifest covers).
    let same_language = || {
        a.language.is_none_or(|want| {
            LanguageRecord::read(dir)
                .ok()
                .flatten()
                .is_some_and(|r| r.language == want.language)
        })
    };
    // A GGUF package pulled before pulls converted it is converted on the next pull.
    let converted = || !a.convert || dir.join(CONVERTED_DIR).join("genai_config.json").is_file();
    if read_manifest(dir).as_ref() == Some(a.manifest)
        && same_files(dir, a.manifest)
        && same_language()
        && converted()
    {
        let conversion = if a.convert {
            Conversion::Kept
        } else {
            Conversion::None
        };
        return Ok((
            ModelPackage::load(dir, None)?.summary(),
            Placed::UpToDate,
            conversion,
        ));
    }
    check_replaceable(dir, force)?;
    let work = work_dir(dir, "pull")?;
    let result = build_dir(&work, a).and_then(|()| {
        let summary = ModelPackage::load(&work, None)?
            .summary()
            .replace(&work.display().to_string(), &dir.display().to_string());
        let conversion = if a.convert {
            let report = super::convert::convert(
                &work,
                &work.join(CONVERTED_DIR),
                Default::default(),
                &mut |done, total| progress.step("converting for --engine ort", done, total),
            );
            progress.done();
            match report {
                Ok(r) => Conversion::Converted(
                    r.summary()
                        .replace(&work.display().to_string(), &dir.display().to_string()),
                ),
                Err(e) => {
                    let why = e
                        .to_string()
                        .replace(&work.display().to_string(), &dir.display().to_string());
                    tracing::warn!(
                        "the GGUF was not converted for --engine ort ({why}); it runs with --engine llama"
                    );
                    Conversion::Failed(why)
                }
            }
        } else {
            Conversion::None
        };
        let placed = install(&work, dir)?;
        Ok((summary, placed, conversion))
    });
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn build_dir(tmp: &Path, a: &Assembly<'_>) -> Result<(), PullError> {
    for (got, m) in a.files {
        let to = tmp.join(&m.to);
        if let Some(p) = to.parent() {
            std::fs::create_dir_all(p).map_err(io(p))?;
        }
        crate::paths::link_or_copy(&got.path, &to).map_err(io(&to))?;
    }
    if let Some(decoder) = a.codec_json.filter(|d| *d != "model.onnx") {
        let json = serde_json::json!({ "sample_rate": super::CODEC_SAMPLE_RATE, "hop_length": super::CODEC_HOP, "decoder": decoder });
        let path = tmp.join("codec/codec.json");
        let _ = std::fs::remove_file(&path);
        write_json(&path, &json).map_err(io(&path))?;
    }
    if let Some(rec) = a.language {
        let path = tmp.join(LANGUAGE_FILE);
        let _ = std::fs::remove_file(&path);
        rec.write(tmp).map_err(io(&path))?;
    }
    let path = tmp.join(MANIFEST);
    let _ = std::fs::remove_file(&path);
    write_json(&path, a.manifest).map_err(io(&path))
}

fn read_manifest(dir: &Path) -> Option<Manifest> {
    let text = std::fs::read_to_string(dir.join(MANIFEST)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Every file the manifest names is in `dir` with its size (a package edited since is not up
/// to date).
fn same_files(dir: &Path, manifest: &Manifest) -> bool {
    manifest
        .files
        .iter()
        .all(|f| std::fs::metadata(dir.join(&f.to)).is_ok_and(|m| m.len() == f.size))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_to_repositories() {
        let t = Target::parse("neutts-air-q4").unwrap();
        assert_eq!(
            (t.name.as_str(), t.repo.as_str()),
            ("neutts-air-q4", "neuphonic/neutts-air-q4-gguf")
        );
        let t = Target::parse("neutts-nano-q8").unwrap();
        assert_eq!(
            (t.name.as_str(), t.repo.as_str()),
            ("neutts-nano-q8", "neuphonic/neutts-nano-q8-gguf")
        );
        // The GGUF build's tokenizer comes from the checkpoint the short names also reach.
        assert_eq!(
            checkpoint_of(&t.repo),
            Some(Target::parse("neutts-nano").unwrap().repo)
        );
        // The vendor's other families: each GGUF build's tokenizer from its own checkpoint.
        for (name, repo, checkpoint) in [
            (
                "neutts-nano-german-q4",
                "neuphonic/neutts-nano-german-q4-gguf",
                "neutts-nano-german",
            ),
            (
                "neutts-nano-french-q8",
                "neuphonic/neutts-nano-french-q8-gguf",
                "neutts-nano-french",
            ),
            (
                "neutts-nano-spanish-q4",
                "neuphonic/neutts-nano-spanish-q4-gguf",
                "neutts-nano-spanish",
            ),
            ("neutts-2e-q4", "neuphonic/neutts-2e-q4-gguf", "neutts-2e"),
            ("neutts-2e-q8", "neuphonic/neutts-2e-q8-gguf", "neutts-2e"),
        ] {
            let t = Target::parse(name).unwrap();
            assert_eq!(t.repo, repo);
            assert_eq!(
                checkpoint_of(&t.repo),
                Some(Target::parse(checkpoint).unwrap().repo)
            );
        }
        // Every vendor phoneme model pulled by name has the language the vendor's map gives.
        for (name, repo, _) in KNOWN {
            if repo.starts_with("neuphonic/") && !name.contains("2e") {
                assert!(
                    super::super::neuphonic::language_of_repo(repo).is_some(),
                    "{name}"
                );
            }
        }
        let t = Target::parse("neuphonic/neutts-nano-q8-gguf").unwrap();
        assert_eq!(
            (t.name.as_str(), t.repo.as_str()),
            ("neutts-nano-q8-gguf", "neuphonic/neutts-nano-q8-gguf")
        );
        for bad in ["", "nope", "a/b/c", "/x", "x/", "../x", "a/..", "a b/c"] {
            let e = Target::parse(bad).unwrap_err().to_string();
            assert!(
                e.contains("neutts-air-q4") && e.contains("owner/name"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_gguf_repository_names_its_checkpoint() {
        assert_eq!(
            checkpoint_of("neuphonic/neutts-air-q4-gguf").as_deref(),
            Some("neuphonic/neutts-air")
        );
        assert_eq!(
            checkpoint_of("neuphonic/neutts-nano-Q8-gguf").as_deref(),
            Some("neuphonic/neutts-nano")
        );
        assert_eq!(
            checkpoint_of("someone/model-gguf").as_deref(),
            Some("someone/model")
        );
        assert_eq!(checkpoint_of("someone/model"), None);
    }
}
