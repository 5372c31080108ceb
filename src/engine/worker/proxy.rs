//! The parent's side of the engine worker: [`WorkerEngine`].

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
    CancelToken, Candidates, Device, Engine, EngineError, Generation, GenerationParams, OrtOptions,
    StopReason,
};
use crate::npu::SystemRoots;
use crate::npu::env::{EnvInputs, worker_env};
use crate::npu::lifecycle::{Child, Ending, StopGrace, StopOutcome, holds_accel};
use crate::npu::residency::Residency;

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
    /// Between SIGTERM and giving up (ONEBIT_BACKEND_STOP_GRACE_S).
    pub grace: Duration,
    /// SIGKILL a worker that outlives the grace; never applied to one holding the NPU.
    pub allow_kill: bool,
    /// Where /sys, /dev and /proc are (residency proof, NPU-holder check); tests fake them.
    pub roots: SystemRoots,
    /// Wait before the one retry of a failed non-streamed request; `None`: no retry. The NPU
    /// route uses [`NPU_RETRY_DELAY`].
    pub retry_delay: Option<Duration>,
    /// RYZENAI_EP_PATH for the worker, over what the environment rules set (`--ep-library`).
    pub ep_library: Option<PathBuf>,
}

impl WorkerConfig {
    /// The production settings: this executable as the worker, the environment rules over this
    /// process's knobs (applied only for `--device npu` on a package that declares RyzenAI),
    /// ONEBIT_BACKEND_STOP_GRACE_S, the real system roots, the 1 s retry on the NPU.
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
        Ok(WorkerConfig {
            package_dir,
            ort_lib,
            env: EnvInputs::from_process(provider_declared && npu, exe),
            grace: StopGrace::from_env().grace,
            allow_kill: false,
            roots: SystemRoots::default(),
            retry_delay: npu.then_some(NPU_RETRY_DELAY),
            ep_library: None,
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

#[derive(Default)]
struct State {
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
    fn lock(&self) -> MutexGuard<'_, State> {
        self.0.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The running worker's pid.
    pub fn pid(&self) -> Option<u32> {
        self.lock().pid
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
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some((_, e)) = st.endings.iter().find(|(p, _)| *p == pid) {
                return Some(*e);
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
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.log_closed.contains(&pid) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .0
                .changed
                .wait_timeout(st, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
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

    /// The next event; the channel closing counts as the stream ending.
    fn recv(&self) -> Event {
        self.events
            .recv()
            .unwrap_or_else(|_| Event::Closed("reply reader gone".into()))
    }
}

/// An [`Engine`] whose backbone runs in a worker child. The child is started by
/// [`WorkerEngine::start`] (or the first request), restarted by the next request after it dies,
/// and stopped by [`WorkerEngine::shutdown`] or drop.
pub struct WorkerEngine {
    cfg: WorkerConfig,
    handle: WorkerHandle,
    live: Option<Live>,
    next_id: u64,
    /// Workers that outlived the grace; kept so their exit can still be reaped.
    left_running: Vec<Arc<Child>>,
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

    /// Changes the settings; they apply from the next start or stop (tests point `roots` at a
    /// fake tree once the worker's pid is known).
    pub fn config_mut(&mut self) -> &mut WorkerConfig {
        &mut self.cfg
    }

    /// Stops the worker: `shutdown` message, end of stdin, SIGTERM to its pid, the grace, then
    /// SIGKILL only when allowed and it does not hold the NPU. `None` when none was running.
    pub fn shutdown(&mut self) -> Option<StopOutcome> {
        let live = self.live.take()?;
        self.retire(live, true)
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
            self.retire(live, false);
        }
        self.spawn()
    }

    fn holds_npu(&self, pid: u32) -> bool {
        self.cfg.ort.device == Device::Npu || holds_accel(pid, &self.cfg.roots).unwrap_or(false)
    }

    /// Ends a worker by the stop policy and records what happened.
    fn retire(&mut self, mut live: Live, expected: bool) -> Option<StopOutcome> {
        if expected {
            live.stopping.store(true, Ordering::SeqCst);
        }
        let pid = live.child.pid();
        if live.child.alive() {
            let _ = live.send(&Request::Shutdown);
        }
        drop(live.stdin.take());
        let holds = self.holds_npu(pid);
        let outcome = match live.child.stop(self.cfg.grace, holds, self.cfg.allow_kill) {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("stopping worker pid {pid}: {e}");
                return None;
            }
        };
        match &outcome {
            StopOutcome::LeftRunning { .. } => {
                tracing::error!("worker pid {pid}: {outcome}");
                self.handle.lock().left_running.push(pid);
                self.left_running.push(live.child.clone());
            }
            StopOutcome::Killed(_) => tracing::warn!("worker pid {pid}: {outcome}"),
            _ => tracing::info!("worker pid {pid}: {outcome}"),
        }
        if let Some(e) = outcome.ending() {
            self.handle.record_ending(pid, e);
        }
        let mut st = self.handle.lock();
        if st.pid == Some(pid) {
            st.pid = None;
        }
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
        match self.handshake(&mut live) {
            Ok(loaded) => {
                // The worker weighed its own evidence (only it can read its placement and see
                // its device counters across decode steps).
                let residency = loaded.residency.clone();
                match &residency {
                    Some(r) if r.is_proven() => tracing::info!("worker pid {pid}: {r}"),
                    Some(r) => tracing::warn!("worker pid {pid}: {r}"),
                    None => {}
                }
                tracing::info!(
                    "worker pid {pid} ready on {}: {} (providers: {})",
                    loaded.device,
                    loaded.engine,
                    loaded.providers.join(", ")
                );
                let mut st = self.handle.lock();
                st.loaded = Some(loaded);
                st.residency = residency;
                drop(st);
                self.live = Some(live);
                Ok(())
            }
            Err((e, closed)) => {
                let outcome = self.retire(live, !closed);
                // Its last words explain most start-up failures; they may still be in the pipe.
                if closed {
                    self.handle.wait_log_closed(pid, Duration::from_secs(1));
                }
                let e = match (closed, outcome.and_then(|o| o.ending())) {
                    (true, Some(ending)) => EngineError::Worker(format!(
                        "{e} ({ending}); last worker log lines:\n{}",
                        last_lines(&self.handle.log_tail(), 5)
                    )),
                    _ => e,
                };
                Err(e)
            }
        }
    }

    /// `hello`, then `load` -> `loaded`. The error says whether the stream ended.
    fn handshake(&self, live: &mut Live) -> Result<Loaded, (EngineError, bool)> {
        let hello = match live.recv() {
            Event::Reply(Reply::Hello(h)) => h,
            Event::Reply(other) => {
                return Err((
                    EngineError::Worker(format!("expected hello, got {other:?}")),
                    false,
                ));
            }
            Event::Closed(why) => {
                return Err((
                    EngineError::Worker(format!("the worker ended before saying hello: {why}")),
                    true,
                ));
            }
        };
        if hello.protocol != PROTOCOL_VERSION {
            return Err((
                EngineError::Worker(format!(
                    "the worker speaks protocol {} (onebit-tts {}); this process speaks {PROTOCOL_VERSION}",
                    hello.protocol, hello.version
                )),
                false,
            ));
        }
        self.handle.lock().hello = Some(hello);
        let load = Request::Load(Load {
            package_dir: self.cfg.package_dir.clone(),
            ort_lib: self.cfg.ort_lib.clone(),
            ort: self.cfg.ort.clone(),
            roots: self.cfg.roots.clone(),
            evidence_steps: EVIDENCE_STEPS,
        });
        if let Err(e) = live.send(&load) {
            return Err((
                EngineError::Worker(format!("sending load to the worker: {e}")),
                true,
            ));
        }
        match live.recv() {
            Event::Reply(Reply::Loaded(l)) => Ok(*l),
            Event::Reply(Reply::Error { error, .. }) => Err((error.into(), false)),
            Event::Reply(other) => Err((
                EngineError::Worker(format!("expected loaded, got {other:?}")),
                false,
            )),
            Event::Closed(why) => Err((
                EngineError::Worker(format!("the worker ended while loading the model: {why}")),
                true,
            )),
        }
    }

    /// The worker died or broke its stream during a request: collect it, say how it ended.
    fn crashed(&mut self, why: &str) -> EngineError {
        let Some(live) = self.live.take() else {
            return EngineError::Worker(why.to_owned());
        };
        let pid = live.child.pid();
        let _ = live.child.wait_timeout(CRASH_REAP_WAIT);
        let outcome = self.retire(live, false);
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

    fn hung(&mut self, since_cancel: Duration) -> EngineError {
        let Some(live) = self.live.take() else {
            return EngineError::Worker("hung".into());
        };
        let pid = live.child.pid();
        tracing::error!(
            "worker pid {pid} did not finish within {:.0} s of a cancel; stopping it",
            since_cancel.as_secs_f64()
        );
        let outcome = self.retire(live, false);
        EngineError::WorkerCrashed {
            pid,
            ending: format!(
                "no answer {:.0} s after a cancel; {}",
                since_cancel.as_secs_f64(),
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
    Hung(Duration),
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
        self.ensure_live()?;
        let id = self.next_id;
        self.next_id += 1;
        // A hung worker gets the stop grace to answer a cancel (at least a second).
        let answer_within = self.cfg.grace.max(Duration::from_secs(1));
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
                    break Ended::Hung(t.elapsed());
                }
                let event = match live.events.recv_timeout(CANCEL_POLL) {
                    Ok(ev) => ev,
                    Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => {
                        Event::Closed("reply reader gone".into())
                    }
                };
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
            Ended::Hung(after) => Err(self.hung(after)),
        }
    }

    fn describe(&self) -> String {
        let st = self.handle.lock();
        match (&st.loaded, st.pid) {
            (Some(l), Some(pid)) => format!("worker pid {pid}: {}", l.engine),
            (Some(l), None) => format!("worker (not running; last: {})", l.engine),
            (None, _) => format!("worker on {} (not loaded)", self.cfg.ort.device),
        }
    }

    fn device(&self) -> Device {
        self.cfg.ort.device
    }

    fn retry_delay(&self, err: &EngineError) -> Option<Duration> {
        let curable = matches!(
            err,
            EngineError::WorkerCrashed { .. }
                | EngineError::Runtime(_)
                | EngineError::Device(_)
                | EngineError::Worker(_)
        );
        self.cfg.retry_delay.filter(|_| curable)
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
