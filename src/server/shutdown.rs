//! Serving a listener and stopping: SIGINT/SIGTERM, the grace for in-flight requests, cancelling
//! what is left, and waiting for the engine to be idle.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::ServerConfig;
use super::routes::build;
use crate::synth::Synthesizer;

/// How long cancelled requests get to wind down after the shutdown grace before [`serve_on`]
/// stops waiting for their connections.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Runs the server until SIGINT/SIGTERM, then stops accepting, lets in-flight requests finish for
/// the grace period, cancels the rest, and returns (dropping the engine before the runtime).
pub async fn serve(synth: Arc<Synthesizer>, cfg: ServerConfig) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(cfg.addr).await?;
    serve_on(listener, synth, cfg, shutdown_signal()).await
}

/// [`serve`] on a bound listener with any shutdown future (tests use loopback port 0).
///
/// When `shutdown` completes: the listener closes (new connections are refused), idle connections
/// close, in-flight requests may finish within `shutdown_grace`; then they are cancelled (streams
/// end with an error, whole responses get 503) and get [`SHUTDOWN_DRAIN`] to wind down. Returns
/// once every connection is closed (or the drain is over) and the engine is idle.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    synth: Arc<Synthesizer>,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = cfg.shutdown_grace;
    let (app, state) = build(synth, cfg);
    tracing::info!(addr = %listener.local_addr()?, "listening");
    let (fired_tx, mut fired_rx) = tokio::sync::watch::channel(false);
    let st = state.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        shutdown.await;
        st.shutting_down.store(true, Ordering::SeqCst);
        tracing::info!(
            grace_s = grace.as_secs_f64(),
            "shutting down: no new connections; in-flight requests get the grace period"
        );
        let _ = fired_tx.send(true);
    });
    let st = state.clone();
    let overdue = async move {
        if fired_rx.wait_for(|fired| *fired).await.is_err() {
            std::future::pending::<()>().await;
        }
        tokio::time::sleep(grace).await;
        let n = st.cancel_all();
        if n > 0 {
            tracing::warn!(n, "grace over: cancelling in-flight requests");
        }
        tokio::time::sleep(SHUTDOWN_DRAIN).await;
    };
    tokio::select! {
        r = server.into_future() => r?,
        _ = overdue => tracing::warn!("connections still open after the grace and drain; leaving them"),
    }
    // Nothing may start any more; what still runs (a request whose client left) is cancelled and
    // stops within one code. Waiting for the gate means the engine is idle.
    state.cancel_all();
    match tokio::time::timeout(SHUTDOWN_DRAIN, state.gate.acquire()).await {
        Ok(Ok(permit)) => drop(permit),
        _ => tracing::warn!("the engine did not stop in time"),
    }
    state.gate.close();
    // The engine sessions go before the runtime: the last Arc of the synthesizer drops when the
    // caller drops its own, on a normal thread, and main returns after.
    drop(state);
    Ok(())
}

fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{Signal, SignalKind, signal};
    // Registered here, before the server logs "listening": a SIGTERM that arrives as soon as the
    // server can be seen must already find our handler, not the default action that kills the
    // process with its worker still running.
    let int = signal(SignalKind::interrupt()).ok();
    let term = signal(SignalKind::terminate()).ok();
    async fn wait(s: Option<Signal>) {
        match s {
            Some(mut s) => {
                s.recv().await;
            }
            None => std::future::pending::<()>().await,
        }
    }
    async move {
        tokio::select! {
            _ = wait(int) => {},
            _ = wait(term) => {},
        }
    }
}
