//! ggml's tensor types as a GGUF stores them, and what `models convert` makes of them: the
//! blocks of 4-bit and 8-bit quantised weights that ONNX Runtime's MatMulNBits and
//! GatherBlockQuantized read (bits 4 or 8, blocks of 32 along the input dimension, one float
//! scale per block), repacked without loss where the ggml type is one of them already (Q4_0,
//! Q8_0), and otherwise dequantised exactly as ggml-quants.c does and quantised again.
//!
//! Layouts (ggml-common.h): a row of `K` weights is `K / block` blocks stored one after another.
//! Q4_0 keeps element `j` in the low nibble of byte `j` and element `j + 16` in its high nibble;
//! MatMulNBits keeps elements `2i` and `2i + 1` in the low and high nibble of byte `i`. Both
//! mean `(q - 8) * d` for 4 bits; ggml's 8-bit `q` is signed, MatMulNBits' unsigned around 128.

use half::{bf16, f16};

/// Weights per block of the ONNX side (MatMulNBits' `block_size`, GatherBlockQuantized's): the
/// block of Q4_0 and Q8_0, so those two convert block for block.
pub const BLOCK: usize = 32;
/// ggml's K-quant super-block.
const QK_K: usize = 256;

/// The ggml types a NeuTTS GGUF holds (the vendor's Q4_0/Q8_0 builds, llama.cpp's converter's
/// float outputs, and the K-quant mixes llama.cpp's quantizer makes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    Bf16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4K,
    Q5K,
    Q6K,
}

impl GgmlType {
    /// ggml.h's `enum ggml_type` value; `None` for a type this converter does not read.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            6 => Self::Q5_0,
            7 => Self::Q5_1,
            8 => Self::Q8_0,
            12 => Self::Q4K,
            13 => Self::Q5K,
            14 => Self::Q6K,
            30 => Self::Bf16,
            _ => return None,
        })
    }

    /// ggml's name of a type id, for messages about types this converter does not read too.
    pub fn name_of(id: u32) -> String {
        match Self::from_id(id) {
            Some(t) => t.name().to_owned(),
            None => match id {
                10 => "Q2_K".into(),
                11 => "Q3_K".into(),
                15 => "Q8_K".into(),
                16..=23 | 29 => "an IQ type".into(),
                34 | 35 => "a ternary type (TQ1_0/TQ2_0)".into(),
                39 => "MXFP4".into(),
                _ => format!("ggml type {id}"),
            },
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::Bf16 => "BF16",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q4K => "Q4_K",
            Self::Q5K => "Q5_K",
            Self::Q6K => "Q6_K",
        }
    }

    /// (bytes, weights) of one block.
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (4, 1),
            Self::F16 | Self::Bf16 => (2, 1),
            Self::Q4_0 => (18, 32),
            Self::Q4_1 => (20, 32),
            Self::Q5_0 => (22, 32),
            Self::Q5_1 => (24, 32),
            Self::Q8_0 => (34, 32),
            Self::Q4K => (144, QK_K),
            Self::Q5K => (176, QK_K),
            Self::Q6K => (210, QK_K),
        }
    }

    /// Bytes of a row of `k` weights (`k` a multiple of the block).
    pub fn row_bytes(self, k: usize) -> usize {
        let (bytes, weights) = self.block();
        k / weights * bytes
    }

    pub fn is_float(self) -> bool {
        matches!(self, Self::F32 | Self::F16 | Self::Bf16)
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Dequantises one row (`src` is `row_bytes(out.len())` bytes) into `out`, as ggml-quants.c's
/// `dequantize_row_*` (and ggml's fp16/bf16 conversions) compute it, float for float.
pub fn dequantize_row(ty: GgmlType, src: &[u8], out: &mut [f32]) {
    let (bytes, weights) = ty.block();
    debug_assert_eq!(src.len(), out.len() / weights * bytes);
    for (b, y) in src.chunks_exact(bytes).zip(out.chunks_exact_mut(weights)) {
        match ty {
            GgmlType::F32 => y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            GgmlType::F16 => y[0] = f16_at(b, 0),
            GgmlType::Bf16 => y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32(),
            GgmlType::Q4_0 => {
                let d = f16_at(b, 0);
                for j in 0..16 {
                    y[j] = ((b[2 + j] & 0x0f) as i32 - 8) as f32 * d;
                    y[j + 16] = ((b[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
            }
            GgmlType::Q4_1 => {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                for j in 0..16 {
                    y[j] = (b[4 + j] & 0x0f) as f32 * d + m;
                    y[j + 16] = (b[4 + j] >> 4) as f32 * d + m;
                }
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let (d, m, at) = if ty == GgmlType::Q5_0 {
                    (f16_at(b, 0), 0.0, 2)
                } else {
                    (f16_at(b, 0), f16_at(b, 2), 4)
                };
                let qh = u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                let qs = &b[at + 4..at + 20];
                let offset = if ty == GgmlType::Q5_0 { 16 } else { 0 };
                for j in 0..16 {
                    let h0 = (((qh >> j) << 4) & 0x10) as i32;
                    let h1 = ((qh >> (j + 12)) & 0x10) as i32;
                    let x0 = ((qs[j] & 0x0f) as i32 | h0) - offset;
                    let x1 = ((qs[j] >> 4) as i32 | h1) - offset;
                    // Q5_0's m is 0 (ggml writes x*d there: the same value but for the sign
                    // of a zero, which no product or requantisation sees).
                    y[j] = x0 as f32 * d + m;
                    y[j + 16] = x1 as f32 * d + m;
                }
            }
            GgmlType::Q8_0 => {
                let d = f16_at(b, 0);
                for j in 0..32 {
                    y[j] = (b[2 + j] as i8) as f32 * d;
                }
            }
            GgmlType::Q4K | GgmlType::Q5K => {
                let (d, min) = (f16_at(b, 0), f16_at(b, 2));
                let scales = &b[4..16];
                let (qh, mut ql) = if ty == GgmlType::Q5K {
                    (&b[16..48], &b[48..176])
                } else {
                    (&b[0..0], &b[16..144])
                };
                let (mut u1, mut u2) = (1u8, 2u8);
                for (n, is) in (0..8).step_by(2).enumerate() {
                    let (sc, m) = scale_min_k4(is, scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    let (sc, m) = scale_min_k4(is + 1, scales);
                    let (d2, m2) = (d * sc as f32, min * m as f32);
                    let y = &mut y[n * 64..];
                    for l in 0..32 {
                        let hi1 = if !qh.is_empty() && qh[l] & u1 != 0 {
                            16
                        } else {
                            0
                        };
                        let hi2 = if !qh.is_empty() && qh[l] & u2 != 0 {
                            16
                        } else {
                            0
                        };
                        y[l] = d1 * ((ql[l] & 0x0f) + hi1) as f32 - m1;
                        y[l + 32] = d2 * ((ql[l] >> 4) + hi2) as f32 - m2;
                    }
                    ql = &ql[32..];
                    u1 <<= 2;
                    u2 <<= 2;
                }
            }
            GgmlType::Q6K => {
                let (ql_all, qh_all, sc_all) = (&b[0..128], &b[128..192], &b[192..208]);
                let d = f16_at(b, 208);
                for n in 0..2 {
                    let (ql, qh) = (&ql_all[n * 64..], &qh_all[n * 32..]);
                    let sc = &sc_all[n * 8..];
                    let y = &mut y[n * 128..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        y[l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        y[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        y[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        y[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
            }
        }
    }
}

/// ggml-quants.c's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Rows of block-quantised weights as ONNX Runtime's MatMulNBits (B, scales, zero_points) and
/// GatherBlockQuantized (data, scales, zero_points) take them: per row, `K / 32` blocks of
/// `32 * bits / 8` bytes; one float32 scale per block; 4-bit zero points (when present) two to a
/// byte, low nibble first, per row padded to whole bytes; absent, the zero point is the middle
/// (8 for 4 bits, 128 for 8 bits).
#[derive(Debug, Clone, Default)]
pub struct Blocks {
    pub bits: u8,
    pub rows: usize,
    pub k: usize,
    pub data: Vec<u8>,
    pub scales: Vec<f32>,
    pub zero_points: Option<Vec<u8>>,
}

impl Blocks {
    fn new(bits: u8, k: usize, asymmetric: bool) -> Self {
        Self {
            bits,
            rows: 0,
            k,
            data: Vec::new(),
            scales: Vec::new(),
            zero_points: asymmetric.then(Vec::new),
        }
    }

    /// `other`'s rows after these (the same bits, row length and zero-point form).
    pub fn append(&mut self, other: Blocks) {
        debug_assert!(other.bits == self.bits && other.k == self.k);
        self.rows += other.rows;
        self.data.extend(other.data);
        self.scales.extend(other.scales);
        if let (Some(a), Some(b)) = (self.zero_points.as_mut(), other.zero_points) {
            a.extend(b);
        }
    }

    pub fn blocks_per_row(&self) -> usize {
        self.k / BLOCK
    }

    /// Bytes of one block's weights.
    pub fn block_bytes(&self) -> usize {
        BLOCK * self.bits as usize / 8
    }

    /// The dequantised value of weight `i` of row `r` (tests and the conversion's error check).
    pub fn value(&self, r: usize, i: usize) -> f32 {
        let blk = r * self.blocks_per_row() + i / BLOCK;
        let (q, mid) = if self.bits == 4 {
            let byte = self.data[r * self.k / 2 + i / 2];
            (
                if i.is_multiple_of(2) {
                    byte & 0x0f
                } else {
                    byte >> 4
                },
                8,
            )
        } else {
            (self.data[r * self.k + i], 128)
        };
        let zp = match &self.zero_points {
            Some(z) => {
                let per_row = self.blocks_per_row().div_ceil(2);
                let byte = z[r * per_row + (i / BLOCK) / 2];
                if (i / BLOCK).is_multiple_of(2) {
                    byte & 0x0f
                } else {
                    byte >> 4
                }
            }
            None => mid,
        };
        (q as f32 - zp as f32) * self.scales[blk]
    }
}

/// Q4_0 or Q8_0 rows (`src`: whole rows of `k` weights) in MatMulNBits' form, bit for bit: the
/// same 4-bit or 8-bit codes, the float16 scale widened to float32 (exact).
pub fn repack(ty: GgmlType, src: &[u8], k: usize) -> Option<Blocks> {
    let bits = match ty {
        GgmlType::Q4_0 => 4,
        GgmlType::Q8_0 => 8,
        _ => return None,
    };
    let mut out = Blocks::new(bits, k, false);
    let (bytes, _) = ty.block();
    out.data
        .reserve(src.len() / bytes * BLOCK * bits as usize / 8);
    for b in src.chunks_exact(bytes) {
        out.scales.push(f16_at(b, 0));
        if ty == GgmlType::Q4_0 {
            let qs = &b[2..18];
            let q = |e: usize| {
                if e < 16 {
                    qs[e] & 0x0f
                } else {
                    qs[e - 16] >> 4
                }
            };
            out.data
                .extend((0..16).map(|i| q(2 * i) | (q(2 * i + 1) << 4)));
        } else {
            // int8 q -> q + 128: MatMulNBits' 8-bit codes are unsigned with zero point 128.
            out.data
                .extend(b[2..34].iter().map(|&q| (q as i8 as i16 + 128) as u8));
        }
    }
    out.rows = src.len() / ty.row_bytes(k);
    Some(out)
}

/// Float rows quantised to blocks of 32: 8 bits symmetric as ggml's `quantize_row_q8_0_ref`
/// (scale `amax / 127`, round to nearest), or 4 bits asymmetric (each block's own min and max
/// mapped to codes 0 and 15, an integer zero point): the forms the conversion gives a
/// K-quant's weights.
pub fn quantize(rows: &[f32], k: usize, bits: u8) -> Blocks {
    let mut out = Blocks::new(bits, k, bits == 4);
    out.rows = rows.len() / k;
    for row in rows.chunks_exact(k) {
        let mut zps = Vec::with_capacity(k / BLOCK);
        for x in row.chunks_exact(BLOCK) {
            if bits == 8 {
                let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.scales.push(d);
                out.data
                    .extend(x.iter().map(|v| ((v * id).round() as i32 + 128) as u8));
            } else {
                let (lo, hi) = x
                    .iter()
                    .fold((0f32, 0f32), |(l, h), &v| (l.min(v), h.max(v)));
                let d = (hi - lo) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                let zp = (-lo * id).round().clamp(0.0, 15.0) as u8;
                out.scales.push(d);
                zps.push(zp);
                let q = |v: f32| ((v * id).round() as i32 + zp as i32).clamp(0, 15) as u8;
                out.data
                    .extend(x.chunks_exact(2).map(|p| q(p[0]) | (q(p[1]) << 4)));
            }
        }
        if let Some(z) = out.zero_points.as_mut() {
            z.extend(
                zps.chunks(2)
                    .map(|p| p[0] | (p.get(1).copied().unwrap_or(0) << 4)),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_0_repacks_to_the_same_values_nibble_for_nibble() {
        // One block: d = 0.5, codes 0..15 then 15..0.
        let mut b = h(0.5).to_vec();
        b.extend((0..16).map(|j| (j as u8) | ((15 - j as u8) << 4)));
        let mut want = [0f32; 32];
        dequantize_row(GgmlType::Q4_0, &b, &mut want);
        assert_eq!(want[0], -4.0);
        assert_eq!(want[16], 3.5);
        let got = repack(GgmlType::Q4_0, &b, 32).unwrap();
        assert_eq!((got.rows, got.bits, got.scales.clone()), (1, 4, vec![0.5]));
        for (i, w) in want.iter().enumerate() {
            assert_eq!(got.value(0, i), *w, "weight {i}");
        }
        // MatMulNBits' order: byte 0 holds elements 0 and 1.
        assert_eq!(
            got.data[0],
            1 << 4,
            "element 0 (code 0) low, element 1 (code 1) high"
        );
    }

    #[test]
    fn q8_0_repacks_around_128() {
        let mut b = h(0.25).to_vec();
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        let mut want = [0f32; 32];
        dequantize_row(GgmlType::Q8_0, &b, &mut want);
        let got = repack(GgmlType::Q8_0, &b, 32).unwrap();
        for (i, w) in want.iter().enumerate() {
            assert_eq!(got.value(0, i), *w);
        }
        assert_eq!(got.data[0], 112);
        assert_eq!(want[0], -4.0);
    }

    #[test]
    fn q6_k_and_q4_k_dequantise_as_ggml_writes_them() {
        // Q6_K, d = 1, every scale 2, every 6-bit code 33 (value (33 - 32) * 2 = 2).
        let mut b = vec![0u8; 210];
        b[..128].fill(0x11); // low nibbles 1
        b[128..192].fill(0b1010_1010); // high bits 2 -> code 32 + 1
        b[192..208].fill(2);
        b[208..210].copy_from_slice(&h(1.0));
        let mut y = [0f32; 256];
        dequantize_row(GgmlType::Q6K, &b, &mut y);
        assert!(y.iter().all(|&v| v == 2.0), "{:?}", &y[..8]);
        // Q4_K: d = 1, dmin = 0.5, sub-block j scale j+1 and min 1 (j < 4 packed plainly, j >= 4
        // in the high bits), codes 3: value (j+1)*3 - 0.5.
        let mut b = vec![0u8; 144];
        b[0..2].copy_from_slice(&h(1.0));
        b[2..4].copy_from_slice(&h(0.5));
        let sc = &mut b[4..16];
        for j in 0..4 {
            sc[j] = (j + 1) as u8;
            sc[j + 4] = 1;
        }
        for j in 4..8 {
            let (s, m) = ((j + 1) as u8, 1u8);
            sc[j + 4] = (s & 0x0f) | ((m & 0x0f) << 4);
            sc[j - 4] |= (s >> 4) << 6;
            sc[j] |= (m >> 4) << 6;
        }
        b[16..].fill(0x33);
        let mut y = [0f32; 256];
        dequantize_row(GgmlType::Q4K, &b, &mut y);
        for (i, v) in y.iter().enumerate() {
            assert_eq!(*v, ((i / 32) + 1) as f32 * 3.0 - 0.5, "weight {i}");
        }
    }

    #[test]
    fn requantised_blocks_stay_within_half_a_step() {
        let row: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 11.0) * 0.1)
            .collect();
        for bits in [4u8, 8] {
            let q = quantize(&row, 64, bits);
            for (i, &x) in row.iter().enumerate() {
                let step = q.scales[i / 32];
                assert!(
                    (q.value(0, i) - x).abs() <= step * 0.5 + 1e-6,
                    "bits {bits}, weight {i}: {} for {x}",
                    q.value(0, i)
                );
            }
        }
    }
}
