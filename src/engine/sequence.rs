//! One sequence's generation, step by step: budget check, min/max new tokens, speech-constrained
//! sampling, stop ids, cancellation and the per-code callback. [`super::generate`] runs one
//! sequence on a [`super::Backbone`]; the scheduler runs many side by side in one batch. Both
//! feed a [`Sequence`] the logits after each token and feed back the token it returns, so a
//! sequence makes the same codes alone or in a batch whenever the logits are the same.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use crate::runtime::TurnWait;
use crate::runtime::turns::waited_here;

use super::{
    CancelToken, Candidates, EngineError, Generation, GenerationParams, LogitsLayout, Sampler,
    StopReason, too_long,
};

/// What the backbone allows a sequence.
#[derive(Debug, Clone)]
pub struct SequenceLimits {
    /// Most tokens (prompt + generated) one sequence may hold.
    pub budget: usize,
    /// The past length the graph declares as a number, if it does (names the error).
    pub static_kv: Option<usize>,
    pub layout: LogitsLayout,
}

/// A sequence being generated: its sampler (with its own seeded RNG), its codes so far and its
/// limits.
pub struct Sequence {
    sampler: Sampler,
    candidates: Candidates,
    min_new: usize,
    max_new: usize,
    out: Generation,
    started: Instant,
    decoding_since: Option<Instant>,
    in_callback: Duration,
    /// [`waited_here`] when the current stage began, plus what this sequence's callbacks waited
    /// since (the callback's whole time is left out already). A sequence lives on the thread
    /// that runs its backbone (the scheduler's, or [`super::generate`]'s caller); the
    /// scheduler's callbacks only send on a channel, so no other sequence's callback waits on
    /// that thread in its stage.
    waits_at: Duration,
    thread: std::thread::ThreadId,
}

impl Sequence {
    /// Checks the settings and the prompt against the limits; the prefill clock starts here.
    pub fn new(
        candidates: &Candidates,
        prompt: &[u32],
        params: &GenerationParams,
        limits: &SequenceLimits,
    ) -> Result<Self, EngineError> {
        params.sampling.validate()?;
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        if prompt.len() >= limits.budget {
            return Err(too_long(prompt.len(), limits.budget, limits.static_kv));
        }
        let room = limits.budget - prompt.len();
        let started = Instant::now();
        let waits_at = waited_here();
        let sampler = Sampler::with_layout(params.sampling, candidates.clone(), &limits.layout)?;
        Ok(Self {
            out: Generation {
                codes: Vec::new(),
                stop: StopReason::Length,
                prompt_tokens: prompt.len(),
                seed: sampler.seed(),
                prefill: Duration::ZERO,
                decode: Duration::ZERO,
                turn_wait: TurnWait::default(),
                npu_commands: None,
                cached_tokens: 0,
            },
            sampler,
            candidates: candidates.clone(),
            min_new: params.min_new_tokens,
            max_new: params.max_new_tokens.map_or(room, |m| m.min(room)),
            started,
            decoding_since: None,
            in_callback: Duration::ZERO,
            waits_at,
            thread: std::thread::current().id(),
        })
    }

    /// Takes the logits row after the last token fed (the prompt's last, then each code's) and
    /// returns the token to feed next, or `None` when the sequence has ended (a stop id, the
    /// length limit, cancellation, or `on_code` asking to stop).
    pub fn advance(
        &mut self,
        logits: &[f32],
        cancel: &CancelToken,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Option<u32>, EngineError> {
        let next = self
            .sampler
            .sample(logits, self.out.codes.len() >= self.min_new)?;
        if self.decoding_since.is_none() {
            let waits = self.waits_since_stage();
            self.out.prefill = self.started.elapsed().saturating_sub(waits);
            self.out.turn_wait.prefill = waits;
            self.waits_at = waited_here();
            self.decoding_since = Some(Instant::now());
        }
        if self.candidates.stop_ids.contains(&next) {
            self.out.stop = StopReason::Stop(next);
            return Ok(None);
        }
        let first = self.candidates.speech_first;
        debug_assert!((first..first + self.candidates.speech_count).contains(&next));
        let code = next - first;
        self.out.codes.push(code);
        let (t, waits) = (Instant::now(), waited_here());
        let flow = on_code(code);
        self.in_callback += t.elapsed();
        self.waits_at += waited_here() - waits;
        if flow.is_break() || cancel.is_cancelled() {
            self.out.stop = StopReason::Cancelled;
            return Ok(None);
        }
        if self.out.codes.len() >= self.max_new {
            self.out.stop = StopReason::Length;
            return Ok(None);
        }
        Ok(Some(next))
    }

    /// The codes so far.
    pub fn codes(&self) -> &[u32] {
        &self.out.codes
    }

    /// Its first `n` prompt tokens' KV came from the voice-prefix cache.
    pub fn cached(&mut self, n: usize) {
        self.out.cached_tokens = n;
    }

    /// Ends the sequence as cancelled, with what it made so far.
    pub fn cancelled(mut self) -> Generation {
        self.out.stop = StopReason::Cancelled;
        self.finish()
    }

    /// What the sequence made, with its timings: prefill and decode count the backbone's runs,
    /// not the time spent in `on_code` (a streaming codec, encoding, the caller's I/O) nor in
    /// waiting for the codec's turn ([`crate::runtime::Turns`]), so stage timings add up.
    pub fn finish(mut self) -> Generation {
        if let Some(t) = self.decoding_since {
            let waits = self.waits_since_stage();
            self.out.decode = t.elapsed().saturating_sub(self.in_callback + waits);
            self.out.turn_wait.decode = waits;
        }
        self.out
    }

    /// How long this stage's backbone runs have waited for codec runs.
    fn waits_since_stage(&self) -> Duration {
        debug_assert_eq!(
            self.thread,
            std::thread::current().id(),
            "a sequence's waits are counted on the thread that runs its backbone"
        );
        waited_here().saturating_sub(self.waits_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::SamplingParams;
    use crate::runtime::Turns;
    use std::sync::Arc;

    /// Makes the backbone's next run on this thread wait for a codec run: another thread holds
    /// one until this thread's run waits, then lets it end. Returns how long this thread waited.
    fn wait_for_a_codec_run(turns: &Arc<Turns>) -> Duration {
        let (started, running) = std::sync::mpsc::channel();
        let (end, ending) = std::sync::mpsc::channel::<()>();
        let codec = {
            let turns = turns.clone();
            std::thread::spawn(move || {
                turns.codec(81, || {
                    started.send(()).unwrap();
                    ending.recv().unwrap();
                })
            })
        };
        running.recv().unwrap();
        let (before, waits) = (waited_here(), turns.backbone_waits());
        // Ends the codec run once this thread's run below is waiting for it.
        let watcher = {
            let turns = turns.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                while turns.backbone_waits() == waits {
                    assert!(Instant::now() < deadline, "the backbone's run never waited");
                    std::thread::yield_now();
                }
                end.send(()).unwrap();
            })
        };
        turns.backbone(1, || ());
        watcher.join().unwrap();
        codec.join().unwrap();
        waited_here() - before
    }

    /// Makes a codec run on this thread wait for a backbone run another thread holds until the
    /// codec run waits. Returns how long this thread waited.
    fn wait_for_a_backbone_run(turns: &Arc<Turns>) -> Duration {
        let (started, running) = std::sync::mpsc::channel();
        let (end, ending) = std::sync::mpsc::channel::<()>();
        let step = {
            let turns = turns.clone();
            std::thread::spawn(move || {
                turns.backbone(1, || {
                    started.send(()).unwrap();
                    ending.recv().unwrap();
                })
            })
        };
        running.recv().unwrap();
        let before = waited_here();
        let watcher = {
            let turns = turns.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(60);
                while turns.codec_runs() == 0 {
                    assert!(Instant::now() < deadline, "the codec's run never waited");
                    std::thread::yield_now();
                }
                end.send(()).unwrap();
            })
        };
        turns.codec(81, || ());
        watcher.join().unwrap();
        step.join().unwrap();
        waited_here() - before
    }

    #[test]
    fn stage_times_leave_out_waiting_for_the_codec() {
        let candidates = Candidates {
            speech_first: 10,
            speech_count: 4,
            stop_ids: vec![2],
        };
        let limits = SequenceLimits {
            budget: 64,
            static_kv: None,
            layout: LogitsLayout::default(),
        };
        let params = GenerationParams {
            sampling: SamplingParams {
                temperature: 0.0,
                ..SamplingParams::default()
            },
            min_new_tokens: 0,
            max_new_tokens: Some(2),
        };
        let mut logits = vec![0.0f32; 16];
        logits[11] = 5.0;
        let turns = Arc::new(Turns::new());
        let wall = Instant::now();
        let mut seq = Sequence::new(&candidates, &[1, 3], &params, &limits).unwrap();
        let t = Instant::now();
        let in_prefill = wait_for_a_codec_run(&turns);
        let prefill_call = t.elapsed();
        let cancel = CancelToken::new();
        // A callback that waits its turn itself (a codec run on this thread): its whole time is
        // left out already, so its wait must not be taken out again.
        let mut in_callbacks = Duration::ZERO;
        let mut on_code = |_| {
            in_callbacks += wait_for_a_backbone_run(&turns);
            ControlFlow::Continue(())
        };
        assert_eq!(
            seq.advance(&logits, &cancel, &mut on_code).unwrap(),
            Some(11)
        );
        let prefill_wall = wall.elapsed();
        let t = Instant::now();
        let in_decode = wait_for_a_codec_run(&turns);
        let decode_call = t.elapsed();
        assert_eq!(seq.advance(&logits, &cancel, &mut on_code).unwrap(), None);
        let g = seq.finish();
        let total = wall.elapsed();
        assert!(in_callbacks > Duration::ZERO);
        assert_eq!(g.codes, [1, 1]);
        assert!(in_prefill > Duration::ZERO && in_decode > Duration::ZERO);
        // Had either wait been counted in its stage, these would not hold.
        assert!(g.prefill + in_prefill <= prefill_wall);
        assert!(g.prefill + in_prefill + g.decode + in_decode <= total);
        // Each wait is left out of its own stage only: the rest of the call stays in it.
        assert!(g.prefill + in_prefill >= prefill_call);
        assert!(g.decode + in_decode >= decode_call);
        assert_eq!(
            g.turn_wait,
            TurnWait {
                prefill: in_prefill,
                decode: in_decode
            }
        );
    }
}
