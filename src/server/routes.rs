//! The router: every route's handler, and the speech handler that ties schema, admission, the
//! runner and the response framing together.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::time::Instant;

use super::admission::{check_host, check_key, cors};
use super::errors::ApiError;
use super::metrics::Metrics;
use super::names::VoiceAliases;
use super::runner::{TooLarge, code_cap, ended, refused, within_cap};
use super::schema::{StreamFormat, check_content_type, parse_body, read_body};
use super::spool::{self, Spool};
use super::stream::{add_report_headers, response_stream};
use super::voices::{self, Cloning};
use super::{AppState, ServerConfig};
use crate::synth::{Door, Event, Submit, SynthesisReport, Synthesizer};

/// Builds the router; `serve` runs it.
pub fn router(synth: Arc<Synthesizer>, cfg: ServerConfig) -> Router {
    build(synth, cfg).0
}

pub(super) fn build(synth: Arc<Synthesizer>, cfg: ServerConfig) -> (Router, Arc<AppState>) {
    let cloning = Cloning::open_or_explain(&cfg);
    let (door, metrics) = front_door(synth, &cfg);
    build_with(door, metrics, cfg, cloning)
}

/// The front door every transport of one server shares, and the metrics that see each of its
/// requests.
pub(super) fn front_door(synth: Arc<Synthesizer>, cfg: &ServerConfig) -> (Door, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::default());
    let observer = Arc::new(MetricsObserver(metrics.clone()));
    (Door::observed(synth, cfg.limits(), Some(observer)), metrics)
}

/// Counts every request's generation and, for one that ended without its audio, why: here,
/// whether or not its client still reads (a stream nobody reads still has its end counted).
struct MetricsObserver(Arc<Metrics>);

impl crate::synth::door::Observer for MetricsObserver {
    fn report(&self, r: &SynthesisReport) {
        self.0.generated(
            r.codes.len(),
            r.audio_seconds(),
            &r.timings,
            r.stop,
            r.npu_commands,
        );
    }

    fn ended(&self, ended: &crate::synth::Ended) {
        self.0.dropped(super::runner::drop_reason(ended));
    }
}

pub(super) fn build_with(
    door: Door,
    metrics: Arc<Metrics>,
    cfg: ServerConfig,
    cloning: Cloning,
) -> (Router, Arc<AppState>) {
    let synth = door.synth().clone();
    // `serve` refuses bad aliases before it binds; a router built directly keeps the defaults.
    let installed = synth.voices();
    let aliases = VoiceAliases::new(&installed, &cfg.voice_aliases).unwrap_or_else(|e| {
        tracing::error!("{e}; serving OpenAI's voice names with the default mapping only");
        VoiceAliases::new(&installed, &Default::default()).unwrap_or_default()
    });
    let state = Arc::new(AppState {
        aliases,
        cloning,
        door,
        synth,
        metrics,
        cfg,
        stopping: tokio::sync::watch::channel(false).0,
    });
    let mut router = Router::new()
        .route("/", get(page))
        .route("/v1/audio/speech", post(speech))
        .route("/v1/audio/speech/stream", get(super::ws::upgrade))
        .route("/v1/audio/voices", get(voices).post(voices::create_voice))
        .route(
            "/v1/audio/voices/{id}",
            get(voices::get_voice).delete(voices::delete_voice),
        )
        .route(
            "/v1/audio/voice_consents",
            get(voices::list_consents).post(voices::create_consent),
        )
        .route(
            "/v1/audio/voice_consents/{id}",
            get(voices::get_consent)
                .post(voices::update_consent)
                .delete(voices::delete_consent),
        )
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics_route))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        // Layers run last-added first: Host, then CORS (which answers preflights, sent without
        // credentials), then the key.
        .layer(middleware::from_fn_with_state(state.clone(), check_key));
    if let Some(cors) = cors(&state.cfg.cors_origins) {
        router = router.layer(cors);
    }
    let router = router
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .with_state(state.clone());
    (router, state)
}

/// The page to try the server in a browser: one self-contained file in the binary, no CDN.
async fn page() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            // It holds the key and buttons that speak and clone: no other site may frame it.
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CONTENT_SECURITY_POLICY, "frame-ancestors 'none'"),
        ],
        include_str!("web/index.html"),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::not_found()
}

async fn method_not_allowed() -> ApiError {
    ApiError::method_not_allowed()
}

async fn voices(State(st): State<Arc<AppState>>) -> Response {
    let store = st.synth.voices();
    let voices: Vec<_> = store
        .iter()
        .map(|(v, _)| {
            serde_json::json!({"name": v.name, "language": v.language,
                "reference_seconds": v.seconds(), "aliases": st.aliases.of(&v.name),
                "id": v.custom.as_ref().map(|c| &c.id)})
        })
        .collect();
    // OpenAI's list shape beside ours: the voices created here, as `audio.voice` objects.
    let data: Vec<_> = store
        .iter()
        .filter(|(v, _)| v.custom.is_some())
        .map(|(v, _)| voices::voice_object(v))
        .collect();
    let aliases: serde_json::Map<String, serde_json::Value> = st
        .aliases
        .iter()
        .map(|(a, v)| (a.to_owned(), v.into()))
        .collect();
    axum::Json(
        serde_json::json!({ "voices": voices, "aliases": aliases, "object": "list",
        "data": data, "cloning": st.cloning.status() }),
    )
    .into_response()
}

/// OpenAI's model object, with what a request may ask of the loaded model (every id names it):
/// its emotions (`null`: a BPE model that declares none takes any its tokenizer has a token
/// for), the language it reads when a request names none (`null`: the voice's), its input
/// format.
fn model_object(id: &str, pkg: &crate::package::ModelPackage) -> serde_json::Value {
    serde_json::json!({"id": id, "object": "model", "owned_by": "onebit-tts", "created": 0,
        "emotions": pkg.listed_emotions(), "language": pkg.language,
        "input_format": pkg.input_format.to_string()})
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    let pkg = st.synth.package();
    let data: Vec<_> = st
        .model_ids()
        .iter()
        .map(|id| model_object(id, pkg))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

async fn model(
    State(st): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    let known = st.model_ids();
    if known.contains(&id) {
        axum::Json(model_object(&id, st.synth.package())).into_response()
    } else {
        ApiError::model_not_found(&id, &known, None).into_response()
    }
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let stopping = st.shutting_down();
    let load = st.door.load();
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
        "model": st.package_name(),
        // The package's own word that its weights are random (a test package: no words).
        "model_note": st.synth.package().random_weights_notice(),
        "device": st.cfg.device,
        "engine": st.synth.engine_description(),
        "residency": st.synth.residency(),
        // The driver's count for the last finished request (null: not on the NPU, not
        // countable, or none yet).
        "last_request": { "npu_commands": st.metrics.last_npu_commands() },
        "runtime": st.synth.runtime(),
        "queue_depth": load.queued,
        "running": load.running,
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
        st.metrics
            .render(st.synth.scheduler_stats(), &st.door.load()),
    )
        .into_response()
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

/// Errors before admission are rejections; after it [`ended`] counts why a request ended.
fn before_queue<T>(st: &AppState, r: Result<T, ApiError>) -> Result<T, ApiError> {
    if let Err(e) = &r {
        st.metrics.rejected(e.code);
    }
    r
}

async fn speech_inner(
    st: &Arc<AppState>,
    arrived: Instant,
    request: Request,
) -> Result<Response, ApiError> {
    let (parts, body) = request.into_parts();
    let checked = async {
        check_content_type(&parts.headers)?;
        let bytes = read_body(st, &parts.headers, body).await?;
        parse_body(st, &bytes)
    }
    .await;
    let (req, stream, timing) = before_queue(st, checked)?;
    let content_type = req.output.format.content_type();
    // A whole response is held until it is complete: past the cap, stop generating and refuse.
    let too_large = (stream == StreamFormat::None).then(|| TooLarge {
        codes: code_cap(st, req.output.sample_rate, req.output.speed),
        rate: req.output.sample_rate,
        speed: req.output.speed,
    });
    let opts = Submit {
        deadline: Some((arrived + st.cfg.request_timeout).into_std()),
        codes: too_large.is_some(),
    };
    let (permit, events) = st.door.submit(req, opts).map_err(|r| refused(st, r))?;
    let mut events = events;

    match stream {
        StreamFormat::None => {
            // Spooled (memory, then an unlinked file) as it is made, sent from there once
            // complete: a slow client holds disk, not the server's memory.
            let failed = |e: std::io::Error| {
                // The request is dropped with it: counted as its client gone.
                tracing::warn!("spooling a response failed: {e}");
                ApiError::internal(format!("spooling the response failed: {e}"))
            };
            let mut spool = Spool::for_response();
            let mut stopped = None;
            let report = loop {
                match events.recv().await {
                    Some(Event::Audio(b)) => spool.append(b).await.map_err(failed)?,
                    Some(Event::Patch { offset, bytes }) => {
                        spool.patch(offset, bytes).await.map_err(failed)?
                    }
                    Some(Event::Code { index, .. })
                        if too_large.is_some_and(|t| index >= t.codes) =>
                    {
                        stopped = too_large;
                        permit.stop();
                    }
                    Some(Event::Done(result)) => {
                        break ended(st, result, stopped).map_err(|e| {
                            e.unwrap_or_else(|| ApiError::unavailable("the client has gone"))
                        })?;
                    }
                    Some(_) => {}
                    None => {
                        return Err(ApiError::unavailable(
                            "the synthesis job ended without a result",
                        ));
                    }
                }
            };
            within_cap(st, &report, too_large)?;
            st.metrics.request(200);
            drop(permit);
            let (len, body, ct) = if timing {
                // Kokoro-FastAPI's captioned speech shape: the audio in base64 beside its
                // timing document.
                let (len, body) =
                    spool::with_timing(spool, content_type, report.timeline.to_value());
                (len, Body::from_stream(body), "application/json")
            } else {
                let len = spool.len();
                (len, Body::from_stream(spool.into_stream()), content_type)
            };
            let mut r = Response::new(body);
            r.headers_mut()
                .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, header::HeaderValue::from(len));
            add_report_headers(r.headers_mut(), &report);
            Ok(r)
        }
        StreamFormat::Audio | StreamFormat::Sse => {
            let sse = stream == StreamFormat::Sse;
            st.metrics.request(200);
            let body_stream = response_stream(st.clone(), events, permit, sse, timing);
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
