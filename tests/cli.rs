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

/// On a terminal `say` draws its progress (codes so far, rate against the 50/s line) on stderr;
/// `-q` draws nothing, and the audio is the same.
#[test]
fn say_on_a_terminal_shows_progress_and_quiet_hides_it() {
    let dir = common::tempdir("say-tty");
    let mut wavs = Vec::new();
    for quiet in [false, true] {
        let out = dir.join(format!("{quiet}.wav"));
        let mut cmd = common::clean_command(&common::bin(), &common::repo());
        cmd.args(["say", "--voice", "test", "--seed", "5", "-o"])
            .arg(&out)
            .arg("Hello there.");
        if quiet {
            cmd.arg("-q");
        }
        let o = common::on_terminal(&cmd);
        let text = common::stdout(&o);
        assert!(o.status.success(), "{text}");
        let bars = ["\x1b[2K", "the 50/s line"].map(|s| text.contains(s));
        assert_eq!(bars, [!quiet; 2], "quiet {quiet}: {text:?}");
        wavs.push(std::fs::read(&out).unwrap());
    }
    assert_eq!(wavs[0], wavs[1]);
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

/// The chain package sampled never draws its end token: "hi" ends at its code budget, 140 codes
/// (2.8 s, not the context's 79 s), and the summary and a warning say so.
#[test]
fn say_hi_on_the_test_package_gives_a_few_seconds() {
    let out = common::tempdir("say-hi").join("hi.wav");
    let model = common::model("tiny");
    let o = cli(&[
        "say",
        "-q",
        "--model",
        model.to_str().unwrap(),
        "--voice",
        "test",
        "--seed",
        "3",
        "-o",
        out.to_str().unwrap(),
        "hi",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(wav_len(&out), (24_000, 1, 140 * 480));
    let err = stderr(&o);
    assert!(
        err.contains("2.80 s of audio, 140 codes, finish length"),
        "{err}"
    );
    assert!(
        err.contains("WARN") && err.contains("ended at 140 codes (its text's code budget)"),
        "{err}"
    );
    // The package says its weights are random: `say` passes it on, once, with the way out
    // (issue 54, item 6).
    let notice = "holds random weights (made by tools/gen_models.py, a generated test package): \
                  it makes sound-like audio at the real rates but speaks no words. For the real \
                  model run `onebit-tts models setup`";
    assert_eq!(err.matches(notice).count(), 1, "{err}");
    // A package that claims nothing gets no such word.
    let plain = common::tempdir("say-hi-plain");
    common::copy_dir(&model, &plain);
    std::fs::remove_file(plain.join("onebit_weights.json")).expect("the generator writes it");
    let o = cli(&[
        "say",
        "-q",
        "--model",
        plain.to_str().unwrap(),
        "--voice",
        "test",
        "-o",
        out.to_str().unwrap(),
        "hi",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(!stderr(&o).contains("random weights"), "{}", stderr(&o));
}

/// A long text with a sentence of only emoji: that sentence is skipped with a warning and the rest
/// is spoken; a text of only emoji and symbols is one error line.
#[test]
fn say_skips_an_emoji_only_sentence_and_refuses_an_all_emoji_text() {
    let out = common::tempdir("say-emoji").join("emoji.wav");
    let model = common::model("tiny");
    let sentence = "The river runs slowly past the old stone houses of the valley, where people have watched it for years. ";
    let text = format!("{}😀😀. {}", sentence.repeat(12), sentence.repeat(12));
    let run = |text: &str| {
        cli(&[
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
            text,
        ])
    };
    let o = run(&text);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("skipping \"😀😀.\": nothing to speak in it"),
        "{err}"
    );
    assert!(err.contains("finish stop"), "{err}");
    let (_, _, samples) = wav_len(&out);
    assert!(samples > 2 * 120 * 480, "{samples} samples");

    let line = error_line(&run("😀😀 🎉 ★"));
    assert!(line.contains("nothing speakable"), "{line}");
}

/// `-o` names the format by its extension: an extension that names none is an error listing the
/// formats (nothing is written), `--format` overrides it, and `.raw` is headerless pcm.
#[test]
fn output_extension_must_name_a_format_unless_format_is_given() {
    let dir = common::tempdir("say-ext");
    let model = common::model("tiny");
    let say = |out: &Path, extra: &[&str]| {
        let mut args = vec![
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
        ];
        args.extend_from_slice(extra);
        args.push("Hello world, this is a test.");
        cli(&args)
    };
    let codes = common::expect("tiny")["test_voice_greedy_codes"]
        .as_u64()
        .unwrap() as usize;

    let xyz = dir.join("out.xyz");
    let line = error_line(&say(&xyz, &[]));
    assert!(
        line.contains("out.xyz: unknown output extension \"xyz\"")
            && line.contains("mp3, opus, flac, wav, pcm")
            && line.contains("--format"),
        "{line}"
    );
    assert!(!xyz.exists() && !dir.join("out.xyz.partial").exists());

    let o = say(&xyz, &["--format", "flac"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(&std::fs::read(&xyz).unwrap()[..4], b"fLaC");

    let raw = dir.join("out.RAW");
    let o = say(&raw, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&raw).unwrap().len(), codes * 480 * 2);

    let mp3 = dir.join("out.mp3");
    assert!(say(&mp3, &[]).status.success());
    let head = std::fs::read(&mp3).unwrap();
    assert!(
        head.starts_with(b"ID3") || head[0] == 0xff,
        "an MP3 frame or tag"
    );
}

/// `say` prints its summary and warnings only; `--verbose` or RUST_LOG/ONEBIT_LOG bring the INFO
/// lines back.
#[test]
fn say_logs_warnings_only_unless_asked() {
    let out = common::tempdir("say-log").join("out.wav");
    let model = common::model("tiny");
    let args = |verbose: bool| {
        let mut a = vec![
            "say",
            "--model",
            model.to_str().unwrap(),
            "--voice",
            "test",
            "--temperature",
            "0",
            "-o",
            out.to_str().unwrap(),
        ];
        if verbose {
            a.push("--verbose");
        }
        a.push("Hello world, this is a test.");
        a
    };
    let o = cli(&args(false));
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    // The test package's one warning (its weights are random), then the summary.
    assert_eq!(
        lines.len(),
        2,
        "the package's note and the summary only: {err}"
    );
    assert!(
        lines[0].contains("WARN") && lines[0].contains("holds random weights"),
        "{err}"
    );
    assert!(lines[1].starts_with("wrote "), "{err}");

    for (verbose, env) in [
        (true, None),
        (false, Some(("RUST_LOG", "info"))),
        (false, Some(("ONEBIT_LOG", "info"))),
    ] {
        let env: Vec<(&str, &str)> = env.into_iter().collect();
        let o = common::cli_with(&args(verbose), &env);
        assert!(o.status.success(), "{}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains(" INFO ") && err.contains("ONNX Runtime loaded"),
            "{err}"
        );
    }
}

/// bench reports each run's finish reason (greedy on the chain package every text ends on the end
/// token, so no run is flagged as cut) and the codec sessions it decoded with; none is refused.
#[test]
fn bench_json_reports_each_runs_finish_reason() {
    let o = cli(&[
        "bench",
        "-q",
        "--model",
        "models/tiny",
        "--runs",
        "1",
        "--temperature",
        "0",
        "--codec-sessions",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    let codec = v["codec"].as_str().unwrap();
    assert!(codec.starts_with("2 sessions x "), "{codec}");
    // The report and the log say once that the package speaks no words.
    let note = v["package_note"]
        .as_str()
        .expect("a note for random weights");
    assert!(
        note.starts_with("models/tiny holds random weights (made by tools/gen_models.py"),
        "{note}"
    );
    assert_eq!(stderr(&o).matches("holds random weights").count(), 1);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    for r in runs {
        assert_eq!(r["finish"], "stop", "{r}");
        assert_eq!(r["codes"], 120, "{r}");
    }
    let o = cli(&[
        "bench",
        "-q",
        "--model",
        "models/tiny",
        "--codec-sessions",
        "0",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("--codec-sessions"), "{}", stderr(&o));
}

/// `bench --engine-only --peers` runs onnxruntime-genai's own loop on the same prompts (its
/// greedy tokens equal ours), says why llama.cpp did not run, and refuses a missing GGUF.
#[test]
fn bench_peers_run_onnxruntime_genai_on_the_same_prompts() {
    let base = [
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
        "32,64",
        "--peers",
    ];
    let o = cli(&base);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = common::stdout(&o);
    assert!(
        out.contains("oga decode tok/s") && out.contains("x oga"),
        "{out}"
    );
    assert!(
        out.contains("greedy tokens equal to ours from the start: 4/4, 4/4"),
        "{out}"
    );
    assert!(
        out.contains("llama.cpp peer not run: no models/tiny-q4_0.gguf"),
        "{out}"
    );

    let mut json = base.to_vec();
    json.push("--json");
    let o = cli(&json);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    assert_eq!(
        v["peers"]["onnxruntime_genai"]["greedy_agreement"],
        serde_json::json!([4, 4])
    );
    assert_eq!(v["ours"].as_array().unwrap().len(), 2);
    assert_eq!(v["onnxruntime_genai"].as_array().unwrap().len(), 2);
    assert!(v["llama_cpp"].is_null());

    let mut missing = base.to_vec();
    missing.extend(["--llama-gguf", "target/no-such.gguf"]);
    let err = error_line(&cli(&missing));
    assert!(
        err.contains("--llama-gguf")
            && err.contains("no such file")
            && err.contains("onnx_to_gguf.py"),
        "{err}"
    );
}

/// `bench --peers` on whole synthesis runs the vendor's streaming pipeline after ours on the same
/// cases. Its venv is a stand-in here (CI does not install neutts): through ONEBIT_HOME the bench
/// finds a "python" that gives the command line the bench built to the real
/// benches/peers/neutts_stream.py with --dry-run (which checks the arguments, files and cases and
/// prints its plan, loading nothing), then answers each planned case with fixed numbers.
#[test]
fn bench_peers_run_the_vendors_streaming_pipeline_after_ours() {
    let work = std::env::temp_dir().join(format!("onebit-cli-vendor-{}", std::process::id()));
    let home = work.join("home");
    std::fs::create_dir_all(home.join("neutts-peer/venv/bin")).unwrap();
    let python = common::repo().join(".onebit/venv/bin/python");
    assert!(
        python.exists(),
        "scripts/setup.sh makes {}",
        python.display()
    );
    let plan_path = work.join("plan.json");
    let stub = home.join("neutts-peer/venv/bin/python");
    std::fs::write(
        &stub,
        format!(
            r#"#!/bin/sh
'{py}' "$@" --dry-run > '{plan}' || exit $?
exec '{py}' - '{plan}' <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
s = lambda m: {{"median": m, "min": m - 1, "max": m + 1}}
for c in plan["cases"]:
    voice = 30 if plan["prompt_cache"] == "voice" else 0
    print(json.dumps({{"case": c["case"], "text": c["text"], "prompt_tokens": 7, "voice_tokens": voice,
        "codes": c["max_codes"],
        "first_audio_ms": s(100.0), "rtf": s(2.0), "stall_ms": s(0.0), "first_code_ms": s(50.0),
        "codec_ms": s(10.0), "last_codes": list(range(c["max_codes"])),
        "settings": {{"neutts": "stand-in", "llama_cpp_python": "none"}}}}))
PY
"#,
            py = python.display(),
            plan = plan_path.display()
        ),
    )
    .unwrap();
    let mut perm = std::fs::metadata(&stub).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&stub, perm).unwrap();
    // Only looked for: the stand-in never opens it.
    let gguf = work.join("stand-in.gguf");
    std::fs::write(&gguf, "").unwrap();
    let gguf_arg = gguf.to_str().unwrap();
    let home_env = [("ONEBIT_HOME", home.to_str().unwrap())];
    let base = [
        "bench",
        "-q",
        "--model",
        "models/tiny",
        "--runs",
        "1",
        "--temperature",
        "0",
        "--threads",
        "1",
        "--peers",
        "--llama-gguf",
        gguf_arg,
    ];
    let o = common::cli_with(&base, &home_env);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = common::stdout(&o);
    let block: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.starts_with("the vendor's streaming pipeline (peer)"))
        .collect();
    assert_eq!(
        block.first().copied(),
        Some(
            "the vendor's streaming pipeline (peer): neutts stand-in on llama-cpp-python none, 1 decode threads"
        ),
        "{out}"
    );
    assert_eq!(
        block[1],
        format!("  GGUF {gguf_arg}, codec models/tiny/codec/model.onnx (its ONNX class)")
    );
    assert!(block[3].starts_with("case    voice"), "{out}");
    // Our prompts on models/tiny are 151 / 220 / 323 tokens; the stand-in says 7, and its codes
    // 0, 1, 2, ... equal ours from the start as far as ours count up from 0 (greedy: compared).
    // Each of its runs started with 30 tokens of the voice in context (the voice-prefix cache is
    // on in ours: `--prompt-cache voice`); ours found them cached from the second request on.
    // (The cells; the unit test checks the columns' layout.)
    let mut agreed = Vec::new();
    for (row, (case, ours, cached)) in block[4..].iter().zip([
        ("short", 151, "30 (ours 0)"),
        ("medium", 220, "30"),
        ("long", 323, "30"),
    ]) {
        let head = format!("{case} test 7 (ours {ours}) {cached} 120");
        let cells: Vec<&str> = row.split_whitespace().collect();
        let at = head.split_whitespace().count();
        let tail = cells[at + 1..].join(" ");
        assert_eq!(cells[..at].join(" "), head, "{out}");
        assert!(
            tail.starts_with("100 [99–101] 2.000 [1.000–3.000] 0 [-1–1] 50 [49–51] 10 [9–11] "),
            "{out}"
        );
        let n = cells[at]
            .strip_suffix("/120")
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("codes = ours cell {:?}: {out}", cells[at]));
        assert!(n <= 120, "{out}");
        agreed.push(n);
    }
    assert_eq!(block.len(), 7, "{out}");
    // What the real script read from the bench's command line.
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    assert_eq!(plan["gguf"], gguf_arg);
    assert_eq!(plan["codec"], "models/tiny/codec/model.onnx");
    assert!(
        plan["voice"]
            .as_str()
            .unwrap()
            .ends_with("voices/test.json"),
        "{plan}"
    );
    assert_eq!(plan["reference_codes"], 100);
    assert_eq!(plan["language"], "en-us");
    assert_eq!(plan["threads"], 1);
    assert_eq!((&plan["warmup"], &plan["runs"]), (&1.into(), &1.into()));
    assert_eq!(plan["temperature"], 0.0);
    assert_eq!(plan["prompt_cache"], "voice");
    let cases: Vec<(&str, u64)> = plan["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["case"].as_str().unwrap(),
                c["max_codes"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(cases, [("short", 120), ("medium", 120), ("long", 120)]);
    assert_eq!(plan["cases"][0]["text"], "Hello, and welcome to the show.");

    let mut json = base.to_vec();
    json.push("--json");
    let o = common::cli_with(&json, &home_env);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    let vendor = &v["vendor"];
    assert_eq!(vendor["version"], "neutts stand-in");
    assert_eq!(vendor["threads"], 1);
    assert_eq!(vendor["cases"].as_array().unwrap().len(), 3);
    assert_eq!(vendor["cases"][2]["case"], "long");
    assert_eq!(vendor["cases"][2]["codes"], 120);
    // Greedy both times: the same comparison as the table's.
    let json_agreed: Vec<u64> = vendor["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["codes_as_ours"].as_u64().unwrap())
        .collect();
    assert_eq!(json_agreed, agreed);
    assert_eq!(
        vendor["cases"][2]["first_audio_ms"],
        serde_json::json!({"median": 100.0, "min": 99.0, "max": 101.0})
    );
    assert!(v["vendor_note"].is_null());

    // Without our cache, the vendor's runs start from an empty context too, and neither side
    // reused a token.
    let mut cold = json.clone();
    cold.extend(["--prefix-cache-mib", "0"]);
    let o = common::cli_with(&cold, &home_env);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).unwrap()).unwrap();
    assert_eq!(plan["prompt_cache"], "none");
    for i in 0..3 {
        assert_eq!(v["vendor"]["cases"][i]["cached_tokens"], 0, "{v}");
        assert_eq!(v["cases"][i]["cached_tokens"]["median"], 0.0, "{v}");
    }

    // No GGUF: our runs and a note on how to add it.
    let o = common::cli_with(&base[..base.len() - 2], &home_env);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        common::stdout(&o).contains(
            "the vendor's streaming pipeline (peer) not run: no models/tiny-q4_0.gguf (and no --llama-gguf)"
        ),
        "{}",
        common::stdout(&o)
    );
    // Several requests at once have no peer.
    let mut load = base.to_vec();
    load.extend(["--concurrency", "1"]);
    let e = stderr(&cli(&load));
    assert!(
        e.contains("'--peers' cannot be used with '--concurrency"),
        "{e}"
    );
    std::fs::remove_dir_all(&work).unwrap();
}

/// `bench --engine-only --also-model` runs our loop on a second package of the same model in the
/// same run and table: here the GGUF conversion of models/tiny under the llama engine, whose
/// greedy codes equal ONNX Runtime's on this package.
#[cfg(feature = "llama")]
#[test]
fn bench_runs_both_engines_in_one_table() {
    let base = [
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
        "32,64",
        "--also-model",
        "models/tiny-gguf",
    ];
    let o = cli(&base);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = common::stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("engine ort: "), "{out}");
    assert!(lines[1] == "device ort: cpu", "{out}");
    assert!(lines[2].starts_with("engine llama: llama.cpp "), "{out}");
    assert!(lines[3] == "device llama: cpu", "{out}");
    let head = lines.iter().find(|l| l.contains("prefill ms")).unwrap();
    assert!(
        head.trim_start().starts_with("engine") && head.contains("x ort"),
        "{out}"
    );
    for (engine, prompt) in [
        ("ort", "32"),
        ("ort", "64"),
        ("llama", "32"),
        ("llama", "64"),
    ] {
        assert!(
            lines.iter().any(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells.first() == Some(&engine) && cells.get(1) == Some(&prompt)
            }),
            "no {engine} row at {prompt} tokens: {out}"
        );
    }
    assert!(
        out.contains("llama: greedy tokens equal to ort's from the start: 4/4, 4/4"),
        "{out}"
    );

    let mut json = base.to_vec();
    json.push("--json");
    let o = cli(&json);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&common::stdout(&o)).unwrap();
    assert_eq!(v["label"], "ort");
    assert_eq!(v["also"][0]["label"], "llama");
    assert_eq!(v["also"][0]["device"], "cpu");
    assert_eq!(v["also"][0]["ours"].as_array().unwrap().len(), 2);
    assert_eq!(v["also"][0]["greedy_agreement"], serde_json::json!([4, 4]));

    // Only for --engine-only (clap names the missing flag on the line after its error line).
    let o = cli(&["bench", "--also-model", "models/tiny-gguf"]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("required arguments were not provided") && e.contains("--engine-only"),
        "{e}"
    );
}

/// `voices import --model` measures a reference by the exact prompt the model's front end builds
/// for it: one token per code plus its transcript and the prompt frame, refused exactly where it
/// leaves fewer than 50 of the 4096 context tokens for new codes.
#[test]
fn voices_import_checks_the_reference_against_the_exact_prompt() {
    let dir = common::tempdir("voices-budget");
    let import = |name: &str, codes: usize| {
        let path = dir.join(format!("{name}.json"));
        let list: Vec<usize> = (0..codes).collect();
        std::fs::write(&path, serde_json::to_string(&list).unwrap()).unwrap();
        cli(&[
            "voices",
            "import",
            path.to_str().unwrap(),
            "--text",
            "Hello there, this is my voice.",
            "--model",
            "models/tiny",
            "--dir",
            dir.join("store").to_str().unwrap(),
        ])
    };
    let err = error_line(&import("big", 4100));
    let needed: usize = err
        .split("takes ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no token count in {err}"));
    assert!(err.contains("4096-token context"), "{err}");
    let frame = needed - 4100;
    assert!(frame > 0 && frame < 100, "{err}");
    // Exactly at the limit: the reference plus 50 new codes fill the context.
    let fits = 4096 - 50 - frame;
    let o = import("edge", fits);
    assert!(o.status.success(), "{}", stderr(&o));
    let err = error_line(&import("over", fits + 1));
    assert!(
        err.contains(&format!("takes {} prompt tokens", 4096 - 50 + 1)),
        "{err}"
    );
    assert!(!dir.join("store").join("over.json").exists());
}
