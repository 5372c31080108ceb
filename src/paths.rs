//! Where onebit-tts looks for the things `scripts/setup.sh` installs (`.onebit/`).
//!
//! One rule for every stage: `$ONEBIT_HOME` first, then a `.onebit` folder in the current directory
//! or any of its ancestors, then beside the executable or any of its ancestors (so
//! `target/release/onebit-tts` finds the checkout's `.onebit` from anywhere).

use std::path::{Path, PathBuf};

/// Existing `.onebit` homes in search order, without duplicates. `$ONEBIT_HOME` is kept even when
/// it does not exist, so that error messages name the place the user asked for.
pub fn onebit_homes() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    if let Some(h) = std::env::var_os("ONEBIT_HOME").filter(|v| !v.is_empty()) {
        out.push(PathBuf::from(h));
    }
    let cwd = std::env::current_dir().ok();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    for start in cwd.iter().chain(exe_dir.iter()) {
        for dir in start.ancestors() {
            let home = dir.join(".onebit");
            if home.is_dir() && !out.contains(&home) {
                out.push(home);
            }
        }
    }
    out
}

/// `rel` under each home, in search order.
pub fn in_homes(rel: &str) -> Vec<PathBuf> {
    onebit_homes().into_iter().map(|h| h.join(rel)).collect()
}
