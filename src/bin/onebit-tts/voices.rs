//! `voices`: list, show, import, clone (add) and remove reference voices.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use onebit_tts::package::ModelPackage;
use onebit_tts::synth::{FrontEnd, resolve_dir};

use crate::args::{default_model, parse_thread_policy, progress_bar, voice_dirs};
use onebit_tts::engine::ThreadPolicy;

#[derive(Subcommand)]
pub enum VoicesCmd {
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
        /// LANG for all, or NAME=LANG for one (repeatable). `--language` is accepted too.
        #[arg(long = "lang", visible_alias = "language")]
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
pub struct AddArgs {
    /// Voice name (letters, digits, '-', '_').
    pub name: String,
    /// Reference audio (wav, flac, mp3, ogg/vorbis; any rate, mono or stereo; 3-15 s is best).
    #[arg(long)]
    pub audio: PathBuf,
    /// Exact transcript of the reference audio.
    #[arg(long)]
    pub text: String,
    /// NeuCodec encoder ONNX: float32 [1,1,T] 16 kHz audio in, int codes [1,1,F] at 50/s out
    /// (default: the `encoder` of the model's codec/codec.json).
    #[arg(long, env = "ONEBIT_CODEC_ENCODER")]
    pub encoder: Option<PathBuf>,
    /// espeak language of the transcript: en-us, de, fr-fr, es. `--language` is accepted too.
    #[arg(
        long = "lang",
        visible_alias = "language",
        default_value = onebit_tts::voice::import::DEFAULT_LANGUAGE
    )]
    pub language: String,
    #[arg(long)]
    pub license: Option<String>,
    /// Replace a voice that already exists.
    #[arg(long)]
    pub force: bool,
    /// Where to store it (default: the repo's voices/).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Model package whose codec.json may name the encoder; given explicitly, the reference is
    /// also checked against its context budget.
    #[arg(long, env = "ONEBIT_MODEL")]
    pub model: Option<PathBuf>,
    /// NeuCodec package directory (default: MODEL/codec).
    #[arg(long, env = "ONEBIT_CODEC")]
    pub codec: Option<PathBuf>,
    /// Path of libonnxruntime.so (else ORT_DYLIB_PATH, the RyzenAI venv, .onebit/, python3's onnxruntime).
    #[arg(long, env = "ONEBIT_ORT_LIB")]
    pub ort_lib: Option<PathBuf>,
    /// Intra-op threads of the encoder session (default: one per usable physical core).
    #[arg(long, env = "ONEBIT_THREADS")]
    pub threads: Option<usize>,
    /// Thread defaults: tuned (one per usable core, pinned on SMT, no spinning) or ort.
    #[arg(long, env = "ONEBIT_THREAD_POLICY", default_value = "tuned", value_parser = parse_thread_policy)]
    pub thread_policy: ThreadPolicy,
}

/// `voices add`: decode and resample the reference, encode it, save the voice.
pub fn voices_add(a: AddArgs) -> Result<()> {
    use onebit_tts::codec::encoder::CodecEncoder;
    use onebit_tts::voice::clone::{CloneSpec, clone_voice, find_encoder};
    use onebit_tts::voice::{VoiceError, VoiceStore};

    let dir = a.dir.clone().unwrap_or_else(store_dir);
    let target = dir.join(format!("{}.json", a.name));
    let model_dir = a
        .model
        .as_deref()
        .map(resolve_dir)
        .unwrap_or_else(default_model);
    let codec_dir = onebit_tts::package::codec_dir_of(
        &model_dir,
        a.codec.as_deref().map(resolve_dir).as_deref(),
    );
    let mut spec = CloneSpec {
        name: a.name.clone(),
        transcript: a.text.clone(),
        language: a.language.clone(),
        license: a.license.clone().unwrap_or_default(),
        source: String::new(),
    };
    // Everything the user typed is checked before any audio is decoded or encoded.
    spec.check()?;
    if !a.force && target.exists() {
        return Err(VoiceError::Exists(target).into());
    }
    let encoder = find_encoder(a.encoder.as_deref(), &codec_dir)?;
    spec.source = format!(
        "encoded from {} with {}",
        file_name(&a.audio),
        file_name(&encoder)
    );

    let audio = onebit_tts::audio::decode::decode_path(&a.audio)
        .with_context(|| format!("{}", a.audio.display()))?;
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

    let env = onebit_tts::runtime::environment(a.ort_lib.as_deref())?;
    let threads = onebit_tts::runtime::ThreadPlan::for_process(a.thread_policy, a.threads, None);
    let mut enc = CodecEncoder::load(env, &encoder, &threads)?;
    let judge = reference_judge(a.model.as_deref(), a.codec.as_deref())?;
    let cloned =
        clone_voice(&spec, &audio, &mut enc).with_context(|| format!("{}", a.audio.display()))?;
    let voice = cloned.voice;
    println!(
        "encoder:  {} -> {} codes ({:.2} s at 50 codes/s)",
        encoder.display(),
        voice.codes.len(),
        voice.seconds()
    );
    for w in cloned.warnings.iter().chain(&judge.judge(&voice)?) {
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

/// How a new voice's reference is judged: against an explicitly named model's token budget
/// (its exact prompt), else by its length alone.
pub struct ReferenceJudge(Option<FrontEnd>);

pub fn reference_judge(model: Option<&Path>, codec: Option<&Path>) -> Result<ReferenceJudge> {
    let Some(dir) = model.map(resolve_dir) else {
        return Ok(ReferenceJudge(None));
    };
    let pkg = ModelPackage::load(&dir, codec)?;
    let voices = onebit_tts::voice::VoiceStore::open(&[])?;
    Ok(ReferenceJudge(Some(FrontEnd::new(pkg, voices))))
}

impl ReferenceJudge {
    /// Refuses a reference that leaves no room to speak; else its warning, if any.
    fn judge(&self, voice: &onebit_tts::voice::Voice) -> Result<Option<String>> {
        Ok(match &self.0 {
            Some(front) => front.check_reference(voice)?,
            None => onebit_tts::voice::length_warning(voice),
        })
    }
}

pub fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Where `voices import` writes by default: the checkout's voices/.
pub fn store_dir() -> PathBuf {
    resolve_dir(Path::new("voices"))
}

pub fn run(cmd: VoicesCmd, quiet: bool) -> Result<()> {
    match cmd {
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
                quiet,
                paths.len() as u64,
                "{spinner} importing {pos}/{len} {msg}",
            );
            let voices = onebit_tts::voice::import_paths(&paths, &opts)?;
            let judge = reference_judge(model.as_deref(), None)?;
            let dir = dir.unwrap_or_else(store_dir);
            bar.set_length(voices.len() as u64);
            for v in &voices {
                bar.set_message(v.name.clone());
                if let Some(w) = judge.judge(v)? {
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
        VoicesCmd::Add(args) => voices_add(args),
        VoicesCmd::Remove { name, dir } => {
            let path =
                onebit_tts::voice::VoiceStore::remove(&dir.unwrap_or_else(store_dir), &name)?;
            println!("removed {}", path.display());
            Ok(())
        }
        VoicesCmd::List { voices: extra } => list_or_show(&extra, None),
        VoicesCmd::Show {
            name,
            voices: extra,
        } => list_or_show(&extra, Some(name)),
    }
}

/// `voices list` (every voice) or `voices show NAME`.
fn list_or_show(extra: &[PathBuf], name: Option<String>) -> Result<()> {
    let store = onebit_tts::voice::VoiceStore::open(&voice_dirs(extra))?;
    let Some(name) = name else {
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
        return Ok(());
    };
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
    Ok(())
}
