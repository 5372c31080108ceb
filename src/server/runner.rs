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
    Done(Result<SynthesisReport, ApiError>),
}

/// Waits for the engine, then runs the synthesis on a blocking thread, sending chunks. Ends early
/// when the client goes away while waiting, and cancels the generation at the deadline.
pub(super) async fn run_job(
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
            let _ = tx.send(Chunk::Done(Err(ApiError::timed_out(timeout))));
            return;
        }
    };
    let Ok(permit) = permit else {
        let _ = tx.send(Chunk::Done(Err(ApiError::shutting_down())));
        return;
    };
    if token.is_cancelled() {
        // Cancelled while waiting: by shutdown (a gone client closes the channel instead).
        let _ = tx.send(Chunk::Done(Err(ApiError::shutting_down())));
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
                Err(ApiError::timed_out(timeout))
            } else if cancelled && st.shutting_down.load(Ordering::SeqCst) {
                Err(ApiError::shutting_down())
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
