//! Output format names: exactly OpenAI's `response_format` names, parsed and refused here.

use std::fmt;
use std::str::FromStr;

use super::AudioError;

/// Output formats, named as in OpenAI's `response_format`.
///
/// `aac` is an OpenAI name but is refused: the only maintained AAC encoder reachable from Rust is
/// Fraunhofer FDK AAC, whose licence is not a free-software licence and grants no patent rights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AudioFormat {
    Mp3,
    Opus,
    Flac,
    Wav,
    Pcm,
}

/// The names [`AudioFormat::from_str`] accepts, for error messages and API docs.
pub const SUPPORTED_FORMATS: &str = "mp3, opus, flac, wav, pcm";

impl AudioFormat {
    pub const ALL: [AudioFormat; 5] = [
        AudioFormat::Mp3,
        AudioFormat::Opus,
        AudioFormat::Flac,
        AudioFormat::Wav,
        AudioFormat::Pcm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AudioFormat::Mp3 => "mp3",
            AudioFormat::Opus => "opus",
            AudioFormat::Flac => "flac",
            AudioFormat::Wav => "wav",
            AudioFormat::Pcm => "pcm",
        }
    }

    /// HTTP `Content-Type`. PCM is raw signed 16-bit little-endian mono at the request's rate;
    /// `audio/L16` would claim big-endian, so it gets the de-facto `audio/pcm` that OpenAI-style
    /// servers send.
    pub fn content_type(self) -> &'static str {
        match self {
            AudioFormat::Mp3 => "audio/mpeg",
            AudioFormat::Opus => "audio/ogg; codecs=opus",
            AudioFormat::Flac => "audio/flac",
            AudioFormat::Wav => "audio/wav",
            AudioFormat::Pcm => "audio/pcm",
        }
    }

    pub fn extension(self) -> &'static str {
        self.name()
    }
}

impl AudioFormat {
    /// OpenAI's `response_format`: exactly one of its lowercase names (OpenAI refuses "Mp3" or
    /// "wav "), `aac` refused as unavailable here. The CLI's `--format` is more forgiving.
    pub fn from_openai_name(name: &str) -> Result<Self, AudioError> {
        if let Some(format) = AudioFormat::ALL.into_iter().find(|f| f.name() == name) {
            return Ok(format);
        }
        match name.parse::<AudioFormat>() {
            Err(e @ AudioError::UnsupportedFormat { .. }) if name == "aac" => Err(e),
            _ => Err(AudioError::UnknownFormat {
                name: name.to_string(),
                supported: SUPPORTED_FORMATS,
            }),
        }
    }
}

impl fmt::Display for AudioFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AudioFormat {
    type Err = AudioError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim().to_ascii_lowercase();
        if let Some(format) = AudioFormat::ALL.into_iter().find(|f| f.name() == name) {
            return Ok(format);
        }
        if name == "aac" {
            return Err(AudioError::UnsupportedFormat {
                name: s.to_string(),
                reason: "no freely licensed AAC encoder is available",
                supported: SUPPORTED_FORMATS,
            });
        }
        Err(AudioError::UnknownFormat {
            name: s.to_string(),
            supported: SUPPORTED_FORMATS,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_openai_names() {
        for f in AudioFormat::ALL {
            assert_eq!(f.name().parse::<AudioFormat>().unwrap(), f);
            assert_eq!(f.name().to_uppercase().parse::<AudioFormat>().unwrap(), f);
        }
    }

    #[test]
    fn openai_names_are_exact() {
        for f in AudioFormat::ALL {
            assert_eq!(AudioFormat::from_openai_name(f.name()).unwrap(), f);
        }
        for bad in ["Mp3", "wav ", " pcm", "WAV", "ogg", ""] {
            let e = AudioFormat::from_openai_name(bad).unwrap_err();
            assert!(
                matches!(e, AudioError::UnknownFormat { .. }),
                "{bad:?}: {e}"
            );
        }
        let e = AudioFormat::from_openai_name("aac").unwrap_err();
        assert!(matches!(e, AudioError::UnsupportedFormat { .. }), "{e}");
        let e = AudioFormat::from_openai_name("AAC").unwrap_err();
        assert!(matches!(e, AudioError::UnknownFormat { .. }), "{e}");
    }

    #[test]
    fn rejects_unknown_and_aac() {
        let e = "ogg".parse::<AudioFormat>().unwrap_err();
        assert!(matches!(e, AudioError::UnknownFormat { .. }));
        assert!(e.to_string().contains("mp3, opus, flac, wav, pcm"), "{e}");
        let e = "aac".parse::<AudioFormat>().unwrap_err();
        assert!(matches!(e, AudioError::UnsupportedFormat { .. }));
        assert!(e.to_string().contains("supported: mp3"), "{e}");
    }
}
