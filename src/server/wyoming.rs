//! The Wyoming protocol (Home Assistant's voice services, as Piper serves them): `describe` gets
//! an `info` with one `tts` program and the installed voices; `synthesize` gets `audio-start`,
//! `audio-chunk`s of 16-bit mono PCM and `audio-stop`; the streaming form (`synthesize-start`,
//! `synthesize-chunk`s, `synthesize-stop`) speaks each sentence as soon as it is complete, so
//! Home Assistant's streaming TTS starts speaking before the whole text has arrived, and ends
//! with `synthesize-stopped`. A bad event gets an `error` event; the connection stays.
//!
//! Framing (the `wyoming` package's): one JSON header line `{"type", "version", "data_length",
//! "payload_length"}`, then `data_length` bytes of JSON merged into the header's `data`, then
//! `payload_length` bytes of payload. Every connection runs on its own task; syntheses of several
//! connections share the scheduler's batch like HTTP requests do.

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Map, Value, json};
use tokio::io::{
    AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::errors::ApiError;
use super::names::VoiceAliases;
use crate::audio::{AudioFormat, OutputSpec};
use crate::package::CODEC_SAMPLE_RATE;
use crate::synth::{
    Cause, Door, Ended, Event as DoorEvent, Refusal, SpeechRequest, Submit, Synthesizer,
};
use crate::text::SentenceStream;

/// The `wyoming` package version whose framing and events this follows (sent as `version`).
pub const WYOMING_VERSION: &str = "1.10.2";
/// Longest header line, and most bytes of `data` or payload one event may carry: text events are
/// small, and nothing a TTS server receives has a payload.
const MAX_LINE: usize = 64 * 1024;
const MAX_DATA: usize = 1 << 20;
const MAX_PAYLOAD: usize = 1 << 20;

/// One Wyoming event.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub kind: String,
    pub data: Map<String, Value>,
    pub payload: Vec<u8>,
}

/// Why an event could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The header line is longer than any event this server takes: the stream cannot be
    /// resynchronised.
    #[error("a header line over {MAX_LINE} bytes")]
    LineTooLong,
    /// A length over the limit: the stream cannot be resynchronised.
    #[error("{what} of {got} bytes is over the limit of {limit}")]
    TooLarge {
        what: &'static str,
        got: usize,
        limit: usize,
    },
    /// A complete line that is not an event header; the next line may be.
    #[error("not a Wyoming event header: {0}")]
    BadHeader(String),
}

impl WireError {
    /// Whether reading can go on with the next line.
    fn recoverable(&self) -> bool {
        matches!(self, WireError::BadHeader(_))
    }
}

/// Reads one event; `None` at the end of the stream.
pub async fn read_event<R: AsyncBufRead + Unpin>(r: &mut R) -> Result<Option<Event>, WireError> {
    let mut line = Vec::new();
    let n = (&mut *r)
        .take(MAX_LINE as u64 + 1)
        .read_until(b'\n', &mut line)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if line.len() > MAX_LINE {
        return Err(WireError::LineTooLong);
    }
    let header: Value =
        serde_json::from_slice(&line).map_err(|e| WireError::BadHeader(format!("{e}")))?;
    let Some(kind) = header.get("type").and_then(Value::as_str) else {
        return Err(WireError::BadHeader("no \"type\"".into()));
    };
    let length = |key: &str| -> Result<usize, WireError> {
        match header.get(key) {
            None | Some(Value::Null) => Ok(0),
            Some(v) => v
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| WireError::BadHeader(format!("{key} is not a length"))),
        }
    };
    let (data_len, payload_len) = (length("data_length")?, length("payload_length")?);
    for (what, got, limit) in [
        ("data", data_len, MAX_DATA),
        ("payload", payload_len, MAX_PAYLOAD),
    ] {
        if got > limit {
            return Err(WireError::TooLarge { what, got, limit });
        }
    }
    let mut data = match header.get("data") {
        Some(Value::Object(m)) => m.clone(),
        None | Some(Value::Null) => Map::new(),
        Some(_) => return Err(WireError::BadHeader("\"data\" is not an object".into())),
    };
    if data_len > 0 {
        let mut bytes = vec![0u8; data_len];
        r.read_exact(&mut bytes).await?;
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(more)) => data.extend(more),
            _ => return Err(WireError::BadHeader("the data is not a JSON object".into())),
        }
    }
    let mut payload = vec![0u8; payload_len];
    r.read_exact(&mut payload).await?;
    Ok(Some(Event {
        kind: kind.to_owned(),
        data,
        payload,
    }))
}

/// Writes one event as the `wyoming` package does: header line, data, payload.
pub async fn write_event<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: &str,
    data: Value,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut header = json!({"type": kind, "version": WYOMING_VERSION});
    let data = match data {
        Value::Object(m) if !m.is_empty() => Some(serde_json::to_vec(&m)?),
        _ => None,
    };
    if let Some(d) = &data {
        header["data_length"] = d.len().into();
    }
    if !payload.is_empty() {
        header["payload_length"] = payload.len().into();
    }
    let mut out = serde_json::to_vec(&header)?;
    out.push(b'\n');
    if let Some(d) = data {
        out.extend_from_slice(&d);
    }
    out.extend_from_slice(payload);
    w.write_all(&out).await?;
    w.flush().await
}

/// Resolves once the shutdown flag is up (the watch guard is not held across awaits).
async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// What every connection shares.
struct Shared {
    /// The process's front door: Wyoming's requests count in the same queue bound as HTTP's.
    door: Door,
    synth: Arc<Synthesizer>,
    aliases: VoiceAliases,
    /// Each synthesis's deadline, as an HTTP request's (`request_timeout`).
    request_timeout: std::time::Duration,
}

/// Serves Wyoming on `listener` through `door` until `shutdown` turns true: then stops
/// accepting, cancels the syntheses in flight and returns when every connection has ended.
pub async fn serve(
    listener: TcpListener,
    door: Door,
    aliases: VoiceAliases,
    request_timeout: std::time::Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let shared = Arc::new(Shared {
        synth: door.synth().clone(),
        door,
        aliases,
        request_timeout,
    });
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "Wyoming listening");
    }
    let mut conns = JoinSet::new();
    let for_conns = shutdown.clone();
    loop {
        tokio::select! {
            _ = stopped(&mut shutdown) => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let (shared, stop) = (shared.clone(), for_conns.clone());
                    conns.spawn(async move { connection(stream, peer, shared, stop).await });
                }
                Err(e) => {
                    tracing::warn!("Wyoming accept failed: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
}

/// A text stream (`synthesize-start` .. `synthesize-stop`): its voice and the text not yet spoken.
struct Streaming {
    voice: String,
    text: SentenceStream,
    /// Sentences spoken so far: a later one waits for room at the door instead of being refused.
    spoken: usize,
}

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut streaming: Option<Streaming> = None;
    loop {
        let event = tokio::select! {
            _ = stopped(&mut shutdown) => return,
            e = read_event(&mut read) => e,
        };
        let event = match event {
            Ok(Some(e)) => e,
            Ok(None) => return,
            Err(e) => {
                let fatal = !e.recoverable();
                let _ = send_error(&mut write, &e.to_string(), "bad_event").await;
                if fatal {
                    tracing::debug!(%peer, "Wyoming connection closed: {e}");
                    return;
                }
                continue;
            }
        };
        let handled = handle(&event, &shared, &mut streaming, &mut write, &mut shutdown).await;
        if let Err(e) = handled {
            tracing::debug!(%peer, "Wyoming connection closed: {e}");
            return;
        }
    }
}

async fn send_error<W: AsyncWrite + Unpin>(
    w: &mut W,
    text: &str,
    code: &str,
) -> std::io::Result<()> {
    write_event(w, "error", json!({"text": text, "code": code}), &[]).await
}

/// One event; `Err` only when the connection is gone.
async fn handle<W: AsyncWrite + Unpin>(
    event: &Event,
    shared: &Shared,
    streaming: &mut Option<Streaming>,
    w: &mut W,
    shutdown: &mut watch::Receiver<bool>,
) -> std::io::Result<()> {
    let text_of = |e: &Event| {
        e.data
            .get("text")
            .and_then(Value::as_str)
            .map(str::to_owned)
    };
    match event.kind.as_str() {
        "describe" => write_event(w, "info", info(shared), &[]).await,
        "ping" => write_event(w, "pong", json!({"text": event.data.get("text")}), &[]).await,
        // Home Assistant sends the whole text as `synthesize` too, inside a stream, for servers
        // that do not stream: a streaming server ignores it there.
        "synthesize" if streaming.is_some() => Ok(()),
        "synthesize" => {
            let Some(text) = text_of(event) else {
                return send_error(w, "synthesize needs \"text\"", "missing_text").await;
            };
            match pick_voice(shared, event.data.get("voice")) {
                Ok(voice) => speak(shared, w, text, voice, shutdown, false).await,
                Err(e) => send_error(w, &e.message, e.code).await,
            }
        }
        "synthesize-start" => match pick_voice(shared, event.data.get("voice")) {
            Ok(voice) => {
                *streaming = Some(Streaming {
                    voice,
                    text: SentenceStream::default(),
                    spoken: 0,
                });
                Ok(())
            }
            Err(e) => send_error(w, &e.message, e.code).await,
        },
        "synthesize-chunk" => {
            let Some(s) = streaming.as_mut() else {
                return send_error(
                    w,
                    "synthesize-chunk outside synthesize-start .. synthesize-stop",
                    "no_stream",
                )
                .await;
            };
            let Some(text) = text_of(event) else {
                return send_error(w, "synthesize-chunk needs \"text\"", "missing_text").await;
            };
            let sentences = s.text.push(&text);
            if let Err(e) = shared.door.limits().check_text(s.text.pending()) {
                *streaming = None;
                let e = ApiError::from(e);
                return send_error(w, &e.message, e.code).await;
            }
            let voice = s.voice.clone();
            for sentence in sentences {
                let in_turn = s.spoken > 0;
                s.spoken += 1;
                speak(shared, w, sentence, voice.clone(), shutdown, in_turn).await?;
            }
            Ok(())
        }
        "synthesize-stop" => {
            let Some(s) = streaming.take() else {
                return send_error(w, "synthesize-stop without synthesize-start", "no_stream")
                    .await;
            };
            let mut s = s;
            if let Some(rest) = s.text.finish() {
                speak(shared, w, rest, s.voice, shutdown, s.spoken > 0).await?;
            }
            write_event(w, "synthesize-stopped", Value::Null, &[]).await
        }
        other => {
            send_error(
                w,
                &format!("this server does not handle {other:?} events (it is a tts program)"),
                "unknown_event",
            )
            .await
        }
    }
}

/// The `info` answer: one tts program with the installed voices.
fn info(shared: &Shared) -> Value {
    let attribution =
        json!({"name": "Neuphonic (NeuTTS-air), onebit-tts", "url": "https://neuphonic.com"});
    let voices: Vec<Value> = shared
        .synth
        .voices()
        .iter()
        .map(|(v, _)| {
            json!({"name": v.name, "attribution": attribution, "installed": true,
                   "description": format!("{} ({})", v.name, v.language), "version": null,
                   "languages": [v.language], "speakers": null})
        })
        .collect();
    json!({"tts": [{
        "name": "onebit-tts",
        "attribution": attribution,
        "installed": true,
        "description": format!("NeuTTS-air speech synthesis ({})", shared.synth.device_label()),
        "version": env!("CARGO_PKG_VERSION"),
        "voices": voices,
        "supports_synthesize_streaming": true,
    }], "asr": [], "handle": [], "intent": [], "wake": [], "mic": [], "snd": []})
}

/// The voice a `voice` object asks for: by name (aliases too), else the first voice of its
/// language, else the first English voice, else the first voice.
fn pick_voice(shared: &Shared, voice: Option<&Value>) -> Result<String, ApiError> {
    let store = shared.synth.voices();
    let name = voice.and_then(|v| v.get("name")).and_then(Value::as_str);
    if let Some(name) = name {
        let real = shared.aliases.resolve(name);
        store
            .get(real)
            .map_err(|e| ApiError::from(crate::synth::SynthError::from(e)))?;
        return Ok(real.to_owned());
    }
    let language = voice
        .and_then(|v| v.get("language"))
        .and_then(Value::as_str)
        .map(|l| l.to_ascii_lowercase().replace('_', "-"));
    let matches =
        |have: &str, want: &str| have == want || have.split('-').next() == want.split('-').next();
    // Shipped and imported voices before ones cloned over HTTP: a client's new voice must not
    // become every Home Assistant's default.
    let mut names = store.names();
    names.sort_by_key(|n| store.get(n).is_ok_and(|v| v.custom.is_some()));
    let pick = |want: &str| {
        names
            .iter()
            .find(|n| store.get(n).is_ok_and(|v| matches(&v.language, want)))
            .cloned()
    };
    let chosen = match &language {
        Some(l) => pick(l).ok_or_else(|| {
            ApiError::invalid_value(
                "voice",
                format!("no voice speaks {l:?} (voices: {})", names.join(", ")),
            )
        })?,
        None => pick("en-us")
            .or_else(|| names.first().cloned())
            .ok_or_else(|| ApiError::invalid_value("voice", "no voice is installed"))?,
    };
    Ok(chosen)
}

/// Speaks `text`: `audio-start`, the PCM as it is made, `audio-stop`; an `error` event instead
/// when the front door refuses it (busy, over a limit, shutting down) or it fails. `Err` only when
/// the connection is gone.
async fn speak<W: AsyncWrite + Unpin>(
    shared: &Shared,
    w: &mut W,
    text: String,
    voice: String,
    shutdown: &mut watch::Receiver<bool>,
    in_turn: bool,
) -> std::io::Result<()> {
    let rate = CODEC_SAMPLE_RATE;
    let req = SpeechRequest {
        text,
        voice,
        output: OutputSpec {
            format: AudioFormat::Pcm,
            sample_rate: rate,
            streaming: true,
            ..OutputSpec::default()
        },
        ..SpeechRequest::default()
    };
    // Dropping the permit (this future dropped, the connection failed) cancels the synthesis.
    let opts = Submit {
        deadline: Some(std::time::Instant::now() + shared.request_timeout),
        codes: false,
    };
    // A later sentence of a stream waits for room rather than leave a gap in the speech.
    let submitted = if in_turn {
        super::runner::submit_in_turn(&shared.door, req, opts).await
    } else {
        shared.door.submit(req, opts)
    };
    let (permit, mut events) = match submitted {
        Ok(p) => p,
        Err(Refusal::Busy { queue_depth }) => {
            let msg = format!(
                "the server is busy: every place is taken and {queue_depth} requests already wait; try again shortly"
            );
            return send_error(w, &msg, "busy").await;
        }
        Err(Refusal::Closed) => {
            return send_error(w, "the server is stopping", "shutting_down").await;
        }
        Err(Refusal::Invalid(e)) => {
            let e = ApiError::from(e);
            return send_error(w, &e.message, e.code).await;
        }
    };
    let format = |extra: Value| {
        let mut d = json!({"rate": rate, "width": 2, "channels": 1});
        if let (Value::Object(d), Value::Object(e)) = (&mut d, extra) {
            d.extend(e);
        }
        d
    };
    let mut started = false;
    let mut samples: u64 = 0;
    let mut stopping = false;
    let result = loop {
        let event = tokio::select! {
            _ = stopped(shutdown), if !stopping => {
                permit.cancel(Cause::Shutdown);
                stopping = true;
                continue;
            }
            e = events.recv() => e,
        };
        match event {
            Some(DoorEvent::Audio(bytes)) => {
                if !started {
                    write_event(w, "audio-start", format(json!({"timestamp": 0})), &[]).await?;
                    started = true;
                }
                let timestamp = samples * 1000 / u64::from(rate);
                samples += bytes.len() as u64 / 2;
                write_event(
                    w,
                    "audio-chunk",
                    format(json!({"timestamp": timestamp})),
                    &bytes,
                )
                .await?;
            }
            Some(DoorEvent::Done(result)) => break Some(result),
            Some(_) => {}
            None => break None,
        }
    };
    match result {
        Some(Ok(_)) => {
            if !started {
                write_event(w, "audio-start", format(json!({"timestamp": 0})), &[]).await?;
            }
            let end = samples * 1000 / u64::from(rate);
            write_event(w, "audio-stop", json!({"timestamp": end}), &[]).await
        }
        Some(Err(Ended::Cancelled { cause, .. })) => {
            let why = match cause {
                Cause::Shutdown => "the server is stopping",
                Cause::Deadline => "its deadline passed",
                Cause::Gone | Cause::Stopped => "it was stopped",
            };
            send_error(
                w,
                &format!("the synthesis was cancelled: {why}"),
                "cancelled",
            )
            .await
        }
        Some(Err(Ended::Failed(e))) => {
            let e = ApiError::from(e);
            send_error(w, &e.message, e.code).await
        }
        None => {
            send_error(
                w,
                "the synthesis ended without a result",
                "engine_unavailable",
            )
            .await
        }
    }
}
