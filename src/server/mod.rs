//! The OpenAI-compatible HTTP server (`onebit-tts serve`). Only this module knows HTTP.
//!
//! One [`Synthesizer`] serves every request through one front door ([`crate::synth::Door`]):
//! up to its scheduler's batch of them at once, the rest in arrival order with a bounded queue
//! counting every transport (full -> 429 with Retry-After). Each
//! request has a deadline (504 when it passes) and is cancelled when its client goes away, so its
//! generation leaves the batch within one code and a waiting request takes its place. On shutdown the listener closes, in-flight requests
//! get a grace period, then are cancelled, and [`serve_on`] returns once the engine is idle.
//!
//! By concern: `config` (limits, knobs and the `serve` flags), `conn` (one connection: timeouts,
//! the connection limit, its shutdown), `schema` (the request body and its validation),
//! `admission` (Host, keys, CORS), `runner` (the door's answers as HTTP answers them), `stream` (response
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
pub mod ws;
pub mod wyoming;

use std::sync::Arc;

pub use config::{ConfigError, ServeArgs, ServerConfig};
pub use errors::ApiError;
pub use metrics::Metrics;
pub use routes::router;
pub use shutdown::{ServeError, serve, serve_listeners, serve_on};

use crate::synth::{Door, Synthesizer};

pub(super) struct AppState {
    /// The process's front door: admission, the queue bound, deadlines and shutdown for every
    /// transport (Wyoming and the WebSocket route share it).
    pub(super) door: Door,
    pub(super) synth: Arc<Synthesizer>,
    pub(super) cfg: ServerConfig,
    pub(super) metrics: Arc<Metrics>,
    /// OpenAI's voice names and the operator's aliases, resolved against the installed voices.
    pub(super) aliases: names::VoiceAliases,
    /// The voice store and encoder behind the custom-voice routes.
    pub(super) cloning: voices::Cloning,
    /// Turns true when the server starts shutting down (WebSocket sessions end then: an
    /// upgraded connection is no longer the HTTP connection's).
    pub(super) stopping: tokio::sync::watch::Sender<bool>,
}

impl AppState {
    /// The model ids requests may name: OpenAI's, the family's and the package's own.
    pub(super) fn model_ids(&self) -> Vec<String> {
        names::model_ids(&self.package_name())
    }

    /// The package's own name ([`crate::package::ModelPackage::name`]).
    pub(super) fn package_name(&self) -> String {
        self.synth.package().name()
    }

    pub(super) fn shutting_down(&self) -> bool {
        self.door.is_closed()
    }
}
