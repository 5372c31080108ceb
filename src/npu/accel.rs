//! Whether a process holds the NPU: the one NPU fact the worker's stop policy needs (a holder is
//! never SIGKILLed, and no second worker starts beside one), and the fds the residency proof
//! samples.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use super::NpuError;
use super::roots::SystemRoots;

/// Whether process `pid` has the NPU's accel node open: a symlink in `<proc>/<pid>/fd` that names
/// [`SystemRoots::accel_node`], or an fd on the same file or the same character device.
/// Errors when the fd directory cannot be read (no such process, or not ours to look at).
pub fn holds_accel(pid: u32, roots: &SystemRoots) -> Result<bool, NpuError> {
    Ok(!accel_fds(pid, roots)?.is_empty())
}

/// The fds of `pid` that point at the accel node.
pub fn accel_fds(pid: u32, roots: &SystemRoots) -> Result<Vec<u32>, NpuError> {
    let dir = roots.proc_fd_dir(pid);
    let node = roots.accel_node();
    let node_meta = fs::metadata(&node).ok();
    let entries = fs::read_dir(&dir).map_err(|e| NpuError::io(&dir, e))?;
    let mut fds = Vec::new();
    for entry in entries {
        // An fd closed between readdir and readlink is simply gone.
        let Ok(entry) = entry else { continue };
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let fd = entry.path();
        let Ok(target) = fs::read_link(&fd) else {
            continue;
        };
        if target == node {
            fds.push(n);
            continue;
        }
        // Same node under another name (a symlinked /dev path, a bind mount): compare what the
        // fd points at. stat() on a /proc fd link does not open anything.
        if let (Some(nm), Ok(m)) = (&node_meta, fs::metadata(&fd)) {
            let same_file = m.dev() == nm.dev() && m.ino() == nm.ino();
            let same_chardev = nm.file_type().is_char_device()
                && m.file_type().is_char_device()
                && m.rdev() == nm.rdev();
            if same_file || same_chardev {
                fds.push(n);
            }
        }
    }
    fds.sort_unstable();
    Ok(fds)
}
