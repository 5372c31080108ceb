//! Resampling keeps frequency and level; time-stretch changes duration and keeps pitch.

mod common;

use common::*;
use onebit_tts::audio::resample::{StreamResampler, resampled_len};
use onebit_tts::audio::stretch::{TimeStretcher, stretched_len};
use onebit_tts::audio::{AudioError, resample, time_stretch};

#[test]
fn resampling_keeps_tone_frequency_and_level() {
    let x = tone(1000.0, 2.0, 24_000, 0.5);
    let level_in = rms(middle(&x, 0.1));
    for out_rate in [16_000, 22_050, 44_100, 48_000, 8_000, 17_001] {
        // Streamed in uneven pieces, as the service feeds it.
        let mut r = StreamResampler::new(24_000, out_rate).unwrap();
        let mut y = Vec::new();
        for piece in x.chunks(4801) {
            y.extend(r.process(piece).unwrap());
        }
        y.extend(r.finish().unwrap());
        assert_eq!(
            y.len() as u64,
            resampled_len(x.len() as u64, 24_000, out_rate)
        );
        let mid = middle(&y, 0.1);
        let f = peak_frequency(center(mid, out_rate as usize / 2), out_rate, 500.0, 2000.0);
        let db = 20.0 * (rms(mid) / level_in).log10();
        eprintln!("24000 -> {out_rate}: peak {f:.2} Hz, level {db:+.3} dB");
        assert!((f - 1000.0).abs() < 1.0, "{out_rate}: peak at {f} Hz");
        assert!(db.abs() < 0.5, "{out_rate}: level changed by {db} dB");
    }
}

#[test]
fn resampling_is_aligned_in_time() {
    // A click at 0.5 s stays at 0.5 s: the start-up delay is removed.
    let mut x = vec![0.0f32; 24_000];
    x[12_000] = 1.0;
    for out_rate in [16_000, 44_100, 48_000] {
        let y = resample(&x, 24_000, out_rate).unwrap();
        let peak = y
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .map(|(i, _)| i)
            .unwrap();
        let expected = out_rate as usize / 2;
        assert!(
            peak.abs_diff(expected) <= 1,
            "{out_rate}: click at {peak}, expected {expected}"
        );
    }
}

#[test]
fn resampling_rejects_rates_outside_range() {
    for rate in [4000, 96_000] {
        let e = resample(&[0.0; 10], 24_000, rate).unwrap_err();
        assert!(matches!(e, AudioError::SampleRateOutOfRange { rate: r, .. } if r == rate));
        assert!(e.to_string().contains("8000..=48000"), "{e}");
    }
}

fn stretch_streamed(x: &[f32], speed: f32) -> Vec<f32> {
    let mut t = TimeStretcher::new(24_000, speed).unwrap();
    let mut y = Vec::new();
    for piece in x.chunks(12_000) {
        y.extend(t.process(piece));
    }
    y.extend(t.finish());
    y
}

#[test]
fn stretch_changes_duration_and_keeps_pitch() {
    let x = tone(440.0, 3.0, 24_000, 0.5);
    for speed in [2.0f32, 0.5, 1.25, 4.0, 0.25] {
        let y = stretch_streamed(&x, speed);
        let expected = x.len() as f64 / f64::from(speed);
        let ratio = y.len() as f64 / expected;
        // Up to an octave either way would show as a pitch change.
        let f = peak_frequency(center(&y, 12_000), 24_000, 200.0, 1000.0);
        let db = 20.0 * (rms(middle(&y, 0.1)) / rms(middle(&x, 0.1))).log10();
        eprintln!(
            "speed {speed}: {} -> {} samples (x{:.4} of expected), pitch {f:.2} Hz, level {db:+.2} dB",
            x.len(),
            y.len(),
            ratio
        );
        assert_eq!(y.len() as u64, stretched_len(x.len() as u64, speed));
        assert!((ratio - 1.0).abs() < 0.02);
        assert!(
            (f - 440.0).abs() < 440.0 * 0.02,
            "speed {speed}: pitch {f} Hz"
        );
        assert!(db.abs() < 1.0, "speed {speed}: level changed by {db} dB");
    }
}

#[test]
fn stretch_keeps_speech_like_pitch() {
    // A harmonic signal with vibrato: the fundamental must stay at ~140 Hz.
    let x = speech_like(3.0, 24_000);
    for speed in [2.0f32, 0.5] {
        let y = time_stretch(&x, 24_000, speed).unwrap();
        let f = peak_frequency(center(&y, 24_000), 24_000, 100.0, 200.0);
        eprintln!("speech-like speed {speed}: fundamental {f:.1} Hz");
        assert!(
            (f - 140.0).abs() < 140.0 * 0.03,
            "speed {speed}: fundamental {f} Hz"
        );
    }
}

#[test]
fn stretch_at_speed_one_is_identity() {
    let x = speech_like(0.5, 24_000);
    assert_eq!(stretch_streamed(&x, 1.0), x);
}

#[test]
fn stretch_has_no_clicks() {
    // The largest sample step of a stretched pure tone stays near the tone's own.
    let x = tone(440.0, 2.0, 24_000, 0.5);
    let max_step = |v: &[f32]| {
        v.windows(2)
            .map(|w| (w[1] - w[0]).abs())
            .fold(0.0f32, f32::max)
    };
    let own = max_step(&x);
    for speed in [0.5f32, 2.0, 3.3] {
        let y = stretch_streamed(&x, speed);
        let step = max_step(middle(&y, 0.02));
        assert!(
            step < own * 1.5,
            "speed {speed}: step {step} vs tone's {own}"
        );
    }
}

#[test]
fn stretch_rejects_bad_speeds() {
    for speed in [0.1f32, 5.0] {
        let e = time_stretch(&[0.0; 10], 24_000, speed).unwrap_err();
        assert!(matches!(e, AudioError::SpeedOutOfRange { .. }), "{e}");
        assert!(e.to_string().contains("0.25..=4"), "{e}");
    }
}
