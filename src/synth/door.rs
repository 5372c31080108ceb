//! The front door: every transport (HTTP, Wyoming, the WebSocket route, `say`, `bench`) hands
//! its requests to one [`Door`] over the process's [`Synthesizer`]. The door checks the limits
//! (one definition, one check), bounds the requests admitted (running plus waiting, whatever
//! transport they came by), lines them up fairly for the scheduler's places, ends them at their
//! deadline, and cancels them all at shutdown. Each admitted request runs on a thread of its own
//! and reports through an [`Events`] stream, in the shape of text-generation-inference's `Infer`.
//!
//! Why a request ended is decided here once ([`Cause`]), so every transport counts and answers
//! it the same way.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::timing::PieceTiming;
use super::{SpeechRequest, SynthError, SynthEvent, SynthesisReport, Synthesizer};
use crate::engine::{CancelToken, StopReason};

/// Longest input text, in characters, when nothing else is said: OpenAI's limit for speech.
pub const DEFAULT_MAX_INPUT_CHARS: usize = 4096;
/// Requests that may wait for a place besides the running ones, when nothing else is said.
pub const DEFAULT_QUEUE_DEPTH: usize = 8;
/// Events that may wait between a running request and its consumer. The request blocks when
/// they are all waiting, so a consumer that reads slowly slows its generation instead of growing
/// memory.
pub const EVENTS_IN_FLIGHT: usize = 4;

/// The limits every request meets at the door, whatever its transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest input text in characters (also a voice's transcript, a streamed text's pending
    /// sentence).
    pub max_input_chars: usize,
    /// Requests that may wait while the scheduler's places are taken; more are refused as busy.
    pub queue_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_input_chars: DEFAULT_MAX_INPUT_CHARS,
            queue_depth: DEFAULT_QUEUE_DEPTH,
        }
    }
}

impl Limits {
    /// The one check of a text's length.
    pub fn check_text(&self, text: &str) -> Result<(), SynthError> {
        let got = text.chars().count();
        if got > self.max_input_chars {
            return Err(SynthError::InputTooLong {
                got,
                limit: self.max_input_chars,
            });
        }
        Ok(())
    }
}

/// Why a request was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error(
        "the server is busy: every place is taken and {queue_depth} requests already wait; try again shortly"
    )]
    Busy { queue_depth: usize },
    #[error("the server is shutting down")]
    Closed,
    #[error(transparent)]
    Invalid(#[from] SynthError),
}

impl std::fmt::Display for Cause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Gone => "its consumer went away",
            Self::Deadline => "its deadline passed",
            Self::Shutdown => "the server is shutting down",
            Self::Stopped => "it was asked to stop",
        })
    }
}

/// Why an admitted request was cancelled. The first cause set wins: a request whose deadline
/// passed while its client was leaving ended by its deadline if that fired first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// Its consumer went away (the events were dropped, or [`Permit`] dropped before the end).
    Gone,
    /// Its deadline passed.
    Deadline,
    /// The door was closed and its requests cancelled ([`Door::cancel_all`]).
    Shutdown,
    /// Its consumer asked it to stop ([`Permit::stop`], or a sink that returned `Break`).
    Stopped,
}

/// How a request ended without its whole result.
#[derive(Debug)]
pub enum Ended {
    Failed(SynthError),
    Cancelled {
        cause: Cause,
        /// It had a place (`false`: it was cancelled while waiting).
        running: bool,
        /// What it made before it stopped (running requests only).
        report: Option<Box<SynthesisReport>>,
    },
}

impl Ended {
    /// As [`Synthesizer::synthesize`] answers: a request cancelled while it ran gives what it
    /// made (its stop is `Cancelled`); one cancelled while it waited, or a failure, an error.
    pub fn into_report(self) -> Result<SynthesisReport, SynthError> {
        match self {
            Self::Failed(e) => Err(e),
            Self::Cancelled {
                report: Some(r), ..
            } => Ok(*r),
            Self::Cancelled { cause, .. } => Err(SynthError::Cancelled(cause)),
        }
    }
}

/// What a consumer sees of its request, in order; [`Event::Done`] is the last.
#[derive(Debug)]
pub enum Event {
    /// It left the line and has a place now.
    Running,
    Started {
        prompt_tokens: usize,
        estimated_codes: usize,
    },
    Piece {
        index: usize,
        count: usize,
        text: String,
    },
    /// One code (only when [`Submit::codes`] asked for them).
    Code {
        index: usize,
        code: u32,
    },
    /// Encoded audio, in order.
    Audio(Vec<u8>),
    /// Bytes that overwrite the output at `offset`, after the last `Audio` (a whole file's
    /// front, once its end is known: [`SynthEvent::Patch`]).
    Patch {
        offset: u64,
        bytes: Vec<u8>,
    },
    /// A piece's place in the audio, once its audio has gone out.
    Timing(PieceTiming),
    Done(Result<Box<SynthesisReport>, Ended>),
}

/// How a request is submitted.
#[derive(Debug, Clone, Copy, Default)]
pub struct Submit {
    /// When it is cancelled if it has not ended, waiting time included.
    pub deadline: Option<Instant>,
    /// Send an [`Event::Code`] per code (progress bars); off, codes are not sent.
    pub codes: bool,
}

/// The door's live numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub running: usize,
    pub queued: usize,
    /// Requests that run at once: the scheduler's batch.
    pub places: usize,
    pub queue_depth: usize,
}

/// One admitted request's control: its token and why it was cancelled.
#[derive(Debug)]
struct Control {
    token: CancelToken,
    cause: OnceLock<Cause>,
    running: AtomicBool,
}

impl Control {
    fn stop(&self, cause: Cause) {
        let _ = self.cause.set(cause);
        self.token.cancel();
    }
}

#[derive(Default)]
struct State {
    admitted: usize,
    running: usize,
    /// Waiting requests' ids, in arrival order: the first takes the next free place.
    line: VecDeque<u64>,
    closed: bool,
    inflight: HashMap<u64, Arc<Control>>,
}

/// Sees how every admitted request went, whatever its transport and whether or not its consumer
/// still reads (the server's metrics).
pub trait Observer: Send + Sync {
    /// Every report a request made (cancelled ones included), while the request still holds its
    /// place: whoever sees the place free sees the report counted.
    fn report(&self, report: &SynthesisReport);
    /// A request that ended without its whole result, once its place is free: whoever sees the
    /// reason sees the place free.
    fn ended(&self, ended: &Ended);
}

struct Shared {
    synth: Arc<Synthesizer>,
    observer: Option<Arc<dyn Observer>>,
    limits: Limits,
    places: usize,
    state: Mutex<State>,
    /// Signalled when a place frees, a waiting request is cancelled, or the door empties.
    changed: Condvar,
    next_id: AtomicU64,
    timer: Arc<Timer>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The front door over one synthesizer. Clones share it.
#[derive(Clone)]
pub struct Door(Arc<Shared>);

impl Door {
    pub fn new(synth: Arc<Synthesizer>, limits: Limits) -> Self {
        Self::observed(synth, limits, None)
    }

    /// A door whose every report is shown to `observer` first (the server's metrics).
    pub fn observed(
        synth: Arc<Synthesizer>,
        limits: Limits,
        observer: Option<Arc<dyn Observer>>,
    ) -> Self {
        let places = synth.max_batch().max(1);
        Self(Arc::new(Shared {
            synth,
            observer,
            limits,
            places,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            next_id: AtomicU64::new(1),
            timer: Timer::start(),
        }))
    }

    pub fn synth(&self) -> &Arc<Synthesizer> {
        &self.0.synth
    }

    pub fn limits(&self) -> Limits {
        self.0.limits
    }

    pub fn load(&self) -> Load {
        let st = self.0.lock();
        Load {
            running: st.running,
            queued: st.admitted - st.running,
            places: self.0.places,
            queue_depth: self.0.limits.queue_depth,
        }
    }

    /// Checks `req` and gives it a place in the line, or refuses it: over a limit, every place
    /// and the whole queue taken, or the door closed. Nothing runs until [`Ticket::run`].
    pub fn admit(&self, req: SpeechRequest, deadline: Option<Instant>) -> Result<Ticket, Refusal> {
        self.0.limits.check_text(&req.text)?;
        let control = Arc::new(Control {
            token: CancelToken::new(),
            cause: OnceLock::new(),
            running: AtomicBool::new(false),
        });
        let id = self.0.next_id.fetch_add(1, Ordering::Relaxed);
        {
            let mut st = self.0.lock();
            if st.closed {
                return Err(Refusal::Closed);
            }
            if st.admitted >= self.0.places + self.0.limits.queue_depth {
                return Err(Refusal::Busy {
                    queue_depth: self.0.limits.queue_depth,
                });
            }
            st.admitted += 1;
            st.inflight.insert(id, control.clone());
            // In line from admission: places go in the order requests were admitted.
            st.line.push_back(id);
        }
        if let Some(at) = deadline {
            self.0.timer.add(at, id, &control);
        }
        Ok(Ticket {
            door: self.clone(),
            id,
            req,
            control,
            deadline,
            placed: false,
        })
    }

    /// Admits `req` and runs it on this thread, as [`Synthesizer::synthesize`] answers (for
    /// consumers that run one request at a time from their own threads: `bench`, tests).
    pub fn synthesize(
        &self,
        req: &SpeechRequest,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<SynthesisReport, SynthError> {
        let ticket = self.admit(req.clone(), None).map_err(|r| match r {
            Refusal::Invalid(e) => e,
            other => SynthError::NotAdmitted(other.to_string()),
        })?;
        ticket.run(sink).or_else(Ended::into_report)
    }

    /// Admits `req` and runs it on a thread of its own; its events come on the stream. Dropping
    /// the stream (or the permit) cancels it.
    pub fn submit(&self, req: SpeechRequest, opts: Submit) -> Result<(Permit, Events), Refusal> {
        let ticket = self.admit(req, opts.deadline)?;
        let control = ticket.control.clone();
        let (tx, rx) = mpsc::channel(EVENTS_IN_FLIGHT);
        let permit = Permit {
            control: control.clone(),
        };
        let job = move || {
            let token = control.token.clone();
            let mut sink = |ev: SynthEvent<'_>| {
                let event = match ev {
                    SynthEvent::Started {
                        prompt_tokens,
                        estimated_codes,
                    } => Event::Started {
                        prompt_tokens,
                        estimated_codes,
                    },
                    SynthEvent::Piece {
                        index, count, text, ..
                    } => Event::Piece {
                        index,
                        count,
                        text: text.to_owned(),
                    },
                    SynthEvent::Code { index, code } if opts.codes => Event::Code { index, code },
                    SynthEvent::Code { .. } => {
                        return if tx.is_closed() {
                            control.stop(Cause::Gone);
                            ControlFlow::Break(())
                        } else {
                            ControlFlow::Continue(())
                        };
                    }
                    SynthEvent::Audio([]) => return ControlFlow::Continue(()),
                    SynthEvent::Audio(b) => Event::Audio(b.to_vec()),
                    SynthEvent::Timing(t) => Event::Timing(t.clone()),
                    SynthEvent::Patch { offset, bytes } => Event::Patch {
                        offset,
                        bytes: bytes.to_vec(),
                    },
                };
                if send_or_cancel(&tx, event, &token) {
                    ControlFlow::Continue(())
                } else {
                    control.stop(Cause::Gone);
                    ControlFlow::Break(())
                }
            };
            let on_place = |_: &Ticket| {
                // A consumer that has gone is found at the first event.
                let _ = tx.try_send(Event::Running);
            };
            let door = ticket.door.clone();
            // A panic inside the synthesis still ends the request (its place is freed as the
            // ticket unwinds), counted and answered like any failure.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                ticket.run_with(&mut sink, on_place)
            }))
            .unwrap_or_else(|_| {
                Err(Ended::Failed(SynthError::Engine(
                    crate::engine::EngineError::Unavailable(
                        "the request's synthesis panicked".into(),
                    ),
                )))
            });
            door.observe_end(&result);
            // The consumer may be gone; then nobody is left to tell.
            let _ = tx.blocking_send(Event::Done(result.map(Box::new)));
        };
        std::thread::Builder::new()
            .name("onebit-request".into())
            .spawn(job)
            .map_err(|e| {
                Refusal::Invalid(SynthError::Engine(crate::engine::EngineError::Unavailable(
                    format!("cannot start the request's thread: {e}"),
                )))
            })?;
        Ok((permit, Events(rx)))
    }

    /// Tells the observer how a request ended, once its ticket (and place) is gone.
    fn observe_end<T>(&self, result: &Result<T, Ended>) {
        if let (Err(e), Some(observer)) = (result, &self.0.observer) {
            observer.ended(e);
        }
    }

    /// Refuses every request from now on (already admitted ones go on).
    pub fn close(&self) {
        self.0.lock().closed = true;
    }

    pub fn is_closed(&self) -> bool {
        self.0.lock().closed
    }

    /// Cancels every admitted request (as [`Cause::Shutdown`]); returns how many there were.
    pub fn cancel_all(&self) -> usize {
        let all: Vec<Arc<Control>> = self.0.lock().inflight.values().cloned().collect();
        // Cancelled outside the lock: a cancel hook takes it to wake the line.
        for c in &all {
            c.stop(Cause::Shutdown);
        }
        all.len()
    }

    /// Waits up to `timeout` until no request is admitted; whether it got there.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let end = Instant::now() + timeout;
        let mut st = self.0.lock();
        while st.admitted > 0 {
            let now = Instant::now();
            if now >= end {
                return false;
            }
            st = self
                .0
                .changed
                .wait_timeout(st, end - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
        true
    }
}

/// Hands an event to the consumer, waiting while it is behind; false when it is gone or the
/// request was cancelled meanwhile. A plain blocking send would not see the deadline or shutdown:
/// a consumer that reads a byte now and then would hold its place for as long as it liked.
fn send_or_cancel(tx: &mpsc::Sender<Event>, mut event: Event, token: &CancelToken) -> bool {
    loop {
        match tx.try_send(event) {
            Ok(()) => return true,
            Err(mpsc::error::TrySendError::Closed(_)) => return false,
            Err(mpsc::error::TrySendError::Full(e)) => {
                if token.is_cancelled() {
                    return false;
                }
                event = e;
                std::thread::sleep(FULL_POLL);
            }
        }
    }
}

/// How often a request waiting for a slow consumer looks at its cancel token.
const FULL_POLL: Duration = Duration::from_millis(5);

/// An admitted request, waiting for [`Ticket::run`]. Dropping it leaves the door.
pub struct Ticket {
    door: Door,
    id: u64,
    req: SpeechRequest,
    control: Arc<Control>,
    deadline: Option<Instant>,
    placed: bool,
}

impl Ticket {
    /// The request's token: cancelling it ends the request (as [`Cause::Stopped`] unless a
    /// cause was set before).
    pub fn token(&self) -> &CancelToken {
        &self.control.token
    }

    pub fn request(&self) -> &SpeechRequest {
        &self.req
    }

    /// Waits in line for a place, then synthesises on this thread, handing events to `sink`.
    pub fn run(
        self,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
    ) -> Result<SynthesisReport, Ended> {
        let door = self.door.clone();
        let result = self.run_with(sink, |_| {});
        door.observe_end(&result);
        result
    }

    fn run_with(
        mut self,
        sink: &mut dyn FnMut(SynthEvent<'_>) -> ControlFlow<()>,
        on_place: impl FnOnce(&Ticket),
    ) -> Result<SynthesisReport, Ended> {
        if let Err(cause) = self.wait_place() {
            return Err(Ended::Cancelled {
                cause,
                running: false,
                report: None,
            });
        }
        on_place(&self);
        let result = self
            .door
            .0
            .synth
            .synthesize(&self.req, &self.control.token, sink);
        if let (Ok(report), Some(observer)) = (&result, &self.door.0.observer) {
            observer.report(report);
        }
        match result {
            Ok(report) if report.stop == StopReason::Cancelled => Err(Ended::Cancelled {
                cause: self.cause(),
                running: true,
                report: Some(Box::new(report)),
            }),
            Ok(report) => Ok(report),
            Err(e) if self.control.token.is_cancelled() && is_interruption(&e) => {
                Err(Ended::Cancelled {
                    cause: self.cause(),
                    running: true,
                    report: None,
                })
            }
            Err(e) => Err(Ended::Failed(e)),
        }
    }

    fn cause(&self) -> Cause {
        self.control.cause.get().copied().unwrap_or(Cause::Stopped)
    }

    /// Takes the next free place when this request is first in line. `Err` with the cause when
    /// it is cancelled (or its deadline passes) while waiting.
    fn wait_place(&mut self) -> Result<(), Cause> {
        let shared = self.door.0.clone();
        // A cancel must wake the wait: the hook takes the lock, so it never runs under it.
        let wake = Arc::downgrade(&shared);
        let _hook = self.control.token.on_cancel(move || {
            if let Some(s) = wake.upgrade() {
                let _st = s.lock();
                s.changed.notify_all();
            }
        });
        let mut st = shared.lock();
        loop {
            if self.deadline.is_some_and(|at| Instant::now() >= at)
                && !self.control.token.is_cancelled()
            {
                // The timer's job, done here should it be late or missing; outside the lock,
                // which the cancel hook takes.
                drop(st);
                self.control.stop(Cause::Deadline);
                st = shared.lock();
            }
            if self.control.token.is_cancelled() {
                st.line.retain(|&id| id != self.id);
                drop(st);
                shared.changed.notify_all();
                return Err(self.cause());
            }
            if st.line.front() == Some(&self.id) && st.running < shared.places {
                st.line.pop_front();
                st.running += 1;
                self.placed = true;
                self.control.running.store(true, Ordering::SeqCst);
                drop(st);
                // The next in line may fit too.
                shared.changed.notify_all();
                return Ok(());
            }
            st = match self.deadline {
                // The timer cancels at the deadline; this wait wakes for it too.
                Some(at) => {
                    let left = at
                        .saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1));
                    shared
                        .changed
                        .wait_timeout(st, left)
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .0
                }
                None => shared
                    .changed
                    .wait(st)
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            };
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let shared = &self.door.0;
        shared.timer.remove(self.deadline, self.id);
        {
            let mut st = shared.lock();
            if self.placed {
                st.running -= 1;
            }
            st.admitted -= 1;
            st.inflight.remove(&self.id);
            // Never run (refused to start, or dropped): out of the line.
            st.line.retain(|&id| id != self.id);
        }
        shared.changed.notify_all();
        self.control.running.store(false, Ordering::SeqCst);
    }
}

/// An interruption of a cancelled run, not a failure of the engine.
fn is_interruption(e: &SynthError) -> bool {
    matches!(
        e,
        SynthError::Engine(crate::engine::EngineError::Interrupted)
    )
}

/// A submitted request's handle: stop it, or see whether it runs. Dropping it before the end
/// cancels the request (its consumer is gone).
pub struct Permit {
    control: Arc<Control>,
}

impl Permit {
    /// Stops the request; it ends as [`Cause::Stopped`] unless another cause came first.
    pub fn stop(&self) {
        self.control.stop(Cause::Stopped);
    }

    /// Ends the request as cancelled by `cause` (a transport's deadline or shutdown).
    pub fn cancel(&self, cause: Cause) {
        self.control.stop(cause);
    }

    pub fn is_running(&self) -> bool {
        self.control.running.load(Ordering::SeqCst)
    }

    pub fn token(&self) -> &CancelToken {
        &self.control.token
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Nothing happens to a request that has ended.
        self.control.stop(Cause::Gone);
    }
}

/// A submitted request's events.
pub struct Events(mpsc::Receiver<Event>);

impl Events {
    pub async fn recv(&mut self) -> Option<Event> {
        self.0.recv().await
    }

    /// For a consumer on a plain thread (never inside an async runtime).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.0.blocking_recv()
    }
}

/// Cancels requests at their deadlines: one thread for the door, asleep until the next one.
struct Timer {
    due: Mutex<BTreeMap<(Instant, u64), Weak<Control>>>,
    changed: Condvar,
    stop: AtomicBool,
}

impl Timer {
    fn start() -> Arc<Self> {
        let timer = Arc::new(Self {
            due: Mutex::new(BTreeMap::new()),
            changed: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&timer);
        // A door that cannot start its timer still works: a waiting request sees its deadline
        // itself; a running one ends at the transport's own timeouts.
        if let Err(e) = std::thread::Builder::new()
            .name("onebit-deadlines".into())
            .spawn(move || Self::run(weak))
        {
            tracing::error!("cannot start the deadline timer: {e}");
        }
        timer
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<(Instant, u64), Weak<Control>>> {
        self.due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn add(&self, at: Instant, id: u64, control: &Arc<Control>) {
        self.lock().insert((at, id), Arc::downgrade(control));
        self.changed.notify_all();
    }

    fn remove(&self, at: Option<Instant>, id: u64) {
        if let Some(at) = at {
            self.lock().remove(&(at, id));
        }
    }

    fn run(weak: Weak<Self>) {
        loop {
            let Some(timer) = weak.upgrade() else { return };
            if timer.stop.load(Ordering::SeqCst) {
                return;
            }
            let mut due = timer.lock();
            let now = Instant::now();
            let mut fired = Vec::new();
            while let Some(entry) = due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                fired.push(entry.remove());
            }
            if fired.is_empty() {
                // Wakes at the next deadline, when one is added, or to let a dropped door go.
                let wait = due
                    .keys()
                    .next()
                    .map_or(Duration::from_secs(1), |(at, _)| {
                        at.saturating_duration_since(now)
                    })
                    .min(Duration::from_secs(1));
                let _ = timer.changed.wait_timeout(due, wait);
                continue;
            }
            drop(due);
            for c in fired.iter().filter_map(Weak::upgrade) {
                c.stop(Cause::Deadline);
            }
        }
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.timer.stop.store(true, Ordering::SeqCst);
        self.timer.changed.notify_all();
    }
}
