//! Response framing: the report headers of a whole response, and the streamed body (raw bytes or
//! server-sent events) with its error endings.

use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, header};
use base64::Engine as _;
use tokio::sync::mpsc;

use super::admission::CancelOnDrop;
use super::runner::Chunk;
use crate::synth::SynthesisReport;

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
pub(super) fn response_stream(
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
            // A streamed encoder's bytes are final when they leave; a patch would mean the
            // client already has wrong bytes: end in an error rather than send a corrupt file.
            Some(Chunk::Patch { .. }) => {
                drop(guard);
                Some((
                    Err(std::io::Error::other(
                        "internal error: a streamed response cannot be patched",
                    )),
                    (None, None),
                ))
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
