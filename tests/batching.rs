//! Continuous batching: sequences that share decode steps get bit for bit the logits they get
//! beside any other company (one row alone differs only by the int4 kernels' rounding, and not
//! at all when padded to two rows: `--batch-invariant`), and on
//! the chain package exactly the codes (and the audio) they make alone, whatever joins or leaves
//! beside them; cancelling one leaves the others alone;
//! graphs that fix their batch run one sequence at a time through the same scheduler.

mod common;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Barrier, mpsc};

use onebit_tts::audio::{AudioFormat, OutputSpec};
use onebit_tts::engine::{
    self, CancelToken, Candidates, Generation, GenerationParams, KvMode, LocalEngine,
    SamplingParams, Scheduler, SchedulerOptions, StopReason,
};
use onebit_tts::package::ModelPackage;
use onebit_tts::runtime::TurnsMode;
use onebit_tts::synth::{SpeechRequest, SynthConfig, Synthesizer};

fn sampled(seed: u64, max_new: usize) -> GenerationParams {
    GenerationParams {
        sampling: SamplingParams {
            seed: Some(seed),
            ..SamplingParams::default()
        },
        min_new_tokens: 0,
        max_new_tokens: Some(max_new),
    }
}

/// Greedy with a seed on the chain package: exact alone and in a batch. Sampling is not, on
/// CPUs where the int4 kernels round one row differently from several (see
/// a_sequence_sees_the_same_logits_whatever_runs_beside_it): a near-tie then tips another way.
fn chain(seed: u64, max_new: usize) -> GenerationParams {
    let mut g = sampled(seed, max_new);
    g.sampling.temperature = 0.0;
    g
}

/// A job per prompt: the i-th makes at most `limits[i]` codes with `params(first_seed + i, ..)`.
fn jobs(
    prompts: Vec<Vec<u32>>,
    limits: [usize; 4],
    first_seed: u64,
    params: fn(u64, usize) -> GenerationParams,
) -> Vec<(Vec<u32>, GenerationParams)> {
    prompts
        .into_iter()
        .zip(limits)
        .enumerate()
        .map(|(i, (p, max_new))| (p, params(first_seed + i as u64, max_new)))
        .collect()
}

/// Prompts of 4 lengths (13 to 300-odd tokens).
fn prompts(pkg: &ModelPackage) -> Vec<Vec<u32>> {
    common::speech_prompts(pkg, &[(300, 65_400), (5, 1000), (120, 9), (40, 20_000)])
}

/// What each prompt makes alone, on a backbone of its own through the plain generation loop.
fn alone(model: &str, jobs: &[(Vec<u32>, GenerationParams)]) -> Vec<Generation> {
    let (pkg, mut b) = common::load_ort(&common::model(model), KvMode::Shared);
    let c = Candidates::of(&pkg);
    jobs.iter()
        .map(|(p, g)| common::generate_all(&mut b, &c, p, g))
        .collect()
}

fn scheduler(model: &str, kv: KvMode, max_batch: usize) -> (ModelPackage, Scheduler) {
    let (pkg, b) = common::load_ort(&common::model(model), kv);
    let s = Scheduler::start(
        Box::new(LocalEngine(Box::new(b))),
        Candidates::of(&pkg),
        SchedulerOptions {
            max_batch,
            prefill_chunk: 16,
            batch_invariant: false,
            prefix_cache_mib: engine::scheduler::DEFAULT_PREFIX_CACHE_MIB,
        },
    )
    .unwrap();
    (pkg, s)
}

#[test]
fn seeded_sequences_make_the_same_codes_alone_and_in_batches_of_1_2_and_4() {
    // The chain package: its codes follow from the right slot, position and mask with margins no
    // kernel rounding moves (on the random package one row and several add in another order:
    // see a_sequence_sees_the_same_logits_whatever_runs_beside_it). Different prompt lengths and
    // limits: sequences join and leave at different steps, and the shared buffer (16 positions
    // at first) grows with 4 slots in it.
    let (pkg, _) = common::load_ort(&common::model("tiny"), KvMode::Shared);
    let jobs = jobs(prompts(&pkg), [900, 250, 600, 400], 7, chain);
    let want = alone("tiny", &jobs);
    for w in &want {
        assert_eq!(w.stop, StopReason::Length);
    }
    for n in [1, 2, 4] {
        let (_, s) = scheduler("tiny", KvMode::Shared, 4);
        assert_eq!(s.max_batch(), 4);
        let got = common::together(&s, &jobs[..n], 20, &[]);
        common::assert_same(&got, &want[..n]);
        assert_eq!(
            s.stats().peak_batch.load(Ordering::Relaxed),
            n,
            "{n} concurrent sequences shared decode steps"
        );
    }
}

#[test]
fn greedy_chain_codes_are_exact_in_a_batch_with_end_tokens_and_a_full_queue() {
    // The chain package ends sequences with its end token at different steps; 6 jobs on a batch
    // of 3 also wait in the queue and take the places the finished ones free.
    let (pkg, _) = common::load_ort(&common::model("tiny"), KvMode::Shared);
    let specs = [
        (5, 64_000),
        (40, 65_300),
        (300, 65_000),
        (7, 10),
        (90, 65_450),
        (3, 65_520),
    ];
    let jobs: Vec<(Vec<u32>, GenerationParams)> = common::speech_prompts(&pkg, &specs)
        .into_iter()
        .map(|p| {
            (
                p,
                GenerationParams {
                    sampling: SamplingParams::greedy(),
                    min_new_tokens: 0,
                    max_new_tokens: Some(3000),
                },
            )
        })
        .collect();
    let want = alone("tiny", &jobs);
    assert!(
        want.iter().any(|g| matches!(g.stop, StopReason::Stop(_))),
        "some sequences end with the end token"
    );
    let (_, s) = scheduler("tiny", KvMode::Shared, 3);
    let got = common::together(&s, &jobs, 5, &[]);
    common::assert_same(&got, &want);
    assert_eq!(s.stats().peak_batch.load(Ordering::Relaxed), 3);
}

#[test]
fn sequences_that_end_during_a_chunked_prefill_leave_it_intact() {
    // X's long prompt is prefilled whole (nothing else runs yet) while A, B and C queue in this
    // order. A and B join in a chunk or two each; C's long prompt then goes in 16 tokens per turn
    // beside them, and X, A and B all end during it: each time, C's half-filled slot moves down
    // to stay right after the running ones.
    let (pkg, s) = scheduler("tiny-random", KvMode::Shared, 4);
    let prompts = common::speech_prompts(&pkg, &[(300, 65_400), (5, 1000), (7, 2000), (300, 9)]);
    let jobs = jobs(prompts, [15, 3, 6, 40], 40, sampled);
    let want = alone("tiny-random", &jobs);
    let pending: Vec<_> = jobs
        .iter()
        .map(|(p, g)| s.submit(p, g, &CancelToken::new()).unwrap())
        .collect();
    let got: Vec<Generation> = pending
        .into_iter()
        .map(|p| p.wait(&mut |_| ControlFlow::Continue(())).unwrap())
        .collect();
    common::assert_same(&got, &want);
    assert!(s.stats().peak_batch.load(Ordering::Relaxed) >= 2);
}

#[test]
fn a_stopped_sequence_leaves_the_batch_and_the_others_go_on_unchanged() {
    let (pkg, _) = common::load_ort(&common::model("tiny"), KvMode::Shared);
    let jobs: Vec<(Vec<u32>, GenerationParams)> = prompts(&pkg)
        .into_iter()
        .enumerate()
        .map(|(i, p)| (p, chain(100 + i as u64, 700)))
        .collect();
    let want = alone("tiny", &jobs);
    let (_, s) = scheduler("tiny", KvMode::Shared, 4);
    // Job 1 stops after 60 codes, job 0 (the first, in slot 0) after 150: the slots move.
    let got = common::together(&s, &jobs, 10, &[Some(150), Some(60), None, None]);
    for (i, stop) in [(0, 150), (1, 60)] {
        assert_eq!(got[i].stop, StopReason::Cancelled, "job {i}");
        assert_eq!(got[i].codes, want[i].codes[..stop], "job {i}");
    }
    common::assert_same(&got[2..], &want[2..]);

    // The request's own cancel token (client gone): the job ends within a step, the others go on.
    let cancel = CancelToken::new();
    let (first_code, got_first) = mpsc::channel();
    std::thread::scope(|scope| {
        let s = &s;
        let (p0, g0) = jobs[0].clone();
        let token = cancel.clone();
        let a = scope.spawn(move || {
            let mut sent = false;
            s.generate(&p0, &g0, &token, &mut |_| {
                if !sent {
                    first_code.send(()).unwrap();
                    sent = true;
                }
                ControlFlow::Continue(())
            })
            .unwrap()
        });
        got_first.recv().unwrap();
        let b = scope.spawn(move || {
            let (p, g) = &jobs[2];
            s.generate(
                p,
                g,
                &CancelToken::new(),
                &mut |_| ControlFlow::Continue(()),
            )
            .unwrap()
        });
        cancel.cancel();
        let a = a.join().unwrap();
        assert_eq!(a.stop, StopReason::Cancelled);
        assert!(a.codes.len() < 700);
        assert_eq!(a.codes, want[0].codes[..a.codes.len()]);
        common::assert_same(&[b.join().unwrap()], &want[2..3]);
    });
}

#[test]
fn graphs_that_fix_their_batch_and_growing_kv_run_one_at_a_time_with_the_same_codes() {
    for (model, kv) in [("tiny-static", KvMode::Shared), ("tiny", KvMode::Growing)] {
        let (pkg, s) = scheduler(model, kv, 4);
        assert_eq!(s.max_batch(), 1, "{model} {kv:?}");
        let jobs: Vec<(Vec<u32>, GenerationParams)> =
            common::speech_prompts(&pkg, &[(5, 1000), (40, 20_000)])
                .into_iter()
                .map(|p| (p, sampled(3, 120)))
                .collect();
        let (_, mut b) = common::load_ort(&common::model(model), kv);
        let c = Candidates::of(&pkg);
        let want: Vec<Generation> = jobs
            .iter()
            .map(|(p, g)| common::generate_all(&mut b, &c, p, g))
            .collect();
        let got = common::together(&s, &jobs, 5, &[]);
        common::assert_same(&got, &want);
        assert!(s.stats().peak_batch.load(Ordering::Relaxed) <= 1);
    }
}

#[test]
fn refused_prompts_fail_alone_without_disturbing_the_batch() {
    let (pkg, s) = scheduler("tiny-random", KvMode::Shared, 4);
    let ok = (prompts(&pkg)[1].clone(), sampled(5, 300));
    let want = alone("tiny-random", std::slice::from_ref(&ok));
    let budget = pkg.genai.token_budget();
    std::thread::scope(|scope| {
        let s = &s;
        let good = scope.spawn(|| {
            s.generate(&ok.0, &ok.1, &CancelToken::new(), &mut |_| {
                ControlFlow::Continue(())
            })
            .unwrap()
        });
        let too_long = vec![ok.0[0]; budget + 1];
        let err = s
            .generate(&too_long, &ok.1, &CancelToken::new(), &mut |_| {
                ControlFlow::Continue(())
            })
            .unwrap_err();
        assert!(
            matches!(err, engine::EngineError::PromptTooLong { .. }),
            "{:?}",
            err
        );
        let mut bad = ok.1.clone();
        bad.sampling.temperature = -1.0;
        let err = s
            .generate(&ok.0, &bad, &CancelToken::new(), &mut |_| {
                ControlFlow::Continue(())
            })
            .unwrap_err();
        assert!(matches!(err, engine::EngineError::Sampling(_)));
        common::assert_same(&[good.join().unwrap()], &want);
    });
}

// ---- The whole pipeline: requests through one Synthesizer at once. ----

fn synth(max_batch: usize, codec_sessions: usize) -> Synthesizer {
    Synthesizer::load(&SynthConfig {
        package_dir: common::model("tiny"),
        voice_dirs: vec![common::repo().join("voices")],
        codec_sessions: Some(codec_sessions),
        scheduler: SchedulerOptions {
            max_batch,
            prefill_chunk: 32,
            batch_invariant: false,
            prefix_cache_mib: engine::scheduler::DEFAULT_PREFIX_CACHE_MIB,
        },
        ..SynthConfig::default()
    })
    .unwrap()
}

fn request(
    text: &str,
    voice: &str,
    seed: u64,
    format: AudioFormat,
    streaming: bool,
) -> SpeechRequest {
    let mut req = SpeechRequest {
        text: text.into(),
        voice: voice.into(),
        output: OutputSpec {
            format,
            streaming,
            ..OutputSpec::default()
        },
        ..SpeechRequest::default()
    };
    req.generation.sampling.seed = Some(seed);
    req.generation.sampling.temperature = 0.0;
    req
}

fn bytes_of(s: &Synthesizer, req: &SpeechRequest) -> Vec<u8> {
    common::synthesize_bytes(s, req).0
}

#[test]
fn requests_side_by_side_give_byte_identical_audio_to_each_alone() {
    let voices: Vec<String> = {
        let s = synth(1, 1);
        s.voices().names().into_iter().take(3).collect()
    };
    assert!(voices.len() >= 2, "the repo ships voices");
    let reqs = [
        request(
            "The quick brown fox jumps over the lazy dog. Then it runs far away into the woods.",
            &voices[0],
            11,
            AudioFormat::Wav,
            true,
        ),
        request("Hello there.", &voices[1], 12, AudioFormat::Pcm, true),
        request(
            "A third voice speaks a little longer, in one sentence.",
            &voices[voices.len() - 1],
            13,
            AudioFormat::Flac,
            false,
        ),
    ];
    let single = synth(1, 1);
    assert!(single.codec_description().starts_with("1 session x"));
    let want: Vec<Vec<u8>> = reqs.iter().map(|r| bytes_of(&single, r)).collect();
    drop(single);
    // Batched, and with two codec sessions decoding the streams' windows side by side.
    let batched = synth(4, 2);
    assert_eq!(batched.max_batch(), 4);
    assert!(batched.codec_description().starts_with("2 sessions x"));
    let start = Barrier::new(reqs.len());
    let got: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let hs: Vec<_> = reqs
            .iter()
            .map(|r| {
                let (b, start) = (&batched, &start);
                scope.spawn(move || {
                    start.wait();
                    bytes_of(b, r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g == w, "request {i}: {} vs {} bytes", g.len(), w.len());
    }
    let peak = batched.scheduler_stats().peak_batch.load(Ordering::Relaxed);
    assert!(
        peak >= 2,
        "the requests shared decode steps (peak batch {peak})"
    );
}

/// An ort backbone that records how many rows each of its runs had: a prefill chunk's tokens,
/// a step's sequences plus its padding; with a [`Hold`], it also stops the scheduler at a known
/// point; with a [`FailAt`], one of its decode steps fails once.
struct Recorder {
    inner: onebit_tts::engine::OrtBackbone,
    rows: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    hold: Option<Hold>,
    fail: Option<FailAt>,
}

/// Fails the `step`-th decode step once, as a device that times out once would; `steps` counts
/// the steps run.
struct FailAt {
    step: usize,
    steps: std::sync::Arc<AtomicUsize>,
}

/// Fires `cancel` during the `shared_steps`-th step of two or more sequences, and then holds
/// the close of the last sequence left until `release` gets a message (or its sender is gone).
struct Hold {
    shared_steps: usize,
    cancel: CancelToken,
    release: mpsc::Receiver<()>,
}

impl engine::Backbone for Recorder {
    fn reset(&mut self) {
        self.inner.reset()
    }
    fn append(&mut self, tokens: &[u32]) -> Result<&[f32], engine::EngineError> {
        self.rows.lock().unwrap().push(tokens.len());
        self.inner.append(tokens)
    }
    fn logits_layout(&self) -> engine::LogitsLayout {
        self.inner.logits_layout()
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn budget(&self) -> usize {
        self.inner.budget()
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn batch(&mut self) -> Option<&mut dyn engine::BatchBackbone> {
        Some(self)
    }
}

impl engine::BatchBackbone for Recorder {
    fn open(&mut self, slot: usize) -> Result<(), engine::EngineError> {
        self.inner.open(slot)
    }
    fn extend(
        &mut self,
        slot: usize,
        tokens: &[u32],
        cancel: &[&CancelToken],
    ) -> Result<&[f32], engine::EngineError> {
        self.rows.lock().unwrap().push(tokens.len());
        self.inner.extend(slot, tokens, cancel)
    }
    fn step_padded(&mut self, tokens: &[u32], pad: usize) -> Result<&[f32], engine::EngineError> {
        if let Some(f) = &self.fail
            && f.steps.fetch_add(1, Ordering::SeqCst) + 1 == f.step
        {
            return Err(engine::EngineError::Runtime(
                "simulated one-off device timeout".into(),
            ));
        }
        self.rows.lock().unwrap().push(tokens.len() + pad);
        if let Some(h) = self.hold.as_mut().filter(|_| tokens.len() >= 2) {
            h.shared_steps -= 1;
            if h.shared_steps == 0 {
                h.cancel.cancel();
            }
        }
        self.inner.step_padded(tokens, pad)
    }
    fn can_pad(&self) -> bool {
        self.inner.can_pad()
    }
    fn close(&mut self, slot: usize, running: usize) -> Result<(), engine::EngineError> {
        if let Some(h) = self
            .hold
            .as_ref()
            .filter(|h| running == 1 && h.shared_steps == 0)
        {
            let _ = h.release.recv();
        }
        self.inner.close(slot, running)
    }
}

#[test]
fn batch_invariant_sampled_takes_are_the_same_alone_and_beside_others() {
    // Sampled takes on the random package, whose near-ties tip with the last bit of a logit:
    // where the int4 kernels round one row apart from several (AVX2), these part within a few
    // hundred codes unless no run ever has one row. So: the backbone must never run one row (a
    // lone step is padded, no prompt chunk is one token), and every take is the same alone and
    // beside 1 and 3 others that join and leave at other steps.
    let (pkg, _) = common::load_ort(&common::model("tiny-random"), KvMode::Shared);
    // Long enough that every job still runs when the last one joins (as in the greedy test).
    let jobs = jobs(prompts(&pkg), [900, 250, 600, 400], 21, sampled);
    let start = |max_batch: usize| {
        let rows = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (_, inner) = common::load_ort(&common::model("tiny-random"), KvMode::Shared);
        let s = Scheduler::start(
            Box::new(LocalEngine(Box::new(Recorder {
                inner,
                rows: rows.clone(),
                hold: None,
                fail: None,
            }))),
            Candidates::of(&pkg),
            SchedulerOptions {
                max_batch,
                // Chunks of 16 (of 17 where one token would be left for a run of its own).
                prefill_chunk: 16,
                batch_invariant: true,
                prefix_cache_mib: engine::scheduler::DEFAULT_PREFIX_CACHE_MIB,
            },
        )
        .unwrap();
        (s, rows)
    };
    let (solo, solo_rows) = start(4);
    let want: Vec<Generation> = jobs
        .iter()
        .map(|job| common::together(&solo, std::slice::from_ref(job), 1, &[]).remove(0))
        .collect();
    assert!(
        solo.stats().pad_rows.load(Ordering::Relaxed) > 0,
        "lone steps were padded"
    );
    drop(solo);
    for n in [2, 4] {
        let (s, rows) = start(4);
        let got = common::together(&s, &jobs[..n], 30, &[]);
        common::assert_same(&got, &want[..n]);
        assert_eq!(s.stats().peak_batch.load(Ordering::Relaxed), n);
        drop(s);
        let rows = rows.lock().unwrap();
        assert!(rows.iter().all(|&r| r >= 2), "{n}: a one-row run: {rows:?}");
    }
    let rows = solo_rows.lock().unwrap();
    assert!(rows.iter().all(|&r| r >= 2), "alone: a one-row run");
    assert!(
        rows.iter().all(|&r| r <= 17),
        "prompts ran in chunks alone too"
    );
}

/// A caller that has heard its generation end is no longer counted in the batch (`/metrics`'
/// `onebit_batch_size`): the count changes with the batch, not at the end of the scheduler's
/// turn, which may be a whole step later (under load, a server test once read a finished
/// request as still running).
#[test]
fn a_sequence_leaves_the_batch_count_before_its_caller_hears_that_it_ended() {
    let (pkg, inner) = common::load_ort(&common::model("tiny"), KvMode::Shared);
    let cancel = CancelToken::new();
    let (release, held) = mpsc::channel();
    let s = Scheduler::start(
        Box::new(LocalEngine(Box::new(Recorder {
            inner,
            rows: Default::default(),
            // The second shared step: the count already said 2 after the first.
            hold: Some(Hold {
                shared_steps: 2,
                cancel: cancel.clone(),
                release: held,
            }),
            fail: None,
        }))),
        Candidates::of(&pkg),
        SchedulerOptions {
            max_batch: 4,
            prefill_chunk: 16,
            batch_invariant: false,
            prefix_cache_mib: engine::scheduler::DEFAULT_PREFIX_CACHE_MIB,
        },
    )
    .unwrap();
    // Dropped before the scheduler, whose drop waits for its thread: a failed assertion must
    // not leave that thread held in a close.
    let release = release;
    let p = prompts(&pkg);
    let running = || s.stats().running.load(Ordering::Relaxed);
    // Both share the token, so both end in the step that fires it; the second, in the higher
    // slot, leaves first, and the scheduler then waits in the first one's close.
    let first = s.submit(&p[1], &chain(1, 700), &cancel).unwrap();
    let second = s.submit(&p[3], &chain(2, 700), &cancel).unwrap();
    let g = second.wait(&mut |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(g.stop, StopReason::Cancelled);
    assert_eq!(
        running(),
        1,
        "the second is done, the first is still in the batch"
    );
    release.send(()).unwrap();
    let g = first.wait(&mut |_| ControlFlow::Continue(())).unwrap();
    assert_eq!(g.stop, StopReason::Cancelled);
    assert_eq!(running(), 0, "both are done");
    assert_eq!(s.stats().peak_batch.load(Ordering::Relaxed), 2);
}

#[test]
fn the_codec_sessions_follow_the_requests_that_can_run_side_by_side() {
    let codec = |max_batch: usize, kv: KvMode| {
        Synthesizer::load(&SynthConfig {
            package_dir: common::model("tiny"),
            voice_dirs: vec![common::repo().join("voices")],
            codec_threads: Some(8),
            // The sessions alone: on a small machine taking turns would add to the line.
            cpu_turns: TurnsMode::Off,
            ort: engine::OrtOptions {
                kv_mode: Some(kv),
                ..Default::default()
            },
            scheduler: SchedulerOptions {
                max_batch,
                ..Default::default()
            },
            ..SynthConfig::default()
        })
        .unwrap()
        .codec_description()
    };
    // 8 threads make two sessions of 4 when requests run side by side, one of 8 when they
    // cannot (one place, or growing KV, which runs one request at a time).
    assert_eq!(codec(4, KvMode::Shared), "2 sessions x 4 threads");
    assert_eq!(codec(1, KvMode::Shared), "1 session x 8 threads");
    assert_eq!(codec(4, KvMode::Growing), "1 session x 8 threads");
}

#[test]
fn taking_turns_changes_no_sample_and_says_so() {
    let run = |turns: TurnsMode| {
        let synth = Synthesizer::load(&SynthConfig {
            package_dir: common::model("tiny-random"),
            voice_dirs: vec![common::repo().join("voices")],
            cpu_turns: turns,
            // Which steps the two share depends on timing, which turns change: padded, a
            // seeded take is the same whatever runs beside it, on every CPU.
            scheduler: SchedulerOptions {
                batch_invariant: true,
                ..SchedulerOptions::default()
            },
            ..SynthConfig::default()
        })
        .unwrap();
        let said = (
            synth
                .engine_description()
                .ends_with("; taking turns with the codec"),
            synth
                .codec_description()
                .ends_with(", taking turns with the backbone"),
        );
        // Two requests at once, streamed: both sides' runs interleave through the gate.
        let barrier = Barrier::new(2);
        let streams: Vec<Vec<u8>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..2)
                .map(|i| {
                    let (synth, barrier) = (&synth, &barrier);
                    scope.spawn(move || {
                        let text = common::sentences(i * 3, 3);
                        let mut req = request(&text, "test", 7 + i as u64, AudioFormat::Wav, true);
                        // Sampled, not greedy: near-ties would show any difference.
                        req.generation.sampling.temperature = SamplingParams::default().temperature;
                        barrier.wait();
                        bytes_of(synth, &req)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        (said, streams)
    };
    let (said_on, on) = run(TurnsMode::On);
    let (said_off, off) = run(TurnsMode::Off);
    assert_eq!(said_on, (true, true));
    assert_eq!(said_off, (false, false));
    assert!(on.iter().all(|b| b.len() > 44));
    // Turns change when runs happen, never what they compute.
    assert!(on == off, "streams differ with and without turns");
}

#[test]
fn codec_sessions_decode_side_by_side_and_each_gives_the_same_samples() {
    let cfg = SynthConfig {
        package_dir: common::model("tiny"),
        codec_sessions: Some(2),
        ..SynthConfig::default()
    };
    let pkg = ModelPackage::load(&cfg.package_dir, None).unwrap();
    let pool = onebit_tts::synth::load_codec(&cfg, &pkg.codec, 2).unwrap();
    assert_eq!(pool.sessions(), 2);
    let codes: Vec<u32> = (0..60).map(|i| (i * 1_097) % 65_536).collect();
    let want = pool.decode(&codes).unwrap();
    assert_eq!(want.len(), codes.len() * pool.hop());
    // Both sessions taken: none is free, and each decodes on its own thread at once.
    let mut a = pool.take();
    let mut b = pool.try_take().expect("a second session");
    assert!(pool.try_take().is_none(), "only two sessions");
    let start = Barrier::new(2);
    let (x, y) = std::thread::scope(|scope| {
        let (ha, hb) = (
            scope.spawn(|| {
                start.wait();
                a.decode(&codes).unwrap()
            }),
            scope.spawn(|| {
                start.wait();
                b.decode(&codes).unwrap()
            }),
        );
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert!(
        x == want && y == want,
        "each session gives the same samples"
    );
    drop(a);
    let c = pool.try_take().expect("a session given back is free again");
    drop((b, c));
    assert_eq!(pool.decode(&codes).unwrap(), want);
}

/// Largest |a - b| over two logits rows.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn a_sequence_sees_the_same_logits_whatever_runs_beside_it() {
    // Teacher-forced on the random package: every sequence is fed the same tokens in every run.
    // Reference: each job beside a twin of itself (two rows, so the int4 kernels take their
    // several-row path, which adds in another order than their one-row path). In a batch of 4
    // where job 1 leaves after 40 steps (job 3 moves into its slot), every job's logits must be
    // those bit for bit: a wrong slot, position, mask or KV row would show at once. Alone (one
    // row) they may differ only by the kernels' rounding.
    use onebit_tts::engine::BatchBackbone;
    let (pkg, mut b) = common::load_ort(&common::model("tiny-random"), KvMode::Shared);
    let prompts = prompts(&pkg);
    let steps = 120;
    let feed = |i: usize, t: usize| {
        pkg.vocab
            .code_to_id(((i * 7_919 + t * 104_729) % 65_536) as u32)
    };
    let mut twin: Vec<Vec<Vec<f32>>> = Vec::new();
    let mut solo: Vec<Vec<Vec<f32>>> = Vec::new();
    let mut scale = 0.0f32;
    for (i, p) in prompts.iter().enumerate() {
        for s in 0..2 {
            b.open(s).unwrap();
            b.extend(s, p, &[]).unwrap();
        }
        let mut rows = Vec::new();
        for t in 0..steps {
            let both = b.step(&[feed(i, t), feed(i, t)]).unwrap().to_vec();
            let w = both.len() / 2;
            assert_eq!(both[..w], both[w..], "twins differ at step {t}");
            rows.push(both[..w].to_vec());
        }
        b.close(1, 2).unwrap();
        b.close(0, 1).unwrap();
        b.open(0).unwrap();
        b.extend(0, p, &[]).unwrap();
        let mut alone = Vec::new();
        for t in 0..steps {
            alone.push(b.step(&[feed(i, t)]).unwrap().to_vec());
        }
        b.close(0, 1).unwrap();
        // Padded with a throwaway row (--batch-invariant), alone is its twin's bit for bit.
        b.open(0).unwrap();
        b.extend(0, p, &[]).unwrap();
        for (t, want) in rows.iter().enumerate() {
            let padded = b.step_padded(&[feed(i, t)], 1).unwrap();
            assert!(
                padded == want.as_slice(),
                "job {i} padded alone at step {t}"
            );
        }
        b.close(0, 1).unwrap();
        scale = rows.iter().flatten().fold(scale, |m, x| m.max(x.abs()));
        twin.push(rows);
        solo.push(alone);
    }
    let mut slots: Vec<usize> = (0..prompts.len()).collect();
    for (slot, p) in prompts.iter().enumerate() {
        b.open(slot).unwrap();
        b.extend(slot, p, &[]).unwrap();
    }
    let mut rounding = 0.0f32;
    for t in 0..steps {
        if t == 40 {
            let at = slots.iter().position(|&j| j == 1).unwrap();
            b.close(at, slots.len()).unwrap();
            slots.swap_remove(at);
        }
        let tokens: Vec<u32> = slots.iter().map(|&j| feed(j, t)).collect();
        let rows = b.step(&tokens).unwrap().to_vec();
        let w = rows.len() / slots.len();
        for (k, &j) in slots.iter().enumerate() {
            let row = &rows[k * w..(k + 1) * w];
            assert!(
                row == twin[j][t].as_slice(),
                "job {j} in slot {k} at step {t}: not its logits"
            );
            rounding = rounding.max(max_diff(row, &solo[j][t]));
        }
    }
    assert!(
        rounding < 0.02 * scale,
        "alone and batched differ by {rounding} on a logit scale of {scale}: more than rounding"
    );
    eprintln!("alone vs batched: largest logit difference {rounding} (scale {scale})");
}

/// A cancelled prompt stops inside ONNX Runtime's run (the token's hook sets the run options'
/// terminate flag; a token that fired before the run sets it at once, so the run ends at its
/// first node) and loses only its own sequence: alone, the backbone then gives a fresh one's
/// logits; in a batch slot, the sequence beside it steps on with the very logits it gets when
/// nothing was interrupted.
#[test]
fn a_cancelled_prefill_stops_inside_the_run_and_loses_only_its_sequence() {
    use onebit_tts::engine::{Backbone, BatchBackbone, EngineError};
    let model = common::model("tiny-random");
    let (idle, fired) = (CancelToken::new(), CancelToken::new());
    fired.cancel();
    for kv in [KvMode::Growing, KvMode::Shared] {
        let (pkg, mut b) = common::load_ort(&model, kv);
        let (_, mut fresh) = common::load_ort(&model, kv);
        for prompt in &prompts(&pkg)[..2] {
            let err = b.prefill(prompt, &[&idle, &fired]).unwrap_err();
            assert!(matches!(err, EngineError::Interrupted), "{kv:?}: {err}");
            b.reset();
            fresh.reset();
            assert_eq!(
                b.prefill(prompt, &[&idle]).unwrap(),
                fresh.append(prompt).unwrap(),
                "{kv:?}, prompt of {}",
                prompt.len()
            );
            assert_eq!(b.len(), prompt.len());
        }
    }
    // In a batch: slot 0 runs; slot 1's prompt is cancelled, then opened again and prefilled.
    let (pkg, mut b) = common::load_ort(&model, KvMode::Shared);
    let (_, mut reference) = common::load_ort(&model, KvMode::Shared);
    let p = prompts(&pkg);
    let (beside, cancelled) = (&p[1], &p[0]);
    for (bb, interrupt) in [(&mut b, true), (&mut reference, false)] {
        bb.open(0).unwrap();
        bb.extend(0, beside, &[]).unwrap();
        bb.open(1).unwrap();
        if interrupt {
            let err = bb.extend(1, cancelled, &[&fired]).unwrap_err();
            assert!(matches!(err, EngineError::Interrupted), "{err}");
            bb.open(1).unwrap();
        }
    }
    let code = |t: usize| pkg.vocab.code_to_id((t * 7_919 % 65_536) as u32);
    for t in 0..4 {
        assert_eq!(
            b.step(&[code(t)]).unwrap(),
            reference.step(&[code(t)]).unwrap(),
            "slot 0 at step {t}"
        );
    }
    assert_eq!(
        b.extend(1, cancelled, &[&idle]).unwrap(),
        reference.extend(1, cancelled, &[&idle]).unwrap()
    );
    for t in 4..8 {
        assert_eq!(
            b.step(&[code(t), code(t + 1)]).unwrap(),
            reference.step(&[code(t), code(t + 1)]).unwrap(),
            "both slots at step {t}"
        );
    }
}

/// A transient failure on the batched path is retried like one on the one-at-a-time path: a
/// whole-file request gets exactly the bytes it gets without the failure; a stream is never
/// retried (its failure reaches its caller), and without a retry policy nothing is retried.
#[test]
fn a_transient_failure_on_the_batched_path_is_retried_once_for_a_whole_file() {
    let want = bytes_of(
        &synth(2, 1),
        &request(
            "The quick brown fox jumps over the lazy dog. Then it runs far away.",
            "test",
            7,
            AudioFormat::Wav,
            false,
        ),
    );
    let failing = |retry: Option<std::time::Duration>| {
        let cfg = SynthConfig {
            package_dir: common::model("tiny"),
            voice_dirs: vec![common::repo().join("voices")],
            codec_sessions: Some(1),
            ..SynthConfig::default()
        };
        let front = onebit_tts::synth::FrontEnd::load(&cfg).unwrap();
        let (_, inner) = common::load_ort(&common::model("tiny"), KvMode::Shared);
        let steps = std::sync::Arc::new(AtomicUsize::new(0));
        let engine = LocalEngine(Box::new(Recorder {
            inner,
            rows: Default::default(),
            hold: None,
            fail: Some(FailAt {
                step: 5,
                steps: steps.clone(),
            }),
        }));
        let codec = onebit_tts::synth::load_codec(&cfg, &front.package().codec, 1).unwrap();
        let s = Synthesizer::from_parts(
            front,
            Box::new(engine),
            codec,
            SchedulerOptions {
                max_batch: 2,
                prefill_chunk: 32,
                batch_invariant: false,
                prefix_cache_mib: engine::scheduler::DEFAULT_PREFIX_CACHE_MIB,
            },
        )
        .unwrap()
        .with_retry(retry);
        assert_eq!(s.max_batch(), 2, "the batched path");
        (s, steps)
    };
    let (s, steps) = failing(Some(std::time::Duration::from_millis(10)));
    let got = bytes_of(
        &s,
        &request(
            "The quick brown fox jumps over the lazy dog. Then it runs far away.",
            "test",
            7,
            AudioFormat::Wav,
            false,
        ),
    );
    assert!(steps.load(Ordering::SeqCst) > 5, "the failing step ran");
    assert_eq!(got, want, "the retry made the same audio");

    let (s, _) = failing(Some(std::time::Duration::from_millis(10)));
    let err = s
        .synthesize(
            &request(
                "The quick brown fox jumps over the lazy dog. Then it runs far away.",
                "test",
                7,
                AudioFormat::Pcm,
                true,
            ),
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("simulated one-off device timeout"),
        "{err}"
    );

    let (s, _) = failing(None);
    let err = s
        .synthesize(
            &request(
                "The quick brown fox jumps over the lazy dog. Then it runs far away.",
                "test",
                7,
                AudioFormat::Wav,
                false,
            ),
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .unwrap_err();
    assert!(
        err.to_string().contains("simulated one-off device timeout"),
        "{err}"
    );
}
