//! The backbone engine on generated packages: exact greedy sequences, parity with
//! onnxruntime-genai, both KV modes, the speech constraint, seeds, budget and failures.

mod common;

use std::ops::ControlFlow;
use std::path::Path;
use std::process::{Command, Stdio};

use onebit_tts::engine::{
    self, Backbone, CancelToken, Candidates, EngineError, GenerationParams, KvMode, OrtBackbone,
    SamplingParams, StopReason,
};
use onebit_tts::package::{ModelPackage, SPEECH_CODES};

fn load(name: &str, kv: KvMode) -> (ModelPackage, OrtBackbone) {
    common::load_ort(&common::model(name), kv)
}

fn candidates(pkg: &ModelPackage) -> Candidates {
    Candidates::of(pkg)
}

fn greedy(min_new: usize, max_new: Option<usize>) -> GenerationParams {
    GenerationParams {
        sampling: SamplingParams::greedy(),
        min_new_tokens: min_new,
        max_new_tokens: max_new,
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
fn chain_model_greedy_codes_are_exact_in_both_kv_modes() {
    let exp = common::expect("tiny");
    let end_after = exp["end_after_code"].as_u64().unwrap() as u32;
    for kv in [KvMode::Growing, KvMode::Shared] {
        let (pkg, mut b) = load("tiny", kv);
        let c = candidates(&pkg);
        for prompt in prompts(&pkg) {
            let last = pkg.vocab.id_to_code(*prompt.last().unwrap()).unwrap();
            let g = run(&mut b, &c, &prompt, &greedy(0, Some(2000)));
            let want: Vec<u32> = (1..)
                .map(|i| (last + i) % SPEECH_CODES)
                .take_while(|&x| x != (end_after + 1) % SPEECH_CODES)
                .collect();
            let want: Vec<u32> = want.into_iter().take(2000).collect();
            if want.len() < 2000 {
                assert_eq!(g.stop, StopReason::Stop(pkg.vocab.end), "{kv:?}");
            }
            assert_eq!(g.codes, want, "{kv:?} prompt of {} tokens", prompt.len());
        }
    }
}

#[test]
fn min_new_tokens_masks_the_end_and_the_chain_continues() {
    let exp = common::expect("tiny");
    let end_after = exp["end_after_code"].as_u64().unwrap() as u32;
    let (pkg, mut b) = load("tiny", KvMode::Growing);
    let c = candidates(&pkg);
    let start = end_after - 10;
    let prompt = vec![pkg.vocab.generation_start, pkg.vocab.code_to_id(start)];
    let g = run(&mut b, &c, &prompt, &greedy(0, Some(100)));
    assert_eq!(g.codes, (start + 1..=end_after).collect::<Vec<_>>());
    assert_eq!(g.stop, StopReason::Stop(pkg.vocab.end));
    let g = run(&mut b, &c, &prompt, &greedy(20, Some(20)));
    assert_eq!(g.codes, (start + 1..=start + 20).collect::<Vec<_>>());
    assert_eq!(g.stop, StopReason::Length);
}

fn oga(
    model: &str,
    prompts: &[Vec<u32>],
    max_new: usize,
    stops: &[u32],
    share: bool,
) -> Vec<Vec<u32>> {
    let py = common::repo().join(".onebit/venv/bin/python");
    assert!(
        py.exists(),
        "run scripts/setup.sh (installs onnxruntime-genai into .onebit/venv)"
    );
    let mut child = Command::new(py)
        .arg(common::repo().join("tests/python/oga_generate.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let req = serde_json::json!({"model": common::model(model), "prompts": prompts, "max_new": max_new,
        "stop_ids": stops, "share_buffer": share});
    serde_json::to_writer(child.stdin.take().unwrap(), &req).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "oga_generate.py failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    serde_json::from_value(v["outputs"].clone()).unwrap()
}

#[test]
fn greedy_codes_equal_onnxruntime_genai_token_for_token() {
    for model in ["tiny-random", "tiny"] {
        let (pkg, _) = load(model, KvMode::Growing);
        let ps = prompts(&pkg);
        let max_new = 150;
        for share in [false, true] {
            let reference = oga(model, &ps, max_new, &pkg.stop_ids, share);
            for kv in [KvMode::Growing, KvMode::Shared] {
                let (pkg, mut b) = load(model, kv);
                let c = candidates(&pkg);
                for (prompt, want) in ps.iter().zip(&reference) {
                    let g = run(&mut b, &c, prompt, &greedy(0, Some(max_new)));
                    let mut ids: Vec<u32> =
                        g.codes.iter().map(|&x| pkg.vocab.code_to_id(x)).collect();
                    if let StopReason::Stop(id) = g.stop {
                        ids.push(id);
                    }
                    assert_eq!(
                        &ids, want,
                        "{model}: ours {kv:?} vs onnxruntime-genai share_buffer={share}"
                    );
                    assert!(ids.len() >= 20, "the comparison must cover many steps");
                }
            }
        }
    }
}

#[test]
fn text_tokens_are_never_emitted_even_when_they_win_the_raw_argmax() {
    let exp = common::expect("tiny");
    let end_after = exp["end_after_code"].as_u64().unwrap() as u32;
    let (pkg, mut b) = load("tiny-textbias", KvMode::Growing);
    let c = candidates(&pkg);
    let prompt = vec![pkg.vocab.generation_start, pkg.vocab.code_to_id(100)];
    // The raw argmax of the first step is not a speech id or a stop id.
    let logits = b.append(&prompt).unwrap().to_vec();
    let raw = logits
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .unwrap()
        .0 as u32;
    assert!(
        pkg.vocab.id_to_code(raw).is_none() && !pkg.stop_ids.contains(&raw),
        "raw argmax {raw}"
    );
    let g = run(&mut b, &c, &prompt, &greedy(0, Some(200)));
    assert_eq!(
        g.codes,
        (101..101 + 200)
            .take_while(|&x| x <= end_after)
            .collect::<Vec<_>>()
    );
    for seed in 0..3 {
        let p = GenerationParams {
            sampling: SamplingParams {
                seed: Some(seed),
                ..SamplingParams::default()
            },
            min_new_tokens: 0,
            max_new_tokens: Some(200),
        };
        let g = run(&mut b, &c, &prompt, &p);
        assert!(g.codes.iter().all(|&x| x < SPEECH_CODES));
        assert!(!g.codes.is_empty());
    }
}

#[test]
fn same_seed_same_codes_other_seed_other_codes() {
    let (pkg, mut b) = load("tiny-random", KvMode::Growing);
    let c = candidates(&pkg);
    let prompt = &prompts(&pkg)[1];
    let sampled = |b: &mut OrtBackbone, seed| {
        let p = GenerationParams {
            sampling: SamplingParams {
                temperature: 1.0,
                top_k: 50,
                top_p: 1.0,
                seed: Some(seed),
            },
            min_new_tokens: 0,
            max_new_tokens: Some(60),
        };
        run(b, &c, prompt, &p).codes
    };
    let a = sampled(&mut b, 42);
    assert_eq!(a, sampled(&mut b, 42));
    assert_ne!(a, sampled(&mut b, 43));
}

#[test]
fn a_prompt_over_the_budget_is_refused_before_any_work() {
    let (pkg, mut b) = load("tiny", KvMode::Growing);
    let c = candidates(&pkg);
    let budget = b.budget();
    let prompt = vec![pkg.vocab.code_to_id(1); budget + 5];
    let err = engine::generate(
        &mut b,
        &c,
        &prompt,
        &greedy(0, None),
        &CancelToken::new(),
        &mut |_| ControlFlow::Continue(()),
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::PromptTooLong { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains(&(budget + 5).to_string()) && msg.contains(&budget.to_string()),
        "{msg}"
    );
    assert_eq!(b.len(), 0, "no token was run");
}

#[test]
fn sampling_out_of_range_is_refused_naming_its_parameter() {
    let (pkg, mut b) = load("tiny", KvMode::Growing);
    let c = candidates(&pkg);
    let prompt = &prompts(&pkg)[0];
    for (sampling, param) in [
        (
            SamplingParams {
                temperature: 9.0,
                ..SamplingParams::greedy()
            },
            "temperature",
        ),
        (
            SamplingParams {
                top_p: 0.0,
                ..SamplingParams::greedy()
            },
            "top_p",
        ),
    ] {
        let params = GenerationParams {
            sampling,
            ..greedy(0, Some(4))
        };
        let err = engine::generate(
            &mut b,
            &c,
            prompt,
            &params,
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
        match err {
            EngineError::Sampling(e) => assert_eq!(e.param, param),
            other => panic!("{param}: {other}"),
        }
        assert_eq!(b.len(), 0, "no token was run");
    }
}

#[test]
fn generation_stops_within_one_step_of_cancellation() {
    let (pkg, mut b) = load("tiny-random", KvMode::Growing);
    let c = candidates(&pkg);
    let cancel = CancelToken::new();
    let mut seen = 0;
    let g = engine::generate(
        &mut b,
        &c,
        &prompts(&pkg)[0],
        &greedy(0, Some(500)),
        &cancel,
        &mut |_| {
            seen += 1;
            if seen == 7 {
                cancel.cancel();
            }
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    assert_eq!(g.stop, StopReason::Cancelled);
    assert_eq!(g.codes.len(), 7);
    let mut n = 0;
    let g = engine::generate(
        &mut b,
        &c,
        &prompts(&pkg)[0],
        &greedy(0, Some(500)),
        &CancelToken::new(),
        &mut |_| {
            n += 1;
            if n == 3 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        },
    )
    .unwrap();
    assert_eq!((g.stop, g.codes.len()), (StopReason::Cancelled, 3));
}

#[test]
fn a_runtime_failure_mid_sequence_is_an_error_and_the_engine_recovers() {
    for kv in [KvMode::Growing, KvMode::Shared] {
        let (pkg, mut b) = load("tiny-random", kv);
        let c = candidates(&pkg);
        let p = &prompts(&pkg)[0];
        let before = run(&mut b, &c, p, &greedy(0, Some(30))).codes;
        b.reset();
        b.append(p).unwrap();
        // An id far outside the embedding table makes the Gather fail inside ONNX Runtime.
        let err = b.append(&[50_000_000]).unwrap_err();
        assert!(matches!(err, EngineError::Runtime(_)), "{err}");
        assert_eq!(
            run(&mut b, &c, p, &greedy(0, Some(30))).codes,
            before,
            "{kv:?}"
        );
    }
}

#[test]
fn incremental_logits_equal_a_fresh_prefill() {
    // The KV loop is right when step-by-step logits equal the logits of prefilling the whole
    // sequence at once.
    for kv in [KvMode::Growing, KvMode::Shared] {
        let (pkg, mut b) = load("tiny-random", kv);
        let mut seq = prompts(&pkg)[1].clone();
        b.reset();
        b.append(&seq).unwrap();
        for i in 0..12u32 {
            let next = pkg.vocab.code_to_id(i * 5000 + 3);
            let step = b.append(&[next]).unwrap().to_vec();
            seq.push(next);
            let (_, mut fresh) = load("tiny-random", KvMode::Growing);
            let full = fresh.append(&seq).unwrap();
            let diff = step
                .iter()
                .zip(full)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 1e-3, "{kv:?} step {i}: max diff {diff}");
        }
    }
}

/// Decode time is the steps alone: a slow `on_code` (a streaming codec, a slow client) is the
/// caller's stage, so stage timings add up to the wall time instead of counting it twice.
#[test]
fn decode_time_leaves_out_the_time_spent_in_on_code() {
    let (pkg, mut b) = load("tiny", KvMode::Shared);
    let c = candidates(&pkg);
    let prompt = &prompts(&pkg)[0];
    let per_code = std::time::Duration::from_millis(10);
    let mut in_callback = std::time::Duration::ZERO;
    let t = std::time::Instant::now();
    let g = engine::generate(
        &mut b,
        &c,
        prompt,
        &greedy(0, Some(20)),
        &CancelToken::new(),
        &mut |_| {
            // Busy work of a known length, standing in for the caller's stage.
            let s = std::time::Instant::now();
            while s.elapsed() < per_code {
                std::hint::spin_loop();
            }
            in_callback += s.elapsed();
            ControlFlow::Continue(())
        },
    )
    .unwrap();
    let wall = t.elapsed();
    assert_eq!(g.codes.len(), 20);
    assert!(in_callback >= per_code * 20);
    assert!(
        g.prefill + g.decode + in_callback <= wall,
        "prefill {:?} + decode {:?} + callbacks {in_callback:?} > wall {wall:?}",
        g.prefill,
        g.decode
    );
}

// ---- Static KV caches (AMD's NPU package shape: past length fixed in the graph) ----

/// The generated static packages' fixed past length (scripts/gen-test-models.sh).
const STATIC_LEN: usize = 512;

#[test]
fn a_static_package_decodes_the_dynamic_packages_codes_until_its_cache_is_full() {
    let (pkg, mut dynamic) = load("tiny", KvMode::Shared);
    let c = candidates(&pkg);
    // --kv growing is overridden by the graph's fixed length, as onnxruntime-genai does.
    for kv in [KvMode::Shared, KvMode::Growing] {
        let (_, mut b) = load("tiny-static", kv);
        assert_eq!((b.budget(), b.static_kv()), (STATIC_LEN, Some(STATIC_LEN)));
        assert!(
            b.describe()
                .contains(&format!("static shared buffer of {STATIC_LEN} positions")),
            "{}",
            b.describe()
        );
        for prompt in prompts(&pkg) {
            let room = STATIC_LEN - prompt.len();
            let want = run(&mut dynamic, &c, &prompt, &greedy(0, Some(room)));
            let got = run(&mut b, &c, &prompt, &greedy(0, None));
            assert_eq!(got.codes, want.codes, "{kv:?} prompt of {}", prompt.len());
            assert_eq!(got.stop, want.stop, "{kv:?} prompt of {}", prompt.len());
        }
    }
}

#[test]
fn static_packages_equal_onnxruntime_genai_token_for_token() {
    for model in ["tiny-static", "tiny-static-f16"] {
        let (pkg, mut b) = load(model, KvMode::Shared);
        let c = candidates(&pkg);
        let ps = prompts(&pkg);
        let max_new = 150;
        let reference = oga(model, &ps, max_new, &pkg.stop_ids, true);
        for (prompt, want) in ps.iter().zip(&reference) {
            let g = run(&mut b, &c, prompt, &greedy(0, Some(max_new)));
            let mut ids: Vec<u32> = g.codes.iter().map(|&x| pkg.vocab.code_to_id(x)).collect();
            if let StopReason::Stop(id) = g.stop {
                ids.push(id);
            }
            assert_eq!(&ids, want, "{model}: prompt of {}", prompt.len());
            assert!(ids.len() >= 20, "the comparison must cover many steps");
        }
    }
}

#[test]
fn a_float16_static_package_runs_the_chain_to_its_end() {
    let exp = common::expect("tiny-static-f16");
    assert_eq!(exp["kv_dtype"], "float16");
    let end_after = exp["end_after_code"].as_u64().unwrap() as u32;
    let (pkg, mut b) = load("tiny-static-f16", KvMode::Shared);
    assert!(b.describe().contains("KV (f16)"), "{}", b.describe());
    let c = candidates(&pkg);
    let start = end_after - 60;
    let prompt = vec![pkg.vocab.generation_start, pkg.vocab.code_to_id(start)];
    let g = run(&mut b, &c, &prompt, &greedy(0, None));
    assert_eq!(g.codes, (start + 1..=end_after).collect::<Vec<_>>());
    assert_eq!(g.stop, StopReason::Stop(pkg.vocab.end));
    // float16 logits of the last position only, converted for the sampler.
    b.reset();
    let row = b.append(&prompt).unwrap();
    assert_eq!(row.len(), pkg.genai.model.vocab_size);
    assert!(row.iter().all(|x| x.is_finite()));
}

#[test]
fn a_prompt_that_overflows_a_static_cache_is_refused_before_any_work() {
    let (pkg, mut b) = load("tiny-static", KvMode::Shared);
    let c = candidates(&pkg);
    let prompt = vec![pkg.vocab.code_to_id(1); 600];
    let err = engine::generate(
        &mut b,
        &c,
        &prompt,
        &greedy(0, None),
        &CancelToken::new(),
        &mut |_| ControlFlow::Continue(()),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::StaticKvFull {
                prompt: 600,
                capacity: STATIC_LEN
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("the prompt needs 600 positions")
            && msg.contains(&format!("static KV cache holds {STATIC_LEN}")),
        "{msg}"
    );
    assert_eq!(b.len(), 0, "no token was run");
    // Appending past the end is the same typed error, never an ONNX Runtime shape error, and the
    // sequence so far is kept.
    b.reset();
    b.append(&prompt[..STATIC_LEN - 1]).unwrap();
    let err = b.append(&prompt[..2]).unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::StaticKvFull {
                prompt: 513,
                capacity: STATIC_LEN
            }
        ),
        "{err}"
    );
    assert_eq!(b.len(), STATIC_LEN - 1);
    b.append(&prompt[..1]).unwrap();
    assert_eq!(b.len(), STATIC_LEN);
}

#[test]
fn a_generation_that_fills_a_static_cache_ends_with_length() {
    let (pkg, mut b) = load("tiny-static", KvMode::Shared);
    let c = candidates(&pkg);
    // 500 prompt tokens whose chain runs on for tens of thousands of codes.
    let mut prompt = vec![pkg.vocab.generation_start];
    prompt.extend((0..499u32).map(|i| pkg.vocab.code_to_id(1000 + i)));
    let g = run(&mut b, &c, &prompt, &greedy(0, Some(10_000)));
    assert_eq!(g.stop, StopReason::Length);
    assert_eq!(g.codes, (1499..1499 + 12).collect::<Vec<_>>());
    assert_eq!(prompt.len() + g.codes.len(), STATIC_LEN);
}

#[test]
fn a_graph_without_an_attention_mask_runs_as_onnxruntime_genai_runs_it() {
    // models/tiny-nomask: the chain's weights, no attention_mask input, position_ids instead.
    let (pkg, _) = load("tiny", KvMode::Shared);
    let c = candidates(&pkg);
    let prompt = prompts(&pkg).remove(0);
    let want = {
        let (_, mut b) = load("tiny", KvMode::Shared);
        run(&mut b, &c, &prompt, &greedy(0, Some(300))).codes
    };
    assert!(!want.is_empty());
    for kv in [KvMode::Growing, KvMode::Shared] {
        let (_, mut b) = load("tiny-nomask", kv);
        let g = run(&mut b, &c, &prompt, &greedy(0, Some(300)));
        assert_eq!(g.codes, want, "{kv:?}");
        // Without a mask, rows of different lengths cannot share a run.
        assert!(b.batch().is_none(), "{kv:?}");
    }
}

#[test]
fn a_package_chunk_size_prefills_in_chunks_with_the_same_codes() {
    let t = common::tempdir("engine-chunk-size");
    let (pkg, mut b) = load("tiny", KvMode::Shared);
    let c = candidates(&pkg);
    let prompt = prompts(&pkg).remove(0);
    assert!(prompt.len() > 7, "a prompt longer than the chunks");
    let want = run(&mut b, &c, &prompt, &greedy(0, Some(200))).codes;
    for name in ["tiny", "tiny-nomask"] {
        let chunked =
            common::package_with(&t, name, name, |cfg| cfg["search"]["chunk_size"] = 7.into());
        let (p, mut b) = common::load_ort(&chunked, KvMode::Shared);
        assert_eq!(p.genai.search.chunk_size, Some(7));
        assert_eq!(
            run(&mut b, &c, &prompt, &greedy(0, Some(200))).codes,
            want,
            "{name}"
        );
    }
}

#[test]
fn a_shared_buffer_package_gets_its_buffer_at_max_length_as_onnxruntime_genai_sizes_it() {
    let t = common::tempdir("engine-max-length");
    // No --kv-capacity: the engine's own choice.
    let load_default = |dir: &Path| {
        let pkg = ModelPackage::load(dir, None).unwrap();
        let env = onebit_tts::runtime::environment(None).unwrap();
        let b = OrtBackbone::load(env, &pkg, &onebit_tts::engine::OrtOptions::default()).unwrap();
        (pkg, b)
    };
    let (_, b) = load_default(&common::model("tiny"));
    // Our own default: a small buffer that doubles up to the budget.
    assert!(
        b.describe().contains("shared buffer from 2048 positions"),
        "{}",
        b.describe()
    );
    // The package asks for onnxruntime-genai's shared buffer: one of search.max_length.
    let shared = common::package_with(&t, "tiny", "tiny", |cfg| {
        cfg["search"]["past_present_share_buffer"] = true.into();
        cfg["search"]["max_length"] = 3000.into();
    });
    let (p, b) = load_default(&shared);
    assert_eq!(p.genai.token_budget(), 3000);
    assert!(
        b.describe().contains("shared buffer from 3000 positions"),
        "{}",
        b.describe()
    );
}
