//! The espeak-ng C library, loaded at run time, shared per process.
//!
//! espeak-ng keeps its whole state (voice, translator, phoneme buffer) in globals, so one
//! loaded library is one phonemizer: every call goes through a single mutex, and the library is
//! initialised once and never unloaded. Loading the same file again hands back the same engine.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use libloading::Library;

use super::TextError;
use super::language::Language;

const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 0x02;
/// Without it espeak-ng calls `exit()` when its data cannot be loaded.
const INITIALIZE_DONT_EXIT: c_int = 0x8000;
const CHARS_UTF8: c_int = 1;
/// phonemizer's `ord("_") << 8 | 0x02`: IPA, phonemes separated by "_".
const PHONEME_MODE: c_int = ((b'_' as c_int) << 8) | 0x02;

type InitializeFn = unsafe extern "C" fn(c_int, c_int, *const c_char, c_int) -> c_int;
type InfoFn = unsafe extern "C" fn(*mut *const c_char) -> *const c_char;
type ListVoicesFn = unsafe extern "C" fn(*mut c_void) -> *const *const VoiceHead;
type SetVoiceByNameFn = unsafe extern "C" fn(*const c_char) -> c_int;
type TextToPhonemesFn = unsafe extern "C" fn(*mut *const c_void, c_int, c_int) -> *const c_char;

/// The leading fields of `espeak_VOICE`; only read through pointers the library owns.
#[repr(C)]
struct VoiceHead {
    name: *const c_char,
    languages: *const c_char,
    identifier: *const c_char,
}

/// Where the library comes from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LibSource<'a> {
    File(&'a Path),
    /// A bare file name for the dynamic loader's search path.
    System(&'static str),
}

struct Ffi {
    list_voices: ListVoicesFn,
    set_voice_by_name: SetVoiceByNameFn,
    text_to_phonemes: TextToPhonemesFn,
    // Kept so the function pointers above stay valid.
    _lib: Library,
}

#[derive(Default)]
struct State {
    current: Option<Language>,
    voices: HashMap<Language, CString>,
}

pub(crate) struct Espeak {
    lib: PathBuf,
    data: Option<PathBuf>,
    data_in_use: String,
    version: String,
    ffi: Ffi,
    state: Mutex<State>,
}

static ENGINES: OnceLock<Mutex<Vec<Arc<Espeak>>>> = OnceLock::new();

fn lock_recover<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| {
        m.clear_poison();
        poisoned.into_inner()
    })
}

#[cfg(unix)]
fn path_to_cstring(p: &Path) -> Option<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(p.as_os_str().as_bytes()).ok()
}

#[cfg(not(unix))]
fn path_to_cstring(p: &Path) -> Option<CString> {
    CString::new(p.to_str()?).ok()
}

fn check_data_dir(data: &Path) -> Result<PathBuf, TextError> {
    let bad = |reason: &str| TextError::EspeakData {
        path: data.to_path_buf(),
        reason: reason.to_string(),
    };
    let canonical = data.canonicalize().map_err(|e| bad(&e.to_string()))?;
    if !canonical.join("phontab").is_file() {
        return Err(bad(
            "no phontab in it (expected an espeak-ng-data directory)",
        ));
    }
    Ok(canonical)
}

impl Espeak {
    /// The engine for `source`, loading and initialising the library on first use.
    pub(crate) fn open(
        source: LibSource<'_>,
        data: Option<&Path>,
    ) -> Result<Arc<Espeak>, TextError> {
        let key = match source {
            LibSource::File(p) => match p.canonicalize() {
                Ok(c) if c.is_file() => c,
                _ => {
                    return Err(TextError::EspeakNotFound {
                        tried: vec![format!("{} (no such file)", p.display())],
                    });
                }
            },
            LibSource::System(name) => PathBuf::from(name),
        };
        let data = data.map(check_data_dir).transpose()?;

        let engines = ENGINES.get_or_init(|| Mutex::new(Vec::new()));
        let mut engines = lock_recover(engines);
        if let Some(e) = engines.iter().find(|e| e.lib == key) {
            if data.is_some() && e.data != data {
                return Err(TextError::DataDirConflict {
                    lib: key.display().to_string(),
                    current: e.data_in_use.clone(),
                    requested: data.map(|d| d.display().to_string()).unwrap_or_default(),
                });
            }
            return Ok(Arc::clone(e));
        }
        let engine = Arc::new(Self::init(key, data)?);
        engines.push(Arc::clone(&engine));
        Ok(engine)
    }

    fn init(lib_path: PathBuf, data: Option<PathBuf>) -> Result<Espeak, TextError> {
        let lib_name = lib_path.display().to_string();
        let load_err = |source| TextError::EspeakLoad {
            lib: lib_name.clone(),
            source,
        };
        // SAFETY: loading runs the library's initialisers; espeak-ng's only set up static data.
        let lib = unsafe { Library::new(&lib_path) }.map_err(load_err)?;
        // SAFETY: the types match espeak-ng's speak_lib.h (1.49 and later).
        let (initialize, info, list_voices, set_voice_by_name, text_to_phonemes) = unsafe {
            (
                *lib.get::<InitializeFn>(b"espeak_Initialize\0")
                    .map_err(load_err)?,
                *lib.get::<InfoFn>(b"espeak_Info\0").map_err(load_err)?,
                *lib.get::<ListVoicesFn>(b"espeak_ListVoices\0")
                    .map_err(load_err)?,
                *lib.get::<SetVoiceByNameFn>(b"espeak_SetVoiceByName\0")
                    .map_err(load_err)?,
                *lib.get::<TextToPhonemesFn>(b"espeak_TextToPhonemes\0")
                    .map_err(load_err)?,
            )
        };

        let data_c = match &data {
            Some(d) => Some(path_to_cstring(d).ok_or_else(|| TextError::EspeakData {
                path: d.clone(),
                reason: "path not representable as a C string".into(),
            })?),
            None => None,
        };
        let data_ptr = data_c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        // SAFETY: called once per loaded library, under the registry lock; the path outlives it.
        let rc = unsafe { initialize(AUDIO_OUTPUT_SYNCHRONOUS, 0, data_ptr, INITIALIZE_DONT_EXIT) };
        if rc <= 0 {
            return Err(TextError::EspeakInit {
                lib: lib_name,
                code: rc,
            });
        }

        let mut data_path: *const c_char = std::ptr::null();
        // SAFETY: espeak_Info returns static strings owned by the library.
        let version = unsafe {
            let v = info(&mut data_path);
            if v.is_null() {
                String::new()
            } else {
                CStr::from_ptr(v).to_string_lossy().trim().to_string()
            }
        };
        let data_in_use = if data_path.is_null() {
            String::new()
        } else {
            // SAFETY: as above.
            unsafe { CStr::from_ptr(data_path) }
                .to_string_lossy()
                .into_owned()
        };
        tracing::debug!(lib = %lib_name, data = %data_in_use, %version, "espeak-ng initialised");
        if !version.starts_with("1.52") {
            tracing::warn!(
                lib = %lib_name,
                %version,
                "espeak-ng is not 1.52: phonemes will differ from the vendor's in places"
            );
        }

        Ok(Espeak {
            lib: lib_path,
            data,
            data_in_use,
            version,
            ffi: Ffi {
                list_voices,
                set_voice_by_name,
                text_to_phonemes,
                _lib: lib,
            },
            state: Mutex::new(State::default()),
        })
    }

    pub(crate) fn version(&self) -> &str {
        &self.version
    }

    pub(crate) fn library(&self) -> &Path {
        &self.lib
    }

    pub(crate) fn data_dir(&self) -> &str {
        &self.data_in_use
    }

    /// Runs `f` with the library locked and set to `lang`'s voice.
    pub(crate) fn with_voice<R>(
        &self,
        lang: Language,
        f: impl FnOnce(&mut Session<'_>) -> R,
    ) -> Result<R, TextError> {
        let mut state = match self.state.lock() {
            Ok(g) => g,
            Err(poisoned) => {
                // A panic mid-call may have left espeak on any voice: select it again.
                self.state.clear_poison();
                let mut g = poisoned.into_inner();
                g.current = None;
                g
            }
        };
        if state.current != Some(lang) {
            state.current = None;
            let voice = match state.voices.get(&lang) {
                Some(v) => v.clone(),
                None => {
                    let v = self.find_voice(lang)?;
                    state.voices.insert(lang, v.clone());
                    v
                }
            };
            // SAFETY: serialised by `state`; the name is a NUL-terminated identifier.
            let code = unsafe { (self.ffi.set_voice_by_name)(voice.as_ptr()) };
            if code != 0 {
                return Err(TextError::VoiceSelect {
                    language: lang,
                    voice: voice.to_string_lossy().into_owned(),
                    code,
                });
            }
            state.current = Some(lang);
        }
        let mut session = Session {
            ffi: &self.ffi,
            _state: state,
        };
        Ok(f(&mut session))
    }

    /// phonemizer's voice lookup: the first listed voice whose first language is exactly the code,
    /// skipping mbrola voices; selected by identifier ("gmw/en-US"), as phonemizer does.
    fn find_voice(&self, lang: Language) -> Result<CString, TextError> {
        let code = lang.as_str().as_bytes();
        // SAFETY: called with the state lock held; the list is a NULL-terminated array of
        // pointers into library-owned memory, valid until the next espeak_ListVoices call.
        unsafe {
            let list = (self.ffi.list_voices)(std::ptr::null_mut());
            if list.is_null() {
                return Err(TextError::VoiceNotFound(lang));
            }
            let mut i = 0;
            loop {
                let entry = *list.add(i);
                if entry.is_null() {
                    break;
                }
                i += 1;
                let v = &*entry;
                if v.identifier.is_null() || v.languages.is_null() || v.name.is_null() {
                    continue;
                }
                let identifier = CStr::from_ptr(v.identifier);
                let id_bytes = identifier.to_bytes();
                if id_bytes.starts_with(b"mb/") || id_bytes.starts_with(b"mb\\") {
                    continue;
                }
                // `languages` starts with a priority byte, then the NUL-terminated language.
                let languages = CStr::from_ptr(v.languages).to_bytes();
                if languages.len() > 1 && &languages[1..] == code {
                    return Ok(identifier.to_owned());
                }
            }
        }
        Err(TextError::VoiceNotFound(lang))
    }
}

/// The locked library with a voice selected.
pub(crate) struct Session<'a> {
    ffi: &'a Ffi,
    _state: MutexGuard<'a, State>,
}

impl Session<'_> {
    /// phonemizer's `EspeakWrapper.text_to_phonemes`: one espeak call per clause until the text
    /// is consumed, clause outputs joined by a space.
    pub(crate) fn text_to_phonemes(&mut self, text: &str) -> String {
        // espeak reads a C string: an interior NUL would silently end the text there.
        let c = match CString::new(text) {
            Ok(c) => c,
            Err(_) => CString::new(text.replace('\0', " ")).unwrap_or_default(),
        };
        let mut ptr: *const c_void = c.as_ptr().cast();
        let mut clauses: Vec<String> = Vec::new();
        while !ptr.is_null() {
            let before = ptr;
            // SAFETY: the session holds the lock; `ptr` points into `c`, which outlives the loop,
            // and espeak advances it within the string or sets it to NULL at its end.
            let out = unsafe { (self.ffi.text_to_phonemes)(&mut ptr, CHARS_UTF8, PHONEME_MODE) };
            if !out.is_null() {
                // SAFETY: a NUL-terminated buffer owned by espeak, valid until its next call.
                let bytes = unsafe { CStr::from_ptr(out) }.to_bytes();
                if !bytes.is_empty() {
                    clauses.push(String::from_utf8_lossy(bytes).into_owned());
                }
            }
            if ptr == before {
                // Never seen; guards against spinning forever on a library that stops advancing.
                tracing::warn!("espeak_TextToPhonemes did not advance; rest of the text skipped");
                break;
            }
        }
        clauses.join(" ")
    }
}
