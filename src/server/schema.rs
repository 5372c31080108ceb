//! The request body of `POST /v1/audio/speech` and its validation: reading the body within its
//! limit, the Content-Type rule, the JSON schema, and every field check, ending in a
//! [`SpeechRequest`] for the synthesizer.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, header};
use futures_util::StreamExt as _;
use serde::Deserialize;

use super::AppState;
use super::errors::ApiError;
use crate::audio::{AudioFormat, OutputSpec};
use crate::engine::{GenerationParams, SamplingParams};
use crate::prompt::InputFormat;
use crate::synth::{SpeechRequest, SynthError};
use crate::text::Language;

/// `voice`: a name, or OpenAI's custom-voice object `{"id": NAME}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum VoiceField {
    Name(String),
    Object { id: String },
}

/// The request body of `POST /v1/audio/speech`: OpenAI's fields plus extensions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SpeechBody {
    /// One of the ids `GET /v1/models` lists (OpenAI's, the family's, the package's); all are
    /// the one loaded model. Absent: that model.
    #[serde(default)]
    model: Option<String>,
    input: String,
    voice: VoiceField,
    #[serde(default)]
    response_format: Option<String>,
    #[serde(default)]
    speed: Option<f32>,
    #[serde(default)]
    stream_format: Option<String>,
    /// Accepted for compatibility; NeuTTS has no instruction input, so it is ignored.
    #[serde(default)]
    #[allow(dead_code)]
    instructions: Option<String>,
    #[serde(default)]
    temperature: Option<f32>,
    #[serde(default)]
    top_k: Option<usize>,
    #[serde(default)]
    top_p: Option<f32>,
    #[serde(default)]
    seed: Option<u64>,
    #[serde(default)]
    language: Option<String>,
    /// One of the model's emotions (`GET /v1/models` lists them); "neutral" or absent: none.
    #[serde(default)]
    emotion: Option<String>,
    #[serde(default)]
    sample_rate: Option<u32>,
    /// Most codes to generate (50 per second of audio); the model's context bounds it too.
    #[serde(default)]
    max_new_tokens: Option<usize>,
    /// Written-to-spoken normalisation ("$5" → "five dollars"); default on.
    #[serde(default)]
    normalize: Option<bool>,
    /// Read pause and pronunciation markup in `input`; default off.
    #[serde(default)]
    markup: Option<bool>,
    /// Words spoken with the given IPA for this request: `{"word": "ipa", ...}`.
    #[serde(default)]
    lexicon: Option<std::collections::BTreeMap<String, String>>,
    /// Timing with the audio: `speech.timing` events in an SSE stream, or a whole response as
    /// JSON with the audio in base64 and the timing document beside it; default off.
    #[serde(default)]
    timing: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum StreamFormat {
    /// A complete file in one body.
    None,
    /// Raw bytes streamed as they are made.
    Audio,
    /// Server-sent events with base64 audio.
    Sse,
}

/// Most bytes of an oversized body read and thrown away before the 413 is sent: a client that is
/// still sending when the server closes would see a reset instead of the answer.
const DRAIN_CAP: u64 = 1 << 20;

/// Reads the body up to the limit within `body_timeout`: 413 past the limit, 408 past the time,
/// 400 when the client breaks off.
pub(super) async fn read_body(
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = st.cfg.max_body_bytes;
    let timeout = st.cfg.body_timeout;
    tokio::time::timeout(timeout, read_limited(limit, DRAIN_CAP, headers, body))
        .await
        .unwrap_or_else(|_| Err(ApiError::body_timeout(timeout)))
}

/// [`read_body`] without its clock: at most `limit` bytes; a body over it is read and dropped up
/// to `drain_cap` bytes in all before the 413, so the client is not cut off mid-send.
pub(super) async fn read_limited(
    limit: usize,
    drain_cap: u64,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        if declared.is_some_and(|n| n <= drain_cap) {
            drain(&mut stream, 0, drain_cap).await;
        }
        return Err(ApiError::body_too_large(limit));
    }
    let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(ApiError::body_unreadable)?;
        if out.len() + chunk.len() > limit {
            drain(&mut stream, (out.len() + chunk.len()) as u64, drain_cap).await;
            return Err(ApiError::body_too_large(limit));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

/// Reads and drops the rest of a body, up to `cap` bytes in all.
pub(super) async fn drain(stream: &mut axum::body::BodyDataStream, mut seen: u64, cap: u64) {
    while seen <= cap {
        match stream.next().await {
            Some(Ok(chunk)) => seen += chunk.len() as u64,
            _ => return,
        }
    }
}

/// JSON endpoints take `application/json` only (parameters such as `charset` aside): a browser
/// page can send a form or `text/plain` to any address without asking (no CORS preflight), but
/// not JSON, so refusing the rest keeps other sites' pages from using a local server.
pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"))
        .unwrap_or("");
    let mime = ct.split(';').next().unwrap_or("").trim();
    if mime.eq_ignore_ascii_case("application/json") {
        return Ok(());
    }
    Err(ApiError::unsupported_media_type(if ct.is_empty() {
        "(none)"
    } else {
        ct
    }))
}

/// The request, how its answer is framed, and whether timing rides with the audio.
pub(super) fn parse_body(
    st: &AppState,
    bytes: &[u8],
) -> Result<(SpeechRequest, StreamFormat, bool), ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(ApiError::invalid_json)?;
    if !value.is_object() {
        return Err(ApiError::invalid_type("the body must be a JSON object"));
    }
    let body: SpeechBody = serde_json::from_value(value)
        .map_err(|e| ApiError::invalid_type(format!("invalid request body: {e}")))?;

    if body.input.trim().is_empty() {
        return Err(ApiError::empty_input());
    }
    if let Some(model) = &body.model {
        let known = st.model_ids();
        if !known.iter().any(|m| m == model) {
            return Err(ApiError::model_not_found(model, &known, Some("model")));
        }
    }
    let voice = match body.voice {
        VoiceField::Name(n) | VoiceField::Object { id: n } => st.aliases.resolve(&n).to_owned(),
    };
    if let Err(e) = st.synth.voices().get(&voice) {
        return Err(SynthError::Voice(e).into());
    }
    let format = match body.response_format.as_deref() {
        None => AudioFormat::Mp3,
        Some(f) => AudioFormat::from_openai_name(f)?,
    };
    let speed = body.speed.unwrap_or(1.0);
    crate::audio::check_speed(speed)?;
    let sample_rate = body
        .sample_rate
        .unwrap_or(crate::package::CODEC_SAMPLE_RATE);
    crate::audio::check_output_rate(sample_rate)?;
    let stream = match body.stream_format.as_deref() {
        None => StreamFormat::None,
        Some("audio") => StreamFormat::Audio,
        Some("sse") => StreamFormat::Sse,
        Some(other) => {
            return Err(ApiError::invalid_value(
                "stream_format",
                format!("unknown stream_format {other:?} (supported: audio, sse)"),
            ));
        }
    };
    let timing = body.timing.unwrap_or(false);
    if timing && stream == StreamFormat::Audio {
        return Err(ApiError::invalid_value(
            "timing",
            "timing rides in an SSE stream (stream_format \"sse\") or a whole JSON response; raw streamed audio has no place for it",
        ));
    }
    let language = body
        .language
        .as_deref()
        .map(str::parse::<Language>)
        .transpose()?;
    let emotion = st
        .synth
        .package()
        .emotion(body.emotion.as_deref())
        .map_err(SynthError::from)?;
    let defaults = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: body.temperature.unwrap_or(defaults.temperature),
        top_k: body.top_k.unwrap_or(defaults.top_k),
        top_p: body.top_p.unwrap_or(defaults.top_p),
        seed: body.seed,
    };
    sampling.validate()?;
    if body.max_new_tokens == Some(0) {
        return Err(ApiError::invalid_value(
            "max_new_tokens",
            "max_new_tokens must be at least 1",
        ));
    }
    // Markup and lexicon are checked here so a bad one is a 400 before the request waits for a
    // place; planning checks them again (the library's other callers have no such gate).
    let markup = body.markup.unwrap_or(false);
    let input_format = st.synth.package().input_format;
    if markup {
        let segments = crate::text::markup::parse(&body.input).map_err(SynthError::from)?;
        if input_format != InputFormat::Phonemes
            && segments
                .iter()
                .any(|s| matches!(s, crate::text::markup::Segment::Ipa { .. }))
        {
            return Err(SynthError::IpaNeedsPhonemes(input_format).into());
        }
    }
    let lexicon = body
        .lexicon
        .map(crate::text::markup::Lexicon::from_pairs)
        .transpose()
        .map_err(SynthError::from)?
        .map(std::sync::Arc::new);
    if lexicon.as_ref().is_some_and(|l| !l.is_empty()) && input_format != InputFormat::Phonemes {
        return Err(SynthError::LexiconNeedsPhonemes(input_format).into());
    }
    let req = SpeechRequest {
        reading: crate::synth::Reading {
            normalize: body.normalize.unwrap_or(true),
            markup,
            lexicon,
        },
        text: body.input,
        voice,
        language,
        input_format: None,
        emotion,
        generation: GenerationParams {
            sampling,
            max_new_tokens: body.max_new_tokens,
            ..GenerationParams::default()
        },
        output: OutputSpec {
            format,
            sample_rate,
            speed,
            streaming: stream != StreamFormat::None,
        },
    };
    Ok((req, stream, timing))
}
