//! Compares `codec::stream` with tests/python/stream_reference.py, a numpy port of the vendor's
//! streaming decode, over a deterministic fake decoder implemented identically on both sides.

use std::convert::Infallible;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use onebit_tts::codec::stream::{
    CODES_PER_DECODE, FRAMES_PER_CHUNK, SAMPLES_PER_CODE, StreamDecoder, TailMode, decode_whole,
};

const GENERATED_LENGTHS: [usize; 8] = [0, 1, 29, 30, 31, 55, 80, 137];
const REFERENCE_LENGTHS: [usize; 3] = [0, 10, 372];
const TOLERANCE: f32 = 1e-5;

/// Same function as `fake_decode` in stream_reference.py.
fn fake_decode(codes: &[i32]) -> Result<Vec<f32>, Infallible> {
    let n = codes.len();
    let c = |i: usize| i64::from(codes[i]);
    let mut out = Vec::with_capacity(n * SAMPLES_PER_CODE);
    let phase0 = 0.37 * n as f64 + 0.001 * c(0) as f64;
    let mut acc = 0.0f64;
    for f in 0..n {
        let prev = c(f.saturating_sub(1));
        let next = c((f + 1).min(n - 1));
        let freq = 80.0 + ((prev + 2 * c(f) + next) % 997) as f64 * 0.5;
        let inc = 2.0 * std::f64::consts::PI * freq / 24000.0;
        for _ in 0..SAMPLES_PER_CODE {
            acc += inc;
            out.push((0.5 * (phase0 + acc).sin()) as f32);
        }
    }
    Ok(out)
}

/// Deterministic codes spread over the 65,536-entry codebook.
fn codes(len: usize, seed: u64) -> Vec<i32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % 65536) as i32
        })
        .collect()
}

fn python() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("ONEBIT_PYTHON").map(PathBuf::from),
        Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".onebit/venv/bin/python")),
        Some(PathBuf::from("python3")),
    ];
    candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import numpy"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

struct Case {
    reference: Vec<i32>,
    generated: Vec<i32>,
}

#[derive(Default)]
struct Reference {
    vendor: Vec<Vec<f32>>,
    aligned: Vec<Vec<f32>>,
    whole: Vec<Vec<f32>>,
}

fn run_python(py: &PathBuf, cases: &[Case]) -> Vec<Reference> {
    let list = |v: &[i32]| {
        v.iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let json = format!(
        "{{\"cases\":[{}]}}",
        cases
            .iter()
            .map(|c| format!(
                "{{\"reference\":[{}],\"generated\":[{}]}}",
                list(&c.reference),
                list(&c.generated)
            ))
            .collect::<Vec<_>>()
            .join(",")
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/python/stream_reference.py");
    let mut child = Command::new(py)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start stream_reference.py");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(json.as_bytes())
        .expect("write cases");
    let output = child.wait_with_output().expect("run stream_reference.py");
    assert!(
        output.status.success(),
        "stream_reference.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("utf8");
    let mut refs: Vec<Reference> = (0..cases.len()).map(|_| Reference::default()).collect();
    let mut lines = text.lines();
    while let Some(header) = lines.next() {
        let parts: Vec<&str> = header.split_whitespace().collect();
        assert_eq!(parts[0], "case", "bad header {header}");
        let index: usize = parts[1].parse().expect("index");
        let n_chunks: usize = parts[3].parse().expect("chunks");
        let mut chunks = Vec::with_capacity(n_chunks);
        for _ in 0..n_chunks {
            let line = lines.next().expect("chunk line");
            let mut it = line.split_whitespace();
            let len: usize = it.next().expect("len").parse().expect("len");
            let chunk: Vec<f32> = it.map(|x| x.parse().expect("sample")).collect();
            assert_eq!(chunk.len(), len);
            chunks.push(chunk);
        }
        let slot = match parts[2] {
            "vendor" => &mut refs[index].vendor,
            "aligned" => &mut refs[index].aligned,
            "whole" => &mut refs[index].whole,
            other => panic!("unknown mode {other}"),
        };
        *slot = chunks;
    }
    refs
}

fn run_rust(case: &Case, mode: TailMode) -> Vec<Vec<f32>> {
    let mut decoder = StreamDecoder::with_tail_mode(fake_decode, &case.reference, mode);
    let mut chunks = Vec::new();
    for &code in &case.generated {
        if let Some(chunk) = decoder.push(code).expect("push") {
            chunks.push(chunk);
        }
    }
    let tail = decoder.finish().expect("finish");
    if !tail.is_empty() {
        chunks.push(tail);
    }
    chunks
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn concat(chunks: &[Vec<f32>]) -> Vec<f32> {
    chunks.iter().flatten().copied().collect()
}

#[test]
fn stream_matches_vendor_reference() {
    let Some(py) = python() else {
        if std::env::var_os("CI").is_some() {
            panic!(
                "python3 with numpy is required in CI (set ONEBIT_PYTHON or create .onebit/venv)"
            );
        }
        eprintln!("SKIPPED: stream_matches_vendor_reference (no python with numpy found)");
        return;
    };
    let mut cases = Vec::new();
    for (ri, &n_ref) in REFERENCE_LENGTHS.iter().enumerate() {
        for (gi, &n_gen) in GENERATED_LENGTHS.iter().enumerate() {
            cases.push(Case {
                reference: codes(n_ref, 1000 + ri as u64),
                generated: codes(n_gen, 2000 + (ri * 100 + gi) as u64),
            });
        }
    }
    let refs = run_python(&py, &cases);

    let mut worst = 0.0f32;
    for (case, reference) in cases.iter().zip(&refs) {
        let n_ref = case.reference.len();
        let n_gen = case.generated.len();
        let label = format!("reference {n_ref}, generated {n_gen}");
        let exact_len = n_gen * SAMPLES_PER_CODE;
        let full_chunks = if n_gen >= CODES_PER_DECODE {
            (n_gen - CODES_PER_DECODE) / FRAMES_PER_CHUNK + 1
        } else {
            0
        };
        let streamed_len = full_chunks * FRAMES_PER_CHUNK * SAMPLES_PER_CODE;

        // Aligned tail: equal to the reference port with the aligned tail, chunk for chunk.
        let aligned = run_rust(case, TailMode::Aligned);
        let py_aligned = &reference.aligned;
        assert_eq!(
            aligned.iter().map(Vec::len).collect::<Vec<_>>(),
            py_aligned.iter().map(Vec::len).collect::<Vec<_>>(),
            "{label}: aligned chunk lengths"
        );
        let (ours, theirs) = (concat(&aligned), concat(py_aligned));
        assert_eq!(ours.len(), exact_len, "{label}: 480 samples per code");
        let d = max_diff(&ours, &theirs);
        assert!(d < TOLERANCE, "{label}: aligned max diff {d}");
        worst = worst.max(d);

        // The vendor itself: identical while streaming, then its tail as documented.
        let vendor = concat(&reference.vendor);
        let vendor_total = if n_gen == 0 {
            0
        } else if n_ref == 0 && n_gen < CODES_PER_DECODE {
            SAMPLES_PER_CODE
        } else {
            exact_len + SAMPLES_PER_CODE
        };
        assert_eq!(vendor.len(), vendor_total, "{label}: vendor total");
        let common = streamed_len.min(vendor.len());
        let d = max_diff(&ours[..common], &vendor[..common]);
        assert!(
            d < TOLERANCE,
            "{label}: streamed part vs vendor, max diff {d}"
        );

        // Vendor tail mode: the vendor's samples, cut to 480 per code (clamped start when the
        // vendor's own slice index goes negative).
        let ours_vendor = concat(&run_rust(case, TailMode::Vendor));
        assert_eq!(ours_vendor.len(), exact_len, "{label}: vendor mode length");
        let expected: &[f32] = if n_ref == 0 && n_gen < CODES_PER_DECODE {
            &ours
        } else {
            &vendor[..exact_len]
        };
        let d = max_diff(&ours_vendor, expected);
        assert!(d < TOLERANCE, "{label}: vendor mode max diff {d}");
        worst = worst.max(d);

        // Non-streaming path.
        let whole = decode_whole(fake_decode, &case.generated).expect("whole");
        let py_whole = concat(&reference.whole);
        assert_eq!(whole.len(), exact_len, "{label}: whole length");
        let d = max_diff(&whole, &py_whole);
        assert!(d < TOLERANCE, "{label}: whole max diff {d}");

        // Joins must be as smooth as the audio inside the chunks.
        let mut boundaries = Vec::new();
        let mut pos = 0;
        for chunk in &aligned[..aligned.len().saturating_sub(1)] {
            pos += chunk.len();
            boundaries.push(pos);
        }
        let jump = |i: usize| (ours[i] - ours[i - 1]).abs();
        let inner = (1..ours.len())
            .filter(|i| !boundaries.contains(i))
            .map(jump)
            .fold(0.0f32, f32::max);
        for &b in &boundaries {
            assert!(
                jump(b) <= inner,
                "{label}: jump {} at chunk boundary {b} exceeds largest in-chunk jump {inner}",
                jump(b)
            );
        }
    }
    eprintln!(
        "stream_matches_vendor_reference: {} cases, worst max abs diff {worst:e}",
        cases.len()
    );
}
