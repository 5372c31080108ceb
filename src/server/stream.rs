//! Response framing: the report headers of a whole response, and the streamed body (raw bytes or
//! server-sent events) with its error endings.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use base64::Engine as _;
use std::sync::Arc;

use super::AppState;
use super::runner::ended;
use crate::synth::{Event, Events, Permit, SynthesisReport};

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub(super) fn add_report_headers(h: &mut HeaderMap, report: &SynthesisReport) {
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
                "front_end;dur={:.3}, prefill;dur={:.3}, decode;dur={:.3}, turn_wait;dur={:.3}, codec;dur={:.3}, encode;dur={:.3}, total;dur={:.3}",
                ms(t.front_end),
                ms(t.prefill),
                ms(t.decode),
                ms(t.turn_wait.total()),
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

/// The streamed body: raw bytes, or SSE events, read from the request's events as the client
/// reads. Errors after the start end the stream: raw audio aborts the transfer (so a client never
/// takes a cut file for a whole one), SSE sends an error event. Dropping the body (the client
/// went away) drops the permit, which cancels the request.
pub(super) fn response_stream(
    st: Arc<AppState>,
    events: Events,
    permit: Permit,
    sse: bool,
    timing: bool,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> {
    futures_util::stream::unfold(Some((events, permit)), move |open| {
        let st = st.clone();
        async move {
            let (mut events, permit) = open?;
            loop {
                let item = match events.recv().await {
                    Some(Event::Audio(b)) => Ok(if sse {
                        let b64 = base64::engine::general_purpose::STANDARD.encode(&b);
                        Bytes::from(format!(
                            "data: {}\n\n",
                            serde_json::json!({"type": "speech.audio.delta", "audio": b64})
                        ))
                    } else {
                        Bytes::from(b)
                    }),
                    Some(Event::Timing(t)) if sse && timing => {
                        let ev = serde_json::json!({"type": "speech.timing", "piece": t,
                            "words_estimated": true});
                        Ok(Bytes::from(format!("data: {ev}\n\n")))
                    }
                    Some(Event::Done(result)) => {
                        return match ended(&st, result, None) {
                            Ok(report) if sse => {
                                let done = serde_json::json!({"type": "speech.audio.done", "usage": {
                                    "input_tokens": report.prompt_tokens, "output_tokens": report.codes.len(),
                                    "total_tokens": report.prompt_tokens + report.codes.len()}});
                                Some((Ok(Bytes::from(format!("data: {done}\n\n"))), None))
                            }
                            Ok(_) | Err(None) => None,
                            Err(Some(e)) if sse => {
                                let ev = serde_json::json!({"type": "error", "error": e.body()["error"]});
                                Some((Ok(Bytes::from(format!("data: {ev}\n\n"))), None))
                            }
                            Err(Some(e)) => Some((Err(std::io::Error::other(e.message)), None)),
                        };
                    }
                    Some(_) => continue,
                    None => Err(std::io::Error::other(
                        "the synthesis job ended without a result",
                    )),
                };
                let go_on = item.is_ok();
                return Some((item, go_on.then_some((events, permit))));
            }
        }
    })
}
