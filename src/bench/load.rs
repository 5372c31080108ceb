//! `bench --concurrency 1,2,4,8`: several requests at once through the scheduler, side by side in
//! one run: aggregate and per-stream codes/s, time to first audio under load, and the ratio to one
//! request alone. Engine-only runs the backbone's scheduler on synthetic prompts (greedy, the end
//! token masked, so every stream makes the same count and the greedy codes can be compared with
//! the solo run's); the whole pipeline runs [`Synthesizer::synthesize`] on the medium text.

use std::ops::ControlFlow;
use std::sync::{Barrier, mpsc};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::engine::{
    CancelToken, Candidates, GenerationParams, SamplingParams, Scheduler, SchedulerOptions,
};
use crate::synth::{Door, FrontEnd, SynthConfig, SynthEvent, load_engine};

use super::peers::BenchError;
use super::{Stat, machine, peak_rss_mb, synthetic_prompt};

/// One concurrency level: `concurrency` requests at once, `runs` times.
#[derive(Debug, Clone, Serialize)]
pub struct LoadLevel {
    pub concurrency: usize,
    /// Codes each stream made.
    pub codes_per_stream: Stat,
    /// All codes made at this level over the wall time from the first request's start to the
    /// last code (prefills included), median of the runs.
    pub aggregate_codes_per_s: Stat,
    /// All codes made while every stream of the level was decoding (from the last stream's first
    /// code to the first stream's last), over that time: the batch's steady rate, no prefills in
    /// it. `None` when the streams did not overlap.
    pub steady_codes_per_s: Option<Stat>,
    /// Each stream's codes/s while it was generating (first code to last).
    pub per_stream_codes_per_s: Stat,
    /// The slowest stream of each run (the one a listener would hear stutter first).
    pub slowest_stream_codes_per_s: Stat,
    /// Aggregate codes/s over the aggregate at concurrency 1.
    pub vs_one: f64,
    /// The steady rate over concurrency 1's.
    pub steady_vs_one: Option<f64>,
    /// Time to first audio (whole pipeline) or first code (engine-only), over every request.
    pub first_out_ms_p50: f64,
    pub first_out_ms_p95: f64,
    /// Whole pipeline, concurrency > 1: the last request starts once the others are all
    /// generating; its time to first audio and its prefill.
    pub late_first_audio_ms: Option<Stat>,
    pub late_prefill_ms: Option<Stat>,
    /// The largest batch a decode step ran, and the mean over the level's steps.
    pub peak_batch: usize,
    pub mean_batch: f64,
    /// Engine-only, greedy: the first code index where a stream differs from the solo run's
    /// codes (`None`: every stream matched every code).
    pub first_divergence: Option<usize>,
}

#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    pub mode: &'static str,
    pub engine: String,
    pub device: String,
    pub package: String,
    pub machine: String,
    /// The codec's sessions and threads (the whole pipeline only).
    pub codec: Option<String>,
    pub max_batch: usize,
    pub runs: usize,
    /// Engine-only: the prompt length and the codes per stream.
    pub prompt_tokens: Option<usize>,
    pub new_tokens: Option<usize>,
    pub levels: Vec<LoadLevel>,
    pub peak_rss_mb: f64,
}

/// What one request at a level saw.
struct Stream {
    started: Instant,
    first_out: Option<Instant>,
    last_code: Option<Instant>,
    codes: Vec<u32>,
    /// When each code came.
    code_times: Vec<Instant>,
    prefill: Duration,
}

impl Stream {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            first_out: None,
            last_code: None,
            codes: Vec::new(),
            code_times: Vec::new(),
            prefill: Duration::ZERO,
        }
    }

    fn code(&mut self, code: u32) {
        let now = Instant::now();
        self.last_code = Some(now);
        self.code_times.push(now);
        self.codes.push(code);
    }

    fn rate(&self) -> Option<f64> {
        let (first, last) = (*self.code_times.first()?, self.last_code?);
        let n = self.codes.len().saturating_sub(1) as f64;
        Some(n / last.duration_since(first).as_secs_f64().max(1e-9))
    }
}

/// The numbers of `runs` runs of one level (each a set of streams).
fn summarise(
    concurrency: usize,
    runs: &[Vec<Stream>],
    batch: (usize, f64),
    solo: Option<&[u32]>,
) -> LoadLevel {
    let mut aggregate = Vec::new();
    let mut steady = Vec::new();
    let lengths: Vec<f64> = runs
        .iter()
        .flatten()
        .map(|s| s.codes.len() as f64)
        .collect();
    let mut per_stream = Vec::new();
    let mut slowest = Vec::new();
    let mut first_out = Vec::new();
    let mut late_first = Vec::new();
    let mut late_prefill = Vec::new();
    let mut divergence: Option<usize> = None;
    for streams in runs {
        let start = streams.iter().map(|s| s.started).min();
        let end = streams.iter().filter_map(|s| s.last_code).max();
        if let (Some(a), Some(b)) = (start, end) {
            let total: usize = streams.iter().map(|s| s.codes.len()).sum();
            aggregate.push(total as f64 / b.duration_since(a).as_secs_f64().max(1e-9));
        }
        let from = streams.iter().filter_map(|s| s.code_times.first()).max();
        let to = streams.iter().filter_map(|s| s.code_times.last()).min();
        if let (Some(&a), Some(&b)) = (from, to)
            && b > a
        {
            let made: usize = streams
                .iter()
                .map(|s| s.code_times.iter().filter(|&&t| t > a && t <= b).count())
                .sum();
            steady.push(made as f64 / b.duration_since(a).as_secs_f64());
        }
        // A stream of one code has no rate to speak of.
        let rates: Vec<f64> = streams
            .iter()
            .filter(|s| s.codes.len() > 1)
            .filter_map(Stream::rate)
            .collect();
        if let Some(min) = rates.iter().copied().reduce(f64::min) {
            slowest.push(min);
        }
        per_stream.extend(rates);
        for s in streams {
            if let Some(t) = s.first_out {
                first_out.push(t.duration_since(s.started).as_secs_f64() * 1e3);
            }
            if let Some(solo) = solo {
                let at = s
                    .codes
                    .iter()
                    .zip(solo)
                    .position(|(a, b)| a != b)
                    .or_else(|| {
                        (s.codes.len() != solo.len()).then(|| s.codes.len().min(solo.len()))
                    });
                divergence = match (divergence, at) {
                    (Some(d), Some(a)) => Some(d.min(a)),
                    (d, a) => d.or(a),
                };
            }
        }
        if concurrency > 1
            && solo.is_none()
            && let Some(late) = streams.last()
            && let Some(t) = late.first_out
        {
            late_first.push(t.duration_since(late.started).as_secs_f64() * 1e3);
            late_prefill.push(late.prefill.as_secs_f64() * 1e3);
        }
    }
    LoadLevel {
        concurrency,
        codes_per_stream: Stat::of(&lengths),
        aggregate_codes_per_s: Stat::of(&aggregate),
        steady_codes_per_s: (!steady.is_empty()).then(|| Stat::of(&steady)),
        per_stream_codes_per_s: Stat::of(&per_stream),
        slowest_stream_codes_per_s: Stat::of(&slowest),
        vs_one: 0.0,
        steady_vs_one: None,
        first_out_ms_p50: percentile(&first_out, 0.50),
        first_out_ms_p95: percentile(&first_out, 0.95),
        late_first_audio_ms: (!late_first.is_empty()).then(|| Stat::of(&late_first)),
        late_prefill_ms: (!late_prefill.is_empty()).then(|| Stat::of(&late_prefill)),
        peak_batch: batch.0,
        mean_batch: batch.1,
        first_divergence: if solo.is_some() { divergence } else { None },
    }
}

/// The nearest-rank percentile.
fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Batch numbers since `before`: (peak, mean rows per step).
fn batch_since(s: &crate::engine::SchedulerStats, before: (u64, u64)) -> (usize, f64) {
    use std::sync::atomic::Ordering;
    let steps = s.steps.load(Ordering::Relaxed) - before.0;
    let rows = s.step_rows.load(Ordering::Relaxed) - before.1;
    let peak = s.peak_batch.swap(0, Ordering::Relaxed);
    (peak, rows as f64 / steps.max(1) as f64)
}

fn batch_mark(s: &crate::engine::SchedulerStats) -> (u64, u64) {
    use std::sync::atomic::Ordering;
    s.peak_batch.store(0, Ordering::Relaxed);
    (
        s.steps.load(Ordering::Relaxed),
        s.step_rows.load(Ordering::Relaxed),
    )
}

fn finish_levels(levels: &mut [LoadLevel]) {
    let one = levels
        .iter()
        .find(|l| l.concurrency == 1)
        .map(|l| l.aggregate_codes_per_s.median);
    let steady_one = levels
        .iter()
        .find(|l| l.concurrency == 1)
        .and_then(|l| l.steady_codes_per_s)
        .map(|s| s.median);
    for l in levels.iter_mut() {
        l.vs_one = one.map_or(0.0, |one| l.aggregate_codes_per_s.median / one.max(1e-9));
        l.steady_vs_one = match (steady_one, l.steady_codes_per_s) {
            (Some(one), Some(s)) => Some(s.median / one.max(1e-9)),
            _ => None,
        };
    }
}

/// Engine-only: the backbone's scheduler with `max(levels)` places, `runs` runs per level of
/// `concurrency` streams started together on the same synthetic prompt.
pub fn engine_load(
    cfg: &SynthConfig,
    levels: &[usize],
    prompt_len: usize,
    new_tokens: usize,
    runs: usize,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<LoadReport, BenchError> {
    let front = FrontEnd::load(cfg)?;
    let pkg = front.package();
    let max_batch = levels.iter().copied().max().unwrap_or(1);
    // Engines that size their KV for the batch at load (llama.cpp) must know the largest level.
    let mut cfg = cfg.clone();
    cfg.scheduler.max_batch = max_batch;
    let engine = load_engine(&cfg, pkg)?;
    let (description, device) = (engine.describe(), engine.device());
    let candidates = Candidates::of(pkg);
    let text_ids: Vec<u32> = pkg
        .tokenizer
        .encode(super::peers::PROMPT_TEXT, false)
        .map_err(|e| BenchError::Tokenizer(e.to_string()))?
        .get_ids()
        .to_vec();
    let prompt = synthetic_prompt(&candidates, &text_ids, prompt_len);
    let sched = Scheduler::start(
        engine,
        candidates,
        SchedulerOptions {
            max_batch,
            ..cfg.scheduler
        },
    )?;
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: new_tokens,
        max_new_tokens: Some(new_tokens),
    };
    // One warm-up: first-run allocations and page faults are not the steady state.
    progress("engine-only warm-up", 0, 1);
    let solo = sched
        .generate(&prompt, &params, &CancelToken::new(), &mut |_| {
            ControlFlow::Continue(())
        })?
        .codes;
    let total = levels.len() * runs;
    let mut out = Vec::new();
    for (li, &n) in levels.iter().enumerate() {
        let mark = batch_mark(sched.stats());
        let mut all = Vec::new();
        for r in 0..runs {
            progress(
                &format!("engine-only, {n} at once, run {}", r + 1),
                li * runs + r,
                total,
            );
            all.push(together(n, |_, s: &mut Stream| {
                let g = sched.generate(&prompt, &params, &CancelToken::new(), &mut |code| {
                    s.code(code);
                    s.first_out.get_or_insert(Instant::now());
                    ControlFlow::Continue(())
                })?;
                s.prefill = g.prefill;
                Ok(())
            })?);
        }
        out.push(summarise(
            n,
            &all,
            batch_since(sched.stats(), mark),
            Some(&solo),
        ));
    }
    progress("done", total, total);
    finish_levels(&mut out);
    Ok(LoadReport {
        mode: "engine-only",
        engine: description,
        device: device.to_string(),
        package: pkg.dir.display().to_string(),
        machine: machine(),
        codec: None,
        max_batch: sched.max_batch(),
        runs,
        prompt_tokens: Some(prompt.len()),
        new_tokens: Some(new_tokens),
        levels: out,
        peak_rss_mb: peak_rss_mb(),
    })
}

/// Runs `n` streams on their own threads, started together, and returns what each saw.
fn together(
    n: usize,
    run: impl Fn(usize, &mut Stream) -> Result<(), BenchError> + Sync,
) -> Result<Vec<Stream>, BenchError> {
    let start = Barrier::new(n);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (start, run) = (&start, &run);
                scope.spawn(move || {
                    start.wait();
                    let mut s = Stream::new();
                    run(i, &mut s).map(|()| s)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// The whole pipeline: `concurrency` streaming requests of the medium text at once through
/// `synth`; at concurrency > 1 the last one starts when all the others have made their first
/// code (a request arriving while the others run). The streams of a run share a seed, so they
/// make the same codes: a short take beside a long one would measure the lengths, not the batch.
pub fn pipeline_load(
    door: &Door,
    voice: &str,
    levels: &[usize],
    runs: usize,
    sampling: SamplingParams,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<LoadReport, BenchError> {
    let synth = door.synth();
    let text = super::TEXTS[1].1;
    let request = |seed: u64| super::bench_request(text, voice, seed, sampling);
    // Warm-up, as engine-only.
    progress("pipeline warm-up", 0, 1);
    door.synthesize(&request(0), &mut |_| ControlFlow::Continue(()))?;
    let total = levels.len() * runs;
    let mut out = Vec::new();
    for (li, &n) in levels.iter().enumerate() {
        let mark = batch_mark(synth.scheduler_stats());
        let mut all = Vec::new();
        for r in 0..runs {
            progress(
                &format!("pipeline, {n} at once, run {}", r + 1),
                li * runs + r,
                total,
            );
            // The others each say when they are generating; the late one waits for all of them.
            let (going, all_going) = mpsc::channel::<()>();
            let early = n.saturating_sub(1);
            let all_going = std::sync::Mutex::new(all_going);
            let streams = together(n, |i, s: &mut Stream| {
                let late = n > 1 && i == n - 1;
                if late {
                    let rx = all_going.lock().unwrap_or_else(|p| p.into_inner());
                    for _ in 0..early {
                        if rx.recv().is_err() {
                            break;
                        }
                    }
                    s.started = Instant::now();
                }
                let mut told = late;
                let result = door.synthesize(&request(r as u64), &mut |ev| {
                    match ev {
                        SynthEvent::Code { code, .. } => {
                            s.code(code);
                            if !told {
                                told = true;
                                let _ = going.send(());
                            }
                        }
                        SynthEvent::Audio(b) if !b.is_empty() => {
                            s.first_out.get_or_insert_with(Instant::now);
                        }
                        _ => {}
                    }
                    ControlFlow::Continue(())
                });
                // One that ended without a code (an error, an empty take) still lets the late
                // one go.
                if !told {
                    let _ = going.send(());
                }
                let report = result?;
                s.prefill = report.timings.prefill;
                Ok(())
            })?;
            all.push(streams);
        }
        out.push(summarise(
            n,
            &all,
            batch_since(synth.scheduler_stats(), mark),
            None,
        ));
    }
    progress("done", total, total);
    finish_levels(&mut out);
    Ok(LoadReport {
        mode: "pipeline",
        engine: synth.engine_description(),
        device: synth.device_label(),
        package: synth.package().dir.display().to_string(),
        machine: machine(),
        codec: Some(synth.codec_description()),
        max_batch: synth.max_batch(),
        runs,
        prompt_tokens: None,
        new_tokens: None,
        levels: out,
        peak_rss_mb: peak_rss_mb(),
    })
}

impl LoadReport {
    pub fn table(&self) -> String {
        let mut s = format!(
            "{} under load\nengine {}\ndevice {}\npackage {}\nmachine {}\n{}max batch {}; {} runs per level{}\n\n",
            self.mode,
            self.engine,
            self.device,
            self.package,
            self.machine,
            self.codec
                .as_ref()
                .map_or_else(String::new, |c| format!("codec {c}\n")),
            self.max_batch,
            self.runs,
            match (self.prompt_tokens, self.new_tokens) {
                (Some(p), Some(n)) => format!("; {p}-token prompt, {n} codes per stream"),
                _ => String::new(),
            }
        );
        let first = if self.mode == "pipeline" {
            "first audio ms p50/p95"
        } else {
            "first code ms p50/p95"
        };
        s.push_str(&format!(
            "{:>4} {:>7} {:>18} {:>6} {:>16} {:>6} {:>18} {:>10} {:>22} {:>16} {:>12}\n",
            "conc",
            "codes",
            "aggregate codes/s",
            "x c=1",
            "steady codes/s",
            "x c=1",
            "per stream",
            "slowest",
            first,
            "late (prefill) ms",
            "batch pk/avg"
        ));
        for l in &self.levels {
            s.push_str(&format!(
                "{:>4} {:>7.0} {:>18} {:>6.2} {:>16} {:>6} {:>18} {:>10.1} {:>22} {:>16} {:>12}\n",
                l.concurrency,
                l.codes_per_stream.median,
                format!("{:.1}", l.aggregate_codes_per_s),
                l.vs_one,
                l.steady_codes_per_s
                    .map_or("-".to_owned(), |t| format!("{t:.1}")),
                l.steady_vs_one
                    .map_or("-".to_owned(), |x| format!("{x:.2}")),
                format!("{:.1}", l.per_stream_codes_per_s),
                l.slowest_stream_codes_per_s.median,
                format!("{:.0} / {:.0}", l.first_out_ms_p50, l.first_out_ms_p95),
                match (l.late_first_audio_ms, l.late_prefill_ms) {
                    (Some(t), Some(p)) => format!("{:.0} ({:.0})", t.median, p.median),
                    _ => "-".to_owned(),
                },
                format!("{} / {:.2}", l.peak_batch, l.mean_batch),
            ));
        }
        if self.mode == "engine-only" {
            let diverged: Vec<String> = self
                .levels
                .iter()
                .filter_map(|l| {
                    l.first_divergence
                        .map(|d| format!("{} at once: code {d}", l.concurrency))
                })
                .collect();
            s.push_str(&if diverged.is_empty() {
                "\ngreedy codes: every stream equal to the solo run at every level\n".to_owned()
            } else {
                format!(
                    "\ngreedy codes differ from the solo run from: {}\n",
                    diverged.join("; ")
                )
            });
        }
        s.push_str(&format!(
            "\npeak RSS {:.0} MiB; real time is 50 codes/s per stream\n",
            self.peak_rss_mb
        ));
        s
    }
}
