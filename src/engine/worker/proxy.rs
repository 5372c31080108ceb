//! The parent's side of the engine worker: [`WorkerEngine`].

use std::fmt;
use std::io::{self, BufRead, BufReader, BufWriter};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::process::{ChildStderr, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::protocol::{
    EVIDENCE_STEPS, Generate, Hello, Load, Loaded, PROTOCOL_VERSION, Reply, Request, read_frame,
    write_frame,
};
use crate::engine::{
    CancelToken, Candidates, Device, Engine, EngineError, Generation, GenerationParams, OgaOptions,
    OrtOptions, StopReason,
};
use crate::npu::SystemRoots;
use crate::npu::env::{EnvInputs, worker_env};
use crate::npu::residency::Residency;
use crate::npu::supervisor::{Child, Ending, NeverKill, StopOutcome, StopPolicy};

/// How often the watchdog reaps (a reap by anyone else wakes it at once).
const WATCHDOG_INTERVAL: Duration = Duration::from_millis(50);
/// How often a running request looks at its cancel token between messages.
const CANCEL_POLL: Duration = Duration::from_millis(20);
/// After the worker's reply stream ends, how long to wait for its exit status before stopping it.
const CRASH_REAP_WAIT: Duration = Duration::from_secs(2);
/// How much of the worker's recent log the handle keeps.
const LOG_TAIL_BYTES: usize = 16 * 1024;
/// The delay before the one retry of a failed non-streamed NPU request (first dispatch after
/// idle can hit a one-off firmware timeout).
pub const NPU_RETRY_DELAY: Duration = Duration::from_secs(1);
/// From start to `loaded`: generous, because a first NPU load compiles the model (minutes) and
/// caches the result for later loads.
pub const DEFAULT_LOAD_TIMEOUT: Duration = Duration::from_secs(900);
/// Within a request, the longest wait for the next code or the end; the first code includes the
/// prefill of the whole prompt.
pub const DEFAULT_STEP_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the worker may go without progress before it counts as hung and is stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerTimeouts {
    /// From start to `loaded` (`--load-timeout`, ONEBIT_LOAD_TIMEOUT_S).
    pub load: Duration,
    /// Between a request's codes, or to its end (`--step-timeout`, ONEBIT_STEP_TIMEOUT_S).
    pub step: Duration,
}

impl Default for WorkerTimeouts {
    fn default() -> Self {
        WorkerTimeouts {
            load: DEFAULT_LOAD_TIMEOUT,
            step: DEFAULT_STEP_TIMEOUT,
        }
    }
}

/// Whether an NPU load may serve: only with proven residency, unless the CPU fallback is allowed
/// (and `--require-npu` forbids that in any case). Checked after every load, a respawn's too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResidencyGate {
    pub require_npu: bool,
    pub allow_cpu_fallback: bool,
}

impl ResidencyGate {
    pub fn check(&self, residency: Option<&Residency>) -> Result<(), EngineError> {
        let r = match residency {
            Some(r) if r.is_proven() => return Ok(()),
            Some(r) => r.to_string(),
            None => "npu residency: unproven: the worker reported no evidence".to_owned(),
        };
        if self.require_npu {
            return Err(EngineError::Device(format!("--require-npu: {r}")));
        }
        if !self.allow_cpu_fallback {
            return Err(EngineError::Device(format!(
                "--device npu: {r}; refusing to serve a CPU fallback as the NPU (pass \
                 --allow-cpu-fallback to serve it anyway, labelled \"cpu fallback\")"
            )));
        }
        tracing::warn!("--allow-cpu-fallback: serving although {r}");
        Ok(())
    }
}

/// How to start and stop the worker.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    pub package_dir: PathBuf,
    pub ort_lib: Option<PathBuf>,
    /// Session options, device included.
    pub ort: OrtOptions,
    /// Inputs of the environment rules; `env.worker_exe` is the program started as
    /// `<exe> worker` (normally this process's own executable).
    pub env: EnvInputs,
    /// SIGTERM, the grace (ONEBIT_BACKEND_STOP_GRACE_S), then SIGKILL only when allowed and
    /// never for a worker the policy protects (one holding the NPU).
    pub stop: StopPolicy,
    /// Load and step timeouts: past them the worker counts as hung and is stopped.
    pub timeouts: WorkerTimeouts,
    /// On the NPU: whether a load may serve, checked after every (re)spawn; `None`: any load.
    pub gate: Option<ResidencyGate>,
    /// Where /sys, /dev and /proc are for the residency proof; tests fake them.
    pub roots: SystemRoots,
    /// RYZENAI_EP_PATH for the worker, over what the environment rules set (`--ep-library`).
    pub ep_library: Option<PathBuf>,
    /// Run onnxruntime-genai's loop in the worker (`--engine oga`) instead of ours.
    pub oga: Option<OgaOptions>,
}

impl WorkerConfig {
    /// The production settings: this executable as the worker, the environment rules over this
    /// process's knobs (applied only for `--device npu` on a package that declares RyzenAI),
    /// ONEBIT_BACKEND_STOP_GRACE_S with no SIGKILL of an NPU worker (nor of any process found
    /// holding the NPU), the default timeouts, no residency gate, the real system roots, the 1 s
    /// retry on the NPU.
    pub fn from_process(
        package_dir: PathBuf,
        ort_lib: Option<PathBuf>,
        ort: OrtOptions,
        provider_declared: bool,
        worker_exe: Option<PathBuf>,
    ) -> Result<Self, EngineError> {
        let exe = match worker_exe {
            Some(p) => p,
            None => std::env::current_exe().map_err(|e| {
                EngineError::Worker(format!(
                    "cannot find this executable to start the worker: {e}"
                ))
            })?,
        };
        let npu = ort.device == Device::Npu;
        let roots = SystemRoots::default();
        Ok(WorkerConfig {
            package_dir,
            ort_lib,
            env: EnvInputs::from_process(provider_declared && npu, exe),
            stop: StopPolicy {
                never_kill: if npu {
                    NeverKill::Anyone
                } else {
                    NeverKill::AccelHolders(roots.clone())
                },
                ..StopPolicy::from_env()
            },
            timeouts: WorkerTimeouts::default(),
            gate: None,
            roots,
            ep_library: None,
            oga: None,
            ort,
        })
    }
}

/// What the parent knows about its worker; shared with the watchdog, cheap to clone, readable
/// while a request runs (for /health and tests).
#[derive(Clone, Default)]
pub struct WorkerHandle(Arc<Shared>);

#[derive(Default)]
struct Shared {
    st: Mutex<State>,
    changed: Condvar,
}

/// Where the worker stands, for /health and the log. Every state but `NotStarted` and
/// `Unavailable` names the worker's pid.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum WorkerState {
    /// None started yet; the next request starts one.
    #[default]
    NotStarted,
    /// Started, not yet said hello.
    Starting {
        pid: u32,
    },
    /// Said hello, loading the model (minutes for a first NPU load).
    Loading {
        pid: u32,
    },
    Ready {
        pid: u32,
    },
    /// Made no progress in time; being stopped (SIGTERM, grace).
    Hung {
        pid: u32,
        reason: String,
    },
    /// Being stopped (shutdown, or cleanup after a failure): SIGTERM sent, in its grace.
    Stopping {
        pid: u32,
    },
    /// Outlived its grace while holding the NPU: never SIGKILLed, and no worker starts beside
    /// it; the engine serves again once it exits.
    WaitingForExit {
        pid: u32,
        reason: String,
    },
    /// Ended (or was let go); the next request starts a new one.
    Stopped {
        pid: u32,
        how: String,
    },
    /// Serves nothing until restarted (a respawned NPU worker's residency was not proven).
    Unavailable {
        reason: String,
    },
}

impl WorkerState {
    pub fn pid(&self) -> Option<u32> {
        match self {
            WorkerState::Starting { pid }
            | WorkerState::Loading { pid }
            | WorkerState::Ready { pid }
            | WorkerState::Hung { pid, .. }
            | WorkerState::Stopping { pid }
            | WorkerState::WaitingForExit { pid, .. }
            | WorkerState::Stopped { pid, .. } => Some(*pid),
            WorkerState::NotStarted | WorkerState::Unavailable { .. } => None,
        }
    }

    /// True while no request can be served until something outside the engine changes.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            WorkerState::WaitingForExit { .. } | WorkerState::Unavailable { .. }
        )
    }
}

impl fmt::Display for WorkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkerState::NotStarted => f.write_str("not started"),
            WorkerState::Starting { pid } => write!(f, "worker pid {pid} starting"),
            WorkerState::Loading { pid } => write!(f, "worker pid {pid} loading the model"),
            WorkerState::Ready { pid } => write!(f, "worker pid {pid} ready"),
            WorkerState::Hung { pid, reason } => {
                write!(f, "worker pid {pid} hung ({reason}); stopping it")
            }
            WorkerState::Stopping { pid } => write!(f, "worker pid {pid} stopping"),
            WorkerState::WaitingForExit { reason, .. } | WorkerState::Unavailable { reason } => {
                f.write_str(reason)
            }
            WorkerState::Stopped { pid, how } => write!(f, "worker pid {pid} stopped: {how}"),
        }
    }
}

#[derive(Default)]
struct State {
    state: WorkerState,
    pid: Option<u32>,
    spawns: u32,
    hello: Option<Hello>,
    loaded: Option<Loaded>,
    residency: Option<Residency>,
    endings: Vec<(u32, Ending)>,
    left_running: Vec<u32>,
    log_tail: String,
    /// Workers whose stderr reached its end (every line of theirs is in `log_tail`).
    log_closed: Vec<u32>,
}

impl WorkerHandle {
    /// The worker and its engine as they are now (`None`: nothing loaded yet): read live, so
    /// it names the pid of the worker a respawn started, not the first one's.
    pub fn describe(&self) -> Option<String> {
        let st = self.lock();
        match (&st.loaded, st.pid) {
            (Some(l), Some(pid)) => Some(format!("worker pid {pid}: {}", l.engine)),
            (Some(l), None) => Some(format!("worker (not running; last: {})", l.engine)),
            (None, _) => None,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running worker's pid.
    pub fn pid(&self) -> Option<u32> {
        self.lock().pid
    }

    /// Where the worker stands (for /health).
    pub fn state(&self) -> WorkerState {
        self.lock().state.clone()
    }

    /// Waits up to `timeout` for a state that `want` accepts; returns it, or None on timeout.
    pub fn wait_state(
        &self,
        timeout: Duration,
        want: impl Fn(&WorkerState) -> bool,
    ) -> Option<WorkerState> {
        self.wait(timeout, |st| want(&st.state).then(|| st.state.clone()))
    }

    /// Waits up to `timeout` until the worker's log tail contains `needle`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        self.wait(timeout, |st| st.log_tail.contains(needle).then_some(()))
            .is_some()
    }

    /// Waits on the condition variable (every change notifies it) until `f` answers.
    fn wait<R>(&self, timeout: Duration, f: impl Fn(&State) -> Option<R>) -> Option<R> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(r) = f(&st) {
                return Some(r);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self
                .0
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// A stop's verdict on worker `pid`; a holder whose exit the watchdog already recorded is
    /// no longer waited for (checked under the same lock the watchdog records under).
    fn settle(&self, pid: u32, state: WorkerState) {
        let mut st = self.lock();
        let ended = st.endings.iter().any(|(p, _)| *p == pid);
        if !(ended && matches!(state, WorkerState::WaitingForExit { .. })) {
            st.state = state;
        }
        drop(st);
        self.0.changed.notify_all();
    }

    fn set_state(&self, state: WorkerState) {
        let mut st = self.lock();
        if st.state != state {
            tracing::debug!("worker state: {state}");
            st.state = state;
        }
        drop(st);
        self.0.changed.notify_all();
    }

    /// Workers started so far (a respawn after a crash counts).
    pub fn spawns(&self) -> u32 {
        self.lock().spawns
    }

    /// The latest worker's `hello`: its pid and the NPU environment as it saw it.
    pub fn hello(&self) -> Option<Hello> {
        self.lock().hello.clone()
    }

    /// The latest worker's `loaded`: engine, device, providers.
    pub fn loaded(&self) -> Option<Loaded> {
        self.lock().loaded.clone()
    }

    /// The NPU residency proof of the latest load (`None` off the NPU).
    pub fn residency(&self) -> Option<Residency> {
        self.lock().residency.clone()
    }

    /// How worker `pid` ended, once reaped.
    pub fn ending(&self, pid: u32) -> Option<Ending> {
        self.lock()
            .endings
            .iter()
            .find(|(p, _)| *p == pid)
            .map(|(_, e)| *e)
    }

    /// Waits up to `timeout` for worker `pid` to be reaped.
    pub fn wait_ending(&self, pid: u32, timeout: Duration) -> Option<Ending> {
        self.wait(timeout, |st| {
            st.endings.iter().find(|(p, _)| *p == pid).map(|(_, e)| *e)
        })
    }

    /// Workers left running after the grace (never SIGKILLed: NPU holders, or kill not allowed).
    pub fn left_running(&self) -> Vec<u32> {
        self.lock().left_running.clone()
    }

    /// The last lines the worker logged (at most 16 KB).
    pub fn log_tail(&self) -> String {
        self.lock().log_tail.clone()
    }

    /// Waits up to `timeout` until worker `pid`'s stderr has ended, so that its last lines are
    /// in [`WorkerHandle::log_tail`]. False on timeout.
    pub fn wait_log_closed(&self, pid: u32, timeout: Duration) -> bool {
        self.wait(timeout, |st| st.log_closed.contains(&pid).then_some(()))
            .is_some()
    }

    fn log_closed(&self, pid: u32) {
        self.lock().log_closed.push(pid);
        self.0.changed.notify_all();
    }

    fn record_ending(&self, pid: u32, ending: Ending) {
        let mut st = self.lock();
        if !st.endings.iter().any(|(p, _)| *p == pid) {
            st.endings.push((pid, ending));
        }
        if st.pid == Some(pid) {
            st.pid = None;
        }
        // A worker that ends on its own (a crash while idle, a holder that finally exits after
        // its grace) is no longer what /health should show; the stop in progress, if any,
        // overwrites this with its own verdict.
        if st.state.pid() == Some(pid) {
            st.state = WorkerState::Stopped {
                pid,
                how: format!("exited: {ending}"),
            };
        }
        drop(st);
        self.0.changed.notify_all();
    }

    fn push_log(&self, line: &str) {
        let mut st = self.lock();
        st.log_tail.push_str(line);
        st.log_tail.push('\n');
        if st.log_tail.len() > LOG_TAIL_BYTES {
            let mut cut = st.log_tail.len() - LOG_TAIL_BYTES;
            while !st.log_tail.is_char_boundary(cut) {
                cut += 1;
            }
            st.log_tail.drain(..cut);
        }
        drop(st);
        self.0.changed.notify_all();
    }
}

enum Event {
    Reply(Reply),
    /// The reply stream ended (the worker exited or closed it) or broke.
    Closed(String),
}

struct Live {
    child: Arc<Child>,
    stdin: Option<BufWriter<ChildStdin>>,
    events: mpsc::Receiver<Event>,
    /// Set before the parent stops the worker on purpose (the watchdog then logs at info).
    stopping: Arc<AtomicBool>,
}

impl Live {
    fn send(&mut self, req: &Request) -> io::Result<()> {
        match self.stdin.as_mut() {
            Some(w) => write_frame(w, req),
            None => Err(io::Error::new(io::ErrorKind::BrokenPipe, "stdin closed")),
        }
    }

    /// The next event, or `None` once `deadline` passes; the channel closing counts as the
    /// stream ending.
    fn recv_until(&self, deadline: Instant) -> Option<Event> {
        let left = deadline.saturating_duration_since(Instant::now());
        match self.events.recv_timeout(left) {
            Ok(ev) => Some(ev),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => Some(Event::Closed("reply reader gone".into())),
        }
    }
}

/// Why the parent stops a worker: decides what the log and /health say meanwhile.
enum Retire {
    /// On purpose (shutdown, a load the worker refused): logged at info.
    Planned,
    /// It died or broke its stream.
    Crashed,
    /// It made no progress in time.
    Hung(String),
}

/// How the start-up conversation failed.
enum Handshake {
    /// The worker answered with an error (or out of turn) and is still there.
    Refused(EngineError),
    /// Its reply stream ended.
    Closed(String),
    /// It said nothing in time; what it did not do.
    TimedOut(&'static str),
}

/// An [`Engine`] whose backbone runs in a worker child. The child is started by
/// [`WorkerEngine::start`] (or the first request), restarted by the next request after it dies
/// or hangs — but never beside an earlier worker that still holds the NPU — and stopped by
/// [`WorkerEngine::shutdown`] or drop.
pub struct WorkerEngine {
    cfg: WorkerConfig,
    handle: WorkerHandle,
    live: Option<Live>,
    next_id: u64,
    /// Workers that outlived the grace; kept so their exit can still be reaped, and so no new
    /// worker starts while one of them holds the NPU.
    left_running: Vec<Arc<Child>>,
    /// Set when a load must not serve (the residency gate refused it): every later request
    /// fails with this reason instead of respawning into a silent CPU fallback.
    unavailable: Option<String>,
}

impl WorkerEngine {
    /// A worker engine that has not started its child yet.
    pub fn new(cfg: WorkerConfig) -> Self {
        WorkerEngine {
            cfg,
            handle: WorkerHandle::default(),
            live: None,
            next_id: 1,
            left_running: Vec::new(),
            unavailable: None,
        }
    }

    /// Starts the worker and loads the backbone (a no-op while one is running).
    pub fn start(&mut self) -> Result<(), EngineError> {
        self.ensure_live()
    }

    pub fn handle(&self) -> WorkerHandle {
        self.handle.clone()
    }

    pub fn config(&self) -> &WorkerConfig {
        &self.cfg
    }

    /// Changes the settings; they apply from the next start or stop (tests point the stop
    /// policy at a fake /proc once the worker's pid is known).
    pub fn config_mut(&mut self) -> &mut WorkerConfig {
        &mut self.cfg
    }

    /// Stops the worker: `shutdown` message, end of stdin, SIGTERM to its pid, the grace, then
    /// SIGKILL only when the stop policy allows it. `None` when none was running.
    pub fn shutdown(&mut self) -> Option<StopOutcome> {
        let live = self.live.take()?;
        self.retire(live, Retire::Planned)
    }

    fn ensure_live(&mut self) -> Result<(), EngineError> {
        if let Some(live) = &self.live {
            if live.child.alive() {
                return Ok(());
            }
            let live = self.live.take().expect("checked above");
            tracing::warn!(
                "worker pid {} is gone ({}); starting a new one",
                live.child.pid(),
                live.child
                    .ending()
                    .map_or_else(|| "ended".into(), |e| e.to_string())
            );
            self.retire(live, Retire::Crashed);
        }
        if let Some(reason) = &self.unavailable {
            return Err(EngineError::Unavailable(reason.clone()));
        }
        if let Some(pid) = self.device_holder() {
            // One context per model on the NPU: a second worker beside this one would fail, or
            // worse, share the device with a process in an unknown state.
            let reason = format!(
                "waiting for worker pid {pid} to exit before respawning: it holds the NPU, did \
                 not end within {} s of SIGTERM and is never SIGKILLed (check it with `ls -l \
                 /proc/{pid}/fd`; end it with `kill -TERM {pid}` once it is idle)",
                self.cfg.stop.grace.as_secs()
            );
            tracing::warn!("{reason}");
            self.handle.set_state(WorkerState::WaitingForExit {
                pid,
                reason: reason.clone(),
            });
            return Err(EngineError::Unavailable(reason));
        }
        self.spawn()
    }

    /// An earlier worker, left running after its grace, that the stop policy protects (it
    /// holds the NPU). Those that ended meanwhile are let go here.
    fn device_holder(&mut self) -> Option<u32> {
        self.left_running.retain(|c| c.alive());
        self.left_running
            .iter()
            .map(|c| c.pid())
            .find(|&pid| self.cfg.stop.never_kill.protects(pid))
    }

    /// Ends a worker by the stop policy and records what happened.
    fn retire(&mut self, mut live: Live, why: Retire) -> Option<StopOutcome> {
        let pid = live.child.pid();
        match why {
            Retire::Planned => {
                live.stopping.store(true, Ordering::SeqCst);
                self.handle.set_state(WorkerState::Stopping { pid });
            }
            Retire::Crashed => self.handle.set_state(WorkerState::Stopping { pid }),
            Retire::Hung(reason) => self.handle.set_state(WorkerState::Hung { pid, reason }),
        }
        if live.child.alive() {
            let _ = live.send(&Request::Shutdown);
        }
        drop(live.stdin.take());
        let outcome = match live.child.stop(&self.cfg.stop) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("stopping worker pid {pid}: {e}");
                return None;
            }
        };
        let state = match &outcome {
            StopOutcome::LeftRunning { holds_npu, .. } => {
                tracing::error!("worker pid {pid}: {outcome}");
                self.handle.lock().left_running.push(pid);
                self.left_running.push(live.child.clone());
                if *holds_npu {
                    WorkerState::WaitingForExit {
                        pid,
                        reason: format!(
                            "waiting for worker pid {pid} to exit before respawning: {outcome}"
                        ),
                    }
                } else {
                    WorkerState::Stopped {
                        pid,
                        how: outcome.to_string(),
                    }
                }
            }
            StopOutcome::Killed(_) => {
                tracing::warn!("worker pid {pid}: {outcome}");
                WorkerState::Stopped {
                    pid,
                    how: outcome.to_string(),
                }
            }
            _ => {
                tracing::info!("worker pid {pid}: {outcome}");
                WorkerState::Stopped {
                    pid,
                    how: outcome.to_string(),
                }
            }
        };
        if let Some(e) = outcome.ending() {
            self.handle.record_ending(pid, e);
        }
        {
            let mut st = self.handle.lock();
            if st.pid == Some(pid) {
                st.pid = None;
            }
        }
        self.handle.settle(pid, state);
        Some(outcome)
    }

    fn spawn(&mut self) -> Result<(), EngineError> {
        let plan = worker_env(&self.cfg.env).map_err(|e| EngineError::Worker(e.to_string()))?;
        tracing::info!("{plan}");
        let exe = self.cfg.env.worker_exe.clone();
        let mut cmd = Command::new(&exe);
        cmd.arg("worker")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        plan.apply(&mut cmd);
        if let Some(lib) = &self.cfg.ep_library {
            cmd.env(crate::npu::env::RYZENAI_EP_PATH_VAR, lib);
        }
        let child = Child::spawn(&mut cmd, "worker").map_err(|e| {
            EngineError::Worker(format!("starting `{} worker`: {e}", exe.display()))
        })?;
        let child = Arc::new(child);
        let pid = child.pid();
        let (stdin, stdout, stderr) =
            child.with_std(|c| (c.stdin.take(), c.stdout.take(), c.stderr.take()));
        let (Some(stdin), Some(stdout), Some(stderr)) = (stdin, stdout, stderr) else {
            return Err(EngineError::Worker("the worker's pipes are missing".into()));
        };
        {
            let mut st = self.handle.lock();
            st.pid = Some(pid);
            st.spawns += 1;
            st.hello = None;
            st.loaded = None;
            st.residency = None;
        }
        self.handle.set_state(WorkerState::Starting { pid });
        forward_stderr(stderr, pid, self.handle.clone());
        let (tx, events) = mpsc::channel();
        read_replies(stdout, pid, tx);
        let stopping = Arc::new(AtomicBool::new(false));
        {
            let handle = self.handle.clone();
            let stopping = stopping.clone();
            let watched = child.spawn_watchdog(WATCHDOG_INTERVAL, move |ending| {
                if stopping.load(Ordering::SeqCst) {
                    tracing::info!(pid, "worker pid {pid} exited: {ending}");
                } else {
                    tracing::warn!(pid, "worker pid {pid} exited: {ending}");
                }
                handle.record_ending(pid, ending);
            });
            if let Err(e) = watched {
                tracing::warn!("worker pid {pid}: no watchdog thread ({e}); reaped on use");
            }
        }
        let mut live = Live {
            child,
            stdin: Some(BufWriter::new(stdin)),
            events,
            stopping,
        };
        tracing::info!("worker pid {pid} started: {} worker", exe.display());
        let load_timeout = self.cfg.timeouts.load;
        let loaded = match self.handshake(&mut live, Instant::now() + load_timeout) {
            Ok(loaded) => loaded,
            Err(Handshake::Refused(e)) => {
                self.retire(live, Retire::Planned);
                return Err(e);
            }
            Err(Handshake::Closed(why)) => {
                let outcome = self.retire(live, Retire::Crashed);
                let ending = outcome
                    .as_ref()
                    .and_then(StopOutcome::ending)
                    .map_or_else(|| "status unknown".into(), |e| e.to_string());
                return Err(EngineError::Worker(format!(
                    "{why} ({ending}){}",
                    self.last_words(pid)
                )));
            }
            Err(Handshake::TimedOut(what)) => {
                let reason = format!(
                    "it {what} within {} s (--load-timeout)",
                    load_timeout.as_secs()
                );
                tracing::error!("worker pid {pid}: {reason}; stopping it");
                let outcome = self.retire(live, Retire::Hung(reason.clone()));
                return Err(EngineError::WorkerHung {
                    pid,
                    detail: format!(
                        "{reason}; {}{}",
                        outcome.map_or_else(|| "status unknown".into(), |o| o.to_string()),
                        self.last_words(pid)
                    ),
                });
            }
        };
        // The worker weighed its own evidence (only it can read its placement and see its
        // device counters across decode steps).
        let residency = loaded.residency.clone();
        match &residency {
            Some(r) if r.is_proven() => tracing::info!("worker pid {pid}: {r}"),
            Some(r) => tracing::warn!("worker pid {pid}: {r}"),
            None => {}
        }
        {
            let mut st = self.handle.lock();
            st.loaded = Some(loaded.clone());
            st.residency = residency.clone();
        }
        if let Some(gate) = self.cfg.gate
            && let Err(e) = gate.check(residency.as_ref())
        {
            // A respawn is proven again or it does not serve: a silent CPU fallback behind an
            // "npu" label is what the gate exists to prevent.
            tracing::error!("worker pid {pid}: {e}; the engine stops serving");
            self.retire(live, Retire::Planned);
            let reason = e.to_string();
            self.unavailable = Some(reason.clone());
            self.handle.set_state(WorkerState::Unavailable { reason });
            return Err(e);
        }
        tracing::info!(
            "worker pid {pid} ready on {}: {} (providers: {})",
            loaded.device,
            loaded.engine,
            loaded.providers.join(", ")
        );
        self.handle.set_state(WorkerState::Ready { pid });
        self.live = Some(live);
        Ok(())
    }

    /// The last lines worker `pid` logged, as a suffix for an error; its stderr gets a moment to
    /// drain, since its last words explain most start-up failures.
    fn last_words(&self, pid: u32) -> String {
        self.handle.wait_log_closed(pid, Duration::from_secs(1));
        let tail = last_lines(&self.handle.log_tail(), 5);
        if tail.is_empty() {
            String::new()
        } else {
            format!("; last worker log lines:\n{tail}")
        }
    }

    /// `hello`, then `load` -> `loaded`, all before `deadline`.
    fn handshake(&self, live: &mut Live, deadline: Instant) -> Result<Loaded, Handshake> {
        let hello = match live.recv_until(deadline) {
            Some(Event::Reply(Reply::Hello(h))) => h,
            Some(Event::Reply(other)) => {
                return Err(Handshake::Refused(EngineError::Worker(format!(
                    "expected hello, got {other:?}"
                ))));
            }
            Some(Event::Closed(why)) => {
                return Err(Handshake::Closed(format!(
                    "the worker ended before saying hello: {why}"
                )));
            }
            None => return Err(Handshake::TimedOut("did not say hello")),
        };
        if hello.protocol != PROTOCOL_VERSION {
            return Err(Handshake::Refused(EngineError::Worker(format!(
                "the worker speaks protocol {} (onebit-tts {}); this process speaks {PROTOCOL_VERSION}",
                hello.protocol, hello.version
            ))));
        }
        let pid = live.child.pid();
        self.handle.lock().hello = Some(hello);
        self.handle.set_state(WorkerState::Loading { pid });
        let load = Request::Load(Box::new(Load {
            package_dir: self.cfg.package_dir.clone(),
            ort_lib: self.cfg.ort_lib.clone(),
            ort: self.cfg.ort.clone(),
            roots: self.cfg.roots.clone(),
            evidence_steps: EVIDENCE_STEPS,
            oga: self.cfg.oga.clone(),
        }));
        if let Err(e) = live.send(&load) {
            return Err(Handshake::Closed(format!(
                "sending load to the worker: {e}"
            )));
        }
        match live.recv_until(deadline) {
            Some(Event::Reply(Reply::Loaded(l))) => Ok(*l),
            Some(Event::Reply(Reply::Error { error, .. })) => Err(Handshake::Refused(error.into())),
            Some(Event::Reply(other)) => Err(Handshake::Refused(EngineError::Worker(format!(
                "expected loaded, got {other:?}"
            )))),
            Some(Event::Closed(why)) => Err(Handshake::Closed(format!(
                "the worker ended while loading the model: {why}"
            ))),
            None => Err(Handshake::TimedOut("did not report the model loaded")),
        }
    }

    /// The worker died or broke its stream during a request: collect it, say how it ended.
    fn crashed(&mut self, why: &str) -> EngineError {
        let Some(live) = self.live.take() else {
            return EngineError::Worker(why.to_owned());
        };
        let pid = live.child.pid();
        let _ = live.child.wait_timeout(CRASH_REAP_WAIT);
        let outcome = self.retire(live, Retire::Crashed);
        let ending = match &outcome {
            Some(o) => o
                .ending()
                .map_or_else(|| format!("stopped: {o}"), |e| e.to_string()),
            None => "status unknown".into(),
        };
        tracing::error!(
            "worker pid {pid} failed during a request ({why}): {ending}; the next request starts a new worker"
        );
        EngineError::WorkerCrashed { pid, ending }
    }

    /// The worker made no progress in time during a request: stop it by the policy.
    fn hung(&mut self, reason: String) -> EngineError {
        let Some(live) = self.live.take() else {
            return EngineError::Worker(reason);
        };
        let pid = live.child.pid();
        tracing::error!("worker pid {pid} hung: {reason}; stopping it");
        let outcome = self.retire(live, Retire::Hung(reason.clone()));
        EngineError::WorkerHung {
            pid,
            detail: format!(
                "{reason}; {}",
                outcome.map_or_else(|| "status unknown".into(), |o| o.to_string())
            ),
        }
    }
}

impl Drop for WorkerEngine {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What a running request ended with, before the engine's state is touched.
enum Ended {
    Done(Generation),
    Failed(EngineError),
    Crashed(String),
    Hung(String),
}

impl Engine for WorkerEngine {
    fn generate(
        &mut self,
        candidates: &Candidates,
        prompt: &[u32],
        params: &GenerationParams,
        cancel: &CancelToken,
        on_code: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Generation, EngineError> {
        // Checked here, typed, rather than by the worker, whose answer would be text.
        params.sampling.validate()?;
        self.ensure_live()?;
        let id = self.next_id;
        self.next_id += 1;
        // A hung worker gets the stop grace to answer a cancel (at least a second).
        let answer_within = self.cfg.stop.grace.max(Duration::from_secs(1));
        let step_timeout = self.cfg.timeouts.step;
        let live = self.live.as_mut().expect("ensure_live started one");
        let request = Request::Generate(Generate {
            id,
            prompt: prompt.to_vec(),
            candidates: candidates.clone(),
            params: params.clone(),
        });
        let ended = if let Err(e) = live.send(&request) {
            Ended::Crashed(format!("sending the request: {e}"))
        } else {
            let mut codes = Vec::new();
            let mut stopped = false;
            let mut cancelled_at: Option<Instant> = None;
            let mut progress_at = Instant::now();
            loop {
                if cancelled_at.is_none() && (stopped || cancel.is_cancelled()) {
                    stopped = true;
                    cancelled_at = Some(Instant::now());
                    if let Err(e) = live.send(&Request::Cancel { id }) {
                        break Ended::Crashed(format!("sending cancel: {e}"));
                    }
                }
                if let Some(t) = cancelled_at
                    && t.elapsed() > answer_within
                {
                    break Ended::Hung(format!(
                        "no answer {:.0} s after a cancel",
                        t.elapsed().as_secs_f64()
                    ));
                }
                if cancelled_at.is_none() && progress_at.elapsed() > step_timeout {
                    break Ended::Hung(format!(
                        "no code and no end of request {id} within {} s (--step-timeout)",
                        step_timeout.as_secs()
                    ));
                }
                let event = match live.events.recv_timeout(CANCEL_POLL) {
                    Ok(ev) => ev,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => {
                        Event::Closed("reply reader gone".into())
                    }
                };
                if matches!(&event, Event::Reply(Reply::Code { id: i, .. } | Reply::Done { id: i, .. })
                    if *i == id)
                {
                    progress_at = Instant::now();
                }
                match event {
                    Event::Reply(Reply::Code { id: i, code }) if i == id => {
                        // After a stop, codes already on their way are dropped, as the local
                        // loop would never have made them.
                        if !stopped && !cancel.is_cancelled() {
                            codes.push(code);
                            if on_code(code).is_break() {
                                stopped = true;
                            }
                        }
                    }
                    Event::Reply(Reply::Done { id: i, summary }) if i == id => {
                        let stop = if stopped {
                            StopReason::Cancelled
                        } else {
                            summary.stop
                        };
                        if stop != StopReason::Cancelled && summary.codes != codes.len() {
                            break Ended::Failed(EngineError::Worker(format!(
                                "the worker reported {} codes but sent {}",
                                summary.codes,
                                codes.len()
                            )));
                        }
                        break Ended::Done(summary.into_generation(codes, stop));
                    }
                    Event::Reply(Reply::Error { id: Some(i), error }) if i == id => {
                        break Ended::Failed(error.into());
                    }
                    Event::Reply(other) => {
                        tracing::debug!("worker: ignoring {other:?} during request {id}");
                    }
                    Event::Closed(why) => break Ended::Crashed(why),
                }
            }
        };
        match ended {
            Ended::Done(g) => Ok(g),
            Ended::Failed(e) => Err(e),
            Ended::Crashed(why) => Err(self.crashed(&why)),
            Ended::Hung(reason) => Err(self.hung(reason)),
        }
    }

    fn describe(&self) -> String {
        self.handle
            .describe()
            .unwrap_or_else(|| format!("worker on {} (not loaded)", self.cfg.ort.device))
    }

    fn device(&self) -> Device {
        self.cfg.ort.device
    }

    fn worker(&self) -> Option<WorkerHandle> {
        Some(self.handle.clone())
    }

    fn budget(&self) -> Option<usize> {
        self.handle.loaded().and_then(|l| l.budget)
    }
}

/// Forwards the worker's stderr lines into this process's log at their own level.
fn forward_stderr(stderr: ChildStderr, pid: u32, handle: WorkerHandle) {
    let spawned = std::thread::Builder::new()
        .name(format!("worker-{pid}-log"))
        .spawn(move || {
            let mut r = BufReader::new(stderr);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => {
                        handle.log_closed(pid);
                        return;
                    }
                    Ok(_) => {}
                }
                let line = String::from_utf8_lossy(&buf);
                let line = line.trim_end();
                if line.is_empty() {
                    continue;
                }
                handle.push_log(line);
                let (level, msg) = split_level(line);
                match level {
                    "ERROR" => tracing::error!("worker[{pid}] {msg}"),
                    "WARN" => tracing::warn!("worker[{pid}] {msg}"),
                    "DEBUG" => tracing::debug!("worker[{pid}] {msg}"),
                    "TRACE" => tracing::trace!("worker[{pid}] {msg}"),
                    _ => tracing::info!("worker[{pid}] {msg}"),
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("worker pid {pid}: cannot forward its log ({e})");
    }
}

/// `"  WARN message"` -> `("WARN", "message")`; lines without a level (a library printing)
/// count as INFO.
fn split_level(line: &str) -> (&str, &str) {
    let t = line.trim_start();
    for level in ["ERROR", "WARN", "INFO", "DEBUG", "TRACE"] {
        if let Some(rest) = t.strip_prefix(level)
            && (rest.is_empty() || rest.starts_with(' '))
        {
            return (level, rest.trim_start());
        }
    }
    ("INFO", line)
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..]
        .iter()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Decodes the worker's replies into `tx` until the stream ends.
fn read_replies(stdout: ChildStdout, pid: u32, tx: mpsc::Sender<Event>) {
    let spawned = std::thread::Builder::new()
        .name(format!("worker-{pid}-replies"))
        .spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let ev = match read_frame::<_, Reply>(&mut r) {
                    Ok(Some(m)) => Event::Reply(m),
                    Ok(None) => Event::Closed("the worker closed its reply stream".into()),
                    Err(e) => Event::Closed(format!("reading the worker's replies: {e}")),
                };
                let closed = matches!(ev, Event::Closed(_));
                if tx.send(ev).is_err() || closed {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::error!("worker pid {pid}: cannot read its replies ({e})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_are_read_from_the_workers_lines() {
        assert_eq!(split_level("  WARN worker: x"), ("WARN", "worker: x"));
        assert_eq!(split_level("ERROR boom"), ("ERROR", "boom"));
        assert_eq!(
            split_level("INFORMATIVE banner"),
            ("INFO", "INFORMATIVE banner")
        );
        assert_eq!(split_level("[vaip] hello"), ("INFO", "[vaip] hello"));
    }

    #[test]
    fn the_log_tail_is_bounded() {
        let h = WorkerHandle::default();
        for i in 0..2000 {
            h.push_log(&format!("line {i} ééé"));
        }
        let t = h.log_tail();
        assert!(t.len() <= LOG_TAIL_BYTES);
        assert!(t.ends_with("line 1999 ééé\n"));
        assert_eq!(last_lines(&t, 1), "  line 1999 ééé");
    }
}
