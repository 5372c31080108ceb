//! Text in as it is written: `GET /v1/audio/speech/stream` upgrades to a WebSocket that takes
//! text chunks as a language model emits them, speaks each sentence as soon as it is complete,
//! and sends its audio back while the client goes on writing (docs/api.md, "WebSocket").
//!
//! Client messages are JSON text frames: `session.update` (the speech body's fields but
//! `input`; before the first text), `input_text.append` (`text`), `input_text.flush` (speak
//! what is pending now, even mid-sentence) and `input_text.done` (speak the rest, then the
//! server closes). The server sends each sentence's audio as binary frames (in the session's
//! `response_format`; every sentence is a complete stream of it, so `pcm` is one continuous
//! stream) between JSON `speech.sentence.start` and `speech.sentence.done` events, then
//! `speech.done` and a normal close. Every sentence goes through the front door like any other
//! request: the same keys, limits, queue bound and deadline.
//!
//! Backpressure both ways: audio goes out as the client reads it (a client that stops reading
//! stops the generation); the socket is read all the time (pings are answered, a client that
//! leaves is seen at once), and the text waiting to be spoken may not exceed `max_input_chars`.
//! A bad message gets an `error` event and a close code that names the fault. A browser page may
//! open the socket only from this server's own origin or a `--cors-origin` one.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::AppState;
use super::errors::ApiError;
use super::runner::{ended, refused, submit_in_turn};
use super::schema::parse_body;
use crate::synth::{Event, Refusal, SpeechRequest, Submit};
use crate::text::SentenceStream;

/// Close codes (RFC 6455 7.4.1) and what they mean here.
pub mod close {
    /// Everything was spoken.
    pub const NORMAL: u16 = 1000;
    /// The server is shutting down.
    pub const GOING_AWAY: u16 = 1001;
    /// A binary frame where JSON text was expected.
    pub const UNSUPPORTED: u16 = 1003;
    /// A message that is not JSON, or lacks a field, or has a bad value.
    pub const INVALID: u16 = 1007;
    /// A message type this route does not take, or one out of order.
    pub const POLICY: u16 = 1008;
    /// The text waiting to be spoken is over the input limit.
    pub const TOO_BIG: u16 = 1009;
    /// The synthesis failed.
    pub const INTERNAL: u16 = 1011;
    /// The server is busy (the front door's queue is full): try again later.
    pub const TRY_AGAIN: u16 = 1013;
}

/// What the reader hands the speaker, in order.
enum Work {
    Speak(String),
    /// The client is done: close normally once everything before this is spoken.
    Done,
}

/// How the reader ends a session at once, whatever is still queued or being spoken.
enum End {
    /// The client closed the socket or it failed: nobody reads the rest.
    Gone,
    /// End with an error event and this close code.
    Fail(u16, ApiError),
}

/// The upgrade handler. The key check and Host check ran before it, as for every route; the
/// Origin check is this route's own (below).
pub(super) async fn upgrade(
    State(st): State<Arc<AppState>>,
    slot: Option<axum::Extension<super::conn::ConnSlot>>,
    headers: axum::http::HeaderMap,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let refuse = |e: ApiError| {
        st.metrics.rejected(e.code);
        st.metrics.request(e.status.as_u16());
        axum::response::IntoResponse::into_response(e)
    };
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            return refuse(ApiError::upgrade_required(
                e.status(),
                format!(
                    "{}: this route speaks WebSocket (docs/api.md)",
                    e.body_text()
                ),
            ));
        }
    };
    if let Some(origin) = headers.get(axum::http::header::ORIGIN)
        && !origin_allowed(origin, &headers, &st.cfg.cors_origins)
    {
        return refuse(ApiError::forbidden_origin(
            origin.to_str().unwrap_or("(not text)"),
        ));
    }
    if st.shutting_down() {
        return refuse(ApiError::shutting_down());
    }
    ws.max_message_size(st.cfg.max_body_bytes)
        .on_upgrade(move |socket| async move {
            // The session holds its connection's place and count until it ends.
            let _slot = slot;
            session(st, socket).await
        })
}

/// A WebSocket has no CORS preflight and a page may read its replies from any origin, so a
/// browser's upgrade (it always sends `Origin`) is let through only from this server's own
/// origin (the Host it was reached by) or one of `--cors-origin`; clients that are not browsers
/// send no Origin.
fn origin_allowed(
    origin: &axum::http::HeaderValue,
    headers: &axum::http::HeaderMap,
    allowed: &[String],
) -> bool {
    let Ok(origin) = origin.to_str() else {
        return false;
    };
    let origin = origin.trim_end_matches('/');
    if allowed
        .iter()
        .any(|a| a == "*" || a.trim_end_matches('/').eq_ignore_ascii_case(origin))
    {
        return true;
    }
    let host = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok());
    let own = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    matches!((own, host), (Some(o), Some(h)) if o.eq_ignore_ascii_case(h))
}

async fn session(st: Arc<AppState>, socket: WebSocket) {
    let (mut tx, mut rx) = socket.split();
    let (work_tx, mut work_rx) = mpsc::unbounded_channel::<Work>();
    let (end_tx, mut end_rx) = tokio::sync::oneshot::channel::<End>();
    let (template_tx, template_rx) = tokio::sync::watch::channel(None::<SpeechRequest>);
    let queued = Arc::new(AtomicUsize::new(0));
    let reader = {
        let mut reader = Reader {
            st: st.clone(),
            text: SentenceStream::default(),
            template: None,
            template_tx,
            work: work_tx,
            queued: queued.clone(),
            done: false,
        };
        tokio::spawn(async move {
            let end = reader.run(&mut rx).await;
            let _ = end_tx.send(end);
        })
    };
    let mut shutdown = st.stopping.subscribe();
    let mut index = 0usize;
    let end = loop {
        let work = tokio::select! {
            w = work_rx.recv() => w,
            e = &mut end_rx => break ending(e),
            _ = shutdown.wait_for(|s| *s) => {
                break (close::GOING_AWAY, Some(ApiError::shutting_down()));
            }
        };
        match work {
            Some(Work::Speak(text)) => {
                queued.fetch_sub(text.chars().count(), Ordering::SeqCst);
                let Some(template) = template_rx.borrow().clone() else {
                    continue;
                };
                match speak(&st, &mut tx, &mut end_rx, template, text, index).await {
                    Ok(()) => index += 1,
                    Err(Some((code, e))) => break (code, Some(e)),
                    Err(None) => break (close::NORMAL, None),
                }
            }
            Some(Work::Done) => {
                let _ =
                    send_json(&mut tx, json!({"type": "speech.done", "sentences": index})).await;
                break (close::NORMAL, None);
            }
            // The reader has ended; its reason is on `end_rx`.
            None => break ending((&mut end_rx).await),
        }
    };
    reader.abort();
    let (code, error) = end;
    let reason = match &error {
        Some(e) => {
            let _ = send_json(
                &mut tx,
                json!({"type": "error", "error": e.body()["error"]}),
            )
            .await;
            e.code.to_owned()
        }
        None => String::new(),
    };
    let _ = tx
        .send(Message::Close(Some(CloseFrame {
            code,
            reason: truncate(&reason, 120).into(),
        })))
        .await;
}

/// The close code and error a reader's end calls for (none: the client is gone).
fn ending(end: Result<End, tokio::sync::oneshot::error::RecvError>) -> (u16, Option<ApiError>) {
    match end {
        Ok(End::Fail(code, e)) => (code, Some(e)),
        Ok(End::Gone) | Err(_) => (close::NORMAL, None),
    }
}

/// A close reason is at most 123 bytes.
fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

async fn send_json<S>(tx: &mut S, v: Value) -> Result<(), axum::Error>
where
    S: SinkExt<Message, Error = axum::Error> + Unpin,
{
    tx.send(Message::Text(v.to_string().into())).await
}

/// Speaks one sentence through the front door, its audio going out as binary frames as the
/// client reads them. `Err(None)`: the client has gone; `Err(Some)`: end the session with this
/// close code and error. A later sentence waits for room at the door rather than be refused.
async fn speak<S>(
    st: &Arc<AppState>,
    tx: &mut S,
    end: &mut tokio::sync::oneshot::Receiver<End>,
    template: SpeechRequest,
    text: String,
    index: usize,
) -> Result<(), Option<(u16, ApiError)>>
where
    S: SinkExt<Message, Error = axum::Error> + Unpin,
{
    let req = SpeechRequest { text, ..template };
    let sentence = req.text.clone();
    let opts = Submit {
        deadline: Some(std::time::Instant::now() + st.cfg.request_timeout),
        codes: false,
    };
    let submitted = if index == 0 {
        st.door.submit(req, opts)
    } else {
        submit_in_turn(&st.door, req, opts).await
    };
    let (permit, events) = submitted.map_err(|r| {
        let code = match r {
            Refusal::Busy { .. } => close::TRY_AGAIN,
            Refusal::Closed => close::GOING_AWAY,
            Refusal::Invalid(_) => close::INVALID,
        };
        Some((code, refused(st, r)))
    })?;
    let mut events = events;
    send_json(
        tx,
        json!({"type": "speech.sentence.start", "index": index, "text": sentence}),
    )
    .await
    .map_err(|_| None)?;
    loop {
        let event = tokio::select! {
            e = events.recv() => e,
            // The client left or broke the protocol mid-sentence: the permit goes, and with it
            // the synthesis.
            e = &mut *end => {
                let (code, error) = ending(e);
                return Err(error.map(|e| (code, e)));
            }
        };
        match event {
            Some(Event::Audio(b)) => tx.send(Message::Binary(b.into())).await.map_err(|_| None)?,
            // Where the sentence's pieces lie in its audio (word times estimated).
            Some(Event::Timing(t)) => send_json(
                tx,
                json!({"type": "speech.timing", "index": index, "piece": t, "words_estimated": true}),
            )
            .await
            .map_err(|_| None)?,
            Some(Event::Done(result)) => {
                drop(permit);
                return match ended(st, result, None) {
                    Ok(report) => {
                        st.metrics.request(200);
                        send_json(
                            tx,
                            json!({"type": "speech.sentence.done", "index": index,
                                "codes": report.codes.len(),
                                "audio_seconds": report.audio_seconds(),
                                "finish_reason": report.stop.finish_reason()}),
                        )
                        .await
                        .map_err(|_| None)
                    }
                    Err(None) => Err(None),
                    Err(Some(e)) => {
                        st.metrics.request(e.status.as_u16());
                        let code = match e.code {
                            "shutting_down" => close::GOING_AWAY,
                            _ if e.status.is_client_error() => close::INVALID,
                            _ => close::INTERNAL,
                        };
                        Err(Some((code, e)))
                    }
                };
            }
            Some(_) => {}
            None => {
                return Err(Some((
                    close::INTERNAL,
                    ApiError::unavailable("the synthesis ended without a result"),
                )));
            }
        }
    }
}

/// Reads the client's messages into sentences for the speaker. It reads all the time, so pings
/// are answered and a client that leaves is seen at once, even while sentences wait; what may
/// wait is bounded instead (the text queued and pending within `max_input_chars`).
struct Reader {
    st: Arc<AppState>,
    text: SentenceStream,
    template: Option<SpeechRequest>,
    template_tx: tokio::sync::watch::Sender<Option<SpeechRequest>>,
    work: mpsc::UnboundedSender<Work>,
    /// Characters of the sentences queued and not yet taken by the speaker.
    queued: Arc<AtomicUsize>,
    /// `input_text.done` came: later text is refused, the socket is still read.
    done: bool,
}

impl Reader {
    async fn run(&mut self, rx: &mut futures_util::stream::SplitStream<WebSocket>) -> End {
        // A client with nothing to say for a request's whole deadline (no text, no ping) has
        // gone quiet for good; once it is done, the session ends with the speech instead.
        let idle = self.st.cfg.request_timeout;
        loop {
            let next = if self.done {
                rx.next().await
            } else {
                match tokio::time::timeout(idle, rx.next()).await {
                    Ok(m) => m,
                    Err(_) => {
                        return End::Fail(close::POLICY, ApiError::timed_out(idle));
                    }
                }
            };
            let step = match next {
                Some(Ok(Message::Text(t))) => self.message(t.as_str()),
                Some(Ok(Message::Binary(_))) => Err((
                    close::UNSUPPORTED,
                    ApiError::invalid_type("messages are JSON text frames, not binary"),
                )),
                Some(Ok(Message::Close(_)) | Err(_)) | None => return End::Gone,
                // Pings are answered by the socket itself as it is read.
                Some(Ok(_)) => Ok(()),
            };
            if let Err((code, e)) = step {
                return End::Fail(code, e);
            }
        }
    }

    /// One message.
    fn message(&mut self, text: &str) -> Result<(), (u16, ApiError)> {
        let invalid = |m: String| (close::INVALID, ApiError::invalid_type(m));
        let v: Value =
            serde_json::from_str(text).map_err(|e| (close::INVALID, ApiError::invalid_json(e)))?;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a message needs a \"type\"".into()))?;
        if self.done {
            return Err((
                close::POLICY,
                ApiError::invalid_value("type", format!("{kind} after input_text.done")),
            ));
        }
        match kind {
            "session.update" => {
                if self.template.is_some() {
                    return Err((
                        close::POLICY,
                        ApiError::invalid_value(
                            "type",
                            "session.update comes once, before any text",
                        ),
                    ));
                }
                self.set_template(v)
            }
            "input_text.append" => {
                let chunk = v
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("input_text.append needs \"text\"".into()))?;
                if self.template.is_none() {
                    self.set_template(json!({}))?;
                }
                for sentence in self.text.push(chunk) {
                    self.hand_on(Work::Speak(sentence))?;
                }
                self.within_limit("")
            }
            "input_text.flush" => {
                if let Some(rest) = self.text.finish() {
                    self.hand_on(Work::Speak(rest))?;
                }
                Ok(())
            }
            "input_text.done" => {
                if let Some(rest) = self.text.finish() {
                    self.hand_on(Work::Speak(rest))?;
                }
                self.done = true;
                self.hand_on(Work::Done)
            }
            other => Err((
                close::POLICY,
                ApiError::invalid_value(
                    "type",
                    format!(
                        "unknown message type {other:?} (session.update, input_text.append, input_text.flush, input_text.done)"
                    ),
                ),
            )),
        }
    }

    /// The text waiting to be spoken (queued sentences, the pending one, and `more`) is within
    /// the input limit: a client that writes faster than speech is made is stopped here, not by
    /// the server's memory.
    fn within_limit(&self, more: &str) -> Result<(), (u16, ApiError)> {
        let limits = self.st.door.limits();
        let waiting = self.queued.load(Ordering::SeqCst)
            + self.text.pending().chars().count()
            + more.chars().count();
        if waiting > limits.max_input_chars {
            return Err((
                close::TOO_BIG,
                ApiError::input_too_long(waiting, limits.max_input_chars),
            ));
        }
        Ok(())
    }

    /// The session's settings: the speech body's fields, checked exactly as a POST's are.
    fn set_template(&mut self, mut v: Value) -> Result<(), (u16, ApiError)> {
        let Some(obj) = v.as_object_mut() else {
            return Err((
                close::INVALID,
                ApiError::invalid_type("a message is a JSON object"),
            ));
        };
        obj.remove("type");
        // Timing always comes (speech.timing events): the field is accepted and changes nothing.
        obj.remove("timing");
        if obj.contains_key("input") || obj.contains_key("stream_format") {
            return Err((
                close::INVALID,
                ApiError::invalid_value(
                    "input",
                    "session.update takes the speech body's fields but input and stream_format",
                ),
            ));
        }
        obj.insert("input".into(), ".".into());
        obj.insert("stream_format".into(), "audio".into());
        obj.entry("response_format").or_insert("pcm".into());
        let bytes = serde_json::to_vec(&v).unwrap_or_default();
        let (req, _, _) = parse_body(&self.st, &bytes).map_err(|e| (close::INVALID, e))?;
        self.template = Some(req.clone());
        let _ = self.template_tx.send(Some(req));
        Ok(())
    }

    /// Queues work for the speaker (a sentence counted against the limit).
    fn hand_on(&self, work: Work) -> Result<(), (u16, ApiError)> {
        if let Work::Speak(sentence) = &work {
            self.within_limit(sentence)?;
            self.queued
                .fetch_add(sentence.chars().count(), Ordering::SeqCst);
        }
        self.work.send(work).map_err(|_| {
            (
                close::INTERNAL,
                ApiError::unavailable("the session has ended"),
            )
        })
    }
}
