//! Voices: reference codes plus their exact transcript and language.
//!
//! A voice is one JSON file `NAME.json` in a voice directory (the repo's `voices/`, a user
//! directory given by flag or `ONEBIT_VOICES`, the server's custom-voice store). Files are validated
//! when they are read, so a bad voice is reported once with its path (a warning; the file is
//! skipped), not on every request. A [`VoiceStore`] reads its directories again when a lookup
//! misses or a file changed, so servers sharing a directory agree ([`shared`]).
//!
//! [`import`] turns the vendor's `NAME.pt` + `NAME.txt` pairs (read without torch, see `torch` and
//! `pickle`), `.npy` arrays and JSON code lists into voices, and saves and removes voice files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::package::SPEECH_CODES;

pub mod clone;
pub mod consent;
pub mod import;
mod pickle;
pub mod shared;
mod torch;

pub use import::{ImportOptions, check_budget, import_path, import_paths, length_warning};
use shared::{Disk, Slot};
pub use shared::{DiskReads, LOCK_FILE, LOCK_WAIT, REVALIDATE, SETTLED, StoreLock};

#[derive(Debug, thiserror::Error)]
pub enum VoiceError {
    #[error("unknown voice {name:?}; known voices: {}", if .known.is_empty() { "none (import one with `onebit-tts voices import`)".to_owned() } else { .known.join(", ") })]
    Unknown { name: String, known: Vec<String> },
    #[error("{}: {msg}", .path.display())]
    Invalid { path: PathBuf, msg: String },
    #[error(
        "invalid voice name {0:?}: use 1-64 letters, digits, '-' or '_', starting with a letter or digit"
    )]
    BadName(String),
    #[error("{}: a voice file of this name exists; pass --force to replace it", .0.display())]
    Exists(PathBuf),
    #[error("voice {name:?} is {}, not one of the voices in {}: it is not removed here", .path.display(), .dir.display())]
    NotRemovable {
        name: String,
        path: PathBuf,
        dir: PathBuf,
    },
    #[error(
        "{}: the voice store is busy (another change holds its lock); gave up after waiting {} ms, try again later",
        .path.display(),
        .waited.as_millis()
    )]
    StoreBusy {
        path: PathBuf,
        waited: std::time::Duration,
    },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "voice {name:?}: its reference takes {needed} prompt tokens, which leaves no room for {} new codes in a {budget}-token context; use a shorter reference (3-15 s)",
        import::MIN_NEW_CODES
    )]
    TooLong {
        name: String,
        needed: usize,
        budget: usize,
    },
}

/// One reference voice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Voice {
    pub name: String,
    /// espeak language code: en-us, de, fr-fr, es.
    pub language: String,
    pub transcript: String,
    pub codes: Vec<u32>,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub license: String,
    /// Set on a voice created through the server's custom-voice API (OpenAI's `audio.voice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomVoice>,
}

/// What OpenAI's custom-voice API says of a voice besides its name: its id (`voice_...`), when it
/// was made and the consent recording it was made under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomVoice {
    pub id: String,
    /// Unix seconds.
    pub created_at: u64,
    pub consent: String,
}

/// How custom voices' ids begin (`voice_...`, OpenAI's spelling).
pub const CUSTOM_ID_PREFIX: &str = "voice_";

/// A fresh id `PREFIX_` + 24 hex digits, as OpenAI's objects have. Unique, not secret: std's
/// `RandomState` (keyed from the OS once per process) hashes the time and a counter.
pub fn new_id(prefix: &str) -> String {
    use std::hash::{BuildHasher as _, Hasher as _};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let word = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(nanos);
        h.write_u64(n);
        h.write_u64(salt);
        h.finish()
    };
    let (a, b) = (word(1), word(2) >> 32);
    format!("{prefix}_{a:016x}{b:08x}")
}

/// Seconds since the Unix epoch, now.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Voice {
    /// Reference length in seconds.
    pub fn seconds(&self) -> f32 {
        (self.codes.len() as f64 / crate::package::CODES_PER_SECOND) as f32
    }

    pub fn validate(&self) -> Result<(), InvalidVoice> {
        let bad = |field, reason: String| Err(InvalidVoice { field, reason });
        if let Err(e) = validate_name(&self.name) {
            return bad("name", e.to_string());
        }
        if self.transcript.trim().is_empty() {
            return bad("transcript", "the transcript is empty".into());
        }
        if self.codes.is_empty() {
            return bad("codes", "the voice has no codes".into());
        }
        if let Some((i, c)) = self
            .codes
            .iter()
            .enumerate()
            .find(|(_, c)| **c >= SPEECH_CODES)
        {
            return bad(
                "codes",
                format!("code {c} at index {i} is outside 0..65535"),
            );
        }
        Ok(())
    }
}

/// What is wrong with a voice, and in which of its fields (`name`, `transcript`, `codes`), so a
/// caller can point at the field without reading the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}")]
pub struct InvalidVoice {
    pub field: &'static str,
    pub reason: String,
}

/// Voice names become file names: no path tricks.
pub fn validate_name(name: &str) -> Result<(), VoiceError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(VoiceError::BadName(name.to_owned()))
    }
}

/// All voices found in the given directories; a later directory's voice of the same name wins.
///
/// A store is a snapshot of its directories, and every snapshot of one store shares what was read
/// from disk ([`shared`]), so servers that share a directory agree: a lookup that misses, or finds
/// a voice whose file changed or went (one `stat`), reads the directories again before answering;
/// a listing is as old as the snapshot it comes from (`FrontEnd::voices` refreshes that after
/// [`REVALIDATE`]). A file that is not a valid voice is skipped with a warning.
#[derive(Debug, Default)]
pub struct VoiceStore {
    voices: BTreeMap<String, Slot>,
    dirs: Vec<PathBuf>,
    /// The directories as read; `None` for a store made empty ([`Default`]).
    disk: Option<Arc<Disk>>,
    /// The disk's generation this snapshot was built at.
    generation: u64,
    /// The snapshot a lookup that had to read the disk again found its answer in (so that it can
    /// lend it out for as long as this one lives).
    newer: OnceLock<Arc<VoiceStore>>,
}

impl Clone for VoiceStore {
    fn clone(&self) -> Self {
        Self {
            voices: self.voices.clone(),
            dirs: self.dirs.clone(),
            disk: self.disk.clone(),
            generation: self.generation,
            newer: OnceLock::new(),
        }
    }
}

impl VoiceStore {
    /// Reads every `*.json` voice in `dirs` (missing directories are skipped). A file that is not
    /// a valid voice is skipped with a warning naming it and why (once per state of the file);
    /// the `Result` is kept for callers that expect one.
    pub fn open(dirs: &[PathBuf]) -> Result<Self, VoiceError> {
        Ok(Self::from_disk(Disk::open(dirs)))
    }

    /// The snapshot of what `disk` holds now.
    fn from_disk(disk: Arc<Disk>) -> Self {
        let (generation, dirs, voices) = disk.view();
        Self {
            voices,
            dirs,
            disk: Some(disk),
            generation,
            newer: OnceLock::new(),
        }
    }

    /// This store's voice of `name` or, for a `voice_...` name, of that id.
    fn find(&self, name: &str) -> Option<&Slot> {
        let by_id = || {
            self.voices
                .values()
                .find(|s| s.voice.custom.as_ref().is_some_and(|c| c.id == name))
        };
        // An id wins over a name spelled like one, so no name can take another voice's id.
        if name.starts_with(CUSTOM_ID_PREFIX) {
            by_id().or_else(|| self.voices.get(name))
        } else {
            self.voices.get(name).or_else(by_id)
        }
    }

    /// `find`'s answer as the disk has it: a voice found whose file is unchanged (one `stat`),
    /// else what the directories hold once read again (a voice whose file changed: every
    /// directory listed; a miss: each directory that may have changed; parsing only new or
    /// changed files). `Err` carries the snapshot that answered, for its names.
    fn resolve<'a>(
        &'a self,
        name: &str,
        find: impl Fn(&'a Self, &str) -> Option<&'a Slot>,
    ) -> Result<&'a Slot, &'a Self> {
        let found = find(self, name);
        if let Some(slot) = found
            && slot.is_current()
        {
            return Ok(slot);
        }
        let Some(disk) = &self.disk else {
            return Err(self);
        };
        match found {
            // Its file changed: perhaps in place, which moves no directory's mtime.
            Some(_) => disk.reread_all(std::time::Instant::now()),
            None => disk.reread(std::time::Instant::now()),
        }
        let now = disk.generation();
        let mut fresh = self;
        while fresh.generation < now {
            fresh = fresh
                .newer
                .get_or_init(|| Arc::new(Self::from_disk(disk.clone())));
        }
        find(fresh, name).ok_or(fresh)
    }

    /// The voice of this name, or the custom voice of this id (`voice_...`).
    pub fn get(&self, name: &str) -> Result<&Voice, VoiceError> {
        self.resolve(name, Self::find)
            .map(|s| &*s.voice)
            .map_err(|fresh| VoiceError::Unknown {
                name: name.to_owned(),
                known: fresh.names(),
            })
    }

    /// The file a voice was read from (or saved to).
    pub fn path_of(&self, name: &str) -> Option<&Path> {
        self.resolve(name, |s, n| s.voices.get(n))
            .ok()
            .map(|s| s.path.as_path())
    }

    /// Adds a voice saved at `path`: its directory becomes one of the store's (the first, so any
    /// other directory's voice of its name wins) and the directories are read again.
    pub fn insert(&mut self, voice: Voice, path: PathBuf) {
        let disk = self.disk.get_or_insert_with(|| Disk::open(&[])).clone();
        if let Some(dir) = path.parent() {
            disk.add_dir(dir);
        }
        *self = Self::from_disk(disk);
        if self.voices.get(&voice.name).is_none_or(|s| s.path != path) {
            // Not (or no longer) on disk where it was saved: offered as given.
            let slot = Slot {
                voice: Arc::new(voice),
                path,
                id: None,
            };
            self.voices.insert(slot.voice.name.clone(), slot);
        }
    }

    /// Stops offering a voice (its file is expected gone: the store reads its directories again,
    /// and a file still there comes back at the next read); returns it and its file.
    pub fn forget(&mut self, name: &str) -> Option<(Voice, PathBuf)> {
        let old = self.voices.get(name).cloned();
        if let Some(disk) = self.disk.clone() {
            disk.reread(std::time::Instant::now());
            *self = Self::from_disk(disk);
        }
        self.voices.remove(name);
        old.map(|s| (Voice::clone(&s.voice), s.path))
    }

    /// A snapshot of what the directories hold now when this one is out of date: they are read
    /// again when the last read began `max_age` or more ago. `None`: this one is current.
    pub fn refreshed(&self, max_age: Duration) -> Option<Self> {
        let disk = self.disk.as_ref()?;
        disk.revalidate(max_age);
        (disk.generation() != self.generation).then(|| Self::from_disk(disk.clone()))
    }

    /// Which read of the disk this snapshot shows: a later snapshot of the same store has a
    /// higher one when anything changed in between.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// How often this store's directories were listed and its files parsed, by every snapshot.
    pub fn disk_reads(&self) -> DiskReads {
        self.disk.as_ref().map(|d| d.reads()).unwrap_or_default()
    }

    pub fn names(&self) -> Vec<String> {
        self.voices.keys().cloned().collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Voice, &Path)> {
        self.voices.values().map(|s| (&*s.voice, s.path.as_path()))
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }
}

/// Reads and validates one voice file; its name must match the file stem.
pub fn read_voice(path: &Path) -> Result<Voice, VoiceError> {
    let invalid = |msg: String| VoiceError::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    let text = std::fs::read_to_string(path).map_err(|e| invalid(format!("cannot read: {e}")))?;
    let voice: Voice =
        serde_json::from_str(&text).map_err(|e| invalid(format!("not a voice file: {e}")))?;
    voice.validate().map_err(|e| invalid(e.to_string()))?;
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if stem != voice.name {
        return Err(invalid(format!(
            "the file is named {stem:?} but the voice inside is {:?}",
            voice.name
        )));
    }
    Ok(voice)
}

/// The directory under a voice directory where the server keeps voices created over HTTP (and
/// their consent recordings), apart from the shipped ones.
pub const CUSTOM_SUBDIR: &str = "custom";

/// The default voice directories: `$ONEBIT_VOICES` (colon-separated) and the repo's `voices/`
/// beside the current directory or the executable's checkout, each after its `custom/` (voices
/// created over HTTP; a shipped voice of the same name wins).
pub fn default_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for home in crate::paths::onebit_homes() {
        if let Some(repo) = home.parent() {
            let d = repo.join("voices");
            for d in [d.join(CUSTOM_SUBDIR), d] {
                if !dirs.contains(&d) {
                    dirs.push(d);
                }
            }
        }
    }
    if let Some(v) = std::env::var_os("ONEBIT_VOICES") {
        dirs.extend(std::env::split_paths(&v));
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_reject_path_tricks() {
        for bad in ["../x", "a/b", "", ".hidden", "a b", "x\0", &"a".repeat(65)] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        for good in ["dave", "Jo-2", "my_voice"] {
            assert!(validate_name(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn voice_validation_names_the_problem() {
        let mut v = Voice {
            name: "t".into(),
            language: "en-us".into(),
            transcript: "hi".into(),
            codes: vec![1, 65_536],
            source: String::new(),
            license: String::new(),
            custom: None,
        };
        let e = v.validate().unwrap_err();
        assert_eq!(e.field, "codes");
        assert_eq!(e.to_string(), "code 65536 at index 1 is outside 0..65535");
        v.codes = vec![1];
        v.transcript = "  ".into();
        let e = v.validate().unwrap_err();
        assert_eq!(e.field, "transcript");
        assert_eq!(e.to_string(), "the transcript is empty");
    }
}
