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

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error(
        "{}: exists and was not made by `models pull` or `models build`; move it away or pass \
         --force to replace it",
        .0.display()
    )]
    Occupied(PathBuf),
    #[error(
        "{}: holds model packages, which not even --force replaces: give the package's own \
         directory",
        .0.display()
    )]
    HoldsPackages(PathBuf),
    #[error(
        "{}: the new package could not take its place ({err}) and the old one could not be put \
         back; it is at {}",
        .dir.display(),
        .old.display()
    )]
    Stranded {
        dir: PathBuf,
        old: PathBuf,
        err: std::io::Error,
    },
    #[error("{}: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> InstallError + '_ {
    move |err| InstallError::Io {
        path: path.to_path_buf(),
        err,
    }
}

fn ours(dir: &Path) -> bool {
    dir.join(PULLED).is_file() || dir.join(BUILT).is_file()
}

/// Whether a package may be put at `dir`: nothing is there, or `models pull` or `models build`
/// made what is there (its manifest says so), or the user said `--force` — but never over a
/// directory that holds packages (`--dir models`).
pub fn check_replaceable(dir: &Path, force: bool) -> Result<(), InstallError> {
    if !dir.exists() || ours(dir) {
        return Ok(());
    }
    let holds_packages = std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let p = e.path();
            // A GGUF package's own conversion (`models pull`, `models setup`) is part of it.
            p.is_dir()
                && p.file_name() != Some(super::CONVERTED_DIR.as_ref())
                && (ours(&p)
                    || p.join("genai_config.json").is_file()
                    || super::gguf::find_in(&p).is_ok_and(|g| g.is_some()))
        })
    });
    match (force, holds_packages) {
        (_, true) => Err(InstallError::HoldsPackages(dir.to_path_buf())),
        (false, false) => Err(InstallError::Occupied(dir.to_path_buf())),
        (true, false) => Ok(()),
    }
}

/// A fresh directory beside `dir` (same file system, so the final rename is atomic) to assemble
/// a package in. What runs killed before (Ctrl-C in a build) left beside `dir` is cleaned up
/// first: their work directories removed, and an old package that was moved aside put back if
/// nothing took its place.
pub fn work_dir(dir: &Path, what: &str) -> Result<PathBuf, InstallError> {
    let parent = dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let leaf = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "package".into());
    clean_stale(parent, &leaf, dir);
    let work = parent.join(format!(".{leaf}.{what}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir(&work).map_err(io(&work))?;
    Ok(work)
}

fn clean_stale(parent: &Path, leaf: &str, dir: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let prefix = format!(".{leaf}.");
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((kind, pid)) = name
            .strip_prefix(&prefix)
            .and_then(|rest| rest.rsplit_once('-'))
        else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        // SAFETY: kill with signal 0 only asks whether the process exists.
        let dead = unsafe { libc::kill(pid, 0) } == -1
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if !dead {
            continue;
        }
        match kind {
            "old" if !dir.exists() => {
                let _ = std::fs::rename(e.path(), dir);
            }
            "old" | "pull" | "build" | "convert" => {
                let _ = std::fs::remove_dir_all(e.path());
            }
            _ => {}
        }
    }
}

/// Renames the finished package `ready` to `dir`. A package already there is swapped with it
/// in one step (renameat2 RENAME_EXCHANGE: at every moment `dir` is the old package or the
/// new one) and then removed; where the file system cannot exchange, it is moved aside first
/// and put back if the second rename fails.
pub fn install(ready: &Path, dir: &Path) -> Result<Placed, InstallError> {
    install_with(ready, dir, exchange)
}

/// [`install`] with the exchange step given, so the two-step path of file systems without
/// RENAME_EXCHANGE is tested on one that has it.
fn install_with(
    ready: &Path,
    dir: &Path,
    exchange: fn(&Path, &Path) -> std::io::Result<()>,
) -> Result<Placed, InstallError> {
    if !dir.exists() {
        std::fs::rename(ready, dir).map_err(io(dir))?;
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
    std::fs::rename(dir, &old).map_err(io(dir))?;
    if let Err(err) = std::fs::rename(ready, dir) {
        if std::fs::rename(&old, dir).is_err() {
            return Err(InstallError::Stranded {
                dir: dir.to_path_buf(),
                old,
                err,
            });
        }
        return Err(io(dir)(err));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn unsupported(_: &Path, _: &Path) -> std::io::Result<()> {
        Err(std::io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn package(dir: &Path, content: &str) {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("model.onnx"), content).unwrap();
    }

    fn content(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("model.onnx")).unwrap()
    }

    /// What is left beside the package: nothing but the package itself.
    fn entries(parent: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(parent)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn without_an_exchange_the_old_package_moves_aside_and_is_put_back_on_failure() {
        let root = crate::testutil::tempdir("install");
        let (ready, dir) = (root.join("ready"), root.join("pkg"));
        package(&dir, "old");
        package(&ready, "new");
        assert_eq!(
            install_with(&ready, &dir, unsupported).unwrap(),
            Placed::Replaced
        );
        assert_eq!(content(&dir), "new");
        assert_eq!(entries(&root), ["pkg"]);

        // The new package's rename fails (it is gone): the old one is put back, untouched.
        let err = install_with(&root.join("missing"), &dir, unsupported).unwrap_err();
        assert!(matches!(err, InstallError::Io { .. }), "{err}");
        assert_eq!(content(&dir), "new");
        assert_eq!(entries(&root), ["pkg"]);

        // With the exchange, the same replacement in one step.
        package(&ready, "newer");
        assert_eq!(install(&ready, &dir).unwrap(), Placed::Replaced);
        assert_eq!(content(&dir), "newer");
        assert_eq!(entries(&root), ["pkg"]);
    }
}
