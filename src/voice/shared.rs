//! Voice directories as they are on disk, for servers that share one (replicas with the custom-voice
//! store on a ReadWriteMany volume): each directory's `*.json` files are remembered with the
//! identity of the file they were parsed from (device, inode, size, mtime, ctime), and read again
//! when asked to. A read is one directory listing plus one `stat` per voice file; only a file whose
//! identity changed is parsed again, so reading an unchanged directory parses nothing. A file that
//! is not a valid voice (cut short, corrupt, misnamed) is skipped with one warning per state of the
//! file, never an error.
//!
//! A lookup that misses reads the directories again before answering, but a directory whose own
//! identity (its mtime above all: adding, removing or renaming an entry moves it) is the one last
//! listed, and whose mtime was [`SETTLED`] old when it was listed, holds no new file: the miss
//! costs one open and `fstat` of that directory instead of a listing, so a flood of requests for
//! unknown voices adds no listing to the revalidation's (at most one a second, [`REVALIDATE`]).
//! The settling time covers file systems whose clock moves in ticks (a second or two on some),
//! where a change in the same tick as the last one would not move the mtime. A lookup that finds
//! a voice whose file changed reads every directory again (an edit in place moves no mtime).
//!
//! [`StoreLock`] is the lock every writer of a store takes (`flock` on [`LOCK_FILE`] in the store),
//! so a name check and the save after it are one step across processes and machines; a writer
//! gives up after a bounded wait ([`LOCK_WAIT`]) rather than hang behind a stuck one.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::{Voice, VoiceError};

/// How old a listing may be: a store's directories are read again whenever a request uses the
/// voices (`FrontEnd::voices`: speech, listings, lookups, changes) and the last read began
/// longer ago than this. A lookup that misses, or finds a voice whose file changed, reads them
/// again at once.
pub const REVALIDATE: Duration = Duration::from_secs(1);

/// How old a directory's mtime must be, when it is listed, for a later miss to trust it
/// unchanged (see the module's doc).
pub const SETTLED: Duration = Duration::from_secs(2);

/// The lock file in a custom-voice store (hidden, so never a voice).
pub const LOCK_FILE: &str = ".onebit-voices.lock";

/// How long a writer waits for the store's lock by default ([`StoreLock::acquire`]).
pub const LOCK_WAIT: Duration = Duration::from_secs(30);

/// What identifies one version of a file: a rename into place is a new inode, an edit in place
/// a new size, mtime or ctime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileId {
    fn of(meta: &fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt as _;
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        }
    }

    /// The identity of the file at `path` now (following links); `None` when there is none.
    pub(super) fn now(path: &Path) -> Option<Self> {
        fs::metadata(path)
            .ok()
            .filter(fs::Metadata::is_file)
            .map(|m| Self::of(&m))
    }

    /// The identity of the directory at `path` now; `None` when there is none. Taken through an
    /// open directory, not a path `stat`: on NFS an open revalidates the attributes with the
    /// server (close-to-open), where a `stat` may answer from a cache tens of seconds old.
    fn of_dir(path: &Path) -> Option<Self> {
        fs::File::open(path)
            .and_then(|d| d.metadata())
            .ok()
            .filter(fs::Metadata::is_dir)
            .map(|m| Self::of(&m))
    }

    /// Whether the mtime is [`SETTLED`] or more before `t`.
    fn settled_at(&self, t: SystemTime) -> bool {
        let Ok(since_epoch) = t.duration_since(SystemTime::UNIX_EPOCH) else {
            return false;
        };
        let mtime_ns = i128::from(self.mtime.0) * 1_000_000_000 + i128::from(self.mtime.1);
        let bound = since_epoch.saturating_sub(SETTLED).as_nanos();
        i128::try_from(bound).is_ok_and(|b| mtime_ns < b)
    }
}

/// Which directories a read lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dirs {
    All,
    /// Those whose identity moved, or was not settled, since their last listing.
    MayHaveChanged,
}

/// One `*.json` file as last read.
#[derive(Debug)]
struct FileState {
    /// `None` when the file changed while it was read: it is parsed again next time.
    id: Option<FileId>,
    /// `None`: not a valid voice (warned about once for this `id`).
    voice: Option<Arc<Voice>>,
}

#[derive(Debug)]
struct DirState {
    path: PathBuf,
    files: BTreeMap<OsString, FileState>,
    /// The last error listing the directory, so a failing directory is warned about once.
    error: Option<String>,
    /// The directory's identity when last listed, if its mtime was settled then: while it stays
    /// this, the listing is still whole.
    settled: Option<FileId>,
}

#[derive(Debug, Default)]
struct State {
    /// In precedence order: a later directory's voice of a name wins.
    dirs: Vec<DirState>,
    /// When the last completed read (listing every directory) began.
    read_began: Option<Instant>,
    /// When the last completed read or check (a miss's: listing only what may have changed)
    /// began.
    checked_began: Option<Instant>,
    reads: DiskReads,
}

/// How often a store's directories were listed and its files parsed (for tests and diagnostics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskReads {
    /// Directory listings (one per directory per read).
    pub listings: u64,
    /// Voice files parsed.
    pub parses: u64,
}

/// A voice as a store offers it: the voice, its file and that file's identity when read.
#[derive(Debug, Clone)]
pub(super) struct Slot {
    pub voice: Arc<Voice>,
    pub path: PathBuf,
    /// `None` for a voice that was not read from a directory of the store.
    pub id: Option<FileId>,
}

impl Slot {
    /// Whether the file is still the one the voice was read from (one `stat`).
    pub(super) fn is_current(&self) -> bool {
        self.id.is_none_or(|id| FileId::now(&self.path) == Some(id))
    }
}

/// The voice directories of one store, shared by all its snapshots (one per process and store).
#[derive(Debug, Default)]
pub(super) struct Disk {
    state: Mutex<State>,
    /// Bumped whenever a read finds anything changed; a snapshot built at an older generation is
    /// out of date.
    generation: AtomicU64,
}

impl Disk {
    /// Reads `dirs` (missing ones are empty).
    pub(super) fn open(dirs: &[PathBuf]) -> Arc<Self> {
        let disk = Self::default();
        {
            let mut st = disk.lock();
            st.dirs = dirs.iter().map(|d| DirState::new(d)).collect();
            disk.read_locked(&mut st);
        }
        Arc::new(disk)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic mid-read leaves a state that a later read corrects.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn reads(&self) -> DiskReads {
        self.lock().reads
    }

    /// Makes sure the directories were read after `since`, for a lookup that found a voice whose
    /// file changed (edited in place, it moves no directory's mtime): reads them all unless a
    /// read that began at or after `since` has completed.
    pub(super) fn reread_all(&self, since: Instant) {
        let mut st = self.lock();
        if st.read_began.is_some_and(|t| t >= since) {
            return;
        }
        self.read_locked(&mut st);
    }

    /// Makes sure the directories' voices are known as they were after `since`, for a lookup
    /// that missed: lists each directory that may have changed since it was last listed (one
    /// open and `fstat` tells), unless a read or check that began at or after `since` has
    /// completed (concurrent misses share one).
    pub(super) fn reread(&self, since: Instant) {
        let mut st = self.lock();
        if st.checked_began.is_some_and(|t| t >= since) {
            return;
        }
        self.read_dirs(&mut st, Dirs::MayHaveChanged);
    }

    /// Reads the directories if the last read began `max_age` ago or more.
    pub(super) fn revalidate(&self, max_age: Duration) {
        let mut st = self.lock();
        if st.read_began.is_none_or(|t| t.elapsed() >= max_age) {
            self.read_locked(&mut st);
        }
    }

    /// Adds `dir` (first, so that any other directory's voice of a name wins) unless it is one
    /// already, and reads every directory.
    pub(super) fn add_dir(&self, dir: &Path) {
        let mut st = self.lock();
        if !st.dirs.iter().any(|d| d.path == dir) {
            st.dirs.insert(0, DirState::new(dir));
        }
        self.read_locked(&mut st);
    }

    fn read_locked(&self, st: &mut State) {
        self.read_dirs(st, Dirs::All);
    }

    /// Lists `which` directories, bumping the generation when anything changed.
    fn read_dirs(&self, st: &mut State, which: Dirs) {
        let began = Instant::now();
        let mut changed = false;
        let State { dirs, reads, .. } = &mut *st;
        for d in dirs.iter_mut() {
            let unchanged = || d.settled.is_some() && d.settled == FileId::of_dir(&d.path);
            if which == Dirs::All || !unchanged() {
                changed |= d.read(reads);
            }
        }
        if which == Dirs::All {
            st.read_began = Some(began);
        }
        st.checked_began = Some(began);
        if changed {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// The directories, the voices they hold (a later directory's voice of a name winning) and
    /// the generation they were read at.
    pub(super) fn view(&self) -> (u64, Vec<PathBuf>, BTreeMap<String, Slot>) {
        let st = self.lock();
        let mut voices = BTreeMap::new();
        for d in &st.dirs {
            for (file, f) in &d.files {
                if let Some(v) = &f.voice {
                    let slot = Slot {
                        voice: v.clone(),
                        path: d.path.join(file),
                        id: f.id,
                    };
                    voices.insert(v.name.clone(), slot);
                }
            }
        }
        let dirs = st.dirs.iter().map(|d| d.path.clone()).collect();
        // Read under the lock: no read can have bumped it past this view.
        (self.generation(), dirs, voices)
    }
}

impl DirState {
    fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            files: BTreeMap::new(),
            error: None,
            settled: None,
        }
    }

    /// Lists the directory and parses the `*.json` files that are new or changed; true when
    /// anything differs from the last read.
    fn read(&mut self, reads: &mut DiskReads) -> bool {
        reads.listings += 1;
        // Before listing: a change during the listing then moves the identity from this one.
        let wall = SystemTime::now();
        let before = FileId::of_dir(&self.path);
        self.settled = None;
        // The whole listing first: one entry that cannot be read (a network volume's hiccup)
        // would otherwise count every voice not yet seen as removed.
        let entries = match fs::read_dir(&self.path).and_then(|d| d.collect::<Result<Vec<_>, _>>())
        {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.error = None;
                let changed = !self.files.is_empty();
                self.files.clear();
                return changed;
            }
            Err(e) => {
                // A directory that cannot be listed now (a network volume's hiccup) keeps the
                // voices last read from it rather than losing them all.
                let msg = e.to_string();
                if self.error.as_ref() != Some(&msg) {
                    tracing::warn!(dir = %self.path.display(), "cannot list the voice directory: {msg}");
                    self.error = Some(msg);
                }
                return false;
            }
        };
        self.error = None;
        let mut old = std::mem::take(&mut self.files);
        let mut changed = false;
        for entry in entries {
            let file = entry.file_name();
            let Some(name) = file.to_str() else { continue };
            // Dot files are editors' and writers' temporary files (`.NAME.json.PID-N.tmp`), never
            // voices; `NAME.json.partial` is not `*.json`.
            if name.starts_with('.') || !name.ends_with(".json") {
                continue;
            }
            let path = self.path.join(&file);
            // Gone since the listing, or a directory: not a voice.
            let Some(id) = FileId::now(&path) else {
                continue;
            };
            if let Some(prev) = old.remove(&file)
                && prev.id == Some(id)
            {
                self.files.insert(file, prev);
                continue;
            }
            changed = true;
            reads.parses += 1;
            let voice = match super::read_voice(&path) {
                Ok(v) => Some(Arc::new(v)),
                Err(e) => {
                    tracing::warn!("skipping a voice file that is not a valid voice: {e}");
                    None
                }
            };
            // Written while it was read: whatever was parsed, parse it again next time.
            let id = (FileId::now(&path) == Some(id)).then_some(id);
            self.files.insert(file, FileState { id, voice });
        }
        // A file that changed while it was read, or that is not a valid voice (it may be
        // mended in place, which moves no mtime), is read again by the next miss too.
        self.settled = before.filter(|d| {
            d.settled_at(wall)
                && self
                    .files
                    .values()
                    .all(|f| f.id.is_some() && f.voice.is_some())
        });
        changed || !old.is_empty()
    }
}

/// An exclusive `flock` on a store's [`LOCK_FILE`], held until dropped. Every process that
/// creates or deletes voices in the store takes it around its name check and its write, so the
/// check sees every voice written before and none is written between the two. It works across
/// machines where the file system's locks do (NFS v4, or v3 with lockd; CephFS).
#[derive(Debug)]
pub struct StoreLock {
    _file: fs::File,
}

impl StoreLock {
    /// Waits up to [`LOCK_WAIT`] for the store's lock (creating the store and the lock file when
    /// missing).
    pub fn acquire(store: &Path) -> Result<Self, VoiceError> {
        Self::acquire_within(store, LOCK_WAIT)
    }

    /// Waits up to `wait` for the store's lock: a writer stuck while holding it (a replica
    /// hanging on the network volume) makes the others fail with [`VoiceError::StoreBusy`]
    /// instead of waiting for ever. Polls, since `flock` itself cannot time out.
    pub fn acquire_within(store: &Path, wait: Duration) -> Result<Self, VoiceError> {
        let path = store.join(LOCK_FILE);
        let io = |source| VoiceError::Io {
            path: path.clone(),
            source,
        };
        fs::create_dir_all(store).map_err(io)?;
        let file = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        // std's lock is flock(LOCK_EX) on Linux; closing the file releases it.
        // None: a wait too long to reckon, for ever in effect.
        let deadline = Instant::now().checked_add(wait);
        let mut pause = Duration::from_millis(2);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Self { _file: file }),
                Err(fs::TryLockError::WouldBlock) => {}
                Err(fs::TryLockError::Error(e)) => return Err(io(e)),
            }
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Err(VoiceError::StoreBusy { path, waited: wait });
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}
