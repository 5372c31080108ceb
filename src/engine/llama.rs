//! The llama.cpp backbone (`--engine llama`): a GGUF file run through llama.h, on the CPU or on a
//! GPU backend compiled in (Vulkan, ROCm, CUDA: cargo features). Our front end builds the prompt
//! ids and our loop samples: llama.cpp only turns ids into logits, keeping each sequence's KV in
//! its own sequence id, so the scheduler batches several sequences in one `llama_decode`.
//!
//! Where the model runs is what llama.cpp reports while it loads: the buffer each weight landed in
//! (its "model buffer size" lines, read from its log), never assumed from the flag asked; its
//! "offloaded N/M layers" line only repeats the request and is shown beside that evidence.

use std::cell::RefCell;
use std::ffi::{CStr, CString, c_char, c_void};
use std::fmt;
use std::ptr::NonNull;
use std::sync::Once;

use llama_cpp_sys_2 as sys;

use super::{Backbone, BatchBackbone, Device, EngineError, LlamaAttention};
use crate::package::{BackboneFormat, ModelPackage};

/// How to load a GGUF backbone.
#[derive(Debug, Clone)]
pub struct LlamaOptions {
    /// Threads for decode and prefill.
    pub threads: usize,
    /// `Device::Cpu`: every layer on the CPU; `Cuda`/`Vulkan`/`Rocm`: every layer on the GPUs of
    /// that backend (the build must include it).
    pub device: Device,
    /// Sequences one step may carry (the scheduler's `--max-batch`): llama.cpp sizes its KV
    /// cache for this many up front.
    pub max_batch: usize,
    pub attention: LlamaAttention,
}

/// What llama.cpp said about where the model went while it loaded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    /// "offloaded N/M layers to GPU" (absent from a build without GPU offload).
    pub offloaded: Option<(u32, u32)>,
    /// Each buffer holding weights and its size in MiB ("CPU_Mapped", "Vulkan0", ...).
    pub weights: Vec<(String, f64)>,
    /// The GPU devices the model was given (name and description).
    pub gpus: Vec<String>,
}

impl Placement {
    /// Reads llama.cpp's load log.
    pub fn from_log(log: &str) -> Self {
        let mut p = Placement::default();
        for line in log.lines() {
            if let Some(rest) = line.split("offloaded ").nth(1)
                && let Some(frac) = rest.strip_suffix(" layers to GPU")
                && let Some((n, m)) = frac.split_once('/')
                && let (Ok(n), Ok(m)) = (n.trim().parse(), m.trim().parse())
            {
                p.offloaded = Some((n, m));
            }
            if let Some((head, size)) = line.split_once(" model buffer size =")
                && let Some(name) = head.split_whitespace().last()
                && let Some(mib) = size.trim().strip_suffix("MiB")
                && let Ok(mib) = mib.trim().parse()
            {
                p.weights.push((name.to_owned(), mib));
            }
        }
        p
    }

    /// MiB of weights llama.cpp put in a GPU's buffers (any buffer not named CPU...): the
    /// evidence of offload. Its "offloaded N/M layers" line repeats what was asked.
    pub fn gpu_weights_mib(&self) -> f64 {
        self.weights
            .iter()
            .filter(|(name, _)| !name.starts_with("CPU"))
            .map(|(_, mib)| mib)
            .sum()
    }
}

fn mib(n: &str, mib: f64) -> String {
    if mib < 10.0 {
        format!("{n} {mib:.1} MiB")
    } else {
        format!("{n} {mib:.0} MiB")
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.weights.is_empty() {
            f.write_str("no weight buffers reported")?;
        } else {
            let w: Vec<String> = self.weights.iter().map(|(n, m)| mib(n, *m)).collect();
            write!(f, "weights in {}", w.join(", "))?;
        }
        match self.offloaded {
            Some((n, m)) if !self.gpus.is_empty() => {
                write!(
                    f,
                    " (offload of {n}/{m} layers to {})",
                    self.gpus.join(", ")
                )
            }
            Some((_, m)) => write!(f, " (0/{m} layers offloaded)"),
            None => f.write_str(" (no GPU offload in this llama.cpp build)"),
        }
    }
}

thread_local! {
    /// The load log of the model this thread is loading (llama.cpp logs on the calling thread).
    static CAPTURE: RefCell<Option<String>> = const { RefCell::new(None) };
}

unsafe extern "C" fn on_log(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    // try_with: ggml may log from a static destructor after this thread's locals are gone.
    let _ = CAPTURE.try_with(|c| {
        if let Some(buf) = c.borrow_mut().as_mut() {
            buf.push_str(&text);
        }
    });
    if level == sys::GGML_LOG_LEVEL_ERROR {
        tracing::debug!(target: "llama.cpp", "error: {}", text.trim_end());
    } else {
        tracing::trace!(target: "llama.cpp", "{}", text.trim_end());
    }
}

/// llama.cpp's abort callback: true stops the running `llama_decode` (it then returns 2).
unsafe extern "C" fn on_abort(data: *mut c_void) -> bool {
    // SAFETY: `decode_piece` passes a pointer to its `&[&CancelToken]`, alive for the call, and
    // CancelToken is an atomic flag (read from whichever thread ggml computes on).
    let cancel = unsafe { &*(data as *const &[&super::CancelToken]) };
    cancel.iter().any(|c| c.is_cancelled())
}

/// llama.cpp's process-wide start: backends registered, its log routed to tracing.
fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        // SAFETY: called once, before any other llama.cpp call of this process.
        unsafe {
            sys::llama_log_set(Some(on_log), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: ggml returns NUL-terminated names that live as long as the backend registry.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A device llama.cpp has registered.
struct BackendDevice {
    dev: sys::ggml_backend_dev_t,
    backend: String,
    name: String,
    description: String,
    gpu: bool,
    integrated: bool,
}

fn devices() -> Vec<BackendDevice> {
    // SAFETY: the registry is filled by llama_backend_init and never shrinks.
    let n = unsafe { sys::ggml_backend_dev_count() };
    (0..n)
        .map(|i| unsafe {
            let dev = sys::ggml_backend_dev_get(i);
            let ty = sys::ggml_backend_dev_type(dev);
            BackendDevice {
                dev,
                backend: cstr(sys::ggml_backend_reg_name(
                    sys::ggml_backend_dev_backend_reg(dev),
                )),
                name: cstr(sys::ggml_backend_dev_name(dev)),
                description: cstr(sys::ggml_backend_dev_description(dev)),
                gpu: ty == sys::GGML_BACKEND_DEVICE_TYPE_GPU
                    || ty == sys::GGML_BACKEND_DEVICE_TYPE_IGPU,
                integrated: ty == sys::GGML_BACKEND_DEVICE_TYPE_IGPU,
            }
        })
        .collect()
}

/// The first GPU this build's backends see, as a device kind (`--device auto`).
pub fn first_gpu() -> Option<Device> {
    init();
    devices().into_iter().filter(|d| d.gpu).find_map(|d| {
        [Device::Vulkan, Device::Rocm, Device::Cuda]
            .into_iter()
            .find(|&k| backend_name(k) == Some(d.backend.as_str()))
    })
}

/// The name ggml gives a device kind's backend.
fn backend_name(device: Device) -> Option<&'static str> {
    match device {
        Device::Cuda => Some("CUDA"),
        Device::Vulkan => Some("Vulkan"),
        Device::Rocm => Some("ROCm"),
        Device::Cpu | Device::Npu => None,
    }
}

/// A GGUF backbone loaded into llama.cpp.
pub struct LlamaBackbone {
    // Declared before `model`: fields drop in order and the context uses the model.
    ctx: NonNull<sys::llama_context>,
    model: NonNull<sys::llama_model>,
    batch: sys::llama_batch,
    batch_capacity: usize,
    /// The most tokens llama.cpp computes in one graph (its ubatch).
    n_ubatch: usize,
    n_vocab: usize,
    budget: usize,
    /// Slot `i` of the batch is llama.cpp's sequence `slots[i]` (`None`: moved away).
    slots: Vec<Option<i32>>,
    /// Tokens each llama.cpp sequence holds.
    lens: Vec<usize>,
    logits: Vec<f32>,
    placement: Placement,
    device: Device,
    description: String,
}

// SAFETY: the context and model are used from one thread at a time (`&mut self`); llama.cpp
// keeps no thread-local state for them.
unsafe impl Send for LlamaBackbone {}

impl Drop for LlamaBackbone {
    fn drop(&mut self) {
        // SAFETY: each was made once by llama.cpp and is freed once, the context first.
        unsafe {
            sys::llama_batch_free(self.batch);
            sys::llama_free(self.ctx.as_ptr());
            sys::llama_model_free(self.model.as_ptr());
        }
    }
}

struct Model(NonNull<sys::llama_model>);

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: freed once, on a load that failed after the model loaded.
        unsafe { sys::llama_model_free(self.0.as_ptr()) }
    }
}

/// Runs `f` with llama.cpp's log on this thread captured; returns its result and the log.
fn capturing<T>(f: impl FnOnce() -> T) -> (T, String) {
    CAPTURE.with(|c| *c.borrow_mut() = Some(String::new()));
    let out = f();
    let log = CAPTURE.with(|c| c.borrow_mut().take()).unwrap_or_default();
    (out, log)
}

/// The lines of a load log that say what went wrong.
fn log_errors(log: &str) -> String {
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("error") || l.contains("failed") || l.contains("invalid"))
        .collect();
    if lines.is_empty() {
        "llama.cpp gave no reason".to_owned()
    } else {
        lines.join("; ")
    }
}

impl LlamaBackbone {
    /// Loads the package's GGUF backbone with every layer on `opts.device`.
    pub fn load(pkg: &ModelPackage, opts: &LlamaOptions) -> Result<Self, EngineError> {
        if pkg.format != BackboneFormat::Gguf {
            return Err(EngineError::Params(format!(
                "--engine llama runs GGUF packages and {} holds an ONNX backbone; make its GGUF with: \
                 .onebit/venv/bin/python tools/onnx_to_gguf.py {} --out DIR/model.gguf (docs/models.md)",
                pkg.dir.display(),
                pkg.dir.display()
            )));
        }
        init();
        let all = devices();
        let mut chosen: Vec<sys::ggml_backend_dev_t> = Vec::new();
        let mut gpus = Vec::new();
        if let Some(want) = backend_name(opts.device) {
            // llama.cpp's own rule: the discrete GPUs, else the integrated ones (a Strix Halo
            // has only its iGPU; a desktop with both would otherwise split layers across them).
            let of_backend = |integrated| {
                all.iter()
                    .filter(move |d| d.backend == want && d.integrated == integrated && d.gpu)
            };
            let pick: Vec<&BackendDevice> = if of_backend(false).next().is_some() {
                of_backend(false).collect()
            } else {
                of_backend(true).collect()
            };
            for d in pick {
                chosen.push(d.dev);
                gpus.push(format!("{} ({})", d.name, d.description));
            }
            if chosen.is_empty() {
                let have: Vec<String> = all
                    .iter()
                    .map(|d| format!("{} {} ({})", d.backend, d.name, d.description))
                    .collect();
                return Err(EngineError::Device(format!(
                    "--device {}: llama.cpp found no {want} GPU (its devices: {}); {}",
                    opts.device,
                    have.join(", "),
                    build_hint(opts.device)
                )));
            }
        } else if opts.device == Device::Npu {
            return Err(EngineError::Device(
                "--engine llama has no NPU backend; the NPU runs ONNX packages with --engine ort"
                    .into(),
            ));
        }
        chosen.push(std::ptr::null_mut()); // the list is NULL-terminated

        let path = CString::new(pkg.decoder_path.as_os_str().as_encoded_bytes()).map_err(|_| {
            EngineError::Params(format!("{}: a NUL in the path", pkg.decoder_path.display()))
        })?;
        // SAFETY: default params from llama.cpp; `chosen` outlives the load call.
        let mut mparams = unsafe { sys::llama_model_default_params() };
        mparams.devices = chosen.as_mut_ptr();
        mparams.n_gpu_layers = if opts.device == Device::Cpu { 0 } else { -1 };
        let (model, log) =
            capturing(|| unsafe { sys::llama_model_load_from_file(path.as_ptr(), mparams) });
        let model = Model(NonNull::new(model).ok_or_else(|| {
            EngineError::Graph(format!(
                "could not load {}: {}",
                pkg.decoder_path.display(),
                log_errors(&log)
            ))
        })?);
        let mut placement = Placement::from_log(&log);
        placement.gpus = gpus;
        if opts.device != Device::Cpu && placement.gpu_weights_mib() <= 0.0 {
            // Asked for a GPU, got none: serving on the CPU under a GPU's name would be a lie.
            return Err(EngineError::Device(format!(
                "--device {}: llama.cpp put no weights on the GPU ({placement}); see its log with --verbose",
                opts.device
            )));
        }

        // SAFETY: the model is loaded; these read its metadata.
        let (n_vocab, n_ctx_train) = unsafe {
            let vocab = sys::llama_model_get_vocab(model.0.as_ptr());
            (
                sys::llama_vocab_n_tokens(vocab),
                sys::llama_model_n_ctx_train(model.0.as_ptr()),
            )
        };
        let n_vocab = usize::try_from(n_vocab).unwrap_or(0);
        if n_vocab != pkg.genai.model.vocab_size {
            return Err(EngineError::Graph(format!(
                "{}: llama.cpp reads {n_vocab} vocabulary entries but the output layer has {} rows",
                pkg.decoder_path.display(),
                pkg.genai.model.vocab_size
            )));
        }
        let budget = pkg
            .genai
            .token_budget()
            .min(usize::try_from(n_ctx_train).unwrap_or(usize::MAX));
        let max_batch = opts.max_batch.max(1);
        let threads = i32::try_from(opts.threads.max(1)).unwrap_or(1);
        // SAFETY: default params from llama.cpp, then plain values.
        let mut cparams = unsafe { sys::llama_context_default_params() };
        cparams.n_seq_max = u32::try_from(max_batch).unwrap_or(1);
        // Each sequence its own KV stream of `budget` cells: sequences here share no prefix.
        cparams.kv_unified = false;
        cparams.n_ctx = u32::try_from(budget * max_batch).unwrap_or(u32::MAX);
        // A whole prompt in one decode call (llama.cpp splits it into its ubatches itself).
        cparams.n_batch = u32::try_from(budget.max(max_batch)).unwrap_or(u32::MAX);
        cparams.n_threads = threads;
        cparams.n_threads_batch = threads;
        cparams.no_perf = true;
        if opts.attention == LlamaAttention::Exact {
            cparams.type_k = sys::GGML_TYPE_F32;
            cparams.type_v = sys::GGML_TYPE_F32;
            cparams.flash_attn_type = sys::LLAMA_FLASH_ATTN_TYPE_DISABLED;
        }
        if opts.device == Device::Cpu {
            cparams.offload_kqv = false;
            cparams.op_offload = false;
        }
        let (ctx, log) =
            capturing(|| unsafe { sys::llama_init_from_model(model.0.as_ptr(), cparams) });
        let ctx = NonNull::new(ctx).ok_or_else(|| {
            EngineError::Llama(format!(
                "could not make a context of {} x {budget} tokens: {}",
                max_batch,
                log_errors(&log)
            ))
        })?;
        let batch_capacity = budget.max(max_batch);
        // SAFETY: the context is made.
        let n_ubatch = usize::try_from(unsafe { sys::llama_n_ubatch(ctx.as_ptr()) })
            .unwrap_or(1)
            .max(1);
        // SAFETY: a token batch (no embeddings), each token in one sequence.
        let batch = unsafe { sys::llama_batch_init(batch_capacity as i32, 0, 1) };

        let device = if placement.gpu_weights_mib() > 0.0 {
            opts.device
        } else {
            Device::Cpu
        };
        let arch = &pkg.genai.model.model_type;
        let layers = pkg.genai.model.decoder.num_hidden_layers;
        let description = format!(
            "llama.cpp {} ({arch}, {layers} layers, budget {budget} x {max_batch} sequences, {threads} threads, {}; {placement})",
            pkg.decoder_path.display(),
            opts.attention
        );
        tracing::info!("{description}");
        let model_ptr = model.0;
        std::mem::forget(model); // owned by the backbone from here
        Ok(Self {
            ctx,
            model: model_ptr,
            batch,
            batch_capacity,
            n_ubatch,
            n_vocab,
            budget,
            slots: Vec::new(),
            lens: vec![0; max_batch],
            logits: Vec::new(),
            placement,
            device,
            description,
        })
    }

    /// Where llama.cpp put the model.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Decodes `(token, sequence)` pairs, each at its sequence's next position; `rows` of them
    /// (the last `rows`, in order) give a logits row each into `self.logits`.
    ///
    /// A long run goes to llama.cpp in pieces of its ubatch size, the pieces llama.cpp would cut
    /// it into itself (the same computation), so that `cancel` is looked at between them on any
    /// backend; inside a piece, llama.cpp's abort callback looks at it between graph nodes on the
    /// CPU backend. Stopped or failed, the sequences of the run are forgotten: they hold part of
    /// it, and a failed run leaves no sequence usable.
    fn decode(
        &mut self,
        tokens: &[(u32, i32)],
        rows: usize,
        cancel: &[&super::CancelToken],
    ) -> Result<&[f32], EngineError> {
        if tokens.is_empty() || tokens.len() > self.batch_capacity {
            return Err(EngineError::Llama(format!(
                "a decode of {} tokens (this context takes 1 to {})",
                tokens.len(),
                self.batch_capacity
            )));
        }
        let mut next = self.lens.clone();
        let mut placed = Vec::with_capacity(tokens.len());
        for &(token, seq) in tokens {
            let s = seq as usize;
            if next[s] >= self.budget {
                return Err(super::too_long(next[s] + 1, self.budget, None));
            }
            let token = i32::try_from(token)
                .ok()
                .filter(|&t| (t as usize) < self.n_vocab)
                .ok_or_else(|| {
                    EngineError::Llama(format!("token id {token} is outside the vocabulary"))
                })?;
            placed.push((token, next[s] as i32, seq));
            next[s] += 1;
        }
        let first_row = tokens.len() - rows;
        self.logits.clear();
        let piece = self.n_ubatch;
        let mut result = Ok(());
        for (k, part) in placed.chunks(piece).enumerate() {
            if k > 0 && cancel.iter().any(|c| c.is_cancelled()) {
                result = Err(EngineError::Interrupted);
                break;
            }
            result = self.decode_piece(part, k * piece, first_row, cancel);
            if result.is_err() {
                break;
            }
        }
        if let Err(e) = result {
            let mut seqs: Vec<i32> = tokens.iter().map(|&(_, s)| s).collect();
            seqs.sort_unstable();
            seqs.dedup();
            seqs.into_iter().for_each(|s| self.forget(s));
            return Err(e);
        }
        self.lens = next;
        Ok(&self.logits)
    }

    /// One `llama_decode` of `(token, position, sequence)` triples that start at index `offset`
    /// of the run; the rows from `first_row` on are appended to `self.logits`.
    fn decode_piece(
        &mut self,
        part: &[(i32, i32, i32)],
        offset: usize,
        first_row: usize,
        cancel: &[&super::CancelToken],
    ) -> Result<(), EngineError> {
        for (i, &(token, pos, seq)) in part.iter().enumerate() {
            // SAFETY: i < part.len() <= batch_capacity, the size the batch was made with, and
            // each token in one sequence.
            unsafe {
                *self.batch.token.add(i) = token;
                *self.batch.pos.add(i) = pos;
                *self.batch.n_seq_id.add(i) = 1;
                *(*self.batch.seq_id.add(i)) = seq;
                *self.batch.logits.add(i) = i8::from(offset + i >= first_row);
            }
        }
        self.batch.n_tokens = part.len() as i32;
        let ctx = self.ctx.as_ptr();
        let watch: &[&super::CancelToken] = cancel;
        // SAFETY: the batch is filled up to n_tokens. The abort callback's data is `watch`,
        // which outlives the call, and the callback is taken away again before it returns.
        let rc = unsafe {
            if !watch.is_empty() {
                sys::llama_set_abort_callback(
                    ctx,
                    Some(on_abort),
                    &watch as *const &[&super::CancelToken] as *mut c_void,
                );
            }
            let rc = sys::llama_decode(ctx, self.batch);
            if !watch.is_empty() {
                sys::llama_set_abort_callback(ctx, None, std::ptr::null_mut());
            }
            rc
        };
        match rc {
            0 => {}
            2 => return Err(EngineError::Interrupted),
            _ => {
                return Err(EngineError::Llama(format!(
                    "llama_decode returned {rc} ({})",
                    match rc {
                        1 => "no room in the KV cache",
                        -1 => "invalid batch",
                        _ => "a compute error",
                    }
                )));
            }
        }
        for i in first_row.saturating_sub(offset)..part.len() {
            // SAFETY: row i of this piece was asked for; llama.cpp gives n_vocab floats.
            let row = unsafe { sys::llama_get_logits_ith(ctx, i as i32) };
            if row.is_null() {
                return Err(EngineError::Llama(format!(
                    "no logits for row {}",
                    offset + i
                )));
            }
            self.logits
                .extend_from_slice(unsafe { std::slice::from_raw_parts(row, self.n_vocab) });
        }
        Ok(())
    }

    fn forget(&mut self, seq: i32) {
        // SAFETY: removes every position of one sequence.
        unsafe {
            sys::llama_memory_seq_rm(sys::llama_get_memory(self.ctx.as_ptr()), seq, -1, -1);
        }
        self.lens[seq as usize] = 0;
    }
}

/// What to do when llama.cpp shows no GPU of the device's backend: build with the backend, or,
/// where this binary has it (the cargo feature decides what was compiled in), make the GPU visible.
fn build_hint(device: Device) -> String {
    let (backend, feature, built, section, look) = match device {
        Device::Vulkan => (
            "Vulkan",
            "vulkan",
            cfg!(feature = "vulkan"),
            "GGUF on a GPU",
            "`vulkaninfo --summary` must list it",
        ),
        Device::Rocm => (
            "ROCm",
            "rocm",
            cfg!(feature = "rocm"),
            "The CUDA and ROCm builds",
            "`rocminfo` must list it; your user needs /dev/kfd and /dev/dri (the render group)",
        ),
        Device::Cuda => (
            "CUDA",
            "llama-cuda",
            cfg!(feature = "llama-cuda"),
            "The CUDA and ROCm builds",
            "`nvidia-smi` must list it",
        ),
        Device::Cpu | Device::Npu => return String::new(),
    };
    if built {
        format!("this binary has the {backend} backend, so the GPU is not visible: {look}")
    } else {
        format!(
            "build with `cargo build --release --features {feature}` (docs/models.md, \"{section}\") and check the driver sees the GPU"
        )
    }
}

impl Backbone for LlamaBackbone {
    fn reset(&mut self) {
        // SAFETY: clears every sequence's KV (data too).
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ctx.as_ptr()), true) };
        self.lens.iter_mut().for_each(|l| *l = 0);
        self.slots.clear();
    }

    fn append(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        self.prefill(tokens, &[])
    }

    fn prefill(
        &mut self,
        tokens: &[u32],
        cancel: &[&super::CancelToken],
    ) -> Result<&[f32], EngineError> {
        let pairs: Vec<(u32, i32)> = tokens.iter().map(|&t| (t, 0)).collect();
        self.decode(&pairs, 1, cancel)
    }

    fn len(&self) -> usize {
        self.lens[0]
    }

    fn budget(&self) -> usize {
        self.budget
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn device(&self) -> Device {
        self.device
    }

    fn batch(&mut self) -> Option<&mut dyn BatchBackbone> {
        (self.lens.len() > 1).then_some(self as &mut dyn BatchBackbone)
    }
}

impl LlamaBackbone {
    /// The llama.cpp sequence in `slot`.
    fn seq_of(&self, slot: usize) -> Result<i32, EngineError> {
        self.slots
            .get(slot)
            .copied()
            .flatten()
            .ok_or_else(|| EngineError::Llama(format!("slot {slot} is not open")))
    }
}

impl BatchBackbone for LlamaBackbone {
    fn open(&mut self, slot: usize) -> Result<(), EngineError> {
        if slot >= self.lens.len() {
            return Err(EngineError::Llama(format!(
                "slot {slot}: this context runs {} sequences (--max-batch)",
                self.lens.len()
            )));
        }
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, None);
        }
        let seq = match self.slots[slot] {
            Some(seq) => seq,
            None => {
                let used: Vec<i32> = self.slots.iter().flatten().copied().collect();
                let seq = (0..self.lens.len() as i32)
                    .find(|s| !used.contains(s))
                    .ok_or_else(|| EngineError::Llama("no free llama.cpp sequence".into()))?;
                self.slots[slot] = Some(seq);
                seq
            }
        };
        self.forget(seq);
        Ok(())
    }

    fn extend(
        &mut self,
        slot: usize,
        tokens: &[u32],
        cancel: &[&super::CancelToken],
    ) -> Result<&[f32], EngineError> {
        let seq = self.seq_of(slot)?;
        let pairs: Vec<(u32, i32)> = tokens.iter().map(|&t| (t, seq)).collect();
        self.decode(&pairs, 1, cancel)
    }

    fn step_padded(&mut self, tokens: &[u32], pad: usize) -> Result<&[f32], EngineError> {
        if pad > 0 {
            return Err(EngineError::Params(
                "the llama engine does not pad decode steps".into(),
            ));
        }
        let pairs = tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| Ok((t, self.seq_of(i)?)))
            .collect::<Result<Vec<_>, EngineError>>()?;
        let rows = pairs.len();
        self.decode(&pairs, rows, &[])
    }

    fn close(&mut self, slot: usize, running: usize) -> Result<(), EngineError> {
        if slot >= running || running > self.slots.len() {
            return Err(EngineError::Llama(format!(
                "closing slot {slot} of {running} running"
            )));
        }
        // Moving a sequence is renaming its slot: llama.cpp's sequence ids stay, no KV moves.
        if let Some(seq) = self.slots[slot].take() {
            self.forget(seq);
        }
        if slot != running - 1 {
            self.slots[slot] = self.slots[running - 1].take();
        }
        while self.slots.last() == Some(&None) {
            self.slots.pop();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_is_read_from_what_llama_cpp_logs() {
        let log = "load_tensors: offloading output layer to GPU\n\
                   load_tensors: offloading 24 repeating layers to GPU\n\
                   load_tensors: offloaded 25/25 layers to GPU\n\
                   load_tensors:   CPU_Mapped model buffer size =   137.94 MiB\n\
                   load_tensors:      Vulkan0 model buffer size =   352.06 MiB\n";
        let mut p = Placement::from_log(log);
        assert_eq!(p.offloaded, Some((25, 25)));
        assert_eq!(
            p.weights,
            vec![
                ("CPU_Mapped".to_owned(), 137.94),
                ("Vulkan0".to_owned(), 352.06)
            ]
        );
        assert_eq!(p.gpu_weights_mib(), 352.06);
        p.gpus = vec!["Vulkan0 (AMD Radeon 8060S Graphics (RADV GFX1151))".into()];
        assert_eq!(
            p.to_string(),
            "weights in CPU_Mapped 138 MiB, Vulkan0 352 MiB (offload of 25/25 layers to Vulkan0 (AMD Radeon 8060S Graphics (RADV GFX1151)))"
        );
        // The offload line repeats the request: without a GPU buffer nothing was offloaded.
        let asked = Placement::from_log(
            "load_tensors: offloaded 25/25 layers to GPU\n\
             load_tensors:   CPU_Mapped model buffer size =   4.25 MiB\n",
        );
        assert_eq!(asked.gpu_weights_mib(), 0.0);
        let cpu =
            Placement::from_log("load_tensors:   CPU_Mapped model buffer size =   10.00 MiB\n");
        assert_eq!(
            cpu.to_string(),
            "weights in CPU_Mapped 10 MiB (no GPU offload in this llama.cpp build)"
        );
    }
}
