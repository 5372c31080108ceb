//! `onebit_logits.json`: what `onebit-tts models optimize` changed about the decoder's logits.
//!
//! A package without the file has the exporter's head: logits `[batch, seq, vocab_size]`, index =
//! token id. An optimized package says here whether only the last position is projected
//! (`[batch, 1, width]`) and whether the head was cut to the speech block plus a few extra ids (the
//! stop ids), in which case the logits row is compact: the 65,536 speech ids first, in order, then
//! `extra_ids` in the order listed. This file is the only place that mapping is written down; the
//! engine reads it once ([`crate::engine::LogitsLayout`]).

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The file name, beside genai_config.json.
pub const LOGITS_MANIFEST: &str = "onebit_logits.json";

/// The manifest's format version.
pub const LOGITS_MANIFEST_FORMAT: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogitsManifest {
    pub format: u32,
    /// The lm_head sees the last position only: logits are `[batch, 1, width]` in prefill too.
    pub last_position_only: bool,
    /// The head's rows were cut to these ids; `None` keeps the full vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speech_head: Option<SpeechHead>,
    /// Where the package came from (informational).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl Default for LogitsManifest {
    /// The exporter's head: every position, every id.
    fn default() -> Self {
        Self {
            format: LOGITS_MANIFEST_FORMAT,
            last_position_only: false,
            speech_head: None,
            source: None,
        }
    }
}

/// A compact head: logit `i` is token `speech_first_id + i` for `i < speech_count`, then
/// `extra_ids[i - speech_count]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeechHead {
    pub speech_first_id: u32,
    pub speech_count: u32,
    pub extra_ids: Vec<u32>,
}

impl SpeechHead {
    /// Logits per row.
    pub fn width(&self) -> usize {
        self.speech_count as usize + self.extra_ids.len()
    }

    /// The row index of token `id`, if the head has it.
    pub fn position(&self, id: u32) -> Option<usize> {
        if (self.speech_first_id..self.speech_first_id + self.speech_count).contains(&id) {
            return Some((id - self.speech_first_id) as usize);
        }
        self.extra_ids
            .iter()
            .position(|&e| e == id)
            .map(|i| self.speech_count as usize + i)
    }

    /// The token id of row index `pos`.
    pub fn id_at(&self, pos: usize) -> Option<u32> {
        let count = self.speech_count as usize;
        if pos < count {
            Some(self.speech_first_id + pos as u32)
        } else {
            self.extra_ids.get(pos - count).copied()
        }
    }

    /// Checks the ids are distinct and inside the vocabulary.
    pub fn validate(&self, vocab_size: usize) -> Result<(), String> {
        let end = self.speech_first_id as u64 + u64::from(self.speech_count);
        if self.speech_count == 0 || end > vocab_size as u64 {
            return Err(format!(
                "speech block {}..{end} is empty or beyond vocab_size {vocab_size}",
                self.speech_first_id
            ));
        }
        for (i, &id) in self.extra_ids.iter().enumerate() {
            if id as usize >= vocab_size {
                return Err(format!("extra id {id} is beyond vocab_size {vocab_size}"));
            }
            if (self.speech_first_id..end as u32).contains(&id) {
                return Err(format!("extra id {id} is inside the speech block"));
            }
            if self.extra_ids[..i].contains(&id) {
                return Err(format!("extra id {id} is listed twice"));
            }
        }
        Ok(())
    }
}

impl LogitsManifest {
    /// Reads `dir/onebit_logits.json`; a package without it has the default head.
    pub fn load(dir: &Path) -> Result<Self, super::PackageError> {
        let path = dir.join(LOGITS_MANIFEST);
        if !path.exists() {
            return Ok(Self::default());
        }
        let m: Self = super::read_json(&path, "onebit_logits.json (written by models optimize)")?;
        if m.format != LOGITS_MANIFEST_FORMAT {
            return Err(super::PackageError::Invalid {
                path,
                msg: format!(
                    "format {} is not the one this build reads ({LOGITS_MANIFEST_FORMAT})",
                    m.format
                ),
            });
        }
        Ok(m)
    }

    /// Whether any lever was applied.
    pub fn is_optimized(&self) -> bool {
        self.last_position_only || self.speech_head.is_some()
    }

    /// Logits per row for a model of `vocab_size`.
    pub fn width(&self, vocab_size: usize) -> usize {
        self.speech_head
            .as_ref()
            .map_or(vocab_size, SpeechHead::width)
    }

    /// One line for `models check`.
    pub fn describe(&self, vocab_size: usize) -> String {
        let head = match &self.speech_head {
            None => format!("full head ({vocab_size} wide, index = token id)"),
            Some(h) => format!(
                "speech-only head ({} wide: ids {}..{} then extra ids {:?})",
                h.width(),
                h.speech_first_id,
                h.speech_first_id + h.speech_count - 1,
                h.extra_ids
            ),
        };
        let pos = if self.last_position_only {
            "last position only"
        } else {
            "every position"
        };
        format!("{head}, {pos}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head() -> SpeechHead {
        SpeechHead {
            speech_first_id: 10,
            speech_count: 100,
            extra_ids: vec![5, 2],
        }
    }

    #[test]
    fn positions_round_trip() {
        let h = head();
        assert_eq!(h.width(), 102);
        for pos in 0..h.width() {
            assert_eq!(h.position(h.id_at(pos).unwrap()), Some(pos));
        }
        assert_eq!(h.position(10), Some(0));
        assert_eq!(h.position(109), Some(99));
        assert_eq!(h.position(5), Some(100));
        assert_eq!(h.position(2), Some(101));
        assert_eq!(h.position(3), None);
        assert_eq!(h.position(110), None);
        assert_eq!(h.id_at(102), None);
    }

    #[test]
    fn validate_rejects_overlaps_and_out_of_range() {
        assert!(head().validate(120).is_ok());
        assert!(head().validate(100).is_err());
        let mut h = head();
        h.extra_ids.push(50);
        assert!(h.validate(120).unwrap_err().contains("inside"));
        let mut h = head();
        h.extra_ids.push(5);
        assert!(h.validate(120).unwrap_err().contains("twice"));
        let mut h = head();
        h.extra_ids.push(500);
        assert!(h.validate(120).unwrap_err().contains("beyond"));
    }

    #[test]
    fn json_shape() {
        let m = LogitsManifest {
            last_position_only: true,
            speech_head: Some(head()),
            ..LogitsManifest::default()
        };
        let s = serde_json::to_string(&m).unwrap();
        assert_eq!(
            s,
            r#"{"format":1,"last_position_only":true,"speech_head":{"speech_first_id":10,"speech_count":100,"extra_ids":[5,2]}}"#
        );
        assert_eq!(serde_json::from_str::<LogitsManifest>(&s).unwrap(), m);
    }
}
