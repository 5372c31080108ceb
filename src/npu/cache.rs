//! Where the NPU session's compile cache lives.
//!
//! A first NPU load compiles the model and caches the result, and AMD's NPU packages ship that
//! cache as `.cache/` inside the model directory (the session's `model_root`), where the
//! provider reads it and writes what it compiles. A model directory mounted read-only (as a
//! container deployment mounts its models) makes that write fail, or the load compiles again
//! at every start.
//!
//! So the session's `model_root` is the package itself only where it may be written and no
//! cache directory was named; otherwise it is a directory of our own under the cache root
//! (`ONEBIT_NPU_CACHE_DIR`, else `$XDG_CACHE_HOME/onebit-tts/npu`) that mirrors the package
//! with symbolic links, file by file, and holds a writable `.cache/` of its own, seeded once
//! from the package's. The weights are never copied; the package is never written.

use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::NpuError;

/// Names the cache root (a writable directory; a volume in a container).
pub const CACHE_DIR_VAR: &str = "ONEBIT_NPU_CACHE_DIR";
/// The compile cache's name inside a model directory (AMD's NPU packages ship one).
pub const PACKAGE_CACHE: &str = ".cache";

/// The directory a session loads from, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRoot {
    /// The package itself (writable, and no cache directory named).
    Package(PathBuf),
    /// A mirror of the package under the cache root, with its own `.cache/` (`seeded`: copied
    /// from the package's this time).
    Mirror { dir: PathBuf, seeded: bool },
}

impl ModelRoot {
    pub fn dir(&self) -> &Path {
        match self {
            ModelRoot::Package(d) | ModelRoot::Mirror { dir: d, .. } => d,
        }
    }
}

/// The cache root for a package that cannot be written when none is named:
/// `$XDG_CACHE_HOME/onebit-tts/npu`, else `~/.cache/onebit-tts/npu` (`None`: no home either).
pub fn fallback_root() -> Option<PathBuf> {
    crate::native::env_path("XDG_CACHE_HOME")
        .or_else(|| crate::native::env_path("HOME").map(|h| h.join(".cache")))
        .map(|c| c.join("onebit-tts").join("npu"))
}

/// Where the session for `package` loads from (see the module docs). `named`: the cache root
/// the user named (`ONEBIT_NPU_CACHE_DIR`); `fallback`: the one to use when the package cannot
/// be written and none was named.
pub fn model_root(
    package: &Path,
    named: Option<&Path>,
    fallback: Option<&Path>,
) -> Result<ModelRoot, NpuError> {
    let root = match named {
        Some(r) => r,
        None if writable(package) => return Ok(ModelRoot::Package(package.to_path_buf())),
        None => fallback.ok_or_else(|| NpuError::Parse {
            path: package.to_path_buf(),
            what: format!(
                "the model directory cannot be written (the NPU session writes its compile \
                 cache there) and no cache directory is known: set {CACHE_DIR_VAR} to a \
                 writable directory"
            ),
        })?,
    };
    let package = fs::canonicalize(package).map_err(|e| NpuError::io(package, e))?;
    let dir = root.join(mirror_name(&package));
    fs::create_dir_all(&dir).map_err(|e| NpuError::io(&dir, e))?;
    link_files(&package, &dir)?;
    let cache = dir.join(PACKAGE_CACHE);
    let shipped = package.join(PACKAGE_CACHE);
    let seeded = !cache.exists() && shipped.is_dir() && seed(&shipped, &dir, &cache)?;
    fs::create_dir_all(&cache).map_err(|e| NpuError::io(&cache, e))?;
    Ok(ModelRoot::Mirror { dir, seeded })
}

/// One link in `dir` per entry of `package` (but its cache), made or kept; links whose entry
/// left the package are removed. A subdirectory is linked whole: what a session writes under it
/// would go to the package, so only `.cache/` is a directory of the mirror's own.
fn link_files(package: &Path, dir: &Path) -> Result<(), NpuError> {
    let mut names = Vec::new();
    for entry in fs::read_dir(package).map_err(|e| NpuError::io(package, e))? {
        let entry = entry.map_err(|e| NpuError::io(package, e))?;
        let name = entry.file_name();
        if name == PACKAGE_CACHE {
            continue;
        }
        let link = dir.join(&name);
        let target = entry.path();
        names.push(name);
        // A link made by an earlier start, or by another worker a moment ago, is kept.
        match fs::read_link(&link) {
            Ok(t) if t == target => continue,
            Ok(_) => fs::remove_file(&link).map_err(|e| NpuError::io(&link, e))?,
            Err(_) if link.symlink_metadata().is_ok() => {
                return Err(NpuError::Parse {
                    path: link,
                    what: "is not a link into the package: remove it".into(),
                });
            }
            Err(_) => {}
        }
        match std::os::unix::fs::symlink(&target, &link) {
            Ok(()) => {}
            Err(e)
                if e.kind() == std::io::ErrorKind::AlreadyExists
                    && fs::read_link(&link).is_ok_and(|t| t == target) => {}
            Err(e) => return Err(NpuError::io(&link, e)),
        }
    }
    for entry in fs::read_dir(dir).map_err(|e| NpuError::io(dir, e))? {
        let entry = entry.map_err(|e| NpuError::io(dir, e))?;
        let path = entry.path();
        if !names.contains(&entry.file_name()) && path.is_symlink() {
            fs::remove_file(&path).map_err(|e| NpuError::io(&path, e))?;
        }
    }
    Ok(())
}

/// Copies the package's shipped cache to `cache` under a temporary name, then renames it into
/// place, so an interrupted copy is never taken for a cache. False when another worker's copy
/// got there first (then ours is dropped). Copies left by processes that no longer exist are
/// removed.
fn seed(shipped: &Path, dir: &Path, cache: &Path) -> Result<bool, NpuError> {
    let prefix = format!("{PACKAGE_CACHE}.partial-");
    for entry in fs::read_dir(dir)
        .map_err(|e| NpuError::io(dir, e))?
        .flatten()
    {
        let name = entry.file_name();
        let pid = name.to_str().and_then(|n| n.strip_prefix(&prefix));
        if let Some(pid) = pid
            && !Path::new("/proc").join(pid).exists()
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
    let tmp = dir.join(format!("{prefix}{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    crate::paths::copy_tree(shipped, &tmp, &[], crate::paths::Files::Copy)
        .map_err(|(path, e)| NpuError::io(path, e))?;
    match fs::rename(&tmp, cache) {
        Ok(()) => Ok(true),
        Err(_) if cache.is_dir() => {
            let _ = fs::remove_dir_all(&tmp);
            Ok(false)
        }
        Err(e) => Err(NpuError::io(cache, e)),
    }
}

/// `<package dir name>-<sha256 of its canonical path, 16 hex digits>`: two packages never share
/// a mirror, and the name stays the same across releases (the compile cache is kept).
fn mirror_name(package: &Path) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(package.as_os_str().as_bytes());
    let name: String = package
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{name}-{}", &format!("{digest:x}")[..16])
}

/// Whether this process may create files in `dir` (a read-only mount says no).
fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads the NUL-terminated path and nothing else.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn package(t: &Path) -> PathBuf {
        let p = t.join("neutts-air-npu");
        fs::create_dir_all(p.join(".cache/sub")).expect("mkdir");
        fs::write(p.join("genai_config.json"), "{}").expect("write");
        fs::write(p.join("model.onnx"), "graph").expect("write");
        fs::write(p.join(".cache/sub/compiled.bin"), "compiled").expect("write");
        p
    }

    #[test]
    fn a_writable_package_is_its_own_root_unless_a_cache_dir_is_named() {
        let t = crate::testutil::tempdir("npu-cache-writable");
        let p = package(&t);
        assert_eq!(
            model_root(&p, None, None).expect("root"),
            ModelRoot::Package(p.clone())
        );
        let named = t.join("cache");
        let r = model_root(&p, Some(&named), None).expect("mirror");
        assert!(matches!(r, ModelRoot::Mirror { seeded: true, .. }), "{r:?}");
        assert!(r.dir().starts_with(&named));
    }

    #[test]
    fn a_read_only_package_gets_a_mirror_with_a_writable_seeded_cache() {
        // Root ignores permission bits: what a read-only mount refuses cannot be shown then.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let t = crate::testutil::tempdir("npu-cache-ro-root");
            let p = package(&t);
            let r = model_root(&p, Some(&t.join("c")), None).expect("mirror");
            check_mirror(&p, r.dir());
            return;
        }
        let t = crate::testutil::tempdir("npu-cache-ro");
        let p = package(&t);
        fs::set_permissions(&p, fs::Permissions::from_mode(0o555)).expect("chmod");
        let e = model_root(&p, None, None).expect_err("nowhere to write");
        assert!(e.to_string().contains(CACHE_DIR_VAR), "{e}");
        let r = model_root(&p, None, Some(&t.join("fallback"))).expect("mirror");
        check_mirror(&p, r.dir());
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    fn check_mirror(p: &Path, dir: &Path) {
        assert_eq!(
            fs::read_link(dir.join("model.onnx")).expect("link"),
            p.join("model.onnx")
        );
        assert_eq!(
            fs::read_to_string(dir.join("genai_config.json")).expect("read"),
            "{}"
        );
        let cache = dir.join(PACKAGE_CACHE);
        assert!(!cache.symlink_metadata().expect("cache").is_symlink());
        assert_eq!(
            fs::read_to_string(cache.join("sub/compiled.bin")).expect("seeded"),
            "compiled"
        );
        // What the session compiles lands in the mirror, never in the package.
        fs::write(cache.join("new.bin"), "x").expect("the cache is writable");
        assert!(!p.join(PACKAGE_CACHE).join("new.bin").exists());
    }

    #[test]
    fn a_second_start_reuses_the_mirror_and_keeps_its_cache() {
        let t = crate::testutil::tempdir("npu-cache-again");
        let p = package(&t);
        let root = t.join("c");
        let first = model_root(&p, Some(&root), None).expect("mirror");
        fs::write(first.dir().join(".cache/compiled-at-first-start"), "y").expect("write");
        // The package gains a file; the mirror follows, and its cache is not seeded again.
        fs::write(p.join("tokenizer.json"), "{}").expect("write");
        let again = model_root(&p, Some(&root), None).expect("mirror");
        assert_eq!(
            again,
            ModelRoot::Mirror {
                dir: first.dir().to_path_buf(),
                seeded: false
            }
        );
        assert!(again.dir().join(".cache/compiled-at-first-start").exists());
        assert!(again.dir().join("tokenizer.json").exists());
        // A file that left the package loses its link; a copy a dead process left is removed.
        fs::remove_file(p.join("tokenizer.json")).expect("rm");
        let stale = again.dir().join(".cache.partial-999999999");
        fs::create_dir_all(&stale).expect("mkdir");
        fs::remove_dir_all(again.dir().join(PACKAGE_CACHE)).expect("rm");
        let third = model_root(&p, Some(&root), None).expect("mirror");
        assert!(!third.dir().join("tokenizer.json").exists());
        assert!(!third.dir().join("tokenizer.json").is_symlink());
        assert!(!stale.exists());
        assert_eq!(
            third,
            ModelRoot::Mirror {
                dir: first.dir().to_path_buf(),
                seeded: true
            }
        );
        // Another package never shares it.
        let other = t.join("other/neutts-air-npu");
        fs::create_dir_all(&other).expect("mkdir");
        let o = model_root(&other, Some(&root), None).expect("mirror");
        assert_ne!(o.dir(), again.dir());
    }
}
