//! Helpers shared by the crate's unit tests (the integration tests have tests/common).

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// A fresh, empty directory under the system's temp dir, unique to this process and call, so
/// tests running in parallel never share one. Removed when dropped (a failing test's too: its
/// assertion message carries what it found), so runs do not pile up in the temp dir; `tag`
/// names it for whoever finds one that a killed run left.
pub(crate) fn tempdir(tag: &str) -> TempDir {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "onebit-unit-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    TempDir(dir)
}

/// The directory [`tempdir`] made; it goes when this does.
pub(crate) struct TempDir(PathBuf);

impl Deref for TempDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for TempDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
