//! `models optimize` on the generated packages: each lever alone and both give the same codes as the
//! original head (greedy and seeded sampling), the logits have the promised shape, external data is
//! handled, and bad inputs get clear errors.

mod common;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use onebit_tts::engine::{
    self, Backbone, CancelToken, Candidates, GenerationParams, KvMode, LogitsLayout, OrtBackbone,
    OrtOptions, SamplingParams, StopReason,
};
use onebit_tts::package::optimize::{self, Levers, OptimizeError};
use onebit_tts::package::{LOGITS_MANIFEST, LogitsManifest, ModelPackage, SPEECH_CODES};
use onnx_protobuf::Message;

const LAST: Levers = Levers {
    last_position: true,
    speech_head: false,
};
const SPEECH: Levers = Levers {
    last_position: false,
    speech_head: true,
};
const BOTH: Levers = Levers {
    last_position: true,
    speech_head: true,
};

fn load(dir: &Path, kv: KvMode) -> (ModelPackage, OrtBackbone) {
    common::load_ort(dir, kv)
}

fn candidates(pkg: &ModelPackage) -> Candidates {
    Candidates::of(pkg)
}

/// Optimizes `model` with `levers` into a fresh directory.
fn optimized(model: &str, levers: Levers) -> PathBuf {
    // Tests run in parallel threads of one process: each call gets its own directory.
    static N: AtomicUsize = AtomicUsize::new(0);
    let tag = format!(
        "optimize-{model}-{}{}-{}",
        if levers.last_position { "L" } else { "" },
        if levers.speech_head { "S" } else { "" },
        N.fetch_add(1, Ordering::Relaxed)
    );
    let dst = common::tempdir(&tag).join("pkg");
    optimize::optimize(&common::model(model), &dst, levers).unwrap();
    dst
}

/// The shared prompt shapes plus a one-code reference.
fn prompts(pkg: &ModelPackage) -> Vec<Vec<u32>> {
    common::speech_prompts(pkg, &[(1, 150), (5, 1000), (40, 20_000), (300, 65_400)])
}

fn run(
    b: &mut dyn Backbone,
    c: &Candidates,
    prompt: &[u32],
    p: &GenerationParams,
) -> (Vec<u32>, StopReason) {
    let g = engine::generate(b, c, prompt, p, &CancelToken::new(), &mut |_| {
        ControlFlow::Continue(())
    })
    .unwrap();
    (g.codes, g.stop)
}

fn greedy(max_new: usize) -> GenerationParams {
    GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: 0,
        max_new_tokens: Some(max_new),
    }
}

fn sampled(seed: u64, top_k: usize, top_p: f32) -> GenerationParams {
    GenerationParams {
        sampling: SamplingParams {
            temperature: 1.0,
            top_k,
            top_p,
            seed: Some(seed),
        },
        min_new_tokens: 10,
        max_new_tokens: Some(80),
    }
}

/// Every (params, prompt) on the original and on each optimized package, compared.
fn assert_same_codes(model: &str, params: &[GenerationParams], kvs: &[KvMode]) {
    let (pkg, _) = load(&common::model(model), KvMode::Growing);
    let c = candidates(&pkg);
    let ps = prompts(&pkg);
    for &kv in kvs {
        let (_, mut base) = load(&common::model(model), kv);
        let want: Vec<Vec<_>> = params
            .iter()
            .map(|p| ps.iter().map(|q| run(&mut base, &c, q, p)).collect())
            .collect();
        for levers in [LAST, SPEECH, BOTH] {
            let dir = optimized(model, levers);
            let (opkg, mut b) = load(&dir, kv);
            assert_eq!(candidates(&opkg).stop_ids, c.stop_ids);
            let mut steps = 0;
            for (p, want) in params.iter().zip(&want) {
                for (q, w) in ps.iter().zip(want) {
                    let got = run(&mut b, &c, q, p);
                    assert_eq!(
                        &got,
                        w,
                        "{model} {levers:?} {kv:?} {:?}, prompt of {} tokens",
                        p.sampling,
                        q.len()
                    );
                    steps += got.0.len();
                }
            }
            assert!(steps >= 100, "the comparison must cover many steps");
        }
    }
}

#[test]
fn greedy_codes_are_the_same_with_each_lever_and_both() {
    for model in ["tiny", "tiny-textbias"] {
        assert_same_codes(model, &[greedy(120)], &[KvMode::Growing]);
    }
    // Last-position logits with the shared KV buffer (logits bound to an output buffer).
    assert_same_codes(
        "tiny-random",
        &[greedy(120)],
        &[KvMode::Growing, KvMode::Shared],
    );
}

#[test]
fn chain_model_still_gives_its_predicted_codes() {
    let exp = common::expect("tiny");
    let end_after = exp["end_after_code"].as_u64().unwrap() as u32;
    let (pkg, mut b) = load(&optimized("tiny", BOTH), KvMode::Growing);
    let c = candidates(&pkg);
    let prompt = vec![pkg.vocab.generation_start, pkg.vocab.code_to_id(150)];
    let (codes, stop) = run(&mut b, &c, &prompt, &greedy(1000));
    assert_eq!(codes, (151..=end_after).collect::<Vec<_>>());
    assert_eq!(stop, StopReason::Stop(pkg.vocab.end));
}

#[test]
fn sampled_codes_with_a_fixed_seed_are_the_same() {
    let params = [
        sampled(7, 50, 1.0),
        sampled(8, 0, 0.9),
        sampled(9, 1000, 1.0),
    ];
    for model in ["tiny", "tiny-random"] {
        assert_same_codes(model, &params, &[KvMode::Growing]);
    }
}

#[test]
fn logits_have_the_promised_width_and_values() {
    let (pkg, mut full) = load(&common::model("tiny-random"), KvMode::Growing);
    let vocab = pkg.genai.model.vocab_size;
    let prompt = &prompts(&pkg)[2];
    let want = full.append(prompt).unwrap().to_vec();
    assert_eq!(want.len(), vocab);
    assert_eq!(full.logits_layout(), LogitsLayout::Full);
    for levers in [LAST, SPEECH, BOTH] {
        let (opkg, mut b) = load(&optimized("tiny-random", levers), KvMode::Growing);
        let layout = b.logits_layout();
        let got = b.append(prompt).unwrap().to_vec();
        let width = if levers.speech_head {
            SPEECH_CODES as usize + opkg.stop_ids.len()
        } else {
            vocab
        };
        assert_eq!(got.len(), width, "{levers:?}");
        assert_eq!(opkg.logits.last_position_only, levers.last_position);
        let mut worst = 0f32;
        for (pos, &v) in got.iter().enumerate() {
            let id = match &layout {
                LogitsLayout::Full => pos,
                LogitsLayout::Speech(h) => h.id_at(pos).unwrap() as usize,
            };
            worst = worst.max((v - want[id]).abs());
        }
        assert!(worst <= 1e-4, "{levers:?}: logits differ by {worst}");
        if let LogitsLayout::Speech(h) = &layout {
            assert_eq!(h.speech_first_id, pkg.vocab.first);
            assert_eq!(h.speech_count, SPEECH_CODES);
            assert_eq!(h.extra_ids, pkg.stop_ids);
        } else {
            assert!(!levers.speech_head);
        }
    }
}

#[test]
fn the_cli_optimizes_and_check_reports_the_levers() {
    let base = common::tempdir("optimize-cli");
    let run_cli = |args: &[&str]| {
        let out = Command::new(common::bin()).args(args).output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let src = common::model("tiny");
    let cases: [(&str, &[&str], &str, &str); 3] = [
        (
            "both",
            &[],
            "speech-only head (65539 wide",
            "last position only",
        ),
        (
            "last",
            &["--no-speech-head"],
            "full head (66304 wide",
            "last position only",
        ),
        (
            "speech",
            &["--no-last-position"],
            "speech-only head",
            "every position",
        ),
    ];
    for (name, flags, head, pos) in cases {
        let dst = base.join(name);
        let mut args = vec![
            "models",
            "optimize",
            src.to_str().unwrap(),
            dst.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let (ok, out, err) = run_cli(&args);
        assert!(ok, "{name}: {err}");
        assert!(out.contains(head) && out.contains(pos), "{name}: {out}");
        let (ok, out, err) = run_cli(&["models", "check", dst.to_str().unwrap()]);
        assert!(ok, "{name}: {err}");
        assert!(
            out.contains(&format!("logits       {head}")) && out.contains(pos),
            "{name}: {out}"
        );
        if name != "speech" {
            assert!(out.contains("input cut to the last position"), "{out}");
        }
        let m: LogitsManifest =
            serde_json::from_str(&std::fs::read_to_string(dst.join(LOGITS_MANIFEST)).unwrap())
                .unwrap();
        assert_eq!(m.speech_head.is_some(), name != "last");
        // The rest of the package came along.
        for f in [
            "genai_config.json",
            "tokenizer.json",
            "config.json",
            "codec/model.onnx",
        ] {
            assert!(dst.join(f).is_file(), "{name}: {f}");
        }
    }
    // The original reports its full head.
    let (ok, out, _) = run_cli(&["models", "check", src.to_str().unwrap()]);
    assert!(ok && out.contains("full head (66304 wide, index = token id), every position"));
    assert!(out.contains("lm_head      MatMulNBits"), "{out}");
    // Refusals are one clear line and a failure exit.
    let (ok, _, err) = run_cli(&[
        "models",
        "optimize",
        "models/no-such-package",
        base.join("x").to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("no-such-package") && err.contains("missing"),
        "{err}"
    );
    let (ok, _, err) = run_cli(&[
        "models",
        "optimize",
        src.to_str().unwrap(),
        base.join("y").to_str().unwrap(),
        "--no-speech-head",
        "--no-last-position",
    ]);
    assert!(!ok && err.contains("nothing to do"), "{err}");
    assert!(!base.join("y").exists());
}

/// Rewrites a package's decoder so every initializer lives in `model.onnx.data`.
fn to_external_data(dir: &Path) {
    use onnx_protobuf::tensor_proto::DataLocation;
    use onnx_protobuf::{ModelProto, StringStringEntryProto};
    let path = dir.join("model.onnx");
    let mut model = ModelProto::parse_from_bytes(&std::fs::read(&path).unwrap()).unwrap();
    let mut data = Vec::new();
    for t in model.graph.as_mut().unwrap().initializer.iter_mut() {
        if t.raw_data.len() < 64 {
            continue;
        }
        // Unaligned offsets on purpose: the reader must not assume alignment.
        data.extend_from_slice(&[0u8; 3]);
        let offset = data.len();
        data.extend_from_slice(&t.raw_data);
        let entry = |k: &str, v: String| {
            let mut e = StringStringEntryProto::new();
            e.key = k.into();
            e.value = v;
            e
        };
        t.external_data = vec![
            entry("location", "model.onnx.data".into()),
            entry("offset", offset.to_string()),
            entry("length", t.raw_data.len().to_string()),
        ];
        t.raw_data.clear();
        t.data_location = DataLocation::EXTERNAL.into();
    }
    std::fs::write(dir.join("model.onnx.data"), data).unwrap();
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
}

#[test]
fn external_data_packages_are_read_by_offset_and_the_head_written_beside() {
    let base = common::tempdir("optimize-external");
    let src = base.join("src");
    common::copy_dir(&common::model("tiny-random"), &src);
    to_external_data(&src);
    let dst = base.join("dst");
    let report = optimize::optimize(&src, &dst, BOTH).unwrap();
    let ext = report
        .external
        .clone()
        .expect("the head's tensors were external");
    assert_eq!(ext, dst.join("model.onnx.onebit.data"));
    assert!(dst.join("model.onnx.data").is_file());
    // Only the cut rows: 65,539 rows of (2 blocks x 16 bytes + 2 scales x 4 bytes), aligned.
    let rows = SPEECH_CODES as u64 + 3;
    assert_eq!(report.head_bytes_after, rows * (32 + 8));
    assert!(std::fs::metadata(&ext).unwrap().len() >= report.head_bytes_after);
    assert!(std::fs::metadata(&report.decoder).unwrap().len() < 100_000);

    let (pkg, mut a) = load(&src, KvMode::Growing);
    let (_, mut b) = load(&dst, KvMode::Growing);
    let (_, mut inline) = load(&common::model("tiny-random"), KvMode::Growing);
    let c = candidates(&pkg);
    for q in prompts(&pkg) {
        let want = run(&mut inline, &c, &q, &greedy(60));
        assert_eq!(run(&mut a, &c, &q, &greedy(60)), want);
        assert_eq!(run(&mut b, &c, &q, &greedy(60)), want);
    }
}

fn optimize_err(src: &Path, dst: &Path, levers: Levers) -> String {
    match optimize::optimize(src, dst, levers) {
        Ok(_) => panic!("{} optimized although it should not", src.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_inputs_get_clear_errors() {
    let base = common::tempdir("optimize-bad");

    // An unknown path.
    let e = optimize_err(&base.join("nope"), &base.join("out"), BOTH);
    assert!(e.contains("nope") && e.contains("missing"), "{e}");

    // A head that is a plain MatMul.
    let matmul = base.join("matmul");
    common::copy_dir(&common::model("tiny"), &matmul);
    let path = matmul.join("model.onnx");
    let mut model =
        onnx_protobuf::ModelProto::parse_from_bytes(&std::fs::read(&path).unwrap()).unwrap();
    let g = model.graph.as_mut().unwrap();
    let head = g
        .node
        .iter_mut()
        .find(|n| n.output.iter().any(|o| o == "logits"))
        .unwrap();
    head.op_type = "MatMul".into();
    head.domain.clear();
    head.input.truncate(2);
    head.attribute.clear();
    std::fs::write(&path, model.write_to_bytes().unwrap()).unwrap();
    for levers in [LAST, SPEECH, BOTH] {
        let e = optimize_err(&matmul, &base.join("out"), levers);
        assert!(
            e.contains("MatMul node") && e.contains("not a com.microsoft MatMulNBits lm_head"),
            "{e}"
        );
        assert!(!base.join("out").exists(), "a failed run leaves nothing");
    }

    // A file that is not ONNX.
    let garbage = base.join("garbage");
    common::copy_dir(&common::model("tiny"), &garbage);
    std::fs::write(garbage.join("model.onnx"), b"not a model").unwrap();
    let e = optimize_err(&garbage, &base.join("out"), BOTH);
    assert!(e.contains("not an ONNX model"), "{e}");

    // An already optimized package, and a destination that exists.
    let done = base.join("done");
    optimize::optimize(&common::model("tiny"), &done, SPEECH).unwrap();
    let e = optimize_err(&done, &base.join("out"), LAST);
    assert!(e.contains("already optimized"), "{e}");
    let e = optimize_err(&common::model("tiny"), &done, BOTH);
    assert!(e.contains("already exists"), "{e}");
    assert!(matches!(
        optimize::optimize(&common::model("tiny"), &done, BOTH),
        Err(OptimizeError::Usage(_))
    ));

    // A manifest that does not match the graph: the engine refuses to load it.
    let liar = base.join("liar");
    common::copy_dir(&common::model("tiny"), &liar);
    std::fs::copy(done.join(LOGITS_MANIFEST), liar.join(LOGITS_MANIFEST)).unwrap();
    let pkg = ModelPackage::load(&liar, None).unwrap();
    let env = onebit_tts::runtime::environment(None).unwrap();
    let e = OrtBackbone::load(env, &pkg, &OrtOptions::default())
        .err()
        .expect("a head of the wrong width")
        .to_string();
    assert!(e.contains("66304 wide") && e.contains("65539"), "{e}");

    // A manifest whose head misses a stop id: the package refuses to load.
    let mut m: LogitsManifest =
        serde_json::from_str(&std::fs::read_to_string(done.join(LOGITS_MANIFEST)).unwrap())
            .unwrap();
    m.speech_head.as_mut().unwrap().extra_ids.pop();
    std::fs::write(
        liar.join(LOGITS_MANIFEST),
        serde_json::to_string(&m).unwrap(),
    )
    .unwrap();
    let e = ModelPackage::load(&liar, None).unwrap_err().to_string();
    assert!(e.contains("has no row in the speech head"), "{e}");
}

/// onnxruntime-genai's greedy ids for `prompts` on the package in `dir`, or its error text.
fn oga(dir: &Path, prompts: &[Vec<u32>], stops: &[u32]) -> Result<Vec<Vec<u32>>, String> {
    let py = common::repo().join(".onebit/venv/bin/python");
    assert!(
        py.exists(),
        "run scripts/setup.sh (installs onnxruntime-genai into .onebit/venv)"
    );
    let mut child = Command::new(py)
        .arg(common::repo().join("tests/python/oga_generate.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let req =
        serde_json::json!({"model": dir, "prompts": prompts, "max_new": 60, "stop_ids": stops});
    serde_json::to_writer(child.stdin.take().unwrap(), &req).unwrap();
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    Ok(serde_json::from_value(v["outputs"].clone()).unwrap())
}

#[test]
fn onnxruntime_genai_runs_the_last_position_package_but_not_the_speech_head() {
    let (pkg, _) = load(&common::model("tiny-random"), KvMode::Growing);
    let ps = prompts(&pkg);
    let want = oga(&common::model("tiny-random"), &ps, &pkg.stop_ids).unwrap();
    let got = oga(&optimized("tiny-random", LAST), &ps, &pkg.stop_ids).unwrap();
    assert_eq!(got, want, "OGA handles [1, 1, V] logits in prefill");
    // OGA samples by row index = token id over vocab_size rows: a compact head is ours alone.
    let err = oga(&optimized("tiny-random", SPEECH), &ps, &pkg.stop_ids).unwrap_err();
    assert!(err.contains("logits"), "{err}");
}

#[test]
fn say_on_the_optimized_package_writes_the_same_audio() {
    // The whole pipeline (front end, Synthesizer candidates, engine, codec): seeded sampling on
    // tiny-random, original vs both levers, byte for byte.
    let base = common::tempdir("optimize-say");
    let both = optimized("tiny-random", BOTH);
    let mut wavs = Vec::new();
    for (i, model) in [common::model("tiny-random"), both].iter().enumerate() {
        let out = base.join(format!("{i}.wav"));
        let o = Command::new(common::bin())
            .args(["say", "-q", "--model"])
            .arg(model)
            .args([
                "--voice",
                "test",
                "--seed",
                "11",
                "--max-new-tokens",
                "90",
                "-o",
            ])
            .arg(&out)
            .arg("Sampling the same take twice.")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        wavs.push(std::fs::read(&out).unwrap());
    }
    assert!(wavs[0].len() > 44 + 480 * 2 * 10, "some audio");
    assert!(
        wavs[0] == wavs[1],
        "the optimized package changed the audio"
    );
}

/// `--engine oga` on optimized packages: the last-position lever it runs (same audio as on the
/// source), a speech-only head it refuses before loading, in one line naming the manifest and
/// the source package.
#[test]
fn the_oga_engine_runs_last_position_packages_and_refuses_a_speech_head() {
    let base = common::tempdir("optimize-oga-say");
    let say = |model: &Path, out: &Path| {
        Command::new(common::bin())
            .args(["say", "-q", "--engine", "oga", "--model"])
            .arg(model)
            .args([
                "--voice",
                "test",
                "--seed",
                "5",
                "--max-new-tokens",
                "60",
                "-o",
            ])
            .arg(out)
            .arg("Sampling the same take twice.")
            .output()
            .unwrap()
    };
    let src = common::model("tiny-random");
    let last = optimized("tiny-random", LAST);
    let mut wavs = Vec::new();
    for (i, model) in [&src, &last].into_iter().enumerate() {
        let out = base.join(format!("{i}.wav"));
        let o = say(model, &out);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        wavs.push(std::fs::read(&out).unwrap());
    }
    assert!(wavs[0].len() > 44, "some audio");
    assert_eq!(wavs[0], wavs[1], "same take on the last-position package");

    let both = optimized("tiny-random", BOTH);
    let out = base.join("refused.wav");
    let o = say(&both, &out);
    let line = common::error_line(&o);
    assert!(
        line.contains("--engine oga cannot run this package"),
        "{line}"
    );
    assert!(
        line.contains(&both.join("onebit_logits.json").display().to_string()),
        "{line}"
    );
    assert!(line.contains(&src.display().to_string()), "{line}");
    assert!(
        !line.contains("OgaGenerator"),
        "refused before loading: {line}"
    );
    assert!(!out.exists());
}
