//! The OpenAI-compatible server end to end: the real server (`server::serve_on`) on loopback port 0
//! in this process, driven by reqwest for every route and error, the scheduler (queue, timeout,
//! disconnect, shutdown) and a bounded load test.
//!
//! Synchronisation is on observable state only (responses, /metrics gauges and counters, refused
//! connections), polled with bounded retries; no test sleeps to let something happen. Scheduler
//! tests that need the engine busy for as long as they like use a gated engine: the real engine
//! behind a latch the test opens, which also gives way to the request's cancel token.

mod common;

use std::io::Cursor;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use reqwest::{Client, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use onebit_tts::codec::CodecDecoder;
use onebit_tts::engine::{
    CancelToken, Candidates, Engine, EngineError, Generation, GenerationParams,
};
use onebit_tts::server::names::AliasError;
use onebit_tts::server::{ConfigError, ServerConfig, serve_on};
use onebit_tts::synth::{FrontEnd, SynthConfig, Synthesizer, load_engine};

const TEXT: &str = "Hello world, this is a test.";
/// Long enough (about 400 characters) that its code budget lets a generation run for thousands
/// of codes: for tests that need a generation still running when something happens.
const LONG_TEXT: &str = "The river runs slowly past the old stone houses of the valley, and the people who live there \
    have watched it for many years. In spring it rises with the melting snow, in summer it is low \
    and clear, and in autumn the leaves of the tall trees float on it towards the sea. Nobody \
    remembers a year when it did not come back, and nobody expects one, because the mountains \
    are still there and the snow still falls on them every winter.";
const SAMPLES_PER_CODE: usize = 480;
/// How long a bounded wait on observable state may take before the test fails.
const WAIT: Duration = Duration::from_secs(60);

// ---- Synthesizers: loaded once per test binary. ----

fn synth_config(model: &str) -> SynthConfig {
    SynthConfig {
        package_dir: common::model(model),
        voice_dirs: vec![common::repo().join("voices")],
        ..SynthConfig::default()
    }
}

/// The chain package: greedy decoding gives expect.json's code count.
fn tiny() -> Arc<Synthesizer> {
    static S: OnceLock<Arc<Synthesizer>> = OnceLock::new();
    S.get_or_init(|| Arc::new(Synthesizer::load(&synth_config("tiny")).expect("load tiny")))
        .clone()
}

/// Random weights: sampling with a seed gives a different take per seed, and it never runs out
/// of things to say before max_new_tokens.
fn tiny_random() -> Arc<Synthesizer> {
    static S: OnceLock<Arc<Synthesizer>> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Synthesizer::load(&synth_config("tiny-random")).expect("load tiny-random"))
    })
    .clone()
}

fn greedy_codes() -> usize {
    common::expect("tiny")["test_voice_greedy_codes"]
        .as_u64()
        .unwrap() as usize
}

/// A latch in front of the engine: while held, generation waits (and gives way to cancellation,
/// checked every few milliseconds as a real engine checks it every code).
#[derive(Default)]
struct Gate {
    held: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    fn hold(&self) {
        *self.held.lock().unwrap() = true;
    }
    fn release(&self) {
        *self.held.lock().unwrap() = false;
        self.cv.notify_all();
    }
    fn wait(&self, cancel: &CancelToken) {
        let mut held = self.held.lock().unwrap();
        while *held && !cancel.is_cancelled() {
            held = self
                .cv
                .wait_timeout(held, Duration::from_millis(5))
                .unwrap()
                .0;
        }
    }
}

struct GatedEngine {
    inner: Box<dyn Engine>,
    gate: Arc<Gate>,
}

impl Engine for GatedEngine {
    fn generate(
        &mut self,
        candidates: &Candidates,
        prompt: &[u32],
        params: &GenerationParams,
        cancel: &CancelToken,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        self.gate.wait(cancel);
        self.inner
            .generate(candidates, prompt, params, cancel, on_code)
    }

    fn describe(&self) -> String {
        format!("gated {}", self.inner.describe())
    }
}

/// A fresh tiny synthesizer whose engine is the real one wrapped by `wrap`.
fn tiny_with(wrap: impl FnOnce(Box<dyn Engine>) -> Box<dyn Engine>) -> Arc<Synthesizer> {
    let cfg = synth_config("tiny");
    let front = FrontEnd::load(&cfg).unwrap();
    let engine = load_engine(&cfg, front.package()).unwrap();
    let env = onebit_tts::runtime::environment(None).unwrap();
    let codec = CodecDecoder::load(env, &front.package().codec, &Default::default()).unwrap();
    Arc::new(Synthesizer::from_parts(front, wrap(engine), codec, Default::default()).unwrap())
}

/// A fresh tiny synthesizer whose engine waits on the returned gate (held from the start).
fn gated_tiny() -> (Arc<Synthesizer>, Arc<Gate>) {
    let gate = Arc::new(Gate::default());
    gate.hold();
    let g = gate.clone();
    let synth = tiny_with(move |inner| Box::new(GatedEngine { inner, gate: g }));
    (synth, gate)
}

/// An engine that fails (or panics) on every request.
struct BrokenEngine {
    panics: bool,
}

impl Engine for BrokenEngine {
    fn generate(
        &mut self,
        _: &Candidates,
        _: &[u32],
        _: &GenerationParams,
        _: &CancelToken,
        _: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        if self.panics {
            panic!("simulated engine panic");
        }
        Err(EngineError::Runtime("simulated device failure".into()))
    }

    fn describe(&self) -> String {
        "broken".into()
    }
}

// ---- The server under test. ----

struct Server {
    addr: SocketAddr,
    stop: Mutex<Option<oneshot::Sender<()>>>,
    task: Mutex<Option<JoinHandle<std::io::Result<()>>>>,
}

impl Server {
    async fn start(synth: Arc<Synthesizer>, cfg: ServerConfig) -> Arc<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve_on(listener, synth, cfg, async move {
            let _ = stopped.await;
        }));
        Arc::new(Self {
            addr,
            stop: Mutex::new(Some(stop)),
            task: Mutex::new(Some(task)),
        })
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    /// Completes the shutdown future given to `serve_on`.
    fn trigger_shutdown(&self) {
        if let Some(s) = self.stop.lock().unwrap().take() {
            let _ = s.send(());
        }
    }

    fn has_returned(&self) -> bool {
        self.task
            .lock()
            .unwrap()
            .as_ref()
            .is_none_or(|t| t.is_finished())
    }

    /// Waits (bounded) for `serve_on` to return, and asserts it returned Ok.
    async fn join(&self) {
        let task = self.task.lock().unwrap().take().expect("joined once");
        let r = tokio::time::timeout(WAIT, task)
            .await
            .expect("serve_on returns after shutdown");
        r.unwrap().unwrap();
    }

    async fn stop(&self) {
        self.trigger_shutdown();
        self.join().await;
    }
}

fn config() -> ServerConfig {
    ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        ..ServerConfig::default()
    }
}

/// A loopback client; the timeout turns a hang into a failure.
fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(2 * WAIT)
        .build()
        .unwrap()
}

/// A greedy request for the test voice with `extra` fields merged in (null removes a field). No
/// `model`: the server's one model speaks (the synthesizers here serve several packages).
fn body(extra: Value) -> Value {
    let mut b = json!({"voice": "test", "input": TEXT, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            b.as_object_mut().unwrap().remove(k);
        } else {
            b[k] = v.clone();
        }
    }
    b
}

/// `GET path` as JSON (its status and text in the panic when it is not).
async fn get_json(c: &Client, s: &Server, path: &str) -> Value {
    let r = c.get(s.url(path)).send().await.unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: {status} {e}: {text}"))
}

async fn speak(c: &Client, s: &Server, body: &Value) -> Response {
    c.post(s.url("/v1/audio/speech"))
        .json(body)
        .send()
        .await
        .unwrap()
}

fn header(r: &Response, name: &str) -> String {
    r.headers()
        .get(name)
        .unwrap_or_else(|| panic!("no {name} header"))
        .to_str()
        .unwrap()
        .to_owned()
}

fn codes_header(r: &Response) -> usize {
    header(r, "x-onebit-codes").parse().unwrap()
}

/// Samples of a WAV body: (rate, channels, samples).
fn wav(bytes: &[u8]) -> (u32, u16, usize) {
    let r = hound::WavReader::new(Cursor::new(bytes.to_vec())).expect("a valid WAV");
    let s = r.spec();
    assert_eq!(s.bits_per_sample, 16);
    (s.sample_rate, s.channels, r.len() as usize)
}

/// Asserts an OpenAI-shaped error and returns its message.
async fn api_error(r: Response, status: u16, param: Option<&str>, code: Option<&str>) -> String {
    assert!(
        status >= 500 || code.is_some(),
        "every 4xx carries a code: name it"
    );
    assert_eq!(r.status().as_u16(), status, "status");
    assert!(
        header(&r, "content-type").starts_with("application/json"),
        "errors are JSON"
    );
    let v: Value = r.json().await.expect("error body is JSON");
    let e = &v["error"];
    let obj = e
        .as_object()
        .unwrap_or_else(|| panic!("no error object: {v}"));
    for key in ["message", "type", "param", "code"] {
        assert!(obj.contains_key(key), "error.{key} missing: {v}");
    }
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    let ty = e["type"].as_str().unwrap();
    let expected_type = match status {
        429 => "rate_limit_error",
        500..=599 => "server_error",
        _ => "invalid_request_error",
    };
    assert_eq!(ty, expected_type, "{v}");
    assert_eq!(e["param"].as_str(), param, "param of {v}");
    if let Some(code) = code {
        assert_eq!(e["code"].as_str(), Some(code), "code of {v}");
    }
    e["message"].as_str().unwrap().to_owned()
}

// ---- /metrics ----

async fn metrics_text(c: &Client, s: &Server) -> String {
    let r = c.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    r.text().await.unwrap()
}

/// The value of one sample line (`name` includes labels, e.g. `x{status="200"}`); 0 when absent
/// (a counter never incremented).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == name).then(|| v.parse::<f64>().unwrap())
        })
        .unwrap_or(0.0)
}

/// Polls /metrics (bounded) until `name` satisfies `ok`; returns the whole text then.
async fn wait_metric(c: &Client, s: &Server, name: &str, ok: impl Fn(f64) -> bool) -> String {
    let start = Instant::now();
    loop {
        let text = metrics_text(c, s).await;
        if ok(metric(&text, name)) {
            return text;
        }
        assert!(
            start.elapsed() < WAIT,
            "{name} never reached the expected value; last metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ---- Audio checks ----

/// Asserts that `bytes` is a valid `format` file of `samples` samples at `rate` (within `tol`).
fn check_audio(format: &str, bytes: &[u8], rate: u32, samples: usize, tol: usize) {
    let got = match format {
        "wav" => {
            let (r, ch, n) = wav(bytes);
            assert_eq!((r, ch), (rate, 1), "wav spec");
            n
        }
        "pcm" => {
            assert_eq!(bytes.len() % 2, 0, "pcm is 16-bit");
            bytes.len() / 2
        }
        "opus" => {
            assert_eq!(&bytes[..4], b"OggS");
            let (d, _, input_rate, _) = common::opus_decode(bytes);
            assert_eq!(input_rate, rate);
            // Decoded at 48 kHz.
            let n = d.len() as u64 * u64::from(rate) / 48_000;
            n as usize
        }
        "mp3" | "flac" => {
            let (r, ch, d, _) = common::symphonia_decode(bytes, format);
            assert_eq!((r, ch), (rate, 1), "{format} spec");
            d.len()
        }
        other => panic!("no check for {other}"),
    };
    assert!(
        got.abs_diff(samples) <= tol,
        "{format}: {got} samples at {rate} Hz, expected {samples} ± {tol}"
    );
}

// ---- Routes and formats ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speech_in_every_format_is_a_valid_file_of_the_greedy_length() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let codes = greedy_codes();
    let samples = codes * SAMPLES_PER_CODE;
    // (response_format, content type, tolerance in samples): MP3's gapless trim is exact to a frame.
    let cases = [
        (None, "audio/mpeg", 1152),
        (Some("mp3"), "audio/mpeg", 1152),
        (Some("opus"), "audio/ogg; codecs=opus", 0),
        (Some("flac"), "audio/flac", 0),
        (Some("wav"), "audio/wav", 0),
        (Some("pcm"), "audio/pcm", 0),
    ];
    for (format, ct, tol) in cases {
        let r = speak(&c, &s, &body(json!({"response_format": format}))).await;
        assert_eq!(r.status(), StatusCode::OK, "{format:?}");
        assert_eq!(header(&r, "content-type"), ct);
        assert_eq!(codes_header(&r), codes, "greedy codes for {format:?}");
        assert!(header(&r, "server-timing").contains("decode;dur="));
        let bytes = r.bytes().await.unwrap();
        check_audio(format.unwrap_or("mp3"), &bytes, 24_000, samples, tol);
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_format_audio_arrives_in_chunks() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let samples = greedy_codes() * SAMPLES_PER_CODE;
    for format in ["pcm", "wav"] {
        let mut r = speak(
            &c,
            &s,
            &body(json!({"response_format": format, "stream_format": "audio"})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
        assert!(
            r.headers().get("content-length").is_none(),
            "a streamed body has no length up front"
        );
        let mut chunks = Vec::new();
        while let Some(chunk) = r.chunk().await.unwrap() {
            chunks.push(chunk);
        }
        assert!(
            chunks.len() > 1,
            "{format}: audio must leave in pieces, got {} chunk(s)",
            chunks.len()
        );
        let all: Vec<u8> = chunks.concat();
        let data = if format == "wav" {
            // Streamed WAV: a header of unknown length, then the samples.
            assert_eq!(&all[..4], b"RIFF");
            assert_eq!(&all[8..16], b"WAVEfmt ");
            assert_eq!(u32::from_le_bytes(all[24..28].try_into().unwrap()), 24_000);
            assert_eq!(&all[36..40], b"data");
            &all[44..]
        } else {
            &all[..]
        };
        assert_eq!(data.len(), samples * 2, "{format} sample bytes");
    }
    s.stop().await;
}

/// Splits an SSE body into its `data:` JSON events.
fn sse_events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: "))
                .unwrap_or_else(|| panic!("event without data: {e:?}"));
            serde_json::from_str(data).unwrap()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_format_sse_sends_deltas_then_done_with_usage() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let codes = greedy_codes();
    let r = speak(
        &c,
        &s,
        &body(json!({"response_format": "pcm", "stream_format": "sse"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "content-type"), "text/event-stream");
    let events = sse_events(&r.text().await.unwrap());
    let (done, deltas) = events.split_last().unwrap();
    assert!(deltas.len() > 1, "audio must come in several deltas");
    let mut pcm = Vec::new();
    for d in deltas {
        assert_eq!(d["type"], "speech.audio.delta", "{d}");
        pcm.extend(
            base64::engine::general_purpose::STANDARD
                .decode(d["audio"].as_str().unwrap())
                .unwrap(),
        );
    }
    assert_eq!(pcm.len(), codes * SAMPLES_PER_CODE * 2);
    assert_eq!(done["type"], "speech.audio.done", "{done}");
    let usage = &done["usage"];
    assert_eq!(usage["output_tokens"].as_u64(), Some(codes as u64));
    let input = usage["input_tokens"].as_u64().unwrap();
    assert!(input > 0);
    assert_eq!(usage["total_tokens"].as_u64(), Some(input + codes as u64));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sample_rate_and_speed_change_the_output() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let samples = greedy_codes() * SAMPLES_PER_CODE;

    // 16 kHz: the same duration, two thirds of the samples.
    let r = speak(
        &c,
        &s,
        &body(json!({"response_format": "wav", "sample_rate": 16000})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let (rate, ch, n) = wav(&r.bytes().await.unwrap());
    assert_eq!((rate, ch), (16_000, 1));
    assert!(n.abs_diff(samples * 2 / 3) <= 2, "{n} samples at 16 kHz");

    // Speed 2: half the duration (±2 %), same rate.
    let r = speak(
        &c,
        &s,
        &body(json!({"response_format": "wav", "speed": 2.0})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let (rate, _, n) = wav(&r.bytes().await.unwrap());
    assert_eq!(rate, 24_000);
    let half = samples as f64 / 2.0;
    assert!(
        (n as f64 - half).abs() <= 0.02 * half,
        "speed 2: {n} samples for {samples} at speed 1"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_pauses_are_silence_of_their_length_and_reading_fields_are_taken() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let per_piece = greedy_codes() * SAMPLES_PER_CODE;
    // A pause before, between and after two pieces: exact silence of 0.25 + 1 + 0.5 s at 24 kHz
    // around the two pieces' greedy audio.
    let input = "[pause:0.25s]Hello world.<break time=\"1s\"/>This is a test.[pause:500ms]";
    let r = speak(
        &c,
        &s,
        &body(json!({"input": input, "markup": true, "response_format": "wav"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let bytes = r.bytes().await.unwrap();
    let samples: Vec<i16> = hound::WavReader::new(Cursor::new(bytes.to_vec()))
        .unwrap()
        .into_samples::<i16>()
        .map(Result::unwrap)
        .collect();
    let (lead, mid, tail) = (6_000, 24_000, 12_000);
    assert_eq!(samples.len(), lead + per_piece + mid + per_piece + tail);
    let silent = |r: std::ops::Range<usize>| samples[r].iter().all(|&x| x == 0);
    assert!(silent(0..lead), "leading pause");
    assert!(!silent(lead..lead + per_piece), "the first piece speaks");
    assert!(
        silent(lead + per_piece..lead + per_piece + mid),
        "pause between"
    );
    assert!(
        silent(samples.len() - tail..samples.len()),
        "trailing pause"
    );

    // A pause lasts its time at any speed: 1 s of silence at speed 2 is still 24,000 samples
    // (the time-stretch's window blurs its edge by a few milliseconds).
    let r = speak(
        &c,
        &s,
        &body(json!({"input": "[pause:1s]Hello world.", "markup": true, "speed": 2.0, "response_format": "wav"})),
    )
    .await;
    let fast: Vec<i16> = hound::WavReader::new(Cursor::new(r.bytes().await.unwrap().to_vec()))
        .unwrap()
        .into_samples::<i16>()
        .map(Result::unwrap)
        .collect();
    let lead = fast.iter().position(|&x| x != 0).unwrap();
    assert!(
        lead.abs_diff(24_000) <= 480,
        "{lead} silent samples at speed 2"
    );
    let half = (fast.len() - lead) as f64;
    assert!(
        (half - per_piece as f64 / 2.0).abs() <= 0.03 * per_piece as f64,
        "{half}"
    );

    // Without `markup` the same text is ordinary text: no pause, one piece that reads the
    // brackets as written.
    let plain = greedy_wav(&c, &s, json!({"input": input, "response_format": "wav"})).await;
    assert_eq!(wav(&plain).2, per_piece);

    // The reading fields change the prompt: its token count is in the SSE usage.
    let dollars = json!({"input": "It costs $5.50."});
    let said = prompt_tokens(
        &c,
        &s,
        json!({"input": "It costs five dollars fifty cents."}),
    )
    .await;
    assert_eq!(prompt_tokens(&c, &s, dollars.clone()).await, said);
    let mut raw = dollars;
    raw["normalize"] = json!(false);
    assert_ne!(prompt_tokens(&c, &s, raw).await, said);
    let plain = prompt_tokens(&c, &s, json!({"input": "Say NeuTTS now."})).await;
    let ipa =
        json!({"input": "Say NeuTTS now.", "lexicon": {"NeuTTS": "njuːtˌiːtˌiːˈɛs ə lˈɒŋ wˈʌn"}});
    assert!(prompt_tokens(&c, &s, ipa).await > plain);
    s.stop().await;
}

/// The prompt tokens of a request (greedy, 8 codes), from its SSE usage.
async fn prompt_tokens(c: &Client, s: &Server, extra: Value) -> u64 {
    let mut b = body(extra);
    b["stream_format"] = json!("sse");
    b["max_new_tokens"] = json!(8);
    let r = speak(c, s, &b).await;
    assert_eq!(r.status(), StatusCode::OK);
    let events = sse_events(&r.text().await.unwrap());
    let done = events.last().expect("events");
    assert_eq!(done["type"], "speech.audio.done", "{done}");
    done["usage"]["input_tokens"].as_u64().unwrap()
}

// ---- OpenAI's names ----

/// The greedy WAV of `extra` merged into the test request.
async fn greedy_wav(c: &Client, s: &Server, extra: Value) -> Vec<u8> {
    let r = speak(c, s, &body(extra)).await;
    assert_eq!(r.status(), StatusCode::OK);
    r.bytes().await.unwrap().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_model_and_voice_names_speak_as_the_voices_they_map_to() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let jo = greedy_wav(&c, &s, json!({"voice": "jo", "response_format": "wav"})).await;
    let dave = greedy_wav(&c, &s, json!({"voice": "dave", "response_format": "wav"})).await;
    assert!(jo != dave, "two voices, two takes");
    for (model, voice, want) in [
        ("tts-1", json!("alloy"), &jo),
        ("tts-1-hd", json!("shimmer"), &jo),
        ("gpt-4o-mini-tts", json!({"id": "ash"}), &dave),
        ("neutts-air", json!("onyx"), &dave),
    ] {
        let got = greedy_wav(
            &c,
            &s,
            json!({"model": model, "voice": voice, "response_format": "wav",
                   "instructions": "Speak cheerfully."}),
        )
        .await;
        assert!(got == *want, "{model} {voice}");
    }
    // Without a model the one loaded model speaks.
    let got = greedy_wav(
        &c,
        &s,
        json!({"model": null, "voice": "alloy", "response_format": "wav"}),
    )
    .await;
    assert!(got == jo);

    // An unknown model: 404 as OpenAI answers it, naming the field and the models there are.
    let r = speak(&c, &s, &body(json!({"model": "whisper-1"}))).await;
    let msg = api_error(r, 404, Some("model"), Some("model_not_found")).await;
    assert!(msg.contains("tts-1") && msg.contains("tiny"), "{msg}");
    // An unknown voice name is still a 400 naming the voice.
    let r = speak(&c, &s, &body(json!({"voice": "juniper"}))).await;
    api_error(r, 400, Some("voice"), Some("unknown_voice")).await;

    // /v1/models/{id} describes a model; an unknown id is OpenAI's 404.
    let r = c.get(s.url("/v1/models/tts-1")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let m: Value = r.json().await.unwrap();
    assert_eq!(m["id"], "tts-1");
    assert_eq!(m["object"], "model");
    assert_eq!(m["owned_by"], "onebit-tts");
    let r = c.get(s.url("/v1/models/tiny")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = c.get(s.url("/v1/models/dall-e-3")).send().await.unwrap();
    api_error(r, 404, None, Some("model_not_found")).await;

    // /v1/audio/voices shows the mapping both ways.
    let v: Value = get_json(&c, &s, "/v1/audio/voices").await;
    assert_eq!(v["aliases"]["alloy"], "jo");
    assert_eq!(v["aliases"]["verse"], "steven");
    assert_eq!(v["aliases"].as_object().unwrap().len(), 11);
    let jo_entry = v["voices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == "jo")
        .unwrap();
    assert_eq!(jo_entry["aliases"], json!(["alloy", "shimmer"]));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_aliases_win_and_bad_ones_stop_the_start() {
    let mut cfg = config();
    cfg.voice_aliases = [("alloy", "dave"), ("narrator", "paul")]
        .iter()
        .map(|(a, v)| ((*a).to_owned(), (*v).to_owned()))
        .collect();
    let s = Server::start(tiny(), cfg).await;
    let c = client();
    let dave = greedy_wav(&c, &s, json!({"voice": "dave", "response_format": "wav"})).await;
    let paul = greedy_wav(&c, &s, json!({"voice": "paul", "response_format": "wav"})).await;
    assert!(greedy_wav(&c, &s, json!({"voice": "alloy", "response_format": "wav"})).await == dave);
    assert!(
        greedy_wav(
            &c,
            &s,
            json!({"voice": {"id": "narrator"}, "response_format": "wav"})
        )
        .await
            == paul
    );
    s.stop().await;

    // `serve` refuses an alias to a voice that is not installed, or one that hides a voice,
    // before it listens.
    for (alias, voice) in [("alloy", "nobody"), ("dave", "jo")] {
        let mut cfg = config();
        cfg.voice_aliases = [(alias.to_owned(), voice.to_owned())].into_iter().collect();
        let e = onebit_tts::server::serve(tiny(), cfg).await.unwrap_err();
        assert!(
            matches!(
                e,
                onebit_tts::server::ServeError::Config(ConfigError::Alias(
                    AliasError::Target { .. } | AliasError::HidesVoice { .. }
                ))
            ),
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn voices_models_health_and_metrics() {
    let s = Server::start(tiny(), config()).await;
    let c = client();

    let v: Value = get_json(&c, &s, "/v1/audio/voices").await;
    let test = v["voices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "test")
        .unwrap_or_else(|| panic!("voice test listed: {v}"));
    assert_eq!(test["language"], "en-us");
    assert!(test["reference_seconds"].as_f64().unwrap() > 0.0);

    let m: Value = get_json(&c, &s, "/v1/models").await;
    assert_eq!(m["object"], "list");
    let ids: Vec<&str> = m["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert_eq!(d["object"], "model");
            d["id"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        ids,
        ["tts-1", "tts-1-hd", "gpt-4o-mini-tts", "neutts-air", "tiny"]
    );

    let r = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let h: Value = r.json().await.unwrap();
    assert_eq!(h["status"], "ok");
    assert_eq!(h["ready"], true);
    assert_eq!(h["device"], "cpu");
    assert!(!h["engine"].as_str().unwrap().is_empty());
    // The test package's own word that it speaks no words, with the way to the real model.
    let note = h["model_note"].as_str().expect("a note for random weights");
    assert!(
        note.contains("holds random weights (made by tools/gen_models.py")
            && note.contains("onebit-tts models setup"),
        "{note}"
    );

    // One request so the counters move.
    let r = speak(&c, &s, &body(json!({"response_format": "wav"}))).await;
    assert_eq!(r.status(), StatusCode::OK);
    let codes = codes_header(&r);
    r.bytes().await.unwrap();
    let r = c.get(s.url("/metrics")).send().await.unwrap();
    assert!(header(&r, "content-type").starts_with("text/plain"));
    r.text().await.unwrap();
    // A request leaves `running` before its answer is sent.
    let text = metrics_text(&c, &s).await;
    assert_eq!(metric(&text, "onebit_running"), 0.0);
    for name in [
        "onebit_requests_total",
        "onebit_codes_generated_total",
        "onebit_generations_cancelled_total",
        "onebit_codes_per_second",
        "onebit_rtf",
        "onebit_time_to_first_audio_seconds_sum",
        "onebit_queue_depth",
        "onebit_running",
    ] {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} in:\n{text}"
        );
    }
    assert_eq!(metric(&text, "onebit_requests_total{status=\"200\"}"), 1.0);
    assert_eq!(metric(&text, "onebit_codes_generated_total"), codes as f64);
    assert_eq!(metric(&text, "onebit_generations_total"), 1.0);
    assert_eq!(metric(&text, "onebit_generations_cancelled_total"), 0.0);
    assert!(metric(&text, "onebit_codes_per_second") > 0.0);
    assert!(metric(&text, "onebit_rtf") > 0.0);
    assert_eq!(metric(&text, "onebit_queue_depth"), 0.0);
    assert_eq!(metric(&text, "onebit_running"), 0.0);
    s.stop().await;
}

/// The chain package sampled never draws its end token: "hi" stops at its code budget (140
/// codes, 2.8 s, not the context's 79 s), the answer says finish reason length, and /metrics
/// counts generations by finish reason. Greedy, the chain ends by itself: finish reason stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runaway_generation_ends_at_its_budget_and_is_counted_by_finish_reason() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let r = speak(
        &c,
        &s,
        &body(json!({"input": "hi", "temperature": null, "seed": 3, "response_format": "wav"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-onebit-finish-reason"), "length");
    assert_eq!(codes_header(&r), 140);
    assert_eq!(header(&r, "x-onebit-audio-seconds"), "2.800");
    check_audio(
        "wav",
        &r.bytes().await.unwrap(),
        24_000,
        140 * SAMPLES_PER_CODE,
        0,
    );

    let r = speak(&c, &s, &body(json!({"response_format": "wav"}))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-onebit-finish-reason"), "stop");
    assert_eq!(codes_header(&r), greedy_codes());

    let text = metrics_text(&c, &s).await;
    let finished = |reason: &str| {
        metric(
            &text,
            &format!("onebit_generations_finished_total{{reason=\"{reason}\"}}"),
        )
    };
    assert_eq!(
        (finished("stop"), finished("length"), finished("cancelled")),
        (1.0, 1.0, 0.0),
        "{text}"
    );
    assert!(
        text.contains("onebit_generations_finished_total{reason=\"cancelled\"} 0\n"),
        "every reason is exported: {text}"
    );
    assert_eq!(
        metric(&text, "onebit_codes_generated_total"),
        (140 + greedy_codes()) as f64
    );
    s.stop().await;
}

/// A long input (several pieces) with a sentence of only emoji: that piece is skipped and the
/// rest is spoken (200, each greedy piece's 120 codes plus the pauses between pieces); an input
/// with nothing speakable at all is a 400 nothing_speakable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emoji_only_piece_is_skipped_and_an_all_emoji_input_is_refused() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let half = format!("{LONG_TEXT} {LONG_TEXT}");
    let input = format!("{half} 😀😀. {half}");
    let r = speak(
        &c,
        &s,
        &body(json!({"input": input, "response_format": "wav"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "x-onebit-finish-reason"), "stop");
    let codes = codes_header(&r);
    let per_piece = greedy_codes();
    assert!(
        codes.is_multiple_of(per_piece) && codes / per_piece >= 2,
        "{codes} codes"
    );
    let pause = (onebit_tts::synth::PIECE_PAUSE_S * 24_000.0) as usize;
    check_audio(
        "wav",
        &r.bytes().await.unwrap(),
        24_000,
        codes * SAMPLES_PER_CODE + (codes / per_piece - 1) * pause,
        0,
    );

    let r = speak(&c, &s, &body(json!({"input": "😀😀 🎉 ★"}))).await;
    let msg = api_error(r, 400, Some("input"), Some("nothing_speakable")).await;
    assert!(msg.contains("nothing speakable"), "{msg}");
    s.stop().await;
}

// ---- Errors ----

/// Extra fields, status, param, code, words the message must hold.
type ErrorCase = (
    Value,
    u16,
    Option<&'static str>,
    Option<&'static str>,
    Vec<&'static str>,
);

async fn still_serving(c: &Client, s: &Server, valid: &Value) {
    let r = speak(c, s, valid).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(codes_header(&r), 8);
    assert_eq!(r.bytes().await.unwrap().len(), 8 * SAMPLES_PER_CODE * 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_has_the_openai_shape_and_the_server_keeps_serving() {
    let cfg = ServerConfig {
        max_input_chars: 64,
        max_body_bytes: 2048,
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let c = client();
    let speech = s.url("/v1/audio/speech");
    // A cheap valid request after every error.
    let valid = body(json!({"response_format": "pcm", "max_new_tokens": 8}));

    let cases: Vec<ErrorCase> = vec![
        (
            json!({"voice": "nobody"}),
            400,
            Some("voice"),
            Some("unknown_voice"),
            vec!["nobody", "test"],
        ),
        (
            json!({"voice": {"id": "nobody"}}),
            400,
            Some("voice"),
            Some("unknown_voice"),
            vec!["nobody", "test"],
        ),
        (
            json!({"input": ""}),
            400,
            Some("input"),
            Some("empty_input"),
            vec!["empty"],
        ),
        (
            json!({"input": "   "}),
            400,
            Some("input"),
            Some("empty_input"),
            vec!["empty"],
        ),
        (
            json!({"input": "a".repeat(65)}),
            400,
            Some("input"),
            Some("input_too_long"),
            vec!["65", "64"],
        ),
        (
            json!({"response_format": "aac"}),
            400,
            Some("response_format"),
            Some("unsupported_value"),
            vec!["aac", "mp3, opus, flac, wav, pcm"],
        ),
        (
            json!({"response_format": "ogg"}),
            400,
            Some("response_format"),
            Some("invalid_value"),
            vec!["mp3, opus, flac, wav, pcm"],
        ),
        // OpenAI's names exactly: no other case, no spaces.
        (
            json!({"response_format": "Mp3"}),
            400,
            Some("response_format"),
            Some("invalid_value"),
            vec!["\"Mp3\""],
        ),
        (
            json!({"response_format": "wav "}),
            400,
            Some("response_format"),
            Some("invalid_value"),
            vec!["\"wav \""],
        ),
        (
            json!({"speed": 0.1}),
            400,
            Some("speed"),
            Some("invalid_value"),
            vec!["0.25"],
        ),
        (
            json!({"speed": 5}),
            400,
            Some("speed"),
            Some("invalid_value"),
            vec!["4"],
        ),
        (
            json!({"sample_rate": 4000}),
            400,
            Some("sample_rate"),
            Some("invalid_value"),
            vec!["4000"],
        ),
        (
            json!({"temperature": -1}),
            400,
            Some("temperature"),
            Some("invalid_value"),
            vec!["temperature"],
        ),
        (
            json!({"top_p": 0}),
            400,
            Some("top_p"),
            Some("invalid_value"),
            vec!["top_p"],
        ),
        (
            json!({"stream_format": "chunks"}),
            400,
            Some("stream_format"),
            Some("invalid_value"),
            vec!["audio, sse"],
        ),
        (
            json!({"language": "xx-yy"}),
            400,
            Some("language"),
            Some("invalid_value"),
            vec!["xx-yy"],
        ),
        (
            json!({"max_new_tokens": 0}),
            400,
            Some("max_new_tokens"),
            Some("invalid_value"),
            vec!["max_new_tokens"],
        ),
        // Markup (opt-in) that does not parse names where it goes wrong, in characters.
        (
            json!({"input": "Hé [pause:abc] x", "markup": true}),
            400,
            Some("input"),
            Some("invalid_markup"),
            vec!["character 4", "[pause:abc]"],
        ),
        (
            json!({"input": "<break time=\"20s\"/>Hi", "markup": true}),
            400,
            Some("input"),
            Some("invalid_markup"),
            vec!["character 1"],
        ),
        (
            json!({"input": "Say [it](/ɪt", "markup": true}),
            400,
            Some("input"),
            Some("invalid_markup"),
            vec!["character 5"],
        ),
        (
            json!({"lexicon": {"word": ""}}),
            400,
            Some("lexicon"),
            Some("invalid_lexicon"),
            vec!["lexicon"],
        ),
        // Wrong types and missing or unknown fields: 422.
        (
            json!({"input": 5}),
            422,
            None,
            Some("invalid_type"),
            vec!["invalid type"],
        ),
        (
            json!({"speed": "fast"}),
            422,
            None,
            Some("invalid_type"),
            vec!["invalid type"],
        ),
        (
            json!({"voice": null}),
            422,
            None,
            Some("invalid_type"),
            vec!["voice"],
        ),
        (
            json!({"volume": 3}),
            422,
            None,
            Some("invalid_type"),
            vec!["volume"],
        ),
    ];
    for (extra, status, param, code, words) in cases {
        let r = speak(&c, &s, &body(extra.clone())).await;
        let msg = api_error(r, status, param, code).await;
        for w in words {
            assert!(msg.contains(w), "{extra}: {msg:?} lacks {w:?}");
        }
        still_serving(&c, &s, &valid).await;
    }

    // Body over max_body_bytes, with a Content-Length and chunked without one: 413.
    let big = body(json!({"input": "word ".repeat(1000)}));
    let r = c.post(&speech).json(&big).send().await.unwrap();
    let msg = api_error(r, 413, None, Some("body_too_large")).await;
    assert!(msg.contains("2048"), "{msg}");
    still_serving(&c, &s, &valid).await;
    let bytes = serde_json::to_vec(&big).unwrap();
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        bytes.chunks(512).map(|c| Ok(c.to_vec())).collect();
    let r = c
        .post(&speech)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces,
        )))
        .send()
        .await
        .unwrap();
    api_error(r, 413, None, Some("body_too_large")).await;
    still_serving(&c, &s, &valid).await;

    // Not JSON by Content-Type: 415.
    let r = c
        .post(&speech)
        .header("content-type", "text/plain")
        .body(serde_json::to_vec(&valid).unwrap())
        .send()
        .await
        .unwrap();
    let msg = api_error(r, 415, None, Some("unsupported_media_type")).await;
    assert!(msg.contains("text/plain"), "{msg}");
    still_serving(&c, &s, &valid).await;
    // No Content-Type is not JSON either (a browser's simple POST may omit it).
    let r = c
        .post(&speech)
        .body(serde_json::to_vec(&valid).unwrap())
        .send()
        .await
        .unwrap();
    let msg = api_error(r, 415, None, Some("unsupported_media_type")).await;
    assert!(msg.contains("(none)"), "{msg}");
    // JSON with a charset parameter is JSON.
    let r = c
        .post(&speech)
        .header("content-type", "application/json; charset=utf-8")
        .body(serde_json::to_vec(&valid).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // Malformed JSON: 400; valid JSON that is not an object: 422.
    for (raw, status, code) in [
        (&b"{\"input\": "[..], 400, "invalid_json"),
        (&b"not json"[..], 400, "invalid_json"),
        (&b"[1, 2]"[..], 422, "invalid_type"),
    ] {
        let r = c
            .post(&speech)
            .header("content-type", "application/json")
            .body(raw.to_vec())
            .send()
            .await
            .unwrap();
        api_error(r, status, None, Some(code)).await;
        still_serving(&c, &s, &valid).await;
    }

    // Unknown routes: 404; a known route with the wrong method: 405.
    for path in ["/v1/nope", "/v1/audio/speech/extra", "/index.html"] {
        let r = c.get(s.url(path)).send().await.unwrap();
        api_error(r, 404, None, Some("not_found")).await;
        still_serving(&c, &s, &valid).await;
    }
    let r = c
        .post(s.url("/v1/chat/completions"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    api_error(r, 404, None, Some("not_found")).await;
    still_serving(&c, &s, &valid).await;
    let r = c.get(&speech).send().await.unwrap();
    api_error(r, 405, None, Some("method_not_allowed")).await;
    still_serving(&c, &s, &valid).await;

    let text = metrics_text(&c, &s).await;
    assert!(metric(&text, "onebit_requests_total{status=\"400\"}") >= 17.0);
    assert_eq!(metric(&text, "onebit_requests_total{status=\"413\"}"), 2.0);
    assert_eq!(metric(&text, "onebit_requests_total{status=\"415\"}"), 2.0);
    s.stop().await;
}

// ---- Scheduler ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429_with_retry_after() {
    let (synth, gate) = gated_tiny();
    let cfg = ServerConfig {
        queue_depth: 2,
        retry_after_s: 3,
        ..config()
    };
    let s = Server::start(synth, cfg).await;
    let c = client();
    let req = body(json!({"response_format": "wav"}));

    // One running (held at the gate), then two waiting.
    let spawn = |s: Arc<Server>| {
        let (c, req) = (c.clone(), req.clone());
        tokio::spawn(async move {
            let r = speak(&c, &s, &req).await;
            let status = r.status();
            let codes = codes_header(&r);
            (status, codes, r.bytes().await.unwrap())
        })
    };
    let running = spawn(s.clone());
    wait_metric(&c, &s, "onebit_running", |v| v == 1.0).await;
    let waiting = [spawn(s.clone()), spawn(s.clone())];
    let text = wait_metric(&c, &s, "onebit_queue_depth", |v| v == 2.0).await;
    assert_eq!(metric(&text, "onebit_running"), 1.0);

    // The next one is refused at once, with Retry-After; the health check still answers.
    let r = speak(&c, &s, &req).await;
    assert_eq!(header(&r, "retry-after"), "3");
    let msg = api_error(r, 429, None, Some("queue_full")).await;
    assert!(msg.contains("busy"), "{msg}");
    let h = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(h.status(), StatusCode::OK);
    let h: Value = h.json().await.unwrap();
    assert_eq!(
        (h["queue_depth"].as_u64(), h["running"].as_u64()),
        (Some(2), Some(1))
    );

    // Open the gate: all three admitted requests finish in full.
    gate.release();
    let samples = greedy_codes() * SAMPLES_PER_CODE;
    for job in std::iter::once(running).chain(waiting) {
        let (status, codes, bytes) = job.await.unwrap();
        assert_eq!(status, StatusCode::OK);
        assert_eq!(codes, greedy_codes());
        check_audio("wav", &bytes, 24_000, samples, 0);
    }
    // Each request left `running` before its answer was sent.
    let text = metrics_text(&c, &s).await;
    assert_eq!(metric(&text, "onebit_running"), 0.0);
    assert_eq!(metric(&text, "onebit_requests_total{status=\"429\"}"), 1.0);
    assert_eq!(metric(&text, "onebit_requests_total{status=\"200\"}"), 3.0);
    assert_eq!(metric(&text, "onebit_queue_depth"), 0.0);

    // A place is free again.
    let r = speak(&c, &s, &req).await;
    assert_eq!(r.status(), StatusCode::OK);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_timeout_answers_504_and_cancels_the_generation() {
    let (synth, gate) = gated_tiny();
    let cfg = ServerConfig {
        request_timeout: Duration::from_millis(1500),
        ..config()
    };
    let s = Server::start(synth, cfg).await;
    let c = client();

    // A is held inside the engine past its deadline, B waits behind it past its own: both 504.
    let a = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move { speak(&c, &s, &body(json!({"response_format": "wav"}))).await })
    };
    wait_metric(&c, &s, "onebit_running", |v| v == 1.0).await;
    let b = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move { speak(&c, &s, &body(json!({"response_format": "wav"}))).await })
    };
    for r in [a.await.unwrap(), b.await.unwrap()] {
        let msg = api_error(r, 504, None, Some("timeout")).await;
        assert!(msg.contains("1.500 s"), "{msg}");
    }
    // A's generation was cancelled at its deadline (B's too if it reached the engine before its
    // own); none ran to the end.
    let text = metrics_text(&c, &s).await;
    let cancelled = metric(&text, "onebit_generations_cancelled_total");
    assert!((1.0..=2.0).contains(&cancelled), "{text}");
    assert_eq!(metric(&text, "onebit_generations_total"), cancelled);
    assert_eq!(metric(&text, "onebit_codes_generated_total"), 0.0);
    assert_eq!(metric(&text, "onebit_requests_total{status=\"504\"}"), 2.0);

    // A stream past its deadline ends with an error event instead of speech.audio.done.
    let r = speak(
        &c,
        &s,
        &body(json!({"response_format": "pcm", "stream_format": "sse"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let events = sse_events(&r.text().await.unwrap());
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error", "{events:?}");
    assert_eq!(last["error"]["code"], "timeout");
    assert!(events.iter().all(|e| e["type"] != "speech.audio.done"));

    // With the engine free, a request within the deadline goes through.
    gate.release();
    let r = speak(
        &c,
        &s,
        &body(json!({"response_format": "pcm", "max_new_tokens": 5})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.bytes().await.unwrap().len(), 5 * SAMPLES_PER_CODE * 2);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_cancels_its_generation() {
    let s = Server::start(tiny_random(), config()).await;
    let c = client();
    let long = 3_500;
    let mut r = speak(
        &c,
        &s,
        &json!({"model": "tiny-random", "voice": "test", "input": LONG_TEXT, "seed": 1,
                "response_format": "pcm", "stream_format": "audio", "max_new_tokens": long}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let first = r.chunk().await.unwrap().expect("first audio");
    assert!(!first.is_empty());
    drop(r);

    // The generation stops early and is counted as cancelled; its request then leaves
    // `running`, and last its drop reason is counted.
    let text = wait_metric(
        &c,
        &s,
        "onebit_requests_dropped_total{reason=\"client_gone_running\"}",
        |v| v == 1.0,
    )
    .await;
    assert_eq!(metric(&text, "onebit_generations_cancelled_total"), 1.0);
    assert_eq!(metric(&text, "onebit_running"), 0.0);
    let stopped_at = metric(&text, "onebit_codes_generated_total");
    assert!(
        stopped_at > 0.0 && stopped_at < long as f64,
        "cancelled after {stopped_at} of {long} codes"
    );

    // The next request runs, and it is the only thing generating codes now.
    let r = speak(
        &c,
        &s,
        &json!({"model": "tiny-random", "voice": "test", "input": TEXT, "seed": 2,
                "response_format": "wav", "max_new_tokens": 100}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let codes = codes_header(&r);
    check_audio(
        "wav",
        &r.bytes().await.unwrap(),
        24_000,
        codes * SAMPLES_PER_CODE,
        0,
    );
    let text = metrics_text(&c, &s).await;
    assert_eq!(
        metric(&text, "onebit_codes_generated_total"),
        stopped_at + codes as f64
    );
    assert_eq!(metric(&text, "onebit_generations_total"), 2.0);
    assert_eq!(metric(&text, "onebit_generations_cancelled_total"), 1.0);
    s.stop().await;
}

/// Polls (bounded) until a new TCP connection to `addr` is refused.
async fn wait_refused(addr: SocketAddr) {
    let start = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(start.elapsed() < WAIT, "{addr} still accepts connections");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_stream_finish_within_the_grace() {
    let (synth, gate) = gated_tiny();
    let s = Server::start(synth, config()).await;
    let c = client();
    let codes = greedy_codes();

    // A stream is in flight (headers sent, the engine held) when shutdown begins.
    let r = speak(
        &c,
        &s,
        &body(json!({"response_format": "pcm", "stream_format": "sse"})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    wait_metric(&c, &s, "onebit_running", |v| v == 1.0).await;
    s.trigger_shutdown();

    // No new connections; then the engine goes on and the stream finishes whole.
    wait_refused(s.addr).await;
    assert!(
        client().get(s.url("/health")).send().await.is_err(),
        "a new request must not be served"
    );
    assert!(!s.has_returned(), "serve_on waits for the in-flight stream");
    gate.release();
    let events = sse_events(&r.text().await.unwrap());
    let done = events.last().unwrap();
    assert_eq!(done["type"], "speech.audio.done", "{events:?}");
    assert_eq!(done["usage"]["output_tokens"].as_u64(), Some(codes as u64));
    let audio: usize = events
        .iter()
        .filter(|e| e["type"] == "speech.audio.delta")
        .map(|e| {
            base64::engine::general_purpose::STANDARD
                .decode(e["audio"].as_str().unwrap())
                .unwrap()
                .len()
        })
        .sum();
    assert_eq!(audio, codes * SAMPLES_PER_CODE * 2);
    s.join().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_what_is_still_in_flight_after_the_grace() {
    let (synth, gate) = gated_tiny();
    let cfg = ServerConfig {
        shutdown_grace: Duration::from_millis(300),
        ..config()
    };
    let s = Server::start(synth, cfg).await;
    let c = client();

    // A streams (held in the engine), B waits for the engine.
    let a = speak(
        &c,
        &s,
        &body(json!({"response_format": "pcm", "stream_format": "sse"})),
    )
    .await;
    assert_eq!(a.status(), StatusCode::OK);
    wait_metric(&c, &s, "onebit_running", |v| v == 1.0).await;
    let b = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move { speak(&c, &s, &body(json!({"response_format": "wav"}))).await })
    };
    wait_metric(&c, &s, "onebit_queue_depth", |v| v == 1.0).await;

    let started = Instant::now();
    s.trigger_shutdown();
    // The gate never opens: after the grace both are cancelled.
    let events = sse_events(&a.text().await.unwrap());
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error", "{events:?}");
    assert_eq!(last["error"]["code"], "shutting_down");
    assert!(events.iter().all(|e| e["type"] != "speech.audio.done"));
    api_error(b.await.unwrap(), 503, None, Some("shutting_down")).await;
    s.join().await;
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "not before the grace"
    );
    gate.release();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_engine_answers_503_and_the_server_stays_up() {
    for panics in [false, true] {
        let s = Server::start(tiny_with(|_| Box::new(BrokenEngine { panics })), config()).await;
        let c = client();
        let what = if panics { "panic" } else { "error" };

        let r = speak(&c, &s, &body(json!({"response_format": "wav"}))).await;
        let msg = api_error(r, 503, None, Some("engine_unavailable")).await;
        eprintln!("engine {what}: {msg}");
        if !panics {
            assert!(msg.contains("simulated device failure"), "{msg}");
        }
        // A stream that fails after its start ends with an error event.
        let r = speak(
            &c,
            &s,
            &body(json!({"response_format": "pcm", "stream_format": "sse"})),
        )
        .await;
        assert_eq!(r.status(), StatusCode::OK);
        let events = sse_events(&r.text().await.unwrap());
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["type"], "error");
        assert_eq!(events[0]["error"]["code"], "engine_unavailable");
        // A raw stream is aborted, so no client takes it for a whole file: the connection
        // closes inside the body, or before the head when the failure came before hyper wrote
        // it (after a panic the scheduler refuses at once, so either can happen).
        let sent = c
            .post(s.url("/v1/audio/speech"))
            .json(&body(
                json!({"response_format": "pcm", "stream_format": "audio"}),
            ))
            .send()
            .await;
        match sent {
            Ok(r) => {
                assert_eq!(r.status(), StatusCode::OK);
                assert!(
                    r.bytes().await.is_err(),
                    "a failed raw stream must not end cleanly"
                );
            }
            Err(e) => assert!(e.is_request() && !e.is_timeout(), "{e}"),
        }

        // Still answering, and still refusing cleanly (after a panic the engine stays poisoned).
        let h = c.get(s.url("/health")).send().await.unwrap();
        assert_eq!(h.status(), StatusCode::OK);
        let r = speak(&c, &s, &body(json!({"response_format": "wav"}))).await;
        api_error(r, 503, None, Some("engine_unavailable")).await;
        let text = metrics_text(&c, &s).await;
        assert_eq!(metric(&text, "onebit_requests_total{status=\"503\"}"), 2.0);
        assert_eq!(metric(&text, "onebit_running"), 0.0);
        // A panic ends the scheduler with nothing counted in it.
        assert_eq!(metric(&text, "onebit_batch_size"), 0.0);
        s.stop().await;
    }
}

// ---- Load ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_200_requests_from_32_clients_get_200_or_429_and_never_mix_bytes() {
    const SEEDS: u64 = 8;
    const REQUESTS: usize = 200;
    const CLIENTS: usize = 32;
    let started = Instant::now();
    let cfg = ServerConfig {
        queue_depth: 4,
        ..config()
    };
    // The chain package: a take is exact in a batch too (on the random package one row and
    // several round differently: tests/batching.rs); each "seed" also asks its own length, so the
    // takes differ.
    // Its own synthesizer: the metrics below are this test's alone.
    let own = Arc::new(Synthesizer::load(&synth_config("tiny")).expect("load tiny"));
    let s = Server::start(own, cfg).await;
    let c = client();
    let req = |seed: u64| {
        json!({"model": "tiny", "voice": "test", "input": TEXT, "seed": seed,
               "response_format": "wav", "max_new_tokens": 40 + 7 * seed, "temperature": 0})
    };

    // The reference take of each seed, one request at a time.
    let mut refs = Vec::new();
    for seed in 0..SEEDS {
        let r = speak(&c, &s, &req(seed)).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "x-onebit-seed"), seed.to_string());
        let codes = codes_header(&r);
        let bytes = r.bytes().await.unwrap();
        check_audio("wav", &bytes, 24_000, codes * SAMPLES_PER_CODE, 0);
        refs.push((codes, bytes));
    }
    let distinct: std::collections::HashSet<_> = refs.iter().map(|r| &r.1).collect();
    assert_eq!(
        distinct.len(),
        SEEDS as usize,
        "seeds must give distinct takes"
    );
    let refs = Arc::new(refs);

    let next = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(CLIENTS));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (s, next, barrier, refs) = (s.clone(), next.clone(), barrier.clone(), refs.clone());
        let c = client();
        clients.push(tokio::spawn(async move {
            barrier.wait().await;
            let (mut ok, mut busy) = (0usize, 0usize);
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= REQUESTS {
                    return (ok, busy);
                }
                let seed = i as u64 % SEEDS;
                let r = speak(&c, &s, &req(seed)).await;
                match r.status().as_u16() {
                    200 => {
                        let (codes, bytes) = &refs[seed as usize];
                        assert_eq!(codes_header(&r), *codes, "request {i} seed {seed}");
                        let body = r.bytes().await.unwrap();
                        assert!(
                            body == bytes,
                            "request {i} (seed {seed}): {} bytes differ from its reference take",
                            body.len()
                        );
                        ok += 1;
                    }
                    429 => {
                        let retry: u64 = header(&r, "retry-after").parse().unwrap();
                        assert_eq!(retry, 1);
                        api_error(r, 429, None, Some("queue_full")).await;
                        busy += 1;
                        // A well-behaved client honours Retry-After; without it the clients that
                        // got a place would resend at once and the rest would only ever see 429.
                        tokio::time::sleep(Duration::from_secs(retry)).await;
                    }
                    other => panic!("request {i}: status {other}: {}", r.text().await.unwrap()),
                }
            }
        }));
    }
    let (mut ok, mut busy) = (0, 0);
    for h in clients {
        let (o, b) = h.await.unwrap();
        ok += o;
        busy += b;
    }
    eprintln!(
        "load: {ok} x 200, {busy} x 429 of {REQUESTS} requests from {CLIENTS} clients; {:.1} s in all",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(ok + busy, REQUESTS);
    assert!(ok >= CLIENTS.min(5), "only {ok} requests got through");
    assert!(busy > 0, "a queue of 4 must turn some of 32 clients away");

    let h = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(h.status(), StatusCode::OK);
    // Every request left `running` (and the batch) before its answer was sent.
    let text = metrics_text(&c, &s).await;
    assert_eq!(metric(&text, "onebit_running"), 0.0);
    assert_eq!(metric(&text, "onebit_queue_depth"), 0.0);
    assert_eq!(
        metric(&text, "onebit_requests_total{status=\"200\"}"),
        (ok + SEEDS as usize) as f64
    );
    assert_eq!(
        metric(&text, "onebit_requests_total{status=\"429\"}"),
        busy as f64
    );
    assert_eq!(metric(&text, "onebit_generations_cancelled_total"), 0.0);
    // The requests ran side by side in the scheduler's batch, and every one of them is in the
    // per-stream rate histogram.
    assert_eq!(metric(&text, "onebit_batch_places"), 4.0);
    assert_eq!(metric(&text, "onebit_batch_size"), 0.0);
    let steps = metric(&text, "onebit_decode_steps_total");
    let rows = metric(&text, "onebit_decode_step_sequences_total");
    assert!(
        steps > 0.0 && rows / steps > 1.0,
        "mean batch {:.2} over {steps} steps",
        rows / steps
    );
    // Not batch-invariant: no step was padded.
    assert_eq!(metric(&text, "onebit_decode_pad_rows_total"), 0.0);
    // Every request after the first found voice `test`'s prefix in the cache (a request is
    // admitted only once the one before it is prefilled, which kept that prefix).
    assert!(metric(&text, "onebit_prompt_cached_tokens_total") > 0.0);
    assert_eq!(
        metric(&text, "onebit_stream_codes_per_second_count"),
        metric(&text, "onebit_generations_total")
    );
    assert_eq!(
        metric(&text, "onebit_stream_codes_per_second_bucket{le=\"+Inf\"}"),
        (ok + SEEDS as usize) as f64
    );
    // Still serving.
    let r = speak(&c, &s, &req(0)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.bytes().await.unwrap() == refs[0].1);
    s.stop().await;
}

// ---- Network safety: keys, Host, CORS, connections, timeouts, shutdown ----

/// A raw HTTP/1.1 exchange on a fresh connection: the whole answer as text (the request asks the
/// server to close after answering).
async fn raw(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, s.read_to_end(&mut out))
        .await
        .expect("the server answers and closes")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

const KEY: &str = "sk-test-0123456789";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_guard_every_route_but_health() {
    let cfg = ServerConfig {
        api_keys: vec!["sk-other".into(), KEY.into()],
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let c = client();
    let req = body(json!({"response_format": "pcm", "max_new_tokens": 5}));
    let expected = json!({"error": {
        "message": "missing or incorrect API key: send it as 'Authorization: Bearer KEY'",
        "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}});
    let mut refused = 0;
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer sk-test-012345678"),
        Some(KEY),
    ] {
        for (method, path) in [
            ("POST", "/v1/audio/speech"),
            ("GET", "/v1/models"),
            ("GET", "/v1/audio/voices"),
            ("GET", "/metrics"),
            ("GET", "/nope"),
        ] {
            let mut b = c.request(method.parse().unwrap(), s.url(path));
            if method == "POST" {
                b = b.json(&req);
            }
            if let Some(a) = auth {
                b = b.header("authorization", a);
            }
            let r = b.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{auth:?} {path}");
            assert_eq!(
                r.json::<Value>().await.unwrap(),
                expected,
                "{auth:?} {path}"
            );
            refused += 1;
        }
    }
    // /health needs no key; the right key opens everything.
    let r = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let r = c
        .post(s.url("/v1/audio/speech"))
        .bearer_auth(KEY)
        .json(&req)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.bytes().await.unwrap().len(), 5 * SAMPLES_PER_CODE * 2);
    let r = c
        .get(s.url("/metrics"))
        .bearer_auth("sk-other")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.unwrap();
    assert_eq!(
        metric(
            &text,
            "onebit_requests_rejected_total{reason=\"invalid_api_key\"}"
        ),
        refused as f64
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_header_must_name_this_server() {
    let cfg = ServerConfig {
        allowed_hosts: vec!["tts.lan".into()],
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let port = s.addr.port();
    for host in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        "[::1]:9".to_string(),
        "localhost".to_string(),
        format!("tts.lan:{port}"),
    ] {
        let a = raw(
            s.addr,
            &format!("GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(a.starts_with("HTTP/1.1 200 "), "{host}: {a}");
    }
    // DNS rebinding: a name that resolves here but is not ours.
    for host in [
        "evil.example",
        "evil.example:8880",
        "192.168.1.9",
        "tts.lan.evil",
    ] {
        let a = raw(
            s.addr,
            &format!("GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert!(a.starts_with("HTTP/1.1 400 "), "{host}: {a}");
        let body: Value = serde_json::from_str(a.split("\r\n\r\n").nth(1).unwrap()).unwrap();
        assert_eq!(
            body,
            json!({"error": {"message": format!("Host {host:?} is not this server's address; add it with --allowed-host if it is"),
                "type": "invalid_request_error", "param": null, "code": "invalid_host"}})
        );
    }
    let text = metrics_text(&client(), &s).await;
    assert_eq!(
        metric(
            &text,
            "onebit_requests_rejected_total{reason=\"invalid_host\"}"
        ),
        4.0
    );
    s.stop().await;
}

fn preflight(c: &Client, s: &Server, origin: &str) -> reqwest::RequestBuilder {
    c.request(reqwest::Method::OPTIONS, s.url("/v1/audio/speech"))
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default_and_answers_preflights_for_named_origins() {
    let c = client();
    // Off: no CORS header at all, so a browser page elsewhere cannot read or preflight.
    let s = Server::start(tiny(), config()).await;
    let r = preflight(&c, &s, "http://app.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(r.headers().get("access-control-allow-origin").is_none());
    s.stop().await;

    let cfg = ServerConfig {
        cors_origins: vec!["http://app.example".into()],
        api_keys: vec![KEY.into()],
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    // The preflight carries no key and needs none.
    let r = preflight(&c, &s, "http://app.example")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        "http://app.example"
    );
    assert_eq!(
        header(&r, "access-control-allow-methods"),
        "GET,POST,DELETE"
    );
    assert_eq!(
        header(&r, "access-control-allow-headers"),
        "authorization,content-type"
    );
    assert_eq!(header(&r, "access-control-max-age"), "600");
    let r = preflight(&c, &s, "http://evil.example")
        .send()
        .await
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
    // The real request from the named origin gets the header and may read ours.
    let r = c
        .post(s.url("/v1/audio/speech"))
        .header("origin", "http://app.example")
        .bearer_auth(KEY)
        .json(&body(
            json!({"response_format": "pcm", "max_new_tokens": 5}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        header(&r, "access-control-allow-origin"),
        "http://app.example"
    );
    assert!(header(&r, "access-control-expose-headers").contains("x-onebit-codes"));
    s.stop().await;
}

/// Raises this process's open-file limit to its hard limit (both ends of every test connection
/// live here).
fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit on a struct we own.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut l), 0);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_thousands_of_idle_connections_are_open() {
    const IDLE: usize = 2_000;
    let limit = raise_fd_limit();
    assert!(
        limit > 2 * IDLE as u64 + 200,
        "open-file limit {limit} too low"
    );
    // The idle ones, the one keep-alive connection this test asks on, and one more. The test
    // asks over its own connection: a pooling client may open a second one whenever its first
    // is not back in the pool yet, which would make the count depend on timing.
    let cfg = ServerConfig {
        max_connections: IDLE + 2,
        header_timeout: Duration::from_secs(120),
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let mut mon = KeepAlive::open(s.addr).await;
    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        // Half of them with half a request head: slow clients, not only silent ones.
        if i % 2 == 0 {
            use tokio::io::AsyncWriteExt;
            let mut conn = conn;
            conn.write_all(b"GET /health HTTP/1.1\r\nHost: loc")
                .await
                .unwrap();
            idle.push(conn);
        } else {
            idle.push(conn);
        }
    }
    mon.wait_open(|v| v == (IDLE + 1) as f64).await;
    let start = Instant::now();
    let (status, _) = tokio::time::timeout(Duration::from_secs(2), mon.get("/health"))
        .await
        .expect("/health within 2 s");
    assert_eq!(status, 200);
    eprintln!(
        "/health with {IDLE} idle connections open: {:.1} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    // The last place, then over the limit: a 503 at once, and the connection closes.
    let extra = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    mon.wait_open(|v| v == (IDLE + 2) as f64).await;
    let a = raw(s.addr, "").await;
    assert!(a.starts_with("HTTP/1.1 503 Service Unavailable\r\n"), "{a}");
    let body: Value = serde_json::from_str(a.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections", "{body}");
    drop(extra);
    drop(idle);
    let text = mon.wait_open(|v| v == 1.0).await;
    assert_eq!(
        metric(
            &text,
            "onebit_requests_rejected_total{reason=\"too_many_connections\"}"
        ),
        1.0
    );
    drop(mon);
    s.stop().await;
}

/// One HTTP/1.1 keep-alive connection of the test's own, so it knows exactly how many
/// connections it holds.
struct KeepAlive {
    conn: tokio::net::TcpStream,
}

impl KeepAlive {
    async fn open(addr: SocketAddr) -> Self {
        Self {
            conn: tokio::net::TcpStream::connect(addr).await.unwrap(),
        }
    }

    /// GETs `path`; the status and the body (read to its Content-Length).
    async fn get(&mut self, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        self.conn.write_all(req.as_bytes()).await.unwrap();
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            let n = self.conn.read(&mut byte).await.unwrap();
            assert_eq!(n, 1, "the server closed the connection mid-head");
            buf.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&buf).into_owned();
        let status: u16 = head[9..12].parse().unwrap();
        let len: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no content-length in {head}"));
        let mut body = vec![0u8; len];
        self.conn.read_exact(&mut body).await.unwrap();
        (status, String::from_utf8(body).unwrap())
    }

    /// Polls /metrics (bounded) until onebit_connections_open satisfies `ok`; the text then.
    async fn wait_open(&mut self, ok: impl Fn(f64) -> bool) -> String {
        let start = Instant::now();
        loop {
            let (status, text) = self.get("/metrics").await;
            assert_eq!(status, 200);
            if ok(metric(&text, "onebit_connections_open")) {
                return text;
            }
            assert!(
                start.elapsed() < WAIT,
                "onebit_connections_open never reached the expected value; last metrics:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_header_client_is_closed_at_the_header_timeout() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cfg = ServerConfig {
        header_timeout: Duration::from_millis(400),
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let started = Instant::now();
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let n = tokio::time::timeout(WAIT, conn.read_to_end(&mut buf))
        .await
        .expect("closed by the server");
    let waited = started.elapsed();
    // hyper closes without an answer: the head never ended, so there is nothing to answer.
    assert_eq!(n.unwrap(), 0);
    assert!(
        waited >= Duration::from_millis(400) && waited < Duration::from_secs(5),
        "closed after {waited:?}"
    );
    // A keep-alive connection idle after its answer is closed the same way.
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(WAIT, conn.read_to_end(&mut buf))
        .await
        .expect("closed by the server")
        .unwrap();
    assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 200 "));
    let text = metrics_text(&client(), &s).await;
    assert_eq!(
        metric(
            &text,
            "onebit_connections_closed_total{reason=\"header_timeout\"}"
        ),
        2.0
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_idle_connections_at_once() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let cfg = ServerConfig {
        shutdown_grace: Duration::from_secs(30),
        header_timeout: Duration::from_secs(60),
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let c = client();
    // Silent, half-sent and kept-alive (after an answer) connections.
    let mut conns = Vec::new();
    for i in 0..30 {
        let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
        if i % 3 == 1 {
            conn.write_all(b"GET /health HTTP/1.1\r\nHo").await.unwrap();
        }
        if i % 3 == 2 {
            conn.write_all(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 12];
            conn.read_exact(&mut buf).await.unwrap();
            assert_eq!(&buf, b"HTTP/1.1 200");
        }
        conns.push(conn);
    }
    let r = c.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    wait_metric(&c, &s, "onebit_connections_open", |v| v >= 31.0).await;
    let started = Instant::now();
    s.stop().await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "shutdown took {took:?} with idle connections"
    );
    eprintln!(
        "shutdown with 31 idle connections: {:.0} ms",
        took.as_secs_f64() * 1e3
    );
    for mut conn in conns {
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(WAIT, conn.read_to_end(&mut rest))
            .await
            .expect("closed");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_queue_leavers_timeouts_and_rejections_by_reason() {
    let (synth, gate) = gated_tiny();
    let cfg = ServerConfig {
        queue_depth: 1,
        ..config()
    };
    let s = Server::start(synth, cfg).await;
    let c = client();
    let req = body(json!({"response_format": "wav"}));
    let running = {
        let (c, s, req) = (c.clone(), s.clone(), req.clone());
        tokio::spawn(async move { speak(&c, &s, &req).await.status() })
    };
    wait_metric(&c, &s, "onebit_running", |v| v == 1.0).await;
    // A waiting request whose client gives up leaves the queue and is counted.
    let leaver = {
        let (c, s, req) = (c.clone(), s.clone(), req.clone());
        tokio::spawn(async move { speak(&c, &s, &req).await })
    };
    wait_metric(&c, &s, "onebit_queue_depth", |v| v == 1.0).await;
    // The queue is full now: a rejection.
    api_error(speak(&c, &s, &req).await, 429, None, Some("queue_full")).await;
    leaver.abort();
    let text = wait_metric(
        &c,
        &s,
        "onebit_requests_dropped_total{reason=\"client_gone_queued\"}",
        |v| v == 1.0,
    )
    .await;
    assert_eq!(metric(&text, "onebit_queue_depth"), 0.0);
    // A refusal of validation.
    api_error(
        speak(&c, &s, &body(json!({"speed": 9}))).await,
        400,
        Some("speed"),
        Some("invalid_value"),
    )
    .await;
    gate.release();
    assert_eq!(running.await.unwrap(), StatusCode::OK);
    // A deadline passed while running.
    let s2 = Server::start(
        gated_tiny().0,
        ServerConfig {
            request_timeout: Duration::from_millis(300),
            ..config()
        },
    )
    .await;
    api_error(speak(&c, &s2, &req).await, 504, None, Some("timeout")).await;
    let text2 = metrics_text(&c, &s2).await;
    assert_eq!(
        metric(
            &text2,
            "onebit_requests_dropped_total{reason=\"timeout_running\"}"
        ),
        1.0
    );
    s2.stop().await;

    let text = metrics_text(&c, &s).await;
    for (name, v) in [
        ("onebit_requests_rejected_total{reason=\"queue_full\"}", 1.0),
        (
            "onebit_requests_rejected_total{reason=\"invalid_request\"}",
            1.0,
        ),
        (
            "onebit_requests_rejected_total{reason=\"invalid_api_key\"}",
            0.0,
        ),
        (
            "onebit_requests_dropped_total{reason=\"client_gone_queued\"}",
            1.0,
        ),
        (
            "onebit_requests_dropped_total{reason=\"client_gone_running\"}",
            0.0,
        ),
    ] {
        assert_eq!(metric(&text, name), v, "{name}\n{text}");
        assert!(
            text.contains(&format!("{name} ")),
            "{name} is always exported"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_response_over_max_response_bytes_is_refused_and_a_stream_is_not() {
    // 0.1 MiB of 16-bit audio at 48 kHz: 50 codes (1 s at 24 kHz is 50 codes of 1,920 bytes).
    let cfg = ServerConfig {
        max_response_bytes: 96_000,
        ..config()
    };
    let s = Server::start(tiny_random(), cfg).await;
    let c = client();
    let long = json!({"model": "tiny-random", "voice": "test", "input": LONG_TEXT, "seed": 1,
        "response_format": "wav", "sample_rate": 48000, "max_new_tokens": 400});
    let msg = api_error(
        speak(&c, &s, &long).await,
        400,
        None,
        Some("response_too_large"),
    )
    .await;
    assert!(
        msg.contains("max_response_mb") && msg.contains("stream_format"),
        "{msg}"
    );
    let mut streamed = long.clone();
    streamed["stream_format"] = json!("audio");
    let r = speak(&c, &s, &streamed).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.bytes().await.unwrap().len() > 96_000);
    let text = metrics_text(&c, &s).await;
    assert_eq!(
        metric(
            &text,
            "onebit_requests_dropped_total{reason=\"response_too_large\"}"
        ),
        1.0
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_nobody_reads_frees_the_engine_at_the_request_timeout() {
    use tokio::io::AsyncWriteExt;
    // The write timeout is far away: only the request's deadline can stop this stream.
    let cfg = ServerConfig {
        request_timeout: Duration::from_millis(1500),
        write_timeout: Duration::from_secs(120),
        ..config()
    };
    let s = Server::start(tiny_random(), cfg).await;
    let c = client();
    let req = json!({"model": "tiny-random", "voice": "test", "input": LONG_TEXT, "seed": 1,
        "response_format": "pcm", "sample_rate": 48000, "speed": 0.5,
        "stream_format": "audio", "max_new_tokens": 3000})
    .to_string();
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(
        format!(
            "POST /v1/audio/speech HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{req}",
            req.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let text = wait_metric(
        &c,
        &s,
        "onebit_requests_dropped_total{reason=\"timeout_running\"}",
        |v| v == 1.0,
    )
    .await;
    assert_eq!(metric(&text, "onebit_running"), 0.0);
    assert!(
        metric(&text, "onebit_codes_generated_total") < 3000.0,
        "{text}"
    );
    // The engine is free for the next request.
    let r = speak(
        &c,
        &s,
        &body(json!({"response_format": "pcm", "max_new_tokens": 5})),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    drop(conn);
    s.stop().await;
}

// ---- Custom voices without what they need ----

/// A multipart/form-data body: text fields, then one file.
fn form(fields: &[(&str, &str)], file: Option<(&str, &[u8])>) -> (String, Vec<u8>) {
    let boundary = "onebit-test-boundary-5e8f";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    if let Some((name, bytes)) = file {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; \
                 filename=\"{name}.wav\"\r\nContent-Type: audio/wav\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(bytes);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// One second of a 16 kHz tone as WAV bytes.
fn tone_wav() -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::new(&mut out, spec).unwrap();
    for i in 0..16_000 {
        let x = (f64::from(i) * 2.0 * std::f64::consts::PI * 220.0 / 16_000.0).sin();
        w.write_sample((x * 10_000.0) as i16).unwrap();
    }
    w.finalize().unwrap();
    out.into_inner()
}

async fn post_form(c: &Client, s: &Server, path: &str, f: &(String, Vec<u8>)) -> Response {
    c.post(s.url(path))
        .header("content-type", &f.0)
        .body(f.1.clone())
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloning_without_a_store_or_an_encoder_says_what_to_configure() {
    let c = client();
    let wav = tone_wav();
    let voice_form = form(
        &[("name", "x"), ("consent", "cons_00"), ("transcript", "Hi.")],
        Some(("audio_sample", &wav)),
    );
    let consent_form = form(
        &[("name", "Ana"), ("language", "en-US")],
        Some(("recording", &wav)),
    );

    // No store: neither consents nor voices, and the voice list says why.
    let s = Server::start(tiny(), config()).await;
    let r = post_form(&c, &s, "/v1/audio/voices", &voice_form).await;
    let m = api_error(r, 501, None, Some("voice_store_not_configured")).await;
    assert!(m.contains("--voice-store"), "{m}");
    let r = post_form(&c, &s, "/v1/audio/voice_consents", &consent_form).await;
    api_error(r, 501, None, Some("voice_store_not_configured")).await;
    let v = get_json(&c, &s, "/v1/audio/voices").await;
    assert_eq!(v["cloning"]["available"], false, "{v}");
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"], json!([]));

    // A store but no encoder: consents work, voices answer 501 naming the flag.
    let store = common::tempdir("server-cloning");
    let cfg = ServerConfig {
        voice_store: Some(store.clone()),
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let r = post_form(&c, &s, "/v1/audio/voices", &voice_form).await;
    let m = api_error(r, 501, None, Some("encoder_not_configured")).await;
    assert!(m.contains("--encoder"), "{m}");
    let r = post_form(&c, &s, "/v1/audio/voice_consents", &consent_form).await;
    assert_eq!(r.status(), StatusCode::OK);
    let consent: Value = r.json().await.unwrap();
    assert_eq!(consent["object"], "audio.voice_consent");
    assert_eq!(consent["language"], "en-US");
    let id = consent["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("cons_"), "{id}");

    // Not multipart: 415. Another site's page: 403. Not audio: 400. No language: 400.
    let r = c
        .post(s.url("/v1/audio/voice_consents"))
        .json(&json!({"name": "Ana", "language": "en-US"}))
        .send()
        .await
        .unwrap();
    api_error(r, 415, None, Some("unsupported_media_type")).await;
    let r = c
        .post(s.url("/v1/audio/voice_consents"))
        .header("content-type", &consent_form.0)
        .header("origin", "http://elsewhere.example")
        .body(consent_form.1.clone())
        .send()
        .await
        .unwrap();
    api_error(r, 403, None, Some("cross_origin_upload")).await;
    let junk = form(
        &[("name", "Ana"), ("language", "en-US")],
        Some(("recording", b"not audio".repeat(50).as_slice())),
    );
    let r = post_form(&c, &s, "/v1/audio/voice_consents", &junk).await;
    api_error(r, 400, Some("recording"), Some("invalid_audio")).await;
    let nolang = form(&[("name", "Ana")], Some(("recording", &wav)));
    let r = post_form(&c, &s, "/v1/audio/voice_consents", &nolang).await;
    api_error(r, 400, Some("language"), Some("missing_required_parameter")).await;
    let klingon = form(
        &[("name", "Ana"), ("language", "tlh")],
        Some(("recording", &wav)),
    );
    let r = post_form(&c, &s, "/v1/audio/voice_consents", &klingon).await;
    api_error(r, 400, Some("language"), Some("invalid_value")).await;

    // Listed, then deleted, then gone.
    let list: Value = get_json(&c, &s, "/v1/audio/voice_consents").await;
    assert_eq!(list["data"].as_array().unwrap().len(), 1, "{list}");
    assert_eq!(
        (&list["first_id"], &list["has_more"]),
        (&json!(id), &json!(false))
    );
    let r = c
        .delete(s.url(&format!("/v1/audio/voice_consents/{id}")))
        .send()
        .await
        .unwrap();
    let d: Value = r.json().await.unwrap();
    assert_eq!(
        d,
        json!({"id": id, "object": "audio.voice_consent", "deleted": true})
    );
    let r = c
        .get(s.url(&format!("/v1/audio/voice_consents/{id}")))
        .send()
        .await
        .unwrap();
    api_error(r, 404, None, Some("consent_not_found")).await;
    assert_eq!(
        std::fs::read_dir(store.join("consents")).unwrap().count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_loads_without_a_key_and_no_other_site_may_frame_it() {
    let cfg = ServerConfig {
        api_keys: vec!["sk-page-test".into()],
        ..config()
    };
    let s = Server::start(tiny(), cfg).await;
    let c = client();
    let r = c.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header(&r, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&r, "x-frame-options"), "DENY");
    assert_eq!(
        header(&r, "content-security-policy"),
        "frame-ancestors 'none'"
    );
    let page = r.text().await.unwrap();
    assert!(page.contains("<title>onebit-tts</title>"), "{page}");
    // Everything the page calls still needs the key.
    let r = c.get(s.url("/v1/audio/voices")).send().await.unwrap();
    api_error(r, 401, None, Some("invalid_api_key")).await;
}

// ---- The front door: every transport through one admission ----

/// HTTP and Wyoming on one server share the front door: together they never run more than the
/// scheduler's places, and the queue bound counts the requests of both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_wyoming_share_the_places_and_the_queue_bound() {
    use onebit_tts::server::serve_listeners;
    use onebit_tts::server::wyoming::{read_event, write_event};
    use tokio::io::BufReader;

    let (synth, gate) = gated_tiny();
    assert_eq!(synth.max_batch(), 1, "the gated engine runs one at a time");
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let wyoming = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (http_addr, wy_addr) = (http.local_addr().unwrap(), wyoming.local_addr().unwrap());
    let cfg = ServerConfig {
        addr: http_addr,
        queue_depth: 1,
        ..config()
    };
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_listeners(
        Some(http),
        Some(wyoming),
        synth,
        cfg,
        async move {
            let _ = stopped.await;
        },
    ));
    let s = Arc::new(Server {
        addr: http_addr,
        stop: Mutex::new(Some(stop)),
        task: Mutex::new(Some(task)),
    });
    let c = client();
    let health = |c: Client, s: Arc<Server>| async move {
        let h: Value = c
            .get(s.url("/health"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (
            h["running"].as_u64().unwrap(),
            h["queue_depth"].as_u64().unwrap(),
        )
    };
    let wait_health = |want: (u64, u64)| {
        let (c, s) = (c.clone(), s.clone());
        async move {
            let start = Instant::now();
            loop {
                let got = health(c.clone(), s.clone()).await;
                if got == want {
                    return;
                }
                assert!(
                    start.elapsed() < WAIT,
                    "health never reached {want:?}: {got:?}"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };

    // One HTTP request takes the only place (held at the engine's gate).
    let running = {
        let (c, s) = (c.clone(), s.clone());
        tokio::spawn(async move {
            let r = speak(&c, &s, &body(json!({"response_format": "wav"}))).await;
            (r.status(), r.bytes().await.unwrap())
        })
    };
    wait_health((1, 0)).await;

    // A Wyoming request waits in the same line.
    let conn = tokio::net::TcpStream::connect(wy_addr).await.unwrap();
    let (read, mut write) = conn.into_split();
    let mut read = BufReader::new(read);
    write_event(
        &mut write,
        "synthesize",
        json!({"text": TEXT, "voice": {"name": "test"}}),
        &[],
    )
    .await
    .unwrap();
    wait_health((1, 1)).await;

    // The queue (depth 1) is full with Wyoming's request: HTTP is refused...
    let r = speak(&c, &s, &body(json!({"response_format": "wav"}))).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&r, "retry-after"), "1");
    // ...and so is a second Wyoming client, with an error event.
    let conn2 = tokio::net::TcpStream::connect(wy_addr).await.unwrap();
    let (read2, mut write2) = conn2.into_split();
    let mut read2 = BufReader::new(read2);
    write_event(&mut write2, "synthesize", json!({"text": TEXT}), &[])
        .await
        .unwrap();
    let refused = read_event(&mut read2).await.unwrap().unwrap();
    assert_eq!(refused.kind, "error");
    assert_eq!(refused.data["code"], "busy", "{:?}", refused.data);
    let metrics = metrics_text(&c, &s).await;
    assert_eq!(metric(&metrics, "onebit_running"), 1.0);
    assert_eq!(metric(&metrics, "onebit_queue_depth"), 1.0);

    // Released, both run, one after the other, and Wyoming's speaks whole.
    gate.release();
    let (status, wav) = running.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(wav.len() > 44);
    let mut kinds = Vec::new();
    let mut pcm = 0usize;
    loop {
        let ev = read_event(&mut read).await.unwrap().expect("an event");
        pcm += ev.payload.len();
        let end = ev.kind == "audio-stop" || ev.kind == "error";
        kinds.push(ev.kind);
        if end {
            break;
        }
    }
    assert_eq!(kinds.first().map(String::as_str), Some("audio-start"));
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("audio-stop"),
        "{kinds:?}"
    );
    assert!(
        pcm > 0 && pcm.is_multiple_of(SAMPLES_PER_CODE * 2),
        "{pcm} bytes"
    );
    wait_health((0, 0)).await;
    s.stop().await;
}

// ---- Timing with the audio ----

/// `"timing": true`: a whole response becomes JSON with the audio in base64 (the same bytes as
/// without timing) and the timing document, whose piece times are the code counts exactly, at
/// speed 2 and 48 kHz too; an SSE stream carries a `speech.timing` event after each piece's
/// audio; raw streamed audio refuses timing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timing_rides_with_whole_and_sse_responses() {
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let two_pieces = "The first sentence is here. [pause:0.5s] And the second one follows it.";
    for (speed, rate) in [(1.0f64, 24_000u32), (2.0, 48_000)] {
        let plain = body(
            json!({"input": two_pieces, "markup": true, "response_format": "wav",
            "speed": speed, "sample_rate": rate}),
        );
        let want = speak(&c, &s, &plain).await;
        assert_eq!(want.status(), StatusCode::OK);
        let want = want.bytes().await.unwrap();
        let mut timed = plain.clone();
        timed["timing"] = json!(true);
        let r = speak(&c, &s, &timed).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(header(&r, "content-type"), "application/json");
        let doc: Value = r.json().await.unwrap();
        let audio = base64::engine::general_purpose::STANDARD
            .decode(doc["audio"].as_str().unwrap())
            .unwrap();
        assert_eq!(audio, want, "the same audio with or without timing");
        assert_eq!(doc["content_type"], "audio/wav");
        let t = &doc["timing"];
        assert_eq!(t["words_estimated"], true);
        assert_eq!(t["sample_rate"], rate);
        let pieces = t["pieces"].as_array().unwrap();
        assert_eq!(pieces.len(), 2, "{t}");
        let secs = |v: &Value| v.as_f64().unwrap();
        for p in pieces {
            let codes = p["codes"].as_u64().unwrap() as f64;
            let span = secs(&p["end"]) - secs(&p["start"]);
            assert!((span - codes * 0.02 / speed).abs() < 1e-9, "{p}");
        }
        assert_eq!(secs(&pieces[0]["start"]), 0.0);
        // The markup pause lasts its time whatever the speed.
        let gap = secs(&pieces[1]["start"]) - secs(&pieces[0]["end"]);
        assert!((gap - 0.5).abs() < 1e-6, "gap {gap}");
        // The WAV holds the timeline's seconds (within a sample of the output rate per piece).
        let samples = (audio.len() - 44) / 2;
        let seconds = samples as f64 / f64::from(rate);
        assert!(
            (seconds - secs(&t["audio_seconds"])).abs() < 0.002,
            "{seconds} vs {t}"
        );
    }

    // SSE: a timing event after each piece's audio, before the done event.
    let sse = body(
        json!({"input": two_pieces, "markup": true, "response_format": "pcm",
        "stream_format": "sse", "timing": true}),
    );
    let r = speak(&c, &s, &sse).await;
    assert_eq!(r.status(), StatusCode::OK);
    let events = sse_events(&r.text().await.unwrap());
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let timings: Vec<usize> = kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| **k == "speech.timing")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(timings.len(), 2, "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"speech.audio.done"));
    assert!(
        kinds[..timings[0]].contains(&"speech.audio.delta"),
        "{kinds:?}"
    );
    assert_eq!(events[timings[1]]["piece"]["index"], 1);
    assert_eq!(events[timings[0]]["words_estimated"], true);
    // Without the opt-in, no timing event.
    let mut plain = sse.clone();
    plain["timing"] = Value::Null;
    let r = speak(&c, &s, &plain).await;
    let events = sse_events(&r.text().await.unwrap());
    assert!(events.iter().all(|e| e["type"] != "speech.timing"));

    // Raw streamed audio has nowhere to put it.
    let raw = body(json!({"stream_format": "audio", "response_format": "pcm", "timing": true}));
    let r = speak(&c, &s, &raw).await;
    api_error(r, 400, Some("timing"), Some("invalid_value")).await;
    s.stop().await;
}

/// A WebSocket session keeps its connection's place and count (`onebit_connections_open`) for as
/// long as it lives, though hyper hands the socket over at the upgrade; a browser page from
/// another origin is refused before the upgrade (a WebSocket has no CORS preflight).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_holds_its_connection_and_foreign_origins_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let s = Server::start(tiny(), config()).await;
    let c = client();
    let handshake = |origin: &str| {
        format!(
            "GET /v1/audio/speech/stream HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n{origin}\r\n"
        )
    };
    let head = |mut conn: tokio::net::TcpStream| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        while !got.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = conn.read(&mut buf).await.unwrap();
            assert!(
                n > 0,
                "closed before the head: {:?}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&buf[..n]);
        }
        (conn, String::from_utf8_lossy(&got).into_owned())
    };

    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(handshake("").as_bytes()).await.unwrap();
    let (mut conn, answer) = head(conn).await;
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    // A ping (masked, empty) answered by a pong: the session runs, the upgrade is over.
    conn.write_all(&[0x89, 0x80, 1, 2, 3, 4]).await.unwrap();
    let mut pong = [0u8; 2];
    conn.read_exact(&mut pong).await.unwrap();
    assert_eq!(pong, [0x8A, 0x00]);
    // The session and the connection that asks for the metrics.
    wait_metric(&c, &s, "onebit_connections_open", |v| v == 2.0).await;
    drop(conn);
    wait_metric(&c, &s, "onebit_connections_open", |v| v == 1.0).await;

    // Its own origin is let through; another is a 403 in the error shape.
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(handshake("Origin: http://localhost\r\n").as_bytes())
        .await
        .unwrap();
    let (conn, answer) = head(conn).await;
    assert!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    drop(conn);
    let mut conn = tokio::net::TcpStream::connect(s.addr).await.unwrap();
    conn.write_all(handshake("Origin: http://evil.example\r\n").as_bytes())
        .await
        .unwrap();
    let (_conn, answer) = head(conn).await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    // Not an upgrade at all: the error shape too.
    let r = c
        .get(s.url("/v1/audio/speech/stream"))
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    assert!((400..500).contains(&status), "{status}");
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        body["error"]["code"], "websocket_upgrade_required",
        "{body}"
    );
    s.stop().await;
}
