//! The lm_head speed levers of `onebit-tts models optimize`, measured: prefill time at several
//! prompt lengths and decode codes/s, for the original package, each lever alone and both, median
//! of n runs, and the peak RSS of each.
//!
//! ```text
//! cargo bench --bench levers -- --bench [--model models/real-shape] [--runs 3]
//!     [--lengths 128,512,2048] [--decode 32] [--threads N] [--json FILE]
//! ```
//!
//! Each variant lives in its own child process (so its peak RSS is its own); the parent asks them
//! in turn, one generation at a time, rotating the order every run, so a busy spell on a shared
//! machine hits every variant alike. Besides wall time it records the process CPU time of the
//! prefill and of each decode step, which contention inflates much less (with `--threads 1` there
//! is no thread pool spinning, so CPU time is the work done).
//!
//! The optimized variants are written once under target/levers/ (hard links to the model's data).
//! Without `--bench` (as under `cargo test --all-targets`) it exits at once.

use std::io::{BufRead, BufReader, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use onebit_tts::engine::{
    self, Backbone, CancelToken, Candidates, GenerationParams, KvMode, OrtBackbone, OrtOptions,
    SamplingParams,
};
use onebit_tts::package::optimize::{self, Levers};
use onebit_tts::package::{ModelPackage, SPEECH_CODES};
use serde_json::{Value, json};

const VARIANTS: [(&str, Option<Levers>); 4] = [
    ("original", None),
    (
        "last position",
        Some(Levers {
            last_position: true,
            speech_head: false,
        }),
    ),
    (
        "speech head",
        Some(Levers {
            last_position: false,
            speech_head: true,
        }),
    ),
    (
        "both",
        Some(Levers {
            last_position: true,
            speech_head: true,
        }),
    ),
];

struct Opts {
    model: PathBuf,
    runs: usize,
    lengths: Vec<usize>,
    decode: usize,
    threads: Option<usize>,
    json: Option<PathBuf>,
    child: Option<PathBuf>,
}

fn parse() -> Option<Opts> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--bench") {
        return None;
    }
    let mut o = Opts {
        model: PathBuf::from("models/real-shape"),
        runs: 3,
        lengths: vec![128, 512, 2048],
        decode: 32,
        threads: None,
        json: None,
        child: None,
    };
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--bench" => {}
            "--model" => o.model = val().into(),
            "--runs" => o.runs = val().parse().expect("--runs N"),
            "--lengths" => {
                o.lengths = val()
                    .split(',')
                    .map(|s| s.parse().expect("--lengths A,B,C"))
                    .collect()
            }
            "--decode" => o.decode = val().parse().expect("--decode N"),
            "--threads" => o.threads = Some(val().parse().expect("--threads N")),
            "--json" => o.json = Some(val().into()),
            "--child" => o.child = Some(val().into()),
            other => panic!("unknown argument {other}"),
        }
    }
    Some(o)
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s[s.len() / 2]
}

/// `VmHWM` (peak resident set) of this process, in MiB.
fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// User + system CPU time of this process (all threads).
fn cpu_time() -> Duration {
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// A prompt of exactly `len` tokens in the model's shape: text markers, then speech codes.
fn prompt(pkg: &ModelPackage, len: usize) -> Vec<u32> {
    let v = &pkg.vocab;
    let mut p = vec![v.text_prompt_start, v.text_prompt_end, v.generation_start];
    p.truncate(len);
    let codes = len - p.len();
    p.extend((0..codes as u32).map(|i| v.code_to_id(i.wrapping_mul(7919) % SPEECH_CODES)));
    p
}

/// One variant in this process. Prints a JSON line when loaded, then answers each line on stdin
/// (a prompt length) with one JSON line of timings; `quit` prints the peak RSS and ends.
fn child(o: &Opts, dir: &Path) {
    let t = Instant::now();
    let pkg = ModelPackage::load(dir, None).expect("package");
    let env = onebit_tts::runtime::environment(None).expect("onnx runtime");
    let opts = OrtOptions {
        intra_threads: o.threads,
        kv_mode: Some(KvMode::Growing),
        ..OrtOptions::default()
    };
    let mut b = OrtBackbone::load(env, &pkg, &opts).expect("backbone");
    let load_s = t.elapsed().as_secs_f64();
    let rss_loaded = peak_rss_mib();
    let engine = b.describe();
    let c = Candidates::of(&pkg);
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: o.decode,
        max_new_tokens: Some(o.decode),
    };
    // Times one generation; the first code's callback marks the end of the prefill.
    let mut generate = |p: &[u32]| {
        let (w0, c0) = (Instant::now(), cpu_time());
        let mut first = None;
        let g = engine::generate(&mut b, &c, p, &params, &CancelToken::new(), &mut |_| {
            first.get_or_insert((Instant::now(), cpu_time()));
            ControlFlow::Continue(())
        })
        .expect("generate");
        let (w2, c2) = (Instant::now(), cpu_time());
        let (w1, c1) = first.expect("at least one code");
        assert_eq!(g.codes.len(), o.decode);
        let steps = (o.decode - 1) as f64;
        json!({
            "prompt_tokens": p.len(),
            "prefill_ms": (w1 - w0).as_secs_f64() * 1000.0,
            "prefill_cpu_ms": (c1 - c0).as_secs_f64() * 1000.0,
            "decode_codes_per_s": steps / (w2 - w1).as_secs_f64(),
            "decode_cpu_ms_per_code": (c2 - c1).as_secs_f64() * 1000.0 / steps,
        })
    };
    generate(&prompt(&pkg, 16));
    let mut out = std::io::stdout().lock();
    let ready = json!({
        "engine": engine,
        "logits": pkg.logits.describe(pkg.genai.model.vocab_size),
        "load_s": load_s,
        "rss_after_load_mib": rss_loaded,
    });
    writeln!(out, "{ready}").unwrap();
    out.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("stdin");
        if line.trim() == "quit" {
            writeln!(out, "{}", json!({"peak_rss_mib": peak_rss_mib()})).unwrap();
            return;
        }
        let len: usize = line.trim().parse().expect("a prompt length");
        let r = generate(&prompt(&pkg, len));
        writeln!(out, "{r}").unwrap();
        out.flush().unwrap();
    }
}

struct Worker {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    info: Value,
    runs: Vec<Value>,
}

impl Worker {
    fn ask(&mut self, line: &str) -> Value {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
        read_json(&mut self.stdout, self.name)
    }
}

fn read_json(r: &mut impl BufRead, name: &str) -> Value {
    let mut s = String::new();
    r.read_line(&mut s).expect("child output");
    serde_json::from_str(&s).unwrap_or_else(|_| panic!("{name}: the child failed ({s:?})"))
}

fn main() {
    let Some(o) = parse() else {
        return;
    };
    if let Some(dir) = &o.child {
        child(&o, dir);
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let model = if o.model.is_absolute() {
        o.model.clone()
    } else {
        root.join(&o.model)
    };
    assert!(
        model.join("genai_config.json").exists(),
        "{} is missing: tools/gen_models.py --real-shape --out {}",
        model.display(),
        model.display()
    );
    let work = root.join("target/levers").join(
        model
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("model"),
    );
    let mut workers = Vec::new();
    for (name, levers) in VARIANTS {
        let dir = match levers {
            None => model.clone(),
            Some(l) => {
                let dir = work.join(name.replace(' ', "-"));
                if !dir.join("onebit_logits.json").exists() {
                    let _ = std::fs::remove_dir_all(&dir);
                    optimize::optimize(&model, &dir, l).expect("optimize");
                }
                dir
            }
        };
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.args(["--bench", "--child"])
            .arg(&dir)
            .args(["--decode", &o.decode.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(t) = o.threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        let mut child = cmd.spawn().expect("child");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let info = read_json(&mut stdout, name);
        eprintln!("{name}: {} loaded ({info})", dir.display());
        workers.push(Worker {
            name,
            child,
            stdin,
            stdout,
            info,
            runs: Vec::new(),
        });
    }
    let n = workers.len();
    for run in 0..o.runs {
        for &len in &o.lengths {
            for k in 0..n {
                let w = &mut workers[(k + run) % n];
                let r = w.ask(&len.to_string());
                eprintln!(
                    "  run {} {len:>5} tokens {:<14} prefill {:>7.0} ms ({:>7.0} cpu ms), decode {:>6.2} codes/s ({:>5.1} cpu ms/code)",
                    run + 1,
                    w.name,
                    r["prefill_ms"].as_f64().unwrap(),
                    r["prefill_cpu_ms"].as_f64().unwrap(),
                    r["decode_codes_per_s"].as_f64().unwrap(),
                    r["decode_cpu_ms_per_code"].as_f64().unwrap(),
                );
                w.runs.push(r);
            }
        }
    }
    let mut results = Vec::new();
    for w in &mut workers {
        let end = w.ask("quit");
        let _ = w.child.wait();
        let mut rows = Vec::new();
        for &len in &o.lengths {
            let of = |k: &str| -> Vec<f64> {
                w.runs
                    .iter()
                    .filter(|r| r["prompt_tokens"] == len)
                    .map(|r| r[k].as_f64().unwrap())
                    .collect()
            };
            let mut row = json!({"prompt_tokens": len});
            for k in [
                "prefill_ms",
                "prefill_cpu_ms",
                "decode_codes_per_s",
                "decode_cpu_ms_per_code",
            ] {
                row[k] = median(&of(k)).into();
                row[format!("{k}_runs")] = of(k).into();
            }
            rows.push(row);
        }
        results.push(json!({
            "variant": w.name,
            "engine": w.info["engine"],
            "logits": w.info["logits"],
            "load_s": w.info["load_s"],
            "rss_after_load_mib": w.info["rss_after_load_mib"],
            "peak_rss_mib": end["peak_rss_mib"],
            "lengths": rows,
        }));
    }
    print_tables(&o, &results);
    if let Some(path) = &o.json {
        let all = json!({
            "runs": o.runs,
            "decode_codes": o.decode,
            "threads": o.threads,
            "results": results,
        });
        std::fs::write(path, serde_json::to_string_pretty(&all).unwrap()).expect("--json");
    }
}

/// Medians with the ratio to the original: wall time, then CPU time.
fn print_tables(o: &Opts, results: &[Value]) {
    let base = &results[0];
    let cell = |v: &Value, i: usize, k: &str| v["lengths"][i][k].as_f64().unwrap();
    for (title, prefill, decode, decode_unit, higher_is_better) in [
        (
            "wall time",
            "prefill_ms",
            "decode_codes_per_s",
            "codes/s",
            true,
        ),
        (
            "CPU time (all threads)",
            "prefill_cpu_ms",
            "decode_cpu_ms_per_code",
            "cpu ms/code",
            false,
        ),
    ] {
        println!("\n{title}, median of {}\n", o.runs);
        let mut head = String::from("| variant |");
        let mut rule = String::from("|---|");
        for l in &o.lengths {
            head += &format!(" prefill {l} (ms) |");
            rule += "---:|";
        }
        for l in &o.lengths {
            head += &format!(" decode @{l} ({decode_unit}) |");
            rule += "---:|";
        }
        head += " peak RSS (MiB) |";
        rule += "---:|";
        println!("{head}\n{rule}");
        for r in results {
            let mut line = format!("| {} |", r["variant"].as_str().unwrap());
            for i in 0..o.lengths.len() {
                let (v, b) = (cell(r, i, prefill), cell(base, i, prefill));
                line += &format!(" {v:.0} ({:.2}x) |", b / v);
            }
            for i in 0..o.lengths.len() {
                let (v, b) = (cell(r, i, decode), cell(base, i, decode));
                let gain = if higher_is_better { v / b } else { b / v };
                line += &format!(" {v:.2} ({gain:.2}x) |");
            }
            line += &format!(" {:.0} |", r["peak_rss_mib"].as_f64().unwrap());
            println!("{line}");
        }
    }
}
