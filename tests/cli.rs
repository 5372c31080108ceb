//! The `onebit-tts` binary end to end: real child processes on the generated package.

mod common;

use std::path::Path;

use common::{cli, error_line, stderr};

fn wav_len(path: &Path) -> (u32, u32, usize) {
    let r = hound::WavReader::open(path).unwrap();
    let s = r.spec();
    (s.sample_rate, u32::from(s.channels), r.len() as usize)
}

#[test]
fn say_writes_a_wav_of_480_samples_per_code() {
    let exp = common::expect("tiny");
    let out = common::tempdir("say").join("out.wav");
    let model = common::model("tiny");
    let o = cli(&[
        "say",
        "-q",
        "--model",
        model.to_str().unwrap(),
        "--voice",
        "test",
        "--temperature",
        "0",
        "-o",
        out.to_str().unwrap(),
        "Hello world, this is a test.",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let codes = exp["test_voice_greedy_codes"].as_u64().unwrap() as usize;
    assert_eq!(wav_len(&out), (24_000, 1, codes * 480));
    let err = stderr(&o);
    assert!(
        err.contains(&format!("{codes} codes")) && err.contains("codes/s") && err.contains("RTF"),
        "{err}"
    );
}

#[test]
fn sampled_say_length_matches_its_reported_codes() {
    let out = common::tempdir("say-sampled").join("out.wav");
    let model = common::model("tiny-random");
    let o = cli(&[
        "say",
        "--model",
        model.to_str().unwrap(),
        "--voice",
        "test",
        "--seed",
        "5",
        "--max-new-tokens",
        "77",
        "-o",
        out.to_str().unwrap(),
        "Sampling run.",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let codes: usize = err
        .split(" codes,")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no code count in {err}"));
    assert!(codes > 0 && codes <= 77);
    assert_eq!(wav_len(&out).2, codes * 480);
}

#[test]
fn unknown_voice_lists_the_known_ones() {
    let model = common::model("tiny");
    let o = cli(&[
        "say",
        "-q",
        "--model",
        model.to_str().unwrap(),
        "--voice",
        "nobody",
        "hi",
    ]);
    let line = error_line(&o);
    assert!(
        line.contains("unknown voice \"nobody\"") && line.contains("test"),
        "{line}"
    );
}

#[test]
fn empty_text_is_refused() {
    let model = common::model("tiny");
    for text in ["", "   \n\t "] {
        let o = cli(&[
            "say",
            "-q",
            "--model",
            model.to_str().unwrap(),
            "--voice",
            "test",
            text,
        ]);
        let line = error_line(&o);
        assert!(line.contains("empty"), "{line}");
    }
}

#[test]
fn broken_packages_are_one_line_errors() {
    let dir = common::tempdir("cli-broken");
    common::copy_dir(&common::model("tiny"), &dir);
    std::fs::write(dir.join("genai_config.json"), "not json").unwrap();
    let o = cli(&[
        "say",
        "-q",
        "--model",
        dir.to_str().unwrap(),
        "--voice",
        "test",
        "hi",
    ]);
    assert!(error_line(&o).contains("genai_config.json"));
    let o = cli(&["models", "check", dir.to_str().unwrap()]);
    assert!(error_line(&o).contains("not valid JSON"));
    let missing = dir.join("nope");
    let o = cli(&[
        "say",
        "-q",
        "--model",
        missing.to_str().unwrap(),
        "--voice",
        "test",
        "hi",
    ]);
    assert!(error_line(&o).contains("missing"));
}

#[test]
fn models_check_prints_the_summary() {
    let model = common::model("tiny");
    let o = cli(&["models", "check", model.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(
        s.contains("speech ids") && s.contains("65536 codes") && s.contains("24000 Hz"),
        "{s}"
    );
}

/// `bench --engine-only` names the thread plan its sessions got: the tuned policy's (an explicit
/// count, spinning only inside runs, or not at all with --spin off) or ONNX Runtime's own.
#[test]
fn bench_names_the_thread_plan_it_ran_with() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "-q",
            "--model",
            "models/tiny",
            "--engine-only",
            "--runs",
            "1",
            "--new-tokens",
            "4",
            "--prompt-lens",
            "32",
        ];
        args.extend_from_slice(extra);
        let o = cli(&args);
        assert!(o.status.success(), "bench {extra:?}: {}", stderr(&o));
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        out.lines().next().unwrap_or_default().to_owned()
    };
    let tuned = run(&["--threads", "1"]);
    assert!(
        tuned.ends_with("; 1 threads, spinning in runs, unpinned)"),
        "{tuned}"
    );
    let quiet = run(&["--threads", "1", "--spin", "off"]);
    assert!(
        quiet.ends_with("; 1 threads, spinning off, unpinned)"),
        "{quiet}"
    );
    let ort = run(&["--thread-policy", "ort"]);
    assert!(
        ort.ends_with("; ORT-default threads, spinning ORT-default, unpinned)"),
        "{ort}"
    );
    let bad = error_line(&cli(&["bench", "--thread-policy", "fast"]));
    assert!(bad.contains("unknown thread policy \"fast\""), "{bad}");
}

/// The shipped voices are listed with their language and licence.
#[test]
fn voices_list_shows_language_and_licence() {
    let o = cli(&["voices", "list"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = common::stdout(&o);
    let line = |name: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not listed: {out}"))
            .to_owned()
    };
    for (name, lang) in [("dave", "en-us"), ("greta", "de"), ("juliette", "fr-fr")] {
        let l = line(name);
        assert!(
            l.contains(&format!(" {lang} "))
                && l.contains("NeuTTS Open License v1.0 (samples/LICENSE)"),
            "{l}"
        );
    }
    assert!(line("emily").contains("NeuTTS Open License v1.0"));
    assert!(line("test").contains("CC0, generated"));
}
