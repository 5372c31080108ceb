//! Cost of choosing one code: the speech-constrained sampler over a real-width logits row
//! (217,652 logits, 65,536 speech ids + stops), greedy and top-k 50, on one core.
//! `cargo bench --bench sampler`. Without `--bench` (as `cargo test --benches` runs it) it does
//! one quick pass so the harness is exercised but takes no time.

use std::time::Instant;

use onebit_tts::engine::{Candidates, Sampler, SamplingParams};

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let vocab = 217_652usize;
    let c = Candidates {
        speech_first: 151_671,
        speech_count: 65_536,
        stop_ids: vec![151_670, 151_645, 151_643],
    };
    // Logits shaped like a model's: mostly small noise, a few peaks.
    let mut x: u32 = 7;
    let rows: Vec<Vec<f32>> = (0..16)
        .map(|_| {
            (0..vocab)
                .map(|_| {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (x >> 9) as f32 / (1u32 << 23) as f32 * 8.0 - 4.0
                })
                .collect()
        })
        .collect();
    let iters = if full { 2000 } else { 16 };
    for (name, params) in [
        ("greedy", SamplingParams::greedy()),
        (
            "top-k 50, T 1.0",
            SamplingParams {
                seed: Some(1),
                ..SamplingParams::default()
            },
        ),
        (
            "top-k 50, top-p 0.9",
            SamplingParams {
                top_p: 0.9,
                seed: Some(1),
                ..SamplingParams::default()
            },
        ),
        (
            "no top-k (all 65,539)",
            SamplingParams {
                top_k: 0,
                seed: Some(1),
                ..SamplingParams::default()
            },
        ),
    ] {
        let mut s = Sampler::new(params, c.clone());
        let mut times = Vec::with_capacity(iters);
        let mut sink = 0u64;
        for i in 0..iters {
            let t = Instant::now();
            sink = sink.wrapping_add(u64::from(
                s.sample(&rows[i % rows.len()], i > 10).expect("sample"),
            ));
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!(
            "{name:<24} median {:.4} ms, p90 {:.4} ms per code ({iters} draws; checksum {sink})",
            times[times.len() / 2],
            times[times.len() * 9 / 10]
        );
    }
}
