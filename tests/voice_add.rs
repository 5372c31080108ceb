//! `onebit-tts voices add`: reference audio -> audio stage -> encoder ONNX -> saved voice, end to
//! end with the real binary and the generated tiny encoder (models/tiny/codec/encoder.onnx, made by
//! scripts/gen-test-models.sh: 320 samples per code, F = floor((T + 160) / 320)).

mod common;

use std::path::{Path, PathBuf};

use common::{cli, error_line, stderr, stdout};

fn encoder() -> PathBuf {
    let p = common::model("tiny").join("codec").join("encoder.onnx");
    assert!(
        p.exists(),
        "{} is missing: run scripts/gen-test-models.sh",
        p.display()
    );
    p
}

/// One second of a 44.1 kHz stereo reference: a tone sweep per channel plus deterministic noise.
fn write_reference(path: &Path) {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 44_100,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let mut state = 0x1234_5678u32;
    for i in 0..44_100u32 {
        let t = f64::from(i) / 44_100.0;
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let noise = f64::from(state >> 16) / 65_536.0 - 0.5;
        let l = 0.4 * (2.0 * std::f64::consts::PI * (180.0 + 300.0 * t) * t).sin() + 0.1 * noise;
        let r = 0.3 * (2.0 * std::f64::consts::PI * 440.0 * t).sin() + 0.1 * noise;
        w.write_sample((l * 32_767.0) as i16).unwrap();
        w.write_sample((r * 32_767.0) as i16).unwrap();
    }
    w.finalize().unwrap();
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// 1 s at 16 kHz is 16000 samples; the tiny encoder rounds to the nearest 320-sample frame.
const EXPECTED_CODES: usize = (16_000 + 160) / 320;

#[test]
fn a_44k_stereo_reference_becomes_a_voice_that_speaks() {
    let tmp = common::tempdir("voice-add");
    let wav = tmp.join("ref.wav");
    write_reference(&wav);
    let voices = tmp.join("voices");
    let enc = encoder();
    let o = cli(&[
        "voices",
        "add",
        "clone",
        "--audio",
        wav.to_str().unwrap(),
        "--text",
        "  This is my cloned voice.  ",
        "--encoder",
        enc.to_str().unwrap(),
        "--language",
        "en_US",
        "--dir",
        voices.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    // What the audio stage did, and the clipping report.
    assert!(
        out.contains("1.00 s, 44100 Hz, 2 channels -> 16000 samples at 16000 Hz mono"),
        "{out}"
    );
    assert!(out.contains("clipped 0 of 88200 samples"), "{out}");
    assert!(out.contains(&format!("{EXPECTED_CODES} codes")), "{out}");
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));

    let v = read_json(&voices.join("clone.json"));
    let codes: Vec<u64> = v["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap())
        .collect();
    assert_eq!(codes.len(), EXPECTED_CODES);
    assert!(codes.iter().all(|&c| c < 65_536));
    let distinct: std::collections::BTreeSet<_> = codes.iter().collect();
    assert!(
        distinct.len() > 10,
        "a varied signal gives varied codes: {codes:?}"
    );
    assert_eq!(v["name"], "clone");
    assert_eq!(v["transcript"], "This is my cloned voice.");
    assert_eq!(v["language"], "en-us");
    assert_eq!(v["source"], "encoded from ref.wav with encoder.onnx");

    let o = cli(&[
        "voices",
        "show",
        "clone",
        "--voices",
        voices.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let shown = stdout(&o);
    assert!(shown.contains("name:       clone"), "{shown}");
    assert!(
        shown.contains(&format!("codes:      {EXPECTED_CODES} (1.00 s)")),
        "{shown}"
    );
    assert!(
        shown.contains("transcript: This is my cloned voice."),
        "{shown}"
    );
    let o = cli(&["voices", "list", "--voices", voices.to_str().unwrap()]);
    assert!(stdout(&o).contains("clone"), "{}", stdout(&o));

    let speech = tmp.join("out.wav");
    let model = common::model("tiny");
    let o = cli(&[
        "say",
        "-q",
        "--model",
        model.to_str().unwrap(),
        "--voices",
        voices.to_str().unwrap(),
        "--voice",
        "clone",
        "--temperature",
        "0",
        "-o",
        speech.to_str().unwrap(),
        "Hello from a cloned voice.",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r = hound::WavReader::open(&speech).unwrap();
    assert_eq!(r.spec().sample_rate, 24_000);
    assert!(
        r.len() > 0 && r.len().is_multiple_of(480),
        "{} samples",
        r.len()
    );
}

#[test]
fn the_package_codec_json_names_the_encoder_and_languages_are_stored() {
    let tmp = common::tempdir("voice-add-pkg");
    let wav = tmp.join("ref.wav");
    write_reference(&wav);
    let voices = tmp.join("voices");
    let model = common::model("tiny");
    let o = cli(&[
        "voices",
        "add",
        "french",
        "--audio",
        wav.to_str().unwrap(),
        "--text",
        "Bonjour.",
        "--language",
        "fr",
        "--model",
        model.to_str().unwrap(),
        "--dir",
        voices.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let v = read_json(&voices.join("french.json"));
    assert_eq!(v["language"], "fr-fr");
    assert_eq!(v["transcript"], "Bonjour.");
    assert_eq!(v["codes"].as_array().unwrap().len(), EXPECTED_CODES);
}

#[test]
fn without_an_encoder_it_says_what_is_needed() {
    let tmp = common::tempdir("voice-add-none");
    let wav = tmp.join("ref.wav");
    write_reference(&wav);
    let voices = tmp.join("voices");
    // tiny-random's codec.json names no encoder.
    let model = common::model("tiny-random");
    let o = cli(&[
        "voices",
        "add",
        "clone",
        "--audio",
        wav.to_str().unwrap(),
        "--text",
        "Hello.",
        "--model",
        model.to_str().unwrap(),
        "--dir",
        voices.to_str().unwrap(),
    ]);
    let err = error_line(&o);
    for want in [
        "no encoder",
        "NeuCodec encoder ONNX",
        "float32 [1,1,T] of 16 kHz",
        "[1,1,F] at 50 codes/s",
        "gated PyTorch model",
        "--encoder FILE",
        "ONEBIT_CODEC_ENCODER",
    ] {
        assert!(err.contains(want), "{want:?} missing from {err}");
    }
    assert!(!voices.join("clone.json").exists());
}

#[test]
fn a_model_of_the_wrong_shape_is_refused_at_load() {
    let tmp = common::tempdir("voice-add-shape");
    let wav = tmp.join("ref.wav");
    write_reference(&wav);
    // The decoder takes int32 codes, not float audio.
    let decoder = common::model("tiny").join("codec").join("model.onnx");
    let o = cli(&[
        "voices",
        "add",
        "clone",
        "--audio",
        wav.to_str().unwrap(),
        "--text",
        "Hello.",
        "--encoder",
        decoder.to_str().unwrap(),
        "--dir",
        tmp.join("voices").to_str().unwrap(),
    ]);
    let err = error_line(&o);
    assert!(
        err.contains("model.onnx") && err.contains("expected float32 [B,1,T]"),
        "{err}"
    );
}

#[test]
fn corrupt_audio_is_refused_clearly() {
    let tmp = common::tempdir("voice-add-corrupt");
    let bad = tmp.join("bad.wav");
    std::fs::write(&bad, b"RIFF\x10\x00\x00\x00WAVEthis is not audio at all").unwrap();
    let enc = encoder();
    let o = cli(&[
        "voices",
        "add",
        "clone",
        "--audio",
        bad.to_str().unwrap(),
        "--text",
        "Hello.",
        "--encoder",
        enc.to_str().unwrap(),
        "--dir",
        tmp.join("voices").to_str().unwrap(),
    ]);
    let err = error_line(&o);
    assert!(
        err.contains("bad.wav") && err.contains("audio input"),
        "{err}"
    );
    assert!(!tmp.join("voices").join("clone.json").exists());

    let empty = tmp.join("empty.wav");
    std::fs::write(&empty, b"").unwrap();
    let o = cli(&[
        "voices",
        "add",
        "clone",
        "--audio",
        empty.to_str().unwrap(),
        "--text",
        "Hello.",
        "--encoder",
        enc.to_str().unwrap(),
        "--dir",
        tmp.join("voices").to_str().unwrap(),
    ]);
    let err = error_line(&o);
    assert!(err.contains("empty.wav: audio input is empty"), "{err}");
}

#[test]
fn an_existing_voice_is_replaced_only_with_force() {
    let tmp = common::tempdir("voice-add-exists");
    let wav = tmp.join("ref.wav");
    write_reference(&wav);
    let voices = tmp.join("voices");
    let enc = encoder();
    let add = |text: &str, force: bool| {
        let mut args = vec![
            "voices",
            "add",
            "twice",
            "--audio",
            wav.to_str().unwrap(),
            "--text",
            text,
            "--encoder",
            enc.to_str().unwrap(),
            "--dir",
            voices.to_str().unwrap(),
        ];
        if force {
            args.push("--force");
        }
        cli(&args)
    };
    let o = add("First.", false);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = error_line(&add("Second.", false));
    assert!(
        err.contains("twice.json") && err.contains("exists") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(
        read_json(&voices.join("twice.json"))["transcript"],
        "First."
    );
    let o = add("Second.", true);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        read_json(&voices.join("twice.json"))["transcript"],
        "Second."
    );

    let err = error_line(&cli(&[
        "voices",
        "add",
        "../x",
        "--audio",
        wav.to_str().unwrap(),
        "--text",
        "Hi.",
        "--encoder",
        enc.to_str().unwrap(),
        "--dir",
        voices.to_str().unwrap(),
    ]));
    assert!(err.contains("invalid voice name"), "{err}");
}
