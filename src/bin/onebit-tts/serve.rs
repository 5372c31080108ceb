//! `serve`: the OpenAI-compatible HTTP API.

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;

use onebit_tts::server::ServerConfig;
use onebit_tts::synth::Synthesizer;

use crate::args::{ModelArgs, synth_config};

#[derive(Args, Clone)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "ONEBIT_HOST", default_value = "127.0.0.1")]
    pub host: std::net::IpAddr,
    #[arg(long, env = "ONEBIT_PORT", default_value_t = 8880)]
    pub port: u16,
    /// Requests that may wait while one runs; more get 429.
    #[arg(long, env = "ONEBIT_QUEUE_DEPTH", default_value_t = 8)]
    pub queue_depth: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, env = "ONEBIT_MAX_BODY_BYTES", default_value_t = 65_536)]
    pub max_body_bytes: usize,
    /// Longest `input` in characters (400 above).
    #[arg(long, env = "ONEBIT_MAX_INPUT_CHARS", default_value_t = 4096)]
    pub max_input_chars: usize,
    /// Seconds a request may run before it is cancelled.
    #[arg(long, env = "ONEBIT_REQUEST_TIMEOUT_S", default_value_t = 300)]
    pub request_timeout_s: u64,
    /// Seconds in-flight requests may run on after SIGINT/SIGTERM.
    #[arg(long, env = "ONEBIT_SHUTDOWN_GRACE_S", default_value_t = 30)]
    pub shutdown_grace_s: u64,
}

pub fn serve(model: &ModelArgs, args: &ServeArgs) -> Result<()> {
    let mut cfg = synth_config(model);
    cfg.max_input_chars = args.max_input_chars;
    let synth = std::sync::Arc::new(Synthesizer::load(&cfg)?);
    tracing::info!(
        package = %synth.package().dir.display(),
        engine = %synth.engine_description(),
        device = %synth.device_label(),
        voices = synth.voices().names().len(),
        "model loaded"
    );
    let server_cfg = ServerConfig {
        addr: std::net::SocketAddr::new(args.host, args.port),
        queue_depth: args.queue_depth,
        max_body_bytes: args.max_body_bytes,
        max_input_chars: args.max_input_chars,
        request_timeout: Duration::from_secs(args.request_timeout_s),
        shutdown_grace: Duration::from_secs(args.shutdown_grace_s),
        retry_after_s: 1,
        device: synth.device_label(),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(onebit_tts::server::serve(synth, server_cfg))
        .context("server")?;
    // The runtime (and with it the last handle on the synthesizer) goes before main returns.
    drop(rt);
    tracing::info!("stopped");
    Ok(())
}
