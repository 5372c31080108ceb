//! Proof that the model is resident on the NPU, from evidence the worker process gathers about
//! itself (reference: "Residency").
//!
//! A passing request proves nothing: builds fall back to CPU silently, the provider can decline
//! the whole graph without a log line, and a load that the provider declines still opens
//! `/dev/accel/accel0` and makes successful ioctls. So neither our own list of providers nor an
//! open accel fd counts. What does:
//!
//! 1. **placement** — where ONNX Runtime itself assigned the graph's nodes
//!    (`Session_GetEpGraphAssignmentInfo`, recorded with `session.record_ep_graph_assignment_info`,
//!    see [`Placement`]); the provider must hold at least one node;
//! 2. **activity** — the device did work for this process while it decoded: the `drm-engine-*`
//!    busy time in `/proc/<pid>/fdinfo/<fd>` of the worker's accel fds grew across the decode
//!    steps ([`AccelUsage`]), or `/sys/class/accel/accel0/device/mem_usage` grew across the load
//!    (not every driver has that file).
//!
//! Residency is [`ResidencyState::Proven`] only with activity and a placement that does not refute
//! it (unknown placement, as onnxruntime-genai's loop leaves it, lets the counters decide; a
//! placement with no node on the provider refutes it); `Unproven` lists every missing piece;
//! `Failed` means the provider could not even be set up. Unknown is reported as unknown.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::accel::accel_fds;
use super::roots::SystemRoots;
use super::{NpuError, PROVIDER_NAME};

/// Reads the device-wide NPU memory use, in bytes.
pub fn read_mem_usage(roots: &SystemRoots) -> Result<u64, NpuError> {
    let path = roots.mem_usage();
    let text = fs::read_to_string(&path).map_err(|e| NpuError::io(&path, e))?;
    parse_mem_usage(&text).ok_or_else(|| NpuError::Parse {
        path,
        what: format!("no byte count in {:?}", text.trim()),
    })
}

/// The first number in the text, with an optional unit (`B`, `K`/`KB`/`KiB`, `M…`, `G…`, all
/// taken as powers of 1024). The attribute's exact format differs between driver builds; only
/// "did it grow" matters, so any consistent reading will do.
pub fn parse_mem_usage(text: &str) -> Option<u64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    parse_quantity(&text[start..])
}

/// `N [unit]` at the start of `text` (units as in [`parse_mem_usage`], plus `ns`, taken as 1).
fn parse_quantity(text: &str) -> Option<u64> {
    let text = text.trim_start();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..digits_end].parse().ok()?;
    let unit: String = text[digits_end..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" | "ns" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// Where ONNX Runtime placed a session's nodes: provider name -> count of the graph's nodes
/// assigned to it, as ONNX Runtime itself reports it (`Session_GetEpGraphAssignmentInfo`; a
/// provider that fuses nodes into one subgraph still counts each original node).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement(pub BTreeMap<String, usize>);

impl Placement {
    pub fn nodes_on(&self, provider: &str) -> usize {
        self.0.get(provider).copied().unwrap_or(0)
    }
    pub fn total(&self) -> usize {
        self.0.values().sum()
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(p, n)| format!("{p}: {n}")).collect();
        f.write_str(&parts.join(", "))
    }
}

/// One process's use of the accel device, summed over its accel fds (DRM client usage stats,
/// the kernel's drm-usage-stats format in `/proc/<pid>/fdinfo/<fd>`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccelUsage {
    /// Accel fds the process held.
    pub fds: usize,
    /// `drm-driver`, when the fdinfo names one.
    pub driver: Option<String>,
    /// `drm-engine-<name>`: busy time in ns.
    pub engine_ns: BTreeMap<String, u64>,
    /// `drm-total-*`, `drm-resident-*`, `drm-shared-*`, `drm-memory-*`: bytes.
    pub memory_bytes: BTreeMap<String, u64>,
}

impl AccelUsage {
    /// Adds one fdinfo file's text.
    pub fn add_fdinfo(&mut self, text: &str) {
        self.fds += 1;
        for line in text.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            let key = key.trim();
            if key == "drm-driver" {
                self.driver = Some(value.trim().to_owned());
            } else if let Some(engine) = key.strip_prefix("drm-engine-") {
                // drm-engine-capacity-* is a count of engines, not a time.
                if engine.starts_with("capacity-") {
                    continue;
                }
                if let Some(ns) = parse_quantity(value) {
                    *self.engine_ns.entry(engine.to_owned()).or_default() += ns;
                }
            } else if ["drm-total-", "drm-resident-", "drm-shared-", "drm-memory-"]
                .iter()
                .any(|p| key.starts_with(p))
                && let Some(bytes) = parse_quantity(value)
            {
                *self.memory_bytes.entry(key.to_owned()).or_default() += bytes;
            }
        }
    }

    pub fn busy_ns(&self) -> u64 {
        self.engine_ns.values().sum()
    }
}

/// Reads `pid`'s usage of the accel node (`None`: the process holds no accel fd).
pub fn read_accel_usage(pid: u32, roots: &SystemRoots) -> Result<Option<AccelUsage>, NpuError> {
    let fds = accel_fds(pid, roots)?;
    if fds.is_empty() {
        return Ok(None);
    }
    let mut usage = AccelUsage::default();
    let dir = roots.proc_fdinfo_dir(pid);
    for fd in fds {
        let path = dir.join(fd.to_string());
        let text = fs::read_to_string(&path).map_err(|e| NpuError::io(&path, e))?;
        usage.add_fdinfo(&text);
    }
    Ok(Some(usage))
}

/// Everything the worker observed about where its model runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evidence {
    /// ONNX Runtime's own node placement (`None`: its report was not seen).
    pub placement: Option<Placement>,
    /// The worker's accel usage before and after [`Evidence::decode_steps`] decode steps
    /// (`None`: no accel fd, or unreadable; see `notes`).
    pub accel_before: Option<AccelUsage>,
    pub accel_after: Option<AccelUsage>,
    pub decode_steps: usize,
    /// Device-wide `mem_usage` before the session was created and after the decode steps.
    pub mem_usage_before: Option<u64>,
    pub mem_usage_after: Option<u64>,
    /// Readings that failed, with why.
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResidencyState {
    Proven,
    Unproven,
    Failed,
}

impl ResidencyState {
    pub fn as_str(self) -> &'static str {
        match self {
            ResidencyState::Proven => "proven",
            ResidencyState::Unproven => "unproven",
            ResidencyState::Failed => "failed",
        }
    }
}

/// The verdict with its reasons and the evidence it was drawn from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Residency {
    pub state: ResidencyState,
    /// What proved it, or every reason it is not proven.
    pub reasons: Vec<String>,
    pub evidence: Evidence,
}

impl Residency {
    pub fn is_proven(&self) -> bool {
        self.state == ResidencyState::Proven
    }

    /// The provider could not be set up at all.
    pub fn failed(reason: impl Into<String>) -> Self {
        Residency {
            state: ResidencyState::Failed,
            reasons: vec![reason.into()],
            evidence: Evidence::default(),
        }
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "npu residency: {}: {}",
            self.state.as_str(),
            self.reasons.join("; ")
        )
    }
}

/// Weighs the evidence for `provider` (normally [`PROVIDER_NAME`]).
pub fn weigh(evidence: Evidence, provider: &str) -> Residency {
    let mut proofs = Vec::new();
    let mut missing = Vec::new();
    // Placement can refute residency (the provider declined every node) or support it; when it
    // is unknown (onnxruntime-genai's loop does not report it) the device's own counters decide.
    let placed = match &evidence.placement {
        None => {
            missing.push(
                "ONNX Runtime's node placement is unknown (this loop does not report it), so \
                 only the device's counters can show where the model runs"
                    .to_owned(),
            );
            None
        }
        Some(p) if p.nodes_on(provider) == 0 => {
            missing.push(format!(
                "ONNX Runtime placed no node on {provider} ({p}): the provider declined the graph"
            ));
            Some(false)
        }
        Some(p) => {
            proofs.push(format!(
                "ONNX Runtime placed {} of {} nodes on {provider} ({p})",
                p.nodes_on(provider),
                p.total()
            ));
            Some(true)
        }
    };
    let busy = match (&evidence.accel_before, &evidence.accel_after) {
        (Some(_), Some(a)) if a.engine_ns.is_empty() => {
            missing.push(format!(
                "the worker's accel fd reports no drm-engine-* busy time (driver {})",
                a.driver.as_deref().unwrap_or("unnamed")
            ));
            false
        }
        (Some(b), Some(a)) if a.busy_ns() > b.busy_ns() => {
            proofs.push(format!(
                "the NPU was busy {} ns for this worker over {} decode steps (drm-engine-*)",
                a.busy_ns() - b.busy_ns(),
                evidence.decode_steps
            ));
            true
        }
        (Some(b), Some(a)) => {
            missing.push(format!(
                "the NPU's busy time for this worker did not grow over {} decode steps \
                 ({} -> {} ns)",
                evidence.decode_steps,
                b.busy_ns(),
                a.busy_ns()
            ));
            false
        }
        _ => {
            missing.push("the worker holds no readable accel fd (/dev/accel/accel0)".to_owned());
            false
        }
    };
    let mem = match (evidence.mem_usage_before, evidence.mem_usage_after) {
        (Some(b), Some(a)) if a > b => {
            proofs.push(format!(
                "NPU mem_usage grew across the load and decode ({b} -> {a} bytes)"
            ));
            true
        }
        (Some(b), Some(a)) => {
            missing.push(format!(
                "NPU mem_usage did not grow across the load ({b} -> {a} bytes)"
            ));
            false
        }
        _ => {
            missing.push("NPU mem_usage is not readable (not every driver has it)".to_owned());
            false
        }
    };
    missing.extend(evidence.notes.iter().cloned());
    if placed != Some(false) && (busy || mem) {
        if placed.is_none() {
            proofs.push("node placement unknown (not reported by this loop)".to_owned());
        }
        Residency {
            state: ResidencyState::Proven,
            reasons: proofs,
            evidence,
        }
    } else {
        Residency {
            state: ResidencyState::Unproven,
            reasons: missing,
            evidence,
        }
    }
}

/// [`weigh`] for the RyzenAI provider.
pub fn weigh_npu(evidence: Evidence) -> Residency {
    weigh(evidence, PROVIDER_NAME)
}

/// Reads the accel usage of `pid`, noting a failed reading in `notes`.
pub fn sample_accel(pid: u32, roots: &SystemRoots, notes: &mut Vec<String>) -> Option<AccelUsage> {
    match read_accel_usage(pid, roots) {
        Ok(u) => u,
        Err(e) => {
            notes.push(format!("accel usage of pid {pid}: {e}"));
            None
        }
    }
}

/// Reads `mem_usage`, noting a failed reading only when the file exists (most drivers have none).
pub fn sample_mem_usage(roots: &SystemRoots, notes: &mut Vec<String>) -> Option<u64> {
    match read_mem_usage(roots) {
        Ok(v) => Some(v),
        Err(NpuError::Io { path, .. }) if !Path::new(&path).exists() => None,
        Err(e) => {
            notes.push(e.to_string());
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_usage_formats() {
        assert_eq!(parse_mem_usage("123456\n"), Some(123_456));
        assert_eq!(parse_mem_usage("  4096 B"), Some(4096));
        assert_eq!(parse_mem_usage("12 KB\n"), Some(12 * 1024));
        assert_eq!(parse_mem_usage("total: 3M"), Some(3 << 20));
        assert_eq!(parse_mem_usage("2 GiB"), Some(2 << 30));
        assert_eq!(parse_mem_usage("n/a"), None);
        assert_eq!(parse_mem_usage("5 parsecs"), None);
        assert_eq!(parse_mem_usage("99999999999999999999999"), None);
    }

    #[test]
    fn placement_display() {
        let p = placed(3, 26).expect("placement");
        assert_eq!(p.nodes_on(PROVIDER_NAME), 3);
        assert_eq!(p.total(), 29);
        assert_eq!(
            p.to_string(),
            "CPUExecutionProvider: 26, RyzenAILightExecutionProvider: 3"
        );
    }

    #[test]
    fn fdinfo_engines_and_memory() {
        let mut u = AccelUsage::default();
        u.add_fdinfo(
            "pos:\t0\nflags:\t02100002\ndrm-driver:\tamdxdna_accel_driver\ndrm-client-id:\t4\n\
             drm-engine-npu:\t123456 ns\ndrm-engine-capacity-npu:\t1\ndrm-total-memory:\t2048 KiB\n\
             drm-resident-memory:\t1 MiB\n",
        );
        u.add_fdinfo("drm-engine-npu: 4 ns\n");
        assert_eq!(u.fds, 2);
        assert_eq!(u.driver.as_deref(), Some("amdxdna_accel_driver"));
        assert_eq!(u.busy_ns(), 123_460);
        assert_eq!(u.memory_bytes["drm-total-memory"], 2048 * 1024);
        assert_eq!(u.memory_bytes["drm-resident-memory"], 1 << 20);
    }

    fn placed(npu: usize, cpu: usize) -> Option<Placement> {
        let mut m = BTreeMap::new();
        if npu > 0 {
            m.insert(PROVIDER_NAME.to_owned(), npu);
        }
        m.insert("CPUExecutionProvider".to_owned(), cpu);
        Some(Placement(m))
    }

    fn busy(ns: u64) -> Option<AccelUsage> {
        let mut u = AccelUsage::default();
        u.add_fdinfo(&format!("drm-engine-npu: {ns} ns\n"));
        Some(u)
    }

    #[test]
    fn proven_needs_placement_and_activity() {
        let r = weigh_npu(Evidence {
            placement: placed(1, 12),
            accel_before: busy(100),
            accel_after: busy(5100),
            decode_steps: 8,
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Proven, "{r}");
        assert!(r.to_string().contains("busy 5000 ns"), "{r}");
        assert!(r.to_string().contains("placed 1 of 13 nodes"), "{r}");

        // mem_usage growth alone is activity too.
        let r = weigh_npu(Evidence {
            placement: placed(2, 0),
            mem_usage_before: Some(10),
            mem_usage_after: Some(20),
            ..Evidence::default()
        });
        assert!(r.is_proven(), "{r}");
    }

    #[test]
    fn a_declined_graph_is_unproven_even_with_an_open_busy_accel_fd() {
        let r = weigh_npu(Evidence {
            placement: placed(0, 29),
            accel_before: busy(100),
            accel_after: busy(200),
            mem_usage_before: Some(1),
            mem_usage_after: Some(2),
            decode_steps: 8,
            notes: vec![],
        });
        assert_eq!(r.state, ResidencyState::Unproven);
        assert!(r.to_string().contains("declined the graph"), "{r}");
    }

    #[test]
    fn placement_without_activity_is_unproven_with_every_reason() {
        let r = weigh_npu(Evidence {
            placement: placed(3, 26),
            accel_before: busy(100),
            accel_after: busy(100),
            decode_steps: 8,
            notes: vec!["mem_usage: permission denied".into()],
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Unproven);
        let text = r.to_string();
        assert!(
            text.contains("did not grow over 8 decode steps (100 -> 100 ns)"),
            "{text}"
        );
        assert!(text.contains("mem_usage is not readable"), "{text}");
        assert!(text.contains("permission denied"), "{text}");
        let r = weigh_npu(Evidence::default());
        assert_eq!(r.state, ResidencyState::Unproven);
        assert_eq!(r.reasons.len(), 3, "{r}");
        assert!(r.reasons[0].contains("placement is unknown"));
        assert!(r.reasons[1].contains("no readable accel fd"));
    }

    #[test]
    fn unknown_placement_leaves_it_to_the_device_counters() {
        let r = weigh_npu(Evidence {
            accel_before: busy(10),
            accel_after: busy(20),
            decode_steps: 8,
            ..Evidence::default()
        });
        assert!(r.is_proven(), "{r}");
        assert!(r.to_string().contains("node placement unknown"), "{r}");
        let r = weigh_npu(Evidence {
            accel_before: busy(10),
            accel_after: busy(10),
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
    }

    #[test]
    fn json_shape() {
        let r = Residency::failed("No RyzenAI devices detected");
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["state"], "failed");
        assert_eq!(v["reasons"][0], "No RyzenAI devices detected");
        assert_eq!(v["evidence"]["placement"], serde_json::Value::Null);
    }
}
