//! Float ↔ 16-bit conversions shared by the encoders.

/// f32 in [-1, 1] to i16, symmetric (±1.0 → ±32767) so silence stays 0 and a full-scale sine
/// does not clip on one side. Out-of-range input saturates; NaN becomes 0.
pub fn f32_to_i16(x: f32) -> i16 {
    // `as` saturates and maps NaN to 0, which is what a decoder glitch should become.
    (x.clamp(-1.0, 1.0) * 32767.0).round() as i16
}

/// The inverse scale of [`f32_to_i16`].
pub fn i16_to_f32(x: i16) -> f32 {
    f32::from(x) / 32767.0
}

/// Appends `samples` as signed 16-bit little-endian bytes.
pub fn push_s16le(samples: &[f32], out: &mut Vec<u8>) {
    out.reserve(samples.len() * 2);
    for &x in samples {
        out.extend_from_slice(&f32_to_i16(x).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions() {
        assert_eq!(f32_to_i16(0.0), 0);
        assert_eq!(f32_to_i16(1.0), 32767);
        assert_eq!(f32_to_i16(-1.0), -32767);
        assert_eq!(f32_to_i16(2.0), 32767);
        assert_eq!(f32_to_i16(f32::NAN), 0);
        for v in [-32767i16, -1, 0, 1, 12345, 32767] {
            assert_eq!(f32_to_i16(i16_to_f32(v)), v);
        }
    }
}
