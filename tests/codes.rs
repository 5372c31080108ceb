//! Saved speech codes: `say --codes` / `say --json` write them, `onebit-tts decode` turns them
//! back into the bytes `say` wrote (real child processes); a streamed synthesis's codes decode to
//! its streamed bytes (library); broken documents are refused with one clear line.

mod common;

use std::ops::ControlFlow;
use std::path::Path;

use common::{cli, error_line, stderr, stdout};
use onebit_tts::audio::{AudioFormat, OutputSpec};
use onebit_tts::codec::stream::Windows;
use onebit_tts::engine::{CancelToken, GenerationParams, SamplingParams};
use onebit_tts::synth::{
    CODES_FORMAT, CODES_FORMAT_FIRST, CODES_FORMAT_WINDOWS, Decoding, SpeechCodes, SpeechRequest,
    SynthConfig, SynthEvent, Synthesizer, load_codec,
};

/// Twelve sentences: more than one piece on models/tiny-static (512 KV positions).
fn sentences(count: usize) -> String {
    (0..count)
        .map(|i| {
            format!(
                "Sentence {i} tells the story of a quiet valley, where the river runs slowly past old stone houses. "
            )
        })
        .collect()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `say` with `extra` options writing `audio` and `codes`, then `decode` with the same output
/// options: the two audio files are byte for byte the same. Returns the codes document.
fn say_then_decode(tag: &str, model: &str, extra: &[&str], text: &str, ext: &str) -> SpeechCodes {
    let dir = common::tempdir(&format!("codes-{tag}-{ext}"));
    let (said, codes, decoded) = (
        dir.join(format!("said.{ext}")),
        dir.join("codes.json"),
        dir.join(format!("decoded.{ext}")),
    );
    let model = common::model(model);
    let mut args = vec![
        "say",
        "-q",
        "--model",
        s(&model),
        "--voice",
        "test",
        "-o",
        s(&said),
        "--codes",
        s(&codes),
    ];
    args.extend_from_slice(extra);
    args.push(text);
    let o = cli(&args);
    assert!(o.status.success(), "{}", stderr(&o));

    let mut args = vec!["decode", "--model", s(&model), "-o", s(&decoded), s(&codes)];
    // The output options only (format, rate, speed), as a user repeats them.
    for pair in extra.chunks(2) {
        if matches!(pair[0], "--format" | "--sample-rate" | "--speed") {
            args.extend_from_slice(pair);
        }
    }
    let o = cli(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let a = std::fs::read(&said).unwrap();
    let b = std::fs::read(&decoded).unwrap();
    assert!(!a.is_empty());
    assert!(
        a == b,
        "{ext}: decode made {} bytes, say {}",
        b.len(),
        a.len()
    );
    let doc = std::fs::read_to_string(&codes).unwrap();
    SpeechCodes::from_json(&doc).unwrap()
}

#[test]
fn greedy_codes_decode_to_the_bytes_say_wrote() {
    let exp = common::expect("tiny");
    let n = exp["test_voice_greedy_codes"].as_u64().unwrap() as usize;
    let doc = say_then_decode(
        "greedy",
        "tiny",
        &["--temperature", "0"],
        "Hello world, this is a test.",
        "wav",
    );
    assert_eq!(doc.codes_format, CODES_FORMAT);
    assert_eq!(doc.decoding, Decoding::Whole);
    assert_eq!(doc.voice, "test");
    assert_eq!(doc.model, "tiny");
    assert_eq!(doc.sample_rate, 24_000);
    assert_eq!(doc.pieces.len(), 1);
    assert_eq!(doc.planned_pieces, 1);
    assert_eq!(doc.pieces[0].codes.len(), n);
    // The voice's reference codes ride along (windowed decoding's left context).
    let voice: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::repo().join("voices/test.json")).unwrap(),
    )
    .unwrap();
    let reference: Vec<u32> = voice["codes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(doc.reference_codes, reference);
}

#[test]
fn many_pieces_with_speed_rate_and_lossy_formats_decode_to_the_same_bytes() {
    let text = sentences(12);
    for (ext, extra) in [
        ("mp3", vec!["--speed", "1.5", "--sample-rate", "16000"]),
        ("flac", vec![]),
        ("opus", vec!["--sample-rate", "48000"]),
    ] {
        let mut args = vec!["--seed", "11"];
        args.extend(extra);
        let doc = say_then_decode("pieces", "tiny-static", &args, &text, ext);
        assert!(doc.pieces.len() > 1, "{ext}: {} pieces", doc.pieces.len());
        assert_eq!(doc.planned_pieces, doc.pieces.len());
        // Each piece's sampler runs on the request's seed plus its index.
        for (i, p) in doc.pieces.iter().enumerate() {
            assert_eq!(p.seed, 11 + i as u64, "{ext}");
            assert!(p.prompt_ids.len() + p.max_new_tokens <= 512, "{ext}");
        }
        assert_eq!(doc.seed, 11);
    }
}

#[test]
fn pieces_left_out_by_max_new_tokens_keep_the_planned_joins() {
    // 60 codes are used up by the first piece: the rest never run, and the first piece's end
    // still fades out as planned for a join, which decode must reproduce.
    let doc = say_then_decode(
        "left-out",
        "tiny-static",
        &["--temperature", "0", "--max-new-tokens", "60"],
        &sentences(12),
        "wav",
    );
    assert_eq!(doc.pieces.len(), 1);
    assert!(doc.planned_pieces > 1, "{}", doc.planned_pieces);
    assert_eq!(doc.finish_reason, "length");
    assert_eq!(doc.pieces[0].codes.len(), 60);
}

#[test]
fn say_json_prints_the_codes_and_its_prompt_ids_are_the_prompt_commands() {
    let dir = common::tempdir("codes-json");
    let out = dir.join("out.wav");
    let model = common::model("tiny-random");
    let text = "Sampling run.";
    let o = cli(&[
        "say",
        "-q",
        "--json",
        "--model",
        s(&model),
        "--voice",
        "test",
        "--seed",
        "5",
        "--max-new-tokens",
        "77",
        "-o",
        s(&out),
        text,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("stdout is one JSON doc");
    assert_eq!(v["seed"], 5);
    assert_eq!(v["output"], s(&out));
    assert_eq!(v["audio_format"], "wav");
    let doc = SpeechCodes::from_json(&stdout(&o)).expect("say --json reads as a codes document");
    let codes = doc.all_codes().count();
    assert!(codes > 0 && codes <= 77, "{codes}");
    assert_eq!(v["codes"], codes);
    assert_eq!(v["finish"], doc.finish_reason.as_str());
    assert_eq!(doc.pieces[0].finish_reason, doc.finish_reason);
    let wav = hound::WavReader::open(&out).unwrap();
    assert_eq!(wav.len() as usize, codes * 480);

    let p = cli(&[
        "prompt",
        "--json",
        "--model",
        s(&model),
        "--voice",
        "test",
        text,
    ]);
    assert!(p.status.success(), "{}", stderr(&p));
    let prompt: serde_json::Value = serde_json::from_str(&stdout(&p)).unwrap();
    let ids: Vec<u32> = prompt["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(doc.pieces[0].prompt_ids, ids);

    // The say --json document decodes like a --codes file.
    let codes_file = dir.join("run.json");
    std::fs::write(&codes_file, stdout(&o)).unwrap();
    let decoded = dir.join("decoded.wav");
    let d = cli(&[
        "decode",
        "--model",
        s(&model),
        "-o",
        s(&decoded),
        s(&codes_file),
    ]);
    assert!(d.status.success(), "{}", stderr(&d));
    assert_eq!(
        std::fs::read(&decoded).unwrap(),
        std::fs::read(&out).unwrap()
    );
}

/// Keeps the bytes of a decode's events, patches applied.
fn collect(out: &mut Vec<u8>, ev: SynthEvent<'_>) {
    match ev {
        SynthEvent::Audio(b) => out.extend_from_slice(b),
        SynthEvent::Patch { offset, bytes } => {
            onebit_tts::audio::apply_patch(out, offset, bytes).unwrap()
        }
        _ => {}
    }
}

#[test]
fn streamed_codes_decode_to_the_streamed_bytes() {
    for layout in ["vendor", "25:25", "25:25:10"] {
        streamed_codes_decode_in_their_layout(layout.parse().unwrap());
    }
}

fn streamed_codes_decode_in_their_layout(windows: Windows) {
    let cfg = SynthConfig {
        package_dir: common::model("tiny-static"),
        voice_dirs: vec![common::repo().join("voices")],
        // The real NeuCodec architecture (random weights): its transformer sees the whole
        // window, so a layout shows in the samples, where the tiny stand-in's would not.
        codec_dir: Some(common::repo().join("tests/data/neucodec-decoder")),
        stream_windows: windows,
        ..SynthConfig::default()
    };
    let synth = Synthesizer::load(&cfg).unwrap();
    for format in [AudioFormat::Wav, AudioFormat::Pcm] {
        let output = OutputSpec {
            format,
            streaming: true,
            ..OutputSpec::default()
        };
        let req = SpeechRequest {
            text: sentences(6),
            voice: "test".into(),
            generation: GenerationParams {
                sampling: SamplingParams::greedy(),
                ..GenerationParams::default()
            },
            output,
            ..SpeechRequest::default()
        };
        let mut streamed = Vec::new();
        let report = synth
            .synthesize(&req, &CancelToken::new(), &mut |ev| {
                if let SynthEvent::Audio(b) = ev {
                    streamed.extend_from_slice(b);
                }
                ControlFlow::Continue(())
            })
            .unwrap();
        assert!(report.pieces.len() > 1);
        let doc = SpeechCodes::of(&synth, &req, &report).unwrap();
        assert_eq!((doc.decoding, doc.windows), (Decoding::Windowed, windows));
        // The vendor's layout is not written, so documents of earlier versions read as before;
        // another layout makes a format they refuse rather than decode in the wrong windows:
        // v2 for other look-back or later chunks, v3 once the first chunk differs too (a v2
        // reader would ignore `first`). The vendor's first chunk is not written either, so a v2
        // document reads back as it was written.
        let json = doc.to_json();
        assert_eq!(json.contains("\"windows\""), !windows.is_vendor());
        assert_eq!(json.contains("\"first\""), windows.first != 25);
        let format_name = if windows.is_vendor() {
            CODES_FORMAT
        } else if windows.first == 25 {
            CODES_FORMAT_WINDOWS
        } else {
            CODES_FORMAT_FIRST
        };
        assert_eq!(doc.codes_format, format_name);
        let doc = SpeechCodes::from_json(&doc.to_json()).unwrap();
        assert_eq!(doc.windows, windows);

        let codec = load_codec(&cfg, &synth.package().codec, 1).unwrap();
        let decode = |doc: &SpeechCodes| {
            let mut bytes = Vec::new();
            let tally = doc
                .decode(&codec, 24_000, &output, &mut |ev| {
                    collect(&mut bytes, ev);
                    ControlFlow::Continue(())
                })
                .unwrap();
            (bytes, tally.samples)
        };
        let (decoded, samples) = decode(&doc);
        assert_eq!(samples, report.samples);
        assert!(
            decoded == streamed,
            "{format:?}: {} vs {} bytes",
            decoded.len(),
            streamed.len()
        );
        // Decoded whole instead, the same codes give other samples: the mode matters.
        let (other, _) = decode(&SpeechCodes {
            decoding: Decoding::Whole,
            ..doc.clone()
        });
        assert_eq!(other.len(), decoded.len());
        assert!(other != decoded, "{format:?}");
        if !windows.is_vendor() {
            // And in the vendor's windows they give the vendor's samples, not these.
            let (other, _) = decode(&SpeechCodes {
                windows: Windows::VENDOR,
                ..doc.clone()
            });
            assert_eq!(other.len(), decoded.len());
            assert!(other != decoded, "{format:?} {windows}");
        }
    }
}

#[test]
fn broken_codes_documents_are_refused_and_write_nothing() {
    let dir = common::tempdir("codes-bad");
    let model = common::model("tiny");
    let good = say_then_decode("bad", "tiny", &["--temperature", "0"], "Hi there.", "wav");
    let cases: Vec<(&str, String, &str)> = vec![
        ("garbage", "this is not json".into(), "not a codes document"),
        (
            "other-format",
            good.to_json().replace(CODES_FORMAT, "onebit-tts.codes.v9"),
            "codes_format is \"onebit-tts.codes.v9\"",
        ),
        (
            "no-format",
            "{\"pieces\": []}".into(),
            "codes_format is \"missing\"",
        ),
        (
            "out-of-range",
            {
                let mut bad = good.clone();
                bad.pieces[0].codes[3] = 70_000;
                bad.to_json()
            },
            "piece 0, code 3: 70000 is outside the codec's 0..65535",
        ),
        (
            "bad-windows",
            good.to_json().replace(
                "\"decoding\":\"whole\"",
                "\"decoding\":\"windowed\",\"windows\":{\"lookback\":25,\"chunk\":0}",
            ),
            "chunk 0 is outside 1..=200 codes",
        ),
        (
            "wrong-rate",
            SpeechCodes {
                sample_rate: 16_000,
                ..good.clone()
            }
            .to_json(),
            "the codes are for a 16000 Hz codec; this codec makes 24000 Hz",
        ),
    ];
    for (name, doc, want) in cases {
        let path = dir.join(format!("{name}.json"));
        std::fs::write(&path, doc).unwrap();
        let out = dir.join(format!("{name}.wav"));
        let o = cli(&["decode", "--model", s(&model), "-o", s(&out), s(&path)]);
        let line = error_line(&o);
        assert!(line.contains(want), "{name}: {line}");
        assert!(!out.exists(), "{name}: an output file was left");
        assert!(
            !dir.join(format!("{name}.wav.partial")).exists(),
            "{name}: a partial file was left"
        );
    }
    let missing = dir.join("missing.json");
    let o = cli(&[
        "decode",
        "--model",
        s(&model),
        "-o",
        s(&dir.join("m.wav")),
        s(&missing),
    ]);
    assert!(error_line(&o).contains("missing.json"), "{}", stderr(&o));
}
