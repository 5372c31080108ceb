//! `npu probe` and `doctor`: the NPU route's checks.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::args::{ModelArgs, synth_config};
use crate::{ExitWith, Silent};

#[derive(Subcommand)]
pub enum NpuCmd {
    /// Build the RyzenAI session in a worker child with the NPU environment, run one prefill and
    /// a few decode steps, and report the runtime, provider library, EP devices, options, custom
    /// ops route, node placement and residency with its evidence. Exit 0: residency proven;
    /// 2: ran but not proven; 3: could not set up.
    Probe {
        #[command(flatten)]
        model: ModelArgs,
        #[arg(long)]
        json: bool,
    },
}

/// The worker `npu probe` starts: the package's session set up exactly as --device npu does.
pub fn probe_config(model: &ModelArgs) -> Result<onebit_tts::engine::WorkerConfig> {
    Ok(onebit_tts::synth::load::probe_config(&synth_config(model))?)
}

/// `doctor [--model PKG]`: with a package, `npu probe` runs first so that the residency line
/// is measured rather than skipped.
pub fn doctor_cmd(json: bool, model: Option<PathBuf>) -> Result<()> {
    use onebit_tts::npu::doctor::{self, DoctorInputs, Probed, RealHost};
    let mut inputs = DoctorInputs::from_process();
    if let Some(pkg) = model {
        /// The model options with everything but --model from the environment.
        #[derive(Parser)]
        struct FromEnv {
            #[command(flatten)]
            model: ModelArgs,
        }
        let args = ModelArgs {
            model: Some(pkg),
            ..FromEnv::try_parse_from(["onebit-tts"])?.model
        };
        // A package that cannot even be read is a failed setup, reported on the
        // residency line with the rest of the report.
        let residency = match probe_config(&args) {
            Ok(cfg) => onebit_tts::engine::worker::probe::probe(cfg).residency,
            Err(e) => onebit_tts::npu::Residency::failed(format!("{e:#}")),
        };
        inputs.probed = Some(Probed {
            package: synth_config(&args).package_dir.display().to_string(),
            residency,
        });
    }
    let report = doctor::run(&inputs, &RealHost::default());
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_text());
    }
    if report.exit_code() == 0 {
        Ok(())
    } else {
        Err(Silent.into())
    }
}

pub fn npu_probe(model: &ModelArgs, json: bool) -> Result<()> {
    use onebit_tts::engine::worker::probe;
    let report = probe::probe(probe_config(model)?);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.text());
    }
    match report.exit_code() {
        0 => Ok(()),
        code => Err(ExitWith(code).into()),
    }
}
