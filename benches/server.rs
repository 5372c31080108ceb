//! Server overhead per request, excluding the engine and the codec.
//!
//!     cargo bench --bench server [-- ROUNDS]
//!
//! Starts the real server (`server::serve_on`) in this process on loopback with the generated tiny
//! package (models/tiny; scripts/gen-test-models.sh makes it) and sends requests one at a time
//! with reqwest. Two measurements:
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
//! The target is under 2 ms per request. Without `--bench` (as `cargo test --benches` runs it)
//! the program exits at once.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use onebit_tts::server::{ServerConfig, serve_on};
use onebit_tts::synth::{SynthConfig, Synthesizer};
use serde_json::json;

const TARGET_MS: f64 = 2.0;

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
            "  {:<44} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
            self.name,
            self.mean(),
            self.pct(0.5),
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
    let cfg = SynthConfig {
        package_dir: root.join("models/tiny"),
        voice_dirs: vec![root.join("voices")],
        ..SynthConfig::default()
    };
    let synth = Arc::new(Synthesizer::load(&cfg).expect("load models/tiny"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run(synth, rounds));
}

async fn run(synth: Arc<Synthesizer>, rounds: usize) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(
        listener,
        synth,
        ServerConfig {
            addr,
            ..ServerConfig::default()
        },
        async move {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let url = format!("http://{addr}/v1/audio/speech");
    let text = "Hello world, this is a test.";

    let mut refused = Stats::new("refused late (unknown voice), wall");
    let mut refused_cpu = 0.0;
    let mut walls = Vec::new();
    for format in ["wav", "mp3"] {
        walls.push((
            format,
            Stats::new(&format!("{format}: wall")),
            Stats::new(&format!("{format}: engine + codec (server-timing)")),
            Stats::new(&format!("{format}: front end (server-timing)")),
            Stats::new(&format!("{format}: encode (server-timing)")),
            Stats::new(&format!("{format}: overhead, front end excluded")),
            Stats::new(&format!("{format}: overhead, front end included")),
            Stats::new(&format!("{format}:   of which in synthesize, untimed")),
            Stats::new(&format!("{format}:   of which outside synthesize")),
        ));
    }
    let body = |voice: &str, format: &str| {
        json!({"model": "tiny", "voice": voice, "input": text, "temperature": 0,
               "response_format": format, "max_new_tokens": 25})
    };

    // Warm-up: connections, the phonemizer, the sessions' first runs.
    for _ in 0..20 {
        for f in ["wav", "mp3"] {
            let r = client
                .post(&url)
                .json(&body("test", f))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
            r.bytes().await.unwrap();
        }
    }

    for _ in 0..rounds {
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
        refused.ms.push(t.elapsed().as_secs_f64() * 1e3);
        refused_cpu += process_cpu_ms() - c;

        for (format, wall, engine, front, encode, over, over_front, inside, outside) in &mut walls {
            let t = Instant::now();
            let r = client
                .post(&url)
                .json(&body("test", format))
                .send()
                .await
                .unwrap();
            assert!(r.status().is_success());
            let timing = r.headers()["server-timing"].to_str().unwrap().to_owned();
            let bytes = r.bytes().await.unwrap();
            assert!(!bytes.is_empty());
            let ms = t.elapsed().as_secs_f64() * 1e3;
            let e = server_timing(&timing, "prefill")
                + server_timing(&timing, "decode")
                + server_timing(&timing, "codec");
            let f = server_timing(&timing, "front_end");
            wall.ms.push(ms);
            engine.ms.push(e);
            front.ms.push(f);
            encode.ms.push(server_timing(&timing, "encode"));
            over.ms.push(ms - e - f);
            over_front.ms.push(ms - e);
            let total = server_timing(&timing, "total");
            let enc = server_timing(&timing, "encode");
            inside.ms.push(total - e - f - enc);
            outside.ms.push(ms - total);
        }
    }

    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "server overhead per request, {rounds} rounds, {} build, {} CPUs, load average {} (ms)",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "optimised"
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!(
        "  {:<44} {:>8} {:>8} {:>8} {:>8}",
        "", "mean", "p50", "p90", "p99"
    );
    refused.print();
    println!(
        "  {:<44} {:>8.3}   (CPU of every thread, client included: immune to a busy machine)",
        "refused late, process CPU per request",
        refused_cpu / rounds as f64
    );
    let mut worst: f64 = refused.pct(0.5);
    // Encoding grows with the audio: the requests here make 0.5 s of it.
    for (_, wall, engine, front, encode, over, over_front, inside, outside) in &walls {
        for s in [
            wall, engine, front, encode, over, over_front, inside, outside,
        ] {
            s.print();
        }
        worst = worst.max(over.pct(0.5));
    }
    println!(
        "median overhead (front end excluded) {worst:.3} ms: {} the {TARGET_MS} ms target",
        if worst < TARGET_MS { "within" } else { "OVER" }
    );

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), server)
        .await
        .expect("server stops")
        .unwrap()
        .unwrap();
}
