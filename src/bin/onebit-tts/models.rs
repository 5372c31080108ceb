//! `models`: check and optimize model packages.

use std::path::PathBuf;

use anyhow::Result;
use clap::Subcommand;

use onebit_tts::package::{ModelPackage, optimize};
use onebit_tts::synth::resolve_dir;

#[derive(Subcommand)]
pub enum ModelsCmd {
    /// Validate a package and print its summary.
    Check {
        dir: PathBuf,
        #[arg(long)]
        codec: Option<PathBuf>,
    },
    /// Write a faster copy of a package: the lm_head projects the last position only and only
    /// the speech ids and stop ids (a graph edit of the decoder ONNX; see docs).
    Optimize {
        src: PathBuf,
        /// A new (or empty) directory.
        dst: PathBuf,
        /// Keep logits for every position (the prefill computes them all).
        #[arg(long)]
        no_last_position: bool,
        /// Keep the head's full vocabulary.
        #[arg(long)]
        no_speech_head: bool,
    },
}

/// Prints the decoder's lm_head as the graph has it and checks it against onebit_logits.json.
pub fn check_head(pkg: &ModelPackage) -> Result<()> {
    println!("lm_head      {}", optimize::check_head(pkg)?);
    Ok(())
}

pub fn run(cmd: ModelsCmd) -> Result<()> {
    match cmd {
        ModelsCmd::Check { dir, codec } => {
            let pkg = ModelPackage::load(&resolve_dir(&dir), codec.as_deref())?;
            println!("{}", pkg.summary());
            check_head(&pkg)
        }
        ModelsCmd::Optimize {
            src,
            dst,
            no_last_position,
            no_speech_head,
        } => {
            let levers = optimize::Levers {
                last_position: !no_last_position,
                speech_head: !no_speech_head,
            };
            let report = optimize::optimize(&resolve_dir(&src), &dst, levers)?;
            println!("{}", report.summary());
            let pkg = ModelPackage::load(&dst, None)?;
            check_head(&pkg)
        }
    }
}
