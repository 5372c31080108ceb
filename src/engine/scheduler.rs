//! The scheduler: one thread owns the engine, and every generation (one per piece of text) goes
//! through it as a job on a channel, getting its codes and its end back on a channel of its own.
//!
//! When the backbone can batch ([`super::Backbone::batch`]), sequences join and leave the running
//! batch between decode steps: a new one is prefilled alone in the next free slot (in chunks while
//! others run, so their pace holds) and then joins; one that ends or is cancelled leaves at once.
//! Each sequence keeps its own [`Sequence`] (sampler, seeded RNG, limits), so its codes are the
//! ones it would make alone whenever the backbone's logits are. Otherwise (a worker child, the
//! oga engine, a static NPU graph, growing KV) jobs run one at a time through
//! [`super::Engine::generate`]. Jobs wait in arrival order; every running sequence gets one code
//! per decode step whatever its length, and a long text is one job per piece, queued again
//! between its pieces behind the jobs that arrived meanwhile.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use super::prefix::PrefixCache;
use super::{
    BatchBackbone, CancelToken, Candidates, Engine, EngineError, Generation, GenerationParams,
    Sequence, SequenceLimits, StopReason,
};

/// Sequences one decode step runs at most when nothing else is said. Measured on the real-shape
/// package on 2 cores (docs/performance.md): 4 streams give 1.7x the codes/s of one.
pub const DEFAULT_MAX_BATCH: usize = 4;

/// Prompt tokens prefilled per scheduler turn while other sequences are decoding: one chunk,
/// then one decode step for the running batch, so their codes keep coming during a prefill.
pub const DEFAULT_PREFILL_CHUNK: usize = 64;

/// KV rows of voice prefixes the scheduler keeps, in MiB (`--prefix-cache-mib`): about 24 KiB
/// a token for the NeuTTS-air shape, so a voice whose transcript is 160 tokens takes 4 MiB.
pub const DEFAULT_PREFIX_CACHE_MIB: usize = 64;

/// How the scheduler runs its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SchedulerOptions {
    /// Most sequences per decode step (1: one request at a time).
    pub max_batch: usize,
    /// Prompt tokens per prefill chunk while others run.
    pub prefill_chunk: usize,
    /// A seeded request makes the same codes whatever runs beside it, on every CPU: a lone
    /// sequence's decode step is padded to two rows and prompts are prefilled in the same
    /// chunks alone as beside others (`--batch-invariant`). Engines that cannot pad then run
    /// one request at a time.
    #[serde(default)]
    pub batch_invariant: bool,
    /// Bound of the voice-prefix cache ([`super::prefix`]) in MiB; 0 turns it off. It is off
    /// batch-invariant too: reused rows move the prefill's chunks.
    #[serde(default = "default_prefix_cache_mib")]
    pub prefix_cache_mib: usize,
}

fn default_prefix_cache_mib() -> usize {
    DEFAULT_PREFIX_CACHE_MIB
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            batch_invariant: false,
            prefix_cache_mib: DEFAULT_PREFIX_CACHE_MIB,
        }
    }
}

enum JobEvent {
    Code(u32),
    Done(Result<Generation, EngineError>),
}

struct Job {
    prompt: Vec<u32>,
    /// Leading prompt tokens that every request of its voice shares (the cache may give them).
    shared: usize,
    params: GenerationParams,
    /// The request's token (client gone, deadline, shutdown).
    cancel: CancelToken,
    /// This job's: the caller's code sink asked to stop.
    stop: CancelToken,
    events: mpsc::Sender<JobEvent>,
}

impl Job {
    fn ended(&self) -> bool {
        self.cancel.is_cancelled() || self.stop.is_cancelled()
    }

    fn done(&self, result: Result<Generation, EngineError>) {
        // The caller may have gone (a panic on its side); nobody is left to tell.
        let _ = self.events.send(JobEvent::Done(result));
    }

    /// The callback a sequence calls with each code: hands it to the caller, and stops when the
    /// caller asked to or is gone.
    fn on_code(&self) -> impl FnMut(u32) -> ControlFlow<()> + '_ {
        |code| {
            if self.events.send(JobEvent::Code(code)).is_err() || self.stop.is_cancelled() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
}

/// Live numbers of the scheduler, for `/metrics`.
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Sequences in the running batch now.
    pub running: AtomicUsize,
    /// Decode steps run, and the sequences they ran in all (their ratio is the mean batch size).
    pub steps: AtomicU64,
    pub step_rows: AtomicU64,
    /// The largest batch a step has run.
    pub peak_batch: AtomicUsize,
    /// Throwaway rows that padded lone sequences' steps (`--batch-invariant`).
    pub pad_rows: AtomicU64,
    /// Prompt tokens whose KV came from the voice-prefix cache instead of a prefill.
    pub cached_tokens: AtomicU64,
}

/// The handle to the thread that owns the engine.
pub struct Scheduler {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<SchedulerStats>,
    max_batch: usize,
}

impl Scheduler {
    /// Moves `engine` onto its own thread. It batches when the backbone can and
    /// `opts.max_batch` is above 1.
    pub fn start(
        mut engine: Box<dyn Engine>,
        candidates: Candidates,
        opts: SchedulerOptions,
    ) -> Result<Self, EngineError> {
        let max_batch = Self::places(engine.as_mut(), &opts);
        if opts.batch_invariant && max_batch == 1 && opts.max_batch > 1 {
            tracing::warn!(
                "--batch-invariant: this engine cannot pad a lone decode step, so requests run one at a time"
            );
        }
        let stats = Arc::new(SchedulerStats::default());
        let (tx, rx) = mpsc::channel::<Job>();
        let thread_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("onebit-scheduler".into())
            .spawn(move || {
                let mut lane = Lane {
                    candidates,
                    stats: thread_stats,
                    waiting: VecDeque::new(),
                    jobs: rx,
                };
                if max_batch > 1 {
                    let cache_bytes = if opts.batch_invariant {
                        0
                    } else {
                        opts.prefix_cache_mib.saturating_mul(1 << 20)
                    };
                    lane.batched(
                        engine.as_mut(),
                        max_batch,
                        opts.prefill_chunk.max(1),
                        opts.batch_invariant,
                        PrefixCache::new(cache_bytes),
                    );
                } else {
                    lane.one_at_a_time(engine.as_mut());
                }
            })
            .map_err(|e| EngineError::Worker(format!("cannot start the scheduler thread: {e}")))?;
        Ok(Self {
            jobs: Some(tx),
            thread: Some(thread),
            stats,
            max_batch,
        })
    }

    /// Requests that will generate side by side on `engine` under `opts`: `opts.max_batch` when
    /// the backbone can batch (and pad, batch-invariant), else 1.
    pub fn places(engine: &mut dyn Engine, opts: &SchedulerOptions) -> usize {
        match engine.backbone().and_then(|b| b.batch()) {
            Some(b) if !opts.batch_invariant || b.can_pad() => opts.max_batch.max(1),
            _ => 1,
        }
    }

    /// Sequences one decode step runs at most (1 when the engine cannot batch).
    pub fn max_batch(&self) -> usize {
        self.max_batch
    }

    pub fn stats(&self) -> &SchedulerStats {
        &self.stats
    }

    /// Generates for `prompt` among whatever else runs, calling `on_code` with each code on the
    /// caller's thread. When `on_code` asks to stop, the sequence leaves the batch at its next
    /// step and the generation ends `Cancelled` with the codes `on_code` saw.
    pub fn generate(
        &self,
        prompt: &[u32],
        params: &GenerationParams,
        cancel: &CancelToken,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        self.submit(prompt, params, cancel)?.wait(on_code)
    }

    /// [`Scheduler::generate`] for a prompt whose first `shared` tokens are the same for every
    /// request of its voice: their KV may come from the voice-prefix cache, and is kept there.
    pub fn generate_shared(
        &self,
        prompt: &[u32],
        shared: usize,
        params: &GenerationParams,
        cancel: &CancelToken,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        self.queue(prompt, shared, params, cancel)?.wait(on_code)
    }

    /// Queues a generation behind those already queued; [`Pending::wait`] follows it.
    pub fn submit(
        &self,
        prompt: &[u32],
        params: &GenerationParams,
        cancel: &CancelToken,
    ) -> Result<Pending, EngineError> {
        self.queue(prompt, 0, params, cancel)
    }

    fn queue(
        &self,
        prompt: &[u32],
        shared: usize,
        params: &GenerationParams,
        cancel: &CancelToken,
    ) -> Result<Pending, EngineError> {
        let (events, rx) = mpsc::channel();
        let stop = CancelToken::new();
        let job = Job {
            prompt: prompt.to_vec(),
            shared: shared.min(prompt.len()),
            params: params.clone(),
            cancel: cancel.clone(),
            stop: stop.clone(),
            events,
        };
        self.jobs
            .as_ref()
            .ok_or_else(gone)?
            .send(job)
            .map_err(|_| gone())?;
        Ok(Pending { rx, stop })
    }
}

fn gone() -> EngineError {
    EngineError::Unavailable("the scheduler thread has stopped (a panic inside the engine)".into())
}

/// A queued or running generation.
pub struct Pending {
    rx: mpsc::Receiver<JobEvent>,
    stop: CancelToken,
}

impl Pending {
    /// Hands each code to `on_code` as it is made, and returns the generation when it ends.
    pub fn wait(
        self,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        let mut seen = 0usize;
        loop {
            match self.rx.recv().map_err(|_| gone())? {
                JobEvent::Code(code) => {
                    if self.stop.is_cancelled() {
                        continue;
                    }
                    seen += 1;
                    if on_code(code).is_break() {
                        self.stop.cancel();
                    }
                }
                JobEvent::Done(Ok(mut generation)) => {
                    if self.stop.is_cancelled() {
                        // Codes made after the caller stopped were never seen: they are not its.
                        generation.codes.truncate(seen);
                        generation.stop = StopReason::Cancelled;
                    }
                    return Ok(generation);
                }
                JobEvent::Done(Err(e)) => return Err(e),
            }
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Nobody follows this generation any more: it leaves the batch at its next step.
        self.stop.cancel();
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        // Closing the channel ends the thread once its running jobs are done.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The scheduler thread's state.
struct Lane {
    candidates: Candidates,
    stats: Arc<SchedulerStats>,
    waiting: VecDeque<Job>,
    jobs: mpsc::Receiver<Job>,
}

/// A sequence in the running batch: its job, its state and the token it feeds next.
struct Running {
    job: Job,
    seq: Sequence,
    next: u32,
}

/// A sequence being prefilled in the slot after the running ones.
struct Prefill {
    job: Job,
    seq: Sequence,
    done: usize,
}

impl Lane {
    /// Takes every job that has arrived; blocks for one when `idle`. False when the channel is
    /// closed and nothing is left to do.
    fn take_jobs(&mut self, idle: bool) -> bool {
        if idle && self.waiting.is_empty() {
            match self.jobs.recv() {
                Ok(job) => self.waiting.push_back(job),
                Err(_) => return false,
            }
        }
        while let Ok(job) = self.jobs.try_recv() {
            self.waiting.push_back(job);
        }
        // A job cancelled while it waited ends here, before it costs a prefill.
        self.waiting.retain(|job| {
            if job.ended() {
                job.done(Ok(Generation {
                    codes: Vec::new(),
                    stop: StopReason::Cancelled,
                    prompt_tokens: job.prompt.len(),
                    seed: job.params.sampling.seed.unwrap_or_default(),
                    prefill: Duration::ZERO,
                    decode: Duration::ZERO,
                    turn_wait: crate::runtime::TurnWait::default(),
                    npu_commands: None,
                    cached_tokens: 0,
                }));
                false
            } else {
                true
            }
        });
        true
    }

    fn one_at_a_time(&mut self, engine: &mut dyn Engine) {
        while self.take_jobs(true) {
            let Some(job) = self.waiting.pop_front() else {
                continue;
            };
            // Declared after the job: should the engine panic, the count drops before the job's
            // channel does, so its caller never hears of the end while it is still counted.
            let counted = Counted::new(&self.stats, 1);
            // One token for the engine that fires with either of the job's: a caller that stops
            // listening ends the prefill too, not only the steps after it.
            let either = CancelToken::new();
            let _linked = [&job.cancel, &job.stop].map(|t| {
                let either = either.clone();
                t.on_cancel(move || either.cancel())
            });
            let result = engine.generate(
                &self.candidates,
                &job.prompt,
                &job.params,
                &either,
                &mut job.on_code(),
            );
            drop(counted);
            job.done(result);
        }
    }

    fn batched(
        &mut self,
        engine: &mut dyn Engine,
        max_batch: usize,
        chunk: usize,
        invariant: bool,
        cache: PrefixCache,
    ) {
        let Some(backbone) = engine.backbone() else {
            return self.one_at_a_time(engine);
        };
        let limits = SequenceLimits {
            budget: backbone.budget(),
            static_kv: backbone.static_kv(),
            layout: backbone.logits_layout(),
        };
        let Some(backbone) = backbone.batch() else {
            return self.one_at_a_time(engine);
        };
        // Its own handle: the loop below borrows `self` mutably while the batch holds this.
        let stats = self.stats.clone();
        let mut batch = Batch {
            count: Counted::new(&stats, 0),
            backbone,
            running: Vec::with_capacity(max_batch),
            prefill: None,
            invariant,
            cache,
        };
        loop {
            let idle = batch.running.is_empty() && batch.prefill.is_none();
            if !self.take_jobs(idle) {
                return;
            }
            if batch.prefill.is_none() && batch.running.len() < max_batch {
                self.admit(&mut batch, &limits);
            }
            // Alone, a prefill runs whole; beside running sequences, one chunk per turn (and
            // always, batch-invariant: the same runs alone as beside others).
            let take = if batch.running.is_empty() && !invariant {
                usize::MAX
            } else {
                chunk
            };
            batch.prefill_some(take);
            if !batch.running.is_empty() {
                batch.step();
            }
        }
    }

    /// Starts the next waiting job's prefill in the slot after the running ones, or ends it at
    /// once when its prompt or settings are refused.
    fn admit(&mut self, batch: &mut Batch<'_>, limits: &SequenceLimits) {
        let Some(job) = self.waiting.pop_front() else {
            return;
        };
        let slot = batch.running.len();
        let started = Sequence::new(&self.candidates, &job.prompt, &job.params, limits)
            .and_then(|seq| batch.backbone.open(slot).map(|()| seq));
        match started {
            Ok(mut seq) => {
                let done = batch.reuse(slot, &job);
                seq.cached(done);
                batch.prefill = Some(Prefill { job, seq, done });
            }
            Err(e) => job.done(Err(e)),
        }
    }
}

/// The scheduler's running count while it lives: zero again when dropped, on a panic too.
struct Counted<'s>(&'s SchedulerStats);

impl<'s> Counted<'s> {
    fn new(stats: &'s SchedulerStats, running: usize) -> Self {
        let counted = Self(stats);
        counted.set(running);
        counted
    }

    fn set(&self, running: usize) {
        self.0.running.store(running, Ordering::Relaxed);
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.running.store(0, Ordering::Relaxed);
    }
}

/// The running batch: sequences in slots `0..running.len()` of the backbone's cache, and the one
/// being prefilled, always in the slot right after them.
struct Batch<'b> {
    /// First, so that it is dropped first: after a panic the count is zero before the running
    /// jobs' channels close.
    count: Counted<'b>,
    backbone: &'b mut dyn BatchBackbone,
    running: Vec<Running>,
    prefill: Option<Prefill>,
    /// Lone sequences' steps are padded to two rows.
    invariant: bool,
    cache: PrefixCache,
}

impl Batch<'_> {
    /// Starts the job's sequence, just opened in `slot`, with the cached KV rows of the longest
    /// beginning of its voice prefix the cache holds; returns how many prompt tokens they cover.
    /// At least two tokens are left to prefill: a one-row run rounds differently.
    fn reuse(&mut self, slot: usize, job: &Job) -> usize {
        let usable = job.shared.min(job.prompt.len().saturating_sub(2));
        if !self.cache.enabled() || usable == 0 {
            return 0;
        }
        let Some((n, rows)) = self.cache.find(&job.prompt[..usable]) else {
            return 0;
        };
        match self.backbone.load_rows(slot, rows, n) {
            Ok(()) => {
                self.count
                    .0
                    .cached_tokens
                    .fetch_add(n as u64, Ordering::Relaxed);
                n
            }
            Err(e) => {
                // The slot is still open and empty: the prompt is prefilled whole.
                tracing::warn!("cannot reuse {n} cached prompt tokens: {e}");
                0
            }
        }
    }

    /// Keeps the voice prefix of the prompt just prefilled in `slot`, unless the cache holds it.
    fn remember(&mut self, slot: usize, job: &Job) {
        let prefix = &job.prompt[..job.shared];
        if !self.cache.enabled() || prefix.is_empty() || self.cache.holds(prefix) {
            return;
        }
        match self.backbone.save_rows(slot, prefix.len()) {
            Some(Ok(rows)) => self.cache.insert(prefix, rows),
            Some(Err(e)) => tracing::warn!("cannot keep the voice prefix's KV rows: {e}"),
            None => {}
        }
    }

    /// Runs up to `take` more prompt tokens of the prefill; when its prompt is in, its first code
    /// is sampled and it joins the running batch (or ends there).
    fn prefill_some(&mut self, take: usize) {
        let Some(mut p) = self.prefill.take() else {
            return;
        };
        if p.job.ended() {
            p.job.done(Ok(p.seq.cancelled()));
            return;
        }
        let slot = self.running.len();
        let end = p.done + super::next_chunk(p.job.prompt.len() - p.done, take);
        let cancel = [&p.job.cancel, &p.job.stop];
        let logits = match self
            .backbone
            .extend(slot, &p.job.prompt[p.done..end], &cancel)
        {
            Ok(logits) => logits,
            // Only this sequence was in the run; the slot is opened anew by the next admit.
            Err(EngineError::Interrupted) => return p.job.done(Ok(p.seq.cancelled())),
            Err(e) => {
                // A failed run leaves the cache unusable for every sequence in it.
                p.job.done(Err(again(&e)));
                return self.fail_all(&e);
            }
        };
        p.done = end;
        if p.done < p.job.prompt.len() {
            self.prefill = Some(p);
            return;
        }
        let advanced = p.seq.advance(logits, &p.job.cancel, &mut p.job.on_code());
        // The slot holds the whole prompt until the next sequence opens one.
        self.remember(slot, &p.job);
        match advanced {
            Ok(Some(next)) => {
                self.running.push(Running {
                    job: p.job,
                    seq: p.seq,
                    next,
                });
                self.publish();
            }
            Ok(None) => p.job.done(Ok(p.seq.finish())),
            Err(e) => p.job.done(Err(e)),
        }
    }

    /// One decode step for the whole running batch; sequences that end leave it.
    fn step(&mut self) {
        let stats = self.count.0;
        // Cancelled sequences leave before the step, not after paying for it.
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].job.ended() {
                if let Some(r) = self.leave(i) {
                    r.job.done(Ok(r.seq.cancelled()));
                }
            } else {
                i += 1;
            }
        }
        if self.running.is_empty() {
            return;
        }
        let tokens: Vec<u32> = self.running.iter().map(|r| r.next).collect();
        let pad = usize::from(self.invariant && tokens.len() == 1);
        let rows = match self.backbone.step_padded(&tokens, pad) {
            Ok(rows) => rows,
            Err(e) => return self.fail_all(&e),
        };
        stats.pad_rows.fetch_add(pad as u64, Ordering::Relaxed);
        stats.steps.fetch_add(1, Ordering::Relaxed);
        stats
            .step_rows
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        stats.peak_batch.fetch_max(tokens.len(), Ordering::Relaxed);
        let width = rows.len() / tokens.len();
        let mut ended = Vec::new();
        for (i, r) in self.running.iter_mut().enumerate() {
            let row = &rows[i * width..(i + 1) * width];
            match r.seq.advance(row, &r.job.cancel, &mut r.job.on_code()) {
                Ok(Some(next)) => r.next = next,
                Ok(None) => ended.push((i, None)),
                Err(e) => ended.push((i, Some(e))),
            }
        }
        // Highest slot first, so the moves never touch a sequence that is yet to leave.
        for (i, err) in ended.into_iter().rev() {
            let Some(r) = self.leave(i) else {
                return;
            };
            match err {
                None => r.job.done(Ok(r.seq.finish())),
                Some(e) => r.job.done(Err(e)),
            }
        }
    }

    /// Shows the batch's size in the stats. Called as the batch changes, before any job that left
    /// it hears that it is done: a caller that has its answer must never still be counted in
    /// the batch.
    fn publish(&self) {
        self.count.set(self.running.len());
    }

    /// Takes the sequence in slot `i` out of the batch: the last running one moves into its slot,
    /// and a prefill in progress moves down into the slot that frees, so it stays right after
    /// the running ones. `None` when moving a cache failed and every sequence was ended.
    fn leave(&mut self, i: usize) -> Option<Running> {
        let n = self.running.len();
        let moved = self.backbone.close(i, n).and_then(|()| match self.prefill {
            Some(_) => self.backbone.close(n - 1, n + 1),
            None => Ok(()),
        });
        let r = self.running.swap_remove(i);
        self.publish();
        if let Err(e) = moved {
            r.job.done(Err(again(&e)));
            self.fail_all(&e);
            return None;
        }
        Some(r)
    }

    /// Ends every sequence, running or prefilling, with `e`: a failed run leaves their cache
    /// unusable.
    fn fail_all(&mut self, e: &EngineError) {
        let n = self.running.len() + usize::from(self.prefill.is_some());
        tracing::warn!("a batched run failed; ending the {n} sequences in the batch: {e}");
        let running = std::mem::take(&mut self.running);
        self.publish();
        for r in running {
            r.job.done(Err(again(e)));
        }
        if let Some(p) = self.prefill.take() {
            p.job.done(Err(again(e)));
        }
    }
}

/// The same failure for another sequence of the batch (errors are not `Clone`: ONNX Runtime's
/// own text is what they carry).
fn again(e: &EngineError) -> EngineError {
    match e {
        EngineError::PromptTooLong { prompt, budget } => EngineError::PromptTooLong {
            prompt: *prompt,
            budget: *budget,
        },
        EngineError::StaticKvFull { prompt, capacity } => EngineError::StaticKvFull {
            prompt: *prompt,
            capacity: *capacity,
        },
        EngineError::Graph(m) => EngineError::Graph(m.clone()),
        EngineError::Llama(m) => EngineError::Llama(m.clone()),
        other => EngineError::Runtime(other.to_string()),
    }
}
