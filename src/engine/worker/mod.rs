//! The engine in a worker child (`onebit-tts worker`).
//!
//! The NPU route needs its environment (LD_LIBRARY_PATH and friends, `npu::env`) set before the
//! process starts, so `--device npu` runs the backbone in a child; `--isolate` does the same for
//! any device. [`protocol`] is the wire format, [`child`] the worker's side, and
//! [`WorkerEngine`] the parent's side: an [`Engine`](super::Engine) that forwards each
//! generation and owns the child's lifecycle (one reap, SIGTERM and grace, never SIGKILL an NPU
//! holder, respawn after a crash).

pub mod child;
pub mod probe;
pub mod protocol;
mod proxy;

pub use proxy::{WorkerConfig, WorkerEngine, WorkerHandle};
