//! OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::synth::SynthError;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
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
            code: None,
            retry_after: None,
        }
    }

    pub fn bad(param: &'static str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param),
            ..Self::new(StatusCode::BAD_REQUEST, message)
        }
    }

    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    pub fn busy(retry_after: u64, depth: usize) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!("the server is busy: {depth} requests are already queued; retry after {retry_after} s"),
            )
            .code("queue_full")
        }
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message).code("engine_unavailable")
    }

    pub fn shutting_down() -> Self {
        Self::unavailable("the server is shutting down").code("shutting_down")
    }

    pub fn timed_out(timeout: std::time::Duration) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the request ran past the {:.3} s timeout (request_timeout)",
                timeout.as_secs_f64()
            ),
        )
        .code("timeout")
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

impl From<SynthError> for ApiError {
    fn from(e: SynthError) -> Self {
        use crate::engine::EngineError;
        let msg = e.to_string();
        match &e {
            SynthError::Voice(crate::voice::VoiceError::Unknown { .. }) => {
                ApiError::bad("voice", msg).code("unknown_voice")
            }
            SynthError::Voice(_) => ApiError::bad("voice", msg),
            SynthError::EmptyInput => ApiError::bad("input", msg).code("empty_input"),
            SynthError::InputTooLong { .. } => ApiError::bad("input", msg).code("input_too_long"),
            SynthError::WordTooLong { .. } => {
                ApiError::bad("input", msg).code("context_length_exceeded")
            }
            SynthError::Text(crate::text::TextError::NothingSpeakable) => {
                ApiError::bad("input", msg).code("nothing_speakable")
            }
            SynthError::Text(crate::text::TextError::UnsupportedLanguage(_)) => {
                ApiError::bad("language", msg)
            }
            SynthError::Engine(
                EngineError::PromptTooLong { .. } | EngineError::StaticKvFull { .. },
            ) => ApiError::bad("input", msg).code("context_length_exceeded"),
            SynthError::Engine(EngineError::Params(_)) => {
                ApiError::new(StatusCode::BAD_REQUEST, msg)
            }
            SynthError::Prompt(_) => ApiError::bad("input", msg),
            SynthError::Engine(_)
            | SynthError::Codec(_)
            | SynthError::Poisoned
            | SynthError::Text(_) => ApiError::unavailable(msg),
            SynthError::Audio(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, msg),
        }
    }
}
