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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

/// An fd on the accel node: one this process opened, or a duplicate of one it already holds (the
/// same DRM client, so asking adds no client to the driver).
pub struct AccelFd(OwnedFd);

impl AccelFd {
    pub fn open(path: &Path) -> io::Result<Self> {
        let f = OpenOptions::new().read(true).write(true).open(path)?;
        Ok(AccelFd(f.into()))
    }

    /// A duplicate of this process's own `fd`.
    pub fn dup(fd: i32) -> io::Result<Self> {
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on any integer is safe; it fails with EBADF for a
        // closed one. The new fd is ours alone, so OwnedFd may close it.
        let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if new < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `new` is a fresh fd owned by nobody else.
        Ok(AccelFd(unsafe { OwnedFd::from_raw_fd(new) }))
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
    /// Commands the NPU completed for `pid`'s contexts (`None`: it has none).
    pub fn completions_of(&self, pid: i64) -> Option<u64> {
        let mut mine = self.contexts.iter().filter(|c| c.pid == pid).peekable();
        mine.peek()?;
        Some(mine.map(|c| c.command_completions).sum())
    }

    /// Completions per context of `pid`, keyed by context id.
    fn by_context(&self, pid: i64) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.contexts
            .iter()
            .filter(move |c| c.pid == pid)
            .map(|c| (c.context_id, c.command_completions))
    }
}

/// Commands completed for `pid` between two readings: the growth of each of its contexts (a
/// context that is new in `after` counts from 0; one that went away counts nothing). Context ids
/// are unique per DRM client only: where one repeats for `pid` (two clients), the contexts
/// cannot be told apart and the growth of the sum counts, which may undercount, never over.
pub fn completed_between(before: &HwContexts, after: &HwContexts, pid: i64) -> u64 {
    let repeats = |c: &HwContexts| {
        let mut ids: Vec<u32> = c.by_context(pid).map(|(id, _)| id).collect();
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        ids.len() != n
    };
    if repeats(before) || repeats(after) {
        let sum = |c: &HwContexts| c.by_context(pid).map(|(_, d)| d).sum::<u64>();
        return sum(after).saturating_sub(sum(before));
    }
    after
        .by_context(pid)
        .map(|(id, done)| {
            let was = before
                .by_context(pid)
                .find(|(b, _)| *b == id)
                .map_or(0, |(_, d)| d);
            done.saturating_sub(was)
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

/// Reads every hardware context: GET_ARRAY where the driver has it, else (or when it refuses)
/// GET_INFO, as XRT's own shim falls back.
pub fn read_contexts(dev: &dyn Ioctl) -> Result<HwContexts, CountersError> {
    let driver = driver_version(dev)?;
    if driver.name != DRIVER_NAME {
        return Err(CountersError::Unavailable(format!(
            "the accel device's driver is {driver}, not {DRIVER_NAME}"
        )));
    }
    let array = if driver.has_get_array() {
        match get_array(dev) {
            Ok(c) => Some(c),
            // A driver without the query (or this param): the older one is next.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) => {
                tracing::debug!(
                    "GET_ARRAY(HW_CONTEXT_ALL): {}; trying GET_INFO",
                    errno_name(&e)
                );
                None
            }
            Err(e) => return Err(query_error(Query::GetArray, &e)),
        }
    } else {
        None
    };
    let (query, contexts) = match array {
        Some(c) => (Query::GetArray, c),
        None => (
            Query::GetInfo,
            get_info(dev, &driver).map_err(|e| query_error(Query::GetInfo, &e))?,
        ),
    };
    Ok(HwContexts {
        driver,
        query,
        contexts,
    })
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
    }

    impl FakeXdna {
        pub fn new(driver: Driver, contexts: Vec<HwContext>) -> Self {
            FakeXdna {
                driver,
                contexts: RefCell::new(contexts),
                calls: RefCell::new(Vec::new()),
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
    fn completions_are_counted_per_context_of_one_pid() {
        let dev = FakeXdna::new(Driver::Mainline, vec![ctx(1, 42, 5), ctx(2, 7, 100)]);
        let before = read_contexts(&dev).expect("read");
        *dev.contexts.borrow_mut() = vec![ctx(1, 42, 9), ctx(3, 42, 2), ctx(2, 7, 500)];
        let after = read_contexts(&dev).expect("read");
        assert_eq!(completed_between(&before, &after, 42), 4 + 2);
        assert_eq!(completed_between(&before, &after, 7), 400);
        assert_eq!(completed_between(&before, &after, 99), 0);
        // Two clients of one pid, both with context 1, counters flat: nothing completed.
        let two = |a, b| HwContexts {
            contexts: vec![ctx(1, 42, a), ctx(1, 42, b)],
            ..before.clone()
        };
        assert_eq!(completed_between(&two(5, 100), &two(5, 100), 42), 0);
        assert_eq!(completed_between(&two(5, 100), &two(7, 101), 42), 3);
        assert_eq!(after.completions_of(42), Some(11));
        assert_eq!(after.completions_of(99), None);
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
}
