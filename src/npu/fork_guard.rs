//! Once an NPU session exists, its process must never fork or exec.
//!
//! XRT holds the session's hardware contexts through one fd on the accel node. A child made by
//! `fork` (or `posix_spawn`, `system`, `popen`) holds a copy of that fd and closes it when it
//! execs (close-on-exec) or exits, and `close(2)` runs the file's `flush` on every descriptor
//! closed, not only the last. amdxdna's flush on the kernels our users run (mainline 6.14
//! through at least 6.18) removes every hardware context of the fd's DRM client,
//! unconditionally: the session's contexts die with the child's copy, and the next NPU
//! submission fails. (AMD's DKMS driver skips the flush when the closing task is another
//! process, and a later kernel removes the flush; no one can rely on either.)
//!
//! [`forbid`] makes that a refusal instead of a teardown: a seccomp filter, on every thread of
//! the process, answers `EPERM` to `fork`, `vfork`, `execve`, `execveat` and to `clone` without
//! `CLONE_THREAD`, and `ENOSYS` to `clone3` (whose flags a filter cannot read; glibc then falls
//! back to `clone`, so threads are still made). Nothing is killed: a library that tries to
//! spawn gets an error it can report, and the contexts stay.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Why the guard exists, for the log line and the error a refused spawn leads to.
pub const WHY: &str = "an NPU session exists in this process: a child process would close its \
                       copy of XRT's accel fd on exec or exit, and amdxdna's flush then destroys \
                       the session's hardware contexts";

/// How a worker with the guard installed reports it.
pub const REFUSED: &str = "refused (seccomp: fork, vfork, execve, execveat and clone without \
                           CLONE_THREAD answer EPERM)";

static FORBIDDEN: AtomicBool = AtomicBool::new(false);

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "cannot forbid fork/exec in this process ({0}): a child must never be made here, since {WHY}"
    )]
    Filter(String),
}

/// Whether this process refuses fork/exec.
pub fn forbidden() -> bool {
    FORBIDDEN.load(Ordering::Acquire)
}

/// From now on this process refuses to fork or exec (see the module docs). Idempotent; logs
/// why once.
pub fn forbid() -> Result<(), GuardError> {
    if forbidden() {
        return Ok(());
    }
    for filter in filters()? {
        let prog: BpfProgram = filter
            .try_into()
            .map_err(|e: seccompiler::BackendError| GuardError::Filter(e.to_string()))?;
        seccompiler::apply_filter_all_threads(&prog)
            .map_err(|e| GuardError::Filter(e.to_string()))?;
    }
    FORBIDDEN.store(true, Ordering::Release);
    tracing::info!("this process now refuses fork and exec (EPERM): {WHY}");
    Ok(())
}

/// The two filters: `ENOSYS` for `clone3` first (installed alone, it makes glibc use `clone`,
/// which is still allowed: no half-installed guard lets a child through `clone3`), then `EPERM`
/// for the process-making calls.
fn filters() -> Result<Vec<SeccompFilter>, GuardError> {
    let arch = std::env::consts::ARCH
        .try_into()
        .map_err(|e: seccompiler::BackendError| GuardError::Filter(e.to_string()))?;
    let bad = |e: seccompiler::BackendError| GuardError::Filter(e.to_string());
    // clone's first argument is its flags on every architecture we build for.
    let not_a_thread = SeccompRule::new(vec![
        SeccompCondition::new(
            0,
            SeccompCmpArgLen::Qword,
            SeccompCmpOp::MaskedEq(libc::CLONE_THREAD as u64),
            0,
        )
        .map_err(bad)?,
    ])
    .map_err(bad)?;
    let mut refused: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    // An empty rule list matches the call whatever its arguments.
    for nr in process_calls() {
        refused.insert(nr, Vec::new());
    }
    refused.insert(libc::SYS_clone, vec![not_a_thread]);
    let eperm = SeccompFilter::new(
        refused,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(bad)?;
    let enosys = SeccompFilter::new(
        [(libc::SYS_clone3, Vec::new())].into_iter().collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
        arch,
    )
    .map_err(bad)?;
    Ok(vec![enosys, eperm])
}

/// The calls that make a process or replace this one, beside `clone`.
#[cfg(target_arch = "x86_64")]
fn process_calls() -> [i64; 4] {
    [
        libc::SYS_fork,
        libc::SYS_vfork,
        libc::SYS_execve,
        libc::SYS_execveat,
    ]
}

/// aarch64 has no fork/vfork calls: glibc makes both with `clone`.
#[cfg(not(target_arch = "x86_64"))]
fn process_calls() -> [i64; 2] {
    [libc::SYS_execve, libc::SYS_execveat]
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_filters_compile_for_this_architecture() {
        let f = super::filters().expect("filters");
        assert_eq!(f.len(), 2);
        for filter in f {
            let prog: seccompiler::BpfProgram = filter.try_into().expect("bpf");
            assert!(!prog.is_empty());
        }
    }
}
