//! Written-to-spoken normalisation ("$5.50" → "five dollars fifty cents") before phonemization.
//!
//! The grammars are damga 1.0.5's compiled weighted transducers (Apache-2.0), in OpenFst's binary
//! format, for en, de, fr and es: a reader that tags the text (`money(text="…")`, `word="…"`)
//! and a writer that turns the tags into words. This module is damga's run time in Rust: each
//! grammar runs as "compose the input's bytes with the transducer, keep the shortest path"
//! (rustfst reads the files and does both, as damga's own OpenFst runtime does), around damga's
//! per-language regex steps before and after (`en.rs` … `es.rs`), which also hold our own
//! corrections of the grammars' known mistakes. No Python runs at serve time.
//!
//! Where a grammar finds no reading, the text passes through as written; the reason is kept in
//! [`Normalized::notes`] and logged, and the sentence is still spoken (espeak-ng reads digits).

mod de;
mod en;
mod es;
mod fr;
mod pyre;

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, OnceLock};

use regex::Regex;
use rustfst::algorithms::compose::compose;
use rustfst::algorithms::{shortest_path, tr_sort};
use rustfst::prelude::{
    CoreFst, ExpandedFst, ILabelCompare, Label, MutableFst, Semiring, SerializableFst, Tr,
    TropicalWeight, Trs, VectorFst,
};
use sha2::{Digest, Sha256};

use super::Language;

/// The damga release whose grammars these are; `scripts/setup.sh` unpacks them from its source
/// package into `<onebit home>/tn/damga-1.0.5/<lang>/`.
pub const GRAMMARS: &str = "damga-1.0.5";

/// sha256 of each grammar file (reader, writer), as damga 1.0.5 ships them: a file that differs
/// is refused rather than run, since the regex steps here are written against these grammars.
const PINS: [(Language, &str, &str); 4] = [
    (
        Language::EnUs,
        "1d22bc9aaa3c8dbfed7653970320a431d21782a1ad5a541a0a078fc6db0e97c1",
        "d4a352edb5168cfad472c045540a31310de83fa00e9b962269293255c7812cbe",
    ),
    (
        Language::De,
        "0935f8b925a36945d390ffd49997210f65f0429f3bb05610d8081a757072b6cf",
        "d4a352edb5168cfad472c045540a31310de83fa00e9b962269293255c7812cbe",
    ),
    (
        Language::FrFr,
        "552dd1513c0f7100cb8de8a2456aa71ff85c3d15cdf4936900c6ef8571efd552",
        "d4a352edb5168cfad472c045540a31310de83fa00e9b962269293255c7812cbe",
    ),
    (
        Language::Es,
        "0fe053851676ca4ba90470b5aa50bfff6724d7f8eccc0b00e6f57ddb16420f8a",
        "1a47c3a88befd513a4d8d3eb6f29c3674946bdd2d3cec3b2b0a62825dcd1be11",
    ),
];

/// Why normalisation could not run for a language.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum TnError {
    #[error(
        "no {GRAMMARS} grammars for {lang}; looked in: {}. Run `scripts/setup.sh` (it unpacks \
         them into .onebit/tn), set ONEBIT_TN_DIR, or turn normalisation off (--no-normalize)",
        tried.join("; ")
    )]
    NotFound { lang: Language, tried: Vec<String> },

    #[error("cannot read grammar {path}: {reason}")]
    Read { path: String, reason: String },

    #[error("grammar {path} has sha256 {got}, not the {GRAMMARS} file this build expects ({want})")]
    Mismatch {
        path: String,
        got: String,
        want: String,
    },
}

/// One weighted transducer over UTF-8 bytes (damga's grammars label arcs with byte values).
struct Grammar {
    fst: VectorFst<TropicalWeight>,
}

impl Grammar {
    fn load(path: &Path, sha256: &str) -> Result<Self, TnError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|e| TnError::Read {
            path: shown.clone(),
            reason: e.to_string(),
        })?;
        let got = format!("{:x}", Sha256::digest(&bytes));
        if got != sha256 {
            return Err(TnError::Mismatch {
                path: shown,
                got,
                want: sha256.to_owned(),
            });
        }
        let mut fst = VectorFst::<TropicalWeight>::load(&bytes).map_err(|e| TnError::Read {
            path: shown,
            reason: format!("{e:#}"),
        })?;
        // Composition looks arcs up by input label.
        tr_sort(&mut fst, ILabelCompare {});
        Ok(Self { fst })
    }

    /// The output of the cheapest path that reads `input`, or None where no path does.
    fn rewrite(&self, input: &str) -> Option<String> {
        let mut chain = VectorFst::<TropicalWeight>::new();
        let mut state = chain.add_state();
        chain.set_start(state).ok()?;
        for &b in input.as_bytes() {
            let next = chain.add_state();
            let label = Label::from(b);
            chain
                .add_tr(state, Tr::new(label, label, TropicalWeight::one(), next))
                .ok()?;
            state = next;
        }
        chain.set_final(state, TropicalWeight::one()).ok()?;
        let lattice: VectorFst<TropicalWeight> =
            compose::<_, VectorFst<_>, VectorFst<_>, _, _, _>(&chain, &self.fst).ok()?;
        lattice.start()?;
        let best: VectorFst<TropicalWeight> = shortest_path(&lattice).ok()?;
        let mut state = best.start()?;
        let mut out = Vec::with_capacity(input.len() * 2);
        // A single path: follow its one arc per state to the final state.
        for _ in 0..=best.num_states() {
            if best.is_final(state).ok()? {
                return String::from_utf8(out).ok();
            }
            let trs = best.get_trs(state).ok()?;
            let tr = trs.trs().first()?;
            if tr.olabel != 0 {
                out.push(u8::try_from(tr.olabel).ok()?);
            }
            state = tr.nextstate;
        }
        None
    }
}

/// A language's reader and writer.
struct Grammars {
    read: Grammar,
    write: Grammar,
}

/// What normalisation made of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// The spoken form: what the grammars read, verbalised, and everything else as written
    /// (spelling and spacing: [`as_written_where_unread`]), so that a text with nothing to read
    /// reaches the prompt exactly as the vendor's neutts would take it.
    pub text: String,
    /// The grammars' own output, sentence by sentence as damga gives it (its clean-up of spaces
    /// and quotes included).
    pub grammar: String,
    /// The grammar's tagged reading of each sentence (`money(text="…")`): what it decided.
    pub records: Vec<String>,
    /// Sentences read as written, and why (e.g. "no reading").
    pub notes: Vec<String>,
}

/// Written-to-spoken normaliser for the four languages; grammars load on first use of a language
/// and are shared by every request after.
pub struct Normalizer {
    dirs: Vec<PathBuf>,
    langs: [OnceLock<Result<Arc<Grammars>, TnError>>; 4],
}

impl std::fmt::Debug for Normalizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Normalizer")
            .field("dirs", &self.dirs)
            .finish_non_exhaustive()
    }
}

/// Directories that may hold `<lang>/read.fst`: `$ONEBIT_TN_DIR` alone when set, else
/// `tn/damga-1.0.5` in each onebit home (`.onebit/`, see [`crate::paths`]).
fn grammar_dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("ONEBIT_TN_DIR").filter(|v| !v.is_empty()) {
        return vec![PathBuf::from(d)];
    }
    crate::paths::in_homes(&format!("tn/{GRAMMARS}"))
}

fn lang_dir(lang: Language) -> &'static str {
    match lang {
        Language::EnUs => "en",
        Language::De => "de",
        Language::FrFr => "fr",
        Language::Es => "es",
    }
}

fn index(lang: Language) -> usize {
    match lang {
        Language::EnUs => 0,
        Language::De => 1,
        Language::FrFr => 2,
        Language::Es => 3,
    }
}

impl Normalizer {
    /// Looks for the grammars where `scripts/setup.sh` puts them (or `$ONEBIT_TN_DIR`).
    pub fn discover() -> Self {
        Self::in_dirs(grammar_dirs())
    }

    /// Grammars from these directories, first match wins.
    pub fn in_dirs(dirs: Vec<PathBuf>) -> Self {
        Self {
            dirs,
            langs: Default::default(),
        }
    }

    /// Loads a language's grammars now (a server does this at start, so the first request does
    /// not pay for it and a missing file is reported before any request).
    pub fn warm(&self, lang: Language) -> Result<(), TnError> {
        self.grammars(lang).map(|_| ())
    }

    fn grammars(&self, lang: Language) -> Result<&Arc<Grammars>, TnError> {
        self.langs[index(lang)]
            .get_or_init(|| self.load(lang).map(Arc::new))
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load(&self, lang: Language) -> Result<Grammars, TnError> {
        let (_, read_sha, write_sha) = PINS[index(lang)];
        let sub = lang_dir(lang);
        let mut tried = Vec::new();
        for dir in &self.dirs {
            let d = dir.join(sub);
            if d.join("read.fst").is_file() && d.join("write.fst").is_file() {
                let started = std::time::Instant::now();
                let g = Grammars {
                    read: Grammar::load(&d.join("read.fst"), read_sha)?,
                    write: Grammar::load(&d.join("write.fst"), write_sha)?,
                };
                tracing::debug!(
                    "normaliser: {lang} grammars from {} in {:?}",
                    d.display(),
                    started.elapsed()
                );
                return Ok(g);
            }
            tried.push(d.display().to_string());
        }
        if tried.is_empty() {
            tried.push(
                "no .onebit home (none in the current directory, beside the executable or \
                 their ancestors, and ONEBIT_HOME unset)"
                    .to_owned(),
            );
        }
        Err(TnError::NotFound { lang, tried })
    }

    /// The spoken form of `text` (any length: it is read sentence by sentence).
    pub fn normalize(&self, text: &str, lang: Language) -> Result<Normalized, TnError> {
        let g = self.grammars(lang)?;
        let mut out = Normalized {
            text: String::new(),
            grammar: String::with_capacity(text.len() * 2),
            records: Vec::new(),
            notes: Vec::new(),
        };
        for sentence in chunks(text) {
            let one = normalize_sentence(g, &sentence, lang);
            if !out.grammar.is_empty() && !one.text.is_empty() {
                out.grammar.push(' ');
            }
            out.grammar.push_str(&one.text);
            if let Some(r) = one.record {
                tracing::debug!("normaliser: {sentence:?} read as {r}");
                out.records.push(r);
            }
            if let Some(n) = one.note {
                tracing::debug!("normaliser: {sentence:?} kept as written: {n}");
                out.notes.push(format!("{sentence:?}: {n}"));
            }
        }
        out.text = as_written_where_unread(text, &out.grammar);
        Ok(out)
    }
}

/// `spoken` (the grammars' output for `written`) with every part the grammars did not read put
/// back as written. The grammars also tidy what they leave alone (no space before `?` or `;`,
/// straight apostrophes, single spaces, NFC), which moves a prompt away from the text the model
/// was trained on (French writes "plaît ?"). Both texts are cut into tokens (runs of letters and
/// digits; any other visible character alone) and aligned with a diff; a token of `spoken` that
/// is one of `written` (compared after the grammars' own folding) is written as it was, and so
/// is the space between two such tokens that were neighbours in `written`. Everything else
/// (what the grammars verbalised, and the spaces around it) is taken from `spoken`.
pub fn as_written_where_unread(written: &str, spoken: &str) -> String {
    let a = tokens(written);
    let b = tokens(spoken);
    let key = |t: &Token| fold(&t.text);
    let ops = similar::capture_diff_slices_by_key(similar::Algorithm::Myers, &a, &b, key);
    // For each token of `spoken`, the token of `written` it is (if any).
    let mut from = vec![None; b.len()];
    for op in ops {
        if let similar::DiffOp::Equal {
            old_index,
            new_index,
            len,
        } = op
        {
            for i in 0..len {
                from[new_index + i] = Some(old_index + i);
            }
        }
    }
    let mut out = String::with_capacity(spoken.len());
    for (j, t) in b.iter().enumerate() {
        if j > 0 {
            let gap = match (from[j - 1], from[j]) {
                (Some(p), Some(k)) if k == p + 1 => &written[a[p].end..a[k].start],
                // Unread punctuation keeps the space it had before it (French "cinq euros ?"),
                // which the grammars took away whatever precedes it.
                (_, Some(k)) if k > 0 && !is_word(&a[k].text) => &written[a[k - 1].end..a[k].start],
                _ => &spoken[b[j - 1].end..t.start],
            };
            out.push_str(gap);
        }
        match from[j] {
            Some(k) => out.push_str(&written[a[k].start..a[k].end]),
            None => out.push_str(&spoken[t.start..t.end]),
        }
    }
    out
}

struct Token {
    start: usize,
    end: usize,
    text: String,
}

/// Letters, digits and combining marks: what a word token is made of.
fn wordish(c: char) -> bool {
    c.is_alphanumeric() || unicode_normalization::char::is_combining_mark(c)
}

fn is_word(token: &str) -> bool {
    token.chars().next().is_some_and(wordish)
}

/// Runs of letters, digits and combining marks are one token; whitespace separates; any other
/// character is a token alone.
fn tokens(s: &str) -> Vec<Token> {
    let mut v: Vec<Token> = Vec::new();
    let mut word: Option<usize> = None;
    for (i, c) in s.char_indices() {
        if wordish(c) {
            word.get_or_insert(i);
            continue;
        }
        if let Some(st) = word.take() {
            v.push(Token {
                start: st,
                end: i,
                text: s[st..i].to_owned(),
            });
        }
        if !c.is_whitespace() {
            v.push(Token {
                start: i,
                end: i + c.len_utf8(),
                text: c.to_string(),
            });
        }
    }
    if let Some(st) = word {
        v.push(Token {
            start: st,
            end: s.len(),
            text: s[st..].to_owned(),
        });
    }
    v
}

/// A token as the grammars' preprocessing leaves it (NFC, apostrophes straightened), so that
/// what they only tidied still counts as unread.
fn fold(t: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    t.nfc().map(straight_apostrophe).collect()
}

/// damga's preprocessing writes every apostrophe-like mark as `'`.
fn straight_apostrophe(c: char) -> char {
    match c {
        '\u{2019}' | '\u{2018}' | '\u{2bc}' | '`' | '\u{b4}' => '\'',
        c => c,
    }
}

/// The text in pieces damga reads as it reads the whole: paragraphs (a blank line ends one even
/// without a point, as after a heading), then sentences, except that a cut after a point that may
/// not end a sentence ("2. März", "1 Mio. Menschen", "ext. 12", "EE. UU.") is undone while the
/// piece is short. damga reads a whole input in one pass, which costs more than linear time in
/// its length and delays the first audio of a long text; most sentence ends are unambiguous.
fn chunks(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for paragraph in PARAGRAPH.split(text) {
        let paragraph = preprocess(paragraph);
        let first = out.len();
        for sentence in super::split_sentences(&paragraph) {
            let in_paragraph = out.len() > first;
            match out.last_mut() {
                Some(last)
                    if in_paragraph && !ends_sentence(last) && last.len() < MAX_JOINED_BYTES =>
                {
                    last.push(' ');
                    last.push_str(&sentence);
                }
                _ => out.push(sentence),
            }
        }
    }
    out
}

/// A blank line (with any spaces on it).
static PARAGRAPH: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\n[ \t\r]*\n").expect("constant pattern"));

/// How long a piece may grow by undoing cuts: a text of many short sentences or list items
/// would otherwise be read in one pass.
const MAX_JOINED_BYTES: usize = 600;

/// Whether a piece surely ends a sentence: "!", "?" or "…", or a point after a word of five or
/// more letters (not a number, an initial or a short abbreviation such as "Nr." or "St.").
fn ends_sentence(piece: &str) -> bool {
    let piece = piece.trim_end_matches(|c: char| c == ' ' || super::split::CLOSERS.contains(&c));
    if piece.ends_with(['!', '?', '…']) {
        return true;
    }
    let Some(before) = piece.strip_suffix('.') else {
        return false;
    };
    let word = before
        .trim_end_matches('.')
        .rsplit(char::is_whitespace)
        .next()
        .unwrap_or("");
    word.chars().count() >= 5 && word.chars().all(char::is_alphabetic)
}

struct Sentence {
    text: String,
    record: Option<String>,
    note: Option<&'static str>,
}

fn prepare(lang: Language, text: &str) -> String {
    match lang {
        Language::EnUs => en::prepare(text),
        Language::De => de::prepare(text),
        Language::FrFr => fr::prepare(text),
        Language::Es => es::prepare(text),
    }
}

fn language_finish(lang: Language, text: &str) -> String {
    match lang {
        Language::EnUs => en::finish(text),
        Language::De => de::finish(text),
        Language::FrFr => fr::finish(text),
        Language::Es => es::finish(text),
    }
}

/// damga's `Engine.normalize`: read with the language's regex step first; where that step's
/// marks block every path or survive into the output, read the plain text instead.
fn normalize_sentence(g: &Grammars, text: &str, lang: Language) -> Sentence {
    let base = preprocess(text);
    let prepared = prepare(lang, &base);
    let hooked = run(g, text, &prepared, lang);
    // Marks are what the regex step adds that is not text: invisible separators, º, −.
    let marks: Vec<char> = prepared
        .chars()
        .filter(|c| {
            !base.contains(*c) && !c.is_ascii() && (!c.is_alphabetic() || "ºª".contains(*c))
        })
        .collect();
    if hooked.note.is_some() || hooked.text.chars().any(|c| marks.contains(&c)) {
        let plain = run(g, text, &base, lang);
        if plain.note.is_none() || hooked.note.is_some() {
            return plain;
        }
    }
    hooked
}

/// damga's `Engine._normalize`: reader, writer, then the clean-up after them.
fn run(g: &Grammars, original: &str, clean: &str, lang: Language) -> Sentence {
    if clean.is_empty() {
        return Sentence {
            text: String::new(),
            record: None,
            note: None,
        };
    }
    // damga's language step after the engine (en `_tidy`, es `reattach`) runs on every result,
    // the text left as written included.
    let Some(record) = g.read.rewrite(clean) else {
        return Sentence {
            text: language_finish(lang, clean),
            record: None,
            note: Some("the grammar has no reading of it"),
        };
    };
    let Some(out) = g.write.rewrite(&record) else {
        return Sentence {
            text: language_finish(lang, clean),
            record: Some(record),
            note: Some("the grammar cannot say its reading"),
        };
    };
    Sentence {
        text: language_finish(lang, &finish(original, clean, &out)),
        record: Some(record),
        note: None,
    }
}

/// damga's `preprocess` without lower-casing (damga runs these four languages cased): NFC,
/// apostrophes to `'`, whitespace runs to one space.
fn preprocess(text: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let mut out = String::with_capacity(text.len());
    let mut space = false;
    for c in text.nfc() {
        let c = straight_apostrophe(c);
        // damga's `[ \t\r\n   ]+` (with NBSP, thin space and narrow NBSP).
        if matches!(
            c,
            ' ' | '\t' | '\r' | '\n' | '\u{a0}' | '\u{2009}' | '\u{202f}'
        ) {
            space = true;
            continue;
        }
        if space && !out.is_empty() {
            out.push(' ');
        }
        space = false;
        out.push(c);
    }
    // damga strips what Python calls whitespace at both ends (U+3000, U+001C… too).
    pyre::py_strip(&out).to_owned()
}

static SPACE_BEFORE_PUNCT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r" +([.,;:!?)\]…])").expect("constant pattern"));
static SPACE_AFTER_OPEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"([(\[]) +").expect("constant pattern"));
static SPACES: LazyLock<Regex> = LazyLock::new(|| Regex::new(r" {2,}").expect("constant pattern"));
/// A sentence that ends in a word with a point (an abbreviation, or a plain full stop).
static ENDS_WITH_ABBREVIATION: pyre::PyRegex = pyre::PyRegex::new(|| r"[^\W\d_]\.$".into());

/// damga's `Engine.finish` for cased languages without a custom vocabulary: spacing around
/// punctuation, the one point that ends both an abbreviation and the sentence, quotes.
fn finish(text: &str, clean: &str, out: &str) -> String {
    let out = SPACE_BEFORE_PUNCT.replace_all(out, "$1");
    let out = SPACE_AFTER_OPEN.replace_all(&out, "$1");
    let mut out = SPACES.replace_all(&out, " ").trim().to_owned();
    let text = text.trim_end();
    if ENDS_WITH_ABBREVIATION
        .for_text(text)
        .is_match(text)
        .unwrap_or(false)
    {
        if !out.ends_with(['.', '!', '?', '…']) && !out.is_empty() {
            out.push('.');
        } else if out.ends_with("..") && !out.ends_with("...") {
            out.pop();
        }
    }
    if out.contains('"') {
        out = reattach_quotes(clean, &out);
    }
    out
}

/// damga's `reattach_quotes`: a straight quote glued to a word in the source is glued to it in
/// the output too (the writer spaces every token).
fn reattach_quotes(source: &str, output: &str) -> String {
    let src: Vec<char> = source.chars().collect();
    let positions: Vec<usize> = (0..src.len()).filter(|&i| src[i] == '"').collect();
    let parts: Vec<&str> = output.split('"').collect();
    if positions.len() + 1 != parts.len() {
        return output.to_owned();
    }
    let mut res = parts[0].to_owned();
    for (k, next) in parts[1..].iter().enumerate() {
        let i = positions[k];
        if i > 0 && src[i - 1] != ' ' {
            res.truncate(res.trim_end_matches(' ').len());
        }
        res.push('"');
        if i + 1 < src.len() && src[i + 1] != ' ' {
            res.push_str(next.trim_start_matches(' '));
        } else {
            res.push_str(next);
        }
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_grammars_did_not_read_stays_as_written() {
        let k = as_written_where_unread;
        // Only tidied: the French space before "?" and ";" and the curly apostrophes come back.
        assert_eq!(
            k(
                "Où est la gare, s’il vous plaît ?",
                "Où est la gare, s'il vous plaît?"
            ),
            "Où est la gare, s’il vous plaît ?"
        );
        // A reading between unread words takes the grammars' spacing around it only.
        assert_eq!(
            k("Il a 3 chats ; et toi ?", "Il a trois chats; et toi?"),
            "Il a trois chats ; et toi ?"
        );
        assert_eq!(
            k(
                "My email is jane.doe@example.com, ok ?",
                "My email is jane dot doe at example dot com, ok?"
            ),
            "My email is jane dot doe at example dot com, ok ?"
        );
        assert_eq!(k("Dr. Smith", "doctor Smith"), "doctor Smith");
        // A reading right before unread punctuation: the punctuation keeps its space.
        assert_eq!(
            k("Ça coûte 5 € ?", "Ça coûte cinq euros?"),
            "Ça coûte cinq euros ?"
        );
        assert_eq!(
            k("Il est 10 h ?", "Il est dix heures?"),
            "Il est dix heures ?"
        );
        // Line breaks and runs of spaces between unread words are kept; NFD stays NFD where
        // unread.
        assert_eq!(
            k("Bonjour\n\nà  tous", "Bonjour à tous"),
            "Bonjour\n\nà  tous"
        );
        let nfd = "cafe\u{301} ?";
        assert_eq!(k(nfd, "café?"), nfd);
        // Nothing to say, or everything new.
        assert_eq!(k("…", ""), "");
        assert_eq!(k("12", "twelve"), "twelve");
    }

    #[test]
    fn preprocess_folds_space_and_apostrophes_and_composes() {
        assert_eq!(
            preprocess("  It\u{2019}s\u{a0}\u{a0}the  Cafe\u{301}\t\n`s  "),
            "It's the Café 's"
        );
    }

    #[test]
    fn finish_spaces_punctuation_and_keeps_one_point() {
        assert_eq!(
            finish("x", "x", "Hello , world ( yes ) !"),
            "Hello, world (yes)!"
        );
        // "St." both ends an abbreviation and the sentence: one point.
        assert_eq!(finish("Elm St.", "Elm St.", "Elm Street"), "Elm Street.");
        assert_eq!(finish("Elm St.", "Elm St.", "Elm Street.."), "Elm Street.");
        assert_eq!(finish("Wait...", "Wait...", "Wait..."), "Wait...");
    }

    #[test]
    fn only_sure_sentence_ends_cut_the_text() {
        assert_eq!(
            chunks("Am 3. Oktober kam er heute. Dann ging er! Wer? 1 Mio. Menschen."),
            [
                "Am 3. Oktober kam er heute.",
                "Dann ging er!",
                "Wer?",
                "1 Mio. Menschen."
            ]
        );
        assert_eq!(
            chunks("It is 5. Then go. We waited there. Done."),
            ["It is 5. Then go. We waited there.", "Done."]
        );
        assert_eq!(chunks("EE. UU. es grande."), ["EE. UU. es grande."]);
        // A heading without a point ends at its blank line.
        assert_eq!(
            chunks("Introduction\n \nThe 2. Mai.\n\n\nNext"),
            ["Introduction", "The 2. Mai.", "Next"]
        );
        // Undone cuts stop growing a piece past its limit.
        let list = "It is 5. ".repeat(200);
        let pieces = chunks(&list);
        assert!(pieces.len() > 1, "{}", pieces.len());
        assert!(pieces.iter().all(|p| p.len() < MAX_JOINED_BYTES + 20));
    }

    /// A transducer that reads only `from` and writes `to`, byte for byte.
    fn only(from: &str, to: &str) -> Grammar {
        let mut fst = VectorFst::<TropicalWeight>::new();
        let mut state = fst.add_state();
        fst.set_start(state).unwrap();
        let (from, to) = (from.as_bytes(), to.as_bytes());
        for i in 0..from.len().max(to.len()) {
            let next = fst.add_state();
            let label = |b: Option<&u8>| b.map_or(0, |&b| Label::from(b));
            fst.add_tr(
                state,
                Tr::new(
                    label(from.get(i)),
                    label(to.get(i)),
                    TropicalWeight::one(),
                    next,
                ),
            )
            .unwrap();
            state = next;
        }
        fst.set_final(state, TropicalWeight::one()).unwrap();
        Grammar { fst }
    }

    #[test]
    fn text_without_a_reading_passes_through_with_a_note() {
        let g = Grammars {
            read: only("a", "word=\"a\""),
            write: only("word=\"a\"", "A"),
        };
        let read = run(&g, "a", "a", Language::FrFr);
        assert_eq!((read.text.as_str(), read.note), ("A", None));
        assert_eq!(read.record.as_deref(), Some("word=\"a\""));
        let kept = run(&g, "b 5", "b 5", Language::FrFr);
        assert_eq!(kept.text, "b 5");
        assert_eq!(kept.note, Some("the grammar has no reading of it"));
        assert_eq!(kept.record, None);
        // The hooked reading failing, the plain text is tried before giving up.
        let n = normalize_sentence(&g, "a", Language::FrFr);
        assert_eq!(n.text, "A");
    }

    #[test]
    fn quotes_stay_glued_to_their_words() {
        assert_eq!(
            reattach_quotes("He said \"5 cats\" twice", "He said \" five cats \" twice"),
            "He said \"five cats\" twice"
        );
        // A count that does not match leaves the writer's output alone.
        assert_eq!(reattach_quotes("\"a", "a"), "a");
    }

    #[test]
    fn missing_grammars_name_where_they_were_looked_for() {
        let n = Normalizer::in_dirs(vec![PathBuf::from("/nonexistent/tn")]);
        let e = n.normalize("5", Language::De).unwrap_err();
        assert!(matches!(
            e,
            TnError::NotFound {
                lang: Language::De,
                ..
            }
        ));
        let msg = e.to_string();
        assert!(
            msg.contains("/nonexistent/tn/de") && msg.contains("--no-normalize"),
            "{msg}"
        );
    }

    #[test]
    fn a_grammar_file_that_is_not_the_pinned_one_is_refused() {
        let dir = std::env::temp_dir().join(format!("onebit-tn-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("fr")).unwrap();
        std::fs::write(dir.join("fr/read.fst"), b"not a grammar").unwrap();
        std::fs::write(dir.join("fr/write.fst"), b"not a grammar").unwrap();
        let e = Normalizer::in_dirs(vec![dir.clone()])
            .warm(Language::FrFr)
            .unwrap_err();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(matches!(e, TnError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains(PINS[2].1), "{e}");
    }
}
