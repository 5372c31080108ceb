//! OpenAI's names for what this server has: the model ids OpenAI clients send (`tts-1`,
//! `tts-1-hd`, `gpt-4o-mini-tts`) besides the package's own, and OpenAI's voice names mapped onto
//! installed voices: a default mapping over the shipped English voices, changed by the operator
//! (`--voice-aliases FILE`, `--voice-alias alloy=dave`).

use std::collections::BTreeMap;
use std::path::Path;

use crate::voice::VoiceStore;

/// Why an alias or the aliases file was refused.
#[derive(Debug, thiserror::Error)]
pub enum AliasError {
    #[error(
        "voice alias {spec:?}: expected ALIAS=VOICE, both voice names (letters, digits, - and _)"
    )]
    Syntax { spec: String },
    #[error("voice aliases file {}: {msg}", path.display())]
    File {
        path: std::path::PathBuf,
        msg: String,
    },
    #[error(
        "voice alias {alias:?} names the voice {voice:?}, which is not installed (installed: {known})"
    )]
    Target {
        alias: String,
        voice: String,
        known: String,
    },
    #[error(
        "voice alias {alias:?} would hide the installed voice of that name; choose another alias"
    )]
    HidesVoice { alias: String },
}

/// OpenAI's speech model ids; every one is served by the one loaded model.
pub const OPENAI_MODELS: [&str; 3] = ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"];

/// The model family's name, accepted whatever the package directory is called.
pub const FAMILY: &str = "neutts-air";

/// OpenAI's built-in voices and the shipped voice each maps to by default: English voices of a
/// similar register (the mapping is a guess at the character, not a likeness).
pub const DEFAULT_ALIASES: [(&str, &str); 11] = [
    ("alloy", "jo"),
    ("ash", "dave"),
    ("ballad", "paul"),
    ("coral", "emily"),
    ("echo", "steven"),
    ("fable", "paul"),
    ("nova", "sophie"),
    ("onyx", "dave"),
    ("sage", "emily"),
    ("shimmer", "jo"),
    ("verse", "steven"),
];

/// Voice names that stand for installed voices.
#[derive(Debug, Clone, Default)]
pub struct VoiceAliases(BTreeMap<String, String>);

impl VoiceAliases {
    /// The default mapping where its voice is installed, then `explicit` (the operator's, which
    /// wins). An explicit alias must name an installed voice and may not hide one.
    pub fn new(
        store: &VoiceStore,
        explicit: &BTreeMap<String, String>,
    ) -> Result<Self, AliasError> {
        let mut map: BTreeMap<String, String> = DEFAULT_ALIASES
            .iter()
            .filter(|(alias, voice)| store.get(voice).is_ok() && store.get(alias).is_err())
            .map(|(a, v)| ((*a).to_owned(), (*v).to_owned()))
            .collect();
        for (alias, voice) in explicit {
            if store.get(alias).is_ok() {
                return Err(AliasError::HidesVoice {
                    alias: alias.clone(),
                });
            }
            if store.get(voice).is_err() {
                return Err(AliasError::Target {
                    alias: alias.clone(),
                    voice: voice.clone(),
                    known: store.names().join(", "),
                });
            }
            map.insert(alias.clone(), voice.clone());
        }
        Ok(Self(map))
    }

    /// The installed voice `name` stands for: itself unless it is an alias.
    pub fn resolve<'a>(&'a self, name: &'a str) -> &'a str {
        self.0.get(name).map_or(name, String::as_str)
    }

    /// The aliases of `voice`.
    pub fn of(&self, voice: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(_, v)| *v == voice)
            .map(|(a, _)| a.as_str())
            .collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(a, v)| (a.as_str(), v.as_str()))
    }
}

/// `ALIAS=VOICE`.
pub fn parse_alias(s: &str) -> Result<(String, String), AliasError> {
    let bad = || AliasError::Syntax { spec: s.to_owned() };
    let (alias, voice) = s.split_once('=').ok_or_else(bad)?;
    let (alias, voice) = (alias.trim(), voice.trim());
    let ok = |n: &str| crate::voice::validate_name(n).is_ok();
    if !ok(alias) || !ok(voice) {
        return Err(bad());
    }
    Ok((alias.to_owned(), voice.to_owned()))
}

/// A JSON object of aliases: `{"alloy": "dave", ...}`.
pub fn read_alias_file(path: &Path) -> Result<BTreeMap<String, String>, AliasError> {
    let bad = |msg: String| AliasError::File {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let map: BTreeMap<String, String> = serde_json::from_str(&text).map_err(|e| {
        bad(format!(
            "expected a JSON object of alias to voice names: {e}"
        ))
    })?;
    for (alias, voice) in &map {
        parse_alias(&format!("{alias}={voice}")).map_err(|e| bad(e.to_string()))?;
    }
    Ok(map)
}

/// The model ids this server answers to: OpenAI's, the family's and the package's own.
pub fn model_ids(package: &str) -> Vec<String> {
    let mut ids: Vec<String> = OPENAI_MODELS.iter().map(|m| (*m).to_owned()).collect();
    for own in [FAMILY, package] {
        if !ids.iter().any(|m| m == own) {
            ids.push(own.to_owned());
        }
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> VoiceStore {
        VoiceStore::open(&[Path::new(env!("CARGO_MANIFEST_DIR")).join("voices")]).unwrap()
    }

    fn explicit(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(a, v)| ((*a).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_openai_voice_maps_to_a_shipped_english_voice_by_default() {
        let store = shipped();
        let aliases = VoiceAliases::new(&store, &BTreeMap::new()).unwrap();
        for (alias, voice) in DEFAULT_ALIASES {
            assert_eq!(aliases.resolve(alias), voice);
            assert!(
                store.get(voice).unwrap().language.starts_with("en"),
                "{voice}"
            );
        }
        assert_eq!(aliases.iter().count(), 11);
        assert_eq!(aliases.of("jo"), ["alloy", "shimmer"]);
        assert_eq!(aliases.resolve("dave"), "dave", "a voice name stays itself");
        assert_eq!(aliases.resolve("nobody"), "nobody");
    }

    #[test]
    fn the_operator_wins_and_defaults_whose_voice_is_missing_drop_out() {
        let store = shipped();
        let a =
            VoiceAliases::new(&store, &explicit(&[("alloy", "dave"), ("house", "greta")])).unwrap();
        assert_eq!(a.resolve("alloy"), "dave");
        assert_eq!(a.resolve("house"), "greta");
        assert_eq!(a.resolve("shimmer"), "jo");
        // Only the test voice installed: no default applies.
        let dir = std::env::temp_dir().join(format!("onebit-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let test = Path::new(env!("CARGO_MANIFEST_DIR")).join("voices/test.json");
        std::fs::copy(test, dir.join("test.json")).unwrap();
        let only_test = VoiceStore::open(std::slice::from_ref(&dir)).unwrap();
        let none = VoiceAliases::new(&only_test, &BTreeMap::new()).unwrap();
        assert_eq!(none.iter().count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn aliases_to_missing_voices_or_over_installed_ones_are_refused() {
        let store = shipped();
        let e = VoiceAliases::new(&store, &explicit(&[("alloy", "nobody")])).unwrap_err();
        assert!(matches!(e, AliasError::Target { .. }), "{e}");
        assert!(
            e.to_string().contains("dave"),
            "lists the installed voices: {e}"
        );
        let e = VoiceAliases::new(&store, &explicit(&[("dave", "jo")])).unwrap_err();
        assert!(matches!(e, AliasError::HidesVoice { .. }), "{e}");
    }

    #[test]
    fn model_ids_are_openai_s_the_family_s_and_the_package_s() {
        assert_eq!(
            model_ids("tiny"),
            ["tts-1", "tts-1-hd", "gpt-4o-mini-tts", "neutts-air", "tiny"]
        );
        assert_eq!(model_ids("neutts-air").len(), 4);
    }
}
