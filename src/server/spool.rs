//! The spool of a whole (not streamed) response: its bytes as they are made, in memory up to a
//! small bound and beyond it in an unlinked temporary file, then read back as the client takes
//! them.
//!
//! A whole response can only be sent once it is complete (its status and `x-onebit-*` headers
//! come from the end of the synthesis, its front is patched at the end), and a client may take
//! its time reading it. Held in memory, a few long responses to slow clients were hundreds of
//! megabytes of the server's memory; spooled, each costs [`MEMORY`] at most plus one read chunk
//! while it is sent, and the rest is disk (under `$TMPDIR`, bounded by `max_response_bytes`,
//! gone when the response is, even if the server is killed: the file has no name).

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use axum::body::Bytes;

/// Bytes a spool keeps in memory before it moves to a file: a short response (most are) never
/// touches the disk.
pub(super) const MEMORY: usize = 1 << 20;
/// Bytes read from the file at a time while the client reads: what a slow client holds of the
/// server's memory, beside the connection's own buffers.
pub(super) const READ_CHUNK: usize = 64 << 10;

enum Store {
    Memory(Vec<u8>),
    /// `None` only while a blocking task holds it.
    File(Option<File>),
}

/// One response's bytes, in order, with patches of earlier bytes.
pub(super) struct Spool {
    store: Store,
    len: u64,
    memory: usize,
    dir: PathBuf,
}

fn lost() -> std::io::Error {
    std::io::Error::other("the response spool's file was lost by a failed write")
}

/// Runs file I/O on the blocking pool: a disk that stalls must not stall the server's threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)))
}

/// A new file in `dir` that no other process can open and that is gone once closed: created
/// under a fresh name (never an existing file's), then unlinked at once.
fn unlinked_file(dir: &Path) -> std::io::Result<File> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    loop {
        let name = format!(
            ".onebit-spool-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let mut open = std::fs::OpenOptions::new();
        open.read(true).write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut open, 0o600);
        match open.open(&path) {
            Ok(file) => {
                std::fs::remove_file(&path)?;
                return Ok(file);
            }
            // Left by an earlier process with the same pid: take the next name.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
}

impl Spool {
    /// Keeps up to `memory` bytes in memory, the rest in a file in `dir`.
    pub(super) fn new(memory: usize, dir: PathBuf) -> Self {
        Self {
            store: Store::Memory(Vec::new()),
            len: 0,
            memory,
            dir,
        }
    }

    /// A spool for a response: [`MEMORY`] in memory, the rest under `$TMPDIR`.
    pub(super) fn for_response() -> Self {
        Self::new(MEMORY, std::env::temp_dir())
    }

    /// Bytes appended so far.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Whether the bytes have moved to a file.
    #[cfg(test)]
    fn on_disk(&self) -> bool {
        matches!(self.store, Store::File(_))
    }

    fn file(&mut self) -> std::io::Result<File> {
        match &mut self.store {
            Store::File(f) => f.take().ok_or_else(lost),
            Store::Memory(_) => Err(std::io::Error::other("the spool is in memory")),
        }
    }

    pub(super) async fn append(&mut self, bytes: Vec<u8>) -> std::io::Result<()> {
        let len = bytes.len() as u64;
        match &mut self.store {
            Store::Memory(held) if held.len() + bytes.len() <= self.memory => {
                held.extend_from_slice(&bytes);
            }
            Store::Memory(held) => {
                let held = std::mem::take(held);
                let dir = self.dir.clone();
                let file = blocking(move || {
                    let mut file = unlinked_file(&dir)?;
                    file.write_all(&held)?;
                    file.write_all(&bytes)?;
                    Ok(file)
                })
                .await?;
                self.store = Store::File(Some(file));
            }
            Store::File(_) => {
                let mut file = self.file()?;
                let file = blocking(move || file.write_all(&bytes).map(|()| file)).await?;
                self.store = Store::File(Some(file));
            }
        }
        self.len += len;
        Ok(())
    }

    /// Overwrites bytes already appended, from `offset`.
    pub(super) async fn patch(&mut self, offset: u64, bytes: Vec<u8>) -> std::io::Result<()> {
        let end = offset.checked_add(bytes.len() as u64);
        if end.is_none_or(|end| end > self.len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "a patch of {} bytes at offset {offset} is past the end of the {} bytes spooled",
                    bytes.len(),
                    self.len
                ),
            ));
        }
        if let Store::Memory(held) = &mut self.store {
            // In range: checked against `len`, which is `held.len()` here.
            let at = offset as usize;
            held[at..at + bytes.len()].copy_from_slice(&bytes);
            return Ok(());
        }
        let mut file = self.file()?;
        let file = blocking(move || {
            file.seek(SeekFrom::Start(offset))?;
            file.write_all(&bytes)?;
            file.seek(SeekFrom::End(0))?;
            Ok(file)
        })
        .await?;
        self.store = Store::File(Some(file));
        Ok(())
    }

    /// The body: every byte in order, read from the file a chunk at a time as the connection
    /// asks for more (hyper polls a body only when it can write). Its length is [`Spool::len`].
    pub(super) fn into_stream(
        self,
    ) -> impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static {
        use futures_util::StreamExt;
        enum Next {
            Memory(Vec<u8>),
            File(File, u64),
            Done,
        }
        let start = match self.store {
            Store::Memory(held) if held.is_empty() => Next::Done,
            Store::Memory(held) => Next::Memory(held),
            Store::File(Some(file)) => Next::File(file, self.len),
            Store::File(None) => {
                return futures_util::stream::once(async { Err(lost()) }).left_stream();
            }
        };
        futures_util::stream::unfold((start, true), |(next, first)| async move {
            match next {
                Next::Done => None,
                Next::Memory(held) => Some((Ok(Bytes::from(held)), (Next::Done, false))),
                Next::File(mut file, left) => {
                    let read = blocking(move || {
                        if first {
                            file.seek(SeekFrom::Start(0))?;
                        }
                        let mut chunk = vec![0; READ_CHUNK.min(left as usize)];
                        file.read_exact(&mut chunk)?;
                        Ok((file, chunk))
                    })
                    .await;
                    match read {
                        Ok((file, chunk)) => {
                            let left = left - chunk.len() as u64;
                            let next = if left == 0 {
                                Next::Done
                            } else {
                                Next::File(file, left)
                            };
                            Some((Ok(Bytes::from(chunk)), (next, false)))
                        }
                        // A short read or an I/O error: the body ends in an error, so the
                        // client sees a cut transfer, never a short file.
                        Err(e) => Some((Err(e), (Next::Done, false))),
                    }
                }
            }
        })
        .right_stream()
    }
}

/// The body of a whole response with `"timing": true`: `{"audio": BASE64, "content_type",
/// "timing"}`, the audio's base64 made from the spool as the client reads, so it is never held
/// whole either. Its length is known before the first byte.
pub(super) fn with_timing(
    spool: Spool,
    content_type: &str,
    timing: serde_json::Value,
) -> (
    u64,
    impl futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
) {
    use base64::Engine as _;
    use futures_util::StreamExt;
    let head = Bytes::from_static(b"{\"audio\":\"");
    let tail = Bytes::from(format!(
        "\",\"content_type\":{},\"timing\":{}}}",
        serde_json::Value::from(content_type),
        timing
    ));
    let b64_len = spool.len().div_ceil(3) * 4;
    let len = head.len() as u64 + b64_len + tail.len() as u64;
    let mut carry: Vec<u8> = Vec::new();
    let audio = spool
        .into_stream()
        .map(Some)
        .chain(futures_util::stream::once(async { None }))
        .map(move |chunk| match chunk {
            // Whole groups of 3 bytes now; the rest waits for the next chunk (or the end).
            Some(Ok(b)) => {
                carry.extend_from_slice(&b);
                let whole = carry.len() / 3 * 3;
                let out = base64::engine::general_purpose::STANDARD.encode(&carry[..whole]);
                carry.drain(..whole);
                Ok(Bytes::from(out))
            }
            Some(Err(e)) => Err(e),
            None => Ok(Bytes::from(
                base64::engine::general_purpose::STANDARD.encode(std::mem::take(&mut carry)),
            )),
        });
    let body = futures_util::stream::once(async move { Ok(head) })
        .chain(audio)
        .chain(futures_util::stream::once(async move { Ok(tail) }));
    (len, body)
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    async fn body(spool: Spool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut s = std::pin::pin!(spool.into_stream());
        while let Some(chunk) = s.next().await {
            let chunk = chunk.unwrap();
            assert!(!chunk.is_empty() && chunk.len() <= READ_CHUNK.max(MEMORY));
            out.extend_from_slice(&chunk);
        }
        out
    }

    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("onebit-spool-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[tokio::test]
    async fn small_responses_stay_in_memory_with_their_patches() {
        let dir = scratch("memory");
        let mut s = Spool::new(100, dir.clone());
        s.append(vec![1; 60]).await.unwrap();
        s.append(vec![2; 40]).await.unwrap();
        s.patch(58, vec![9, 9, 9]).await.unwrap();
        assert!(!s.on_disk());
        assert_eq!(s.len(), 100);
        let mut want = [vec![1u8; 60], vec![2; 40]].concat();
        want[58..61].copy_from_slice(&[9, 9, 9]);
        assert_eq!(body(s).await, want);
        // Nothing was written to the directory.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn large_responses_go_to_an_unlinked_file_and_are_read_back_in_chunks() {
        let dir = scratch("file");
        let mut s = Spool::new(1000, dir.clone());
        let mut want = Vec::new();
        for i in 0..200u32 {
            // Uneven pieces, some larger than a read chunk.
            let piece: Vec<u8> = (0..(i * 997 % 70_001)).map(|j| (j ^ i) as u8).collect();
            want.extend_from_slice(&piece);
            s.append(piece).await.unwrap();
        }
        assert!(s.on_disk());
        assert_eq!(s.len(), want.len() as u64);
        // The file has no name: the directory stays empty.
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        // A patch at the front (a header), one across the first chunk boundary, one at the end.
        let end = want.len() as u64;
        for (offset, bytes) in [
            (0, vec![7u8; 44]),
            (READ_CHUNK as u64 - 3, vec![8; 10]),
            (end - 5, vec![6; 5]),
        ] {
            let at = offset as usize;
            want[at..at + bytes.len()].copy_from_slice(&bytes);
            s.patch(offset, bytes).await.unwrap();
        }
        // Bytes appended after a patch go at the end, not after the patch.
        s.append(vec![5; 3]).await.unwrap();
        want.extend_from_slice(&[5; 3]);
        let got = body(s).await;
        assert_eq!(got.len(), want.len());
        assert!(got == want);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_patch_past_the_end_is_refused_in_memory_and_on_disk() {
        let dir = scratch("past");
        for memory in [1000, 10] {
            let mut s = Spool::new(memory, dir.clone());
            s.append(vec![0; 100]).await.unwrap();
            for (offset, len) in [(99, 2), (101, 0), (u64::MAX, 1)] {
                let e = s.patch(offset, vec![0; len]).await.unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
            }
            assert_eq!(body(s).await, vec![0; 100]);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn an_empty_spool_is_an_empty_body() {
        let s = Spool::new(10, std::env::temp_dir());
        assert_eq!(s.len(), 0);
        assert!(body(s).await.is_empty());
    }
}
