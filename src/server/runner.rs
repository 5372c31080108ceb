//! What HTTP makes of the front door's answers: a refusal becomes its OpenAI error, and every
//! way an admitted request ends without its audio is counted by reason and answered.

use std::sync::Arc;

use super::AppState;
use super::errors::ApiError;
use crate::synth::{Cause, Ended, Event, Events, Refusal, SynthesisReport};

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

/// The end of an admitted request as HTTP answers it: its report, or the error to send (`None`:
/// the client has gone, nobody reads an answer). Each way of ending without the audio is counted
/// once, by reason.
pub(super) fn ended(
    st: &AppState,
    result: Result<Box<SynthesisReport>, Ended>,
    too_large: Option<TooLarge>,
) -> Result<Box<SynthesisReport>, Option<ApiError>> {
    let timeout = st.cfg.request_timeout;
    let (reason, answer) = match result {
        Ok(report) => return Ok(report),
        Err(Ended::Failed(e)) => {
            tracing::warn!("request failed: {e}");
            ("engine_failed", Some(ApiError::from(e)))
        }
        Err(Ended::Cancelled { cause, running, .. }) => match (cause, too_large) {
            (Cause::Deadline, _) if running => {
                ("timeout_running", Some(ApiError::timed_out(timeout)))
            }
            (Cause::Deadline, _) => ("timeout_queued", Some(ApiError::timed_out(timeout))),
            (Cause::Shutdown, _) => ("shutdown", Some(ApiError::shutting_down())),
            (Cause::Stopped, Some(t)) => {
                let seconds = t.codes as f64 * crate::package::CODEC_HOP as f64
                    / f64::from(crate::package::CODEC_SAMPLE_RATE)
                    / f64::from(t.speed);
                let e = ApiError::response_too_large(st.cfg.max_response_bytes, seconds, t.rate);
                ("response_too_large", Some(e))
            }
            // The client went away (or stopped reading past the write timeout).
            (_, _) if running => ("client_gone_running", None),
            (_, _) => ("client_gone_queued", None),
        },
    };
    st.metrics.dropped(reason);
    Err(answer)
}

/// A request's events as HTTP reads them. Dropped before its end (the client went away and the
/// handler or body with it), it reads the rest on a task of its own, so the way the request
/// ended is still counted, once its place is free.
pub(super) struct Watched {
    st: Arc<AppState>,
    events: Option<Events>,
}

impl Watched {
    pub(super) fn new(st: Arc<AppState>, events: Events) -> Self {
        Self {
            st,
            events: Some(events),
        }
    }

    pub(super) async fn recv(&mut self) -> Option<Event> {
        let events = self.events.as_mut()?;
        let event = events.recv().await;
        if matches!(event, Some(Event::Done(_)) | None) {
            self.events = None;
        }
        event
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let Some(mut events) = self.events.take() else {
            return;
        };
        let st = self.st.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                while let Some(event) = events.recv().await {
                    if let Event::Done(result) = event {
                        let _ = ended(&st, result, None);
                    }
                }
            });
        }
    }
}
