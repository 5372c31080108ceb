//! Server overhead per request, excluding the engine and the codec.
//!
//!     cargo bench --bench server [-- ROUNDS]
//!
//! Starts the real server (`server::serve_on`) in this process on loopback with the generated tiny
//! package (models/tiny; scripts/gen-test-models.sh makes it) and sends requests one at a time
//! with reqwest, with an API key set (every request carries it). Two measurements:
//!
//! * `refused late`: a request that passes every check but the last one the server makes (an
//!   unknown voice): HTTP both ways, body read, JSON parse, validation, the error body. No engine.
//! * `whole path`: a real synthesis of 25 codes (0.5 s of audio). The server reports each stage's
//!   time in `Server-Timing`; overhead = the client's wall time minus prefill, decode and codec
//!   (engine and codec), so it holds request parsing, admission and queueing, the hop to the
//!   blocking thread and back, encoding, the response and both HTTP sides. It is shown with and
//!   without the text front end (normalise + phonemise + tokenise), which is a synthesis stage of
//!   its own rather than server work.
//!
//! The engine and codec run with one intra-op thread (`ONEBIT_BENCH_THREADS` changes it), so
//! ONNX Runtime's spinning pool threads do not compete with the server's threads for the CPU.
//!
//! The target is under 2 ms per request. Without `--bench` (as `cargo test --benches` runs it)
//! the program exits at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onebit_tts::server::{ServerConfig, serve_on};
use onebit_tts::synth::{SynthConfig, Synthesizer};
use serde_json::json;

const TARGET_MS: f64 = 2.0;
/// The API key the server runs with in this benchmark.
const KEY: &str = "sk-bench-0123456789abcdef";

/// CPU time of the whole process (every thread, the client's too), in milliseconds.
fn process_cpu_ms() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
    ms(u.ru_utime) + ms(u.ru_stime)
}

struct Stats {
    name: String,
    ms: Vec<f64>,
}

impl Stats {
    fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ms: Vec::new(),
        }
    }
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.ms.clone();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    fn mean(&self) -> f64 {
        self.ms.iter().sum::<f64>() / self.ms.len() as f64
    }
    fn print(&self) {
        println!(
            "  {:<44} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            self.name,
            self.pct(0.0),
            self.pct(0.1),
            self.pct(0.5),
            self.mean(),
            self.pct(0.9),
            self.pct(0.99)
        );
    }
}

/// Milliseconds of each `name;dur=MS` entry of a Server-Timing header.
fn server_timing(h: &str, name: &str) -> f64 {
    h.split(',')
        .find_map(|e| {
            let (n, d) = e.trim().split_once(";dur=")?;
            (n == name).then(|| d.parse::<f64>().ok())?
        })
        .unwrap_or_else(|| panic!("no {name} in Server-Timing {h:?}"))
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("benches/server: run with `cargo bench --bench server`; nothing to do here");
        return;
    }
    let rounds: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(200);
    let root = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // One intra-op thread for the backbone and the codec: ONNX Runtime's pool threads spin for a
    // while after each run, and on a small machine that spinning takes the CPU from the server's
    // own threads, which is the engine's cost showing up as the server's.
    let threads = std::env::var("ONEBIT_BENCH_THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let cfg = SynthConfig {
        package_dir: root.join("models/tiny"),
        voice_dirs: vec![root.join("voices")],
        ort: onebit_tts::engine::OrtOptions {
            intra_threads: Some(threads),
            ..Default::default()
        },
        codec_threads: Some(threads),
        ..SynthConfig::default()
    };
    println!("engine and codec: {threads} intra-op thread(s) (ONEBIT_BENCH_THREADS)");
    let synth = Arc::new(Synthesizer::load(&cfg).expect("load models/tiny"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(synth, rounds));
}

/// Per-request samples of one response format (ms).
struct Format {
    name: &'static str,
    wall: Stats,
    engine_codec: Stats,
    front_end: Stats,
    encode: Stats,
    /// Wall minus engine, codec and front end: the server's work plus encoding.
    overhead: Stats,
    /// The same without encoding: parsing, admission, queueing, hand-offs, HTTP.
    server_only: Stats,
}

async fn run(synth: Arc<Synthesizer>, rounds: usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(
        listener,
        synth,
        // Keys on, as a server on a network runs: the key check is part of the overhead.
        ServerConfig {
            addr,
            api_keys: vec![KEY.into()],
            ..ServerConfig::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let mut auth = reqwest::header::HeaderMap::new();
    auth.insert(
        reqwest::header::AUTHORIZATION,
        format!("Bearer {KEY}").parse().unwrap(),
    );
    let client = reqwest::Client::builder()
        .no_proxy()
        .default_headers(auth)
        .build()
        .unwrap();
    let url = format!("http://{addr}/v1/audio/speech");
    let text = "Hello world, this is a test.";
    let body = |voice: &str, format: &str| {
        json!({"model": "tiny", "voice": voice, "input": text, "temperature": 0,
               "response_format": format, "max_new_tokens": 25})
    };

    // The refused requests first, before any synthesis has started ONNX Runtime (whose threads
    // would count in the process CPU time). The first 20 warm the connection up.
    let mut refused = Stats::new("refused late (unknown voice)");
    let mut refused_cpu = 0.0;
    for round in 0..rounds + 20 {
        let t = Instant::now();
        let c = process_cpu_ms();
        let r = client
            .post(&url)
            .json(&body("nobody", "wav"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 400);
        r.bytes().await.unwrap();
        if round >= 20 {
            refused.ms.push(t.elapsed().as_secs_f64() * 1e3);
            refused_cpu += process_cpu_ms() - c;
        }
    }

    let mut formats: Vec<Format> = ["wav", "pcm", "flac", "opus", "mp3"]
        .into_iter()
        .map(|name| Format {
            name,
            wall: Stats::new("wall"),
            engine_codec: Stats::new("engine + codec"),
            front_end: Stats::new("front end"),
            encode: Stats::new("encode"),
            overhead: Stats::new(&format!("{name}: overhead (encode included)")),
            server_only: Stats::new(&format!("{name}: overhead without encode")),
        })
        .collect();
    // Warm-up: the phonemizer, the sessions' first runs, each encoder.
    for _ in 0..5 {
        for f in &formats {
            let r = client
                .post(&url)
                .json(&body("test", f.name))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
            r.bytes().await.unwrap();
        }
    }
    for _ in 0..rounds {
        for f in &mut formats {
            let t = Instant::now();
            let r = client
                .post(&url)
                .json(&body("test", f.name))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
            let timing = r.headers()["server-timing"].to_str().unwrap().to_owned();
            assert!(!r.bytes().await.unwrap().is_empty());
            let wall = t.elapsed().as_secs_f64() * 1e3;
            let engine_codec = server_timing(&timing, "prefill")
                + server_timing(&timing, "decode")
                + server_timing(&timing, "codec");
            let front_end = server_timing(&timing, "front_end");
            let encode = server_timing(&timing, "encode");
            f.wall.ms.push(wall);
            f.engine_codec.ms.push(engine_codec);
            f.front_end.ms.push(front_end);
            f.encode.ms.push(encode);
            f.overhead.ms.push(wall - engine_codec - front_end);
            f.server_only
                .ms
                .push(wall - engine_codec - front_end - encode);
        }
    }

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "\nserver overhead per request, {rounds} rounds, {} build, {cpus} CPUs, load average {}",
        if cfg!(debug_assertions) {
            "dev"
        } else {
            "optimised"
        },
        load.join(" ")
    );
    println!("\nmedians per format (ms; each request makes 25 codes = 0.5 s of audio):");
    println!(
        "  {:<6} {:>9} {:>15} {:>10} {:>8} {:>10} {:>17}",
        "format", "wall", "engine + codec", "front end", "encode", "overhead", "without encode"
    );
    for f in &formats {
        println!(
            "  {:<6} {:>9.3} {:>15.3} {:>10.3} {:>8.3} {:>10.3} {:>17.3}",
            f.name,
            f.wall.pct(0.5),
            f.engine_codec.pct(0.5),
            f.front_end.pct(0.5),
            f.encode.pct(0.5),
            f.overhead.pct(0.5),
            f.server_only.pct(0.5)
        );
    }
    println!("\ndistributions (ms):");
    println!(
        "  {:<44} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "", "min", "p10", "p50", "mean", "p90", "p99"
    );
    refused.print();
    for f in &formats {
        f.overhead.print();
        f.server_only.print();
    }
    println!(
        "  {:<44} {:>8.3}   (every thread, the client's too)",
        "refused late: process CPU per request",
        refused_cpu / rounds as f64
    );

    // Overhead is the server's own work (parsing, admission, queueing, hand-offs, HTTP) plus
    // encoding; encoding grows with the audio, so it is judged both ways. On a machine busier
    // than its CPUs the medians include waiting for a CPU: the p10 line shows the cost itself.
    println!();
    for p in [0.5, 0.1] {
        let own = formats
            .iter()
            .map(|f| f.server_only.pct(p))
            .fold(refused.pct(p), f64::max);
        let verdict = |ms: f64| if ms < TARGET_MS { "within" } else { "OVER" };
        println!(
            "p{:.0}: server work without encoding, worst format: {own:.3} ms, {} the {TARGET_MS} ms target",
            p * 100.0,
            verdict(own)
        );
        for f in &formats {
            let o = f.overhead.pct(p);
            println!(
                "p{:.0}: {:<5} with its encoding: {o:.3} ms, {} the target",
                p * 100.0,
                f.name,
                verdict(o)
            );
        }
    }
    if load
        .first()
        .and_then(|l| l.parse::<f64>().ok())
        .is_some_and(|l| l >= cpus as f64)
    {
        println!("(the machine is busier than its CPUs: the p10 lines are the ones to read)");
    }

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}
