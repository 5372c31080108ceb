//! The lm_head speed levers of `onebit-tts models optimize`, measured: prefill time at several
//! prompt lengths and decode codes/s, for the original package, each lever alone and both, median
//! of n runs, and the peak RSS of each (one child process per variant).
//!
//! ```text
//! cargo bench --bench levers -- --bench [--model models/real-shape] [--runs 3]
//!     [--lengths 128,512,2048] [--decode 32] [--threads N] [--json FILE]
//! ```
//!
//! The optimized variants are written once under target/levers/ (hard links to the model's data).
//! Without `--bench` (as under `cargo test --all-targets`) it exits at once.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use onebit_tts::engine::{
    self, Backbone, CancelToken, Candidates, GenerationParams, KvMode, OrtBackbone, OrtOptions,
    SamplingParams,
};
use onebit_tts::package::optimize::{self, Levers};
use onebit_tts::package::{ModelPackage, SPEECH_CODES};

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

/// A prompt of exactly `len` tokens in the model's shape: text markers, then speech codes.
fn prompt(pkg: &ModelPackage, len: usize) -> Vec<u32> {
    let v = &pkg.vocab;
    let mut p = vec![v.text_prompt_start, v.text_prompt_end, v.generation_start];
    p.truncate(len);
    let codes = len - p.len();
    p.extend((0..codes as u32).map(|i| v.code_to_id(i.wrapping_mul(7919) % SPEECH_CODES)));
    p
}

/// One variant in this process: prints one JSON line with the medians.
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
    let c = Candidates {
        speech_first: pkg.vocab.first,
        speech_count: SPEECH_CODES,
        stop_ids: pkg.stop_ids.clone(),
    };
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: o.decode,
        max_new_tokens: Some(o.decode),
    };
    let mut generate = |p: &[u32]| {
        engine::generate(&mut b, &c, p, &params, &CancelToken::new(), &mut |_| {
            ControlFlow::Continue(())
        })
        .expect("generate")
    };
    generate(&prompt(&pkg, 16));
    let mut rows = Vec::new();
    for &len in &o.lengths {
        let p = prompt(&pkg, len);
        let (mut prefill, mut decode) = (Vec::new(), Vec::new());
        for run in 0..o.runs {
            let g = generate(&p);
            assert_eq!(g.codes.len(), o.decode);
            prefill.push(g.prefill.as_secs_f64() * 1000.0);
            // The first code comes out of the prefill; the rest are one step each.
            decode.push((o.decode - 1) as f64 / g.decode.as_secs_f64());
            eprintln!(
                "  {}: {len} tokens run {}: prefill {:.0} ms, decode {:.2} codes/s",
                dir.display(),
                run + 1,
                prefill[run],
                decode[run]
            );
        }
        rows.push(serde_json::json!({
            "prompt_tokens": len,
            "prefill_ms": median(&prefill),
            "prefill_ms_runs": prefill,
            "decode_codes_per_s": median(&decode),
            "decode_runs": decode,
        }));
    }
    let out = serde_json::json!({
        "package": dir.display().to_string(),
        "engine": b.describe(),
        "logits": pkg.logits.describe(pkg.genai.model.vocab_size),
        "load_s": load_s,
        "rss_after_load_mib": rss_loaded,
        "peak_rss_mib": peak_rss_mib(),
        "lengths": rows,
    });
    println!("{out}");
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
    let mut results = Vec::new();
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
        eprintln!("{name}: {}", dir.display());
        let mut cmd = Command::new(std::env::current_exe().expect("own path"));
        cmd.args(["--bench", "--child"])
            .arg(&dir)
            .args(["--runs", &o.runs.to_string()])
            .args(["--decode", &o.decode.to_string()])
            .arg("--lengths")
            .arg(
                o.lengths
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .stderr(Stdio::inherit());
        if let Some(t) = o.threads {
            cmd.args(["--threads", &t.to_string()]);
        }
        let out = cmd.output().expect("child");
        assert!(out.status.success(), "{name}: the child failed");
        let mut v: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("one JSON line from the child");
        v["variant"] = name.into();
        results.push(v);
    }

    // The table: medians, and the ratio to the original.
    let base = &results[0];
    let cell = |v: &serde_json::Value, i: usize, k: &str| v["lengths"][i][k].as_f64().unwrap();
    let mut head = String::from("| variant |");
    let mut rule = String::from("|---|");
    for l in &o.lengths {
        head += &format!(" prefill {l} (ms) |");
        rule += "---:|";
    }
    for l in &o.lengths {
        head += &format!(" decode @{l} (codes/s) |");
        rule += "---:|";
    }
    head += " peak RSS (MiB) |";
    rule += "---:|";
    println!("{head}\n{rule}");
    for r in &results {
        let mut line = format!("| {} |", r["variant"].as_str().unwrap());
        for i in 0..o.lengths.len() {
            let (v, b) = (cell(r, i, "prefill_ms"), cell(base, i, "prefill_ms"));
            line += &format!(" {v:.0} ({:.2}x) |", b / v);
        }
        for i in 0..o.lengths.len() {
            let (v, b) = (
                cell(r, i, "decode_codes_per_s"),
                cell(base, i, "decode_codes_per_s"),
            );
            line += &format!(" {v:.2} ({:.2}x) |", v / b);
        }
        line += &format!(" {:.0} |", r["peak_rss_mib"].as_f64().unwrap());
        println!("{line}");
    }
    if let Some(path) = &o.json {
        std::fs::write(path, serde_json::to_string_pretty(&results).unwrap()).expect("--json");
    }
}
