//! The NPU route (AMD Ryzen AI, amdxdna, Linux): everything that knows XRT, sysfs and the RyzenAI
//! venv lives here, and nothing here knows ONNX Runtime sessions or HTTP.
//!
//! - [`env`](mod@env): the worker child's environment (XILINX_XRT, LD_LIBRARY_PATH, RYZENAI_EP_PATH) as a
//!   pure function of its inputs, and where onnxruntime-genai looks for the provider library.
//! - [`roots`]: the `/sys`, `/dev`, `/proc`, `/etc`, `/lib` roots every check reads through, so
//!   tests run over fake trees.
//! - [`residency`]: the proof that the model really sits on the NPU (a passing run is not).
//! - [`doctor`]: one PASS/WARN/FAIL line per known Linux NPU blocker, each failure with its fix.
//! - [`cache`]: where the session's compile cache lives (never the read-only model directory).
//! - [`fork_guard`]: once a session exists, its process refuses fork and exec.
//! - [`accel`]: whether a process holds the NPU's accel node, the fact behind the worker
//!   supervisor's "never SIGKILL an NPU holder".
//! - [`supervisor`]: the lifecycle of any worker child (the engine's, the doctor's `xrt-smi`):
//!   one reap, SIGTERM, a grace, and a stop policy that never SIGKILLs an NPU holder. It lives
//!   here because that rule is the NPU's; the engine's worker uses it for CPU workers too.
//!
//! The facts behind the rules are in `shared/reference/npu-route.md`; `docs/npu.md` is the user's
//! side of the same story.

pub mod accel;
pub mod cache;
pub mod doctor;
pub mod env;
pub mod fork_guard;
pub mod residency;
pub mod roots;
pub mod supervisor;
pub mod xdna;

use std::io;
use std::path::PathBuf;

pub use accel::{accel_fds, holds_accel};
pub use doctor::{Check, Report, Status};
pub use env::{EnvInputs, EnvPlan, WorkerEnv, worker_env};
pub use residency::{Evidence, Placement, Residency, ResidencyState, weigh_npu};
pub use roots::SystemRoots;

/// The name onnxruntime-genai registers the RyzenAI provider library under, and the name the
/// worker's log must show for [`residency`] to count it.
pub const PROVIDER_NAME: &str = "RyzenAILightExecutionProvider";

/// File name of the RyzenAI provider library on Linux (venv `deployment/lib`, or beside a worker
/// built against the venv).
pub const PROVIDER_FILE: &str = "libonnxruntime_providers_ryzenai.so";

/// Errors of the NPU module. Checks in [`doctor`] turn these into report lines; the other modules
/// return them to the caller.
#[derive(Debug, thiserror::Error)]
pub enum NpuError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: {what}", path.display())]
    Parse { path: PathBuf, what: String },
    /// LD_LIBRARY_PATH is `:`-separated and has no escape, so such a directory cannot be listed.
    #[error("{var}: {} contains ':' and cannot be put on a search path", path.display())]
    ColonInPath { var: &'static str, path: PathBuf },
    #[error("running {program}: {reason}")]
    Command { program: String, reason: String },
    #[error(transparent)]
    Signal(#[from] supervisor::SignalError),
}

impl NpuError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: io::Error) -> Self {
        NpuError::Io {
            path: path.into(),
            source,
        }
    }
}
