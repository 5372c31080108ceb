//! Where the backbone runs: the CPU, CUDA, or the AMD NPU through the RyzenAI provider (ONNX
//! packages), or the CPU, Vulkan, ROCm or CUDA through llama.cpp (GGUF packages), and how
//! `--device auto` chooses.

use std::fmt;
use std::path::Path;

use ort::environment::Environment;
use ort::session::builder::SessionBuilder;

use super::EngineError;
use super::ryzenai::ProviderSetup;
use crate::npu::env::Unchanged;
use crate::package::BackbonePackage;

/// The execution provider a backbone session is built for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
    /// AMD's RyzenAI provider; always in a worker child (its environment must be set before the
    /// process starts).
    Npu,
    /// llama.cpp's Vulkan backend (`--engine llama`; the Strix Halo iGPU's route).
    Vulkan,
    /// llama.cpp's ROCm (HIP) backend (`--engine llama`).
    Rocm,
}

impl Device {
    pub fn as_str(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
            Device::Npu => "npu",
            Device::Vulkan => "vulkan",
            Device::Rocm => "rocm",
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `--device` asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// npu when the package declares RyzenAI and ONEBIT_RYZENAI_ROOT is set, else cpu.
    #[default]
    Auto,
    Exactly(Device),
}

impl std::str::FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Exactly(Device::Cpu)),
            "cuda" => Ok(Self::Exactly(Device::Cuda)),
            "npu" => Ok(Self::Exactly(Device::Npu)),
            "vulkan" => Ok(Self::Exactly(Device::Vulkan)),
            "rocm" => Ok(Self::Exactly(Device::Rocm)),
            _ => Err(format!(
                "unknown device {s:?} (supported: auto, cpu, cuda, npu; with --engine llama: cpu, vulkan, rocm, cuda)"
            )),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceChoice::Auto => f.write_str("auto"),
            DeviceChoice::Exactly(d) => d.fmt(f),
        }
    }
}

/// The device a choice resolved to and why, for the startup log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceDecision {
    pub device: Device,
    pub why: String,
    /// `auto` wanted the NPU's conditions and did not find them (a `--require-npu` error).
    pub fell_back: bool,
}

/// Resolves `--device`. `auto` is npu only when both conditions of the NPU route hold (the
/// package declares the RyzenAI provider and ONEBIT_RYZENAI_ROOT names the venv); otherwise cpu.
/// An explicit device is taken as asked.
pub fn resolve(
    choice: DeviceChoice,
    provider_declared: bool,
    ryzenai_root: Option<&Path>,
) -> DeviceDecision {
    match choice {
        DeviceChoice::Exactly(device) => DeviceDecision {
            device,
            why: format!("--device {device}"),
            fell_back: false,
        },
        DeviceChoice::Auto => {
            let missing = if !provider_declared {
                Some(Unchanged::CpuModel)
            } else if ryzenai_root.is_none() {
                Some(Unchanged::NoRyzenAiRoot)
            } else {
                None
            };
            match missing {
                None => DeviceDecision {
                    device: Device::Npu,
                    why: "auto: the package declares RyzenAI and ONEBIT_RYZENAI_ROOT is set".into(),
                    fell_back: false,
                },
                Some(why) => DeviceDecision {
                    device: Device::Cpu,
                    why: format!("auto: {why}"),
                    fell_back: true,
                },
            }
        }
    }
}

/// Adds the device's execution provider to a session builder, returning the providers the
/// session will have in priority order (the CPU provider is always last: ONNX Runtime places on
/// it what the others decline) and, on the NPU, everything the RyzenAI provider was given.
pub(crate) fn attach(
    builder: SessionBuilder,
    env: &Environment,
    device: Device,
    pkg: &BackbonePackage,
    npu_strict: bool,
) -> Result<(SessionBuilder, Vec<String>, Option<ProviderSetup>), EngineError> {
    const CPU: &str = "CPUExecutionProvider";
    match device {
        Device::Cpu => Ok((builder, vec![CPU.into()], None)),
        Device::Cuda => {
            use ort::ep::ExecutionProvider as _;
            let compiled = ort::ep::CUDA::is_available().unwrap_or(false);
            if !compiled {
                return Err(EngineError::Device(format!(
                    "--device cuda: the loaded ONNX Runtime ({}) has no CUDA execution provider; \
                     point --ort-lib at a CUDA build (onnxruntime-gpu)",
                    crate::runtime::info().map_or("?".into(), |i| i.path.display().to_string())
                )));
            }
            let builder = builder
                .with_execution_providers([ort::ep::CUDA::default().build().error_on_failure()])
                .map_err(|e| EngineError::Device(format!("--device cuda: {e}")))?;
            tracing::info!("execution provider CUDAExecutionProvider appended");
            Ok((
                builder,
                vec!["CUDAExecutionProvider".into(), CPU.into()],
                None,
            ))
        }
        Device::Vulkan | Device::Rocm => Err(EngineError::Device(format!(
            "--device {device} is a llama.cpp backend: it runs GGUF packages with --engine llama (docs/models.md)"
        ))),
        Device::Npu => {
            let (builder, setup) = super::ryzenai::attach(builder, env, pkg, npu_strict)?;
            Ok((
                builder,
                vec![crate::npu::PROVIDER_NAME.into(), CPU.into()],
                Some(setup),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_show() {
        for s in ["auto", "cpu", "cuda", "npu", "vulkan", "rocm"] {
            assert_eq!(s.parse::<DeviceChoice>().expect(s).to_string(), s);
        }
        assert!("gpu".parse::<DeviceChoice>().is_err());
    }

    #[test]
    fn auto_needs_both_conditions() {
        let root = Path::new("/venv");
        let d = resolve(DeviceChoice::Auto, true, Some(root));
        assert_eq!(d.device, Device::Npu);
        assert!(!d.fell_back);
        let d = resolve(DeviceChoice::Auto, true, None);
        assert_eq!(d.device, Device::Cpu);
        assert!(d.fell_back);
        assert!(
            d.why.contains("ONEBIT_RYZENAI_ROOT is not set"),
            "{}",
            d.why
        );
        let d = resolve(DeviceChoice::Auto, false, Some(root));
        assert_eq!(d.device, Device::Cpu);
        assert!(d.why.contains("does not declare"), "{}", d.why);
        let d = resolve(DeviceChoice::Exactly(Device::Npu), false, None);
        assert_eq!(d.device, Device::Npu);
        assert!(!d.fell_back);
    }
}
