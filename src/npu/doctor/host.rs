//! What the doctor asks of the running system beyond files: who we are, the memlock limit, the
//! kernel log, commands (xrt-smi) and access(2). [`RealHost`] asks the system; tests implement
//! [`Host`] with fixed answers.

use crate::npu::xdna::{CountersError, HwContexts, read_node};
use std::ffi::{CString, OsString};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use crate::npu::NpuError;
use crate::npu::supervisor::{Child, Ending, NeverKill, StopOutcome, StopPolicy};

/// The effective ids that decide whether `open(2)` of the accel node succeeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups of this process (not of the user in /etc/group: a group added
    /// after login is not here until the next login).
    pub groups: Vec<u32>,
}

impl Identity {
    pub fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Unlimited,
    Bytes(u64),
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::Bytes(b) if b % (1 << 20) == 0 => write!(f, "{} MiB", b >> 20),
            Limit::Bytes(b) if b % (1 << 10) == 0 => write!(f, "{} KiB", b >> 10),
            Limit::Bytes(b) => write!(f, "{b} bytes"),
        }
    }
}

/// RLIMIT_MEMLOCK: the soft limit applies; the hard limit says whether the user can raise it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memlock {
    pub soft: Limit,
    pub hard: Limit,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandOutput {
    /// None when ended by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

pub trait Host {
    fn identity(&self) -> Identity;
    fn memlock(&self) -> Result<Memlock, NpuError>;
    /// The kernel log since boot. Err when it cannot be read (kernel.dmesg_restrict=1 without
    /// CAP_SYSLOG, no journal access).
    fn kernel_log(&self) -> Result<String, NpuError>;
    /// Runs a program with extra environment variables and returns its output.
    fn run(
        &self,
        program: &Path,
        args: &[&str],
        env: &[(&str, OsString)],
    ) -> Result<CommandOutput, NpuError>;
    /// access(2) for read+write with the effective ids, on the real system: it also sees ACLs
    /// (logind's uaccess), user namespaces and LSMs that mode bits do not show. None when the
    /// answer would not be about the tree being checked (fake trees).
    fn access_rw(&self, _path: &Path) -> Option<bool> {
        None
    }
    /// `modinfo <module>`'s output (which file the kernel loads, its version). Err when it could
    /// not be asked (fake hosts; no modinfo).
    fn modinfo(&self, module: &str) -> Result<String, NpuError> {
        Err(NpuError::Command {
            program: format!("modinfo {module}"),
            reason: "not asked of this host".into(),
        })
    }
    /// The amdxdna hardware-context query, run on a fresh fd on `node` (what residency reads).
    fn hw_contexts(&self, node: &Path) -> Result<HwContexts, CountersError> {
        read_node(node)
    }
}

/// The real system.
#[derive(Debug, Clone)]
pub struct RealHost {
    /// Longest a command (xrt-smi, dmesg) may take.
    pub command_timeout: Duration,
}

impl Default for RealHost {
    fn default() -> Self {
        RealHost {
            command_timeout: Duration::from_secs(20),
        }
    }
}

fn read_all(mut r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        let _ = tx.send(String::from_utf8_lossy(&buf).into_owned());
    });
    rx
}

impl Host for RealHost {
    fn identity(&self) -> Identity {
        // SAFETY: these calls only return the caller's ids.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Identity {
            uid,
            gid,
            groups: supplementary_groups(),
        }
    }

    fn memlock(&self) -> Result<Memlock, NpuError> {
        let mut rl = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit into the struct we own.
        if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rl) } != 0 {
            return Err(NpuError::Command {
                program: "getrlimit(RLIMIT_MEMLOCK)".into(),
                reason: std::io::Error::last_os_error().to_string(),
            });
        }
        let lim = |v: libc::rlim_t| {
            if v == libc::RLIM_INFINITY {
                Limit::Unlimited
            } else {
                Limit::Bytes(v)
            }
        };
        Ok(Memlock {
            soft: lim(rl.rlim_cur),
            hard: lim(rl.rlim_max),
        })
    }

    fn kernel_log(&self) -> Result<String, NpuError> {
        let dmesg = self.run(Path::new("dmesg"), &[], &[]);
        if let Ok(out) = &dmesg
            && out.code == Some(0)
            && !out.stdout.is_empty()
        {
            return Ok(out.stdout.clone());
        }
        // Members of systemd-journal/adm can read the kernel log through the journal even
        // when dmesg_restrict blocks dmesg.
        let journal = self.run(
            Path::new("journalctl"),
            &["-k", "-b", "-q", "--no-pager", "-o", "cat"],
            &[],
        );
        if let Ok(out) = &journal
            && out.code == Some(0)
            && !out.stdout.is_empty()
        {
            return Ok(out.stdout.clone());
        }
        let why = match dmesg {
            Ok(out) => out.stderr.lines().next().unwrap_or("no output").to_string(),
            Err(e) => e.to_string(),
        };
        Err(NpuError::Command {
            program: "dmesg / journalctl -k".into(),
            reason: why,
        })
    }

    fn run(
        &self,
        program: &Path,
        args: &[&str],
        env: &[(&str, OsString)],
    ) -> Result<CommandOutput, NpuError> {
        let shown = program.display().to_string();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = Child::spawn(&mut cmd, shown.clone()).map_err(|e| NpuError::Command {
            program: shown.clone(),
            reason: e.to_string(),
        })?;
        // Drain both pipes on threads so a chatty program cannot block on a full pipe.
        let (out_rx, err_rx) =
            child.with_std(|c| (c.stdout.take().map(read_all), c.stderr.take().map(read_all)));
        let Some(ending) = child.wait_timeout(self.command_timeout) else {
            // xrt-smi opens /dev/accel/accel0: a hung one gets SIGTERM, never SIGKILL.
            let outcome = child.stop(&StopPolicy {
                grace: Duration::from_secs(2),
                never_kill: NeverKill::Anyone,
                ..StopPolicy::default()
            })?;
            if let StopOutcome::LeftRunning { pid, .. } = outcome {
                return Err(NpuError::Command {
                    program: shown,
                    reason: format!(
                        "no answer within {} s; pid {pid} left running (not SIGKILLed: it may hold the NPU)",
                        self.command_timeout.as_secs()
                    ),
                });
            }
            return Err(NpuError::Command {
                program: shown,
                reason: format!(
                    "no answer within {} s ({outcome})",
                    self.command_timeout.as_secs()
                ),
            });
        };
        let get = |rx: Option<mpsc::Receiver<String>>| {
            rx.and_then(|rx| rx.recv_timeout(Duration::from_secs(2)).ok())
                .unwrap_or_default()
        };
        Ok(CommandOutput {
            code: match ending {
                Ending::Exit(c) => Some(c),
                _ => None,
            },
            stdout: get(out_rx),
            stderr: get(err_rx),
        })
    }

    fn modinfo(&self, module: &str) -> Result<String, NpuError> {
        let out = self.run(Path::new("modinfo"), &[module], &[])?;
        if out.code == Some(0) {
            Ok(out.stdout)
        } else {
            Err(NpuError::Command {
                program: format!("modinfo {module}"),
                reason: out.stderr.lines().next().unwrap_or("failed").to_owned(),
            })
        }
    }

    fn access_rw(&self, path: &Path) -> Option<bool> {
        let c = CString::new(path.as_os_str().as_bytes()).ok()?;
        // SAFETY: c is a valid NUL-terminated path; faccessat only reads it.
        let rc = unsafe {
            libc::faccessat(
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::R_OK | libc::W_OK,
                libc::AT_EACCESS,
            )
        };
        Some(rc == 0)
    }
}

fn supplementary_groups() -> Vec<u32> {
    // SAFETY: getgroups(0, NULL) returns the count; the second call fills a buffer of that
    // size that we own.
    unsafe {
        let n = libc::getgroups(0, std::ptr::null_mut());
        let Ok(len) = usize::try_from(n) else {
            return Vec::new();
        };
        let mut v: Vec<libc::gid_t> = vec![0; len];
        let got = libc::getgroups(n, v.as_mut_ptr());
        match usize::try_from(got) {
            Ok(got) => {
                v.truncate(got);
                v
            }
            Err(_) => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_host_basics() {
        let h = RealHost::default();
        let id = h.identity();
        assert!(id.in_group(id.gid));
        assert!(h.memlock().is_ok());
        let out = h
            .run(
                Path::new("sh"),
                &["-c", "echo out; echo err >&2; exit 4"],
                &[("X", "1".into())],
            )
            .expect("sh runs");
        assert_eq!(out.code, Some(4));
        assert_eq!(out.stdout, "out\n");
        assert_eq!(out.stderr, "err\n");
        assert!(h.run(Path::new("/nonexistent/xrt-smi"), &[], &[]).is_err());
    }

    #[test]
    fn limits_read_well() {
        assert_eq!(Limit::Bytes(8 << 20).to_string(), "8 MiB");
        assert_eq!(Limit::Bytes(64 << 10).to_string(), "64 KiB");
        assert_eq!(Limit::Unlimited.to_string(), "unlimited");
    }
}
