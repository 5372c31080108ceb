//! NeuCodec decoding of generated speech codes, streamed and whole.
//!
//! The streaming path is a port of the vendor's `_infer_stream_ggml` (neutts 1.4.1): decode a
//! window of codes with left context and a little lookahead, keep 27 frames of it, and join the
//! kept pieces with the triangular overlap-add of `_linear_overlap_add`. Every sample emitted while
//! codes are still arriving matches the vendor sample for sample.
//!
//! Where the vendor's tail differs from what we emit (see [`TailMode`]):
//! - the vendor's final piece starts one frame *before* the decoded point but is laid down at the
//!   decoded point, so its last stretch of audio is one frame (20 ms) late and the stream ends one
//!   frame long: it emits `480 * (generated + 1)` samples in all;
//! - with no reference codes and fewer than 30 generated codes its negative slice start
//!   (`recon[-480:]`) keeps only the last frame, so it emits 480 samples whatever the length;
//! - with reference codes and fewer than 30 generated codes its first emitted frame is the audio of
//!   the last *reference* code.
//!
//! We always emit exactly [`SAMPLES_PER_CODE`] samples per generated code. [`TailMode::Aligned`]
//! (the default) decodes the tail from the decoded point, so nothing is late and no reference audio
//! leaks; [`TailMode::Vendor`] keeps the vendor's one-frame-early tail and truncates it to the exact
//! length, reproducing the vendor's samples wherever the vendor emits them (except the no-reference
//! short case above, where it clamps the slice start at 0 instead of keeping only the last frame).
//!
//! The non-streaming path mirrors the vendor's `infer` + `_decode`: the decoder is given the
//! generated codes only, with no reference context ([`decode_whole`]). [`decode_whole_with_reference`]
//! is the variant that decodes reference and generated codes together and drops the reference audio,
//! so the decoder has the voice as left context at the start (as the streamed first chunk has) at the
//! cost of a longer decode.
//!
//! The vendor also runs an optional Perth watermarker over every decoded window when the
//! `resemble-perth` package is installed; nothing here watermarks.

use std::fmt;

/// NeuCodec hop: samples of 24 kHz audio per code (50 codes per second).
pub const SAMPLES_PER_CODE: usize = 480;
/// Codes emitted per streamed chunk.
pub const FRAMES_PER_CHUNK: usize = 25;
/// Codes past a chunk that must exist before the chunk is decoded.
pub const LOOKFORWARD: usize = 5;
/// Codes of left context decoded with each chunk (plus [`OVERLAP`]).
pub const LOOKBACK: usize = 50;
/// Frames of overlap on each side of a chunk.
pub const OVERLAP: usize = 1;
/// Samples between the starts of consecutive chunks.
pub const STRIDE_SAMPLES: usize = FRAMES_PER_CHUNK * SAMPLES_PER_CODE;
/// Codes past the decoded point needed before a chunk is decoded.
pub const CODES_PER_DECODE: usize = FRAMES_PER_CHUNK + LOOKFORWARD;

/// The window layout of the streaming decoder: how many codes of left context each decode sees,
/// how many codes the first chunk emits (the vendor's [`FRAMES_PER_CHUNK`], out after
/// [`CODES_PER_DECODE`]) and how many each later chunk emits. The first chunk's look-back is the
/// layout's, so with reference codes its samples are the vendor's only at the vendor's look-back
/// and size, and a longer look-back makes its decode (not its start) longer. A shorter first chunk
/// is out after `first + LOOKFORWARD` codes: earlier first audio, for a listener who then has
/// less audio in hand while the next chunk is made.
///
/// NeuCodec's decoder runs a bidirectional transformer over the whole window, so every frame's
/// samples depend on every code in it: only the vendor's layout gives the vendor's samples, and no
/// per-frame state can be carried from one window to the next exactly. Fewer look-back codes or
/// longer chunks decode fewer frames per code (`(lookback + chunk + 6) / chunk`: 3.24 for the
/// vendor's) at the cost of samples that differ from the vendor's; docs/performance.md gives the
/// measured difference and cost of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "RawWindows")]
pub struct Windows {
    /// Codes of left context before the overlap frame.
    pub lookback: usize,
    /// Codes emitted by every chunk after the first.
    pub chunk: usize,
    /// Codes emitted by the first chunk. Written only when not the vendor's, so a layout that
    /// keeps it is written as versions before it wrote it.
    #[serde(skip_serializing_if = "is_vendor_first")]
    pub first: usize,
}

impl Windows {
    /// The vendor's layout: 50 codes of look-back, 25-code chunks.
    pub const VENDOR: Self = Self {
        lookback: LOOKBACK,
        chunk: FRAMES_PER_CHUNK,
        first: FRAMES_PER_CHUNK,
    };
    /// The most look-back a layout may ask for (twice the vendor's).
    pub const MAX_LOOKBACK: usize = 2 * LOOKBACK;
    /// The longest chunk a layout may ask for: 4 s of audio.
    pub const MAX_CHUNK: usize = 200;

    /// A layout whose first chunk has the vendor's size, refused outside `0..=MAX_LOOKBACK`
    /// look-back and `1..=MAX_CHUNK` codes a chunk.
    pub fn new(lookback: usize, chunk: usize) -> Result<Self, String> {
        Self::with_first(lookback, chunk, FRAMES_PER_CHUNK)
    }

    /// A layout with a first chunk of `first` codes (`1..=MAX_CHUNK`).
    pub fn with_first(lookback: usize, chunk: usize, first: usize) -> Result<Self, String> {
        if lookback > Self::MAX_LOOKBACK {
            return Err(format!(
                "look-back {lookback} is more than {} codes",
                Self::MAX_LOOKBACK
            ));
        }
        if !(1..=Self::MAX_CHUNK).contains(&chunk) {
            return Err(format!(
                "chunk {chunk} is outside 1..={} codes",
                Self::MAX_CHUNK
            ));
        }
        if !(1..=Self::MAX_CHUNK).contains(&first) {
            return Err(format!(
                "first chunk {first} is outside 1..={} codes",
                Self::MAX_CHUNK
            ));
        }
        Ok(Self {
            lookback,
            chunk,
            first,
        })
    }

    pub fn is_vendor(&self) -> bool {
        *self == Self::VENDOR
    }
}

/// A layout as a document holds it, checked by [`Windows::with_first`] before use.
#[derive(serde::Deserialize)]
struct RawWindows {
    lookback: usize,
    chunk: usize,
    /// Absent in documents written before the first chunk could change: the vendor's size.
    #[serde(default = "vendor_first")]
    first: usize,
}

fn vendor_first() -> usize {
    FRAMES_PER_CHUNK
}

fn is_vendor_first(first: &usize) -> bool {
    *first == FRAMES_PER_CHUNK
}

impl TryFrom<RawWindows> for Windows {
    type Error = String;
    fn try_from(r: RawWindows) -> Result<Self, String> {
        Self::with_first(r.lookback, r.chunk, r.first)
    }
}

impl Default for Windows {
    fn default() -> Self {
        Self::VENDOR
    }
}

impl fmt::Display for Windows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_vendor() {
            f.write_str("vendor")
        } else if self.first == FRAMES_PER_CHUNK {
            write!(f, "{}:{}", self.lookback, self.chunk)
        } else {
            write!(f, "{}:{}:{}", self.lookback, self.chunk, self.first)
        }
    }
}

impl std::str::FromStr for Windows {
    type Err = String;
    /// `vendor`, or `LOOKBACK:CHUNK[:FIRST]` in codes (`vendor` is `50:25:25`).
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "vendor" {
            return Ok(Self::VENDOR);
        }
        let parts: Option<Vec<usize>> = s.split(':').map(|p| p.trim().parse().ok()).collect();
        match parts.as_deref() {
            Some(&[l, c]) => Self::new(l, c),
            Some(&[l, c, f]) => Self::with_first(l, c, f),
            _ => Err(format!(
                "stream windows {s:?}: expected `vendor` or LOOKBACK:CHUNK[:FIRST] in codes (e.g. 25:25 or 25:25:10)"
            )),
        }
    }
}

/// How the last, shorter piece of a stream is placed. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TailMode {
    /// Decode the tail from the decoded point: time-aligned, exactly 480 samples per code.
    #[default]
    Aligned,
    /// The vendor's tail (starts one frame early), truncated to 480 samples per code.
    Vendor,
}

/// Errors of the streaming and whole decoders.
#[derive(Debug, thiserror::Error)]
pub enum StreamError<E> {
    /// The codec decoder itself failed.
    #[error("codec decoder failed")]
    Decode(#[source] E),
    /// The codec decoder returned a length other than `codes * 480`; a mismatch would shift every
    /// later chunk, so it is refused rather than padded.
    #[error("codec decoder returned {got} samples for {codes} codes, expected {expected}")]
    WrongLength {
        codes: usize,
        expected: usize,
        got: usize,
    },
}

/// Overlap-add weight of sample `i` of a piece of `n` samples, computed exactly as numpy does in
/// the vendor's `_linear_overlap_add` (float32 `linspace(0, 1, n + 2)[1:-1]`, then
/// `0.5 - |t - 0.5|` in float32), so overlapped samples match the vendor bit for bit.
fn ola_weight(i: usize, n: usize) -> f32 {
    let step = 1.0f64 / (n + 1) as f64;
    let t = ((i + 1) as f64 * step) as f32;
    0.5f32 - (t - 0.5f32).abs()
}

fn call_decoder<F, E>(decode: &mut F, codes: &[i32]) -> Result<Vec<f32>, StreamError<E>>
where
    F: FnMut(&[i32]) -> Result<Vec<f32>, E>,
{
    let audio = decode(codes).map_err(StreamError::Decode)?;
    let expected = codes.len() * SAMPLES_PER_CODE;
    if audio.len() != expected {
        return Err(StreamError::WrongLength {
            codes: codes.len(),
            expected,
            got: audio.len(),
        });
    }
    Ok(audio)
}

/// The part of the previous chunk that overlaps the next one, with its overlap-add weights.
struct PendingTail {
    samples: Vec<f32>,
    weights: Vec<f32>,
}

/// Blends `piece` (with its overlap-add `weights`) onto the pending tail and returns the first
/// `out_len` samples of the result, with numpy's float32 operation order so the samples match the
/// vendor's bit for bit.
fn overlap_add(
    tail: Option<&PendingTail>,
    piece: &[f32],
    weights: &[f32],
    out_len: usize,
) -> Vec<f32> {
    let mut out = Vec::with_capacity(out_len);
    let overlap = tail.map_or(0, |t| t.samples.len().min(out_len));
    if let Some(t) = tail {
        for i in 0..overlap {
            let (acc, wsum) = match (piece.get(i), weights.get(i)) {
                (Some(&x), Some(&w)) => (t.weights[i] * t.samples[i] + w * x, t.weights[i] + w),
                _ => (t.weights[i] * t.samples[i], t.weights[i]),
            };
            out.push(acc / wsum);
        }
    }
    let end = out_len.min(piece.len()).min(weights.len());
    if overlap < end {
        // Only this piece covers these samples: numpy computes (w*x)/w, which can differ from x by
        // an ulp; keep its arithmetic rather than its intent.
        out.extend(
            piece[overlap..end]
                .iter()
                .zip(&weights[overlap..end])
                .map(|(&x, &w)| (w * x) / w),
        );
    }
    // A piece shorter than asked for can only come from a malformed call; pad so the caller's
    // sample count stays exact.
    out.resize(out_len, 0.0);
    out
}

/// Streaming NeuCodec decoder: feed generated codes one at a time, get audio in 25-code chunks.
///
/// `decode` turns a run of codes into `codes.len() * 480` samples (the ONNX decoder later). The
/// reference codes given at construction are left context only and are never emitted.
pub struct StreamDecoder<F, E>
where
    F: FnMut(&[i32]) -> Result<Vec<f32>, E>,
{
    decode: F,
    /// Codes from absolute index `base` on (reference first, then generated). Older codes are
    /// dropped once they fall out of every future lookback window.
    codes: Vec<i32>,
    base: usize,
    total_codes: usize,
    reference_len: usize,
    /// Absolute index of the first code not yet emitted as audio.
    decoded: usize,
    emitted_samples: usize,
    tail: Option<PendingTail>,
    tail_mode: TailMode,
    windows: Windows,
    /// Chunks emitted so far.
    chunks: usize,
    /// Weights of a full kept piece of the first chunk's size and of the later chunks' size.
    first_weights: Vec<f32>,
    later_weights: Vec<f32>,
}

impl<F, E> fmt::Debug for StreamDecoder<F, E>
where
    F: FnMut(&[i32]) -> Result<Vec<f32>, E>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamDecoder")
            .field("reference_len", &self.reference_len)
            .field("total_codes", &self.total_codes)
            .field("decoded", &self.decoded)
            .field("emitted_samples", &self.emitted_samples)
            .field("tail_mode", &self.tail_mode)
            .field("windows", &self.windows)
            .finish()
    }
}

impl<F, E> StreamDecoder<F, E>
where
    F: FnMut(&[i32]) -> Result<Vec<f32>, E>,
{
    /// A decoder with the default [`TailMode::Aligned`].
    pub fn new(decode: F, reference: &[i32]) -> Self {
        Self::with_tail_mode(decode, reference, TailMode::default())
    }

    pub fn with_tail_mode(decode: F, reference: &[i32], tail_mode: TailMode) -> Self {
        Self::with_layout(decode, reference, tail_mode, Windows::VENDOR)
    }

    /// A decoder with the given tail and window layout.
    pub fn with_layout(
        decode: F,
        reference: &[i32],
        tail_mode: TailMode,
        windows: Windows,
    ) -> Self {
        let kept_weights = |chunk: usize| {
            let n = (chunk + 2 * OVERLAP) * SAMPLES_PER_CODE;
            (0..n).map(|i| ola_weight(i, n)).collect::<Vec<f32>>()
        };
        let mut s = Self {
            decode,
            codes: reference.to_vec(),
            base: 0,
            total_codes: reference.len(),
            reference_len: reference.len(),
            decoded: reference.len(),
            emitted_samples: 0,
            tail: None,
            tail_mode,
            windows,
            chunks: 0,
            first_weights: kept_weights(windows.first),
            later_weights: kept_weights(windows.chunk),
        };
        s.drop_old_codes();
        s
    }

    /// Number of reference codes given at construction.
    pub fn reference_len(&self) -> usize {
        self.reference_len
    }

    /// Number of generated codes pushed so far.
    pub fn generated_len(&self) -> usize {
        self.total_codes - self.reference_len
    }

    /// Samples returned so far by [`push`](Self::push).
    pub fn emitted_samples(&self) -> usize {
        self.emitted_samples
    }

    /// Start of the lookback window for a decode at the current decoded point.
    fn window_start(&self) -> usize {
        self.decoded.saturating_sub(self.windows.lookback + OVERLAP)
    }

    /// Codes the next chunk emits.
    fn next_chunk(&self) -> usize {
        if self.chunks == 0 {
            self.windows.first
        } else {
            self.windows.chunk
        }
    }

    fn drop_old_codes(&mut self) {
        // Every later decode (chunk or tail, either tail mode) starts at or after this point.
        let keep_from = self.window_start();
        if keep_from > self.base {
            self.codes.drain(..keep_from - self.base);
            self.base = keep_from;
        }
    }

    /// Adds one generated code. Returns a chunk of exactly `480 * chunk` samples when the chunk's
    /// codes and [`LOOKFORWARD`] more exist past the decoded point, else `None` (the vendor's first
    /// chunk: [`STRIDE_SAMPLES`] samples after 30 codes).
    pub fn push(&mut self, code: i32) -> Result<Option<Vec<f32>>, StreamError<E>> {
        self.codes.push(code);
        self.total_codes += 1;
        let chunk = self.next_chunk();
        if self.total_codes - self.decoded < chunk + LOOKFORWARD {
            return Ok(None);
        }
        let start = self.window_start();
        // The vendor asks for one overlap frame past the lookforward; it never exists at this
        // point because the check runs after every code, and Python's slice clamps it away.
        let end = (self.decoded + chunk + LOOKFORWARD + OVERLAP).min(self.total_codes);
        let audio = call_decoder(
            &mut self.decode,
            &self.codes[start - self.base..end - self.base],
        )?;
        let from = (self.decoded - start) * SAMPLES_PER_CODE;
        let stride = chunk * SAMPLES_PER_CODE;
        let weights = if self.chunks == 0 {
            &self.first_weights
        } else {
            &self.later_weights
        };
        let piece = &audio[from..from + weights.len()];

        let out = overlap_add(self.tail.as_ref(), piece, weights, stride);
        self.tail = Some(PendingTail {
            samples: piece[stride..].to_vec(),
            weights: weights[stride..].to_vec(),
        });
        self.chunks += 1;
        self.decoded += chunk;
        self.emitted_samples += out.len();
        self.drop_old_codes();
        Ok(Some(out))
    }

    /// Decodes the codes not yet emitted and returns the rest of the audio, so that the stream as
    /// a whole holds exactly `480 * generated_len()` samples.
    pub fn finish(mut self) -> Result<Vec<f32>, StreamError<E>> {
        let remaining = self.total_codes - self.decoded;
        let out_len = remaining * SAMPLES_PER_CODE;
        if remaining == 0 {
            return Ok(Vec::new());
        }
        let start = self.window_start();
        let audio = call_decoder(&mut self.decode, &self.codes[start - self.base..])?;
        let first_frame = match self.tail_mode {
            TailMode::Aligned => self.decoded - start,
            // The vendor starts the tail one frame early; at decoded == 0 its index goes negative
            // (a Python wrap-around), which we clamp instead.
            TailMode::Vendor => (self.decoded - start).saturating_sub(OVERLAP),
        };
        let piece = &audio[first_frame * SAMPLES_PER_CODE..];
        let weights: Vec<f32> = (0..piece.len())
            .map(|i| ola_weight(i, piece.len()))
            .collect();
        let out = overlap_add(self.tail.as_ref(), piece, &weights, out_len);
        self.emitted_samples += out.len();
        Ok(out)
    }
}

/// The vendor's non-streaming decode: the generated codes alone, in one decoder call, exactly
/// `480 * generated.len()` samples. No codes gives no audio (the vendor raises instead).
pub fn decode_whole<F, E>(mut decode: F, generated: &[i32]) -> Result<Vec<f32>, StreamError<E>>
where
    F: FnMut(&[i32]) -> Result<Vec<f32>, E>,
{
    if generated.is_empty() {
        return Ok(Vec::new());
    }
    call_decoder(&mut decode, generated)
}

/// One decode of reference + generated codes with the reference audio dropped: the generated
/// speech starts with the voice's context, like the streamed path's first chunk.
pub fn decode_whole_with_reference<F, E>(
    mut decode: F,
    reference: &[i32],
    generated: &[i32],
) -> Result<Vec<f32>, StreamError<E>>
where
    F: FnMut(&[i32]) -> Result<Vec<f32>, E>,
{
    if generated.is_empty() {
        return Ok(Vec::new());
    }
    let mut codes = Vec::with_capacity(reference.len() + generated.len());
    codes.extend_from_slice(reference);
    codes.extend_from_slice(generated);
    let mut audio = call_decoder(&mut decode, &codes)?;
    audio.drain(..reference.len() * SAMPLES_PER_CODE);
    Ok(audio)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;

    fn ramp_decoder(codes: &[i32]) -> Result<Vec<f32>, Infallible> {
        Ok(codes
            .iter()
            .flat_map(|&c| std::iter::repeat_n(c as f32, SAMPLES_PER_CODE))
            .collect())
    }

    fn run(reference: &[i32], generated: &[i32], mode: TailMode) -> (Vec<usize>, Vec<f32>) {
        let mut d = StreamDecoder::with_tail_mode(ramp_decoder, reference, mode);
        let mut lens = Vec::new();
        let mut all = Vec::new();
        for &c in generated {
            if let Some(chunk) = d.push(c).unwrap() {
                lens.push(chunk.len());
                all.extend(chunk);
            }
        }
        let tail = d.finish().unwrap();
        lens.push(tail.len());
        all.extend(tail);
        (lens, all)
    }

    #[test]
    fn emits_exactly_480_per_code() {
        for n_ref in [0usize, 3, 60] {
            for n in [0usize, 1, 29, 30, 31, 54, 55, 56, 200] {
                let reference: Vec<i32> = (0..n_ref as i32).map(|i| -i).collect();
                let generated: Vec<i32> = (0..n as i32).collect();
                for mode in [TailMode::Aligned, TailMode::Vendor] {
                    let (_, all) = run(&reference, &generated, mode);
                    assert_eq!(all.len(), n * SAMPLES_PER_CODE, "ref {n_ref} gen {n}");
                }
            }
        }
    }

    #[test]
    fn first_chunk_after_thirty_codes() {
        let mut d = StreamDecoder::new(ramp_decoder, &[7; 10]);
        for i in 0..29 {
            assert!(d.push(i).unwrap().is_none());
        }
        let chunk = d.push(29).unwrap().expect("chunk at 30 codes");
        assert_eq!(chunk.len(), STRIDE_SAMPLES);
        // A constant-per-frame decoder reproduces the codes: frame i holds value i.
        for (f, frame) in chunk.chunks(SAMPLES_PER_CODE).enumerate() {
            assert!(frame.iter().all(|&x| (x - f as f32).abs() < 1e-5));
        }
    }

    #[test]
    fn aligned_tail_is_time_aligned() {
        let generated: Vec<i32> = (0..67).collect();
        let (_, all) = run(&[5; 4], &generated, TailMode::Aligned);
        for (f, frame) in all.chunks(SAMPLES_PER_CODE).enumerate() {
            // Inside the overlap both pieces hold the same per-frame value, so blends are exact.
            assert!(
                frame.iter().all(|&x| (x - f as f32).abs() < 1e-4),
                "frame {f}"
            );
        }
    }

    /// Every window a layout decodes (start, end) over `n` generated codes after `n_ref` reference
    /// codes, and the lengths of what it emitted.
    fn layout_run(n_ref: usize, n: usize, windows: Windows) -> (Vec<(i32, i32)>, Vec<usize>) {
        let mut calls = Vec::new();
        let spy = |c: &[i32]| -> Result<Vec<f32>, Infallible> {
            calls.push((c[0], c[c.len() - 1]));
            ramp_decoder(c)
        };
        let reference: Vec<i32> = (0..n_ref as i32).collect();
        let mut d = StreamDecoder::with_layout(spy, &reference, TailMode::Aligned, windows);
        let mut lens = Vec::new();
        for c in n_ref..n_ref + n {
            if let Some(chunk) = d.push(c as i32).unwrap() {
                lens.push(chunk.len());
            }
        }
        lens.push(d.finish().unwrap().len());
        (calls, lens)
    }

    #[test]
    fn a_layout_keeps_the_first_chunk_and_changes_the_later_ones() {
        // Codes are their own absolute index, so a window is named by its first and last code.
        let (calls, lens) = layout_run(60, 140, Windows::VENDOR);
        assert_eq!(
            calls,
            [
                (9, 89),
                (34, 114),
                (59, 139),
                (84, 164),
                (109, 189),
                (134, 199)
            ]
        );
        assert_eq!(lens, [12_000, 12_000, 12_000, 12_000, 12_000, 7_200]);

        let wide = "50:50".parse::<Windows>().unwrap();
        let (calls, lens) = layout_run(60, 140, wide);
        // The first chunk as the vendor's (out after 30 codes), then 50 codes from 55 on.
        assert_eq!(calls, [(9, 89), (34, 139), (84, 189), (134, 199)]);
        assert_eq!(lens, [12_000, 24_000, 24_000, 7_200]);

        let short = "25:25".parse::<Windows>().unwrap();
        let (calls, lens) = layout_run(60, 140, short);
        assert_eq!(
            calls,
            [
                (34, 89),
                (59, 114),
                (84, 139),
                (109, 164),
                (134, 189),
                (159, 199)
            ]
        );
        assert_eq!(lens, [12_000, 12_000, 12_000, 12_000, 12_000, 7_200]);
        // Frames decoded: 81 a window for the vendor's, 56 for 25 of look-back.
        let frames = |c: &[(i32, i32)]| c.iter().map(|(a, b)| b - a + 1).sum::<i32>();
        assert_eq!(frames(&layout_run(60, 140, Windows::VENDOR).0), 81 * 5 + 66);
        assert_eq!(frames(&calls), 56 * 5 + 41);
    }

    #[test]
    fn a_shorter_first_chunk_is_out_sooner() {
        let early = "25:25:10".parse::<Windows>().unwrap();
        let (calls, lens) = layout_run(60, 140, early);
        // Out after 15 codes (10 + 5 of look-ahead) instead of 30, then 25-code chunks.
        assert_eq!(
            calls,
            [
                (34, 74),
                (44, 99),
                (69, 124),
                (94, 149),
                (119, 174),
                (144, 199),
                (169, 199)
            ]
        );
        assert_eq!(lens, [4_800, 12_000, 12_000, 12_000, 12_000, 12_000, 2_400]);
        // Fewer codes than a first chunk and its look-ahead: nothing streams, the tail has all.
        let (calls, lens) = layout_run(60, 14, early);
        assert_eq!(calls, [(34, 73)]);
        assert_eq!(lens, [14 * SAMPLES_PER_CODE]);
    }

    #[test]
    fn every_layout_emits_480_per_code_in_time() {
        for text in [
            "vendor", "0:1", "0:25", "10:50", "25:25", "50:50", "100:200", "25:25:10", "50:25:1",
            "25:50:5", "0:25:200",
        ] {
            let windows: Windows = text.parse().unwrap();
            for n_ref in [0usize, 3, 120] {
                for n in [0usize, 1, 29, 30, 31, 54, 55, 56, 79, 80, 81, 400] {
                    let reference: Vec<i32> = vec![-1; n_ref];
                    let generated: Vec<i32> = (0..n as i32).collect();
                    let mut d = StreamDecoder::with_layout(
                        ramp_decoder,
                        &reference,
                        TailMode::Aligned,
                        windows,
                    );
                    let mut all = Vec::new();
                    for &c in &generated {
                        all.extend(d.push(c).unwrap().unwrap_or_default());
                    }
                    all.extend(d.finish().unwrap());
                    assert_eq!(
                        all.len(),
                        n * SAMPLES_PER_CODE,
                        "{text} ref {n_ref} gen {n}"
                    );
                    // A constant-per-frame decoder: any misplaced window shows as a wrong value.
                    for (f, frame) in all.chunks(SAMPLES_PER_CODE).enumerate() {
                        assert!(
                            frame.iter().all(|&x| (x - f as f32).abs() < 1e-3),
                            "{text} ref {n_ref} gen {n} frame {f}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn layouts_parse_and_refuse() {
        assert_eq!("vendor".parse::<Windows>(), Ok(Windows::VENDOR));
        assert_eq!("50:25".parse::<Windows>(), Ok(Windows::VENDOR));
        assert_eq!(Windows::VENDOR.to_string(), "vendor");
        assert_eq!(
            "25:50".parse::<Windows>(),
            Ok(Windows {
                lookback: 25,
                chunk: 50,
                first: 25
            })
        );
        assert_eq!("25:50".parse::<Windows>().unwrap().to_string(), "25:50");
        assert_eq!("25:50:25".parse::<Windows>().unwrap().to_string(), "25:50");
        assert_eq!("50:25:25".parse::<Windows>(), Ok(Windows::VENDOR));
        assert_eq!(
            "25:25:10".parse::<Windows>(),
            Ok(Windows {
                lookback: 25,
                chunk: 25,
                first: 10
            })
        );
        assert_eq!(
            "25:25:10".parse::<Windows>().unwrap().to_string(),
            "25:25:10"
        );
        for bad in [
            "",
            "fast",
            "25",
            "25:",
            ":25",
            "25:0",
            "101:25",
            "25:201",
            "-1:25",
            "25:25:0",
            "25:25:201",
            "25:25:10:1",
            "25:25:",
        ] {
            let err = bad.parse::<Windows>().unwrap_err();
            assert!(!err.is_empty(), "{bad:?}");
        }
    }

    #[test]
    fn wrong_decoder_length_is_an_error() {
        let short = |c: &[i32]| -> Result<Vec<f32>, Infallible> { Ok(vec![0.0; c.len()]) };
        let mut d = StreamDecoder::new(short, &[]);
        let mut err = None;
        for i in 0..30 {
            if let Err(e) = d.push(i) {
                err = Some(e);
            }
        }
        assert!(matches!(err, Some(StreamError::WrongLength { .. })));
        assert!(matches!(
            decode_whole(short, &[1, 2]),
            Err(StreamError::WrongLength { .. })
        ));
    }

    #[test]
    fn whole_decodes() {
        let out = decode_whole(ramp_decoder, &[1, 2, 3]).unwrap();
        assert_eq!(out.len(), 3 * SAMPLES_PER_CODE);
        let out = decode_whole_with_reference(ramp_decoder, &[9, 9], &[1, 2, 3]).unwrap();
        assert_eq!(out.len(), 3 * SAMPLES_PER_CODE);
        assert_eq!(out[0], 1.0);
        assert!(decode_whole(ramp_decoder, &[]).unwrap().is_empty());
    }
}
