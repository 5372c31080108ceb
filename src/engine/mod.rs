//! The backbone: prompt ids in, speech codes out.
//!
//! A [`Backbone`] is anything that turns tokens into next-token logits while keeping its own KV
//! state (the in-process ONNX Runtime session, or onnxruntime-genai's generator). [`generate`] is the one generation loop over any
//! backbone: budget check, min/max new tokens, speech-constrained sampling, stop ids, cancellation
//! and the per-code callback all live here once.

pub mod device;
#[cfg(feature = "llama")]
pub mod llama;
pub mod oga;
pub mod ort_engine;
pub mod prefix;
pub mod ryzenai;
pub mod sampler;
pub mod scheduler;
mod sequence;
pub mod worker;

use std::ops::ControlFlow;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub use device::{Device, DeviceChoice};
#[cfg(feature = "llama")]
pub use llama::{LlamaBackbone, LlamaOptions};
pub use oga::{OgaBackbone, OgaLoadError, OgaOptions, OgaStep};
pub use ort_engine::{KvMode, OrtBackbone, OrtOptions};
pub use prefix::{KvRows, PrefixCache};
pub use ryzenai::{CustomOpsRoute, ProviderSetup};
pub use sampler::{
    Candidates, InvalidSampling, LogitsLayout, SampleError, Sampler, SamplingParams,
};
pub use scheduler::{Scheduler, SchedulerOptions, SchedulerStats};
pub use sequence::{Sequence, SequenceLimits};
// The thread plan is the runtime's (the codec shares it); the engine's options carry it.
pub use crate::runtime::{CpuTopology, ThreadPlan, ThreadPolicy};
pub use worker::{
    ResidencyGate, WorkerConfig, WorkerEngine, WorkerHandle, WorkerState, WorkerTimeouts,
};

/// The vendor's minimum: the end token cannot win before 50 new codes.
pub const DEFAULT_MIN_NEW_TOKENS: usize = 50;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "the prompt has {prompt} tokens but the model's budget is {budget} tokens per sequence (prompt + generated); shorten the text or use a shorter reference voice"
    )]
    PromptTooLong { prompt: usize, budget: usize },
    /// The graph declares a fixed past length (AMD's NPU packages) and the prompt leaves no room
    /// in it.
    #[error(
        "the prompt needs {prompt} positions; this package's static KV cache holds {capacity} (prompt and generated codes together); shorten the text or use a shorter reference voice"
    )]
    StaticKvFull { prompt: usize, capacity: usize },
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// A cancel token fired inside a run that stops early ([`Backbone::prefill`],
    /// [`BatchBackbone::extend`]); the sequence it ran for is gone. Callers end that request as
    /// cancelled, never as a failure.
    #[error("stopped by its cancel token during the run")]
    Interrupted,
    #[error("onnx runtime: {0}")]
    Runtime(String),
    /// A call into llama.cpp failed (the engine's own words, or llama.cpp's log lines).
    #[error("llama.cpp: {0}")]
    Llama(String),
    #[error("model graph: {0}")]
    Graph(String),
    #[error("sampling: {0}")]
    Sample(#[from] SampleError),
    /// A sampling setting out of range, naming the parameter.
    #[error("invalid generation settings: {0}")]
    Sampling(#[from] InvalidSampling),
    /// Settings the engine itself refuses (onnxruntime-genai's options, paths), as its text.
    #[error("invalid generation settings: {0}")]
    Params(String),
    /// A call into onnxruntime-genai failed; `message` is OGA's own error text.
    #[error("onnxruntime-genai {call}: {message}")]
    Oga { call: &'static str, message: String },
    #[error(transparent)]
    OgaLoad(#[from] OgaLoadError),
    /// `models optimize` cut the package's lm_head to the speech ids, which only our loop reads.
    #[error(
        "--engine oga cannot run this package: {} says its lm_head was cut to the speech ids (`models optimize`), and onnxruntime-genai needs one logit per vocabulary id; use --engine ort here, or --engine oga on {}",
        .manifest.display(),
        .source_package.as_deref().map_or_else(|| "the unoptimized source package".to_owned(), |s| format!("the source package {s}"))
    )]
    OgaCompactHead {
        manifest: std::path::PathBuf,
        source_package: Option<String>,
    },
    /// The execution provider could not be set up (no NPU, no CUDA in this runtime, ...).
    #[error("device: {0}")]
    Device(String),
    /// The engine worker could not be started or spoke out of turn.
    #[error("engine worker: {0}")]
    Worker(String),
    /// The engine worker ended while a request was running; the next request starts a new one.
    #[error(
        "the engine worker (pid {pid}) ended during the request ({ending}); the next request starts a new worker"
    )]
    WorkerCrashed { pid: u32, ending: String },
    /// The engine worker made no progress in time (no `loaded` within the load timeout, no code
    /// within the step timeout, no answer to a cancel) and was stopped by the stop policy.
    #[error("the engine worker (pid {pid}) hung: {detail}")]
    WorkerHung { pid: u32, detail: String },
    /// The engine serves nothing until something outside it changes: an earlier worker that
    /// holds the NPU has not exited yet, or a respawned worker's NPU residency was not proven.
    #[error("the engine is unavailable: {0}")]
    Unavailable(String),
}

impl EngineError {
    /// Whether a retry may cure this failure: a worker that died or hung (the next request gets
    /// a fresh one), the runtime or the device failing at run time (the NPU's one-off
    /// first-dispatch timeout). Refused input, bad settings and a cancelled run are not.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::WorkerCrashed { .. } | Self::Runtime(_) | Self::Device(_) | Self::Worker(_)
        )
    }
}

impl From<ort::Error<ort::session::builder::SessionBuilder>> for EngineError {
    fn from(e: ort::Error<ort::session::builder::SessionBuilder>) -> Self {
        EngineError::Runtime(e.to_string())
    }
}

impl From<crate::runtime::session::SessionError> for EngineError {
    fn from(e: crate::runtime::session::SessionError) -> Self {
        use crate::runtime::session::SessionError;
        match e {
            SessionError::Ort(message) => EngineError::Runtime(message),
            SessionError::CustomOps { .. } => EngineError::Graph(e.to_string()),
        }
    }
}

impl From<ort::Error> for EngineError {
    fn from(e: ort::Error) -> Self {
        EngineError::Runtime(e.to_string())
    }
}

/// Stops a generation from another thread within one step. Loops poll it; a run that cannot
/// poll (one ONNX Runtime run over a long prompt) registers a hook with [`CancelToken::on_cancel`]
/// that stops it from the cancelling thread.
#[derive(Clone, Default)]
pub struct CancelToken(Arc<CancelState>);

type Hook = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct CancelState {
    fired: AtomicBool,
    /// Hooks by id; called under this lock, so once [`OnCancel`] is dropped its hook is not
    /// running and never runs again (a hook must not touch its own token; firing another is
    /// fine).
    hooks: Mutex<Vec<(u64, Hook)>>,
    next: AtomicU64,
}

impl std::fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("CancelToken")
            .field(&self.is_cancelled())
            .finish()
    }
}

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn cancel(&self) {
        let hooks = lock(&self.0.hooks);
        self.0.fired.store(true, Ordering::SeqCst);
        for (_, hook) in hooks.iter() {
            hook();
        }
    }
    pub fn is_cancelled(&self) -> bool {
        self.0.fired.load(Ordering::SeqCst)
    }
    /// Calls `hook` when the token fires, at once if it already has, until the guard is dropped.
    pub fn on_cancel(&self, hook: impl Fn() + Send + Sync + 'static) -> OnCancel<'_> {
        let id = self.0.next.fetch_add(1, Ordering::Relaxed);
        let mut hooks = lock(&self.0.hooks);
        if self.0.fired.load(Ordering::SeqCst) {
            hook();
        }
        hooks.push((id, Box::new(hook)));
        OnCancel { token: self, id }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A hook that panicked leaves the list as it was: still usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Keeps a [`CancelToken::on_cancel`] hook registered; dropping it removes the hook.
#[must_use = "the hook is removed when this is dropped"]
pub struct OnCancel<'a> {
    token: &'a CancelToken,
    id: u64,
}

impl Drop for OnCancel<'_> {
    fn drop(&mut self) {
        lock(&self.token.0.hooks).retain(|(id, _)| *id != self.id);
    }
}

/// Something that holds a sequence's KV state and gives next-token logits.
pub trait Backbone: Send {
    /// Forgets the previous sequence.
    fn reset(&mut self);
    /// Appends `tokens` to the sequence and returns the logits row of the last one, laid out as
    /// [`Backbone::logits_layout`] says. The first call after `reset` is the prefill.
    fn append(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError>;
    /// [`Backbone::append`] for a prompt, which may take seconds: a backbone that can stop inside
    /// the run does so when one of `cancel` fires, with [`EngineError::Interrupted`] (the
    /// sequence is then gone: `reset` before the next). Others run it whole.
    fn prefill(&mut self, tokens: &[u32], _cancel: &[&CancelToken]) -> Result<&[f32], EngineError> {
        self.append(tokens)
    }
    /// Which token each logit of a row belongs to: index = id unless the model has a compact head.
    fn logits_layout(&self) -> LogitsLayout {
        LogitsLayout::Full
    }
    /// Tokens the sequence already holds.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Most tokens (prompt + generated) one sequence may hold.
    fn budget(&self) -> usize;
    /// The past length the graph declares as a number (a static KV cache), if it does.
    fn static_kv(&self) -> Option<usize> {
        None
    }
    fn describe(&self) -> String;
    /// Where the backbone runs.
    fn device(&self) -> Device {
        Device::Cpu
    }
    /// The same backbone as one that runs several sequences per step, when its graph allows it.
    fn batch(&mut self) -> Option<&mut dyn BatchBackbone> {
        None
    }
}

/// A backbone that runs several sequences side by side: each lives in a slot of one KV cache,
/// the running ones in slots `0..n`, each with its own length and positions. A new sequence is
/// prefilled alone in slot `n` and then joins the steps; one that ends leaves at once, and the
/// last slot's sequence moves into its place (as `Vec::swap_remove` moves the last element).
pub trait BatchBackbone {
    /// Starts a sequence in `slot`, forgetting what the slot held.
    fn open(&mut self, slot: usize) -> Result<(), EngineError>;
    /// Appends `tokens` to the sequence in `slot` alone (its prefill, or one chunk of it) and
    /// returns the logits row of the last one. As [`Backbone::prefill`], it may end early with
    /// [`EngineError::Interrupted`] when one of `cancel` fires; the slot's sequence is then gone
    /// (`open` starts it again) and the others are untouched.
    fn extend(
        &mut self,
        slot: usize,
        tokens: &[u32],
        cancel: &[&CancelToken],
    ) -> Result<&[f32], EngineError>;
    /// Appends `tokens[i]` to the sequence in slot `i`, for every `i`, in one run, and returns
    /// their logits rows one after another. A failure leaves no sequence usable.
    fn step(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        self.step_padded(tokens, 0)
    }
    /// [`BatchBackbone::step`] with `pad` throwaway rows run after the sequences' rows, in the
    /// slots after theirs; the sequences in those slots (none, or one being prefilled) are left
    /// as they were, and only the sequences' logits rows are returned. For CPU kernels that add
    /// in another order for one row than for several: a lone sequence padded to two rows gets
    /// the logits it gets beside any other (`--batch-invariant`).
    fn step_padded(&mut self, tokens: &[u32], pad: usize) -> Result<&[f32], EngineError>;
    /// Whether [`BatchBackbone::step_padded`] can pad.
    fn can_pad(&self) -> bool {
        false
    }
    /// Ends the sequence in `slot` of the `running` ones; the last one moves into its slot.
    fn close(&mut self, slot: usize, running: usize) -> Result<(), EngineError>;
    /// A copy of the first `len` positions of `slot`'s cache, for [`BatchBackbone::load_rows`];
    /// `None` when this backbone cannot copy its cache.
    fn save_rows(&mut self, _slot: usize, _len: usize) -> Option<Result<KvRows, EngineError>> {
        None
    }
    /// Starts the sequence just opened in `slot` with `rows` (from [`BatchBackbone::save_rows`]
    /// of this backbone) cut to their first `len` positions; it continues after them.
    fn load_rows(&mut self, _slot: usize, _rows: &KvRows, _len: usize) -> Result<(), EngineError> {
        Err(EngineError::Runtime(
            "this backbone cannot load cached KV rows".into(),
        ))
    }
}

/// How many of the `left` prompt tokens the next prefill run takes: `chunk` (at least 2), but
/// never leaving one token to a run of its own (a one-row run is the one the int4 kernels round
/// differently); only a prompt of one token is a one-token run.
pub fn next_chunk(left: usize, chunk: usize) -> usize {
    let take = left.min(chunk.max(2));
    if left - take == 1 { take + 1 } else { take }
}

/// [`next_chunk`] under a hard `limit` (a package's `search.chunk_size`): where the limit binds,
/// the split is onnxruntime-genai's own (`min(limit, left)`, a short last run included), since
/// a run longer than the limit may be one the graph or its provider cannot take.
pub fn next_chunk_within(left: usize, chunk: usize, limit: Option<usize>) -> usize {
    match limit {
        Some(limit) if chunk >= limit => left.min(limit.max(1)),
        Some(limit) => next_chunk(left, chunk).min(limit.max(1)),
        None => next_chunk(left, chunk),
    }
}

/// Something that turns a prompt into speech codes: an in-process [`Backbone`] under the shared
/// loop ([`LocalEngine`]), or a proxy to another process that runs that loop itself.
pub trait Engine: Send {
    fn generate(
        &mut self,
        candidates: &Candidates,
        prompt: &[u32],
        params: &GenerationParams,
        cancel: &CancelToken,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError>;
    fn describe(&self) -> String;
    /// Where the backbone runs.
    fn device(&self) -> Device {
        Device::Cpu
    }
    /// The worker child behind this engine, if any (pid, residency, how it ended).
    fn worker(&self) -> Option<WorkerHandle> {
        None
    }
    /// Most tokens (prompt + generated) one sequence may hold, when the engine knows better than
    /// the package's config (a static KV cache smaller than `search.max_length`).
    fn budget(&self) -> Option<usize> {
        None
    }
    /// The backbone in this process, when the engine runs one here (the scheduler batches it).
    fn backbone(&mut self) -> Option<&mut dyn Backbone> {
        None
    }
    /// The same engine with every run of a backbone in this process waiting its turn with the
    /// codec, and whether it does (an engine whose backbone runs elsewhere does not).
    fn take_turns(&mut self, _turns: std::sync::Arc<crate::runtime::Turns>) -> bool {
        false
    }
}

/// A backbone in this process, driven by [`generate`].
pub struct LocalEngine(pub Box<dyn Backbone>);

impl Engine for LocalEngine {
    fn generate(
        &mut self,
        candidates: &Candidates,
        prompt: &[u32],
        params: &GenerationParams,
        cancel: &CancelToken,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        generate(self.0.as_mut(), candidates, prompt, params, cancel, on_code)
    }

    fn describe(&self) -> String {
        self.0.describe()
    }

    fn device(&self) -> Device {
        self.0.device()
    }

    fn budget(&self) -> Option<usize> {
        Some(self.0.budget())
    }

    fn backbone(&mut self) -> Option<&mut dyn Backbone> {
        Some(self.0.as_mut())
    }

    fn take_turns(&mut self, turns: std::sync::Arc<crate::runtime::Turns>) -> bool {
        let inner = std::mem::replace(&mut self.0, Box::new(Vacant));
        self.0 = Box::new(TakingTurns::new(inner, turns));
        true
    }
}

/// What a [`LocalEngine`] holds for the instant its backbone moves into a wrapper.
struct Vacant;

impl Backbone for Vacant {
    fn reset(&mut self) {}
    fn append(&mut self, _: &[u32]) -> Result<&[f32], EngineError> {
        Err(EngineError::Params("no backbone".into()))
    }
    fn len(&self) -> usize {
        0
    }
    fn budget(&self) -> usize {
        0
    }
    fn describe(&self) -> String {
        "none".into()
    }
}

/// A backbone whose every run waits its turn with the codec ([`crate::runtime::Turns`]).
pub struct TakingTurns {
    inner: Box<dyn Backbone>,
    turns: std::sync::Arc<crate::runtime::Turns>,
    /// The inner backbone's [`BatchBackbone::can_pad`] (`batch` needs `&mut`).
    can_pad: bool,
}

impl TakingTurns {
    pub fn new(mut inner: Box<dyn Backbone>, turns: std::sync::Arc<crate::runtime::Turns>) -> Self {
        let can_pad = inner.batch().is_some_and(|b| b.can_pad());
        Self {
            inner,
            turns,
            can_pad,
        }
    }

    fn batched(&mut self) -> Result<&mut dyn BatchBackbone, EngineError> {
        self.inner
            .batch()
            .ok_or_else(|| EngineError::Params("this backbone runs one sequence at a time".into()))
    }
}

impl Backbone for TakingTurns {
    fn reset(&mut self) {
        self.inner.reset();
    }
    fn append(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        let (inner, turns) = (&mut self.inner, &self.turns);
        turns.backbone(tokens.len(), || inner.append(tokens))
    }
    fn prefill(&mut self, tokens: &[u32], cancel: &[&CancelToken]) -> Result<&[f32], EngineError> {
        let (inner, turns) = (&mut self.inner, &self.turns);
        turns.backbone(tokens.len(), || inner.prefill(tokens, cancel))
    }
    fn logits_layout(&self) -> LogitsLayout {
        self.inner.logits_layout()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn budget(&self) -> usize {
        self.inner.budget()
    }
    fn static_kv(&self) -> Option<usize> {
        self.inner.static_kv()
    }
    fn describe(&self) -> String {
        format!("{}; taking turns with the codec", self.inner.describe())
    }
    fn device(&self) -> Device {
        self.inner.device()
    }
    fn batch(&mut self) -> Option<&mut dyn BatchBackbone> {
        if self.inner.batch().is_some() {
            Some(self)
        } else {
            None
        }
    }
}

impl BatchBackbone for TakingTurns {
    fn open(&mut self, slot: usize) -> Result<(), EngineError> {
        self.batched()?.open(slot)
    }
    fn extend(
        &mut self,
        slot: usize,
        tokens: &[u32],
        cancel: &[&CancelToken],
    ) -> Result<&[f32], EngineError> {
        let turns = self.turns.clone();
        let inner = self.batched()?;
        turns.backbone(tokens.len(), || inner.extend(slot, tokens, cancel))
    }
    fn step_padded(&mut self, tokens: &[u32], pad: usize) -> Result<&[f32], EngineError> {
        let turns = self.turns.clone();
        let inner = self.batched()?;
        // A step appends one token to each sequence.
        turns.backbone(1, || inner.step_padded(tokens, pad))
    }
    fn can_pad(&self) -> bool {
        self.can_pad
    }
    fn close(&mut self, slot: usize, running: usize) -> Result<(), EngineError> {
        self.batched()?.close(slot, running)
    }
    fn save_rows(&mut self, slot: usize, len: usize) -> Option<Result<KvRows, EngineError>> {
        self.batched().ok()?.save_rows(slot, len)
    }
    fn load_rows(&mut self, slot: usize, rows: &KvRows, len: usize) -> Result<(), EngineError> {
        self.batched()?.load_rows(slot, rows, len)
    }
}

/// How the llama engine's attention keeps and reads its KV cache (`--llama-attention`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LlamaAttention {
    /// llama.cpp's own defaults, as its tools and the vendor's neutts run it: an f16 KV cache
    /// (half the memory) and flash attention where the backend has it.
    #[default]
    Fast,
    /// A float32 KV cache and attention without the flash kernels: the logits follow the ONNX
    /// route's float32 computation within float32 rounding (measured on the test packages: 6e-5
    /// on a scale of 20, where f16 KV alone moves them by 0.04 and CPU flash attention by 0.08).
    /// Slower: 0.8x the decode rate on the real-shape model on 2 cores (docs/performance.md).
    Exact,
}

impl std::str::FromStr for LlamaAttention {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exact" => Ok(Self::Exact),
            "fast" => Ok(Self::Fast),
            _ => Err(format!(
                "unknown llama attention {s:?} (supported: exact, fast)"
            )),
        }
    }
}

impl std::fmt::Display for LlamaAttention {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Exact => "exact attention (f32 KV)",
            Self::Fast => "fast attention (f16 KV, flash)",
        })
    }
}

/// Per-request generation settings.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct GenerationParams {
    pub sampling: SamplingParams,
    pub min_new_tokens: usize,
    /// Further bounded by the budget left after the prompt.
    pub max_new_tokens: Option<usize>,
}

impl Default for GenerationParams {
    fn default() -> Self {
        Self {
            sampling: SamplingParams::default(),
            min_new_tokens: DEFAULT_MIN_NEW_TOKENS,
            max_new_tokens: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop id won (the end token or an eos id).
    Stop(u32),
    /// max_new_tokens or the context budget was reached.
    Length,
    /// The cancel token fired or the callback asked to stop.
    Cancelled,
}

impl StopReason {
    /// The name clients, logs and metrics use: `stop`, `length` or `cancelled`.
    pub fn finish_reason(self) -> &'static str {
        match self {
            StopReason::Stop(_) => "stop",
            StopReason::Length => "length",
            StopReason::Cancelled => "cancelled",
        }
    }
}

/// What one generation produced, with its timings.
#[derive(Debug, Clone)]
pub struct Generation {
    pub codes: Vec<u32>,
    pub stop: StopReason,
    pub prompt_tokens: usize,
    pub seed: u64,
    /// The prefill's backbone runs, without their waits for codec runs (`turn_wait`).
    pub prefill: Duration,
    /// The decode steps alone: time spent inside `on_code` (a streaming codec, encoding, the
    /// caller's I/O) and the steps' waits for codec runs are left out, so stage timings add up
    /// instead of overlapping.
    pub decode: Duration,
    /// How long this generation's backbone runs waited for codec runs while it was prefilled
    /// and decoded (`--cpu-turns`): its own request's windows, and other requests' too.
    pub turn_wait: crate::runtime::TurnWait,
    /// Commands the NPU completed for this generation, by its driver's hardware-context counters
    /// (`None`: not on the NPU, or the counters could not be read).
    pub npu_commands: Option<u64>,
    /// Leading prompt tokens whose KV came from the voice-prefix cache: not prefilled, so not
    /// in `prefill`'s time.
    pub cached_tokens: usize,
}

/// The error for a sequence of `prompt` tokens that does not fit `budget`: named after the static
/// KV cache when that is what sets the limit.
pub(crate) fn too_long(prompt: usize, budget: usize, static_kv: Option<usize>) -> EngineError {
    match static_kv {
        Some(capacity) if capacity <= budget => EngineError::StaticKvFull { prompt, capacity },
        _ => EngineError::PromptTooLong { prompt, budget },
    }
}

/// Runs one generation: prefill the prompt, then one code per step until a stop id, the length
/// limit or cancellation. `on_code` sees each code as it is made and may stop the run.
pub fn generate(
    backbone: &mut dyn Backbone,
    candidates: &Candidates,
    prompt: &[u32],
    params: &GenerationParams,
    cancel: &CancelToken,
    on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
) -> Result<Generation, EngineError> {
    let limits = SequenceLimits {
        budget: backbone.budget(),
        static_kv: backbone.static_kv(),
        layout: backbone.logits_layout(),
    };
    let mut seq = Sequence::new(candidates, prompt, params, &limits)?;
    backbone.reset();
    if cancel.is_cancelled() {
        return Ok(seq.cancelled());
    }
    let mut logits = match backbone.prefill(prompt, &[cancel]) {
        Err(EngineError::Interrupted) => {
            backbone.reset();
            return Ok(seq.cancelled());
        }
        other => other?,
    };
    while let Some(next) = seq.advance(logits, cancel, on_code)? {
        logits = backbone.append(&[next])?;
    }
    Ok(seq.finish())
}

#[cfg(test)]
mod tests {
    use super::CancelToken;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn prefill_chunks_never_leave_one_token_for_a_run_of_its_own() {
        let runs = |len: usize, chunk: usize| {
            let (mut done, mut out) = (0, Vec::new());
            while done < len {
                let take = super::next_chunk(len - done, chunk);
                out.push(take);
                done += take;
            }
            out
        };
        assert_eq!(runs(130, 64), [64, 64, 2]);
        assert_eq!(runs(129, 64), [64, 65]);
        assert_eq!(runs(65, 64), [65]);
        assert_eq!(runs(64, 64), [64]);
        assert_eq!(runs(5, 2), [2, 3]);
        assert_eq!(runs(3, 1), [3]);
        assert_eq!(runs(4, 1), [2, 2]);
        assert_eq!(runs(1, 64), [1]);
        assert_eq!(runs(150, usize::MAX), [150]);
    }

    #[test]
    fn a_package_chunk_size_is_never_exceeded_and_splits_as_onnxruntime_genai_does() {
        let runs = |len: usize, chunk: usize, limit: Option<usize>| {
            let (mut done, mut out) = (0, Vec::new());
            while done < len {
                let take = super::next_chunk_within(len - done, chunk, limit);
                out.push(take);
                done += take;
            }
            out
        };
        // onnxruntime-genai: min(chunk_size, left), a one-token tail run on its own.
        assert_eq!(runs(129, 64, Some(64)), [64, 64, 1]);
        assert_eq!(runs(10, 4, Some(4)), [4, 4, 2]);
        assert_eq!(runs(3, 64, Some(64)), [3]);
        // A smaller chunk of our own under the limit keeps our split, which stays within it.
        assert_eq!(runs(129, 32, Some(64)), [32, 32, 32, 33]);
        assert_eq!(runs(129, 64, None), [64, 65]);
        // Our split's minimum of 2 never beats a limit below it.
        assert_eq!(runs(3, 1, Some(2)), [2, 1]);
    }

    #[test]
    fn a_hook_runs_when_its_token_fires_and_never_after_its_guard_is_gone() {
        let token = CancelToken::new();
        let calls = Arc::new(AtomicUsize::new(0));
        let hook = || {
            let calls = Arc::clone(&calls);
            move || {
                calls.fetch_add(1, Ordering::SeqCst);
            }
        };
        let guard = token.on_cancel(hook());
        assert_eq!(calls.load(Ordering::SeqCst), 0);
        // Fired by a clone on another thread, as a server's disconnect does.
        let other = token.clone();
        std::thread::spawn(move || other.cancel()).join().unwrap();
        assert!(token.is_cancelled());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        drop(guard);
        token.cancel();
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "a dropped guard's hook ran"
        );
        // A hook registered after the token fired runs at once.
        let _late = token.on_cancel(hook());
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // A hook may fire another token (the scheduler links a job's two tokens so).
        let (a, b) = (CancelToken::new(), CancelToken::new());
        let to_b = b.clone();
        let _link = a.on_cancel(move || to_b.cancel());
        a.cancel();
        assert!(b.is_cancelled());
    }
}
