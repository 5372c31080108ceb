//! Sentence and clause splitting for input too long for one prompt.
//!
//! Conservative on purpose: a missed boundary only makes a chunk longer, a wrong one changes
//! how espeak reads numbers and abbreviations ("12.5", "Dr. Smith", "e.g. this").

use super::py;

const TERMINATORS: [char; 4] = ['.', '!', '?', '…'];
const CLAUSE_MARKS: [char; 4] = [',', ';', ':', '—'];
/// Characters that close a sentence after its terminator: `"Why?" he asked.`
pub(super) const CLOSERS: [char; 8] = ['"', '\'', '\u{201d}', '\u{2019}', '»', ')', ']', '}'];
const OPENERS: [char; 10] = [
    '"', '\'', '\u{201c}', '\u{2018}', '«', '(', '[', '{', '¿', '¡',
];

/// Words that take a "." and are followed by more of the same sentence (en, de, fr, es).
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "mt", "gen", "gov", "sgt", "capt",
    "lt", "col", "rev", "hon", "fig", "figs", "vol", "approx", "dept", "est", "jan", "feb", "mar",
    "apr", "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec", "hr", "fr", "str", "ca", "bzw",
    "vgl", "evtl", "inkl", "ggf", "mme", "mlle", "sra", "srta", "dra", "ud", "uds", "av", "avda",
];
/// Abbreviations that only count as such before a number: "No. 5" but "I said no. Then".
const NUMBER_ABBREVIATIONS: &[&str] = &["no", "nos", "nr", "art", "núm", "tel"];

/// Whether the "." that ends `before` belongs to an abbreviation rather than ending a sentence.
fn is_abbreviation(before: &str, next: char) -> bool {
    let token = before
        .rsplit(py::is_space)
        .next()
        .unwrap_or("")
        .trim_start_matches(OPENERS);
    if token.is_empty() {
        return false;
    }
    // "e.g", "U.S.A", "a.m", "z.B": dotted abbreviations.
    if token.contains('.') {
        return true;
    }
    let mut chars = token.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        // An initial: "J. R. R. Tolkien".
        return c.is_alphabetic();
    }
    let lower = token.to_lowercase();
    ABBREVIATIONS.contains(&lower.as_str())
        || (next.is_ascii_digit() && NUMBER_ABBREVIATIONS.contains(&lower.as_str()))
}

fn push_trimmed(out: &mut Vec<String>, piece: &str) {
    let piece = py::strip(piece);
    if !piece.is_empty() {
        out.push(piece.to_string());
    }
}

/// Splits text into sentences after ".", "!", "?", "…" (and runs like "?!" or "...", with any
/// closing quotes or brackets) when whitespace follows and the next word does not start in
/// lower case, and at blank lines. A "." inside a token ("12.5", "2.0.1") never splits, nor one
/// after an abbreviation ("Dr.", "e.g.", "No. 5") or an initial.
pub fn split_sentences(text: &str) -> Vec<String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let n = chars.len();
    let byte = |i: usize| chars.get(i).map_or(text.len(), |&(b, _)| b);
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < n {
        let c = chars[i].1;
        if c == '\n' {
            let mut j = i + 1;
            while j < n && chars[j].1 != '\n' && py::is_space(chars[j].1) {
                j += 1;
            }
            if j < n && chars[j].1 == '\n' {
                push_trimmed(&mut out, &text[start..byte(i)]);
                start = byte(j);
                i = j + 1;
                continue;
            }
        }
        if !TERMINATORS.contains(&c) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < n && TERMINATORS.contains(&chars[j].1) {
            j += 1;
        }
        let single_dot = j == i + 1 && c == '.';
        while j < n && CLOSERS.contains(&chars[j].1) {
            j += 1;
        }
        if j == n {
            break;
        }
        if !py::is_space(chars[j].1) {
            i = j;
            continue;
        }
        let mut k = j;
        while k < n && py::is_space(chars[k].1) && chars[k].1 != '\n' {
            k += 1;
        }
        if k == n {
            break;
        }
        let next = chars[k].1;
        let keep_going =
            next.is_lowercase() || (single_dot && is_abbreviation(&text[start..byte(i)], next));
        if !keep_going && next != '\n' {
            push_trimmed(&mut out, &text[start..byte(j)]);
            start = byte(j);
        }
        i = k;
    }
    push_trimmed(&mut out, &text[start..]);
    out
}

/// Splits a sentence after ",", ";", ":" or "—" followed by whitespace (so "1,234" and "10:30"
/// stay whole), keeping each mark with the clause it ends.
pub fn split_clauses(sentence: &str) -> Vec<String> {
    let chars: Vec<(usize, char)> = sentence.char_indices().collect();
    let n = chars.len();
    let byte = |i: usize| chars.get(i).map_or(sentence.len(), |&(b, _)| b);
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < n {
        if !CLAUSE_MARKS.contains(&chars[i].1) {
            i += 1;
            continue;
        }
        let mut j = i + 1;
        while j < n && CLOSERS.contains(&chars[j].1) {
            j += 1;
        }
        if j < n && py::is_space(chars[j].1) {
            push_trimmed(&mut out, &sentence[start..byte(j)]);
            start = byte(j);
        }
        i = j;
    }
    push_trimmed(&mut out, &sentence[start..]);
    out
}

/// Text that arrives in chunks (as a language model writes it), handed out a complete sentence
/// at a time: a sentence is complete once the next one has begun, which is when
/// [`split_sentences`] ends it. The Wyoming streaming events and the WebSocket route both read
/// their text through this.
#[derive(Debug, Default)]
pub struct SentenceStream {
    pending: String,
}

impl SentenceStream {
    /// Adds `chunk` and returns the sentences it completed, in order.
    pub fn push(&mut self, chunk: &str) -> Vec<String> {
        self.pending.push_str(chunk);
        let mut sentences = split_sentences(&self.pending);
        if sentences.len() < 2 {
            return Vec::new();
        }
        let rest = sentences.pop().unwrap_or_default();
        let start = self.pending.rfind(rest.as_str()).unwrap_or(0);
        self.pending.drain(..start);
        sentences
    }

    /// The text not yet handed out.
    pub fn pending(&self) -> &str {
        &self.pending
    }

    /// Ends the stream: what is left, as the last sentence (`None` when it is only blanks).
    pub fn finish(&mut self) -> Option<String> {
        let rest = std::mem::take(&mut self.pending);
        (!rest.trim().is_empty()).then_some(rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, want: &[&str]) {
        assert_eq!(split_sentences(text), want, "{text:?}");
    }

    #[test]
    fn basic_sentences() {
        check(
            "Hello there. How are you? Fine!",
            &["Hello there.", "How are you?", "Fine!"],
        );
        check("One… Two!? Three...", &["One…", "Two!?", "Three..."]);
        check("No terminator at all", &["No terminator at all"]);
        check("   ", &[]);
        check("", &[]);
        check("Trailing spaces.   ", &["Trailing spaces."]);
    }

    #[test]
    fn numbers_and_dotted_tokens_stay_whole() {
        check(
            "It rose 12.5% to €18.50 in v2.0.1 today. Then it fell.",
            &["It rose 12.5% to €18.50 in v2.0.1 today.", "Then it fell."],
        );
        check(
            "Mail jane.doe@example.com now. Thanks.",
            &["Mail jane.doe@example.com now.", "Thanks."],
        );
        check(
            "It ended in 2023. Next year it starts again.",
            &["It ended in 2023.", "Next year it starts again."],
        );
    }

    #[test]
    fn abbreviations_and_initials() {
        check(
            "Use e.g. Paris or i.e. Lyon. Done.",
            &["Use e.g. Paris or i.e. Lyon.", "Done."],
        );
        check(
            "Dr. Smith met Mrs. Jones at 10 a.m. Monday. Good.",
            &["Dr. Smith met Mrs. Jones at 10 a.m. Monday.", "Good."],
        );
        check(
            "See No. 5 on Baker St. Then leave.",
            &["See No. 5 on Baker St. Then leave."],
        );
        check("I said no. Then I left.", &["I said no.", "Then I left."]);
        check(
            "J. R. R. Tolkien wrote it. Yes.",
            &["J. R. R. Tolkien wrote it.", "Yes."],
        );
        check(
            "Das ist z.B. Berlin. Gut.",
            &["Das ist z.B. Berlin.", "Gut."],
        );
    }

    #[test]
    fn lower_case_continuation_and_quotes() {
        check("Wait... what did you say?", &["Wait... what did you say?"]);
        check(
            "\"Why?\" he asked. \"Because!\" she said.",
            &["\"Why?\" he asked.", "\"Because!\" she said."],
        );
        check(
            "He left (finally.) Then we ate.",
            &["He left (finally.)", "Then we ate."],
        );
        check("¿Qué hora es? ¡Es tarde!", &["¿Qué hora es?", "¡Es tarde!"]);
    }

    #[test]
    fn blank_lines_split_paragraphs() {
        check(
            "First line\nsame paragraph\n\nSecond paragraph",
            &["First line\nsame paragraph", "Second paragraph"],
        );
        check("Title\n  \n\nBody. More.", &["Title", "Body.", "More."]);
    }

    #[test]
    fn clauses() {
        assert_eq!(
            split_clauses("First, second; third: fourth — fifth"),
            vec!["First,", "second;", "third:", "fourth —", "fifth"]
        );
        assert_eq!(
            split_clauses("It costs 1,234 at 10:30, ok."),
            vec!["It costs 1,234 at 10:30,", "ok."]
        );
        assert_eq!(
            split_clauses("\"Yes,\" he said"),
            vec!["\"Yes,\"", "he said"]
        );
        assert_eq!(split_clauses("no marks here"), vec!["no marks here"]);
        assert_eq!(split_clauses(" , "), vec![","]);
        assert!(split_clauses("  ").is_empty());
    }

    /// Deterministic pseudo-random strings over the characters the splitters care about.
    fn tricky_strings() -> Vec<String> {
        let alphabet: Vec<char> = "aZé5. .!?…,;:—\"'”’»)(«¿¡\n\t\u{a0}eg.Dr".chars().collect();
        let mut seed = 0x2545_f491_u64;
        (0..2000)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let len = (seed % 40) as usize;
                (0..len)
                    .map(|k| alphabet[((seed >> (k % 50)) as usize + k * 7) % alphabet.len()])
                    .collect()
            })
            .collect()
    }

    fn visible(s: &str) -> String {
        s.chars().filter(|c| !py::is_space(*c)).collect()
    }

    #[test]
    fn splitting_never_drops_or_reorders_text() {
        for s in tricky_strings() {
            let sentences = split_sentences(&s);
            assert_eq!(
                visible(&sentences.concat()),
                visible(&s),
                "{s:?} -> {sentences:?}"
            );
            for sentence in &sentences {
                assert!(
                    !sentence.is_empty() && py::strip(sentence) == sentence,
                    "{s:?}"
                );
                let clauses = split_clauses(sentence);
                assert_eq!(
                    visible(&clauses.concat()),
                    visible(sentence),
                    "{sentence:?}"
                );
            }
        }
    }

    #[test]
    fn a_sentence_goes_out_once_the_next_has_begun() {
        let mut s = SentenceStream::default();
        assert!(s.push("Hello there").is_empty());
        assert!(s.push(".").is_empty(), "the next sentence has not begun");
        assert_eq!(s.push(" How"), ["Hello there."]);
        assert_eq!(s.push(" are you? Fine"), ["How are you?"]);
        assert_eq!(s.pending(), "Fine");
        assert_eq!(s.finish().as_deref(), Some("Fine"));
        assert_eq!(s.finish(), None);
    }
}
