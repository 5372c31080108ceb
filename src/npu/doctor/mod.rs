//! `onebit-tts doctor` for the NPU route: one PASS/WARN/FAIL/SKIP line per Linux NPU blocker
//! named in the reference, each WARN/FAIL with its fix in one line. A check with nothing to look
//! at is SKIP (with why), never PASS; residency is PASS only when a probe proved it.
//!
//! Every file is read through [`SystemRoots`] and the venv/XRT paths given in
//! [`DoctorInputs`]; everything else (ids, memlock, kernel log, xrt-smi, access(2)) comes from a
//! [`Host`]. Nothing here opens `/dev/accel/accel0` itself: a close of the device is exactly the
//! path that has misbehaved (xrt-smi does open it, and is never SIGKILLed).

pub mod host;
pub mod parse;
pub mod report;

use std::cmp::Ordering;
use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub use host::{CommandOutput, Host, Identity, Limit, Memlock, RealHost};
pub use report::{Check, Report, Status};

use super::PROVIDER_FILE;
use super::env::{self, EnvInputs, EnvPlan, files_starting};
use super::residency::{Residency, ResidencyState};
use super::roots::SystemRoots;
use crate::runtime;
use parse::XrtSmi;

pub const NPU_VENDOR_ID: u16 = 0x1022;
/// Strix / Strix Halo / Krackan NPU.
pub const NPU_DEVICE_ID: u16 = 0x17f0;
/// Phoenix / Hawk Point NPU: not supported by the RyzenAI LLM flow.
pub const OLD_NPU_DEVICE_ID: u16 = 0x1502;
/// Minimums from the reference (FastFlowLM's; mainline 6.18 showed DRM 0.1, firmware 1.0.0.166).
pub const MIN_FIRMWARE: &str = "1.1.0.0";
pub const MIN_DRM: &str = "0.6";

/// Check names, stable for `--json` consumers.
pub mod names {
    pub const MODULE: &str = "amdxdna module";
    pub const PCI: &str = "NPU PCI device";
    pub const FIRMWARE_FILE: &str = "NPU firmware file";
    pub const ACCEL: &str = "accel node";
    pub const MEMLOCK: &str = "memlock";
    pub const HUGEPAGES: &str = "hugepages";
    pub const HUGEPAGES_MOUNT: &str = "hugepages mount";
    pub const XRT: &str = "XRT";
    pub const VENV: &str = "RyzenAI venv";
    pub const PYTHON: &str = "venv python";
    pub const PROVIDER: &str = "provider library";
    pub const STALE_XRT: &str = "venv libxrt";
    pub const WORKER_ENV: &str = "worker env";
    pub const FW_VERSION: &str = "NPU firmware version";
    pub const DRM_VERSION: &str = "amdxdna DRM version";
    pub const DRIVER: &str = "amdxdna driver";
    pub const HW_COUNTERS: &str = "NPU counters";
    pub const KERNEL_LOG: &str = "kernel log";
    pub const VENV_RUNTIME: &str = "venv ONNX Runtime";
    pub const RESIDENCY: &str = "residency";
    pub const XRT_HEAP: &str = "XRT heap";
    pub const PROVIDER_LIBS: &str = "provider libraries";
}

/// XRT's configuration file, when set (XRT reads it before any other xrt.ini).
pub const XRT_INI_PATH_VAR: &str = "XRT_INI_PATH";
/// AMD's NPU shim sizes the device heap in pages of this many bytes (`Debug.num_heap_pages`,
/// default 1; the shim caps the heap at 512 MiB).
pub const HEAP_PAGE_BYTES: u64 = 64 << 20;
/// The pages AMD's Ryzen AI 1.7.1 Linux LLM instructions set (`[Debug] num_heap_pages = 8`).
pub const LLM_HEAP_PAGES: u64 = 8;
/// The device memory the kernel's own amdxdna allows one client (`AIE2_DEVM_SIZE`, 64 MiB);
/// AMD's newer out-of-tree driver allows up to 512 MiB.
pub const IN_TREE_DEVM_BYTES: u64 = 64 << 20;

/// The firmware directory amdxdna requests for each (PCI device, revision) it binds, under the
/// firmware search path. From Linux drivers/accel/amdxdna/amdxdna_pci_drv.c `amdxdna_ids`
/// (torvalds/linux 063db451, 2025) and each npuN_regs.c `fw_path`: rev 0x00 is npu2, 0x10 npu4,
/// 0x11 npu5 (Strix Halo), 0x20 npu6, and npu6 requests 17f0_10, not 17f0_20 (MODULE_FIRMWARE
/// lists a 17f0_20 that no fw_path uses).
pub const FIRMWARE_DIRS: &[(u16, u8, &str)] = &[
    (OLD_NPU_DEVICE_ID, 0x00, "1502_00"),
    (NPU_DEVICE_ID, 0x00, "17f0_00"),
    (NPU_DEVICE_ID, 0x10, "17f0_10"),
    (NPU_DEVICE_ID, 0x11, "17f0_11"),
    (NPU_DEVICE_ID, 0x20, "17f0_10"),
];

/// The file names amdxdna requests in that directory, in its order. Before 2026 the driver
/// requested `npu.sbin` only; "accel/amdxdna: ... npu_7.sbin" (Lizhi Hou, dri-devel 2026-02-25,
/// Fixes f1eac46fe5f7) made aie2_init() try `npu_7.sbin` (protocol-7 firmware) first and fall
/// back to `npu.sbin`, because a legacy driver given the newest firmware powered the NPU off.
pub const FIRMWARE_NAMES: &[&str] = &["npu_7.sbin", "npu.sbin"];
/// The name every driver version requests.
const FIRMWARE_LEGACY: &str = "npu.sbin";

/// request_firmware() also finds `<name>.zst` / `<name>.xz` when the kernel has
/// CONFIG_FW_LOADER_COMPRESS_ZSTD / _XZ (distributions ship the amdnpu files compressed).
pub const FIRMWARE_SUFFIXES: &[&str] = &["", ".zst", ".xz"];

/// Kernel log lines of known failures: (text to find, what it means, the fix).
pub const KNOWN_KERNEL_FAILURES: &[(&str, &str, &str)] = &[
    (
        "aie2_check_protocol: Incompatible firmware protocol",
        "NPU firmware and amdxdna driver disagree on the protocol",
        "the firmware is newer than this kernel's amdxdna: boot a newer kernel, or restore the \
         amdnpu firmware that matches this kernel, then reboot",
    ),
    (
        "firmware is not alive",
        "the NPU firmware did not start",
        "usually follows the protocol mismatch: match kernel and firmware (see above), then reboot",
    ),
    (
        "HW Context is not ready",
        "the driver rejected a hardware context (ELF-loaded contexts need a newer amdxdna)",
        "use a kernel whose amdxdna reports DRM >= 0.6 (newer kernel)",
    ),
    (
        "aie2_hwctx_restart: Map host buf failed",
        "a process holding the NPU was SIGKILLed or crashed; the close path failed",
        "reboot before trusting the NPU again; never SIGKILL the worker \
         (onebit-tts leaves an NPU holder running instead)",
    ),
    (
        "amdxdna_drm_close: Resume failed",
        "the device failed to resume while a holder closed it (seen after SIGKILL)",
        "reboot before trusting the NPU again; never SIGKILL the worker",
    ),
    (
        "Unknown symbol",
        "the amdxdna module was built for another kernel and did not load",
        "a DKMS/out-of-tree amdxdna left over after a kernel upgrade: rebuild it for this kernel \
         (sudo dkms autoinstall) or remove it so the in-tree module loads, then reboot",
    ),
];

/// What the doctor checks besides the system trees.
#[derive(Debug, Clone, Default)]
pub struct DoctorInputs {
    pub roots: SystemRoots,
    /// ONEBIT_RYZENAI_ROOT.
    pub ryzenai_root: Option<PathBuf>,
    /// ONEBIT_XRT_ROOT.
    pub xrt_root_knob: Option<PathBuf>,
    /// $XILINX_XRT.
    pub xilinx_xrt: Option<PathBuf>,
    /// The worker executable (a provider copy beside it wins over the venv's).
    pub worker_exe: Option<PathBuf>,
    /// $XRT_INI_PATH.
    pub xrt_ini: Option<PathBuf>,
    /// The doctor's own working directory, standing for the server's (the worker inherits the
    /// server's; XRT's last place to look for xrt.ini).
    pub cwd: Option<PathBuf>,
    /// Residency as a probe measured it (`doctor --model PKG`); None: not measured.
    pub probed: Option<Probed>,
}

/// What `npu probe` found for one package.
#[derive(Debug, Clone)]
pub struct Probed {
    pub package: String,
    pub residency: Residency,
}

impl DoctorInputs {
    /// The real system, the knobs from this process's environment, this executable as worker.
    pub fn from_process() -> Self {
        let worker = std::env::current_exe().unwrap_or_default();
        let e = EnvInputs::from_process(true, worker.clone());
        DoctorInputs {
            roots: SystemRoots::default(),
            ryzenai_root: e.ryzenai_root,
            xrt_root_knob: e.xrt_root_knob,
            xilinx_xrt: e.xilinx_xrt,
            worker_exe: (!worker.as_os_str().is_empty()).then_some(worker),
            xrt_ini: crate::native::env_path(XRT_INI_PATH_VAR),
            cwd: std::env::current_dir().ok(),
            probed: None,
        }
    }
}

/// Runs every check, in the order a fix would go (driver, device, access, limits, XRT, venv,
/// versions, kernel log, residency).
pub fn run(inputs: &DoctorInputs, host: &dyn Host) -> Report {
    let mut d = Doctor {
        i: inputs,
        host,
        checks: Vec::new(),
    };
    let module_loaded = d.module();
    let build = d.driver(module_loaded);
    let pci = d.pci();
    d.firmware_file(pci.as_ref());
    d.accel(module_loaded);
    let drm = d.hw_counters();
    d.memlock();
    d.hugepages();
    let smi = d.xrt();
    d.xrt_heap(build);
    if d.venv() {
        d.python();
        d.provider();
        d.stale_xrt();
        d.venv_runtime();
        if let Some(w) = d.worker_env() {
            let c = libraries_check(&w, host);
            d.push(c);
        }
    }
    let log = host.kernel_log();
    d.firmware_version(pci.as_ref(), smi.as_ref());
    d.drm_version(drm, log.as_ref().ok().map(String::as_str));
    d.kernel_log(log, module_loaded);
    d.push(residency_check(inputs.probed.as_ref()));
    Report { checks: d.checks }
}

/// The residency line: PASS only for residency a probe proved; FAIL with the probe's reasons
/// otherwise; SKIP when nothing was measured (the doctor alone has no model to run).
pub fn residency_check(probed: Option<&Probed>) -> Check {
    let Some(p) = probed else {
        return Check::skip(
            names::RESIDENCY,
            "not measured by doctor",
            "run `onebit-tts npu probe --model PKG` (or `onebit-tts doctor --model PKG`)",
        );
    };
    let reasons = if p.residency.reasons.is_empty() {
        "no reason given".to_string()
    } else {
        p.residency.reasons.join("; ")
    };
    let detail = format!(
        "{} for {}: {reasons}",
        p.residency.state.as_str(),
        p.package
    );
    match p.residency.state {
        ResidencyState::Proven => Check::pass(names::RESIDENCY, detail),
        ResidencyState::Unproven => Check::fail(
            names::RESIDENCY,
            detail,
            "the session ran but the NPU did not take the model: see the probe's node placement \
             (`onebit-tts npu probe --model PKG`) and the provider's log",
        ),
        ResidencyState::Failed => Check::fail(
            names::RESIDENCY,
            detail,
            "the NPU session could not be set up: fix the FAILs above first, then rerun with \
             --model PKG",
        ),
    }
}

/// The XRT library XRT opens at run time for the NPU (its amdxdna shim): not a link-time
/// dependency of the provider, so `ldd` of the provider does not cover it.
pub const XRT_SHIM: &str = "libxrt_driver_xdna.so";

/// Whether the libraries the worker loads for the NPU resolve with the worker's
/// `LD_LIBRARY_PATH`: `ldd` (the dynamic loader's own trace) of the provider library it
/// registers and of XRT's NPU shim must find every library they link and every symbol version
/// those must define. AMD builds the provider, XRT and the venv's libraries for Ubuntu 24.04,
/// and AMD's order puts the system's library directory first, so an older system (glibc, GCC's
/// libstdc++) or a missing prerequisite (boost 1.74) shows here before a session fails to load.
/// Libraries those open with `dlopen` later are not covered.
pub fn libraries_check(w: &env::WorkerEnv, host: &dyn Host) -> Check {
    let lib = &w.ryzenai_ep_path;
    if !lib.is_file() {
        return Check::skip(
            names::PROVIDER_LIBS,
            format!("not run: no provider library at {}", lib.display()),
            "see the provider library line",
        );
    }
    let xrt_lib = w.xilinx_xrt.join("lib");
    let mut libs = vec![lib.clone()];
    libs.extend(
        files_starting(&xrt_lib, XRT_SHIM)
            .into_iter()
            .take(1)
            .map(|n| xrt_lib.join(n)),
    );
    let env = [(env::LD_LIBRARY_PATH_VAR, w.ld_library_path.clone())];
    let mut problems = Vec::new();
    let mut linked = 0;
    for l in &libs {
        let Some(arg) = l.to_str() else {
            return Check::skip(
                names::PROVIDER_LIBS,
                format!("not run: {} is not UTF-8", l.display()),
                "move the venv and XRT to UTF-8 paths",
            );
        };
        let out = match host.run(Path::new("ldd"), &[arg], &env) {
            Ok(o) => o,
            Err(e) => {
                return Check::warn(
                    names::PROVIDER_LIBS,
                    format!("unknown: {e}"),
                    "install ldd (Debian/Ubuntu: libc-bin) and run doctor again",
                );
            }
        };
        let found = parse::ldd_problems(&out.stdout, &out.stderr);
        if found.is_empty() && out.code != Some(0) {
            let why = out
                .stderr
                .lines()
                .chain(out.stdout.lines())
                .next()
                .unwrap_or("no output");
            problems.push(format!("ldd {}: {why}", l.display()));
        }
        problems.extend(found);
        linked += out.stdout.lines().filter(|l| l.contains("=>")).count();
    }
    // Two libraries missing the same one say it once.
    let mut seen = std::collections::HashSet::new();
    problems.retain(|p| seen.insert(p.clone()));
    let shown: Vec<String> = libs.iter().map(|l| l.display().to_string()).collect();
    if !problems.is_empty() {
        return Check::fail(
            names::PROVIDER_LIBS,
            format!(
                "{} with the worker's LD_LIBRARY_PATH: {}",
                shown.join(" and "),
                problems.join("; ")
            ),
            "AMD builds these libraries for Ubuntu 24.04 (glibc 2.39, GCC 14's libstdc++, \
             boost 1.74): run on Ubuntu 24.04 or in the npu image (docs/deploy.md), and install \
             what is missing (AMD's prerequisites include libboost-filesystem1.74.0)",
        );
    }
    Check::pass(
        names::PROVIDER_LIBS,
        format!(
            "{}: the {linked} libraries they link resolve, with every symbol version, on the \
             worker's LD_LIBRARY_PATH (libraries opened later with dlopen are not covered)",
            shown.join(" and ")
        ),
    )
}

/// Which amdxdna the kernel loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DriverBuild {
    /// The kernel's own (`drivers/accel/amdxdna`).
    InTree,
    /// AMD's DKMS build.
    OutOfTree,
}

struct Doctor<'a> {
    i: &'a DoctorInputs,
    host: &'a dyn Host,
    checks: Vec<Check>,
}

/// The NPU's PCI function.
struct Pci {
    bdf: String,
    dir: PathBuf,
    revision: Option<u8>,
}

fn read(path: &Path) -> io::Result<String> {
    fs::read_to_string(path)
}

/// The firmware directory amdxdna requests for a device and revision ([`FIRMWARE_DIRS`]).
pub fn firmware_dir(device: u16, revision: u8) -> Option<&'static str> {
    FIRMWARE_DIRS
        .iter()
        .find(|(d, r, _)| *d == device && *r == revision)
        .map(|(_, _, dir)| *dir)
}

/// A requested firmware name as the loader may find it: plain or compressed.
fn firmware_file_names(name: &str) -> Vec<String> {
    FIRMWARE_SUFFIXES
        .iter()
        .map(|sfx| format!("{name}{sfx}"))
        .collect()
}

fn hex_u16(s: &str) -> Option<u16> {
    u16::from_str_radix(s.trim().trim_start_matches("0x"), 16).ok()
}

/// The version in a versioned library name: `libxrt_coreutil.so.2.19.0` -> `2.19.0`.
fn soname_version(name: &str) -> Option<&str> {
    name.split_once(".so.").map(|(_, v)| v)
}

impl Doctor<'_> {
    fn push(&mut self, c: Check) {
        self.checks.push(c);
    }

    fn roots(&self) -> &SystemRoots {
        &self.i.roots
    }

    fn module(&mut self) -> bool {
        let r = self.roots();
        let kernel = read(&r.proc.join("sys/kernel/osrelease"))
            .map(|k| format!(", kernel {}", k.trim()))
            .unwrap_or_default();
        let listed = read(&r.proc.join("modules"))
            .ok()
            .and_then(|m| parse::module_taint(&m, "amdxdna"));
        let sys_dir = r.sys.join("module/amdxdna");
        let taint = listed.clone().or_else(|| {
            sys_dir.is_dir().then(|| {
                read(&sys_dir.join("taint"))
                    .unwrap_or_default()
                    .trim()
                    .to_string()
            })
        });
        let Some(taint) = taint else {
            self.push(Check::fail(
                names::MODULE,
                format!("amdxdna is not loaded{kernel}"),
                "sudo modprobe amdxdna (in-tree since Linux 6.14; older kernels need an upgrade)",
            ));
            return false;
        };
        let how = if listed.is_some() {
            "module"
        } else {
            "built in"
        };
        if taint.contains('O') {
            // AMD's Ryzen AI 1.8 Linux install puts this one there (the xrt_plugin amdxdna DKMS
            // package): a supported route, the other one being the in-tree driver.
            self.push(Check::pass(
                names::MODULE,
                format!(
                    "loaded ({how}), out-of-tree build (taint {taint}: AMD's DKMS driver from \
                     the xrt_plugin package, as AMD's Ryzen AI 1.8 install does){kernel}"
                ),
            ));
        } else {
            self.push(Check::pass(
                names::MODULE,
                format!("loaded ({how}, in-tree){kernel}"),
            ));
        }
        true
    }

    /// Which amdxdna the kernel loads, by `modinfo`: AMD's DKMS build (under `updates/` or
    /// `extra/`, with a version) or the kernel's own (`kernel/drivers/accel/amdxdna`).
    fn driver(&mut self, module_loaded: bool) -> Option<DriverBuild> {
        let info = match self.host.modinfo("amdxdna") {
            Ok(i) => i,
            Err(e) => {
                self.push(Check::warn(
                    names::DRIVER,
                    format!("unknown: {e}"),
                    "modinfo amdxdna (kmod) says which build the kernel loads",
                ));
                return None;
            }
        };
        let field = |k: &str| {
            info.lines()
                .find_map(|l| l.strip_prefix(k).map(|v| v.trim().to_owned()))
        };
        let file = field("filename:").unwrap_or_default();
        let version = field("version:");
        let (kind, build) = if file.contains("/updates/") || file.contains("/extra/") {
            (
                Some(DriverBuild::OutOfTree),
                "out-of-tree (DKMS; AMD's xrt_plugin amdxdna)",
            )
        } else if file.contains("/kernel/drivers/accel/amdxdna/") || file == "(builtin)" {
            (Some(DriverBuild::InTree), "in-tree (the kernel's own)")
        } else {
            (None, "unrecognised location")
        };
        let detail = format!(
            "{build}: {}{}{}",
            if file.is_empty() {
                "no filename"
            } else {
                file.as_str()
            },
            version
                .map(|v| format!(", version {v}"))
                .unwrap_or_default(),
            if module_loaded {
                ""
            } else {
                " (not loaded now)"
            }
        );
        self.push(Check::pass(names::DRIVER, detail));
        kind
    }

    /// The device heap XRT will ask for (`Debug.num_heap_pages` in the xrt.ini XRT reads, in
    /// its order: $XRT_INI_PATH, xrt.ini beside the executable, xrt.ini in the working
    /// directory) against AMD's LLM setting and what the driver grants one client.
    fn xrt_heap(&mut self, build: Option<DriverBuild>) {
        let candidates = [
            self.i.xrt_ini.clone().map(|p| (p, "$XRT_INI_PATH")),
            self.i
                .worker_exe
                .as_ref()
                .and_then(|w| w.parent())
                .map(|d| (d.join("xrt.ini"), "beside the worker")),
            self.i
                .cwd
                .as_ref()
                .map(|d| (d.join("xrt.ini"), "in the working directory")),
        ];
        let mut source = "no xrt.ini (XRT's default)".to_owned();
        let mut pages = 1u64;
        for (path, whence) in candidates.into_iter().flatten() {
            let text = match read(&path) {
                Ok(t) => t,
                // $XRT_INI_PATH names a file XRT will fail to read: say so.
                Err(e) if whence == "$XRT_INI_PATH" => {
                    self.push(Check::fail(
                        names::XRT_HEAP,
                        format!("XRT_INI_PATH={}: {e}", path.display()),
                        "point XRT_INI_PATH at a readable xrt.ini (docs/npu.md, \"XRT heap\")",
                    ));
                    return;
                }
                Err(_) => continue,
            };
            source = format!("{} ({whence})", path.display());
            match parse::ini_value(&text, "Debug", "num_heap_pages") {
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n > 0 => pages = n,
                    _ => {
                        self.push(Check::fail(
                            names::XRT_HEAP,
                            format!("{source}: num_heap_pages = {v:?} is not a page count"),
                            "write `num_heap_pages = 8` under [Debug]",
                        ));
                        return;
                    }
                },
                None => source.push_str(", no [Debug] num_heap_pages"),
            }
            break;
        }
        let heap = pages.saturating_mul(HEAP_PAGE_BYTES).min(512 << 20);
        let detail = format!(
            "num_heap_pages = {pages} from {source}: XRT asks for a {} MiB device heap",
            heap >> 20
        );
        let fix_pages = format!(
            "AMD's LLM instructions set it: an xrt.ini with `[Debug]` `num_heap_pages = \
             {LLM_HEAP_PAGES}` and XRT_INI_PATH=/path/to/xrt.ini (docs/npu.md, \"XRT heap\")"
        );
        match build {
            Some(DriverBuild::InTree) if heap > IN_TREE_DEVM_BYTES => self.push(Check::fail(
                names::XRT_HEAP,
                format!(
                    "{detail}, but the kernel's own amdxdna grants a client at most {} MiB \
                     (AIE2_DEVM_SIZE): the heap allocation fails",
                    IN_TREE_DEVM_BYTES >> 20
                ),
                "use AMD's amdxdna (route A in docs/npu.md) for the LLM heap, or set \
                 num_heap_pages = 1 (64 MiB) and check the package loads",
            )),
            // Nothing to change here: more than the driver grants would fail.
            Some(DriverBuild::InTree) => self.push(Check::pass(
                names::XRT_HEAP,
                format!(
                    "{detail}, the most the kernel's own amdxdna grants a client (AIE2_DEVM_SIZE); \
                     AMD's LLM instructions ask for {} MiB on AMD's driver: a package whose \
                     load fails to allocate on the NPU needs route A (docs/npu.md)",
                    (LLM_HEAP_PAGES * HEAP_PAGE_BYTES) >> 20
                ),
            )),
            _ if pages < LLM_HEAP_PAGES => {
                self.push(Check::warn(names::XRT_HEAP, detail, fix_pages))
            }
            Some(DriverBuild::OutOfTree) => self.push(Check::pass(
                names::XRT_HEAP,
                format!("{detail} (AMD's driver grants up to 512 MiB)"),
            )),
            None => self.push(Check::warn(
                names::XRT_HEAP,
                format!("{detail}; what the driver grants one client is unknown (its build is)"),
                "the kernel's own amdxdna grants 64 MiB; AMD's driver up to 512 MiB",
            )),
        }
    }

    /// Runs the hardware-context query residency depends on; returns the driver's version as
    /// DRM_IOCTL_VERSION gave it.
    fn hw_counters(&mut self) -> Option<String> {
        use crate::npu::xdna::CountersError;
        let node = self.roots().accel_node();
        if !node.exists() {
            self.push(Check::skip(
                names::HW_COUNTERS,
                format!("not run: {} does not exist", node.display()),
                "fix the accel node (above), then run doctor again",
            ));
            return None;
        }
        match self.host.hw_contexts(&node) {
            Ok(c) => {
                let version = format!("{}.{}.{}", c.driver.major, c.driver.minor, c.driver.patch);
                self.push(Check::pass(
                    names::HW_COUNTERS,
                    format!(
                        "{} answered by {}: {} hardware contexts (what residency counts)",
                        c.query,
                        c.driver,
                        c.contexts.len()
                    ),
                ));
                Some(version)
            }
            Err(CountersError::Open(why)) => {
                self.push(Check::skip(
                    names::HW_COUNTERS,
                    format!("not run: {why}"),
                    "see the accel node check: the user needs read/write access",
                ));
                None
            }
            Err(e) => {
                self.push(Check::fail(
                    names::HW_COUNTERS,
                    format!("the hardware-context query did not answer: {e}"),
                    "NPU residency is proven by these counters: use an amdxdna that answers \
                     DRM_IOCTL_AMDXDNA_GET_INFO (every mainline driver since Linux 6.14)",
                ));
                None
            }
        }
    }

    fn pci(&mut self) -> Option<Pci> {
        let base = self.roots().pci_devices();
        let mut old = None;
        let mut found = None;
        let mut entries: Vec<_> = fs::read_dir(&base)
            .into_iter()
            .flatten()
            .flatten()
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let dir = e.path();
            let vendor = read(&dir.join("vendor")).ok().and_then(|v| hex_u16(&v));
            let device = read(&dir.join("device")).ok().and_then(|v| hex_u16(&v));
            if vendor != Some(NPU_VENDOR_ID) {
                continue;
            }
            let bdf = e.file_name().to_string_lossy().into_owned();
            if device == Some(NPU_DEVICE_ID) {
                found = Some(Pci {
                    revision: read(&dir.join("revision"))
                        .ok()
                        .and_then(|r| hex_u16(&r))
                        .and_then(|r| u8::try_from(r).ok()),
                    bdf,
                    dir,
                });
                break;
            }
            if device == Some(OLD_NPU_DEVICE_ID) {
                old = Some(bdf);
            }
        }
        let Some(pci) = found else {
            match old {
                Some(bdf) => self.push(Check::fail(
                    names::PCI,
                    format!("only a Phoenix/Hawk Point NPU (1022:1502) at {bdf}"),
                    "the RyzenAI LLM flow needs a Strix-class NPU (1022:17f0); use --device cpu here",
                )),
                None => self.push(Check::fail(
                    names::PCI,
                    format!("no AMD NPU (1022:17f0) under {}", base.display()),
                    "enable the NPU (IPU) in the firmware setup; in a VM pass the PCI function through",
                )),
            }
            return None;
        };
        let rev = pci
            .revision
            .map(|r| format!(" rev 0x{r:02x}"))
            .unwrap_or_default();
        let driver = fs::read_link(pci.dir.join("driver"))
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
        let what = format!("1022:17f0{rev} at {}", pci.bdf);
        match driver.as_deref() {
            Some("amdxdna") => {
                self.push(Check::pass(names::PCI, format!("{what}, driver amdxdna")))
            }
            Some(other) => self.push(Check::fail(
                names::PCI,
                format!("{what} is bound to {other}, not amdxdna"),
                format!(
                    "unbind it (echo {} | sudo tee /sys/bus/pci/drivers/{other}/unbind) and modprobe amdxdna",
                    pci.bdf
                ),
            )),
            None => self.push(Check::fail(
                names::PCI,
                format!("{what}, no driver bound"),
                "sudo modprobe amdxdna, then look at `sudo dmesg | grep amdxdna` for why it did not bind",
            )),
        }
        Some(pci)
    }

    /// The firmware file amdxdna will request for this device: the directory from its device
    /// table, the names it tries, with the suffixes the firmware loader also accepts. A file that
    /// is not one of those names (a versioned blob without its `npu.sbin` link, a `.bak`) does
    /// not count, nor does a dangling symlink.
    fn firmware_file(&mut self, pci: Option<&Pci>) {
        let Some(pci) = pci else {
            self.push(Check::skip(
                names::FIRMWARE_FILE,
                "no Strix-class NPU found (see the PCI line): the file amdxdna requests depends \
                 on the device's revision",
                "fix the PCI line first",
            ));
            return;
        };
        let dirs: Vec<&str> = match pci.revision {
            Some(rev) => {
                let Some(dir) = firmware_dir(NPU_DEVICE_ID, rev) else {
                    self.push(Check::warn(
                        names::FIRMWARE_FILE,
                        format!(
                            "1022:17f0 rev 0x{rev:02x} is not in amdxdna's device table as this \
                             doctor knows it (revisions 0x00, 0x10, 0x11, 0x20)"
                        ),
                        "if amdxdna did not bind (see the PCI line), this kernel's driver does not \
                         know the device: boot a newer kernel",
                    ));
                    return;
                };
                vec![dir]
            }
            // Revision unreadable: any directory the driver could request for this device.
            None => {
                let mut v: Vec<&str> = FIRMWARE_DIRS
                    .iter()
                    .filter(|(dev, _, _)| *dev == NPU_DEVICE_ID)
                    .map(|(_, _, d)| *d)
                    .collect();
                v.dedup();
                v
            }
        };
        let bases = self.roots().firmware_dirs();
        // The first base directory that has a file the driver requests wins, as in the
        // firmware loader's search.
        let mut found: Vec<(String, &PathBuf)> = Vec::new();
        'search: for base in &bases {
            for dir in &dirs {
                let in_dir: Vec<String> = FIRMWARE_NAMES
                    .iter()
                    .flat_map(|n| firmware_file_names(n))
                    .map(|f| format!("amdnpu/{dir}/{f}"))
                    .filter(|rel| base.join(rel).is_file())
                    .collect();
                if !in_dir.is_empty() {
                    found = in_dir.into_iter().map(|f| (f, base)).collect();
                    break 'search;
                }
            }
        }
        let rev = pci
            .revision
            .map_or("revision unknown".to_string(), |r| format!("rev 0x{r:02x}"));
        let names_shown = format!("{{{}}}[.zst|.xz]", FIRMWARE_NAMES.join(","));
        let Some((_, base)) = found.first() else {
            let shown: Vec<String> = dirs
                .iter()
                .map(|d| format!("amdnpu/{d}/{names_shown}"))
                .collect();
            self.push(Check::fail(
                names::FIRMWARE_FILE,
                format!(
                    "none of {} under {} (what amdxdna requests for 1022:17f0 {rev})",
                    shown.join(" or "),
                    bases
                        .iter()
                        .map(|b| b.display().to_string())
                        .collect::<Vec<_>>()
                        .join(" or ")
                ),
                format!(
                    "install a linux-firmware release that has amdnpu/{}/ (or copy that folder from \
                     linux-firmware.git into /lib/firmware/amdnpu/); a versioned npu.sbin.<ver> \
                     needs its npu.sbin link; then reboot",
                    dirs.first().copied().unwrap_or("17f0_11")
                ),
            ));
            return;
        };
        let has_legacy = found.iter().any(|(f, _)| {
            f.rsplit('/')
                .next()
                .is_some_and(|n| firmware_file_names(FIRMWARE_LEGACY).iter().any(|w| w == n))
        });
        let list: Vec<&str> = found.iter().map(|(f, _)| f.as_str()).collect();
        let detail = format!(
            "{} in {} (requested by amdxdna for 1022:17f0 {rev})",
            list.join(", "),
            base.display()
        );
        if has_legacy {
            self.push(Check::pass(names::FIRMWARE_FILE, detail));
        } else {
            self.push(Check::warn(
                names::FIRMWARE_FILE,
                format!("{detail}: only npu_7.sbin (protocol-7 firmware), no npu.sbin"),
                "drivers without the npu_7.sbin fallback (before 2026) request npu.sbin only: \
                 if amdxdna fails to load firmware, install the npu.sbin that matches this kernel",
            ));
        }
    }

    fn accel(&mut self, module_loaded: bool) {
        let r = self.roots().clone();
        let node = r.accel_node();
        let meta = match fs::metadata(&node) {
            Ok(m) => m,
            Err(e) => {
                let fix = if module_loaded {
                    "amdxdna is loaded but made no node: see `sudo dmesg | grep amdxdna`; in a \
                     container pass it with --device /dev/accel/accel0"
                } else {
                    "load amdxdna (see above); in a container pass --device /dev/accel/accel0"
                };
                let detail = if e.kind() == io::ErrorKind::NotFound {
                    format!("{} does not exist", node.display())
                } else {
                    format!("{}: {e}", node.display())
                };
                self.push(Check::fail(names::ACCEL, detail, fix));
                return;
            }
        };
        let id = self.host.identity();
        let groups = read(&r.etc.join("group"))
            .map(|t| parse::parse_groups(&t))
            .unwrap_or_default();
        let passwd = read(&r.etc.join("passwd")).unwrap_or_default();
        let group_name = |gid: u32| {
            groups
                .iter()
                .find(|g| g.gid == gid)
                .map(|g| g.name.clone())
                .unwrap_or_else(|| gid.to_string())
        };
        let user_name = |uid: u32| parse::passwd_name(&passwd, uid);
        let userns = read(&r.proc.join("self/uid_map"))
            .map(|m| parse::in_user_namespace(&m))
            .unwrap_or(false);
        let overflow_gid: u32 = read(&r.proc.join("sys/kernel/overflowgid"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(65_534);

        let mode = meta.mode() & 0o777;
        let (ouid, ogid) = (meta.uid(), meta.gid());
        let gname = group_name(ogid);
        let owner = user_name(ouid).unwrap_or_else(|| ouid.to_string());
        // Only inside a user namespace does the overflow gid mean "unmapped"; outside one it
        // is just the nogroup group.
        let unmapped = userns && ogid == overflow_gid;
        // POSIX order: owner bits if we own it, else group bits if in the group, else other.
        let bits_rw = if id.uid == 0 && !unmapped {
            true
        } else if id.uid == ouid {
            mode & 0o600 == 0o600
        } else if id.in_group(ogid) {
            mode & 0o060 == 0o060
        } else {
            mode & 0o006 == 0o006
        };
        let access = self.host.access_rw(&node);
        let rw = access.unwrap_or(bits_rw);
        let my_groups: Vec<String> = std::iter::once(id.gid)
            .chain(id.groups.iter().copied())
            .map(group_name)
            .collect();
        let detail = format!(
            "{} {owner}:{gname} {mode:04o}; you: uid {} groups {}{}",
            node.display(),
            id.uid,
            my_groups.join(","),
            if userns { " (in a user namespace)" } else { "" }
        );
        if rw {
            let via_acl = if access == Some(true) && !bits_rw {
                " (granted beyond the mode bits, e.g. an ACL)"
            } else {
                ""
            };
            self.push(Check::pass(
                names::ACCEL,
                format!("{detail}: read+write ok{via_acl}"),
            ));
            return;
        }
        let me = user_name(id.uid);
        let listed_in_group = me.as_ref().is_some_and(|me| {
            groups
                .iter()
                .any(|g| g.gid == ogid && g.members.iter().any(|m| m == me))
        });
        let (why, fix) = if unmapped || (userns && !id.in_group(ogid)) {
            (
                "the node's group is not mapped into this user namespace (rootless container)"
                    .to_string(),
                "rootless containers cannot open the NPU: run the container rootful with \
                 --device /dev/accel/accel0, or add a host udev rule that opens the node up"
                    .to_string(),
            )
        } else if bits_rw {
            (
                "the mode bits allow you but access(2) refuses (user namespace or LSM)".to_string(),
                "run rootful, or allow the device in the SELinux/AppArmor policy".to_string(),
            )
        } else if mode & 0o060 == 0o060 && !id.in_group(ogid) && listed_in_group {
            (
                format!("you are in group {gname} in /etc/group, but this session predates it"),
                format!("log out and in again (or run under `newgrp {gname}`)"),
            )
        } else if mode & 0o060 == 0o060 && !id.in_group(ogid) {
            (
                format!("you are not in group {gname}"),
                format!(
                    "sudo usermod -aG {gname} $USER, then log out and in (containers: --group-add {ogid})"
                ),
            )
        } else {
            (
                format!("mode {mode:04o} gives group {gname} no read+write"),
                "add a udev rule: KERNEL==\"accel*\", SUBSYSTEM==\"accel\", GROUP=\"render\", \
                 MODE=\"0660\" in /etc/udev/rules.d/70-amdxdna.rules, then udevadm trigger"
                    .to_string(),
            )
        };
        self.push(Check::fail(names::ACCEL, format!("{detail}: {why}"), fix));
    }

    fn memlock(&mut self) {
        match self.host.memlock() {
            Ok(Memlock {
                soft: Limit::Unlimited,
                ..
            }) => self.push(Check::pass(names::MEMLOCK, "unlimited")),
            Ok(Memlock { soft, hard }) => {
                // The soft limit is what the worker gets; the hard one says whether a plain
                // `ulimit -l` can lift it or the limit must be raised where it is set.
                let fix = if hard == Limit::Unlimited {
                    "ulimit -l unlimited in the shell that starts onebit-tts; systemd: \
                     LimitMEMLOCK=infinity; docker/podman: --ulimit memlock=-1"
                } else {
                    "the hard limit blocks `ulimit -l unlimited`: add '* - memlock unlimited' to \
                     /etc/security/limits.d/ and log in again; systemd: LimitMEMLOCK=infinity; \
                     docker/podman: --ulimit memlock=-1"
                };
                self.push(Check::fail(
                    names::MEMLOCK,
                    format!(
                        "soft {soft}, hard {hard}: amdxdna maps NPU buffers as locked memory and \
                         needs unlimited (the usual 8 MiB default makes device mapping fail)"
                    ),
                    fix,
                ));
            }
            Err(e) => self.push(Check::warn(
                names::MEMLOCK,
                format!("could not read: {e}"),
                "check `ulimit -l` says unlimited",
            )),
        }
    }

    fn hugepages(&mut self) {
        let r = self.roots().clone();
        let meminfo = r.proc.join("meminfo");
        match read(&meminfo).map(|t| parse::meminfo_value(&t, "HugePages_Total")) {
            Ok(Some(n)) if n > 0 => {
                self.push(Check::pass(names::HUGEPAGES, format!("{n} reserved")))
            }
            Ok(Some(_)) => self.push(Check::warn(
                names::HUGEPAGES,
                "none reserved (HugePages_Total 0); seen needed on some systems (ZimaOS)",
                "if device mapping fails: sudo sysctl vm.nr_hugepages=64 (persist in /etc/sysctl.d/)",
            )),
            Ok(None) | Err(_) => self.push(Check::warn(
                names::HUGEPAGES,
                format!("no HugePages_Total in {}", meminfo.display()),
                "a kernel without hugetlbfs: if device mapping fails, use one with it",
            )),
        }
        let mp = r.hugepages_mount();
        let mp_s = mp.to_string_lossy();
        match read(&r.proc.join("mounts")) {
            Ok(m) if parse::has_mount(&m, &mp_s, "hugetlbfs") => self.push(Check::pass(
                names::HUGEPAGES_MOUNT,
                format!("hugetlbfs on {mp_s}"),
            )),
            Ok(_) => self.push(Check::warn(
                names::HUGEPAGES_MOUNT,
                format!("no hugetlbfs on {mp_s}"),
                format!("if device mapping fails: sudo mount -t hugetlbfs none {mp_s}"),
            )),
            Err(e) => self.push(Check::warn(
                names::HUGEPAGES_MOUNT,
                format!("cannot read the mount table: {e}"),
                format!("check `findmnt {mp_s}`"),
            )),
        }
    }

    fn xrt(&mut self) -> Option<XrtSmi> {
        let (root, source) = env::xrt_root(
            self.i.xrt_root_knob.as_deref(),
            self.i.xilinx_xrt.as_deref(),
        );
        let fix_install = "extract the XRT debs (dpkg-deb -x xrt_*.deb DIR, also the amdxdna plugin \
                           deb) and export ONEBIT_XRT_ROOT=DIR/opt/xilinx/xrt; never dpkg -i them";
        let lib = root.join("lib");
        let where_ = format!("{} ({source})", root.display());
        if !lib.is_dir() {
            self.push(Check::fail(
                names::XRT,
                format!("no XRT at {where_}: {} is missing", lib.display()),
                fix_install,
            ));
            return None;
        }
        // A name alone is not a library: a dangling symlink (a half-removed install) or a
        // directory would pass a listing but not the loader.
        let real = |prefix: &str| -> Vec<String> {
            files_starting(&lib, prefix)
                .into_iter()
                .filter(|n| lib.join(n).is_file())
                .collect()
        };
        let coreutil = real("libxrt_coreutil.so");
        let shim = real("libxrt_driver_xdna.so");
        if coreutil.is_empty() || shim.is_empty() {
            let missing = if coreutil.is_empty() {
                "libxrt_coreutil.so* (a loadable file)"
            } else {
                "libxrt_driver_xdna.so* (a loadable file: the NPU shim from the amdxdna plugin deb)"
            };
            self.push(Check::fail(
                names::XRT,
                format!("XRT at {where_} has no {missing} in {}", lib.display()),
                fix_install,
            ));
            return None;
        }
        // Version from files first (version.json, then the library's soname), then xrt-smi,
        // which also reports the NPU firmware it sees.
        let json_version = read(&root.join("version.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("BUILD_VERSION")?.as_str().map(String::from));
        let so_version = coreutil
            .iter()
            .filter_map(|n| soname_version(n))
            .max_by_key(|v| v.len())
            .map(String::from);
        let smi_path = root.join("bin/xrt-smi");
        let mut smi = None;
        let mut smi_note = String::new();
        if smi_path.is_file() {
            let env = [
                ("XILINX_XRT", root.clone().into_os_string()),
                ("LD_LIBRARY_PATH", lib.clone().into_os_string()),
            ];
            match self.host.run(&smi_path, &["examine"], &env) {
                Ok(out) if out.code == Some(0) => {
                    let s = parse::parse_xrt_smi(&out.stdout);
                    if s.devices == 0 {
                        smi_note = "; xrt-smi examine lists no device".into();
                    }
                    smi = Some(s);
                }
                Ok(out) => {
                    smi_note = format!(
                        "; xrt-smi examine failed ({}): {}",
                        out.code
                            .map_or("signal".to_string(), |c| format!("exit {c}")),
                        out.stderr
                            .lines()
                            .chain(out.stdout.lines())
                            .next()
                            .unwrap_or("")
                    )
                }
                Err(e) => smi_note = format!("; xrt-smi examine: {e}"),
            }
        }
        let version = json_version
            .or_else(|| smi.as_ref().and_then(|s| s.xrt_version.clone()))
            .or(so_version)
            .unwrap_or_else(|| "version unknown".into());
        let detail = format!("{version} at {where_}{smi_note}");
        if smi_note.is_empty() {
            self.push(Check::pass(names::XRT, detail));
        } else {
            self.push(Check::warn(
                names::XRT,
                detail,
                "run `xrt-smi examine` with XILINX_XRT and LD_LIBRARY_PATH set to this XRT and \
                 fix what it says (often the accel node's access or the firmware)",
            ));
        }
        smi
    }

    /// The venv line; false when there is no usable venv (the venv-dependent checks are then
    /// left out: this one line says what to do).
    fn venv(&mut self) -> bool {
        let Some(venv) = self.i.ryzenai_root.clone() else {
            self.push(Check::fail(
                names::VENV,
                "ONEBIT_RYZENAI_ROOT is not set: the NPU route is off",
                "export ONEBIT_RYZENAI_ROOT=<the RyzenAI 1.8 venv>",
            ));
            return false;
        };
        let fix = "ONEBIT_RYZENAI_ROOT must name the RyzenAI 1.8 venv (its deployment/lib holds \
                   libonnxruntime-genai.so and the provider)";
        let lib = env::venv_lib_dir(&venv);
        if !venv.is_dir() {
            self.push(Check::fail(
                names::VENV,
                format!("{} is not a directory", venv.display()),
                fix,
            ));
            return false;
        }
        if !lib.is_dir() {
            self.push(Check::fail(
                names::VENV,
                format!("{} is missing", lib.display()),
                fix,
            ));
            return false;
        }
        let genai = files_starting(&lib, "libonnxruntime-genai.so");
        if genai.is_empty() {
            self.push(Check::fail(
                names::VENV,
                format!("no libonnxruntime-genai.so in {}", lib.display()),
                fix,
            ));
            return false;
        }
        let ort = files_starting(&lib, "libonnxruntime.so");
        self.push(Check::pass(
            names::VENV,
            format!(
                "{} has {}{}",
                lib.display(),
                genai[0],
                ort.first().map(|o| format!(", {o}")).unwrap_or_default()
            ),
        ));
        true
    }

    fn venv_path(&self) -> PathBuf {
        self.i.ryzenai_root.clone().unwrap_or_default()
    }

    fn python(&mut self) {
        let venv = self.venv_path();
        let fix = "RyzenAI 1.8 needs python 3.12: recreate the venv with python3.12";
        if venv.join("bin/python3.12").exists() {
            self.push(Check::pass(names::PYTHON, "python3.12 (bin/python3.12)"));
            return;
        }
        let cfg = venv.join("pyvenv.cfg");
        match read(&cfg).ok().and_then(|t| parse::pyvenv_version(&t)) {
            Some(v) if v.starts_with("3.12.") || v == "3.12" => self.push(Check::pass(
                names::PYTHON,
                format!("python {v} (pyvenv.cfg)"),
            )),
            Some(v) => self.push(Check::fail(names::PYTHON, format!("python {v}"), fix)),
            None => self.push(Check::fail(
                names::PYTHON,
                format!("no bin/python3.12 and no version in {}", cfg.display()),
                fix,
            )),
        }
    }

    fn provider(&mut self) {
        let beside = self
            .i
            .worker_exe
            .as_deref()
            .and_then(Path::parent)
            .map(|d| d.join(PROVIDER_FILE))
            .filter(|p| p.is_file());
        let in_venv = env::venv_lib_dir(&self.venv_path()).join(PROVIDER_FILE);
        match beside {
            Some(p) => self.push(Check::pass(
                names::PROVIDER,
                format!("{} (beside the worker; wins over the venv's)", p.display()),
            )),
            None if in_venv.is_file() => {
                self.push(Check::pass(names::PROVIDER, in_venv.display().to_string()))
            }
            None => self.push(Check::fail(
                names::PROVIDER,
                format!(
                    "no {PROVIDER_FILE} in {}",
                    in_venv.parent().unwrap_or(&in_venv).display()
                ),
                "install the RyzenAI 1.8 venv completely (its deployment/lib ships the provider)",
            )),
        }
    }

    fn stale_xrt(&mut self) {
        let site = self.venv_path().join("lib/python3.12/site-packages");
        let mut found = Vec::new();
        find_files(&site, "libxrt_coreutil.so", 8, &mut found);
        found.sort();
        if found.is_empty() {
            self.push(Check::pass(
                names::STALE_XRT,
                "no libxrt_coreutil.so bundled in the venv",
            ));
            return;
        }
        let (xrt, _) = env::xrt_root(
            self.i.xrt_root_knob.as_deref(),
            self.i.xilinx_xrt.as_deref(),
        );
        let list: Vec<String> = found
            .iter()
            .map(|p| p.strip_prefix(&site).unwrap_or(p).display().to_string())
            .collect();
        let own = files_starting(&xrt.join("lib"), "libxrt_coreutil.so");
        if own.is_empty() {
            self.push(Check::fail(
                names::STALE_XRT,
                format!(
                    "the venv bundles {} and {}/lib has none to put before it",
                    list.join(", "),
                    xrt.display()
                ),
                "point ONEBIT_XRT_ROOT at a real XRT (extracted debs); the bundled copy is stale",
            ));
        } else {
            self.push(Check::pass(
                names::STALE_XRT,
                format!(
                    "the venv bundles {} (stale) outside the worker's LD_LIBRARY_PATH; {}/lib is \
                     on it, and the loader searches it before a library's RUNPATH, so the stale \
                     copy does not win",
                    list.join(", "),
                    xrt.display()
                ),
            ));
        }
    }

    /// The worker's environment as the parent would plan it; returns the plan when it is set.
    fn worker_env(&mut self) -> Option<env::WorkerEnv> {
        let inputs = EnvInputs {
            provider_declared: true,
            ryzenai_root: self.i.ryzenai_root.clone(),
            xrt_root_knob: self.i.xrt_root_knob.clone(),
            xilinx_xrt: self.i.xilinx_xrt.clone(),
            ld_library_path: std::env::var_os(env::LD_LIBRARY_PATH_VAR),
            ryzenai_ep_path: crate::native::env_path(env::RYZENAI_EP_PATH_VAR),
            system_lib_dir: Some(env::system_lib_dir()),
            worker_exe: self.i.worker_exe.clone().unwrap_or_default(),
        };
        match env::worker_env(&inputs) {
            Ok(EnvPlan::Set(w)) => {
                self.push(Check::pass(names::WORKER_ENV, w.to_string()));
                Some(w)
            }
            Ok(EnvPlan::Unchanged(why)) => {
                self.push(Check::warn(
                    names::WORKER_ENV,
                    format!("unchanged: {why}"),
                    "set ONEBIT_RYZENAI_ROOT",
                ));
                None
            }
            Err(e) => {
                self.push(Check::fail(
                    names::WORKER_ENV,
                    e.to_string(),
                    "move the venv/XRT to a path without ':'",
                ));
                None
            }
        }
    }

    fn firmware_version(&mut self, pci: Option<&Pci>, smi: Option<&XrtSmi>) {
        let mut candidates = vec![self.roots().accel_sysfs_device().join("fw_version")];
        if let Some(p) = pci {
            candidates.push(p.dir.join("fw_version"));
        }
        let from_sysfs = candidates
            .iter()
            .find_map(|p| read(p).ok().map(|v| (v.trim().to_string(), "sysfs")));
        let found = from_sysfs.or_else(|| {
            smi.and_then(|s| s.firmware_version.clone())
                .map(|v| (v, "xrt-smi"))
        });
        self.version_line(
            names::FW_VERSION,
            found,
            MIN_FIRMWARE,
            "a newer linux-firmware (amdnpu) with a kernel whose amdxdna speaks its protocol",
            (
                "no fw_version in sysfs and no answer from xrt-smi",
                "read it with `xrt-smi examine`",
            ),
        );
    }

    fn drm_version(&mut self, ioctl: Option<String>, log: Option<&str>) {
        let found = ioctl.map(|v| (v, "DRM_IOCTL_VERSION")).or_else(|| {
            log.and_then(parse::drm_version_from_log)
                .map(|v| (v, "kernel log"))
        });
        self.version_line(
            names::DRM_VERSION,
            found,
            MIN_DRM,
            "a newer kernel (amdxdna DRM version rises with it)",
            (
                "no \"Initialized amdxdna\" line in a readable kernel log",
                "sudo dmesg | grep 'Initialized amdxdna'",
            ),
        );
    }

    /// Versions below the reference's minimums are WARN, not FAIL: those minimums are
    /// FastFlowLM's, and the RyzenAI route is not known to need them; the kernel-log check
    /// fails the concrete symptoms ("HW Context is not ready", protocol mismatch).
    fn version_line(
        &mut self,
        name: &'static str,
        found: Option<(String, &str)>,
        min: &str,
        upgrade: &str,
        (unknown, how_to_read): (&str, &str),
    ) {
        let Some((v, from)) = found else {
            self.push(Check::warn(
                name,
                format!("unknown: {unknown}"),
                how_to_read,
            ));
            return;
        };
        let min_parts = parse::version_parts(min).unwrap_or_default();
        match parse::version_parts(&v).map(|p| parse::compare_versions(&p, &min_parts)) {
            Some(Ordering::Less) => self.push(Check::warn(
                name,
                format!("{v} ({from}) is below {min}, the minimum known to work for NPU LLMs"),
                format!("if NPU loads fail: {upgrade}"),
            )),
            Some(_) => self.push(Check::pass(name, format!("{v} ({from}), >= {min}"))),
            None => self.push(Check::warn(
                name,
                format!("{v:?} ({from}) is not a version"),
                "read it with `xrt-smi examine`",
            )),
        }
    }

    /// Known failures each get a FAIL line; any other NPU-driver line that says
    /// fail/error/timeout is a WARN. PASS needs driver lines to have been read: with amdxdna not
    /// loaded, or no driver line left in the log, there is nothing to vouch for (SKIP), unless
    /// a failure (a module that could not load) is there.
    fn kernel_log(&mut self, log: Result<String, super::NpuError>, module_loaded: bool) {
        let log = match log {
            Ok(l) => l,
            Err(e) => {
                self.push(Check::warn(
                    names::KERNEL_LOG,
                    format!("not readable: {e}"),
                    "sudo dmesg | grep -iE 'xdna|aie2' (kernel.dmesg_restrict blocks users)",
                ));
                return;
            }
        };
        let ours: Vec<&str> = log
            .lines()
            .filter(|l| parse::is_npu_driver_line(l))
            .collect();
        let known = |l: &str| KNOWN_KERNEL_FAILURES.iter().any(|(p, _, _)| l.contains(p));
        let mut any = false;
        for (pattern, what, fix) in KNOWN_KERNEL_FAILURES {
            let hits: Vec<&str> = ours
                .iter()
                .copied()
                .filter(|l| l.contains(pattern))
                .collect();
            if let Some(last) = hits.last() {
                any = true;
                self.push(Check::fail(
                    names::KERNEL_LOG,
                    format!("{what}: {} ({} since boot)", last.trim(), hits.len()),
                    *fix,
                ));
            }
        }
        let other: Vec<&str> = ours
            .iter()
            .copied()
            .filter(|l| parse::says_failure(l) && !known(l))
            .collect();
        if let Some(last) = other.last() {
            any = true;
            self.push(Check::warn(
                names::KERNEL_LOG,
                format!(
                    "{} other NPU driver line(s) reporting fail/error/timeout since boot; last: {}",
                    other.len(),
                    last.trim()
                ),
                "read them all: sudo dmesg | grep -iE 'xdna|aie2'; one timeout on the first \
                 request after idle is known (retried); repeated ones are worth a bug report \
                 with scripts/npu-check.sh's report",
            ));
        }
        if any {
            return;
        }
        if !module_loaded {
            self.push(Check::skip(
                names::KERNEL_LOG,
                "amdxdna is not loaded: there is no driver activity in the kernel log to check",
                "load amdxdna (see the module line), then run doctor again",
            ));
        } else if ours.is_empty() {
            self.push(Check::skip(
                names::KERNEL_LOG,
                "amdxdna is loaded but the kernel log has none of its lines (the ring buffer \
                 has wrapped since boot?)",
                "journalctl -k -b | grep -iE 'xdna|aie2' (the journal keeps what dmesg lost)",
            ));
        } else {
            self.push(Check::pass(
                names::KERNEL_LOG,
                format!(
                    "{} NPU driver line(s) since boot, none reporting a failure",
                    ours.len()
                ),
            ));
        }
    }

    /// The venv's ONNX Runtime and onnxruntime-genai versions against what this build pairs:
    /// our own engine needs ONNX Runtime >= [`runtime::min_version`], and the provider works only
    /// with the venv's runtime, so below that only onnxruntime-genai's own loop can run.
    fn venv_runtime(&mut self) {
        let venv = self.venv_path();
        let packages = venv_packages(&venv);
        // The library itself says what the worker will load; its version needs a real library
        // (dlopen), so a venv whose library will not open falls back to pip's record.
        let ort = runtime::venv_runtime(&venv)
            .ok()
            .and_then(|p| runtime::lib_version(&p).map(|v| (v, p.display().to_string())))
            .or_else(|| {
                packages
                    .iter()
                    .find(|p| is_runtime_package(&p.name))
                    .map(|p| (p.version.clone(), p.shown.clone()))
            });
        let genai = packages
            .iter()
            .find(|p| p.name.starts_with("onnxruntime_genai"))
            .map_or(
                "onnxruntime-genai version unknown (no onnxruntime_genai*.dist-info)".into(),
                |p| format!("onnxruntime-genai {} ({})", p.version, p.shown),
            );
        let min = runtime::min_version();
        match ort {
            None => self.push(Check::warn(
                names::VENV_RUNTIME,
                format!(
                    "ONNX Runtime version unknown (no loadable libonnxruntime.so and no \
                     onnxruntime*.dist-info in {}); {genai}",
                    venv.display()
                ),
                format!(
                    "{}/bin/python -c 'import onnxruntime; print(onnxruntime.__version__)'; our \
                     engine needs >= {min}, --engine oga runs with any",
                    venv.display()
                ),
            )),
            Some((v, from)) if runtime::version_supported(&v) => self.push(Check::pass(
                names::VENV_RUNTIME,
                format!(
                    "ONNX Runtime {v} ({from}) >= {min}: our engine and --engine oga can run; {genai}"
                ),
            )),
            Some((v, from)) => self.push(Check::warn(
                names::VENV_RUNTIME,
                format!(
                    "ONNX Runtime {v} ({from}) is below {min}, which our own engine needs: only \
                     --engine oga (onnxruntime-genai's loop in the venv) can run; {genai}"
                ),
                format!(
                    "run with --engine oga, or install a Ryzen AI Software release whose ONNX \
                     Runtime is >= {min}"
                ),
            )),
        }
    }
}

/// A Python package installed in the venv, from its dist-info METADATA.
struct VenvPackage {
    /// Normalized (PEP 503) name.
    name: String,
    version: String,
    /// Where it was read, for the report.
    shown: String,
}

/// The onnxruntime* packages in `<venv>/lib/python3*/site-packages`.
fn venv_packages(venv: &Path) -> Vec<VenvPackage> {
    let mut sites: Vec<PathBuf> = fs::read_dir(venv.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .map(|e| e.path().join("site-packages"))
        .collect();
    sites.sort();
    let mut out = Vec::new();
    for site in sites {
        for dist in files_starting(&site, "onnxruntime") {
            if !dist.ends_with(".dist-info") {
                continue;
            }
            let meta = site.join(&dist).join("METADATA");
            if let Some((name, version)) =
                read(&meta).ok().and_then(|t| parse::dist_info_metadata(&t))
            {
                out.push(VenvPackage {
                    name: parse::normalize_package_name(&name),
                    version,
                    shown: format!("{dist} METADATA"),
                });
            }
        }
    }
    out
}

/// ONNX Runtime itself under any of its distribution names (onnxruntime, onnxruntime-vitisai,
/// onnxruntime-gpu, ...), not the separately versioned genai and extensions packages.
fn is_runtime_package(normalized: &str) -> bool {
    normalized == "onnxruntime"
        || (normalized.starts_with("onnxruntime_")
            && !normalized.starts_with("onnxruntime_genai")
            && !normalized.starts_with("onnxruntime_extensions"))
}

/// Files whose name starts with `prefix` under `dir`, without following symlinks, at most
/// `depth` levels down (site-packages is deep but the bundled libraries sit near the top).
fn find_files(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(ft) = e.file_type() else { continue };
        let name = e.file_name();
        if name.to_string_lossy().starts_with(prefix) && !ft.is_dir() {
            out.push(e.path());
        } else if ft.is_dir() && depth > 0 {
            find_files(&e.path(), prefix, depth - 1, out);
        }
    }
}

#[cfg(test)]
mod tests;
