//! Decoding of uploaded reference audio (voice cloning): wav, flac, mp3 or ogg/vorbis, from bytes
//! or a path, downmixed to mono and resampled to the codec encoder's 16 kHz.

use std::io::Cursor;
use std::path::Path;

use symphonia::core::codecs::CodecParameters;
use symphonia::core::codecs::audio::AudioDecoderOptions;
use symphonia::core::errors::Error as SymphoniaError;
use symphonia::core::formats::probe::Hint;
use symphonia::core::formats::{FormatOptions, TrackType};
use symphonia::core::io::{MediaSource, MediaSourceStream};
use symphonia::core::meta::MetadataOptions;

use super::AudioError;
use super::resample::StreamResampler;

/// The NeuCodec encoder's input rate.
pub const CLONE_SAMPLE_RATE: u32 = 16_000;
/// Uploads longer than this are refused before they cost memory: a reference needs seconds.
pub const MAX_INPUT_SECONDS: u32 = 600;
/// A sample counts as clipped at or above this magnitude (the last step below full scale).
pub const CLIP_THRESHOLD: f32 = 0.999;

/// How much of the input sits at full scale; a high share means a distorted reference.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClippingReport {
    /// Samples (all channels, before downmix) with |x| >= [`CLIP_THRESHOLD`].
    pub clipped_samples: u64,
    pub total_samples: u64,
}

impl ClippingReport {
    /// Share of clipped samples, 0.0..=1.0.
    pub fn ratio(&self) -> f64 {
        if self.total_samples == 0 {
            0.0
        } else {
            self.clipped_samples as f64 / self.total_samples as f64
        }
    }
}

/// Decoded reference audio.
#[derive(Clone, Debug)]
pub struct DecodedAudio {
    /// Mono at [`DecodedAudio::sample_rate`].
    pub samples: Vec<f32>,
    pub sample_rate: u32,
    /// Duration of the decoded input, in seconds.
    pub duration_secs: f64,
    pub original_sample_rate: u32,
    pub original_channels: u16,
    pub clipping: ClippingReport,
}

/// Decodes audio bytes. `extension` (e.g. "mp3") is a hint for the format probe, not a
/// requirement: the content decides.
pub fn decode_bytes(bytes: &[u8], extension: Option<&str>) -> Result<DecodedAudio, AudioError> {
    decode_bytes_to(bytes, extension, CLONE_SAMPLE_RATE)
}

/// [`decode_bytes`] to another output rate.
pub fn decode_bytes_to(
    bytes: &[u8],
    extension: Option<&str>,
    sample_rate: u32,
) -> Result<DecodedAudio, AudioError> {
    decode_bytes_at(bytes, extension, sample_rate, MAX_INPUT_SECONDS)
}

/// [`decode_bytes`] that stops at `max_seconds` of audio ([`AudioError::InputTooLong`]), so an
/// upload that claims a long or high-rate stream cannot grow the decoded buffer past it.
pub fn decode_bytes_within(
    bytes: &[u8],
    extension: Option<&str>,
    max_seconds: u32,
) -> Result<DecodedAudio, AudioError> {
    decode_bytes_at(
        bytes,
        extension,
        CLONE_SAMPLE_RATE,
        max_seconds.min(MAX_INPUT_SECONDS),
    )
}

fn decode_bytes_at(
    bytes: &[u8],
    extension: Option<&str>,
    sample_rate: u32,
    max_seconds: u32,
) -> Result<DecodedAudio, AudioError> {
    if bytes.is_empty() {
        return Err(AudioError::EmptyInput);
    }
    decode_source(
        Box::new(Cursor::new(bytes)),
        extension,
        sample_rate,
        max_seconds,
    )
}

/// Decodes an audio file; its extension is used as a probe hint.
pub fn decode_path(path: &Path) -> Result<DecodedAudio, AudioError> {
    let file = std::fs::File::open(path)?;
    if file.metadata()?.len() == 0 {
        return Err(AudioError::EmptyInput);
    }
    let ext = path.extension().and_then(|e| e.to_str());
    decode_source(Box::new(file), ext, CLONE_SAMPLE_RATE, MAX_INPUT_SECONDS)
}

fn corrupt(e: SymphoniaError) -> AudioError {
    AudioError::CorruptInput(e.to_string())
}

fn decode_source<'a>(
    source: Box<dyn MediaSource + 'a>,
    extension: Option<&str>,
    out_rate: u32,
    max_seconds: u32,
) -> Result<DecodedAudio, AudioError> {
    let mss = MediaSourceStream::new(source, Default::default());
    let mut hint = Hint::new();
    if let Some(ext) = extension {
        hint.with_extension(ext);
    }
    let mut format = symphonia::default::get_probe()
        .probe(
            &hint,
            mss,
            FormatOptions::default(),
            MetadataOptions::default(),
        )
        .map_err(|e| match e {
            // Readers scan for their first frame while opening, so a truncated file or one whose
            // frames are damaged runs out here.
            SymphoniaError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                AudioError::CorruptInput(
                    "input ended before any audio could be read (truncated or damaged)".into(),
                )
            }
            SymphoniaError::IoError(io) => AudioError::Io(io),
            other => AudioError::UnrecognizedInput(other.to_string()),
        })?;

    let track = format
        .default_track(TrackType::Audio)
        .ok_or(AudioError::NoAudioTrack)?;
    let track_id = track.id;
    let Some(CodecParameters::Audio(params)) = track.codec_params.clone() else {
        return Err(AudioError::NoAudioTrack);
    };
    let mut decoder = symphonia::default::get_codecs()
        .make_audio_decoder(&params, &AudioDecoderOptions::default())
        .map_err(|e| match e {
            SymphoniaError::Unsupported(what) => {
                AudioError::UnrecognizedInput(format!("unsupported codec: {what}"))
            }
            other => corrupt(other),
        })?;

    let mut interleaved: Vec<f32> = Vec::new();
    let mut mono: Vec<f32> = Vec::new();
    let mut rate = params.sample_rate.unwrap_or(0);
    let mut channels = params.channels.as_ref().map_or(0, |c| c.count());
    let mut clipping = ClippingReport {
        clipped_samples: 0,
        total_samples: 0,
    };
    let mut decode_errors = 0usize;
    let mut last_error = None;

    loop {
        let packet = match format.next_packet() {
            Ok(Some(p)) => p,
            Ok(None) => break,
            // A truncated file ends like this; keep what was decoded.
            Err(SymphoniaError::IoError(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break;
            }
            Err(e) => {
                if mono.is_empty() {
                    return Err(corrupt(e));
                }
                tracing::debug!(error = %e, "stopping at unreadable packet");
                break;
            }
        };
        if packet.track_id != track_id {
            continue;
        }
        let buf = match decoder.decode(&packet) {
            Ok(buf) => buf,
            // A damaged packet in a long file (common in MP3) is skipped, as players do.
            Err(SymphoniaError::DecodeError(msg)) => {
                decode_errors += 1;
                last_error = Some(msg);
                continue;
            }
            Err(e) => return Err(corrupt(e)),
        };
        let spec = buf.spec();
        rate = spec.rate();
        channels = spec.channels().count();
        if channels == 0 {
            return Err(AudioError::CorruptInput("stream has no channels".into()));
        }
        buf.copy_to_vec_interleaved::<f32>(&mut interleaved);
        clipping.total_samples += interleaved.len() as u64;
        clipping.clipped_samples += interleaved
            .iter()
            .filter(|x| x.abs() >= CLIP_THRESHOLD)
            .count() as u64;
        // Averaging keeps the level of a centred voice and cannot clip.
        let scale = 1.0 / channels as f32;
        mono.extend(
            interleaved
                .chunks_exact(channels)
                .map(|frame| frame.iter().sum::<f32>() * scale),
        );
        if rate > 0 && mono.len() as u64 > u64::from(max_seconds) * u64::from(rate) {
            return Err(AudioError::InputTooLong { max_seconds });
        }
    }

    if mono.is_empty() {
        return Err(match last_error {
            Some(msg) => AudioError::CorruptInput(format!(
                "no packet could be decoded ({decode_errors} failed): {msg}"
            )),
            None => AudioError::EmptyInput,
        });
    }
    if decode_errors > 0 {
        tracing::warn!(
            decode_errors,
            "skipped undecodable packets in reference audio"
        );
    }
    if rate == 0 {
        return Err(AudioError::CorruptInput("stream has no sample rate".into()));
    }
    let original_channels = u16::try_from(channels)
        .map_err(|_| AudioError::CorruptInput(format!("{channels} channels")))?;
    let duration_secs = mono.len() as f64 / f64::from(rate);
    let mut resampler = StreamResampler::new_unchecked_output(rate, out_rate)?;
    let mut samples = resampler.process(&mono)?;
    samples.extend(resampler.finish()?);
    Ok(DecodedAudio {
        samples,
        sample_rate: out_rate,
        duration_secs,
        original_sample_rate: rate,
        original_channels,
        clipping,
    })
}
