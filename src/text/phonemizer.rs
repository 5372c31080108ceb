//! Text to the phoneme string NeuTTS models are prompted with.

use std::env;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::espeak::{Espeak, LibSource};
use super::punctuation::{self, Chunking};
use super::{Language, TextError, py};

#[cfg(target_os = "macos")]
const LIB_FILE: &str = "libespeak-ng.1.dylib";
#[cfg(windows)]
const LIB_FILE: &str = "libespeak-ng.dll";
#[cfg(not(any(target_os = "macos", windows)))]
const LIB_FILE: &str = "libespeak-ng.so.1";

const DATA_DIR: &str = "espeak-ng-data";

/// espeak-ng phonemizer with the NeuTTS vendor's settings. Cheap to clone; `Send + Sync`.
///
/// All handles on the same library share one espeak-ng instance, whose calls are serialised:
/// concurrent `phonemize` calls are safe and simply take turns.
#[derive(Clone)]
pub struct Phonemizer {
    engine: Arc<Espeak>,
}

impl fmt::Debug for Phonemizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Phonemizer")
            .field("library", &self.engine.library())
            .field("data", &self.engine.data_dir())
            .field("version", &self.engine.version())
            .finish()
    }
}

impl Phonemizer {
    /// Loads espeak-ng from `lib` with its data in `data_dir` (the `espeak-ng-data` directory).
    ///
    /// The library is initialised once per process; loading the same file again returns a handle
    /// on the same instance (asking for another data directory then is an error).
    pub fn load(lib: &Path, data_dir: &Path) -> Result<Self, TextError> {
        Self::open(LibSource::File(lib), Some(data_dir))
    }

    /// Finds espeak-ng, in order: `$ONEBIT_ESPEAK_LIB` (the library file, or a directory holding
    /// it and `espeak-ng-data`), `$ONEBIT_HOME/neutts`, `<dir>/.onebit/neutts` for every ancestor
    /// of the current directory and then of the executable's directory, and last the system's
    /// `libespeak-ng.so.1` (with a warning: only espeak-ng 1.52 matches the vendor).
    /// `$ONEBIT_ESPEAK_DATA` overrides the data directory.
    pub fn discover() -> Result<Self, TextError> {
        let data_override = env::var_os("ONEBIT_ESPEAK_DATA")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);

        if let Some(v) = env::var_os("ONEBIT_ESPEAK_LIB").filter(|v| !v.is_empty()) {
            let given = PathBuf::from(v);
            let (lib, sibling_data) = if given.is_dir() {
                (given.join(LIB_FILE), given.join(DATA_DIR))
            } else {
                let data = given.parent().map(|d| d.join(DATA_DIR)).unwrap_or_default();
                (given, data)
            };
            // An explicit setting that does not work is reported, not silently replaced.
            if !lib.is_file() {
                return Err(TextError::EspeakNotFound {
                    tried: vec![format!(
                        "ONEBIT_ESPEAK_LIB={} (no such file)",
                        lib.display()
                    )],
                });
            }
            let data = data_override.or_else(|| sibling_data.is_dir().then_some(sibling_data));
            return Self::open(LibSource::File(&lib), data.as_deref());
        }

        let mut tried = Vec::new();
        for dir in candidate_dirs() {
            let lib = dir.join(LIB_FILE);
            let data = dir.join(DATA_DIR);
            if lib.is_file() && data.is_dir() {
                let data = data_override.clone().unwrap_or(data);
                return Self::open(LibSource::File(&lib), Some(&data));
            }
            tried.push(dir.display().to_string());
        }

        match Self::open(LibSource::System(LIB_FILE), data_override.as_deref()) {
            Ok(p) => {
                tracing::warn!(
                    version = %p.version(),
                    "using the system espeak-ng ({LIB_FILE}); only espeak-ng 1.52 (installed by \
                     scripts/setup.sh) gives the vendor's phonemes"
                );
                Ok(p)
            }
            Err(e) => {
                tried.push(format!("system {LIB_FILE} ({e})"));
                Err(TextError::EspeakNotFound { tried })
            }
        }
    }

    fn open(source: LibSource<'_>, data: Option<&Path>) -> Result<Self, TextError> {
        let engine = Espeak::open(source, data)?;
        Ok(Self { engine })
    }

    /// The phonemes of `text` exactly as the vendor's `NeuTTS._to_phones` writes them, except
    /// where the vendor loses words (see below).
    ///
    /// phonemizer cuts the text at its punctuation marks with `line.split(mark)`, i.e. at the
    /// first occurrence of the mark's text. When that is a decimal point earlier in the line
    /// ("12.5", "v2.0.1", "€18.50") it returns several items and the vendor keeps the first: the
    /// rest of the sentence is lost. Only then is the text phonemized again with each cut where
    /// its mark really is, which keeps every word (and reads "12.5" as a number).
    ///
    /// A NUL character is read as a space (espeak would stop there). Empty input, or input
    /// with no words, gives what phonemizer gives (possibly ""); [`super::normalize`] first
    /// rejects text with nothing to say.
    pub fn phonemize(&self, text: &str, lang: Language) -> Result<String, TextError> {
        let mut items = self.pipeline(text, lang, Chunking::Vendor)?;
        if items.len() > 1 {
            items = self.pipeline(text, lang, Chunking::Exact)?;
        }
        // Exact cuts always give one item; joining would still keep every word if not.
        Ok(py::fold_whitespace(&items.join(" ")))
    }

    /// The espeak-ng version string (`espeak_Info`), e.g. "1.52.0.1".
    pub fn version(&self) -> String {
        self.engine.version().to_string()
    }

    /// The library file in use (a bare name when the system's was picked up).
    pub fn library(&self) -> &Path {
        self.engine.library()
    }

    /// What the vendor's code returns, truncation included; for parity tests.
    #[cfg(test)]
    pub(crate) fn phonemize_vendor(&self, text: &str, lang: Language) -> Result<String, TextError> {
        let items = self.pipeline(text, lang, Chunking::Vendor)?;
        Ok(items
            .first()
            .map(|s| py::fold_whitespace(s))
            .unwrap_or_default())
    }

    /// phonemizer's `EspeakBackend.phonemize([text])` plus the vendor's per-language cleanup;
    /// returns phonemizer's output list.
    fn pipeline(
        &self,
        text: &str,
        lang: Language,
        chunking: Chunking,
    ) -> Result<Vec<String>, TextError> {
        let (pieces, marks) = punctuation::preserve(text, chunking);
        let phonemized = if pieces.is_empty() {
            Vec::new()
        } else {
            self.engine.with_voice(lang, |session| {
                pieces
                    .iter()
                    .map(|p| postprocess_line(&session.text_to_phonemes(p)))
                    .collect::<Vec<_>>()
            })?
        };
        let mut items = punctuation::restore(phonemized, marks);
        if lang == Language::FrFr {
            // The vendor's FrenchPhonemizer.clean.
            for item in &mut items {
                if item.contains('-') {
                    *item = item.replace('-', "");
                }
            }
        }
        Ok(items)
    }
}

fn candidate_dirs() -> Vec<PathBuf> {
    crate::paths::in_homes("neutts")
}

/// `EspeakBackend._postprocess_line` with `with_stress=True`, no tie, the default separator
/// (words end with " ", phones unseparated) and `language_switch='remove-flags'`.
fn postprocess_line(raw: &str) -> String {
    let line = py::strip(raw).replace('\n', " ").replace("  ", " ");
    let line = collapse_underscores(&line).replace("_ ", " ");
    let line = remove_language_flags(&line);
    if line.is_empty() {
        return String::new();
    }
    let mut out = String::with_capacity(line.len() + 8);
    for word in line.split(' ') {
        out.extend(py::strip(word).chars().filter(|&c| c != '_'));
        out.push(' ');
    }
    out
}

/// `re.sub(r'_+', '_', s)`.
fn collapse_underscores(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_underscore = false;
    for c in s.chars() {
        if c == '_' && prev_underscore {
            continue;
        }
        prev_underscore = c == '_';
        out.push(c);
    }
    out
}

/// `re.sub(r'\(.+?\)', '', s)`: drops espeak's "(en)" / "(fr)" language switch flags.
fn remove_language_flags(s: &str) -> String {
    if !s.contains('(') {
        return s.to_string();
    }
    let chars: Vec<char> = s.chars().collect();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '(' {
            let mut end = None;
            let mut k = i + 1;
            while k < chars.len() {
                if k >= i + 2 && chars[k] == ')' {
                    end = Some(k);
                    break;
                }
                if chars[k] == '\n' {
                    break;
                }
                k += 1;
            }
            if let Some(end) = end {
                i = end + 1;
                continue;
            }
        }
        out.push(chars[i]);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::testutil;

    #[test]
    fn phonemizer_is_send_sync() {
        fn check<T: Send + Sync + Clone>() {}
        check::<Phonemizer>();
    }

    #[test]
    fn postprocess_like_phonemizer() {
        assert_eq!(postprocess_line("h_ə_l_ˈoʊ w_ˈɜː_l_d"), "həlˈoʊ wˈɜːld ");
        assert_eq!(
            postprocess_line("k_ɛ_s_k_ˌə t_y f_ˈɛ s_ə- (en)_w_ˈiː_k_ˈɛ_n_d_(fr)"),
            "kɛskˌə ty fˈɛ sə- wˈiːkˈɛnd "
        );
        assert_eq!(postprocess_line("  a__b_ \nc  "), "ab c ");
        assert_eq!(postprocess_line(""), "");
        assert_eq!(postprocess_line("(en)"), "");
        // "   " -> one pass of replace("  ", " ") leaves two spaces: an empty word.
        assert_eq!(postprocess_line("a   b"), "a  b ");
    }

    #[test]
    fn language_flags_regex() {
        assert_eq!(remove_language_flags("a(en)b(fr)c"), "abc");
        assert_eq!(remove_language_flags("()x)y"), "y");
        assert_eq!(remove_language_flags("a() b"), "a() b");
        assert_eq!(remove_language_flags("(a\nb)c"), "(a\nb)c");
        assert_eq!(remove_language_flags("x(unclosed"), "x(unclosed");
    }

    #[test]
    fn collapse() {
        assert_eq!(collapse_underscores("a___b_c__"), "a_b_c_");
    }

    #[test]
    fn second_load_shares_the_engine() {
        let Some(p) = testutil::phonemizer("second load shares the engine") else {
            return;
        };
        let lib = p.library().to_path_buf();
        let data = PathBuf::from(p.engine.data_dir());
        let again = Phonemizer::load(&lib, &data).expect("second load");
        assert!(Arc::ptr_eq(&p.engine, &again.engine));
        assert_eq!(again.version(), p.version());

        // Another data directory for the same library cannot be honoured.
        let tmp = env::temp_dir().join(format!("onebit-text-fake-data-{}", std::process::id()));
        std::fs::create_dir_all(&tmp).expect("temp dir");
        std::fs::write(tmp.join("phontab"), b"").expect("fake phontab");
        let err = Phonemizer::load(&lib, &tmp).expect_err("conflicting data dir");
        assert!(matches!(err, TextError::DataDirConflict { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&tmp);
    }

    #[test]
    fn load_errors_are_typed() {
        let err = Phonemizer::load(
            Path::new("/nonexistent/libespeak-ng.so.1"),
            Path::new("/tmp"),
        )
        .expect_err("missing lib");
        assert!(matches!(err, TextError::EspeakNotFound { .. }));
        assert!(err.to_string().contains("scripts/setup.sh"), "{err}");
    }

    #[test]
    fn empty_and_punctuation_only_input() {
        let Some(p) = testutil::phonemizer("empty and punctuation-only input") else {
            return;
        };
        assert_eq!(p.phonemize("", Language::EnUs).unwrap(), "");
        assert_eq!(p.phonemize("   ", Language::EnUs).unwrap(), "");
        assert_eq!(p.phonemize("...", Language::EnUs).unwrap(), "...");
        assert_eq!(
            p.phonemize("a\0b", Language::EnUs).unwrap(),
            p.phonemize("a b", Language::EnUs).unwrap()
        );
    }

    #[test]
    fn decimal_point_keeps_the_rest_of_the_sentence() {
        let Some(p) = testutil::phonemizer("decimal point keeps the rest") else {
            return;
        };
        let text = "It weighs 3.5 kilos and costs twenty dollars.";
        let vendor = p.phonemize_vendor(text, Language::EnUs).unwrap();
        let ours = p.phonemize(text, Language::EnUs).unwrap();
        let cut = vendor.trim_end_matches('.');
        assert!(ours.starts_with(cut), "{ours} / {vendor}");
        assert!(ours.len() > vendor.len() + 20, "{ours} / {vendor}");
        assert!(ours.ends_with("dˈɑːlɚz."), "{ours}");
    }

    /// The vendor emulation (phonemizer's own cuts, first item only) must equal every golden,
    /// truncated ones included: proof that the only divergence is the deliberate one.
    #[test]
    fn vendor_emulation_matches_every_golden() {
        let Some(cases) = testutil::golden_cases("vendor emulation parity") else {
            return;
        };
        let Some(p) = testutil::phonemizer_for_goldens("vendor emulation parity") else {
            return;
        };
        let mut failed = Vec::new();
        for c in &cases {
            let lang: Language = c.lang.parse().expect("golden language");
            let got = p.phonemize_vendor(&c.text, lang).expect("phonemize");
            if got != c.phones {
                failed.push(format!(
                    "[{}] {:?}\n  got  {got}\n  want {}",
                    c.lang, c.text, c.phones
                ));
            }
        }
        assert!(
            failed.is_empty(),
            "{} of {} differ:\n{}",
            failed.len(),
            cases.len(),
            failed.join("\n")
        );
    }

    #[test]
    fn concurrent_calls_match_sequential() {
        let Some(p) = testutil::phonemizer("concurrent phonemize") else {
            return;
        };
        let inputs: Vec<(Language, &str)> = vec![
            (
                Language::EnUs,
                "A small boat drifted past the old harbour, slowly.",
            ),
            (Language::De, "Der Zug fährt um halb neun ab, nicht später!"),
            (
                Language::FrFr,
                "Il fait très beau aujourd'hui, n'est-ce pas ?",
            ),
            (Language::Es, "¿Puedes cerrar la ventana, por favor?"),
            (
                Language::EnUs,
                "She paid 4.75 dollars for 2 coffees (both cold).",
            ),
            (Language::De, "Wir treffen uns am Bahnhof."),
            (
                Language::FrFr,
                "Le week-end dernier, nous sommes allés au cinéma.",
            ),
            (Language::Es, "El perro corre muy rápido."),
        ];
        let sequential: Vec<String> = inputs
            .iter()
            .map(|(l, t)| p.phonemize(t, *l).expect("sequential"))
            .collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..8)
                .map(|t| {
                    let p = p.clone();
                    let (inputs, sequential) = (&inputs, &sequential);
                    scope.spawn(move || {
                        for round in 0..5 {
                            // Rotate so threads keep switching voices under each other.
                            for k in 0..inputs.len() {
                                let i = (k + t + round) % inputs.len();
                                let (l, text) = inputs[i];
                                let got = p.phonemize(text, l).expect("concurrent");
                                assert_eq!(got, sequential[i], "thread {t} round {round}");
                            }
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().expect("thread");
            }
        });
    }
}
