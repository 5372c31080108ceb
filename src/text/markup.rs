//! Opt-in speech markup in request text (pauses, pronunciations) and a pronunciation lexicon.
//!
//! Only parsing lives here; the synthesis pipeline decides what a [`Segment`] becomes.
//!
//! The syntax, chosen so that it never fires on ordinary text: a `[` or `<` that does not form
//! one of these constructs stays literal text ("a < b", "<b>bold</b>", "[sic]", "(a) [b] c").
//!
//! - `[pause:0.5s]`, `[pause:500ms]`, `[pause: 2 s]`: a pause. The prefix is case-insensitive;
//!   the amount is a decimal number (no sign, no exponent) with the unit `s` or `ms`.
//! - `<break time="500ms"/>`, `<break time='1.5s' />`, `<break strength="medium"/>`, `<break/>`:
//!   an SSML break. Strengths are SSML's: none 0, x-weak 0.1 s, weak 0.25 s, medium 0.5 s,
//!   strong 1 s, x-strong 2 s; a bare `<break/>` is medium; with both attributes `time` wins,
//!   as SSML says. It must be an empty element (`/>`): `<break>` is refused, since a following
//!   `</break>` would otherwise be read aloud.
//! - `[tomato](/təˈmɑːtoʊ/)`: words spoken with the given IPA (Kokoro-FastAPI's syntax). The
//!   text is kept as written, the IPA has surrounding whitespace trimmed. Neither may be empty,
//!   and neither may span lines.
//! - `\[` and `\<` are a literal `[` and `<` (the backslash dropped), so `\[pause:1s]` is read
//!   as text. A backslash before anything else is kept.
//!
//! Once text starts like a construct (`[pause:`, `<break` then whitespace, `/` or `>`,
//! `[text](/`), anything wrong with it is an error at the construct's first character rather
//! than literal text: a typo in markup should be reported, not spoken.
//!
//! Pauses: zero is accepted (`[pause:0s]`, `time="0ms"`, `strength="none"`) and yields no
//! segment at all, the text either side joining up; a `Pause(0)` would split the text where
//! SSML's "none" asks for no break. Each pause is its own segment (`[pause:1s][pause:1s]` is
//! two), so every construct maps to at most one segment. The longest pause is [`MAX_PAUSE`].

use std::collections::HashMap;
use std::time::Duration;

/// One part of a marked-up text, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Segment {
    /// Ordinary text (normalised and phonemized later).
    Text(String),
    /// Silence of this length.
    Pause(Duration),
    /// Words spoken with the given IPA (goes straight into the phoneme prompt).
    Ipa { text: String, ipa: String },
}

/// Malformed markup.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("markup error at character {position}: {message}")]
pub struct MarkupError {
    /// 1-based character (not byte) offset of the construct's first character.
    pub position: usize,
    pub message: String,
}

/// The longest pause one construct may ask for.
pub const MAX_PAUSE: Duration = Duration::from_secs(10);

const PAUSE_PREFIX: &str = "[pause:";
const BREAK_NAME: &str = "break";
const MEDIUM: Duration = Duration::from_millis(500);
const STRENGTHS: [(&str, Duration); 6] = [
    ("none", Duration::ZERO),
    ("x-weak", Duration::from_millis(100)),
    ("weak", Duration::from_millis(250)),
    ("medium", MEDIUM),
    ("strong", Duration::from_secs(1)),
    ("x-strong", Duration::from_secs(2)),
];
/// How much of a bad construct an error message quotes.
const SNIPPET_CHARS: usize = 40;

/// Parses marked-up text. Text with no markup comes back as one Text segment, unchanged (empty
/// text as no segments: an empty Text is never emitted).
pub fn parse(text: &str) -> Result<Vec<Segment>, MarkupError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut literal = String::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        let rest = &chars[i + 1..];
        match c {
            '\\' if matches!(rest.first(), Some('[' | '<')) => {
                literal.extend(rest.first());
                i += 2;
            }
            '[' if starts_with_ignore_case(rest, &PAUSE_PREFIX[1..]) => {
                let (pause, next) = parse_pause(&chars, i)?;
                push_pause(&mut out, &mut literal, pause);
                i = next;
            }
            '[' => match parse_pronunciation(&chars, i)? {
                Some((segment, next)) => {
                    flush(&mut out, &mut literal);
                    out.push(segment);
                    i = next;
                }
                None => {
                    literal.push(c);
                    i += 1;
                }
            },
            '<' if is_break_start(rest) => {
                let (pause, next) = parse_break(&chars, i)?;
                push_pause(&mut out, &mut literal, pause);
                i = next;
            }
            _ => {
                literal.push(c);
                i += 1;
            }
        }
    }
    flush(&mut out, &mut literal);
    Ok(out)
}

fn flush(out: &mut Vec<Segment>, literal: &mut String) {
    if !literal.is_empty() {
        out.push(Segment::Text(std::mem::take(literal)));
    }
}

fn push_pause(out: &mut Vec<Segment>, literal: &mut String, pause: Duration) {
    if !pause.is_zero() {
        flush(out, literal);
        out.push(Segment::Pause(pause));
    }
}

fn error(start: usize, message: impl Into<String>) -> MarkupError {
    MarkupError {
        position: start + 1,
        message: message.into(),
    }
}

/// The start of a bad construct, for its error message.
fn snippet(chars: &[char]) -> String {
    let line = chars.iter().take_while(|&&c| c != '\n');
    let mut s: String = line.clone().take(SNIPPET_CHARS).collect();
    if line.count() > SNIPPET_CHARS {
        s.push('…');
    }
    s
}

/// ASCII case-insensitive prefix test (markup keywords are ASCII).
fn starts_with_ignore_case(chars: &[char], prefix: &str) -> bool {
    prefix
        .chars()
        .enumerate()
        .all(|(k, p)| chars.get(k).is_some_and(|c| c.eq_ignore_ascii_case(&p)))
}

/// `[pause:…]` starting at `start`: the pause and the index just past the `]`.
fn parse_pause(chars: &[char], start: usize) -> Result<(Duration, usize), MarkupError> {
    let body_start = start + PAUSE_PREFIX.len();
    // A pause never spans lines or holds another bracket, so a missing `]` is reported here
    // rather than as a bad amount swallowed up to some later `]`.
    let close = chars[body_start..]
        .iter()
        .position(|&c| matches!(c, ']' | '[' | '\n'))
        .map(|k| body_start + k)
        .filter(|&k| chars[k] == ']')
        .ok_or_else(|| {
            error(
                start,
                format!(
                    "unterminated pause \"{}\": missing ']'",
                    snippet(&chars[start..])
                ),
            )
        })?;
    let body: String = chars[body_start..close].iter().collect();
    let pause = parse_duration(&body)
        .map_err(|why| error(start, format!("invalid pause \"[pause:{body}]\": {why}")))?;
    Ok((pause, close + 1))
}

/// A pause amount such as "0.5s", " 500 ms", "2S", bounded by [`MAX_PAUSE`].
fn parse_duration(text: &str) -> Result<Duration, String> {
    const EXPECTED: &str = "expected a number and s or ms, such as 0.5s or 500ms";
    let text = text.trim();
    if text.starts_with('-') {
        return Err("a pause cannot be negative".into());
    }
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = (&text[..split], text[split..].trim());
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(EXPECTED.into());
    }
    let unit_nanos: u128 = if unit.eq_ignore_ascii_case("s") {
        1_000_000_000
    } else if unit.eq_ignore_ascii_case("ms") {
        1_000_000
    } else if unit.is_empty() {
        return Err("missing unit: write s or ms, such as 0.5s or 500ms".into());
    } else {
        return Err(format!("unknown unit \"{unit}\": use s or ms"));
    };
    let too_long = || format!("longer than the maximum of {MAX_PAUSE:?}");
    // Integer arithmetic so that "0.3s" is exactly 300 ms; digits past nanoseconds are dropped.
    let fraction = &fraction[..fraction.len().min(9)];
    let nanos = digits_value(whole)
        .and_then(|w| w.checked_mul(unit_nanos))
        .and_then(|w| {
            let scale = 10u128.pow(fraction.len() as u32);
            w.checked_add(digits_value(fraction)? * unit_nanos / scale)
        })
        .ok_or_else(too_long)?;
    if nanos > MAX_PAUSE.as_nanos() {
        return Err(too_long());
    }
    u64::try_from(nanos)
        .map(Duration::from_nanos)
        .map_err(|_| too_long())
}

/// The value of a run of ASCII digits (empty is 0); `None` on overflow.
fn digits_value(digits: &str) -> Option<u128> {
    digits.bytes().try_fold(0u128, |acc, b| {
        acc.checked_mul(10)?.checked_add(u128::from(b - b'0'))
    })
}

/// Whether the text after a `<` opens a break element (not "<breakfast>", not "<b>").
fn is_break_start(rest: &[char]) -> bool {
    starts_with_ignore_case(rest, BREAK_NAME)
        && rest
            .get(BREAK_NAME.len())
            .is_some_and(|&c| c.is_whitespace() || c == '/' || c == '>')
}

/// `<break …/>` starting at `start`: the pause and the index just past the `/>`.
fn parse_break(chars: &[char], start: usize) -> Result<(Duration, usize), MarkupError> {
    let fail = |message: String| error(start, message);
    let unterminated = || {
        fail(format!(
            "unterminated break \"{}\": missing '/>'",
            snippet(&chars[start..])
        ))
    };
    let mut time = None;
    let mut strength = None;
    let mut i = start + 1 + BREAK_NAME.len();
    loop {
        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        match chars.get(i) {
            None => return Err(unterminated()),
            Some('/') if chars.get(i + 1) == Some(&'>') => {
                i += 2;
                break;
            }
            Some('>') => {
                return Err(fail(
                    "a break is an empty element: write <break/> or <break time=\"1s\"/>".into(),
                ));
            }
            Some(c) if c.is_ascii_alphabetic() => {}
            Some(c) => return Err(fail(format!("unexpected '{c}' in a break element"))),
        }
        let name_start = i;
        while chars
            .get(i)
            .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':'))
        {
            i += 1;
        }
        let name: String = chars[name_start..i].iter().collect();
        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        if chars.get(i) != Some(&'=') {
            return Err(fail(format!("break attribute \"{name}\" has no value")));
        }
        i += 1;
        while chars.get(i).is_some_and(|c| c.is_whitespace()) {
            i += 1;
        }
        let quote = match chars.get(i) {
            Some(&q @ ('"' | '\'')) => q,
            None => return Err(unterminated()),
            Some(_) => {
                return Err(fail(format!(
                    "the value of break attribute \"{name}\" must be quoted"
                )));
            }
        };
        let value_start = i + 1;
        let value_end = chars[value_start..]
            .iter()
            .position(|&c| c == quote || c == '\n')
            .map(|k| value_start + k)
            .filter(|&k| chars[k] == quote)
            .ok_or_else(unterminated)?;
        let value: String = chars[value_start..value_end].iter().collect();
        i = value_end + 1;
        let slot = if name.eq_ignore_ascii_case("time") {
            let pause = parse_duration(&value)
                .map_err(|why| fail(format!("invalid break time \"{value}\": {why}")))?;
            time.replace(pause)
        } else if name.eq_ignore_ascii_case("strength") {
            let pause = STRENGTHS
                .iter()
                .find(|(s, _)| s.eq_ignore_ascii_case(value.trim()))
                .map(|&(_, pause)| pause)
                .ok_or_else(|| {
                    fail(format!(
                        "unknown break strength \"{value}\": use none, x-weak, weak, medium, \
                         strong or x-strong"
                    ))
                })?;
            strength.replace(pause)
        } else {
            return Err(fail(format!(
                "unknown break attribute \"{name}\": use time or strength"
            )));
        };
        if slot.is_some() {
            return Err(fail(format!("break attribute \"{name}\" given twice")));
        }
    }
    Ok((time.or(strength).unwrap_or(MEDIUM), i))
}

/// `[text](/ipa/)` starting at `start`: the segment and the index just past the `/)`; `None`
/// when the bracket opens no such construct (it is then literal text).
fn parse_pronunciation(
    chars: &[char],
    start: usize,
) -> Result<Option<(Segment, usize)>, MarkupError> {
    let text_start = start + 1;
    let Some(close) = chars[text_start..]
        .iter()
        .position(|&c| matches!(c, ']' | '[' | '\n'))
        .map(|k| text_start + k)
        .filter(|&k| chars[k] == ']')
    else {
        return Ok(None);
    };
    if chars.get(close + 1..close + 3) != Some(&['(', '/'][..]) {
        return Ok(None);
    }
    let ipa_start = close + 3;
    let ipa_end = (ipa_start..chars.len())
        .take_while(|&k| chars[k] != '\n')
        .find(|&k| chars[k] == '/' && chars.get(k + 1) == Some(&')'))
        .ok_or_else(|| {
            error(
                start,
                format!(
                    "unterminated pronunciation \"{}\": missing '/)'",
                    snippet(&chars[start..])
                ),
            )
        })?;
    let text: String = chars[text_start..close].iter().collect();
    let ipa: String = chars[ipa_start..ipa_end].iter().collect();
    let ipa = ipa.trim();
    if text.trim().is_empty() {
        return Err(error(
            start,
            format!("empty text in pronunciation \"[{text}](/{ipa}/)\""),
        ));
    }
    if ipa.is_empty() {
        return Err(error(
            start,
            format!("empty IPA in pronunciation of \"{text}\""),
        ));
    }
    if let Err(why) = check_ipa(ipa) {
        return Err(error(start, format!("the IPA for \"{text}\" {why}")));
    }
    let segment = Segment::Ipa {
        text,
        ipa: ipa.to_string(),
    };
    Ok(Some((segment, ipa_end + 2)))
}

/// A pronunciation lexicon: whole words (case-insensitive, Unicode-aware) → IPA.
///
/// A key is matched as a sequence of whole words: a word is a run of letters, digits, `_` and
/// combining marks, with an apostrophe between letters kept inside it, so "NeuTTS" matches in
/// "NeuTTS," and "neutts." but not in "NeuTTSair", and "don" never matches in "don't" (nor
/// "homme" in "l'homme": add the elided or possessive form as its own entry). Case is compared
/// per character with [`char::to_lowercase`] (not full case folding: "ß" is not "ss"), and the
/// apostrophes ' and ’ are the same.
///
/// Multi-word keys are supported ("New York"): any whitespace between the words of the text
/// matches (a space, several, a line break). Keys may hold punctuation too ("C++", "Dr.",
/// "AT&T"). Where keys overlap, the longest match at a position wins ("New York City" over
/// "New York").
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lexicon {
    /// Normalised key (see [`normalized`]) → IPA.
    entries: HashMap<String, String>,
    /// The most tokens any key has, so that matching stops looking further.
    max_tokens: usize,
}

/// A malformed lexicon entry.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("lexicon line {line}: {message}")]
pub struct LexiconError {
    /// 1-based line of the file, or 1-based index of the pair.
    pub line: usize,
    pub message: String,
}

impl Lexicon {
    /// A lexicon file: one `word<TAB>ipa` per line; blank lines and lines starting with `#` are
    /// skipped. Whitespace around the word and the IPA is trimmed. A word given twice (compared
    /// as the lexicon matches, so "US" and "us" clash) is an error, as is a line with a second
    /// tab: both are likelier mistakes than intent.
    pub fn parse(text: &str) -> Result<Self, LexiconError> {
        let mut builder = Builder::default();
        for (index, line) in text.lines().enumerate() {
            let number = index + 1;
            let trimmed = line.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let Some((word, ipa)) = line.split_once('\t') else {
                return Err(LexiconError {
                    line: number,
                    message: format!("expected word<TAB>ipa, found \"{trimmed}\""),
                });
            };
            if ipa.contains('\t') {
                return Err(LexiconError {
                    line: number,
                    message: "more than one tab: expected word<TAB>ipa".into(),
                });
            }
            builder.add(word, ipa, number)?;
        }
        Ok(builder.lexicon)
    }

    /// From pairs (e.g. a JSON object in a request); an empty word or IPA is an error (line =
    /// index+1), as is a word given twice.
    pub fn from_pairs<I: IntoIterator<Item = (String, String)>>(
        pairs: I,
    ) -> Result<Self, LexiconError> {
        let mut builder = Builder::default();
        for (index, (word, ipa)) in pairs.into_iter().enumerate() {
            builder.add(&word, &ipa, index + 1)?;
        }
        Ok(builder.lexicon)
    }

    /// This lexicon with `other`'s entries added, `other` winning on a clash (a request's lexicon
    /// over the server's).
    pub fn merged(&self, other: &Lexicon) -> Lexicon {
        let mut merged = self.clone();
        merged
            .entries
            .extend(other.entries.iter().map(|(k, v)| (k.clone(), v.clone())));
        merged.max_tokens = merged.max_tokens.max(other.max_tokens);
        merged
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Turns every whole-word match inside Text segments into an Ipa segment (splitting the Text
    /// around it); Pause and Ipa segments are kept. Adjacent empty Text pieces are dropped.
    pub fn apply(&self, segments: Vec<Segment>) -> Vec<Segment> {
        Self::apply_layers(&[self], segments)
    }

    /// [`apply`](Self::apply) with several lexicons, the first that has a key winning (a
    /// request's over the server's) without copying either.
    pub fn apply_layers(layers: &[&Lexicon], segments: Vec<Segment>) -> Vec<Segment> {
        let mut out = Vec::with_capacity(segments.len());
        for segment in segments {
            match segment {
                Segment::Text(text) => apply_text(layers, &text, &mut out),
                other => out.push(other),
            }
        }
        out
    }
}

fn apply_text(layers: &[&Lexicon], text: &str, out: &mut Vec<Segment>) {
    let push_text = |out: &mut Vec<Segment>, piece: &str| {
        if !piece.is_empty() {
            out.push(Segment::Text(piece.to_string()));
        }
    };
    if layers.iter().all(|l| l.is_empty()) {
        push_text(out, text);
        return;
    }
    let tokens = tokenize(text);
    let mut literal_start = 0;
    let mut i = 0;
    while let Some(token) = tokens.get(i) {
        let found = (token.kind != Kind::Space)
            .then(|| longest_match(layers, text, &tokens[i..]))
            .flatten();
        let Some((count, ipa)) = found else {
            i += 1;
            continue;
        };
        let end = tokens[i + count - 1].end;
        push_text(out, &text[literal_start..token.start]);
        out.push(Segment::Ipa {
            text: text[token.start..end].to_string(),
            ipa: ipa.to_string(),
        });
        literal_start = end;
        i += count;
    }
    push_text(out, &text[literal_start..]);
}

/// The longest key of any layer matching the tokens from the first (the first layer that has
/// that key gives its IPA): how many tokens it spans, its IPA.
fn longest_match<'l>(
    layers: &[&'l Lexicon],
    text: &str,
    tokens: &[Token],
) -> Option<(usize, &'l str)> {
    let reach = layers.iter().map(|l| l.max_tokens).max().unwrap_or(0);
    let mut key = String::new();
    let mut best = None;
    for (k, token) in tokens.iter().take(reach).enumerate() {
        push_normalized(&mut key, text, token);
        // Keys are trimmed, so none ends in whitespace.
        if token.kind == Kind::Space {
            continue;
        }
        if let Some(ipa) = layers.iter().find_map(|l| l.entries.get(&key)) {
            best = Some((k + 1, ipa.as_str()));
        }
    }
    best
}

/// Most tokens (words, spaces, marks) one lexicon key may span: matching looks this far ahead of
/// every word, so a longer key would make every request's lexicon pass slower.
pub const MAX_KEY_TOKENS: usize = 15;

/// Whether IPA can go into the phoneme prompt as written: a line break or other control
/// character would only corrupt it, and `<|` would open one of the prompt's special tokens.
fn check_ipa(ipa: &str) -> Result<(), &'static str> {
    if ipa.chars().any(char::is_control) {
        return Err("holds a control character");
    }
    if ipa.contains("<|") {
        return Err("holds \"<|\", which opens the prompt's special tokens");
    }
    Ok(())
}

/// Builds a lexicon entry by entry, remembering where each key came from for duplicate errors.
#[derive(Default)]
struct Builder {
    lexicon: Lexicon,
    lines: HashMap<String, usize>,
}

impl Builder {
    fn add(&mut self, word: &str, ipa: &str, line: usize) -> Result<(), LexiconError> {
        let fail = |message: String| LexiconError { line, message };
        let (word, ipa) = (word.trim(), ipa.trim());
        if word.is_empty() {
            return Err(fail("empty word".into()));
        }
        if ipa.is_empty() {
            return Err(fail(format!("empty IPA for \"{word}\"")));
        }
        if let Err(why) = check_ipa(ipa) {
            return Err(fail(format!("the IPA for \"{word}\" {why}")));
        }
        let tokens = tokenize(word);
        if tokens.len() > MAX_KEY_TOKENS {
            return Err(fail(format!(
                "\"{word}\" is longer than a lexicon entry may be ({MAX_KEY_TOKENS} words, \
                 spaces and marks)"
            )));
        }
        let key = normalized(word, &tokens);
        if let Some(first) = self.lines.insert(key.clone(), line) {
            return Err(fail(format!(
                "\"{word}\" repeats the word of line {first} (words match case-insensitively)"
            )));
        }
        self.lexicon.max_tokens = self.lexicon.max_tokens.max(tokens.len());
        self.lexicon.entries.insert(key, ipa.to_string());
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Word,
    Space,
    /// One character that is neither: punctuation, a symbol.
    Other,
}

/// A piece of text by byte range.
#[derive(Debug, Clone, Copy)]
struct Token {
    start: usize,
    end: usize,
    kind: Kind,
}

fn is_apostrophe(c: char) -> bool {
    matches!(c, '\'' | '\u{2019}')
}

/// Letters, digits, `_` and the combining marks that `char::is_alphanumeric` leaves out (it
/// counts marks of the Alphabetic property only): without them "cafe" + U+0301 would split
/// into "cafe" and a lone accent, and "cafe" would match inside "café".
fn is_word_char(c: char) -> bool {
    c.is_alphanumeric()
        || c == '_'
        || matches!(c,
            '\u{0300}'..='\u{036F}'
            | '\u{1AB0}'..='\u{1AFF}'
            | '\u{1DC0}'..='\u{1DFF}'
            | '\u{20D0}'..='\u{20FF}'
            | '\u{FE20}'..='\u{FE2F}')
}

/// Splits text into maximal words, whitespace runs and single other characters. An apostrophe
/// between word characters belongs to the word ("don't", "l'homme").
fn tokenize(text: &str) -> Vec<Token> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let end_of = |k: usize| chars.get(k).map_or(text.len(), |&(b, _)| b);
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(&(start, c)) = chars.get(i) {
        let kind = if is_word_char(c) {
            Kind::Word
        } else if c.is_whitespace() {
            Kind::Space
        } else {
            Kind::Other
        };
        i += 1;
        match kind {
            Kind::Word => loop {
                match chars.get(i) {
                    Some(&(_, c)) if is_word_char(c) => i += 1,
                    Some(&(_, c))
                        if is_apostrophe(c)
                            && chars.get(i + 1).is_some_and(|&(_, n)| is_word_char(n)) =>
                    {
                        i += 2
                    }
                    _ => break,
                }
            },
            Kind::Space => {
                while chars.get(i).is_some_and(|&(_, c)| c.is_whitespace()) {
                    i += 1;
                }
            }
            Kind::Other => {}
        }
        tokens.push(Token {
            start,
            end: end_of(i),
            kind,
        });
    }
    tokens
}

/// Appends a token's matching form: lower case, one apostrophe, any whitespace as one space.
fn push_normalized(key: &mut String, text: &str, token: &Token) {
    if token.kind == Kind::Space {
        key.push(' ');
        return;
    }
    for c in text[token.start..token.end].chars() {
        if is_apostrophe(c) {
            key.push('\'');
        } else {
            key.extend(c.to_lowercase());
        }
    }
}

/// The matching form of a whole (trimmed) key.
fn normalized(text: &str, tokens: &[Token]) -> String {
    let mut key = String::with_capacity(text.len());
    for token in tokens {
        push_normalized(&mut key, text, token);
    }
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Segment {
        Segment::Text(s.to_string())
    }

    fn ipa(text: &str, ipa: &str) -> Segment {
        Segment::Ipa {
            text: text.to_string(),
            ipa: ipa.to_string(),
        }
    }

    fn ms(n: u64) -> Segment {
        Segment::Pause(Duration::from_millis(n))
    }

    fn ok(input: &str) -> Vec<Segment> {
        match parse(input) {
            Ok(segments) => segments,
            Err(e) => panic!("{input:?}: {e}"),
        }
    }

    /// The error's position, checking its message names what is wrong.
    fn err(input: &str, needle: &str) -> usize {
        match parse(input) {
            Ok(segments) => panic!("{input:?} parsed as {segments:?}"),
            Err(e) => {
                assert!(
                    e.message.contains(needle),
                    "{input:?}: {:?} lacks {needle:?}",
                    e.message
                );
                e.position
            }
        }
    }

    fn lexicon(pairs: &[(&str, &str)]) -> Lexicon {
        Lexicon::from_pairs(pairs.iter().map(|&(w, i)| (w.to_string(), i.to_string())))
            .expect("valid pairs")
    }

    fn lex_err(file: &str) -> LexiconError {
        Lexicon::parse(file).expect_err("an invalid lexicon")
    }

    #[test]
    fn plain_text_is_one_unchanged_segment() {
        for s in [
            "Hello, world.",
            "  leading and trailing  ",
            "line one\nline two\t",
            "Grüße, señor — 😀",
            "a \\ b \\n c\\",
        ] {
            assert_eq!(ok(s), vec![text(s)]);
        }
        assert_eq!(ok(""), vec![]);
    }

    #[test]
    fn brackets_that_are_not_markup_stay_literal() {
        for s in [
            "a < b > c",
            "<b>bold</b>",
            "<br/>",
            "<breakfast> is served",
            "<breaking news>",
            "the tag <break",
            "x<",
            "[sic]",
            "[1]",
            "(a) [b] c",
            "[]",
            "[ ]",
            "[pause]",
            "[pause 1s]",
            "[link](http://example.com)",
            "[tomato] (/təˈmɑːtoʊ/)",
            "[tomato]( /x/)",
            "[tomato](x/)",
            "[tomato]",
            "[a\nb](/x/)",
            "f(x) = [a, b] and arr[i] < 3 >= 2",
            "unclosed [ bracket",
            "]] ][ [[",
            "1 / 2 (/) [/]",
        ] {
            assert_eq!(ok(s), vec![text(s)], "{s:?}");
        }
    }

    #[test]
    fn pause_forms() {
        let cases = [
            ("[pause:0.5s]", 500),
            ("[pause:500ms]", 500),
            ("[pause:2s]", 2000),
            ("[pause: 0.5 s]", 500),
            ("[pause:  1s  ]", 1000),
            ("[PAUSE:1S]", 1000),
            ("[Pause:250MS]", 250),
            ("[pause:.25s]", 250),
            ("[pause:1.s]", 1000),
            ("[pause:0.3s]", 300),
            ("[pause:10s]", 10_000),
            ("[pause:10000ms]", 10_000),
            ("[pause:0010.000s]", 10_000),
        ];
        for (input, millis) in cases {
            assert_eq!(ok(input), vec![ms(millis)], "{input:?}");
        }
        // Exact integer arithmetic, not a float round trip.
        assert_eq!(
            ok("[pause:1.5ms]"),
            vec![Segment::Pause(Duration::from_micros(1500))]
        );
        assert_eq!(
            ok("[pause:0.1234567891s]"),
            vec![Segment::Pause(Duration::from_nanos(123_456_789))]
        );
    }

    #[test]
    fn pause_splits_text_keeping_its_whitespace() {
        assert_eq!(
            ok("Hello [pause:1s] world"),
            vec![text("Hello "), ms(1000), text(" world")]
        );
        assert_eq!(ok("[pause:1s]Hi"), vec![ms(1000), text("Hi")]);
        assert_eq!(ok("Hi[pause:1s]"), vec![text("Hi"), ms(1000)]);
        assert_eq!(
            ok("a[pause:1s][pause:200ms]b"),
            vec![text("a"), ms(1000), ms(200), text("b")]
        );
        assert_eq!(
            ok("a [pause:1s] [pause:1s] b"),
            vec![text("a "), ms(1000), text(" "), ms(1000), text(" b")]
        );
    }

    #[test]
    fn zero_pause_is_accepted_and_leaves_no_segment() {
        assert_eq!(ok("a[pause:0s]b"), vec![text("ab")]);
        assert_eq!(ok("a [pause:0ms] b"), vec![text("a  b")]);
        assert_eq!(ok("[pause:0.0s]"), vec![]);
        assert_eq!(ok("a<break time=\"0ms\"/>b"), vec![text("ab")]);
        assert_eq!(ok("a<break strength=\"none\"/>b"), vec![text("ab")]);
        assert_eq!(
            ok("a[pause:0s]b[pause:1s]c"),
            vec![text("ab"), ms(1000), text("c")]
        );
    }

    #[test]
    fn pause_errors_name_the_construct_start() {
        assert_eq!(err("Hi [pause:abc] x", "invalid pause \"[pause:abc]\""), 4);
        assert_eq!(err("[pause:-1s]", "negative"), 1);
        assert_eq!(err("[pause:+1s]", "expected a number"), 1);
        assert_eq!(err("a [pause:11s]", "maximum of 10s"), 3);
        assert_eq!(err("a [pause:10001ms]", "maximum"), 3);
        assert_eq!(err("a [pause:10.000000001s]", "maximum"), 3);
        assert_eq!(
            err(
                "[pause:99999999999999999999999999999999999999999s]",
                "maximum"
            ),
            1
        );
        assert_eq!(err("x [pause:1s", "missing ']'"), 3);
        assert_eq!(err("x [pause:1s\n]", "missing ']'"), 3);
        assert_eq!(err("x [pause:1s [pause:2s]", "missing ']'"), 3);
        assert_eq!(err("[pause:]", "expected a number"), 1);
        assert_eq!(err("[pause:2]", "missing unit"), 1);
        assert_eq!(err("[pause:2min]", "unknown unit \"min\""), 1);
        assert_eq!(err("[pause:1.2.3s]", "expected a number"), 1);
        assert_eq!(err("[pause:.s]", "expected a number"), 1);
        assert_eq!(err("[pause:0,5s]", "unknown unit"), 1);
        assert_eq!(err("[pause:1e3ms]", "unknown unit"), 1);
        assert_eq!(err("[pause:s]", "expected a number"), 1);
        // Only the first error is reported.
        assert_eq!(err("[pause:x] [pause:y]", "[pause:x]"), 1);
    }

    #[test]
    fn error_positions_count_characters_not_bytes() {
        assert_eq!(err("héllo ☃ [pause:x]", "invalid pause"), 9);
        assert_eq!(err("😀😀 <break time=\"x\"/>", "invalid break time"), 4);
        assert_eq!(err("日本語[tomato](/x", "missing '/)'"), 4);
        let e = parse("Grüße [pause:abc]").expect_err("invalid");
        assert_eq!(e.position, 7);
        assert_eq!(
            e.to_string(),
            "markup error at character 7: invalid pause \"[pause:abc]\": expected a number \
             and s or ms, such as 0.5s or 500ms"
        );
    }

    #[test]
    fn break_forms() {
        let cases = [
            (r#"<break time="500ms"/>"#, 500),
            (r#"<break time="1.5s"/>"#, 1500),
            ("<break time='2s' />", 2000),
            (r#"<break   time = "1s"   />"#, 1000),
            ("<break\ntime=\"1s\"/>", 1000),
            (r#"<BREAK TIME="1S"/>"#, 1000),
            (r#"<break time=" 250 ms "/>"#, 250),
            (r#"<break strength="x-weak"/>"#, 100),
            (r#"<break strength="weak"/>"#, 250),
            (r#"<break strength="medium"/>"#, 500),
            (r#"<break strength="strong"/>"#, 1000),
            (r#"<break strength="x-strong"/>"#, 2000),
            (r#"<break strength="STRONG"/>"#, 1000),
            ("<break/>", 500),
            ("<break />", 500),
            ("<Break/>", 500),
            (r#"<break strength="weak" time="3s"/>"#, 3000),
            (r#"<break time="3s" strength="weak"/>"#, 3000),
        ];
        for (input, millis) in cases {
            assert_eq!(ok(input), vec![ms(millis)], "{input:?}");
        }
        assert_eq!(
            ok("Wait<break time=\"1s\"/>, then go."),
            vec![text("Wait"), ms(1000), text(", then go.")]
        );
    }

    #[test]
    fn break_errors() {
        assert_eq!(
            err(r#"a <break foo="1"/>"#, "unknown break attribute \"foo\""),
            3
        );
        assert_eq!(
            err(r#"<break time="abc"/>"#, "invalid break time \"abc\""),
            1
        );
        assert_eq!(err(r#"<break time="-1s"/>"#, "negative"), 1);
        assert_eq!(err(r#"<break time="20s"/>"#, "maximum"), 1);
        assert_eq!(err(r#"<break time="500"/>"#, "missing unit"), 1);
        assert_eq!(
            err(
                r#"<break strength="loud"/>"#,
                "unknown break strength \"loud\""
            ),
            1
        );
        assert_eq!(err(r#"x <break time="1s""#, "missing '/>'"), 3);
        assert_eq!(err(r#"<break time="1s/>"#, "missing '/>'"), 1);
        assert_eq!(err("<break time=\"1s\n\"/>", "missing '/>'"), 1);
        assert_eq!(err("<break ", "missing '/>'"), 1);
        assert_eq!(err("<break time=", "missing '/>'"), 1);
        assert_eq!(err("<break>", "empty element"), 1);
        assert_eq!(err(r#"<break time="1s">"#, "empty element"), 1);
        assert_eq!(err("<break time=1s/>", "must be quoted"), 1);
        assert_eq!(err("<break time/>", "has no value"), 1);
        assert_eq!(err(r#"<break time="1s" time="2s"/>"#, "given twice"), 1);
        assert_eq!(err(r#"<break / >"#, "unexpected '/'"), 1);
        assert_eq!(err(r#"<break "1s"/>"#, "unexpected '\"'"), 1);
    }

    #[test]
    fn pronunciation_forms() {
        assert_eq!(
            ok("[tomato](/təˈmɑːtoʊ/)"),
            vec![ipa("tomato", "təˈmɑːtoʊ")]
        );
        assert_eq!(
            ok("I say [tomato](/təˈmeɪtoʊ/), you say [tomato](/təˈmɑːtoʊ/)."),
            vec![
                text("I say "),
                ipa("tomato", "təˈmeɪtoʊ"),
                text(", you say "),
                ipa("tomato", "təˈmɑːtoʊ"),
                text("."),
            ]
        );
        assert_eq!(
            ok("[New York](/ nuː jɔːk /)"),
            vec![ipa("New York", "nuː jɔːk")]
        );
        // The first "/)" closes it; a lone "/" inside is IPA.
        assert_eq!(ok("[x](/a/b/)"), vec![ipa("x", "a/b")]);
        // A bracket before the real one is literal.
        assert_eq!(ok("[[tomato](/x/)"), vec![text("["), ipa("tomato", "x")]);
        assert_eq!(ok("[pause:1s](/x/)"), vec![ms(1000), text("(/x/)")]);
    }

    #[test]
    fn pronunciation_errors() {
        assert_eq!(err("say [tomato](/təˈmɑːtoʊ", "missing '/)'"), 5);
        assert_eq!(err("[tomato](/təˈmɑːtoʊ)", "missing '/)'"), 1);
        assert_eq!(err("[tomato](/x\n/)", "missing '/)'"), 1);
        assert_eq!(err("[tomato](/", "missing '/)'"), 1);
        assert_eq!(err("a [](/x/)", "empty text"), 3);
        assert_eq!(err("[ ](/x/)", "empty text"), 1);
        assert_eq!(err("[x](//)", "empty IPA"), 1);
        assert_eq!(err("[x](/  /)", "empty IPA"), 1);
    }

    #[test]
    fn escapes() {
        assert_eq!(ok(r"\[pause:1s]"), vec![text("[pause:1s]")]);
        assert_eq!(
            ok(r#"\<break time="1s"/>"#),
            vec![text(r#"<break time="1s"/>"#)]
        );
        assert_eq!(ok(r"\[tomato](/x/)"), vec![text("[tomato](/x/)")]);
        assert_eq!(ok(r"a \[b"), vec![text("a [b")]);
        assert_eq!(ok(r"\<b>"), vec![text("<b>")]);
        // A backslash before anything else is kept.
        assert_eq!(ok(r"C:\path\n \] \x"), vec![text(r"C:\path\n \] \x")]);
        assert_eq!(ok("trailing \\"), vec![text("trailing \\")]);
        // The second backslash escapes the bracket; the first is kept.
        assert_eq!(ok(r"\\[pause:1s]"), vec![text(r"\[pause:1s]")]);
        assert_eq!(
            ok(r"\[pause:1s] [pause:1s]"),
            vec![text("[pause:1s] "), ms(1000)]
        );
        // An escaped bad construct is no error.
        assert_eq!(ok(r"\[pause:abc]"), vec![text("[pause:abc]")]);
        assert_eq!(ok(r"\<break>"), vec![text("<break>")]);
    }

    #[test]
    fn lexicon_file() {
        let lex = Lexicon::parse(
            "# comment\n\nNeuTTS\tnjuːtiːtiːɛs\r\n  tomato \t təˈmɑːtoʊ \n   # indented comment\n\t\n",
        )
        .expect("valid");
        assert_eq!(lex.len(), 2);
        assert!(!lex.is_empty());
        assert_eq!(
            lex.apply(vec![text("tomato NeuTTS")]),
            vec![
                ipa("tomato", "təˈmɑːtoʊ"),
                text(" "),
                ipa("NeuTTS", "njuːtiːtiːɛs")
            ]
        );
        let empty = Lexicon::parse("# nothing\n\n").expect("valid");
        assert!(empty.is_empty());
        assert_eq!(empty, Lexicon::default());
    }

    #[test]
    fn lexicon_file_errors() {
        let e = lex_err("# c\n\na\tb\nno tab here\n");
        assert_eq!(e.line, 4);
        assert!(e.message.contains("expected word<TAB>ipa"), "{e}");
        assert_eq!(
            e.to_string(),
            "lexicon line 4: expected word<TAB>ipa, found \"no tab here\""
        );

        let e = lex_err("a\tb\n\tipa\n");
        assert_eq!((e.line, e.message.as_str()), (2, "empty word"));
        let e = lex_err("word\t\n");
        assert_eq!(e.line, 1);
        assert!(e.message.contains("empty IPA for \"word\""), "{e}");
        let e = lex_err("word\t  \n");
        assert_eq!(e.line, 1);
        let e = lex_err("a\tb\nword\tipa\tnoun\n");
        assert_eq!(e.line, 2);
        assert!(e.message.contains("more than one tab"), "{e}");
        let e = lex_err("US\tjuːɛs\nx\ty\nus\tʌs\n");
        assert_eq!(e.line, 3);
        assert!(e.message.contains("line 1"), "{e}");
        let e = lex_err("New York\ta\nnew   york\tb\n");
        assert_eq!(e.line, 2);
    }

    #[test]
    fn lexicon_pairs() {
        let pairs = |v: &[(&str, &str)]| {
            Lexicon::from_pairs(v.iter().map(|&(w, i)| (w.to_string(), i.to_string())))
        };
        assert_eq!(pairs(&[]).expect("valid").len(), 0);
        assert_eq!(pairs(&[("a", "b"), ("c", "d")]).expect("valid").len(), 2);
        let e = pairs(&[("a", "b"), ("", "x")]).expect_err("empty word");
        assert_eq!((e.line, e.message.as_str()), (2, "empty word"));
        let e = pairs(&[("a", "b"), ("c", "d"), ("e", " ")]).expect_err("empty IPA");
        assert_eq!(e.line, 3);
        let e = pairs(&[("a", "x\ny")]).expect_err("control character");
        assert_eq!(e.line, 1);
        assert!(e.message.contains("control character"), "{e}");
        let e = pairs(&[("Tomato", "a"), ("TOMATO", "b")]).expect_err("duplicate");
        assert_eq!(e.line, 2);
    }

    #[test]
    fn apply_matches_whole_words_case_insensitively() {
        let lex = lexicon(&[("NeuTTS", "njuː")]);
        assert_eq!(
            lex.apply(vec![text(
                "Try neutts, or NEUTTS. Not NeuTTSair or xNeuTTS or NeuTTS2."
            )]),
            vec![
                text("Try "),
                ipa("neutts", "njuː"),
                text(", or "),
                ipa("NEUTTS", "njuː"),
                text(". Not NeuTTSair or xNeuTTS or NeuTTS2."),
            ]
        );
        // A whole segment that is the word leaves no empty Text either side.
        assert_eq!(lex.apply(vec![text("NeuTTS")]), vec![ipa("NeuTTS", "njuː")]);
        assert_eq!(
            lex.apply(vec![text("NeuTTS NeuTTS")]),
            vec![ipa("NeuTTS", "njuː"), text(" "), ipa("NeuTTS", "njuː")]
        );
        assert_eq!(
            lex.apply(vec![text("(NeuTTS)-based")]),
            vec![text("("), ipa("NeuTTS", "njuː"), text(")-based")]
        );
        assert_eq!(
            lex.apply(vec![text("snake_NeuTTS")]),
            vec![text("snake_NeuTTS")]
        );
    }

    #[test]
    fn apply_keeps_pauses_and_ipa_and_drops_empty_text() {
        let lex = lexicon(&[("tomato", "x")]);
        let input = vec![
            text("tomato"),
            ms(500),
            ipa("tomato", "given"),
            text(""),
            text(" a tomato!"),
        ];
        assert_eq!(
            lex.apply(input),
            vec![
                ipa("tomato", "x"),
                ms(500),
                ipa("tomato", "given"),
                text(" a "),
                ipa("tomato", "x"),
                text("!"),
            ]
        );
        let unchanged = vec![text("a"), ms(1), ipa("b", "c")];
        assert_eq!(Lexicon::default().apply(unchanged.clone()), unchanged);
        assert_eq!(Lexicon::default().apply(vec![text("")]), vec![]);
    }

    #[test]
    fn apply_is_unicode_aware() {
        let lex = lexicon(&[("Ärger", "ˈɛʁɡɐ"), ("cafe", "kafe"), ("Σοφία", "soˈfia")]);
        assert_eq!(
            lex.apply(vec![text("ÄRGER, ärger; Ärgernis")]),
            vec![
                ipa("ÄRGER", "ˈɛʁɡɐ"),
                text(", "),
                ipa("ärger", "ˈɛʁɡɐ"),
                text("; Ärgernis"),
            ]
        );
        // A combining accent is part of the word.
        let decomposed = "cafe\u{301} cafe";
        assert_eq!(
            lex.apply(vec![text(decomposed)]),
            vec![text("cafe\u{301} "), ipa("cafe", "kafe")]
        );
        assert_eq!(lex.apply(vec![text("ΣΟΦΊΑ")]), vec![ipa("ΣΟΦΊΑ", "soˈfia")]);
    }

    #[test]
    fn apply_apostrophes() {
        let lex = lexicon(&[("don", "dɒn"), ("don't", "doʊnt"), ("homme", "ɔm")]);
        assert_eq!(
            lex.apply(vec![text("Don’t, don, DON'T, l'homme, 'homme'")]),
            vec![
                ipa("Don’t", "doʊnt"),
                text(", "),
                ipa("don", "dɒn"),
                text(", "),
                ipa("DON'T", "doʊnt"),
                text(", l'homme, '"),
                ipa("homme", "ɔm"),
                text("'"),
            ]
        );
        let lex = lexicon(&[("don", "dɒn")]);
        assert_eq!(lex.apply(vec![text("don't")]), vec![text("don't")]);
    }

    #[test]
    fn apply_multi_word_and_punctuated_keys() {
        let lex = lexicon(&[
            ("New York", "nuː jɔːk"),
            ("new", "njuː"),
            ("New York City", "nyc"),
            ("C++", "siː plʌs plʌs"),
            ("Dr.", "dɒktə"),
        ]);
        assert_eq!(lex.max_tokens, 5);
        assert_eq!(
            lex.apply(vec![text(
                "New  York,\nnew\nyork city; New Yorker; New Jersey"
            )]),
            vec![
                ipa("New  York", "nuː jɔːk"),
                text(",\n"),
                ipa("new\nyork city", "nyc"),
                text("; "),
                ipa("New", "njuː"),
                text(" Yorker; "),
                ipa("New", "njuː"),
                text(" Jersey"),
            ]
        );
        assert_eq!(
            lex.apply(vec![text("I like c++ and Dr. Who.")]),
            vec![
                text("I like "),
                ipa("c++", "siː plʌs plʌs"),
                text(" and "),
                ipa("Dr.", "dɒktə"),
                text(" Who."),
            ]
        );
        // Whitespace never ends a match, even with a key's words split across segments.
        assert_eq!(
            lex.apply(vec![text("New "), ms(1), text("York")]),
            vec![ipa("New", "njuː"), text(" "), ms(1), text("York")]
        );
    }

    #[test]
    fn merged_prefers_the_other_lexicon() {
        let server = lexicon(&[("tomato", "server"), ("potato", "pəˈteɪtoʊ")]);
        let request = lexicon(&[("TOMATO", "request"), ("New York", "ny")]);
        let merged = server.merged(&request);
        assert_eq!(merged.len(), 3);
        assert_eq!(server.len(), 2);
        assert_eq!(
            merged.apply(vec![text("tomato potato New York")]),
            vec![
                ipa("tomato", "request"),
                text(" "),
                ipa("potato", "pəˈteɪtoʊ"),
                text(" "),
                ipa("New York", "ny"),
            ]
        );
        assert_eq!(
            request.merged(&server).apply(vec![text("tomato")]),
            vec![ipa("tomato", "server")]
        );
        assert_eq!(server.merged(&Lexicon::default()), server);
        assert_eq!(Lexicon::default().merged(&server), server);
    }

    #[test]
    fn markup_then_lexicon() {
        let lex = lexicon(&[("tomato", "lex")]);
        let segments = ok("A tomato,[pause:300ms] a [tomato](/given/) and <break/>tomato");
        assert_eq!(
            lex.apply(segments),
            vec![
                text("A "),
                ipa("tomato", "lex"),
                text(","),
                ms(300),
                text(" a "),
                ipa("tomato", "given"),
                text(" and "),
                ms(500),
                ipa("tomato", "lex"),
            ]
        );
    }
}
