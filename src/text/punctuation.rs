//! phonemizer 3.4.0's `Punctuation.preserve` / `restore` for one line of text.
//!
//! The text is cut at runs of punctuation marks (with their surrounding whitespace), the pieces
//! go to espeak separately and the marks are glued back. The vendor's phonemes depend on exactly
//! where the cuts fall and how the marks are re-attached, so this follows the Python code
//! operation by operation rather than "doing the sensible thing".

use std::collections::VecDeque;
use std::ops::Range;

use super::py;

/// phonemizer's `_DEFAULT_MARKS`.
const MARKS: &str = ";:,.!?¡¿—…\"«»“”(){}[]";

/// Marks that are kept inside a number ("1,5", "12.5") when a digit is on both sides.
const DECIMAL_SEPARATORS: [char; 2] = ['.', ','];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Position {
    Begin,
    End,
    Inner,
    Alone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mark {
    pub text: String,
    pub position: Position,
}

/// How the line is cut at the marks that were found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunking {
    /// phonemizer's own `line.split(mark)`: cuts at the first occurrence of the mark's text,
    /// which for "." or "," can be a decimal separator earlier in the line ("12.5", "3,5").
    Vendor,
    /// Cuts where each mark was found: always one output item, nothing lost. Identical to
    /// `Vendor` whenever the vendor's cuts land on the marks it found.
    Exact,
}

fn is_mark(chars: &[char], i: usize) -> bool {
    let c = chars[i];
    if DECIMAL_SEPARATORS.contains(&c) {
        // `(?<![0-9])[.,]|[.,](?![0-9])`: only ASCII digits count, as in the Python regex.
        let digit_before = i > 0 && chars[i - 1].is_ascii_digit();
        let digit_after = chars.get(i + 1).is_some_and(char::is_ascii_digit);
        !(digit_before && digit_after)
    } else {
        MARKS.contains(c)
    }
}

/// Byte ranges of the matches of phonemizer's `(\s*(?:marks)+\s*)+`.
///
/// The greedy pattern always matches a maximal run of whitespace-or-mark characters that holds
/// at least one mark, which is what this computes without a regex engine.
fn find_marks(line: &str) -> Vec<Range<usize>> {
    let chars: Vec<char> = line.chars().collect();
    let mut offsets: Vec<usize> = line.char_indices().map(|(o, _)| o).collect();
    offsets.push(line.len());

    let mut runs = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let mark = is_mark(&chars, i);
        if !(mark || py::is_space(chars[i])) {
            i += 1;
            continue;
        }
        let start = i;
        let mut has_mark = false;
        while i < chars.len() {
            let m = is_mark(&chars, i);
            if !(m || py::is_space(chars[i])) {
                break;
            }
            has_mark |= m;
            i += 1;
        }
        if has_mark {
            runs.push(offsets[start]..offsets[i]);
        }
    }
    runs
}

/// `Punctuation.preserve([line])`: the non-empty pieces to phonemize and the marks to restore.
pub(crate) fn preserve(line: &str, chunking: Chunking) -> (Vec<String>, Vec<Mark>) {
    let runs = find_marks(line);
    if runs.is_empty() {
        let pieces = if line.is_empty() {
            Vec::new()
        } else {
            vec![line.to_string()]
        };
        return (pieces, Vec::new());
    }
    if runs.len() == 1 && runs[0] == (0..line.len()) {
        let mark = Mark {
            text: line.to_string(),
            position: Position::Alone,
        };
        return (Vec::new(), vec![mark]);
    }

    // phonemizer tests `line.startswith(mark)` / `line.endswith(mark)`; for maximal runs that is
    // the same as the run touching the start / end of the line.
    let last = runs.len() - 1;
    let marks: Vec<Mark> = runs
        .iter()
        .enumerate()
        .map(|(k, r)| {
            let position = if k == 0 && r.start == 0 {
                Position::Begin
            } else if k == last && r.end == line.len() {
                Position::End
            } else {
                Position::Inner
            };
            Mark {
                text: line[r.clone()].to_string(),
                position,
            }
        })
        .collect();

    let mut pieces = Vec::with_capacity(marks.len() + 1);
    match chunking {
        Chunking::Vendor => {
            let mut rest = line;
            for mark in &marks {
                match rest.find(mark.text.as_str()) {
                    Some(at) => {
                        pieces.push(&rest[..at]);
                        rest = &rest[at + mark.text.len()..];
                    }
                    None => {
                        // Python: split -> [rest], prefix = rest, suffix = "".join([]) == "".
                        pieces.push(rest);
                        rest = "";
                    }
                }
            }
            pieces.push(rest);
        }
        Chunking::Exact => {
            let mut from = 0;
            for r in &runs {
                pieces.push(&line[from..r.start]);
                from = r.end;
            }
            pieces.push(&line[from..]);
        }
    }
    let pieces = pieces
        .into_iter()
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    (pieces, marks)
}

/// `Punctuation.restore(text, marks, Separator(word=' '), strip=False)` for a single input line
/// (every mark has line index 0).
pub(crate) fn restore(phonemized: Vec<String>, marks: Vec<Mark>) -> Vec<String> {
    let mut text: VecDeque<String> = phonemized.into();
    let mut marks: VecDeque<Mark> = marks.into();
    let mut out = Vec::new();
    let mut pos = 0usize;

    loop {
        if marks.is_empty() {
            for mut line in text.drain(..) {
                if !line.ends_with(' ') {
                    line.push(' ');
                }
                out.push(line);
            }
            break;
        }
        if text.is_empty() {
            out.push(marks.drain(..).map(|m| m.text).collect());
            break;
        }
        if pos != 0 {
            // Once a mark has closed the first output item, phonemizer's line counter no longer
            // matches the marks' index: the remaining pieces become separate items.
            if let Some(line) = text.pop_front() {
                out.push(line);
            }
            pos += 1;
            continue;
        }
        let Some(mark) = marks.pop_front() else {
            continue;
        };
        let pieces_left = text.len();
        let Some(first) = text.front_mut() else {
            continue;
        };
        if first.ends_with(' ') {
            first.pop();
        }
        match mark.position {
            Position::Begin => first.insert_str(0, &mark.text),
            Position::End => {
                let mut line = std::mem::take(first);
                text.pop_front();
                line.push_str(&mark.text);
                if !mark.text.ends_with(' ') {
                    line.push(' ');
                }
                out.push(line);
                pos += 1;
            }
            Position::Alone => {
                let mut line = mark.text;
                if !line.ends_with(' ') {
                    line.push(' ');
                }
                out.push(line);
                pos += 1;
            }
            Position::Inner => {
                if pieces_left == 1 {
                    first.push_str(&mark.text);
                } else {
                    let mut joined = std::mem::take(first);
                    text.pop_front();
                    if let Some(next) = text.front_mut() {
                        joined.push_str(&mark.text);
                        joined.push_str(next);
                        *next = joined;
                    }
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs preserve -> fake phonemizer (uppercase + word separator) -> restore, as phonemizer does.
    fn roundtrip(
        line: &str,
        chunking: Chunking,
    ) -> (Vec<String>, Vec<(String, Position)>, Vec<String>) {
        let (pieces, marks) = preserve(line, chunking);
        let listed = marks.iter().map(|m| (m.text.clone(), m.position)).collect();
        let phonemized = pieces
            .iter()
            .map(|p| format!("{} ", p.to_uppercase()))
            .collect();
        (pieces, listed, restore(phonemized, marks))
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    /// (line, pieces, marks, restored)
    type Case<'a> = (
        &'a str,
        &'a [&'a str],
        &'a [(&'a str, Position)],
        &'a [&'a str],
    );

    // Expected values come from running phonemizer 3.4.0's Punctuation on the same inputs.
    #[test]
    fn matches_phonemizer_punctuation() {
        use Position::*;
        let cases: &[Case] = &[
            (
                "Hello, world!",
                &["Hello", "world"],
                &[(", ", Inner), ("!", End)],
                &["HELLO, WORLD! "],
            ),
            (
                "\"Why?\" he asked. \"Because!\"",
                &["Why", "he asked", "Because"],
                &[
                    ("\"", Begin),
                    ("?\" ", Inner),
                    (". \"", Inner),
                    ("!\"", End),
                ],
                &["\"WHY?\" HE ASKED. \"BECAUSE!\" "],
            ),
            ("...", &[], &[("...", Alone)], &["..."]),
            ("  hello  ", &["  hello  "], &[], &["  HELLO   "]),
            (
                "x , y ; z",
                &["x", "y", "z"],
                &[(" , ", Inner), (" ; ", Inner)],
                &["X , Y ; Z "],
            ),
            (
                "(a) [b] {c}",
                &["a", "b", "c"],
                &[("(", Begin), (") [", Inner), ("] {", Inner), ("}", End)],
                &["(A) [B] {C} "],
            ),
            (
                "one,two 1,5 three.",
                &["one", "two 1,5 three"],
                &[(",", Inner), (".", End)],
                &["ONE,TWO 1,5 THREE. "],
            ),
            (
                "¿Qué? ¡Sí!",
                &["Qué", "Sí"],
                &[("¿", Begin), ("? ¡", Inner), ("!", End)],
                &["¿QUÉ? ¡SÍ! "],
            ),
            (".5 start", &["5 start"], &[(".", Begin)], &[".5 START "]),
            (
                "a 1.5. b",
                &["a 1.5", "b"],
                &[(". ", Inner)],
                &["A 1.5. B "],
            ),
            (
                "a — b … c « d »",
                &["a", "b", "c", "d"],
                &[(" — ", Inner), (" … ", Inner), (" « ", Inner), (" »", End)],
                &["A — B … C « D » "],
            ),
            (
                "a ,1.5,b",
                &["a", "1.5", "b"],
                &[(" ,", Inner), (",", Inner)],
                &["A ,1.5,B "],
            ),
        ];
        for &(line, pieces, marks, restored) in cases {
            for chunking in [Chunking::Vendor, Chunking::Exact] {
                let (p, m, r) = roundtrip(line, chunking);
                assert_eq!(p, s(pieces), "{line:?} pieces");
                let want: Vec<(String, Position)> =
                    marks.iter().map(|(t, p)| (t.to_string(), *p)).collect();
                assert_eq!(m, want, "{line:?} marks");
                assert_eq!(r, s(restored), "{line:?} restored");
            }
        }
    }

    #[test]
    fn vendor_cut_at_decimal_point_is_reproduced() {
        let (p, _, r) = roundtrip("a 12.5 b, c 1.5 d.", Chunking::Vendor);
        assert_eq!(p, s(&["a 12.5 b", "c 1", "5 d."]));
        assert_eq!(r, s(&["A 12.5 B, C 1. ", "5 D. "]));
        let (p, _, r) = roundtrip("Version 2.0.1 fixes v1.9.", Chunking::Vendor);
        assert_eq!(p, s(&["Version 2", "0.1 fixes v1.9."]));
        assert_eq!(r, s(&["VERSION 2. ", "0.1 FIXES V1.9. "]));
        let (p, _, r) = roundtrip("x 3,5,y", Chunking::Vendor);
        assert_eq!(p, s(&["x 3", "5,y"]));
        assert_eq!(r, s(&["X 3,5,Y "]));
    }

    #[test]
    fn exact_cut_keeps_the_whole_line_in_one_item() {
        let (p, _, r) = roundtrip("a 12.5 b, c 1.5 d.", Chunking::Exact);
        assert_eq!(p, s(&["a 12.5 b", "c 1.5 d"]));
        assert_eq!(r, s(&["A 12.5 B, C 1.5 D. "]));
        let (_, _, r) = roundtrip("Version 2.0.1 fixes v1.9.", Chunking::Exact);
        assert_eq!(r, s(&["VERSION 2.0.1 FIXES V1.9. "]));
        let (p, _, r) = roundtrip("x 3,5,y", Chunking::Exact);
        assert_eq!(p, s(&["x 3,5", "y"]));
        assert_eq!(r, s(&["X 3,5,Y "]));
    }

    #[test]
    fn empty_and_mark_free_lines() {
        assert_eq!(preserve("", Chunking::Exact), (Vec::new(), Vec::new()));
        let (p, m) = preserve("plain words", Chunking::Exact);
        assert_eq!(p, s(&["plain words"]));
        assert!(m.is_empty());
        assert_eq!(restore(Vec::new(), Vec::new()), Vec::<String>::new());
    }

    #[test]
    fn whitespace_only_runs_are_not_marks() {
        assert!(find_marks("a   b").is_empty());
        assert_eq!(find_marks("a \u{1c}, b"), vec![1..5]);
    }

    #[test]
    fn exact_cut_loses_nothing() {
        let alphabet: Vec<char> = "ab1 .,;!?\"()…—«»¿¡\t".chars().collect();
        let mut seed = 0x9e37_79b9_u64;
        for _ in 0..3000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let line: String = (0..(seed % 24) as usize)
                .map(|k| alphabet[((seed >> (k % 40)) as usize + 3 * k) % alphabet.len()])
                .collect();
            let (pieces, marks) = preserve(&line, Chunking::Exact);
            let total: usize = pieces
                .iter()
                .chain(marks.iter().map(|m| &m.text))
                .map(String::len)
                .sum();
            assert_eq!(total, line.len(), "{line:?}");
            let restored = restore(pieces.iter().map(|p| format!("{p} ")).collect(), marks);
            assert!(restored.len() <= 1, "{line:?} -> {restored:?}");
        }
    }
}
