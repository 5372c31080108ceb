//! Taking turns on a small CPU. The backbone and the NeuCodec decoder each run an ONNX Runtime
//! pool as wide as the usable cores, and a streamed request runs both at once: the backbone makes
//! the codes of the next window while the codec decodes the last one. On 2 cores two such pools at
//! once share the cores badly (each run's threads wait on threads the other pool holds), and the
//! two in turn finish sooner (docs/performance.md, "Whole streaming synthesis on 2 cores").
//! [`Turns`] makes them alternate run by run: a codec run waits for the backbone's run in progress
//! (one decode step, or one prefill chunk), and the backbone's next run waits until no codec run
//! is waiting or running, so a window's audio leaves as early as it can. Only short runs take
//! turns ([`TURN_TOKENS`], [`TURN_FRAMES`]): a whole prompt prefilled in one run, or a long piece
//! decoded whole, overlaps as before, so no stream's window waits seconds for another's prompt.

use std::cell::Cell;
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// Whether the backbone and the codec take turns (`--cpu-turns`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TurnsMode {
    /// On where both run on fewer than [`AUTO_BELOW_CORES`] usable cores (the backbone in this
    /// process on the CPU); elsewhere they overlap.
    #[default]
    Auto,
    On,
    Off,
}

/// `auto` takes turns below this many usable physical cores: measured faster on 2; on 16 the
/// codec beside the backbone was measured to pay (docs/performance.md).
pub const AUTO_BELOW_CORES: usize = 4;

/// The longest backbone run that takes turns, in tokens: a decode step, or one prefill chunk
/// beside running requests (the scheduler's 64 by default, ~0.25 s on 2 cores).
pub const TURN_TOKENS: usize = 64;

/// The longest codec run that takes turns, in frames: every streaming window (at most
/// 100 + 200 + 6 frames), not a long piece decoded whole.
pub const TURN_FRAMES: usize = 320;

impl TurnsMode {
    /// Whether a backbone on the CPU of this process and the codec take turns on `cores` usable
    /// physical cores, their pools having `threads` intra-op threads together.
    pub fn resolve(self, backbone_on_cpu_here: bool, cores: usize, threads: usize) -> bool {
        match self {
            Self::On => true,
            Self::Off => false,
            Self::Auto => backbone_on_cpu_here && cores < AUTO_BELOW_CORES && threads > cores,
        }
    }
}

impl std::str::FromStr for TurnsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(format!("{s:?}: expected auto, on or off")),
        }
    }
}

thread_local! {
    /// How long runs on this thread have waited for the other side's, in all.
    static WAITED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
}

/// How long runs on this thread have waited for the other side's so far: a backbone run for
/// codec runs, a codec run for the backbone's run in progress. A stage timed on this thread takes
/// the difference over it from its time, so each stage counts its own side's work and the
/// stages of a lone request add up instead of overlapping.
pub(crate) fn waited_here() -> Duration {
    WAITED.with(Cell::get)
}

/// How long one request's backbone runs waited for codec runs, by the stage they were in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TurnWait {
    pub prefill: Duration,
    pub decode: Duration,
}

impl TurnWait {
    pub fn total(self) -> Duration {
        self.prefill + self.decode
    }
}

impl std::ops::AddAssign for TurnWait {
    fn add_assign(&mut self, o: Self) {
        self.prefill += o.prefill;
        self.decode += o.decode;
    }
}

fn count_wait(since: Instant) {
    WAITED.with(|w| w.set(w.get() + since.elapsed()));
}

#[derive(Default)]
struct State {
    /// Codec runs waiting or running.
    codec: usize,
    backbone: bool,
    /// Backbone runs that have had to wait for codec runs.
    backbone_waits: u64,
}

/// The gate both sides pass for every run.
#[derive(Default)]
pub struct Turns {
    state: Mutex<State>,
    changed: Condvar,
}

impl std::fmt::Debug for Turns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Turns")
    }
}

/// Gives the turn back when dropped, a panic in the run included.
struct Release<'a> {
    turns: &'a Turns,
    codec: bool,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let mut s = self.turns.lock();
        if self.codec {
            s.codec -= 1;
        } else {
            s.backbone = false;
        }
        drop(s);
        self.turns.changed.notify_all();
    }
}

impl Turns {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wait<'a>(&self, s: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(s).unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs one backbone run of `tokens` tokens once no codec run is waiting or running; a run
    /// longer than [`TURN_TOKENS`] does not wait.
    pub fn backbone<T>(&self, tokens: usize, run: impl FnOnce() -> T) -> T {
        if tokens > TURN_TOKENS {
            return run();
        }
        let mut s = self.lock();
        if s.codec > 0 {
            s.backbone_waits += 1;
            let since = Instant::now();
            while s.codec > 0 {
                s = self.wait(s);
            }
            count_wait(since);
        }
        s.backbone = true;
        drop(s);
        let _release = Release {
            turns: self,
            codec: false,
        };
        run()
    }

    /// Backbone runs that have had to wait for codec runs (tests watch a run start waiting).
    #[cfg(test)]
    pub(crate) fn backbone_waits(&self) -> u64 {
        self.lock().backbone_waits
    }

    /// Codec runs waiting or running (tests watch a run start waiting).
    #[cfg(test)]
    pub(crate) fn codec_runs(&self) -> usize {
        self.lock().codec
    }

    /// Runs one codec run of `frames` frames once the backbone's run in progress has ended; the
    /// backbone starts no new run meanwhile. Codec runs may overlap each other (their sessions
    /// share the threads). A run longer than [`TURN_FRAMES`] does not wait.
    pub fn codec<T>(&self, frames: usize, run: impl FnOnce() -> T) -> T {
        if frames > TURN_FRAMES {
            return run();
        }
        let mut s = self.lock();
        s.codec += 1;
        // From here on the backbone starts nothing new; the Release below counts this run out
        // however it ends.
        let _release = Release {
            turns: self,
            codec: true,
        };
        if s.backbone {
            let since = Instant::now();
            while s.backbone {
                s = self.wait(s);
            }
            count_wait(since);
        }
        drop(s);
        run()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;

    #[test]
    fn auto_takes_turns_only_for_a_backbone_on_few_local_cores() {
        assert!(TurnsMode::Auto.resolve(true, 2, 4));
        assert!(TurnsMode::Auto.resolve(true, 3, 6));
        assert!(!TurnsMode::Auto.resolve(true, 4, 8));
        assert!(!TurnsMode::Auto.resolve(false, 2, 4));
        // One thread each on 2 cores: they do not share a core, nothing to take turns for.
        assert!(!TurnsMode::Auto.resolve(true, 2, 2));
        assert!(TurnsMode::On.resolve(false, 64, 2));
        assert!(!TurnsMode::Off.resolve(true, 2, 4));
        assert_eq!("on".parse(), Ok(TurnsMode::On));
        assert!("yes".parse::<TurnsMode>().is_err());
    }

    #[test]
    fn a_waiting_codec_run_goes_before_the_backbones_next_run() {
        let turns = Arc::new(Turns::new());
        let order = Arc::new(Mutex::new(Vec::new()));
        let (in_step, step_started) = mpsc::channel();
        let (finish_step, step_may_end) = mpsc::channel::<()>();
        // The backbone is inside a run.
        let backbone = {
            let (turns, order) = (turns.clone(), order.clone());
            std::thread::spawn(move || {
                turns.backbone(1, || {
                    in_step.send(()).unwrap();
                    step_may_end.recv().unwrap();
                    order.lock().unwrap().push("step 1");
                });
                // Its next run: must come after the codec run that asked meanwhile.
                turns.backbone(1, || order.lock().unwrap().push("step 2"));
            })
        };
        step_started.recv().unwrap();
        let codec = {
            let (turns, order) = (turns.clone(), order.clone());
            std::thread::spawn(move || {
                let before = waited_here();
                turns.codec(81, || order.lock().unwrap().push("codec"));
                waited_here() - before
            })
        };
        // Until the codec run has counted itself in (it then waits for the step to end).
        while turns.lock().codec == 0 {
            std::thread::yield_now();
        }
        finish_step.send(()).unwrap();
        // The codec run's wait for the step is counted on its thread.
        assert!(codec.join().unwrap() > Duration::ZERO);
        backbone.join().unwrap();
        assert_eq!(*order.lock().unwrap(), ["step 1", "codec", "step 2"]);
        let s = turns.lock();
        assert_eq!((s.codec, s.backbone), (0, false));
    }

    #[test]
    fn a_threads_waits_for_the_codec_are_counted_on_that_thread_only() {
        let turns = Arc::new(Turns::new());
        // No codec run: the backbone's run waits for nothing.
        let before = waited_here();
        turns.backbone(1, || ());
        assert_eq!(waited_here(), before);
        // A codec run is counted in before the backbone's thread asks for its turn.
        turns.lock().codec = 1;
        let backbone = {
            let turns = turns.clone();
            std::thread::spawn(move || {
                let start = waited_here();
                turns.backbone(1, || ());
                waited_here() - start
            })
        };
        // Until its run is waiting (a run that never waits fails here, not hangs).
        let deadline = Instant::now() + Duration::from_secs(60);
        while turns.backbone_waits() == 0 {
            assert!(Instant::now() < deadline, "the backbone's run never waited");
            std::thread::yield_now();
        }
        {
            let mut s = turns.lock();
            s.codec = 0;
        }
        turns.changed.notify_all();
        assert!(backbone.join().unwrap() > Duration::ZERO);
        // This thread's count is its own.
        assert_eq!(waited_here(), before);
    }

    #[test]
    fn a_panicking_run_gives_its_turn_back() {
        let turns = Turns::new();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            turns.codec(81, || panic!("codec run failed"))
        }));
        assert!(r.is_err());
        assert_eq!(turns.backbone(1, || 7), 7);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            turns.backbone(1, || panic!("step failed"))
        }));
        assert!(r.is_err());
        assert_eq!(turns.codec(81, || 8), 8);
    }

    #[test]
    fn long_runs_do_not_wait() {
        let turns = Turns::new();
        // A codec run is waiting or running (counted in, as a window in progress is).
        turns.lock().codec = 1;
        // A whole prompt prefilled in one run goes ahead; a short step would wait.
        assert_eq!(turns.backbone(TURN_TOKENS + 1, || "prefill"), "prefill");
        turns.lock().codec = 0;
        turns.lock().backbone = true;
        // A long piece decoded whole goes ahead of a step in progress.
        assert_eq!(turns.codec(TURN_FRAMES + 1, || "whole"), "whole");
        let s = turns.lock();
        assert_eq!((s.codec, s.backbone), (0, true));
    }
}
