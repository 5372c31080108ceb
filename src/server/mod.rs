//! The OpenAI-compatible HTTP server (`onebit-tts serve`). Only this module knows HTTP.
//!
//! One [`Synthesizer`] serves every request, one at a time, in arrival order: a FIFO gate in front
//! of the engine and a bounded queue before it (full -> 429 with Retry-After). Each request has a
//! deadline (504 when it passes) and is cancelled when its client goes away, so generation stops
//! within one code and the next request starts. On shutdown the listener closes, in-flight requests
//! get a grace period, then are cancelled, and [`serve_on`] returns once the engine is idle.

mod errors;
mod metrics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use futures_util::StreamExt as _;
use serde::Deserialize;
use tokio::sync::{Semaphore, mpsc};
use tokio::time::Instant;

pub use errors::ApiError;
pub use metrics::Metrics;

use crate::audio::{AudioFormat, OutputSpec};
use crate::engine::{CancelToken, GenerationParams, SamplingParams, StopReason};
use crate::synth::{SpeechRequest, SynthEvent, SynthesisReport, Synthesizer};
use crate::text::Language;

/// How long cancelled requests get to wind down after the shutdown grace before [`serve_on`]
/// stops waiting for their connections.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Server limits and knobs; every one is documented in docs/api.md.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// Requests that may wait for the engine besides the one running.
    pub queue_depth: usize,
    pub max_body_bytes: usize,
    pub max_input_chars: usize,
    /// From arrival to the end of synthesis, queue wait included.
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
    /// Read once: asking the synthesizer takes the engine's lock, which a running request holds.
    engine: String,
    /// One permit: the engine. Tokio's semaphore is fair, so waiters run in arrival order.
    gate: Arc<Semaphore>,
    metrics: Metrics,
    /// Requests admitted and not finished (waiting or running): the queue bound is on this.
    admitted: AtomicUsize,
    /// Cancel tokens of admitted requests, for shutdown.
    inflight: Mutex<HashMap<u64, CancelToken>>,
    next_id: AtomicU64,
    shutting_down: AtomicBool,
}

impl AppState {
    fn cancel_all(&self) -> usize {
        let tokens: Vec<CancelToken> = self
            .inflight
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for t in &tokens {
            t.cancel();
        }
        tokens.len()
    }
}

/// `voice`: a name, or OpenAI's custom-voice object `{"id": NAME}`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum VoiceField {
    Name(String),
    Object { id: String },
}

/// The request body of `POST /v1/audio/speech`: OpenAI's fields plus extensions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SpeechBody {
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
        engine: synth.engine_description(),
        synth,
        gate: Arc::new(Semaphore::new(1)),
        metrics: Metrics::default(),
        admitted: AtomicUsize::new(0),
        inflight: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        shutting_down: AtomicBool::new(false),
        cfg,
    });
    let router = Router::new()
        .route("/v1/audio/speech", post(speech))
        .route("/v1/audio/voices", get(voices))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_route))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state.clone());
    (router, state)
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no such route").code("not_found")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "this route does not take that method",
    )
    .code("method_not_allowed")
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

fn model_id(st: &AppState) -> String {
    st.synth
        .package()
        .dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("neutts-air")
        .to_owned()
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    axum::Json(serde_json::json!({"object": "list", "data": [
        {"id": model_id(&st), "object": "model", "owned_by": "onebit-tts", "created": 0}
    ]}))
    .into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let stopping = st.shutting_down.load(Ordering::SeqCst);
    let worker = st.synth.worker().map(|w| w.state());
    // A worker that cannot be replaced yet (an NPU holder still exiting, a respawn that failed
    // the residency gate) leaves nothing to serve with: say so, so a balancer looks elsewhere.
    let unavailable = worker.as_ref().is_some_and(|w| w.is_unavailable());
    let status = match (stopping, unavailable) {
        (true, _) => "shutting_down",
        (false, true) => "unavailable",
        (false, false) => "ok",
    };
    let body = axum::Json(serde_json::json!({
        "status": status,
        "ready": !stopping && !unavailable,
        "worker": worker.as_ref().map(|w| {
            let mut v = serde_json::to_value(w).unwrap_or_default();
            v["detail"] = w.to_string().into();
            v
        }),
        "model": model_id(&st),
        "device": st.cfg.device,
        "engine": st.engine,
        "residency": st.synth.residency(),
        "runtime": st.synth.runtime(),
        "queue_depth": st.metrics.queued.load(Ordering::SeqCst),
        "running": st.metrics.running.load(Ordering::SeqCst),
    }));
    let code = if stopping || unavailable {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    };
    (code, body).into_response()
}

async fn metrics_route(State(st): State<Arc<AppState>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

/// A place in the system (waiting or running) for one request. Dropping it, whichever way the
/// request ends, frees the place and keeps the gauges right.
struct Admission {
    st: Arc<AppState>,
    id: u64,
    running: bool,
}

impl Admission {
    /// `None` when one request runs and `queue_depth` already wait.
    fn try_new(st: &Arc<AppState>, token: &CancelToken) -> Option<Self> {
        let prev = st.admitted.fetch_add(1, Ordering::SeqCst);
        if prev > st.cfg.queue_depth {
            st.admitted.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        st.metrics.queued.fetch_add(1, Ordering::SeqCst);
        let id = st.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = st.inflight.lock() {
            m.insert(id, token.clone());
        }
        Some(Self {
            st: st.clone(),
            id,
            running: false,
        })
    }

    fn start(&mut self) {
        if !self.running {
            self.running = true;
            self.st.metrics.queued.fetch_sub(1, Ordering::SeqCst);
            self.st.metrics.running.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.running {
            self.st.metrics.running.fetch_sub(1, Ordering::SeqCst);
        } else {
            self.st.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        }
        if let Ok(mut m) = self.st.inflight.lock() {
            m.remove(&self.id);
        }
        self.st.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Cancels a request's generation when the response (or the handler) is dropped: the client went
/// away. A no-op once the generation has ended.
struct CancelOnDrop(CancelToken);
impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

/// Most bytes of an oversized body read and thrown away before the 413 is sent: a client that is
/// still sending when the server closes would see a reset instead of the answer.
const DRAIN_CAP: u64 = 1 << 20;

/// Reads the body up to the limit: 413 past it, 400 when the client breaks off.
async fn read_body(st: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
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
async fn drain(stream: &mut axum::body::BodyDataStream, mut seen: u64) {
    while seen <= DRAIN_CAP {
        match stream.next().await {
            Some(Ok(chunk)) => seen += chunk.len() as u64,
            _ => return,
        }
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
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

fn parse_body(st: &AppState, bytes: &[u8]) -> Result<(SpeechRequest, StreamFormat), ApiError> {
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

enum Chunk {
    Bytes(Vec<u8>),
    Done(Result<SynthesisReport, ApiError>),
}

async fn speech(State(st): State<Arc<AppState>>, request: Request) -> Response {
    let arrived = Instant::now();
    match speech_inner(&st, arrived, request).await {
        Ok(r) => r,
        Err(e) => {
            st.metrics.request(e.status.as_u16());
            e.into_response()
        }
    }
}

async fn speech_inner(
    st: &Arc<AppState>,
    arrived: Instant,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    check_content_type(&parts.headers)?;
    let bytes = read_body(st, &parts.headers, body).await?;
    let (req, stream) = parse_body(st, &bytes)?;
    if st.shutting_down.load(Ordering::SeqCst) {
        return Err(shutting_down());
    }

    let token = CancelToken::new();
    let Some(admission) = Admission::try_new(st, &token) else {
        return Err(ApiError::busy(st.cfg.retry_after_s, st.cfg.queue_depth));
    };
    let guard = CancelOnDrop(token.clone());
    let (tx, mut rx) = mpsc::unbounded_channel::<Chunk>();
    let content_type = req.output.format.content_type();
    let deadline = arrived + st.cfg.request_timeout;
    tokio::spawn(run_job(st.clone(), req, token, tx, admission, deadline));

    match stream {
        StreamFormat::None => {
            let mut body = Vec::new();
            loop {
                match rx.recv().await {
                    Some(Chunk::Bytes(b)) => body.extend_from_slice(&b),
                    Some(Chunk::Done(Ok(report))) => {
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
            let body_stream = response_stream(rx, guard, sse);
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

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn add_report_headers(h: &mut HeaderMap, report: &SynthesisReport) {
    let t = &report.timings;
    let pairs = [
        ("x-onebit-codes", report.codes.len().to_string()),
        ("x-onebit-seed", report.seed.to_string()),
        (
            "x-onebit-finish-reason",
            report.stop.finish_reason().to_owned(),
        ),
        (
            "x-onebit-audio-seconds",
            format!("{:.3}", report.audio_seconds()),
        ),
        // Stage times of the synthesis (W3C Server-Timing, milliseconds).
        (
            "server-timing",
            format!(
                "front_end;dur={:.3}, prefill;dur={:.3}, decode;dur={:.3}, codec;dur={:.3}, encode;dur={:.3}, total;dur={:.3}",
                ms(t.front_end),
                ms(t.prefill),
                ms(t.decode),
                ms(t.codec),
                ms(t.encode),
                ms(t.total)
            ),
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
fn response_stream(
    rx: mpsc::UnboundedReceiver<Chunk>,
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
            None => Some((
                Err(std::io::Error::other(
                    "the synthesis job ended without a result",
                )),
                (None, None),
            )),
        }
    })
}

fn shutting_down() -> ApiError {
    ApiError::unavailable("the server is shutting down").code("shutting_down")
}

fn timed_out(timeout: Duration) -> ApiError {
    ApiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        format!(
            "the request ran past the {:.3} s timeout (request_timeout)",
            timeout.as_secs_f64()
        ),
    )
    .code("timeout")
}

/// Waits for the engine, then runs the synthesis on a blocking thread, sending chunks. Ends early
/// when the client goes away while waiting, and cancels the generation at the deadline.
async fn run_job(
    st: Arc<AppState>,
    req: SpeechRequest,
    token: CancelToken,
    tx: mpsc::UnboundedSender<Chunk>,
    mut admission: Admission,
    deadline: Instant,
) {
    let timeout = st.cfg.request_timeout;
    let permit = tokio::select! {
        p = st.gate.clone().acquire_owned() => p,
        _ = tx.closed() => return,
        _ = tokio::time::sleep_until(deadline) => {
            let _ = tx.send(Chunk::Done(Err(timed_out(timeout))));
            return;
        }
    };
    let Ok(permit) = permit else {
        let _ = tx.send(Chunk::Done(Err(shutting_down())));
        return;
    };
    if token.is_cancelled() {
        // Cancelled while waiting: by shutdown (a gone client closes the channel instead).
        let _ = tx.send(Chunk::Done(Err(shutting_down())));
        return;
    }
    admission.start();
    let st2 = st.clone();
    let tx2 = tx.clone();
    let token2 = token.clone();
    let mut job = tokio::task::spawn_blocking(move || {
        st2.synth.synthesize(&req, &token2, &mut |ev| match ev {
            SynthEvent::Audio(bytes) if !bytes.is_empty() => {
                if tx2.send(Chunk::Bytes(bytes.to_vec())).is_err() {
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
    });
    let mut deadline_passed = false;
    let result = tokio::select! {
        r = &mut job => r,
        _ = tokio::time::sleep_until(deadline) => {
            deadline_passed = true;
            token.cancel();
            job.await
        }
    };
    drop(permit);
    let done = match result {
        Ok(Ok(report)) => {
            let cancelled = report.stop == StopReason::Cancelled;
            st.metrics.generated(
                report.codes.len(),
                report.audio_seconds(),
                &report.timings,
                report.stop,
            );
            if deadline_passed && cancelled {
                Err(timed_out(timeout))
            } else if cancelled && st.shutting_down.load(Ordering::SeqCst) {
                Err(shutting_down())
            } else if cancelled {
                // The client went away: nobody reads this.
                Err(ApiError::unavailable("the request was cancelled").code("cancelled"))
            } else {
                Ok(report)
            }
        }
        Ok(Err(e)) => {
            tracing::warn!("request failed: {e}");
            Err(ApiError::from(e))
        }
        Err(e) => Err(ApiError::unavailable(format!(
            "the synthesis job failed: {e}"
        ))),
    };
    drop(admission);
    let _ = tx.send(Chunk::Done(done));
}

/// Runs the server until SIGINT/SIGTERM, then stops accepting, lets in-flight requests finish for
/// the grace period, cancels the rest, and returns (dropping the engine before the runtime).
pub async fn serve(synth: Arc<Synthesizer>, cfg: ServerConfig) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    serve_on(listener, synth, cfg, shutdown_signal()).await
}

/// [`serve`] on a bound listener with any shutdown future (tests use loopback port 0).
///
/// When `shutdown` completes: the listener closes (new connections are refused), idle connections
/// close, in-flight requests may finish within `shutdown_grace`; then they are cancelled (streams
/// end with an error, whole responses get 503) and get [`SHUTDOWN_DRAIN`] to wind down. Returns
/// once every connection is closed (or the drain is over) and the engine is idle.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    synth: Arc<Synthesizer>,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = cfg.shutdown_grace;
    let (app, state) = build(synth, cfg);
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let (fired_tx, mut fired_rx) = tokio::sync::watch::channel(false);
    let st = state.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        st.shutting_down.store(true, Ordering::SeqCst);
        tracing::info!(
            grace_s = grace.as_secs_f64(),
            "shutting down: no new connections; in-flight requests get the grace period"
        );
        let _ = fired_tx.send(true);
    });
    let st = state.clone();
    let overdue = async move {
        if fired_rx.wait_for(|fired| *fired).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(grace).await;
        let n = st.cancel_all();
        if n > 0 {
            tracing::warn!(n, "grace over: cancelling in-flight requests");
        }
        tokio::time::sleep(SHUTDOWN_DRAIN).await;
    };
    tokio::select! {
        r = server.into_future() => r?,
        _ = overdue => tracing::warn!("connections still open after the grace and drain; leaving them"),
    }
    // Nothing may start any more; what still runs (a request whose client left) is cancelled and
    // stops within one code. Waiting for the gate means the engine is idle.
    state.cancel_all();
    match tokio::time::timeout(SHUTDOWN_DRAIN, state.gate.acquire()).await {
        Ok(Ok(permit)) => drop(permit),
        _ => tracing::warn!("the engine did not stop in time"),
    }
    state.gate.close();
    // The engine sessions go before the runtime: the last Arc of the synthesizer drops when the
    // caller drops its own, on a normal thread, and main returns after.
    drop(state);
    Ok(())
}

fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    // Registered here, before the server logs "listening": a SIGTERM that arrives as soon as the
    // server can be seen must already find our handler, not the default action that kills the
    // process with its worker still running.
    let int = signal(SignalKind::interrupt()).ok();
    let term = signal(SignalKind::terminate()).ok();
    async fn wait(s: Option<Signal>) {
        match s {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    async move {
        tokio::select! {
            _ = wait(int) => {},
            _ = wait(term) => {},
        }
    }
}
