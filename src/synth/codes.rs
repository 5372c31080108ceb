//! Saved speech codes: what a synthesis generated, piece by piece, as a JSON document that
//! `say --codes` writes (and `say --json` prints) and `onebit-tts decode` turns back into audio.
//! The vendor's users save codes and decode them later; this is that, with enough of the run
//! (prompt ids, seeds, finish reasons) to compare it against another implementation.
//!
//! Decoding goes through the synthesis's own audio stage, so the same codes, decoding mode and
//! output settings give the same bytes the synthesis wrote.

use std::ops::ControlFlow;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::audio::OutputSpec;
use crate::codec::CodecPool;
use crate::codec::stream::Windows;
use crate::package::SPEECH_CODES;

use super::audio::{AudioStage, AudioTally};
use super::{SpeechRequest, SynthError, SynthEvent, SynthesisReport, Synthesizer};

/// The `codes_format` of the documents this version writes and reads.
pub const CODES_FORMAT: &str = "onebit-tts.codes.v1";
/// The `codes_format` of a document decoded in other windows than the vendor's (`windows`):
/// a version that reads only [`CODES_FORMAT`] refuses it rather than decode it in the vendor's
/// windows, which would give other samples.
pub const CODES_FORMAT_WINDOWS: &str = "onebit-tts.codes.v2";
/// The `codes_format` of a document whose first streamed chunk is not the vendor's size
/// (`windows.first`): a version that reads [`CODES_FORMAT_WINDOWS`] ignores that field and would
/// decode the first chunk in the vendor's size, so it must refuse this one.
pub const CODES_FORMAT_FIRST: &str = "onebit-tts.codes.v3";

/// The oldest format that records `windows` exactly.
fn format_of(windows: Windows) -> &'static str {
    if windows.is_vendor() {
        CODES_FORMAT
    } else if windows.first == Windows::VENDOR.first {
        CODES_FORMAT_WINDOWS
    } else {
        CODES_FORMAT_FIRST
    }
}

/// How the codes were turned into audio: decoding changes the samples, so it is part of the
/// record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decoding {
    /// Each piece decoded in one run once it ended (files: `say`, non-streamed HTTP responses).
    Whole,
    /// Overlapping windows while codes arrived (the vendor's unless `windows` says otherwise),
    /// with the voice's codes as left context (streamed HTTP responses).
    Windowed,
}

fn is_vendor(w: &Windows) -> bool {
    w.is_vendor()
}

/// The codes of one synthesis.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpeechCodes {
    /// [`CODES_FORMAT`].
    pub codes_format: String,
    /// The model package that generated them (its directory name; informative).
    pub model: String,
    pub voice: String,
    pub text: String,
    /// The first piece's sampler seed (each later piece runs with seed + its index).
    pub seed: u64,
    /// The request's finish reason: stop, length or cancelled.
    pub finish_reason: String,
    /// The codec rate the codes are for (NeuCodec: 24000).
    pub sample_rate: u32,
    pub decoding: Decoding,
    /// The window layout of windowed decoding (absent: the vendor's).
    #[serde(default, skip_serializing_if = "is_vendor")]
    pub windows: Windows,
    /// The voice's reference codes: left context of windowed decoding.
    pub reference_codes: Vec<u32>,
    /// Pieces the text was cut into; more than `pieces` lists when max_new_tokens ran out or the
    /// synthesis was cancelled (the fades between pieces were planned for this many).
    pub planned_pieces: usize,
    pub pieces: Vec<PieceCodes>,
}

/// One piece of a synthesis: its prompt and what it generated.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PieceCodes {
    pub text: String,
    pub prompt_ids: Vec<u32>,
    /// The most codes the piece was allowed.
    pub max_new_tokens: usize,
    pub seed: u64,
    pub finish_reason: String,
    pub codes: Vec<u32>,
    /// Seconds of silence markup put before the piece (absent: the usual join).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_before_s: Option<f64>,
    /// Seconds of silence markup put after it (the end of the text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_after_s: Option<f64>,
}

/// A recorded pause, checked as markup's are.
fn pause(seconds: Option<f64>) -> Result<Option<std::time::Duration>, CodesError> {
    seconds
        .map(|s| {
            std::time::Duration::try_from_secs_f64(s)
                .ok()
                .filter(|d| *d <= crate::text::markup::MAX_PAUSE)
                .ok_or(CodesError::Pause(s))
        })
        .transpose()
}

/// Why a codes document cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodesError {
    #[error("not a codes document: {0}")]
    Json(#[from] serde_json::Error),
    #[error(
        "codes_format is {found:?}; this version reads {CODES_FORMAT:?}, {CODES_FORMAT_WINDOWS:?} and {CODES_FORMAT_FIRST:?} (write the codes again with this version's `say --codes`)"
    )]
    Format { found: String },
    #[error("a pause of {0} s is not one markup can make (0 to 10 s)")]
    Pause(f64),
    #[error("piece {piece}, code {index}: {code} is outside the codec's 0..{max}")]
    CodeOutOfRange {
        piece: usize,
        index: usize,
        code: u32,
        max: u32,
    },
    #[error("reference code {index}: {code} is outside the codec's 0..{max}")]
    ReferenceOutOfRange { index: usize, code: u32, max: u32 },
    #[error("the codes are for a {found} Hz codec; this codec makes {codec} Hz")]
    SampleRate { found: u32, codec: u32 },
}

impl SpeechCodes {
    /// The record of a finished synthesis of `req` by `synth`.
    pub fn of(
        synth: &Synthesizer,
        req: &SpeechRequest,
        report: &SynthesisReport,
    ) -> Result<Self, SynthError> {
        let voices = synth.voices();
        let voice = voices.get(&req.voice)?;
        let pkg = synth.package();
        let model = pkg.name();
        // Only windowed decoding has a layout; a whole decode records none.
        let windows = if req.output.streaming {
            synth.windows
        } else {
            Windows::VENDOR
        };
        Ok(Self {
            codes_format: format_of(windows).to_owned(),
            model,
            voice: req.voice.clone(),
            text: req.text.clone(),
            seed: report.seed,
            finish_reason: report.stop.finish_reason().to_owned(),
            sample_rate: report.sample_rate,
            decoding: if req.output.streaming {
                Decoding::Windowed
            } else {
                Decoding::Whole
            },
            windows,
            reference_codes: voice.codes.clone(),
            planned_pieces: report.planned_pieces,
            pieces: report
                .pieces
                .iter()
                .map(|p| PieceCodes {
                    text: p.text.clone(),
                    prompt_ids: p.prompt_ids.clone(),
                    max_new_tokens: p.max_new_tokens,
                    seed: p.seed,
                    finish_reason: p.stop.finish_reason().to_owned(),
                    codes: p.codes.clone(),
                    pause_before_s: p.pause_before.map(|d| d.as_secs_f64()),
                    pause_after_s: p.pause_after.map(|d| d.as_secs_f64()),
                })
                .collect(),
        })
    }

    /// Parses and checks a document: its format, and every code within the codec's range.
    /// Fields it does not know are ignored, so `say --json` output reads as well.
    pub fn from_json(text: &str) -> Result<Self, CodesError> {
        // The format first, so a document of another version says so rather than which of its
        // fields does not parse.
        #[derive(Deserialize)]
        struct Head {
            codes_format: Option<String>,
        }
        let head: Head = serde_json::from_str(text)?;
        match head.codes_format {
            Some(f)
                if [CODES_FORMAT, CODES_FORMAT_WINDOWS, CODES_FORMAT_FIRST]
                    .contains(&f.as_str()) => {}
            found => {
                return Err(CodesError::Format {
                    found: found.unwrap_or_else(|| "missing".to_owned()),
                });
            }
        }
        let me: Self = serde_json::from_str(text)?;
        for (index, &code) in me.reference_codes.iter().enumerate() {
            if code >= SPEECH_CODES {
                return Err(CodesError::ReferenceOutOfRange {
                    index,
                    code,
                    max: SPEECH_CODES - 1,
                });
            }
        }
        for (piece, p) in me.pieces.iter().enumerate() {
            if let Some((index, &code)) = p
                .codes
                .iter()
                .enumerate()
                .find(|(_, c)| **c >= SPEECH_CODES)
            {
                return Err(CodesError::CodeOutOfRange {
                    piece,
                    index,
                    code,
                    max: SPEECH_CODES - 1,
                });
            }
        }
        Ok(me)
    }

    /// The document on one line: thousands of codes pretty-printed one per line would bury the
    /// few fields a reader looks for (`jq .` lays it out).
    pub fn to_json(&self) -> String {
        // Plain data of strings and numbers: serialising it cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Every generated code, in order.
    pub fn all_codes(&self) -> impl Iterator<Item = u32> + '_ {
        self.pieces.iter().flat_map(|p| p.codes.iter().copied())
    }

    /// Decodes the codes into `output`'s format through the synthesis's audio stage, in the
    /// recorded decoding mode. `output.streaming` only decides the container's header (a streamed
    /// WAV has an unknown length). `sink` gets the bytes in order ([`SynthEvent::Audio`]), then a
    /// whole file's [`SynthEvent::Patch`]es, and may stop.
    pub fn decode(
        &self,
        codec: &CodecPool,
        codec_rate: u32,
        output: &OutputSpec,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<AudioTally, SynthError> {
        if self.sample_rate != codec_rate {
            return Err(SynthError::Codes(CodesError::SampleRate {
                found: self.sample_rate,
                codec: codec_rate,
            }));
        }
        let mut audio = AudioStage::new(
            codec,
            output,
            codec_rate,
            &self.reference_codes,
            self.planned_pieces.max(self.pieces.len()),
            (self.decoding == Decoding::Windowed).then_some(self.windows),
            Instant::now(),
        )?;
        let mut events = |ev: SynthEvent<'_>| match ev {
            SynthEvent::Audio(_) | SynthEvent::Patch { .. } => sink(ev),
            _ => ControlFlow::Continue(()),
        };
        for (i, piece) in self.pieces.iter().enumerate() {
            if !audio.begin_piece(i, pause(piece.pause_before_s)?, &mut events)? {
                return Ok(audio.tally());
            }
            for &code in &piece.codes {
                if !audio.push_code(code, &mut events)? {
                    return Ok(audio.tally());
                }
            }
            if !audio.end_piece(&piece.codes, &mut events)? {
                return Ok(audio.tally());
            }
            if let Some(d) = pause(piece.pause_after_s)?
                && !audio.silence(d, &mut events)?
            {
                return Ok(audio.tally());
            }
        }
        audio.finish(&mut events)
    }
}
