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

/// Files at least this large are hard-linked into a package instead of copied: weights are
/// never edited in place, so sharing them costs nothing; small files (configs, tokenizers) are
/// copied so that editing one in a package never changes its source (a cached blob, say).
pub const LINK_AT: u64 = 16 << 20;

/// Puts `from`'s content at `to`: a hard link when the file is large and the file system
/// allows, else a copy written beside `to` and renamed into place. True when linked.
pub fn link_or_copy(from: &Path, to: &Path) -> std::io::Result<bool> {
    let real = std::fs::canonicalize(from)?;
    if std::fs::metadata(&real)?.len() >= LINK_AT && std::fs::hard_link(&real, to).is_ok() {
        return Ok(true);
    }
    let mut out = PartialFile::create(to)?;
    std::io::copy(&mut std::fs::File::open(&real)?, &mut out)?;
    out.commit()?;
    Ok(false)
}

/// How [`copy_tree`] puts each file in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Files {
    /// [`link_or_copy`]: large files hard-linked where the file system allows.
    LinkLarge,
    /// Always a copy of its own (the copy will be written in place).
    Copy,
}

/// Copies `src` into `dst` recursively, leaving out the paths in `skip`. Returns (copied,
/// linked) file counts; an error names the path it happened at.
pub fn copy_tree(
    src: &Path,
    dst: &Path,
    skip: &[PathBuf],
    files: Files,
) -> Result<(usize, usize), (PathBuf, std::io::Error)> {
    let mut counts = (0, 0);
    copy_tree_into(src, dst, skip, files, &mut counts)?;
    Ok(counts)
}

fn copy_tree_into(
    src: &Path,
    dst: &Path,
    skip: &[PathBuf],
    files: Files,
    counts: &mut (usize, usize),
) -> Result<(), (PathBuf, std::io::Error)> {
    fn at(p: &Path) -> impl FnOnce(std::io::Error) -> (PathBuf, std::io::Error) + '_ {
        move |e| (p.to_path_buf(), e)
    }
    std::fs::create_dir_all(dst).map_err(at(dst))?;
    for entry in std::fs::read_dir(src).map_err(at(src))? {
        let entry = entry.map_err(at(src))?;
        let from = entry.path();
        if skip.contains(&from) {
            continue;
        }
        let to = dst.join(entry.file_name());
        if std::fs::metadata(&from).map_err(at(&from))?.is_dir() {
            copy_tree_into(&from, &to, skip, files, counts)?;
            continue;
        }
        let linked = match files {
            Files::LinkLarge => link_or_copy(&from, &to).map_err(at(&from))?,
            Files::Copy => {
                std::fs::copy(&from, &to).map_err(at(&from))?;
                false
            }
        };
        if linked {
            counts.1 += 1;
        } else {
            counts.0 += 1;
        }
    }
    Ok(())
}

/// A file written under `NAME.EXT.partial` beside its final name and renamed over it only once
/// complete, so a failed or interrupted run never leaves a cut file under the requested name.
/// Dropped without [`commit`](Self::commit), it removes what it wrote.
pub struct PartialFile {
    tmp: PathBuf,
    target: PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
    /// The first failed [`append`](Self::append), returned by the commit.
    failed: Option<std::io::Error>,
}

impl PartialFile {
    pub fn create(target: &Path) -> std::io::Result<Self> {
        let ext = target.extension().and_then(|e| e.to_str()).unwrap_or("out");
        let tmp = target.with_extension(format!("{ext}.partial"));
        let file = std::fs::File::create(&tmp)?;
        Ok(Self {
            tmp,
            target: target.to_path_buf(),
            file: Some(std::io::BufWriter::new(file)),
            failed: None,
        })
    }

    /// Appends `bytes` from a producer that cannot take an error back (a synthesis sink);
    /// false once a write has failed, whose error the commit then returns.
    pub fn append(&mut self, bytes: &[u8]) -> bool {
        if self.failed.is_none()
            && let Err(e) = std::io::Write::write_all(self, bytes)
        {
            self.failed = Some(e);
        }
        self.failed.is_none()
    }

    /// Overwrites `bytes` at `offset` of what was appended (a whole file's header patched at
    /// its end, [`crate::synth::SynthEvent::Patch`]); later appends go on at the end. False once a
    /// write has failed, as [`append`](Self::append).
    pub fn patch(&mut self, offset: u64, bytes: &[u8]) -> bool {
        use std::io::{Seek, SeekFrom, Write};
        if self.failed.is_none() {
            let done = match self.file.as_mut() {
                // BufWriter's seek writes out what it buffered first.
                Some(f) => f
                    .seek(SeekFrom::Start(offset))
                    .and_then(|_| f.write_all(bytes))
                    .and_then(|()| f.seek(SeekFrom::End(0)).map(drop)),
                None => Err(std::io::Error::other("file already committed")),
            };
            if let Err(e) = done {
                self.failed = Some(e);
            }
        }
        self.failed.is_none()
    }

    /// Whether every append so far succeeded; the first failure otherwise (the file still
    /// refuses to commit).
    pub fn check(&self) -> std::io::Result<()> {
        match &self.failed {
            Some(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
            None => Ok(()),
        }
    }

    /// Flushes and renames the file to its final name; the first failed append, if any, instead.
    pub fn commit(mut self) -> std::io::Result<()> {
        let Some(mut f) = self.file.take() else {
            return Ok(());
        };
        let done = match self.failed.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
        .and_then(|()| std::io::Write::flush(&mut f))
        .and_then(|()| f.into_inner().map_err(|e| e.into_error()))
        .and_then(|f| f.sync_all())
        .and_then(|()| std::fs::rename(&self.tmp, &self.target));
        if done.is_err() {
            let _ = std::fs::remove_file(&self.tmp);
        }
        done
    }
}

impl std::io::Write for PartialFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self.file.as_mut() {
            Some(f) => f.write(buf),
            None => Err(std::io::Error::other("file already committed")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for PartialFile {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
