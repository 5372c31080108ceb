//! Admission: a bounded number of places (one running, `queue_depth` waiting) and the bookkeeping
//! that frees a place and keeps the gauges right however a request ends.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::AppState;
use crate::engine::CancelToken;

/// A place in the system (waiting or running) for one request. Dropping it, whichever way the
/// request ends, frees the place and keeps the gauges right.
pub(super) struct Admission {
    st: Arc<AppState>,
    id: u64,
    running: bool,
}

impl Admission {
    /// `None` when one request runs and `queue_depth` already wait.
    pub(super) fn try_new(st: &Arc<AppState>, token: &CancelToken) -> Option<Self> {
        let prev = st.admitted.fetch_add(1, Ordering::SeqCst);
        if prev > st.cfg.queue_depth {
            st.admitted.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        st.metrics.queued.fetch_add(1, Ordering::SeqCst);
        let id = st.next_id.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut m) = st.inflight.lock() {
            m.insert(id, token.clone());
        }
        Some(Self {
            st: st.clone(),
            id,
            running: false,
        })
    }

    pub(super) fn start(&mut self) {
        if !self.running {
            self.running = true;
            self.st.metrics.queued.fetch_sub(1, Ordering::SeqCst);
            self.st.metrics.running.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if self.running {
            self.st.metrics.running.fetch_sub(1, Ordering::SeqCst);
        } else {
            self.st.metrics.queued.fetch_sub(1, Ordering::SeqCst);
        }
        if let Ok(mut m) = self.st.inflight.lock() {
            m.remove(&self.id);
        }
        self.st.admitted.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Cancels a request's generation when the response (or the handler) is dropped: the client went
/// away. A no-op once the generation has ended.
pub(super) struct CancelOnDrop(pub(super) CancelToken);
impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}
