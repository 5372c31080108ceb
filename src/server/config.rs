//! The server's limits and knobs ([`ServerConfig`]); each is documented in docs/api.md.

use std::net::SocketAddr;
use std::time::Duration;

/// Server limits and knobs; every one is documented in docs/api.md.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// Requests that may wait for the engine besides the one running.
    pub queue_depth: usize,
    pub max_body_bytes: usize,
    pub max_input_chars: usize,
    /// From arrival to the end of synthesis, queue wait included.
    pub request_timeout: Duration,
    /// How long in-flight requests may run on after SIGINT/SIGTERM before they are cancelled.
    pub shutdown_grace: Duration,
    pub retry_after_s: u64,
    /// Reported by /health.
    pub device: String,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8880)),
            queue_depth: 8,
            max_body_bytes: 64 * 1024,
            max_input_chars: 4096,
            request_timeout: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(30),
            retry_after_s: 1,
            device: "cpu".into(),
        }
    }
}
