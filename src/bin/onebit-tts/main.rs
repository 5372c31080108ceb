//! The `onebit-tts` command line: parses arguments and calls the library. Errors end here: one
//! line on stderr and a non-zero exit. Each sub-command's options and its few lines of printing
//! live in the module of its name; what it does lives in the library.

mod args;
mod bench;
mod models;
mod npu;
mod say;
mod serve;
mod voices;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

use args::ModelArgs;

#[derive(Parser)]
#[command(
    name = "onebit-tts",
    version,
    about = "NeuTTS-air speech synthesis on ONNX Runtime"
)]
struct Cli {
    /// Less output: no progress bars, warnings and errors only.
    #[arg(short, long, global = true)]
    quiet: bool,
    /// More log lines: INFO for every command (say and the other one-shot commands log
    /// warnings only by default; serve logs INFO). ONEBIT_LOG or RUST_LOG (an EnvFilter) win.
    #[arg(long, global = true)]
    verbose: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Synthesise text to an audio file.
    Say(say::SayArgs),
    /// Turn speech codes saved by `say --codes` (or printed by `say --json`) into audio: the
    /// same codes and output options give the same bytes `say` wrote.
    Decode(say::DecodeArgs),
    /// Serve the OpenAI-compatible API (POST /v1/audio/speech).
    Serve {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        args: onebit_tts::server::ServeArgs,
    },
    /// Measure synthesis speed against the real-time line (50 codes/s).
    Bench {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        args: bench::BenchArgs,
    },
    /// Check this machine for the NPU route's known blockers (PASS/WARN/FAIL/SKIP per check).
    Doctor {
        #[arg(long)]
        json: bool,
        /// Also run `npu probe` on this package (settings from the environment, as `npu probe`
        /// takes them) for the residency line: PASS only when residency is proven. Without it
        /// that line is SKIP: the doctor starts nothing on the NPU unless asked.
        #[arg(long, value_name = "PKG")]
        model: Option<PathBuf>,
    },
    /// The NPU route: `npu probe` sets the RyzenAI session up exactly as --device npu does and
    /// reports what it observed.
    Npu {
        #[command(subcommand)]
        cmd: npu::NpuCmd,
    },
    /// Print the prompt (prepared text, ids, token count) for a text.
    Prompt(say::PromptArgs),
    /// Print the spoken form of a text ("$5.50" → "five dollars fifty cents"), as synthesis
    /// reads it before phonemization.
    Normalize(say::NormalizeArgs),
    /// The engine worker child (started by the server itself; framed messages on stdin/stdout).
    #[command(hide = true)]
    Worker,
    /// Model packages.
    Models {
        #[command(subcommand)]
        cmd: models::ModelsCmd,
    },
    /// Reference voices.
    Voices {
        #[command(subcommand)]
        cmd: voices::VoicesCmd,
    },
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Say(a) => say::say(a, cli.quiet),
        Cmd::Decode(a) => say::decode(a),
        Cmd::Prompt(a) => say::prompt(a),
        Cmd::Normalize(a) => say::normalize(a),
        Cmd::Serve { model, args } => serve::serve(&model, &args),
        Cmd::Bench { model, args } => bench::bench(&model, &args, cli.quiet),
        Cmd::Worker => unreachable!("main runs the worker before anything else"),
        Cmd::Npu {
            cmd: npu::NpuCmd::Probe { model, json },
        } => npu::npu_probe(&model, json),
        Cmd::Doctor { json, model } => npu::doctor_cmd(json, model),
        Cmd::Models { cmd } => models::run(cmd, cli.quiet),
        Cmd::Voices { cmd } => voices::run(cmd, cli.quiet),
    }
}

/// Ends the process with this status, having said what it had to say already.
#[derive(Debug)]
pub struct ExitWith(pub u8);
impl std::fmt::Display for ExitWith {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "exit status {}", self.0)
    }
}
impl std::error::Error for ExitWith {}

/// An error already reported on stdout (doctor's FAIL lines): exit 1 without an extra line.
#[derive(Debug)]
pub struct Silent;
impl std::fmt::Display for Silent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("checks failed")
    }
}
impl std::error::Error for Silent {}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A one-shot command's user wants its progress and summary, not the server's INFO lines;
    // the server (and the worker, whose lines the parent re-logs) keeps them.
    let long_running = matches!(cli.cmd, Cmd::Serve { .. } | Cmd::Worker);
    // --verbose also shows the normaliser's decisions: each sentence's tagged reading, and the
    // ones it left as written (debug lines a server would otherwise log per request).
    let default = if cli.verbose {
        "info,onebit_tts::text::tn=debug"
    } else if long_running && !cli.quiet {
        "info"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("ONEBIT_LOG")
        .or_else(|_| tracing_subscriber::EnvFilter::try_from_env("RUST_LOG"))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default},ort=warn")));
    if matches!(cli.cmd, Cmd::Worker) {
        // Plain `LEVEL message` lines: the parent adds the time and re-logs each at its level.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_target(false)
            .with_ansi(false)
            .without_time()
            .init();
        // No other thread exists yet: the worker blocks its signals before it starts any.
        return onebit_tts::engine::worker::child::main();
    }
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colour codes only for a person at a terminal, not in a log file or a test's pipe.
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Silent>() => ExitCode::FAILURE,
        Err(e) if e.is::<ExitWith>() => {
            ExitCode::from(e.downcast_ref::<ExitWith>().map_or(1, |x| x.0))
        }
        Err(e) => {
            // One line: the chain joined, so scripts can grep it.
            let msg = e
                .chain()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": ");
            eprintln!("error: {}", msg.replace('\n', "\n       "));
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// clap checks a command's definition (duplicate argument ids, ...) only in debug builds and
    /// only when that subcommand is parsed; this checks every subcommand at once.
    #[test]
    fn every_subcommand_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
