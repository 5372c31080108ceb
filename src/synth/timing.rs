//! Timing: where each piece of a request lies in its audio, and where its words probably do;
//! written out as SRT or WebVTT captions or as a JSON timing document.
//!
//! A piece's start and end are exact: every code is 20 ms of audio (480 samples at the codec's
//! 24 kHz) and the audio stage counts every sample it hands out, pauses included. Word times are
//! not: the model gives no alignment, so they are an estimate spread over the piece's span by the
//! length of each word's phonemes, and every output says so (`words_estimated`).

use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Characters per caption line: the usual broadcast limit, so a long piece's cue reads as a few
/// short lines rather than one that runs off the screen.
pub const CAPTION_LINE_CHARS: usize = 42;

/// One word's estimated place in the audio, in seconds of output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WordTiming {
    pub word: String,
    pub start: f64,
    pub end: f64,
}

/// Where one piece of a request lies in the audio, in seconds of output (after the speed
/// change; resampling changes no time).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PieceTiming {
    /// The piece's place among the request's pieces, from 0.
    pub index: usize,
    /// The piece's text as spoken (normalised).
    pub text: String,
    /// Its first sample: after the pause before it.
    pub start: f64,
    /// One past its last sample; `end - start` is `codes` x 20 ms / speed.
    pub end: f64,
    /// Codes the piece was made of.
    pub codes: usize,
    /// Estimated word times inside `start..end` ([`estimate_words`]).
    pub words: Vec<WordTiming>,
}

impl PieceTiming {
    /// `span`: the piece's samples at the codec rate, as the audio stage emitted them (counted
    /// from the request's first sample); `samples_per_second`: codec-rate samples per second of
    /// output, i.e. the codec rate times the speed. `prepared` is the piece's model input, which
    /// the word estimate weighs the words by.
    pub fn new(
        index: usize,
        text: &str,
        prepared: &str,
        span: Range<usize>,
        codes: usize,
        samples_per_second: f64,
    ) -> Self {
        let start = span.start as f64 / samples_per_second;
        let end = span.end as f64 / samples_per_second;
        Self {
            index,
            text: text.to_owned(),
            start,
            end,
            codes,
            words: estimate_words(text, prepared, start, end),
        }
    }
}

/// The timing of a whole request: its pieces in order and the length of its audio.
#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// The output's sample rate (times do not depend on it; it tells a reader which file).
    pub sample_rate: u32,
    pub speed: f32,
    /// Seconds of audio in all: the last piece's end plus any pause after it.
    pub audio_seconds: f64,
    pub pieces: Vec<PieceTiming>,
}

/// The JSON timing document: the timeline with the word times labelled as estimates.
#[derive(Serialize)]
struct Document<'a> {
    sample_rate: u32,
    speed: f32,
    audio_seconds: f64,
    pieces: &'a [PieceTiming],
    words_estimated: bool,
}

impl Timeline {
    pub fn new(sample_rate: u32, speed: f32) -> Self {
        Self {
            sample_rate,
            speed,
            audio_seconds: 0.0,
            pieces: Vec::new(),
        }
    }

    fn document(&self) -> Document<'_> {
        Document {
            sample_rate: self.sample_rate,
            speed: self.speed,
            audio_seconds: self.audio_seconds,
            pieces: &self.pieces,
            // No word time is ever measured: a reader must not take them for an alignment.
            words_estimated: true,
        }
    }

    /// The JSON timing document (pretty-printed: a caption editor or a person reads it).
    pub fn to_json(&self) -> String {
        // Strings and finite numbers only: serialising cannot fail.
        serde_json::to_string_pretty(&self.document()).unwrap_or_default() + "\n"
    }

    /// The JSON timing document as a value, to embed in another document.
    pub fn to_value(&self) -> serde_json::Value {
        serde_json::to_value(self.document()).unwrap_or_default()
    }

    /// SubRip captions: one cue per piece, `HH:MM:SS,mmm`.
    pub fn to_srt(&self) -> String {
        let cues: Vec<String> = self
            .pieces
            .iter()
            .enumerate()
            .map(|(n, p)| {
                format!(
                    "{}\n{} --> {}\n{}\n",
                    n + 1,
                    clock(p.start, ','),
                    clock(p.end, ','),
                    wrap(&p.text, CAPTION_LINE_CHARS).join("\n")
                )
            })
            .collect();
        cues.join("\n")
    }

    /// WebVTT captions: one cue per piece, `HH:MM:SS.mmm`, `&`, `<` and `>` escaped (cue text
    /// is markup in WebVTT, and `-->` in it would end a cue).
    pub fn to_vtt(&self) -> String {
        let mut out = String::from("WEBVTT\n");
        for (n, p) in self.pieces.iter().enumerate() {
            let lines: Vec<String> = wrap(&p.text, CAPTION_LINE_CHARS)
                .iter()
                .map(|l| vtt_escape(l))
                .collect();
            out.push_str(&format!(
                "\n{}\n{} --> {}\n{}\n",
                n + 1,
                clock(p.start, '.'),
                clock(p.end, '.'),
                lines.join("\n")
            ));
        }
        out
    }
}

/// A captions file's format, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptionFormat {
    Srt,
    Vtt,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum TimingError {
    #[error(
        "{}: unknown captions extension; name the file .srt, .vtt or .json (the extension picks the format)",
        path.display()
    )]
    UnknownExtension { path: PathBuf },
}

impl CaptionFormat {
    /// The format a file name asks for: `.srt`, `.vtt` or `.json` (any case).
    pub fn from_path(path: &Path) -> Result<Self, TimingError> {
        let ext = path
            .extension()
            .map(|e| e.to_string_lossy().to_ascii_lowercase());
        match ext.as_deref() {
            Some("srt") => Ok(Self::Srt),
            Some("vtt") => Ok(Self::Vtt),
            Some("json") => Ok(Self::Json),
            _ => Err(TimingError::UnknownExtension {
                path: path.to_path_buf(),
            }),
        }
    }

    /// The timeline in this format.
    pub fn render(self, timeline: &Timeline) -> String {
        match self {
            Self::Srt => timeline.to_srt(),
            Self::Vtt => timeline.to_vtt(),
            Self::Json => timeline.to_json(),
        }
    }
}

/// Estimated word times for a piece spoken over `start..end`: its words (whitespace-separated
/// tokens of `text` with a letter or digit; punctuation alone takes no time) share the span in
/// proportion to their length. When `prepared` (the model's input: espeak-ng's phonemes with a
/// space between words, or the normalised text of a BPE model) has as many words, each word is
/// weighed by its phoneme characters, which follow its spoken length better than its spelling;
/// otherwise (espeak-ng joined or split some words) by its written characters. Stress marks and
/// punctuation weigh nothing. The words tile the span: the first starts at `start`, the last ends
/// at `end`, and the times between words are rounded to the millisecond (an estimate has no
/// finer meaning, and captions count milliseconds).
pub fn estimate_words(text: &str, prepared: &str, start: f64, end: f64) -> Vec<WordTiming> {
    let words: Vec<&str> = text.split_whitespace().filter(|w| weight(w) > 0).collect();
    let spoken: Vec<usize> = prepared
        .split_whitespace()
        .map(weight)
        .filter(|&w| w > 0)
        .collect();
    let weights: Vec<usize> = if spoken.len() == words.len() {
        spoken
    } else {
        words.iter().map(|w| weight(w)).collect()
    };
    let total: usize = weights.iter().sum();
    let span = end - start;
    let mut done = 0usize;
    let mut at = start;
    words
        .iter()
        .zip(&weights)
        .map(|(word, &w)| {
            done += w;
            let to = if done == total {
                end
            } else {
                let t = start + span * done as f64 / total as f64;
                ((t * 1000.0).round() / 1000.0).clamp(start, end)
            };
            let t = WordTiming {
                word: (*word).to_owned(),
                start: at,
                end: to,
            };
            at = to;
            t
        })
        .collect()
}

/// A word's length for the estimate: its letters and digits, less IPA's stress marks (which are
/// letters to Unicode but no sound of their own).
fn weight(word: &str) -> usize {
    word.chars()
        .filter(|&c| c.is_alphanumeric() && !matches!(c, 'ˈ' | 'ˌ'))
        .count()
}

/// `HH:MM:SS<sep>mmm`, to the nearest millisecond (hours go past 99 if they must).
fn clock(seconds: f64, sep: char) -> String {
    let ms = (seconds.max(0.0) * 1000.0).round() as u64;
    format!(
        "{:02}:{:02}:{:02}{sep}{:03}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    )
}

/// Greedy word wrap at `width` characters; a word longer than that has a line of its own.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
}

fn vtt_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timeline() -> Timeline {
        // Two pieces at the codec rate, speed 1: 120 codes, the 0.2 s join, 60 codes.
        let rate = 24_000.0;
        let mut t = Timeline::new(48_000, 1.0);
        t.pieces.push(PieceTiming::new(
            0,
            "Hello there.",
            "həlˈoʊ ðˈɛɹ.",
            0..57_600,
            120,
            rate,
        ));
        t.pieces.push(PieceTiming::new(
            1,
            "Fish & <chips> are served on the terrace by the sea at noon, daily.",
            "x",
            62_400..91_200,
            60,
            rate,
        ));
        t.audio_seconds = 91_200.0 / rate;
        t
    }

    #[test]
    fn piece_times_come_from_the_samples() {
        let t = timeline();
        assert_eq!((t.pieces[0].start, t.pieces[0].end), (0.0, 2.4));
        assert_eq!((t.pieces[1].start, t.pieces[1].end), (2.6, 3.8));
        // At speed 2 the same samples last half as long.
        let p = PieceTiming::new(0, "a", "a", 4_800..62_400, 120, 48_000.0);
        assert_eq!((p.start, p.end), (0.1, 1.3));
    }

    #[test]
    fn srt_has_one_cue_per_piece_with_comma_milliseconds_and_wrapped_text() {
        assert_eq!(
            timeline().to_srt(),
            "1\n00:00:00,000 --> 00:00:02,400\nHello there.\n\n\
             2\n00:00:02,600 --> 00:00:03,800\nFish & <chips> are served on the terrace\nby the sea at noon, daily.\n"
        );
    }

    #[test]
    fn vtt_has_its_header_dot_milliseconds_and_escapes_markup() {
        assert_eq!(
            timeline().to_vtt(),
            "WEBVTT\n\n1\n00:00:00.000 --> 00:00:02.400\nHello there.\n\n\
             2\n00:00:02.600 --> 00:00:03.800\nFish &amp; &lt;chips&gt; are served on the terrace\nby the sea at noon, daily.\n"
        );
        let mut t = Timeline::new(24_000, 1.0);
        t.pieces
            .push(PieceTiming::new(0, "a --> b", "", 0..480, 1, 24_000.0));
        assert!(t.to_vtt().ends_with("\na --&gt; b\n"), "{}", t.to_vtt());
    }

    #[test]
    fn clock_rounds_to_the_millisecond_and_counts_hours() {
        assert_eq!(clock(0.0, ','), "00:00:00,000");
        assert_eq!(clock(0.0004, '.'), "00:00:00.000");
        assert_eq!(clock(0.0005, '.'), "00:00:00.001");
        assert_eq!(clock(61.02, ','), "00:01:01,020");
        assert_eq!(clock(3600.0 * 101.0 + 59.9999, '.'), "101:01:00.000");
    }

    #[test]
    fn json_document_labels_the_words_as_estimates() {
        let mut t = Timeline::new(24_000, 2.0);
        t.pieces.push(PieceTiming::new(
            0,
            "Hi you",
            "hˈaɪ juː",
            0..48_000,
            100,
            48_000.0,
        ));
        t.audio_seconds = 1.0;
        assert_eq!(
            t.to_json(),
            r#"{
  "sample_rate": 24000,
  "speed": 2.0,
  "audio_seconds": 1.0,
  "pieces": [
    {
      "index": 0,
      "text": "Hi you",
      "start": 0.0,
      "end": 1.0,
      "codes": 100,
      "words": [
        {
          "word": "Hi",
          "start": 0.0,
          "end": 0.5
        },
        {
          "word": "you",
          "start": 0.5,
          "end": 1.0
        }
      ]
    }
  ],
  "words_estimated": true
}
"#
        );
    }

    #[test]
    fn words_are_weighed_by_their_phonemes_when_the_counts_match() {
        // "həlˈoʊ" weighs 5 (the stress mark nothing), "ðˈɛɹ." 3: 8 in all over 0.8 s.
        let w = estimate_words("Hello there.", "həlˈoʊ ðˈɛɹ.", 1.0, 1.8);
        let got: Vec<(&str, f64, f64)> = w.iter().map(|w| (&*w.word, w.start, w.end)).collect();
        assert_eq!(got, [("Hello", 1.0, 1.5), ("there.", 1.5, 1.8)]);
    }

    #[test]
    fn words_fall_back_to_their_letters_when_the_phonemes_do_not_split_alike() {
        // espeak-ng joins "of the" into one word: 3 phoneme words for 4 text words, so the
        // written letters (2, 3, 3, 1 of 9) share the 1.8 s; the dash alone is no word.
        let w = estimate_words("of the cat — a", "ʌvðə kˈæt ɐ", 0.0, 1.8);
        let got: Vec<(&str, f64, f64)> = w.iter().map(|w| (&*w.word, w.start, w.end)).collect();
        assert_eq!(
            got,
            [
                ("of", 0.0, 0.4),
                ("the", 0.4, 1.0),
                ("cat", 1.0, 1.6),
                ("a", 1.6, 1.8)
            ]
        );
        // Between words, times are rounded to the millisecond; the ends stay the piece's.
        let w = estimate_words("a b c", "x", 0.0125, 1.0);
        let got: Vec<(&str, f64, f64)> = w.iter().map(|w| (&*w.word, w.start, w.end)).collect();
        assert_eq!(
            got,
            [("a", 0.0125, 0.342), ("b", 0.342, 0.671), ("c", 0.671, 1.0)]
        );
        // A piece with nothing but punctuation in its text has no words.
        assert!(estimate_words("— !", "", 0.0, 1.0).is_empty());
    }

    #[test]
    fn caption_format_comes_from_the_extension() {
        assert_eq!(
            CaptionFormat::from_path(Path::new("a/b.SRT")).unwrap(),
            CaptionFormat::Srt
        );
        assert_eq!(
            CaptionFormat::from_path(Path::new("b.vtt")).unwrap(),
            CaptionFormat::Vtt
        );
        assert_eq!(
            CaptionFormat::from_path(Path::new("b.json")).unwrap(),
            CaptionFormat::Json
        );
        for bad in ["b.txt", "b", "srt"] {
            let e = CaptionFormat::from_path(Path::new(bad)).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!(
                    "{bad}: unknown captions extension; name the file .srt, .vtt or .json (the extension picks the format)"
                )
            );
        }
    }
}
