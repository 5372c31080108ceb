//! Planning: a request's text cut into pieces that fit the model's token budget, each with its
//! prompt ids, and the most codes each piece may generate.

use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use crate::package::ModelPackage;
use crate::prompt::{self, InputFormat, PromptInput};
use crate::text::markup::{self, Lexicon, Segment};
use crate::text::{self, Language, Normalizer, Phonemizer, TextError};
use crate::voice::{Voice, VoiceStore};

use super::{SpeechRequest, SynthConfig, SynthError};

/// Text to prompt ids: the package's tokenizer, the voices and the phonemizer. Needs no runtime,
/// so `onebit-tts prompt` can use it alone.
pub struct FrontEnd {
    pkg: ModelPackage,
    phonemizer: OnceLock<Result<Phonemizer, String>>,
    /// Swapped whole when a voice is added or removed while serving: a request plans with the
    /// snapshot it took.
    voices: RwLock<Arc<VoiceStore>>,
    normalizer: Normalizer,
    /// The server's (or `say`'s) pronunciations; a request's own entries win over them.
    lexicon: Arc<Lexicon>,
    /// Languages whose grammars failed to load, so the warning is logged once, not per request.
    warned: Mutex<Vec<Language>>,
}

impl FrontEnd {
    pub fn new(pkg: ModelPackage, voices: VoiceStore) -> Self {
        Self {
            pkg,
            phonemizer: OnceLock::new(),
            voices: RwLock::new(Arc::new(voices)),
            normalizer: Normalizer::discover(),
            lexicon: Arc::default(),
            warned: Mutex::new(Vec::new()),
        }
    }

    /// Loads the package, voices and lexicon a config names.
    pub fn load(cfg: &SynthConfig) -> Result<Self, crate::Error> {
        let pkg = ModelPackage::load(&cfg.package_dir, cfg.codec_dir.as_deref())?;
        // A language the front end cannot speak stops the load, not every request.
        if let Some(l) = &pkg.language {
            l.parse::<Language>()
                .map_err(|e| crate::package::PackageError::Invalid {
                    path: pkg.dir.join(crate::package::neuphonic::LANGUAGE_FILE),
                    msg: e.to_string(),
                })?;
        }
        // Said once per package, where every command that speaks loads one (say, serve, bench).
        if let Some(note) = pkg.random_weights_notice() {
            tracing::warn!("{note}");
        }
        let voices = VoiceStore::open(&cfg.voice_dirs)?;
        let mut front = Self::new(pkg, voices);
        if let Some(path) = &cfg.lexicon {
            let text =
                std::fs::read_to_string(path).map_err(|source| crate::Error::LexiconRead {
                    path: path.clone(),
                    source,
                })?;
            let lexicon = Lexicon::parse(&text).map_err(|source| crate::Error::Lexicon {
                path: path.clone(),
                source,
            })?;
            tracing::info!("lexicon {}: {} words", path.display(), lexicon.len());
            front.lexicon = Arc::new(lexicon);
        }
        Ok(front)
    }

    /// The normaliser requests are read with (a server warms its languages at start).
    pub fn normalizer(&self) -> &Normalizer {
        &self.normalizer
    }

    pub fn package(&self) -> &ModelPackage {
        &self.pkg
    }

    /// The voices now: the snapshot held, read again from disk when its last read began
    /// [`REVALIDATE`](crate::voice::REVALIDATE) ago or more and replaced when anything changed
    /// (another server sharing the store made or deleted a voice). Its lookups read the disk
    /// again themselves on a miss ([`VoiceStore::get`]).
    pub fn voices(&self) -> Arc<VoiceStore> {
        // A panic while swapping cannot leave a half-made store: the swap is one assignment.
        let held = self
            .voices
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(fresh) = held.refreshed(crate::voice::REVALIDATE) else {
            return held;
        };
        let mut guard = self
            .voices
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // Another caller may have swapped in a snapshot as new or newer meanwhile.
        if guard.generation() < fresh.generation() {
            *guard = Arc::new(fresh);
        }
        guard.clone()
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

    /// The language a request's text (and the voice's transcript, which shares its prompt) is
    /// read in: the request's, else the model's, else the voice's. The vendor phonemizes in the
    /// model's language whatever the reference voice speaks (`_load_phonemizer`); a package that
    /// does not record one (a generated test package, a custom model) keeps the voice's.
    fn language(&self, requested: Option<Language>, voice: &Voice) -> Result<Language, TextError> {
        match (requested, &self.pkg.language) {
            (Some(l), _) => Ok(l),
            (None, Some(model)) => model.parse(),
            (None, None) => voice.language.parse(),
        }
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

    /// [`prepare_text`](Self::prepare_text) for text that may hold IPA placeholders: the text
    /// around each is prepared on its own and the IPA goes in as written.
    fn prepare_marked(
        &self,
        text: &str,
        ipa: &[(String, String)],
        format: InputFormat,
        lang: Language,
    ) -> Result<String, TextError> {
        if !text.chars().any(|c| placeholder_index(c).is_some()) {
            return self.prepare_text(text, format, lang);
        }
        let mut parts: Vec<String> = Vec::new();
        let mut chunk = String::new();
        let flush = |chunk: &mut String, parts: &mut Vec<String>| -> Result<(), TextError> {
            if chunk.chars().any(char::is_alphanumeric) {
                parts.push(self.prepare_text(chunk, format, lang)?);
            } else if let Some(last) = parts.last_mut() {
                // Punctuation after a pronunciation ("[X](/…/).") has nothing to phonemize but
                // still ends the phrase: it goes on as written, as espeak-ng writes its own.
                last.push_str(chunk.trim());
            }
            chunk.clear();
            Ok(())
        };
        for c in text.chars() {
            match placeholder_index(c).and_then(|i| ipa.get(i)) {
                Some((_, phonemes)) => {
                    flush(&mut chunk, &mut parts)?;
                    parts.push(phonemes.clone());
                }
                None => chunk.push(c),
            }
        }
        flush(&mut chunk, &mut parts)?;
        if parts.is_empty() {
            return Err(TextError::NothingSpeakable);
        }
        Ok(parts.join(" "))
    }

    /// A text segment's spoken form: normalised when asked (and the grammars are there).
    fn spoken(
        &self,
        text: &str,
        lang: Language,
        normalize: bool,
        notes: &mut Vec<String>,
    ) -> String {
        if !normalize {
            return text.to_owned();
        }
        match self.normalizer.normalize(text, lang) {
            Ok(n) => {
                notes.extend(n.notes);
                n.text
            }
            Err(e) => {
                let mut warned = self.warned.lock().unwrap_or_else(|p| p.into_inner());
                if !warned.contains(&lang) {
                    warned.push(lang);
                    tracing::warn!("text is read as written: {e}");
                }
                notes.push(format!("not normalised: {e}"));
                text.to_owned()
            }
        }
    }
}

/// IPA pronunciations stand in the text as one private-use character each while it is split
/// into pieces (a placeholder is one "word", so no cut falls inside it), and are put back when
/// each piece is prepared. Plane 15 is private use: no text a user sends means anything by it.
const PLACEHOLDER_BASE: u32 = 0xF0000;
/// Placeholders there are (plane 15 less its two noncharacters): pronunciations a run may hold.
const PLACEHOLDERS: u32 = 0xFFFE;

/// Most markup silence one request may ask for in all: pauses are cheap to write and each one
/// costs its length in output, so a 20,000-character text of pauses would otherwise be hours.
pub const MAX_TOTAL_PAUSE: Duration = Duration::from_secs(300);

fn placeholder(index: usize) -> Option<char> {
    u32::try_from(index)
        .ok()
        .filter(|&i| i < PLACEHOLDERS)
        .and_then(|i| char::from_u32(PLACEHOLDER_BASE + i))
}

fn placeholder_index(c: char) -> Option<usize> {
    let v = u32::from(c);
    (PLACEHOLDER_BASE..PLACEHOLDER_BASE + PLACEHOLDERS)
        .contains(&v)
        .then(|| (v - PLACEHOLDER_BASE) as usize)
}

/// A piece's text as written: its placeholders back to the words they stand for.
fn written(text: &str, ipa: &[(String, String)]) -> String {
    text.chars()
        .map(|c| match placeholder_index(c).and_then(|i| ipa.get(i)) {
            Some((word, _)) => word.clone(),
            None => c.to_string(),
        })
        .collect()
}

/// A request's text planned: its pieces and what was made of the text.
#[derive(Debug, Clone)]
pub struct Plan {
    pub pieces: Vec<Piece>,
    pub voice: Voice,
    /// The text as it is spoken: normalised, markup resolved (pronounced words as written).
    pub spoken: String,
    /// Silence after the last piece (markup at the end of the text).
    pub trailing_pause: Option<Duration>,
    /// What normalisation left as written, and why.
    pub notes: Vec<String>,
}

/// What [`FrontEnd::read`] made of a request's text.
struct ReadText {
    runs: Vec<Run>,
    trailing_pause: Option<Duration>,
    notes: Vec<String>,
}

/// What every run of one request is planned with.
#[derive(Clone, Copy)]
struct RunContext<'a> {
    req: &'a SpeechRequest,
    voice: &'a Voice,
    ref_text: &'a str,
    lang: Language,
    format: InputFormat,
    budget: usize,
    min_new: usize,
}

/// Text between two pauses of a marked-up request, with its pronunciations.
#[derive(Default)]
struct Run {
    pause_before: Option<Duration>,
    text: String,
    ipa: Vec<(String, String)>,
}

/// One piece of a request's text with its prompt.
#[derive(Debug, Clone)]
pub struct Piece {
    /// The piece's source text (normalised).
    pub text: String,
    /// The text in the model's input format (phonemes or normalised BPE text).
    pub prepared: String,
    pub ids: Vec<u32>,
    /// Leading ids the same for every request of the voice ([`prompt::build_shared`]).
    pub voice_prefix: usize,
    /// Codes this piece is expected to need, from the voice's speaking rate.
    pub estimated_codes: usize,
    /// Codes this piece may make at most, from its text ([`code_budget`]).
    pub max_codes: usize,
    /// Silence before it asked for by markup; `None`: the usual join between pieces.
    pub pause_before: Option<Duration>,
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
        let lang = self.language(None, voice)?;
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
    /// budget, in order. The text is first read as the request asks (markup, pronunciations,
    /// written-to-spoken normalisation); a text that then fits whole is one piece phonemized
    /// whole, exactly as the vendor does; longer ones are cut at sentences, then clauses, then
    /// words. A markup pause always ends a piece.
    pub fn plan(
        &self,
        req: &SpeechRequest,
        budget: usize,
        min_new: usize,
    ) -> Result<Plan, SynthError> {
        if req.text.trim().is_empty() {
            return Err(SynthError::EmptyInput);
        }
        let owned = self.voices().get(&req.voice)?.clone();
        let lang = self.language(req.language, &owned)?;
        let format = req.input_format.unwrap_or(self.pkg.input_format);
        let ReadText {
            runs,
            trailing_pause,
            notes,
        } = self.read(req, lang, format)?;
        let ref_text = self.prepare_text(&owned.transcript, format, lang)?;
        let ctx = RunContext {
            req,
            voice: &owned,
            ref_text: &ref_text,
            lang,
            format,
            budget,
            min_new,
        };
        let mut pieces = Vec::new();
        for run in &runs {
            let first = pieces.len();
            self.plan_run(&ctx, run, &mut pieces)?;
            if let Some(p) = pieces.get_mut(first) {
                p.pause_before = run.pause_before;
            }
        }
        if pieces.is_empty() {
            return Err(TextError::NothingSpeakable.into());
        }
        let spoken = runs
            .iter()
            .map(|r| written(&r.text, &r.ipa))
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Plan {
            pieces,
            voice: owned,
            spoken,
            trailing_pause,
            notes,
        })
    }

    /// The request's text as runs between pauses, each normalised (when asked) with its
    /// pronunciations as placeholders, and the pause after the last run.
    fn read(
        &self,
        req: &SpeechRequest,
        lang: Language,
        format: InputFormat,
    ) -> Result<ReadText, SynthError> {
        let segments = if req.reading.markup {
            markup::parse(&req.text)?
        } else {
            vec![Segment::Text(req.text.clone())]
        };
        let own = req.reading.lexicon.as_deref().filter(|l| !l.is_empty());
        let segments = if format != InputFormat::Phonemes {
            // A text-input model cannot take IPA: a request that brings its own lexicon is told
            // so; the server's lexicon simply does not apply to it.
            if own.is_some() {
                return Err(SynthError::LexiconNeedsPhonemes(format));
            }
            segments
        } else {
            match own {
                Some(own) => Lexicon::apply_layers(&[own, &self.lexicon], segments),
                None if !self.lexicon.is_empty() => self.lexicon.apply(segments),
                None => segments,
            }
        };
        let mut out = ReadText {
            runs: Vec::new(),
            trailing_pause: None,
            notes: Vec::new(),
        };
        let mut cur = Run::default();
        // The silence asked for since the last run, and in the whole request.
        let mut pause: Option<Duration> = None;
        let mut total_pause = Duration::ZERO;
        // Whether the text before the next segment ended in a space: segments are joined as
        // they were written ("[word](/ipa/)," keeps its comma on the word).
        let mut space = false;
        // A run ends at a pause; one with nothing to speak in it (the "." of "Hi [pause:1s].")
        // is dropped and its pause carries on to the next.
        let end_run = |cur: &mut Run, out: &mut ReadText, pause: &mut Option<Duration>| {
            let run = std::mem::take(cur);
            if run
                .text
                .chars()
                .any(|c| c.is_alphanumeric() || placeholder_index(c).is_some())
            {
                out.runs.push(run);
            } else {
                *pause = run.pause_before;
            }
        };
        for seg in segments {
            match seg {
                Segment::Pause(d) => {
                    if !cur.text.is_empty() {
                        end_run(&mut cur, &mut out, &mut pause);
                    }
                    space = false;
                    // Pauses in a row add up, to at most one pause's limit.
                    pause = Some((pause.unwrap_or_default() + d).min(markup::MAX_PAUSE));
                    total_pause += d;
                    if total_pause > MAX_TOTAL_PAUSE {
                        return Err(SynthError::PausesTooLong {
                            seconds: total_pause.as_secs_f64(),
                        });
                    }
                }
                Segment::Text(t) => {
                    // Characters of the placeholders' range are not text anyone speaks (icon
                    // fonts use them); dropped so they cannot pose as a pronunciation.
                    let t: String = t
                        .chars()
                        .filter(|&c| placeholder_index(c).is_none())
                        .collect();
                    let (lead, trail) = (
                        t.starts_with(char::is_whitespace),
                        t.ends_with(char::is_whitespace),
                    );
                    let t = self.spoken(&t, lang, req.reading.normalize, &mut out.notes);
                    if t.trim().is_empty() {
                        space |= lead || trail;
                        continue;
                    }
                    if cur.text.is_empty() {
                        cur.pause_before = pause.take();
                    } else if space || lead {
                        cur.text.push(' ');
                    }
                    cur.text.push_str(t.trim());
                    space = trail;
                }
                Segment::Ipa { text, ipa } => {
                    if format != InputFormat::Phonemes {
                        return Err(SynthError::IpaNeedsPhonemes(format));
                    }
                    let Some(mark) = placeholder(cur.ipa.len()) else {
                        return Err(SynthError::Markup(markup::MarkupError {
                            position: 1,
                            message: format!(
                                "more than {PLACEHOLDERS} pronunciations between two pauses"
                            ),
                        }));
                    };
                    if cur.text.is_empty() {
                        cur.pause_before = pause.take();
                    } else if space {
                        cur.text.push(' ');
                    }
                    cur.text.push(mark);
                    cur.ipa.push((text, ipa));
                    space = false;
                }
            }
        }
        if !cur.text.is_empty() {
            end_run(&mut cur, &mut out, &mut pause);
        }
        out.trailing_pause = pause;
        Ok(out)
    }

    /// One run's pieces, appended to `pieces`.
    fn plan_run(
        &self,
        ctx: &RunContext<'_>,
        run: &Run,
        pieces: &mut Vec<Piece>,
    ) -> Result<(), SynthError> {
        let RunContext {
            req,
            voice,
            ref_text,
            lang,
            format,
            budget,
            min_new,
        } = *ctx;
        // Speaking rate of this voice: codes per character of its prepared transcript, with a
        // margin so a piece rarely runs into the budget.
        let rate = voice.codes.len() as f64 / ref_text.chars().count().max(1) as f64;
        let estimate = |prepared: &str| {
            ((prepared.chars().count() as f64 * rate * 1.3).ceil() as usize).max(min_new)
        };
        // The ids, and with `voice_part` how many are the voice's alone (that count tokenizes
        // the transcript once more, so a length check goes without it).
        let build = |prepared: &str, voice_part: bool| {
            let input = PromptInput {
                format,
                ref_text,
                text: prepared,
                ref_codes: &voice.codes,
                emotion: req.emotion.as_deref(),
            };
            let (tok, vocab) = (&self.pkg.tokenizer, &self.pkg.vocab);
            if voice_part {
                prompt::build_shared(tok, vocab, &input)
            } else {
                prompt::build(tok, vocab, &input).map(|ids| (ids, 0))
            }
        };
        let piece = |text: String, prepared: String| -> Result<Piece, SynthError> {
            let (ids, voice_prefix) = build(&prepared, true)?;
            Ok(Piece {
                text: written(&text, &run.ipa),
                ids,
                voice_prefix,
                estimated_codes: estimate(&prepared),
                max_codes: code_budget(&prepared),
                prepared,
                pause_before: None,
            })
        };
        let whole = if run.ipa.is_empty() {
            text::normalize(&run.text)?
        } else {
            run.text.clone()
        };
        let prepared = self.prepare_marked(&whole, &run.ipa, format, lang)?;
        let one = piece(whole.clone(), prepared)?;
        if one.ids.len() + one.estimated_codes <= budget {
            pieces.push(one);
            return Ok(());
        }

        // Units small enough to fit alone, each with its prepared text.
        let fits = |prepared: &str| -> Result<(bool, usize), SynthError> {
            let n = build(prepared, false)?.0.len() + estimate(prepared);
            Ok((n <= budget, n))
        };
        // A unit with no letter or digit (only emoji or symbols) has nothing to speak: it is
        // dropped with a warning instead of failing a request that has speakable text elsewhere
        // (`whole` has some, or preparing it above would have failed).
        let prepare = |t: &str| -> Result<Option<String>, SynthError> {
            match self.prepare_marked(t, &run.ipa, format, lang) {
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
                            word: written(word, &run.ipa),
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
                            word: written(word, &run.ipa),
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
        Ok(())
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
