//! The Hugging Face Hub as `models pull` sees it: a repository's file list at a revision (with
//! the sizes and LFS sha256 sums the hub states) and files fetched into the hub's own cache
//! (found as `huggingface_hub` finds it: [`HubConfig::from_env`]) in its layout, so what the
//! Python tools already fetched is reused and what we fetch is theirs. Downloads go through hf-hub, which writes
//! `blobs/ETAG.part` and renames it only when complete, and resumes a `.part` left by an
//! interrupted run with a Range request. Every file is checked here against the hub's size and
//! sha256 before it is used; a file that fails is removed from the cache, never kept.

use std::io::Read;
use std::path::{Path, PathBuf};

use hf_hub::api::sync::{Api, ApiBuilder, ApiError};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The public hub, unless `HF_ENDPOINT` names another (a mirror, or a test's fake hub).
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error(
        "{repo} is gated: accept its terms at {url} while logged in, then set HF_TOKEN to a token \
         of that account (or run `hf auth login`){}",
        if *.had_token { " — the token given was refused for it" } else { "" }
    )]
    Gated {
        repo: String,
        url: String,
        had_token: bool,
    },
    #[error(
        "{repo}: no such repository on {endpoint}, or it is private{}",
        if *.had_token {
            " and the token given (HF_TOKEN or the token file) has no access to it"
        } else {
            ": for a private one set HF_TOKEN to a token with access"
        }
    )]
    NotFound {
        repo: String,
        endpoint: String,
        had_token: bool,
    },
    #[error("{repo}: no revision {revision:?}")]
    NoRevision { repo: String, revision: String },
    #[error("{repo}: the hub refused {what}: HTTP {status}{}", .message.as_deref().map(|m| format!(" ({m})")).unwrap_or_default())]
    Refused {
        repo: String,
        what: String,
        status: u16,
        message: Option<String>,
    },
    #[error(
        "could not reach {endpoint} ({detail}); set HF_ENDPOINT for a mirror, or run again where \
         the hub is reachable"
    )]
    Unreachable { endpoint: String, detail: String },
    #[error(
        "the download of {repo}/{file} from {endpoint} broke off ({detail}); run the same command \
         again: it resumes where this one stopped"
    )]
    Interrupted {
        endpoint: String,
        repo: String,
        file: String,
        detail: String,
    },
    #[error(
        "{repo}/{file}: {what} {got} does not match the hub's {want}; the file was not kept \
         (run again to fetch it anew)"
    )]
    Mismatch {
        repo: String,
        file: String,
        what: &'static str,
        got: String,
        want: String,
    },
    #[error(
        "{repo} moved to another commit while it was being pulled ({want} -> {got}); run again"
    )]
    Moved {
        repo: String,
        want: String,
        got: String,
    },
    #[error(
        "{repo}/{file}: another process is downloading it (lock {}); run again when it is done",
        .lock.display()
    )]
    Busy {
        repo: String,
        file: String,
        lock: PathBuf,
    },
    #[error("{repo}: the hub's answer is not what was expected: {detail}")]
    Protocol { repo: String, detail: String },
    #[error("{}: {err}", .path.display())]
    Io { path: PathBuf, err: std::io::Error },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |err| HubError::Io {
        path: path.to_path_buf(),
        err,
    }
}

/// Where the hub is and who asks: from the environment as the Python tools read it.
#[derive(Debug, Clone)]
pub struct HubConfig {
    pub endpoint: String,
    /// The cache's `hub` directory.
    pub cache_dir: PathBuf,
    pub token: Option<String>,
}

impl HubConfig {
    /// As `huggingface_hub` reads them: `HF_ENDPOINT` (default the public hub); the cache
    /// `HF_HUB_CACHE` (or the older `HUGGINGFACE_HUB_CACHE`), else `$HF_HOME/hub`, with
    /// `HF_HOME` defaulting to `$XDG_CACHE_HOME/huggingface` and that to `~/.cache/huggingface`;
    /// the token `HF_TOKEN` (or `HUGGING_FACE_HUB_TOKEN`), else the file `HF_TOKEN_PATH` names,
    /// else `$HF_HOME/token` (what `hf auth login` writes). Empty values count as unset.
    pub fn from_env() -> Self {
        // `~` expanded, as huggingface_hub does for these paths.
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let var = |k: &str| {
            let v = std::env::var(k).ok().filter(|v| !v.is_empty())?;
            match (v.strip_prefix("~/"), &home) {
                (Some(rest), Some(h)) => Some(h.join(rest)),
                _ => Some(PathBuf::from(v)),
            }
        };
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .map(|e| e.trim_end_matches('/').to_owned())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_owned());
        let hf_home = var("HF_HOME").unwrap_or_else(|| {
            var("XDG_CACHE_HOME")
                .or_else(|| home.as_ref().map(|h| h.join(".cache")))
                .unwrap_or_else(|| PathBuf::from(".cache"))
                .join("huggingface")
        });
        let cache_dir = var("HF_HUB_CACHE")
            .or_else(|| var("HUGGINGFACE_HUB_CACHE"))
            .unwrap_or_else(|| hf_home.join("hub"));
        let token_file = var("HF_TOKEN_PATH").unwrap_or_else(|| hf_home.join("token"));
        let nonempty = |t: String| Some(t.trim().to_owned()).filter(|t| !t.is_empty());
        let token = std::env::var("HF_TOKEN")
            .ok()
            .and_then(nonempty)
            .or_else(|| {
                std::env::var("HUGGING_FACE_HUB_TOKEN")
                    .ok()
                    .and_then(nonempty)
            })
            .or_else(|| std::fs::read_to_string(token_file).ok().and_then(nonempty));
        Self {
            endpoint,
            cache_dir,
            token,
        }
    }
}

/// One file of a repository as the hub lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    /// The path inside the repository (`/`-separated).
    pub path: String,
    pub size: Option<u64>,
    /// Stated for LFS files (the large ones): the sha256 of the content.
    pub sha256: Option<String>,
    /// The name of its blob in the cache: the LFS sha256, else the git blob id.
    pub etag: Option<String>,
}

/// A repository at one commit: what `models pull` fetches from.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub repo: String,
    /// The revision asked for (a branch, tag or commit).
    pub revision: String,
    /// The commit it resolved to.
    pub commit: String,
    pub files: Vec<RepoFile>,
    /// Listed from the local cache because the hub could not be reached: files are checked
    /// against their blob names only.
    pub offline: bool,
}

impl Snapshot {
    pub fn file(&self, path: &str) -> Option<&RepoFile> {
        self.files.iter().find(|f| f.path == path)
    }
}

/// A fetched file: where it lies in the cache and whether this run downloaded it.
#[derive(Debug, Clone)]
pub struct Fetched {
    pub path: PathBuf,
    pub downloaded: bool,
    pub size: u64,
    pub sha256: String,
}

/// Receives download progress: `start` once per attempt with the file's size and the bytes
/// already there (a resumed `.part`), then `advance` as bytes arrive.
pub trait FetchProgress {
    fn start(&mut self, file: &str, size: u64, already: u64);
    fn advance(&mut self, bytes: u64);
    fn done(&mut self);
    /// Work after the downloads (`models pull` converting a GGUF): `done` of `total` steps.
    fn step(&mut self, _what: &str, _done: usize, _total: usize) {}
}

/// Adapts hf-hub's progress calls (an `init` per attempt, then `update(resume offset)` and the
/// increments) to [`FetchProgress`].
struct Adapter<'a> {
    inner: &'a mut dyn FetchProgress,
    file: String,
    size: u64,
    started: bool,
}

impl hf_hub::api::Progress for Adapter<'_> {
    fn init(&mut self, size: usize, _filename: &str) {
        self.size = size as u64;
        self.started = false;
    }
    fn update(&mut self, n: usize) {
        if !self.started {
            // hf-hub's first update of an attempt is the resume offset.
            self.started = true;
            self.inner.start(&self.file, self.size, n as u64);
        } else {
            self.inner.advance(n as u64);
        }
    }
    fn finish(&mut self) {
        self.inner.done();
    }
}

#[derive(Deserialize)]
struct InfoJson {
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<SiblingJson>,
}

#[derive(Deserialize)]
struct SiblingJson {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<LfsJson>,
}

#[derive(Deserialize)]
struct LfsJson {
    sha256: String,
    size: Option<u64>,
}

pub struct Hub {
    config: HubConfig,
    api: Api,
}

impl Hub {
    pub fn new(config: HubConfig) -> Result<Self, HubError> {
        let api = ApiBuilder::new()
            .with_endpoint(config.endpoint.clone())
            .with_cache_dir(config.cache_dir.clone())
            .with_token(config.token.clone())
            .with_progress(false)
            // Retries are ours ([`Hub::download`]).
            .with_retries(0)
            .with_user_agent("onebit-tts", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|e| HubError::Protocol {
                repo: String::new(),
                detail: e.to_string(),
            })?;
        Ok(Self { config, api })
    }

    pub fn config(&self) -> &HubConfig {
        &self.config
    }

    fn repo(&self, repo: &str, revision: &str) -> Repo {
        Repo::with_revision(repo.to_owned(), RepoType::Model, revision.to_owned())
    }

    fn repo_dir(&self, repo: &str) -> PathBuf {
        self.config
            .cache_dir
            .join(self.repo(repo, "main").folder_name())
    }

    /// The directory a commit's files appear in (links into `blobs/`).
    pub fn snapshot_dir(&self, repo: &str, commit: &str) -> PathBuf {
        self.repo_dir(repo).join("snapshots").join(commit)
    }

    /// The repository's files at `revision`, with sizes and LFS sha256 sums. When the hub
    /// cannot be reached and the cache holds the revision, the cached snapshot's listing
    /// (marked offline).
    pub fn snapshot(&self, repo: &str, revision: &str) -> Result<Snapshot, HubError> {
        let req = self
            .api
            .repo(self.repo(repo, revision))
            .info_request()
            .query("blobs", "true");
        let resp = match req.call() {
            Ok(r) => r,
            Err(e) => {
                let err = self.request_error(repo, &format!("revision {revision}"), e);
                if matches!(err, HubError::Unreachable { .. })
                    && let Some(snap) = self.cached_snapshot(repo, revision)
                {
                    tracing::warn!("{err}; using the cached snapshot {}", snap.commit);
                    return Ok(snap);
                }
                return Err(err);
            }
        };
        let info: InfoJson = resp.into_json().map_err(|e| HubError::Protocol {
            repo: repo.to_owned(),
            detail: format!("repository info: {e}"),
        })?;
        let commit = info.sha.ok_or_else(|| HubError::Protocol {
            repo: repo.to_owned(),
            detail: "repository info without a commit (sha)".into(),
        })?;
        let protocol = |detail: String| HubError::Protocol {
            repo: repo.to_owned(),
            detail,
        };
        if !is_hex(&commit, 40) {
            return Err(protocol(format!(
                "commit {commit:?} is not a 40-digit hex id"
            )));
        }
        let mut files = Vec::new();
        for s in info.siblings {
            // The names become paths in the cache and the package: a listing must not reach
            // outside them.
            if !safe_relative(&s.rfilename) {
                return Err(protocol(format!(
                    "file name {:?} is not a plain relative path",
                    s.rfilename
                )));
            }
            let sha256 = s.lfs.as_ref().map(|l| l.sha256.to_ascii_lowercase());
            let etag = sha256
                .clone()
                .or(s.blob_id)
                .filter(|e| is_hex(e, 40) || is_hex(e, 64));
            files.push(RepoFile {
                size: s.size.or(s.lfs.as_ref().and_then(|l| l.size)),
                sha256,
                etag,
                path: s.rfilename,
            });
        }
        Ok(Snapshot {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            commit,
            files,
            offline: false,
        })
    }

    /// The snapshot `refs/REVISION` points to in the cache, listed from disk.
    fn cached_snapshot(&self, repo: &str, revision: &str) -> Option<Snapshot> {
        let commit = std::fs::read_to_string(self.repo_dir(repo).join("refs").join(revision))
            .ok()?
            .trim()
            .to_owned();
        let dir = self.snapshot_dir(repo, &commit);
        let mut files = Vec::new();
        walk(&dir, &dir, &mut files);
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Some(Snapshot {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            commit,
            files,
            offline: true,
        })
        .filter(|s| !s.files.is_empty())
    }

    /// The file in the cache, downloaded (or a `.part` resumed) when absent, and checked
    /// against the hub's size and sha256. A file that fails the check is removed.
    pub fn fetch(
        &self,
        snap: &Snapshot,
        file: &RepoFile,
        progress: &mut dyn FetchProgress,
    ) -> Result<Fetched, HubError> {
        let local = self.snapshot_dir(&snap.repo, &snap.commit).join(&file.path);
        if local.exists() {
            match verify(&snap.repo, file, &local) {
                Ok(f) => return Ok(f),
                Err(e @ HubError::Mismatch { .. }) if snap.offline => return Err(e),
                Err(HubError::Mismatch { .. }) => {
                    tracing::warn!(
                        "{}: cached copy does not match the hub; fetching it anew",
                        local.display()
                    );
                    remove_cached(&local);
                }
                Err(e) => return Err(e),
            }
        } else if std::fs::symlink_metadata(&local).is_ok() {
            // A link to a blob that is gone: hf-hub would download, then fail to link.
            let _ = std::fs::remove_file(&local);
        }
        if !local.exists() && snap.offline {
            return Err(HubError::Unreachable {
                endpoint: self.config.endpoint.clone(),
                detail: format!("and {}/{} is not in the cache", snap.repo, file.path),
            });
        }
        // The same content under another commit (a new revision that kept the weights): link
        // the blob the cache already has instead of downloading it again.
        if let Some(blob) = file
            .etag
            .as_ref()
            .map(|e| self.repo_dir(&snap.repo).join("blobs").join(e))
            && blob.is_file()
        {
            match verify(&snap.repo, file, &blob) {
                Ok(f) => {
                    self.link_snapshot(snap, &file.path, &blob)?;
                    return Ok(Fetched { path: local, ..f });
                }
                Err(HubError::Mismatch { .. }) => {
                    let _ = std::fs::remove_file(&blob);
                }
                Err(e) => return Err(e),
            }
        }
        let got = self.download(snap, file, progress)?;
        if got != local {
            return Err(HubError::Moved {
                repo: snap.repo.clone(),
                want: snap.commit.clone(),
                got: got
                    .parent()
                    .and_then(|p| {
                        p.strip_prefix(self.repo_dir(&snap.repo).join("snapshots"))
                            .ok()
                    })
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            });
        }
        let fetched = verify(&snap.repo, file, &got).inspect_err(|_| remove_cached(&got))?;
        Ok(Fetched {
            downloaded: true,
            ..fetched
        })
    }

    /// Downloads through hf-hub, one attempt at a time: each attempt reopens the blob's `.part`
    /// and asks for the bytes after it (hf-hub's own retry loop can re-request from 0 onto a
    /// resumed `.part`), so a connection that breaks off is resumed where it stopped.
    fn download(
        &self,
        snap: &Snapshot,
        file: &RepoFile,
        progress: &mut dyn FetchProgress,
    ) -> Result<PathBuf, HubError> {
        const ATTEMPTS: u32 = 3;
        // By commit, not branch: the bytes are the listing's even if the branch moves meanwhile.
        let api_repo = self.api.repo(self.repo(&snap.repo, &snap.commit));
        let part = file.etag.as_ref().map(|e| {
            self.repo_dir(&snap.repo)
                .join("blobs")
                .join(format!("{e}.part"))
        });
        let mut attempt = 0;
        loop {
            attempt += 1;
            let adapter = Adapter {
                inner: &mut *progress,
                file: file.path.clone(),
                size: 0,
                started: false,
            };
            let err = match api_repo.download_with_progress(&file.path, adapter) {
                Ok(path) => {
                    self.point_ref(snap)?;
                    return Ok(path);
                }
                Err(e) => e,
            };
            let restart = matches!(err, ApiError::InvalidResume)
                || matches!(&err, ApiError::RequestError(e)
                    if matches!(&**e, ureq::Error::Status(416, _)));
            let err = self.api_error(&snap.repo, &file.path, err);
            match (&err, &part) {
                // A `.part` that does not fit the file (longer, or already whole but never
                // renamed): its bytes cannot be trusted; start this file over.
                _ if restart && attempt < ATTEMPTS => {
                    if let Some(p) = &part {
                        let _ = std::fs::remove_file(p);
                    }
                }
                (HubError::Interrupted { .. }, _) if attempt < ATTEMPTS => {
                    tracing::warn!("{err}; resuming (attempt {} of {ATTEMPTS})", attempt + 1);
                    std::thread::sleep(std::time::Duration::from_secs(u64::from(attempt)));
                }
                _ => return Err(err),
            }
        }
    }

    /// Makes `snapshots/COMMIT/PATH` point at `blob` (relative, as the hub's tools do) and
    /// `refs/REVISION` name the commit.
    fn link_snapshot(&self, snap: &Snapshot, path: &str, blob: &Path) -> Result<(), HubError> {
        let pointer = self.snapshot_dir(&snap.repo, &snap.commit).join(path);
        let parent = pointer.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(io(parent))?;
        let depth = path.split('/').count() + 1;
        let target = PathBuf::from("../".repeat(depth))
            .join("blobs")
            .join(blob.file_name().unwrap_or_default());
        let _ = std::fs::remove_file(&pointer);
        std::os::unix::fs::symlink(&target, &pointer).map_err(io(&pointer))?;
        self.point_ref(snap)
    }

    /// `refs/REVISION` names the commit, as the hub's tools keep it (hf-hub, asked by commit,
    /// writes a ref named after the commit itself, which they never do).
    fn point_ref(&self, snap: &Snapshot) -> Result<(), HubError> {
        let refs = self.repo_dir(&snap.repo).join("refs");
        if snap.revision != snap.commit {
            let _ = std::fs::remove_file(refs.join(&snap.commit));
        }
        Cache::new(self.config.cache_dir.clone())
            .repo(self.repo(&snap.repo, &snap.revision))
            .create_ref(&snap.commit)
            .map_err(io(&refs))
    }

    fn api_error(&self, repo: &str, file: &str, e: ApiError) -> HubError {
        match e {
            // Connected, then cut off (the server or the network dropped the body).
            ApiError::RequestError(e) if matches!(&*e, ureq::Error::Transport(t) if t.kind() == ureq::ErrorKind::Io) => {
                HubError::Interrupted {
                    endpoint: self.config.endpoint.clone(),
                    repo: repo.to_owned(),
                    file: file.to_owned(),
                    detail: e.to_string(),
                }
            }
            ApiError::RequestError(e) => self.request_error(repo, file, *e),
            ApiError::TooManyRetries(inner) => self.api_error(repo, file, *inner),
            ApiError::IoError(err) if is_transport(&err) => HubError::Interrupted {
                endpoint: self.config.endpoint.clone(),
                repo: repo.to_owned(),
                file: file.to_owned(),
                detail: err.to_string(),
            },
            ApiError::IoError(err) => HubError::Io {
                path: self.repo_dir(repo),
                err,
            },
            ApiError::LockAcquisition(path) => HubError::Busy {
                repo: repo.to_owned(),
                file: file.to_owned(),
                lock: path,
            },
            other => HubError::Protocol {
                repo: repo.to_owned(),
                detail: format!("{file}: {other}"),
            },
        }
    }

    fn request_error(&self, repo: &str, what: &str, e: ureq::Error) -> HubError {
        let had_token = self.config.token.is_some();
        match e {
            ureq::Error::Status(status, resp) => {
                let code = resp.header("x-error-code").map(str::to_owned);
                let message = resp.header("x-error-message").map(str::to_owned);
                match (status, code.as_deref()) {
                    (_, Some("GatedRepo")) => HubError::Gated {
                        repo: repo.to_owned(),
                        url: format!("{}/{repo}", self.config.endpoint),
                        had_token,
                    },
                    (_, Some("RevisionNotFound")) if what.starts_with("revision ") => {
                        HubError::NoRevision {
                            repo: repo.to_owned(),
                            revision: what.trim_start_matches("revision ").to_owned(),
                        }
                    }
                    // The hub answers 401 for a private repository as for a missing one.
                    (_, Some("RepoNotFound")) | (401, _) => HubError::NotFound {
                        repo: repo.to_owned(),
                        endpoint: self.config.endpoint.clone(),
                        had_token,
                    },
                    _ => HubError::Refused {
                        repo: repo.to_owned(),
                        what: what.to_owned(),
                        status,
                        message,
                    },
                }
            }
            ureq::Error::Transport(t) => HubError::Unreachable {
                endpoint: self.config.endpoint.clone(),
                detail: t.to_string(),
            },
        }
    }
}

/// A broken connection, as opposed to a local disk error.
fn is_transport(err: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        err.kind(),
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | TimedOut
    )
}

/// Files under a cached snapshot, with what their blob names say: an LFS blob is named by its
/// sha256.
fn walk(root: &Path, dir: &Path, out: &mut Vec<RepoFile>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(root, &p, out);
            continue;
        }
        let Ok(rel) = p.strip_prefix(root) else {
            continue;
        };
        let blob = std::fs::canonicalize(&p).ok();
        let name = blob
            .as_deref()
            .and_then(Path::file_name)
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let sha256 = is_hex(name, 64).then(|| name.to_ascii_lowercase());
        out.push(RepoFile {
            path: rel.to_string_lossy().replace('\\', "/"),
            size: None,
            etag: sha256.clone(),
            sha256,
        });
    }
}

/// Checks a cached file against the size and sha256 the hub states for it.
fn verify(repo: &str, file: &RepoFile, path: &Path) -> Result<Fetched, HubError> {
    let size = std::fs::metadata(path).map_err(io(path))?.len();
    let mismatch = |what, got: String, want: String| HubError::Mismatch {
        repo: repo.to_owned(),
        file: file.path.clone(),
        what,
        got,
        want,
    };
    if let Some(want) = file.size
        && want != size
    {
        return Err(mismatch("size", size.to_string(), want.to_string()));
    }
    let sha256 = sha256_file(path)?;
    if let Some(want) = &file.sha256
        && *want != sha256
    {
        return Err(mismatch("sha256", sha256, want.clone()));
    }
    Ok(Fetched {
        path: path.to_path_buf(),
        downloaded: false,
        size,
        sha256,
    })
}

pub fn sha256_file(path: &Path) -> Result<String, HubError> {
    let mut f = std::fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Removes a snapshot entry and the blob it links to, so a bad file is never found again.
fn remove_cached(pointer: &Path) {
    if let Ok(blob) = std::fs::canonicalize(pointer)
        && blob != pointer
    {
        let _ = std::fs::remove_file(blob);
    }
    let _ = std::fs::remove_file(pointer);
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A `/`-separated path of plain names: nothing absolute, no `..` or `.`, no backslashes.
fn safe_relative(path: &str) -> bool {
    !path.is_empty()
        && !path.contains('\\')
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_relative_names_are_taken_from_a_listing() {
        for ok in [
            "model.onnx",
            "a/b.txt",
            "onnx/model.onnx_data",
            ".gitattributes",
        ] {
            assert!(safe_relative(ok), "{ok}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../b",
            "a/./b",
            "./a",
            "a//b",
            "a/",
            "a\\b",
            "..",
        ] {
            assert!(!safe_relative(bad), "{bad}");
        }
    }
}
