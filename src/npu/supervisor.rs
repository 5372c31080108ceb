//! The worker child's supervisor: one reap, SIGTERM to the child only, a grace, and what happens
//! after it decided by a [`StopPolicy`] the worker's config carries (reference: "Child
//! lifecycle"). It supervises any worker — the NPU's, a CPU `--isolate` one, the doctor's
//! `xrt-smi` — and knows about the NPU only through [`NeverKill::AccelHolders`].
//!
//! - Every waitpid goes through one [`Child::reap`], which records how the child ended once.
//!   [`Child::alive`], [`Child::stop`] and the watchdog ([`Child::spawn_watchdog`]) share it, so a
//!   child that already exited makes `stop()` a no-op: waiting out the grace for a child that is
//!   gone and then SIGKILLing its pid would signal whatever process was given that pid since.
//! - Signals go to the child's pid only, never to a process group (the group may hold the
//!   server too), and only while the child is unreaped: the state lock is held across the check
//!   and the `kill(2)`, so the pid cannot have been recycled in between.
//! - The grace comes from ONEBIT_BACKEND_STOP_GRACE_S ([`StopGrace`]); while it runs, the wait
//!   is logged at its start and every [`StopPolicy::report_every`], so a parent that exits
//!   behind a slow worker says what it waits for instead of hanging silently.
//! - A process holding `/dev/accel/accel0` is never SIGKILLed ([`NeverKill`]): the amdxdna close
//!   path after a SIGKILL left "aie2_hwctx_restart: Map host buf failed" / "amdxdna_drm_close:
//!   Resume failed" in the kernel log and once panicked the box. It is reported loudly and left
//!   running.
//! - A stopped (SIGSTOP) or otherwise hung child is not sent SIGCONT: it is treated as hung.

use std::ffi::OsStr;
use std::fmt;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::accel::holds_accel;
use super::roots::SystemRoots;

/// Seconds a worker gets between SIGTERM and escalation.
pub const STOP_GRACE_VAR: &str = "ONEBIT_BACKEND_STOP_GRACE_S";
pub const DEFAULT_STOP_GRACE_S: u64 = 30;
pub const MAX_STOP_GRACE_S: u64 = 86_400;

/// How often a waiter re-checks the child. `reap()` is a non-blocking waitpid, so a short poll
/// costs nothing; a reap by another thread wakes waiters at once through the condition variable.
const POLL: Duration = Duration::from_millis(10);
/// How long to wait for the kernel to deliver a SIGKILL before reporting the child unreaped
/// (a process in uninterruptible sleep inside a driver may not die at once).
const KILL_REAP_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a stop in its grace says what it is waiting for (besides once at its start).
pub const DEFAULT_REPORT_EVERY: Duration = Duration::from_secs(10);

/// A signal could not be sent to the child.
#[derive(Debug, thiserror::Error)]
#[error("signal {signal} to pid {pid}: {source}")]
pub struct SignalError {
    pub pid: u32,
    pub signal: i32,
    #[source]
    pub source: io::Error,
}

/// Which children are never SIGKILLed, whatever [`StopPolicy::allow_kill`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NeverKill {
    /// No child is protected (`allow_kill` decides alone).
    Nobody,
    /// Every child of this policy: an NPU worker may be opening the device at any moment, so it
    /// counts as a holder from its start.
    Anyone,
    /// A child whose fd table (under these roots) shows the NPU's accel node open.
    AccelHolders(SystemRoots),
}

impl NeverKill {
    /// Whether `pid` is protected now. An fd table that cannot be read counts as not holding:
    /// the child is ours, so that only happens once it is gone.
    pub fn protects(&self, pid: u32) -> bool {
        match self {
            NeverKill::Nobody => false,
            NeverKill::Anyone => true,
            NeverKill::AccelHolders(roots) => holds_accel(pid, roots).unwrap_or_else(|e| {
                tracing::debug!("pid {pid}: cannot read its fd table ({e}); not a holder");
                false
            }),
        }
    }
}

/// What [`Child::stop`] does: SIGTERM, `grace`, then SIGKILL only when `allow_kill` and the
/// child is not protected by `never_kill`; otherwise it is reported and left running.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopPolicy {
    /// Between SIGTERM and the verdict (ONEBIT_BACKEND_STOP_GRACE_S).
    pub grace: Duration,
    /// SIGKILL a child that outlives the grace (`--allow-kill`).
    pub allow_kill: bool,
    pub never_kill: NeverKill,
    /// How often the wait through the grace is logged (after a line at its start).
    pub report_every: Duration,
}

impl StopPolicy {
    /// The grace from ONEBIT_BACKEND_STOP_GRACE_S, no SIGKILL, nobody protected.
    pub fn from_env() -> Self {
        StopPolicy {
            grace: StopGrace::from_env().grace,
            ..StopPolicy::default()
        }
    }
}

impl Default for StopPolicy {
    fn default() -> Self {
        StopPolicy {
            grace: Duration::from_secs(DEFAULT_STOP_GRACE_S),
            allow_kill: false,
            never_kill: NeverKill::Nobody,
            report_every: DEFAULT_REPORT_EVERY,
        }
    }
}

/// The stop grace and, when the variable was bad, the warning to show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopGrace {
    pub grace: Duration,
    pub warning: Option<String>,
}

impl Default for StopGrace {
    fn default() -> Self {
        StopGrace {
            grace: Duration::from_secs(DEFAULT_STOP_GRACE_S),
            warning: None,
        }
    }
}

impl StopGrace {
    /// Reads ONEBIT_BACKEND_STOP_GRACE_S and logs the warning, if any, once here.
    pub fn from_env() -> Self {
        let g = StopGrace::parse(std::env::var_os(STOP_GRACE_VAR).as_deref());
        if let Some(w) = &g.warning {
            tracing::warn!("{w}");
        }
        g
    }

    /// Whole seconds in 0..=86400. Unset or empty: the default, silently. Anything else
    /// (negative, fractional, a unit suffix, out of range, not UTF-8): the default plus a
    /// warning, because a typo must not turn into "kill at once" or "wait forever".
    pub fn parse(value: Option<&OsStr>) -> Self {
        let Some(raw) = value else {
            return StopGrace::default();
        };
        let bad = |shown: &str| StopGrace {
            grace: Duration::from_secs(DEFAULT_STOP_GRACE_S),
            warning: Some(format!(
                "{STOP_GRACE_VAR}={shown} is not a whole number of seconds in \
                 0..={MAX_STOP_GRACE_S}; using the default ({DEFAULT_STOP_GRACE_S} s)"
            )),
        };
        let Some(s) = raw.to_str() else {
            return bad(&format!("{raw:?}"));
        };
        let t = s.trim();
        if t.is_empty() {
            return StopGrace::default();
        }
        // u64::from_str accepts a leading '+'; whole seconds here means digits only.
        if !t.bytes().all(|b| b.is_ascii_digit()) {
            return bad(&format!("{s:?}"));
        }
        match t.parse::<u64>() {
            Ok(n) if n <= MAX_STOP_GRACE_S => StopGrace {
                grace: Duration::from_secs(n),
                warning: None,
            },
            _ => bad(&format!("{s:?}")),
        }
    }
}

/// How a child ended, as the log says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Ending {
    Exit(i32),
    Signal(i32),
    /// Reaped by someone else (waitpid said ECHILD), so the status is gone.
    Unknown,
}

impl From<ExitStatus> for Ending {
    fn from(s: ExitStatus) -> Self {
        match (s.code(), s.signal()) {
            (Some(c), _) => Ending::Exit(c),
            (None, Some(sig)) => Ending::Signal(sig),
            // waitpid without WUNTRACED/WCONTINUED only reports terminations.
            (None, None) => Ending::Unknown,
        }
    }
}

impl fmt::Display for Ending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ending::Exit(c) => write!(f, "exit {c}"),
            Ending::Signal(s) => write!(f, "signal {s}"),
            Ending::Unknown => f.write_str("ended (status reaped elsewhere)"),
        }
    }
}

/// What [`Child::stop`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopOutcome {
    /// The child had already ended; nothing was sent.
    AlreadyEnded(Ending),
    /// It ended within the grace after SIGTERM.
    Ended { ending: Ending, after: Duration },
    /// SIGKILL was sent after the grace; `None` when it was not reaped within a few seconds.
    Killed(Option<Ending>),
    /// Still running after the grace and not killed: it holds the NPU, or killing was not
    /// allowed.
    LeftRunning { pid: u32, holds_npu: bool },
}

impl StopOutcome {
    pub fn ending(&self) -> Option<Ending> {
        match self {
            StopOutcome::AlreadyEnded(e) | StopOutcome::Ended { ending: e, .. } => Some(*e),
            StopOutcome::Killed(e) => *e,
            StopOutcome::LeftRunning { .. } => None,
        }
    }
}

impl fmt::Display for StopOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StopOutcome::AlreadyEnded(e) => write!(f, "already ended ({e})"),
            StopOutcome::Ended { ending, after } => {
                write!(
                    f,
                    "ended after SIGTERM ({ending}) in {:.1} s",
                    after.as_secs_f64()
                )
            }
            StopOutcome::Killed(Some(e)) => write!(f, "SIGKILLed after the grace ({e})"),
            StopOutcome::Killed(None) => f.write_str("SIGKILL sent, not reaped yet"),
            StopOutcome::LeftRunning {
                pid,
                holds_npu: true,
            } => write!(
                f,
                "left running: pid {pid} holds the NPU and is never SIGKILLed"
            ),
            StopOutcome::LeftRunning {
                pid,
                holds_npu: false,
            } => write!(f, "left running: pid {pid} (SIGKILL not allowed)"),
        }
    }
}

struct State {
    child: std::process::Child,
    ending: Option<Ending>,
}

/// A child process with one reap for everyone. Methods take `&self` so one `Arc<Child>` can be
/// shared by the engine (alive/stop) and the watchdog.
pub struct Child {
    pid: u32,
    name: String,
    state: Mutex<State>,
    ended: Condvar,
}

impl fmt::Debug for Child {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Child")
            .field("pid", &self.pid)
            .field("name", &self.name)
            .field("ending", &self.ending())
            .finish()
    }
}

impl Child {
    /// Wraps a spawned child; `name` is what logs call it ("worker").
    pub fn new(child: std::process::Child, name: impl Into<String>) -> Self {
        Child {
            pid: child.id(),
            name: name.into(),
            state: Mutex::new(State {
                child,
                ending: None,
            }),
            ended: Condvar::new(),
        }
    }

    pub fn spawn(cmd: &mut Command, name: impl Into<String>) -> io::Result<Self> {
        Ok(Child::new(cmd.spawn()?, name))
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is two fields updated together; a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives access to the std child, e.g. to take its stdin/stdout for the framed protocol.
    /// Do not wait on it here: waiting belongs to [`Child::reap`].
    pub fn with_std<R>(&self, f: impl FnOnce(&mut std::process::Child) -> R) -> R {
        f(&mut self.lock().child)
    }

    /// How the child ended, if a reap has seen it end (no waitpid).
    pub fn ending(&self) -> Option<Ending> {
        self.lock().ending
    }

    /// The one waitpid (non-blocking): records the ending the first time it is seen, logs it, and
    /// wakes every waiter.
    pub fn reap(&self) -> Option<Ending> {
        let mut st = self.lock();
        self.reap_locked(&mut st)
    }

    fn reap_locked(&self, st: &mut State) -> Option<Ending> {
        if let Some(e) = st.ending {
            return Some(e);
        }
        let ending = match st.child.try_wait() {
            Ok(Some(status)) => Ending::from(status),
            Ok(None) => return None,
            Err(err) => {
                // ECHILD: reaped behind our back (SIGCHLD ignored, or a stray waitpid(-1)). The
                // pid is free for reuse now, so it must count as ended.
                tracing::warn!(
                    pid = self.pid,
                    "{} pid {}: waitpid: {err}",
                    self.name,
                    self.pid
                );
                Ending::Unknown
            }
        };
        st.ending = Some(ending);
        tracing::info!(
            pid = self.pid,
            "{} pid {} ended: {ending}",
            self.name,
            self.pid
        );
        self.ended.notify_all();
        Some(ending)
    }

    pub fn alive(&self) -> bool {
        self.reap().is_none()
    }

    /// Waits up to `timeout` for the child to end; returns its ending or None if still running.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Ending> {
        self.wait_polling(timeout, POLL)
    }

    fn wait_polling(&self, timeout: Duration, poll: Duration) -> Option<Ending> {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if let Some(e) = self.reap_locked(&mut st) {
                return Some(e);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            st = self
                .ended
                .wait_timeout(st, left.min(poll))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Sends `signal` to the child's pid (not its group) unless it has been reaped. Returns
    /// whether it was sent.
    pub fn signal(&self, signal: i32) -> Result<bool, SignalError> {
        let mut st = self.lock();
        self.signal_locked(&mut st, signal)
    }

    fn signal_locked(&self, st: &mut State, signal: i32) -> Result<bool, SignalError> {
        if self.reap_locked(st).is_some() {
            return Ok(false);
        }
        let pid = libc::pid_t::try_from(self.pid).map_err(|_| SignalError {
            pid: self.pid,
            signal,
            source: io::Error::from(io::ErrorKind::InvalidInput),
        })?;
        // SAFETY: kill(2) has no memory effects; the pid is our unreaped child (a zombie at
        // worst), so it cannot name another process.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(SignalError {
                pid: self.pid,
                signal,
                source: io::Error::last_os_error(),
            });
        }
        Ok(true)
    }

    /// Stops the child by `policy`: a no-op if it already ended; else SIGTERM to the child only,
    /// up to `policy.grace` for it to end (said in the log at the start and every
    /// `report_every`), then SIGKILL if allowed and the child is not protected, else it is left
    /// running.
    pub fn stop(&self, policy: &StopPolicy) -> Result<StopOutcome, SignalError> {
        let (name, pid) = (&self.name, self.pid);
        {
            let mut st = self.lock();
            if let Some(e) = self.reap_locked(&mut st) {
                tracing::info!(pid, "{name} pid {pid} already ended ({e}); nothing to stop");
                return Ok(StopOutcome::AlreadyEnded(e));
            }
            self.signal_locked(&mut st, libc::SIGTERM)?;
        }
        let start = Instant::now();
        // Asked before the grace: a holder may close the device while it shuts down, and must
        // still not be killed for having been slow about it.
        let holds = policy.never_kill.protects(pid);
        let holder = if holds { " (holds the NPU)" } else { "" };
        tracing::info!(pid, "{name} pid {pid}{holder}: SIGTERM sent");
        let deadline = start + policy.grace;
        let every = policy.report_every.max(POLL);
        let mut first = true;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
            if first {
                tracing::info!(
                    pid,
                    "waiting for {name} pid {pid}{holder} to exit: {secs} s of grace left"
                );
            } else {
                tracing::warn!(
                    pid,
                    "still waiting for {name} pid {pid}{holder} to exit: {secs} s of grace left"
                );
            }
            first = false;
            if let Some(ending) = self.wait_timeout(left.min(every)) {
                return Ok(StopOutcome::Ended {
                    ending,
                    after: start.elapsed(),
                });
            }
        }
        let grace = policy.grace.as_secs();
        if holds || policy.never_kill.protects(pid) {
            tracing::error!(
                pid,
                "{name} pid {pid} did not end within {grace} s of SIGTERM and holds /dev/accel/accel0: \
                 NOT sending SIGKILL (the amdxdna close path after SIGKILL has left driver errors \
                 and once panicked the machine); leaving it running — check it with \
                 `ls -l /proc/{pid}/fd`, end it with `kill -TERM {pid}` once it is idle"
            );
            return Ok(StopOutcome::LeftRunning {
                pid,
                holds_npu: true,
            });
        }
        if !policy.allow_kill {
            tracing::warn!(
                pid,
                "{name} pid {pid} did not end within {grace} s of SIGTERM; leaving it running"
            );
            return Ok(StopOutcome::LeftRunning {
                pid,
                holds_npu: false,
            });
        }
        {
            let mut st = self.lock();
            if let Some(ending) = self.reap_locked(&mut st) {
                return Ok(StopOutcome::Ended {
                    ending,
                    after: start.elapsed(),
                });
            }
            self.signal_locked(&mut st, libc::SIGKILL)?;
        }
        tracing::warn!(
            pid,
            "{name} pid {pid} did not end within {grace} s of SIGTERM: SIGKILL sent"
        );
        Ok(StopOutcome::Killed(self.wait_timeout(KILL_REAP_TIMEOUT)))
    }

    /// Starts a thread that reaps the child every `interval` (and at once when another thread
    /// reaps it), then calls `on_exit` once with the ending. The thread holds only a weak
    /// reference between rounds, so dropping every `Arc<Child>` ends it without a call.
    pub fn spawn_watchdog<F>(
        self: &Arc<Self>,
        interval: Duration,
        on_exit: F,
    ) -> io::Result<JoinHandle<()>>
    where
        F: FnOnce(Ending) + Send + 'static,
    {
        let weak = Arc::downgrade(self);
        thread::Builder::new()
            .name(format!("{}-watchdog", self.name))
            .spawn(move || {
                loop {
                    let Some(child) = weak.upgrade() else {
                        return;
                    };
                    // One round: reap, then sleep on the condition variable for `interval`.
                    let ending = child.wait_polling(interval, interval);
                    drop(child);
                    if let Some(e) = ending {
                        on_exit(e);
                        return;
                    }
                }
            })
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // No policy here (the caller decides about stop/kill); just collect a zombie if there is
        // one and say so when a live child is let go.
        if self.reap().is_none() {
            tracing::warn!(
                pid = self.pid,
                "{} pid {} dropped while running; left as is",
                self.name,
                self.pid
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grace_parsing() {
        let p = |s: &str| StopGrace::parse(Some(OsStr::new(s)));
        assert_eq!(StopGrace::parse(None), StopGrace::default());
        assert_eq!(p("").grace, Duration::from_secs(30));
        assert!(p("").warning.is_none());
        assert_eq!(p("0").grace, Duration::ZERO);
        assert_eq!(p(" 12 ").grace, Duration::from_secs(12));
        assert_eq!(p("86400").grace, Duration::from_secs(86_400));
        assert!(p("12").warning.is_none());
        for bad in [
            "86401",
            "-1",
            "+5",
            "1.5",
            "30s",
            "abc",
            "99999999999999999999999",
        ] {
            let g = p(bad);
            assert_eq!(g.grace, Duration::from_secs(30), "{bad}");
            let w = g.warning.expect("warning");
            assert!(w.starts_with("ONEBIT_BACKEND_STOP_GRACE_S="), "{w}");
            assert!(w.contains("using the default (30 s)"), "{w}");
        }
    }

    #[test]
    fn endings_read_like_the_log() {
        assert_eq!(Ending::Exit(3).to_string(), "exit 3");
        assert_eq!(Ending::Signal(9).to_string(), "signal 9");
        assert_eq!(Ending::from(ExitStatus::from_raw(3 << 8)), Ending::Exit(3));
        assert_eq!(Ending::from(ExitStatus::from_raw(15)), Ending::Signal(15));
    }

    #[test]
    fn outcome_display() {
        let o = StopOutcome::LeftRunning {
            pid: 7,
            holds_npu: true,
        };
        assert!(o.to_string().contains("never SIGKILLed"));
        assert_eq!(o.ending(), None);
        assert_eq!(
            StopOutcome::AlreadyEnded(Ending::Exit(3)).to_string(),
            "already ended (exit 3)"
        );
    }

    /// Collects what the code under test logs on this thread.
    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stop_in_its_grace_says_what_it_waits_for_at_the_start_and_then_periodically() {
        let child = Child::spawn(Command::new("sleep").arg("1000"), "worker").expect("spawn");
        // Stopped, so SIGTERM stays pending and the whole grace runs.
        assert!(child.signal(libc::SIGSTOP).expect("SIGSTOP"));
        let pid = child.pid();
        // The kernel has no notification for "stopped"; poll /proc, bounded.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('T'))
        }) {
            assert!(Instant::now() < deadline, "pid {pid} never stopped");
            thread::sleep(Duration::from_millis(2));
        }
        let log = Capture::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        let policy = StopPolicy {
            grace: Duration::from_millis(900),
            allow_kill: true,
            never_kill: NeverKill::Anyone,
            report_every: Duration::from_millis(200),
        };
        let outcome =
            tracing::subscriber::with_default(subscriber, || child.stop(&policy)).expect("stop");
        assert_eq!(
            outcome,
            StopOutcome::LeftRunning {
                pid,
                holds_npu: true
            }
        );
        let text = String::from_utf8_lossy(&log.0.lock().expect("log")).into_owned();
        assert!(
            text.contains(&format!(
                "waiting for worker pid {pid} (holds the NPU) to exit: 1 s of grace left"
            )),
            "{text}"
        );
        let periodic = text.matches("still waiting for worker pid").count();
        assert!((3..=5).contains(&periodic), "{periodic} reports:\n{text}");
        assert!(text.contains("NOT sending SIGKILL"), "{text}");
        assert!(child.signal(libc::SIGKILL).expect("SIGKILL"));
        assert_eq!(
            child.wait_timeout(Duration::from_secs(10)),
            Some(Ending::Signal(libc::SIGKILL))
        );
    }
}
