//! `bench --engine-only`: the backbone alone at fixed prompt lengths, and with `--peers` the
//! peers' own generation loops (onnxruntime-genai, llama.cpp) on the same prompts, each run by a
//! script of benches/peers/ in its own process (stdin/stdout JSON, see benches/peers/oga_bench.py).
//! The vendor's whole streaming pipeline (`super::vendor`) runs on the same `Peer` machinery.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::engine::{Candidates, EngineError};
use crate::synth::{EngineKind, FrontEnd, SynthConfig, device_label, load_engine, resolve_dir};

use super::{EngineRun, Stat, engine_only, files_mb, machine, peak_rss_mb, synthetic_prompt};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Load(#[from] crate::Error),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Synth(#[from] crate::synth::SynthError),
    #[error(transparent)]
    Voice(#[from] crate::voice::VoiceError),
    #[error("voice {0:?} has no file a peer could read its codes and transcript from")]
    VoiceFile(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("the {peer} peer needs {what} ({setup})")]
    PeerMissing {
        peer: &'static str,
        what: String,
        setup: &'static str,
    },
    #[error("--llama-gguf {}: no such file; make the llama.cpp peer's model with: {howto} [--out FILE]", .path.display())]
    NoGguf { path: PathBuf, howto: String },
    #[error("the {peer} peer ({} {}): {source}", .python.display(), .script.display())]
    PeerIo {
        peer: &'static str,
        python: PathBuf,
        script: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the {peer} peer failed ({status}) on {}; its messages are above (setup: {setup})",
        .model.display()
    )]
    PeerFailed {
        peer: &'static str,
        status: std::process::ExitStatus,
        model: PathBuf,
        setup: &'static str,
    },
    #[error("the {peer} peer's output: {msg}")]
    PeerOutput { peer: &'static str, msg: String },
    #[error(
        "--also-model {}: its tokenizer's speech vocabulary differs from {}'s, so the same prompt ids would mean other tokens; compare packages of one model",
        .also.display(), .main.display()
    )]
    OtherVocabulary { also: PathBuf, main: PathBuf },
    #[error("the {peer} peer answered {got} of {want} {what}")]
    PeerShort {
        peer: &'static str,
        got: usize,
        want: usize,
        /// What it was asked for: prompts, cases.
        what: &'static str,
    },
}

/// What `bench --engine-only` runs.
#[derive(Debug, Clone)]
pub struct EngineBench {
    pub prompt_lens: Vec<usize>,
    pub new_tokens: usize,
    pub runs: usize,
    /// Run the peers too.
    pub peers: bool,
    /// The package the peers run (default: the bench's).
    pub peer_model: Option<PathBuf>,
    /// The llama.cpp peer's GGUF (default: PEER_MODEL-q4_0.gguf beside the peer package).
    pub llama_gguf: Option<PathBuf>,
    /// Threads the peers are given (the bench's --threads).
    pub peer_threads: Option<usize>,
    /// More packages our loop runs on the same prompts, each with the engine its format takes.
    pub also: Vec<PathBuf>,
}

/// Our loop on one package: the engine that ran and its measurements.
#[derive(Debug, Clone)]
pub struct OurEngine {
    /// The engine's `--engine` name (`ort`, `llama`, `oga`; `#2`... on a repeat).
    pub label: String,
    pub engine: String,
    /// As observed: an unproven NPU load is "cpu fallback", never "npu".
    pub device: String,
    pub runs: Vec<EngineRun>,
    pub model_files_mb: f64,
}

/// The engine-only report: ours per prompt length, and each peer's.
#[derive(Debug, Clone)]
pub struct EngineReport {
    pub engine: String,
    /// As observed: an unproven NPU load is "cpu fallback", never "npu".
    pub device: String,
    pub residency: Option<crate::npu::Residency>,
    pub machine: String,
    pub ours: Vec<EngineRun>,
    /// The `--engine` name of the first engine (the table names engines by it with `also`).
    pub label: String,
    /// Our loop on the `--also-model` packages, in their order.
    pub also: Vec<OurEngine>,
    pub peers: Vec<PeerRun>,
    /// Why the llama.cpp peer did not run, when it was not asked for by path and is not there.
    pub llama_note: Option<String>,
    /// This process's peak: the engines ran one after another, each dropped before the next.
    pub peak_rss_mb: f64,
    pub model_files_mb: f64,
    pub new_tokens: usize,
    pub runs: usize,
}

/// The text every engine-only prompt starts from (the vendor's example sentence, phonemized).
pub(crate) const PROMPT_TEXT: &str =
    "user: Convert the text to speech: ðə kwˈɪk bɹˈaʊn fˈɑːks dʒˈʌmps ˌoʊvɚ ðə lˈeɪzi dˈɑːɡ.";

/// Loads the engine a config asks for and measures it (and the peers) on synthetic prompts of
/// the lengths that fit the package's budget.
pub fn run_engine_bench(
    cfg: &SynthConfig,
    opts: &EngineBench,
    progress: &mut dyn FnMut(&str, usize, usize),
) -> Result<EngineReport, BenchError> {
    let front = FrontEnd::load(cfg)?;
    let pkg = front.package();
    // Every package is read, and its engine loaded once, before any engine runs: one that does
    // not load, or holds fewer positions than the prompt lengths need, is refused up front.
    let mut budget = usize::MAX;
    let mut others = Vec::with_capacity(opts.also.len());
    for dir in &opts.also {
        let mut c = cfg.clone();
        c.package_dir = resolve_dir(dir);
        c.engine = EngineKind::Auto;
        let f = FrontEnd::load(&c)?;
        if f.package().vocab != pkg.vocab {
            return Err(BenchError::OtherVocabulary {
                also: f.package().dir.clone(),
                main: pkg.dir.clone(),
            });
        }
        let probe = load_engine(&c, f.package())?;
        budget = budget.min(
            probe
                .budget()
                .unwrap_or_else(|| f.package().genai.token_budget()),
        );
        drop(probe);
        others.push((c, f));
    }
    let engine = load_engine(cfg, pkg)?;
    budget = budget.min(engine.budget().unwrap_or_else(|| pkg.genai.token_budget()));
    let candidates = Candidates::of(pkg);
    let text_ids: Vec<u32> = pkg
        .tokenizer
        .encode(PROMPT_TEXT, false)
        .map_err(|e| BenchError::Tokenizer(e.to_string()))?
        .get_ids()
        .to_vec();
    let lens: Vec<usize> = opts
        .prompt_lens
        .iter()
        .copied()
        .filter(|&n| n + opts.new_tokens <= budget)
        .collect();
    let mut labels: Vec<String> = Vec::new();
    let mut label_of = |kind: EngineKind| {
        let name = kind.name();
        let n = labels
            .iter()
            .filter(|l| l.split('#').next() == Some(name))
            .count();
        let label = if n == 0 {
            name.to_owned()
        } else {
            format!("{name}#{}", n + 1)
        };
        labels.push(label.clone());
        label
    };
    let mut measure = |mut engine: Box<dyn crate::engine::Engine>,
                       cfg: &SynthConfig,
                       pkg: &crate::package::ModelPackage,
                       progress: &mut dyn FnMut(&str, usize, usize)|
     -> Result<(OurEngine, Option<crate::npu::Residency>), BenchError> {
        let label = label_of(cfg.engine.resolve(pkg.format));
        let runs = engine_only(
            engine.as_mut(),
            &candidates,
            &text_ids,
            &lens,
            opts.new_tokens,
            opts.runs,
            progress,
        )?;
        let residency = engine.worker().and_then(|w| w.residency());
        let ours = OurEngine {
            label,
            engine: engine.describe(),
            device: device_label(engine.device(), residency.as_ref()),
            runs,
            model_files_mb: files_mb(&pkg.dir),
        };
        Ok((ours, residency))
    };
    let (first, residency) = measure(engine, cfg, pkg, progress)?;
    let mut also = Vec::with_capacity(others.len());
    for (c, f) in &others {
        let engine = load_engine(c, f.package())?;
        also.push(measure(engine, c, f.package(), progress)?.0);
    }
    let mut peers: Vec<PeerRun> = Vec::new();
    let mut llama_note = None;
    if opts.peers {
        let peer_dir = peer_dir(opts.peer_model.as_deref(), &pkg.dir);
        let prompts: Vec<Vec<u32>> = lens
            .iter()
            .map(|&n| synthetic_prompt(&candidates, &text_ids, n))
            .collect();
        let total = lens.len() * (opts.runs + 1);
        progress("onnxruntime-genai (peer) on the same prompts", total, total);
        peers.push(run_peer(
            &Peer::oga(&peer_dir)?,
            &prompts,
            opts.new_tokens,
            opts.runs,
            opts.peer_threads,
        )?);
        match Peer::llama(opts.llama_gguf.as_deref(), &peer_dir)? {
            Ok(llama) => {
                progress("llama.cpp (peer) on the same prompts", total, total);
                peers.push(run_peer(
                    &llama,
                    &prompts,
                    opts.new_tokens,
                    opts.runs,
                    opts.peer_threads,
                )?);
            }
            Err(note) => llama_note = Some(note),
        }
    }
    Ok(EngineReport {
        engine: first.engine,
        device: first.device,
        residency,
        machine: machine(),
        ours: first.runs,
        label: first.label,
        also,
        peers,
        llama_note,
        peak_rss_mb: peak_rss_mb(),
        model_files_mb: first.model_files_mb,
        new_tokens: opts.new_tokens,
        runs: opts.runs,
    })
}

impl EngineReport {
    /// How many of each peer's greedy tokens equal ours from the start, per prompt length.
    fn agreement(&self, peer: &PeerRun) -> Vec<usize> {
        self.ours
            .iter()
            .zip(&peer.per_prompt)
            .map(|(o, r)| leading_agreement(&o.last_ids, &r.tokens))
            .collect()
    }

    /// How many of another engine's greedy tokens equal the first engine's, per prompt length.
    fn agreement_with_first(&self, other: &OurEngine) -> Vec<usize> {
        self.ours
            .iter()
            .zip(&other.runs)
            .map(|(o, r)| leading_agreement(&o.last_ids, &r.last_ids))
            .collect()
    }

    /// The JSON report. "onnxruntime_genai" / "llama_cpp": [prefill ms, decode tok/s] per
    /// prompt length; "peers": who ran, on what, and how far its greedy tokens agree with ours;
    /// "also": our loop on the --also-model packages, with their agreement with the first.
    pub fn to_json(&self) -> serde_json::Value {
        let pairs = |key: &str| {
            self.peers.iter().find(|p| p.key == key).map(|p| {
                p.per_prompt
                    .iter()
                    .map(|r| (r.prefill_ms, r.decode_tok_per_s))
                    .collect::<Vec<_>>()
            })
        };
        let about: serde_json::Map<String, serde_json::Value> = self
            .peers
            .iter()
            .map(|p| {
                (
                    p.key.to_owned(),
                    serde_json::json!({"version": p.version, "model": p.model,
                        "settings": p.settings, "greedy_agreement": self.agreement(p)}),
                )
            })
            .collect();
        let also: Vec<serde_json::Value> = self
            .also
            .iter()
            .map(|a| {
                serde_json::json!({"label": a.label, "engine": a.engine, "device": a.device,
                    "ours": a.runs, "model_files_mb": a.model_files_mb,
                    "greedy_agreement": self.agreement_with_first(a)})
            })
            .collect();
        serde_json::json!({"engine": self.engine, "device": self.device,
            "residency": self.residency, "machine": self.machine, "ours": self.ours,
            "label": self.label, "also": also,
            "onnxruntime_genai": pairs("onnxruntime_genai"), "llama_cpp": pairs("llama_cpp"),
            "peers": about, "llama_cpp_note": self.llama_note,
            "peak_rss_mb": self.peak_rss_mb, "model_files_mb": self.model_files_mb})
    }

    /// The table `bench --engine-only` prints. With --also-model, a row per engine and prompt
    /// length, the engines named by their `--engine` names.
    pub fn table(&self) -> String {
        let multi = !self.also.is_empty();
        let mut s = if multi {
            let mut s = String::new();
            for (label, engine, device) in
                std::iter::once((&self.label, &self.engine, &self.device))
                    .chain(self.also.iter().map(|a| (&a.label, &a.engine, &a.device)))
            {
                s.push_str(&format!(
                    "engine {label}: {engine}\ndevice {label}: {device}\n"
                ));
            }
            s.push_str(&format!("machine {}\n\n", self.machine));
            s
        } else {
            format!(
                "engine {}\ndevice {}\nmachine {}\n\n",
                self.engine, self.device, self.machine
            )
        };
        // Stat's Display ignores width, so each cell is formatted first, then padded.
        let cell = |st: Stat, p: usize| format!("{:.p$} ± {:.p$}", st.median, st.half_range);
        let mut head: Vec<String> = Vec::new();
        if multi {
            head.push("engine".into());
        }
        head.extend(["prompt", "prefill ms", "prefill tok/s", "decode codes/s"].map(String::from));
        if multi {
            head.push(format!("x {}", self.label));
        }
        for p in &self.peers {
            head.push(format!("{} decode tok/s", p.label));
            head.push(format!("x {}", p.short));
            head.push(format!("prefill x {}", p.short));
        }
        let mut rows = vec![head];
        let engines = std::iter::once((&self.label, &self.ours))
            .chain(self.also.iter().map(|a| (&a.label, &a.runs)));
        for (label, runs) in engines {
            for (i, r) in runs.iter().enumerate() {
                let mut row = Vec::new();
                if multi {
                    row.push(label.clone());
                }
                row.extend([
                    r.prompt_tokens.to_string(),
                    cell(r.prefill_ms, 1),
                    cell(r.prefill_tok_per_s, 0),
                    cell(r.decode_codes_per_s, 1),
                ]);
                // Every engine and peer measured every length (or the bench failed); a missing
                // cell still prints as one rather than panicking.
                if multi {
                    row.push(self.ours.get(i).map_or_else(
                        || "-".to_owned(),
                        |o| {
                            format!(
                                "{:.2}",
                                r.decode_codes_per_s.median / o.decode_codes_per_s.median
                            )
                        },
                    ));
                }
                for p in &self.peers {
                    match p.per_prompt.get(i) {
                        Some(pr) => {
                            row.push(format!("{:.1}", pr.decode_tok_per_s.median));
                            row.push(format!(
                                "{:.2}",
                                r.decode_codes_per_s.median / pr.decode_tok_per_s.median
                            ));
                            row.push(format!("{:.2}", pr.prefill_ms.median / r.prefill_ms.median));
                        }
                        None => row.extend(std::iter::repeat_n("-".to_owned(), 3)),
                    }
                }
                rows.push(row);
            }
        }
        s.push_str(&super::columns(&rows, 0));
        let files = if multi {
            let each: Vec<String> = std::iter::once((&self.label, self.model_files_mb))
                .chain(self.also.iter().map(|a| (&a.label, a.model_files_mb)))
                .map(|(l, mb)| format!("{l} {mb:.0} MiB"))
                .collect();
            format!("model files: {}", each.join(", "))
        } else {
            format!("model files {:.0} MiB", self.model_files_mb)
        };
        s.push_str(&format!(
            "\npeak RSS {:.0} MiB (this process{}; each peer runs in its own); {files}; {} new codes per run, median ± half-range of {} runs\n",
            self.peak_rss_mb,
            if multi { ", the engines one after another" } else { "" },
            self.new_tokens,
            self.runs
        ));
        // "agreed/ours" per prompt length, for one agreement line.
        let fractions = |agreed: Vec<usize>| -> Vec<String> {
            agreed
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    let of = self.ours.get(i).map_or(0, |o| o.last_ids.len());
                    format!("{n}/{of}")
                })
                .collect()
        };
        for a in &self.also {
            let agree = fractions(self.agreement_with_first(a));
            s.push_str(&format!(
                "{}: greedy tokens equal to {}'s from the start: {}\n",
                a.label,
                self.label,
                agree.join(", ")
            ));
        }
        for p in &self.peers {
            let agree = fractions(self.agreement(p));
            s.push_str(&format!(
                "{}: {} on {}; greedy tokens equal to {} from the start: {}\n",
                p.label,
                p.version,
                p.model.display(),
                if multi {
                    format!("{}'s", self.label)
                } else {
                    "ours".to_owned()
                },
                agree.join(", ")
            ));
        }
        if let Some(note) = &self.llama_note {
            s.push_str(note);
            s.push('\n');
        }
        s
    }
}

/// The package the peers run: `--peer-model`, else the bench's own (`main`). Its name also gives
/// the llama.cpp peers' default GGUF ([`peer_gguf`]).
pub fn peer_dir(peer_model: Option<&Path>, main: &Path) -> PathBuf {
    peer_model.map_or_else(|| main.to_path_buf(), resolve_dir)
}

/// The command that makes the llama.cpp peer's model from a package.
fn llama_howto(peer_dir: &Path) -> String {
    format!(
        "scripts/setup-llama-peer.sh && .onebit/venv/bin/python tools/onnx_to_gguf.py {}",
        peer_dir.display()
    )
}

/// A peer: its own loop (or whole pipeline), run by a script of benches/peers/ in its own process.
pub(super) struct Peer {
    /// Key in the JSON report.
    pub(super) key: &'static str,
    /// Name in the table and messages.
    pub(super) label: &'static str,
    /// Ratio column suffix (`x oga`).
    pub(super) short: &'static str,
    pub(super) python: PathBuf,
    /// Relative to the checkout (resolved like a model directory).
    pub(super) script: PathBuf,
    pub(super) model: PathBuf,
    /// How to install what the peer needs, for error messages.
    pub(super) setup: &'static str,
}

/// The Python a peer's setup script made (`rel` under a `.onebit` home), else what is missing and
/// the script that makes it.
pub(super) fn peer_python(
    rel: &str,
    peer: &'static str,
    what: impl FnOnce() -> String,
    setup: &'static str,
) -> Result<PathBuf, BenchError> {
    crate::paths::in_homes(rel)
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| BenchError::PeerMissing {
            peer,
            what: what(),
            setup,
        })
}

/// A llama.cpp peer's GGUF: `gguf`, else `PEER_DIR-q4_0.gguf` beside the peer package (what
/// tools/onnx_to_gguf.py writes by default). `Ok(Err(note))` when no GGUF was asked for and none
/// is there: the bench runs without `who` and prints the note.
pub(super) fn peer_gguf(
    gguf: Option<&Path>,
    peer_dir: &Path,
    who: &str,
) -> Result<Result<PathBuf, String>, BenchError> {
    let howto = llama_howto(peer_dir);
    match gguf {
        Some(p) => {
            let p = resolve_dir(p);
            if !p.is_file() {
                return Err(BenchError::NoGguf { path: p, howto });
            }
            Ok(Ok(p))
        }
        None => {
            let name = peer_dir
                .file_name()
                .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
            let p = peer_dir.with_file_name(format!("{name}-q4_0.gguf"));
            if !p.is_file() {
                return Ok(Err(format!(
                    "{who} not run: no {} (and no --llama-gguf); to add it: {howto}",
                    p.display()
                )));
            }
            Ok(Ok(p))
        }
    }
}

impl Peer {
    /// onnxruntime-genai's greedy loop on an onnxruntime-genai package.
    fn oga(dir: &Path) -> Result<Self, BenchError> {
        let python = peer_python(
            "venv/bin/python",
            "onnxruntime-genai",
            || ".onebit/venv".into(),
            "scripts/setup.sh",
        )?;
        Ok(Self {
            key: "onnxruntime_genai",
            label: "oga",
            short: "oga",
            python,
            script: "benches/peers/oga_bench.py".into(),
            model: dir.to_path_buf(),
            setup: "scripts/setup.sh",
        })
    }

    /// llama.cpp's loop on a Q4_0 GGUF ([`peer_gguf`]). `Ok(Err(note))` when no GGUF was asked
    /// for and none is there.
    fn llama(gguf: Option<&Path>, peer_dir: &Path) -> Result<Result<Self, String>, BenchError> {
        let model = match peer_gguf(gguf, peer_dir, "llama.cpp peer")? {
            Ok(p) => p,
            Err(note) => return Ok(Err(note)),
        };
        let python = peer_python(
            "llama/venv/bin/python",
            "llama.cpp",
            || format!("llama.cpp built into .onebit/llama for {}", model.display()),
            "scripts/setup-llama-peer.sh",
        )?;
        Ok(Ok(Self {
            key: "llama_cpp",
            label: "llama.cpp",
            short: "llama",
            python,
            script: "benches/peers/llama_bench.py".into(),
            model,
            setup: "scripts/setup-llama-peer.sh",
        }))
    }
}

impl Peer {
    /// Runs the peer's script with `args`, `stdin` written to it (else none), and returns what it
    /// printed on stdout; its stderr is the terminal's, so a failure's messages are already above.
    pub(super) fn run(
        &self,
        args: &[std::ffi::OsString],
        stdin: Option<&[u8]>,
    ) -> Result<Vec<u8>, BenchError> {
        use std::io::Write as _;
        use std::process::Stdio;
        let script = resolve_dir(&self.script);
        let io = |source: std::io::Error| BenchError::PeerIo {
            peer: self.label,
            python: self.python.clone(),
            script: script.clone(),
            source,
        };
        let mut child = std::process::Command::new(&self.python)
            .arg(&script)
            .args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .spawn()
            .map_err(io)?;
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(bytes).map_err(io)?;
        }
        let out = child.wait_with_output().map_err(io)?;
        if !out.status.success() {
            return Err(BenchError::PeerFailed {
                peer: self.label,
                status: out.status,
                model: self.model.clone(),
                setup: self.setup,
            });
        }
        Ok(out.stdout)
    }
}

/// One peer's measurements, per prompt length.
#[derive(Debug, Clone)]
pub struct PeerRun {
    pub key: &'static str,
    pub label: &'static str,
    pub short: &'static str,
    pub model: PathBuf,
    pub version: String,
    pub settings: serde_json::Value,
    pub per_prompt: Vec<PeerResult>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PeerResult {
    pub prefill_ms: Stat,
    pub decode_tok_per_s: Stat,
    /// The new ids of the peer's last run (empty when its script does not say).
    pub tokens: Vec<u32>,
}

/// Runs a peer's script on the prompts: exactly `new_tokens` greedy tokens, one warm-up and
/// `runs` measured runs per prompt.
fn run_peer(
    peer: &Peer,
    prompts: &[Vec<u32>],
    new_tokens: usize,
    runs: usize,
    threads: Option<usize>,
) -> Result<PeerRun, BenchError> {
    let output = |msg: String| BenchError::PeerOutput {
        peer: peer.label,
        msg,
    };
    let req = serde_json::json!({"model": peer.model, "prompts": prompts, "new_tokens": new_tokens,
        "runs": runs, "threads": threads});
    let stdout = peer.run(&[], Some(req.to_string().as_bytes()))?;
    let v: serde_json::Value =
        serde_json::from_slice(&stdout).map_err(|e| output(format!("not JSON: {e}")))?;
    let results = v["results"]
        .as_array()
        .ok_or_else(|| output("no results".into()))?;
    if results.len() != prompts.len() {
        return Err(BenchError::PeerShort {
            peer: peer.label,
            got: results.len(),
            want: prompts.len(),
            what: "prompts",
        });
    }
    let per_prompt = results
        .iter()
        .map(|r| {
            let f = |k: &str| -> Vec<f64> {
                r[k].as_array()
                    .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
                    .unwrap_or_default()
            };
            PeerResult {
                prefill_ms: Stat::of(&f("prefill_s").iter().map(|s| s * 1e3).collect::<Vec<_>>()),
                decode_tok_per_s: Stat::of(&f("decode_tok_per_s")),
                tokens: r["tokens"]
                    .as_array()
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_u64().map(|t| t as u32))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    Ok(PeerRun {
        key: peer.key,
        label: peer.label,
        short: peer.short,
        model: peer.model.clone(),
        version: v["version"].as_str().unwrap_or("?").to_owned(),
        settings: v["settings"].clone(),
        per_prompt,
    })
}

/// How many tokens two greedy runs share from the start.
pub(super) fn leading_agreement(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leading_agreement_counts_the_common_start() {
        assert_eq!(leading_agreement(&[1, 2, 3], &[1, 2, 3]), 3);
        assert_eq!(leading_agreement(&[1, 2, 3], &[1, 9, 3]), 1);
        assert_eq!(leading_agreement(&[1, 2, 3], &[]), 0);
        assert_eq!(leading_agreement(&[1, 2], &[1, 2, 3]), 2);
    }

    #[test]
    fn llama_peer_default_gguf_sits_beside_the_package() {
        let dir = std::env::temp_dir().join(format!("onebit-llama-peer-{}", std::process::id()));
        let pkg = dir.join("pkg");
        std::fs::create_dir_all(&pkg).unwrap();
        // No GGUF asked for and none there: a note on how to make it, not an error.
        let slash = PathBuf::from(format!("{}/", pkg.display()));
        for p in [&pkg, &slash] {
            match Peer::llama(None, p).unwrap() {
                Err(note) => {
                    assert!(
                        note.contains(&dir.join("pkg-q4_0.gguf").display().to_string()),
                        "{note}"
                    );
                    assert!(note.contains("scripts/setup-llama-peer.sh"), "{note}");
                    assert!(note.contains("tools/onnx_to_gguf.py"), "{note}");
                }
                Ok(_) => panic!("no GGUF exists"),
            }
        }
        // A GGUF asked for that is not there: an error saying how to make it.
        let e = Peer::llama(Some(&dir.join("missing.gguf")), &pkg)
            .err()
            .expect("missing --llama-gguf is an error")
            .to_string();
        assert!(
            e.contains("missing.gguf") && e.contains("scripts/setup-llama-peer.sh"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn run_peer_reads_the_peer_contract_and_reports_failures() {
        let dir = std::env::temp_dir().join(format!("onebit-run-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ok = dir.join("ok.sh");
        std::fs::write(
            &ok,
            r#"cat > /dev/null
echo '{"version": "fake 1", "settings": {"threads": 2}, "results": [
 {"prompt_tokens": 3, "prefill_s": [0.5, 0.25, 0.75], "decode_tok_per_s": [10, 30, 20], "tokens": [7, 8]},
 {"prompt_tokens": 5, "prefill_s": [1.0], "decode_tok_per_s": [5]}]}'
"#,
        )
        .unwrap();
        let peer = |script: &Path| Peer {
            key: "fake",
            label: "fake",
            short: "fake",
            python: PathBuf::from("/bin/sh"),
            script: script.to_path_buf(),
            model: dir.clone(),
            setup: "nothing",
        };
        let prompts = vec![vec![1, 2, 3], vec![1, 2, 3, 4, 5]];
        let r = run_peer(&peer(&ok), &prompts, 2, 3, None).unwrap();
        assert_eq!(r.version, "fake 1");
        assert_eq!(r.settings["threads"], 2);
        assert_eq!(r.per_prompt.len(), 2);
        assert_eq!(r.per_prompt[0].prefill_ms.median, 500.0);
        assert_eq!(r.per_prompt[0].decode_tok_per_s.median, 20.0);
        assert_eq!(r.per_prompt[0].tokens, vec![7, 8]);
        assert!(r.per_prompt[1].tokens.is_empty());
        // one prompt short: refused
        let three = vec![vec![1], vec![2], vec![3]];
        let e = run_peer(&peer(&ok), &three, 2, 3, None).err().unwrap();
        assert!(e.to_string().contains("answered 2 of 3"), "{e}");
        // a failing script: its exit status and the setup hint
        let bad = dir.join("bad.sh");
        std::fs::write(&bad, "cat > /dev/null; echo boom >&2; exit 3\n").unwrap();
        let e = run_peer(&peer(&bad), &prompts, 2, 3, None).err().unwrap();
        assert!(
            e.to_string().contains("fake peer failed") && e.to_string().contains("nothing"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
