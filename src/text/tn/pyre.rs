//! Python `re` semantics over fancy_regex, for the language hooks (`en.rs` … `es.rs`).
//!
//! damga's regex steps are written for Python's `re`, and its grammars were built against what
//! those patterns leave. fancy_regex (the regex crate's syntax plus look-around) reads them almost
//! the same, but a few classes differ: Python's `\w` is `str.isalnum()` or `_` (letters and every
//! kind of number, `²` and `½` included, but no combining marks, which Rust's `\w` takes), so `\W`
//! and `\b` differ with it; Python's `\s` is `str.isspace()`, which also takes U+001C..U+001F, and
//! `\S` differs with it. `\d` is the same in both (Unicode decimal digits). So each pattern is kept
//! as Python wrote it and compiled in two flavours ([`PyRegex`]): with Python's classes spelled out
//! ([`py`]) for a text that holds a character where the two disagree ([`needs_python_classes`]),
//! and with Rust's own classes for every other text, where they mean the same and run several
//! times faster (a spelled-out `\b` is a look-around, which fancy-regex runs in its backtracking VM).
//!
//! Matching follows Python too: [`sub`] and [`split`] step through the text as `re.sub` and
//! `re.split` do (empty matches included, where the regex crate's iterators differ), and the few
//! `str` methods the hooks call ([`py_isspace`], [`py_strip`], [`py_isupper`], [`py_int`]) are here
//! with Python's meaning.
//!
//! Not modelled, since no hook meets it: Python's `$` also matches before a final newline (the text
//! reaching the hooks has had its whitespace runs turned into single spaces), and Python's `(?i)`
//! folds a few characters more than simple case folding.

use std::ops::Deref;
use std::sync::{LazyLock, OnceLock};

use fancy_regex::{Captures, Regex};

/// Python's `\w` in a class: what `str.isalnum()` takes, and `_`.
const PY_WORD: &str = r"\p{L}\p{N}_";

/// Python's `\s` in a class: `str.isspace()`, which also takes U+001C..U+001F.
const PY_SPACE: &str = r"\s\x1c-\x1f";

/// A Python `re` pattern in fancy-regex syntax with Python's `\w \W \s \S \b \B` spelled out.
pub(super) fn py(pattern: &str) -> String {
    translate(pattern, true)
}

/// A Python `re` pattern in fancy-regex syntax. Where the two syntaxes differ, the pattern is
/// rewritten to mean what Python reads (in a class `[` is a literal, not a nested class, a `]`
/// right after the opening is a literal, `\b` is a backspace, `&` and `~` are literals, not set
/// operators; `\Z` is the end of the text). With `python_classes`, the class escapes get Python's
/// meaning too; without, they keep Rust's.
fn translate(pattern: &str, python_classes: bool) -> String {
    let word = format!("[{PY_WORD}]");
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut in_class = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let Some(e) = chars.next() else {
                    out.push('\\');
                    break;
                };
                match (e, in_class) {
                    ('Z', false) => out.push_str(r"\z"),
                    ('b', true) => out.push_str(r"\x08"),
                    ('w', false) if python_classes => out.push_str(&word),
                    ('w', true) if python_classes => out.push_str(PY_WORD),
                    ('W', _) if python_classes => out.push_str(&format!("[^{PY_WORD}]")),
                    ('s', false) if python_classes => out.push_str(&format!("[{PY_SPACE}]")),
                    ('s', true) if python_classes => out.push_str(PY_SPACE),
                    ('S', _) if python_classes => out.push_str(&format!("[^{PY_SPACE}]")),
                    ('b', false) if python_classes => {
                        out.push_str(&format!("(?:(?<={word})(?!{word})|(?<!{word})(?={word}))"))
                    }
                    ('B', false) if python_classes => {
                        out.push_str(&format!("(?:(?<={word})(?={word})|(?<!{word})(?!{word}))"))
                    }
                    _ => {
                        out.push('\\');
                        out.push(e);
                    }
                }
            }
            '[' if !in_class => {
                in_class = true;
                out.push('[');
                if chars.next_if_eq(&'^').is_some() {
                    out.push('^');
                }
                if chars.next_if_eq(&']').is_some() {
                    out.push_str(r"\]");
                }
            }
            '[' | '&' | '~' if in_class => {
                out.push('\\');
                out.push(c);
            }
            ']' if in_class => {
                in_class = false;
                out.push(']');
            }
            _ => out.push(c),
        }
    }
    out
}

/// A compiled pattern, Python's `re.Pattern`: the regex (which it derefs to), and the twin that
/// [`sub`] and [`split`] search with right after an empty match, compiled when first needed.
pub(super) struct Pattern {
    regex: Regex,
    advance: OnceLock<Option<Regex>>,
}

impl Deref for Pattern {
    type Target = Regex;

    fn deref(&self) -> &Regex {
        &self.regex
    }
}

impl Pattern {
    /// Python's search right after an empty match (its `must_advance`): a match that starts where
    /// the search does and takes at least one character, the pattern backtracking for one if its
    /// first choice there is empty; where there is none, an empty match there (`\G`: where the
    /// search starts), so that the search stops there rather than trying every later place.
    fn advance(&self) -> Option<&Regex> {
        self.advance
            .get_or_init(|| Regex::new(&format!(r"\G(?:{})(?!\G)|\G", self.regex.as_str())).ok())
            .as_ref()
    }
}

/// Compiles a constant pattern as written (fancy-regex syntax, Rust's classes).
pub(super) fn re(pattern: &str) -> Pattern {
    Pattern {
        regex: Regex::new(pattern).expect("constant pattern"),
        advance: OnceLock::new(),
    }
}

/// Characters on which Python's `\w` or `\s` and Rust's disagree: combining marks and other
/// joiners (word characters in Rust only), `²`, `½` and other non-decimal numbers (in Python
/// only), U+001C..U+001F (spaces in Python only).
static PY_DIFFERS: LazyLock<regex::Regex> = LazyLock::new(|| {
    regex::Regex::new(r"[[\w--[\p{L}\p{N}_]][[\p{L}\p{N}_]--\w]\x1c-\x1f]")
        .expect("constant pattern")
});

/// Whether `text` needs a pattern with Python's classes spelled out; on any other text Rust's
/// classes mean the same.
pub(super) fn needs_python_classes(text: &str) -> bool {
    PY_DIFFERS.is_match(text)
}

/// One of damga's patterns (or ours, written the same way), compiled on first use in the flavour
/// a text needs.
pub(super) struct PyRegex {
    pattern: fn() -> String,
    rust: OnceLock<Pattern>,
    python: OnceLock<Pattern>,
}

impl PyRegex {
    pub(super) const fn new(pattern: fn() -> String) -> Self {
        Self {
            pattern,
            rust: OnceLock::new(),
            python: OnceLock::new(),
        }
    }

    /// The pattern with Python's classes spelled out (`python`) or with Rust's.
    pub(super) fn get(&self, python: bool) -> &Pattern {
        let cell = if python { &self.python } else { &self.rust };
        cell.get_or_init(|| {
            let pattern = (self.pattern)();
            re(&if python {
                py(&pattern)
            } else {
                translate(&pattern, false)
            })
        })
    }

    /// The pattern in the flavour that reads `text` as Python does.
    pub(super) fn for_text(&self, text: &str) -> &Pattern {
        self.get(needs_python_classes(text))
    }
}

/// Python's search loop (`re.sub`, `re.split`): leftmost matches from left to right; after an
/// empty match the next one must take a character where that one was, or start after it, so an
/// empty match is taken right after a non-empty one (the regex crate's iterators skip it) but never
/// twice at one place. `f` gets each match's span and groups; `None` where the matcher gave up
/// (fancy-regex's backtrack limit).
fn each_match<'t>(
    pattern: &Pattern,
    text: &'t str,
    mut f: impl FnMut(usize, usize, &Captures<'t>),
) -> Option<()> {
    let mut pos = 0;
    let mut after_empty = false;
    while pos <= text.len() {
        let mut found = None;
        if after_empty {
            if let Some(advance) = pattern.advance() {
                found = advance
                    .captures_from_pos(text, pos)
                    .ok()?
                    .filter(|caps| caps.get(0).is_some_and(|m| m.end() > pos));
            }
            if found.is_none() {
                match text[pos..].chars().next() {
                    Some(c) => pos += c.len_utf8(),
                    None => break,
                }
            }
        }
        let caps = match found {
            Some(caps) => caps,
            None => match pattern.captures_from_pos(text, pos).ok()? {
                Some(caps) => caps,
                None => break,
            },
        };
        let Some((start, end)) = caps.get(0).map(|m| (m.start(), m.end())) else {
            break;
        };
        f(start, end, &caps);
        pos = end;
        after_empty = start == end;
    }
    Some(())
}

/// Python's `re.sub` with a function. Where the matcher gives up (fancy-regex's backtrack limit),
/// the text is left as it was.
pub(super) fn sub(
    pattern: &Pattern,
    text: &str,
    mut rep: impl FnMut(&Captures) -> String,
) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut last = 0;
    let done = each_match(pattern, text, |start, end, caps| {
        out.push_str(&text[last..start]);
        out.push_str(&rep(caps));
        last = end;
    });
    if done.is_none() {
        tracing::debug!("normaliser: a regex step gave up (backtrack limit); text left as it was");
        return text.to_owned();
    }
    out.push_str(&text[last..]);
    out
}

/// Python's `re.split`: the text between matches, each match's groups between them (a group that
/// took no part as ""). Where the matcher gives up, the text stays in one piece.
pub(super) fn split<'t>(pattern: &Pattern, text: &'t str) -> Vec<&'t str> {
    let mut pieces = Vec::new();
    let mut last = 0;
    let done = each_match(pattern, text, |start, end, caps| {
        pieces.push(&text[last..start]);
        pieces.extend((1..caps.len()).map(|i| group(caps, i)));
        last = end;
    });
    if done.is_none() {
        return vec![text];
    }
    pieces.push(&text[last..]);
    pieces
}

/// Python's `m.group(i)`, with a group that took no part as "".
pub(super) fn group<'t>(caps: &Captures<'t>, i: usize) -> &'t str {
    caps.get(i).map_or("", |m| m.as_str())
}

/// Python's `m.start()`: where the match begins in the text.
pub(super) fn match_start(caps: &Captures) -> usize {
    caps.get(0).map_or(0, |m| m.start())
}

/// Python's `str.isspace()` for one character.
pub(super) fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python's `str.strip()`.
pub(super) fn py_strip(s: &str) -> &str {
    s.trim_matches(py_isspace)
}

/// Python's `str.isupper()`: some cased character, and none lower or title case.
pub(super) fn py_isupper(s: &str) -> bool {
    let titlecase = |c: char| {
        matches!(
            c,
            '\u{1c5}' | '\u{1c8}' | '\u{1cb}' | '\u{1f2}' | '\u{1fbc}' | '\u{1fcc}' | '\u{1ffc}'
        ) || matches!(c, '\u{1f88}'..='\u{1f8f}' | '\u{1f98}'..='\u{1f9f}' | '\u{1fa8}'..='\u{1faf}')
    };
    let mut cased = false;
    for c in s.chars() {
        if c.is_lowercase() || titlecase(c) {
            return false;
        }
        cased |= c.is_uppercase();
    }
    cased
}

/// Python's `int()` on a run of `\d` digits of any script (no sign, spaces or `_`); `None` where
/// Python raises. Each script's digits run 0–9 in a row, so a digit's value is its distance from
/// the start of its run, modulo 10 (runs of 10 can follow each other, as the mathematical digits
/// do).
pub(super) fn py_int(s: &str) -> Option<u64> {
    static DIGIT: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r"^\d$").expect("constant pattern"));
    let is_digit = |c: char| DIGIT.is_match(c.encode_utf8(&mut [0; 4]));
    if s.is_empty() {
        return None;
    }
    s.chars().try_fold(0u64, |n, c| {
        let value = match c.to_digit(10) {
            Some(v) => u64::from(v),
            None if is_digit(c) => {
                let mut start = u32::from(c);
                while char::from_u32(start.wrapping_sub(1)).is_some_and(is_digit) {
                    start -= 1;
                }
                u64::from((u32::from(c) - start) % 10)
            }
            None => return None,
        };
        n.checked_mul(10)?.checked_add(value)
    })
}

// Small helpers more than one language's hooks share.

/// The value of a Roman numeral, in either case, as damga's `roman_value` (en) and `_roman` (es)
/// reckon it: a numeral right before a larger one is taken away, so any run of numerals has a
/// value ("IIX" is 10, "IVX" 4). A letter that is no numeral counts 0; damga's patterns pass none.
pub(super) fn roman(numeral: &str) -> i64 {
    let values: Vec<i64> = numeral
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            'i' => 1,
            'v' => 5,
            'x' => 10,
            'l' => 50,
            'c' => 100,
            'd' => 500,
            'm' => 1000,
            _ => 0,
        })
        .collect();
    values
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if values.get(i + 1).is_some_and(|&next| v < next) {
                -v
            } else {
                v
            }
        })
        .sum()
}

/// The first column of a damga table such as `units.tsv` (the written form): damga's
/// `line.split("\t")[0]` for every line that is neither empty nor a `#` comment.
pub(super) fn tsv_first_column(tsv: &str) -> impl Iterator<Item = &str> {
    tsv.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| line.split('\t').next().unwrap_or(line))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub_all(pattern: &str, text: &str, with: &str) -> String {
        sub(&re(&py(pattern)), text, |_| with.to_owned())
    }

    #[test]
    fn sub_takes_an_empty_match_right_after_a_match() {
        // Python: re.sub("x*", "-", "abxd") == "-a-b--d-"; the regex crate gives "-a-b-d-".
        assert_eq!(sub_all("x*", "abxd", "-"), "-a-b--d-");
        assert_eq!(sub_all("", "ab", "-"), "-a-b-");
        assert_eq!(sub_all(r"(?<=a)-?(?=\d)", "a1 a-2", " "), "a 1 a 2");
        // re.sub(r"\b", "|", "ab cd") == "|ab| |cd|"
        assert_eq!(sub_all(r"\b", "ab cd", "|"), "|ab| |cd|");
        // After an empty match Python takes a non-empty one at the same place:
        // re.sub("|a", "-", "a") == "---", re.sub(r"^|\w+", "[\g<0>]", "two words") == "[][two] [words]"
        assert_eq!(sub_all("|a", "a", "-"), "---");
        let bracket = |pattern: &str, text: &str| {
            sub(&re(&py(pattern)), text, |c| format!("[{}]", group(c, 0)))
        };
        assert_eq!(bracket(r"^|\w+", "two words"), "[][two] [words]");
        assert_eq!(bracket("x*|b", "abxb"), "[]a[][b][x][][b][]");
        assert_eq!(bracket(r"(?i)|A", "a"), "[][a][]");
        // a match error leaves the text as it was
        let runaway = re(r"(a+)+\1b");
        assert!(runaway.is_match(&"a".repeat(64)).is_err());
        assert_eq!(
            sub(&runaway, &"a".repeat(64), |_| "x".into()),
            "a".repeat(64)
        );
    }

    #[test]
    fn split_is_pythons() {
        let ws = re(&py(r"(\s+)"));
        assert_eq!(split(&ws, "a  b"), ["a", "  ", "b"]);
        assert_eq!(split(&re(r"\d"), "a1b2"), ["a", "b", ""]);
        // re.split(r"\b|:+", "a:b") == ['', 'a', '', '', 'b', '']
        assert_eq!(split(&re(&py(r"\b|:+")), "a:b"), ["", "a", "", "", "b", ""]);
        // re.split("(a)|(b)", "xbz") == ['x', None, 'b', 'z']
        assert_eq!(split(&re("(a)|(b)"), "xbz"), ["x", "", "b", "z"]);
    }

    #[test]
    fn boundary_next_to_superscripts_and_combining_marks() {
        // "²" is a word character in Python ("km²" is one word), a combining mark is not.
        let at_end = re(&py(r"km\b"));
        assert!(!at_end.is_match("5 km²").unwrap_or(true));
        assert!(re(r"km\b").is_match("5 km²").unwrap_or(false));
        let before = re(&py(r"\bB"));
        assert!(before.is_match("q\u{308}B").unwrap_or(false));
        assert!(!re(r"\bB").is_match("q\u{308}B").unwrap_or(true));
        assert!(
            re(&py(r"\w+"))
                .find("a\u{308}")
                .ok()
                .flatten()
                .map(|m| m.as_str())
                == Some("a")
        );
        assert!(re(&py(r"q\B²")).is_match("q²").unwrap_or(false));
        assert!(!re(r"q\B²").is_match("q²").unwrap_or(true));
        // "½" is a word character that is no decimal digit
        assert!(re(&py(r"^[^\W\d_]")).is_match("½").unwrap_or(false));
        assert!(!re(&py(r"[^\W\d_]")).is_match("_\u{308}٣").unwrap_or(true));
    }

    #[test]
    fn separators_are_spaces() {
        for c in '\u{1c}'..='\u{1f}' {
            let text = format!("a{c}b");
            assert!(re(&py(r"a\sb")).is_match(&text).unwrap_or(false));
            assert!(re(&py(r"a[\s]b")).is_match(&text).unwrap_or(false));
            assert!(!re(&py(r"a\Sb")).is_match(&text).unwrap_or(true));
            assert!(py_isspace(c) && needs_python_classes(&text));
        }
        assert_eq!(py_strip("\u{1c} x \u{1f}\u{85}"), "x");
        assert!(!py_isspace('\u{200b}') && !py_isspace('\u{feff}'));
    }

    #[test]
    fn class_syntax_is_pythons() {
        // a "[" in a Python class is a literal, as are a leading "]", "&&" and "~~"
        assert!(re(&py(r"[[x]")).is_match("[").unwrap_or(false));
        assert!(re(&py(r"[]x]")).is_match("]").unwrap_or(false));
        assert!(re(&py(r"[^]x]")).is_match("y").unwrap_or(false));
        assert!(re(&py(r"[a&&b]")).is_match("&").unwrap_or(false));
        assert!(re(&py(r"[a~~b]")).is_match("~").unwrap_or(false));
        // \b in a class is a backspace, \Z the end of the text
        assert!(re(&py(r"[\b]")).is_match("\u{8}").unwrap_or(false));
        assert!(re(&py(r"a\Z")).is_match("ba").unwrap_or(false));
        // Rust's flavour fixes the syntax only
        let plain = r"(?<![\w.,$€£])(1\d{3}|20\d{2})(?= (?:people)\b)\s\S\W[^\W\d]";
        assert_eq!(translate(plain, false), plain);
    }

    #[test]
    fn flavours_agree_where_the_classes_do() {
        static P: PyRegex = PyRegex::new(|| r"\b\w+\b|\s\S".into());
        for text in ["Café naïve 5 km ٣٤ x_y", "a\tb—c"] {
            assert!(!needs_python_classes(text));
            let found = |python| {
                P.get(python)
                    .find_iter(text)
                    .map(|m| m.map(|m| m.range()).ok())
                    .collect::<Vec<_>>()
            };
            assert_eq!(found(true), found(false), "{text:?}");
        }
        assert!(std::ptr::eq(P.for_text("5 km²"), P.get(true)));
        assert!(std::ptr::eq(P.for_text("5 km2"), P.get(false)));
    }

    #[test]
    fn int_reads_any_decimal_digits() {
        assert_eq!(py_int("0305"), Some(305));
        assert_eq!(py_int("٢٠٠٨"), Some(2008));
        assert_eq!(py_int("१२"), Some(12));
        // mathematical digits: five runs of ten in a row
        assert_eq!(py_int("𝟗𝟘𝟭𝟮𝟿"), Some(90129));
        assert_eq!(py_int("1٢1"), Some(121));
        // int() refuses these: no digits, a superscript (a number, not a decimal digit), a letter
        assert_eq!(py_int(""), None);
        assert_eq!(py_int("2²"), None);
        assert_eq!(py_int("½"), None);
        assert_eq!(py_int("1a"), None);
        assert_eq!(py_int("99999999999999999999"), None);
    }

    #[test]
    fn str_methods_are_pythons() {
        assert!(py_isupper("ÁRBOLES") && py_isupper("A1") && py_isupper("ǄEMAL"));
        assert!(!py_isupper("ǅEMAL") && !py_isupper("12") && !py_isupper("") && !py_isupper("Ab"));
    }

    #[test]
    fn roman_numerals() {
        for (numeral, value) in [
            ("I", 1),
            ("IV", 4),
            ("VIII", 8),
            ("XIV", 14),
            ("xix", 19),
            ("XL", 40),
            ("XC", 90),
            ("MCMXC", 1990),
            ("IIX", 10),
            ("IVXLC", 34),
        ] {
            assert_eq!(roman(numeral), value, "{numeral}");
        }
    }

    #[test]
    fn tsv_first_column_skips_comments_and_blank_lines() {
        let tsv = "# written\tspoken\n\nkm\tkilometre\nm²\tsquare metre\nh\n";
        assert_eq!(tsv_first_column(tsv).collect::<Vec<_>>(), ["km", "m²", "h"]);
    }
}
