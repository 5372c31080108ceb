//! The oga engine (onnxruntime-genai's C API) on generated packages: token-for-token parity with
//! our ONNX Runtime backbone in both KV settings and both step modes, the CLI and the server with
//! `--engine oga`, and clear errors for a library that is not OGA or a package OGA rejects.

mod common;

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use onebit_tts::engine::{
    self, Backbone, CancelToken, Candidates, EngineError, GenerationParams, KvMode, OgaBackbone,
    OgaLoadError, OgaOptions, OgaStep, OrtBackbone, OrtOptions, SamplingParams, StopReason, oga,
};
use onebit_tts::package::{ModelPackage, SPEECH_CODES};

/// A copy of a generated package with edited genai_config.json fields, removed when dropped; the
/// package itself stays untouched.
struct PackageCopy(PathBuf);

impl std::ops::Deref for PackageCopy {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for PackageCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn package_copy(name: &str, tag: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PackageCopy {
    let dir = common::tempdir(&format!("oga-{name}-{tag}"));
    common::copy_dir(&common::model(name), &dir);
    let path = dir.join("genai_config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(&path, serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    PackageCopy(dir)
}

fn with_share(name: &str, share: bool) -> PackageCopy {
    package_copy(name, &format!("share{share}"), |c| {
        c["search"]["past_present_share_buffer"] = share.into();
    })
}

fn ort(pkg: &ModelPackage) -> OrtBackbone {
    let env = onebit_tts::runtime::environment(None).unwrap();
    OrtBackbone::load(env, pkg, &OrtOptions::default()).unwrap()
}

fn oga_with(pkg: &ModelPackage, opts: OgaOptions) -> OgaBackbone {
    OgaBackbone::load(pkg, &opts).unwrap_or_else(|e| panic!("oga engine: {e}"))
}

fn oga_step(pkg: &ModelPackage, step: OgaStep) -> OgaBackbone {
    oga_with(
        pkg,
        OgaOptions {
            step,
            ..OgaOptions::default()
        },
    )
}

fn candidates(pkg: &ModelPackage) -> Candidates {
    Candidates::of(pkg)
}

fn greedy(max_new: usize) -> GenerationParams {
    GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: 0,
        max_new_tokens: Some(max_new),
    }
}

fn prompts(pkg: &ModelPackage) -> Vec<Vec<u32>> {
    common::speech_prompts(pkg, common::PROMPT_SPECS)
}

fn run(
    b: &mut dyn Backbone,
    c: &Candidates,
    prompt: &[u32],
    p: &GenerationParams,
) -> engine::Generation {
    common::generate_all(b, c, prompt, p)
}

#[test]
fn greedy_codes_equal_the_ort_backbone_in_both_share_buffer_settings_and_step_modes() {
    for model in ["tiny", "tiny-random"] {
        for share in [false, true] {
            let dir = with_share(model, share);
            let pkg = ModelPackage::load(&dir, None).unwrap();
            let c = candidates(&pkg);
            let mut reference = ort(&pkg);
            let mut append = oga_step(&pkg, OgaStep::Append);
            let mut generate = oga_step(&pkg, OgaStep::Generate);
            let want_kv = if share {
                "shared KV buffer"
            } else {
                "growing KV"
            };
            for b in [&append, &generate] {
                let d = b.describe();
                assert!(d.starts_with("oga ") && d.contains(want_kv), "{d}");
            }
            for prompt in prompts(&pkg) {
                let want = run(&mut reference, &c, &prompt, &greedy(150));
                assert!(
                    want.codes.len() >= 20,
                    "the comparison must cover many steps"
                );
                for (mode, b) in [("append", &mut append), ("generate", &mut generate)] {
                    let got = run(b, &c, &prompt, &greedy(150));
                    assert_eq!(
                        (&got.codes, got.stop),
                        (&want.codes, want.stop),
                        "{model} share_buffer={share} {mode} steps, prompt of {} tokens",
                        prompt.len()
                    );
                }
            }
            // Auto mode never needed the fallback on the CPU.
            assert_eq!(append.step(), OgaStep::Append);
            assert_eq!(generate.step(), OgaStep::Generate);
        }
    }
}

#[test]
fn chain_model_greedy_codes_are_exact() {
    let exp = common::expect("tiny");
    let end_after = exp["end_after_code"].as_u64().unwrap() as u32;
    let pkg = ModelPackage::load(&common::model("tiny"), None).unwrap();
    let c = candidates(&pkg);
    let mut b = oga_step(&pkg, OgaStep::Auto);
    for prompt in prompts(&pkg) {
        let last = pkg.vocab.id_to_code(*prompt.last().unwrap()).unwrap();
        let g = run(&mut b, &c, &prompt, &greedy(2000));
        let want: Vec<u32> = (1..)
            .map(|i| (last + i) % SPEECH_CODES)
            .take_while(|&x| x != (end_after + 1) % SPEECH_CODES)
            .take(2000)
            .collect();
        if want.len() < 2000 {
            assert_eq!(g.stop, StopReason::Stop(pkg.vocab.end));
        }
        assert_eq!(g.codes, want, "prompt of {} tokens", prompt.len());
    }
    assert_eq!(b.step(), OgaStep::Auto, "auto mode stayed in append mode");
}

#[test]
fn logits_of_the_last_position_equal_ort_at_prefill_and_every_step() {
    let pkg = ModelPackage::load(&common::model("tiny-random"), None).unwrap();
    let mut reference = ort(&pkg);
    for step in [OgaStep::Append, OgaStep::Generate] {
        let mut b = oga_step(&pkg, step);
        let prompt = prompts(&pkg)[1].clone();
        reference.reset();
        b.reset();
        let mut pairs = vec![(
            reference.append(&prompt).unwrap().to_vec(),
            b.append(&prompt).unwrap().to_vec(),
        )];
        for i in 0..12u32 {
            let next = pkg.vocab.code_to_id(i * 5000 + 3);
            pairs.push((
                reference.append(&[next]).unwrap().to_vec(),
                b.append(&[next]).unwrap().to_vec(),
            ));
        }
        assert_eq!(b.len(), prompt.len() + 12);
        for (i, (want, got)) in pairs.iter().enumerate() {
            assert_eq!(got.len(), pkg.genai.model.vocab_size);
            let diff = want
                .iter()
                .zip(got)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 1e-3, "{step:?} step {i}: max diff {diff}");
        }
    }
}

#[test]
fn kv_and_thread_overrides_apply_through_the_config_overlay() {
    let pkg = ModelPackage::load(&common::model("tiny-random"), None).unwrap();
    let c = candidates(&pkg);
    let prompt = &prompts(&pkg)[0];
    let mut plain = oga_step(&pkg, OgaStep::Auto);
    assert!(plain.describe().contains("growing KV"));
    let mut shared = oga_with(
        &pkg,
        OgaOptions {
            kv_mode: Some(KvMode::Shared),
            intra_threads: Some(1),
            ..OgaOptions::default()
        },
    );
    assert_eq!(shared.kv_mode(), KvMode::Shared);
    assert!(shared.describe().contains("shared KV buffer"));
    assert_eq!(
        run(&mut shared, &c, prompt, &greedy(60)).codes,
        run(&mut plain, &c, prompt, &greedy(60)).codes
    );
}

#[test]
fn sequences_reuse_one_generator_and_sampling_is_ours() {
    let pkg = ModelPackage::load(&common::model("tiny-random"), None).unwrap();
    let c = candidates(&pkg);
    let ps = prompts(&pkg);
    let mut b = oga_step(&pkg, OgaStep::Auto);
    let first = run(&mut b, &c, &ps[0], &greedy(40)).codes;
    run(&mut b, &c, &ps[2], &greedy(40));
    assert_eq!(run(&mut b, &c, &ps[0], &greedy(40)).codes, first);
    // Sampling with a seed is our sampler's: the same seed gives the same codes as on ort.
    let sampled = GenerationParams {
        sampling: SamplingParams {
            temperature: 1.0,
            top_k: 50,
            top_p: 0.9,
            seed: Some(7),
        },
        min_new_tokens: 0,
        max_new_tokens: Some(60),
    };
    let mut reference = ort(&pkg);
    assert_eq!(
        run(&mut b, &c, &ps[1], &sampled).codes,
        run(&mut reference, &c, &ps[1], &sampled).codes
    );
}

#[test]
fn the_budget_is_genai_configs_max_length_and_generation_runs_up_to_it() {
    let original = ModelPackage::load(&common::model("tiny-random"), None).unwrap();
    let prompt = prompts(&original)[1].clone();
    let max_length = prompt.len() + 40;
    // The end token cannot win, so generation runs into the budget.
    let to_the_end = GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: 10_000,
        max_new_tokens: None,
    };
    for share in [false, true] {
        let dir = package_copy("tiny-random", &format!("budget{share}"), |c| {
            c["search"]["max_length"] = max_length.into();
            c["search"]["past_present_share_buffer"] = share.into();
        });
        let pkg = ModelPackage::load(&dir, None).unwrap();
        let c = candidates(&pkg);
        let mut b = oga_step(&pkg, OgaStep::Auto);
        assert_eq!(b.budget(), max_length);
        let g = run(&mut b, &c, &prompt, &to_the_end);
        assert_eq!(g.stop, StopReason::Length);
        assert_eq!(g.codes.len(), 40, "share={share}");
        let mut reference = ort(&pkg);
        assert_eq!(g.codes, run(&mut reference, &c, &prompt, &to_the_end).codes);
        let too_long = vec![pkg.vocab.code_to_id(1); max_length + 5];
        let err = engine::generate(
            &mut b,
            &c,
            &too_long,
            &greedy(10),
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
        assert!(matches!(err, EngineError::PromptTooLong { .. }), "{err}");
        // Refused before any work: the backbone still holds the previous sequence.
        assert_eq!(b.len(), prompt.len() + 39);
    }
}

#[test]
fn a_failure_inside_oga_is_its_error_text_and_the_engine_recovers() {
    let pkg = ModelPackage::load(&common::model("tiny-random"), None).unwrap();
    let c = candidates(&pkg);
    let p = &prompts(&pkg)[0];
    for step in [OgaStep::Append, OgaStep::Generate] {
        let mut b = oga_step(&pkg, step);
        let before = run(&mut b, &c, p, &greedy(30)).codes;
        b.reset();
        b.append(p).unwrap();
        // An id far outside the embedding table: OGA's AppendTokens fails inside ONNX Runtime
        // (append mode), or we refuse to force it (generate mode).
        let err = b.append(&[50_000_000]).unwrap_err();
        assert!(
            matches!(err, EngineError::Oga { .. } | EngineError::Params(_)),
            "{step:?}: {err}"
        );
        assert_eq!(b.len(), 0);
        assert_eq!(run(&mut b, &c, p, &greedy(30)).codes, before, "{step:?}");
    }
    // A prompt OGA cannot run at all.
    let mut b = oga_step(&pkg, OgaStep::Auto);
    let err = b.append(&[50_000_000, 1, 2]).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, EngineError::Oga { call, .. } if call == "OgaGenerator_AppendTokens"),
        "{msg}"
    );
    assert!(
        msg.starts_with("onnxruntime-genai OgaGenerator_AppendTokens: "),
        "{msg}"
    );
    assert_eq!(run(&mut b, &c, p, &greedy(30)).codes.len(), 30);
}

/// The libc this process runs on.
fn libc_path() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libc.so") || n.starts_with("libc-"))
        })
        .map(PathBuf::from)
        .expect("libc in /proc/self/maps")
}

fn ort_lib_path() -> PathBuf {
    onebit_tts::runtime::environment(None).unwrap();
    onebit_tts::runtime::info().unwrap().path.clone()
}

#[test]
fn a_library_that_is_not_oga_is_refused_by_name() {
    // In-process: the error is the same whether or not another test loaded OGA already.
    for path in [libc_path(), ort_lib_path()] {
        let err = oga::library(Some(&path)).unwrap_err();
        assert!(
            matches!(&err, OgaLoadError::NotOga { symbol, .. } if *symbol == "OgaCreateConfig"),
            "{}: {err}",
            path.display()
        );
        let msg = err.to_string();
        assert!(
            msg.contains(&path.display().to_string())
                && msg.contains("not an onnxruntime-genai library"),
            "{msg}"
        );
    }
    let text = common::model("tiny").join("genai_config.json");
    let err = oga::library(Some(&text)).unwrap_err();
    assert!(
        matches!(err, OgaLoadError::Load { .. } | OgaLoadError::NotOga { .. }),
        "{err}"
    );
    let missing = common::model("tiny").join("libnothing.so");
    let err = oga::library(Some(&missing)).unwrap_err().to_string();
    assert!(err.contains("no such file"), "{err}");
    // The real one still loads, and its version was found.
    let lib = oga::library(None).unwrap();
    assert!(lib.path().ends_with(oga::OGA_LIB_FILE), "{lib:?}");
    let v = lib
        .version()
        .expect("the version of the installed OGA is known");
    assert!(v.split('.').count() >= 2, "{v}");
}

#[test]
fn a_package_oga_rejects_is_a_clear_error() {
    let dir = package_copy("tiny", "bogus-type", |c| {
        c["model"]["type"] = "bogus_model_type".into();
    });
    let pkg = ModelPackage::load(&dir, None).expect("our package checks do not judge the type");
    let err = OgaBackbone::load(&pkg, &OgaOptions::default())
        .err()
        .expect("OGA must refuse the package")
        .to_string();
    assert!(
        err.contains("OgaCreateModelFromConfig") && err.contains("bogus_model_type"),
        "{err}"
    );
}

// ---- The CLI and the server with --engine oga: real child processes. ----

use common::stderr;

fn cli(args: &[&str], envs: &[(&str, &str)]) -> Output {
    common::cli_with(args, envs)
}

/// The one `error:` line of a command that failed cleanly (exit code 1, not a signal).
fn error_line(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(1), "a clean failure: {}", stderr(o));
    common::error_line(o)
}

fn wav(path: &Path) -> (hound::WavSpec, Vec<i16>) {
    let mut r = hound::WavReader::open(path).unwrap();
    let spec = r.spec();
    let samples = r.samples::<i16>().map(Result::unwrap).collect();
    (spec, samples)
}

const TEXT: &str = "Hello world, this is a test.";

#[test]
fn say_with_the_oga_engine_writes_the_same_wav_as_ort() {
    let exp = common::expect("tiny");
    let codes = exp["test_voice_greedy_codes"].as_u64().unwrap() as usize;
    let dir = common::tempdir("oga-say");
    let model = common::model("tiny");
    let mut outputs = Vec::new();
    for engine in ["oga", "ort"] {
        let out = dir.join(format!("{engine}.wav"));
        let o = cli(
            &[
                "say",
                "-q",
                "--engine",
                engine,
                "--model",
                model.to_str().unwrap(),
                "--voice",
                "test",
                "--temperature",
                "0",
                "-o",
                out.to_str().unwrap(),
                TEXT,
            ],
            &[],
        );
        assert!(o.status.success(), "{engine}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("{codes} codes")),
            "{}",
            stderr(&o)
        );
        let (spec, samples) = wav(&out);
        assert_eq!((spec.sample_rate, spec.channels), (24_000, 1));
        assert_eq!(samples.len(), codes * 480, "{engine}");
        outputs.push(samples);
    }
    assert_eq!(outputs[0], outputs[1], "oga and ort give the same audio");
}

#[test]
fn say_with_a_library_that_is_not_oga_is_one_error_line() {
    let model = common::model("tiny");
    let out = common::tempdir("oga-say-bad").join("x.wav");
    let base = [
        "say",
        "-q",
        "--engine",
        "oga",
        "--model",
        model.to_str().unwrap(),
        "--voice",
        "test",
        "-o",
        out.to_str().unwrap(),
    ];
    for lib in [libc_path(), ort_lib_path()] {
        let lib = lib.to_str().unwrap().to_owned();
        let mut args = base.to_vec();
        args.extend(["--oga-lib", lib.as_str(), "hi"]);
        let line = error_line(&cli(&args, &[]));
        assert!(
            line.contains(&lib) && line.contains("not an onnxruntime-genai library"),
            "{line}"
        );
        // The same through the environment.
        let mut args = base.to_vec();
        args.push("hi");
        let line = error_line(&cli(&args, &[("ONEBIT_OGA_LIB", lib.as_str())]));
        assert!(line.contains("not an onnxruntime-genai library"), "{line}");
    }
    assert!(!out.exists(), "no output for a failed run");
}

#[test]
fn say_with_a_package_oga_rejects_is_one_error_line() {
    let dir = package_copy("tiny", "cli-bogus-type", |c| {
        c["model"]["type"] = "bogus_model_type".into();
    });
    let out = dir.join("x.wav");
    let o = cli(
        &[
            "say",
            "-q",
            "--engine",
            "oga",
            "--model",
            dir.to_str().unwrap(),
            "--voice",
            "test",
            "-o",
            out.to_str().unwrap(),
            "hi",
        ],
        &[],
    );
    let line = error_line(&o);
    assert!(
        line.contains("onnxruntime-genai") && line.contains("bogus_model_type"),
        "{line}"
    );
}

/// `onebit-tts serve` as a child, stopped with SIGTERM when dropped.
struct Server {
    child: std::process::Child,
    log: PathBuf,
}

impl Server {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Server {
    /// SIGTERM, then a bounded wait; a server that does not stop is killed.
    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        // SAFETY: signals our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

#[test]
fn the_server_with_the_oga_engine_answers_speech_requests() {
    let exp = common::expect("tiny");
    let codes = exp["test_voice_greedy_codes"].as_u64().unwrap() as usize;
    let dir = common::tempdir("oga-serve");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let log = dir.join("server.log");
    let child = Command::new(common::bin())
        .args([
            "serve",
            "--engine",
            "oga",
            "--model",
            common::model("tiny").to_str().unwrap(),
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ])
        .current_dir(common::repo())
        .env_remove("ONEBIT_MODEL")
        .env_remove("ONEBIT_OGA_LIB")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut server = Server { child, log };
    let base = format!("http://127.0.0.1:{port}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = reqwest::Client::new();
        // Bounded poll for readiness: the model loads before the port opens.
        let deadline = Instant::now() + Duration::from_secs(60);
        let health: serde_json::Value = loop {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("server exited with {status}: {}", server.log());
            }
            if let Ok(r) = client.get(format!("{base}/health")).send().await
                && r.status().is_success()
            {
                break r.json().await.unwrap();
            }
            assert!(
                Instant::now() < deadline,
                "no /health within 60 s: {}",
                server.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let engine = health["engine"].as_str().unwrap_or_default();
        assert!(engine.starts_with("oga "), "{health}");
        let r = client
            .post(format!("{base}/v1/audio/speech"))
            .json(&serde_json::json!({
                "model": "tiny",
                "input": TEXT,
                "voice": "test",
                "response_format": "wav",
                "temperature": 0,
            }))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let header = r
            .headers()
            .get("x-onebit-codes")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = r.bytes().await.unwrap();
        assert!(
            status.is_success(),
            "{status}: {}",
            String::from_utf8_lossy(&body)
        );
        assert_eq!(header, Some(codes.to_string()));
        let mut reader = hound::WavReader::new(std::io::Cursor::new(body.to_vec())).unwrap();
        assert_eq!(reader.spec().sample_rate, 24_000);
        assert_eq!(reader.samples::<i16>().count(), codes * 480);
    });
    drop(rt);
    let status = server.stop();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "the server stops cleanly on SIGTERM: {}",
        server.log()
    );
}

/// `--engine oga` inside the worker child: the same sampler over onnxruntime-genai's loop, so a
/// seeded take is byte-identical to the in-process one (tiny-random: sampling matters there).
#[test]
fn oga_in_the_worker_child_gives_the_same_bytes_as_in_process() {
    let dir = common::tempdir("oga-isolate");
    let model = common::model("tiny-random");
    let mut files = Vec::new();
    for isolate in [false, true] {
        let out = dir.join(format!("isolate-{isolate}.wav"));
        let mut args = vec![
            "say",
            "-q",
            "--engine",
            "oga",
            "--model",
            model.to_str().unwrap(),
            "--voice",
            "test",
            "--seed",
            "1234",
            "--max-new-tokens",
            "120",
            "-o",
            out.to_str().unwrap(),
        ];
        if isolate {
            args.push("--isolate");
        }
        args.push(TEXT);
        let o = cli(&args, &[]);
        assert!(o.status.success(), "isolate {isolate}: {}", stderr(&o));
        files.push(std::fs::read(&out).unwrap());
    }
    assert!(files[0].len() > 44);
    assert_eq!(
        files[0], files[1],
        "the worker's oga take equals the in-process one"
    );
}

/// `--device npu --engine oga`: onnxruntime-genai attaches the (stub) RyzenAI provider itself in
/// the worker, custom ops by library; its loop reports no node placement and no NPU worked for the
/// worker, so the probe says unproven (exit 2), never proven.
#[test]
fn npu_probe_with_the_oga_engine_never_claims_the_npu_without_evidence() {
    let dir = common::tempdir("oga-npu-probe");
    let pkg = common::npu_package(
        &dir,
        serde_json::json!({"provider_options": [{"RyzenAI": {}}]}),
    );
    let stub = common::stub_ep();
    let rec = dir.join("record.jsonl");
    let o = cli(
        &[
            "-q",
            "npu",
            "probe",
            "--engine",
            "oga",
            "--model",
            pkg.to_str().unwrap(),
            "--json",
        ],
        &[
            ("RYZENAI_EP_PATH", stub.to_str().unwrap()),
            ("ONEBIT_STUB_EP_RECORD", rec.to_str().unwrap()),
        ],
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("probe json ({e}): {}", stderr(&o)));
    assert_eq!(o.status.code(), Some(2), "{j}");
    assert_eq!(j["residency"]["state"], "unproven", "{j}");
    assert!(
        j["engine"].as_str().is_some_and(|e| e.starts_with("oga ")),
        "{j}"
    );
    assert!(j["placement"].is_null(), "{j}");
    let reasons = j["residency"]["reasons"].to_string();
    assert!(reasons.contains("placement is unknown"), "{reasons}");
    assert!(reasons.contains("no readable accel fd"), "{reasons}");
    // onnxruntime-genai reached the provider: registered it, its custom ops by library.
    let recorded = std::fs::read_to_string(&rec).unwrap();
    assert!(
        recorded.contains(r#""event":"register_custom_ops""#),
        "{recorded}"
    );
    assert!(recorded.contains(r#""event":"create_ep""#), "{recorded}");
}
