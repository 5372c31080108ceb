//! The amdxdna driver's hardware-context counters: per context, the owning process and how many
//! commands it submitted to the NPU and how many the NPU completed. Every mainline amdxdna has
//! them (what `xrt-smi examine -r aie-partitions` shows), unlike fdinfo busy time, which only
//! AMD's out-of-tree and staging drivers print. A context of this process whose
//! `command_completions` grows while it decodes is the device's own word that the NPU ran its
//! work.
//!
//! The ABI, from the kernel's `include/uapi/drm/amdxdna_accel.h` and `drivers/accel/amdxdna/`
//! (sizes and offsets checked in the tests below):
//!
//! - `DRM_IOCTL_AMDXDNA_GET_ARRAY` (`_IOWR('d', 0x40 + 10, struct amdxdna_drm_get_array)`,
//!   driver version 0.1 and later, Linux 6.18) with `DRM_AMDXDNA_HW_CONTEXT_ALL`: an array of
//!   `struct amdxdna_drm_hwctx_entry` (144 bytes in mainline, 160 in AMD's trees). The kernel
//!   packs entries at `min(element_size asked, its own size)` and writes that stride back into
//!   `element_size` and the count written into `num_element`. A buffer too small is silently
//!   truncated (6.18.2 and later), `-EINVAL` (6.18.0/1) or `-ENOSPC` with the count needed
//!   (AMD's DKMS driver).
//! - `DRM_IOCTL_AMDXDNA_GET_INFO` (`_IOWR('d', 0x40 + 7, struct amdxdna_drm_get_info)`) with
//!   `DRM_AMDXDNA_QUERY_HW_CONTEXTS`: 64-byte `struct amdxdna_drm_query_hwctx` records. Before
//!   driver 0.1 (and in AMD's DKMS driver) `buffer_size` comes back as the bytes all contexts
//!   need, and a buffer too small is `-EINVAL`; from 0.1 on it comes back as the bytes left
//!   unused.
//! - In both records `context_id` is at 0, `pid` (the opener's pid in the initial PID namespace)
//!   at 16, `command_submissions` at 24, `command_completions` at 32.
//!
//! Driver-specific DRM ioctls are dispatched by number alone, so `DRM_IOCTL_VERSION` must name
//! `amdxdna_accel_driver` before either is sent. A file that is not a DRM device answers
//! `ENOTTY`: the counters are then "unavailable", which proves nothing.
//!
//! The ioctls go through [`Ioctl`], so tests feed byte buffers laid out as the kernel writes
//! them through the same parsing code; [`AccelFd`] is the real device.

use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// The DRM driver name every amdxdna build registers.
pub const DRIVER_NAME: &str = "amdxdna_accel_driver";

/// `DRM_IOWR(0x00, struct drm_version)`: 64-byte argument on 64-bit Linux.
pub const DRM_IOCTL_VERSION: u64 = ioc_rw(0x00, DRM_VERSION_SIZE);
/// `DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDXDNA_GET_INFO, struct amdxdna_drm_get_info)`.
pub const DRM_IOCTL_AMDXDNA_GET_INFO: u64 = ioc_rw(0x40 + 7, GET_INFO_SIZE);
/// `DRM_IOWR(DRM_COMMAND_BASE + DRM_AMDXDNA_GET_ARRAY, struct amdxdna_drm_get_array)`.
pub const DRM_IOCTL_AMDXDNA_GET_ARRAY: u64 = ioc_rw(0x40 + 10, GET_ARRAY_SIZE);
/// `enum amdxdna_drm_get_param`: `DRM_AMDXDNA_QUERY_HW_CONTEXTS`.
pub const DRM_AMDXDNA_QUERY_HW_CONTEXTS: u32 = 5;
/// GET_ARRAY param `DRM_AMDXDNA_HW_CONTEXT_ALL`.
pub const DRM_AMDXDNA_HW_CONTEXT_ALL: u32 = 0;

/// `sizeof(struct drm_version)` on LP64.
pub const DRM_VERSION_SIZE: usize = 64;
/// `sizeof(struct amdxdna_drm_get_info)`: param u32 @0, buffer_size u32 @4, buffer u64 @8.
pub const GET_INFO_SIZE: usize = 16;
/// `sizeof(struct amdxdna_drm_get_array)`: param @0, element_size @4, num_element @8, pad @12,
/// buffer u64 @16.
pub const GET_ARRAY_SIZE: usize = 24;
/// `sizeof(struct amdxdna_drm_query_hwctx)`.
pub const QUERY_HWCTX_SIZE: usize = 64;
/// `sizeof(struct amdxdna_drm_hwctx_entry)` in mainline (AMD's trees append a 16-byte name).
pub const HWCTX_ENTRY_SIZE: usize = 144;
/// Field offsets shared by both record layouts.
pub const CONTEXT_ID_AT: usize = 0;
pub const START_COL_AT: usize = 4;
pub const NUM_COL_AT: usize = 8;
pub const PID_AT: usize = 16;
pub const SUBMISSIONS_AT: usize = 24;
pub const COMPLETIONS_AT: usize = 32;
/// The kernel's limit on `num_element` (6.18.2 and later; AMD's DKMS driver too).
pub const MAX_ENTRIES: u32 = 1024;
/// Entries asked for first; more only when they may not have fit.
const FIRST_ENTRIES: u32 = 64;

const fn ioc_rw(nr: u64, size: usize) -> u64 {
    // _IOC(_IOC_READ | _IOC_WRITE, 'd', nr, size): dir << 30 | size << 16 | type << 8 | nr.
    (3 << 30) | ((size as u64) << 16) | ((b'd' as u64) << 8) | nr
}

/// One ioctl on an accel fd. `arg` is the argument struct exactly as the kernel lays it out; its
/// user-pointer fields, where it has them, point at `data`. The kernel (or a fake) writes its
/// answer into both.
pub trait Ioctl {
    fn ioctl(&self, request: u64, arg: &mut [u8], data: &mut [u8]) -> io::Result<()>;
}

/// An fd this process opened on the accel node: its own DRM client.
///
/// Never a duplicate of another fd on the node (XRT's above all): `close(2)` runs the file's
/// `flush` on every descriptor closed, not only the last, and amdxdna's flush (mainline 6.14
/// through at least 6.18; AMD's DKMS driver when the closing task is the opener's process)
/// destroys every hardware context of the file's DRM client. A duplicate shares the struct file,
/// hence XRT's client: closing it would tear down the session's contexts. An fd of our own is a
/// client with no contexts, whose flush harms nothing.
pub struct AccelFd(OwnedFd);

impl AccelFd {
    pub fn open(path: &Path) -> io::Result<Self> {
        // O_CLOEXEC (std's default): no child may inherit it. The worker spawns nothing once
        // the NPU session exists (`npu::fork_guard`), but a child inheriting this fd would
        // only close our own, context-free client.
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(AccelFd(f.into()))
    }

    /// The descriptor's number (to tell our own fd from XRT's in `/proc/self/fd`).
    pub fn raw(&self) -> i32 {
        self.0.as_raw_fd()
    }
}

impl Ioctl for AccelFd {
    fn ioctl(&self, request: u64, arg: &mut [u8], _data: &mut [u8]) -> io::Result<()> {
        // The kernel reads and writes _IOC_SIZE(request) bytes at `arg`: never more than it has.
        if arg.len() != ((request >> 16) & 0x3fff) as usize {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut tries = 0;
        loop {
            tries += 1;
            // SAFETY: `arg` is a buffer of the size the request encodes, laid out as the kernel's
            // struct; its pointer fields point into `data`, which outlives the call and is as
            // long as the lengths given beside those pointers.
            let r = unsafe {
                libc::ioctl(
                    self.0.as_raw_fd(),
                    request as libc::c_ulong,
                    arg.as_mut_ptr(),
                )
            };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            // As libdrm's drmIoctl: an interrupted call is made again (a bounded number of times).
            if !matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN)) || tries >= 8 {
                return Err(e);
            }
        }
    }
}

/// The DRM driver behind an fd (`DRM_IOCTL_VERSION`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverVersion {
    pub name: String,
    pub major: i32,
    pub minor: i32,
    pub patch: i32,
}

impl fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}.{}.{}",
            self.name, self.major, self.minor, self.patch
        )
    }
}

impl DriverVersion {
    /// GET_ARRAY exists from mainline 0.1 on; AMD's DKMS driver is 1.x.
    pub fn has_get_array(&self) -> bool {
        self.major >= 1 || self.minor >= 1
    }

    /// GET_INFO's `buffer_size` comes back as the bytes still free (mainline 0.1 and later),
    /// not as the bytes all contexts need (0.0, and AMD's DKMS driver).
    fn info_returns_remainder(&self) -> bool {
        self.major == 0 && self.minor >= 1
    }
}

/// One hardware context as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HwContext {
    pub context_id: u32,
    /// The process that opened the device, in the initial PID namespace.
    pub pid: i64,
    pub start_col: u32,
    pub num_col: u32,
    pub command_submissions: u64,
    pub command_completions: u64,
}

/// Which query answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Query {
    /// `DRM_IOCTL_AMDXDNA_GET_ARRAY` / `DRM_AMDXDNA_HW_CONTEXT_ALL`.
    GetArray,
    /// `DRM_IOCTL_AMDXDNA_GET_INFO` / `DRM_AMDXDNA_QUERY_HW_CONTEXTS`.
    GetInfo,
}

impl fmt::Display for Query {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Query::GetArray => "GET_ARRAY(HW_CONTEXT_ALL)",
            Query::GetInfo => "GET_INFO(QUERY_HW_CONTEXTS)",
        })
    }
}

/// Every hardware context on the device at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HwContexts {
    pub driver: DriverVersion,
    pub query: Query,
    pub contexts: Vec<HwContext>,
}

impl HwContexts {
    /// The contexts with this (driver) pid and id: one, or several where two DRM clients of one
    /// process both numbered a context alike (ids are unique per client only).
    fn with(&self, pid: i64, id: u32) -> impl Iterator<Item = &HwContext> + '_ {
        self.contexts
            .iter()
            .filter(move |c| c.pid == pid && c.context_id == id)
    }

    /// Commands the NPU completed for `ours` (`None`: none of its contexts is there any more).
    pub fn completions_of(&self, ours: &Ours) -> Option<u64> {
        let mut found = false;
        let mut sum = 0u64;
        for &id in &ours.context_ids {
            for c in self.with(ours.pid, id) {
                found = true;
                sum = sum.saturating_add(c.command_completions);
            }
        }
        found.then_some(sum)
    }

    /// The ids of `ours` this reading no longer has (the driver destroyed them).
    pub fn missing(&self, ours: &Ours) -> Vec<u32> {
        ours.context_ids
            .iter()
            .copied()
            .filter(|&id| self.with(ours.pid, id).next().is_none())
            .collect()
    }

    /// The distinct pids of the contexts, sorted.
    pub fn pids(&self) -> Vec<i64> {
        let mut p: Vec<i64> = self.contexts.iter().map(|c| c.pid).collect();
        p.sort_unstable();
        p.dedup();
        p
    }
}

/// How a session's hardware contexts were told from other processes'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Identified {
    /// They appeared across the session's creation and carry this process's pid.
    CreationAndPid,
    /// They appeared across the session's creation, all under one pid that held no context
    /// before and is not this process's own: the driver records the pid of the initial PID
    /// namespace, which a process inside a container does not see.
    Creation,
}

/// One session's hardware contexts: the pid the driver records for them and their ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ours {
    pub pid: i64,
    pub context_ids: Vec<u32>,
    pub identified: Identified,
}

/// Why no context could be told to be this session's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unidentified {
    #[error(
        "no hardware context appeared across this worker's session creation and evidence run \
         ({count} on the device, of pids {pids:?})"
    )]
    NoneAppeared { count: usize, pids: Vec<i64> },
    #[error(
        "the only contexts that appeared across this worker's session creation are of pid \
         {pid}, which held contexts before the session existed: another process's (this process \
         is pid {own})"
    )]
    OldPid { pid: i64, own: i64 },
    #[error(
        "the only contexts that appeared across this worker's session creation are of pid \
         {pid}, not this process's {own}, and this process is in the initial PID namespace, \
         where the driver records its own pid: another process's"
    )]
    OtherProcess { pid: i64, own: i64 },
    #[error(
        "the only contexts that appeared across this worker's session creation are of pid \
         {pid}, not this process's {own}, and whether this process is in a PID namespace could \
         not be read ({proc_ns}): they may be another process's"
    )]
    NamespaceUnknown { pid: i64, own: i64, proc_ns: String },
    #[error(
        "contexts of pids {pids:?} appeared across this worker's session creation, none with \
         its pid {own}: which are its own cannot be told"
    )]
    Several { pids: Vec<i64>, own: i64 },
}

/// This session's contexts: those in `after` (read once the session exists and has run) that
/// were not in `at_load` (read before it was created), keyed by (pid, id) since ids are unique
/// per DRM client only. `own_pid` is this process's pid as it sees itself: where a new context
/// carries it, those are ours. Otherwise the new contexts count only when they all carry one pid
/// that held none before and this process is in a PID namespace of its own (`initial_ns`:
/// `Some(false)`), where the driver records a pid it cannot see. Anything else cannot be told
/// apart from another process's work and identifies nothing.
pub fn identify(
    at_load: &HwContexts,
    after: &HwContexts,
    own_pid: i64,
    initial_ns: Option<bool>,
) -> Result<Ours, Unidentified> {
    let existed = |c: &HwContext| {
        at_load
            .contexts
            .iter()
            .any(|b| b.pid == c.pid && b.context_id == c.context_id)
    };
    let new: Vec<&HwContext> = after.contexts.iter().filter(|c| !existed(c)).collect();
    let ids_of = |pid: i64| {
        let mut ids: Vec<u32> = new
            .iter()
            .filter(|c| c.pid == pid)
            .map(|c| c.context_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    };
    if new.iter().any(|c| c.pid == own_pid) {
        return Ok(Ours {
            pid: own_pid,
            context_ids: ids_of(own_pid),
            identified: Identified::CreationAndPid,
        });
    }
    let mut pids: Vec<i64> = new.iter().map(|c| c.pid).collect();
    pids.sort_unstable();
    pids.dedup();
    let own = own_pid;
    match (pids.as_slice(), initial_ns) {
        ([], _) => Err(Unidentified::NoneAppeared {
            count: after.contexts.len(),
            pids: after.pids(),
        }),
        ([pid], _) if at_load.contexts.iter().any(|c| c.pid == *pid) => {
            Err(Unidentified::OldPid { pid: *pid, own })
        }
        ([pid], Some(true)) => Err(Unidentified::OtherProcess { pid: *pid, own }),
        ([pid], None) => Err(Unidentified::NamespaceUnknown {
            pid: *pid,
            own,
            proc_ns: "its /proc/self/ns/pid is unreadable".into(),
        }),
        ([pid], Some(false)) => Ok(Ours {
            pid: *pid,
            context_ids: ids_of(*pid),
            identified: Identified::Creation,
        }),
        (many, _) => Err(Unidentified::Several {
            pids: many.to_vec(),
            own,
        }),
    }
}

/// The inode of the initial PID namespace (the kernel's `PROC_PID_INIT_INO`), which
/// `/proc/self/ns/pid` names as `pid:[4026531836]`.
pub const INITIAL_PID_NS: &str = "pid:[4026531836]";

/// Whether this process is in the initial PID namespace, where the driver's pids are its own
/// (`None`: `<proc>/self/ns/pid` could not be read).
pub fn in_initial_pid_namespace(proc_root: &Path) -> Option<bool> {
    std::fs::read_link(proc_root.join("self/ns/pid"))
        .ok()
        .map(|l| l.as_os_str() == INITIAL_PID_NS)
}

/// Commands completed for `ours` between two readings: the growth of each of its contexts (a
/// context new in `after` counts from 0; one gone from `after` counts nothing).
pub fn completed_between(before: &HwContexts, after: &HwContexts, ours: &Ours) -> u64 {
    ours.context_ids
        .iter()
        .map(|&id| {
            let sum = |r: &HwContexts| {
                r.with(ours.pid, id)
                    .map(|c| c.command_completions)
                    .fold(0u64, u64::saturating_add)
            };
            sum(after).saturating_sub(sum(before))
        })
        .sum()
}

/// Why the counters could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountersError {
    /// The accel node could not be opened: the query did not run.
    #[error("counters not read: {0}")]
    Open(String),
    /// The device answers no such query (not a DRM device, another driver): the counters do not
    /// exist here, which is no evidence either way.
    #[error("counters unavailable: {0}")]
    Unavailable(String),
    /// The query exists but failed.
    #[error("counters unreadable: {0}")]
    Failed(String),
}

impl CountersError {
    /// The reason alone, without the variant's words.
    pub fn reason(&self) -> &str {
        match self {
            CountersError::Open(r) | CountersError::Unavailable(r) | CountersError::Failed(r) => r,
        }
    }
}

fn errno_name(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOTTY) => "ENOTTY".into(),
        Some(libc::EINVAL) => "EINVAL".into(),
        Some(libc::EOPNOTSUPP) => "EOPNOTSUPP".into(),
        Some(libc::ENOSPC) => "ENOSPC".into(),
        Some(libc::EACCES) => "EACCES".into(),
        Some(libc::EPERM) => "EPERM".into(),
        Some(libc::ENODEV) => "ENODEV".into(),
        _ => e.to_string(),
    }
}

fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_ne_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_ne_bytes(a)
}

/// `DRM_IOCTL_VERSION` with a name buffer; date and description are not asked for.
pub fn driver_version(dev: &dyn Ioctl) -> Result<DriverVersion, CountersError> {
    let mut name = [0u8; 64];
    let mut arg = [0u8; DRM_VERSION_SIZE];
    put_u64(&mut arg, 16, name.len() as u64);
    put_u64(&mut arg, 24, name.as_mut_ptr() as u64);
    dev.ioctl(DRM_IOCTL_VERSION, &mut arg, &mut name)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENOTTY) => {
                CountersError::Unavailable("DRM_IOCTL_VERSION: ENOTTY (not a DRM device)".into())
            }
            _ => CountersError::Failed(format!("DRM_IOCTL_VERSION: {}", errno_name(&e))),
        })?;
    // The kernel copies min(strlen, name_len) bytes without a NUL and sets name_len to strlen.
    let len = (u64_at(&arg, 16) as usize).min(name.len());
    let int = |at| u32_at(&arg, at) as i32;
    Ok(DriverVersion {
        name: String::from_utf8_lossy(&name[..len]).into_owned(),
        major: int(0),
        minor: int(4),
        patch: int(8),
    })
}

/// [`read_contexts`] through a fresh fd on the accel node at `node`.
pub fn read_node(node: &Path) -> Result<HwContexts, CountersError> {
    let dev = AccelFd::open(node)
        .map_err(|e| CountersError::Open(format!("opening {}: {e}", node.display())))?;
    read_contexts(&dev)
}

/// Reads every hardware context: GET_ARRAY where the driver has it, and GET_INFO whenever
/// GET_ARRAY did not answer, for whatever reason: "no such query" (older drivers, Linux
/// 6.18.0/1 on a full buffer) as XRT's own shim falls back, but also any other failure (AMD's
/// DKMS driver fails the whole GET_ARRAY when its firmware health query fails, while GET_INFO
/// still answers).
pub fn read_contexts(dev: &dyn Ioctl) -> Result<HwContexts, CountersError> {
    let driver = driver_version(dev)?;
    if driver.name != DRIVER_NAME {
        return Err(CountersError::Unavailable(format!(
            "the accel device's driver is {driver}, not {DRIVER_NAME}"
        )));
    }
    let mut array_error = None;
    if driver.has_get_array() {
        match get_array(dev) {
            Ok(contexts) => {
                return Ok(HwContexts {
                    driver,
                    query: Query::GetArray,
                    contexts,
                });
            }
            Err(e) => {
                tracing::debug!("{}: {}; trying GET_INFO", Query::GetArray, errno_name(&e));
                array_error = Some(e);
            }
        }
    }
    match get_info(dev, &driver) {
        Ok(contexts) => Ok(HwContexts {
            driver,
            query: Query::GetInfo,
            contexts,
        }),
        Err(e) => {
            let info = query_error(Query::GetInfo, &e);
            match array_error {
                // GET_ARRAY said "no such query": GET_INFO's failure is the whole story.
                Some(a) if !matches!(a.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                    Err(CountersError::Failed(format!(
                        "{}: {}, then {}",
                        Query::GetArray,
                        errno_name(&a),
                        info.reason()
                    )))
                }
                _ => Err(info),
            }
        }
    }
}

fn query_error(q: Query, e: &io::Error) -> CountersError {
    match e.raw_os_error() {
        Some(libc::ENOTTY | libc::EOPNOTSUPP) => {
            CountersError::Unavailable(format!("{q}: {}", errno_name(e)))
        }
        _ => CountersError::Failed(format!("{q}: {}", errno_name(e))),
    }
}

fn parse_records(buf: &[u8], stride: usize, n: usize) -> Vec<HwContext> {
    buf.chunks_exact(stride)
        .take(n)
        .map(|r| HwContext {
            context_id: u32_at(r, CONTEXT_ID_AT),
            start_col: u32_at(r, START_COL_AT),
            num_col: u32_at(r, NUM_COL_AT),
            pid: u64_at(r, PID_AT) as i64,
            command_submissions: u64_at(r, SUBMISSIONS_AT),
            command_completions: u64_at(r, COMPLETIONS_AT),
        })
        .collect()
}

fn bad_answer(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

fn get_array(dev: &dyn Ioctl) -> io::Result<Vec<HwContext>> {
    let mut cap = FIRST_ENTRIES;
    loop {
        let mut buf = vec![0u8; cap as usize * HWCTX_ENTRY_SIZE];
        let mut arg = [0u8; GET_ARRAY_SIZE];
        put_u32(&mut arg, 0, DRM_AMDXDNA_HW_CONTEXT_ALL);
        put_u32(&mut arg, 4, HWCTX_ENTRY_SIZE as u32);
        put_u32(&mut arg, 8, cap);
        put_u64(&mut arg, 16, buf.as_mut_ptr() as u64);
        match dev.ioctl(DRM_IOCTL_AMDXDNA_GET_ARRAY, &mut arg, &mut buf) {
            Ok(()) => {}
            // AMD's DKMS driver: num_element is the count needed.
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) && cap < MAX_ENTRIES => {
                cap = u32_at(&arg, 8).clamp(cap + 1, MAX_ENTRIES);
                continue;
            }
            Err(e) => return Err(e),
        }
        let stride = u32_at(&arg, 4) as usize;
        let n = u32_at(&arg, 8);
        if !(COMPLETIONS_AT + 8..=HWCTX_ENTRY_SIZE).contains(&stride) {
            return Err(bad_answer(format!(
                "GET_ARRAY answered element_size {stride}"
            )));
        }
        // Entries are packed at the stride the kernel chose; the capacity it had is in bytes.
        let fits = (cap as usize * HWCTX_ENTRY_SIZE / stride) as u32;
        if n > fits {
            return Err(bad_answer(format!(
                "GET_ARRAY answered {n} entries for room for {fits}"
            )));
        }
        // A full buffer may have been cut short without a word (Linux 6.18.2 and later).
        if n == fits && cap < MAX_ENTRIES {
            cap = (cap * 4).min(MAX_ENTRIES);
            continue;
        }
        return Ok(parse_records(&buf, stride, n as usize));
    }
}

fn get_info(dev: &dyn Ioctl, driver: &DriverVersion) -> io::Result<Vec<HwContext>> {
    let remainder = driver.info_returns_remainder();
    let mut cap = FIRST_ENTRIES as usize;
    loop {
        let size = cap * QUERY_HWCTX_SIZE;
        let mut buf = vec![0u8; size];
        let mut arg = [0u8; GET_INFO_SIZE];
        put_u32(&mut arg, 0, DRM_AMDXDNA_QUERY_HW_CONTEXTS);
        put_u32(&mut arg, 4, size as u32);
        put_u64(&mut arg, 8, buf.as_mut_ptr() as u64);
        let answer = dev.ioctl(DRM_IOCTL_AMDXDNA_GET_INFO, &mut arg, &mut buf);
        let out = u32_at(&arg, 4) as usize;
        let grow = |cap: usize| (cap * 4).min(MAX_ENTRIES as usize);
        match answer {
            // Before driver 0.1: buffer_size is the bytes every context needs.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !remainder => {
                let need = out.div_ceil(QUERY_HWCTX_SIZE);
                if need <= cap || cap >= MAX_ENTRIES as usize {
                    return Err(e);
                }
                cap = need.min(MAX_ENTRIES as usize);
                continue;
            }
            // 6.18.0/1: too small is EINVAL too, with no count; ask for more.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && cap < MAX_ENTRIES as usize => {
                cap = grow(cap);
                continue;
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        let written = if remainder {
            if out > size {
                return Err(bad_answer(format!("GET_INFO left {out} of {size} bytes")));
            }
            let n = (size - out) / QUERY_HWCTX_SIZE;
            // A full buffer may have been cut short without a word (6.18.2 and later).
            if n == cap && cap < MAX_ENTRIES as usize {
                cap = grow(cap);
                continue;
            }
            n
        } else {
            if out > size {
                return Err(bad_answer(format!(
                    "GET_INFO needs {out} bytes but answered success for {size}"
                )));
            }
            out / QUERY_HWCTX_SIZE
        };
        return Ok(parse_records(&buf, QUERY_HWCTX_SIZE, written));
    }
}

/// This process's pid as the driver records it: the first `NSpid` of `/proc/self/status` (the
/// outermost namespace this procfs shows), else `getpid()`.
pub fn driver_pid(proc_root: &Path) -> i64 {
    std::fs::read_to_string(proc_root.join("self/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("NSpid:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or_else(|| i64::from(std::process::id()))
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake amdxdna device answering as the kernel does, through the real parsing code.

    use super::*;
    use std::cell::RefCell;

    /// Which driver the fake answers as.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Driver {
        /// Linux 6.14-6.17 (driver 0.0): no GET_ARRAY (EINVAL: no such ioctl); GET_INFO sets
        /// buffer_size to the bytes needed and answers EINVAL when they do not fit.
        Mainline0,
        /// Linux 6.18.0/6.18.1 (0.1): GET_ARRAY at min(asked, 144), EINVAL when full.
        Mainline618,
        /// Linux 6.18.2 and later (0.6): full buffers silently truncated.
        Mainline,
        /// AMD's DKMS driver (1.0): 160-byte entries, ENOSPC with the count needed, strided at
        /// the caller's element size.
        Dkms,
        /// Another DRM driver behind the node.
        Other,
        /// Not a DRM device at all (every ioctl ENOTTY).
        NotDrm,
    }

    pub struct FakeXdna {
        pub driver: Driver,
        pub contexts: RefCell<Vec<HwContext>>,
        /// Requests seen, in order.
        pub calls: RefCell<Vec<u64>>,
        /// GET_ARRAY fails with this errno (AMD's DKMS driver when its firmware health query
        /// fails).
        pub array_fails: Option<i32>,
    }

    impl FakeXdna {
        pub fn new(driver: Driver, contexts: Vec<HwContext>) -> Self {
            FakeXdna {
                driver,
                contexts: RefCell::new(contexts),
                calls: RefCell::new(Vec::new()),
                array_fails: None,
            }
        }

        fn record(&self, c: &HwContext, size: usize) -> Vec<u8> {
            let mut r = vec![0u8; size];
            put_u32(&mut r, CONTEXT_ID_AT, c.context_id);
            put_u32(&mut r, START_COL_AT, c.start_col);
            put_u32(&mut r, NUM_COL_AT, c.num_col);
            put_u64(&mut r, PID_AT, c.pid as u64);
            put_u64(&mut r, SUBMISSIONS_AT, c.command_submissions);
            put_u64(&mut r, COMPLETIONS_AT, c.command_completions);
            if size > 88 {
                put_u32(&mut r, 88, 1); // state: AMDXDNA_HWCTX_STATE_ACTIVE
            }
            if size >= 160 {
                r[144..152].copy_from_slice(b"onebit-t");
            }
            r
        }
    }

    fn err(code: i32) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(code))
    }

    impl Ioctl for FakeXdna {
        fn ioctl(&self, request: u64, arg: &mut [u8], data: &mut [u8]) -> io::Result<()> {
            self.calls.borrow_mut().push(request);
            if self.driver == Driver::NotDrm {
                return err(libc::ENOTTY);
            }
            let ctxs = self.contexts.borrow();
            match request {
                DRM_IOCTL_VERSION => {
                    assert_eq!(arg.len(), DRM_VERSION_SIZE);
                    let (name, major, minor) = match self.driver {
                        Driver::Mainline0 => (DRIVER_NAME, 0, 0),
                        Driver::Mainline618 => (DRIVER_NAME, 0, 1),
                        Driver::Mainline => (DRIVER_NAME, 0, 6),
                        Driver::Dkms => (DRIVER_NAME, 1, 0),
                        _ => ("i915", 1, 6),
                    };
                    let room = u64_at(arg, 16) as usize;
                    let n = name.len().min(room).min(data.len());
                    data[..n].copy_from_slice(&name.as_bytes()[..n]);
                    put_u32(arg, 0, major);
                    put_u32(arg, 4, minor);
                    put_u32(arg, 8, 0);
                    put_u64(arg, 16, name.len() as u64);
                    Ok(())
                }
                DRM_IOCTL_AMDXDNA_GET_ARRAY => {
                    assert_eq!(arg.len(), GET_ARRAY_SIZE);
                    assert_eq!(u32_at(arg, 0), DRM_AMDXDNA_HW_CONTEXT_ALL);
                    assert_eq!(u32_at(arg, 12), 0, "pad must be zero");
                    let asked = u32_at(arg, 4) as usize;
                    let num = u32_at(arg, 8) as usize;
                    match self.driver {
                        Driver::Mainline0 | Driver::Other => return err(libc::EINVAL),
                        _ => {}
                    }
                    if let Some(errno) = self.array_fails {
                        return err(errno);
                    }
                    if asked == 0 || num == 0 {
                        return err(libc::EINVAL);
                    }
                    if self.driver == Driver::Dkms {
                        if num < ctxs.len() {
                            put_u32(arg, 8, ctxs.len() as u32);
                            return err(libc::ENOSPC);
                        }
                        let size = asked.min(160);
                        for (i, c) in ctxs.iter().enumerate() {
                            let r = self.record(c, 160);
                            data[i * asked..i * asked + size].copy_from_slice(&r[..size]);
                        }
                        put_u32(arg, 4, size as u32);
                        put_u32(arg, 8, ctxs.len() as u32);
                        return Ok(());
                    }
                    if self.driver == Driver::Mainline && (asked > 4096 || num > 1024) {
                        return err(libc::EINVAL);
                    }
                    let size = asked.min(HWCTX_ENTRY_SIZE);
                    let room = num * asked / size;
                    let n = ctxs.len().min(room);
                    for (i, c) in ctxs.iter().take(n).enumerate() {
                        let r = self.record(c, HWCTX_ENTRY_SIZE);
                        data[i * size..(i + 1) * size].copy_from_slice(&r[..size]);
                    }
                    put_u32(arg, 4, size as u32);
                    put_u32(arg, 8, n as u32);
                    if n < ctxs.len() && self.driver == Driver::Mainline618 {
                        return err(libc::EINVAL);
                    }
                    Ok(())
                }
                DRM_IOCTL_AMDXDNA_GET_INFO => {
                    assert_eq!(arg.len(), GET_INFO_SIZE);
                    if u32_at(arg, 0) != DRM_AMDXDNA_QUERY_HW_CONTEXTS {
                        return err(libc::EOPNOTSUPP);
                    }
                    if self.driver == Driver::Other {
                        return err(libc::EINVAL);
                    }
                    let size = u32_at(arg, 4) as usize;
                    let fits = size / QUERY_HWCTX_SIZE;
                    for (i, c) in ctxs.iter().take(fits).enumerate() {
                        let r = self.record(c, QUERY_HWCTX_SIZE);
                        data[i * QUERY_HWCTX_SIZE..(i + 1) * QUERY_HWCTX_SIZE].copy_from_slice(&r);
                    }
                    let written = ctxs.len().min(fits) * QUERY_HWCTX_SIZE;
                    match self.driver {
                        Driver::Mainline0 | Driver::Dkms => {
                            let need = ctxs.len() * QUERY_HWCTX_SIZE;
                            put_u32(arg, 4, need as u32);
                            if need > size {
                                return err(libc::EINVAL);
                            }
                            Ok(())
                        }
                        _ => {
                            put_u32(arg, 4, (size - written) as u32);
                            if ctxs.len() > fits && self.driver == Driver::Mainline618 {
                                return err(libc::EINVAL);
                            }
                            Ok(())
                        }
                    }
                }
                _ => err(libc::EINVAL),
            }
        }
    }

    /// What closing a descriptor does to its DRM client's contexts: amdxdna's `flush` file
    /// operation, which `close(2)` runs on every descriptor closed, not only the last.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Flush {
        /// Mainline 6.14 through at least 6.18.y: `amdxdna_flush` removes every context of the
        /// client on any close, unconditionally.
        Mainline,
        /// AMD's DKMS driver: the same, when the closing task belongs to the opener's process.
        Dkms,
        /// A kernel without `amdxdna_flush`: only the last close (the file's release) does.
        Never,
    }

    struct File {
        opener: i64,
        refs: usize,
        next_id: u32,
    }

    struct Kernel {
        driver: Driver,
        flush: Flush,
        files: Vec<File>,
        /// (file, context): contexts belong to a file's DRM client.
        contexts: Vec<(usize, HwContext)>,
        /// The process of the task that makes the next call (close included).
        current: i64,
    }

    /// An accel node whose descriptors behave as amdxdna's do: each open is a DRM client of
    /// its own, duplicates share it, and closes run the generation's flush.
    #[derive(Clone)]
    pub struct FakeNode(std::rc::Rc<RefCell<Kernel>>);

    impl FakeNode {
        pub fn new(driver: Driver, flush: Flush) -> Self {
            FakeNode(std::rc::Rc::new(RefCell::new(Kernel {
                driver,
                flush,
                files: Vec::new(),
                contexts: Vec::new(),
                current: 0,
            })))
        }

        /// `open(2)` by process `pid` (which becomes the calling task).
        pub fn open(&self, pid: i64) -> FakeFile {
            let mut k = self.0.borrow_mut();
            k.current = pid;
            k.files.push(File {
                opener: pid,
                refs: 1,
                next_id: 1,
            });
            FakeFile {
                node: self.clone(),
                file: k.files.len() - 1,
            }
        }

        /// The process whose task makes the next calls.
        pub fn set_current(&self, pid: i64) {
            self.0.borrow_mut().current = pid;
        }

        /// Every context on the device.
        pub fn contexts(&self) -> Vec<HwContext> {
            self.0.borrow().contexts.iter().map(|(_, c)| *c).collect()
        }

        /// The pid the driver records differs from the one a process sees inside a PID
        /// namespace: the driver's is `host`, whatever the opener called itself.
        pub fn record_pid_as(&self, file: &FakeFile, host: i64) {
            self.0.borrow_mut().files[file.file].opener = host;
        }
    }

    /// One descriptor on a [`FakeNode`].
    pub struct FakeFile {
        node: FakeNode,
        file: usize,
    }

    impl FakeFile {
        /// `dup(2)`: another descriptor on the same struct file, hence the same client.
        pub fn dup(&self) -> FakeFile {
            self.node.0.borrow_mut().files[self.file].refs += 1;
            FakeFile {
                node: self.node.clone(),
                file: self.file,
            }
        }

        /// A hardware context on this client (as XRT makes one), its id the client's next.
        pub fn create_context(&self) -> u32 {
            let mut k = self.node.0.borrow_mut();
            let f = &mut k.files[self.file];
            let id = f.next_id;
            f.next_id += 1;
            let pid = f.opener;
            k.contexts.push((self.file, ctx(id, pid, 0)));
            id
        }

        /// The NPU completes `n` commands on each context of this client.
        pub fn run(&self, n: u64) {
            for (f, c) in &mut self.node.0.borrow_mut().contexts {
                if *f == self.file {
                    c.command_submissions += n;
                    c.command_completions += n;
                }
            }
        }
    }

    impl Drop for FakeFile {
        fn drop(&mut self) {
            let mut k = self.node.0.borrow_mut();
            let file = self.file;
            let flushes = match k.flush {
                Flush::Mainline => true,
                Flush::Dkms => k.current == k.files[file].opener,
                Flush::Never => false,
            };
            k.files[file].refs -= 1;
            if flushes || k.files[file].refs == 0 {
                k.contexts.retain(|(f, _)| *f != file);
            }
        }
    }

    impl Ioctl for FakeFile {
        fn ioctl(&self, request: u64, arg: &mut [u8], data: &mut [u8]) -> io::Result<()> {
            let (driver, contexts) = {
                let k = self.node.0.borrow();
                (k.driver, k.contexts.iter().map(|(_, c)| *c).collect())
            };
            FakeXdna::new(driver, contexts).ioctl(request, arg, data)
        }
    }

    /// A context of `pid` with `done` completions (submissions a little ahead).
    pub fn ctx(id: u32, pid: i64, done: u64) -> HwContext {
        HwContext {
            context_id: id,
            pid,
            start_col: 0,
            num_col: 4,
            command_submissions: done + 1,
            command_completions: done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::fake::{Driver, FakeXdna, ctx};
    use super::*;

    #[test]
    fn request_numbers_and_layouts_are_the_kernels() {
        // _IOWR('d', nr, size) on x86_64, as the uapi headers compile.
        assert_eq!(DRM_IOCTL_VERSION, 0xC040_6400);
        assert_eq!(DRM_IOCTL_AMDXDNA_GET_INFO, 0xC010_6447);
        assert_eq!(DRM_IOCTL_AMDXDNA_GET_ARRAY, 0xC018_644A);
        assert_eq!(
            (
                GET_INFO_SIZE,
                GET_ARRAY_SIZE,
                QUERY_HWCTX_SIZE,
                HWCTX_ENTRY_SIZE
            ),
            (16, 24, 64, 144)
        );
        assert_eq!(
            (PID_AT, SUBMISSIONS_AT, COMPLETIONS_AT, CONTEXT_ID_AT),
            (16, 24, 32, 0)
        );
        // The same layout through the C ABI: a repr(C) mirror of the kernel's structs.
        #[repr(C)]
        struct GetArray {
            param: u32,
            element_size: u32,
            num_element: u32,
            pad: u32,
            buffer: u64,
        }
        #[repr(C)]
        struct QueryHwctx {
            context_id: u32,
            start_col: u32,
            num_col: u32,
            pad: u32,
            pid: i64,
            command_submissions: u64,
            command_completions: u64,
            migrations: u64,
            preemptions: u64,
            errors: u64,
        }
        #[repr(C)]
        struct DrmVersion {
            major: i32,
            minor: i32,
            patch: i32,
            name_len: usize,
            name: *mut u8,
            date_len: usize,
            date: *mut u8,
            desc_len: usize,
            desc: *mut u8,
        }
        assert_eq!(std::mem::size_of::<GetArray>(), GET_ARRAY_SIZE);
        assert_eq!(std::mem::offset_of!(GetArray, buffer), 16);
        assert_eq!(std::mem::offset_of!(GetArray, num_element), 8);
        assert_eq!(std::mem::size_of::<QueryHwctx>(), QUERY_HWCTX_SIZE);
        assert_eq!(std::mem::offset_of!(QueryHwctx, pid), PID_AT);
        assert_eq!(
            std::mem::offset_of!(QueryHwctx, command_completions),
            COMPLETIONS_AT
        );
        assert_eq!(std::mem::size_of::<DrmVersion>(), DRM_VERSION_SIZE);
        assert_eq!(std::mem::offset_of!(DrmVersion, name_len), 16);
        assert_eq!(std::mem::offset_of!(DrmVersion, name), 24);
    }

    fn many(n: u32) -> Vec<HwContext> {
        (0..n)
            .map(|i| ctx(i + 1, 1000 + i64::from(i), 10 * u64::from(i)))
            .collect()
    }

    #[test]
    fn every_driver_generation_reads_the_same_contexts() {
        for driver in [
            Driver::Mainline0,
            Driver::Mainline618,
            Driver::Mainline,
            Driver::Dkms,
        ] {
            // 3 fit the first buffer; 200 need a retry (EINVAL with the size, ENOSPC with the
            // count, or a silently full buffer).
            for n in [0, 3, 200] {
                let dev = FakeXdna::new(driver, many(n));
                let got = read_contexts(&dev).unwrap_or_else(|e| panic!("{driver:?} {n}: {e}"));
                // Linux 6.18.0/1 answers a full GET_ARRAY with EINVAL, which reads as "no such
                // query" (as XRT's shim takes it): GET_INFO answers instead.
                let query = match (driver, n) {
                    (Driver::Mainline0, _) | (Driver::Mainline618, 200) => Query::GetInfo,
                    _ => Query::GetArray,
                };
                assert_eq!(got.query, query, "{driver:?} with {n}");
                assert_eq!(got.contexts, many(n), "{driver:?} with {n} contexts");
                assert_eq!(got.driver.name, DRIVER_NAME);
            }
        }
    }

    #[test]
    fn a_full_buffer_is_asked_again_bigger() {
        let dev = FakeXdna::new(Driver::Mainline, many(64));
        assert_eq!(read_contexts(&dev).expect("read").contexts.len(), 64);
        let calls = dev.calls.borrow();
        let arrays = calls
            .iter()
            .filter(|&&c| c == DRM_IOCTL_AMDXDNA_GET_ARRAY)
            .count();
        assert_eq!(arrays, 2, "64 entries filled the first buffer exactly");
    }

    #[test]
    fn not_drm_or_another_driver_is_unavailable_never_proof() {
        let dev = FakeXdna::new(Driver::NotDrm, many(2));
        let e = read_contexts(&dev).expect_err("ENOTTY");
        assert!(matches!(e, CountersError::Unavailable(_)), "{e}");
        assert!(e.to_string().contains("ENOTTY"), "{e}");
        let dev = FakeXdna::new(Driver::Other, many(2));
        let e = read_contexts(&dev).expect_err("i915");
        assert!(e.to_string().contains("not amdxdna_accel_driver"), "{e}");
        // No amdxdna request went to another driver's fd.
        assert_eq!(*dev.calls.borrow(), [DRM_IOCTL_VERSION]);
    }

    #[test]
    fn a_real_non_drm_fd_answers_enotty() {
        let t = crate::testutil::tempdir("xdna-enotty");
        let path = t.join("accel0");
        std::fs::write(&path, b"").expect("write");
        let fd = AccelFd::open(&path).expect("open");
        let e = read_contexts(&fd).expect_err("a regular file is no DRM device");
        assert_eq!(
            e,
            CountersError::Unavailable("DRM_IOCTL_VERSION: ENOTTY (not a DRM device)".into())
        );
    }

    #[test]
    fn completions_are_counted_per_context_of_one_session() {
        let dev = FakeXdna::new(Driver::Mainline, vec![ctx(1, 42, 5), ctx(2, 7, 100)]);
        let before = read_contexts(&dev).expect("read");
        *dev.contexts.borrow_mut() = vec![ctx(1, 42, 9), ctx(3, 42, 2), ctx(2, 7, 500)];
        let after = read_contexts(&dev).expect("read");
        let of = |pid, ids: &[u32]| Ours {
            pid,
            context_ids: ids.to_vec(),
            identified: Identified::CreationAndPid,
        };
        assert_eq!(completed_between(&before, &after, &of(42, &[1, 3])), 4 + 2);
        assert_eq!(completed_between(&before, &after, &of(42, &[3])), 2);
        assert_eq!(completed_between(&before, &after, &of(7, &[2])), 400);
        assert_eq!(completed_between(&before, &after, &of(99, &[1])), 0);
        // Two clients of one pid, both with context 1: their sum's growth counts.
        let two = |a, b| HwContexts {
            contexts: vec![ctx(1, 42, a), ctx(1, 42, b)],
            ..before.clone()
        };
        assert_eq!(
            completed_between(&two(5, 100), &two(5, 100), &of(42, &[1])),
            0
        );
        assert_eq!(
            completed_between(&two(5, 100), &two(7, 101), &of(42, &[1])),
            3
        );
        assert_eq!(after.completions_of(&of(42, &[1, 3])), Some(11));
        assert_eq!(after.completions_of(&of(99, &[1])), None);
    }

    #[test]
    fn the_initial_pid_namespace_is_known_by_its_inode() {
        let t = crate::testutil::tempdir("xdna-pidns");
        std::fs::create_dir_all(t.join("self/ns")).expect("mkdir");
        assert_eq!(in_initial_pid_namespace(&t), None);
        std::os::unix::fs::symlink(INITIAL_PID_NS, t.join("self/ns/pid")).expect("symlink");
        assert_eq!(in_initial_pid_namespace(&t), Some(true));
        std::fs::remove_file(t.join("self/ns/pid")).expect("rm");
        std::os::unix::fs::symlink("pid:[4026532511]", t.join("self/ns/pid")).expect("symlink");
        assert_eq!(in_initial_pid_namespace(&t), Some(false));
    }

    #[test]
    fn the_driver_pid_is_the_outermost_nspid() {
        let t = crate::testutil::tempdir("xdna-nspid");
        std::fs::create_dir_all(t.join("self")).expect("mkdir");
        std::fs::write(t.join("self/status"), "Name:\tx\nNSpid:\t4242\t17\n").expect("write");
        assert_eq!(driver_pid(&t), 4242);
        let empty = crate::testutil::tempdir("xdna-nspid-none");
        assert_eq!(driver_pid(&empty), i64::from(std::process::id()));
    }

    #[test]
    fn any_get_array_failure_falls_back_to_get_info() {
        // AMD's DKMS driver fails the whole GET_ARRAY when a context's firmware health query
        // fails (EINVAL from the mailbox, ENOMEM from a buffer); GET_INFO still answers.
        for errno in [libc::EINVAL, libc::ENOMEM, libc::EIO, libc::ETIME] {
            let mut dev = FakeXdna::new(Driver::Dkms, many(3));
            dev.array_fails = Some(errno);
            let got = read_contexts(&dev).unwrap_or_else(|e| panic!("errno {errno}: {e}"));
            assert_eq!(got.query, Query::GetInfo, "errno {errno}");
            assert_eq!(got.contexts, many(3));
        }
        // Both failing: both named, a failure (not "unavailable").
        let mut dev = FakeXdna::new(Driver::Dkms, many(1));
        dev.array_fails = Some(libc::EIO);
        let info_fails = FailingInfo(dev);
        let e = read_contexts(&info_fails).expect_err("both fail");
        assert_eq!(
            e,
            CountersError::Failed(
                "GET_ARRAY(HW_CONTEXT_ALL): Input/output error (os error 5), then \
                 GET_INFO(QUERY_HW_CONTEXTS): EACCES"
                    .into()
            )
        );
    }

    /// A device whose GET_INFO is refused.
    struct FailingInfo(FakeXdna);

    impl Ioctl for FailingInfo {
        fn ioctl(&self, request: u64, arg: &mut [u8], data: &mut [u8]) -> io::Result<()> {
            if request == DRM_IOCTL_AMDXDNA_GET_INFO {
                return Err(io::Error::from_raw_os_error(libc::EACCES));
            }
            self.0.ioctl(request, arg, data)
        }
    }

    #[test]
    fn contexts_are_identified_by_what_the_session_created() {
        let read =
            |c: Vec<HwContext>| read_contexts(&FakeXdna::new(Driver::Mainline, c)).expect("read");
        let at_load = read(vec![ctx(1, 999, 50)]);
        // Ids repeat across clients: (999, 1) existed, (4242, 1) is new.
        let after = read(vec![ctx(1, 999, 60), ctx(1, 4242, 3), ctx(2, 4242, 4)]);
        let ours = identify(&at_load, &after, 4242, Some(true)).expect("by pid");
        assert_eq!(
            ours,
            Ours {
                pid: 4242,
                context_ids: vec![1, 2],
                identified: Identified::CreationAndPid
            }
        );
        assert_eq!(after.completions_of(&ours), Some(7));
        let ours = identify(&at_load, &after, 17, Some(false)).expect("by creation");
        assert_eq!(ours.identified, Identified::Creation);
        // Outside a PID namespace (or not knowing), a new pid that is not ours is another
        // process's: our session may have made no context at all.
        assert_eq!(
            identify(&at_load, &after, 17, Some(true)),
            Err(Unidentified::OtherProcess { pid: 4242, own: 17 })
        );
        assert!(matches!(
            identify(&at_load, &after, 17, None),
            Err(Unidentified::NamespaceUnknown { pid: 4242, .. })
        ));
        assert_eq!(ours.pid, 4242);
        let later = read(vec![ctx(1, 999, 61), ctx(2, 4242, 10)]);
        assert_eq!(completed_between(&after, &later, &ours), 6);
        assert_eq!(later.missing(&ours), vec![1]);
    }
}
