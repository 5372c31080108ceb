//! Timing out of the pipeline: where each piece lies in the audio, exact to the code, through a
//! real synthesis on the generated package, and `say --captions` writing SRT, WebVTT and the
//! JSON timing document through the real binary.

mod common;

use std::ops::ControlFlow;
use std::path::Path;

use serde_json::Value;

use onebit_tts::audio::{AudioFormat, OutputSpec};
use onebit_tts::engine::{CancelToken, GenerationParams, SamplingParams};
use onebit_tts::synth::{
    PIECE_PAUSE_S, PieceTiming, Reading, SpeechRequest, SynthConfig, SynthEvent, SynthesisReport,
    Synthesizer,
};

/// Seconds compared after float arithmetic: far below one sample (42 µs at 24 kHz).
const EPS: f64 = 1e-9;

fn synth() -> Synthesizer {
    Synthesizer::load(&SynthConfig {
        package_dir: common::model("tiny"),
        voice_dirs: vec![common::repo().join("voices")],
        ..SynthConfig::default()
    })
    .unwrap()
}

/// Greedy (every piece of the tiny package makes its 120-code chain), read as written.
fn request(text: String, markup: bool, output: OutputSpec) -> SpeechRequest {
    SpeechRequest {
        text,
        voice: "test".into(),
        generation: GenerationParams {
            sampling: SamplingParams::greedy(),
            ..GenerationParams::default()
        },
        output,
        reading: Reading {
            normalize: false,
            markup,
            ..Default::default()
        },
        ..SpeechRequest::default()
    }
}

/// A request's report, its audio bytes, and each `Timing` event with the audio bytes handed out
/// before it.
fn run(
    s: &Synthesizer,
    req: &SpeechRequest,
) -> (SynthesisReport, Vec<u8>, Vec<(PieceTiming, usize)>) {
    let mut bytes = Vec::new();
    let mut events = Vec::new();
    let report = s
        .synthesize(req, &CancelToken::new(), &mut |ev| {
            match ev {
                SynthEvent::Audio(b) => bytes.extend_from_slice(b),
                SynthEvent::Patch { offset, bytes: p } => {
                    onebit_tts::audio::apply_patch(&mut bytes, offset, p).unwrap()
                }
                SynthEvent::Timing(t) => events.push((t.clone(), bytes.len())),
                _ => {}
            }
            ControlFlow::Continue(())
        })
        .unwrap();
    (report, bytes, events)
}

fn wav(format_rate: u32, speed: f32) -> OutputSpec {
    OutputSpec {
        format: AudioFormat::Wav,
        sample_rate: format_rate,
        speed,
        streaming: false,
    }
}

/// Every piece lasts its codes x 20 ms / speed; the first starts at 0 (or after a pause markup
/// put before it), each next one after the gap before it: its markup pause, which lasts its time
/// whatever the speed, or the join between pieces, PIECE_PAUSE_S of codec-rate samples that the
/// speed change shortens like the speech. Returns the gaps, markup ones first flagged `true`.
fn check_pieces(report: &SynthesisReport, speed: f64) -> Vec<(bool, f64)> {
    let t = &report.timeline;
    assert_eq!(t.pieces.len(), report.pieces.len());
    let mut gaps = Vec::new();
    let mut prev_end = 0.0;
    for (i, (p, o)) in t.pieces.iter().zip(&report.pieces).enumerate() {
        assert_eq!(p.index, i);
        assert_eq!(p.text, o.text);
        assert_eq!(p.codes, o.codes.len());
        assert!(
            (p.end - p.start - p.codes as f64 * 0.02 / speed).abs() < EPS,
            "piece {i}: {} codes over {}..{}",
            p.codes,
            p.start,
            p.end
        );
        let gap = match o.pause_before {
            Some(d) => (true, d.as_secs_f64()),
            None if i == 0 => (false, 0.0),
            None => (false, join_samples() as f64 / (24_000.0 * speed)),
        };
        assert!(
            (p.start - prev_end - gap.1).abs() < 1e-6,
            "piece {i} starts at {}, {} after the last end; expected {gap:?}",
            p.start,
            p.start - prev_end
        );
        if i > 0 || gap.0 {
            gaps.push(gap);
        }
        // The words share the piece's span, in order, and are labelled as estimates in the
        // document.
        let w = &p.words;
        assert!(!w.is_empty(), "piece {i}");
        assert_eq!(w[0].start, p.start);
        assert_eq!(w[w.len() - 1].end, p.end);
        assert!(
            w.windows(2)
                .all(|x| x[0].end == x[1].start && x[0].start <= x[0].end)
        );
        assert_eq!(
            w.iter().map(|w| w.word.as_str()).collect::<Vec<_>>(),
            p.text.split_whitespace().collect::<Vec<_>>()
        );
        prev_end = p.end;
    }
    gaps
}

/// The join between pieces in codec-rate samples, as the audio stage makes it.
fn join_samples() -> usize {
    (PIECE_PAUSE_S * 24_000.0) as usize
}

#[test]
fn pieces_lie_exactly_where_their_codes_and_the_joins_put_them() {
    let s = synth();
    let (report, bytes, events) = run(
        &s,
        &request(common::sentences(0, 30), false, wav(24_000, 1.0)),
    );
    assert!(report.pieces.len() > 3, "{} pieces", report.pieces.len());
    assert!(report.pieces.iter().all(|p| p.codes.len() == 120));
    assert_eq!(join_samples(), 4_800);
    let gaps = check_pieces(&report, 1.0);
    assert_eq!(gaps, vec![(false, 0.2); report.pieces.len() - 1]);
    let t = &report.timeline;
    assert_eq!(t.pieces[0].start, 0.0);
    assert_eq!(t.pieces[0].end, 2.4);
    assert_eq!(t.pieces[1].start, 2.6);
    assert_eq!((t.sample_rate, t.speed), (24_000, 1.0));
    // The audio ends with the last piece: 120 codes and a 0.2 s join per piece but the last.
    let n = report.pieces.len() as f64;
    assert!((t.audio_seconds - (n * 2.4 + (n - 1.0) * 0.2)).abs() < EPS);
    assert_eq!(t.audio_seconds, t.pieces.last().unwrap().end);
    let samples = hound::WavReader::new(std::io::Cursor::new(&bytes))
        .unwrap()
        .len() as usize;
    assert_eq!(samples, report.samples);
    assert!((samples as f64 / 24_000.0 - t.audio_seconds).abs() < EPS);
    // One Timing event per piece, the same as the report's.
    let sent: Vec<PieceTiming> = events.into_iter().map(|e| e.0).collect();
    assert_eq!(sent, t.pieces);
}

#[test]
fn a_stream_gets_each_piece_s_timing_right_after_its_audio() {
    let s = synth();
    let output = OutputSpec {
        format: AudioFormat::Pcm,
        streaming: true,
        ..OutputSpec::default()
    };
    let (report, _, events) = run(&s, &request(common::sentences(0, 30), false, output));
    assert!(events.len() > 3, "{} pieces", events.len());
    // 16-bit samples at the codec rate go straight out: when a piece's timing arrives, exactly
    // the audio up to its end has been handed out, no more and no less.
    for (t, sent) in &events {
        assert_eq!(
            *sent,
            (t.end * 24_000.0).round() as usize * 2,
            "piece {}",
            t.index
        );
    }
    // Decoding in windows puts the pieces where decoding whole does.
    let (whole, _, _) = run(
        &s,
        &request(common::sentences(0, 30), false, wav(24_000, 1.0)),
    );
    assert_eq!(report.timeline.pieces, whole.timeline.pieces);
}

#[test]
fn markup_pauses_keep_their_time_before_between_and_after_the_pieces() {
    let s = synth();
    let (report, bytes, _) = run(
        &s,
        &request(
            "[pause:0.5s]One piece here.[pause:1s]And another.[pause:0.25s]".into(),
            true,
            wav(24_000, 1.0),
        ),
    );
    let gaps = check_pieces(&report, 1.0);
    assert_eq!(gaps, [(true, 0.5), (true, 1.0)]);
    let t = &report.timeline;
    assert_eq!((t.pieces[0].start, t.pieces[0].end), (0.5, 2.9));
    assert_eq!((t.pieces[1].start, t.pieces[1].end), (3.9, 6.3));
    // The pause after the text is in the audio's length, after the last piece.
    assert!((t.audio_seconds - 6.55).abs() < EPS, "{}", t.audio_seconds);
    let samples = hound::WavReader::new(std::io::Cursor::new(&bytes))
        .unwrap()
        .len();
    assert_eq!(samples, 157_200);
}

#[test]
fn at_speed_two_pieces_take_half_the_time_and_markup_pauses_their_own() {
    let s = synth();
    let text = format!(
        "{}[pause:1s]{}",
        common::sentences(0, 15),
        common::sentences(15, 15)
    );
    let (report, bytes, _) = run(&s, &request(text, true, wav(24_000, 2.0)));
    let gaps = check_pieces(&report, 2.0);
    // Joins of 0.1 s (the 0.2 s join, sped up with the speech) and one markup pause of 1 s.
    assert!(gaps.contains(&(true, 1.0)), "{gaps:?}");
    assert!(gaps.contains(&(false, 0.1)), "{gaps:?}");
    let t = &report.timeline;
    assert_eq!(t.speed, 2.0);
    assert_eq!((t.pieces[0].start, t.pieces[0].end), (0.0, 1.2));
    assert_eq!(t.audio_seconds, t.pieces.last().unwrap().end);
    // The time-stretch makes about half the samples: within one code of the timeline's end.
    let samples = hound::WavReader::new(std::io::Cursor::new(&bytes))
        .unwrap()
        .len() as f64;
    assert!(
        (samples / 24_000.0 - t.audio_seconds).abs() <= 0.02,
        "{} s of audio, timeline ends at {}",
        samples / 24_000.0,
        t.audio_seconds
    );
}

#[test]
fn resampling_to_48_khz_changes_no_time() {
    let s = synth();
    let text = common::sentences(0, 30);
    let (at24, _, _) = run(&s, &request(text.clone(), false, wav(24_000, 1.0)));
    let (report, bytes, _) = run(&s, &request(text, false, wav(48_000, 1.0)));
    check_pieces(&report, 1.0);
    let t = &report.timeline;
    assert_eq!(t.sample_rate, 48_000);
    assert_eq!(t.pieces, at24.timeline.pieces);
    assert_eq!(t.audio_seconds, at24.timeline.audio_seconds);
    let r = hound::WavReader::new(std::io::Cursor::new(&bytes)).unwrap();
    assert_eq!(r.spec().sample_rate, 48_000);
    let seconds = r.len() as f64 / 48_000.0;
    assert!(
        (seconds - t.audio_seconds).abs() <= 0.02,
        "{seconds} s of audio, timeline ends at {}",
        t.audio_seconds
    );
}

// ---- `say --captions` through the binary. ----

fn say(dir: &Path, captions: &str, text: &str) -> std::process::Output {
    let model = common::model("tiny");
    common::cli(&[
        "say",
        "-q",
        "--model",
        model.to_str().unwrap(),
        "--voice",
        "test",
        "--temperature",
        "0",
        "--no-normalize",
        "--captions",
        dir.join(captions).to_str().unwrap(),
        "-o",
        dir.join("out.wav").to_str().unwrap(),
        text,
    ])
}

/// Milliseconds of an `HH:MM:SS<sep>mmm` time.
fn ms(clock: &str, sep: char) -> u64 {
    let (hms, milli) = clock.split_once(sep).unwrap();
    let p: Vec<u64> = hms.split(':').map(|x| x.parse().unwrap()).collect();
    assert_eq!((p.len(), milli.len()), (3, 3), "{clock}");
    ((p[0] * 60 + p[1]) * 60 + p[2]) * 1000 + milli.parse::<u64>().unwrap()
}

/// The cues of an SRT or VTT file: (start ms, end ms, text lines joined by spaces).
fn cues(text: &str, sep: char) -> Vec<(u64, u64, String)> {
    let mut out = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some((a, b)) = line.split_once(" --> ") else {
            continue;
        };
        let body: Vec<&str> = lines.by_ref().take_while(|l| !l.is_empty()).collect();
        out.push((ms(a, sep), ms(b, sep), body.join(" ")));
    }
    out
}

#[test]
fn say_writes_srt_vtt_and_json_whose_times_agree() {
    let dir = common::tempdir("captions");
    let text = common::sentences(0, 30);
    let o = say(&dir, "c.json", &text);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let doc: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("c.json")).unwrap()).unwrap();
    assert_eq!(doc["words_estimated"], true);
    assert_eq!(doc["sample_rate"], 24_000);
    assert_eq!(doc["speed"], 1.0);
    let pieces = doc["pieces"].as_array().unwrap();
    assert!(pieces.len() > 3, "{}", pieces.len());
    assert_eq!(pieces[0]["start"], 0.0);
    assert_eq!(pieces[0]["end"], 2.4);
    assert_eq!(pieces[0]["codes"], 120);
    assert_eq!(pieces[1]["start"], 2.6);
    let last = pieces.last().unwrap()["end"].as_f64().unwrap();
    assert_eq!(doc["audio_seconds"].as_f64().unwrap(), last);
    let samples = hound::WavReader::open(dir.join("out.wav")).unwrap().len() as f64;
    assert!((samples / 24_000.0 - last).abs() < EPS);
    let words = pieces[0]["words"].as_array().unwrap();
    assert_eq!(words[0]["word"], "Sentence");
    assert_eq!(words[0]["start"], 0.0);
    assert_eq!(words[words.len() - 1]["end"], 2.4);
    let want: Vec<(u64, u64, String)> = pieces
        .iter()
        .map(|p| {
            let t = |k: &str| (p[k].as_f64().unwrap() * 1000.0).round() as u64;
            (t("start"), t("end"), p["text"].as_str().unwrap().to_owned())
        })
        .collect();
    // The same request makes the same audio: the captions' cues are the document's pieces.
    for (name, sep) in [("c.srt", ','), ("c.vtt", '.')] {
        let o = say(&dir, name, &text);
        assert!(o.status.success(), "{name}: {}", common::stderr(&o));
        let file = std::fs::read_to_string(dir.join(name)).unwrap();
        assert_eq!(cues(&file, sep), want, "{name}:\n{file}");
        assert_eq!(
            file.starts_with("WEBVTT\n\n"),
            name.ends_with(".vtt"),
            "{file}"
        );
    }
}

#[test]
fn say_refuses_a_captions_name_of_no_known_format_before_any_work() {
    let dir = common::tempdir("captions-bad");
    // The model does not exist: the captions name is checked first, so that is not the error.
    let o = common::cli(&[
        "say",
        "-q",
        "--model",
        "/nonexistent/model",
        "--voice",
        "test",
        "--captions",
        dir.join("c.txt").to_str().unwrap(),
        "-o",
        dir.join("out.wav").to_str().unwrap(),
        "Hello there.",
    ]);
    let e = common::error_line(&o);
    assert!(
        e.contains("c.txt: unknown captions extension; name the file .srt, .vtt or .json"),
        "{e}"
    );
    assert_ne!(o.status.code(), Some(0));
    let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
    assert!(left.is_empty(), "nothing written: {left:?}");
    // With a real model and a good name it runs.
    let o = say(&dir, "c.srt", "Hello there.");
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(
        std::fs::read_to_string(dir.join("c.srt")).unwrap(),
        "1\n00:00:00,000 --> 00:00:02,400\nHello there.\n"
    );
}
