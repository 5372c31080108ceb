//! Speech-constrained sampling: only the 65,536 speech ids and the stop ids can ever be chosen.
//!
//! Text tokens and the logits' padding ids are never looked at, which is both the correctness rule
//! (a text token in the codes would be garbage audio) and the speed trick (65,537 candidates instead
//! of 217,652). Top-k keeps a small min-heap over one pass, so sampling costs one scan of the speech
//! block plus O(k log k).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};

use crate::package::SpeechHead;

/// User-facing sampling knobs (vendor defaults: temperature 1.0, top-k 50, sampling on).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy.
    pub temperature: f32,
    /// 0 means no top-k cut.
    pub top_k: usize,
    /// 1.0 means no nucleus cut.
    pub top_p: f32,
    /// Fixes the random stream; `None` draws one (reported back so a take can be reproduced).
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 50,
            top_p: 1.0,
            seed: None,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 1,
            top_p: 1.0,
            seed: Some(0),
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == 1
    }

    /// Checks ranges; the error names the field and the allowed range.
    pub fn validate(&self) -> Result<(), InvalidSampling> {
        let bad = |param, expected, got: String| {
            Err(InvalidSampling {
                param,
                expected,
                got,
            })
        };
        if !self.temperature.is_finite() || !(0.0..=5.0).contains(&self.temperature) {
            return bad("temperature", "in 0..=5", self.temperature.to_string());
        }
        if !(self.top_p.is_finite() && self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "in (0, 1]", self.top_p.to_string());
        }
        if self.top_k > crate::package::SPEECH_CODES as usize {
            return bad("top_k", "at most 65536", self.top_k.to_string());
        }
        Ok(())
    }
}

/// A sampling setting out of its range: `param` is the field's name (as in the HTTP API), so a
/// caller can point at it without reading the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param} must be {expected}, got {got}")]
pub struct InvalidSampling {
    pub param: &'static str,
    pub expected: &'static str,
    pub got: String,
}

/// Which ids may be chosen.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Candidates {
    /// First speech id; the block is `speech_first .. speech_first + 65536`.
    pub speech_first: u32,
    pub speech_count: u32,
    /// Ids that end generation (the end token, then the config's eos ids).
    pub stop_ids: Vec<u32>,
}

/// Where each id's logit sits in the row a backbone returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum LogitsLayout {
    /// Row index = token id (the exporter's head).
    #[default]
    Full,
    /// The compact speech-only head of an optimized package (see `onebit_logits.json`).
    Speech(SpeechHead),
}

impl LogitsLayout {
    /// The row index of token `id`.
    pub fn position(&self, id: u32) -> Option<usize> {
        match self {
            LogitsLayout::Full => Some(id as usize),
            LogitsLayout::Speech(h) => h.position(id),
        }
    }

    /// Row width for a model of `vocab_size` ids.
    pub fn width(&self, vocab_size: usize) -> usize {
        match self {
            LogitsLayout::Full => vocab_size,
            LogitsLayout::Speech(h) => h.width(),
        }
    }

    /// Where the ids `first..first + count` sit, if they are contiguous and in order.
    fn block(&self, first: u32, count: u32) -> Option<usize> {
        let at = self.position(first)?;
        let last = self.position(first + count.checked_sub(1)?)?;
        (last == at + count as usize - 1
            && match self {
                LogitsLayout::Full => true,
                LogitsLayout::Speech(h) => last < h.speech_count as usize,
            })
        .then_some(at)
    }
}

impl Candidates {
    /// The package's speech block and stop ids.
    pub fn of(pkg: &crate::package::ModelPackage) -> Self {
        Self {
            speech_first: pkg.vocab.first,
            speech_count: crate::package::SPEECH_CODES,
            stop_ids: pkg.stop_ids.clone(),
        }
    }
}

#[derive(Clone, Copy)]
struct Scored(f32, u32);

impl PartialEq for Scored {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for Scored {}
impl PartialOrd for Scored {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scored {
    /// Higher logit first; on ties the lower id wins, as argmax does.
    fn cmp(&self, o: &Self) -> Ordering {
        self.0.total_cmp(&o.0).then_with(|| o.1.cmp(&self.1))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SampleError {
    #[error("logits have {got} entries but the vocabulary needs {need}")]
    ShortLogits { got: usize, need: usize },
    #[error("every allowed logit is NaN or -inf")]
    NoFiniteLogit,
    #[error("token {id} has no logit in this model's head ({layout})")]
    NotInHead { id: u32, layout: String },
}

/// A seeded sampler for one request.
pub struct Sampler {
    params: SamplingParams,
    candidates: Candidates,
    /// Row index of the first speech id, and of each stop id (in `candidates.stop_ids` order).
    speech_at: usize,
    stop_at: Vec<usize>,
    /// Shortest row that holds every candidate.
    need: usize,
    rng: StdRng,
    seed: u64,
    heap: BinaryHeap<std::cmp::Reverse<Scored>>,
    top: Vec<Scored>,
}

fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

impl Sampler {
    /// A sampler over full-vocabulary rows (row index = token id).
    pub fn new(params: SamplingParams, candidates: Candidates) -> Self {
        Self::with_layout(params, candidates, &LogitsLayout::Full)
            .expect("every id has a row in the full layout")
    }

    /// A sampler over rows laid out as `layout` says; fails when a candidate has no row. The ids it
    /// returns, its tie-breaking and its random draws are those of the full layout.
    pub fn with_layout(
        params: SamplingParams,
        candidates: Candidates,
        layout: &LogitsLayout,
    ) -> Result<Self, SampleError> {
        let missing = |id| SampleError::NotInHead {
            id,
            layout: format!("{layout:?}"),
        };
        let speech_at = layout
            .block(candidates.speech_first, candidates.speech_count)
            .ok_or_else(|| missing(candidates.speech_first))?;
        let stop_at = candidates
            .stop_ids
            .iter()
            .map(|&id| layout.position(id).ok_or_else(|| missing(id)))
            .collect::<Result<Vec<_>, _>>()?;
        let need = stop_at
            .iter()
            .map(|&p| p + 1)
            .chain([speech_at + candidates.speech_count as usize])
            .max()
            .unwrap_or(0);
        let seed = params.seed.unwrap_or_else(fresh_seed);
        Ok(Self {
            params,
            candidates,
            speech_at,
            stop_at,
            need,
            rng: StdRng::seed_from_u64(seed),
            seed,
            heap: BinaryHeap::new(),
            top: Vec::new(),
        })
    }

    /// The seed in use (drawn when the request had none).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    fn clean(x: f32) -> f32 {
        if x.is_nan() { f32::NEG_INFINITY } else { x }
    }

    /// Chooses the next id from `logits` (one row, laid out as the sampler was built for).
    /// `allow_stop` false masks the stop ids (min-new-tokens).
    pub fn sample(&mut self, logits: &[f32], allow_stop: bool) -> Result<u32, SampleError> {
        let c = &self.candidates;
        if logits.len() < self.need {
            return Err(SampleError::ShortLogits {
                got: logits.len(),
                need: self.need,
            });
        }
        let speech = &logits[self.speech_at..self.speech_at + c.speech_count as usize];
        let stops = c.stop_ids.iter().zip(&self.stop_at).filter(|_| allow_stop);

        if self.params.is_greedy() {
            let mut best = Scored(f32::NEG_INFINITY, u32::MAX);
            for (i, &l) in speech.iter().enumerate() {
                let s = Scored(Self::clean(l), c.speech_first + i as u32);
                if s > best {
                    best = s;
                }
            }
            for (&id, &at) in stops {
                let s = Scored(Self::clean(logits[at]), id);
                if s > best {
                    best = s;
                }
            }
            if best.0 == f32::NEG_INFINITY {
                return Err(SampleError::NoFiniteLogit);
            }
            return Ok(best.1);
        }

        let k = match self.params.top_k {
            0 => speech.len() + c.stop_ids.len(),
            k => k,
        };
        self.heap.clear();
        let push = |heap: &mut BinaryHeap<std::cmp::Reverse<Scored>>, s: Scored| {
            if heap.len() < k {
                heap.push(std::cmp::Reverse(s));
            } else if let Some(mut min) = heap.peek_mut()
                && s > min.0
            {
                *min = std::cmp::Reverse(s);
            }
        };
        for (i, &l) in speech.iter().enumerate() {
            // Cheap reject before building a Scored: most logits lose to the current k-th best.
            if self.heap.len() == k
                && let Some(min) = self.heap.peek()
                && l <= min.0.0
            {
                continue;
            }
            push(
                &mut self.heap,
                Scored(Self::clean(l), c.speech_first + i as u32),
            );
        }
        for (&id, &at) in stops {
            push(&mut self.heap, Scored(Self::clean(logits[at]), id));
        }
        self.top.clear();
        self.top.extend(self.heap.drain().map(|r| r.0));
        self.top.sort_unstable_by(|a, b| b.cmp(a));
        let max = self.top.first().map(|s| s.0).unwrap_or(f32::NEG_INFINITY);
        if max == f32::NEG_INFINITY {
            return Err(SampleError::NoFiniteLogit);
        }
        let t = self.params.temperature;
        let mut weights: Vec<f32> = self.top.iter().map(|s| ((s.0 - max) / t).exp()).collect();
        let total: f32 = weights.iter().sum();
        if self.params.top_p < 1.0 {
            // Keep the smallest prefix whose probability reaches top_p (at least one).
            let mut acc = 0.0;
            let mut keep = weights.len();
            for (i, w) in weights.iter().enumerate() {
                acc += w / total;
                if acc >= self.params.top_p {
                    keep = i + 1;
                    break;
                }
            }
            weights.truncate(keep);
        }
        let total: f32 = weights.iter().sum();
        let mut r = self.rng.random::<f32>() * total;
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return Ok(self.top[i].1);
            }
            r -= w;
        }
        Ok(self.top[weights.len() - 1].1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands() -> Candidates {
        Candidates {
            speech_first: 10,
            speech_count: 100,
            stop_ids: vec![5, 2],
        }
    }

    fn logits_with(peaks: &[(usize, f32)]) -> Vec<f32> {
        let mut l = vec![0.0f32; 120];
        for &(i, v) in peaks {
            l[i] = v;
        }
        l
    }

    #[test]
    fn greedy_never_picks_text_or_padding() {
        // Text id 3 and padding id 115 dominate; the best allowed id is speech 42.
        let l = logits_with(&[(3, 100.0), (115, 90.0), (42, 5.0)]);
        let mut s = Sampler::new(SamplingParams::greedy(), cands());
        assert_eq!(s.sample(&l, true).unwrap(), 42);
    }

    #[test]
    fn stop_ids_are_masked_until_allowed() {
        let l = logits_with(&[(5, 50.0), (42, 5.0)]);
        let mut s = Sampler::new(SamplingParams::greedy(), cands());
        assert_eq!(s.sample(&l, false).unwrap(), 42);
        assert_eq!(s.sample(&l, true).unwrap(), 5);
    }

    #[test]
    fn greedy_ties_pick_the_lowest_id() {
        let l = logits_with(&[(50, 7.0), (20, 7.0)]);
        let mut s = Sampler::new(SamplingParams::greedy(), cands());
        assert_eq!(s.sample(&l, true).unwrap(), 20);
    }

    #[test]
    fn same_seed_same_draws_other_seed_other_draws() {
        let l: Vec<f32> = (0..120).map(|i| ((i * 37) % 11) as f32 * 0.1).collect();
        let draw = |seed| {
            let p = SamplingParams {
                seed: Some(seed),
                ..SamplingParams::default()
            };
            let mut s = Sampler::new(p, cands());
            (0..64)
                .map(|_| s.sample(&l, true).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        assert!(
            draw(7)
                .iter()
                .all(|&id| (10..110).contains(&id) || id == 5 || id == 2)
        );
    }

    #[test]
    fn top_k_limits_the_draws() {
        let mut l = vec![0.0f32; 120];
        for (rank, id) in [40usize, 41, 42].iter().enumerate() {
            l[*id] = 10.0 - rank as f32 * 0.1;
        }
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 3,
            top_p: 1.0,
            seed: Some(1),
        };
        let mut s = Sampler::new(p, cands());
        for _ in 0..200 {
            let id = s.sample(&l, false).unwrap();
            assert!((40..=42).contains(&id), "{id}");
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        let l = logits_with(&[(60, 20.0), (61, 0.0)]);
        let p = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            seed: Some(3),
        };
        let mut s = Sampler::new(p, cands());
        for _ in 0..100 {
            assert_eq!(s.sample(&l, false).unwrap(), 60);
        }
    }

    #[test]
    fn nan_logits_are_never_chosen_and_all_nan_is_an_error() {
        let mut l = vec![f32::NAN; 120];
        l[77] = -3.0;
        let mut s = Sampler::new(SamplingParams::greedy(), cands());
        assert_eq!(s.sample(&l, false).unwrap(), 77);
        let l = vec![f32::NAN; 120];
        assert!(matches!(
            s.sample(&l, false),
            Err(SampleError::NoFiniteLogit)
        ));
    }

    #[test]
    fn a_compact_row_gives_the_same_ids_and_draws_as_the_full_row() {
        let head = SpeechHead {
            speech_first_id: 10,
            speech_count: 100,
            extra_ids: vec![5, 2],
        };
        let layout = LogitsLayout::Speech(head.clone());
        for round in 0..4u64 {
            let full: Vec<f32> = (0..120)
                .map(|i| (((i as u64 * 37 + round * 11) % 23) as f32 * 0.3).sin() * 4.0)
                .collect();
            let compact: Vec<f32> = (0..head.width())
                .map(|p| full[head.id_at(p).unwrap() as usize])
                .collect();
            for params in [
                SamplingParams::greedy(),
                SamplingParams {
                    seed: Some(round),
                    ..SamplingParams::default()
                },
                SamplingParams {
                    top_k: 0,
                    top_p: 0.8,
                    seed: Some(round + 100),
                    ..SamplingParams::default()
                },
            ] {
                let mut a = Sampler::new(params, cands());
                let mut b = Sampler::with_layout(params, cands(), &layout).unwrap();
                for step in 0..50 {
                    let allow = step % 3 != 0;
                    assert_eq!(
                        a.sample(&full, allow).unwrap(),
                        b.sample(&compact, allow).unwrap()
                    );
                }
            }
            // The compact row is too short for the full layout's sampler, and vice versa it is
            // the right width.
            let mut a = Sampler::new(SamplingParams::greedy(), cands());
            assert!(matches!(
                a.sample(&compact, true),
                Err(SampleError::ShortLogits { .. })
            ));
        }
    }

    #[test]
    fn a_layout_without_a_candidate_is_refused() {
        let layout = LogitsLayout::Speech(SpeechHead {
            speech_first_id: 10,
            speech_count: 100,
            extra_ids: vec![5],
        });
        assert!(matches!(
            Sampler::with_layout(SamplingParams::greedy(), cands(), &layout),
            Err(SampleError::NotInHead { id: 2, .. })
        ));
        let shifted = LogitsLayout::Speech(SpeechHead {
            speech_first_id: 11,
            speech_count: 100,
            extra_ids: vec![5, 2],
        });
        assert!(matches!(
            Sampler::with_layout(SamplingParams::greedy(), cands(), &shifted),
            Err(SampleError::NotInHead { id: 10, .. })
        ));
    }

    #[test]
    fn short_logits_are_an_error() {
        let mut s = Sampler::new(SamplingParams::greedy(), cands());
        assert!(matches!(
            s.sample(&[0.0; 50], true),
            Err(SampleError::ShortLogits { got: 50, need: 110 })
        ));
    }
}
