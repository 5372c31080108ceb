//! Serving a listener and stopping: SIGINT/SIGTERM, the grace for in-flight requests, cancelling
//! what is left, and waiting for the engine to be idle.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::ServerConfig;
use super::config::ConfigError;
use super::conn::{refuse_connection, serve_connection};
use super::routes::{build_with, front_door};
use super::voices::Cloning;
use crate::synth::{Door, Synthesizer};

/// How long cancelled requests get to wind down after the shutdown grace before [`serve_on`]
/// stops waiting for their connections.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(5);

/// Runs the server until SIGINT/SIGTERM, then stops accepting, lets in-flight requests finish for
/// the grace period, cancels the rest, and returns (dropping the engine before the runtime).
/// Refuses a non-loopback address without an API key (see [`ServerConfig::check_exposure`];
/// `ServeArgs::config` already applied `--insecure-no-auth`).
pub async fn serve(synth: Arc<Synthesizer>, cfg: ServerConfig) -> Result<(), ServeError> {
    cfg.check_exposure()?;
    // An alias that names no installed voice (or hides one) stops the start, before the bind.
    let aliases = super::names::VoiceAliases::new(&synth.voices(), &cfg.voice_aliases)
        .map_err(ConfigError::from)?;
    // A named encoder that does not load stops the start too: cloning would fail every upload.
    let cloning = Cloning::open(&cfg).map_err(ServeError::Encoder)?;
    let (stop, stopping) = watch::channel(false);
    let signal = shutdown_signal();
    tokio::spawn(async move {
        signal.await;
        let _ = stop.send(true);
    });
    let wyoming = match cfg.wyoming {
        Some(addr) => Some(tokio::net::TcpListener::bind(addr).await?),
        None => None,
    };
    let http = match cfg.http {
        true => Some(tokio::net::TcpListener::bind(cfg.addr).await?),
        false => None,
    };
    let mut s = stopping.clone();
    let stopped = async move {
        let _ = s.wait_for(|stop| *stop).await;
    };
    serve_all(http, wyoming, synth, cfg, cloning, aliases, stopped).await?;
    Ok(())
}

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Encoder(String),
}

/// [`serve`] on a bound listener with any shutdown future (tests use loopback port 0).
///
/// Connections beyond `max_connections` get a 503 and are closed. When `shutdown` completes: the
/// listener closes (new connections are refused), connections with no request in flight close
/// at once, in-flight requests may finish within `shutdown_grace`; then they are cancelled
/// (streams end with an error, whole responses get 503) and get [`SHUTDOWN_DRAIN`] to wind down.
/// Returns once every connection is closed (or the drain is over) and the engine is idle.
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    synth: Arc<Synthesizer>,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_listeners(Some(listener), None, synth, cfg, shutdown).await
}

/// [`serve_on`] with HTTP and Wyoming on bound listeners (either may be absent), both through
/// one front door: one queue bound, one line, one shutdown.
pub async fn serve_listeners(
    http: Option<tokio::net::TcpListener>,
    wyoming: Option<tokio::net::TcpListener>,
    synth: Arc<Synthesizer>,
    cfg: ServerConfig,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let cloning = Cloning::open_or_explain(&cfg);
    let installed = synth.voices();
    let aliases =
        super::names::VoiceAliases::new(&installed, &cfg.voice_aliases).unwrap_or_else(|e| {
            tracing::error!("{e}; serving OpenAI's voice names with the default mapping only");
            super::names::VoiceAliases::new(&installed, &Default::default()).unwrap_or_default()
        });
    serve_all(http, wyoming, synth, cfg, cloning, aliases, shutdown).await
}

async fn serve_all(
    http: Option<tokio::net::TcpListener>,
    wyoming: Option<tokio::net::TcpListener>,
    synth: Arc<Synthesizer>,
    cfg: ServerConfig,
    cloning: Cloning,
    aliases: super::names::VoiceAliases,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (door, metrics) = front_door(synth, &cfg);
    // Both transports see the shutdown at once.
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut rx = stop_rx.clone();
    let shutdown = async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let wyoming = wyoming.map(|listener| {
        tokio::spawn(super::wyoming::serve(
            listener,
            door.clone(),
            aliases,
            cfg.request_timeout,
            stop_rx.clone(),
        ))
    });
    let served = match http {
        Some(listener) => serve_with(listener, door.clone(), metrics, cfg, cloning, shutdown).await,
        None => {
            shutdown.await;
            Ok(())
        }
    };
    if let Some(w) = wyoming {
        // Its connections end once their syntheses do (cancelled below at the latest).
        if tokio::time::timeout(SHUTDOWN_DRAIN, w).await.is_err() {
            tracing::warn!("Wyoming connections still open after the drain; closing them");
        }
    }
    // Nothing may start any more; whatever still runs (a request whose client left, a Wyoming
    // one) is cancelled and stops within one code. No request admitted means the engine is idle,
    // before the synthesizer is dropped.
    door.close();
    door.cancel_all();
    let idle = door.clone();
    if !matches!(
        tokio::task::spawn_blocking(move || idle.wait_idle(SHUTDOWN_DRAIN)).await,
        Ok(true)
    ) {
        tracing::warn!("the engine did not stop in time");
    }
    served
}

async fn serve_with(
    listener: tokio::net::TcpListener,
    door: Door,
    metrics: Arc<super::Metrics>,
    mut cfg: ServerConfig,
    cloning: Cloning,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = cfg.shutdown_grace;
    // The Host check compares with the address actually bound (port 0 and all).
    cfg.addr = listener.local_addr()?;
    let (app, state) = build_with(door, metrics, cfg, cloning);
    tracing::info!(addr = %state.cfg.addr, "listening");
    if !state.cfg.api_keys.is_empty() {
        tracing::info!(
            keys = state.cfg.api_keys.len(),
            "API keys set: every route but /health needs Authorization: Bearer KEY"
        );
    }
    let places = Arc::new(Semaphore::new(state.cfg.max_connections));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => match places.clone().try_acquire_owned() {
                    Ok(place) => {
                        connections.spawn(serve_connection(
                            stream, app.clone(), state.clone(), stop_rx.clone(), place,
                        ));
                    }
                    Err(_) => refuse_connection(stream, &state),
                },
                // Out of file descriptors, most likely: the connections that hold them end
                // by themselves (timeouts), so wait a little rather than spin.
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    state.door.close();
    state.stopping.send_replace(true);
    tracing::info!(
        grace_s = grace.as_secs_f64(),
        "shutting down: no new connections; idle ones close now; in-flight requests get the grace period"
    );
    let _ = stop_tx.send(true);
    // Owns the connections: dropping it aborts whatever is still open.
    let mut all_closed = Box::pin(async move { while connections.join_next().await.is_some() {} });
    // In-flight work is HTTP's connections and every request still admitted at the door: a
    // WebSocket session left its connection when it upgraded, and Wyoming's requests share the
    // door. Both get the grace.
    let door = state.door.clone();
    let idle = async move {
        matches!(
            tokio::task::spawn_blocking(move || door.wait_idle(grace)).await,
            Ok(true)
        )
    };
    let closed_in_grace = tokio::select! {
        idle = async { (&mut all_closed).await; idle.await } => idle,
        _ = tokio::time::sleep(grace) => false,
    };
    if !closed_in_grace {
        let n = state.door.cancel_all();
        if n > 0 {
            tracing::warn!(n, "grace over: cancelling in-flight requests");
        }
        if tokio::time::timeout(SHUTDOWN_DRAIN, &mut all_closed)
            .await
            .is_err()
        {
            tracing::warn!("connections still open after the grace and drain; closing them");
        }
    }
    // What still runs (a request whose client left) is cancelled by `serve_all`, which waits for
    // the engine to be idle, for every transport at once.
    drop(all_closed);
    // The engine sessions go before the runtime: the last Arc of the synthesizer drops when the
    // caller drops its own, on a normal thread, and main returns after.
    drop(app);
    drop(state);
    Ok(())
}

/// Pause after a failed accept (EMFILE and the like) before trying again.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

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
