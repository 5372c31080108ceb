//! Tempo change without pitch change (WSOLA), streaming.
//!
//! WSOLA cuts the input into Hann-windowed frames taken every `speed * hop` input samples and lays
//! them down every `hop` output samples. Each frame's exact start is searched within ±10 ms of its
//! nominal position for the waveform that best continues the previous frame, so the overlap-add
//! joins waveforms in phase and the pitch is kept. Written here rather than taken from a crate:
//! the Rust WSOLA crates are single-release or tuned for music, and this is ~250 lines.

use super::AudioError;
use super::resample::check_input_rate;

pub const MIN_SPEED: f32 = 0.25;
pub const MAX_SPEED: f32 = 4.0;

/// Frame length: 30 ms holds two to three pitch periods of low voices, which the similarity
/// search needs, while staying short enough not to smear syllables.
const FRAME_SECONDS: f64 = 0.030;
/// Search range either side of the nominal position: more than half the longest pitch period of
/// speech (about 12.5 ms at 80 Hz), so a matching phase is always in reach.
const TOLERANCE_SECONDS: f64 = 0.010;

pub fn check_speed(speed: f32) -> Result<(), AudioError> {
    if speed.is_finite() && (MIN_SPEED..=MAX_SPEED).contains(&speed) {
        Ok(())
    } else {
        Err(AudioError::SpeedOutOfRange {
            speed,
            min: MIN_SPEED,
            max: MAX_SPEED,
        })
    }
}

/// Output length for `n` input samples: `round(n / speed)`.
pub fn stretched_len(n: u64, speed: f32) -> u64 {
    (n as f64 / f64::from(speed)).round() as u64
}

/// Streaming WSOLA time-stretcher for mono audio. `speed` 2.0 halves the duration.
#[derive(Debug)]
pub struct TimeStretcher {
    speed: f64,
    bypass: bool,
    frame: usize,
    hop: usize,
    tolerance: usize,
    window: Vec<f32>,
    first_window: Vec<f32>,
    /// Input from absolute sample `input_start` on.
    input: Vec<f32>,
    input_start: u64,
    input_total: u64,
    /// Next frame index and the absolute input start chosen for the previous frame.
    next_frame: u64,
    prev_start: u64,
    /// Overlap-add accumulator from absolute output sample `acc_start` on.
    acc: Vec<f32>,
    acc_start: u64,
    /// Finished samples from `emitted` up to `acc_start`, held back by the length cap.
    ready: Vec<f32>,
    emitted: u64,
    // Scratch for the coarse search, kept to avoid an allocation per frame.
    dec_input: Vec<f32>,
    dec_target: Vec<f32>,
}

impl TimeStretcher {
    pub fn new(sample_rate: u32, speed: f32) -> Result<Self, AudioError> {
        check_speed(speed)?;
        check_input_rate(sample_rate)?;
        let rate = f64::from(sample_rate);
        let hop = ((FRAME_SECONDS * rate / 2.0).round() as usize).max(16);
        let frame = 2 * hop;
        let tolerance = ((TOLERANCE_SECONDS * rate).round() as usize).max(2);
        // Periodic Hann: at 50 % overlap the windows sum to exactly one.
        let window: Vec<f32> = (0..frame)
            .map(|i| {
                let phase = 2.0 * std::f64::consts::PI * i as f64 / frame as f64;
                (0.5 - 0.5 * phase.cos()) as f32
            })
            .collect();
        // Nothing overlaps the first half of the first frame, so it is taken unwindowed.
        let first_window = (0..frame)
            .map(|i| if i < hop { 1.0 } else { window[i] })
            .collect();
        Ok(Self {
            speed: f64::from(speed),
            bypass: speed == 1.0,
            frame,
            hop,
            tolerance,
            window,
            first_window,
            input: Vec::new(),
            input_start: 0,
            input_total: 0,
            next_frame: 0,
            prev_start: 0,
            acc: Vec::new(),
            acc_start: 0,
            ready: Vec::new(),
            emitted: 0,
            dec_input: Vec::new(),
            dec_target: Vec::new(),
        })
    }

    pub fn speed(&self) -> f32 {
        self.speed as f32
    }

    fn nominal(&self, k: u64) -> u64 {
        (k as f64 * self.hop as f64 * self.speed).round() as u64
    }

    fn input_end(&self) -> u64 {
        self.input_start + self.input.len() as u64
    }

    /// Stretches what it can of `input` now.
    pub fn process(&mut self, input: &[f32]) -> Vec<f32> {
        self.input_total += input.len() as u64;
        if self.bypass {
            self.emitted += input.len() as u64;
            return input.to_vec();
        }
        self.input.extend_from_slice(input);
        while self.nominal(self.next_frame) + (self.tolerance + self.frame) as u64
            <= self.input_end()
        {
            self.add_frame();
        }
        self.drop_consumed_input();
        // Never run ahead of the length the input seen so far justifies, so the exact total
        // fixed at finish can always be met.
        let limit = (self.input_total as f64 / self.speed).floor() as u64;
        self.emit_until(limit)
    }

    /// Flushes the remaining audio; the whole stream then holds `round(n / speed)` samples.
    pub fn finish(mut self) -> Vec<f32> {
        if self.bypass {
            return Vec::new();
        }
        let target = stretched_len(self.input_total, self.speed as f32);
        // Frames past the end read silence.
        while self.acc_start < target {
            let need = self.nominal(self.next_frame) + (self.tolerance + self.frame) as u64;
            if need > self.input_end() {
                let grow = (need - self.input_end()) as usize;
                self.input.resize(self.input.len() + grow, 0.0);
            }
            self.add_frame();
        }
        self.emit_until(target)
    }

    fn emit_until(&mut self, limit: u64) -> Vec<f32> {
        let final_until = self.acc_start.min(limit);
        if final_until <= self.emitted {
            return Vec::new();
        }
        let n = (final_until - self.emitted) as usize;
        let out: Vec<f32> = self.ready.drain(..n).collect();
        self.emitted = final_until;
        out
    }

    fn drop_consumed_input(&mut self) {
        let next_lo = self
            .nominal(self.next_frame)
            .saturating_sub(self.tolerance as u64);
        let keep_from = if self.next_frame == 0 {
            0
        } else {
            next_lo.min(self.prev_start + self.hop as u64)
        };
        if keep_from > self.input_start {
            let n = ((keep_from - self.input_start) as usize).min(self.input.len());
            self.input.drain(..n);
            self.input_start += n as u64;
        }
    }

    fn add_frame(&mut self) {
        let k = self.next_frame;
        let start = if k == 0 {
            0
        } else {
            self.search(self.nominal(k))
        };
        let from = (start - self.input_start) as usize;
        let window = if k == 0 {
            &self.first_window
        } else {
            &self.window
        };
        let out_pos = k * self.hop as u64;
        let offset = (out_pos - self.acc_start) as usize;
        if self.acc.len() < offset + self.frame {
            self.acc.resize(offset + self.frame, 0.0);
        }
        let seg = &self.input[from..from + self.frame];
        for ((a, &x), &w) in self.acc[offset..].iter_mut().zip(seg).zip(window) {
            *a += x * w;
        }
        self.prev_start = start;
        self.next_frame += 1;
        // Samples before the next frame's start receive no more contributions.
        let done_until = self.next_frame * self.hop as u64;
        let n = (done_until - self.acc_start) as usize;
        self.ready.extend(self.acc.drain(..n));
        self.acc_start = done_until;
    }

    /// Absolute input start within ±tolerance of `nominal` whose first `hop` samples best match
    /// the natural continuation of the previous frame (normalized cross-correlation): a coarse
    /// pass on every second lag and sample, then a full-resolution check around the winner.
    fn search(&mut self, nominal: u64) -> u64 {
        let len = self.hop;
        let lo = nominal
            .saturating_sub(self.tolerance as u64)
            .max(self.input_start);
        let hi = nominal + self.tolerance as u64;
        let target_from = (self.prev_start + self.hop as u64 - self.input_start) as usize;
        let lo_i = (lo - self.input_start) as usize;
        let hi_i = (hi - self.input_start) as usize;

        self.dec_target.clear();
        self.dec_target
            .extend(self.input[target_from..target_from + len].iter().step_by(2));
        self.dec_input.clear();
        self.dec_input
            .extend(self.input[lo_i..hi_i + len].iter().step_by(2));
        let dlen = self.dec_target.len();
        let candidates = (hi_i - lo_i) / 2 + 1;

        let mut energy: f64 = self.dec_input[..dlen]
            .iter()
            .map(|&x| f64::from(x * x))
            .sum();
        let mut best = (f64::NEG_INFINITY, lo_i);
        for j in 0..candidates {
            if j > 0 {
                let out = f64::from(self.dec_input[j - 1]);
                let inn = f64::from(self.dec_input[j - 1 + dlen]);
                energy = (energy - out * out + inn * inn).max(0.0);
            }
            let corr = dot(&self.dec_input[j..j + dlen], &self.dec_target);
            let score = f64::from(corr) / (energy + 1e-9).sqrt();
            if score > best.0 {
                best = (score, lo_i + 2 * j);
            }
        }

        let target = &self.input[target_from..target_from + len];
        let mut fine = (f64::NEG_INFINITY, best.1);
        for c in best.1.saturating_sub(1).max(lo_i)..=(best.1 + 1).min(hi_i) {
            let cand = &self.input[c..c + len];
            let e: f32 = dot(cand, cand);
            let score = f64::from(dot(cand, target)) / (f64::from(e) + 1e-9).sqrt();
            if score > fine.0 {
                fine = (score, c);
            }
        }
        self.input_start + fine.1 as u64
    }
}

/// Dot product in eight independent lanes so the compiler can vectorize it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        sum += x * y;
    }
    sum
}

/// One-shot time-stretch of a whole clip.
pub fn time_stretch(input: &[f32], sample_rate: u32, speed: f32) -> Result<Vec<f32>, AudioError> {
    let mut t = TimeStretcher::new(sample_rate, speed)?;
    let mut out = t.process(input);
    out.extend(t.finish());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_lengths_streamed() {
        for speed in [0.25f32, 0.5, 0.8, 1.0, 1.3, 2.0, 4.0] {
            for n in [0usize, 1, 100, 719, 720, 5000, 24000] {
                let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.05).sin()).collect();
                let mut t = TimeStretcher::new(24000, speed).unwrap();
                let mut out = Vec::new();
                for piece in x.chunks(1000) {
                    out.extend(t.process(piece));
                }
                out.extend(t.finish());
                assert_eq!(
                    out.len() as u64,
                    stretched_len(n as u64, speed),
                    "speed {speed} n {n}"
                );
            }
        }
    }

    #[test]
    fn streaming_equals_one_shot() {
        let x: Vec<f32> = (0..30000).map(|i| (i as f32 * 0.031).sin() * 0.5).collect();
        let whole = time_stretch(&x, 24000, 1.7).unwrap();
        let mut t = TimeStretcher::new(24000, 1.7).unwrap();
        let mut out = Vec::new();
        for piece in x.chunks(777) {
            out.extend(t.process(piece));
        }
        out.extend(t.finish());
        assert_eq!(out, whole);
    }

    #[test]
    fn rejects_out_of_range_speed() {
        for s in [0.1f32, 5.0, f32::NAN, 0.0, -1.0] {
            assert!(matches!(
                TimeStretcher::new(24000, s),
                Err(AudioError::SpeedOutOfRange { .. })
            ));
        }
    }
}
