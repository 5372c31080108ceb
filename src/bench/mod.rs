//! `onebit-tts bench`: synthesis speed against the real-time line of 50 codes per second.
//!
//! Every number comes from the same [`StageTimings`] that `say` and `/metrics` report. Runs are
//! summarised as median ± half-range, because a 2-core machine has outliers a mean would hide.

pub mod load;
pub mod peers;
pub mod svg;
pub mod vendor;

use std::ops::ControlFlow;
use std::time::Instant;

use serde::Serialize;

use crate::audio::{AudioFormat, OutputSpec};
use crate::engine::{
    CancelToken, Candidates, Engine, EngineError, GenerationParams, SamplingParams,
};
use crate::metrics;
use crate::synth::{Door, SpeechRequest, SynthError, SynthEvent};

/// The fixed texts: a short, a medium and a long one.
pub const TEXTS: &[(&str, &str)] = &[
    ("short", "Hello, and welcome to the show."),
    (
        "medium",
        "The library opens at nine on weekdays and at ten on Saturdays. Could you send me the report before the meeting tomorrow afternoon?",
    ),
    (
        "long",
        "Our train was delayed by twenty five minutes, so we missed the first act of the play. The conductor apologised twice and offered everyone a voucher for the next trip. By the time we arrived, the theatre was quiet, and an usher led us to our seats in the dark. The second act was wonderful, and nobody seemed to mind that we had come late.",
    ),
];

/// One synthesis run's numbers.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub case: String,
    pub voice: String,
    pub run: usize,
    #[serde(flatten)]
    pub numbers: metrics::RunNumbers,
    /// Seconds since the bench started when each tenth code came (codes/s over the run).
    pub code_times_s: Vec<f64>,
    /// The codes it made, in order (a peer's greedy codes are compared with them).
    #[serde(skip)]
    pub codes: Vec<u32>,
}

/// Median and half-range of a set of numbers.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Stat {
    pub median: f64,
    pub half_range: f64,
}

impl Stat {
    pub fn of(xs: &[f64]) -> Self {
        if xs.is_empty() {
            return Self {
                median: 0.0,
                half_range: 0.0,
            };
        }
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Self {
            median,
            half_range: (v[n - 1] - v[0]) / 2.0,
        }
    }
}

impl std::fmt::Display for Stat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = f.precision().unwrap_or(1);
        write!(f, "{:.p$} ± {:.p$}", self.median, self.half_range)
    }
}

/// Summary of the runs of one case.
#[derive(Debug, Clone, Serialize)]
pub struct CaseSummary {
    pub case: String,
    pub voice: String,
    pub runs: usize,
    pub prompt_tokens: Stat,
    /// Prompt tokens the voice-prefix cache gave (0 in a voice's first run).
    pub cached_tokens: Stat,
    pub codes: Stat,
    pub codes_per_s: Stat,
    pub x_real_time: Stat,
    pub rtf: Stat,
    pub prefill_tok_per_s: Stat,
    pub first_audio_ms: Stat,
    /// A listener's waits after the first audio ([`crate::metrics::RunNumbers::stall_ms`]).
    pub stall_ms: Stat,
    pub stage_ms: StageStats,
}

#[derive(Debug, Clone, Serialize)]
pub struct StageStats {
    pub front_end: Stat,
    pub prefill: Stat,
    pub decode: Stat,
    pub codec: Stat,
    pub encode: Stat,
    /// The backbone's waits for codec windows ([`crate::metrics::StageTimings::turn_wait`]): not
    /// a stage of its own, for a lone stream they are the codec's time.
    pub turn_wait: Stat,
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub engine: String,
    /// Where the backbone ran, as observed: "npu" only with proven residency, "cpu fallback"
    /// for an NPU load that was not proven ([`crate::synth::Synthesizer::device_label`]).
    pub device: String,
    /// The NPU residency verdict and its evidence (`None` off the NPU).
    pub residency: Option<crate::npu::Residency>,
    pub package: String,
    /// Said of a package whose weights are random (a test package: no words), once.
    pub package_note: Option<String>,
    pub machine: String,
    /// The codec's sessions and threads.
    pub codec: String,
    pub runs: Vec<Run>,
    pub cases: Vec<CaseSummary>,
    pub peak_rss_mb: f64,
    pub model_files_mb: f64,
    /// `--peers`: the vendor's own streaming pipeline on the same cases, after ours.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<vendor::VendorReport>,
    /// Why `--peers` ran without it (no GGUF).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor_note: Option<String>,
}

/// Peak resident memory of this process (VmHWM), in MiB.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| {
                    v.split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<f64>().ok())
                })
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// "N cores, model name" from /proc/cpuinfo.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{cores} cores, {model}")
}

/// Table rows as lines of columns, each padded to its widest cell and two spaces apart: the first
/// `left` columns aligned left (names), the rest right (numbers). Stat's Display ignores width, so
/// cells come formatted.
pub(crate) fn columns(rows: &[Vec<String>], left: usize) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..n)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (s, &w))| {
                if i < left {
                    format!("{s:<w$}")
                } else {
                    format!("{s:>w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Size of the package's files (what "peak RSS vs model files" compares against), in MiB.
pub fn files_mb(dir: &std::path::Path) -> f64 {
    fn walk(p: &std::path::Path) -> u64 {
        std::fs::read_dir(p)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| {
                        let p = e.path();
                        if p.is_dir() {
                            walk(&p)
                        } else {
                            e.metadata().map_or(0, |m| m.len())
                        }
                    })
                    .sum()
            })
            .unwrap_or(0)
    }
    walk(dir) as f64 / (1024.0 * 1024.0)
}

/// Runs every (text, voice) case `runs` times, streaming, with seeds 0..runs.
pub fn run(
    door: &Door,
    voices: &[String],
    runs: usize,
    sampling: SamplingParams,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Report, SynthError> {
    let synth = door.synth();
    let started = Instant::now();
    let mut all = Vec::new();
    let total = TEXTS.len() * voices.len() * runs;
    let mut done = 0;
    for voice in voices {
        for (case, text) in TEXTS {
            for r in 0..runs {
                progress(&format!("{case} / {voice} / run {}", r + 1), done, total);
                let req = bench_request(text, voice, r as u64, sampling);
                let (mut code_times, mut codes) = (Vec::new(), Vec::new());
                let report = door.synthesize(&req, &mut |ev| {
                    if let SynthEvent::Code { index, code } = ev {
                        codes.push(code);
                        if index % 10 == 9 {
                            code_times.push(started.elapsed().as_secs_f64());
                        }
                    }
                    ControlFlow::Continue(())
                })?;
                all.push(Run {
                    case: (*case).to_owned(),
                    voice: voice.clone(),
                    run: r,
                    numbers: report.numbers(),
                    code_times_s: code_times,
                    codes,
                });
                done += 1;
            }
        }
    }
    progress("done", done, total);
    let mut cases = Vec::new();
    for voice in voices {
        for (case, _) in TEXTS {
            let rs: Vec<&Run> = all
                .iter()
                .filter(|r| r.case == *case && &r.voice == voice)
                .collect();
            let stat =
                |f: &dyn Fn(&Run) -> f64| Stat::of(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
            cases.push(CaseSummary {
                case: (*case).to_owned(),
                voice: voice.clone(),
                runs: rs.len(),
                prompt_tokens: stat(&|r| r.numbers.prompt_tokens as f64),
                cached_tokens: stat(&|r| r.numbers.cached_tokens as f64),
                codes: stat(&|r| r.numbers.codes as f64),
                codes_per_s: stat(&|r| r.numbers.codes_per_s),
                x_real_time: stat(&|r| r.numbers.x_real_time),
                rtf: stat(&|r| r.numbers.rtf),
                prefill_tok_per_s: stat(&|r| r.numbers.prefill_tok_per_s),
                first_audio_ms: stat(&|r| r.numbers.first_audio_ms.unwrap_or(0.0)),
                stall_ms: stat(&|r| r.numbers.stall_ms),
                stage_ms: StageStats {
                    front_end: stat(&|r| r.numbers.front_end_ms),
                    prefill: stat(&|r| r.numbers.prefill_ms),
                    decode: stat(&|r| r.numbers.decode_ms),
                    codec: stat(&|r| r.numbers.codec_ms),
                    encode: stat(&|r| r.numbers.encode_ms),
                    turn_wait: stat(&|r| r.numbers.turn_wait_ms),
                },
            });
        }
    }
    Ok(Report {
        engine: synth.engine_description(),
        device: synth.device_label(),
        residency: synth.residency(),
        package: synth.package().dir.display().to_string(),
        package_note: synth.package().random_weights_notice(),
        machine: machine(),
        codec: format!(
            "{}, stream windows {}",
            synth.codec_description(),
            synth.stream_windows()
        ),
        runs: all,
        cases,
        peak_rss_mb: peak_rss_mb(),
        model_files_mb: files_mb(&synth.package().dir),
        vendor: None,
        vendor_note: None,
    })
}

impl Report {
    /// The table `bench` prints on stdout.
    pub fn table(&self) -> String {
        let mut s = format!(
            "engine {}\ndevice {}\npackage {}{}\nmachine {}\ncodec {}\n\n{:<8} {:<8} {:>6} {:>6} {:>6} {:>16} {:>13} {:>13} {:>16} {:>14} {:>12}   stage ms (front/prefill/decode/codec/encode; turn wait)\n",
            self.engine,
            self.device,
            self.package,
            self.package_note
                .as_ref()
                .map_or_else(String::new, |n| format!("\nnote    {n}")),
            self.machine,
            self.codec,
            "case",
            "voice",
            "prompt",
            "cached",
            "codes",
            "codes/s",
            "x real time",
            "RTF",
            "prefill tok/s",
            "first audio ms",
            "stall ms"
        );
        let f = |st: Stat, p: usize| format!("{:.p$} ± {:.p$}", st.median, st.half_range);
        for c in &self.cases {
            let st = &c.stage_ms;
            s.push_str(&format!(
                "{:<8} {:<8} {:>6.0} {:>6.0} {:>6.0} {:>16} {:>13} {:>13} {:>16} {:>14} {:>12}   {:.1}/{:.1}/{:.1}/{:.1}/{:.1}; {:.1}\n",
                c.case,
                c.voice,
                c.prompt_tokens.median,
                c.cached_tokens.median,
                c.codes.median,
                f(c.codes_per_s, 1),
                f(c.x_real_time, 2),
                f(c.rtf, 3),
                f(c.prefill_tok_per_s, 0),
                f(c.first_audio_ms, 0),
                f(c.stall_ms, 0),
                st.front_end.median,
                st.prefill.median,
                st.decode.median,
                st.codec.median,
                st.encode.median,
                st.turn_wait.median
            ));
        }
        // A run cut at its code limit measured a model that did not stop: say so under the table.
        let cut = self
            .runs
            .iter()
            .filter(|r| r.numbers.finish == "length")
            .count();
        if cut > 0 {
            s.push_str(&format!(
                "\n{cut} of {} runs ended at their code limit without the end token (finish reason length)\n",
                self.runs.len()
            ));
        }
        // On the NPU: the driver's own count of the work each run gave it.
        let counted: Vec<u64> = self
            .runs
            .iter()
            .filter_map(|r| r.numbers.npu_commands)
            .collect();
        if !counted.is_empty() {
            let idle = counted.iter().filter(|&&n| n == 0).count();
            s.push_str(&format!(
                "\nNPU commands (amdxdna hardware-context counters): {} over {} counted runs{}\n",
                counted.iter().sum::<u64>(),
                counted.len(),
                if idle > 0 {
                    format!("; {idle} runs made none (they ran as a CPU fallback)")
                } else {
                    String::new()
                }
            ));
        }
        s.push_str(&format!(
            "\npeak RSS {:.0} MiB; model files {:.0} MiB (ratio {:.2}); real time is 50 codes/s\n",
            self.peak_rss_mb,
            self.model_files_mb,
            self.peak_rss_mb / self.model_files_mb.max(1e-9)
        ));
        if let Some(v) = &self.vendor {
            s.push('\n');
            s.push_str(&v.table(self));
        }
        if let Some(note) = &self.vendor_note {
            s.push('\n');
            s.push_str(note);
            s.push('\n');
        }
        s
    }
}

/// One engine-only measurement: prefill of `prompt_tokens`, then exactly `new_tokens` codes.
#[derive(Debug, Clone, Serialize)]
pub struct EngineRun {
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    pub prefill_ms: Stat,
    pub prefill_tok_per_s: Stat,
    pub decode_codes_per_s: Stat,
    /// Token ids of the last measured run's codes (for the peers' greedy-agreement check).
    #[serde(skip)]
    pub last_ids: Vec<u32>,
}

/// Deterministic synthetic prompts of `n` tokens: the NeuTTS layout (text part, then speech
/// codes), so every engine sees the same ids.
/// The whole-pipeline bench's request: `text` in `voice` with `seed`, streamed as WAV.
fn bench_request(text: &str, voice: &str, seed: u64, sampling: SamplingParams) -> SpeechRequest {
    SpeechRequest {
        text: text.to_owned(),
        voice: voice.to_owned(),
        generation: GenerationParams {
            sampling: SamplingParams {
                seed: Some(seed),
                ..sampling
            },
            ..GenerationParams::default()
        },
        output: OutputSpec {
            format: AudioFormat::Wav,
            streaming: true,
            ..OutputSpec::default()
        },
        ..SpeechRequest::default()
    }
}

pub fn synthetic_prompt(c: &Candidates, text_ids: &[u32], n: usize) -> Vec<u32> {
    let text_len = (n / 4).min(text_ids.len().max(1) * 64);
    let mut p: Vec<u32> = text_ids
        .iter()
        .cycle()
        .take(text_len.min(n))
        .copied()
        .collect();
    let mut x: u32 = 12345;
    while p.len() < n {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        p.push(c.speech_first + (x >> 8) % c.speech_count);
    }
    p
}

/// Prefill and decode speed of an engine alone, median of `runs`.
pub fn engine_only(
    engine: &mut dyn Engine,
    c: &Candidates,
    text_ids: &[u32],
    prompt_lens: &[usize],
    new_tokens: usize,
    runs: usize,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<Vec<EngineRun>, EngineError> {
    let mut out = Vec::new();
    let total = prompt_lens.len() * (runs + 1);
    let mut done = 0;
    for &n in prompt_lens {
        let prompt = synthetic_prompt(c, text_ids, n);
        let params = GenerationParams {
            sampling: SamplingParams::greedy(),
            // The end token is masked for the whole run so every engine makes the same count.
            min_new_tokens: new_tokens,
            max_new_tokens: Some(new_tokens),
        };
        let (mut pre, mut dec, mut last_ids) = (Vec::new(), Vec::new(), Vec::new());
        // One warm-up run: first-run allocations and page faults are not the steady state.
        for r in 0..=runs {
            progress(
                &format!("engine-only, {n}-token prompt, run {r}"),
                done,
                total,
            );
            let g = engine.generate(c, &prompt, &params, &CancelToken::new(), &mut |_| {
                ControlFlow::Continue(())
            })?;
            done += 1;
            if r == 0 {
                continue;
            }
            pre.push(g.prefill.as_secs_f64());
            // The first code comes out of the prefill; the decode loop makes the rest.
            dec.push((g.codes.len().saturating_sub(1)) as f64 / g.decode.as_secs_f64().max(1e-9));
            last_ids = g.codes.iter().map(|&code| c.speech_first + code).collect();
        }
        out.push(EngineRun {
            prompt_tokens: n,
            new_tokens,
            prefill_ms: Stat::of(&pre.iter().map(|s| s * 1e3).collect::<Vec<_>>()),
            prefill_tok_per_s: Stat::of(&pre.iter().map(|s| n as f64 / s).collect::<Vec<_>>()),
            decode_codes_per_s: Stat::of(&dec),
            last_ids,
        });
    }
    Ok(out)
}
