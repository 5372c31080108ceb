//! The engine in a worker child (`onebit-tts worker`).
//!
//! The NPU route needs its environment (LD_LIBRARY_PATH and friends, `npu::env`) set before the
//! process starts, so `--device npu` runs the backbone in a child; `--isolate` does the same for
//! any device. [`protocol`] is the wire format, [`child`] the worker's side, [`supervisor`] (from
//! `npu`, whose rule about NPU holders it enforces) the child process's lifecycle (one reap, SIGTERM and grace, a [`StopPolicy`] that never SIGKILLs
//! an NPU holder), and [`WorkerEngine`] the parent's side: an [`Engine`](super::Engine) that
//! forwards each generation, times out loads and steps that make no progress, and respawns after
//! a crash or hang — never beside a worker that still holds the NPU.

pub mod child;
pub mod probe;
pub mod protocol;
mod proxy;
// The supervisor is the NPU route's (its stop policy protects NPU holders); re-exported here,
// where the worker uses it.
pub use crate::npu::supervisor;

pub use proxy::{
    DEFAULT_LOAD_TIMEOUT, DEFAULT_STEP_TIMEOUT, NPU_RETRY_DELAY, ResidencyGate, WorkerConfig,
    WorkerEngine, WorkerHandle, WorkerState, WorkerTimeouts,
};
pub use supervisor::{Child, Ending, NeverKill, StopGrace, StopOutcome, StopPolicy};
