//! Importing voices into the project's format, and saving and removing voice files.
//!
//! Sources: the vendor's `NAME.pt` (torch) + `NAME.txt` pairs, `.npy` arrays, JSON code lists
//! (`[1, 2, ...]` or `{"codes": [...], ...}`), the project's own voice files, and whole folders of
//! those (the vendor's `samples/`). Every value from a file is checked here, once, so that a voice
//! in the store is known good: codes in 0..65535, a non-empty transcript, a language the front
//! end supports and a name that is safe as a file name.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Voice, VoiceError, VoiceStore, validate_name};
use crate::package::SPEECH_CODES;
use crate::text::Language;

/// Language of an imported voice when neither an option nor the file gives one (the vendor's
/// samples and NeuTTS-air are English).
pub const DEFAULT_LANGUAGE: &str = "en-us";

/// The vendor recommends references of 3-15 s; longer ones take context from the text.
pub const MAX_REFERENCE_SECONDS: f32 = 15.0;

/// New codes a prompt must leave room for (the vendor's minimum of 50 new tokens).
pub const MIN_NEW_CODES: usize = 50;

/// Upper bound for a code file: 15 s of int64 codes is 6 KB; anything near this is not a voice.
const MAX_CODE_FILE: u64 = 16 << 20;

/// Upper bound for a transcript file (a 15 s transcript is a few hundred bytes).
const MAX_TRANSCRIPT_FILE: u64 = 1 << 20;

/// Extensions of code files, in the order a folder import lists what it looked for.
const CODE_EXTENSIONS: [&str; 4] = ["pt", "pth", "npy", "json"];

/// What the caller knows better than the files. Names and transcripts apply to single voices
/// only; a folder import takes them from the file names and `NAME.txt` files.
#[derive(Debug, Clone, Default)]
pub struct ImportOptions {
    /// Voice name; default: the file's stem (or the name inside a project voice file).
    pub name: Option<String>,
    /// Exact transcript of the reference; default: `NAME.txt` beside the code file.
    pub transcript: Option<String>,
    /// Language for every imported voice; default: the file's, else [`DEFAULT_LANGUAGE`].
    pub language: Option<String>,
    /// Language per voice name; wins over `language` (a folder of mixed languages).
    pub languages: BTreeMap<String, String>,
    /// Where the voice comes from; default: the file's, else "imported from FILE".
    pub source: Option<String>,
    /// The licence that governs the voice; default: the file's, else empty.
    pub license: Option<String>,
}

impl ImportOptions {
    /// Takes a `--language` argument: `LANG` for every voice, or `NAME=LANG` for one voice.
    pub fn add_language(&mut self, arg: &str) {
        match arg.split_once('=') {
            Some((name, lang)) => {
                self.languages
                    .insert(name.trim().to_owned(), lang.trim().to_owned());
            }
            None => self.language = Some(arg.trim().to_owned()),
        }
    }
}

/// Imports one file or every voice in a folder. Nothing is written: see [`VoiceStore::save`].
/// On any error nothing is returned, so a folder imports completely or not at all.
pub fn import_path(path: &Path, opts: &ImportOptions) -> Result<Vec<Voice>, VoiceError> {
    let voices = import_one_path(path, opts)?;
    check_languages_used(&voices, opts, path)?;
    Ok(voices)
}

/// [`import_path`] over several paths, refusing two voices of the same name.
pub fn import_paths(paths: &[PathBuf], opts: &ImportOptions) -> Result<Vec<Voice>, VoiceError> {
    let first = paths
        .first()
        .map(PathBuf::as_path)
        .unwrap_or(Path::new("."));
    let mut out = Vec::new();
    for p in paths {
        out.extend(import_one_path(p, opts)?);
    }
    if out.len() > 1 && (opts.name.is_some() || opts.transcript.is_some()) {
        return Err(VoiceError::Invalid {
            path: first.to_path_buf(),
            msg: format!(
                "a name or transcript applies to one voice; these paths hold {}",
                out.len()
            ),
        });
    }
    check_unique(&out, first)?;
    check_languages_used(&out, opts, first)?;
    Ok(out)
}

fn import_one_path(path: &Path, opts: &ImportOptions) -> Result<Vec<Voice>, VoiceError> {
    let invalid = |msg: String| VoiceError::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    let io = |source| VoiceError::Io {
        path: path.to_path_buf(),
        source,
    };
    if !fs::metadata(path).map_err(io)?.is_dir() {
        return Ok(vec![import_file(path, opts)?]);
    }
    let mut files: Vec<PathBuf> = fs::read_dir(path)
        .map_err(io)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file() && code_extension(p).is_some() && !is_hidden(p))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(invalid(format!(
            "no voices here: expected NAME.{} files with NAME.txt transcripts",
            CODE_EXTENSIONS.join("/")
        )));
    }
    if files.len() > 1 && (opts.name.is_some() || opts.transcript.is_some()) {
        return Err(invalid(format!(
            "a name or transcript applies to one voice; this folder holds {} code files",
            files.len()
        )));
    }
    let voices = files
        .iter()
        .map(|f| import_file(f, opts))
        .collect::<Result<Vec<_>, _>>()?;
    check_unique(&voices, path)?;
    Ok(voices)
}

/// A per-name language for a voice that is not there is a typo, and would silently leave that
/// voice in the default language.
fn check_languages_used(
    voices: &[Voice],
    opts: &ImportOptions,
    path: &Path,
) -> Result<(), VoiceError> {
    match opts
        .languages
        .keys()
        .find(|k| !voices.iter().any(|v| &v.name == *k))
    {
        Some(k) => Err(VoiceError::Invalid {
            path: path.to_path_buf(),
            msg: format!(
                "a language is given for voice {k:?}, but no imported voice has that name"
            ),
        }),
        None => Ok(()),
    }
}

fn check_unique(voices: &[Voice], path: &Path) -> Result<(), VoiceError> {
    let mut seen = BTreeSet::new();
    for v in voices {
        if !seen.insert(v.name.as_str()) {
            return Err(VoiceError::Invalid {
                path: path.to_path_buf(),
                msg: format!("two voices are named {:?}", v.name),
            });
        }
    }
    Ok(())
}

fn code_extension(p: &Path) -> Option<&'static str> {
    let ext = p.extension()?.to_str()?;
    CODE_EXTENSIONS
        .iter()
        .find(|e| e.eq_ignore_ascii_case(ext))
        .copied()
}

/// Dot files are editor and temp files (including [`VoiceStore::save`]'s own), never voices.
fn is_hidden(p: &Path) -> bool {
    p.file_name()
        .and_then(|n| n.to_str())
        .is_none_or(|n| n.starts_with('.'))
}

/// What a code file says before options and defaults apply.
#[derive(Debug, Default)]
struct Found {
    codes: Vec<i64>,
    name: Option<String>,
    transcript: Option<String>,
    language: Option<String>,
    source: Option<String>,
    license: Option<String>,
}

fn import_file(path: &Path, opts: &ImportOptions) -> Result<Voice, VoiceError> {
    let invalid = |msg: String| VoiceError::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    let ext = code_extension(path).ok_or_else(|| {
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("txt"))
        {
            invalid(
                "this is a transcript; import the codes file beside it (NAME.pt, .npy or .json)"
                    .into(),
            )
        } else {
            invalid(format!(
                "unknown voice file type; expected .{}",
                CODE_EXTENSIONS.join(", .")
            ))
        }
    })?;
    let bytes = read_capped(path, MAX_CODE_FILE)?;
    let found = match ext {
        "pt" | "pth" => Found {
            codes: super::torch::read_pt(&bytes).map_err(|e| invalid(e.to_string()))?,
            ..Found::default()
        },
        "npy" => Found {
            codes: read_npy(&bytes).map_err(invalid)?,
            ..Found::default()
        },
        _ => read_json(&bytes).map_err(invalid)?,
    };
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default();

    let name = opts
        .name
        .clone()
        .or(found.name)
        .unwrap_or_else(|| stem.to_owned());
    validate_name(&name).map_err(|e| {
        invalid(if opts.name.is_some() {
            e.to_string()
        } else {
            format!("{e}; choose one with --name")
        })
    })?;

    let transcript = match (&opts.transcript, found.transcript) {
        (Some(t), _) => {
            let t = vendor_strip(t);
            if t.is_empty() {
                return Err(invalid("the transcript given is empty".into()));
            }
            t
        }
        (None, Some(t)) => t,
        (None, None) => {
            let txt = path.with_extension("txt");
            if !txt.is_file() {
                return Err(invalid(format!(
                    "no transcript: put the exact words of the reference in {} or pass one",
                    txt.display()
                )));
            }
            read_transcript(&txt)?
        }
    };

    let language = opts
        .languages
        .get(&name)
        .or(opts.language.as_ref())
        .cloned()
        .or(found.language)
        .unwrap_or_else(|| DEFAULT_LANGUAGE.to_owned());
    let language = language
        .parse::<Language>()
        .map_err(|e| invalid(e.to_string()))?
        .as_str()
        .to_owned();

    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let voice = Voice {
        name,
        language,
        transcript,
        codes: to_codes(&found.codes).map_err(invalid)?,
        source: opts
            .source
            .clone()
            .or(found.source)
            .unwrap_or_else(|| format!("imported from {file_name}")),
        license: opts.license.clone().or(found.license).unwrap_or_default(),
        custom: None,
    };
    voice.validate().map_err(|e| invalid(e.to_string()))?;
    Ok(voice)
}

fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, VoiceError> {
    let io = |source| VoiceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let too_large = || VoiceError::Invalid {
        path: path.to_path_buf(),
        msg: format!("too large for a voice file (limit {max} bytes)"),
    };
    let file = fs::File::open(path).map_err(io)?;
    if file.metadata().map_err(io)?.len() > max {
        return Err(too_large());
    }
    // Bounded read too: the file may grow between the size check and the read.
    let mut out = Vec::new();
    file.take(max + 1).read_to_end(&mut out).map_err(io)?;
    if out.len() as u64 > max {
        return Err(too_large());
    }
    Ok(out)
}

/// A transcript file as the vendor reads it: `open(path).read().strip()`.
pub fn read_transcript(path: &Path) -> Result<String, VoiceError> {
    let invalid = |msg: &str| VoiceError::Invalid {
        path: path.to_path_buf(),
        msg: msg.to_owned(),
    };
    let bytes = read_capped(path, MAX_TRANSCRIPT_FILE)?;
    let text = String::from_utf8(bytes).map_err(|_| invalid("the transcript is not UTF-8 text"))?;
    let text = vendor_strip(&text);
    if text.is_empty() {
        return Err(invalid("the transcript is empty"));
    }
    Ok(text)
}

/// Python text-mode `read()` then `str.strip()`: universal newlines (`\r\n` and `\r` become
/// `\n`) and Python's whitespace set, which adds the ASCII separators 0x1c-0x1f to Rust's. A
/// leading byte-order mark goes too: Python would keep it, but it is an editor artefact, not
/// speech, and it would reach the prompt.
fn vendor_strip(text: &str) -> String {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    text.trim_matches(|c: char| c.is_whitespace() || ('\x1c'..='\x1f').contains(&c))
        .to_owned()
}

fn to_codes(raw: &[i64]) -> Result<Vec<u32>, String> {
    raw.iter()
        .enumerate()
        .map(|(i, c)| {
            u32::try_from(*c)
                .ok()
                .filter(|c| *c < SPEECH_CODES)
                .ok_or_else(|| {
                    format!(
                        "code {c} at index {i} is outside 0..{}",
                        SPEECH_CODES.saturating_sub(1)
                    )
                })
        })
        .collect()
}

/// A JSON list of codes, an object with "codes" (and optionally the other voice fields), or a
/// project voice file (the same object with every field).
fn read_json(bytes: &[u8]) -> Result<Found, String> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let codes_of = |v: &serde_json::Value| -> Result<Vec<i64>, String> {
        let list = v.as_array().ok_or("\"codes\" must be a list of integers")?;
        list.iter()
            .enumerate()
            .map(|(i, c)| {
                c.as_i64()
                    .ok_or_else(|| format!("codes[{i}] is {c}, not an integer code"))
            })
            .collect()
    };
    match value {
        serde_json::Value::Array(_) => Ok(Found {
            codes: codes_of(&value)?,
            ..Found::default()
        }),
        serde_json::Value::Object(map) => {
            let mut found = Found::default();
            let mut codes = None;
            for (k, v) in &map {
                let text = || {
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or_else(|| format!("{k:?} must be a string"))
                };
                match k.as_str() {
                    "codes" => codes = Some(codes_of(v)?),
                    "name" => found.name = Some(text()?),
                    "transcript" | "text" => {
                        let t = vendor_strip(&text()?);
                        if t.is_empty() {
                            return Err("the transcript is empty".into());
                        }
                        found.transcript = Some(t);
                    }
                    "language" => found.language = Some(text()?),
                    "source" => found.source = Some(text()?),
                    "license" => found.license = Some(text()?),
                    other => {
                        // A misspelt "transcript" must not silently become "use NAME.txt".
                        return Err(format!(
                            "unknown field {other:?}; expected codes, transcript, language, \
                             name, source, license"
                        ));
                    }
                }
            }
            found.codes = codes.ok_or("no \"codes\" field")?;
            Ok(found)
        }
        _ => Err("expected a list of codes or an object with \"codes\"".into()),
    }
}

/// A `.npy` array of little-endian int16/int32/int64 (or uint16/32/64) that is 1-D or squeezes
/// to 1-D.
fn read_npy(bytes: &[u8]) -> Result<Vec<i64>, String> {
    let rest = bytes
        .strip_prefix(b"\x93NUMPY")
        .ok_or("not a .npy file (no \\x93NUMPY magic)")?;
    let (header_len, start): (usize, usize) = match rest {
        [1, _, a, b, ..] => (usize::from(u16::from_le_bytes([*a, *b])), 10),
        [2 | 3, _, a, b, c, d, ..] => (
            usize::try_from(u32::from_le_bytes([*a, *b, *c, *d])).map_err(|e| e.to_string())?,
            12,
        ),
        [v, ..] => return Err(format!(".npy format version {v} is not supported")),
        [] => return Err(".npy header is truncated".into()),
    };
    let header = bytes
        .get(start..start.saturating_add(header_len))
        .ok_or(".npy header is truncated")?;
    let header = std::str::from_utf8(header).map_err(|_| ".npy header is not text")?;
    let data = &bytes[start + header_len..];

    let PyLit::Dict(fields) = PyParser::new(header).parse()? else {
        return Err(".npy header is not a dict".into());
    };
    let field = |k: &str| fields.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let Some(PyLit::Str(descr)) = field("descr") else {
        return Err(".npy header has no descr".into());
    };
    let (size, signed) = match descr.as_str() {
        "<i2" => (2, true),
        "<i4" => (4, true),
        "<i8" => (8, true),
        "<u2" => (2, false),
        "<u4" => (4, false),
        "<u8" => (8, false),
        d if d.starts_with('>') => {
            return Err(format!(
                "dtype {d:?} is big-endian; save little-endian integers"
            ));
        }
        d => {
            return Err(format!(
                "dtype {d:?} is not an integer type; codes must be int16, int32 or int64"
            ));
        }
    };
    let Some(PyLit::Tuple(shape)) = field("shape") else {
        return Err(".npy header has no shape".into());
    };
    let shape: Vec<u64> = shape
        .iter()
        .map(|d| match d {
            PyLit::Int(n) => Ok(*n),
            _ => Err(".npy shape holds a non-integer".to_owned()),
        })
        .collect::<Result<_, _>>()?;
    // fortran_order does not matter: once size-1 dimensions are dropped there is one dimension,
    // whose layout is the same in both orders.
    let kept: Vec<u64> = shape.iter().copied().filter(|d| *d != 1).collect();
    let n = match kept.as_slice() {
        [] if !shape.is_empty() => 1,
        [n] => *n,
        _ => {
            return Err(format!(
                "the array has shape {shape:?}; codes must be one sequence (N,), (1, N) or (1, 1, N)"
            ));
        }
    };
    let want = n
        .checked_mul(size as u64)
        .ok_or("the array shape overflows")?;
    if data.len() as u64 != want {
        return Err(format!(
            "the array data is {} bytes; shape {shape:?} of {descr} needs {want}",
            data.len()
        ));
    }
    data.chunks_exact(size)
        .map(|b| {
            let mut a = [0u8; 8];
            a[..size].copy_from_slice(b);
            // Sign-extend signed values shorter than 8 bytes.
            if signed && b[size - 1] & 0x80 != 0 {
                a[size..].fill(0xff);
            }
            let v = u64::from_le_bytes(a);
            if signed {
                Ok(v as i64)
            } else {
                i64::try_from(v).map_err(|_| format!("code {v} is outside 0..65535"))
            }
        })
        .collect()
}

/// The Python literals a `.npy` header uses.
#[derive(Debug, PartialEq)]
enum PyLit {
    Str(String),
    Int(u64),
    Bool(bool),
    None,
    Tuple(Vec<PyLit>),
    Dict(Vec<(String, PyLit)>),
}

struct PyParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> PyParser<'a> {
    fn new(s: &'a str) -> Self {
        Self {
            s: s.as_bytes(),
            pos: 0,
        }
    }

    fn parse(mut self) -> Result<PyLit, String> {
        let v = self.value(0)?;
        self.ws();
        if self.pos != self.s.len() {
            return Err(".npy header has trailing text".into());
        }
        Ok(v)
    }

    fn ws(&mut self) {
        while self
            .s
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_whitespace())
        {
            self.pos += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let hit = self.s.get(self.pos) == Some(&c);
        if hit {
            self.pos += 1;
        }
        hit
    }

    fn value(&mut self, depth: usize) -> Result<PyLit, String> {
        // The header is at most 4 GB of file text: bound the nesting, not just the length.
        if depth > 8 {
            return Err(".npy header nests too deeply".into());
        }
        self.ws();
        let bad = || ".npy header is not a Python literal".to_owned();
        match self.s.get(self.pos).copied().ok_or_else(bad)? {
            b'{' => {
                self.pos += 1;
                let mut items = Vec::new();
                while !self.eat(b'}') {
                    let PyLit::Str(k) = self.value(depth + 1)? else {
                        return Err(bad());
                    };
                    if !self.eat(b':') {
                        return Err(bad());
                    }
                    items.push((k, self.value(depth + 1)?));
                    if !self.eat(b',') {
                        if !self.eat(b'}') {
                            return Err(bad());
                        }
                        break;
                    }
                }
                Ok(PyLit::Dict(items))
            }
            b'(' => {
                self.pos += 1;
                let mut items = Vec::new();
                while !self.eat(b')') {
                    items.push(self.value(depth + 1)?);
                    if !self.eat(b',') {
                        if !self.eat(b')') {
                            return Err(bad());
                        }
                        break;
                    }
                }
                Ok(PyLit::Tuple(items))
            }
            q @ (b'\'' | b'"') => {
                let start = self.pos + 1;
                let len = self.s[start..]
                    .iter()
                    .position(|c| *c == q)
                    .ok_or_else(bad)?;
                self.pos = start + len + 1;
                std::str::from_utf8(&self.s[start..start + len])
                    .map(|s| PyLit::Str(s.to_owned()))
                    .map_err(|_| bad())
            }
            b'0'..=b'9' => {
                let start = self.pos;
                while self.s.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    self.pos += 1;
                }
                let n = std::str::from_utf8(&self.s[start..self.pos])
                    .ok()
                    .and_then(|d| d.parse().ok())
                    .ok_or_else(bad)?;
                // Python 2 numpy wrote longs as `372L`.
                if self.s.get(self.pos) == Some(&b'L') {
                    self.pos += 1;
                }
                Ok(PyLit::Int(n))
            }
            _ => {
                for (word, lit) in [
                    ("True", PyLit::Bool(true)),
                    ("False", PyLit::Bool(false)),
                    ("None", PyLit::None),
                ] {
                    if self.s[self.pos..].starts_with(word.as_bytes()) {
                        self.pos += word.len();
                        return Ok(lit);
                    }
                }
                Err(bad())
            }
        }
    }
}

/// Some(warning) when the reference is longer than the vendor's recommended 15 s.
pub fn length_warning(voice: &Voice) -> Option<String> {
    (voice.seconds() > MAX_REFERENCE_SECONDS).then(|| {
        format!(
            "voice {:?}: the reference is {:.1} s; the vendor recommends 3-15 s, and a longer one \
             takes context from the text to speak",
            voice.name,
            voice.seconds()
        )
    })
}

/// Refuses a voice whose reference alone leaves no room for [`MIN_NEW_CODES`] new codes in a
/// context of `budget_tokens`; otherwise returns the length warning, if any, for the caller to
/// print. `reference_tokens` is the voice's prompt with no text to speak, as the model's front end
/// builds it (`synth::FrontEnd::reference_tokens`): the one measure of a prompt's size.
pub fn check_budget(
    voice: &Voice,
    reference_tokens: usize,
    budget_tokens: usize,
) -> Result<Option<String>, VoiceError> {
    let needed = reference_tokens;
    if needed > budget_tokens.saturating_sub(MIN_NEW_CODES) {
        return Err(VoiceError::TooLong {
            name: voice.name.clone(),
            needed,
            budget: budget_tokens,
        });
    }
    Ok(length_warning(voice))
}

/// The voice file text: fields first, then the codes 16 to a line, so files stay readable and
/// diff well (serde_json's pretty printer puts every code on its own line).
pub fn voice_json(voice: &Voice) -> String {
    let s = |x: &str| serde_json::Value::String(x.to_owned()).to_string();
    let mut out = format!(
        "{{\n  \"name\": {},\n  \"language\": {},\n  \"transcript\": {},\n  \"source\": {},\n  \
         \"license\": {},\n  \"codes\": [",
        s(&voice.name),
        s(&voice.language),
        s(&voice.transcript),
        s(&voice.source),
        s(&voice.license)
    );
    if let Some(c) = &voice.custom {
        // Compact on one line: serde_json's own spelling of the struct.
        let c = serde_json::to_string(c).unwrap_or_default();
        out.insert_str(
            out.len() - "\n  \"codes\": [".len(),
            &format!("\n  \"custom\": {c},"),
        );
    }
    for (i, line) in voice.codes.chunks(16).enumerate() {
        let line: Vec<String> = line.iter().map(u32::to_string).collect();
        out.push_str(if i == 0 { "\n    " } else { ",\n    " });
        out.push_str(&line.join(", "));
    }
    out.push_str("\n  ]\n}\n");
    out
}

impl VoiceStore {
    /// Writes `dir/NAME.json` atomically: a temp file in `dir`, then a rename (or, without
    /// `overwrite`, a hard link, which fails instead of replacing a file that appeared meanwhile).
    /// Refuses to replace an existing voice unless `overwrite`. Returns the file's path.
    pub fn save(dir: &Path, voice: &Voice, overwrite: bool) -> Result<PathBuf, VoiceError> {
        validate_name(&voice.name)?;
        let path = dir.join(format!("{}.json", voice.name));
        voice.validate().map_err(|e| VoiceError::Invalid {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        if !overwrite && path.exists() {
            return Err(VoiceError::Exists(path));
        }
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| VoiceError::Io { path: p, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;

        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = dir.join(format!(
            ".{}.json.{}-{}.tmp",
            voice.name,
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let written = (|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(voice_json(voice).as_bytes())?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = fs::remove_file(&tmp);
            return Err(io(&tmp)(e));
        }
        let placed = if overwrite {
            fs::rename(&tmp, &path)
        } else {
            match fs::hard_link(&tmp, &path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    let _ = fs::remove_file(&tmp);
                    return Err(VoiceError::Exists(path));
                }
                // Filesystems without hard links: the exists() check above has to do.
                Err(_) => fs::rename(&tmp, &path),
                Ok(()) => fs::remove_file(&tmp),
            }
        };
        if let Err(e) = placed {
            let _ = fs::remove_file(&tmp);
            return Err(io(&path)(e));
        }
        Ok(path)
    }

    /// Deletes `dir/NAME.json`; returns its path.
    pub fn remove(dir: &Path, name: &str) -> Result<PathBuf, VoiceError> {
        validate_name(name)?;
        let path = dir.join(format!("{name}.json"));
        match fs::remove_file(&path) {
            Ok(()) => Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(VoiceError::Unknown {
                name: name.to_owned(),
                known: json_stems(dir),
            }),
            Err(source) => Err(VoiceError::Io { path, source }),
        }
    }
}

fn json_stems(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json") && !is_hidden(p))
        .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut header =
            format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        // numpy pads the header with spaces to a multiple of 64 and ends it with a newline.
        while (10 + header.len() + 1) % 64 != 0 {
            header.push(' ');
        }
        header.push('\n');
        let mut out = b"\x93NUMPY\x01\x00".to_vec();
        out.extend((header.len() as u16).to_le_bytes());
        out.extend(header.as_bytes());
        out.extend(data);
        out
    }

    #[test]
    fn npy_integer_types_and_shapes() {
        let i32s: Vec<u8> = [5i32, 65_535, 0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(
            read_npy(&npy("<i4", "(3,)", &i32s)).unwrap(),
            [5, 65_535, 0]
        );
        assert_eq!(
            read_npy(&npy("<i4", "(1, 3)", &i32s)).unwrap(),
            [5, 65_535, 0]
        );
        assert_eq!(
            read_npy(&npy("<i4", "(1, 1, 3)", &i32s)).unwrap(),
            [5, 65_535, 0]
        );
        let i16s: Vec<u8> = [7i16, -2].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_npy(&npy("<i2", "(2,)", &i16s)).unwrap(), [7, -2]);
        let i64s: Vec<u8> = [9i64, 70_000]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        assert_eq!(read_npy(&npy("<i8", "(2L,)", &i64s)).unwrap(), [9, 70_000]);
        let u16s: Vec<u8> = [65_535u16].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(read_npy(&npy("<u2", "(1,)", &u16s)).unwrap(), [65_535]);
    }

    #[test]
    fn npy_refusals_say_why() {
        let i32s: Vec<u8> = [1i32, 2, 3, 4]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let err = |b: Vec<u8>| read_npy(&b).unwrap_err();
        assert!(err(npy("<f4", "(4,)", &i32s)).contains("not an integer type"));
        assert!(err(npy(">i4", "(4,)", &i32s)).contains("big-endian"));
        assert!(err(npy("<i4", "(2, 2)", &i32s)).contains("one sequence"));
        assert!(err(npy("<i4", "(5,)", &i32s)).contains("needs 20"));
        assert!(err(npy("<i4", "()", &i32s[..4])).contains("one sequence"));
        assert!(err(b"\x93NUMPY\x01\x00\xff\x00{".to_vec()).contains("truncated"));
        assert!(err(b"PK\x03\x04".to_vec()).contains("magic"));
        let deep = format!("{}{}", "(".repeat(100), ")".repeat(100));
        assert!(err(npy("<i4", &deep, &i32s)).contains("deeply"));
    }

    #[test]
    fn transcripts_are_stripped_like_python() {
        assert_eq!(
            vendor_strip("\u{feff}  Hello,\r\nworld.\r\n\x1c"),
            "Hello,\nworld."
        );
        assert_eq!(vendor_strip("a\rb\n"), "a\nb");
        assert_eq!(vendor_strip(" \t\n"), "");
    }

    #[test]
    fn json_forms() {
        assert_eq!(read_json(b"[1, 2, 3]").unwrap().codes, [1, 2, 3]);
        let f = read_json(br#"{"codes": [4], "text": " hi \n", "language": "de"}"#).unwrap();
        assert_eq!((f.codes, f.transcript.as_deref()), (vec![4], Some("hi")));
        assert!(read_json(b"[1.5]").unwrap_err().contains("not an integer"));
        assert!(
            read_json(br#"{"codes": [1], "transcipt": "x"}"#)
                .unwrap_err()
                .contains("unknown field \"transcipt\"")
        );
        assert!(
            read_json(br#"{"text": "x"}"#)
                .unwrap_err()
                .contains("no \"codes\"")
        );
        assert!(read_json(b"7").is_err());
    }

    #[test]
    fn code_range_is_checked_before_narrowing() {
        assert_eq!(to_codes(&[0, 65_535]).unwrap(), [0, 65_535]);
        assert_eq!(
            to_codes(&[1, 70_000]).unwrap_err(),
            "code 70000 at index 1 is outside 0..65535"
        );
        assert_eq!(
            to_codes(&[-1]).unwrap_err(),
            "code -1 at index 0 is outside 0..65535"
        );
        assert!(to_codes(&[i64::MAX]).is_err());
    }

    #[test]
    fn budget_leaves_room_for_the_minimum_new_codes() {
        let mut v = Voice {
            name: "v".into(),
            language: "en-us".into(),
            transcript: "x".repeat(100),
            codes: vec![1; 372],
            source: String::new(),
            license: String::new(),
            custom: None,
        };
        assert_eq!(check_budget(&v, 438, 2048).unwrap(), None);
        // 438 tokens + 50 new codes fits 488 exactly, not 487.
        assert_eq!(check_budget(&v, 438, 488).unwrap(), None);
        let err = check_budget(&v, 438, 487).unwrap_err().to_string();
        assert!(
            err.contains("\"v\"") && err.contains("438") && err.contains("487"),
            "{err}"
        );
        v.codes = vec![1; 751];
        let warn = check_budget(&v, 817, 2048).unwrap().unwrap();
        assert!(warn.contains("\"v\"") && warn.contains("15.0 s"), "{warn}");
        v.codes = vec![1; 750];
        assert_eq!(length_warning(&v), None);
    }

    #[test]
    fn voice_json_reads_back() {
        let v = Voice {
            name: "q".into(),
            language: "fr-fr".into(),
            transcript: "« Bonjour », dit-il.\n\"Oui\"".into(),
            codes: (0..40).collect(),
            source: "s".into(),
            license: "l".into(),
            custom: None,
        };
        let text = voice_json(&v);
        assert_eq!(serde_json::from_str::<Voice>(&text).unwrap(), v);
        assert!(text.lines().count() < 15, "{text}");
    }
}
