//! A model package on disk: the backbone (genai_config.json + decoder ONNX + tokenizer.json) and
//! the NeuCodec decoder package beside it. Loading validates everything a request would otherwise
//! trip over later, and every error names the file and what was expected. The package owns the
//! facts of the model the other stages read: its input format, the speech vocabulary and the
//! codec's rates (and with them the real-time line).

pub mod build;
pub mod convert;
pub mod genai;
pub mod ggml;
pub mod gguf;
pub mod hub;
pub mod install;
pub mod logits;
pub mod neuphonic;
pub mod optimize;
pub mod pull;
pub mod vocab;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::Deserialize;
use tokenizers::Tokenizer;

pub use genai::GenaiConfig;
pub use logits::{LOGITS_MANIFEST, LogitsManifest, SpeechHead};
pub use vocab::{SPEECH_CODES, SpeechVocab, VocabError};

/// Whether `name` is external data of the ONNX graph file `graph`: the exporters name it after
/// the graph (`model.onnx.data`, `model.onnx_data`), and it must travel with it.
pub(crate) fn is_external_data_of(graph: &str, name: &str) -> bool {
    name.strip_prefix(graph)
        .is_some_and(|rest| rest.starts_with('.') || rest.starts_with("_data"))
}

/// Where `models pull` puts a GGUF package's conversion (`models convert`): inside it, so the
/// package holds both backbones (the GGUF for llama.cpp on a GPU, the conversion for our engine
/// on a CPU) under one name.
pub const CONVERTED_DIR: &str = "onnx";

/// Reads [`WEIGHTS_MANIFEST`] (absent: `None`).
fn random_weights(dir: &Path) -> Result<Option<String>, PackageError> {
    let path = dir.join(WEIGHTS_MANIFEST);
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(None);
    };
    let m: WeightsManifest = serde_json::from_str(&text).map_err(|e| PackageError::Invalid {
        path: path.clone(),
        msg: e.to_string(),
    })?;
    Ok(m.random.then(|| {
        if m.made_by.is_empty() {
            "made by an unnamed tool".to_owned()
        } else {
            format!("made by {}", m.made_by)
        }
    }))
}

/// A package's own word on its weights, written by whatever made it (tools/gen_models.py for the
/// generated test packages): `{"random": true, "made_by": "..."}`. Absent: nothing is claimed.
pub const WEIGHTS_MANIFEST: &str = "onebit_weights.json";

#[derive(Debug, Deserialize)]
struct WeightsManifest {
    random: bool,
    #[serde(default)]
    made_by: String,
}

/// NeuCodec's fixed rates: 24 kHz audio, 480 samples per code (50 codes per second).
pub const CODEC_SAMPLE_RATE: u32 = 24_000;
pub const CODEC_HOP: usize = 480;
/// Speech codes per second of audio (50): also the real-time line, the decode rate a synthesis
/// must reach to keep up with playback, which `say`, `bench` and the plots measure against.
pub const CODES_PER_SECOND: f64 = CODEC_SAMPLE_RATE as f64 / CODEC_HOP as f64;

/// How a model wants its text: NeuTTS-air reads phonemes, newer NeuTTS models read BPE text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum InputFormat {
    #[default]
    Phonemes,
    Bpe,
}

impl FromStr for InputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "phonemes" => Ok(Self::Phonemes),
            "bpe" => Ok(Self::Bpe),
            _ => Err(format!(
                "unknown input format {s:?} (supported: phonemes, bpe)"
            )),
        }
    }
}

impl fmt::Display for InputFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Phonemes => "phonemes",
            Self::Bpe => "bpe",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("{}: missing ({what})", .path.display())]
    Missing { path: PathBuf, what: &'static str },
    #[error("{}: not valid JSON for {what}: {err}", .path.display())]
    BadJson {
        path: PathBuf,
        what: &'static str,
        err: String,
    },
    #[error("{}: {msg}", .path.display())]
    Invalid { path: PathBuf, msg: String },
    #[error("{}: {err}", .path.display())]
    Vocab { path: PathBuf, err: VocabError },
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
}

/// What form the backbone takes: an ONNX graph with genai_config.json (the ort and oga engines),
/// or one GGUF file (the llama engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackboneFormat {
    Onnx,
    Gguf,
}

/// The codec package: NeuCodec decoder (and optional encoder) ONNX files.
#[derive(Debug, Clone)]
pub struct CodecPackage {
    pub dir: PathBuf,
    pub decoder: PathBuf,
    pub encoder: Option<PathBuf>,
    pub sample_rate: u32,
    pub hop_length: usize,
}

#[derive(Debug, Deserialize)]
struct CodecJson {
    #[serde(default = "default_rate")]
    sample_rate: u32,
    #[serde(default = "default_hop")]
    hop_length: usize,
    #[serde(default = "default_decoder")]
    decoder: String,
    #[serde(default)]
    encoder: Option<String>,
}

fn default_rate() -> u32 {
    CODEC_SAMPLE_RATE
}
fn default_hop() -> usize {
    CODEC_HOP
}
fn default_decoder() -> String {
    "model.onnx".into()
}

impl CodecPackage {
    /// Loads `dir/codec.json` (optional: defaults are NeuCodec's) and checks the files exist.
    pub fn load(dir: &Path) -> Result<Self, PackageError> {
        if !dir.is_dir() {
            return Err(PackageError::Missing {
                path: dir.to_path_buf(),
                what: "the NeuCodec decoder package directory",
            });
        }
        let json_path = dir.join("codec.json");
        let cfg: CodecJson = if json_path.exists() {
            read_json(&json_path, "codec.json")?
        } else {
            CodecJson {
                sample_rate: default_rate(),
                hop_length: default_hop(),
                decoder: default_decoder(),
                encoder: None,
            }
        };
        if cfg.sample_rate != CODEC_SAMPLE_RATE || cfg.hop_length != CODEC_HOP {
            return Err(PackageError::Invalid {
                path: json_path,
                msg: format!(
                    "NeuCodec runs at {CODEC_SAMPLE_RATE} Hz with hop {CODEC_HOP}; this says {} Hz, hop {}",
                    cfg.sample_rate, cfg.hop_length
                ),
            });
        }
        let decoder = dir.join(&cfg.decoder);
        if !decoder.is_file() {
            return Err(PackageError::Missing {
                path: decoder,
                what: "the NeuCodec decoder ONNX model",
            });
        }
        let encoder = cfg.encoder.map(|e| dir.join(e));
        Ok(Self {
            dir: dir.to_path_buf(),
            decoder,
            encoder,
            sample_rate: cfg.sample_rate,
            hop_length: cfg.hop_length,
        })
    }
}

/// A loaded, validated backbone package.
#[derive(Debug, Clone)]
pub struct ModelPackage {
    pub dir: PathBuf,
    /// The model's facts: genai_config.json, or for a GGUF backbone what the GGUF states.
    pub genai: GenaiConfig,
    /// The backbone file: the decoder ONNX graph, or the GGUF.
    pub decoder_path: PathBuf,
    pub format: BackboneFormat,
    pub tokenizer: Tokenizer,
    pub vocab: SpeechVocab,
    /// Stop ids: `<|SPEECH_GENERATION_END|>` first, then the config's eos ids.
    pub stop_ids: Vec<u32>,
    pub input_format: InputFormat,
    /// The emotions the model declares (config.json's or the GGUF's
    /// `neuphonic.supported_emotions`); `None`: it declares none.
    pub emotions: Option<Vec<String>>,
    /// The language the model was trained to read, as an espeak-ng code
    /// ([`neuphonic::LANGUAGE_FILE`]); `None`: the package does not say.
    pub language: Option<String>,
    pub codec: CodecPackage,
    /// What `models optimize` changed about the logits (the default when the package has no
    /// onebit_logits.json).
    pub logits: LogitsManifest,
    /// Who made the package's weights when its [`WEIGHTS_MANIFEST`] says they are random (a
    /// test package: sound-like audio, no words).
    pub random_weights: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct HfConfig {
    #[serde(default)]
    neuphonic: Option<neuphonic::NeuphonicSection>,
    /// Read leniently: only a GGUF package uses it, and an ONNX package's config.json must load
    /// as it always did whatever this holds.
    #[serde(default)]
    eos_token_id: serde_json::Value,
}

fn read_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    what: &'static str,
) -> Result<T, PackageError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            PackageError::Missing {
                path: path.to_path_buf(),
                what,
            }
        } else {
            PackageError::Invalid {
                path: path.to_path_buf(),
                msg: format!("cannot read: {e}"),
            }
        }
    })?;
    serde_json::from_str(&text).map_err(|e| PackageError::BadJson {
        path: path.to_path_buf(),
        what,
        err: e.to_string(),
    })
}

/// The part of a package the backbone needs: genai_config.json and the decoder graph. The engine
/// worker loads only this (no tokenizer, no codec).
#[derive(Debug, Clone)]
pub struct BackbonePackage {
    pub dir: PathBuf,
    pub genai: GenaiConfig,
    pub decoder_path: PathBuf,
    /// What `models optimize` changed about the logits (the default without onebit_logits.json).
    pub logits: LogitsManifest,
}

impl BackbonePackage {
    /// Loads and validates `dir/genai_config.json` and checks the decoder graph exists.
    pub fn load(dir: &Path) -> Result<Self, PackageError> {
        if !dir.is_dir() {
            return Err(PackageError::Missing {
                path: dir.to_path_buf(),
                what: "the model package directory",
            });
        }
        let config_path = dir.join("genai_config.json");
        let genai: GenaiConfig =
            read_json(&config_path, "genai_config.json (onnxruntime-genai schema)")?;
        genai.validate().map_err(|msg| PackageError::Invalid {
            path: config_path.clone(),
            msg,
        })?;
        let decoder_path = dir.join(&genai.model.decoder.filename);
        if !decoder_path.is_file() {
            return Err(PackageError::Missing {
                path: decoder_path,
                what: "the decoder ONNX model named by genai_config.json model.decoder.filename",
            });
        }
        let logits = LogitsManifest::load(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            genai,
            decoder_path,
            logits,
        })
    }
}

/// Where a package's codec is: `given` (`--codec`), else the package's own `codec/`.
pub fn codec_dir_of(package_dir: &Path, given: Option<&Path>) -> PathBuf {
    given.map_or_else(|| package_dir.join("codec"), Path::to_path_buf)
}

impl ModelPackage {
    /// Loads the package in `dir`; the codec package is `codec_dir` or `dir/codec`.
    /// A directory without genai_config.json whose backbone is a `*.gguf` file is a GGUF package.
    pub fn load(dir: &Path, codec_dir: Option<&Path>) -> Result<Self, PackageError> {
        let gguf = if dir.is_dir() && !dir.join("genai_config.json").exists() {
            gguf::find_in(dir).map_err(|msg| PackageError::Invalid {
                path: dir.to_path_buf(),
                msg,
            })?
        } else {
            None
        };
        let (format, genai, decoder_path, logits, gguf_model) = match gguf {
            Some(path) => {
                let model = gguf::GgufModel::read(&path)?;
                let genai = model.model_facts()?;
                (
                    BackboneFormat::Gguf,
                    genai,
                    path,
                    LogitsManifest::default(),
                    Some(model),
                )
            }
            None => {
                let b = BackbonePackage::load(dir)?;
                (
                    BackboneFormat::Onnx,
                    b.genai,
                    b.decoder_path,
                    b.logits,
                    None,
                )
            }
        };
        let config_path = if format == BackboneFormat::Gguf {
            decoder_path.clone()
        } else {
            dir.join("genai_config.json")
        };

        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(PackageError::Missing {
                path: tok_path,
                what: "tokenizer.json (Hugging Face tokenizers format)",
            });
        }
        let tokenizer = Tokenizer::from_file(&tok_path).map_err(|e| PackageError::Invalid {
            path: tok_path.clone(),
            msg: format!("not a loadable tokenizer: {e}"),
        })?;
        let vocab = SpeechVocab::from_tokenizer(&tokenizer).map_err(|err| PackageError::Vocab {
            path: tok_path.clone(),
            err,
        })?;
        if let Some(model) = &gguf_model {
            model.check_speech_vocab(&vocab)?;
        }
        let tok_size = tokenizer.get_vocab_size(true);
        if genai.model.vocab_size < tok_size
            || (vocab.speech_end_exclusive() as usize) > genai.model.vocab_size
        {
            return Err(PackageError::Invalid {
                path: config_path,
                msg: format!(
                    "model.vocab_size is {} but the tokenizer has {tok_size} tokens (speech ids up to {}): the logits would not cover them",
                    genai.model.vocab_size,
                    vocab.speech_end_exclusive() - 1
                ),
            });
        }

        let hf_path = dir.join("config.json");
        let hf: HfConfig = if hf_path.exists() {
            read_json(&hf_path, "config.json")?
        } else {
            HfConfig::default()
        };
        let neuphonic::Facts {
            input_format,
            emotions,
        } = neuphonic::facts(
            hf.neuphonic.as_ref(),
            &hf_path,
            gguf_model.as_ref().map(|m| (&m.metadata, m.path.as_path())),
        )?;
        let language = neuphonic::LanguageRecord::read(dir)?.map(|r| r.language);

        let mut stop_ids = vec![vocab.end];
        // A GGUF names one eos id; the checkpoint's config.json may name more (onnxruntime-genai's
        // builder puts both in genai_config.json, so an ONNX package stops at the same ids).
        let hf_eos: Vec<u32> = match (format, &hf.eos_token_id) {
            (BackboneFormat::Gguf, serde_json::Value::Number(n)) => {
                n.as_u64().into_iter().collect()
            }
            (BackboneFormat::Gguf, serde_json::Value::Array(a)) => {
                a.iter().filter_map(serde_json::Value::as_u64).collect()
            }
            _ => Vec::new(),
        }
        .into_iter()
        .filter_map(|id| u32::try_from(id).ok())
        .collect();
        if let Some(&id) = hf_eos
            .iter()
            .find(|&&id| id as usize >= genai.model.vocab_size)
        {
            return Err(PackageError::Invalid {
                path: hf_path.clone(),
                msg: format!(
                    "eos_token_id {id} is outside the model's {} logits",
                    genai.model.vocab_size
                ),
            });
        }
        for id in genai.model.eos_token_id.to_vec().into_iter().chain(hf_eos) {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        }

        if let Some(head) = &logits.speech_head {
            let path = dir.join(LOGITS_MANIFEST);
            let bad = |msg: String| PackageError::Invalid {
                path: path.clone(),
                msg,
            };
            head.validate(genai.model.vocab_size).map_err(bad)?;
            if head.speech_first_id != vocab.first || head.speech_count != SPEECH_CODES {
                return Err(bad(format!(
                    "the speech head covers ids {}..+{} but the tokenizer's speech block is {}..+{SPEECH_CODES}",
                    head.speech_first_id, head.speech_count, vocab.first
                )));
            }
            if let Some(id) = stop_ids.iter().find(|&&id| head.position(id).is_none()) {
                return Err(bad(format!(
                    "stop id {id} has no row in the speech head (extra ids {:?}); the end of speech could never be sampled",
                    head.extra_ids
                )));
            }
        }

        let codec = CodecPackage::load(&codec_dir_of(dir, codec_dir))?;
        let random_weights = random_weights(dir)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            genai,
            decoder_path,
            format,
            tokenizer,
            vocab,
            stop_ids,
            input_format,
            emotions,
            language,
            codec,
            logits,
            random_weights,
        })
    }

    /// What to tell a user of a package with random weights, once (`None`: real weights, as far
    /// as the package says).
    pub fn random_weights_notice(&self) -> Option<String> {
        self.random_weights.as_ref().map(|by| {
            format!(
                "{} holds random weights ({by}): it makes sound-like audio at the real rates but \
                 speaks no words. For the real model run `onebit-tts models setup` (it keeps a \
                 real package in models/, else pulls neutts-air-q4 where the Hugging Face Hub is \
                 reachable) and leave out --model: the default takes the real package",
                self.dir.display()
            )
        })
    }

    /// The backbone's part of the package.
    pub fn backbone(&self) -> BackbonePackage {
        BackbonePackage {
            dir: self.dir.clone(),
            genai: self.genai.clone(),
            decoder_path: self.decoder_path.clone(),
            logits: self.logits.clone(),
        }
    }

    /// A human summary for `models check`.
    pub fn summary(&self) -> String {
        let m = &self.genai.model;
        let d = &m.decoder;
        let providers = d.session_options.providers();
        format!(
            "package      {}\n\
             model        {} ({} layers, hidden {}, {} heads / {} KV heads, head size {})\n\
             decoder      {}\n\
             context      {} tokens (budget {} per sequence{})\n\
             vocab        {} logits; tokenizer {} tokens\n\
             logits       {}\n\
             speech ids   {}..{} ({} codes), end {}\n\
             stop ids     {:?}\n\
             input format {}\n\
             emotions     {}\n\
             language     {}\n\
             providers    {}\n\
             codec        {} ({} Hz, hop {})",
            self.dir.display(),
            m.model_type,
            d.num_hidden_layers,
            d.hidden_size,
            d.num_attention_heads,
            d.num_key_value_heads,
            d.head_size,
            self.decoder_path.display(),
            m.context_length,
            self.genai.token_budget(),
            if self.genai.search.past_present_share_buffer {
                ", shared KV buffer"
            } else {
                ""
            },
            m.vocab_size,
            self.tokenizer.get_vocab_size(true),
            self.logits.describe(m.vocab_size),
            self.vocab.first,
            self.vocab.speech_end_exclusive() - 1,
            SPEECH_CODES,
            self.vocab.end,
            self.stop_ids,
            self.input_format,
            match self.listed_emotions() {
                Some(e) if e.is_empty() => "none".to_owned(),
                Some(e) => e.join(", "),
                None => "any its tokenizer has a token for (none declared)".to_owned(),
            },
            self.language
                .as_deref()
                .unwrap_or("not recorded (the voice's)"),
            if self.format == BackboneFormat::Gguf {
                "llama.cpp (a GGUF backbone: --engine llama)".to_owned()
            } else if providers.is_empty() {
                "cpu (none declared)".to_owned()
            } else {
                providers.join(", ")
            },
            self.codec.decoder.display(),
            self.codec.sample_rate,
            self.codec.hop_length,
        )
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn external_data_is_named_after_its_graph() {
        for data in [
            "model.onnx.data",
            "model.onnx_data",
            "model.onnx.onebit.data",
        ] {
            assert!(super::is_external_data_of("model.onnx", data), "{data}");
        }
        for other in [
            "model.onnx",
            "encoder.onnx",
            "model.onnxdata",
            "a/model.onnx.data",
        ] {
            assert!(!super::is_external_data_of("model.onnx", other), "{other}");
        }
    }
}
