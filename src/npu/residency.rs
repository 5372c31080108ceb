//! Proof that the model is resident on the NPU, from evidence the worker process gathers about
//! itself (reference: "Residency").
//!
//! A passing request proves nothing: builds fall back to CPU silently, the provider can decline
//! the whole graph without a log line, and a load that the provider declines still opens
//! `/dev/accel/accel0` and makes successful ioctls. So neither our own list of providers nor an
//! open accel fd counts. What does:
//!
//! 1. **activity** — the device did work for this process while it decoded: the NPU completed
//!    commands for a hardware context owned by the worker's pid across the evidence decode steps
//!    (the amdxdna driver's own counters, [`super::xdna`]; every mainline driver has them), or,
//!    where a driver prints it, the `drm-engine-*` busy time in the worker's accel fdinfo grew
//!    ([`AccelUsage`]);
//! 2. **placement** — where ONNX Runtime itself assigned the graph's nodes
//!    (`Session_GetEpGraphAssignmentInfo`), weighed by the weights (initializer bytes) those
//!    nodes consume ([`Placement`]): the provider must hold most of the model's weights, so one
//!    trivial node it claimed does not count. Unknown placement (onnxruntime-genai's loop does
//!    not report it) leaves the verdict to the device's counters.
//!
//! Memory counters (fdinfo `drm-*-memory`, the device-wide `mem_usage`) are reported as
//! supporting detail and never prove anything: they are device-wide or move for a load the
//! provider then declines. Residency is [`ResidencyState::Proven`] only with activity and a
//! placement that does not refute it; `Unproven` lists every missing piece; `Failed` means the
//! provider could not even be set up. Unknown is reported as unknown.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};

use serde::{Deserialize, Serialize};

use super::accel::accel_fds;
use super::roots::SystemRoots;
use super::xdna::{self, HwContexts, Ours};
use super::{NpuError, PROVIDER_NAME};

/// The share of the model's weights the provider must hold for its placement to count.
pub const MIN_WEIGHT_SHARE: f64 = 0.5;

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

/// Where ONNX Runtime placed a session's nodes, as ONNX Runtime itself reports it
/// (`Session_GetEpGraphAssignmentInfo`; a provider that fuses nodes into one subgraph still
/// counts each original node), and the weights that went with them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// Provider name -> nodes assigned to it.
    pub nodes: BTreeMap<String, usize>,
    /// Provider name -> bytes of the initializers (weights) every consumer of which runs on that
    /// provider (`None`: the graph's initializers could not be read).
    #[serde(default)]
    pub weight_bytes: Option<BTreeMap<String, u64>>,
    /// Bytes of all initializers the graph's nodes consume.
    #[serde(default)]
    pub total_weight_bytes: Option<u64>,
}

impl Placement {
    /// Node counts alone (the weights unread).
    pub fn of_nodes(nodes: BTreeMap<String, usize>) -> Self {
        Placement {
            nodes,
            weight_bytes: None,
            total_weight_bytes: None,
        }
    }

    /// ONNX Runtime's assignment (provider -> the names of its nodes), weighed with the graph's
    /// initializers (name -> bytes and consuming node names). An initializer counts for a
    /// provider when every node that consumes it runs there; one split between providers, or
    /// consumed by a node the assignment does not name (ONNX Runtime rewrote it), counts for
    /// none but still counts in the total.
    pub fn weigh(
        assigned: &BTreeMap<String, Vec<String>>,
        weights: Option<&std::collections::HashMap<String, (u64, Vec<String>)>>,
    ) -> Self {
        let nodes = assigned
            .iter()
            .map(|(ep, n)| (ep.clone(), n.len()))
            .collect();
        let Some(weights) = weights else {
            return Placement::of_nodes(nodes);
        };
        // A name two providers report, or an empty one (ONNX allows unnamed nodes), says nothing
        // about where its weights went: such nodes attribute no weight.
        let mut provider_of: std::collections::HashMap<&str, Option<&str>> =
            std::collections::HashMap::new();
        for (ep, names) in assigned {
            for n in names.iter().filter(|n| !n.is_empty()) {
                provider_of
                    .entry(n.as_str())
                    .and_modify(|p| {
                        if *p != Some(ep.as_str()) {
                            *p = None;
                        }
                    })
                    .or_insert(Some(ep.as_str()));
            }
        }
        let mut by_provider: BTreeMap<String, u64> = BTreeMap::new();
        let mut total = 0u64;
        for (bytes, consumers) in weights.values() {
            if consumers.is_empty() {
                continue;
            }
            total = total.saturating_add(*bytes);
            let mut eps = consumers
                .iter()
                .map(|c| provider_of.get(c.as_str()).copied().flatten());
            if let Some(Some(ep)) = eps.next()
                && eps.all(|e| e == Some(ep))
            {
                let on = by_provider.entry(ep.to_owned()).or_default();
                *on = on.saturating_add(*bytes);
            }
        }
        Placement {
            nodes,
            weight_bytes: Some(by_provider),
            total_weight_bytes: Some(total),
        }
    }

    pub fn nodes_on(&self, provider: &str) -> usize {
        self.nodes.get(provider).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.nodes.values().sum()
    }

    /// The share of the weights on `provider` (`None`: unknown, or a graph without weights).
    pub fn weight_share(&self, provider: &str) -> Option<f64> {
        let total = self.total_weight_bytes.filter(|&t| t > 0)?;
        let on = self
            .weight_bytes
            .as_ref()?
            .get(provider)
            .copied()
            .unwrap_or(0);
        Some(on as f64 / total as f64)
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .nodes
            .iter()
            .map(|(p, n)| match self.weight_share(p) {
                Some(w) => format!("{p}: {n} nodes, {:.1}% of weights", w * 100.0),
                None => format!("{p}: {n}"),
            })
            .collect();
        f.write_str(&parts.join(", "))
    }
}

/// A reading of the amdxdna hardware-context counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Counters {
    Read(HwContexts),
    /// No such counters here (no accel fd, not amdxdna, the query missing): no evidence.
    Unavailable {
        reason: String,
    },
    /// The query exists but failed.
    Failed {
        reason: String,
    },
}

impl Counters {
    pub fn read(&self) -> Option<&HwContexts> {
        match self {
            Counters::Read(c) => Some(c),
            _ => None,
        }
    }
}

/// This process's own reader of the hardware-context counters: an fd it opened on the accel
/// node for the purpose and keeps for its life, a DRM client with no contexts. Never a
/// duplicate of XRT's fd: closing a duplicate runs amdxdna's flush on XRT's client, which
/// destroys the session's contexts ([`xdna::AccelFd`]).
pub struct CounterReader {
    dev: Box<dyn xdna::Ioctl>,
    fd: Option<i32>,
}

/// The fd of this process's open [`CounterReader`] on the real node (-1: none), so that "does
/// this process hold the NPU" and the fdinfo evidence leave out a client that holds no context.
static OWN_READER_FD: AtomicI32 = AtomicI32::new(-1);

/// This process's own counter reader's fd, if one is open.
pub fn own_reader_fd() -> Option<i32> {
    let fd = OWN_READER_FD.load(Ordering::Acquire);
    (fd >= 0).then_some(fd)
}

impl Drop for CounterReader {
    fn drop(&mut self) {
        if let Some(fd) = self.fd {
            let _ = OWN_READER_FD.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Acquire);
        }
    }
}

impl CounterReader {
    /// Opens the accel node under `roots`. `Err` is the reading every later sample reports: the
    /// node is missing (unavailable), or it would not open (failed).
    pub fn open(roots: &SystemRoots) -> Result<Self, Counters> {
        Self::open_with(&roots.accel_node(), |node| {
            let fd = xdna::AccelFd::open(node)?;
            let raw = fd.raw();
            Ok((Box::new(fd) as Box<dyn xdna::Ioctl>, Some(raw)))
        })
    }

    /// [`Self::open`] through `open`, which opens `node` anew and says the fd's number (tests:
    /// a fake node's open).
    pub fn open_with(
        node: &Path,
        open: impl FnOnce(&Path) -> std::io::Result<(Box<dyn xdna::Ioctl>, Option<i32>)>,
    ) -> Result<Self, Counters> {
        match open(node) {
            Ok((dev, fd)) => {
                if let Some(fd) = fd {
                    OWN_READER_FD.store(fd, Ordering::Release);
                }
                Ok(CounterReader { dev, fd })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Counters::Unavailable {
                reason: format!("{} does not exist", node.display()),
            }),
            Err(e) => Err(Counters::Failed {
                reason: format!("opening {} for the counters: {e}", node.display()),
            }),
        }
    }

    pub fn read(&self) -> Counters {
        counters_from(self.dev.as_ref())
    }
}

/// What a process with an NPU session watches for its life: its own [`CounterReader`], the
/// reading taken before the session was created (the contexts that appear after it are the
/// session's), and the session's contexts once the evidence run identified them.
pub struct NpuWatch {
    reader: Result<CounterReader, Counters>,
    own_pid: i64,
    initial_ns: Option<bool>,
    at_load: Counters,
    ours: Option<Ours>,
}

impl NpuWatch {
    /// Call before the session is created. `own_pid`: this process's pid as its procfs shows it
    /// ([`xdna::driver_pid`]); `initial_ns`: whether it is in the initial PID namespace
    /// ([`xdna::in_initial_pid_namespace`]).
    pub fn before_session(
        reader: Result<CounterReader, Counters>,
        own_pid: i64,
        initial_ns: Option<bool>,
    ) -> Self {
        let at_load = Self::sample(&reader);
        NpuWatch {
            reader,
            own_pid,
            initial_ns,
            at_load,
            ours: None,
        }
    }

    fn sample(reader: &Result<CounterReader, Counters>) -> Counters {
        match reader {
            Ok(r) => r.read(),
            Err(c) => c.clone(),
        }
    }

    pub fn read(&self) -> Counters {
        Self::sample(&self.reader)
    }

    /// The counters around `run` (the evidence decode steps), with the reading from before the
    /// session, as [`Evidence`] holds them.
    pub fn evidence_round<E>(
        &self,
        run: impl FnOnce() -> Result<(), E>,
    ) -> Result<CounterReadings, E> {
        let before = self.read();
        run()?;
        Ok(CounterReadings {
            at_load: self.at_load.clone(),
            before,
            after: self.read(),
            own_pid: self.own_pid,
            initial_ns: self.initial_ns,
        })
    }

    /// Keeps the session's contexts as the verdict identified them, for [`Self::commands_since`].
    pub fn adopt(&mut self, residency: &Residency) {
        self.ours = residency.ours.clone();
    }

    pub fn ours(&self) -> Option<&Ours> {
        self.ours.as_ref()
    }

    /// Commands the NPU completed for the session's contexts since `before` (a [`Self::read`]).
    /// `None`: not countable (no context identified, a reading failed, or the driver destroyed
    /// the session's contexts), which is not "none".
    pub fn commands_since(&self, before: &Counters) -> Option<u64> {
        let ours = self.ours.as_ref()?;
        let (Counters::Read(b), Counters::Read(a)) = (before, &self.read()) else {
            return None;
        };
        let gone = a.missing(ours);
        if !gone.is_empty() {
            tracing::warn!(
                "the NPU session's hardware contexts {gone:?} (pid {} as the driver records it) \
                 are gone: the driver destroyed them",
                ours.pid
            );
            return None;
        }
        Some(xdna::completed_between(b, a, ours))
    }
}

/// The counter readings one evidence run takes.
#[derive(Debug, Clone)]
pub struct CounterReadings {
    pub at_load: Counters,
    pub before: Counters,
    pub after: Counters,
    pub own_pid: i64,
    pub initial_ns: Option<bool>,
}

/// One reading through `dev`.
pub fn counters_from(dev: &dyn xdna::Ioctl) -> Counters {
    match xdna::read_contexts(dev) {
        Ok(c) => Counters::Read(c),
        Err(xdna::CountersError::Unavailable(reason) | xdna::CountersError::Open(reason)) => {
            Counters::Unavailable { reason }
        }
        Err(xdna::CountersError::Failed(reason)) => Counters::Failed { reason },
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

/// Reads `pid`'s usage of the accel node, leaving out `except` (the process's own counter
/// reader, a client with no contexts) (`None`: the process holds no other accel fd).
pub fn read_accel_usage(
    pid: u32,
    roots: &SystemRoots,
    except: Option<i32>,
) -> Result<Option<AccelUsage>, NpuError> {
    let mut fds = accel_fds(pid, roots)?;
    fds.retain(|&fd| Some(fd as i32) != except);
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
    /// The worker's pid as its own procfs shows it (the driver records the initial PID
    /// namespace's, which differs inside a container).
    #[serde(default)]
    pub pid: i64,
    /// Whether the worker is in the initial PID namespace, where the driver's pids are its own
    /// (`None`: unknown). Only outside it may contexts under a pid not its own be its session's.
    #[serde(default)]
    pub initial_pid_namespace: Option<bool>,
    /// The hardware-context counters before the session was created: the contexts that appear
    /// after it are the session's (`None`: not read).
    #[serde(default)]
    pub counters_at_load: Option<Counters>,
    /// The hardware-context counters before and after [`Evidence::decode_steps`] decode steps
    /// (`None`: not read).
    #[serde(default)]
    pub counters_before: Option<Counters>,
    #[serde(default)]
    pub counters_after: Option<Counters>,
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
    /// The session's hardware contexts, where the counters identified them.
    #[serde(default)]
    pub ours: Option<Ours>,
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
            ours: None,
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
    let mut details = Vec::new();
    let mut unknown_weights = None;
    // Placement can refute residency (the provider declined the graph or holds only trivial
    // nodes) or support it; unknown, the device's counters decide.
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
        Some(p) => match p.weight_share(provider) {
            Some(share) if share >= MIN_WEIGHT_SHARE => {
                proofs.push(format!(
                    "ONNX Runtime placed {} of {} nodes, {:.1}% of the weights, on {provider} ({p})",
                    p.nodes_on(provider),
                    p.total(),
                    share * 100.0
                ));
                Some(true)
            }
            Some(share) => {
                missing.push(format!(
                    "ONNX Runtime placed {} of {} nodes on {provider} but only {:.1}% of the \
                     weights (at least {:.0}% needed: the weight-heavy nodes run elsewhere) ({p})",
                    p.nodes_on(provider),
                    p.total(),
                    share * 100.0,
                    MIN_WEIGHT_SHARE * 100.0
                ));
                Some(false)
            }
            None => {
                unknown_weights = Some(format!(
                    "ONNX Runtime placed {} of {} nodes on {provider}, but which weights they \
                     hold is unknown (the graph's initializers were not read) ({p})",
                    p.nodes_on(provider),
                    p.total()
                ));
                None
            }
        },
    };
    let pid = evidence.pid;
    let mut ours = None;
    let commands = match (
        &evidence.counters_at_load,
        &evidence.counters_before,
        &evidence.counters_after,
    ) {
        (Some(Counters::Read(l)), Some(Counters::Read(b)), Some(Counters::Read(a))) => {
            // Contexts under another pid can be ours only if XRT holds an fd of this process's
            // on the node (a client of ours exists to own them).
            let xrt_fd = evidence.accel_after.as_ref().is_some_and(|u| u.fds > 0);
            match xdna::identify(l, a, pid, evidence.initial_pid_namespace) {
                Err(why) => {
                    missing.push(format!("no hardware context is this worker's: {why}"));
                    false
                }
                Ok(o) if o.identified == xdna::Identified::Creation && !xrt_fd => {
                    missing.push(format!(
                        "no hardware context is this worker's: contexts {:?} of pid {} appeared \
                         across its session creation, but this worker holds no accel fd besides \
                         its counter reader, so none can be its own",
                        o.context_ids, o.pid
                    ));
                    false
                }
                Ok(o) => {
                    let done = xdna::completed_between(b, a, &o);
                    let whose = match o.identified {
                        xdna::Identified::CreationAndPid => format!("pid {pid}"),
                        xdna::Identified::Creation => format!(
                            "pid {} as the driver records it; this process is pid {pid} in its \
                             own PID namespace",
                            o.pid
                        ),
                    };
                    let ids = &o.context_ids;
                    let proved = if done > 0 {
                        proofs.push(format!(
                            "the NPU completed {done} commands for this worker's hardware \
                             contexts {ids:?} (created with its session; {whose}) over {} decode \
                             steps ({}, {})",
                            evidence.decode_steps, a.query, a.driver
                        ));
                        true
                    } else {
                        missing.push(format!(
                            "this worker's hardware contexts {ids:?} (created with its session; \
                             {whose}) completed no NPU command over {} decode steps ({}: {} -> \
                             {})",
                            evidence.decode_steps,
                            a.query,
                            b.completions_of(&o).unwrap_or(0),
                            a.completions_of(&o).unwrap_or(0)
                        ));
                        false
                    };
                    ours = Some(o);
                    proved
                }
            }
        }
        (Some(Counters::Unavailable { reason } | Counters::Failed { reason }), _, _)
        | (_, Some(Counters::Unavailable { reason } | Counters::Failed { reason }), _)
        | (_, _, Some(Counters::Unavailable { reason } | Counters::Failed { reason })) => {
            missing.push(format!("hardware-context counters unavailable: {reason}"));
            false
        }
        _ => {
            missing.push("hardware-context counters not read".to_owned());
            false
        }
    };
    let busy = match (&evidence.accel_before, &evidence.accel_after) {
        (Some(_), Some(a)) if a.engine_ns.is_empty() => {
            details.push(format!(
                "the worker's accel fdinfo has no drm-engine-* busy time (driver {}; mainline \
                 amdxdna prints none)",
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
    // Memory: supporting detail only.
    if let (Some(b), Some(a)) = (&evidence.accel_before, &evidence.accel_after) {
        let sum = |u: &AccelUsage| u.memory_bytes.values().sum::<u64>();
        if !a.memory_bytes.is_empty() {
            details.push(format!(
                "the worker's accel memory {} -> {} bytes (supporting detail, proves nothing \
                 alone)",
                sum(b),
                sum(a)
            ));
        }
    }
    match (evidence.mem_usage_before, evidence.mem_usage_after) {
        (Some(b), Some(a)) => details.push(format!(
            "device-wide NPU mem_usage {b} -> {a} bytes (supporting detail, proves nothing alone)"
        )),
        _ => {
            details.push("device-wide NPU mem_usage not readable (not every driver has it)".into())
        }
    }
    missing.extend(evidence.notes.iter().cloned());
    if placed != Some(false) && (commands || busy) {
        if placed.is_none() {
            proofs.push(
                unknown_weights.unwrap_or_else(|| {
                    "node placement by weight unknown (not reported)".to_owned()
                }),
            );
        }
        proofs.extend(details);
        Residency {
            state: ResidencyState::Proven,
            reasons: proofs,
            evidence,
            ours,
        }
    } else {
        missing.extend(unknown_weights);
        missing.extend(details);
        Residency {
            state: ResidencyState::Unproven,
            reasons: missing,
            evidence,
            ours,
        }
    }
}

/// [`weigh`] for the RyzenAI provider.
pub fn weigh_npu(evidence: Evidence) -> Residency {
    weigh(evidence, PROVIDER_NAME)
}

/// Reads the accel usage of `pid`, noting a failed reading in `notes`.
pub fn sample_accel(
    pid: u32,
    roots: &SystemRoots,
    except: Option<i32>,
    notes: &mut Vec<String>,
) -> Option<AccelUsage> {
    match read_accel_usage(pid, roots, except) {
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
            "CPUExecutionProvider: 26 nodes, 10.0% of weights, \
             RyzenAILightExecutionProvider: 3 nodes, 90.0% of weights"
        );
        assert_eq!(
            Placement::of_nodes(p.nodes.clone()).to_string(),
            "CPUExecutionProvider: 26, RyzenAILightExecutionProvider: 3"
        );
    }

    #[test]
    fn weights_count_for_the_provider_that_runs_all_their_consumers() {
        let assigned: BTreeMap<String, Vec<String>> = [
            (
                PROVIDER_NAME.to_owned(),
                vec!["mm0".to_owned(), "mm1".to_owned()],
            ),
            (
                "CPUExecutionProvider".to_owned(),
                vec!["gather".to_owned(), "add".to_owned()],
            ),
        ]
        .into_iter()
        .collect();
        let weights: std::collections::HashMap<String, (u64, Vec<String>)> = [
            ("w0", 600, vec!["mm0"]),
            ("w1", 200, vec!["mm1", "mm0"]),
            ("emb", 150, vec!["gather"]),
            ("shared", 40, vec!["mm1", "add"]),
            ("fused_away", 10, vec!["renamed_by_ort"]),
            // Unnamed nodes, and a name two providers report, attribute nothing.
            ("unnamed", 0, vec![""]),
            ("unused", 1000, vec![]),
        ]
        .into_iter()
        .map(|(n, b, c)| (n.to_owned(), (b, c.into_iter().map(String::from).collect())))
        .collect();
        let p = Placement::weigh(&assigned, Some(&weights));
        assert_eq!(p.total_weight_bytes, Some(1000));
        assert_eq!(
            p.weight_bytes.as_ref().expect("weighed")[PROVIDER_NAME],
            800
        );
        assert_eq!(
            p.weight_bytes.as_ref().expect("weighed")["CPUExecutionProvider"],
            150
        );
        assert_eq!(p.weight_share(PROVIDER_NAME), Some(0.8));
        assert_eq!(p.nodes_on(PROVIDER_NAME), 2);
        let unweighed = Placement::weigh(&assigned, None);
        assert_eq!(unweighed.weight_share(PROVIDER_NAME), None);
        assert_eq!(unweighed.total(), 4);
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

    /// `npu` nodes holding 90% of the weights on the provider (none: all on the CPU).
    fn placed(npu: usize, cpu: usize) -> Option<Placement> {
        weighed(npu, cpu, if npu > 0 { 900 } else { 0 })
    }

    /// A placement whose provider nodes hold `npu_bytes` of 1000 weight bytes.
    fn weighed(npu: usize, cpu: usize, npu_bytes: u64) -> Option<Placement> {
        let mut nodes = BTreeMap::new();
        let mut w = BTreeMap::new();
        if npu > 0 {
            nodes.insert(PROVIDER_NAME.to_owned(), npu);
            w.insert(PROVIDER_NAME.to_owned(), npu_bytes);
        }
        nodes.insert("CPUExecutionProvider".to_owned(), cpu);
        w.insert("CPUExecutionProvider".to_owned(), 1000 - npu_bytes);
        Some(Placement {
            nodes,
            weight_bytes: Some(w),
            total_weight_bytes: Some(1000),
        })
    }

    fn busy(ns: u64) -> Option<AccelUsage> {
        let mut u = AccelUsage::default();
        u.add_fdinfo(&format!("drm-engine-npu: {ns} ns\n"));
        Some(u)
    }

    /// A memory-only fdinfo, as mainline amdxdna prints it (when it prints anything).
    fn memory_only(kib: u64) -> Option<AccelUsage> {
        let mut u = AccelUsage::default();
        u.add_fdinfo(&format!(
            "drm-driver:\tamdxdna_accel_driver\ndrm-total-memory:\t{kib} KiB\n"
        ));
        Some(u)
    }

    const ME: i64 = 4321;
    const OTHER: i64 = 999;

    /// Counters read through the fake device as the kernel lays them out.
    fn counters(contexts: Vec<xdna::HwContext>) -> Option<Counters> {
        use xdna::fake::{Driver, FakeXdna};
        Some(counters_from(&FakeXdna::new(Driver::Mainline, contexts)))
    }

    /// The worker had no context before its session was created: the reading at load is the
    /// other processes' contexts of `before`.
    fn with_counters(
        placement: Option<Placement>,
        before: Vec<xdna::HwContext>,
        after: Vec<xdna::HwContext>,
    ) -> Residency {
        let at_load = before.iter().copied().filter(|c| c.pid != ME).collect();
        weigh_npu(Evidence {
            placement,
            pid: ME,
            counters_at_load: counters(at_load),
            counters_before: counters(before),
            counters_after: counters(after),
            accel_before: memory_only(100),
            accel_after: memory_only(100),
            decode_steps: 8,
            ..Evidence::default()
        })
    }

    #[test]
    fn completions_of_our_own_context_prove_residency() {
        use xdna::fake::ctx;
        let r = with_counters(
            placed(40, 10),
            vec![ctx(1, ME, 10), ctx(1, OTHER, 5)],
            vec![ctx(1, ME, 26), ctx(1, OTHER, 5)],
        );
        assert_eq!(r.state, ResidencyState::Proven, "{r}");
        let text = r.to_string();
        assert!(
            text.contains("the NPU completed 16 commands for this worker's hardware contexts [1] (created with its session; pid 4321) over 8 decode steps (GET_ARRAY(HW_CONTEXT_ALL), amdxdna_accel_driver 0.6.0)"),
            "{text}"
        );
        assert!(text.contains("90.0% of the weights"), "{text}");
        // Unknown placement (onnxruntime-genai's loop) leaves it to the counters.
        let r = with_counters(None, vec![ctx(1, ME, 10)], vec![ctx(1, ME, 11)]);
        assert!(r.is_proven(), "{r}");
        assert!(r.to_string().contains("placement by weight unknown"), "{r}");
    }

    #[test]
    fn completions_of_another_process_prove_nothing() {
        use xdna::fake::ctx;
        let r = with_counters(
            placed(40, 10),
            vec![ctx(1, OTHER, 10)],
            vec![ctx(1, OTHER, 900)],
        );
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "no hardware context is this worker's: no hardware context appeared across this \
                 worker's session creation and evidence run (1 on the device, of pids [999])"
            ),
            "{r}"
        );
        assert_eq!(r.ours, None);
        // A new context of a process that had contexts before this worker's session: not ours.
        let r = with_counters(
            placed(40, 10),
            vec![ctx(1, OTHER, 10)],
            vec![ctx(1, OTHER, 10), ctx(2, OTHER, 5)],
        );
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "the only contexts that appeared across this worker's session creation are of \
                 pid 999, which held contexts before the session existed: another process's"
            ),
            "{r}"
        );
    }

    #[test]
    fn flat_counters_prove_nothing() {
        use xdna::fake::ctx;
        let r = with_counters(placed(40, 10), vec![ctx(1, ME, 10)], vec![ctx(1, ME, 10)]);
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "this worker's hardware contexts [1] (created with its session; pid 4321) \
                 completed no NPU command over 8 decode steps (GET_ARRAY(HW_CONTEXT_ALL): 10 -> 10)"
            ),
            "{r}"
        );
    }

    #[test]
    fn growing_memory_without_completions_proves_nothing() {
        use xdna::fake::ctx;
        let r = weigh_npu(Evidence {
            placement: placed(40, 10),
            pid: ME,
            counters_at_load: counters(vec![]),
            counters_before: counters(vec![ctx(1, ME, 10)]),
            counters_after: counters(vec![ctx(1, ME, 10)]),
            accel_before: memory_only(100),
            accel_after: memory_only(700_000),
            mem_usage_before: Some(1 << 20),
            mem_usage_after: Some(700 << 20),
            decode_steps: 8,
            notes: vec![],
            initial_pid_namespace: None,
        });
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        let text = r.to_string();
        assert!(
            text.contains("supporting detail, proves nothing alone"),
            "{text}"
        );
        assert!(text.contains("1048576 -> 734003200"), "{text}");
    }

    #[test]
    fn a_trivial_node_on_the_provider_is_not_placement() {
        use xdna::fake::ctx;
        // The provider claimed 2 nodes holding no weight; its context even completed commands.
        let r = with_counters(weighed(2, 300, 0), vec![ctx(1, ME, 1)], vec![ctx(1, ME, 9)]);
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "placed 2 of 302 nodes on RyzenAILightExecutionProvider but only 0.0% of the weights"
            ),
            "{r}"
        );
        // 40% is still not most of the model.
        let r = with_counters(
            weighed(20, 300, 400),
            vec![ctx(1, ME, 1)],
            vec![ctx(1, ME, 9)],
        );
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        // Nodes but unread weights: not a refutation, not a proof; the counters decide.
        let mut p = placed(3, 26).expect("placement");
        p.weight_bytes = None;
        let r = with_counters(Some(p), vec![ctx(1, ME, 1)], vec![ctx(1, ME, 9)]);
        assert!(r.is_proven(), "{r}");
        assert!(
            r.to_string().contains("which weights they hold is unknown"),
            "{r}"
        );
    }

    #[test]
    fn unavailable_counters_are_never_a_pass() {
        use xdna::fake::{Driver, FakeXdna};
        let enotty = Some(counters_from(&FakeXdna::new(Driver::NotDrm, vec![])));
        let r = weigh_npu(Evidence {
            placement: placed(40, 10),
            pid: ME,
            counters_before: enotty.clone(),
            counters_after: enotty,
            accel_before: memory_only(1),
            accel_after: memory_only(2),
            decode_steps: 8,
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "hardware-context counters unavailable: DRM_IOCTL_VERSION: ENOTTY (not a DRM device)"
            ),
            "{r}"
        );
    }

    #[test]
    fn fdinfo_busy_time_is_a_second_source() {
        let r = weigh_npu(Evidence {
            placement: placed(1, 12),
            accel_before: busy(100),
            accel_after: busy(5100),
            decode_steps: 8,
            counters_before: Some(Counters::Unavailable {
                reason: "no accel fd".into(),
            }),
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Proven, "{r}");
        assert!(r.to_string().contains("busy 5000 ns"), "{r}");
        let r = weigh_npu(Evidence {
            accel_before: busy(10),
            accel_after: busy(10),
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
    }

    #[test]
    fn a_declined_graph_is_unproven_even_with_an_open_busy_accel_fd() {
        use xdna::fake::ctx;
        let r = weigh_npu(Evidence {
            placement: placed(0, 29),
            pid: ME,
            counters_at_load: counters(vec![]),
            counters_before: counters(vec![ctx(1, ME, 1)]),
            counters_after: counters(vec![ctx(1, ME, 5)]),
            accel_before: busy(100),
            accel_after: busy(200),
            mem_usage_before: Some(1),
            mem_usage_after: Some(2),
            decode_steps: 8,
            notes: vec![],
            initial_pid_namespace: None,
        });
        assert_eq!(r.state, ResidencyState::Unproven);
        assert!(r.to_string().contains("declined the graph"), "{r}");
    }

    #[test]
    fn nothing_observed_lists_every_reason() {
        let r = weigh_npu(Evidence {
            notes: vec!["mem_usage: permission denied".into()],
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Unproven);
        let text = r.to_string();
        assert!(r.reasons[0].contains("placement is unknown"), "{text}");
        assert!(text.contains("counters not read"), "{text}");
        assert!(text.contains("no readable accel fd"), "{text}");
        assert!(text.contains("permission denied"), "{text}");
    }

    #[test]
    fn json_shape() {
        let r = Residency::failed("No RyzenAI devices detected");
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["state"], "failed");
        assert_eq!(v["reasons"][0], "No RyzenAI devices detected");
        assert_eq!(v["evidence"]["placement"], serde_json::Value::Null);
        use xdna::fake::ctx;
        let r = with_counters(placed(3, 1), vec![ctx(7, ME, 1)], vec![ctx(7, ME, 3)]);
        let v = serde_json::to_value(&r).expect("json");
        let after = &v["evidence"]["counters_after"];
        assert_eq!(after["state"], "read");
        assert_eq!(after["query"], "get_array");
        assert_eq!(after["contexts"][0]["command_completions"], 3);
        assert_eq!(after["contexts"][0]["pid"], ME);
        assert_eq!(v["evidence"]["placement"]["nodes"][PROVIDER_NAME], 3);
        assert_eq!(v["evidence"]["placement"]["total_weight_bytes"], 1000);
    }

    /// A worker's whole evidence round through the real code ([`NpuWatch`], [`weigh_npu`],
    /// [`NpuWatch::commands_since`]) on a node whose descriptors behave as amdxdna's do, for
    /// every driver generation and flush rule: the session's contexts are still there after
    /// every reading, and after the reader itself is closed. `driver_pid` is the pid the driver
    /// records for the worker, `own_pid` the one the worker sees (they differ in a container).
    fn round(
        driver: xdna::fake::Driver,
        flush: xdna::fake::Flush,
        own_pid: i64,
        driver_pid: i64,
    ) -> (Residency, Option<u64>, xdna::fake::FakeNode) {
        use xdna::fake::FakeNode;
        let node = FakeNode::new(driver, flush);
        // Another process's session, there before ours and busy throughout.
        let other = node.open(OTHER);
        other.create_context();
        // The worker's own reader, opened through the real code's open path on the fake node.
        let reader = CounterReader::open_with(Path::new("/dev/accel/accel0"), |_| {
            let f = node.open(own_pid);
            node.record_pid_as(&f, driver_pid);
            Ok((Box::new(f) as Box<dyn xdna::Ioctl>, None))
        });
        let mut watch = NpuWatch::before_session(reader, own_pid, Some(own_pid == driver_pid));
        // The session: XRT opens the node and creates its contexts.
        node.set_current(own_pid);
        let xrt = node.open(own_pid);
        node.record_pid_as(&xrt, driver_pid);
        xrt.create_context();
        xrt.create_context();
        let readings = watch
            .evidence_round(|| {
                xrt.run(8);
                other.run(1000);
                Ok::<(), ()>(())
            })
            .expect("round");
        let r = weigh_npu(Evidence {
            placement: placed(40, 10),
            pid: readings.own_pid,
            initial_pid_namespace: readings.initial_ns,
            counters_at_load: Some(readings.at_load),
            counters_before: Some(readings.before),
            counters_after: Some(readings.after),
            // XRT's fd, as /proc shows it (our reader's left out).
            accel_before: memory_only(100),
            accel_after: memory_only(100),
            decode_steps: 8,
            ..Evidence::default()
        });
        watch.adopt(&r);
        // One request.
        let before = watch.read();
        xrt.run(5);
        other.run(77);
        let commands = watch.commands_since(&before);
        // The worker ends: its reader closes first (drop order of a real worker: the watch
        // outlives nothing the session needs).
        drop(watch);
        let left = node
            .contexts()
            .iter()
            .filter(|c| c.pid == driver_pid)
            .count();
        assert_eq!(
            left, 2,
            "{driver:?}/{flush:?}: closing our reader removed the session's contexts"
        );
        // The session and the other process live on (dropping them would close their clients).
        std::mem::forget(xrt);
        std::mem::forget(other);
        (r, commands, node)
    }

    #[test]
    fn an_evidence_round_leaves_the_sessions_contexts_on_every_driver_generation() {
        use xdna::fake::{Driver, Flush};
        for driver in [
            Driver::Mainline0,
            Driver::Mainline618,
            Driver::Mainline,
            Driver::Dkms,
        ] {
            for flush in [Flush::Mainline, Flush::Dkms, Flush::Never] {
                let (r, commands, node) = round(driver, flush, ME, ME);
                assert!(r.is_proven(), "{driver:?}/{flush:?}: {r}");
                assert!(
                    r.to_string().contains(
                        "the NPU completed 16 commands for this worker's hardware contexts \
                         [1, 2] (created with its session; pid 4321)"
                    ),
                    "{driver:?}/{flush:?}: {r}"
                );
                let ours = r.ours.as_ref().expect("identified");
                assert_eq!(ours.identified, xdna::Identified::CreationAndPid);
                assert_eq!(commands, Some(10), "{driver:?}/{flush:?}");
                // The other process's context is untouched too.
                assert_eq!(node.contexts().iter().filter(|c| c.pid == OTHER).count(), 1);
            }
        }
    }

    #[test]
    fn a_closed_duplicate_of_xrts_fd_destroys_its_contexts_where_the_driver_flushes() {
        // The driver model the round above is checked against: what reading through a
        // duplicate of XRT's fd (as this crate once did) does on each kernel.
        use xdna::fake::{Driver, FakeNode, Flush};
        for (flush, survive) in [
            (Flush::Mainline, false),
            (Flush::Dkms, false),
            (Flush::Never, true),
        ] {
            let node = FakeNode::new(Driver::Mainline, flush);
            let xrt = node.open(ME);
            xrt.create_context();
            let dup = xrt.dup();
            assert!(counters_from(&dup).read().is_some());
            drop(dup);
            assert_eq!(!node.contexts().is_empty(), survive, "{flush:?}");
            // A child's exit closes its copy from another process: only AMD's DKMS rule spares
            // the contexts then.
            let node = FakeNode::new(Driver::Mainline, flush);
            let xrt = node.open(ME);
            xrt.create_context();
            let childs = xrt.dup();
            node.set_current(ME + 1);
            drop(childs);
            assert_eq!(
                !node.contexts().is_empty(),
                flush != Flush::Mainline,
                "{flush:?}"
            );
            std::mem::forget(xrt);
        }
    }

    #[test]
    fn inside_a_pid_namespace_the_contexts_created_with_the_session_prove_residency() {
        use xdna::fake::{Driver, Flush};
        // The worker is pid 17 in its container; the driver records 4242.
        let (r, commands, _) = round(Driver::Mainline, Flush::Mainline, 17, 4242);
        assert!(r.is_proven(), "{r}");
        assert!(
            r.to_string().contains(
                "contexts [1, 2] (created with its session; pid 4242 as the driver records it; \
                 this process is pid 17 in its own PID namespace)"
            ),
            "{r}"
        );
        let ours = r.ours.as_ref().expect("identified");
        assert_eq!(ours.identified, xdna::Identified::Creation);
        assert_eq!(ours.pid, 4242);
        assert_eq!(commands, Some(10));
    }

    #[test]
    fn contexts_of_several_new_pids_identify_nothing() {
        use xdna::fake::ctx;
        // Two processes created contexts while the worker (pid 17 in a namespace) loaded.
        let r = weigh_npu(Evidence {
            placement: placed(40, 10),
            pid: 17,
            counters_at_load: counters(vec![]),
            counters_before: counters(vec![ctx(1, 4242, 0), ctx(1, 5555, 0)]),
            counters_after: counters(vec![ctx(1, 4242, 9), ctx(1, 5555, 9)]),
            decode_steps: 8,
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "contexts of pids [4242, 5555] appeared across this worker's session creation, \
                 none with its pid 17: which are its own cannot be told"
            ),
            "{r}"
        );
        // No context at all appeared: nothing to count, never a pass.
        let r = weigh_npu(Evidence {
            placement: placed(40, 10),
            pid: 17,
            counters_at_load: counters(vec![ctx(1, OTHER, 1)]),
            counters_before: counters(vec![ctx(1, OTHER, 1)]),
            counters_after: counters(vec![ctx(1, OTHER, 90)]),
            decode_steps: 8,
            ..Evidence::default()
        });
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "no hardware context appeared across this worker's session creation and \
                 evidence run (1 on the device, of pids [999])"
            ),
            "{r}"
        );
    }

    #[test]
    fn another_processs_new_context_is_never_ours() {
        use xdna::fake::ctx;
        let evidence = |initial, accel: Option<AccelUsage>| Evidence {
            placement: placed(40, 10),
            pid: ME,
            initial_pid_namespace: initial,
            // Our session made no context; another process's first session did, meanwhile.
            counters_at_load: counters(vec![]),
            counters_before: counters(vec![ctx(1, OTHER, 0)]),
            counters_after: counters(vec![ctx(1, OTHER, 50)]),
            accel_before: accel.clone(),
            accel_after: accel,
            decode_steps: 8,
            ..Evidence::default()
        };
        // In the initial PID namespace the driver would have recorded our own pid.
        let r = weigh_npu(evidence(Some(true), memory_only(1)));
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string().contains(
                "are of pid 999, not this process's 4321, and this process is in the initial \
                 PID namespace, where the driver records its own pid: another process's"
            ),
            "{r}"
        );
        // Not knowing the namespace is no pass either.
        let r = weigh_npu(evidence(None, memory_only(1)));
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        // In a namespace, a worker whose XRT holds no fd on the node owns no context.
        let r = weigh_npu(evidence(Some(false), None));
        assert_eq!(r.state, ResidencyState::Unproven, "{r}");
        assert!(
            r.to_string()
                .contains("holds no accel fd besides its counter reader, so none can be its own"),
            "{r}"
        );
        assert_eq!(r.ours, None);
    }

    #[test]
    fn a_request_on_destroyed_contexts_is_not_countable() {
        use xdna::fake::{Driver, FakeNode, Flush};
        let node = FakeNode::new(Driver::Mainline, Flush::Mainline);
        let reader = CounterReader::open_with(Path::new("/dev/accel/accel0"), |_| {
            Ok((Box::new(node.open(ME)) as Box<dyn xdna::Ioctl>, None))
        });
        let mut watch = NpuWatch::before_session(reader, ME, Some(true));
        let xrt = node.open(ME);
        xrt.create_context();
        let readings = watch
            .evidence_round(|| {
                xrt.run(3);
                Ok::<(), ()>(())
            })
            .expect("round");
        let r = weigh_npu(Evidence {
            pid: ME,
            counters_at_load: Some(readings.at_load),
            counters_before: Some(readings.before),
            counters_after: Some(readings.after),
            ..Evidence::default()
        });
        watch.adopt(&r);
        let before = watch.read();
        // Something closed a duplicate of XRT's fd: the driver destroyed the contexts.
        drop(xrt.dup());
        assert_eq!(watch.commands_since(&before), None);
        std::mem::forget(xrt);
    }
}
