//! The languages the phoneme front end speaks: parsing their names (with the short aliases) and
//! the espeak-ng language code of each.

use std::fmt;
use std::str::FromStr;

use super::TextError;

pub(crate) const SUPPORTED: &str = "en-us (or en), de, fr-fr (or fr), es";

/// A language the phoneme front end supports (the NeuTTS-air and nano model languages).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Language {
    EnUs,
    De,
    FrFr,
    Es,
}

impl Language {
    pub const ALL: [Language; 4] = [Language::EnUs, Language::De, Language::FrFr, Language::Es];

    /// The espeak-ng / phonemizer language code, as the vendor passes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Language::EnUs => "en-us",
            Language::De => "de",
            Language::FrFr => "fr-fr",
            Language::Es => "es",
        }
    }

    /// A BCP 47 tag (`en-US`, `de-DE`, `es-419`): the tag itself when it names a language here,
    /// else its primary subtag, so a region the front end has no variant for gets the one it has.
    pub fn from_bcp47(tag: &str) -> Result<Self, TextError> {
        tag.parse().or_else(|e| {
            let primary = tag.trim().split(['-', '_']).next().unwrap_or("");
            primary.parse().map_err(|_| e)
        })
    }
}

impl fmt::Display for Language {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Language {
    type Err = TextError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // Accept the spellings clients send in practice ("en_US", "FR").
        let key = s.trim().to_ascii_lowercase().replace('_', "-");
        match key.as_str() {
            "en-us" | "en" => Ok(Language::EnUs),
            "de" => Ok(Language::De),
            "fr-fr" | "fr" => Ok(Language::FrFr),
            "es" => Ok(Language::Es),
            _ => Err(TextError::UnsupportedLanguage(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcp47_tags_fall_back_to_their_language() {
        for (tag, l) in [
            ("en-US", Language::EnUs),
            ("en-GB", Language::EnUs),
            ("de-DE", Language::De),
            ("fr-CA", Language::FrFr),
            ("es-419", Language::Es),
        ] {
            assert_eq!(Language::from_bcp47(tag).unwrap(), l, "{tag}");
        }
        assert!(matches!(
            Language::from_bcp47("ja-JP"),
            Err(TextError::UnsupportedLanguage(t)) if t == "ja-JP"
        ));
    }

    #[test]
    fn parse_and_display() {
        for (s, l) in [
            ("en-us", Language::EnUs),
            ("en", Language::EnUs),
            ("EN_US", Language::EnUs),
            ("de", Language::De),
            ("fr-fr", Language::FrFr),
            ("fr", Language::FrFr),
            ("es", Language::Es),
        ] {
            assert_eq!(s.parse::<Language>().unwrap(), l, "{s}");
        }
        for l in Language::ALL {
            assert_eq!(l.to_string().parse::<Language>().unwrap(), l);
        }
        assert_eq!(Language::FrFr.to_string(), "fr-fr");
    }

    #[test]
    fn unsupported_language_lists_supported_values() {
        let err = "en-gb".parse::<Language>().unwrap_err();
        assert!(matches!(err, TextError::UnsupportedLanguage(ref s) if s == "en-gb"));
        assert_eq!(
            err.to_string(),
            "unsupported language \"en-gb\"; supported: en-us (or en), de, fr-fr (or fr), es"
        );
        assert!("".parse::<Language>().is_err());
        assert!("english".parse::<Language>().is_err());
    }
}
