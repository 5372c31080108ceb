//! The server's limits and knobs ([`ServerConfig`], each documented in docs/api.md), the `serve`
//! flags that fill it ([`ServeArgs`]), and the rule that a server reachable from other machines
//! needs an API key.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Server limits and knobs; every one is documented in docs/api.md.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub addr: SocketAddr,
    /// Requests that may wait for a place besides the ones running (`--max-batch`).
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
    /// Bearer keys; when any is set every route but /health needs one.
    pub api_keys: Vec<String>,
    /// Host names accepted besides the bound address's own (`*`: any).
    pub allowed_hosts: Vec<String>,
    /// Origins allowed by CORS (`*`: any); empty turns CORS off.
    pub cors_origins: Vec<String>,
    /// A connection must deliver a complete request head within this of being ready for one
    /// (just opened, or after its previous response): slow headers and idle keep-alive alike.
    pub header_timeout: Duration,
    /// The whole request body must arrive within this once the head is read.
    pub body_timeout: Duration,
    /// A response write that makes no progress for this long closes the connection (the client
    /// stopped reading); a stream's generation then stops.
    pub write_timeout: Duration,
    /// Open connections; a connection beyond them gets a 503 and is closed at once.
    pub max_connections: usize,
    /// Largest whole (not streamed) response, counted as 16-bit audio. A whole response is
    /// spooled until it is complete: 1 MiB in memory, the rest in an unlinked file under
    /// `$TMPDIR`, so this bounds each response's disk use, not the server's memory.
    pub max_response_bytes: usize,
    /// Serve a non-loopback address without keys (`--insecure-no-auth`).
    pub insecure_no_auth: bool,
    /// The operator's voice aliases (`--voice-aliases FILE`, then `--voice-alias A=V`), over the
    /// default mapping of OpenAI's voice names (see `names`).
    pub voice_aliases: std::collections::BTreeMap<String, String>,
    /// Where the Wyoming protocol is served (`--wyoming-uri`), if anywhere.
    pub wyoming: Option<SocketAddr>,
    /// Serve HTTP at `addr` (`--no-http` turns it off, for a Wyoming-only server).
    pub http: bool,
    /// The NeuCodec encoder ONNX that clones voices from uploaded audio (`--encoder`, else the
    /// codec package's); none: the cloning routes answer 501 saying what to configure.
    pub encoder: Option<PathBuf>,
    /// The operator named the encoder (`--encoder`): one that does not load stops the start.
    /// The codec package's own is optional: failing, cloning answers 501 and says why.
    pub encoder_required: bool,
    /// Where voices created over HTTP are kept (consents in its `consents/`); it must be one of
    /// the synthesizer's voice directories so they load again after a restart. None: cloning
    /// answers 501.
    pub voice_store: Option<PathBuf>,
    /// How long a change to the voice store (voices, consents) waits for its lock, which every
    /// server sharing the store takes; past it the request answers 503 (`voice_store_busy`).
    pub voice_lock_wait: Duration,
    /// Largest uploaded audio file (a voice sample, a consent recording).
    pub max_upload_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 8880)),
            queue_depth: crate::synth::DEFAULT_QUEUE_DEPTH,
            max_body_bytes: 64 * 1024,
            max_input_chars: crate::synth::DEFAULT_MAX_INPUT_CHARS,
            request_timeout: Duration::from_secs(300),
            shutdown_grace: Duration::from_secs(30),
            retry_after_s: 1,
            device: "cpu".into(),
            api_keys: Vec::new(),
            allowed_hosts: Vec::new(),
            cors_origins: Vec::new(),
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            write_timeout: Duration::from_secs(30),
            max_connections: 512,
            max_response_bytes: 64 << 20,
            encoder: None,
            encoder_required: false,
            voice_store: None,
            voice_lock_wait: crate::voice::LOCK_WAIT,
            max_upload_bytes: 10 << 20,
            insecure_no_auth: false,
            voice_aliases: Default::default(),
            wyoming: None,
            http: true,
        }
    }
}

/// Why `serve` will not start.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "refusing to listen on {addr} without an API key: other machines could use this server. \
         Set --api-key (or ONEBIT_API_KEYS, --api-key-file), listen on 127.0.0.1, or pass \
         --insecure-no-auth"
    )]
    Unprotected { addr: SocketAddr },
    #[error("cannot read the API key file {}: {source}", path.display())]
    KeyFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: an API key may not be empty or contain whitespace")]
    BadKey { what: String },
    #[error("--{flag} must be at least {min}")]
    TooSmall { flag: &'static str, min: u64 },
    #[error("--{flag} must be a positive number of seconds, got {value}")]
    BadSeconds { flag: &'static str, value: f64 },
    #[error(transparent)]
    Alias(#[from] super::names::AliasError),
    #[error("--wyoming-uri {uri:?}: expected tcp://HOST:PORT with an IP address or localhost")]
    WyomingUri { uri: String },
    #[error(
        "refusing to serve Wyoming on {addr}: the protocol has no keys, so other machines could \
         use this server. Listen on 127.0.0.1, or pass --insecure-no-auth"
    )]
    WyomingUnprotected { addr: SocketAddr },
    #[error("--no-http needs --wyoming-uri: nothing would be served")]
    NothingServed,
}

/// Flags of `onebit-tts serve` that configure the HTTP side (docs/api.md, "Configuration").
#[derive(clap::Args, Clone, Debug)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "ONEBIT_HOST", default_value = "127.0.0.1")]
    pub host: IpAddr,
    #[arg(long, env = "ONEBIT_PORT", default_value_t = 8880)]
    pub port: u16,
    /// Requests that may wait while the running ones (up to --max-batch) generate; more get 429.
    #[arg(long, env = "ONEBIT_QUEUE_DEPTH", default_value_t = crate::synth::DEFAULT_QUEUE_DEPTH)]
    pub queue_depth: usize,
    /// Largest request body in bytes (413 above).
    #[arg(long, env = "ONEBIT_MAX_BODY_BYTES", default_value_t = 65_536)]
    pub max_body_bytes: usize,
    /// Longest `input` in characters (400 above).
    #[arg(long, env = "ONEBIT_MAX_INPUT_CHARS", default_value_t = crate::synth::DEFAULT_MAX_INPUT_CHARS)]
    pub max_input_chars: usize,
    /// Seconds a request may run before it is cancelled.
    #[arg(long, env = "ONEBIT_REQUEST_TIMEOUT_S", default_value_t = 300)]
    pub request_timeout_s: u64,
    /// Seconds in-flight requests may run on after SIGINT/SIGTERM.
    #[arg(long, env = "ONEBIT_SHUTDOWN_GRACE_S", default_value_t = 30)]
    pub shutdown_grace_s: u64,
    /// An API key clients must send as `Authorization: Bearer KEY` (repeatable; ONEBIT_API_KEYS
    /// takes a comma-separated list).
    #[arg(
        long = "api-key",
        env = "ONEBIT_API_KEYS",
        value_delimiter = ',',
        hide_env_values = true
    )]
    pub api_keys: Vec<String>,
    /// A file of API keys, one per line (blank lines and `#` comments skipped).
    #[arg(long, env = "ONEBIT_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,
    /// Listen on a non-loopback address without any API key.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// A Host name to accept besides the listen address's own (repeatable; `*` accepts any).
    #[arg(
        long = "allowed-host",
        env = "ONEBIT_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    pub allowed_hosts: Vec<String>,
    /// A browser origin allowed to call the API (repeatable; `*` allows any); none: CORS off.
    #[arg(
        long = "cors-origin",
        env = "ONEBIT_CORS_ORIGINS",
        value_delimiter = ','
    )]
    pub cors_origins: Vec<String>,
    /// Seconds a connection may take to send a request head, counted from its opening or from
    /// its previous response (so also the idle keep-alive time).
    #[arg(long, env = "ONEBIT_HEADER_TIMEOUT_S", default_value_t = 10.0)]
    pub header_timeout_s: f64,
    /// Seconds the request body may take to arrive.
    #[arg(long, env = "ONEBIT_BODY_TIMEOUT_S", default_value_t = 30.0)]
    pub body_timeout_s: f64,
    /// Seconds a response write may stall (client not reading) before the connection is closed.
    #[arg(long, env = "ONEBIT_WRITE_TIMEOUT_S", default_value_t = 30.0)]
    pub write_timeout_s: f64,
    /// Open connections at most; more are answered 503 and closed.
    #[arg(long, env = "ONEBIT_MAX_CONNECTIONS", default_value_t = 512)]
    pub max_connections: usize,
    /// Largest whole (not streamed) response in MiB of 16-bit audio; larger ones are refused (400).
    /// Whole responses wait for their client in a file under $TMPDIR: this bounds its size.
    #[arg(long, env = "ONEBIT_MAX_RESPONSE_MB", default_value_t = 64)]
    pub max_response_mb: usize,
    /// A JSON file of voice aliases, `{"alloy": "dave", ...}`: names clients may send for
    /// installed voices (over the default mapping of OpenAI's voice names).
    #[arg(long, env = "ONEBIT_VOICE_ALIASES_FILE")]
    pub voice_aliases: Option<PathBuf>,
    /// A voice alias ALIAS=VOICE (repeatable; ONEBIT_VOICE_ALIASES takes a comma-separated list);
    /// wins over the file and the defaults.
    #[arg(
        long = "voice-alias",
        env = "ONEBIT_VOICE_ALIASES",
        value_delimiter = ',',
        value_name = "ALIAS=VOICE"
    )]
    pub voice_alias: Vec<String>,
    /// Also serve the Wyoming protocol (Home Assistant) at tcp://HOST:PORT.
    #[arg(long, env = "ONEBIT_WYOMING_URI", value_name = "tcp://HOST:PORT")]
    pub wyoming_uri: Option<String>,
    /// Serve no HTTP (with --wyoming-uri: a Wyoming-only server).
    #[arg(long)]
    pub no_http: bool,
    /// NeuCodec encoder ONNX for cloning voices over HTTP (default: the codec package's
    /// `encoder`, if it names one).
    #[arg(long, env = "ONEBIT_CODEC_ENCODER")]
    pub encoder: Option<PathBuf>,
    /// Directory for voices created over HTTP and their consent recordings (default: the
    /// repository's voices/custom/).
    #[arg(long, env = "ONEBIT_VOICE_STORE")]
    pub voice_store: Option<PathBuf>,
    /// Seconds a change to the voice store (voices, consents) waits for its lock (held by
    /// another server sharing the store) before answering 503.
    #[arg(long, env = "ONEBIT_VOICE_LOCK_TIMEOUT_S", default_value_t = 30.0)]
    pub voice_lock_timeout_s: f64,
    /// Largest uploaded audio file in MiB (a voice sample, a consent recording; 413 above).
    #[arg(long, env = "ONEBIT_MAX_UPLOAD_MB", default_value_t = 10)]
    pub max_upload_mb: usize,
}

/// `tcp://HOST:PORT`, HOST an IP address or `localhost`.
pub fn parse_wyoming_uri(uri: &str) -> Result<SocketAddr, ConfigError> {
    let bad = || ConfigError::WyomingUri {
        uri: uri.to_owned(),
    };
    let rest = uri.strip_prefix("tcp://").ok_or_else(bad)?;
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if let Some(port) = rest.strip_prefix("localhost:") {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    rest.parse().map_err(|_| bad())
}

fn secs(s: f64, flag: &'static str) -> Result<Duration, ConfigError> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or(ConfigError::BadSeconds { flag, value: s })
}

impl ServeArgs {
    /// The server's configuration: keys read and checked, and the refusal to serve other
    /// machines without a key (checked here, before minutes of model loading).
    pub fn config(&self, device: String) -> Result<ServerConfig, ConfigError> {
        let mut keys = Vec::new();
        for k in &self.api_keys {
            keys.push(checked_key(k, "--api-key / ONEBIT_API_KEYS")?);
        }
        if let Some(path) = &self.api_key_file {
            keys.extend(read_key_file(path)?);
        }
        if self.max_connections == 0 {
            return Err(ConfigError::TooSmall {
                flag: "max-connections",
                min: 1,
            });
        }
        if self.max_response_mb == 0 {
            return Err(ConfigError::TooSmall {
                flag: "max-response-mb",
                min: 1,
            });
        }
        if self.max_upload_mb == 0 {
            return Err(ConfigError::TooSmall {
                flag: "max-upload-mb",
                min: 1,
            });
        }
        let mut voice_aliases = match &self.voice_aliases {
            Some(path) => super::names::read_alias_file(path)?,
            None => Default::default(),
        };
        for spec in &self.voice_alias {
            let (alias, voice) = super::names::parse_alias(spec)?;
            voice_aliases.insert(alias, voice);
        }
        let wyoming = self
            .wyoming_uri
            .as_deref()
            .map(parse_wyoming_uri)
            .transpose()?;
        if self.no_http && wyoming.is_none() {
            return Err(ConfigError::NothingServed);
        }
        let cfg = ServerConfig {
            addr: SocketAddr::new(self.host, self.port),
            queue_depth: self.queue_depth,
            max_body_bytes: self.max_body_bytes,
            max_input_chars: self.max_input_chars,
            request_timeout: Duration::from_secs(self.request_timeout_s),
            shutdown_grace: Duration::from_secs(self.shutdown_grace_s),
            retry_after_s: 1,
            device,
            api_keys: keys,
            allowed_hosts: self.allowed_hosts.clone(),
            cors_origins: self.cors_origins.clone(),
            header_timeout: secs(self.header_timeout_s, "header-timeout-s")?,
            body_timeout: secs(self.body_timeout_s, "body-timeout-s")?,
            write_timeout: secs(self.write_timeout_s, "write-timeout-s")?,
            max_connections: self.max_connections,
            max_response_bytes: self.max_response_mb.saturating_mul(1 << 20),
            insecure_no_auth: self.insecure_no_auth,
            voice_aliases,
            wyoming,
            http: !self.no_http,
            encoder: self.encoder.clone(),
            encoder_required: self.encoder.is_some(),
            voice_store: self.voice_store.clone(),
            voice_lock_wait: secs(self.voice_lock_timeout_s, "voice-lock-timeout-s")?,
            max_upload_bytes: self.max_upload_mb.saturating_mul(1 << 20),
        };
        cfg.check_exposure()?;
        Ok(cfg)
    }
}

impl ServerConfig {
    /// The front door's limits these settings name (every transport shares them).
    pub fn limits(&self) -> crate::synth::Limits {
        crate::synth::Limits {
            max_input_chars: self.max_input_chars,
            queue_depth: self.queue_depth,
        }
    }

    /// A server other machines can reach must have a key, unless the operator says otherwise
    /// (`--insecure-no-auth`), and then it says so loudly.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        if let Some(addr) = self.wyoming
            && !addr.ip().is_loopback()
        {
            if !self.insecure_no_auth {
                return Err(ConfigError::WyomingUnprotected { addr });
            }
            let warning = format!(
                "serving Wyoming on {addr} (--insecure-no-auth): the protocol has no keys, so \
                 anyone who can reach this address can use the server"
            );
            tracing::warn!("{warning}");
            eprintln!("warning: {warning}");
        }
        if !self.http || self.addr.ip().is_loopback() || !self.api_keys.is_empty() {
            return Ok(());
        }
        if !self.insecure_no_auth {
            return Err(ConfigError::Unprotected { addr: self.addr });
        }
        let warning = format!(
            "listening on {} without an API key (--insecure-no-auth): anyone who can reach this \
             address can use the server",
            self.addr
        );
        tracing::warn!("{warning}");
        eprintln!("warning: {warning}");
        Ok(())
    }
}

fn checked_key(k: &str, what: &str) -> Result<String, ConfigError> {
    let k = k.trim();
    if k.is_empty() || k.chars().any(char::is_whitespace) {
        return Err(ConfigError::BadKey { what: what.into() });
    }
    Ok(k.to_owned())
}

fn read_key_file(path: &Path) -> Result<Vec<String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::KeyFile {
        path: path.to_path_buf(),
        source,
    })?;
    text.lines()
        .enumerate()
        .map(|(i, l)| (i, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .map(|(i, l)| checked_key(l, &format!("{} line {}", path.display(), i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::names::AliasError;
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn parse(args: &[&str]) -> Result<ServerConfig, ConfigError> {
        let cli = Cli::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .expect("flags parse");
        cli.args.config("cpu".into())
    }

    #[test]
    fn a_non_loopback_address_needs_a_key_or_the_insecure_flag() {
        let e = parse(&["--host", "0.0.0.0"]).unwrap_err();
        assert!(matches!(e, ConfigError::Unprotected { .. }), "{e}");
        assert!(e.to_string().contains("--insecure-no-auth"), "{e}");
        let cfg = parse(&["--host", "0.0.0.0", "--api-key", "k1", "--api-key", "k2"]).unwrap();
        assert_eq!(cfg.api_keys, ["k1", "k2"]);
        assert!(parse(&["--host", "0.0.0.0", "--insecure-no-auth"]).is_ok());
        assert!(parse(&["--host", "::1"]).is_ok());
    }

    #[test]
    fn voice_aliases_come_from_a_file_then_the_flags() {
        let dir = std::env::temp_dir().join(format!("onebit-aliases-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("aliases.json");
        std::fs::write(&file, r#"{"alloy": "jo", "house": "dave"}"#).unwrap();
        let f = file.to_str().unwrap();
        let cfg = parse(&["--voice-aliases", f, "--voice-alias", "alloy=paul"]).unwrap();
        let got: Vec<(&str, &str)> = cfg
            .voice_aliases
            .iter()
            .map(|(a, v)| (a.as_str(), v.as_str()))
            .collect();
        assert_eq!(got, [("alloy", "paul"), ("house", "dave")]);
        for bad in ["alloy", "=dave", "alloy=", "al loy=dave", "alloy=../dave"] {
            let e = parse(&["--voice-alias", bad]).unwrap_err();
            assert!(
                matches!(e, ConfigError::Alias(AliasError::Syntax { .. })),
                "{bad}: {e}"
            );
        }
        std::fs::write(&file, r#"["alloy"]"#).unwrap();
        let e = parse(&["--voice-aliases", f]).unwrap_err();
        assert!(
            matches!(e, ConfigError::Alias(AliasError::File { .. })),
            "{e}"
        );
        assert!(e.to_string().contains("JSON object"), "{e}");
        std::fs::write(&file, r#"{"alloy": "a/b"}"#).unwrap();
        assert!(matches!(
            parse(&["--voice-aliases", f]).unwrap_err(),
            ConfigError::Alias(AliasError::File { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn wyoming_uris_and_their_exposure() {
        let cfg = parse(&["--wyoming-uri", "tcp://127.0.0.1:10200"]).unwrap();
        assert_eq!(cfg.wyoming, Some("127.0.0.1:10200".parse().unwrap()));
        assert!(cfg.http);
        let cfg = parse(&["--wyoming-uri", "tcp://localhost:10200/", "--no-http"]).unwrap();
        assert_eq!(cfg.wyoming, Some("127.0.0.1:10200".parse().unwrap()));
        assert!(!cfg.http);
        for bad in [
            "127.0.0.1:10200",
            "tcp://host.lan:10200",
            "tcp://127.0.0.1",
            "unix:///x",
        ] {
            let e = parse(&["--wyoming-uri", bad]).unwrap_err();
            assert!(matches!(e, ConfigError::WyomingUri { .. }), "{bad}: {e}");
        }
        let e = parse(&["--wyoming-uri", "tcp://0.0.0.0:10200"]).unwrap_err();
        assert!(matches!(e, ConfigError::WyomingUnprotected { .. }), "{e}");
        // HTTP keys do not cover Wyoming, which has none.
        let e = parse(&["--wyoming-uri", "tcp://0.0.0.0:10200", "--api-key", "k"]).unwrap_err();
        assert!(matches!(e, ConfigError::WyomingUnprotected { .. }), "{e}");
        assert!(parse(&["--wyoming-uri", "tcp://0.0.0.0:10200", "--insecure-no-auth"]).is_ok());
        assert!(matches!(
            parse(&["--no-http"]).unwrap_err(),
            ConfigError::NothingServed
        ));
    }

    #[test]
    fn keys_come_from_flags_and_a_file() {
        let dir = std::env::temp_dir().join(format!("onebit-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("keys");
        std::fs::write(&file, "# ops\nfile-key-1\n\n  file-key-2  \n").unwrap();
        let cfg = parse(&["--api-key", "a", "--api-key-file", file.to_str().unwrap()]).unwrap();
        assert_eq!(cfg.api_keys, ["a", "file-key-1", "file-key-2"]);
        std::fs::write(&file, "two words\n").unwrap();
        let e = parse(&["--api-key-file", file.to_str().unwrap()]).unwrap_err();
        assert!(e.to_string().contains("line 1"), "{e}");
        let e = parse(&["--api-key-file", dir.join("none").to_str().unwrap()]).unwrap_err();
        assert!(matches!(e, ConfigError::KeyFile { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
