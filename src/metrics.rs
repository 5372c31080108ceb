//! One timing type for every stage, so `say`, `bench`, `/metrics` and the logs agree, and the one
//! way to read a decode rate against the real-time line ([`CODES_PER_SECOND`]).

use std::time::Duration;

use serde::Serialize;

use crate::package::CODES_PER_SECOND;

/// Time spent per stage of one synthesis.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimings {
    /// Normalise + phonemise + tokenise.
    pub front_end: Duration,
    /// The backbone's runs over the prompt: not the time they waited for codec runs.
    pub prefill: Duration,
    /// The backbone's runs over the codes: neither the time they waited for codec runs nor the
    /// time spent handing a code on (the codec's and the output's stages).
    pub decode: Duration,
    /// How long the backbone's runs for this request waited for codec runs (`--cpu-turns`),
    /// in its prefill and in its decode: for its own windows, which the codec stage counts, and
    /// for other requests'. A lone request's stages add up without it; beside others, the other
    /// requests' windows it made way for are in no stage of its own.
    pub turn_wait: crate::runtime::TurnWait,
    /// Decoding, without the codec's waits for a backbone run in progress.
    pub codec: Duration,
    pub encode: Duration,
    /// From the start of the request to the first audio sample handed out.
    pub first_audio: Option<Duration>,
    /// How long a listener who starts playing at the first audio, and waits whenever the audio
    /// runs out, would have waited after the first audio. The audio it has is what went into the
    /// output pipeline: exact for WAV and PCM at the codec's rate (what `bench` streams); where a
    /// resampler or an encoder holds back a few milliseconds, the waits are that much short.
    pub stall: Duration,
    pub total: Duration,
}

impl StageTimings {
    pub fn add(&mut self, o: &StageTimings) {
        self.front_end += o.front_end;
        self.prefill += o.prefill;
        self.decode += o.decode;
        self.turn_wait += o.turn_wait;
        self.codec += o.codec;
        self.encode += o.encode;
        self.total += o.total;
        self.stall += o.stall;
        self.first_audio = self.first_audio.or(o.first_audio);
    }
}

/// Codes per second of decode time (the real-time line is [`CODES_PER_SECOND`]).
pub fn codes_per_second(codes: usize, decode: Duration) -> f64 {
    let s = decode.as_secs_f64();
    if s > 0.0 { codes as f64 / s } else { 0.0 }
}

/// How many times the real-time line a decode rate is (above 1 keeps up with playback).
pub fn times_real_time(codes_per_s: f64) -> f64 {
    codes_per_s / CODES_PER_SECOND
}

/// Real-time factor: wall time over audio time (below 1 is faster than real time).
pub fn rtf(wall: Duration, audio_seconds: f64) -> f64 {
    if audio_seconds > 0.0 {
        wall.as_secs_f64() / audio_seconds
    } else {
        0.0
    }
}

/// The numbers of one synthesis as `say --json` and `bench` report them.
#[derive(Debug, Clone, Serialize)]
pub struct RunNumbers {
    pub codes: usize,
    /// `stop` (the end token), `length` (a piece reached its code limit) or `cancelled`.
    pub finish: &'static str,
    pub prompt_tokens: usize,
    /// Of `prompt_tokens`, those whose KV came from the voice-prefix cache; the prefill rate
    /// counts only the others, the ones prefilled.
    pub cached_tokens: usize,
    pub audio_s: f64,
    /// Codes per second of decode time.
    pub codes_per_s: f64,
    pub x_real_time: f64,
    pub rtf: f64,
    pub prefill_tok_per_s: f64,
    pub first_audio_ms: Option<f64>,
    /// [`StageTimings::stall`]: 0 when the audio kept ahead of playback from the first sample.
    pub stall_ms: f64,
    pub front_end_ms: f64,
    pub prefill_ms: f64,
    pub decode_ms: f64,
    /// [`StageTimings::turn_wait`], both stages.
    pub turn_wait_ms: f64,
    pub codec_ms: f64,
    pub encode_ms: f64,
    pub total_ms: f64,
    /// On the NPU: commands its driver counted as completed for this run (`None`: not on the
    /// NPU, or not countable there).
    pub npu_commands: Option<u64>,
}

impl RunNumbers {
    /// `cached_tokens` of the `prompt_tokens` were not prefilled: the prefill rate counts the
    /// others.
    pub fn new(
        codes: usize,
        finish: &'static str,
        prompt_tokens: usize,
        cached_tokens: usize,
        audio_s: f64,
        t: &StageTimings,
    ) -> Self {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let cps = codes_per_second(codes, t.decode);
        Self {
            codes,
            finish,
            prompt_tokens,
            cached_tokens,
            audio_s,
            codes_per_s: cps,
            x_real_time: times_real_time(cps),
            rtf: rtf(t.total, audio_s),
            prefill_tok_per_s: prompt_tokens.saturating_sub(cached_tokens) as f64
                / t.prefill.as_secs_f64().max(1e-9),
            first_audio_ms: t.first_audio.map(ms),
            stall_ms: ms(t.stall),
            front_end_ms: ms(t.front_end),
            prefill_ms: ms(t.prefill),
            decode_ms: ms(t.decode),
            turn_wait_ms: ms(t.turn_wait.total()),
            codec_ms: ms(t.codec),
            encode_ms: ms(t.encode),
            total_ms: ms(t.total),
            npu_commands: None,
        }
    }
}
