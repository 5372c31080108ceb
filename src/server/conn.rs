//! One HTTP connection: HTTP/1.1 through hyper with the header read timeout, a write timeout on
//! the socket, the connection limit, and its part in shutdown (closed at once when no request
//! was ever made on it or it is idle; otherwise its request finishes first).

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, watch};
use tokio::time::Sleep;

use super::AppState;
use super::errors::ApiError;

/// A socket whose writes fail with `TimedOut` after `timeout` without progress: a client that
/// stops reading no longer holds its response (and, for a stream, the engine) forever. hyper
/// then drops the connection and the response body with it.
struct WriteTimeout {
    inner: TcpStream,
    timeout: Duration,
    stalled: Option<Pin<Box<Sleep>>>,
}

impl WriteTimeout {
    fn poll_progress(
        &mut self,
        cx: &mut Context<'_>,
        r: Poll<io::Result<usize>>,
    ) -> Poll<io::Result<usize>> {
        if r.is_ready() {
            self.stalled = None;
            return r;
        }
        let timeout = self.timeout;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client stopped reading (write timeout)",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl AsyncRead for WriteTimeout {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteTimeout {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.poll_progress(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.poll_progress(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Keeps `onebit_connections_open` right however a connection ends.
struct Open(Arc<AppState>);
impl Drop for Open {
    fn drop(&mut self) {
        self.0.metrics.connections.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A connection's place among `max_connections` and its count in `onebit_connections_open`.
/// Every request of the connection carries a clone (a request extension), so a connection that
/// upgrades (the WebSocket route) keeps both for as long as its session lives, not only until
/// hyper hands the socket over.
#[derive(Clone)]
pub(super) struct ConnSlot(#[allow(dead_code)] Arc<(Open, OwnedSemaphorePermit)>);

/// Serves one connection until it ends, or until shutdown closes it.
pub(super) async fn serve_connection(
    stream: TcpStream,
    app: Router,
    st: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    place: OwnedSemaphorePermit,
) {
    st.metrics.connections.fetch_add(1, Ordering::SeqCst);
    let slot = ConnSlot(Arc::new((Open(st.clone()), place)));
    let _ = stream.set_nodelay(true);
    let io = TokioIo::new(WriteTimeout {
        inner: stream,
        timeout: st.cfg.write_timeout,
        stalled: None,
    });
    // Requests this connection has started: one that never started any has nothing to finish.
    let started = Arc::new(AtomicUsize::new(0));
    let counter = started.clone();
    let app = TowerToHyperService::new(app);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        counter.fetch_add(1, Ordering::SeqCst);
        req.extensions_mut().insert(slot.clone());
        hyper::service::Service::call(&app, req)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(st.cfg.header_timeout)
        .keep_alive(true);
    // Upgrades (the WebSocket route) keep the socket, with its write timeout, after the response.
    let conn = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        _ = async { stop.wait_for(|s| *s).await.map(|_| ()) } => {
            if started.load(Ordering::SeqCst) == 0 {
                // Opened, maybe half a request head sent, nothing asked yet: close now rather
                // than wait for the header timeout.
                return;
            }
            // Idle between requests: hyper closes it at once; with a request in flight, after
            // its response.
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        if e.is_timeout() {
            st.metrics.closed("header_timeout");
            tracing::debug!("connection closed: no complete request head in time");
        } else if io_kind(&e) == Some(io::ErrorKind::TimedOut) {
            st.metrics.closed("write_timeout");
            tracing::info!("connection closed: the client stopped reading (write timeout)");
        } else {
            tracing::debug!("connection ended: {e}");
        }
    }
}

fn io_kind(e: &hyper::Error) -> Option<io::ErrorKind> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<io::Error>() {
            return Some(io.kind());
        }
        source = s.source();
    }
    None
}

/// A connection over `max_connections`: a 503 written without waiting (the socket's buffer is
/// empty, so it fits) and the socket closed, so the client learns at once instead of hanging.
pub(super) fn refuse_connection(stream: TcpStream, st: &AppState) {
    st.metrics.rejected("too_many_connections");
    let e = ApiError::too_many_connections(st.cfg.max_connections);
    let body = e.body().to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(answer.as_bytes());
}
