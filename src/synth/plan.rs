//! Planning: a request's text cut into pieces that fit the model's token budget, each with its
//! prompt ids, and the most codes each piece may generate.

use std::sync::{Arc, OnceLock, RwLock};

use crate::package::ModelPackage;
use crate::prompt::{self, InputFormat, PromptInput};
use crate::text::{self, Language, Phonemizer, TextError};
use crate::voice::{Voice, VoiceStore};

use super::{DEFAULT_MAX_INPUT_CHARS, SpeechRequest, SynthConfig, SynthError};

/// Text to prompt ids: the package's tokenizer, the voices and the phonemizer. Needs no runtime,
/// so `onebit-tts prompt` can use it alone.
pub struct FrontEnd {
    pkg: ModelPackage,
    phonemizer: OnceLock<Result<Phonemizer, String>>,
    /// Swapped whole when a voice is added or removed while serving: a request plans with the
    /// snapshot it took.
    voices: RwLock<Arc<VoiceStore>>,
    max_input_chars: usize,
}

impl FrontEnd {
    pub fn new(pkg: ModelPackage, voices: VoiceStore, max_input_chars: usize) -> Self {
        Self {
            pkg,
            phonemizer: OnceLock::new(),
            voices: RwLock::new(Arc::new(voices)),
            max_input_chars: if max_input_chars == 0 {
                DEFAULT_MAX_INPUT_CHARS
            } else {
                max_input_chars
            },
        }
    }

    /// Loads the package and voices a config names.
    pub fn load(cfg: &SynthConfig) -> Result<Self, crate::Error> {
        let pkg = ModelPackage::load(&cfg.package_dir, cfg.codec_dir.as_deref())?;
        let voices = VoiceStore::open(&cfg.voice_dirs)?;
        Ok(Self::new(pkg, voices, cfg.max_input_chars))
    }

    pub fn package(&self) -> &ModelPackage {
        &self.pkg
    }

    /// The voices now.
    pub fn voices(&self) -> Arc<VoiceStore> {
        // A panic while swapping cannot leave a half-made store: the swap is one assignment.
        self.voices
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Changes the voices for every request planned from now on.
    pub fn update_voices(&self, change: impl FnOnce(&mut VoiceStore)) {
        let mut guard = self
            .voices
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut store = VoiceStore::clone(&guard);
        change(&mut store);
        *guard = Arc::new(store);
    }

    fn phonemizer(&self) -> Result<&Phonemizer, TextError> {
        self.phonemizer
            .get_or_init(|| Phonemizer::discover().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| TextError::Unavailable(e.clone()))
    }

    /// Text in the model's input format for one piece of text.
    fn prepare_text(
        &self,
        text: &str,
        format: InputFormat,
        lang: Language,
    ) -> Result<String, TextError> {
        match format {
            InputFormat::Phonemes => {
                let clean = text::normalize(text)?;
                self.phonemizer()?.phonemize(&clean, lang)
            }
            InputFormat::Bpe => text::normalize_bpe(text),
        }
    }
}

/// One piece of a request's text with its prompt.
#[derive(Debug, Clone)]
pub struct Piece {
    /// The piece's source text (normalised).
    pub text: String,
    /// The text in the model's input format (phonemes or normalised BPE text).
    pub prepared: String,
    pub ids: Vec<u32>,
    /// Codes this piece is expected to need, from the voice's speaking rate.
    pub estimated_codes: usize,
    /// Codes this piece may make at most, from its text ([`code_budget`]).
    pub max_codes: usize,
}

/// Speaking rate the code budget assumes, in characters of prepared text (phonemes, or the
/// normalised text of a BPE model) per second. The vendor's five reference voices speak 16-23
/// transcript characters per second (dave 172 in 7.4 s, mateo 103 in 6.4 s) and an espeak
/// phoneme string is about as long as its text, so 15 is a slow reader.
pub const BUDGET_CHARS_PER_SECOND: f64 = 15.0;
/// How much longer than that estimate a piece may run: room for pauses, slow voices and a
/// model that drawls, while a model that never says its end token stops within a few times the
/// text's length instead of at the context limit (79 s of audio for "hi").
pub const BUDGET_FACTOR: f64 = 3.0;
/// Codes every piece may make whatever its length (2 s): a one-word piece's onset and release
/// are most of its audio.
pub const BUDGET_FLOOR_CODES: usize = 100;

/// The most codes a piece of prepared text may generate: 50 codes/s x its estimated seconds x
/// [`BUDGET_FACTOR`] + [`BUDGET_FLOOR_CODES`], i.e. 10 codes per character plus 100 ("hi", four
/// phoneme characters, gets 140 codes: 2.8 s).
pub fn code_budget(prepared: &str) -> usize {
    let seconds = prepared.chars().count() as f64 / BUDGET_CHARS_PER_SECOND;
    (seconds * crate::package::CODES_PER_SECOND * BUDGET_FACTOR).ceil() as usize
        + BUDGET_FLOOR_CODES
}

impl FrontEnd {
    /// Prompt tokens a voice costs before any text: its prompt with nothing to speak, built exactly
    /// as a request's is (its transcript prepared for the model, its codes, the prompt frame).
    pub fn reference_tokens(&self, voice: &Voice) -> Result<usize, SynthError> {
        let lang: Language = voice.language.parse()?;
        let format = self.pkg.input_format;
        let ref_text = self.prepare_text(&voice.transcript, format, lang)?;
        let ids = prompt::build(
            &self.pkg.tokenizer,
            &self.pkg.vocab,
            &PromptInput {
                format,
                ref_text: &ref_text,
                text: "",
                ref_codes: &voice.codes,
                emotion: None,
            },
        )?;
        Ok(ids.len())
    }

    /// Refuses a voice whose reference leaves no room to speak in this package's token budget;
    /// otherwise the reference's length warning, if any.
    pub fn check_reference(&self, voice: &Voice) -> Result<Option<String>, SynthError> {
        let needed = self.reference_tokens(voice)?;
        Ok(crate::voice::check_budget(
            voice,
            needed,
            self.pkg.genai.token_budget(),
        )?)
    }

    /// Splits a request's text into pieces whose prompt plus expected codes fit the model's token
    /// budget, in order. A text that fits whole is one piece phonemized whole, exactly as the
    /// vendor does; longer ones are cut at sentences, then clauses, then words.
    pub fn plan(
        &self,
        req: &SpeechRequest,
        budget: usize,
        min_new: usize,
    ) -> Result<(Vec<Piece>, Voice), SynthError> {
        let chars = req.text.chars().count();
        if chars > self.max_input_chars {
            return Err(SynthError::InputTooLong {
                got: chars,
                limit: self.max_input_chars,
            });
        }
        if req.text.trim().is_empty() {
            return Err(SynthError::EmptyInput);
        }
        let owned = self.voices().get(&req.voice)?.clone();
        let voice = &owned;
        let lang = match req.language {
            Some(l) => l,
            None => voice.language.parse()?,
        };
        let format = req.input_format.unwrap_or(self.pkg.input_format);
        let ref_text = self.prepare_text(&voice.transcript, format, lang)?;
        // Speaking rate of this voice: codes per character of its prepared transcript, with a
        // margin so a piece rarely runs into the budget.
        let rate = voice.codes.len() as f64 / ref_text.chars().count().max(1) as f64;
        let estimate = |prepared: &str| {
            ((prepared.chars().count() as f64 * rate * 1.3).ceil() as usize).max(min_new)
        };
        let build = |prepared: &str| {
            prompt::build(
                &self.pkg.tokenizer,
                &self.pkg.vocab,
                &PromptInput {
                    format,
                    ref_text: &ref_text,
                    text: prepared,
                    ref_codes: &voice.codes,
                    emotion: req.emotion.as_deref(),
                },
            )
        };
        let piece = |text: String, prepared: String| -> Result<Piece, SynthError> {
            Ok(Piece {
                text,
                ids: build(&prepared)?,
                estimated_codes: estimate(&prepared),
                max_codes: code_budget(&prepared),
                prepared,
            })
        };
        let whole = text::normalize(&req.text)?;
        let prepared = self.prepare_text(&whole, format, lang)?;
        let one = piece(whole.clone(), prepared)?;
        if one.ids.len() + one.estimated_codes <= budget {
            return Ok((vec![one], owned));
        }

        // Units small enough to fit alone, each with its prepared text.
        let fits = |prepared: &str| -> Result<(bool, usize), SynthError> {
            let n = build(prepared)?.len() + estimate(prepared);
            Ok((n <= budget, n))
        };
        // A unit with no letter or digit (only emoji or symbols) has nothing to speak: it is
        // dropped with a warning instead of failing a request that has speakable text elsewhere
        // (`whole` has some, or normalising it above would have failed).
        let prepare = |t: &str| -> Result<Option<String>, SynthError> {
            match self.prepare_text(t, format, lang) {
                Ok(p) => Ok(Some(p)),
                Err(TextError::NothingSpeakable) => {
                    tracing::warn!("skipping {t:?}: nothing to speak in it (no letter or digit)");
                    Ok(None)
                }
                Err(e) => Err(e.into()),
            }
        };
        let mut units: Vec<(String, String)> = Vec::new();
        for sentence in text::split_sentences(&whole) {
            let Some(p) = prepare(&sentence)? else {
                continue;
            };
            if fits(&p)?.0 {
                units.push((sentence, p));
                continue;
            }
            for clause in text::split_clauses(&sentence) {
                let Some(p) = prepare(&clause)? else {
                    continue;
                };
                if fits(&p)?.0 {
                    units.push((clause, p));
                    continue;
                }
                // Group words greedily; a single word that cannot fit is an error, never a cut.
                // `cur` is empty or speakable, so only a lone word can be dropped.
                let mut cur = String::new();
                for word in clause.split_whitespace() {
                    let cand = if cur.is_empty() {
                        word.to_owned()
                    } else {
                        format!("{cur} {word}")
                    };
                    let Some(cp) = prepare(&cand)? else {
                        continue;
                    };
                    if fits(&cp)?.0 {
                        cur = cand;
                        continue;
                    }
                    if cur.is_empty() {
                        let (_, needed) = fits(&cp)?;
                        return Err(SynthError::WordTooLong {
                            word: word.to_owned(),
                            needed,
                            budget,
                        });
                    }
                    if let Some(p) = prepare(&cur)? {
                        units.push((std::mem::take(&mut cur), p));
                    }
                    let Some(wp) = prepare(word)? else {
                        continue;
                    };
                    cur = word.to_owned();
                    let (ok, needed) = fits(&wp)?;
                    if !ok {
                        return Err(SynthError::WordTooLong {
                            word: word.to_owned(),
                            needed,
                            budget,
                        });
                    }
                }
                if !cur.is_empty()
                    && let Some(p) = prepare(&cur)?
                {
                    units.push((cur, p));
                }
            }
        }
        // Merge neighbours while they fit: longer pieces keep the prosody of whole sentences.
        let mut pieces: Vec<Piece> = Vec::new();
        let mut cur: Option<(String, String)> = None;
        for (t, p) in units {
            cur = Some(match cur.take() {
                None => (t, p),
                Some((ct, cp)) => {
                    let mp = format!("{cp} {p}");
                    if fits(&mp)?.0 {
                        (format!("{ct} {t}"), mp)
                    } else {
                        pieces.push(piece(ct, cp)?);
                        (t, p)
                    }
                }
            });
        }
        if let Some((ct, cp)) = cur {
            pieces.push(piece(ct, cp)?);
        }
        Ok((pieces, owned))
    }
}

/// The most codes a piece may generate, and what sets it: its text's [`code_budget`] (raised
/// to an explicit `min_new_tokens`, which the end token cannot beat anyway), the model's context
/// after the prompt, and what is left of the request's `max_new_tokens`, whichever is least.
pub(super) fn piece_limit(
    piece: &Piece,
    context: usize,
    min_new: usize,
    left: Option<usize>,
) -> (usize, &'static str) {
    let mut limit = (piece.max_codes.max(min_new), "its text's code budget");
    let room = context.saturating_sub(piece.ids.len());
    if room < limit.0 {
        limit = (room, "the model's context");
    }
    if let Some(l) = left
        && l < limit.0
    {
        limit = (l, "the request's max_new_tokens");
    }
    limit
}
