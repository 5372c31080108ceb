//! One timing type for every stage, so `say`, `bench`, `/metrics` and the logs agree, and the one
//! way to read a decode rate against the real-time line ([`CODES_PER_SECOND`]).

use std::time::Duration;

use crate::package::CODES_PER_SECOND;

/// Time spent per stage of one synthesis.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageTimings {
    /// Normalise + phonemise + tokenise.
    pub front_end: Duration,
    pub prefill: Duration,
    pub decode: Duration,
    pub codec: Duration,
    pub encode: Duration,
    /// From the start of the request to the first audio sample handed out.
    pub first_audio: Option<Duration>,
    pub total: Duration,
}

impl StageTimings {
    pub fn add(&mut self, o: &StageTimings) {
        self.front_end += o.front_end;
        self.prefill += o.prefill;
        self.decode += o.decode;
        self.codec += o.codec;
        self.encode += o.encode;
        self.total += o.total;
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
