//! The OpenAI-compatible HTTP server (`onebit-tts serve`). Only this module knows HTTP.
//!
//! One [`Synthesizer`] serves every request: up to its scheduler's batch of them at once, the rest
//! in arrival order behind a FIFO gate with a bounded queue (full -> 429 with Retry-After). Each
//! request has a deadline (504 when it passes) and is cancelled when its client goes away, so its
//! generation leaves the batch within one code and a waiting request takes its place. On shutdown the listener closes, in-flight requests
//! get a grace period, then are cancelled, and [`serve_on`] returns once the engine is idle.
//!
//! By concern: `config` (limits, knobs and the `serve` flags), `conn` (one connection: timeouts,
//! the connection limit, its shutdown), `schema` (the request body and its validation),
//! `admission` (Host, keys, CORS and places in the queue), `runner` (a request on the engine), `stream` (response
//! framing: headers, raw and SSE bodies), `spool` (a whole response's bytes: memory, then an unlinked temporary file), `routes` (the router and handlers), `shutdown` (the accept
//! loop and stopping), `errors` (every OpenAI error shape), `metrics`, `names` (OpenAI's model ids
//! and voice names), `voices` (OpenAI's custom-voice API: consents and cloning), `wyoming` (Home
//! Assistant's protocol on its own port).

mod admission;
mod config;
mod conn;
mod errors;
mod metrics;
pub mod names;
mod routes;
mod runner;
mod schema;
mod shutdown;
mod spool;
mod stream;
mod voices;
pub mod wyoming;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};

use tokio::sync::Semaphore;

pub use config::{ConfigError, ServeArgs, ServerConfig};
pub use errors::ApiError;
pub use metrics::Metrics;
pub use routes::router;
pub use shutdown::{ServeError, serve, serve_on};

use crate::engine::CancelToken;
use crate::synth::Synthesizer;

pub(super) struct AppState {
    pub(super) synth: Arc<Synthesizer>,
    pub(super) cfg: ServerConfig,
    pub(super) engine: String,
    /// Requests that run at once: the scheduler's batch size (1 when the engine cannot batch).
    pub(super) places: usize,
    /// `places` permits. Tokio's semaphore is fair, so waiters run in arrival order.
    pub(super) gate: Arc<Semaphore>,
    pub(super) metrics: Metrics,
    /// Requests admitted and not finished (waiting or running): the queue bound is on this.
    pub(super) admitted: AtomicUsize,
    /// Cancel tokens of admitted requests, for shutdown.
    pub(super) inflight: Mutex<HashMap<u64, CancelToken>>,
    pub(super) next_id: AtomicU64,
    pub(super) shutting_down: AtomicBool,
    /// OpenAI's voice names and the operator's aliases, resolved against the installed voices.
    pub(super) aliases: names::VoiceAliases,
    /// The voice store and encoder behind the custom-voice routes.
    pub(super) cloning: voices::Cloning,
}

impl AppState {
    /// The model ids requests may name: OpenAI's, the family's and the package's own.
    pub(super) fn model_ids(&self) -> Vec<String> {
        names::model_ids(&self.package_name())
    }

    /// The package's own name: its directory's.
    pub(super) fn package_name(&self) -> String {
        self.synth
            .package()
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(names::FAMILY)
            .to_owned()
    }

    pub(super) fn cancel_all(&self) -> usize {
        let tokens: Vec<CancelToken> = self
            .inflight
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default();
        for t in &tokens {
            t.cancel();
        }
        tokens.len()
    }
}
