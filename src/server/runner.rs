//! One admitted request on the engine: wait for the gate (or the client leaving, or the
//! deadline), run the synthesis on a blocking thread, and hand its bytes and its end to the
//! response as [`Chunk`]s.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::AppState;
use super::admission::Admission;
use super::errors::ApiError;
use crate::engine::{CancelToken, StopReason};
use crate::synth::{SpeechRequest, SynthEvent, SynthesisReport};

pub(super) enum Chunk {
    Bytes(Vec<u8>),
    /// Overwrites earlier bytes of a whole response ([`SynthEvent::Patch`]), after the last
    /// `Bytes`.
    Patch {
        offset: u64,
        bytes: Vec<u8>,
    },
    // Boxed: a report is far larger than a chunk of bytes, and there is one per request.
    Done(Result<Box<SynthesisReport>, ApiError>),
}

/// Chunks that may wait between the synthesis and the response body. The synthesis blocks when
/// they are all waiting, so a client that reads slowly slows its generation instead of growing
/// the server's memory; one that stops reading is cut off by the write timeout.
pub(super) const CHUNKS_IN_FLIGHT: usize = 4;

/// Bytes of 16-bit mono audio per speech code at `rate` and `speed` (a code is 20 ms at the
/// codec's rate); what a whole response's size is counted in against `max_response_bytes`.
fn bytes_per_code(rate: u32, speed: f32) -> f64 {
    crate::package::CODEC_HOP as f64 * 2.0 * f64::from(rate)
        / f64::from(crate::package::CODEC_SAMPLE_RATE)
        / f64::from(speed)
}

/// How often a synthesis waiting for a slow reader looks at its cancel token.
const FULL_POLL: std::time::Duration = std::time::Duration::from_millis(5);

/// Hands a chunk to the response, waiting while the reader is behind; false when the response
/// is gone or the request was cancelled meanwhile. A plain blocking send would not see the
/// deadline or shutdown: a client that reads a byte now and then would hold the engine for as
/// long as it liked.
fn send_or_cancel(tx: &mpsc::Sender<Chunk>, mut chunk: Chunk, token: &CancelToken) -> bool {
    loop {
        match tx.try_send(chunk) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(c)) => {
                if token.is_cancelled() {
                    return false;
                }
                chunk = c;
                std::thread::sleep(FULL_POLL);
            }
        }
    }
}

/// Ends a request that never reached the engine: it leaves the gauges (drops its admission),
/// then `reason` is counted, then its client hears `answer` (none when it has gone). In this
/// order, so that whoever sees the reason or the answer sees the place free.
async fn end_queued(
    st: &AppState,
    tx: &mpsc::Sender<Chunk>,
    admission: Admission,
    reason: &str,
    answer: Option<ApiError>,
) {
    drop(admission);
    st.metrics.dropped(reason);
    if let Some(e) = answer {
        let _ = tx.send(Chunk::Done(Err(e))).await;
    }
}

/// Waits for the engine, then runs the synthesis on a blocking thread, sending chunks. Ends early
/// when the client goes away while waiting, and cancels the generation at the deadline. Every
/// way an admitted request ends without its audio is counted by reason.
pub(super) async fn run_job(
    st: Arc<AppState>,
    req: SpeechRequest,
    token: CancelToken,
    tx: mpsc::Sender<Chunk>,
    mut admission: Admission,
    deadline: Instant,
) {
    let timeout = st.cfg.request_timeout;
    let permit = tokio::select! {
        p = st.gate.clone().acquire_owned() => p,
        _ = tx.closed() => {
            return end_queued(&st, &tx, admission, "client_gone_queued", None).await;
        }
        _ = tokio::time::sleep_until(deadline) => {
            let answer = ApiError::timed_out(timeout);
            return end_queued(&st, &tx, admission, "timeout_queued", Some(answer)).await;
        }
    };
    // Closed, or cancelled while waiting: by shutdown (a gone client closes the channel instead).
    let permit = match permit {
        Ok(permit) if !token.is_cancelled() => permit,
        _ => {
            let answer = ApiError::shutting_down();
            return end_queued(&st, &tx, admission, "shutdown", Some(answer)).await;
        }
    };
    admission.start();
    let st2 = st.clone();
    let tx2 = tx.clone();
    let token2 = token.clone();
    // A whole response is spooled until it is complete: past the cap, stop generating and refuse.
    let cap = (!req.output.streaming).then(|| {
        let per_code = bytes_per_code(req.output.sample_rate, req.output.speed);
        (st.cfg.max_response_bytes as f64 / per_code).floor() as usize
    });
    let (out_rate, speed) = (req.output.sample_rate, req.output.speed);
    let mut job = tokio::task::spawn_blocking(move || {
        let mut too_large = false;
        let result = st2.synth.synthesize(&req, &token2, &mut |ev| match ev {
            SynthEvent::Audio(bytes) if !bytes.is_empty() => {
                if send_or_cancel(&tx2, Chunk::Bytes(bytes.to_vec()), &token2) {
                    ControlFlow::Continue(())
                } else {
                    ControlFlow::Break(())
                }
            }
            SynthEvent::Patch { offset, bytes } => {
                let patch = Chunk::Patch {
                    offset,
                    bytes: bytes.to_vec(),
                };
                if send_or_cancel(&tx2, patch, &token2) {
                    ControlFlow::Continue(())
                } else {
                    ControlFlow::Break(())
                }
            }
            SynthEvent::Code { index, .. } if cap.is_some_and(|cap| index >= cap) => {
                too_large = true;
                ControlFlow::Break(())
            }
            _ => {
                if tx2.is_closed() {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            }
        });
        (result, too_large)
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
    // The order of end_queued, with the generation counted first, while the request still
    // runs: whoever sees it gone sees its generation counted too.
    if let Ok((Ok(report), _)) = &result {
        st.metrics.generated(
            report.codes.len(),
            report.audio_seconds(),
            &report.timings,
            report.stop,
            report.npu_commands,
        );
    }
    drop(admission);
    let done = match result {
        Ok((Ok(report), too_large)) => {
            let cancelled = report.stop == StopReason::Cancelled;
            if deadline_passed && cancelled {
                st.metrics.dropped("timeout_running");
                Err(ApiError::timed_out(timeout))
            } else if cancelled && too_large {
                st.metrics.dropped("response_too_large");
                let codes = cap.unwrap_or_default() as f64;
                let seconds = codes * crate::package::CODEC_HOP as f64
                    / f64::from(crate::package::CODEC_SAMPLE_RATE)
                    / f64::from(speed);
                Err(ApiError::response_too_large(
                    st.cfg.max_response_bytes,
                    seconds,
                    out_rate,
                ))
            } else if cancelled && st.shutting_down.load(Ordering::SeqCst) {
                st.metrics.dropped("shutdown");
                Err(ApiError::shutting_down())
            } else if cancelled {
                // The client went away (or stopped reading past the write timeout): nobody
                // reads this.
                st.metrics.dropped("client_gone_running");
                Err(ApiError::cancelled())
            } else {
                Ok(report)
            }
        }
        Ok((Err(e), _)) => {
            tracing::warn!("request failed: {e}");
            st.metrics.dropped("engine_failed");
            Err(ApiError::from(e))
        }
        Err(e) => {
            st.metrics.dropped("engine_failed");
            Err(ApiError::unavailable(format!(
                "the synthesis job failed: {e}"
            )))
        }
    };
    let _ = tx.send(Chunk::Done(done.map(Box::new))).await;
}
