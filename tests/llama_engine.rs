//! The llama engine (llama.cpp through llama.h) on the GGUF packages scripts/gen-test-models.sh
//! converts from the generated ONNX packages with every weight float32 (the int4 blocks
//! dequantised exactly): the same logits as our ONNX Runtime backbone up to float rounding, the
//! same greedy codes, alone and batched; the CLI with `--engine llama` (the same audio bytes as
//! `--engine ort` on the source package); clear errors for bad GGUF files and devices; and on the
//! real-shape Q4_0 GGUF, llama.cpp's own greedy loop's tokens for 128 steps.
#![cfg(feature = "llama")]

mod common;

use std::path::{Path, PathBuf};

use onebit_tts::engine::{
    Backbone, CancelToken, Candidates, Device, EngineError, GenerationParams, KvMode,
    LlamaAttention, LlamaBackbone, LlamaOptions, LocalEngine, SamplingParams, Scheduler,
    SchedulerOptions,
};
use onebit_tts::package::{BackboneFormat, ModelPackage};

/// A generated GGUF package (models/NAME-gguf).
fn gguf_model(name: &str) -> PathBuf {
    let p = common::repo().join("models").join(format!("{name}-gguf"));
    assert!(
        p.join("model-f32.gguf").exists(),
        "{} is missing: run scripts/gen-test-models.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

fn llama(pkg: &ModelPackage, max_batch: usize) -> LlamaBackbone {
    LlamaBackbone::load(
        pkg,
        &LlamaOptions {
            threads: 2,
            device: Device::Cpu,
            max_batch,
            attention: LlamaAttention::Exact,
        },
    )
    .unwrap_or_else(|e| panic!("llama engine: {e}"))
}

fn greedy(max_new: usize) -> GenerationParams {
    GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: 0,
        max_new_tokens: Some(max_new),
    }
}

/// The ONNX package and its GGUF conversion, loaded.
fn pair(name: &str) -> (ModelPackage, ModelPackage) {
    let onnx = ModelPackage::load(&common::model(name), None).unwrap();
    let gguf = ModelPackage::load(&gguf_model(name), None).unwrap();
    assert_eq!(gguf.format, BackboneFormat::Gguf);
    assert_eq!(gguf.vocab, onnx.vocab);
    assert_eq!(gguf.stop_ids, onnx.stop_ids);
    (onnx, gguf)
}

#[test]
fn the_gguf_package_states_the_onnx_packages_model() {
    let (onnx, gguf) = pair("tiny");
    let (a, b) = (&onnx.genai.model, &gguf.genai.model);
    assert_eq!(b.model_type, "qwen2");
    assert_eq!(b.vocab_size, a.vocab_size);
    for (x, y) in [
        (b.decoder.num_hidden_layers, a.decoder.num_hidden_layers),
        (b.decoder.hidden_size, a.decoder.hidden_size),
        (b.decoder.num_attention_heads, a.decoder.num_attention_heads),
        (b.decoder.num_key_value_heads, a.decoder.num_key_value_heads),
        (b.decoder.head_size, a.decoder.head_size),
    ] {
        assert_eq!(x, y);
    }
    let b = llama(&gguf, 1);
    let d = b.describe();
    assert!(
        d.starts_with("llama.cpp ")
            && d.contains("qwen2, 2 layers")
            && d.contains("weights in CPU"),
        "{d}"
    );
    assert_eq!(b.device(), Device::Cpu);
    assert_eq!(b.placement().gpu_weights_mib(), 0.0);
}

/// Feeds the same tokens to both backbones and returns the largest logit difference and the
/// logit scale (largest magnitude) seen.
fn teacher_forced(
    a: &mut dyn Backbone,
    b: &mut dyn Backbone,
    prompt: &[u32],
    then: &[u32],
) -> (f32, f32) {
    a.reset();
    b.reset();
    let (mut diff, mut scale) = (0f32, 0f32);
    let mut compare = |x: &[f32], y: &[f32]| {
        assert_eq!(x.len(), y.len());
        for (p, q) in x.iter().zip(y) {
            diff = diff.max((p - q).abs());
            scale = scale.max(p.abs());
        }
    };
    let x = a.append(prompt).unwrap().to_vec();
    compare(&x, b.append(prompt).unwrap());
    for &t in then {
        let x = a.append(&[t]).unwrap().to_vec();
        compare(&x, b.append(&[t]).unwrap());
    }
    (diff, scale)
}

#[test]
fn greedy_codes_equal_the_onnx_runtime_backbone() {
    // The chain package's codes follow from the right ids, positions and KV with margins no
    // rounding moves; the random package's only when ONNX Runtime computes in float32 too
    // (tiny-random-exact: its int8 activations at accuracy level 4 tip near-ties).
    for (name, reference) in [("tiny", "tiny"), ("tiny-random", "tiny-random-exact")] {
        let (_, gguf) = pair(name);
        let (onnx, mut ort) = common::load_ort(&common::model(reference), KvMode::Shared);
        let mut ll = llama(&gguf, 1);
        let c = Candidates::of(&gguf);
        for prompt in common::speech_prompts(&onnx, common::PROMPT_SPECS) {
            let want = common::generate_all(&mut ort, &c, &prompt, &greedy(200));
            let got = common::generate_all(&mut ll, &c, &prompt, &greedy(200));
            assert!(
                want.codes.len() >= 20,
                "the comparison must cover many steps"
            );
            let first = got.codes.iter().zip(&want.codes).position(|(a, b)| a != b);
            assert_eq!(
                got.codes,
                want.codes,
                "{name}, prompt of {}: first difference at {first:?}",
                prompt.len()
            );
            assert_eq!(got.stop, want.stop);
        }
    }
}

#[test]
fn logits_follow_the_onnx_runtime_backbone_within_float32_rounding() {
    // Against the package computing in float32 (accuracy level 0), teacher-forced so a near-tie
    // cannot send the two down different paths. A wrong layout, position or bias would move the
    // logits by the whole scale; llama.cpp's f16 KV cache alone moves them by 0.04 here.
    let (_, gguf) = pair("tiny-random");
    let (onnx, mut ort) = common::load_ort(&common::model("tiny-random-exact"), KvMode::Shared);
    let mut ll = llama(&gguf, 1);
    let c = Candidates::of(&onnx);
    // 1500 tokens go to llama.cpp in three ubatch pieces of ours: positions run on across them.
    let specs = [common::PROMPT_SPECS, &[(1500, 4242)]].concat();
    for prompt in common::speech_prompts(&onnx, &specs) {
        let want = common::generate_all(&mut ort, &c, &prompt, &greedy(60));
        let ids: Vec<u32> = want
            .codes
            .iter()
            .map(|&code| onnx.vocab.code_to_id(code))
            .collect();
        let (diff, scale) = teacher_forced(&mut ort, &mut ll, &prompt, &ids);
        // Rounding grows with the positions attention sums over: within 1e-5 of the scale up
        // to 300, 1.02e-5 measured at 1523 (the same when llama.cpp cuts the run itself).
        let tolerance = if prompt.len() > 1000 { 2e-5 } else { 1e-5 };
        assert!(
            diff <= tolerance * scale.max(1.0),
            "prompt of {}: logits differ by up to {diff} on a scale of {scale}",
            prompt.len()
        );
    }
}

#[test]
fn batched_sequences_make_the_codes_they_make_alone() {
    let (onnx, gguf) = pair("tiny");
    let c = Candidates::of(&onnx);
    let prompts =
        common::speech_prompts(&onnx, &[(300, 65_400), (5, 1000), (120, 9), (40, 20_000)]);
    let jobs: Vec<(Vec<u32>, GenerationParams)> = prompts
        .into_iter()
        .zip([150, 60, 90, 120])
        .map(|(p, n)| (p, greedy(n)))
        .collect();
    let mut solo = llama(&gguf, 1);
    let want: Vec<_> = jobs
        .iter()
        .map(|(p, g)| common::generate_all(&mut solo, &c, p, g))
        .collect();
    drop(solo);
    for max_batch in [2, 4] {
        let s = Scheduler::start(
            Box::new(LocalEngine(Box::new(llama(&gguf, max_batch)))),
            c.clone(),
            SchedulerOptions {
                max_batch,
                prefill_chunk: 16,
                batch_invariant: false,
                prefix_cache_mib: onebit_tts::engine::scheduler::DEFAULT_PREFIX_CACHE_MIB,
            },
        )
        .unwrap();
        // Job 1 stops after 30 codes: its slot is freed mid-run and the others move.
        let got = common::together(&s, &jobs, 7, &[None, Some(30)]);
        assert_eq!(got[1].codes.len(), 30);
        let mut expect = want.clone();
        expect[1].codes.truncate(30);
        expect[1].stop = got[1].stop;
        common::assert_same(&got, &expect);
        assert!(
            s.stats()
                .peak_batch
                .load(std::sync::atomic::Ordering::SeqCst)
                >= 2,
            "max_batch {max_batch}: the jobs never shared a step"
        );
    }
}

/// llama.cpp's batch has no way to pad a lone sequence's step, so --batch-invariant runs the
/// llama engine one request at a time (the scheduler's other way to give a seed one take).
#[test]
fn batch_invariant_runs_the_llama_engine_one_request_at_a_time() {
    let (onnx, gguf) = pair("tiny");
    let start = |batch_invariant| {
        Scheduler::start(
            Box::new(LocalEngine(Box::new(llama(&gguf, 4)))),
            Candidates::of(&onnx),
            SchedulerOptions {
                max_batch: 4,
                prefill_chunk: 16,
                batch_invariant,
                prefix_cache_mib: onebit_tts::engine::scheduler::DEFAULT_PREFIX_CACHE_MIB,
            },
        )
        .unwrap()
        .max_batch()
    };
    assert_eq!((start(false), start(true)), (4, 1));
}

#[test]
fn a_cancelled_prefill_stops_inside_llama_decode_and_the_backbone_goes_on() {
    let (onnx, gguf) = pair("tiny");
    let mut ll = llama(&gguf, 1);
    let mut fresh = llama(&gguf, 1);
    let idle = CancelToken::new();
    let fired = CancelToken::new();
    fired.cancel();
    // 300 tokens are one ubatch: only llama.cpp's abort callback, asked between graph nodes,
    // can stop it (llama_decode returns 2); 1500 tokens are stopped in their first piece too.
    for prompt in common::speech_prompts(&onnx, &[(300, 65_400), (1500, 4242)]) {
        let err = ll.prefill(&prompt, &[&idle, &fired]).unwrap_err();
        assert!(
            matches!(err, EngineError::Interrupted),
            "prompt of {}: {err}",
            prompt.len()
        );
        // The interrupted sequence left nothing behind.
        ll.reset();
        let got = ll.prefill(&prompt, &[&idle]).unwrap().to_vec();
        fresh.reset();
        assert_eq!(
            got,
            fresh.append(&prompt).unwrap(),
            "prompt of {}",
            prompt.len()
        );
        assert_eq!(ll.len(), prompt.len());
    }
    // In a batch slot: the interrupted slot opens again with no reset and starts clean.
    let prompt = &common::speech_prompts(&onnx, &[(300, 65_400)])[0];
    let mut two = llama(&gguf, 2);
    let b = two.batch().expect("two sequences batch");
    b.open(0).unwrap();
    let want = b.extend(0, prompt, &[&idle]).unwrap().to_vec();
    b.open(0).unwrap();
    let err = b.extend(0, prompt, &[&fired]).unwrap_err();
    assert!(matches!(err, EngineError::Interrupted), "{err}");
    b.open(0).unwrap();
    assert_eq!(b.extend(0, prompt, &[&idle]).unwrap(), &want[..]);
}

/// llama.cpp's own loop, as benches/peers/llama_bench.py runs it through llama-cpp-python for
/// `bench --peers`: a context of exactly prompt + `n` positions with llama.cpp's default settings
/// (f16 KV, flash attention where the backend has it), the prompt in one llama_decode, then
/// greedy over the whole vocabulary (the first largest logit), one token per llama_decode.
fn llama_cpp_greedy(path: &Path, prompt: &[u32], n: usize, threads: i32) -> Vec<u32> {
    use llama_cpp_sys_2 as sys;
    let file = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: llama.h's documented sequence; every pointer is checked before use, the logits
    // row is n_vocab floats long, and the context is freed before its model.
    unsafe {
        sys::llama_backend_init();
        let mut mp = sys::llama_model_default_params();
        mp.n_gpu_layers = 0;
        let model = sys::llama_model_load_from_file(file.as_ptr(), mp);
        assert!(
            !model.is_null(),
            "llama.cpp could not load {}",
            path.display()
        );
        let n_vocab = sys::llama_vocab_n_tokens(sys::llama_model_get_vocab(model)) as usize;
        let mut cp = sys::llama_context_default_params();
        cp.n_ctx = (prompt.len() + n) as u32;
        cp.n_batch = prompt.len() as u32;
        cp.n_threads = threads;
        cp.n_threads_batch = threads;
        let ctx = sys::llama_init_from_model(model, cp);
        assert!(!ctx.is_null(), "llama.cpp could not make a context");
        let mut ids: Vec<i32> = prompt.iter().map(|&t| t as i32).collect();
        let batch = sys::llama_batch_get_one(ids.as_mut_ptr(), ids.len() as i32);
        assert_eq!(
            sys::llama_decode(ctx, batch),
            0,
            "the prompt's llama_decode"
        );
        let mut made = Vec::with_capacity(n);
        loop {
            let row = std::slice::from_raw_parts(sys::llama_get_logits_ith(ctx, -1), n_vocab);
            let best = row
                .iter()
                .enumerate()
                .fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
            made.push(best as u32);
            if made.len() == n {
                break;
            }
            let mut one = [best as i32];
            let batch = sys::llama_batch_get_one(one.as_mut_ptr(), 1);
            assert_eq!(sys::llama_decode(ctx, batch), 0, "step {}", made.len());
        }
        sys::llama_free(ctx);
        sys::llama_model_free(model);
        made
    }
}

#[test]
fn the_real_shape_q4_0_gguf_makes_llama_cpps_own_greedy_tokens_for_128_steps() {
    // The peer check, in CI: the real-shape backbone's Q4_0 GGUF (tools/onnx_to_gguf.py)
    // through our engine with llama.cpp's own settings (--llama-attention fast) and our sampler
    // (speech ids, the end token held off) against llama.cpp's own greedy loop over the whole
    // vocabulary.
    let dir = common::repo().join("models/real-shape-q4-gguf");
    let gguf = dir.join("model-q4_0.gguf");
    assert!(
        gguf.exists(),
        "{} is missing: run scripts/gen-test-models.sh",
        gguf.display()
    );
    let pkg = ModelPackage::load(&dir, None).unwrap();
    assert_eq!(pkg.format, BackboneFormat::Gguf);
    let mut ours = LlamaBackbone::load(
        &pkg,
        &LlamaOptions {
            threads: 2,
            device: Device::Cpu,
            max_batch: 1,
            attention: LlamaAttention::Fast,
        },
    )
    .unwrap_or_else(|e| panic!("llama engine: {e}"));
    assert!(ours.describe().contains("24 layers"), "{}", ours.describe());
    let c = Candidates::of(&pkg);
    let steps = 128;
    let params = GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: steps,
        max_new_tokens: Some(steps),
    };
    for prompt in common::speech_prompts(&pkg, &[(100, 4242)]) {
        ours.reset();
        let codes = common::generate_all(&mut ours, &c, &prompt, &params).codes;
        let ids: Vec<u32> = codes.iter().map(|&k| pkg.vocab.code_to_id(k)).collect();
        let peer = llama_cpp_greedy(&gguf, &prompt, steps, 2);
        let same = ids.iter().zip(&peer).take_while(|(a, b)| a == b).count();
        assert_eq!(
            (same, ids.len(), peer.len()),
            (steps, steps, steps),
            "prompt of {}: greedy tokens equal from the start",
            prompt.len()
        );
    }
}

fn say(model: &Path, extra: &[&str], out: &Path) -> std::process::Output {
    let mut args = vec!["say", "--model", model.to_str().unwrap(), "--voice", "test"];
    args.extend([
        "--seed",
        "7",
        "--temperature",
        "0",
        "-o",
        out.to_str().unwrap(),
    ]);
    args.extend(extra);
    args.push("Hello there, this is a test.");
    common::cli(&args)
}

#[test]
fn the_cli_speaks_a_gguf_package_with_the_same_audio_as_its_onnx_source() {
    let dir = common::tempdir("llama-cli");
    let (a, b) = (dir.join("llama.wav"), dir.join("ort.wav"));
    let o = say(&gguf_model("tiny"), &[], &a);
    assert!(o.status.success(), "{}", common::stderr(&o));
    let err = common::stderr(&o);
    assert!(err.contains("on cpu"), "{err}");
    let o = say(&common::model("tiny"), &[], &b);
    assert!(o.status.success(), "{}", common::stderr(&o));
    assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());

    // The engines refuse the other format, naming the one that runs it.
    let o = say(&gguf_model("tiny"), &["--engine", "ort"], &a);
    let e = common::error_line(&o);
    assert!(
        e.contains("is a GGUF package: it runs with --engine llama"),
        "{e}"
    );
    let o = say(&common::model("tiny"), &["--engine", "llama"], &a);
    let e = common::error_line(&o);
    assert!(
        e.contains("--engine llama runs GGUF packages") && e.contains("onnx_to_gguf.py"),
        "{e}"
    );
    // A GPU this build does not have (a build with that backend would run, or, for CUDA without
    // the driver, not start at all): the error names the feature to build with and its docs.
    for (device, has_backend, backend, hint) in [
        (
            "vulkan",
            cfg!(feature = "vulkan"),
            "Vulkan",
            "--features vulkan` (docs/models.md, \"GGUF on a GPU\")",
        ),
        (
            "cuda",
            cfg!(feature = "llama-cuda"),
            "CUDA",
            "--features llama-cuda` (docs/models.md, \"The CUDA and ROCm builds\")",
        ),
    ] {
        if has_backend {
            continue;
        }
        let o = say(&gguf_model("tiny"), &["--device", device], &a);
        let e = common::error_line(&o);
        let found =
            format!("--device {device}: llama.cpp found no {backend} GPU (its devices: CPU");
        assert!(e.contains(&found) && e.contains(hint), "{e}");
    }
}

#[test]
fn bad_gguf_files_get_clear_errors() {
    let src = gguf_model("tiny");
    let gguf = std::fs::read(src.join("model-f32.gguf")).unwrap();
    let check = |tag: &str, bytes: &[u8]| {
        let dir = common::tempdir(&format!("llama-bad-{tag}"));
        for f in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
            std::fs::copy(src.join(f), dir.join(f)).unwrap();
        }
        common::copy_dir(&src.join("codec"), &dir.join("codec"));
        std::fs::write(dir.join("model.gguf"), bytes).unwrap();
        common::error_line(&common::cli(&["models", "check", dir.to_str().unwrap()]))
    };
    // Cut short, as an interrupted download leaves it.
    let e = check("cut", &gguf[..gguf.len() / 2]);
    assert!(
        e.contains("model.gguf: truncated: tensor") && e.contains("interrupted download"),
        "{e}"
    );
    // A vocabulary that lost a speech token: the tokenizer's id means something else there.
    let pos = find(&gguf, b"<|speech_1234|>").expect("the GGUF holds the speech tokens");
    let mut renamed = gguf.clone();
    renamed[pos..pos + 15].copy_from_slice(b"<|speech_x234|>");
    let e = check("vocab", &renamed);
    assert!(
        e.contains("should be <|speech_1234|>") && e.contains("missing speech tokens"),
        "{e}"
    );
    let e = check("junk", b"GGML this is no GGUF file at all");
    assert!(e.contains("not a GGUF file"), "{e}");
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A stand-in executable: a shell script with `body`.
fn script(path: &Path, body: &str) {
    common::write_script(path, &format!("#!/bin/sh\n{body}\n"));
}

/// scripts/gpu-check.sh refuses a toolchain the bundled llama.cpp cannot build with before it
/// starts a build of many minutes (exit 2, saying what is missing), and once the checks pass it
/// builds the device's feature: a stand-in cargo on PATH records the call and fails, so a check
/// that wrongly passes builds nothing.
#[test]
fn gpu_check_refuses_an_unusable_cuda_or_hip_toolchain_before_building() {
    gguf_model("tiny"); // the script's first check
    let dir = common::tempdir("gpu-check");
    script(
        &dir.join("bin/cargo"),
        "echo \"cargo $* (CUDA_LIBRARY_PATH=$CUDA_LIBRARY_PATH)\"; exit 3",
    );
    let toolkit = |name: &str, release: &str| -> PathBuf {
        let root = dir.join(name);
        script(
            &root.join("bin/nvcc"),
            &format!("echo 'Cuda compilation tools, release {release}, V{release}.1'"),
        );
        root
    };
    let old = toolkit("cuda-11.8", "11.8");
    let new = toolkit("cuda-12.4", "12.4");
    let rocm = dir.join("rocm");
    let header = rocm.join("include/hip/hip_version.h");
    let system_path = std::env::var("PATH").unwrap();
    // `path_first`: directories put before the stand-in cargo's and the system's PATH.
    let run = |device: &str, path_first: &[&Path], vars: &[(&str, &Path)]| {
        let mut path = path_first
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>();
        path.push(dir.join("bin").display().to_string());
        path.push(system_path.clone());
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(common::repo().join("scripts/gpu-check.sh"))
            .arg(device)
            .env("PATH", path.join(":"));
        for v in [
            "BIN",
            "CUDACXX",
            "CUDA_PATH",
            "CUDA_LIBRARY_PATH",
            "ROCM_PATH",
            "HIP_PATH",
        ] {
            cmd.env_remove(v);
        }
        let o = cmd.envs(vars.iter().copied()).output().unwrap();
        let out = format!("{}{}", common::stdout(&o), common::stderr(&o));
        (o.status.code(), out)
    };

    // CUDACXX names the toolkit to use, whatever PATH holds.
    let nvcc = old.join("bin/nvcc");
    let (rc, out) = run("cuda", &[&new.join("bin")], &[("CUDACXX", &nvcc)]);
    assert_eq!(rc, Some(2), "{out}");
    let want = format!(
        "SKIP  CUDA toolkit 11.8 at {}; the bundled llama.cpp needs 12+",
        nvcc.display()
    );
    assert!(out.contains(&want), "{out}");
    assert!(!out.contains("cargo build"), "{out}");

    // Else nvcc on PATH; its own toolkit must hold the static libraries.
    let (rc, out) = run("cuda", &[&new.join("bin")], &[]);
    assert_eq!(rc, Some(2), "{out}");
    assert!(
        out.contains("SKIP  libcublas_static.a and libculibos.a (static libraries) not found"),
        "{out}"
    );
    std::fs::create_dir_all(new.join("lib64")).unwrap();
    for lib in ["libcublas_static.a", "libculibos.a"] {
        std::fs::write(new.join("lib64").join(lib), b"!<arch>\n").unwrap();
    }
    let (rc, out) = run("cuda", &[&new.join("bin")], &[]);
    assert_eq!(rc, Some(3), "{out}");
    assert!(out.contains("INFO  CUDA toolkit 12.4"), "{out}");
    // The toolkit's root as the script resolved it (readlink -f: the repo may sit behind a link).
    let root = std::fs::canonicalize(&new).unwrap();
    let want = format!(
        "cargo build --release --locked --features llama-cuda (CUDA_LIBRARY_PATH={})",
        root.display()
    );
    assert!(out.contains(&want), "{out}");

    let (rc, out) = run("rocm", &[], &[("ROCM_PATH", &rocm)]);
    assert_eq!(rc, Some(2), "{out}");
    assert!(
        out.contains("SKIP  no HIP version header at") && out.contains("needs HIP 6.1 or newer"),
        "{out}"
    );
    std::fs::create_dir_all(header.parent().unwrap()).unwrap();
    let hip = |major: u32, minor: u32| {
        let text =
            format!("#define HIP_VERSION_MAJOR {major}\n#define HIP_VERSION_MINOR {minor}\n");
        std::fs::write(&header, text).unwrap();
        run("rocm", &[], &[("HIP_PATH", &rocm)])
    };
    let (rc, out) = hip(6, 0);
    assert_eq!(rc, Some(2), "{out}");
    assert!(
        out.contains(&format!("SKIP  HIP 6.0 at {}", header.display())),
        "{out}"
    );
    let (rc, out) = hip(6, 4);
    assert_eq!(rc, Some(3), "{out}");
    assert!(out.contains("INFO  HIP 6.4"), "{out}");
    assert!(
        out.contains("cargo build --release --locked --features rocm"),
        "{out}"
    );
}
