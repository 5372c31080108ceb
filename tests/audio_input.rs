//! Decoding uploaded reference audio: formats, downmix, 16 kHz, clipping report, bad input.

mod common;

use std::io::Cursor;

use common::*;
use onebit_tts::audio::decode::{CLONE_SAMPLE_RATE, decode_bytes, decode_path};
use onebit_tts::audio::{AudioError, AudioFormat, encode};

/// A stereo 16-bit WAV via hound (independent of our encoder): left a tone, right silence,
/// `clipped` samples of the left channel at full scale.
fn stereo_wav(rate: u32, secs: f64, clipped: usize) -> Vec<u8> {
    let left = tone(1000.0, secs, rate, 0.6);
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: rate,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut buf = Cursor::new(Vec::new());
    let mut w = hound::WavWriter::new(&mut buf, spec).unwrap();
    for (i, &l) in left.iter().enumerate() {
        let l = if i < clipped {
            32767
        } else {
            (l * 32767.0) as i16
        };
        w.write_sample(l).unwrap();
        w.write_sample(0i16).unwrap();
    }
    w.finalize().unwrap();
    buf.into_inner()
}

#[test]
fn stereo_44k_wav_becomes_16k_mono() {
    let bytes = stereo_wav(44_100, 1.5, 441);
    let d = decode_bytes(&bytes, Some("wav")).unwrap();
    assert_eq!(d.sample_rate, CLONE_SAMPLE_RATE);
    assert_eq!(d.original_sample_rate, 44_100);
    assert_eq!(d.original_channels, 2);
    assert!((d.duration_secs - 1.5).abs() < 1e-6, "{}", d.duration_secs);
    assert_eq!(d.samples.len(), 24_000);
    assert_eq!(d.clipping.total_samples, 2 * 66_150);
    assert_eq!(d.clipping.clipped_samples, 441);
    assert!((d.clipping.ratio() - 441.0 / 132_300.0).abs() < 1e-12);
    // Averaged downmix: a 0.6 tone on one channel becomes 0.3.
    let peak = middle(&d.samples, 0.1)
        .iter()
        .fold(0.0f32, |m, x| m.max(x.abs()));
    assert!((peak - 0.3).abs() < 0.01, "peak {peak}");
    let f = peak_frequency(center(&d.samples, 8_000), CLONE_SAMPLE_RATE, 500.0, 2000.0);
    assert!((f - 1000.0).abs() < 1.0, "{f}");
}

#[test]
fn decodes_our_flac_and_mp3_and_a_vorbis_fixture() {
    let x = speech_like(2.0, 24_000);
    for (format, ext) in [
        (AudioFormat::Flac, "flac"),
        (AudioFormat::Mp3, "mp3"),
        (AudioFormat::Wav, "wav"),
    ] {
        let bytes = encode(format, 24_000, &x).unwrap();
        // No hint: the content decides.
        let d = decode_bytes(&bytes, None).unwrap();
        assert_eq!(
            (d.original_sample_rate, d.original_channels),
            (24_000, 1),
            "{ext}"
        );
        assert!(
            (d.duration_secs - 2.0).abs() < 0.021,
            "{ext}: {}",
            d.duration_secs
        );
        assert_eq!(d.clipping.clipped_samples, 0);
        assert!(
            d.samples.len().abs_diff(32_000) <= 320,
            "{ext}: {}",
            d.samples.len()
        );
    }
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/stereo_22050_600ms.ogg");
    let d = decode_path(&path).unwrap();
    assert_eq!((d.original_sample_rate, d.original_channels), (22_050, 2));
    assert!((d.duration_secs - 0.6).abs() < 0.021, "{}", d.duration_secs);
    assert!(
        d.samples.len().abs_diff(9_600) <= 320,
        "{}",
        d.samples.len()
    );
}

#[test]
fn bad_input_gives_typed_errors() {
    assert!(matches!(
        decode_bytes(&[], None),
        Err(AudioError::EmptyInput)
    ));

    let garbage: Vec<u8> = (0..4096u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let e = decode_bytes(&garbage, Some("wav")).unwrap_err();
    assert!(matches!(e, AudioError::UnrecognizedInput(_)), "{e:?}");

    // A valid header with no samples.
    let empty_wav = encode(AudioFormat::Wav, 24_000, &[]).unwrap();
    let e = decode_bytes(&empty_wav, None).unwrap_err();
    assert!(matches!(e, AudioError::EmptyInput), "{e:?}");

    // A FLAC header followed by garbage frames.
    let mut flac = encode(AudioFormat::Flac, 24_000, &speech_like(0.5, 24_000)).unwrap();
    for b in flac.iter_mut().skip(42) {
        *b = b.wrapping_mul(31).wrapping_add(7);
    }
    let e = decode_bytes(&flac, None).unwrap_err();
    assert!(matches!(e, AudioError::CorruptInput(_)), "{e:?}");
    eprintln!("corrupt flac: {e}");

    // A truncated header.
    let wav = encode(AudioFormat::Wav, 24_000, &[0.1; 100]).unwrap();
    let e = decode_bytes(&wav[..20], None).unwrap_err();
    assert!(matches!(e, AudioError::CorruptInput(_)), "{e:?}");

    let dir = std::env::temp_dir().join(format!("onebit-audio-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.wav");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(decode_path(&empty), Err(AudioError::EmptyInput)));
    assert!(matches!(
        decode_path(&dir.join("missing.wav")),
        Err(AudioError::Io(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();

    let e = "aiff".parse::<AudioFormat>().unwrap_err();
    assert!(matches!(e, AudioError::UnknownFormat { .. }));
    assert_eq!(
        e.to_string(),
        "unknown audio format \"aiff\"; supported: mp3, opus, flac, wav, pcm"
    );
}

#[test]
fn truncated_file_keeps_what_decodes() {
    let bytes = encode(AudioFormat::Wav, 24_000, &speech_like(1.0, 24_000)).unwrap();
    let d = decode_bytes(&bytes[..bytes.len() / 2], None).unwrap();
    assert!((d.duration_secs - 0.5).abs() < 0.02, "{}", d.duration_secs);
}
