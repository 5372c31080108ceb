//! The request body of `POST /v1/audio/speech` and its validation: reading the body within its
//! limit, the Content-Type rule, the JSON schema, and every field check, ending in a
//! [`SpeechRequest`] for the synthesizer.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode, header};
use futures_util::StreamExt as _;
use serde::Deserialize;

use super::AppState;
use super::errors::ApiError;
use crate::audio::{AudioFormat, OutputSpec};
use crate::engine::{GenerationParams, SamplingParams};
use crate::synth::SpeechRequest;
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
    /// Accepted for compatibility: the server has one model.
    #[serde(default)]
    #[allow(dead_code)]
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
    #[serde(default)]
    sample_rate: Option<u32>,
    /// Most codes to generate (50 per second of audio); the model's context bounds it too.
    #[serde(default)]
    max_new_tokens: Option<usize>,
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
pub(super) const DRAIN_CAP: u64 = 1 << 20;

/// Reads the body up to the limit: 413 past it, 400 when the client breaks off.
pub(super) async fn read_body(
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limit = st.cfg.max_body_bytes;
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {limit} bytes (max_body_bytes)"),
        )
        .code("body_too_large")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let mut stream = body.into_data_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        if declared.is_some_and(|n| n <= DRAIN_CAP) {
            drain(&mut stream, 0).await;
        }
        return Err(too_large());
    }
    let mut out = Vec::with_capacity(declared.map_or(0, |n| n as usize));
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("could not read the body: {e}"),
            )
        })?;
        if out.len() + chunk.len() > limit {
            drain(&mut stream, (out.len() + chunk.len()) as u64).await;
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

/// Reads and drops the rest of a body, up to [`DRAIN_CAP`] bytes in all.
pub(super) async fn drain(stream: &mut axum::body::BodyDataStream, mut seen: u64) {
    while seen <= DRAIN_CAP {
        match stream.next().await {
            Some(Ok(chunk)) => seen += chunk.len() as u64,
            _ => return,
        }
    }
}

pub(super) fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    // A missing Content-Type is taken as JSON (curl -d without -H sends form encoding, which is
    // named and refused).
    let Some(ct) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let ct = ct.to_str().unwrap_or("");
    let mime = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if mime == "application/json" || (mime.starts_with("application/") && mime.ends_with("+json")) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("the body must be JSON (Content-Type: application/json), got {ct:?}"),
    )
    .code("unsupported_media_type"))
}

pub(super) fn parse_body(
    st: &AppState,
    bytes: &[u8],
) -> Result<(SpeechRequest, StreamFormat), ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
        .code("invalid_json")
    })?;
    if !value.is_object() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the body must be a JSON object",
        )
        .code("invalid_type"));
    }
    let body: SpeechBody = serde_json::from_value(value).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid request body: {e}"),
        )
        .code("invalid_type")
    })?;

    if body.input.trim().is_empty() {
        return Err(ApiError::bad("input", "input is empty").code("empty_input"));
    }
    let chars = body.input.chars().count();
    if chars > st.cfg.max_input_chars {
        return Err(ApiError::bad(
            "input",
            format!(
                "input has {chars} characters; the limit is {} (max_input_chars)",
                st.cfg.max_input_chars
            ),
        )
        .code("input_too_long"));
    }
    let voice = match body.voice {
        VoiceField::Name(n) | VoiceField::Object { id: n } => n,
    };
    if let Err(e) = st.synth.voices().get(&voice) {
        return Err(ApiError::bad("voice", e.to_string()).code("unknown_voice"));
    }
    let format = match body.response_format.as_deref() {
        None => AudioFormat::Mp3,
        Some(f) => f.parse::<AudioFormat>().map_err(|e| {
            ApiError::bad("response_format", e.to_string()).code("unsupported_format")
        })?,
    };
    let speed = body.speed.unwrap_or(1.0);
    crate::audio::check_speed(speed).map_err(|e| ApiError::bad("speed", e.to_string()))?;
    let sample_rate = body
        .sample_rate
        .unwrap_or(crate::package::CODEC_SAMPLE_RATE);
    crate::audio::check_output_rate(sample_rate)
        .map_err(|e| ApiError::bad("sample_rate", e.to_string()))?;
    let stream = match body.stream_format.as_deref() {
        None => StreamFormat::None,
        Some("audio") => StreamFormat::Audio,
        Some("sse") => StreamFormat::Sse,
        Some(other) => {
            return Err(ApiError::bad(
                "stream_format",
                format!("unknown stream_format {other:?} (supported: audio, sse)"),
            ));
        }
    };
    let language = body
        .language
        .as_deref()
        .map(str::parse::<Language>)
        .transpose()
        .map_err(|e| ApiError::bad("language", e.to_string()))?;
    let defaults = SamplingParams::default();
    let sampling = SamplingParams {
        temperature: body.temperature.unwrap_or(defaults.temperature),
        top_k: body.top_k.unwrap_or(defaults.top_k),
        top_p: body.top_p.unwrap_or(defaults.top_p),
        seed: body.seed,
    };
    if let Err(e) = sampling.validate() {
        let param = if e.starts_with("temperature") {
            "temperature"
        } else if e.starts_with("top_p") {
            "top_p"
        } else {
            "top_k"
        };
        return Err(ApiError::bad(param, e));
    }
    if body.max_new_tokens == Some(0) {
        return Err(ApiError::bad(
            "max_new_tokens",
            "max_new_tokens must be at least 1",
        ));
    }
    let req = SpeechRequest {
        text: body.input,
        voice,
        language,
        input_format: None,
        emotion: None,
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
    Ok((req, stream))
}
