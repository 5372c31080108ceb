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
//! stops the generation), and text waits in a bounded queue of sentences (a client that writes
//! faster than speech is made is read no faster). A bad message gets an `error` event and a close
//! code that names the fault.

use std::sync::Arc;

use axum::extract::State;
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::response::Response;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::AppState;
use super::errors::ApiError;
use super::runner::{Watched, ended, refused};
use super::schema::parse_body;
use crate::synth::{Event, SpeechRequest, Submit};
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

/// Complete sentences that may wait to be spoken: past them the socket is read no further.
const SENTENCES_WAITING: usize = 8;

/// What the reader hands the speaker.
enum Work {
    Speak(String),
    /// The client is done: close normally once everything before this is spoken.
    Done,
    /// End with an error event and this close code.
    Fail(u16, ApiError),
}

/// The upgrade handler. The key check and Host check ran before it, as for every route.
pub(super) async fn upgrade(
    State(st): State<Arc<AppState>>,
    ws: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Response {
    let ws = match ws {
        Ok(ws) => ws,
        Err(e) => {
            let e = ApiError::upgrade_required(
                e.status(),
                format!(
                    "{}: this route speaks WebSocket (docs/api.md)",
                    e.body_text()
                ),
            );
            st.metrics.rejected(e.code);
            return axum::response::IntoResponse::into_response(e);
        }
    };
    if st.shutting_down() {
        return axum::response::IntoResponse::into_response(ApiError::shutting_down());
    }
    ws.max_message_size(st.cfg.max_body_bytes)
        .on_upgrade(move |socket| session(st, socket))
}

async fn session(st: Arc<AppState>, socket: WebSocket) {
    let (mut tx, mut rx) = socket.split();
    let (work_tx, mut work_rx) = mpsc::channel::<Work>(SENTENCES_WAITING);
    let (template_tx, template_rx) = tokio::sync::watch::channel(None::<SpeechRequest>);
    let reader_st = st.clone();
    let reader = tokio::spawn(async move {
        let mut reader = Reader {
            st: reader_st,
            text: SentenceStream::default(),
            template: None,
            template_tx,
            work: work_tx,
        };
        reader.run(&mut rx).await;
    });
    let mut shutdown = st.stopping.subscribe();
    let mut index = 0usize;
    let end = loop {
        let work = tokio::select! {
            w = work_rx.recv() => w,
            _ = shutdown.wait_for(|s| *s) => {
                break (close::GOING_AWAY, Some(ApiError::shutting_down()));
            }
        };
        match work {
            Some(Work::Speak(text)) => {
                let Some(template) = template_rx.borrow().clone() else {
                    continue;
                };
                match speak(&st, &mut tx, template, text, index).await {
                    Ok(()) => index += 1,
                    Err(Some((code, e))) => break (code, Some(e)),
                    // The client has gone.
                    Err(None) => break (close::NORMAL, None),
                }
            }
            Some(Work::Done) => {
                let _ =
                    send_json(&mut tx, json!({"type": "speech.done", "sentences": index})).await;
                break (close::NORMAL, None);
            }
            Some(Work::Fail(code, e)) => break (code, Some(e)),
            None => break (close::NORMAL, None),
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

/// Speaks one sentence through the front door, its audio going out as binary frames. `Err(None)`:
/// the client has gone; `Err(Some)`: end the session with this close code and error.
async fn speak<S>(
    st: &Arc<AppState>,
    tx: &mut S,
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
    let (permit, events) = st.door.submit(req, opts).map_err(|r| {
        let busy = matches!(r, crate::synth::Refusal::Busy { .. });
        let closed = matches!(r, crate::synth::Refusal::Closed);
        let e = refused(st, r);
        let code = match () {
            _ if busy => close::TRY_AGAIN,
            _ if closed => close::GOING_AWAY,
            _ => close::INVALID,
        };
        Some((code, e))
    })?;
    let mut events = Watched::new(st.clone(), events);
    send_json(
        tx,
        json!({"type": "speech.sentence.start", "index": index, "text": sentence}),
    )
    .await
    .map_err(|_| None)?;
    loop {
        match events.recv().await {
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

/// Reads the client's messages into sentences for the speaker.
struct Reader {
    st: Arc<AppState>,
    text: SentenceStream,
    template: Option<SpeechRequest>,
    template_tx: tokio::sync::watch::Sender<Option<SpeechRequest>>,
    work: mpsc::Sender<Work>,
}

impl Reader {
    async fn run(&mut self, rx: &mut futures_util::stream::SplitStream<WebSocket>) {
        while let Some(msg) = rx.next().await {
            let step = match msg {
                Ok(Message::Text(t)) => self.message(t.as_str()).await,
                Ok(Message::Binary(_)) => Err((
                    close::UNSUPPORTED,
                    ApiError::invalid_type("messages are JSON text frames, not binary"),
                )),
                Ok(Message::Close(_)) | Err(_) => return,
                Ok(_) => Ok(true),
            };
            match step {
                Ok(true) => {}
                Ok(false) => return,
                Err((code, e)) => {
                    let _ = self.work.send(Work::Fail(code, e)).await;
                    return;
                }
            }
        }
    }

    /// One message; `Ok(false)` once the client said it is done.
    async fn message(&mut self, text: &str) -> Result<bool, (u16, ApiError)> {
        let invalid = |m: String| (close::INVALID, ApiError::invalid_type(m));
        let v: Value =
            serde_json::from_str(text).map_err(|e| (close::INVALID, ApiError::invalid_json(e)))?;
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| invalid("a message needs a \"type\"".into()))?;
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
                self.set_template(v)?;
                Ok(true)
            }
            "input_text.append" => {
                let chunk = v
                    .get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| invalid("input_text.append needs \"text\"".into()))?;
                if self.template.is_none() {
                    self.set_template(json!({}))?;
                }
                let sentences = self.text.push(chunk);
                if let Err(e) = self.st.door.limits().check_text(self.text.pending()) {
                    return Err((close::TOO_BIG, ApiError::from(e)));
                }
                for s in sentences {
                    self.hand_on(Work::Speak(s)).await?;
                }
                Ok(true)
            }
            "input_text.flush" => {
                if let Some(rest) = self.text.finish() {
                    self.hand_on(Work::Speak(rest)).await?;
                }
                Ok(true)
            }
            "input_text.done" => {
                if let Some(rest) = self.text.finish() {
                    self.hand_on(Work::Speak(rest)).await?;
                }
                self.hand_on(Work::Done).await?;
                Ok(false)
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

    /// The session's settings: the speech body's fields, checked exactly as a POST's are.
    fn set_template(&mut self, mut v: Value) -> Result<(), (u16, ApiError)> {
        let Some(obj) = v.as_object_mut() else {
            return Err((
                close::INVALID,
                ApiError::invalid_type("a message is a JSON object"),
            ));
        };
        obj.remove("type");
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

    /// Waits while the speaker is behind: the socket is not read meanwhile.
    async fn hand_on(&self, work: Work) -> Result<(), (u16, ApiError)> {
        self.work.send(work).await.map_err(|_| {
            (
                close::INTERNAL,
                ApiError::unavailable("the session has ended"),
            )
        })
    }
}
