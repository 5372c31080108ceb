//! Every error the server answers, in OpenAI's shape `{"error": {"message", "type", "param",
//! "code"}}` with its status. This is the one place that decides status, `type`, `param` and
//! `code`: from the library's typed errors (by variant, never by message text) and from the
//! server's own refusals. Every 4xx carries a code.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::audio::AudioError;
use crate::engine::{EngineError, InvalidSampling};
use crate::synth::SynthError;
use crate::text::TextError;
use crate::voice::VoiceError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: &'static str,
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let kind = match status.as_u16() {
            429 => "rate_limit_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
            retry_after: None,
        }
    }

    /// 400 naming the request field that was wrong.
    fn field(param: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::new(StatusCode::BAD_REQUEST, code, message)
        }
    }

    /// A field's value is outside what it allows (OpenAI's `invalid_value`).
    pub fn invalid_value(param: &'static str, message: impl Into<String>) -> Self {
        Self::field(param, "invalid_value", message)
    }

    pub fn empty_input() -> Self {
        Self::field("input", "empty_input", "input is empty")
    }

    pub fn input_too_long(chars: usize, limit: usize) -> Self {
        Self::field(
            "input",
            "input_too_long",
            format!("input has {chars} characters; the limit is {limit} (max_input_chars)"),
        )
    }

    pub fn invalid_json(e: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not valid JSON: {e}"),
        )
    }

    /// A browser page from another origin asked for the WebSocket route.
    pub fn forbidden_origin(origin: &str) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "forbidden_origin",
            format!(
                "a WebSocket from the origin {origin:?} is refused: only this server's own origin and --cors-origin may open one"
            ),
        )
    }

    /// A request to the WebSocket route that is no WebSocket upgrade.
    pub fn upgrade_required(status: StatusCode, message: impl Into<String>) -> Self {
        Self::new(status, "websocket_upgrade_required", message)
    }

    pub fn invalid_type(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_type", message)
    }

    pub fn body_unreadable(e: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("could not read the body: {e}"),
        )
    }

    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("the body is larger than {limit} bytes (max_body_bytes)"),
        )
    }

    pub fn body_timeout(limit: Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the body did not arrive within {:.3} s (body_timeout)",
                limit.as_secs_f64()
            ),
        )
    }

    pub fn unsupported_media_type(got: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!("the body must be JSON (Content-Type: application/json), got {got:?}"),
        )
    }

    /// 415 for a body that is not of the type a route takes.
    pub fn unsupported_media_type_of(got: &str, expected: &str) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "the body must be {expected}, got {:?}",
                if got.is_empty() { "(none)" } else { got }
            ),
        )
    }

    pub fn response_too_large(limit: usize, seconds: f64, rate: u32) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "response_too_large",
            format!(
                "the whole response would pass {} MiB of audio (max_response_mb) after {seconds:.1} s \
                 at {rate} Hz; ask for stream_format \"audio\" (sent as it is made), fewer codes \
                 (max_new_tokens), a lower sample_rate or a higher speed",
                limit >> 20
            ),
        )
    }

    /// 404 for a model id this server does not serve (OpenAI's `model_not_found`); `param` is
    /// `model` when the id came in a request body.
    pub fn model_not_found(id: &str, known: &[String], param: Option<&'static str>) -> Self {
        Self {
            param,
            ..Self::new(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!(
                    "the model {id:?} does not exist here (models: {})",
                    known.join(", ")
                ),
            )
        }
    }

    pub fn not_found() -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", "no such route")
    }

    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "this route does not take that method",
        )
    }

    /// OpenAI's answer to a missing or wrong key, word for word in shape.
    pub fn invalid_api_key() -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_api_key",
            "missing or incorrect API key: send it as 'Authorization: Bearer KEY'",
        )
    }

    pub fn invalid_host(host: &str) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_host",
            format!(
                "Host {host:?} is not this server's address; add it with --allowed-host if it is"
            ),
        )
    }

    pub fn busy(retry_after: u64, depth: usize) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                format!(
                    "the server is busy: {depth} requests are already queued; retry after {retry_after} s"
                ),
            )
        }
    }

    pub fn too_many_connections(limit: usize) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too_many_connections",
            format!("the server has {limit} connections open (max_connections); retry later"),
        )
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "engine_unavailable",
            message,
        )
    }

    /// 503 for a change to the voice store that waited its time for the store's lock (another
    /// server sharing the store holds it).
    pub fn store_busy(message: impl Into<String>) -> Self {
        Self {
            retry_after: Some(1),
            ..Self::new(StatusCode::SERVICE_UNAVAILABLE, "voice_store_busy", message)
        }
    }

    pub fn cancelled() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "cancelled",
            "the request was cancelled",
        )
    }

    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down",
        )
    }

    pub fn timed_out(timeout: Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "the request ran past the {:.3} s timeout (request_timeout)",
                timeout.as_secs_f64()
            ),
        )
    }

    /// 400 for a required form field that is absent (OpenAI's `missing_required_parameter`).
    pub fn missing_field(param: &'static str, why: &str) -> Self {
        Self::field(
            param,
            "missing_required_parameter",
            format!("{param} is required{why}"),
        )
    }

    /// 400 naming a field, with a code of its own.
    pub fn bad_field(param: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self::field(param, code, message)
    }

    /// 413 for an uploaded file over its limit (`got`: its size, when the form was read whole).
    pub fn file_too_large(param: &'static str, got: Option<usize>, limit: usize) -> Self {
        let size = got.map_or_else(String::new, |g| format!(" ({g} bytes)"));
        Self {
            param: Some(param),
            ..Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "file_too_large",
                format!(
                    "{param}{size} is over the limit of {limit} bytes ({:.0} MiB, max_upload_mb)",
                    limit as f64 / f64::from(1 << 20)
                ),
            )
        }
    }

    /// 404 for an object id that does not exist (a consent, a custom voice).
    pub fn no_object(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// 409: the request conflicts with the server's state.
    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, code, message)
    }

    /// 409: the name is taken.
    pub fn name_taken(message: impl Into<String>) -> Self {
        Self {
            param: Some("name"),
            ..Self::new(StatusCode::CONFLICT, "voice_exists", message)
        }
    }

    /// 403 for what this server never does for a client (deleting a shipped voice, an upload from
    /// another site's page).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, code, message)
    }

    /// 501: the operator has not configured what this route needs; the message says what to.
    pub fn not_configured(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_IMPLEMENTED, code, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            r.headers_mut().insert(header::RETRY_AFTER, v);
        }
        r
    }
}

impl From<InvalidSampling> for ApiError {
    fn from(e: InvalidSampling) -> Self {
        ApiError::invalid_value(e.param, e.to_string())
    }
}

/// Audio errors that come from a request field name it; the rest are the server's failure.
impl From<AudioError> for ApiError {
    fn from(e: AudioError) -> Self {
        let msg = e.to_string();
        match e {
            AudioError::UnknownFormat { .. } => ApiError::invalid_value("response_format", msg),
            AudioError::UnsupportedFormat { .. } => {
                ApiError::field("response_format", "unsupported_value", msg)
            }
            AudioError::SampleRateOutOfRange { .. } => ApiError::invalid_value("sample_rate", msg),
            AudioError::SpeedOutOfRange { .. } => ApiError::invalid_value("speed", msg),
            AudioError::TooLongForContainer { .. } => {
                ApiError::field("input", "audio_too_long", msg)
            }
            _ => ApiError::internal(msg),
        }
    }
}

impl From<TextError> for ApiError {
    fn from(e: TextError) -> Self {
        let msg = e.to_string();
        match e {
            TextError::UnsupportedLanguage(_) => ApiError::invalid_value("language", msg),
            TextError::NothingSpeakable => ApiError::field("input", "nothing_speakable", msg),
            _ => ApiError::unavailable(msg),
        }
    }
}

impl From<SynthError> for ApiError {
    fn from(e: SynthError) -> Self {
        let msg = e.to_string();
        match e {
            SynthError::Voice(VoiceError::Unknown { .. }) => {
                ApiError::field("voice", "unknown_voice", msg)
            }
            SynthError::Voice(_) => ApiError::field("voice", "invalid_voice", msg),
            SynthError::EmptyInput => ApiError::empty_input(),
            SynthError::Cancelled(_) => ApiError::cancelled(),
            SynthError::NotAdmitted(m) => ApiError::unavailable(m),
            SynthError::InputTooLong { got, limit } => ApiError::input_too_long(got, limit),
            SynthError::WordTooLong { .. }
            | SynthError::Engine(
                EngineError::PromptTooLong { .. } | EngineError::StaticKvFull { .. },
            ) => ApiError::field("input", "context_length_exceeded", msg),
            SynthError::Text(e) => e.into(),
            SynthError::Audio(e) => e.into(),
            SynthError::Engine(EngineError::Sampling(e)) => e.into(),
            SynthError::Engine(EngineError::Params(_)) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_value", msg)
            }
            SynthError::Prompt(_) => ApiError::field("input", "invalid_input", msg),
            SynthError::Emotion(_) => ApiError::invalid_value("emotion", msg),
            SynthError::Engine(_) | SynthError::Codec(_) => ApiError::unavailable(msg),
            SynthError::Markup(_) => ApiError::field("input", "invalid_markup", msg),
            SynthError::Lexicon(_) => ApiError::field("lexicon", "invalid_lexicon", msg),
            SynthError::IpaNeedsPhonemes(_) | SynthError::PausesTooLong { .. } => {
                ApiError::field("input", "invalid_markup", msg)
            }
            SynthError::LexiconNeedsPhonemes(_) => {
                ApiError::field("lexicon", "invalid_lexicon", msg)
            }
            // Saved codes are decoded by `onebit-tts decode`, never by a request.
            SynthError::Codes(_) => ApiError::internal(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sampling error from the engine points at its request field by the variant's own
    /// parameter name, not by the message text.
    #[test]
    fn an_engine_sampling_error_names_its_field() {
        let e = SynthError::Engine(EngineError::Sampling(InvalidSampling {
            param: "top_p",
            expected: "in (0, 1]",
            got: "0".into(),
        }));
        let api = ApiError::from(e);
        assert_eq!(api.status, StatusCode::BAD_REQUEST);
        assert_eq!(
            (api.kind, api.param, api.code),
            ("invalid_request_error", Some("top_p"), "invalid_value")
        );
        assert!(api.message.contains("top_p must be in (0, 1], got 0"));
    }
}
