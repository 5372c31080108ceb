//! Prometheus text metrics, fed from the same [`StageTimings`] the CLI and bench print.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::engine::{SchedulerStats, StopReason};
use crate::metrics::StageTimings;

/// The labels of `onebit_generations_finished_total`, each always present.
const FINISH_REASONS: [&str; 3] = ["stop", "length", "cancelled"];

/// Requests refused before they reached the queue, by reason (`onebit_requests_rejected_total`);
/// any other 4xx of validation counts as `invalid_request`.
const REJECT_REASONS: [&str; 7] = [
    "invalid_api_key",
    "invalid_host",
    "invalid_request",
    "body_timeout",
    "queue_full",
    "shutting_down",
    "too_many_connections",
];

/// Admitted requests that ended without their audio, by reason (`onebit_requests_dropped_total`):
/// the client left while queued or while running (a stream whose client stopped reading past the
/// write timeout included), the deadline passed while queued or running, shutdown, a whole
/// response over `max_response_mb`, an engine failure.
const DROP_REASONS: [&str; 7] = [
    "client_gone_queued",
    "client_gone_running",
    "timeout_queued",
    "timeout_running",
    "shutdown",
    "response_too_large",
    "engine_failed",
];

/// Connections the server closed on a timeout (`onebit_connections_closed_total`).
const CLOSE_REASONS: [&str; 2] = ["header_timeout", "write_timeout"];

fn count(labels: &[&str], counters: &[AtomicU64], reason: &str) {
    if let Some(i) = labels.iter().position(|&r| r == reason) {
        counters[i].fetch_add(1, Ordering::Relaxed);
    }
}

fn render_labelled(
    s: &mut String,
    name: &str,
    help: &str,
    labels: &[&str],
    counters: &[AtomicU64],
) {
    s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
    for (reason, n) in labels.iter().zip(counters) {
        s.push_str(&format!(
            "{name}{{reason=\"{reason}\"}} {}\n",
            n.load(Ordering::Relaxed)
        ));
    }
}

#[derive(Default)]
pub struct Metrics {
    by_status: Mutex<BTreeMap<u16, u64>>,
    /// Finished generations by finish reason: stop, length, cancelled.
    by_finish: [AtomicU64; 3],
    codes: AtomicU64,
    cancelled: AtomicU64,
    /// Sums in microseconds / samples, for averages.
    decode_us: AtomicU64,
    audio_us: AtomicU64,
    wall_us: AtomicU64,
    first_audio_us: AtomicU64,
    first_audio_n: AtomicU64,
    completed: AtomicU64,
    last_codes_per_s_milli: AtomicU64,
    rejected: [AtomicU64; 7],
    dropped: [AtomicU64; 7],
    closed: [AtomicU64; 2],
    pub connections: AtomicUsize,
    /// Requests by their own decode rate (codes over their decode time), in [`STREAM_RATE_BUCKETS`].
    stream_rates: [AtomicU64; STREAM_RATE_BUCKETS.len()],
    stream_rates_sum_milli: AtomicU64,
    /// NPU commands the driver counted for finished requests, and the requests it counted none
    /// for (they ran as a CPU fallback).
    npu_commands: AtomicU64,
    npu_idle_requests: AtomicU64,
    npu_counted_requests: AtomicU64,
    /// The last finished request's NPU commands, plus one (0: not counted).
    last_npu_commands: AtomicU64,
}

/// Upper bounds (codes/s) of the per-stream rate histogram; real time is 50.
const STREAM_RATE_BUCKETS: [f64; 8] = [10.0, 25.0, 40.0, 50.0, 75.0, 100.0, 200.0, f64::INFINITY];

fn us(d: std::time::Duration) -> u64 {
    d.as_micros().min(u128::from(u64::MAX)) as u64
}

impl Metrics {
    pub fn request(&self, status: u16) {
        if let Ok(mut m) = self.by_status.lock() {
            *m.entry(status).or_default() += 1;
        }
    }

    /// A request refused before the queue; `code` is its error code.
    pub fn rejected(&self, code: &str) {
        let reason = if REJECT_REASONS.contains(&code) {
            code
        } else {
            "invalid_request"
        };
        count(&REJECT_REASONS, &self.rejected, reason);
    }

    pub fn dropped(&self, reason: &str) {
        count(&DROP_REASONS, &self.dropped, reason);
    }

    pub fn closed(&self, reason: &str) {
        count(&CLOSE_REASONS, &self.closed, reason);
    }

    pub fn generated(
        &self,
        codes: usize,
        audio_seconds: f64,
        t: &StageTimings,
        finish: StopReason,
        npu_commands: Option<u64>,
    ) {
        self.codes.fetch_add(codes as u64, Ordering::Relaxed);
        if let Some(n) = npu_commands {
            self.npu_commands.fetch_add(n, Ordering::Relaxed);
            self.npu_counted_requests.fetch_add(1, Ordering::Relaxed);
            if n == 0 && codes > 0 {
                self.npu_idle_requests.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.last_npu_commands.store(
            npu_commands.map_or(0, |n| n.saturating_add(1)),
            Ordering::Relaxed,
        );
        if finish == StopReason::Cancelled {
            self.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(i) = FINISH_REASONS
            .iter()
            .position(|&r| r == finish.finish_reason())
        {
            self.by_finish[i].fetch_add(1, Ordering::Relaxed);
        }
        // The rate a client got its codes at: waits for codec windows while decoding (its own
        // and other requests', `--cpu-turns`) slowed it as much as a slower step would.
        let generating = t.decode + t.turn_wait.decode;
        self.decode_us.fetch_add(us(generating), Ordering::Relaxed);
        self.audio_us
            .fetch_add((audio_seconds * 1e6) as u64, Ordering::Relaxed);
        self.wall_us.fetch_add(us(t.total), Ordering::Relaxed);
        if let Some(f) = t.first_audio {
            self.first_audio_us.fetch_add(us(f), Ordering::Relaxed);
            self.first_audio_n.fetch_add(1, Ordering::Relaxed);
        }
        self.completed.fetch_add(1, Ordering::Relaxed);
        let cps = crate::metrics::codes_per_second(codes, generating);
        self.last_codes_per_s_milli
            .store((cps * 1000.0) as u64, Ordering::Relaxed);
        if codes > 0
            && !generating.is_zero()
            && let Some(i) = STREAM_RATE_BUCKETS.iter().position(|&le| cps <= le)
        {
            self.stream_rates[i].fetch_add(1, Ordering::Relaxed);
            self.stream_rates_sum_milli
                .fetch_add((cps * 1000.0) as u64, Ordering::Relaxed);
        }
    }

    /// The last finished request's NPU commands (`None`: not on the NPU, not countable, or no
    /// request yet).
    pub fn last_npu_commands(&self) -> Option<u64> {
        self.last_npu_commands
            .load(Ordering::Relaxed)
            .checked_sub(1)
    }

    pub fn codes_total(&self) -> u64 {
        self.codes.load(Ordering::Relaxed)
    }

    pub fn cancelled_total(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// The text of `/metrics`; `sched` describes the batch, `load` the front door (every
    /// transport's requests).
    pub fn render(&self, sched: &SchedulerStats, load: &crate::synth::Load) -> String {
        let places = load.places;
        let mut s = String::new();
        s.push_str("# HELP onebit_requests_total Speech requests by HTTP status.\n# TYPE onebit_requests_total counter\n");
        if let Ok(m) = self.by_status.lock() {
            for (status, n) in m.iter() {
                s.push_str(&format!(
                    "onebit_requests_total{{status=\"{status}\"}} {n}\n"
                ));
            }
        }
        s.push_str("# HELP onebit_generations_finished_total Generations by finish reason (stop: the end token; length: a piece reached its code limit; cancelled).\n# TYPE onebit_generations_finished_total counter\n");
        for (reason, n) in FINISH_REASONS.iter().zip(&self.by_finish) {
            s.push_str(&format!(
                "onebit_generations_finished_total{{reason=\"{reason}\"}} {}\n",
                n.load(Ordering::Relaxed)
            ));
        }
        s.push_str(&format!(
            "# HELP onebit_npu_commands_total NPU commands the amdxdna driver counted as completed for finished requests (hardware-context counters).\n# TYPE onebit_npu_commands_total counter\nonebit_npu_commands_total {}\n\
             # HELP onebit_npu_counted_requests_total Finished requests whose NPU commands were counted.\n# TYPE onebit_npu_counted_requests_total counter\nonebit_npu_counted_requests_total {}\n\
             # HELP onebit_npu_requests_without_commands_total Requests on --device npu that made codes while the NPU completed no command for them (a CPU fallback).\n# TYPE onebit_npu_requests_without_commands_total counter\nonebit_npu_requests_without_commands_total {}\n",
            self.npu_commands.load(Ordering::Relaxed),
            self.npu_counted_requests.load(Ordering::Relaxed),
            self.npu_idle_requests.load(Ordering::Relaxed),
        ));
        render_labelled(
            &mut s,
            "onebit_requests_rejected_total",
            "Requests refused before the queue, by reason.",
            &REJECT_REASONS,
            &self.rejected,
        );
        render_labelled(
            &mut s,
            "onebit_requests_dropped_total",
            "Admitted requests that ended without their audio, by reason.",
            &DROP_REASONS,
            &self.dropped,
        );
        render_labelled(
            &mut s,
            "onebit_connections_closed_total",
            "Connections closed by the server on a timeout, by reason.",
            &CLOSE_REASONS,
            &self.closed,
        );
        let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e6;
        let lines = [
            (
                "onebit_codes_generated_total",
                "counter",
                "Speech codes generated.",
                self.codes.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_generations_cancelled_total",
                "counter",
                "Generations stopped early (client gone, timeout, shutdown).",
                self.cancelled.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_generations_total",
                "counter",
                "Generations finished or stopped.",
                self.completed.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_decode_seconds_total",
                "counter",
                "Time spent generating codes.",
                secs(&self.decode_us),
            ),
            (
                "onebit_audio_seconds_total",
                "counter",
                "Audio produced.",
                secs(&self.audio_us),
            ),
            (
                "onebit_synthesis_seconds_total",
                "counter",
                "Wall time of syntheses.",
                secs(&self.wall_us),
            ),
            (
                "onebit_time_to_first_audio_seconds_sum",
                "counter",
                "Sum of time to first audio.",
                secs(&self.first_audio_us),
            ),
            (
                "onebit_time_to_first_audio_seconds_count",
                "counter",
                "Requests with first audio.",
                self.first_audio_n.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_codes_per_second",
                "gauge",
                "Decode rate of the last generation (real time is 50).",
                self.last_codes_per_s_milli.load(Ordering::Relaxed) as f64 / 1000.0,
            ),
            (
                "onebit_rtf",
                "gauge",
                "Real-time factor over all syntheses (wall / audio).",
                {
                    let a = secs(&self.audio_us);
                    if a > 0.0 {
                        secs(&self.wall_us) / a
                    } else {
                        0.0
                    }
                },
            ),
            (
                "onebit_queue_depth",
                "gauge",
                "Requests waiting for the engine (every transport).",
                load.queued as f64,
            ),
            (
                "onebit_running",
                "gauge",
                "Requests being synthesised (every transport).",
                load.running as f64,
            ),
            (
                "onebit_connections_open",
                "gauge",
                "Open HTTP connections.",
                self.connections.load(Ordering::Relaxed) as f64,
            ),
        ];
        let batch = [
            (
                "onebit_batch_size",
                "gauge",
                "Sequences in the running decode batch now.",
                sched.running.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_batch_places",
                "gauge",
                "Requests that run side by side at most (--max-batch; 1 when the engine cannot batch).",
                places as f64,
            ),
            (
                "onebit_decode_steps_total",
                "counter",
                "Batched decode steps run.",
                sched.steps.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_decode_step_sequences_total",
                "counter",
                "Sequences over all batched decode steps (divided by the steps: the mean batch size).",
                sched.step_rows.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_decode_pad_rows_total",
                "counter",
                "Throwaway rows that padded a lone sequence's decode step (--batch-invariant).",
                sched.pad_rows.load(Ordering::Relaxed) as f64,
            ),
            (
                "onebit_prompt_cached_tokens_total",
                "counter",
                "Prompt tokens whose KV came from the voice-prefix cache instead of a prefill (--prefix-cache-mib).",
                sched.cached_tokens.load(Ordering::Relaxed) as f64,
            ),
        ];
        for (name, ty, help, v) in lines.into_iter().chain(batch) {
            s.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {ty}\n{name} {v}\n"
            ));
        }
        s.push_str("# HELP onebit_stream_codes_per_second Requests by their own decode rate in codes/s (each stream's rate while sharing the batch; real time is 50).\n# TYPE onebit_stream_codes_per_second histogram\n");
        let mut below = 0;
        for (le, n) in STREAM_RATE_BUCKETS.iter().zip(&self.stream_rates) {
            below += n.load(Ordering::Relaxed);
            let le = if le.is_finite() {
                format!("{le}")
            } else {
                "+Inf".to_owned()
            };
            s.push_str(&format!(
                "onebit_stream_codes_per_second_bucket{{le=\"{le}\"}} {below}\n"
            ));
        }
        s.push_str(&format!(
            "onebit_stream_codes_per_second_sum {}\nonebit_stream_codes_per_second_count {below}\n",
            self.stream_rates_sum_milli.load(Ordering::Relaxed) as f64 / 1000.0
        ));
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn npu_commands_are_counted_per_request_and_an_idle_npu_request_is_named() {
        let m = Metrics::default();
        assert_eq!(m.last_npu_commands(), None);
        let t = StageTimings::default();
        m.generated(100, 2.0, &t, StopReason::Length, Some(640));
        assert_eq!(m.last_npu_commands(), Some(640));
        // Codes made while the NPU completed nothing: a CPU fallback.
        m.generated(50, 1.0, &t, StopReason::Length, Some(0));
        assert_eq!(m.last_npu_commands(), Some(0));
        // Not on the NPU (or not countable): unknown, counted nowhere.
        m.generated(50, 1.0, &t, StopReason::Length, None);
        assert_eq!(m.last_npu_commands(), None);
        let load = crate::synth::Load {
            running: 0,
            queued: 0,
            places: 1,
            queue_depth: 8,
        };
        let text = m.render(&SchedulerStats::default(), &load);
        for line in [
            "onebit_npu_commands_total 640\n",
            "onebit_npu_counted_requests_total 2\n",
            "onebit_npu_requests_without_commands_total 1\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }

    #[test]
    fn the_decode_rate_counts_the_decode_steps_waits_for_codec_windows_not_the_prefills() {
        let m = Metrics::default();
        let t = StageTimings {
            decode: Duration::from_millis(1500),
            turn_wait: crate::runtime::TurnWait {
                prefill: Duration::from_millis(700),
                decode: Duration::from_millis(500),
            },
            ..StageTimings::default()
        };
        // 100 codes over 1.5 s of steps and 0.5 s of waits between them: 50 codes/s.
        m.generated(100, 2.0, &t, StopReason::Length, None);
        let load = crate::synth::Load {
            running: 0,
            queued: 0,
            places: 1,
            queue_depth: 8,
        };
        let text = m.render(&SchedulerStats::default(), &load);
        for line in [
            "onebit_codes_per_second 50\n",
            "onebit_decode_seconds_total 2\n",
            "onebit_stream_codes_per_second_bucket{le=\"40\"} 0\n",
            "onebit_stream_codes_per_second_bucket{le=\"50\"} 1\n",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
    }
}
