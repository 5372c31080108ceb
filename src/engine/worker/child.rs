//! The worker's side (`onebit-tts worker`): loads the backbone on the device the parent asks for
//! and runs generations, streaming codes.
//!
//! Threads:
//! - main: owns the backbone and the reply stream; runs one request at a time;
//! - stdin reader: decodes requests; a `cancel` fires the running request's token at once (so
//!   the main thread stops within one step), everything else is queued for main;
//! - signals: SIGTERM, SIGINT and SIGHUP are blocked in every thread and taken here with
//!   `sigwait`, so no handler ever runs in signal context. SIGTERM cancels the running request
//!   and queues a shutdown; SIGINT/SIGHUP are logged and ignored (they reach the whole terminal
//!   process group; the parent decides and ends the worker with SIGTERM or end of stdin).
//!
//! A stop request (SIGTERM, end of stdin, `shutdown`) that arrives while the model loads cannot
//! wait for main: an NPU load compiles for minutes. When nothing is held on a device yet (any
//! CPU load; an NPU load whose process has no accel fd open), the thread that took the request
//! ends the process at once with `_exit(EXIT_STOPPED_DURING_LOAD)`: no atexit handlers and no
//! C++ static destructors run, so ONNX Runtime's, the provider's and XRT's globals are not torn
//! down under the load still running on main (tearing them down there hangs the exit), and the
//! kernel frees
//! the rest. Once the NPU is open, exiting would end the loading thread like a SIGKILL would on
//! a device holder, so the request waits for the load to finish and the model is released in
//! order as below.
//!
//! Shutdown order: the main loop returns, the model session is dropped, then `main` returns and
//! only then do ONNX Runtime's, the provider's and XRT's globals go (at process exit). The
//! reverse order hangs: exit() in a signal handler tears the runtime down under the model.
//!
//! The reply stream is a private duplicate of the original stdout; fd 1 itself is pointed at
//! stderr, so anything a library prints lands in the log, not inside a frame.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write};
use std::ops::ControlFlow;
use std::os::fd::FromRawFd;
use std::process::ExitCode;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use super::protocol::{
    Generate, Hello, Load, Loaded, Reply, Request, Summary, WireError, read_frame, write_frame,
};
use crate::engine::{self, Backbone, CancelToken, Device, EngineError, OgaBackbone, OrtBackbone};
use crate::npu::residency::{
    CounterReader, Evidence, NpuWatch, Residency, sample_accel, sample_mem_usage, weigh_npu,
};
use crate::npu::xdna;
use crate::npu::{SystemRoots, accel_fds, cache, fork_guard};
use crate::package::BackbonePackage;

enum Input {
    Load(Load),
    Generate(Generate, CancelToken),
    Shutdown(&'static str),
    Broken(String),
}

type Running = Arc<Mutex<Option<(u64, CancelToken)>>>;

/// Exit status of a worker stopped while its model was loading (nothing was held on a device).
/// 75 is EX_TEMPFAIL: the load was abandoned, not failed.
pub const EXIT_STOPPED_DURING_LOAD: u8 = 75;

/// Test hook, read only by the worker: `load` makes it hang inside its model load, as a long NPU
/// compile would, so tests can stop a worker mid-load. Any other value is ignored.
pub const TEST_HANG_VAR: &str = "ONEBIT_WORKER_TEST_HANG";

/// What a stop request finds the worker doing.
#[derive(Default)]
enum Phase {
    #[default]
    Idle,
    /// Inside the model load; on the NPU, the roots under which to look for an open accel node.
    Loading { npu: Option<SystemRoots> },
}

type SharedPhase = Arc<Mutex<Phase>>;

fn lock_phase(phase: &SharedPhase) -> std::sync::MutexGuard<'_, Phase> {
    phase.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `load` with the phase set to loading, so a stop request meanwhile can end the process.
fn in_load_phase<R>(phase: &SharedPhase, load: &Load, f: impl FnOnce() -> R) -> R {
    *lock_phase(phase) = Phase::Loading {
        npu: (load.ort.device == Device::Npu).then(|| load.roots.clone()),
    };
    if std::env::var_os(TEST_HANG_VAR).is_some_and(|v| v == "load") {
        tracing::warn!("{TEST_HANG_VAR}=load: hanging inside the model load (test hook)");
        loop {
            std::thread::park();
        }
    }
    let r = f();
    *lock_phase(phase) = Phase::Idle;
    r
}

/// Ends the process at once when `why` arrives inside a model load and nothing is held on a
/// device yet; returns otherwise, and the caller queues the shutdown for the main loop.
fn exit_if_loading(phase: &SharedPhase, why: &str) {
    // Held until the process ends: main cannot leave the load phase behind this decision.
    let st = lock_phase(phase);
    let Phase::Loading { npu } = &*st else {
        return;
    };
    if let Some(roots) = npu {
        // Our own counter reader holds no context: closing it by exiting harms nothing.
        let own = crate::npu::residency::own_reader_fd();
        let held = accel_fds(std::process::id(), roots)
            .map(|fds| fds.into_iter().any(|fd| Some(fd as i32) != own));
        if !matches!(held, Ok(false)) {
            tracing::warn!(
                "{why} during the model load with the NPU {}: finishing the load, then \
                 releasing the model before exiting (ending now would drop the device mid-setup)",
                if held.is_ok() {
                    "already open"
                } else {
                    "possibly open (this process's fd table is unreadable)"
                }
            );
            return;
        }
    }
    tracing::warn!(
        "{why} during the model load: exiting now (status {EXIT_STOPPED_DURING_LOAD}) without \
         waiting for the load; nothing is held on a device yet"
    );
    // SAFETY: _exit(2) ends the process without running atexit handlers or static destructors,
    // so no runtime global is torn down under the load running on main; the kernel releases
    // memory and fds. Nothing of ours is half-written: replies go out whole, between loads.
    unsafe { libc::_exit(i32::from(EXIT_STOPPED_DURING_LOAD)) }
}

/// The worker's `main`. Call it first thing, before any other thread exists (the signal mask is
/// inherited by threads created later, ONNX Runtime's pools included).
pub fn main() -> ExitCode {
    let signals = match block_signals() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("blocking signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let out = match take_stdout() {
        Ok(f) => f,
        Err(e) => {
            tracing::error!("setting up the reply stream: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (tx, rx) = mpsc::channel::<Input>();
    let running: Running = Arc::new(Mutex::new(None));
    let phase = SharedPhase::default();
    if let Err(e) = spawn_signal_thread(signals, tx.clone(), running.clone(), phase.clone()) {
        tracing::error!("starting the signal thread: {e}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = spawn_stdin_thread(tx, running.clone(), phase.clone()) {
        tracing::error!("starting the request reader: {e}");
        return ExitCode::FAILURE;
    }
    let code = serve(rx, running, &phase, BufWriter::new(out));
    tracing::info!("worker exiting");
    code
}

/// The main loop; returns after the backbone is dropped.
fn serve(
    rx: mpsc::Receiver<Input>,
    running: Running,
    phase: &SharedPhase,
    mut out: BufWriter<File>,
) -> ExitCode {
    let hello = Hello::from_process();
    tracing::info!(
        "worker pid {} started (protocol {}, onebit-tts {})",
        hello.pid,
        hello.protocol,
        hello.version
    );
    if write_frame(&mut out, &Reply::Hello(hello)).is_err() {
        return ExitCode::FAILURE;
    }
    let mut backbone: Option<Box<dyn Backbone>> = None;
    // On the NPU: our own reader of the driver's counters and the session's contexts, kept for
    // the worker's life (closing it early would be harmless; re-opening it each time is waste).
    let mut npu: Option<NpuWatch> = None;
    let mut code = ExitCode::SUCCESS;
    while let Ok(input) = rx.recv() {
        let sent = match input {
            Input::Load(load) => {
                let reply = if backbone.is_some() {
                    Reply::Error {
                        id: None,
                        error: WireError::Other("the backbone is already loaded".into()),
                    }
                } else {
                    match in_load_phase(phase, &load, || load_backbone(&load)) {
                        Ok((b, loaded, watch)) => {
                            backbone = Some(b);
                            npu = watch;
                            Reply::Loaded(Box::new(loaded))
                        }
                        Err(e) => {
                            tracing::error!("load failed: {e}");
                            Reply::Error {
                                id: None,
                                error: WireError::from(&e),
                            }
                        }
                    }
                };
                write_frame(&mut out, &reply)
            }
            Input::Generate(g, token) => {
                let sent = run(backbone.as_deref_mut(), npu.as_ref(), &g, &token, &mut out);
                let mut r = running.lock().unwrap_or_else(|p| p.into_inner());
                if r.as_ref().is_some_and(|(id, _)| *id == g.id) {
                    *r = None;
                }
                sent
            }
            Input::Shutdown(why) => {
                tracing::info!("shutting down ({why})");
                break;
            }
            Input::Broken(why) => {
                tracing::error!("request stream broken: {why}; shutting down");
                code = ExitCode::FAILURE;
                break;
            }
        };
        if let Err(e) = sent {
            tracing::warn!("reply stream closed ({e}): the parent is gone; shutting down");
            break;
        }
    }
    if backbone.take().is_some() {
        tracing::info!("model session released");
    }
    code
}

/// A loaded backbone, what the parent is told of it, and on the NPU the session's watch.
type LoadedBackbone = (Box<dyn Backbone>, Loaded, Option<NpuWatch>);

fn load_backbone(load: &Load) -> Result<LoadedBackbone, EngineError> {
    let npu = load.ort.device == Device::Npu;
    // The RyzenAI provider only works with the ONNX Runtime it was built against: on the NPU
    // route with a venv, that one or none.
    let root = crate::native::env_path(crate::native::RYZENAI_ROOT_VAR);
    // onnxruntime-genai runs on the ONNX Runtime loaded here (one per process).
    let env = match (&load.ort_lib, npu, root) {
        (None, true, Some(root)) => {
            let (path, version) = crate::runtime::paired_with_venv(&root)
                .map_err(|e| EngineError::Device(e.to_string()))?;
            tracing::info!(
                "NPU route: the venv's ONNX Runtime {version} ({}), the one its provider pairs with",
                path.display()
            );
            crate::runtime::environment_from("the RyzenAI venv, paired with its provider", &path)
        }
        (explicit, ..) => crate::runtime::environment(explicit.as_deref()),
    }
    .map_err(|e| EngineError::Runtime(e.to_string()))?;
    // On the NPU the session compiles and caches next to its model_root: a writable place of
    // ours when the package is read-only or a cache directory is named (npu::cache).
    let package_dir = if npu {
        let named = crate::native::env_path(cache::CACHE_DIR_VAR);
        let fallback = cache::fallback_root();
        let root = cache::model_root(&load.package_dir, named.as_deref(), fallback.as_deref())
            .map_err(|e| EngineError::Device(format!("the NPU compile cache: {e}")))?;
        if let cache::ModelRoot::Mirror { dir, seeded } = &root {
            tracing::info!(
                "NPU session loads {} from {} (links to its files and a writable compile cache \
                 of its own{})",
                load.package_dir.display(),
                dir.display(),
                if *seeded {
                    ", seeded from the package's"
                } else {
                    ""
                }
            );
        }
        root.dir().to_path_buf()
    } else {
        load.package_dir.clone()
    };
    let pkg = BackbonePackage::load(&package_dir)
        .map_err(|e| EngineError::Graph(format!("package {}: {e}", package_dir.display())))?;
    let mut notes = Vec::new();
    let mem_before = if npu {
        sample_mem_usage(&load.roots, &mut notes)
    } else {
        None
    };
    // Opened and read before the session exists: the contexts that appear after are its own.
    let mut watch = npu.then(|| {
        NpuWatch::before_session(
            CounterReader::open(&load.roots),
            xdna::driver_pid(&load.roots.proc),
            xdna::in_initial_pid_namespace(&load.roots.proc),
        )
    });
    // Our loop knows where ONNX Runtime put the nodes and what the provider was given;
    // onnxruntime-genai's attaches the package's providers itself and says neither.
    let (mut b, providers, placement, provider_setup): (Box<dyn Backbone>, _, _, _) =
        match &load.oga {
            None => {
                let b = OrtBackbone::load_backbone(env, &pkg, &load.ort)?;
                let providers = b.providers().to_vec();
                let placement = b.placement().cloned();
                let setup = b.provider_setup().cloned();
                (Box::new(b), providers, placement, setup)
            }
            Some(opts) => {
                let b = OgaBackbone::load_backbone(&pkg, opts)?;
                let providers = pkg.genai.model.decoder.session_options.providers();
                let providers = providers.iter().map(|p| p.to_string()).collect();
                (Box::new(b), providers, None, None)
            }
        };
    // The session exists, and XRT's fd with it: from here on a child process would be fatal to
    // the session's contexts (npu::fork_guard).
    let fork_guard = npu.then(|| match fork_guard::forbid() {
        Ok(()) => fork_guard::REFUSED.to_owned(),
        Err(e) => {
            tracing::warn!("{e}");
            format!("not installed: {e}")
        }
    });
    let residency = match &mut watch {
        Some(w) => {
            let r = gather_evidence(
                b.as_mut(),
                w,
                placement.clone(),
                &load.roots,
                load.evidence_steps,
                mem_before,
                notes,
            )?;
            w.adopt(&r);
            Some(r)
        }
        None => None,
    };
    let loaded = Loaded {
        engine: b.describe(),
        // The device the loop was asked for, whichever loop: onnxruntime-genai's does not say.
        device: load.ort.device,
        providers,
        runtime: crate::runtime::info()
            .map(|i| format!("{} ({}; {})", i.path.display(), i.version, i.source)),
        placement,
        provider_setup,
        residency,
        fork_guard,
        budget: Some(b.budget()),
    };
    tracing::info!(
        "backbone loaded on {}: {} (providers: {})",
        loaded.device,
        loaded.engine,
        loaded.providers.join(", ")
    );
    if let Some(r) = &loaded.residency {
        if r.is_proven() {
            tracing::info!("{r}");
        } else {
            tracing::warn!("{r}");
        }
    }
    Ok((b, loaded, watch))
}

/// The NPU's residency evidence, gathered by this process about itself: ONNX Runtime's node
/// placement (when the loop can read it), and the device's busy time for this process across a
/// short evidence run (a prefill of a few tokens, then `steps` decode steps; token 0 exists in
/// every vocabulary and the sequence is reset afterwards).
fn gather_evidence(
    b: &mut dyn Backbone,
    watch: &NpuWatch,
    placement: Option<crate::npu::Placement>,
    roots: &SystemRoots,
    steps: usize,
    mem_usage_before: Option<u64>,
    mut notes: Vec<String>,
) -> Result<Residency, EngineError> {
    let pid = std::process::id();
    // Our own counter reader's fd is no evidence of XRT's.
    let reader = crate::npu::residency::own_reader_fd();
    let accel_before = sample_accel(pid, roots, reader, &mut notes);
    let readings = watch.evidence_round(|| {
        b.reset();
        b.append(&[0; 8])?;
        for _ in 0..steps {
            b.append(&[0])?;
        }
        b.reset();
        Ok::<(), EngineError>(())
    })?;
    let accel_after = sample_accel(pid, roots, reader, &mut notes);
    let mem_usage_after = if mem_usage_before.is_some() {
        sample_mem_usage(roots, &mut notes)
    } else {
        None
    };
    Ok(weigh_npu(Evidence {
        placement,
        pid: readings.own_pid,
        initial_pid_namespace: readings.initial_ns,
        counters_at_load: Some(readings.at_load),
        counters_before: Some(readings.before),
        counters_after: Some(readings.after),
        accel_before,
        accel_after,
        decode_steps: steps,
        mem_usage_before,
        mem_usage_after,
        notes,
    }))
}

/// Runs one generation, streaming codes; returns Err only when the reply stream is gone.
fn run(
    backbone: Option<&mut (dyn Backbone + 'static)>,
    npu: Option<&NpuWatch>,
    g: &Generate,
    token: &CancelToken,
    out: &mut BufWriter<File>,
) -> io::Result<()> {
    let Some(backbone) = backbone else {
        return write_frame(
            out,
            &Reply::Error {
                id: Some(g.id),
                error: WireError::Other("generate before load".into()),
            },
        );
    };
    // The driver's own count of what the NPU did for this request.
    let before = npu.map(NpuWatch::read);
    let mut broken: Option<io::Error> = None;
    let result = engine::generate(
        backbone,
        &g.candidates,
        &g.prompt,
        &g.params,
        token,
        &mut |code| match write_frame(&mut *out, &Reply::Code { id: g.id, code }) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                broken = Some(e);
                ControlFlow::Break(())
            }
        },
    );
    if let Some(e) = broken {
        return Err(e);
    }
    let reply = match result {
        Ok(mut generation) => {
            if let (Some(w), Some(b)) = (npu, &before) {
                generation.npu_commands = w.commands_since(b);
            }
            Reply::Done {
                id: g.id,
                summary: Summary::of(&generation),
            }
        }
        Err(e) => {
            tracing::warn!("request {} failed: {e}", g.id);
            Reply::Error {
                id: Some(g.id),
                error: WireError::from(&e),
            }
        }
    };
    write_frame(out, &reply)
}

fn spawn_stdin_thread(
    tx: mpsc::Sender<Input>,
    running: Running,
    phase: SharedPhase,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("worker-stdin".into())
        .spawn(move || {
            let mut input = BufReader::new(io::stdin().lock());
            loop {
                let msg = match read_frame::<_, Request>(&mut input) {
                    Ok(Some(m)) => m,
                    Ok(None) => {
                        exit_if_loading(&phase, "end of stdin");
                        let _ = tx.send(Input::Shutdown("end of stdin"));
                        return;
                    }
                    Err(e) => {
                        let _ = tx.send(Input::Broken(e.to_string()));
                        return;
                    }
                };
                let forwarded = match msg {
                    Request::Load(l) => tx.send(Input::Load(*l)),
                    Request::Generate(g) => {
                        // Registered here, before main sees it, so a cancel that follows at
                        // once finds it.
                        let token = CancelToken::new();
                        *running.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some((g.id, token.clone()));
                        tx.send(Input::Generate(g, token))
                    }
                    Request::Cancel { id } => {
                        let r = running.lock().unwrap_or_else(|p| p.into_inner());
                        match r.as_ref() {
                            Some((rid, token)) if *rid == id => token.cancel(),
                            _ => tracing::debug!("cancel {id}: not running"),
                        }
                        Ok(())
                    }
                    Request::Shutdown => {
                        exit_if_loading(&phase, "shutdown requested");
                        let _ = tx.send(Input::Shutdown("shutdown requested"));
                        return;
                    }
                };
                if forwarded.is_err() {
                    return;
                }
            }
        })
        .map(|_| ())
}

/// The signals the worker takes on its own thread.
const TAKEN: [libc::c_int; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

fn block_signals() -> io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data initialised by sigemptyset; pthread_sigmask changes only
    // this thread's mask (and, by inheritance, that of threads created later).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in TAKEN {
            libc::sigaddset(&mut set, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

fn spawn_signal_thread(
    set: libc::sigset_t,
    tx: mpsc::Sender<Input>,
    running: Running,
    phase: SharedPhase,
) -> io::Result<()> {
    std::thread::Builder::new()
        .name("worker-signals".into())
        .spawn(move || {
            loop {
                let mut sig: libc::c_int = 0;
                // SAFETY: `set` is a valid sigset whose signals are blocked in every thread.
                let rc = unsafe { libc::sigwait(&set, &mut sig) };
                if rc != 0 {
                    tracing::error!("sigwait: {}", io::Error::from_raw_os_error(rc));
                    return;
                }
                if sig == libc::SIGTERM {
                    exit_if_loading(&phase, "SIGTERM");
                    tracing::info!(
                        "SIGTERM: cancelling the request in flight, then releasing the model"
                    );
                    if let Some((_, token)) =
                        running.lock().unwrap_or_else(|p| p.into_inner()).as_ref()
                    {
                        token.cancel();
                    }
                    let _ = tx.send(Input::Shutdown("SIGTERM"));
                } else {
                    tracing::info!(
                        "signal {sig} ignored: the parent ends the worker (SIGTERM or end of stdin)"
                    );
                }
            }
        })
        .map(|_| ())
}

/// A private, close-on-exec duplicate of stdout for the replies; fd 1 then points at stderr.
fn take_stdout() -> io::Result<File> {
    io::stdout().flush()?;
    // SAFETY: plain fd syscalls on fds 1 and 2, which exist for a process started by the parent
    // with piped stdout/stderr; the duplicate is owned by the returned File alone.
    unsafe {
        let fd = libc::fcntl(libc::STDOUT_FILENO, libc::F_DUPFD_CLOEXEC, 3);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) < 0 {
            let e = io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(File::from_raw_fd(fd))
    }
}
