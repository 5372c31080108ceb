//! Consent recordings: a person's spoken permission for their voice to be cloned (OpenAI's
//! `audio.voice_consent`). A custom voice names the consent it was made under. Each consent is
//! `DIR/ID.json` (its label, language and time) beside its recording `DIR/ID.recording.EXT`; the
//! JSON is written last and atomically, so a consent exists exactly when its JSON does.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::paths::PartialFile;

/// Consent ids: `cons_` and hex digits (they name files, so nothing else).
pub const CONSENT_PREFIX: &str = "cons";
/// Longest label, in characters.
pub const MAX_LABEL_CHARS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum ConsentError {
    #[error("no consent recording {0:?}")]
    NotFound(String),
    #[error("the consent's name is empty or longer than {MAX_LABEL_CHARS} characters")]
    BadName,
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not a consent record: {msg}", .path.display())]
    Invalid { path: PathBuf, msg: String },
}

/// One consent recording's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Consent {
    pub id: String,
    /// The label given at upload.
    pub name: String,
    /// BCP 47 tag of the consent phrase, as given.
    pub language: String,
    /// Unix seconds.
    pub created_at: u64,
    /// The recording's file name beside the record.
    pub recording: String,
    /// The recording's length once decoded.
    pub seconds: f64,
}

/// The consent records in one directory.
#[derive(Debug, Clone)]
pub struct ConsentStore {
    dir: PathBuf,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ConsentError + '_ {
    move |source| ConsentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Whether `id` can name a consent's files: the prefix, then hex digits only.
fn valid_id(id: &str) -> bool {
    id.strip_prefix(CONSENT_PREFIX)
        .and_then(|r| r.strip_prefix('_'))
        .is_some_and(|hex| !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()))
}

fn check_label(name: &str) -> Result<(), ConsentError> {
    let n = name.trim().chars().count();
    if n == 0 || n > MAX_LABEL_CHARS {
        return Err(ConsentError::BadName);
    }
    Ok(())
}

/// A BCP 47 tag's shape: 1-35 ASCII letters, digits and hyphens (it is stored as given).
pub fn valid_tag(tag: &str) -> bool {
    (1..=35).contains(&tag.len())
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

impl ConsentStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    fn write_record(&self, c: &Consent) -> Result<(), ConsentError> {
        let path = self.record_path(&c.id);
        let text = serde_json::to_string_pretty(c).map_err(|e| ConsentError::Invalid {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        let mut f = PartialFile::create(&path).map_err(io(&path))?;
        f.write_all(text.as_bytes()).map_err(io(&path))?;
        f.commit().map_err(io(&path))
    }

    /// Keeps a recording (already checked to be audio of `seconds`) under a new id. `ext` is the
    /// recording's file extension (anything but 1-8 ASCII letters and digits becomes `audio`).
    pub fn create(
        &self,
        name: &str,
        language: &str,
        recording: &[u8],
        ext: Option<&str>,
        seconds: f64,
    ) -> Result<Consent, ConsentError> {
        check_label(name)?;
        std::fs::create_dir_all(&self.dir).map_err(io(&self.dir))?;
        let ext = ext
            .filter(|e| (1..=8).contains(&e.len()) && e.chars().all(|c| c.is_ascii_alphanumeric()))
            .unwrap_or("audio")
            .to_ascii_lowercase();
        let id = super::new_id(CONSENT_PREFIX);
        // Not `ID.EXT`: an upload named `x.json` would be overwritten by its own record.
        let file = format!("{id}.recording.{ext}");
        let audio_path = self.dir.join(&file);
        let mut f = PartialFile::create(&audio_path).map_err(io(&audio_path))?;
        f.write_all(recording).map_err(io(&audio_path))?;
        f.commit().map_err(io(&audio_path))?;
        let consent = Consent {
            id,
            name: name.trim().to_owned(),
            language: language.trim().to_owned(),
            created_at: super::unix_now(),
            recording: file,
            seconds,
        };
        if let Err(e) = self.write_record(&consent) {
            let _ = std::fs::remove_file(&audio_path);
            return Err(e);
        }
        Ok(consent)
    }

    pub fn get(&self, id: &str) -> Result<Consent, ConsentError> {
        if !valid_id(id) {
            return Err(ConsentError::NotFound(id.to_owned()));
        }
        let path = self.record_path(id);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ConsentError::NotFound(id.to_owned()));
            }
            Err(e) => return Err(io(&path)(e)),
        };
        let c: Consent = serde_json::from_str(&text).map_err(|e| ConsentError::Invalid {
            path: path.clone(),
            msg: e.to_string(),
        })?;
        if c.id != id {
            return Err(ConsentError::Invalid {
                path,
                msg: format!("it holds the id {:?}", c.id),
            });
        }
        Ok(c)
    }

    /// Every consent, oldest first (ties by id).
    pub fn list(&self) -> Result<Vec<Consent>, ConsentError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(&self.dir)(e)),
        };
        let mut out = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let Some(id) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".json"))
            else {
                continue;
            };
            if valid_id(id) {
                // One unreadable record must not hide the others.
                match self.get(id) {
                    Ok(c) => out.push(c),
                    Err(e) => tracing::warn!("skipping a consent record: {e}"),
                }
            }
        }
        out.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(out)
    }

    /// Gives a consent a new label.
    pub fn rename(&self, id: &str, name: &str) -> Result<Consent, ConsentError> {
        check_label(name)?;
        let mut c = self.get(id)?;
        c.name = name.trim().to_owned();
        self.write_record(&c)?;
        Ok(c)
    }

    /// Deletes a consent's record, then its recording.
    pub fn delete(&self, id: &str) -> Result<Consent, ConsentError> {
        let c = self.get(id)?;
        let path = self.record_path(id);
        std::fs::remove_file(&path).map_err(io(&path))?;
        let _ = std::fs::remove_file(self.dir.join(&c.recording));
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consent_is_kept_listed_renamed_and_deleted() {
        let dir = std::env::temp_dir().join(format!("onebit-consent-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = ConsentStore::new(&dir);
        assert!(store.list().unwrap().is_empty());
        let a = store
            .create(" Ana ", "en-US", b"RIFF....", Some("WAV"), 1.5)
            .unwrap();
        assert!(valid_id(&a.id), "{}", a.id);
        assert_eq!(
            (a.name.as_str(), a.recording.ends_with(".wav")),
            ("Ana", true)
        );
        assert_eq!(std::fs::read(dir.join(&a.recording)).unwrap(), b"RIFF....");
        let b = store
            .create("Ben", "de", b"x", Some("../../etc"), 2.0)
            .unwrap();
        assert!(b.recording.ends_with(".recording.audio"), "{}", b.recording);
        // An upload named .json keeps its bytes beside the record, not under it.
        let j = store
            .create("Jo", "de", b"RIFF", Some("json"), 1.0)
            .unwrap();
        assert_eq!(std::fs::read(dir.join(&j.recording)).unwrap(), b"RIFF");
        store.delete(&j.id).unwrap();
        let ids: Vec<_> = store.list().unwrap().into_iter().map(|c| c.id).collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&a.id) && ids.contains(&b.id));
        assert_eq!(store.rename(&a.id, "Ana M.").unwrap().name, "Ana M.");
        assert_eq!(store.get(&a.id).unwrap().name, "Ana M.");
        assert!(matches!(
            store.rename(&a.id, "  "),
            Err(ConsentError::BadName)
        ));
        store.delete(&a.id).unwrap();
        assert!(!dir.join(&a.recording).exists());
        assert!(matches!(store.get(&a.id), Err(ConsentError::NotFound(_))));
        assert!(matches!(
            store.delete(&a.id),
            Err(ConsentError::NotFound(_))
        ));
        for bad in ["../cons_1", "cons_", "cons_xyz", "voice_12", "cons_1/.."] {
            assert!(
                matches!(store.get(bad), Err(ConsentError::NotFound(_))),
                "{bad}"
            );
        }
        assert_eq!(store.list().unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
