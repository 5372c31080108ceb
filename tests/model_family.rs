//! What a request may ask of the vendor's other models, end to end: emotions (NeuTTS-2E's input:
//! a BPE model that declares them) over HTTP, the WebSocket session and the CLI, refused where
//! the model has none; the model's own language as the default (a German Nano phonemizes German
//! without `language`); NeuTTS-2E's speakers as voices. The real server on loopback
//! (`server::serve_on`) with reqwest, a WebSocket spoken over a plain TCP stream, the CLI as a
//! child process; the packages are scripts/gen-test-models.sh's `tiny-emotion` (random weights:
//! another prompt is other codes) and its GGUF, and `tiny`.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use reqwest::Client;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use onebit_tts::server::{ServerConfig, serve_on};
use onebit_tts::synth::{SynthConfig, Synthesizer};

const TEXT: &str = "Hello there, this is a test.";
/// Codes per request: the random weights never say their end token, so every request stops here.
const CODES: u64 = 16;
const SPEAKERS: [&str; 4] = ["emily", "paul", "sophie", "steven"];

fn load(dir: PathBuf) -> Arc<Synthesizer> {
    Arc::new(
        Synthesizer::load(&SynthConfig {
            package_dir: dir,
            voice_dirs: vec![common::repo().join("voices")],
            ..SynthConfig::default()
        })
        .expect("load the package"),
    )
}

fn emotion_model() -> Arc<Synthesizer> {
    static S: OnceLock<Arc<Synthesizer>> = OnceLock::new();
    S.get_or_init(|| load(common::model("tiny-emotion")))
        .clone()
}

fn phoneme_model() -> Arc<Synthesizer> {
    static S: OnceLock<Arc<Synthesizer>> = OnceLock::new();
    S.get_or_init(|| load(common::model("tiny"))).clone()
}

/// The GGUF build of `tiny-emotion`: no config.json, so what it says comes from the GGUF.
fn emotion_gguf() -> PathBuf {
    let p = common::repo().join("models/tiny-emotion-gguf");
    assert!(
        p.join("model-f32.gguf").exists(),
        "{} is missing: run scripts/gen-test-models.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

struct Server {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

impl Server {
    async fn start(synth: Arc<Synthesizer>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let cfg = ServerConfig {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            ..ServerConfig::default()
        };
        tokio::spawn(serve_on(listener, synth, cfg, async move {
            let _ = stopped.await;
        }));
        Self {
            addr,
            stop: Some(stop),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

fn client() -> Client {
    Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

/// A seeded request of [`CODES`] codes as raw PCM, with `extra` merged in. Sampled, not greedy:
/// one token in the middle of a long reference moves the random model's logits a little, which
/// an argmax may not show but a draw does.
fn body(voice: &str, extra: Value) -> Value {
    let mut b = json!({"voice": voice, "input": TEXT, "seed": 7,
        "max_new_tokens": CODES, "response_format": "pcm"});
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b
}

/// The audio of a request that must succeed.
async fn audio(c: &Client, s: &Server, body: &Value) -> Vec<u8> {
    let r = c
        .post(s.url("/v1/audio/speech"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let bytes = r.bytes().await.unwrap();
    assert_eq!(status, 200, "{body}: {}", String::from_utf8_lossy(&bytes));
    assert_eq!(bytes.len() as u64, CODES * 480 * 2, "{body}");
    bytes.to_vec()
}

/// The status and JSON body of a request that must fail.
async fn refused(c: &Client, s: &Server, body: &Value) -> (u16, Value) {
    let r = c
        .post(s.url("/v1/audio/speech"))
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn get_json(c: &Client, s: &Server, path: &str) -> Value {
    c.get(s.url(path))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

fn emotion_error(message: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": "emotion",
        "code": "invalid_value"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emotions_are_listed_and_spoken_and_others_refused() {
    let s = Server::start(emotion_model()).await;
    let c = client();

    // Every id names the one loaded model, and each lists its emotions.
    let m = get_json(&c, &s, "/v1/models").await;
    let data = m["data"].as_array().unwrap();
    assert!(data.iter().any(|d| d["id"] == "tiny-emotion"), "{m}");
    for d in data {
        assert_eq!(d["emotions"], json!(["angry", "happy", "sad"]), "{d}");
        assert_eq!(d["input_format"], "bpe", "{d}");
        assert_eq!(d["language"], Value::Null, "{d}");
    }
    let one = get_json(&c, &s, "/v1/models/tiny-emotion").await;
    assert_eq!(one["emotions"], json!(["angry", "happy", "sad"]));

    // The emotion reaches the prompt: each is another take of the same seeded request, the
    // same emotion the same take, and "neutral" is no emotion at all.
    let plain = audio(&c, &s, &body("emily", json!({}))).await;
    let happy = audio(&c, &s, &body("emily", json!({"emotion": "happy"}))).await;
    let sad = audio(&c, &s, &body("emily", json!({"emotion": "sad"}))).await;
    assert!(happy != plain && sad != plain && happy != sad);
    assert!(audio(&c, &s, &body("emily", json!({"emotion": "happy"}))).await == happy);
    assert!(audio(&c, &s, &body("emily", json!({"emotion": "neutral"}))).await == plain);

    // One the model does not have is a 400 naming the field and the model's emotions; the
    // names are the model's own, case and all (as the vendor compares them).
    for bad in ["bored", "Happy"] {
        let (status, v) = refused(&c, &s, &body("emily", json!({"emotion": bad}))).await;
        assert_eq!(status, 400);
        assert_eq!(
            v,
            emotion_error(&format!(
                "the model tiny-emotion has no emotion \"{bad}\"; its emotions: angry, happy, \
                 sad (\"neutral\" means none)"
            ))
        );
    }
    let (status, v) = refused(&c, &s, &body("emily", json!({"emotion": 3}))).await;
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "invalid_type", "{v}");
}

/// NeuTTS-2E's four speakers are voices of the shipped store (the vendor's pre-encoded
/// references, from its wheel), and each speaks with an emotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_2e_speakers_are_voices() {
    let s = Server::start(emotion_model()).await;
    let c = client();
    let v = get_json(&c, &s, "/v1/audio/voices").await;
    for name in SPEAKERS {
        let entry = v["voices"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == name)
            .unwrap_or_else(|| panic!("{name} listed: {v}"));
        assert_eq!(entry["language"], "en-us");
        audio(&c, &s, &body(name, json!({"emotion": "angry"}))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_emotions_refuses_one() {
    let s = Server::start(phoneme_model()).await;
    let c = client();
    let m = get_json(&c, &s, "/v1/models").await;
    for d in m["data"].as_array().unwrap() {
        assert_eq!(d["emotions"], json!([]), "{d}");
        assert_eq!(d["input_format"], "phonemes", "{d}");
    }
    let (status, v) = refused(&c, &s, &body("dave", json!({"emotion": "happy"}))).await;
    assert_eq!(status, 400);
    assert_eq!(
        v,
        emotion_error(
            "the model tiny has no emotions (it reads phonemes; emotions are a BPE model's, \
             such as NeuTTS-2E); leave emotion out, or use \"neutral\""
        )
    );
    // "neutral" is the absence of one, which every model speaks.
    let plain = audio(&c, &s, &body("dave", json!({}))).await;
    assert!(audio(&c, &s, &body("dave", json!({"emotion": "neutral"}))).await == plain);
}

// ---- A WebSocket client over a plain TCP stream (RFC 6455: masked client frames). ----

struct Ws(std::net::TcpStream);

enum Frame {
    Text(String),
    Binary(usize),
    Close(u16),
}

impl Ws {
    fn connect(addr: SocketAddr) -> Self {
        let mut t = std::net::TcpStream::connect(addr).unwrap();
        t.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        write!(
            t,
            "GET /v1/audio/speech/stream HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\n\
             Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            t.read_exact(&mut b).unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        Self(t)
    }

    fn send(&mut self, v: &Value) {
        let payload = v.to_string().into_bytes();
        let mask = [0x12u8, 0x34, 0x56, 0x78];
        let mut f = vec![0x81u8];
        match payload.len() {
            n if n < 126 => f.push(0x80 | n as u8),
            n => {
                f.push(0x80 | 126);
                f.extend_from_slice(&(n as u16).to_be_bytes());
            }
        }
        f.extend_from_slice(&mask);
        f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.0.write_all(&f).unwrap();
    }

    fn recv(&mut self) -> Frame {
        let mut h = [0u8; 2];
        self.0.read_exact(&mut h).unwrap();
        let len = match h[1] & 0x7f {
            126 => {
                let mut l = [0u8; 2];
                self.0.read_exact(&mut l).unwrap();
                u64::from(u16::from_be_bytes(l))
            }
            127 => {
                let mut l = [0u8; 8];
                self.0.read_exact(&mut l).unwrap();
                u64::from_be_bytes(l)
            }
            n => u64::from(n),
        };
        let mut payload = vec![0u8; len as usize];
        self.0.read_exact(&mut payload).unwrap();
        match h[0] & 0x0f {
            1 => Frame::Text(String::from_utf8(payload).unwrap()),
            2 => Frame::Binary(payload.len()),
            8 => Frame::Close(u16::from_be_bytes([payload[0], payload[1]])),
            op => panic!("unexpected opcode {op}"),
        }
    }

    /// The JSON events and PCM bytes until the server closes, and the close code.
    fn until_close(&mut self) -> (Vec<Value>, usize, u16) {
        let (mut events, mut bytes) = (Vec::new(), 0);
        loop {
            match self.recv() {
                Frame::Text(t) => events.push(serde_json::from_str(&t).unwrap()),
                Frame::Binary(n) => bytes += n,
                Frame::Close(code) => return (events, bytes, code),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_session_takes_the_emotion() {
    let s = Server::start(emotion_model()).await;
    let addr = s.addr;
    tokio::task::spawn_blocking(move || {
        // The session's config carries it into every sentence.
        let mut ws = Ws::connect(addr);
        ws.send(
            &json!({"type": "session.update", "voice": "emily", "emotion": "happy",
            "seed": 7, "max_new_tokens": CODES}),
        );
        ws.send(&json!({"type": "input_text.append", "text": TEXT}));
        ws.send(&json!({"type": "input_text.done"}));
        let (events, bytes, code) = ws.until_close();
        assert_eq!(code, 1000, "{events:?}");
        assert_eq!(bytes as u64, CODES * 480 * 2, "{events:?}");
        assert_eq!(events.last().unwrap()["type"], "speech.done", "{events:?}");

        // One the model does not have ends the session with the same error as HTTP's.
        let mut ws = Ws::connect(addr);
        ws.send(&json!({"type": "session.update", "voice": "emily", "emotion": "bored"}));
        let (events, _, code) = ws.until_close();
        assert_eq!(code, 1007, "{events:?}");
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0]["type"], "error");
        assert_eq!(
            events[0]["error"],
            emotion_error(
                "the model tiny-emotion has no emotion \"bored\"; its emotions: angry, happy, \
                 sad (\"neutral\" means none)"
            )["error"]
        );
    })
    .await
    .unwrap();
}

// ---- The CLI. ----

fn prompt_ids(model: &Path, extra: &[&str]) -> Vec<u64> {
    let m = model.to_str().unwrap();
    let o = common::cli(
        &[
            &["prompt", "--model", m, "-v", "emily", "--json"],
            extra,
            &[TEXT],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", common::stderr(&o));
    let v: Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap())
        .collect()
}

#[test]
fn say_and_prompt_take_the_emotion() {
    let model = common::model("tiny-emotion");
    let happy = common::expect("tiny-emotion")["emotion_ids"]["happy"]
        .as_u64()
        .unwrap();
    // The emotion's token goes between the transcript and the text, as the vendor's template
    // puts it: exactly once, and not without it (nor for "neutral").
    let with = prompt_ids(&model, &["--emotion", "happy"]);
    assert_eq!(with.iter().filter(|&&i| i == happy).count(), 1);
    let without = prompt_ids(&model, &[]);
    assert!(!without.contains(&happy));
    assert_eq!(prompt_ids(&model, &["--emotion", "neutral"]), without);
    // The GGUF build says the same (its format and emotions from the GGUF's metadata alone).
    assert_eq!(prompt_ids(&emotion_gguf(), &["--emotion", "happy"]), with);

    let dir = common::tempdir("model-family-say");
    let out = dir.join("happy.wav");
    let say = |model: &Path, emotion: &str, extra: &[&str]| {
        common::cli(
            &[
                &[
                    "say",
                    "--model",
                    model.to_str().unwrap(),
                    "-v",
                    "emily",
                    "--emotion",
                    emotion,
                    "--temperature",
                    "0",
                    "--max-new-tokens",
                    "16",
                    "-o",
                    out.to_str().unwrap(),
                ],
                extra,
                &[TEXT],
            ]
            .concat(),
        )
    };
    let o = say(&model, "happy", &[]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(out.exists());
    // And on llama.cpp, from the GGUF.
    std::fs::remove_file(&out).unwrap();
    let o = say(&emotion_gguf(), "sad", &["--engine", "llama"]);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert!(out.exists());

    // Refused before anything is written, naming the model's emotions; exit status 1.
    std::fs::remove_file(&out).unwrap();
    let o = say(&model, "bored", &[]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        common::error_line(&o),
        "error: the model tiny-emotion has no emotion \"bored\"; its emotions: angry, happy, sad \
         (\"neutral\" means none)"
    );
    let o = say(&common::model("tiny"), "happy", &[]);
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(
        common::error_line(&o),
        "error: the model tiny has no emotions (it reads phonemes; emotions are a BPE model's, \
         such as NeuTTS-2E); leave emotion out, or use \"neutral\""
    );
    assert!(!out.exists());

    // `models check` says what the model has.
    let o = common::cli(&["models", "check", emotion_gguf().to_str().unwrap()]);
    let summary = common::stdout(&o);
    assert!(summary.contains("input format bpe"), "{summary}");
    assert!(
        summary.contains("emotions     angry, happy, sad"),
        "{summary}"
    );
}

// ---- The model's language. ----

/// `tiny-random` (a phoneme model whose codes follow its whole prompt) as a pulled German Nano
/// would be: the same package with the language record `models pull` writes for
/// `neuphonic/neutts-nano-german-q4-gguf`.
fn german_model() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = common::tempdir("model-family-de").join("tiny-de");
        common::copy_dir(&common::model("tiny-random"), &dir);
        onebit_tts::package::neuphonic::LanguageRecord::of_repo(
            "neuphonic/neutts-nano-german-q4-gguf",
        )
        .unwrap()
        .write(&dir)
        .unwrap();
        dir
    })
    .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_s_language_is_the_default() {
    let s = Server::start(load(german_model())).await;
    let c = client();
    let m = get_json(&c, &s, "/v1/models/tiny-de").await;
    assert_eq!(m["language"], "de", "{m}");
    // dave is an English voice: without `language` the German model still reads German, as
    // the vendor's phonemizer does; a request's own language wins.
    let german = "Guten Morgen, wie geht es Ihnen heute?";
    let req = |extra: Value| {
        let mut b = body("dave", extra);
        b["input"] = german.into();
        b
    };
    let default = audio(&c, &s, &req(json!({}))).await;
    assert!(audio(&c, &s, &req(json!({"language": "de"}))).await == default);
    assert!(audio(&c, &s, &req(json!({"language": "en-us"}))).await != default);
}

#[test]
fn the_cli_reads_the_model_s_language() {
    let dir = german_model();
    let prepared = |extra: &[&str]| {
        let o = common::cli(
            &[
                &[
                    "prompt",
                    "--model",
                    dir.to_str().unwrap(),
                    "-v",
                    "dave",
                    "--json",
                ],
                extra,
                &["Guten Morgen, wie geht es Ihnen?"],
            ]
            .concat(),
        );
        assert!(o.status.success(), "{}", common::stderr(&o));
        let v: Value = serde_json::from_str(&common::stdout(&o)).unwrap();
        v["prepared"].as_str().unwrap().to_owned()
    };
    let default = prepared(&[]);
    assert_eq!(default, prepared(&["--lang", "de"]));
    assert_ne!(default, prepared(&["--lang", "en-us"]));
    let o = common::cli(&["models", "check", dir.to_str().unwrap()]);
    assert!(
        common::stdout(&o).contains("language     de\n"),
        "{}",
        common::stdout(&o)
    );
}
