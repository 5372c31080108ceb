//! The OpenAI-compatible HTTP server (`onebit-tts serve`). Only this module knows HTTP.
//!
//! One [`Synthesizer`] serves every request, one at a time, in arrival order: a FIFO gate in front
//! of the engine, a bounded queue before it (full -> 429 with Retry-After), a per-request timeout,
//! and cancellation when the client goes away, so generation stops within one code and the next
//! request starts.

mod errors;
mod metrics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc};

pub use errors::ApiError;
pub use metrics::Metrics;

use crate::audio::{AudioFormat, OutputSpec};
use crate::engine::{CancelToken, GenerationParams, SamplingParams, StopReason};
use crate::synth::{SpeechRequest, SynthEvent, SynthesisReport, Synthesizer};
use crate::text::Language;

/// Server limits and knobs; every one is documented in docs/api.md.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// Requests that may wait for the engine besides the one running.
    pub queue_depth: usize,
    pub max_body_bytes: usize,
    pub max_input_chars: usize,
    pub request_timeout: Duration,
    /// How long in-flight requests may run on after SIGINT/SIGTERM before they are cancelled.
    pub shutdown_grace: Duration,
    pub retry_after_s: u64,
    /// Reported by /health.
    pub device: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8880)),
            queue_depth: 8,
            max_body_bytes: 64 * 1024,
            max_input_chars: 4096,
            request_timeout: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(30),
            retry_after_s: 1,
            device: "cpu".into(),
        }
    }
}

struct AppState {
    synth: Arc<Synthesizer>,
    cfg: ServerConfig,
    gate: Arc<Semaphore>,
    metrics: Metrics,
    inflight: Mutex<HashMap<u64, CancelToken>>,
    next_id: AtomicU64,
}

/// The request body of `POST /v1/audio/speech`: OpenAI's fields plus extensions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeechBody {
    #[serde(default)]
    model: Option<String>,
    input: String,
    voice: String,
    #[serde(default)]
    response_format: Option<String>,
    #[serde(default)]
    speed: Option<f32>,
    #[serde(default)]
    stream_format: Option<String>,
    /// Accepted for compatibility; NeuTTS has no instruction input, so it is ignored.
    #[serde(default)]
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamFormat {
    /// A complete file in one body.
    None,
    /// Raw bytes streamed as they are made.
    Audio,
    /// Server-sent events with base64 audio.
    Sse,
}

/// Builds the router; `serve` runs it.
pub fn router(synth: Arc<Synthesizer>, cfg: ServerConfig) -> Router {
    build(synth, cfg).0
}

fn build(synth: Arc<Synthesizer>, cfg: ServerConfig) -> (Router, Arc<AppState>) {
    let state = Arc::new(AppState {
        synth,
        gate: Arc::new(Semaphore::new(1)),
        metrics: Metrics::default(),
        inflight: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        cfg,
    });
    let router = Router::new()
        .route("/v1/audio/speech", post(speech))
        .route("/v1/audio/voices", get(voices))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_route))
        .fallback(not_found)
        .with_state(state.clone());
    (router, state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route").code("not_found")
}

async fn voices(State(st): State<Arc<AppState>>) -> Response {
    let voices: Vec<_> = st
        .synth
        .voices()
        .iter()
        .map(|(v, _)| {
            serde_json::json!({"name": v.name, "language": v.language, "reference_seconds": v.seconds()})
        })
        .collect();
    axum::Json(serde_json::json!({ "voices": voices })).into_response()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let pkg = st.synth.package();
    let id = pkg
        .dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("neutts-air")
        .to_owned();
    axum::Json(serde_json::json!({"object": "list", "data": [
        {"id": id, "object": "model", "owned_by": "onebit-tts", "created": 0}
    ]}))
    .into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(serde_json::json!({
        "status": "ok",
        "ready": true,
        "device": st.cfg.device,
        "engine": st.synth.engine_description(),
        "residency": st.synth.residency().map(|r| r.to_string()),
        "queue_depth": st.metrics.queued.load(Ordering::Relaxed),
    }))
    .into_response()
}

async fn metrics_route(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

/// Keeps the queue count right whichever way a request ends.
struct QueueTicket<'a>(&'a Metrics);
impl Drop for QueueTicket<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Cancels a request's generation when its handler is dropped (the client went away).
struct CancelOnDrop {
    token: CancelToken,
    id: u64,
    state: Arc<AppState>,
}
impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.token.cancel();
        if let Ok(mut m) = self.state.inflight.lock() {
            m.remove(&self.id);
        }
    }
}

fn parse_body(
    st: &AppState,
    headers: &HeaderMap,
    bytes: &[u8],
) -> Result<(SpeechRequest, StreamFormat), ApiError> {
    if let Some(ct) = headers.get(header::CONTENT_TYPE) {
        let ct = ct.to_str().unwrap_or("");
        if !ct
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
        {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("the body must be JSON (Content-Type: application/json), got {ct:?}"),
            ));
        }
    }
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not valid JSON: {e}"),
        )
        .code("invalid_json")
    })?;
    let body: SpeechBody = serde_json::from_value(value).map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid request body: {e}"),
        )
    })?;
    let _ = (&body.model, &body.instructions);

    if body.input.trim().is_empty() {
        return Err(ApiError::bad("input", "input is empty").code("empty_input"));
    }
    let chars = body.input.chars().count();
    if chars > st.cfg.max_input_chars {
        return Err(ApiError::bad(
            "input",
            format!(
                "input has {chars} characters; the limit is {}",
                st.cfg.max_input_chars
            ),
        )
        .code("input_too_long"));
    }
    if let Err(e) = st.synth.voices().get(&body.voice) {
        return Err(ApiError::bad("voice", e.to_string()).code("unknown_voice"));
    }
    let format = match body.response_format.as_deref() {
        None => AudioFormat::Mp3,
        Some(f) => f
            .parse::<AudioFormat>()
            .map_err(|e| ApiError::bad("response_format", e.to_string()))?,
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
    sampling
        .validate()
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, e))?;
    let req = SpeechRequest {
        text: body.input,
        voice: body.voice,
        language,
        input_format: None,
        emotion: None,
        generation: GenerationParams {
            sampling,
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

enum Chunk {
    Bytes(Vec<u8>),
    Done(Result<SynthesisReport, ApiError>),
}

async fn speech(State(st): State<Arc<AppState>>, headers: HeaderMap, request: Request) -> Response {
    let result = speech_inner(st.clone(), headers, request).await;
    match result {
        Ok(r) => r,
        Err(e) => {
            st.metrics.request(e.status.as_u16());
            e.into_response()
        }
    }
}

async fn speech_inner(
    st: Arc<AppState>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let bytes: Bytes = axum::body::to_bytes(request.into_body(), st.cfg.max_body_bytes)
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the body is larger than {} bytes", st.cfg.max_body_bytes),
            )
        })?;
    let (req, stream) = parse_body(&st, &headers, &bytes)?;

    // Admission: one running plus `queue_depth` waiting.
    let prev = st.metrics.queued.fetch_add(1, Ordering::SeqCst);
    let ticket = QueueTicket(&st.metrics);
    if prev > st.cfg.queue_depth {
        drop(ticket);
        return Err(ApiError::busy(st.cfg.retry_after_s, st.cfg.queue_depth));
    }
    std::mem::forget(ticket);

    let id = st.next_id.fetch_add(1, Ordering::Relaxed);
    let token = CancelToken::new();
    if let Ok(mut m) = st.inflight.lock() {
        m.insert(id, token.clone());
    }
    let guard = CancelOnDrop {
        token: token.clone(),
        id,
        state: st.clone(),
    };
    let (tx, mut rx) = mpsc::channel::<Chunk>(32);
    let content_type = req.output.format.content_type();
    spawn_job(st.clone(), req, token.clone(), tx);

    // The timeout cancels the generation; what was made so far is still the response's end.
    let timeout = st.cfg.request_timeout;
    let timer_token = token.clone();
    let timed_out = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let timed_out2 = timed_out.clone();
    tokio::spawn(async move {
        tokio::time::sleep(timeout).await;
        if !timer_token.is_cancelled() {
            timed_out2.store(true, Ordering::SeqCst);
            timer_token.cancel();
        }
    });

    match stream {
        StreamFormat::None => {
            let mut body = Vec::new();
            loop {
                match rx.recv().await {
                    Some(Chunk::Bytes(b)) => body.extend_from_slice(&b),
                    Some(Chunk::Done(Ok(report))) => {
                        if timed_out.load(Ordering::SeqCst) {
                            return Err(ApiError::new(
                                StatusCode::GATEWAY_TIMEOUT,
                                format!("the request ran past the {} s timeout", timeout.as_secs()),
                            )
                            .code("timeout"));
                        }
                        st.metrics.request(200);
                        drop(guard);
                        let mut r = Response::new(Body::from(body));
                        r.headers_mut().insert(
                            header::CONTENT_TYPE,
                            header::HeaderValue::from_static(content_type),
                        );
                        add_report_headers(r.headers_mut(), &report);
                        return Ok(r);
                    }
                    Some(Chunk::Done(Err(e))) => return Err(e),
                    None => {
                        return Err(ApiError::unavailable(
                            "the synthesis job ended without a result",
                        ));
                    }
                }
            }
        }
        StreamFormat::Audio | StreamFormat::Sse => {
            let sse = stream == StreamFormat::Sse;
            st.metrics.request(200);
            let body_stream = async_stream(rx, guard, sse);
            let mut r = Response::new(Body::from_stream(body_stream));
            let ct = if sse {
                "text/event-stream"
            } else {
                content_type
            };
            r.headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
            r.headers_mut().insert(
                header::CACHE_CONTROL,
                header::HeaderValue::from_static("no-cache"),
            );
            Ok(r)
        }
    }
}

fn add_report_headers(h: &mut HeaderMap, report: &SynthesisReport) {
    let pairs = [
        ("x-onebit-codes", report.codes.len().to_string()),
        ("x-onebit-seed", report.seed.to_string()),
        (
            "x-onebit-audio-seconds",
            format!("{:.3}", report.audio_seconds()),
        ),
    ];
    for (k, v) in pairs {
        if let Ok(v) = header::HeaderValue::from_str(&v) {
            h.insert(k, v);
        }
    }
}

/// The streamed body: raw bytes, or SSE events. Errors after the start end the stream: raw audio
/// aborts the transfer (so a client never takes a cut file for a whole one), SSE sends an error event.
fn async_stream(
    rx: mpsc::Receiver<Chunk>,
    guard: CancelOnDrop,
    sse: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold((Some(rx), Some(guard)), move |(rx, guard)| async move {
        let mut rx = rx?;
        match rx.recv().await {
            Some(Chunk::Bytes(b)) => {
                let out = if sse {
                    let b64 = base64::engine::general_purpose::STANDARD.encode(&b);
                    Bytes::from(format!(
                        "data: {}\n\n",
                        serde_json::json!({"type": "speech.audio.delta", "audio": b64})
                    ))
                } else {
                    Bytes::from(b)
                };
                Some((Ok(out), (Some(rx), guard)))
            }
            Some(Chunk::Done(Ok(report))) => {
                drop(guard);
                if sse {
                    let done = serde_json::json!({"type": "speech.audio.done", "usage": {
                        "input_tokens": report.prompt_tokens, "output_tokens": report.codes.len(),
                        "total_tokens": report.prompt_tokens + report.codes.len()}});
                    Some((Ok(Bytes::from(format!("data: {done}\n\n"))), (None, None)))
                } else {
                    None
                }
            }
            Some(Chunk::Done(Err(e))) => {
                drop(guard);
                if sse {
                    let ev = serde_json::json!({"type": "error", "error": e.body()["error"]});
                    Some((Ok(Bytes::from(format!("data: {ev}\n\n"))), (None, None)))
                } else {
                    Some((Err(std::io::Error::other(e.message)), (None, None)))
                }
            }
            None => None,
        }
    })
}

/// Waits for the engine gate, then runs the synthesis on a blocking thread, sending chunks.
fn spawn_job(st: Arc<AppState>, req: SpeechRequest, token: CancelToken, tx: mpsc::Sender<Chunk>) {
    tokio::spawn(async move {
        let permit = tokio::select! {
            p = st.gate.clone().acquire_owned() => p,
            _ = tx.closed() => return,
        };
        let Ok(permit) = permit else { return };
        st.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        st.metrics.running.fetch_add(1, Ordering::SeqCst);
        let st2 = st.clone();
        let tx2 = tx.clone();
        let result = tokio::task::spawn_blocking(move || {
            st2.synth.synthesize(&req, &token, &mut |ev| match ev {
                SynthEvent::Audio(bytes) if !bytes.is_empty() => {
                    if tx2.blocking_send(Chunk::Bytes(bytes.to_vec())).is_err() {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                }
                _ => {
                    if tx2.is_closed() {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                }
            })
        })
        .await;
        drop(permit);
        st.metrics.running.fetch_sub(1, Ordering::SeqCst);
        let done = match result {
            Ok(Ok(report)) => {
                st.metrics.generated(
                    report.codes.len(),
                    report.audio_seconds(),
                    &report.timings,
                    report.stop == StopReason::Cancelled,
                );
                Ok(report)
            }
            Ok(Err(e)) => {
                tracing::warn!("request failed: {e}");
                Err(ApiError::from(e))
            }
            Err(e) => Err(ApiError::unavailable(format!(
                "the synthesis job failed: {e}"
            ))),
        };
        let _ = tx.send(Chunk::Done(done)).await;
    });
}

/// Runs the server until SIGINT/SIGTERM, then stops accepting, lets in-flight requests finish for
/// the grace period, cancels the rest, and returns (dropping the engine before the runtime).
pub async fn serve(synth: Arc<Synthesizer>, cfg: ServerConfig) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    serve_on(listener, synth, cfg, shutdown_signal()).await
}

/// [`serve`] on a bound listener with any shutdown future (tests use loopback port 0).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    synth: Arc<Synthesizer>,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = cfg.shutdown_grace;
    let (app, state) = build(synth, cfg);
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let st = state.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            shutdown.await;
            tracing::info!(
                grace_s = grace.as_secs(),
                "shutting down: no new connections; in-flight requests get the grace period"
            );
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                let tokens: Vec<CancelToken> = st
                    .inflight
                    .lock()
                    .map(|m| m.values().cloned().collect())
                    .unwrap_or_default();
                if !tokens.is_empty() {
                    tracing::warn!(
                        n = tokens.len(),
                        "grace over: cancelling in-flight requests"
                    );
                }
                for t in tokens {
                    t.cancel();
                }
            });
        })
        .await?;
    // The engine sessions go before the runtime: the last Arc of the synthesizer drops here, on
    // a normal thread, and main returns after.
    drop(state);
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
