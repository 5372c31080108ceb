//! Python `str` semantics that phonemizer's output depends on.

/// `str.isspace()` / regex `\s` for str patterns: Rust's `char::is_whitespace` lacks U+001C..U+001F.
pub(crate) fn is_space(c: char) -> bool {
    matches!(
        c,
        '\t'..='\r'
            | '\u{1c}'..='\u{1f}'
            | ' '
            | '\u{85}'
            | '\u{a0}'
            | '\u{1680}'
            | '\u{2000}'..='\u{200a}'
            | '\u{2028}'
            | '\u{2029}'
            | '\u{202f}'
            | '\u{205f}'
            | '\u{3000}'
    )
}

/// `str.strip()` without arguments.
pub(crate) fn strip(s: &str) -> &str {
    s.trim_matches(is_space)
}

/// `' '.join(s.split())`: the vendor's final whitespace folding.
pub(crate) fn fold_whitespace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for word in s.split(is_space).filter(|w| !w.is_empty()) {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_whitespace_set() {
        for c in [
            '\u{1c}', '\u{1f}', '\u{85}', '\u{a0}', '\u{2009}', '\u{3000}',
        ] {
            assert!(is_space(c), "{c:?}");
        }
        for c in ['\u{200b}', '\u{180e}', '\u{feff}', 'a', '_'] {
            assert!(!is_space(c), "{c:?}");
        }
    }

    #[test]
    fn fold_and_strip() {
        assert_eq!(fold_whitespace("  a \n\tb\u{a0} c  "), "a b c");
        assert_eq!(fold_whitespace(" \u{1c} "), "");
        assert_eq!(strip("\u{1d} x y \u{3000}"), "x y");
    }
}
