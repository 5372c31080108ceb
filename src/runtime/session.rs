//! Session setup: the one place settings become ONNX Runtime session options, for every session
//! the crate opens (the backbone in [`crate::engine`], the NeuCodec decoder and encoder in
//! [`crate::codec`]).
//!
//! Every session starts from [`builder`]: the environment [`super::environment`] loaded and a
//! [`ThreadPlan`] (pool size, spinning, pinning). The backbone then adds its package's
//! genai_config.json options with [`apply_genai`], in onnxruntime-genai's order
//! (`Model::CreateSessionOptionsFromConfig`: optimization level, threads, memory and log knobs,
//! session config entries, the custom-op library); its execution provider is the engine's choice
//! (`engine::device`), attached after these. The codec's sessions take the thread plan only: the
//! package's options describe the backbone graph, not NeuCodec's.

use std::path::{Path, PathBuf};

use ort::AsPointer as _;
use ort::environment::Environment;
use ort::logging::LogLevel;
use ort::session::Session;
use ort::session::builder::{GraphOptimizationLevel, SessionBuilder};

use super::ThreadPlan;
use crate::package::genai::SessionOptions;

/// A session option ONNX Runtime refused.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// ONNX Runtime's own message.
    #[error("{0}")]
    Ort(String),
    /// The package's `custom_ops_library` could not be registered.
    #[error("custom_ops_library {}: {message}", .path.display())]
    CustomOps { path: PathBuf, message: String },
}

impl<R> From<ort::Error<R>> for SessionError {
    fn from(e: ort::Error<R>) -> Self {
        SessionError::Ort(e.to_string())
    }
}

/// A session builder on `env` with `threads` applied: where every session of the crate starts.
pub fn builder(env: &Environment, threads: &ThreadPlan) -> Result<SessionBuilder, SessionError> {
    Ok(threads.apply(Session::builder(env)?)?)
}

/// genai_config.json's `session_options` of a package in `dir`, applied as onnxruntime-genai
/// applies them. An explicit thread count was already folded into the [`ThreadPlan`].
/// `ep_dirs`: the directories of the provider libraries the session will use (the second place
/// a relative `custom_ops_library` is looked for, see [`custom_ops_path`]).
pub fn apply_genai(
    builder: SessionBuilder,
    so: &SessionOptions,
    dir: &Path,
    ep_dirs: &[PathBuf],
) -> Result<SessionBuilder, SessionError> {
    let mut builder = builder
        .with_optimization_level(optimization_level(so.graph_optimization_level.as_deref()))?;
    if let Some(n) = so.inter_op_num_threads {
        builder = builder.with_inter_threads(n)?;
    }
    builder = apply_knobs(builder, so)?;
    for (k, v) in &so.all_config_entries() {
        builder = builder.with_config_entry(k, v)?;
    }
    if let Some(lib) = &so.custom_ops_library {
        let cwd = std::env::current_dir().ok();
        let path = custom_ops_path(Path::new(lib), dir, ep_dirs, cwd.as_deref());
        tracing::info!("custom_ops_library {lib:?}: {}", path.display());
        builder = builder
            .with_operator_library(&path)
            .map_err(|e| SessionError::CustomOps {
                message: e.to_string(),
                path,
            })?;
    }
    Ok(builder)
}

/// Where a `custom_ops_library` is loaded from, in onnxruntime-genai's order
/// (`Model::CreateSessionOptionsFromConfig`): an absolute path as is; a relative one under the
/// package directory, then under each provider library's directory, then under the working
/// directory, the first that exists; none existing, the name as written, for the dynamic
/// loader's own search (LD_LIBRARY_PATH, the system paths).
pub fn custom_ops_path(
    lib: &Path,
    package_dir: &Path,
    ep_dirs: &[PathBuf],
    cwd: Option<&Path>,
) -> PathBuf {
    if lib.is_absolute() {
        return lib.to_path_buf();
    }
    std::iter::once(package_dir)
        .chain(ep_dirs.iter().map(PathBuf::as_path))
        .chain(cwd)
        .map(|d| d.join(lib))
        .find(|p| p.exists())
        .unwrap_or_else(|| lib.to_path_buf())
}

/// genai_config.json's `graph_optimization_level`; anything else (or nothing) is ONNX Runtime's
/// full optimization, as in onnxruntime-genai.
fn optimization_level(name: Option<&str>) -> GraphOptimizationLevel {
    match name.map(str::to_ascii_uppercase).as_deref() {
        Some("ORT_DISABLE_ALL") => GraphOptimizationLevel::Disable,
        Some("ORT_ENABLE_BASIC") => GraphOptimizationLevel::Level1,
        Some("ORT_ENABLE_EXTENDED") => GraphOptimizationLevel::Level2,
        _ => GraphOptimizationLevel::All,
    }
}

/// ONNX Runtime's log severity for genai_config.json's `log_severity_level` (0 verbose .. 4
/// fatal; out-of-range values clamp to the nearest end).
fn log_level(level: i32) -> LogLevel {
    match level {
        i32::MIN..=0 => LogLevel::Verbose,
        1 => LogLevel::Info,
        2 => LogLevel::Warning,
        3 => LogLevel::Error,
        _ => LogLevel::Fatal,
    }
}

/// The memory, log and profiling knobs.
fn apply_knobs(
    mut builder: SessionBuilder,
    so: &SessionOptions,
) -> Result<SessionBuilder, SessionError> {
    if let Some(on) = so.enable_cpu_mem_arena {
        // SAFETY: the builder's pointer is a live OrtSessionOptions; the status is owned and
        // released by `result_from_status`.
        unsafe {
            let api = ort::api();
            let status = if on {
                (api.EnableCpuMemArena)(builder.ptr_mut())
            } else {
                (api.DisableCpuMemArena)(builder.ptr_mut())
            };
            ort::Error::result_from_status(status)?;
        }
    }
    if let Some(on) = so.enable_mem_pattern {
        builder = builder.with_memory_pattern(on)?;
    }
    if let Some(id) = &so.log_id {
        builder = builder.with_log_id(id)?;
    }
    if let Some(level) = so.log_severity_level {
        builder = builder.with_log_level(log_level(level))?;
    }
    if let Some(v) = so.log_verbosity_level {
        builder = builder.with_log_verbosity(v)?;
    }
    if let Some(prefix) = &so.enable_profiling {
        builder = builder.with_profiling(prefix)?;
    }
    Ok(builder)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn custom_ops_are_looked_up_as_onnxruntime_genai_does() {
        let t = crate::testutil::tempdir("custom-ops");
        let (pkg, ep, cwd) = (t.join("pkg"), t.join("ep"), t.join("cwd"));
        for d in [&pkg, &ep, &cwd] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        let lib = Path::new("libops.so");
        let find = || custom_ops_path(lib, &pkg, std::slice::from_ref(&ep), Some(&cwd));
        // Nowhere: the name as written, for the loader's search.
        assert_eq!(find(), PathBuf::from("libops.so"));
        std::fs::write(cwd.join(lib), b"").expect("write");
        assert_eq!(find(), cwd.join(lib));
        std::fs::write(ep.join(lib), b"").expect("write");
        assert_eq!(find(), ep.join(lib));
        std::fs::write(pkg.join(lib), b"").expect("write");
        assert_eq!(find(), pkg.join(lib));
        let abs = t.join("elsewhere.so");
        assert_eq!(custom_ops_path(&abs, &pkg, &[], None), abs);
    }

    #[test]
    fn genai_names_map_to_ort_levels() {
        assert_eq!(
            optimization_level(Some("ort_disable_all")),
            GraphOptimizationLevel::Disable
        );
        assert_eq!(
            optimization_level(Some("ORT_ENABLE_EXTENDED")),
            GraphOptimizationLevel::Level2
        );
        assert_eq!(optimization_level(None), GraphOptimizationLevel::All);
        assert_eq!(log_level(-3), LogLevel::Verbose);
        assert_eq!(log_level(2), LogLevel::Warning);
        assert_eq!(log_level(9), LogLevel::Fatal);
    }
}
