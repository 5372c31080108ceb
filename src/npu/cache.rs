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
use std::hash::{Hash, Hasher};
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
    let entries = fs::read_dir(&package).map_err(|e| NpuError::io(&package, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| NpuError::io(&package, e))?;
        let name = entry.file_name();
        if name == PACKAGE_CACHE {
            continue;
        }
        let link = dir.join(&name);
        let target = entry.path();
        // A link made by an earlier start (to this same package: the name says which) is kept.
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
        std::os::unix::fs::symlink(&target, &link).map_err(|e| NpuError::io(&link, e))?;
    }
    let cache = dir.join(PACKAGE_CACHE);
    let shipped = package.join(PACKAGE_CACHE);
    let seeded = !cache.exists() && shipped.is_dir();
    if seeded {
        // Copied into a temporary name and renamed: an interrupted copy is never taken for a
        // cache.
        let tmp = dir.join(format!("{PACKAGE_CACHE}.partial-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        copy_tree(&shipped, &tmp)?;
        fs::rename(&tmp, &cache).map_err(|e| NpuError::io(&cache, e))?;
    } else {
        fs::create_dir_all(&cache).map_err(|e| NpuError::io(&cache, e))?;
    }
    Ok(ModelRoot::Mirror { dir, seeded })
}

/// `<package dir name>-<hash of its canonical path>`: two packages never share a mirror.
fn mirror_name(package: &Path) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    package.as_os_str().as_bytes().hash(&mut h);
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
    format!("{name}-{:016x}", h.finish())
}

/// Whether this process may create files in `dir` (a read-only mount says no).
fn writable(dir: &Path) -> bool {
    let Ok(c) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) reads the NUL-terminated path and nothing else.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

fn copy_tree(from: &Path, to: &Path) -> Result<(), NpuError> {
    fs::create_dir_all(to).map_err(|e| NpuError::io(to, e))?;
    for entry in fs::read_dir(from).map_err(|e| NpuError::io(from, e))? {
        let entry = entry.map_err(|e| NpuError::io(from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if entry
            .file_type()
            .map_err(|e| NpuError::io(&src, e))?
            .is_dir()
        {
            copy_tree(&src, &dst)?;
        } else {
            fs::copy(&src, &dst).map_err(|e| NpuError::io(&src, e))?;
        }
    }
    Ok(())
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
        // Another package never shares it.
        let other = t.join("other/neutts-air-npu");
        fs::create_dir_all(&other).expect("mkdir");
        let o = model_root(&other, Some(&root), None).expect("mirror");
        assert_ne!(o.dir(), again.dir());
    }
}
