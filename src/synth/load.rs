//! Loading: which engine a [`SynthConfig`] asks for and where it runs (this process or a worker
//! child), and where model directories given on the command line are found.

use std::path::{Path, PathBuf};

use crate::codec::{self, CodecPool};
use crate::engine::device::{self, Device, DeviceChoice};
use crate::engine::{
    self, Engine, EngineError, LocalEngine, OgaOptions, OrtOptions, ResidencyGate,
    SchedulerOptions, WorkerConfig, WorkerEngine, WorkerTimeouts,
};
use crate::npu::Residency;
use crate::package::{BackboneFormat, CodecPackage, ModelPackage};

/// How to build a [`Synthesizer`].
#[derive(Debug, Clone, Default)]
pub struct SynthConfig {
    pub package_dir: PathBuf,
    pub codec_dir: Option<PathBuf>,
    pub ort_lib: Option<PathBuf>,
    pub voice_dirs: Vec<PathBuf>,
    pub ort: OrtOptions,
    pub codec_threads: Option<usize>,
    /// Whether the backbone and the codec take turns on the CPU (`--cpu-turns`).
    pub cpu_turns: crate::runtime::TurnsMode,
    /// The window layout of streamed decoding (`--stream-windows`; the vendor's by default).
    pub stream_windows: crate::codec::stream::Windows,
    /// Codec sessions that decode side by side (`--codec-sessions`); `None`: the measured
    /// default for the codec's threads ([`codec::default_sessions`]).
    pub codec_sessions: Option<usize>,
    /// A pronunciation lexicon file (`word<TAB>ipa` lines) every request is read with.
    pub lexicon: Option<PathBuf>,
    /// Which generation loop runs the backbone.
    pub engine: EngineKind,
    /// The oga engine's library and settings; its threads and KV mode default to `ort`'s.
    pub oga: OgaOptions,
    /// The llama engine's attention (`--llama-attention`).
    pub llama_attention: engine::LlamaAttention,
    /// Where the backbone runs (`--device`); `ort.device` is replaced by what this resolves to.
    pub device: DeviceChoice,
    /// Run the backbone in a worker child whatever the device (the NPU always is).
    pub isolate: bool,
    /// Refuse to start unless the backbone is proven resident on the NPU (also refuses `auto`
    /// resolving to the CPU).
    pub require_npu: bool,
    /// `--device npu` serves even when residency is not proven (the backbone then runs, at least
    /// partly, on the CPU and is labelled "cpu fallback"); without it such a load is refused.
    pub allow_cpu_fallback: bool,
    /// The RyzenAI provider library for the worker (RYZENAI_EP_PATH); `None`: the environment
    /// rules' choice.
    pub ep_library: Option<PathBuf>,
    /// Let the parent SIGKILL a worker that outlives the stop grace (never one holding the NPU).
    pub allow_kill: bool,
    /// The program started as `<exe> worker`; `None`: this executable.
    pub worker_exe: Option<PathBuf>,
    /// How long a worker may take to load, and to make each step of a request, before it counts
    /// as hung (`--load-timeout`, `--step-timeout`).
    pub worker_timeouts: WorkerTimeouts,
    /// How many requests' generations run side by side (`--max-batch`).
    pub scheduler: SchedulerOptions,
}

impl SynthConfig {
    /// The package directory the backbone runs from. A GGUF package that holds its conversion
    /// (`onnx/`, which `models pull` makes) runs the conversion on our ONNX Runtime engine
    /// (measured 1.5x llama.cpp's decode on the same weights on a 2-core Xeon,
    /// docs/performance.md) for `--engine ort`, and for `--engine auto` on the CPU: not where
    /// llama.cpp would run on a GPU (`--device vulkan`, `rocm` or `cuda`, or `auto` where this
    /// build's llama.cpp sees a GPU), nor for `--device npu` (AMD's own package runs there).
    /// `--engine llama` and `oga` keep the directory as given. Said at INFO.
    pub fn backbone_dir(&self) -> PathBuf {
        let dir = &self.package_dir;
        let twin = dir.join(crate::package::CONVERTED_DIR);
        if dir.join("genai_config.json").exists() || !twin.join("genai_config.json").is_file() {
            return dir.clone();
        }
        let why = match (self.engine, self.device) {
            (EngineKind::Ort, _) => "--engine ort",
            (EngineKind::Auto, DeviceChoice::Exactly(Device::Cpu)) => "--device cpu",
            // Only here is llama.cpp's device list asked for (it starts llama.cpp's backends).
            (EngineKind::Auto, DeviceChoice::Auto) if llama_gpu().is_none() => {
                "--engine auto without a GPU for llama.cpp"
            }
            _ => return dir.clone(),
        };
        tracing::info!(
            "{}: its conversion {} runs on our ONNX Runtime engine ({why}); --engine llama runs the GGUF",
            dir.display(),
            twin.display()
        );
        twin
    }

    /// With `--engine oga`: onnxruntime-genai's settings, its runtime, threads and KV mode
    /// defaulting to the ort engine's; `None` for our own loop.
    pub fn oga_options(&self) -> Option<OgaOptions> {
        (self.engine == EngineKind::Oga).then(|| {
            let mut opts = self.oga.clone();
            opts.ort_lib = opts.ort_lib.or_else(|| self.ort_lib.clone());
            opts.intra_threads = opts.intra_threads.or(self.ort.intra_threads);
            opts.kv_mode = opts.kv_mode.or(self.ort.kv_mode);
            opts
        })
    }
}

/// The backbone's generation loop: our own over ONNX Runtime, onnxruntime-genai's, or our own
/// over llama.cpp; `auto` picks by the package's backbone (ONNX: ort, GGUF: llama).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EngineKind {
    #[default]
    Auto,
    Ort,
    Oga,
    Llama,
}

impl EngineKind {
    /// The engine that runs a package of this format.
    pub fn resolve(self, format: BackboneFormat) -> Self {
        match (self, format) {
            (Self::Auto, BackboneFormat::Onnx) => Self::Ort,
            (Self::Auto, BackboneFormat::Gguf) => Self::Llama,
            (kind, _) => kind,
        }
    }
}

impl EngineKind {
    /// The name `--engine` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Ort => "ort",
            Self::Oga => "oga",
            Self::Llama => "llama",
        }
    }
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "ort" => Ok(Self::Ort),
            "oga" => Ok(Self::Oga),
            "llama" => Ok(Self::Llama),
            _ => Err(format!(
                "unknown engine {s:?} (supported: auto, ort, oga, llama)"
            )),
        }
    }
}

/// Loads the engine a config asks for over a loaded package: resolves `--device`, then runs the
/// backbone in this process (cpu, cuda) or in a worker child (npu, or any device with
/// `isolate`). On the NPU the worker's residency gate applies to this load and every respawn:
/// only a proven residency serves, unless `allow_cpu_fallback` (never with `require_npu`).
pub fn load_engine(cfg: &SynthConfig, pkg: &ModelPackage) -> Result<Box<dyn Engine>, crate::Error> {
    match cfg.engine.resolve(pkg.format) {
        EngineKind::Llama => return load_llama(cfg, pkg),
        _ if pkg.format == BackboneFormat::Gguf => {
            return Err(EngineError::Params(format!(
                "{} is a GGUF package: it runs with --engine llama (or --engine auto)",
                pkg.dir.display()
            ))
            .into());
        }
        _ => {}
    }
    let declared = pkg.genai.model.decoder.session_options.declares_ryzenai();
    let root = crate::native::env_path(crate::npu::env::RYZENAI_ROOT_VAR);
    let decision = device::resolve(cfg.device, declared, root.as_deref());
    tracing::info!("device: {} ({})", decision.device, decision.why);
    if cfg.require_npu && decision.device != Device::Npu {
        return Err(EngineError::Device(format!(
            "--require-npu: the backbone would run on {} ({}); refusing to fall back",
            decision.device, decision.why
        ))
        .into());
    }
    if decision.device == Device::Npu && !declared {
        tracing::warn!(
            "--device npu: {} declares no RyzenAI provider in genai_config.json, so the worker \
             gets no NPU environment; this is not an NPU package",
            pkg.dir.display()
        );
    }
    let oga = cfg.oga_options();
    if decision.device == Device::Npu || cfg.isolate {
        let mut wcfg = worker_config(cfg, &pkg.dir, decision.device, declared)?;
        wcfg.gate = (decision.device == Device::Npu).then_some(ResidencyGate {
            require_npu: cfg.require_npu,
            allow_cpu_fallback: cfg.allow_cpu_fallback,
        });
        let mut worker = WorkerEngine::new(wcfg);
        worker.start()?;
        return Ok(Box::new(worker));
    }
    let ort = OrtOptions {
        device: decision.device,
        ..cfg.ort.clone()
    };
    match oga {
        None => {
            let env = crate::runtime::environment(cfg.ort_lib.as_deref())?;
            let backbone = engine::OrtBackbone::load(env, pkg, &ort)?;
            Ok(Box::new(LocalEngine(Box::new(backbone))))
        }
        Some(opts) => {
            let backbone = engine::OgaBackbone::load(pkg, &opts)?;
            Ok(Box::new(LocalEngine(Box::new(backbone))))
        }
    }
}

/// The llama.cpp engine over a GGUF package, in this process. `--device auto` is the first GPU
/// the build's backends see, else the CPU; where the layers went is what llama.cpp reports.
#[cfg(feature = "llama")]
fn load_llama(cfg: &SynthConfig, pkg: &ModelPackage) -> Result<Box<dyn Engine>, crate::Error> {
    if cfg.isolate || cfg.require_npu {
        return Err(EngineError::Params(
            "--engine llama runs in this process on the CPU or a GPU; --isolate and --require-npu are for ONNX packages"
                .into(),
        )
        .into());
    }
    let device = match cfg.device {
        DeviceChoice::Exactly(d) => d,
        DeviceChoice::Auto => engine::llama::first_gpu().unwrap_or(Device::Cpu),
    };
    let plan =
        crate::runtime::ThreadPlan::for_process(cfg.ort.threads, cfg.ort.intra_threads, None);
    let threads = plan
        .intra_threads
        .unwrap_or_else(|| crate::runtime::CpuTopology::detect().physical_cores());
    let opts = engine::LlamaOptions {
        threads,
        device,
        max_batch: cfg.scheduler.max_batch,
        attention: cfg.llama_attention,
    };
    let backbone = engine::LlamaBackbone::load(pkg, &opts)?;
    Ok(Box::new(LocalEngine(Box::new(backbone))))
}

/// The GPU this build's llama.cpp would take for `--device auto`.
#[cfg(feature = "llama")]
fn llama_gpu() -> Option<Device> {
    engine::llama::first_gpu()
}

#[cfg(not(feature = "llama"))]
fn llama_gpu() -> Option<Device> {
    None
}

#[cfg(not(feature = "llama"))]
fn load_llama(_: &SynthConfig, _: &ModelPackage) -> Result<Box<dyn Engine>, crate::Error> {
    Err(EngineError::Params(
        "--engine llama: this build has no llama.cpp (built without the `llama` cargo feature)"
            .into(),
    )
    .into())
}

/// The worker a config starts for a backbone on `device`: the production settings
/// ([`WorkerConfig::from_process`]) with the config's provider library, timeouts, kill
/// permission and generation loop; no residency gate.
pub fn worker_config(
    cfg: &SynthConfig,
    package_dir: &Path,
    device: Device,
    provider_declared: bool,
) -> Result<WorkerConfig, EngineError> {
    let ort = OrtOptions {
        device,
        ..cfg.ort.clone()
    };
    let mut w = WorkerConfig::from_process(
        package_dir.to_path_buf(),
        cfg.ort_lib.clone(),
        ort,
        provider_declared,
        cfg.worker_exe.clone(),
    )?;
    w.stop.allow_kill = cfg.allow_kill;
    w.timeouts = cfg.worker_timeouts;
    w.ep_library = cfg.ep_library.clone();
    w.oga = cfg.oga_options();
    Ok(w)
}

/// The NPU worker `npu probe` and `doctor --model` start for a config's package (read only as
/// far as its backbone config, so a package without a codec can still be probed).
pub fn probe_config(cfg: &SynthConfig) -> Result<WorkerConfig, crate::Error> {
    let pkg = crate::package::BackbonePackage::load(&cfg.package_dir)?;
    let declared = pkg.genai.model.decoder.session_options.declares_ryzenai();
    Ok(worker_config(cfg, &cfg.package_dir, Device::Npu, declared)?)
}

/// Loads the NeuCodec decoder sessions with the threads a config gives them, on this process's
/// ONNX Runtime; `streams` decode side by side at most (the default sessions follow it).
pub fn load_codec(
    cfg: &SynthConfig,
    codec: &CodecPackage,
    streams: usize,
) -> Result<CodecPool, crate::Error> {
    let env = crate::runtime::environment(cfg.ort_lib.as_deref())?;
    let threads =
        crate::runtime::ThreadPlan::for_process(cfg.ort.threads, cfg.codec_threads, cfg.ort.spin);
    let sessions = cfg
        .codec_sessions
        .unwrap_or_else(|| codec::default_sessions(threads.intra_threads, streams));
    let pool = CodecPool::load(env, codec, &threads, sessions)?;
    tracing::info!("codec {}: {}", codec.decoder.display(), pool.describe());
    Ok(pool)
}

/// Where a backbone runs, as far as it was observed: an NPU load is "npu" only with proven
/// residency, else "cpu fallback" (it was let through by --allow-cpu-fallback).
pub fn device_label(device: Device, residency: Option<&Residency>) -> String {
    match device {
        Device::Npu => match residency {
            Some(r) if r.is_proven() => "npu".to_owned(),
            _ => "cpu fallback".to_owned(),
        },
        other => other.to_string(),
    }
}

/// Resolves a model directory given on the command line or by default: an existing path as given,
/// else relative to the checkout that holds `.onebit` (so the binary works from any directory).
pub fn resolve_dir(p: &Path) -> PathBuf {
    if p.is_absolute() || p.exists() {
        return p.to_path_buf();
    }
    for home in crate::paths::onebit_homes() {
        if let Some(repo) = home.parent() {
            let cand = repo.join(p);
            if cand.exists() {
                return cand;
            }
        }
    }
    p.to_path_buf()
}
