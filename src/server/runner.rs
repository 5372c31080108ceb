//! What HTTP makes of the front door's answers: a refusal becomes its OpenAI error (counted as a
//! rejection), an ending its answer; why a request ended is counted by the door's observer
//! ([`drop_reason`]), whatever the transport.

use super::AppState;
use super::errors::ApiError;
use crate::synth::{Cause, Ended, Events, Refusal, SynthesisReport};

/// Bytes of 16-bit mono audio per speech code at `rate` and `speed` (a code is 20 ms at the
/// codec's rate); what a whole response's size is counted in against `max_response_bytes`.
fn bytes_per_code(rate: u32, speed: f32) -> f64 {
    crate::package::CODEC_HOP as f64 * 2.0 * f64::from(rate)
        / f64::from(crate::package::CODEC_SAMPLE_RATE)
        / f64::from(speed)
}

/// The codes a whole response may hold at most under `max_response_bytes`.
pub(super) fn code_cap(st: &AppState, rate: u32, speed: f32) -> usize {
    (st.cfg.max_response_bytes as f64 / bytes_per_code(rate, speed)).floor() as usize
}

fn too_large_error(st: &AppState, t: TooLarge) -> ApiError {
    let seconds = t.codes as f64 * crate::package::CODEC_HOP as f64
        / f64::from(crate::package::CODEC_SAMPLE_RATE)
        / f64::from(t.speed);
    ApiError::response_too_large(st.cfg.max_response_bytes, seconds, t.rate)
}

/// A whole response that ended on its own just past the cap (its last codes were still on their
/// way when the cap was seen) is refused all the same: the cap is on what is answered.
pub(super) fn within_cap(
    st: &AppState,
    report: &SynthesisReport,
    cap: Option<TooLarge>,
) -> Result<(), ApiError> {
    match cap {
        Some(t) if report.codes.len() > t.codes => {
            st.metrics.dropped("response_too_large");
            Err(too_large_error(st, t))
        }
        _ => Ok(()),
    }
}

/// [`crate::synth::Door::submit`] for a later sentence of a text that is being streamed in (a
/// WebSocket session, a Wyoming stream): when the door is full it waits for room until the
/// deadline rather than drop the sentence from the middle of the speech.
pub(super) async fn submit_in_turn(
    door: &crate::synth::Door,
    req: crate::synth::SpeechRequest,
    opts: crate::synth::Submit,
) -> Result<(crate::synth::Permit, Events), Refusal> {
    loop {
        match door.submit(req.clone(), opts) {
            Err(Refusal::Busy { .. })
                if opts.deadline.is_some_and(|d| std::time::Instant::now() < d) =>
            {
                tokio::time::sleep(BUSY_RETRY).await;
            }
            r => return r,
        }
    }
}

/// How often a streamed text's next sentence asks the full door again.
const BUSY_RETRY: std::time::Duration = std::time::Duration::from_millis(20);

/// A request the door did not admit, counted as a rejection.
pub(super) fn refused(st: &AppState, r: Refusal) -> ApiError {
    let e = match r {
        Refusal::Busy { queue_depth } => ApiError::busy(st.cfg.retry_after_s, queue_depth),
        Refusal::Closed => ApiError::shutting_down(),
        Refusal::Invalid(e) => ApiError::from(e),
    };
    st.metrics.rejected(e.code);
    e
}

/// Why a whole response stopped on its own side (it stops the request with [`Cause::Stopped`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct TooLarge {
    pub(super) codes: usize,
    pub(super) rate: u32,
    pub(super) speed: f32,
}

/// Why a request ended without its audio, as `/metrics` counts it (every transport: the door's
/// observer counts it, whether or not the client still reads). Only HTTP's response cap stops a
/// request ([`Cause::Stopped`]).
pub(super) fn drop_reason(ended: &Ended) -> &'static str {
    match ended {
        Ended::Failed(_) => "engine_failed",
        Ended::Cancelled { cause, running, .. } => match (cause, running) {
            (Cause::Deadline, true) => "timeout_running",
            (Cause::Deadline, false) => "timeout_queued",
            (Cause::Shutdown, _) => "shutdown",
            (Cause::Stopped, _) => "response_too_large",
            (Cause::Gone, true) => "client_gone_running",
            (Cause::Gone, false) => "client_gone_queued",
        },
    }
}

/// The end of an admitted request as HTTP answers it: its report, or the error to send (`None`:
/// the client has gone, nobody reads an answer). Counting is the door's observer's.
pub(super) fn ended(
    st: &AppState,
    result: Result<Box<SynthesisReport>, Ended>,
    too_large: Option<TooLarge>,
) -> Result<Box<SynthesisReport>, Option<ApiError>> {
    let timeout = st.cfg.request_timeout;
    match result {
        Ok(report) => Ok(report),
        Err(Ended::Failed(e)) => {
            tracing::warn!("request failed: {e}");
            Err(Some(ApiError::from(e)))
        }
        Err(Ended::Cancelled { cause, .. }) => Err(match (cause, too_large) {
            (Cause::Deadline, _) => Some(ApiError::timed_out(timeout)),
            (Cause::Shutdown, _) => Some(ApiError::shutting_down()),
            (Cause::Stopped, Some(t)) => Some(too_large_error(st, t)),
            // The client went away (or stopped reading past the write timeout).
            _ => None,
        }),
    }
}
