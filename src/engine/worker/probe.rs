//! `onebit-tts npu probe`: the NPU session setup exactly as `--device npu` does it, in a worker
//! child with the NPU environment, followed by the worker's evidence run (one prefill and a few
//! decode steps), and a report of everything observed. Nothing here is assumed: a field the
//! worker could not observe is reported as unknown.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::proxy::{WorkerConfig, WorkerEngine};
use crate::engine::{CustomOpsRoute, ProviderSetup};
use crate::npu::residency::{Counters, Placement, Residency, ResidencyState};

/// Exit status of `npu probe` when residency is proven.
pub const EXIT_PROVEN: u8 = 0;
/// The session ran, but residency is not proven (the provider declined nodes, no device activity).
pub const EXIT_UNPROVEN: u8 = 2;
/// The session could not be set up (no provider library, no NPU device, unpaired runtime, ...).
pub const EXIT_SETUP_FAILED: u8 = 3;

#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    pub package: String,
    /// The worker's ONNX Runtime library, version and why that one.
    pub runtime: Option<String>,
    /// The NPU environment as the worker saw it (XILINX_XRT, LD_LIBRARY_PATH, RYZENAI_EP_PATH).
    pub worker_env: BTreeMap<String, Option<String>>,
    pub engine: Option<String>,
    pub provider_setup: Option<ProviderSetup>,
    pub placement: Option<Placement>,
    /// The amdxdna hardware-context counters across the evidence run, for this worker.
    pub npu_counters: CounterSummary,
    pub residency: Residency,
    /// Whether the worker refused fork and exec once its session existed (`None`: not reported).
    pub fork_guard: Option<String>,
    /// The worker's last log lines when the setup failed.
    pub log_tail: Option<String>,
}

/// What the driver's hardware-context counters said across the evidence run.
#[derive(Debug, Clone, Serialize)]
pub struct CounterSummary {
    /// `read`, `unavailable`, `failed` or `not_read`.
    pub state: &'static str,
    /// Why not read.
    pub reason: Option<String>,
    /// The driver (`DRM_IOCTL_VERSION`) and the query that answered.
    pub driver: Option<String>,
    pub query: Option<String>,
    /// The worker's pid as the driver records it (its own where no context was identified).
    pub pid: Option<i64>,
    /// The worker's hardware contexts, those created with its session (`None`: none
    /// identified).
    pub context_ids: Option<Vec<u32>>,
    /// Hardware contexts on the device (every process's), after the run.
    pub contexts: Option<usize>,
    /// This worker's completed commands before and after the evidence decode steps (`None`: it
    /// had no hardware context).
    pub completions_before: Option<u64>,
    pub completions_after: Option<u64>,
}

impl CounterSummary {
    pub fn of(r: &Residency) -> Self {
        let e = &r.evidence;
        let mut c = CounterSummary {
            state: "not_read",
            reason: None,
            driver: None,
            query: None,
            pid: None,
            context_ids: None,
            contexts: None,
            completions_before: None,
            completions_after: None,
        };
        match (&e.counters_before, &e.counters_after) {
            (Some(Counters::Read(b)), Some(Counters::Read(a))) => {
                c.state = "read";
                c.driver = Some(a.driver.to_string());
                c.query = Some(a.query.to_string());
                c.pid = Some(r.ours.as_ref().map_or(e.pid, |o| o.pid));
                c.contexts = Some(a.contexts.len());
                if let Some(o) = &r.ours {
                    c.context_ids = Some(o.context_ids.clone());
                    c.completions_before = b.completions_of(o);
                    c.completions_after = a.completions_of(o);
                }
            }
            (Some(Counters::Failed { reason }), _) | (_, Some(Counters::Failed { reason })) => {
                c.state = "failed";
                c.reason = Some(reason.clone());
            }
            (Some(Counters::Unavailable { reason }), _)
            | (_, Some(Counters::Unavailable { reason })) => {
                c.state = "unavailable";
                c.reason = Some(reason.clone());
            }
            _ if r.state == ResidencyState::Failed => {
                c.reason = Some(format!(
                    "no NPU work ran: the provider could not be set up ({})",
                    r.reasons.join("; ")
                ));
            }
            _ => {}
        }
        c
    }

    fn text(&self) -> String {
        match self.state {
            "read" => format!(
                "{} on {}: {} contexts; this worker (pid {}, contexts {}): completions {} -> {}",
                self.query.as_deref().unwrap_or("?"),
                self.driver.as_deref().unwrap_or("?"),
                self.contexts.unwrap_or(0),
                self.pid.unwrap_or(0),
                self.context_ids
                    .as_ref()
                    .map_or_else(|| "none identified".to_owned(), |ids| format!("{ids:?}")),
                self.completions_before
                    .map_or_else(|| "no context".to_owned(), |n| n.to_string()),
                self.completions_after
                    .map_or_else(|| "no context".to_owned(), |n| n.to_string()),
            ),
            "not_read" => match &self.reason {
                Some(why) => format!("unknown (not read: {why})"),
                None => "unknown (not read)".to_owned(),
            },
            state => format!("{state}: {}", self.reason.as_deref().unwrap_or("?")),
        }
    }
}

impl ProbeReport {
    pub fn exit_code(&self) -> u8 {
        match self.residency.state {
            ResidencyState::Proven => EXIT_PROVEN,
            ResidencyState::Unproven => EXIT_UNPROVEN,
            ResidencyState::Failed => EXIT_SETUP_FAILED,
        }
    }

    /// The human-readable report.
    pub fn text(&self) -> String {
        let unknown = || "unknown".to_owned();
        let mut s = format!("npu probe: {}\n", self.package);
        let mut line = |k: &str, v: String| {
            let _ = writeln!(s, "  {k:<18} {v}");
        };
        line("ONNX Runtime", self.runtime.clone().unwrap_or_else(unknown));
        for (k, v) in &self.worker_env {
            line(k, v.clone().unwrap_or_else(|| "(unset)".into()));
        }
        match &self.provider_setup {
            Some(p) => {
                line(
                    "provider library",
                    format!("{} ({})", p.library.display(), p.library_source),
                );
                let devices: Vec<String> = p
                    .ep_devices
                    .iter()
                    .map(|d| format!("{}/{} ({})", d.ep, d.hardware, d.ep_vendor))
                    .collect();
                line("EP devices", devices.join(", "));
                line("NPU devices used", p.npu_devices.to_string());
                line("provider options", kv(&p.options));
                line("config entries", kv(&p.config_entries));
                line(
                    "custom ops",
                    match &p.custom_ops {
                        CustomOpsRoute::Library { path } => {
                            format!("RegisterCustomOpsLibrary_V2({})", path.display())
                        }
                        CustomOpsRoute::Function { name } => {
                            format!("RegisterCustomOpsUsingFunction({name})")
                        }
                    },
                );
                line(
                    "strict",
                    if p.strict {
                        "session.disable_cpu_ep_fallback=1".into()
                    } else {
                        "off (declined nodes run on the CPU)".into()
                    },
                );
            }
            None => line("provider setup", unknown()),
        }
        line("engine", self.engine.clone().unwrap_or_else(unknown));
        line(
            "node placement",
            self.placement
                .as_ref()
                .map_or_else(unknown, ToString::to_string),
        );
        line("NPU counters", self.npu_counters.text());
        line("fork/exec", self.fork_guard.clone().unwrap_or_else(unknown));
        line("residency", self.residency.state.as_str().to_owned());
        for r in &self.residency.reasons {
            let _ = writeln!(s, "    - {r}");
        }
        if let Some(tail) = &self.log_tail {
            let _ = writeln!(s, "  worker log (last lines):");
            for l in tail.lines() {
                let _ = writeln!(s, "    {l}");
            }
        }
        s
    }
}

fn kv(m: &BTreeMap<String, String>) -> String {
    if m.is_empty() {
        return "(none)".into();
    }
    m.iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Starts a worker on `cfg` (its device must be the NPU), lets it load and run its evidence run,
/// reports, and stops it.
pub fn probe(cfg: WorkerConfig) -> ProbeReport {
    let package = cfg.package_dir.display().to_string();
    let mut worker = WorkerEngine::new(cfg);
    let started = worker.start();
    let h = worker.handle();
    let hello = h.hello();
    let loaded = h.loaded();
    let residency = match (&started, loaded.as_ref().and_then(|l| l.residency.clone())) {
        (Err(e), _) => Residency::failed(e.to_string()),
        (Ok(()), Some(r)) => r,
        (Ok(()), None) => Residency::failed("the worker reported no residency evidence"),
    };
    let report = ProbeReport {
        package,
        runtime: loaded.as_ref().and_then(|l| l.runtime.clone()),
        worker_env: hello.map(|h| h.env).unwrap_or_default(),
        engine: loaded.as_ref().map(|l| l.engine.clone()),
        provider_setup: loaded.as_ref().and_then(|l| l.provider_setup.clone()),
        placement: loaded.as_ref().and_then(|l| l.placement.clone()),
        npu_counters: CounterSummary::of(&residency),
        residency,
        fork_guard: loaded.as_ref().and_then(|l| l.fork_guard.clone()),
        log_tail: started.as_ref().err().map(|_| last_lines(&h.log_tail(), 8)),
    };
    let _ = worker.shutdown();
    report
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
