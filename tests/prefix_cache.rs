//! A prompt's rows computed in another run than one whole prefill: the voice-prefix cache (a
//! prompt whose instruction and transcript KV rows come from an earlier prompt of the same voice
//! gets, bit for bit, the logits and the audio of a whole prefill, and only those voice-only
//! tokens are ever reused) and the CPU's prefill in runs of 256 (the logits of one run).

mod common;

use onebit_tts::audio::{AudioFormat, OutputSpec};
use onebit_tts::engine::{BatchBackbone, KvMode, SchedulerOptions, scheduler};
use onebit_tts::package::ModelPackage;
use onebit_tts::prompt::{self, PromptInput};
use onebit_tts::synth::{SpeechRequest, SynthConfig, Synthesizer};

const TRANSCRIPT: &str = "So I'm live on radio, and I say, well, my dear friend James here.";

/// Two prompts of one voice (the same transcript and reference codes) with other texts, and how
/// many leading ids are the voice's alone.
fn voice_prompts(pkg: &ModelPackage) -> (Vec<u32>, Vec<u32>, usize) {
    let codes: Vec<u32> = (0..150).map(|i| (i * 4_999 + 17) % 65_536).collect();
    let build = |text: &str| {
        prompt::build_shared(
            &pkg.tokenizer,
            &pkg.vocab,
            &PromptInput {
                format: pkg.input_format,
                ref_text: TRANSCRIPT,
                text,
                ref_codes: &codes,
                emotion: None,
            },
        )
        .unwrap()
    };
    let (a, shared_a) = build("Hello there, this is the first request.");
    let (b, shared_b) = build("Quite another sentence for the second one.");
    assert_eq!(shared_a, shared_b, "the voice part depends on the text");
    assert_eq!(a[..shared_a], b[..shared_b]);
    // Beyond it at most the separator both texts follow.
    let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(
        (shared_a..=shared_a + 1).contains(&common),
        "{shared_a} of {common}"
    );
    (a, b, shared_a)
}

/// The packages checked: the generated test packages, and any named in
/// ONEBIT_PREFIX_EXACT_MODELS (comma-separated directories, e.g. models/real-shape-opt).
fn packages() -> Vec<std::path::PathBuf> {
    let mut dirs = vec![common::model("tiny"), common::model("tiny-random")];
    if let Ok(more) = std::env::var("ONEBIT_PREFIX_EXACT_MODELS") {
        dirs.extend(
            more.split(',')
                .filter(|s| !s.is_empty())
                .map(|s| common::repo().join(s)),
        );
    }
    dirs
}

#[test]
fn cached_voice_rows_give_the_logits_of_a_whole_prefill() {
    for dir in packages() {
        let (pkg, mut b) = common::load_ort(&dir, KvMode::Shared);
        let (a, p, shared) = voice_prompts(&pkg);
        let feed: Vec<u32> = (0..6).map(|t| pkg.vocab.code_to_id(t * 911)).collect();
        // What the second prompt gets prefilled whole, alone, and in the decode steps after it.
        b.open(0).unwrap();
        let mut want = vec![b.extend(0, &p, &[]).unwrap().to_vec()];
        for &t in &feed {
            want.push(b.step(&[t]).unwrap().to_vec());
        }
        b.close(0, 1).unwrap();
        // The first prompt's rows, a few past its voice part (a cached entry is cut to what the
        // next prompt shares).
        b.open(0).unwrap();
        b.extend(0, &a, &[]).unwrap();
        let rows = b.save_rows(0, shared + 3).unwrap().unwrap();
        assert_eq!(rows.len, shared + 3);
        b.close(0, 1).unwrap();
        // Alone in slot 0, and in slot 1 beside a running sequence.
        for slot in 0..2 {
            for s in 0..=slot {
                b.open(s).unwrap();
            }
            if slot == 1 {
                b.extend(0, &a, &[]).unwrap();
            }
            b.load_rows(slot, &rows, shared).unwrap();
            let got = b.extend(slot, &p[shared..], &[]).unwrap().to_vec();
            assert!(
                got == want[0],
                "{}: slot {slot}: cached rows gave other logits than a whole prefill",
                dir.display()
            );
            if slot == 0 {
                for (i, &t) in feed.iter().enumerate() {
                    let step = b.step(&[t]).unwrap();
                    assert!(
                        step == want[i + 1].as_slice(),
                        "{}: step {i} after cached rows",
                        dir.display()
                    );
                }
            }
            for s in (0..=slot).rev() {
                b.close(s, s + 1).unwrap();
            }
        }
        // Refused: rows into a slot that already holds positions, rows the slot does not hold,
        // or more positions than the rows have.
        b.open(0).unwrap();
        b.extend(0, &a[..10], &[]).unwrap();
        assert!(b.load_rows(0, &rows, shared).is_err());
        assert!(b.save_rows(0, 11).unwrap().is_err());
        b.open(0).unwrap();
        assert!(b.load_rows(0, &rows, shared + 4).is_err());
        b.close(0, 1).unwrap();
        eprintln!(
            "{}: {shared} of {} prompt tokens cached, logits exact",
            dir.display(),
            p.len()
        );
    }
}

fn synth(prefix_cache_mib: usize) -> Synthesizer {
    Synthesizer::load(&SynthConfig {
        package_dir: common::model("tiny"),
        voice_dirs: vec![common::repo().join("voices")],
        scheduler: SchedulerOptions {
            prefix_cache_mib,
            ..SchedulerOptions::default()
        },
        ..SynthConfig::default()
    })
    .unwrap()
}

/// The WAV bytes of `text` in voice `test`, greedy, and the prompt tokens the cache gave.
fn speak(s: &Synthesizer, text: &str) -> (Vec<u8>, usize, usize) {
    let mut req = SpeechRequest {
        text: text.into(),
        voice: "test".into(),
        output: OutputSpec {
            format: AudioFormat::Wav,
            ..OutputSpec::default()
        },
        ..SpeechRequest::default()
    };
    req.generation.sampling.temperature = 0.0;
    let (out, report) = common::synthesize_bytes(s, &req);
    (out, report.cached_tokens, report.prompt_tokens)
}

#[test]
fn a_voice_seen_before_prefills_only_its_text_and_sounds_the_same() {
    let on = synth(scheduler::DEFAULT_PREFIX_CACHE_MIB);
    let off = synth(0);
    let (first, cached_first, _) = speak(&on, "Good morning, everyone.");
    let (second, cached, tokens) = speak(&on, "The weather is fine today.");
    // Again the same text: still only the voice part comes from the cache, as for a new text.
    let (again, cached_again, _) = speak(&on, "Good morning, everyone.");
    assert_eq!(
        cached_first, 0,
        "nothing was cached before the first request"
    );
    assert!(cached > 0 && cached < tokens, "{cached} of {tokens}");
    assert_eq!(cached_again, cached);
    for (text, bytes) in [
        ("Good morning, everyone.", &first),
        ("The weather is fine today.", &second),
        ("Good morning, everyone.", &again),
    ] {
        let (alone, none, _) = speak(&off, text);
        assert_eq!(none, 0, "--prefix-cache-mib 0 caches nothing");
        assert!(alone == *bytes, "{text:?}: other audio with the cache");
    }
}

#[test]
fn a_prompt_prefilled_in_runs_gets_the_logits_of_one_run() {
    for dir in packages() {
        let pkg = ModelPackage::load(&dir, None).unwrap();
        let env = onebit_tts::runtime::environment(None).unwrap();
        let load = |run: usize| {
            let opts = onebit_tts::engine::OrtOptions {
                kv_mode: Some(KvMode::Shared),
                prefill_chunk: Some(run),
                ..Default::default()
            };
            onebit_tts::engine::OrtBackbone::load(env, &pkg, &opts).unwrap()
        };
        let prompt = &common::speech_prompts(&pkg, &[(700, 11)])[0];
        let feed: Vec<u32> = (0..4).map(|t| pkg.vocab.code_to_id(t * 313)).collect();
        let mut want = Vec::new();
        for run in [0, onebit_tts::engine::ort_engine::CPU_PREFILL_RUN, 100] {
            let mut b = load(run);
            b.open(0).unwrap();
            let mut got = vec![b.extend(0, prompt, &[]).unwrap().to_vec()];
            for &t in &feed {
                got.push(b.step(&[t]).unwrap().to_vec());
            }
            if run == 0 {
                want = got;
            } else {
                assert!(
                    got == want,
                    "{}: runs of {run} gave other logits than one run of {}",
                    dir.display(),
                    prompt.len()
                );
            }
        }
        eprintln!(
            "{}: {} prompt tokens, one run = runs of 256 = runs of 100",
            dir.display(),
            prompt.len()
        );
    }
}
