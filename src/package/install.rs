//! Putting a finished package directory in place, for `models pull` and `models build`: it is
//! assembled beside its final name (same file system), then swapped in, so a reader of
//! `models/NAME` sees the old package or the new one, never a part of either; a directory
//! neither command made is replaced only when the user says so.

use std::path::{Path, PathBuf};

use serde::Serialize;

/// What `models pull` writes beside a package it made.
pub const PULLED: &str = "pull.json";
/// What `models build` writes beside a package it made.
pub const BUILT: &str = "build.json";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placed {
    New,
    Replaced,
    UpToDate,
}

/// Whether a package may be put at `dir`: nothing is there, or `models pull` or `models build`
/// made what is there (its manifest says so), or the user said `--force`.
pub fn replaceable(dir: &Path, force: bool) -> bool {
    let ours = |d: &Path| d.join(PULLED).is_file() || d.join(BUILT).is_file();
    // Not even --force replaces a directory that holds other packages (`--dir models`).
    let holds_packages = || {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries.flatten().any(|e| {
                let p = e.path();
                p.is_dir()
                    && (ours(&p)
                        || p.join("genai_config.json").is_file()
                        || super::gguf::find_in(&p).is_ok_and(|g| g.is_some()))
            })
        })
    };
    !dir.exists() || ours(dir) || (force && !holds_packages())
}

/// A fresh directory beside `dir` (same file system, so the final rename is atomic) to assemble
/// a package in.
pub fn work_dir(dir: &Path, what: &str) -> std::io::Result<PathBuf> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let leaf = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "package".into());
    let work = parent.join(format!(".{leaf}.{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir(&work)?;
    Ok(work)
}

/// Renames the finished package `ready` to `dir`. A package already there is swapped with it
/// in one step (renameat2 RENAME_EXCHANGE: at every moment `dir` is the old package or the
/// new one) and then removed; where the file system cannot exchange, it is moved aside first
/// and put back if the second rename fails.
pub fn install(ready: &Path, dir: &Path) -> std::io::Result<Placed> {
    if !dir.exists() {
        std::fs::rename(ready, dir)?;
        return Ok(Placed::New);
    }
    if exchange(ready, dir).is_ok() {
        // `ready` now holds the old package.
        let _ = std::fs::remove_dir_all(ready);
        return Ok(Placed::Replaced);
    }
    let old = dir.with_file_name(format!(
        ".{}.old-{}",
        dir.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    std::fs::rename(dir, &old)?;
    if let Err(e) = std::fs::rename(ready, dir) {
        std::fs::rename(&old, dir)?;
        return Err(e);
    }
    let _ = std::fs::remove_dir_all(&old);
    Ok(Placed::Replaced)
}

fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c =
        |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (a, b) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths; renameat2 reads them and returns a status.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Written beside its name and renamed over it, so it replaces a link rather than writing
/// through one into a cached blob.
pub fn write_json<T: Serialize>(path: &Path, value: &T) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(std::io::Error::other)?;
    let mut f = crate::paths::PartialFile::create(path)?;
    std::io::Write::write_all(&mut f, (text + "\n").as_bytes())?;
    f.commit()
}
