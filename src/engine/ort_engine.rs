//! The in-process ONNX Runtime backbone: one session of the OGA decoder graph and its KV cache.
//!
//! It feeds exactly the inputs the graph declares, under the names genai_config.json gives, and
//! keeps the KV cache either as growing tensors (each step's `present.*` becomes the next step's
//! `past_key_values.*`: a new, longer tensor per layer per step) or as one buffer bound as both
//! past and present (`past_present_share_buffer`), which GroupQueryAttention updates in place.
//! The shared buffer starts at [`SHARED_KV_START`] positions and doubles when a sequence needs
//! more (up to the budget), so a 32k-context package does not hold 32k positions for a sentence,
//! unless the package itself sets `search.past_present_share_buffer`: then it gets the buffer as
//! onnxruntime-genai allocates it, once at `search.max_length`.
//! Batched, it holds one slot of that many positions per sequence along the batch axis (all slots
//! grow together: one long sequence grows every slot), and a run binds views of its slots.
//!
//! A graph whose past inputs declare their length as a number (AMD's NPU packages: batch 1 and a
//! fixed window) gets what onnxruntime-genai gives it: one shared buffer of exactly that length,
//! never grown, whatever `--kv` says; sequences stop there. KV caches and logits may be float32,
//! float16 or bfloat16; the engine only allocates and binds KV memory, and converts the last
//! logits row to f32 for the sampler.

use std::path::Path;
use std::sync::Arc;

use ort::AsPointer as _;
use ort::memory::Allocator;
use ort::session::{RunOptions, Session, SessionInputValue};
use ort::value::{
    DynTensor, DynValue, PrimitiveTensorElementType, Tensor, TensorElementType, ValueType,
};

use super::device::{self, Device};
use super::prefix::{KvData, KvRows};
use super::ryzenai::ProviderSetup;
use super::{Backbone, BatchBackbone, CancelToken, EngineError, LogitsLayout};
use crate::npu::residency::Placement;
use crate::package::genai::layer_name;
use crate::package::{BackbonePackage, ModelPackage};
use crate::runtime::session;
use crate::runtime::{ThreadPlan, ThreadPolicy};

/// Positions a shared KV buffer starts with: a long sentence's prompt and codes (a voice's
/// reference is ~400 tokens, 20 s of speech 1,000 codes) without growing; 25 MB per sequence for
/// the real NeuTTS-air shape.
pub const SHARED_KV_START: usize = 2048;

/// Most prompt tokens one prefill run takes on the CPU unless told otherwise: on 2 cores of an
/// AVX-512 Xeon the real-shape int4 package prefilled 512 and 2048 tokens 8-15% faster in runs
/// of 256 than in one run (docs/performance.md), and the logits are bit for bit the same
/// (tests/prefix_cache.rs).
pub const CPU_PREFILL_RUN: usize = 256;

/// How the KV cache is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvMode {
    /// Present tensors grow by one position per step.
    Growing,
    /// One buffer shared by past and present (OGA's share-buffer mode), grown by doubling.
    Shared,
}

/// Session settings; `None` means the package's genai_config.json decides.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct OrtOptions {
    pub intra_threads: Option<usize>,
    /// How threads are sized, pinned and made to wait when `intra_threads` is not given.
    #[serde(default)]
    pub threads: ThreadPolicy,
    /// Spin-waiting of the pool threads; `None` is the policy's choice.
    #[serde(default)]
    pub spin: Option<bool>,
    pub kv_mode: Option<KvMode>,
    /// Shared mode: positions the buffer starts with (default [`SHARED_KV_START`], or the budget
    /// for a package that sets `search.past_present_share_buffer`).
    #[serde(default)]
    pub kv_capacity: Option<usize>,
    /// Prompt tokens per prefill run: `Some(0)` prefills in one run; `None` is the device's
    /// default ([`CPU_PREFILL_RUN`] on the CPU, one run elsewhere).
    pub prefill_chunk: Option<usize>,
    /// The execution provider (`Device::Npu` only works in a process started with the NPU
    /// environment: the engine worker).
    pub device: Device,
    /// On the NPU: `session.disable_cpu_ep_fallback=1`, so a graph the provider does not take
    /// whole fails to load instead of running partly on the CPU.
    #[serde(default)]
    pub npu_strict: bool,
}

struct Names {
    input_ids: String,
    /// `None`: the graph takes no mask (onnxruntime-genai feeds one only where it is declared).
    attention_mask: Option<String>,
    position_ids: Option<String>,
    past: Vec<(String, String)>,
    logits: String,
    present: Vec<(String, String)>,
}

/// The ONNX Runtime backbone.
pub struct OrtBackbone {
    session: Session,
    /// Every run's options: a prompt's run is stopped through their terminate flag when its
    /// request is cancelled (ONNX Runtime checks it between nodes).
    run_options: Arc<RunOptions>,
    names: Names,
    /// Integer inputs the graph declares as int32 (otherwise int64).
    ids_i32: bool,
    mask_i32: bool,
    positions_i32: bool,
    /// The attention mask's length when the graph declares it as a number (onnxruntime-genai's
    /// static mask: ones for the sequence, zeros after); otherwise the sequence's length.
    mask_len: Option<usize>,
    /// The past length the graph declares as a number: the shared buffer's fixed size.
    static_kv: Option<usize>,
    kv_type: TensorElementType,
    kv_heads: usize,
    head_size: usize,
    /// Logits per row, and which token each belongs to (a compact head in optimized packages).
    width: usize,
    layout: LogitsLayout,
    budget: usize,
    mode: KvMode,
    /// Shared mode: the buffers' positions now, and what a fresh engine starts with.
    capacity: usize,
    start_capacity: usize,
    prefill_chunk: Option<usize>,
    /// The package's `search.chunk_size`: no prefill run is ever longer (a limit of its graph or
    /// provider, which onnxruntime-genai honours).
    chunk_limit: Option<usize>,
    /// Growing mode: the tensors fed as past next step (k, v per layer). Shared mode: the buffers.
    past: Vec<(DynValue, DynValue)>,
    /// Shared mode: sequences the buffers hold (their batch dimension); growing mode: 1.
    slots: usize,
    /// Tokens each slot's sequence holds.
    lens: Vec<usize>,
    /// The graph leaves its batch dimension symbolic, so sequences can run side by side.
    batchable: bool,
    logits: Vec<f32>,
    desc: String,
    device: Device,
    providers: Vec<String>,
    setup: Option<ProviderSetup>,
    placement: Option<Placement>,
}

/// ONNX Runtime's session config key that makes it record which provider got each node
/// (`kOrtSessionOptionsRecordEpGraphAssignmentInfo`, ONNX Runtime 1.24+).
pub const RECORD_PLACEMENT_KEY: &str = "session.record_ep_graph_assignment_info";

/// Reads ONNX Runtime's record of which provider got each node (needs
/// [`RECORD_PLACEMENT_KEY`] set before the session was made): provider -> node names.
fn placement(
    session: &Session,
) -> Result<std::collections::BTreeMap<String, Vec<String>>, EngineError> {
    use std::ffi::CStr;
    let api = ort::api();
    // SAFETY: every status passed here is one ONNX Runtime just returned, owned by us.
    let check =
        |status| unsafe { ort::Error::result_from_status(status) }.map_err(EngineError::from);
    let mut placed = std::collections::BTreeMap::<String, Vec<String>>::new();
    // SAFETY: the session pointer is live for this call; ONNX Runtime owns the returned arrays
    // and strings for the session's lifetime, and we copy what we keep before returning.
    unsafe {
        let mut subgraphs: *const *const ort::sys::OrtEpAssignedSubgraph = std::ptr::null();
        let mut n = 0usize;
        check((api.Session_GetEpGraphAssignmentInfo)(
            session.ptr(),
            &mut subgraphs,
            &mut n,
        ))?;
        if n > 0 && subgraphs.is_null() {
            return Err(EngineError::Runtime(
                "Session_GetEpGraphAssignmentInfo returned no array".into(),
            ));
        }
        for i in 0..n {
            let sg = *subgraphs.add(i);
            let mut name: *const std::ffi::c_char = std::ptr::null();
            check((api.EpAssignedSubgraph_GetEpName)(sg, &mut name))?;
            let mut nodes: *const *const ort::sys::OrtEpAssignedNode = std::ptr::null();
            let mut count = 0usize;
            check((api.EpAssignedSubgraph_GetNodes)(
                sg, &mut nodes, &mut count,
            ))?;
            let ep = if name.is_null() {
                "?".to_owned()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            if count > 0 && nodes.is_null() {
                return Err(EngineError::Runtime(
                    "EpAssignedSubgraph_GetNodes returned no array".into(),
                ));
            }
            let names = placed.entry(ep).or_default();
            for j in 0..count {
                let mut node_name: *const std::ffi::c_char = std::ptr::null();
                check((api.EpAssignedNode_GetName)(*nodes.add(j), &mut node_name))?;
                names.push(if node_name.is_null() {
                    String::new()
                } else {
                    CStr::from_ptr(node_name).to_string_lossy().into_owned()
                });
            }
        }
    }
    Ok(placed)
}

/// The element type and shape an input or output declares (symbolic dimensions are -1).
fn declared(outlets: &[ort::value::Outlet], name: &str) -> Option<(TensorElementType, Vec<i64>)> {
    outlets
        .iter()
        .find(|o| o.name() == name)
        .and_then(|o| match o.dtype() {
            ValueType::Tensor { ty, shape, .. } => Some((*ty, shape.to_vec())),
            _ => None,
        })
}

/// Whether an integer input is int32 (true) or int64 (false); anything else is refused.
fn int32_input(path: &str, what: &str, ty: Option<TensorElementType>) -> Result<bool, EngineError> {
    match ty {
        Some(TensorElementType::Int64) => Ok(false),
        Some(TensorElementType::Int32) => Ok(true),
        other => Err(EngineError::Graph(format!(
            "{path}: {what} has type {other:?}, expected int64 or int32"
        ))),
    }
}

/// `[rows, values / rows]` as int32 or int64, as the graph declares the input.
fn int_matrix(
    i32_input: bool,
    rows: usize,
    values: impl Iterator<Item = i64>,
) -> Result<DynValue, EngineError> {
    let t = if i32_input {
        let v: Vec<i32> = values.map(|x| x as i32).collect();
        Tensor::from_array(([rows, v.len() / rows.max(1)], v))?.into_dyn()
    } else {
        let v: Vec<i64> = values.collect();
        Tensor::from_array(([rows, v.len() / rows.max(1)], v))?.into_dyn()
    };
    Ok(t)
}

/// A dimension the graph fixes to a number.
fn fixed(dim: i64) -> Option<usize> {
    usize::try_from(dim).ok().filter(|&d| d > 0)
}

/// What the past inputs declare: their one element type, and their length when every layer fixes
/// it to the same number. Dimensions fixed to something else than this engine feeds (batch 1, the
/// config's heads and head size) are refused here rather than by ONNX Runtime mid-request.
fn past_layout(
    outlets: &[ort::value::Outlet],
    past: &[(String, String)],
    kv_heads: usize,
    head_size: usize,
    path: &str,
) -> Result<(TensorElementType, Option<usize>), EngineError> {
    let mut ty0 = None;
    let mut lens = Vec::new();
    for name in past.iter().flat_map(|(k, v)| [k, v]) {
        let Some((ty, dims)) = declared(outlets, name) else {
            return Err(EngineError::Graph(format!(
                "{path}: input {name:?} is not a tensor"
            )));
        };
        if !matches!(
            ty,
            TensorElementType::Float32 | TensorElementType::Float16 | TensorElementType::Bfloat16
        ) {
            return Err(EngineError::Graph(format!(
                "{path}: {name} is {ty:?}; this engine runs float32, float16 and bfloat16 KV caches"
            )));
        }
        if *ty0.get_or_insert(ty) != ty {
            return Err(EngineError::Graph(format!(
                "{path}: {name} is {ty:?} but {} is {:?}",
                past[0].0,
                ty0.unwrap_or(ty)
            )));
        }
        let want = [Some(1), Some(kv_heads), None, Some(head_size)];
        let bad = dims.len() != 4
            || dims
                .iter()
                .zip(want)
                .any(|(&d, w)| matches!((fixed(d), w), (Some(d), Some(w)) if d != w));
        if bad {
            return Err(EngineError::Graph(format!(
                "{path}: {name} is declared {dims:?}; this engine feeds [1, {kv_heads}, past, {head_size}]"
            )));
        }
        lens.push(fixed(dims[2]));
    }
    let len = match lens.first().copied().flatten() {
        Some(n) if lens.iter().all(|&l| l == Some(n)) => Some(n),
        _ if lens.iter().all(Option::is_none) => None,
        _ => {
            return Err(EngineError::Graph(format!(
                "{path}: past inputs mix fixed and symbolic lengths ({lens:?}); this engine needs one for all layers"
            )));
        }
    };
    Ok((ty0.unwrap_or(TensorElementType::Float32), len))
}

impl OrtBackbone {
    pub fn load(
        env: &ort::environment::Environment,
        pkg: &ModelPackage,
        opts: &OrtOptions,
    ) -> Result<Self, EngineError> {
        Self::load_backbone(env, &pkg.backbone(), opts)
    }

    /// Loads from the backbone's part of a package (what the engine worker has).
    pub fn load_backbone(
        env: &ort::environment::Environment,
        pkg: &BackbonePackage,
        opts: &OrtOptions,
    ) -> Result<Self, EngineError> {
        let d = &pkg.genai.model.decoder;
        let so = &d.session_options;
        let plan = ThreadPlan::for_process(
            opts.threads,
            opts.intra_threads.or(so.intra_op_num_threads),
            opts.spin,
        );
        // The package's own session options first, then the providers (as onnxruntime-genai
        // orders them).
        // A relative custom_ops_library may sit beside the provider library (onnxruntime-genai's
        // second place to look).
        let ep_dirs: Vec<std::path::PathBuf> = match opts.device {
            Device::Npu => crate::engine::ryzenai::library_dir().into_iter().collect(),
            _ => Vec::new(),
        };
        let builder = session::apply_genai(session::builder(env, &plan)?, so, &pkg.dir, &ep_dirs)?;
        // Where ONNX Runtime puts each node is the first piece of residency evidence; it only
        // keeps that record when asked before the session is made.
        let builder = builder.with_config_entry(RECORD_PLACEMENT_KEY, "1")?;
        let (mut builder, providers, setup) =
            device::attach(builder, env, opts.device, pkg, opts.npu_strict)?;
        let session = builder
            .commit_from_file(&pkg.decoder_path)
            .map_err(|e| EngineError::Graph(format!("{}: {e}", pkg.decoder_path.display())))?;
        let placement = match placement(&session) {
            Ok(assigned) => {
                // The weights behind the nodes: what makes a placement count (a provider that
                // holds one trivial node does not hold the model).
                // Read on the NPU only, where residency needs it.
                let weights = match opts.device {
                    Device::Npu => {
                        match crate::package::optimize::graph_weights(&pkg.decoder_path) {
                            Ok(w) => Some(w),
                            Err(e) => {
                                tracing::warn!("node placement by weight unknown: {e}");
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let p = Placement::weigh(&assigned, weights.as_ref());
                tracing::info!("node placement: {p}");
                Some(p)
            }
            Err(e) => {
                tracing::warn!("node placement unknown: {e}");
                None
            }
        };
        let mut me = Self::from_session(session, pkg, opts, providers, &plan)?;
        me.setup = setup;
        me.placement = placement;
        Ok(me)
    }

    /// Where ONNX Runtime placed the graph's nodes (`None`: it could not say).
    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_ref()
    }

    /// What the RyzenAI provider was given (`None` off the NPU).
    pub fn provider_setup(&self) -> Option<&ProviderSetup> {
        self.setup.as_ref()
    }

    fn from_session(
        session: Session,
        pkg: &BackbonePackage,
        opts: &OrtOptions,
        providers: Vec<String>,
        threads: &ThreadPlan,
    ) -> Result<Self, EngineError> {
        let d = &pkg.genai.model.decoder;
        let has_input = |n: &str| session.inputs().iter().any(|o| o.name() == n);
        let has_output = |n: &str| session.outputs().iter().any(|o| o.name() == n);
        let path = pkg.decoder_path.display().to_string();
        let need = |ok: bool, what: String| {
            if ok {
                Ok(())
            } else {
                Err(EngineError::Graph(format!("{path}: {what}")))
            }
        };
        need(
            has_input(&d.inputs.input_ids),
            format!("no input {:?}", d.inputs.input_ids),
        )?;
        need(
            has_output(&d.outputs.logits),
            format!("no output {:?}", d.outputs.logits),
        )?;
        let mut past = Vec::new();
        let mut present = Vec::new();
        for layer in 0..d.num_hidden_layers {
            let pk = layer_name(&d.inputs.past_key_names, layer);
            let pv = layer_name(&d.inputs.past_value_names, layer);
            let ok = layer_name(&d.outputs.present_key_names, layer);
            let ov = layer_name(&d.outputs.present_value_names, layer);
            for n in [&pk, &pv] {
                need(
                    has_input(n),
                    format!("no input {n:?} (layer {layer} of {})", d.num_hidden_layers),
                )?;
            }
            for n in [&ok, &ov] {
                need(
                    has_output(n),
                    format!("no output {n:?} (layer {layer} of {})", d.num_hidden_layers),
                )?;
            }
            past.push((pk, pv));
            present.push((ok, ov));
        }
        let attention_mask =
            has_input(&d.inputs.attention_mask).then(|| d.inputs.attention_mask.clone());
        let known: usize = 1
            + 2 * d.num_hidden_layers
            + usize::from(attention_mask.is_some())
            + usize::from(has_input(&d.inputs.position_ids));
        if session.inputs().len() != known {
            let extra: Vec<&str> = session
                .inputs()
                .iter()
                .map(|o| o.name())
                .filter(|n| {
                    *n != d.inputs.input_ids
                        && *n != d.inputs.attention_mask
                        && *n != d.inputs.position_ids
                        && !past.iter().any(|(k, v)| k == n || v == n)
                })
                .collect();
            return Err(EngineError::Graph(format!(
                "{path}: inputs this engine does not know how to feed: {extra:?}"
            )));
        }
        let ins = session.inputs();
        let ids_i32 = int32_input(
            &path,
            "input_ids",
            declared(ins, &d.inputs.input_ids).map(|t| t.0),
        )?;
        let mask = attention_mask.as_deref().and_then(|m| declared(ins, m));
        let mask_i32 = match &attention_mask {
            Some(_) => int32_input(&path, "attention_mask", mask.as_ref().map(|t| t.0))?,
            None => false,
        };
        let position_ids = has_input(&d.inputs.position_ids).then(|| d.inputs.position_ids.clone());
        let positions_i32 = match &position_ids {
            Some(p) => int32_input(&path, "position_ids", declared(ins, p).map(|t| t.0))?,
            None => false,
        };
        let (kv_type, static_kv) =
            past_layout(ins, &past, d.num_key_value_heads, d.head_size, &path)?;
        let mask_len = mask
            .as_ref()
            .and_then(|(_, dims)| dims.get(1).copied())
            .and_then(fixed);
        // Sequences share one buffer along the batch axis only where the graph leaves that axis
        // open (AMD's NPU packages fix it to 1, and their past length too).
        let open_batch = |name: &str| {
            declared(ins, name).is_some_and(|(_, d)| d.first().is_some_and(|&b| fixed(b).is_none()))
        };
        // Rows of different lengths side by side need a mask to tell them apart.
        let batchable = static_kv.is_none()
            && attention_mask.is_some()
            && mask_len.is_none()
            && open_batch(&d.inputs.input_ids)
            && past.iter().all(|(k, v)| open_batch(k) && open_batch(v));
        if mask_len.is_some() && mask_len != static_kv {
            return Err(EngineError::Graph(format!(
                "{path}: attention_mask is fixed at {mask_len:?} positions but the past inputs at {static_kv:?}; this engine needs both the same"
            )));
        }
        // Shared by default whatever the package's search.past_present_share_buffer says (that
        // flag is onnxruntime-genai's, and its CPU packages set it false): the growing mode
        // allocates and fills a longer tensor per layer every step, which measured 0.6x of the
        // shared buffer's decode speed at 2048 tokens of context (docs/performance.md).
        // Without a mask and without position_ids, only a growing past tells the graph how long
        // the sequence is: a shared buffer's length is its capacity.
        let blind = attention_mask.is_none() && position_ids.is_none();
        if blind && static_kv.is_some() {
            return Err(EngineError::Graph(format!(
                "{path}: declares neither attention_mask nor position_ids over a fixed past length; nothing would tell it how long the sequence is"
            )));
        }
        let mode = match (static_kv, opts.kv_mode) {
            (None, _) if blind => KvMode::Growing,
            (Some(n), Some(KvMode::Growing)) => {
                tracing::warn!(
                    "{path} declares a fixed past length of {n}: using one shared KV buffer of \
                     that size instead of --kv growing, as onnxruntime-genai does"
                );
                KvMode::Shared
            }
            (Some(_), _) => KvMode::Shared,
            (None, m) => m.unwrap_or(KvMode::Shared),
        };
        // The package's search.max_length / context_length bound every sequence; a static cache
        // bounds it too, and the smaller one wins.
        let package_budget = pkg.genai.token_budget();
        let budget = static_kv.map_or(package_budget, |n| n.min(package_budget));
        if let Some(n) = static_kv {
            tracing::info!(
                positions = n,
                budget,
                "{path}: static KV cache; sequences stop at {budget} positions"
            );
        }
        let logits_type = declared(session.outputs(), &d.outputs.logits).map(|t| t.0);
        if !matches!(
            logits_type,
            Some(
                TensorElementType::Float32
                    | TensorElementType::Float16
                    | TensorElementType::Bfloat16
            )
        ) {
            return Err(EngineError::Graph(format!(
                "{path}: logits are {logits_type:?}; this engine reads float32, float16 and bfloat16 logits"
            )));
        }
        let layout = match &pkg.logits.speech_head {
            Some(h) => LogitsLayout::Speech(h.clone()),
            None => LogitsLayout::Full,
        };
        let width = layout.width(pkg.genai.model.vocab_size);
        // The manifest and the graph must agree: a width the graph declares is checked here, the
        // rest on every run.
        let dims = session
            .outputs()
            .iter()
            .find(|o| o.name() == d.outputs.logits)
            .and_then(|o| match o.dtype() {
                ValueType::Tensor { shape, .. } => Some(shape.to_vec()),
                _ => None,
            })
            .unwrap_or_default();
        if let Some(&w) = dims.last()
            && w > 0
            && w as usize != width
        {
            return Err(EngineError::Graph(format!(
                "{path}: logits are {w} wide but the package says {width} ({})",
                pkg.logits.describe(pkg.genai.model.vocab_size)
            )));
        }
        // A static buffer has the graph's size exactly: ONNX Runtime refuses any other. A package
        // that asks for onnxruntime-genai's shared buffer over a symbolic past length gets it as
        // onnxruntime-genai allocates it, once at search.max_length; otherwise the buffer starts
        // small and doubles up to the budget.
        let package_shared = pkg.genai.search.past_present_share_buffer && mode == KvMode::Shared;
        let start_capacity = static_kv.unwrap_or_else(|| {
            opts.kv_capacity
                .unwrap_or(if package_shared {
                    budget
                } else {
                    SHARED_KV_START
                })
                .clamp(1, budget.max(1))
        });
        let desc = format!(
            // The providers asked for, not where the nodes went: that is the placement's to say.
            "ort {} ({} layers, {} KV{}, {}{}{}, providers {}; {})",
            crate::runtime::info().map_or("?", |i| i.version.as_str()),
            d.num_hidden_layers,
            match (mode, static_kv) {
                (_, Some(n)) => format!("static shared buffer of {n} positions"),
                (KvMode::Growing, None) => "growing".to_owned(),
                (KvMode::Shared, None) => {
                    format!("shared buffer from {start_capacity} positions")
                }
            },
            match kv_type {
                TensorElementType::Float32 => String::new(),
                other => format!(" ({other})"),
            },
            if pkg.logits.speech_head.is_some() {
                format!("speech head of {width}, ")
            } else {
                String::new()
            },
            if pkg.logits.last_position_only {
                "last-position logits, "
            } else {
                ""
            },
            pkg.decoder_path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("?"),
            providers.join(" > "),
            threads.describe(),
        );
        let mut me = Self {
            session,
            run_options: Arc::new(RunOptions::new()?),
            names: Names {
                input_ids: d.inputs.input_ids.clone(),
                attention_mask,
                position_ids,
                past,
                logits: d.outputs.logits.clone(),
                present,
            },
            ids_i32,
            mask_i32,
            positions_i32,
            mask_len,
            static_kv,
            kv_type,
            kv_heads: d.num_key_value_heads,
            head_size: d.head_size,
            width,
            layout,
            budget,
            mode,
            capacity: 0,
            start_capacity,
            prefill_chunk: match opts.prefill_chunk {
                Some(0) => None,
                None if opts.device == Device::Cpu => Some(CPU_PREFILL_RUN),
                other => other,
            },
            chunk_limit: pkg.genai.search.chunk_size,
            past: Vec::new(),
            slots: 0,
            lens: vec![0],
            batchable,
            logits: Vec::new(),
            desc,
            device: opts.device,
            providers,
            setup: None,
            placement: None,
        };
        me.reset();
        Ok(me)
    }

    /// A zeroed `[slots, heads, seq, head_size]` KV tensor of the graph's element type (ort
    /// zeroes the CPU memory it allocates).
    fn kv_tensor(&self, slots: usize, seq: usize) -> Result<DynValue, EngineError> {
        let shape = [slots, self.kv_heads, seq, self.head_size];
        Ok(DynTensor::new(&Allocator::default(), self.kv_type, shape)?.into_dyn())
    }

    /// Runs `tokens` (`rows` rows of equal length, one after another) for the sequences in slots
    /// `first..first + rows`, each row appended to its own sequence, and keeps each row's last
    /// logits in `self.logits`.
    fn run(&mut self, first: usize, rows: usize, tokens: &[u32]) -> Result<(), EngineError> {
        let n = tokens.len() / rows;
        let lens = &self.lens[first..first + rows];
        let total = lens.iter().max().copied().unwrap_or(0) + n;
        let mut inputs: Vec<(String, DynValue)> = Vec::with_capacity(3);
        let ids = int_matrix(self.ids_i32, rows, tokens.iter().map(|&t| i64::from(t)))?;
        inputs.push((self.names.input_ids.clone(), ids));
        // Each row: ones over its own sequence, zeros after it (a shorter sequence in a batch, or
        // a mask of fixed length as onnxruntime-genai's static mask is).
        if let Some(name) = &self.names.attention_mask {
            let mask_len = self.mask_len.unwrap_or(total);
            let mask = int_matrix(
                self.mask_i32,
                rows,
                lens.iter()
                    .flat_map(|&l| (0..mask_len).map(move |i| i64::from(i < l + n))),
            )?;
            inputs.push((name.clone(), mask));
        }
        if let Some(p) = &self.names.position_ids {
            let pos = int_matrix(
                self.positions_i32,
                rows,
                lens.iter().flat_map(|&l| (l..l + n).map(|x| x as i64)),
            )?;
            inputs.push((p.clone(), pos));
        }
        match self.mode {
            KvMode::Growing => {
                debug_assert!(first == 0 && rows == 1, "growing KV runs one sequence");
                let mut feed: Vec<(String, SessionInputValue<'_>)> = inputs
                    .into_iter()
                    .map(|(name, v)| (name, v.into()))
                    .collect();
                let past = std::mem::take(&mut self.past);
                for ((kn, vn), (k, v)) in self.names.past.iter().zip(past) {
                    feed.push((kn.clone(), k.into()));
                    feed.push((vn.clone(), v.into()));
                }
                let mut outputs = self.session.run_with_options(feed, &*self.run_options)?;
                let mut next = Vec::with_capacity(self.names.present.len());
                for (kn, vn) in &self.names.present {
                    let k = outputs.remove(kn.as_str());
                    let v = outputs.remove(vn.as_str());
                    match (k, v) {
                        (Some(k), Some(v)) => next.push((k, v)),
                        _ => return Err(EngineError::Graph(format!("run gave no {kn} / {vn}"))),
                    }
                }
                let logits = outputs
                    .get(self.names.logits.as_str())
                    .ok_or_else(|| EngineError::Graph("run gave no logits".into()))?;
                last_rows(logits, 1, self.width, &mut self.logits)?;
                self.past = next;
            }
            KvMode::Shared => {
                let mut binding = self.session.create_binding()?;
                for (name, value) in &inputs {
                    binding.bind_input(name.as_str(), value)?;
                }
                // The run sees exactly its slots: the buffers themselves when it covers them all,
                // else views of those slots (a slot's positions are one contiguous block, so any
                // run of slots is too). No KV is copied for a run.
                let whole = first == 0 && rows == self.slots;
                let shape = [rows, self.kv_heads, self.capacity, self.head_size];
                let per_slot = self.kv_heads * self.capacity * self.head_size;
                let mut views = Vec::new();
                if !whole {
                    for (k, v) in &mut self.past {
                        views.push((
                            slot_view(k, self.kv_type, first * per_slot, shape)?,
                            slot_view(v, self.kv_type, first * per_slot, shape)?,
                        ));
                    }
                }
                let kv = if whole { &mut self.past } else { &mut views };
                for ((pk, pv), ((ok, ov), (k, v))) in self
                    .names
                    .past
                    .iter()
                    .zip(self.names.present.iter().zip(kv.iter_mut()))
                {
                    binding.bind_input(pk.as_str(), &*k)?;
                    binding.bind_input(pv.as_str(), &*v)?;
                    binding.bind_output(ok.as_str(), &mut *k)?;
                    binding.bind_output(ov.as_str(), &mut *v)?;
                }
                binding.bind_output_to_device(
                    self.names.logits.as_str(),
                    &ort::memory::MemoryInfo::default(),
                )?;
                let outputs = self
                    .session
                    .run_binding_with_options(&binding, &self.run_options)?;
                let logits = outputs
                    .get(self.names.logits.as_str())
                    .ok_or_else(|| EngineError::Graph("run gave no logits".into()))?;
                last_rows(logits, rows, self.width, &mut self.logits)?;
            }
        }
        for l in &mut self.lens[first..first + rows] {
            *l += n;
        }
        Ok(())
    }

    /// Shared mode: makes room for `slots` sequences of `needed` positions each (the capacity
    /// doubles, at most to the budget), keeping every slot's positions.
    fn ensure(&mut self, slots: usize, needed: usize) -> Result<(), EngineError> {
        if self.mode != KvMode::Shared || (slots <= self.slots && needed <= self.capacity) {
            return Ok(());
        }
        // A static buffer's size is the graph's, and the budget never exceeds it; its batch is 1.
        debug_assert!(self.static_kv.is_none());
        let cap = if needed > self.capacity {
            needed.max(self.capacity * 2).min(self.budget)
        } else {
            self.capacity
        };
        let new_slots = slots.max(self.slots);
        let (heads, old_cap, row) = (self.kv_heads, self.capacity, self.head_size);
        let lens = &self.lens;
        let grown = |old: &DynValue| -> Result<DynValue, EngineError> {
            let mut t = self.kv_tensor(new_slots, cap)?;
            // [slots, heads, positions, head_size]: each head's used rows move over.
            let spans = lens.iter().enumerate().flat_map(|(s, &len)| {
                (0..heads).map(move |h| {
                    let block = s * heads + h;
                    (block * old_cap * row, block * cap * row, len * row)
                })
            });
            match self.kv_type {
                TensorElementType::Float16 => copy_spans::<half::f16>(old, &mut t, spans)?,
                TensorElementType::Bfloat16 => copy_spans::<half::bf16>(old, &mut t, spans)?,
                _ => copy_spans::<f32>(old, &mut t, spans)?,
            }
            Ok(t)
        };
        let mut past = Vec::with_capacity(self.past.len());
        for (k, v) in &self.past {
            past.push((grown(k)?, grown(v)?));
        }
        tracing::debug!(
            from = old_cap,
            to = cap,
            slots = new_slots,
            "shared KV buffer grown"
        );
        self.past = past;
        self.capacity = cap;
        self.slots = new_slots;
        self.lens.resize(new_slots, 0);
        Ok(())
    }

    /// Allocates the KV cache if a failure (or nothing yet) left it without one: growing mode
    /// starts empty, shared mode with one slot of the starting capacity.
    fn allocate(&mut self) -> Result<(), EngineError> {
        if self.past.len() == self.names.past.len() {
            return Ok(());
        }
        let (slots, seq) = match self.mode {
            KvMode::Growing => (1, 0),
            KvMode::Shared => (1, self.start_capacity),
        };
        let mut past = Vec::with_capacity(self.names.past.len());
        for _ in 0..self.names.past.len() {
            past.push((self.kv_tensor(slots, seq)?, self.kv_tensor(slots, seq)?));
        }
        self.past = past;
        self.capacity = seq;
        self.slots = slots;
        self.lens = vec![0; slots];
        Ok(())
    }

    /// Appends `tokens` to the sequence in `slot` alone, chunk by chunk; on failure the cache is
    /// in an unknown state, so it is dropped and every sequence must start again. When one of
    /// `cancel` fires, the run in progress stops at its next node and only this slot's sequence
    /// is lost: the run saw no other slot (see [`OrtBackbone::run`]).
    fn extend_slot(
        &mut self,
        slot: usize,
        tokens: &[u32],
        cancel: &[&CancelToken],
    ) -> Result<&[f32], EngineError> {
        let needed = self.lens[slot] + tokens.len();
        if needed > self.budget {
            return Err(super::too_long(needed, self.budget, self.static_kv));
        }
        let chunk = self
            .prefill_chunk
            .unwrap_or(tokens.len())
            .min(self.chunk_limit.unwrap_or(usize::MAX))
            .max(1);
        let fired = || cancel.iter().any(|c| c.is_cancelled());
        let result = {
            let stop = Arc::clone(&self.run_options);
            let _hooks: Vec<_> = cancel
                .iter()
                .map(|c| {
                    let stop = Arc::clone(&stop);
                    c.on_cancel(move || {
                        if let Err(e) = stop.terminate() {
                            tracing::warn!("cannot stop the run in progress: {e}");
                        }
                    })
                })
                .collect();
            // A token that fired before this point set the flag as its hook was registered:
            // the first run stops at its first node, and so would every later chunk's.
            self.ensure(self.slots, needed).and_then(|()| {
                let mut done = 0;
                while done < tokens.len() {
                    let take =
                        super::next_chunk_within(tokens.len() - done, chunk, self.chunk_limit);
                    self.run(slot, 1, &tokens[done..done + take])?;
                    done += take;
                }
                Ok(())
            })
            // The hooks are gone here: nothing sets the flag after this point.
        };
        if fired() {
            // Cleared for the next run, which belongs to another request or a later step.
            self.run_options.unterminate()?;
            if self.mode == KvMode::Growing {
                // The run took the past tensors with it.
                self.past.clear();
            }
            self.lens[slot] = 0;
            return Err(EngineError::Interrupted);
        }
        self.failed(result)?;
        Ok(&self.logits)
    }

    fn failed(&mut self, result: Result<(), EngineError>) -> Result<(), EngineError> {
        if result.is_err() {
            self.past.clear();
            self.lens.iter_mut().for_each(|l| *l = 0);
        }
        result
    }

    /// The execution providers the session was built with, in priority order.
    pub fn providers(&self) -> &[String] {
        &self.providers
    }
}

/// A `shape` tensor over `buf`'s memory from element `offset` on: some slots of a shared KV buffer,
/// bound as a run's past and present without copying them.
fn slot_view(
    buf: &mut DynValue,
    ty: TensorElementType,
    offset: usize,
    shape: [usize; 4],
) -> Result<DynValue, EngineError> {
    let elem = match ty {
        TensorElementType::Float16 | TensorElementType::Bfloat16 => 2,
        _ => 4,
    };
    let count: usize = shape.iter().product();
    let end = (offset + count) * elem;
    let buf = buf
        .view_mut()
        .downcast::<ort::value::DynTensorValueType>()?;
    let held: i64 = buf.shape().iter().product();
    if !buf.memory_info().is_cpu_accessible() || end > held as usize * elem {
        return Err(EngineError::Runtime(format!(
            "KV slot view of {count} elements at {offset} does not fit its buffer"
        )));
    }
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mem = ort::memory::MemoryInfo::default();
    let mut out: *mut ort::sys::OrtValue = std::ptr::null_mut();
    // SAFETY: the span [offset, offset + count) lies inside `buf` (checked above), which is CPU
    // memory that outlives the view: views live for one run and are dropped before `buf` is
    // grown, moved or freed. ONNX Runtime does not own or free memory given to
    // CreateTensorWithDataAsOrtValue; dropping the value releases only the OrtValue.
    unsafe {
        let data = buf.data_ptr().cast::<u8>().cast_mut().add(offset * elem);
        let status = (ort::api().CreateTensorWithDataAsOrtValue)(
            mem.ptr(),
            data.cast(),
            count * elem,
            dims.as_ptr(),
            dims.len(),
            ty.into(),
            &mut out,
        );
        ort::Error::result_from_status(status)?;
        let ptr = std::ptr::NonNull::new(out).ok_or_else(|| {
            EngineError::Runtime("CreateTensorWithDataAsOrtValue gave null".into())
        })?;
        Ok(DynValue::from_ptr(ptr, Some(&Allocator::default())))
    }
}

/// Each of `rows` rows' last `expect` logits from `[rows, S, expect]` (`S` is 1 with last-position
/// logits), converted to f32, one row after another.
fn last_rows(
    logits: &DynValue,
    rows: usize,
    expect: usize,
    out: &mut Vec<f32>,
) -> Result<(), EngineError> {
    match logits.dtype() {
        ValueType::Tensor {
            ty: TensorElementType::Float16,
            ..
        } => rows_as_f32::<half::f16>(logits, rows, expect, out, half::f16::to_f32),
        ValueType::Tensor {
            ty: TensorElementType::Bfloat16,
            ..
        } => rows_as_f32::<half::bf16>(logits, rows, expect, out, half::bf16::to_f32),
        _ => rows_as_f32::<f32>(logits, rows, expect, out, |x| x),
    }
}

fn rows_as_f32<T: PrimitiveTensorElementType + Copy>(
    logits: &DynValue,
    rows: usize,
    expect: usize,
    out: &mut Vec<f32>,
    to_f32: impl Fn(T) -> f32,
) -> Result<(), EngineError> {
    let (shape, data) = logits.try_extract_tensor::<T>()?;
    let width = shape.last().copied().unwrap_or(0) as usize;
    if width != expect || rows == 0 || data.len() % (rows * width) != 0 || data.is_empty() {
        return Err(EngineError::Graph(format!(
            "logits shape {shape:?} is not {rows} rows ending in the head's width {expect}"
        )));
    }
    let per_row = data.len() / rows;
    out.clear();
    for r in 0..rows {
        let end = (r + 1) * per_row;
        out.extend(data[end - width..end].iter().map(|&x| to_f32(x)));
    }
    Ok(())
}

/// Copies `(from, to, len)` element spans of `src` into `dst`, both of element type `T`.
fn copy_spans<T: PrimitiveTensorElementType + Copy>(
    src: &DynValue,
    dst: &mut DynValue,
    spans: impl Iterator<Item = (usize, usize, usize)>,
) -> Result<(), EngineError> {
    let (_, src) = src.try_extract_tensor::<T>()?;
    scatter(src, dst, spans)
}

/// Copies `(from, to, len)` element spans of a tensor onto itself (spans do not overlap).
fn move_spans<T: PrimitiveTensorElementType + Copy>(
    buf: &mut DynValue,
    spans: impl Iterator<Item = (usize, usize, usize)>,
) -> Result<(), EngineError> {
    let (_, data) = buf.try_extract_tensor_mut::<T>()?;
    for (from, to, len) in spans {
        data.copy_within(from..from + len, to);
    }
    Ok(())
}

impl Backbone for OrtBackbone {
    fn reset(&mut self) {
        if let Err(e) = self.allocate() {
            tracing::error!("cannot allocate the KV cache: {e}");
            return;
        }
        if self.mode == KvMode::Growing {
            // Growing tensors restart empty; a shared buffer keeps the largest size used so far.
            self.past.clear();
            if let Err(e) = self.allocate() {
                tracing::error!("cannot allocate the KV cache: {e}");
            }
        }
        self.lens[0] = 0;
    }

    fn append(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        // The same run as a prefill's, with no request to watch.
        self.prefill(tokens, &[])
    }

    fn prefill(&mut self, tokens: &[u32], cancel: &[&CancelToken]) -> Result<&[f32], EngineError> {
        if self.past.len() != self.names.past.len() {
            return Err(EngineError::Runtime(
                "the KV cache could not be allocated".into(),
            ));
        }
        self.extend_slot(0, tokens, cancel)
    }

    fn logits_layout(&self) -> LogitsLayout {
        self.layout.clone()
    }

    fn len(&self) -> usize {
        self.lens.first().copied().unwrap_or(0)
    }

    fn budget(&self) -> usize {
        self.budget
    }

    fn static_kv(&self) -> Option<usize> {
        self.static_kv
    }

    fn describe(&self) -> String {
        self.desc.clone()
    }

    fn device(&self) -> Device {
        self.device
    }

    /// Batches when sequences can share one buffer along the batch axis: the shared KV mode and a
    /// graph whose batch dimension is symbolic (a static package fixes it to 1).
    fn batch(&mut self) -> Option<&mut dyn BatchBackbone> {
        (self.mode == KvMode::Shared && self.batchable).then_some(self as &mut dyn BatchBackbone)
    }
}

impl BatchBackbone for OrtBackbone {
    fn open(&mut self, slot: usize) -> Result<(), EngineError> {
        self.allocate()?;
        // A failed ensure keeps the old buffers (it replaces them only when the new ones are
        // whole), so the running sequences go on; only this one is refused.
        self.ensure(slot + 1, 0)?;
        self.lens[slot] = 0;
        Ok(())
    }

    fn extend(
        &mut self,
        slot: usize,
        tokens: &[u32],
        cancel: &[&CancelToken],
    ) -> Result<&[f32], EngineError> {
        if slot >= self.slots || self.past.len() != self.names.past.len() {
            return Err(EngineError::Runtime(format!("KV slot {slot} is not open")));
        }
        self.extend_slot(slot, tokens, cancel)
    }

    fn step_padded(&mut self, tokens: &[u32], pad: usize) -> Result<&[f32], EngineError> {
        let rows = tokens.len();
        if rows == 0 || rows > self.slots || self.past.len() != self.names.past.len() {
            return Err(EngineError::Runtime(format!(
                "a step of {rows} sequences over {} open KV slots",
                self.slots
            )));
        }
        if pad > 0 && !self.can_pad() {
            return Err(EngineError::Params(
                "a padded step needs a shared KV buffer of several slots".into(),
            ));
        }
        let all = rows + pad;
        // A pad row writes its K/V at its slot's next position and is then forgotten: a
        // sequence being prefilled there writes that position again with its next chunk.
        let kept: Vec<usize> = (rows..all)
            .map(|s| self.lens.get(s).copied().unwrap_or(0))
            .collect();
        let needed = self.lens[..rows]
            .iter()
            .chain(&kept)
            .max()
            .copied()
            .unwrap_or(0)
            + 1;
        if needed > self.budget {
            return Err(super::too_long(needed, self.budget, self.static_kv));
        }
        let mut fed = tokens.to_vec();
        fed.resize(all, tokens[0]);
        let result = self
            .ensure(self.slots.max(all), needed)
            .and_then(|()| self.run(0, all, &fed));
        self.failed(result)?;
        self.lens[rows..all].copy_from_slice(&kept);
        self.logits.truncate(rows * self.width);
        Ok(&self.logits)
    }

    fn can_pad(&self) -> bool {
        self.mode == KvMode::Shared
            && self.static_kv.is_none()
            && self.names.attention_mask.is_some()
    }

    fn close(&mut self, slot: usize, running: usize) -> Result<(), EngineError> {
        let last = running.saturating_sub(1);
        if slot >= running || running > self.slots {
            return Err(EngineError::Runtime(format!(
                "closing KV slot {slot} of {running} running"
            )));
        }
        if slot != last && self.past.len() == self.names.past.len() {
            let (heads, cap, row, len) = (
                self.kv_heads,
                self.capacity,
                self.head_size,
                self.lens[last],
            );
            let spans = (0..heads).map(|h| {
                let (from, to) = (
                    (last * heads + h) * cap * row,
                    (slot * heads + h) * cap * row,
                );
                (from, to, len * row)
            });
            let spans: Vec<_> = spans.collect();
            let ty = self.kv_type;
            let result = self.past.iter_mut().try_for_each(|(k, v)| {
                [k, v].into_iter().try_for_each(|t| match ty {
                    TensorElementType::Float16 => move_spans::<half::f16>(t, spans.iter().copied()),
                    TensorElementType::Bfloat16 => {
                        move_spans::<half::bf16>(t, spans.iter().copied())
                    }
                    _ => move_spans::<f32>(t, spans.iter().copied()),
                })
            });
            self.failed(result)?;
            self.lens[slot] = len;
        }
        self.lens[last] = 0;
        Ok(())
    }

    fn save_rows(&mut self, slot: usize, len: usize) -> Option<Result<KvRows, EngineError>> {
        if self.mode != KvMode::Shared {
            return None;
        }
        if slot >= self.slots || len > self.lens[slot] || self.past.len() != self.names.past.len() {
            return Some(Err(EngineError::Runtime(format!(
                "KV slot {slot} holds no {len} positions to copy"
            ))));
        }
        let spans = self.row_spans(slot, len);
        let run = |data: &mut KvData| -> Result<(), EngineError> {
            for (k, v) in &self.past {
                for t in [k, v] {
                    match data {
                        KvData::F32(out) => gather::<f32>(t, &spans, out)?,
                        KvData::F16(out) => gather::<half::f16>(t, &spans, out)?,
                        KvData::Bf16(out) => gather::<half::bf16>(t, &spans, out)?,
                    }
                }
            }
            Ok(())
        };
        let mut data = match self.kv_type {
            TensorElementType::Float16 => KvData::F16(Vec::new()),
            TensorElementType::Bfloat16 => KvData::Bf16(Vec::new()),
            _ => KvData::F32(Vec::new()),
        };
        Some(run(&mut data).map(|()| KvRows { len, data }))
    }

    fn load_rows(&mut self, slot: usize, rows: &KvRows, len: usize) -> Result<(), EngineError> {
        let per_tensor = self.kv_heads * rows.len * self.head_size;
        let want = per_tensor * 2 * self.past.len();
        let held = rows.values();
        if self.mode != KvMode::Shared
            || slot >= self.slots
            || self.lens[slot] != 0
            || len > rows.len
            || held != want
        {
            return Err(EngineError::Runtime(format!(
                "cached KV rows ({held} values for {} positions) do not fit open slot {slot}",
                rows.len
            )));
        }
        self.ensure(self.slots, len)?;
        let row = self.head_size;
        let to = self.row_spans(slot, len);
        let ty = self.kv_type;
        let result = self
            .past
            .iter_mut()
            .flat_map(|(k, v)| [k, v])
            .enumerate()
            .try_for_each(|(i, t)| {
                // The cached tensor i holds its heads one after another, rows.len positions each.
                let spans = to
                    .iter()
                    .enumerate()
                    .map(|(h, &(at, n))| (i * per_tensor + h * rows.len * row, at, n));
                match (&rows.data, ty) {
                    (KvData::F32(src), TensorElementType::Float32) => scatter(src, t, spans),
                    (KvData::F16(src), TensorElementType::Float16) => scatter(src, t, spans),
                    (KvData::Bf16(src), TensorElementType::Bfloat16) => scatter(src, t, spans),
                    _ => Err(EngineError::Runtime(
                        "cached KV rows of another element type".into(),
                    )),
                }
            });
        // Only this slot's positions were written: the running sequences are untouched, and
        // the slot stays open and empty on a failure.
        result?;
        self.lens[slot] = len;
        Ok(())
    }
}

impl OrtBackbone {
    /// `(start, count)` element spans of `slot`'s first `len` positions in one KV tensor, head by
    /// head.
    fn row_spans(&self, slot: usize, len: usize) -> Vec<(usize, usize)> {
        let (heads, cap, row) = (self.kv_heads, self.capacity, self.head_size);
        (0..heads)
            .map(|h| ((slot * heads + h) * cap * row, len * row))
            .collect()
    }
}

/// Appends the `(start, count)` spans of `src` to `out`.
fn gather<T: PrimitiveTensorElementType + Copy>(
    src: &DynValue,
    spans: &[(usize, usize)],
    out: &mut Vec<T>,
) -> Result<(), EngineError> {
    let (_, data) = src.try_extract_tensor::<T>()?;
    for &(at, n) in spans {
        out.extend_from_slice(&data[at..at + n]);
    }
    Ok(())
}

/// Writes `(from, to, len)` element spans of `src` into `dst`.
fn scatter<T: PrimitiveTensorElementType + Copy>(
    src: &[T],
    dst: &mut DynValue,
    spans: impl Iterator<Item = (usize, usize, usize)>,
) -> Result<(), EngineError> {
    let (_, data) = dst.try_extract_tensor_mut::<T>()?;
    for (from, to, n) in spans {
        data[to..to + n].copy_from_slice(&src[from..from + n]);
    }
    Ok(())
}

/// Loads the package's backbone with the runtime found by [`crate::runtime`].
pub fn load(
    pkg: &ModelPackage,
    opts: &OrtOptions,
    ort_lib: Option<&Path>,
) -> Result<OrtBackbone, crate::Error> {
    let env = crate::runtime::environment(ort_lib)?;
    Ok(OrtBackbone::load(env, pkg, opts)?)
}
