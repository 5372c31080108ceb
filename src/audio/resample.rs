//! Streaming sample-rate conversion on top of rubato.
//!
//! Output length is exact: a stream of `n` input samples yields `round(n * out / in)` output
//! samples in total, with the resampler's start-up delay removed, so durations survive any number
//! of conversions and chunk boundaries never shift the audio.

use rubato::audioadapter_buffers::direct::InterleavedSlice;
use rubato::{
    Async, Fft, FixedAsync, FixedSync, Resampler, SincInterpolationParameters, WindowFunction,
};

use super::AudioError;

/// Lowest output rate offered to clients.
pub const MIN_OUTPUT_RATE: u32 = 8_000;
/// Highest output rate offered to clients.
pub const MAX_OUTPUT_RATE: u32 = 48_000;
/// Input rates accepted (uploaded reference audio can be anything from telephone to studio).
pub const MIN_INPUT_RATE: u32 = 1_000;
pub const MAX_INPUT_RATE: u32 = 384_000;

/// Input frames per resampler call: small enough for streaming latency, large enough that the
/// per-call overhead vanishes.
const CHUNK: usize = 1024;
/// The FFT resampler works on blocks of `rate / gcd` samples; past this the blocks (and delay)
/// get large, so odd ratios such as 24000→17001 use the sinc resampler instead.
const MAX_FFT_BLOCK: u64 = 1024;
/// Sinc filter length for odd ratios: about 110 dB stop band with the Blackman-Harris window.
const SINC_LEN: usize = 128;

/// Checks a rate requested for output.
pub fn check_output_rate(rate: u32) -> Result<(), AudioError> {
    if (MIN_OUTPUT_RATE..=MAX_OUTPUT_RATE).contains(&rate) {
        Ok(())
    } else {
        Err(AudioError::SampleRateOutOfRange {
            rate,
            min: MIN_OUTPUT_RATE,
            max: MAX_OUTPUT_RATE,
        })
    }
}

pub(crate) fn check_input_rate(rate: u32) -> Result<(), AudioError> {
    if (MIN_INPUT_RATE..=MAX_INPUT_RATE).contains(&rate) {
        Ok(())
    } else {
        Err(AudioError::SampleRateOutOfRange {
            rate,
            min: MIN_INPUT_RATE,
            max: MAX_INPUT_RATE,
        })
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `round(n * out / in)` without floating point, so long streams cannot drift by a sample.
pub fn resampled_len(n: u64, in_rate: u32, out_rate: u32) -> u64 {
    let (n, i, o) = (u128::from(n), u128::from(in_rate), u128::from(out_rate));
    ((n * o + i / 2) / i) as u64
}

/// A mono resampler fed in pieces of any size.
pub struct StreamResampler {
    engine: Option<Box<dyn Resampler<f32>>>,
    in_rate: u32,
    out_rate: u32,
    pending: Vec<f32>,
    input_total: u64,
    output_total: u64,
    delay_left: usize,
    out_buf: Vec<f32>,
}

impl std::fmt::Debug for StreamResampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamResampler")
            .field("in_rate", &self.in_rate)
            .field("out_rate", &self.out_rate)
            .field("input_total", &self.input_total)
            .field("output_total", &self.output_total)
            .finish()
    }
}

impl StreamResampler {
    /// `out_rate` must be within [`MIN_OUTPUT_RATE`]..=[`MAX_OUTPUT_RATE`]; equal rates pass
    /// samples through untouched.
    pub fn new(in_rate: u32, out_rate: u32) -> Result<Self, AudioError> {
        check_output_rate(out_rate)?;
        Self::new_unchecked_output(in_rate, out_rate)
    }

    /// Internal targets (16 kHz codec input, Opus' 48 kHz) skip the client-range check, so a
    /// change of that policy cannot break them.
    pub(crate) fn new_unchecked_output(in_rate: u32, out_rate: u32) -> Result<Self, AudioError> {
        check_input_rate(in_rate)?;
        let engine: Option<Box<dyn Resampler<f32>>> = if in_rate == out_rate {
            None
        } else {
            let g = gcd(u64::from(in_rate), u64::from(out_rate));
            if u64::from(in_rate) / g <= MAX_FFT_BLOCK && u64::from(out_rate) / g <= MAX_FFT_BLOCK {
                Some(Box::new(
                    Fft::<f32>::new(
                        in_rate as usize,
                        out_rate as usize,
                        CHUNK,
                        1,
                        FixedSync::Input,
                    )
                    .map_err(AudioError::ResamplerSetup)?,
                ))
            } else {
                let params =
                    SincInterpolationParameters::new(SINC_LEN, WindowFunction::BlackmanHarris2);
                Some(Box::new(
                    Async::<f32>::new_sinc(
                        f64::from(out_rate) / f64::from(in_rate),
                        1.0,
                        &params,
                        CHUNK,
                        1,
                        FixedAsync::Input,
                    )
                    .map_err(AudioError::ResamplerSetup)?,
                ))
            }
        };
        let delay_left = engine.as_ref().map_or(0, |e| e.output_delay());
        let out_max = engine.as_ref().map_or(0, |e| e.output_frames_max());
        Ok(Self {
            engine,
            in_rate,
            out_rate,
            pending: Vec::new(),
            input_total: 0,
            output_total: 0,
            delay_left,
            out_buf: vec![0.0; out_max],
        })
    }

    pub fn input_rate(&self) -> u32 {
        self.in_rate
    }

    pub fn output_rate(&self) -> u32 {
        self.out_rate
    }

    /// Resamples what it can of `input` now; the rest waits for more input or [`finish`](Self::finish).
    pub fn process(&mut self, input: &[f32]) -> Result<Vec<f32>, AudioError> {
        self.input_total += input.len() as u64;
        if self.engine.is_none() {
            self.output_total += input.len() as u64;
            return Ok(input.to_vec());
        }
        // Taken out of `self` so chunks can be borrowed from it while the engine runs.
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(input);
        let mut out = Vec::new();
        let mut pos = 0;
        let mut result = Ok(());
        while let Some(need) = self.engine.as_ref().map(|e| e.input_frames_next()) {
            if pending.len() - pos < need {
                break;
            }
            result = self.run_chunk(&pending[pos..pos + need], &mut out);
            if result.is_err() {
                break;
            }
            pos += need;
        }
        pending.drain(..pos);
        self.pending = pending;
        result.map(|()| out)
    }

    /// Flushes the resampler and returns the last samples, completing exactly
    /// `round(input * out / in)` samples over the whole stream.
    pub fn finish(mut self) -> Result<Vec<f32>, AudioError> {
        let target = resampled_len(self.input_total, self.in_rate, self.out_rate);
        let mut out = Vec::new();
        let Some(need) = self.engine.as_ref().map(|e| e.input_frames_next()) else {
            return Ok(out);
        };
        // The pending tail, then silence, until the delayed output has caught up with the input.
        let mut chunk = std::mem::take(&mut self.pending);
        chunk.resize(need, 0.0);
        self.run_chunk(&chunk, &mut out)?;
        let mut guard = 0;
        while self.output_total < target {
            chunk.clear();
            chunk.resize(need, 0.0);
            self.run_chunk(&chunk, &mut out)?;
            guard += 1;
            if guard > 1 + self.out_buf.len() {
                break;
            }
        }
        let excess = self.output_total.saturating_sub(target);
        let keep = out.len().saturating_sub(excess as usize);
        if (excess as usize) > out.len() {
            tracing::warn!(
                excess,
                "resampler emitted past the exact length before finish"
            );
        }
        out.truncate(keep);
        Ok(out)
    }

    fn run_chunk(&mut self, chunk: &[f32], out: &mut Vec<f32>) -> Result<(), AudioError> {
        let Some(engine) = self.engine.as_mut() else {
            return Ok(());
        };
        let out_max = engine.output_frames_max();
        if self.out_buf.len() < out_max {
            self.out_buf.resize(out_max, 0.0);
        }
        let input = InterleavedSlice::new(chunk, 1, chunk.len())
            .map_err(|e| AudioError::Internal(format!("resampler input buffer: {e}")))?;
        let mut output = InterleavedSlice::new_mut(&mut self.out_buf[..out_max], 1, out_max)
            .map_err(|e| AudioError::Internal(format!("resampler output buffer: {e}")))?;
        let (_, produced) = engine
            .process_into_buffer(&input, &mut output, None)
            .map_err(AudioError::Resample)?;
        let skip = self.delay_left.min(produced);
        self.delay_left -= skip;
        out.extend_from_slice(&self.out_buf[skip..produced]);
        self.output_total += (produced - skip) as u64;
        Ok(())
    }
}

/// One-shot resampling of a whole clip.
pub fn resample(input: &[f32], in_rate: u32, out_rate: u32) -> Result<Vec<f32>, AudioError> {
    let mut r = StreamResampler::new(in_rate, out_rate)?;
    let mut out = r.process(input)?;
    out.extend(r.finish()?);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_lengths_for_many_sizes_and_rates() {
        for (a, b) in [
            (24000, 16000),
            (24000, 22050),
            (24000, 44100),
            (24000, 48000),
            (24000, 17001),
            (44100, 16000),
        ] {
            for n in [0usize, 1, 7, 1023, 1024, 1025, 5000, 24000] {
                let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.01).sin()).collect();
                // Uneven pieces exercise the buffering.
                let mut r = StreamResampler::new_unchecked_output(a, b).unwrap();
                let mut out = Vec::new();
                for piece in x.chunks(333) {
                    out.extend(r.process(piece).unwrap());
                }
                out.extend(r.finish().unwrap());
                assert_eq!(
                    out.len() as u64,
                    resampled_len(n as u64, a, b),
                    "{a}->{b} n={n}"
                );
            }
        }
    }

    #[test]
    fn rejects_rates_outside_range() {
        for rate in [4000, 96000, 0] {
            let e = StreamResampler::new(24000, rate).unwrap_err();
            assert!(matches!(e, AudioError::SampleRateOutOfRange { .. }));
            if rate != 0 {
                assert!(e.to_string().contains("8000..=48000"), "{e}");
            }
        }
    }
}
