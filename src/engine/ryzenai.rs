//! AMD's RyzenAI execution provider, attached the way onnxruntime-genai attaches it
//! (src/ryzenai/interface.cpp and the session setup around it), through the `ort` crate:
//!
//! 1. register the provider library under [`PROVIDER_NAME`] once per process, from
//!    RYZENAI_EP_PATH, else beside the loaded ONNX Runtime or the executable, else the current
//!    directory ([`crate::npu::env::provider_library`]);
//! 2. keep the EP devices of that provider whose hardware type is NPU; none is an error
//!    ("No RyzenAI devices detected");
//! 3. append them (`SessionOptionsAppendExecutionProvider_V2`) with the options of the `RyzenAI`
//!    entry of genai_config.json's `provider_options`;
//! 4. session config entry `model_root` = the package directory;
//! 5. `RegisterCustomOpsUsingFunction("RyzenAI_RegisterCustomOps")`.
//!
//! It only works inside a process started with the NPU environment (`npu::env`), which is why
//! `--device npu` always runs the backbone in the worker child.

use std::ffi::CStr;
use std::path::PathBuf;
use std::sync::Mutex;

use ort::AsPointer as _;
use ort::environment::Environment;
use ort::memory::DeviceType;
use ort::session::builder::SessionBuilder;

use super::EngineError;
use crate::npu::PROVIDER_NAME;
use crate::npu::env::{ProviderSearch, provider_library};
use crate::package::BackbonePackage;

/// The session config key onnxruntime-genai sets to the model directory for RyzenAI.
pub const MODEL_ROOT_KEY: &str = "model_root";
/// The registration function the provider library exports for its custom ops.
pub const CUSTOM_OPS_FUNCTION: &CStr = c"RyzenAI_RegisterCustomOps";

/// The library registered in this process (a second registration under the same name fails).
static REGISTERED: Mutex<Option<PathBuf>> = Mutex::new(None);

fn err(step: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::Device(format!("RyzenAI provider: {step}: {e}"))
}

/// Step 1: registers the provider library once per process and returns its path.
fn register(env: &Environment) -> Result<PathBuf, EngineError> {
    let mut done = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = done.as_ref() {
        return Ok(p.clone());
    }
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
    let lib = provider_library(&ProviderSearch::from_process(dirs));
    tracing::info!(
        "registering {PROVIDER_NAME} from {} ({:?})",
        lib.path.display(),
        lib.source
    );
    env.register_ep_library(PROVIDER_NAME, &lib.path)
        .map_err(|e| {
            err(
                &format!(
                    "registering the provider library {} ({:?})",
                    lib.path.display(),
                    lib.source
                ),
                e,
            )
        })?;
    *done = Some(lib.path.clone());
    Ok(lib.path)
}

/// Attaches the RyzenAI provider to `builder` (steps 1-5 of the module docs).
pub(crate) fn attach(
    builder: SessionBuilder,
    env: &Environment,
    pkg: &BackbonePackage,
) -> Result<SessionBuilder, EngineError> {
    let lib = register(env)?;

    // Step 2: the provider's NPU devices.
    let mut seen = Vec::new();
    let devices: Vec<_> = env
        .devices()
        .filter(|d| {
            let ep = d.ep().unwrap_or("?");
            let ty = d.hardware_device().ty();
            seen.push(format!("{ep}/{ty:?}"));
            ep == PROVIDER_NAME && ty == DeviceType::NPU
        })
        .collect();
    if devices.is_empty() {
        return Err(EngineError::Device(format!(
            "No RyzenAI devices detected: {PROVIDER_NAME} (from {}) offers no NPU device \
             (EP devices: [{}]); check `onebit-tts doctor` (amdxdna, /dev/accel/accel0, XRT)",
            lib.display(),
            seen.join(", ")
        )));
    }
    let count = devices.len();

    // Step 3: V2 append with the package's RyzenAI provider options. `with_devices` takes each
    // option as `<ep name>.<key>` and passes `<key>` on.
    let options: Vec<(String, String)> = pkg
        .genai
        .model
        .decoder
        .session_options
        .ryzenai()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (format!("{PROVIDER_NAME}.{k}"), v.clone()))
                .collect()
        })
        .unwrap_or_default();
    let shown: Vec<String> = options
        .iter()
        .map(|(k, v)| format!("{}={v}", &k[PROVIDER_NAME.len() + 1..]))
        .collect();
    let builder = builder
        .with_devices(devices, Some(&options))
        .map_err(|e| err("appending the NPU devices", e))?;

    // Step 4: model_root.
    let root = pkg.dir.to_string_lossy();
    let mut builder = builder
        .with_config_entry(MODEL_ROOT_KEY, &*root)
        .map_err(|e| err("session config model_root", e))?;

    // Step 5: the provider's custom ops, by its exported registration function.
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
                    "RegisterCustomOpsUsingFunction({})",
                    CUSTOM_OPS_FUNCTION.to_string_lossy()
                ),
                e,
            )
        })?;
    }
    tracing::info!(
        "execution provider {PROVIDER_NAME} appended: {count} NPU device(s), options [{}], \
         model_root {root}",
        shown.join(", ")
    );
    Ok(builder)
}
