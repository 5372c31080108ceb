//! Who may use the server: the Host check, API keys and CORS. How many requests may, and in
//! which order, is the front door's ([`crate::synth::Door`]).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::AppState;
use super::errors::ApiError;

/// The Host header names this server (see [`host_allowed`]), so a web page reached through a
/// name that resolves to this machine (DNS rebinding) is refused. Runs before everything else,
/// CORS preflights included. A request without Host (HTTP/1.0; never a browser) passes.
pub(super) async fn check_host(
    State(st): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("(not text)"))
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if let Some(host) = host
        && !host_allowed(host, st.cfg.addr.ip(), &st.cfg.allowed_hosts)
    {
        return refuse(&st, ApiError::invalid_host(host));
    }
    next.run(request).await
}

/// With keys set, `Authorization: Bearer KEY` on every route but /health (which a balancer
/// polls without credentials) and the web page at `/` (a browser cannot send a header with a page
/// load; the page holds no data and asks for the key before it calls the API). CORS preflights are answered before this by the CORS layer:
/// browsers send no credentials with them.
pub(super) async fn check_key(
    State(st): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    if !st.cfg.api_keys.is_empty() && !matches!(request.uri().path(), "/health" | "/") {
        let presented = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        if !presented.is_some_and(|k| key_matches(k, &st.cfg.api_keys)) {
            return refuse(&st, ApiError::invalid_api_key());
        }
    }
    next.run(request).await
}

fn refuse(st: &AppState, e: ApiError) -> Response {
    st.metrics.rejected(e.code);
    e.into_response()
}

/// Whether `host` (a Host header, port and all) names this server: a name given with
/// `--allowed-host`; else on a loopback address only loopback names (`localhost`, 127.0.0.1,
/// `[::1]`); on a wildcard address (0.0.0.0, ::) `localhost` or any IP literal (rebinding needs a
/// name the attacker controls, never a literal); on any other address that address.
pub(super) fn host_allowed(host: &str, bound: IpAddr, allowed: &[String]) -> bool {
    let name = strip_port(host.trim()).to_ascii_lowercase();
    let name = name.strip_suffix('.').unwrap_or(&name);
    if allowed
        .iter()
        .any(|a| a == "*" || a.eq_ignore_ascii_case(name))
    {
        return true;
    }
    let ip = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name)
        .parse::<IpAddr>()
        .ok();
    if bound.is_loopback() {
        name == "localhost" || ip.is_some_and(|ip| ip.is_loopback())
    } else if bound.is_unspecified() {
        name == "localhost" || ip.is_some()
    } else {
        ip == Some(bound)
    }
}

/// `host[:port]` or `[v6][:port]` without the port.
fn strip_port(host: &str) -> &str {
    if host.starts_with('[') {
        return host.find(']').map_or(host, |end| &host[..=end]);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if !name.contains(':') && port.bytes().all(|b| b.is_ascii_digit()) => {
            name
        }
        _ => host,
    }
}

/// Compares `presented` with every key in time that depends only on the lengths, never on where
/// the first differing byte is, so a client cannot find a key byte by byte by timing answers.
pub(super) fn key_matches(presented: &str, keys: &[String]) -> bool {
    let p = presented.as_bytes();
    let mut any = 0u8;
    for key in keys {
        let k = key.as_bytes();
        let mut diff = u8::from(k.len() != p.len());
        for (i, &b) in p.iter().enumerate() {
            diff |= b ^ k.get(i).copied().unwrap_or(!b);
        }
        any |= u8::from(std::hint::black_box(diff) == 0);
    }
    any != 0
}

/// CORS for the configured origins (none: no layer, so browsers get no CORS headers at all).
pub(super) fn cors(origins: &[String]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(
            origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o.trim_end_matches('/')).ok()),
        )
    };
    Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE])
            .expose_headers(
                [
                    "x-onebit-codes",
                    "x-onebit-seed",
                    "x-onebit-finish-reason",
                    "x-onebit-audio-seconds",
                    "server-timing",
                    "retry-after",
                ]
                .map(HeaderName::from_static),
            )
            .max_age(Duration::from_secs(600)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        for ok in [
            "localhost",
            "localhost:8880",
            "127.0.0.1:1",
            "[::1]:8880",
            "[::1]",
            "LOCALHOST.",
        ] {
            assert!(host_allowed(ok, lo, &[]), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8880",
            "192.168.1.5",
            "localhost.evil",
        ] {
            assert!(!host_allowed(bad, lo, &[]), "{bad}");
        }
        assert!(host_allowed("tts.lan:80", lo, &["tts.lan".into()]));
        assert!(host_allowed("anything", lo, &["*".into()]));
        let any: IpAddr = "0.0.0.0".parse().unwrap();
        assert!(host_allowed("10.0.0.7:8880", any, &[]));
        assert!(!host_allowed("evil.example", any, &[]));
        let lan: IpAddr = "10.0.0.7".parse().unwrap();
        assert!(host_allowed("10.0.0.7:8880", lan, &[]));
        assert!(!host_allowed("10.0.0.8", lan, &[]));
    }

    #[test]
    fn keys() {
        let keys = ["sk-one".to_string(), "sk-two".to_string()];
        assert!(key_matches("sk-one", &keys));
        assert!(key_matches("sk-two", &keys));
        for bad in ["", "sk-on", "sk-one1", "sk-onf", "SK-ONE"] {
            assert!(!key_matches(bad, &keys), "{bad}");
        }
        assert!(!key_matches("x", &[]));
    }
}
