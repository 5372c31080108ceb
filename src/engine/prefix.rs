//! The voice-prefix cache: KV rows of the prompt beginnings that every request of a voice shares.
//!
//! In the vendor's prompt layout the instruction and the voice's transcript come before the
//! request's text (its reference codes come after the text), so those leading tokens, and by
//! causality their keys and values, are the same for every request of the voice. The scheduler
//! keeps them after a prompt is in and copies them into the next prompt's slot that begins with
//! the same tokens, which then prefills only the rest. The caller says how many leading tokens
//! are voice-only ([`crate::prompt::build_shared`]); only those are kept, so a repeated
//! request costs what any new text of the voice costs.
//!
//! Exact where the backbone's kernels compute each prompt row the same whatever the number of
//! rows in its run: then the rest, run after cached rows, gets the rows and logits a whole
//! prompt's run gives (measured bit for bit on the real-shape package, tests/prefix_cache.rs).

/// A copy of the first `len` positions of one sequence's KV cache, in the backbone's own layout
/// and element type.
#[derive(Debug, Clone)]
pub struct KvRows {
    pub len: usize,
    pub data: KvData,
}

#[derive(Debug, Clone)]
pub enum KvData {
    F32(Vec<f32>),
    F16(Vec<half::f16>),
    Bf16(Vec<half::bf16>),
}

impl KvRows {
    /// Values the rows hold.
    pub fn values(&self) -> usize {
        match &self.data {
            KvData::F32(v) => v.len(),
            KvData::F16(v) => v.len(),
            KvData::Bf16(v) => v.len(),
        }
    }

    /// Bytes the rows hold.
    pub fn size(&self) -> usize {
        let elem = match &self.data {
            KvData::F32(_) => 4,
            KvData::F16(_) | KvData::Bf16(_) => 2,
        };
        self.values() * elem
    }
}

struct Entry {
    tokens: Vec<u32>,
    rows: KvRows,
}

/// Most recently used last; bounded by the bytes its rows hold.
pub struct PrefixCache {
    entries: Vec<Entry>,
    limit: usize,
    held: usize,
}

impl PrefixCache {
    /// A cache holding at most `limit` bytes of KV rows (0: it holds nothing).
    pub fn new(limit: usize) -> Self {
        Self {
            entries: Vec::new(),
            limit,
            held: 0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// The rows of the entry sharing the longest beginning with `prefix`, cut to that beginning
    /// (at least one token), and marked as just used.
    pub fn find(&mut self, prefix: &[u32]) -> Option<(usize, &KvRows)> {
        let (i, n) = self
            .entries
            .iter()
            .enumerate()
            .map(|(i, e)| (i, common_len(&e.tokens, prefix)))
            .max_by_key(|&(_, n)| n)
            .filter(|&(_, n)| n > 0)?;
        let e = self.entries.remove(i);
        self.entries.push(e);
        self.entries.last().map(|e| (n, &e.rows))
    }

    /// Whether an entry for exactly `prefix` is held.
    pub fn holds(&self, prefix: &[u32]) -> bool {
        self.entries.iter().any(|e| e.tokens == prefix)
    }

    /// Keeps `rows` for `prefix`, dropping the least recently used entries to stay in bounds;
    /// rows larger than the whole bound are not kept.
    pub fn insert(&mut self, prefix: &[u32], rows: KvRows) {
        let size = rows.size();
        if size > self.limit || rows.len != prefix.len() {
            return;
        }
        if let Some(i) = self.entries.iter().position(|e| e.tokens == prefix) {
            let old = self.entries.remove(i);
            self.held -= old.rows.size();
        }
        while self.held + size > self.limit && !self.entries.is_empty() {
            let old = self.entries.remove(0);
            self.held -= old.rows.size();
        }
        self.held += size;
        self.entries.push(Entry {
            tokens: prefix.to_vec(),
            rows,
        });
    }

    /// Bytes of KV rows held now.
    pub fn held(&self) -> usize {
        self.held
    }
}

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(len: usize, per: usize) -> KvRows {
        KvRows {
            len,
            data: KvData::F16(vec![half::f16::ONE; len * per / 2]),
        }
    }

    #[test]
    fn finds_the_longest_shared_beginning_and_evicts_the_least_recent() {
        let mut c = PrefixCache::new(90);
        c.insert(&[1, 2, 3, 4], rows(4, 10));
        c.insert(&[1, 2, 9], rows(3, 10));
        assert_eq!(c.held(), 70);
        assert_eq!(c.find(&[1, 2, 3, 7]).map(|(n, r)| (n, r.len)), Some((3, 4)));
        assert_eq!(c.find(&[1, 2, 9, 9]).map(|(n, r)| (n, r.len)), Some((3, 3)));
        assert!(c.find(&[5]).is_none());
        // [1, 2, 9] was used last: the 4-token entry goes to make room.
        c.insert(&[7, 7, 7], rows(3, 10));
        assert!(!c.holds(&[1, 2, 3, 4]));
        assert!(c.holds(&[1, 2, 9]) && c.holds(&[7, 7, 7]));
        assert_eq!(c.held(), 60);
        // Again for the same tokens replaces, never doubles.
        c.insert(&[7, 7, 7], rows(3, 10));
        assert_eq!(c.held(), 60);
        // Larger than the whole bound, or rows that do not match the tokens: not kept.
        c.insert(&[8; 11], rows(11, 10));
        c.insert(&[8; 2], rows(3, 10));
        assert!(!c.holds(&[8; 11]) && !c.holds(&[8; 2]));
        assert!(!PrefixCache::new(0).enabled());
    }
}
