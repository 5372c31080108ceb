//! Finding and loading the ONNX Runtime shared library (`ort` with `load-dynamic`).
//!
//! Nothing is downloaded at build time, so the library must be found at run time. The order is the
//! one users expect: an explicit flag beats the environment, which beats the RyzenAI venv, which
//! beats the project-local install, which beats whatever `python3` has. When none works the error
//! names every place tried and the one command that fixes it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use ort::environment::Environment;

use crate::paths;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(
        "could not load the ONNX Runtime library; tried:\n{}\nfix: run `scripts/setup.sh` (installs onnxruntime into .onebit/), or pass --ort-lib PATH / set ORT_DYLIB_PATH",
        .tried.iter().map(|t| format!("  - {t}")).collect::<Vec<_>>().join("\n")
    )]
    NotFound { tried: Vec<String> },
    #[error("ONNX Runtime environment: {0}")]
    Environment(String),
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

/// The places to look, in order, each with the name of its source.
fn candidates(explicit: Option<&Path>) -> Vec<(&'static str, PathBuf)> {
    let mut out = Vec::new();
    if let Some(p) = explicit {
        out.push(("--ort-lib", p.to_path_buf()));
    }
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|v| !v.is_empty()) {
        out.push(("ORT_DYLIB_PATH", PathBuf::from(p)));
    }
    if let Some(root) = std::env::var_os("ONEBIT_RYZENAI_ROOT").filter(|v| !v.is_empty()) {
        out.push((
            "ONEBIT_RYZENAI_ROOT",
            Path::new(&root).join("deployment/lib/libonnxruntime.so"),
        ));
    }
    for p in paths::in_homes("onnxruntime/lib/libonnxruntime.so") {
        out.push(("project-local (.onebit)", p));
    }
    out
}

fn python_onnxruntime() -> Result<PathBuf, String> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), 'capi'))",
        ])
        .output()
        .map_err(|e| format!("python3 not runnable: {e}"))?;
    if !out.status.success() {
        return Err("python3 cannot import onnxruntime".into());
    }
    let capi = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let mut libs: Vec<PathBuf> = std::fs::read_dir(&capi)
        .map_err(|e| format!("{}: {e}", capi.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so"))
        })
        .collect();
    libs.sort();
    libs.pop()
        .ok_or_else(|| format!("no libonnxruntime.so in {}", capi.display()))
}

/// Loads ONNX Runtime once per process and returns its environment. Later calls return the same
/// one whatever `explicit` says (the library cannot be swapped inside a process).
pub fn environment(explicit: Option<&Path>) -> Result<&'static Environment, RuntimeError> {
    init(explicit).map(|l| &l.env)
}

/// Which library was loaded, if any yet.
pub fn info() -> Option<&'static RuntimeInfo> {
    RUNTIME.get().map(|l| &l.info)
}

fn init(explicit: Option<&Path>) -> Result<&'static Loaded, RuntimeError> {
    if let Some(l) = RUNTIME.get() {
        return Ok(l);
    }
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = RUNTIME.get() {
        return Ok(l);
    }
    let mut tried = Vec::new();
    let mut try_one = |source: &'static str, path: PathBuf| -> Option<Loaded> {
        if !path.exists() {
            tried.push(format!("{source}: {} (not found)", path.display()));
            return None;
        }
        match ort::init_from(&path) {
            Ok(builder) => match builder.with_name("onebit-tts").build() {
                Ok(env) => {
                    let version = lib_version(&path).unwrap_or_else(|| "unknown".into());
                    tracing::info!(path = %path.display(), source, %version, "ONNX Runtime loaded");
                    Some(Loaded {
                        env,
                        info: RuntimeInfo {
                            path,
                            source,
                            version,
                        },
                    })
                }
                Err(e) => {
                    tried.push(format!("{source}: {} ({e})", path.display()));
                    None
                }
            },
            Err(e) => {
                tried.push(format!("{source}: {} ({e})", path.display()));
                None
            }
        }
    };
    let mut loaded = None;
    for (source, path) in candidates(explicit) {
        if let Some(l) = try_one(source, path) {
            loaded = Some(l);
            break;
        }
    }
    if loaded.is_none() {
        match python_onnxruntime() {
            Ok(path) => loaded = try_one("python3 onnxruntime", path),
            Err(e) => tried.push(format!("python3 onnxruntime: {e}")),
        }
    }
    let Some(loaded) = loaded else {
        return Err(RuntimeError::NotFound { tried });
    };
    Ok(RUNTIME.get_or_init(|| loaded))
}

/// The library's own version string (`OrtGetApiBase()->GetVersionString()`, e.g. "1.31.1").
fn lib_version(path: &Path) -> Option<String> {
    // SAFETY: the library is already loaded by ort from this path; opening it again only takes
    // another reference, and the two calls below are ONNX Runtime's documented, side-effect-free
    // version query.
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
