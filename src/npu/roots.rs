//! The system trees every NPU check reads through. Production uses the real `/sys`, `/dev`,
//! `/proc`, `/etc` and `/lib`; tests build the same layout in a temp dir and point the roots there.
//!
//! Paths the kernel itself writes (symlink targets in `/proc/<pid>/fd`, mount points in
//! `/proc/mounts`) are compared against the node *as seen through these roots*
//! ([`SystemRoots::accel_node`], [`SystemRoots::hugepages_mount`]): with the default roots that is
//! the real path, and a fake tree writes its own paths there.

use std::path::{Path, PathBuf};

/// Where `/sys`, `/dev`, `/proc`, `/etc` and `/lib` are. `Default` is the real system.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SystemRoots {
    pub sys: PathBuf,
    pub dev: PathBuf,
    pub proc: PathBuf,
    /// For `group` and `passwd` (the render group's name and members).
    pub etc: PathBuf,
    /// For `firmware/` (the kernel's firmware search path starts at /lib/firmware).
    pub lib: PathBuf,
}

impl Default for SystemRoots {
    fn default() -> Self {
        SystemRoots::under("/")
    }
}

impl SystemRoots {
    /// All five trees under one root: `under("/")` is the real system, `under(tmp)` a fake one.
    pub fn under(root: impl AsRef<Path>) -> Self {
        let root = root.as_ref();
        SystemRoots {
            sys: root.join("sys"),
            dev: root.join("dev"),
            proc: root.join("proc"),
            etc: root.join("etc"),
            lib: root.join("lib"),
        }
    }

    /// The NPU's accel node, `/dev/accel/accel0`.
    pub fn accel_node(&self) -> PathBuf {
        self.dev.join("accel").join("accel0")
    }

    /// The accel class device's sysfs directory (`.../device` is the PCI function).
    pub fn accel_sysfs_device(&self) -> PathBuf {
        self.sys.join("class/accel/accel0/device")
    }

    /// Device-wide NPU memory in use; grows when a model is loaded onto the NPU.
    pub fn mem_usage(&self) -> PathBuf {
        self.accel_sysfs_device().join("mem_usage")
    }

    /// The open file descriptors of a process (symlinks to what they point at).
    pub fn proc_fd_dir(&self, pid: u32) -> PathBuf {
        self.proc.join(pid.to_string()).join("fd")
    }

    /// The kernel's per-fd information of a process (DRM usage stats for device fds).
    pub fn proc_fdinfo_dir(&self, pid: u32) -> PathBuf {
        self.proc.join(pid.to_string()).join("fdinfo")
    }

    pub fn hugepages_mount(&self) -> PathBuf {
        self.dev.join("hugepages")
    }

    pub fn pci_devices(&self) -> PathBuf {
        self.sys.join("bus/pci/devices")
    }

    /// Directories the kernel loads firmware from, most specific first (the `updates/` tree wins
    /// over the distribution's files).
    pub fn firmware_dirs(&self) -> Vec<PathBuf> {
        vec![self.lib.join("firmware/updates"), self.lib.join("firmware")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_the_real_system() {
        let r = SystemRoots::default();
        assert_eq!(r.sys, Path::new("/sys"));
        assert_eq!(r.accel_node(), Path::new("/dev/accel/accel0"));
        assert_eq!(
            r.mem_usage(),
            Path::new("/sys/class/accel/accel0/device/mem_usage")
        );
        assert_eq!(r.proc_fd_dir(42), Path::new("/proc/42/fd"));
        assert_eq!(r.hugepages_mount(), Path::new("/dev/hugepages"));
        assert_eq!(r.firmware_dirs()[1], Path::new("/lib/firmware"));
    }

    #[test]
    fn under_moves_every_tree() {
        let r = SystemRoots::under("/tmp/fake");
        assert_eq!(r.dev, Path::new("/tmp/fake/dev"));
        assert_eq!(r.etc, Path::new("/tmp/fake/etc"));
        assert_eq!(r.accel_node(), Path::new("/tmp/fake/dev/accel/accel0"));
    }
}
