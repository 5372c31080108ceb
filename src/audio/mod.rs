//! Audio output (placeholder until the audio stage lands): 16-bit WAV.

use std::io::{Seek, Write};

#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    #[error("wav: {0}")]
    Wav(String),
}

/// Writes mono samples as a 16-bit PCM WAV.
pub fn write_wav<W: Write + Seek>(w: W, samples: &[f32], rate: u32) -> Result<(), AudioError> {
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut wr = hound::WavWriter::new(w, spec).map_err(|e| AudioError::Wav(e.to_string()))?;
    for &s in samples {
        let v = (s.clamp(-1.0, 1.0) * 32767.0).round() as i16;
        wr.write_sample(v)
            .map_err(|e| AudioError::Wav(e.to_string()))?;
    }
    wr.finalize().map_err(|e| AudioError::Wav(e.to_string()))
}
