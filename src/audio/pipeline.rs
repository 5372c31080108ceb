//! The output side of one request: 24 kHz samples -> speed change -> resampling -> encoded bytes,
//! all streaming-capable, so the server and `say` share one path.

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
        let stretched;
        let mut s = samples;
        if let Some(t) = &mut self.stretch {
            stretched = t.process(s);
            s = &stretched;
        }
        match &mut self.resample {
            Some(r) => {
                let out = r.process(s)?;
                self.encoder.push(&out)
            }
            None => self.encoder.push(s),
        }
    }

    /// Flushes every stage; returns the last bytes.
    pub fn finish(mut self) -> Result<Vec<u8>, AudioError> {
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
        bytes.extend(self.encoder.finish()?);
        Ok(bytes)
    }
}
