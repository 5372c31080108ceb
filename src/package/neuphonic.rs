//! What the vendor's `neutts` reads about a model besides its weights, read the same way: its
//! input format and emotions (config.json's `neuphonic` section, or a GGUF's `neuphonic.*`
//! metadata and chat template), and its language, which the vendor takes from the backbone's
//! repository id (`BACKBONE_LANGUAGE_MAP`). The source of every rule here is neutts 1.4.1, the
//! PyPI wheel's `neutts/neutts.py` (`_load_backbone`, `_load_phonemizer`, `_check_emotion`,
//! `_apply_chat_template`); docs/models.md says which model has what.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::gguf::Value;
use super::{InputFormat, ModelPackage, PackageError};

/// The vendor's `BACKBONE_LANGUAGE_MAP` (neutts 1.4.1, neutts/neutts.py), entry for entry: the
/// espeak-ng language each of its phoneme models was trained on, by repository id. NeuTTS-2E
/// is not in it: it reads BPE text, and the vendor loads no phonemizer for it.
pub const BACKBONE_LANGUAGE_MAP: &[(&str, &str)] = &[
    ("neuphonic/neutts-air", "en-us"),
    ("neuphonic/neutts-air-q4-gguf", "en-us"),
    ("neuphonic/neutts-air-q8-gguf", "en-us"),
    ("neuphonic/neutts-nano", "en-us"),
    ("neuphonic/neutts-nano-q4-gguf", "en-us"),
    ("neuphonic/neutts-nano-q8-gguf", "en-us"),
    ("neuphonic/neutts-nano-german", "de"),
    ("neuphonic/neutts-nano-german-q4-gguf", "de"),
    ("neuphonic/neutts-nano-german-q8-gguf", "de"),
    ("neuphonic/neutts-nano-french", "fr-fr"),
    ("neuphonic/neutts-nano-french-q4-gguf", "fr-fr"),
    ("neuphonic/neutts-nano-french-q8-gguf", "fr-fr"),
    ("neuphonic/neutts-nano-spanish", "es"),
    ("neuphonic/neutts-nano-spanish-q4-gguf", "es"),
    ("neuphonic/neutts-nano-spanish-q8-gguf", "es"),
];

/// The language the vendor phonemizes a backbone repository's model in (`None`: not one of its
/// phoneme models; the vendor then asks for a language).
pub fn language_of_repo(repo: &str) -> Option<&'static str> {
    BACKBONE_LANGUAGE_MAP
        .iter()
        .find(|(r, _)| *r == repo)
        .map(|(_, l)| *l)
}

/// The file that records a package's language, beside its config: written by `models pull`
/// and `models build` from [`BACKBONE_LANGUAGE_MAP`] (the repository id is known only then),
/// copied with the rest by whatever derives a package from it; any package may carry one.
pub const LANGUAGE_FILE: &str = "onebit_language.json";

/// [`LANGUAGE_FILE`]'s content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LanguageRecord {
    /// An espeak-ng language code, as the vendor passes it (en-us, de, fr-fr, es).
    pub language: String,
    /// Where the language was read (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
}

impl LanguageRecord {
    /// The record for a package made from `repo`, when the vendor's map names its language.
    pub fn of_repo(repo: &str) -> Option<Self> {
        language_of_repo(repo).map(|l| Self {
            language: l.to_owned(),
            from: Some(format!(
                "{repo} in the vendor's BACKBONE_LANGUAGE_MAP (neutts 1.4.1)"
            )),
        })
    }

    /// The record in `dir` (absent: `None`).
    pub fn read(dir: &Path) -> Result<Option<Self>, PackageError> {
        let path = dir.join(LANGUAGE_FILE);
        if !path.exists() {
            return Ok(None);
        }
        let rec: Self = super::read_json(&path, "onebit_language.json")?;
        if rec.language.trim().is_empty() {
            return Err(PackageError::Invalid {
                path,
                msg: "language is empty".into(),
            });
        }
        Ok(Some(rec))
    }

    pub fn write(&self, dir: &Path) -> std::io::Result<()> {
        super::install::write_json(&dir.join(LANGUAGE_FILE), self)
    }
}

/// config.json's `neuphonic` section, as the vendor's torch route reads it.
#[derive(Debug, Default, Deserialize)]
pub(super) struct NeuphonicSection {
    #[serde(default)]
    pub input_format: Option<String>,
    #[serde(default)]
    pub supported_emotions: Option<Vec<String>>,
}

/// The GGUF metadata keys the vendor's llama.cpp route reads.
const GGUF_INPUT_FORMAT: &str = "neuphonic.input_format";
const GGUF_EMOTIONS: &str = "neuphonic.supported_emotions";
const GGUF_CHAT_TEMPLATE: &str = "tokenizer.chat_template";

/// A model's input format and emotions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Facts {
    pub input_format: InputFormat,
    /// The emotions the model declares (`None`: it declares none).
    pub emotions: Option<Vec<String>>,
}

/// Reads the facts as the vendor does: for a GGUF backbone its metadata (`gguf`), where the
/// input format without `neuphonic.input_format` follows the chat template (BPE when it holds
/// `<|TEXT_PROMPT_START|>` and not the phoneme models' "Convert the text to speech"); else
/// config.json's section. A GGUF that says neither (no key, no template: a GGUF made from an
/// ONNX package) leaves it to config.json, which the package holds beside it. `path` names the
/// file a bad value came from.
pub(super) fn facts(
    config: Option<&NeuphonicSection>,
    config_path: &Path,
    gguf: Option<(&BTreeMap<String, Value>, &Path)>,
) -> Result<Facts, PackageError> {
    let bad = |path: &Path, msg: String| PackageError::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    let parse = |path: &Path, key: &str, s: &str| {
        s.parse::<InputFormat>()
            .map_err(|e| bad(path, format!("{key}: {e}")))
    };
    let mut input_format = None;
    let mut emotions = None;
    if let Some((meta, path)) = gguf {
        input_format = match meta.get(GGUF_INPUT_FORMAT) {
            Some(Value::Str(s)) => Some(parse(path, GGUF_INPUT_FORMAT, s)?),
            Some(other) => {
                return Err(bad(
                    path,
                    format!("{GGUF_INPUT_FORMAT} is {other:?}, not a string"),
                ));
            }
            None => match meta.get(GGUF_CHAT_TEMPLATE) {
                Some(Value::Str(t)) => Some(
                    if t.contains("<|TEXT_PROMPT_START|>")
                        && !t.contains("Convert the text to speech")
                    {
                        InputFormat::Bpe
                    } else {
                        InputFormat::Phonemes
                    },
                ),
                _ => None,
            },
        };
        emotions = match meta.get(GGUF_EMOTIONS) {
            None => None,
            Some(Value::Array(items)) => Some(
                items
                    .iter()
                    .map(|v| match v {
                        Value::Str(s) => Ok(s.clone()),
                        other => Err(bad(
                            path,
                            format!("{GGUF_EMOTIONS} holds {other:?}, not a string"),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(other) => {
                return Err(bad(
                    path,
                    format!("{GGUF_EMOTIONS} is {other:?}, not an array of strings"),
                ));
            }
        };
    }
    let input_format = match (input_format, config.and_then(|c| c.input_format.as_deref())) {
        (Some(f), _) => f,
        (None, Some(s)) => parse(config_path, "neuphonic.input_format", s)?,
        (None, None) => InputFormat::Phonemes,
    };
    let emotions = emotions.or_else(|| config.and_then(|c| c.supported_emotions.clone()));
    Ok(Facts {
        input_format,
        emotions,
    })
}

/// The emotion that means none: the vendor drops it before any check, whatever the model.
pub const NEUTRAL: &str = "neutral";

/// Why a request's emotion cannot be spoken by the model.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EmotionError {
    #[error(
        "the model {model} has no emotions (it reads phonemes; emotions are a BPE model's, such \
         as NeuTTS-2E); leave emotion out, or use {NEUTRAL:?}"
    )]
    NoEmotions { model: String },
    #[error(
        "the model {model} has no emotion {emotion:?}; its emotions: {} ({NEUTRAL:?} means none)",
        .supported.join(", ")
    )]
    Unknown {
        model: String,
        emotion: String,
        supported: Vec<String>,
    },
    /// A BPE model that declares no emotions takes any whose token its tokenizer has.
    #[error(
        "the model {model} has no emotion {emotion:?}: its tokenizer has no {token} token, and \
         it declares no emotions (config.json or GGUF neuphonic.supported_emotions)"
    )]
    NoToken {
        model: String,
        emotion: String,
        token: String,
    },
}

/// An emotion's token in the prompt (`happy` -> `<|HAPPY|>`), as the vendor writes it.
pub fn emotion_token(emotion: &str) -> String {
    format!("<|{}|>", emotion.to_uppercase())
}

impl ModelPackage {
    /// The emotion a request asks for, as the model can speak it: `None` for none (absent, or
    /// [`NEUTRAL`]); otherwise the model must read BPE text, the emotion must be one it declares
    /// (when it declares any) and its tokenizer must have the emotion's token. The vendor's
    /// `_check_emotion`, rule for rule; every way a request enters (HTTP, WebSocket, the CLI)
    /// asks this once.
    pub fn emotion(&self, requested: Option<&str>) -> Result<Option<String>, EmotionError> {
        let Some(emotion) = requested.filter(|e| *e != NEUTRAL) else {
            return Ok(None);
        };
        let model = self.name();
        if self.input_format != InputFormat::Bpe {
            return Err(EmotionError::NoEmotions { model });
        }
        if let Some(supported) = &self.emotions
            && !supported.iter().any(|s| s == emotion)
        {
            return Err(EmotionError::Unknown {
                model,
                emotion: emotion.to_owned(),
                supported: supported.clone(),
            });
        }
        let token = emotion_token(emotion);
        if self.tokenizer.token_to_id(&token).is_none() {
            return Err(EmotionError::NoToken {
                model,
                emotion: emotion.to_owned(),
                token,
            });
        }
        Ok(Some(emotion.to_owned()))
    }

    /// The package's name: its directory's; a GGUF package's conversion (`NAME/onnx`, which
    /// `models pull` makes and a CPU runs) is the same model, so it takes `NAME`.
    pub fn name(&self) -> String {
        let dir = match self.dir.parent() {
            Some(p)
                if self.dir.file_name() == Some(super::CONVERTED_DIR.as_ref())
                    && super::gguf::find_in(p).is_ok_and(|g| g.is_some()) =>
            {
                p
            }
            _ => &self.dir,
        };
        dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }

    /// The emotions a client may ask for, as `GET /v1/models` lists them: the declared ones;
    /// none for a model that reads phonemes; `None` for a BPE model that declares none (it takes
    /// any emotion its tokenizer has a token for).
    pub fn listed_emotions(&self) -> Option<Vec<String>> {
        match (self.input_format, &self.emotions) {
            (InputFormat::Phonemes, _) => Some(Vec::new()),
            (InputFormat::Bpe, declared) => declared.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    fn strs(items: &[&str]) -> Value {
        Value::Array(items.iter().map(|s| Value::Str((*s).to_owned())).collect())
    }

    fn gguf_facts(m: &BTreeMap<String, Value>, config: Option<&NeuphonicSection>) -> Facts {
        facts(
            config,
            Path::new("config.json"),
            Some((m, Path::new("m.gguf"))),
        )
        .unwrap()
    }

    #[test]
    fn the_vendor_map_gives_each_nano_its_language() {
        assert_eq!(
            language_of_repo("neuphonic/neutts-nano-german-q4-gguf"),
            Some("de")
        );
        assert_eq!(
            language_of_repo("neuphonic/neutts-nano-french"),
            Some("fr-fr")
        );
        assert_eq!(
            language_of_repo("neuphonic/neutts-nano-spanish-q8-gguf"),
            Some("es")
        );
        assert_eq!(
            language_of_repo("neuphonic/neutts-air-q4-gguf"),
            Some("en-us")
        );
        // 2E reads BPE: the vendor gives it no phonemizer, so no language.
        assert_eq!(language_of_repo("neuphonic/neutts-2e-q4-gguf"), None);
        assert_eq!(language_of_repo("someone/neutts-nano-german"), None);
        let rec = LanguageRecord::of_repo("neuphonic/neutts-nano-german").unwrap();
        assert_eq!(rec.language, "de");
    }

    #[test]
    fn gguf_metadata_is_read_as_the_vendor_reads_it() {
        // The key wins over the template and config.json.
        let m = meta(&[
            (GGUF_INPUT_FORMAT, Value::Str("BPE".into())),
            (
                GGUF_CHAT_TEMPLATE,
                Value::Str("user: Convert the text to speech:".into()),
            ),
            (GGUF_EMOTIONS, strs(&["happy", "sad"])),
        ]);
        let phonemes = NeuphonicSection {
            input_format: Some("phonemes".into()),
            supported_emotions: Some(vec!["angry".into()]),
        };
        let f = gguf_facts(&m, Some(&phonemes));
        assert_eq!(f.input_format, InputFormat::Bpe);
        assert_eq!(f.emotions, Some(vec!["happy".into(), "sad".into()]));

        // Without the key, the chat template decides.
        let bpe_template = "{{ '<|TEXT_PROMPT_START|>' + text + '<|TEXT_PROMPT_END|>' }}";
        let m = meta(&[(GGUF_CHAT_TEMPLATE, Value::Str(bpe_template.into()))]);
        assert_eq!(gguf_facts(&m, None).input_format, InputFormat::Bpe);
        let air = "user: Convert the text to speech:<|TEXT_PROMPT_START|>{{ text }}";
        let m = meta(&[(GGUF_CHAT_TEMPLATE, Value::Str(air.into()))]);
        assert_eq!(
            gguf_facts(&m, Some(&phonemes)).input_format,
            InputFormat::Phonemes
        );
        let m = meta(&[(GGUF_CHAT_TEMPLATE, Value::Str("{{ messages }}".into()))]);
        assert_eq!(gguf_facts(&m, None).input_format, InputFormat::Phonemes);

        // Neither: config.json's section, else phonemes.
        let bpe = NeuphonicSection {
            input_format: Some("BPE".into()),
            supported_emotions: Some(vec!["angry".into()]),
        };
        let f = gguf_facts(&meta(&[]), Some(&bpe));
        assert_eq!(f.input_format, InputFormat::Bpe);
        assert_eq!(f.emotions, Some(vec!["angry".into()]));
        let f = gguf_facts(&meta(&[]), None);
        assert_eq!(
            f,
            Facts {
                input_format: InputFormat::Phonemes,
                emotions: None
            }
        );
    }

    #[test]
    fn bad_metadata_names_the_file_and_key() {
        let check = |m: BTreeMap<String, Value>, want: &str| {
            let e = facts(
                None,
                Path::new("config.json"),
                Some((&m, Path::new("m.gguf"))),
            )
            .unwrap_err()
            .to_string();
            assert!(e.contains("m.gguf") && e.contains(want), "{e}");
        };
        check(
            meta(&[(GGUF_INPUT_FORMAT, Value::Str("graphemes".into()))]),
            "neuphonic.input_format: unknown input format",
        );
        check(
            meta(&[(GGUF_INPUT_FORMAT, Value::Int(1))]),
            GGUF_INPUT_FORMAT,
        );
        check(
            meta(&[(GGUF_EMOTIONS, Value::Str("happy".into()))]),
            GGUF_EMOTIONS,
        );
        check(
            meta(&[(GGUF_EMOTIONS, Value::Array(vec![Value::Int(3)]))]),
            GGUF_EMOTIONS,
        );
    }

    #[test]
    fn emotion_tokens_are_the_vendor_s() {
        assert_eq!(emotion_token("happy"), "<|HAPPY|>");
        assert_eq!(emotion_token("surprised"), "<|SURPRISED|>");
    }
}
