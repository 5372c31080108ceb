//! ONNX Runtime as this crate uses it, shared by the backbone ([`crate::engine`]) and the codec
//! ([`crate::codec`]), which both depend on this module and never on each other:
//!
//! - this file: finding and loading the ONNX Runtime shared library (`ort` with `load-dynamic`),
//!   once per process, through the crate's one native-library search ([`crate::native`]): an
//!   explicit flag beats `ORT_DYLIB_PATH`, which beats the RyzenAI venv, which beats the
//!   project-local install, which beats whatever `python3` has; when none works the error names
//!   every place tried and the one command that fixes it. Also the version rules (which ONNX
//!   Runtime this build can drive, and the venv's runtime the NPU route must pair with).
//! - [`threads`]: how a session's intra-op pool is sized, pinned and made to wait.
//! - [`session`]: the one place settings become session options.

pub mod session;
pub mod threads;
pub mod turns;

pub use threads::{CpuTopology, ThreadPlan, ThreadPolicy};
pub use turns::{TurnWait, Turns, TurnsMode};

use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;

use crate::native;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    NotFound(#[from] native::NotFound),
    #[error("ONNX Runtime environment: {0}")]
    Environment(String),
    /// The NPU route must use the venv's ONNX Runtime (the RyzenAI provider only works with the
    /// runtime it was built against), and there is none.
    #[error(
        "ONEBIT_RYZENAI_ROOT={}: no ONNX Runtime library in the venv (looked for {}); the RyzenAI provider only works with the ONNX Runtime of its own venv. Fix: point ONEBIT_RYZENAI_ROOT at the Ryzen AI Software venv, or pass --ort-lib with the library the provider was built against",
        .root.display(), .looked.join(", ")
    )]
    NoVenvRuntime { root: PathBuf, looked: Vec<String> },
    /// The venv's ONNX Runtime is older than this build can drive, and the provider cannot be
    /// paired with any other.
    #[error(
        "the RyzenAI venv's ONNX Runtime is {venv_version} ({}), but this build of onebit-tts needs ONNX Runtime >= {min} (the ort crate's C API {api}); the RyzenAI provider only works with the ONNX Runtime it was built against, so the project's own copy cannot stand in. Fix: install a Ryzen AI Software release whose ONNX Runtime is >= {min}, or run onnxruntime-genai's own loop (--engine oga), or use --device cpu",
        .path.display()
    )]
    VenvRuntimeTooOld {
        path: PathBuf,
        venv_version: String,
        min: String,
        api: u32,
    },
}

/// The oldest ONNX Runtime this build can drive: the `ort` crate asks the library for its C API
/// version [`ort::MINOR_VERSION`] (the `api-24` feature), which ONNX Runtime 1.24 introduced.
pub fn min_version() -> String {
    format!("1.{}", ort::MINOR_VERSION)
}

/// Whether `version` ("1.31.1") is at least [`min_version`]. An unparsable version is not.
pub fn version_supported(version: &str) -> bool {
    let mut parts = version.trim().split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next()) {
        (Some(Ok(major)), Some(Ok(minor))) => (major, minor) >= (1, ort::MINOR_VERSION),
        _ => false,
    }
}

/// The ONNX Runtime library of a RyzenAI venv: `deployment/lib/libonnxruntime.so*`, else the
/// venv's `onnxruntime` package (`lib/python3*/site-packages/onnxruntime/capi/`).
pub fn venv_runtime(root: &Path) -> Result<PathBuf, RuntimeError> {
    let mut dirs = vec![native::venv_lib_dir(root)];
    if let Ok(entries) = std::fs::read_dir(root.join("lib")) {
        let mut py: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("python3"))
            })
            .map(|p| p.join("site-packages/onnxruntime/capi"))
            .collect();
        py.sort();
        dirs.extend(py);
    }
    for dir in &dirs {
        if let Some(lib) = native::newest(dir, LIB_FILE) {
            return Ok(lib);
        }
    }
    Err(RuntimeError::NoVenvRuntime {
        root: root.to_path_buf(),
        looked: dirs
            .iter()
            .map(|d| format!("{}/libonnxruntime.so*", d.display()))
            .collect(),
    })
}

/// The library the NPU route must load: the venv's, when its version is one this build can drive.
pub fn paired_with_venv(root: &Path) -> Result<(PathBuf, String), RuntimeError> {
    let path = venv_runtime(root)?;
    let version = lib_version(&path).unwrap_or_else(|| "unknown".into());
    if !version_supported(&version) {
        return Err(RuntimeError::VenvRuntimeTooOld {
            path,
            venv_version: version,
            min: min_version(),
            api: ort::MINOR_VERSION,
        });
    }
    Ok((path, version))
}

/// The loaded runtime: where it came from and its version.
#[derive(Debug, Clone)]
pub struct RuntimeInfo {
    pub path: PathBuf,
    pub source: &'static str,
    pub version: String,
}

struct Loaded {
    env: Environment,
    info: RuntimeInfo,
}

static RUNTIME: OnceLock<Loaded> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

/// ONNX Runtime's file name, in every place it is looked for.
const LIB_FILE: &str = "libonnxruntime.so";

/// The places to look, in order: `explicit` (the flag, or the caller's reason), then
/// `ORT_DYLIB_PATH`, the RyzenAI venv, the project-local install, python3's onnxruntime.
fn search(explicit: Option<(&'static str, &Path)>) -> native::Search {
    let search = native::Search::new(
        "the ONNX Runtime library",
        "run `scripts/setup.sh` (installs onnxruntime into .onebit/), or pass --ort-lib PATH / set ORT_DYLIB_PATH",
    );
    let search = match explicit {
        Some((source, p)) => search.at(source, p),
        None => search,
    };
    search
        .env("ORT_DYLIB_PATH")
        .ryzenai_venv(LIB_FILE)
        .project_local(&format!("onnxruntime/lib/{LIB_FILE}"))
        .python("python3 onnxruntime", python_onnxruntime)
}

fn python_onnxruntime() -> Result<PathBuf, String> {
    let capi = native::python_dir(
        "import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))",
        "python3 cannot import onnxruntime",
    )?;
    native::newest(&capi, LIB_FILE).ok_or_else(|| format!("no {LIB_FILE} in {}", capi.display()))
}

/// Loads ONNX Runtime once per process and returns its environment. Later calls return the same
/// one whatever `explicit` says (the library cannot be swapped inside a process).
pub fn environment(explicit: Option<&Path>) -> Result<&'static Environment, RuntimeError> {
    init(explicit.map(|p| ("--ort-lib", p))).map(|l| &l.env)
}

/// [`environment`] with a library chosen for a reason other than `--ort-lib`, named by `source`
/// (what `/health` and `npu probe` show).
pub fn environment_from(
    source: &'static str,
    path: &Path,
) -> Result<&'static Environment, RuntimeError> {
    init(Some((source, path))).map(|l| &l.env)
}

/// Which library was loaded, if any yet.
pub fn info() -> Option<&'static RuntimeInfo> {
    RUNTIME.get().map(|l| &l.info)
}

fn init(explicit: Option<(&'static str, &Path)>) -> Result<&'static Loaded, RuntimeError> {
    if let Some(l) = RUNTIME.get() {
        return Ok(l);
    }
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = RUNTIME.get() {
        return Ok(l);
    }
    let found = search(explicit).first(|place| {
        let env = ort::init_from(&place.path)
            .map_err(|e| e.to_string())?
            .with_name("onebit-tts")
            .build()
            .map_err(|e| e.to_string())?;
        let version = lib_version(&place.path).unwrap_or_else(|| "unknown".into());
        tracing::info!(path = %place.path.display(), source = place.source, %version, "ONNX Runtime loaded");
        Ok(Loaded {
            env,
            info: RuntimeInfo {
                path: place.path.clone(),
                source: place.source,
                version,
            },
        })
    })?;
    let loaded = found.lib;
    Ok(RUNTIME.get_or_init(|| loaded))
}

/// The library's own version string (`OrtGetApiBase()->GetVersionString()`, e.g. "1.31.1").
pub fn lib_version(path: &Path) -> Option<String> {
    // SAFETY: opening the library runs its initialisers, as ort's own load of it does (or
    // already did: then this only takes another reference); the two calls below are ONNX
    // Runtime's documented, side-effect-free version query, which every version has.
    unsafe {
        let lib = libloading::Library::new(path).ok()?;
        let get: libloading::Symbol<unsafe extern "C" fn() -> *const ort::sys::OrtApiBase> =
            lib.get(b"OrtGetApiBase").ok()?;
        let base = get();
        if base.is_null() {
            return None;
        }
        let v = ((*base).GetVersionString)();
        if v.is_null() {
            return None;
        }
        Some(std::ffi::CStr::from_ptr(v).to_string_lossy().into_owned())
    }
}
