//! AMD's RyzenAI execution provider, attached the way onnxruntime-genai attaches it
//! (src/ryzenai/interface.cpp `SetupProvider` and src/ryzenai/session_options.cpp), through the
//! `ort` crate:
//!
//! 1. register the provider library under [`PROVIDER_NAME`] once per process, from
//!    RYZENAI_EP_PATH, else beside the loaded ONNX Runtime or the executable, else the current
//!    directory ([`crate::npu::env::provider_library`]);
//! 2. keep the EP devices of that provider whose hardware type is NPU; none is an error
//!    ("No RyzenAI devices detected");
//! 3. session config entry `model_root` = the package directory;
//! 4. append the devices (`SessionOptionsAppendExecutionProvider_V2`) with the options of the
//!    `RyzenAI` entry of genai_config.json's `provider_options`, passed as they are;
//! 5. register the provider's custom ops from the same library with
//!    `RegisterCustomOpsLibrary_V2` (onnxruntime-genai commit 180ed1ac3, PR #1959: current
//!    provider builds export `RegisterCustomOps` and no longer `RyzenAI_RegisterCustomOps`).
//!    Only a library that does not export `RegisterCustomOps` gets the old route,
//!    `RegisterCustomOpsUsingFunction("RyzenAI_RegisterCustomOps")`; an error names the route that
//!    failed and why.
//!
//! Everything applied is returned as a [`ProviderSetup`] for `npu probe`, `/health` and the
//! worker's log. It only works inside a process started with the NPU environment (`npu::env`),
//! which is why `--device npu` always runs the backbone in the worker child.

use std::collections::BTreeMap;
use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ort::AsPointer as _;
use ort::environment::Environment;
use ort::memory::DeviceType;
use ort::session::builder::SessionBuilder;
use serde::{Deserialize, Serialize};

use super::EngineError;
use crate::npu::PROVIDER_NAME;
use crate::npu::env::{ProviderSearch, provider_library};
use crate::package::BackbonePackage;

/// The session config key onnxruntime-genai sets to the model directory for RyzenAI.
pub const MODEL_ROOT_KEY: &str = "model_root";
/// ONNX Runtime's session config key that makes a session fail instead of placing nodes the
/// other providers decline on the CPU (`kOrtSessionOptionsDisableCPUEPFallback`).
pub const DISABLE_CPU_FALLBACK_KEY: &str = "session.disable_cpu_ep_fallback";
/// The entry point `RegisterCustomOpsLibrary_V2` calls in a custom-op library.
pub const LIBRARY_CUSTOM_OPS_SYMBOL: &str = "RegisterCustomOps";
/// The registration function older provider builds exported for their custom ops.
pub const CUSTOM_OPS_FUNCTION: &CStr = c"RyzenAI_RegisterCustomOps";

/// The library registered in this process (a second registration under the same name fails).
static REGISTERED: Mutex<Option<(PathBuf, String)>> = Mutex::new(None);

/// One EP device ONNX Runtime offered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpDeviceInfo {
    pub ep: String,
    pub ep_vendor: String,
    /// CPU, GPU or NPU.
    pub hardware: String,
    pub hardware_vendor: String,
}

/// How the provider's custom ops were registered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "route", rename_all = "snake_case")]
pub enum CustomOpsRoute {
    /// `RegisterCustomOpsLibrary_V2(<provider library>)`, as onnxruntime-genai does.
    Library { path: PathBuf },
    /// `RegisterCustomOpsUsingFunction(RyzenAI_RegisterCustomOps)`, for builds that do not export
    /// `RegisterCustomOps`.
    Function { name: String },
}

/// Everything the provider was given, as applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderSetup {
    pub provider: String,
    pub library: PathBuf,
    /// Where the library path came from (RYZENAI_EP_PATH, beside a loaded library, ...).
    pub library_source: String,
    /// Every EP device ONNX Runtime offered, and how many of them were this provider's NPUs.
    pub ep_devices: Vec<EpDeviceInfo>,
    pub npu_devices: usize,
    /// Provider options, as passed to the V2 append (genai_config.json's `RyzenAI` entry).
    pub options: BTreeMap<String, String>,
    /// Session config entries set for the provider (model_root, the strict switch).
    pub config_entries: BTreeMap<String, String>,
    pub custom_ops: CustomOpsRoute,
    /// `session.disable_cpu_ep_fallback=1`: nodes the provider declines fail the load.
    pub strict: bool,
}

fn err(step: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Device(format!("RyzenAI provider: {step}: {e}"))
}

/// Where this process looks for the provider library: RYZENAI_EP_PATH, beside the loaded ONNX
/// Runtime and this executable, the working directory.
fn search() -> ProviderSearch {
    let mut dirs = Vec::new();
    if let Some(dir) = crate::runtime::info().and_then(|i| i.path.parent().map(PathBuf::from)) {
        dirs.push(dir);
    }
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(PathBuf::from))
    {
        dirs.push(dir);
    }
    ProviderSearch::from_process(dirs)
}

/// The directory of the provider library this process registered, or would register.
pub fn library_dir() -> Option<PathBuf> {
    let registered = REGISTERED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .map(|(p, _)| p.clone());
    let lib = registered.unwrap_or_else(|| provider_library(&search()).path);
    lib.parent().map(PathBuf::from)
}

/// Step 1: registers the provider library once per process; returns its path and source.
fn register(env: &Environment) -> Result<(PathBuf, String), EngineError> {
    let mut done = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = done.as_ref() {
        return Ok(p.clone());
    }
    let lib = provider_library(&search());
    let source = format!("{:?}", lib.source);
    tracing::info!(
        "registering {PROVIDER_NAME} from {} ({source})",
        lib.path.display()
    );
    env.register_ep_library(PROVIDER_NAME, &lib.path)
        .map_err(|e| {
            err(
                &format!(
                    "registering the provider library {} ({source})",
                    lib.path.display()
                ),
                e,
            )
        })?;
    *done = Some((lib.path.clone(), source.clone()));
    Ok((lib.path, source))
}

/// Whether `lib` exports `symbol`. The library is already loaded by ONNX Runtime, so opening
/// it again only takes another reference.
fn exports(lib: &Path, symbol: &str) -> Result<bool, String> {
    // SAFETY: the provider library was loaded into this process by ONNX Runtime already, so its
    // initialisers have run; looking a symbol up calls nothing in it.
    unsafe {
        let handle = libloading::Library::new(lib).map_err(|e| e.to_string())?;
        Ok(handle.get::<*const ()>(symbol.as_bytes()).is_ok())
    }
}

/// Step 5: the provider's custom ops, by library when it exports the entry point.
fn register_custom_ops(
    builder: SessionBuilder,
    lib: &Path,
) -> Result<(SessionBuilder, CustomOpsRoute), EngineError> {
    let library_route = exports(lib, LIBRARY_CUSTOM_OPS_SYMBOL);
    if let Ok(true) = library_route {
        let builder = builder.with_operator_library(lib).map_err(|e| {
            err(
                &format!(
                    "custom ops by library: RegisterCustomOpsLibrary_V2({})",
                    lib.display()
                ),
                e,
            )
        })?;
        return Ok((
            builder,
            CustomOpsRoute::Library {
                path: lib.to_path_buf(),
            },
        ));
    }
    let why_not_library = match library_route {
        Ok(_) => format!(
            "{} does not export {LIBRARY_CUSTOM_OPS_SYMBOL}",
            lib.display()
        ),
        Err(e) => format!("{} could not be inspected: {e}", lib.display()),
    };
    tracing::warn!(
        "RyzenAI custom ops: {why_not_library}; falling back to \
         RegisterCustomOpsUsingFunction({})",
        CUSTOM_OPS_FUNCTION.to_string_lossy()
    );
    let mut builder = builder;
    // SAFETY: the builder's pointer is a live OrtSessionOptions; the name is a NUL-terminated
    // C string; the returned status is owned and released by `result_from_status`.
    unsafe {
        let status = (ort::api().RegisterCustomOpsUsingFunction)(
            builder.ptr_mut(),
            CUSTOM_OPS_FUNCTION.as_ptr(),
        );
        ort::Error::result_from_status(status).map_err(|e| {
            err(
                &format!(
                    "custom ops: the library route is unavailable ({why_not_library}) and \
                     RegisterCustomOpsUsingFunction({}) failed",
                    CUSTOM_OPS_FUNCTION.to_string_lossy()
                ),
                e,
            )
        })?;
    }
    Ok((
        builder,
        CustomOpsRoute::Function {
            name: CUSTOM_OPS_FUNCTION.to_string_lossy().into_owned(),
        },
    ))
}

/// Attaches the RyzenAI provider to `builder` (steps 1-5 of the module docs). `strict` sets
/// `session.disable_cpu_ep_fallback=1`.
pub(crate) fn attach(
    builder: SessionBuilder,
    env: &Environment,
    pkg: &BackbonePackage,
    strict: bool,
) -> Result<(SessionBuilder, ProviderSetup), EngineError> {
    let (lib, library_source) = register(env)?;

    // Step 2: the provider's NPU devices.
    let mut offered = Vec::new();
    let devices: Vec<_> = env
        .devices()
        .filter(|d| {
            let ep = d.ep().unwrap_or("?");
            let hw = d.hardware_device();
            let ty = hw.ty();
            offered.push(EpDeviceInfo {
                ep: ep.to_owned(),
                ep_vendor: d.ep_vendor().unwrap_or("?").to_owned(),
                hardware: format!("{ty:?}"),
                hardware_vendor: hw.vendor().unwrap_or("?").to_owned(),
            });
            ep == PROVIDER_NAME && ty == DeviceType::NPU
        })
        .collect();
    if devices.is_empty() {
        let seen: Vec<String> = offered
            .iter()
            .map(|d| format!("{}/{}", d.ep, d.hardware))
            .collect();
        return Err(EngineError::Device(format!(
            "No RyzenAI devices detected: {PROVIDER_NAME} (from {}) offers no NPU device \
             (EP devices: [{}]); check `onebit-tts doctor` (amdxdna, /dev/accel/accel0, XRT)",
            lib.display(),
            seen.join(", ")
        )));
    }
    let npu_devices = devices.len();

    // Step 3: model_root (and the strict switch).
    // Absolute: the provider resolves the package's files against it, from whatever directory.
    let root = std::fs::canonicalize(&pkg.dir)
        .unwrap_or_else(|_| pkg.dir.clone())
        .to_string_lossy()
        .into_owned();
    let mut config_entries = BTreeMap::from([(MODEL_ROOT_KEY.to_owned(), root.clone())]);
    let mut builder = builder
        .with_config_entry(MODEL_ROOT_KEY, &root)
        .map_err(|e| err("session config model_root", e))?;
    if strict {
        builder = builder
            .with_config_entry(DISABLE_CPU_FALLBACK_KEY, "1")
            .map_err(|e| err(DISABLE_CPU_FALLBACK_KEY, e))?;
        config_entries.insert(DISABLE_CPU_FALLBACK_KEY.to_owned(), "1".to_owned());
    }

    // Step 4: V2 append with the package's RyzenAI provider options. `with_devices` takes each
    // option as `<ep name>.<key>` and passes `<key>` on.
    let options: BTreeMap<String, String> = pkg
        .genai
        .model
        .decoder
        .session_options
        .ryzenai()
        .cloned()
        .unwrap_or_default();
    let prefixed: Vec<(String, String)> = options
        .iter()
        .map(|(k, v)| (format!("{PROVIDER_NAME}.{k}"), v.clone()))
        .collect();
    let builder = builder
        .with_devices(devices, Some(&prefixed))
        .map_err(|e| err("appending the NPU devices", e))?;

    // Step 5.
    let (builder, custom_ops) = register_custom_ops(builder, &lib)?;
    let setup = ProviderSetup {
        provider: PROVIDER_NAME.to_owned(),
        library: lib,
        library_source,
        ep_devices: offered,
        npu_devices,
        options,
        config_entries,
        custom_ops,
        strict,
    };
    tracing::info!(
        "execution provider {PROVIDER_NAME} appended: {npu_devices} NPU device(s), options {:?}, \
         config {:?}, custom ops {:?}",
        setup.options,
        setup.config_entries,
        setup.custom_ops
    );
    Ok((builder, setup))
}
