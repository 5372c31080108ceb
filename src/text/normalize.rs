//! Input clean-up before phonemization or BPE tokenisation.

use unicode_normalization::UnicodeNormalization;

use super::TextError;
use super::py;

/// The vendor's `_QUOTE_MAP`: curly single and double quotes to straight ones.
fn map_quote(c: char) -> char {
    match c {
        '\u{2018}' | '\u{2019}' => '\'',
        '\u{201c}' | '\u{201d}' => '"',
        c => c,
    }
}

/// Invisible format characters: espeak either ignores or misreads them, and they break words
/// apart for no audible reason.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{2069}' | '\u{feff}'
    )
}

/// Folds every whitespace run to one space, drops control and invisible format characters, and
/// trims: what the vendor lacks. Quotes stay as written, since the vendor's phoneme path feeds
/// curly quotes to the phonemizer unchanged (the prompt goldens carry them).
///
/// Fails with [`TextError::NothingSpeakable`] when no letter or digit is left.
pub fn normalize(text: &str) -> Result<String, TextError> {
    let mut out = String::with_capacity(text.len());
    let mut pending_space = false;
    for c in text.chars() {
        if py::is_space(c) || c.is_whitespace() {
            pending_space = true;
            continue;
        }
        if c.is_control() || is_invisible(c) {
            continue;
        }
        if pending_space && !out.is_empty() {
            out.push(' ');
        }
        pending_space = false;
        out.push(c);
    }
    if !out.chars().any(char::is_alphanumeric) {
        return Err(TextError::NothingSpeakable);
    }
    Ok(out)
}

/// The vendor's BPE input format: curly quotes to straight ones, NFKC, then [`normalize`].
pub fn normalize_bpe(text: &str) -> Result<String, TextError> {
    // The vendor maps quotes before NFKC; the clean-up after it catches whitespace and control
    // characters that compatibility decomposition can produce (e.g. U+2002 EN SPACE).
    let nfkc: String = text.chars().map(map_quote).nfkc().collect();
    normalize(&nfkc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn curly_quotes_become_straight() {
        assert_eq!(
            normalize_bpe("\u{201c}Don\u{2019}t,\u{201d} she said, \u{2018}really\u{2019}.")
                .unwrap(),
            "\"Don't,\" she said, 'really'."
        );
        // Only those four: low-9 quotes and guillemets are not part of the vendor's map.
        assert_eq!(
            normalize_bpe("«Salut» „Hallo“ ‚ja‘").unwrap(),
            "«Salut» „Hallo\" ‚ja'"
        );
        // The phoneme path keeps them, as the vendor does.
        assert_eq!(
            normalize("\u{201c}Hi\u{201d}").unwrap(),
            "\u{201c}Hi\u{201d}"
        );
    }

    #[test]
    fn whitespace_folds_and_trims() {
        assert_eq!(
            normalize("  Hello,\t\tworld!\r\n\n How\u{a0}are\u{3000}you?  ").unwrap(),
            "Hello, world! How are you?"
        );
        assert_eq!(normalize("a\u{1c}b").unwrap(), "a b");
        assert_eq!(normalize("a \u{7} b").unwrap(), "a b");
    }

    #[test]
    fn control_and_invisible_characters_are_dropped() {
        assert_eq!(
            normalize("\u{feff}Hel\u{0}lo\u{7f} wo\u{200b}rld\u{1b}").unwrap(),
            "Hello world"
        );
        assert_eq!(normalize("co\u{ad}operate").unwrap(), "cooperate");
    }

    #[test]
    fn nothing_speakable() {
        for t in ["", "   ", "\n\t", "...!?", "\u{200b}\u{0}", "—  «»", "🙂"] {
            assert!(
                matches!(normalize(t), Err(TextError::NothingSpeakable)),
                "{t:?}"
            );
            assert!(
                matches!(normalize_bpe(t), Err(TextError::NothingSpeakable)),
                "{t:?}"
            );
        }
        assert_eq!(normalize("7").unwrap(), "7");
        assert_eq!(normalize(" ¿Sí? ").unwrap(), "¿Sí?");
    }

    #[test]
    fn bpe_adds_nfkc() {
        assert_eq!(
            normalize_bpe("ﬁne ２０ km² ① \u{2019}").unwrap(),
            "fine 20 km2 1 '"
        );
        assert_eq!(normalize_bpe("Caf\u{65}\u{301}").unwrap(), "Café");
        assert_eq!(normalize_bpe("a\u{2002}\u{2002}b").unwrap(), "a b");
        // Plain normalisation leaves compatibility forms alone.
        assert_eq!(normalize("ﬁne").unwrap(), "ﬁne");
    }
}
