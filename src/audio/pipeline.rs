//! The output side of one request: 24 kHz samples -> speed change -> resampling -> encoded bytes,
//! all streaming-capable, so the server and `say` share one path.

use super::encode::Finished;
use super::{AudioError, AudioFormat, EncodeMode, Encoder, StreamResampler, TimeStretcher};

/// What the caller asked for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputSpec {
    pub format: AudioFormat,
    pub sample_rate: u32,
    /// 0.25..=4.0; 1.0 bypasses the time-stretch.
    pub speed: f32,
    /// Emit bytes as they are made (streamed WAV then has an unknown-length header).
    pub streaming: bool,
}

impl Default for OutputSpec {
    fn default() -> Self {
        Self {
            format: AudioFormat::Wav,
            sample_rate: crate::package::CODEC_SAMPLE_RATE,
            speed: 1.0,
            streaming: false,
        }
    }
}

/// Turns samples into bytes of the requested format.
pub struct OutputPipeline {
    stretch: Option<TimeStretcher>,
    resample: Option<StreamResampler>,
    encoder: Encoder,
}

impl OutputPipeline {
    pub fn new(spec: &OutputSpec, input_rate: u32) -> Result<Self, AudioError> {
        super::stretch::check_speed(spec.speed)?;
        super::resample::check_output_rate(spec.sample_rate)?;
        let stretch = if spec.speed == 1.0 {
            None
        } else {
            Some(TimeStretcher::new(input_rate, spec.speed)?)
        };
        let resample = if spec.sample_rate == input_rate {
            None
        } else {
            Some(StreamResampler::new(input_rate, spec.sample_rate)?)
        };
        let mode = if spec.streaming {
            EncodeMode::Streaming
        } else {
            EncodeMode::Whole
        };
        Ok(Self {
            stretch,
            resample,
            encoder: Encoder::new(spec.format, spec.sample_rate, mode)?,
        })
    }

    pub fn content_type(&self) -> &'static str {
        self.encoder.content_type()
    }

    /// Feeds samples; returns the bytes ready now (possibly none).
    pub fn push(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        self.push_inner(samples, true)
    }

    /// Feeds a part of what is one push, more of it coming at once ([`Encoder::push_part`]):
    /// the bytes are those of one push of all the parts.
    pub fn push_part(&mut self, samples: &[f32]) -> Result<Vec<u8>, AudioError> {
        self.push_inner(samples, false)
    }

    fn push_inner(&mut self, samples: &[f32], end: bool) -> Result<Vec<u8>, AudioError> {
        let stretched;
        let mut s = samples;
        if let Some(t) = &mut self.stretch {
            stretched = t.process(s);
            s = &stretched;
        }
        let resampled;
        if let Some(r) = &mut self.resample {
            resampled = r.process(s)?;
            s = &resampled;
        }
        if end {
            self.encoder.push(s)
        } else {
            self.encoder.push_part(s)
        }
    }

    /// Flushes every stage; returns the last bytes and, for a whole file, the patches of what
    /// went out before (see [`Finished`]).
    pub fn finish(mut self) -> Result<Finished, AudioError> {
        let mut bytes = Vec::new();
        let tail = match self.stretch.take() {
            Some(t) => t.finish(),
            None => Vec::new(),
        };
        match self.resample.take() {
            Some(mut r) => {
                let mut out = r.process(&tail)?;
                out.extend(r.finish()?);
                bytes.extend(self.encoder.push(&out)?);
            }
            None => bytes.extend(self.encoder.push(&tail)?),
        }
        let mut done = self.encoder.finish()?;
        bytes.append(&mut done.tail);
        done.tail = bytes;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes of `x` through a pipeline as one push, in parts of `piece` samples.
    fn run(spec: &OutputSpec, x: &[f32], piece: usize) -> Vec<u8> {
        let mut p = OutputPipeline::new(spec, 24_000).unwrap();
        let mut out = Vec::new();
        let mut parts = x.chunks(piece).peekable();
        while let Some(part) = parts.next() {
            out.extend(if parts.peek().is_some() {
                p.push_part(part).unwrap()
            } else {
                p.push(part).unwrap()
            });
        }
        p.finish().unwrap().complete(&mut out).unwrap();
        out
    }

    /// The synthesis pushes a long piece a second at a time: every format, speed and rate must
    /// give the bytes of one push of it all.
    #[test]
    fn output_does_not_depend_on_how_the_input_is_cut() {
        let x: Vec<f32> = (0..24_000 * 3 + 777)
            .map(|i| 0.3 * (i as f32 * 0.013).sin() * (i as f32 * 0.0007).cos())
            .collect();
        for format in AudioFormat::ALL {
            for (speed, sample_rate) in [(1.0, 24_000), (0.25, 48_000), (1.7, 22_050)] {
                for streaming in [false, true] {
                    let spec = OutputSpec {
                        format,
                        sample_rate,
                        speed,
                        streaming,
                    };
                    let all = run(&spec, &x, x.len());
                    for piece in [24_000, 9_999] {
                        assert!(
                            run(&spec, &x, piece) == all,
                            "{spec:?} in pieces of {piece}"
                        );
                    }
                }
            }
        }
    }
}
