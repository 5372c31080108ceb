//! The engine worker with real child processes: the compiled `onebit-tts worker` runs the CPU
//! backbone of a generated package, and the tests crash it, stop it, hang it and compare it with
//! the in-process engine. No NPU is needed; the NPU environment is checked over a fake venv/XRT
//! tree, and "holds the NPU" over a fake /proc fd table.
//!
//! Nothing sleeps to synchronise: tests wait on what they can observe (a code arriving, the
//! process state in /proc, the watchdog's record of an exit), polling only where the kernel
//! offers no notification.

mod common;

use std::ffi::OsString;
use std::fs;
use std::ops::ControlFlow;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use onebit_tts::audio::OutputSpec;
use onebit_tts::codec::CodecDecoder;
use onebit_tts::engine::worker::supervisor::{Ending, NeverKill, StopOutcome, StopPolicy};
use onebit_tts::engine::{
    CancelToken, Candidates, Device, Engine, EngineError, GenerationParams, OrtOptions,
    SamplingParams, StopReason, WorkerConfig, WorkerEngine, WorkerHandle, WorkerState,
    WorkerTimeouts,
};
use onebit_tts::npu::env::{EnvInputs, EnvPlan, worker_env};
use onebit_tts::npu::{PROVIDER_FILE, SystemRoots};
use onebit_tts::package::ModelPackage;
use onebit_tts::server::ApiError;
use onebit_tts::synth::{FrontEnd, SpeechRequest, SynthConfig, SynthError, SynthEvent};
use onebit_tts::{Synthesizer, voice};

const MODEL: &str = "tiny-random";

/// A CPU worker on the test package, started from the compiled binary, with this process's
/// environment unchanged (no NPU knobs).
fn cpu_config() -> WorkerConfig {
    WorkerConfig {
        package_dir: common::model(MODEL),
        ort_lib: None,
        ort: OrtOptions::default(),
        env: EnvInputs {
            provider_declared: false,
            ryzenai_root: None,
            xrt_root_knob: None,
            xilinx_xrt: None,
            ld_library_path: std::env::var_os("LD_LIBRARY_PATH"),
            ryzenai_ep_path: None,
            system_lib_dir: None,
            worker_exe: common::bin(),
        },
        stop: StopPolicy {
            grace: Duration::from_secs(30),
            ..StopPolicy::default()
        },
        timeouts: WorkerTimeouts::default(),
        gate: None,
        roots: SystemRoots::default(),
        ep_library: None,
        oga: None,
    }
}

fn synth_config(isolate: bool) -> SynthConfig {
    SynthConfig {
        package_dir: common::model(MODEL),
        voice_dirs: voice::default_dirs(),
        isolate,
        worker_exe: Some(common::bin()),
        ..SynthConfig::default()
    }
}

/// A synthesizer whose engine is the given worker (tests set its retry policy).
fn synth_with(worker: WorkerEngine) -> Synthesizer {
    let cfg = synth_config(true);
    let front = FrontEnd::load(&cfg).expect("front end");
    let env = onebit_tts::runtime::environment(None).expect("runtime");
    let codec =
        CodecDecoder::load(env, &front.package().codec, &Default::default()).expect("codec");
    Synthesizer::from_parts(front, Box::new(worker), codec, Default::default()).unwrap()
}

/// A request long enough (3000 codes, several seconds) that a worker killed at its first code
/// cannot have finished it first.
fn long_request(streaming: bool) -> SpeechRequest {
    let mut r = request(streaming);
    r.generation.min_new_tokens = 3000;
    r.generation.max_new_tokens = Some(3000);
    r
}

fn request(streaming: bool) -> SpeechRequest {
    SpeechRequest {
        text: "Sampling run through the worker.".into(),
        voice: "test".into(),
        generation: GenerationParams {
            sampling: SamplingParams {
                seed: Some(5),
                ..SamplingParams::default()
            },
            max_new_tokens: Some(90),
            ..GenerationParams::default()
        },
        output: OutputSpec {
            streaming,
            ..OutputSpec::default()
        },
        ..SpeechRequest::default()
    }
}

type Outcome = (
    Result<onebit_tts::synth::SynthesisReport, SynthError>,
    Vec<u8>,
);

/// Runs a request, collecting the audio bytes; `on_code` sees each code's index and may stop.
fn synthesize_until(
    synth: &Synthesizer,
    req: &SpeechRequest,
    mut on_code: impl FnMut(usize) -> ControlFlow<()>,
) -> Outcome {
    let mut bytes = Vec::new();
    let r = synth.synthesize(req, &CancelToken::new(), &mut |ev| match ev {
        SynthEvent::Code { index, .. } => on_code(index),
        SynthEvent::Audio(b) => {
            bytes.extend_from_slice(b);
            ControlFlow::Continue(())
        }
        SynthEvent::Patch { offset, bytes: p } => {
            onebit_tts::audio::apply_patch(&mut bytes, offset, p).unwrap();
            ControlFlow::Continue(())
        }
        SynthEvent::Started { .. } | SynthEvent::Piece { .. } | SynthEvent::Timing(_) => {
            ControlFlow::Continue(())
        }
    });
    (r, bytes)
}

fn synthesize(synth: &Synthesizer, req: &SpeechRequest, mut on_code: impl FnMut(usize)) -> Outcome {
    synthesize_until(synth, req, |i| {
        on_code(i);
        ControlFlow::Continue(())
    })
}

fn kill(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid this test's engine started and has not reaped.
    assert_eq!(
        unsafe { libc::kill(pid as i32, sig) },
        0,
        "kill {pid} {sig}"
    );
}

/// The state letter of a process in /proc/<pid>/stat (R, S, T, Z, ...); None once reaped.
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Polls /proc (bounded) until `pid` reaches `state`; the kernel has no notification for it.
fn wait_for_state(pid: u32, state: char) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_state(pid) != Some(state) {
        assert!(Instant::now() < deadline, "pid {pid} never reached {state}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn pid_of(h: &WorkerHandle) -> u32 {
    h.pid().expect("a running worker")
}

// ---------------------------------------------------------------------------------------------
// Parity

#[test]
fn synthesis_through_the_worker_equals_in_process_synthesis() {
    let local = Synthesizer::load(&synth_config(false)).expect("in-process");
    assert!(local.worker().is_none());
    let isolated = Synthesizer::load(&synth_config(true)).expect("worker");
    let handle = isolated.worker().expect("a worker").clone();
    assert_eq!(isolated.device(), Device::Cpu);
    assert!(
        isolated.residency().is_none(),
        "no residency claim off the NPU"
    );
    assert!(isolated.engine_description().starts_with("worker pid "));
    let loaded = handle.loaded().expect("loaded");
    assert_eq!(loaded.providers, ["CPUExecutionProvider"]);

    for streaming in [false, true] {
        let req = request(streaming);
        let (a, wav_a) = synthesize(&local, &req, |_| {});
        let (b, wav_b) = synthesize(&isolated, &req, |_| {});
        let (a, b) = (a.expect("local"), b.expect("worker"));
        assert!(!a.codes.is_empty());
        assert_eq!(a.codes, b.codes, "streaming {streaming}");
        assert_eq!(a.seed, b.seed);
        assert_eq!(a.stop, b.stop);
        assert_eq!(a.prompt_tokens, b.prompt_tokens);
        assert_eq!(wav_a, wav_b, "streaming {streaming}: same WAV bytes");
    }
    assert_eq!(handle.spawns(), 1);
}

/// The package's candidates and a two-token prompt, for driving an [`Engine`] directly.
fn engine_inputs() -> (Candidates, Vec<u32>) {
    let pkg = ModelPackage::load(&common::model(MODEL), None).expect("package");
    let candidates = Candidates::of(&pkg);
    let prompt = vec![pkg.vocab.generation_start, pkg.vocab.code_to_id(1234)];
    (candidates, prompt)
}

#[test]
fn a_callback_break_cancels_within_one_step_and_the_worker_stays() {
    let (candidates, prompt) = engine_inputs();
    let params = GenerationParams {
        min_new_tokens: 500,
        max_new_tokens: Some(500),
        ..GenerationParams::default()
    };
    let mut w = WorkerEngine::new(cpu_config());
    w.start().expect("start");
    let pid = pid_of(&w.handle());
    let mut seen = 0;
    let g = w
        .generate(
            &candidates,
            &prompt,
            &params,
            &CancelToken::new(),
            &mut |_| {
                seen += 1;
                if seen == 7 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            },
        )
        .expect("generate");
    assert_eq!(g.stop, StopReason::Cancelled);
    assert_eq!(g.codes.len(), 7, "codes after the break are not delivered");
    assert_eq!(seen, 7);
    // A cancel token set before the request: nothing generated.
    let cancel = CancelToken::new();
    cancel.cancel();
    let g = w
        .generate(&candidates, &prompt, &params, &cancel, &mut |_| {
            ControlFlow::Continue(())
        })
        .expect("generate");
    assert_eq!(g.stop, StopReason::Cancelled);
    // The same worker serves the next request in full.
    let g = w
        .generate(
            &candidates,
            &prompt,
            &GenerationParams {
                max_new_tokens: Some(20),
                ..params.clone()
            },
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .expect("generate");
    assert_eq!(g.codes.len(), 20);
    assert_eq!(g.stop, StopReason::Length);
    assert_eq!(w.handle().pid(), Some(pid));
    assert_eq!(w.handle().spawns(), 1);
    // A request the worker refuses keeps its kind (400, not 503) and the worker.
    let err = w
        .generate(&candidates, &[], &params, &CancelToken::new(), &mut |_| {
            ControlFlow::Continue(())
        })
        .expect_err("empty prompt");
    assert!(matches!(err, EngineError::EmptyPrompt), "{err}");
    assert_eq!(w.handle().pid(), Some(pid));
    let outcome = w.shutdown().expect("was running");
    assert_eq!(outcome.ending(), Some(Ending::Exit(0)), "{outcome}");
}

// ---------------------------------------------------------------------------------------------
// Lifecycle

#[test]
fn a_worker_that_exits_on_its_own_is_reaped_at_once() {
    let mut w = WorkerEngine::new(cpu_config());
    w.start().expect("start");
    let h = w.handle();
    let pid = pid_of(&h);
    // SIGTERM from outside: the worker's signal thread releases the model and it exits 0.
    kill(pid, libc::SIGTERM);
    let ending = h
        .wait_ending(pid, Duration::from_secs(10))
        .expect("the watchdog reaped it");
    assert_eq!(ending, Ending::Exit(0));
    assert_eq!(proc_state(pid), None, "reaped: no zombie left");
    assert_eq!(h.pid(), None);
    // The model went before main returned.
    assert!(h.wait_log_closed(pid, Duration::from_secs(10)));
    let log = h.log_tail();
    let released = log.find("model session released").expect("released");
    let exiting = log.find("worker exiting").expect("exiting");
    assert!(released < exiting, "{log}");
    assert!(log.contains("SIGTERM: cancelling"), "{log}");
    // Stop is a no-op now, not a 30 s grace.
    let t0 = Instant::now();
    let outcome = w.shutdown().expect("known worker");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(outcome, StopOutcome::AlreadyEnded(Ending::Exit(0)));
}

/// A fake /proc in which `pid` holds a fake /dev/accel/accel0.
fn fake_npu_holder(t: &Path, pid: u32) -> SystemRoots {
    let roots = SystemRoots::under(t);
    fs::create_dir_all(roots.accel_node().parent().expect("dev/accel")).expect("mkdir");
    fs::write(roots.accel_node(), "").expect("node");
    let fd = roots.proc_fd_dir(pid);
    fs::create_dir_all(&fd).expect("mkdir");
    symlink(roots.accel_node(), fd.join("7")).expect("symlink");
    roots
}

#[test]
fn a_stopped_npu_holder_gets_the_grace_and_is_never_sigkilled() {
    let t = common::tempdir("worker-holder");
    let mut cfg = cpu_config();
    cfg.stop.grace = Duration::from_secs(1);
    cfg.stop.allow_kill = true;
    let mut w = WorkerEngine::new(cfg);
    w.start().expect("start");
    let h = w.handle();
    let pid = pid_of(&h);
    // Marked as an NPU holder through a fake fd table; then hung.
    let roots = fake_npu_holder(&t, pid);
    assert!(onebit_tts::npu::holds_accel(pid, &roots).expect("fake fd table"));
    w.config_mut().stop.never_kill = NeverKill::AccelHolders(roots);
    kill(pid, libc::SIGSTOP);
    wait_for_state(pid, 'T');
    let t0 = Instant::now();
    let outcome = w.shutdown().expect("was running");
    let waited = t0.elapsed();
    assert_eq!(
        outcome,
        StopOutcome::LeftRunning {
            pid,
            holds_npu: true
        }
    );
    assert!(
        waited >= Duration::from_secs(1),
        "grace not given: {waited:?}"
    );
    assert_eq!(proc_state(pid), Some('T'), "still there, still stopped");
    assert_eq!(h.left_running(), [pid]);
    // The test cleans up by hand; the engine still reaps it.
    kill(pid, libc::SIGKILL);
    assert_eq!(
        h.wait_ending(pid, Duration::from_secs(10)),
        Some(Ending::Signal(libc::SIGKILL))
    );
    let _ = fs::remove_dir_all(&t);
}

#[test]
fn a_hung_cpu_worker_is_sigkilled_only_with_allow_kill() {
    let mut cfg = cpu_config();
    cfg.stop.grace = Duration::from_secs(1);
    cfg.stop.allow_kill = true;
    let mut w = WorkerEngine::new(cfg);
    w.start().expect("start");
    let h = w.handle();
    let pid = pid_of(&h);
    kill(pid, libc::SIGSTOP);
    wait_for_state(pid, 'T');
    let outcome = w.shutdown().expect("was running");
    assert_eq!(
        outcome,
        StopOutcome::Killed(Some(Ending::Signal(libc::SIGKILL)))
    );
    assert_eq!(
        outcome.ending().map(|e| e.to_string()).as_deref(),
        Some("signal 9")
    );
    assert!(h.left_running().is_empty());
}

#[test]
fn a_worker_hung_mid_request_fails_it_after_the_grace_and_the_next_request_respawns() {
    let (candidates, prompt) = engine_inputs();
    let mut cfg = cpu_config();
    cfg.stop.grace = Duration::from_secs(1);
    let mut w = WorkerEngine::new(cfg);
    w.start().expect("start");
    let h = w.handle();
    let pid = pid_of(&h);
    let long = GenerationParams {
        min_new_tokens: 3000,
        max_new_tokens: Some(3000),
        ..GenerationParams::default()
    };
    // At the first code the worker hangs (SIGSTOP) and the client stops: the cancel is never
    // answered.
    let t0 = Instant::now();
    let err = w
        .generate(
            &candidates,
            &prompt,
            &long,
            &CancelToken::new(),
            &mut |_| {
                if proc_state(pid) != Some('T') {
                    kill(pid, libc::SIGSTOP);
                    wait_for_state(pid, 'T');
                }
                ControlFlow::Break(())
            },
        )
        .expect_err("hung");
    assert!(
        t0.elapsed() >= Duration::from_secs(2),
        "grace to answer, grace after SIGTERM"
    );
    assert!(
        matches!(&err, EngineError::WorkerHung { pid: p, detail }
            if *p == pid && detail.contains("no answer") && detail.contains("left running")),
        "{err}"
    );
    // Not killed: CPU workers need --allow-kill.
    assert_eq!(h.left_running(), [pid]);
    assert_eq!(proc_state(pid), Some('T'));
    kill(pid, libc::SIGKILL);
    assert_eq!(
        h.wait_ending(pid, Duration::from_secs(10)),
        Some(Ending::Signal(libc::SIGKILL))
    );
    let short = GenerationParams {
        max_new_tokens: Some(5),
        ..GenerationParams::default()
    };
    let g = common::generate_plain(&mut w, &candidates, &prompt, &short).expect("a new worker");
    assert_eq!(g.codes.len(), 5);
    assert_eq!(h.spawns(), 2);
}

// ---------------------------------------------------------------------------------------------
// Timeouts, hangs, never two NPU workers, signals during load

/// Writes an executable script. `install` writes the file in its own process, so no write fd on
/// it can linger in a child another test thread is forking at that moment (exec would then fail
/// with ETXTBSY).
fn executable(dir: &Path, name: &str, text: &str) -> PathBuf {
    let src = dir.join(format!("{name}.txt"));
    fs::write(&src, text).expect("script");
    let path = dir.join(name);
    let ok = std::process::Command::new("install")
        .args(["-m", "755"])
        .arg(&src)
        .arg(&path)
        .status()
        .expect("install");
    assert!(ok.success());
    path
}

/// A fake worker: says hello like the real one, logs a line, then never loads (and does not
/// handle SIGTERM: it ends by the signal).
fn never_loads(dir: &Path) -> PathBuf {
    use onebit_tts::engine::worker::protocol::{Hello, PROTOCOL_VERSION, Reply, write_frame};
    let mut frame = Vec::new();
    let hello = Reply::Hello(Hello {
        protocol: PROTOCOL_VERSION,
        pid: 0,
        version: "fake".into(),
        env: Default::default(),
    });
    write_frame(&mut frame, &hello).expect("frame");
    let hello_file = dir.join("hello.bin");
    fs::write(&hello_file, frame).expect("hello");
    executable(
        dir,
        "never-loads",
        &format!(
            "#!/bin/sh\ncat '{}'\necho 'INFO fake worker: compiling the model for the NPU' >&2\n\
             exec sleep 1000\n",
            hello_file.display()
        ),
    )
}

#[test]
fn a_worker_that_never_reports_loaded_is_stopped_after_the_load_timeout_with_its_last_words() {
    let t = common::tempdir("worker-never-loads");
    let mut cfg = cpu_config();
    cfg.env.worker_exe = never_loads(&t);
    cfg.timeouts.load = Duration::from_secs(1);
    cfg.stop.grace = Duration::from_secs(5);
    let mut w = WorkerEngine::new(cfg);
    let h = w.handle();
    let t0 = Instant::now();
    let err = w.start().expect_err("never loads");
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let EngineError::WorkerHung { pid, detail } = &err else {
        panic!("{err}")
    };
    assert!(
        detail.contains("did not report the model loaded within 1 s (--load-timeout)"),
        "{detail}"
    );
    // Stopped by the policy: SIGTERM, which the fake does not handle.
    assert!(
        detail.contains("ended after SIGTERM (signal 15)"),
        "{detail}"
    );
    assert!(
        detail.contains("fake worker: compiling the model for the NPU"),
        "its last words: {detail}"
    );
    assert_eq!(h.ending(*pid), Some(Ending::Signal(libc::SIGTERM)));
    assert!(matches!(h.state(), WorkerState::Stopped { pid: p, .. } if p == *pid));
    let _ = fs::remove_dir_all(&t);
}

#[test]
fn sigterm_during_the_model_load_ends_the_worker_at_once() {
    let t = common::tempdir("worker-term-in-load");
    let mut cfg = cpu_config();
    // The real worker with the test hook that makes its load hang, as a long NPU compile does.
    cfg.env.worker_exe = executable(
        &t,
        "slow-load",
        &format!(
            "#!/bin/sh\nONEBIT_WORKER_TEST_HANG=load exec '{}' \"$@\"\n",
            common::bin().display()
        ),
    );
    let mut w = WorkerEngine::new(cfg);
    let h = w.handle();
    std::thread::scope(|s| {
        let started = s.spawn(|| w.start());
        let state = h
            .wait_state(Duration::from_secs(30), |s| {
                matches!(s, WorkerState::Loading { .. })
            })
            .expect("loading");
        let pid = state.pid().expect("pid");
        assert!(h.wait_log("hanging inside the model load", Duration::from_secs(30)));
        let t0 = Instant::now();
        kill(pid, libc::SIGTERM);
        let ending = h
            .wait_ending(pid, Duration::from_secs(10))
            .expect("ended promptly, not after the load");
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        assert_eq!(
            ending,
            Ending::Exit(i32::from(
                onebit_tts::engine::worker::child::EXIT_STOPPED_DURING_LOAD
            ))
        );
        let err = started
            .join()
            .expect("thread")
            .expect_err("stopped in load");
        let msg = err.to_string();
        assert!(
            msg.contains("the worker ended while loading the model") && msg.contains("exit 75"),
            "{msg}"
        );
        assert!(
            msg.contains("SIGTERM during the model load: exiting now (status 75)"),
            "the reason is in its last words: {msg}"
        );
    });
    let _ = fs::remove_dir_all(&t);
}

/// Runs a 3000-code request on `w` on another thread; the worker is SIGSTOPped at its first
/// code and the client never cancels, so only the step timeout can end it. Returns the error
/// and the state /health showed while the hung worker was being stopped.
fn hang_mid_request(w: &mut WorkerEngine) -> (EngineError, WorkerState) {
    let (candidates, prompt) = engine_inputs();
    let h = w.handle();
    let pid = pid_of(&h);
    let long = GenerationParams {
        min_new_tokens: 3000,
        max_new_tokens: Some(3000),
        ..GenerationParams::default()
    };
    std::thread::scope(|s| {
        let run = s.spawn(|| {
            w.generate(
                &candidates,
                &prompt,
                &long,
                &CancelToken::new(),
                &mut |_| {
                    if proc_state(pid) != Some('T') {
                        kill(pid, libc::SIGSTOP);
                        wait_for_state(pid, 'T');
                    }
                    ControlFlow::Continue(())
                },
            )
        });
        let seen = h
            .wait_state(Duration::from_secs(30), |s| {
                matches!(s, WorkerState::Hung { .. })
            })
            .expect("hung state");
        let err = run.join().expect("thread").expect_err("hung");
        (err, seen)
    })
}

#[test]
fn a_worker_hung_mid_request_fails_it_after_the_step_timeout() {
    let mut cfg = cpu_config();
    cfg.timeouts.step = Duration::from_secs(1);
    cfg.stop.grace = Duration::from_secs(1);
    cfg.stop.allow_kill = true;
    let mut w = WorkerEngine::new(cfg);
    w.start().expect("start");
    let h = w.handle();
    let pid = pid_of(&h);
    let (err, seen) = hang_mid_request(&mut w);
    assert!(
        matches!(&seen, WorkerState::Hung { pid: p, reason } if *p == pid
            && reason.contains("within 1 s (--step-timeout)")),
        "{seen:?}"
    );
    assert!(
        matches!(&err, EngineError::WorkerHung { pid: p, detail } if *p == pid
            && detail.contains("no code and no end of request")
            && detail.contains("SIGKILLed after the grace")),
        "{err}"
    );
    assert_eq!(ApiError::from(SynthError::Engine(err)).status.as_u16(), 503);
    // Not an NPU holder: killed (allowed here), and the next request starts a new worker.
    assert_eq!(h.ending(pid), Some(Ending::Signal(libc::SIGKILL)));
    let (candidates, prompt) = engine_inputs();
    let g = w
        .generate(
            &candidates,
            &prompt,
            &GenerationParams {
                max_new_tokens: Some(5),
                ..GenerationParams::default()
            },
            &CancelToken::new(),
            &mut |_| ControlFlow::Continue(()),
        )
        .expect("a new worker");
    assert_eq!(g.codes.len(), 5);
    assert_eq!(h.spawns(), 2);
    assert!(matches!(h.state(), WorkerState::Ready { pid: p } if p != pid));
}

#[test]
fn no_second_worker_starts_beside_a_hung_npu_holder_until_it_exits() {
    let t = common::tempdir("worker-never-two");
    let (candidates, prompt) = engine_inputs();
    let short = GenerationParams {
        max_new_tokens: Some(5),
        ..GenerationParams::default()
    };
    let mut cfg = cpu_config();
    cfg.timeouts.step = Duration::from_secs(1);
    cfg.stop.grace = Duration::from_secs(1);
    cfg.stop.allow_kill = true;
    let mut w = WorkerEngine::new(cfg);
    w.start().expect("start");
    let h = w.handle();
    let pid = pid_of(&h);
    // A holder of the (fake) NPU: never SIGKILLed, whatever --allow-kill says.
    w.config_mut().stop.never_kill = NeverKill::AccelHolders(fake_npu_holder(&t, pid));
    let (err, _) = hang_mid_request(&mut w);
    assert!(
        matches!(&err, EngineError::WorkerHung { detail, .. }
            if detail.contains("holds the NPU and is never SIGKILLed")),
        "{err}"
    );
    assert_eq!(proc_state(pid), Some('T'), "left running, still stopped");
    let waiting = format!("waiting for worker pid {pid} to exit before respawning");
    assert!(
        matches!(h.state(), WorkerState::WaitingForExit { pid: p, reason }
            if p == pid && reason.contains(&waiting)),
        "{:?}",
        h.state()
    );
    assert!(h.state().is_unavailable());
    // The next request does not start a second worker beside it.
    let err = common::generate_plain(&mut w, &candidates, &prompt, &short)
        .expect_err("no respawn while the holder lives");
    assert!(
        matches!(&err, EngineError::Unavailable(r) if r.contains(&waiting)),
        "{err}"
    );
    assert_eq!(ApiError::from(SynthError::Engine(err)).status.as_u16(), 503);
    assert_eq!(h.spawns(), 1);
    // Let it go on: the SIGTERM it was sent is delivered, and it exits cleanly.
    kill(pid, libc::SIGCONT);
    assert_eq!(
        h.wait_ending(pid, Duration::from_secs(30)),
        Some(Ending::Exit(0))
    );
    assert!(!h.state().is_unavailable(), "{:?}", h.state());
    let g = common::generate_plain(&mut w, &candidates, &prompt, &short)
        .expect("respawned once the holder exited");
    assert_eq!(g.codes.len(), 5);
    assert_eq!(h.spawns(), 2);
    let _ = fs::remove_dir_all(&t);
}

/// GET /health of a server over `synth`.
async fn health_of(synth: std::sync::Arc<Synthesizer>) -> (u16, serde_json::Value) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cfg = onebit_tts::server::ServerConfig {
        addr,
        ..onebit_tts::server::ServerConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(onebit_tts::server::serve_on(
        listener,
        synth,
        cfg,
        async move {
            let _ = stopped.await;
        },
    ));
    let r = reqwest::get(format!("http://{addr}/health"))
        .await
        .expect("health");
    let status = r.status().as_u16();
    let body = r.json().await.expect("json");
    let _ = stop.send(());
    task.await.expect("task").expect("serve");
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_shows_the_worker_state_and_is_503_while_waiting_for_a_holder_to_exit() {
    let t = common::tempdir("worker-health");
    let (w, pid) = tokio::task::spawn_blocking({
        let t = t.clone();
        move || {
            let mut cfg = cpu_config();
            cfg.timeouts.step = Duration::from_secs(1);
            cfg.stop.grace = Duration::from_secs(1);
            let mut w = WorkerEngine::new(cfg);
            w.start().expect("start");
            let pid = pid_of(&w.handle());
            w.config_mut().stop.never_kill = NeverKill::AccelHolders(fake_npu_holder(&t, pid));
            (w, pid)
        }
    })
    .await
    .expect("start");
    let h = w.handle();
    let w = tokio::task::spawn_blocking(move || {
        let mut w = w;
        hang_mid_request(&mut w);
        w
    })
    .await
    .expect("hang");
    let synth = tokio::task::spawn_blocking(move || synth_with(w))
        .await
        .expect("synth");
    // Kept past the server: its engine's watchdog is what reaps the holder once it exits.
    let synth = std::sync::Arc::new(synth);
    let (status, health) = health_of(synth.clone()).await;
    assert_eq!(status, 503, "{health}");
    assert_eq!(health["status"], "unavailable");
    assert_eq!(health["ready"], false);
    assert_eq!(health["worker"]["state"], "waiting_for_exit", "{health}");
    assert_eq!(health["worker"]["pid"], pid);
    assert!(
        health["worker"]["detail"]
            .as_str()
            .is_some_and(|d| d.contains(&format!(
                "waiting for worker pid {pid} to exit before respawning"
            ))),
        "{health}"
    );
    // The holder takes its pending SIGTERM and exits; the engine, still there, sees it end.
    kill(pid, libc::SIGCONT);
    assert_eq!(
        h.wait_ending(pid, Duration::from_secs(10)),
        Some(Ending::Exit(0))
    );
    assert!(h.pid().is_none());
    drop(synth);
    let _ = fs::remove_dir_all(&t);

    // A worker that serves: 200, "ready" with its pid.
    let synth = tokio::task::spawn_blocking(|| Synthesizer::load(&synth_config(true)))
        .await
        .expect("load")
        .expect("worker");
    let pid = synth.worker().and_then(WorkerHandle::pid).expect("pid");
    let (status, health) = health_of(std::sync::Arc::new(synth)).await;
    assert_eq!(status, 200, "{health}");
    assert_eq!(
        health["worker"],
        serde_json::json!({"state": "ready", "pid": pid,
            "detail": format!("worker pid {pid} ready")})
    );
}

#[test]
fn a_respawn_is_gated_on_residency_again_and_an_unproven_one_stops_serving() {
    use onebit_tts::engine::ResidencyGate;
    let (candidates, prompt) = engine_inputs();
    let short = GenerationParams {
        max_new_tokens: Some(5),
        ..GenerationParams::default()
    };
    let mut w = WorkerEngine::new(cpu_config());
    w.start().expect("start");
    let h = w.handle();
    let first = pid_of(&h);
    // From the next start on, the load must prove NPU residency, which a CPU worker cannot.
    w.config_mut().gate = Some(ResidencyGate {
        require_npu: true,
        allow_cpu_fallback: false,
    });
    kill(first, libc::SIGKILL);
    assert!(h.wait_ending(first, Duration::from_secs(10)).is_some());
    let err = common::generate_plain(&mut w, &candidates, &prompt, &short)
        .expect_err("the respawn is not proven");
    let why = "--require-npu: npu residency: unproven: the worker reported no evidence";
    assert!(matches!(&err, EngineError::Device(m) if m == why), "{err}");
    assert_eq!(h.spawns(), 2);
    let second = h.hello().expect("the respawn said hello").pid;
    assert_ne!(second, first);
    assert!(
        h.wait_ending(second, Duration::from_secs(10)).is_some(),
        "the unproven respawn was stopped"
    );
    assert!(
        matches!(h.state(), WorkerState::Unavailable { reason } if reason.contains(why)),
        "{:?}",
        h.state()
    );
    // Stays unavailable: no third worker, the same reason.
    let err = common::generate_plain(&mut w, &candidates, &prompt, &short)
        .expect_err("still unavailable");
    assert!(
        matches!(&err, EngineError::Unavailable(r) if r.contains(why)),
        "{err}"
    );
    assert_eq!(h.spawns(), 2);
}

/// Lines of a child's stderr, as they come.
fn lines_of(stderr: std::process::ChildStderr) -> std::sync::mpsc::Receiver<String> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Reads lines until one contains `needle` (bounded); returns it and everything read.
fn read_until(rx: &std::sync::mpsc::Receiver<String>, needle: &str, seen: &mut String) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("no line with {needle:?} ({e}):\n{seen}"));
        seen.push_str(&line);
        seen.push('\n');
        if line.contains(needle) {
            return line;
        }
    }
}

#[test]
fn a_parent_exiting_behind_a_worker_in_a_long_grace_says_what_it_waits_for() {
    let model = common::model(MODEL);
    let mut cmd = std::process::Command::new(common::bin());
    cmd.args(["serve", "--isolate", "--port", "0", "--model"])
        .arg(&model)
        .env("ONEBIT_BACKEND_STOP_GRACE_S", "86400")
        .env("ONEBIT_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let mut parent = cmd.spawn().expect("serve");
    let rx = lines_of(parent.stderr.take().expect("stderr"));
    let mut log = String::new();
    let ready = read_until(&rx, "ready on cpu", &mut log);
    let pid: u32 = ready
        .split("worker pid ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("pid in {ready:?}"));
    read_until(&rx, "listening", &mut log);
    // The worker hangs; then the server is asked to stop.
    kill(pid, libc::SIGSTOP);
    wait_for_state(pid, 'T');
    kill(parent.id(), libc::SIGTERM);
    read_until(
        &rx,
        &format!("waiting for worker pid {pid} to exit: 86400 s of grace left"),
        &mut log,
    );
    assert!(
        parent.try_wait().expect("wait").is_none(),
        "the parent waits for its worker"
    );
    // Once the worker may run, it takes its pending SIGTERM and exits; the parent follows.
    kill(pid, libc::SIGCONT);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = parent.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "parent still running:\n{log}");
        std::thread::sleep(Duration::from_millis(20));
    };
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(5)) {
        log.push_str(&line);
        log.push('\n');
    }
    assert!(status.success(), "{status:?}\n{log}");
    assert!(
        log.contains(&format!("worker pid {pid}: ended after SIGTERM (exit 0)")),
        "{log}"
    );
}

// ---------------------------------------------------------------------------------------------
// Crashes, respawn and the retry

#[test]
fn a_crash_mid_request_is_a_503_and_the_next_request_respawns_the_worker() {
    let synth = Synthesizer::load(&synth_config(true)).expect("worker");
    let h = synth.worker().expect("worker").clone();
    let first = pid_of(&h);
    let described = synth.engine_description();
    assert!(
        described.starts_with(&format!("worker pid {first}: ")),
        "{described}"
    );
    let (r, bytes) = synthesize(&synth, &long_request(false), |index| {
        if index == 0 {
            kill(first, libc::SIGKILL);
        }
    });
    let err = r.expect_err("the worker died");
    assert!(bytes.is_empty());
    assert!(
        matches!(&err, SynthError::Engine(EngineError::WorkerCrashed { pid, ending })
            if *pid == first && ending == "signal 9"),
        "{err}"
    );
    assert_eq!(ApiError::from(err).status.as_u16(), 503);
    assert_eq!(h.ending(first), Some(Ending::Signal(libc::SIGKILL)));
    assert_eq!(h.spawns(), 1, "CPU workers are not retried by default");

    let (r, bytes) = synthesize(&synth, &request(false), |_| {});
    let report = r.expect("the next request succeeds");
    assert!(!report.codes.is_empty() && !bytes.is_empty());
    assert_eq!(h.spawns(), 2);
    assert_ne!(h.pid(), Some(first));
    // The engine line (/health's) is read live: it names the respawned worker, not the first.
    let second = pid_of(&h);
    let described = synth.engine_description();
    assert!(
        described.starts_with(&format!("worker pid {second}: ")),
        "{described} after the respawn of {first} as {second}"
    );
}

/// A worker engine that retries after `delay`, as the NPU route does.
fn retrying(delay: Duration) -> (Synthesizer, WorkerHandle) {
    let mut w = WorkerEngine::new(cpu_config());
    w.start().expect("start");
    let h = w.handle();
    (synth_with(w).with_retry(Some(delay)), h)
}

#[test]
fn a_failed_whole_file_request_is_retried_once_after_the_delay() {
    let (synth, h) = retrying(Duration::from_secs(1));
    // The first 30 codes of the take, without a crash (the client stops there).
    let stop_at_30 = |i: usize| {
        if i == 29 {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    };
    let (r, _) = synthesize_until(&synth, &long_request(false), stop_at_30);
    let reference = r.expect("reference").codes;
    assert_eq!(reference.len(), 30);

    // The first attempt dies at its first code; the retry runs the same take.
    let attempts = AtomicUsize::new(0);
    let t0 = Instant::now();
    let (r, _) = synthesize_until(&synth, &long_request(false), |index| {
        if index == 0 && attempts.fetch_add(1, Ordering::SeqCst) == 0 {
            kill(pid_of(&h), libc::SIGKILL);
        }
        stop_at_30(index)
    });
    let report = r.expect("the retry succeeds");
    assert!(t0.elapsed() >= Duration::from_secs(1), "retried after 1 s");
    assert_eq!(attempts.load(Ordering::SeqCst), 2, "one retry");
    assert_eq!(h.spawns(), 2);
    assert_eq!(report.codes, reference, "same take as without the crash");

    // Dying on every attempt: one retry, then the error.
    let kills = AtomicUsize::new(0);
    let (r, _) = synthesize(&synth, &long_request(false), |index| {
        if index == 0 {
            kills.fetch_add(1, Ordering::SeqCst);
            kill(pid_of(&h), libc::SIGKILL);
        }
    });
    let err = r.expect_err("fails after one retry");
    assert_eq!(kills.load(Ordering::SeqCst), 2, "exactly one retry");
    assert_eq!(ApiError::from(err).status.as_u16(), 503);
    assert_eq!(h.spawns(), 3);
}

#[test]
fn a_stream_is_never_retried() {
    let (synth, h) = retrying(Duration::from_secs(1));
    let kills = AtomicUsize::new(0);
    let (r, _) = synthesize(&synth, &long_request(true), |index| {
        if index == 0 {
            kills.fetch_add(1, Ordering::SeqCst);
            kill(pid_of(&h), libc::SIGKILL);
        }
    });
    let err = r.expect_err("a stream fails");
    assert_eq!(kills.load(Ordering::SeqCst), 1, "no retry");
    assert_eq!(h.spawns(), 1, "no new worker until the next request");
    assert_eq!(ApiError::from(err).status.as_u16(), 503);
    // The next stream gets a new worker.
    let (r, bytes) = synthesize(&synth, &request(true), |_| {});
    assert!(r.is_ok() && !bytes.is_empty());
    assert_eq!(h.spawns(), 2);
}

// ---------------------------------------------------------------------------------------------
// The NPU environment, as the worker sees it

struct Tree {
    root: PathBuf,
    venv: PathBuf,
    xrt: PathBuf,
}

/// A fake RyzenAI venv and XRT tree; the provider "library" is an empty file, so registering
/// it fails with ONNX Runtime's own error after the worker has reported its environment.
fn fake_tree(tag: &str) -> Tree {
    let root = common::tempdir(tag);
    let venv = root.join("venv");
    let xrt = root.join("xrt");
    fs::create_dir_all(venv.join("deployment/lib")).expect("mkdir");
    fs::write(venv.join("deployment/lib").join(PROVIDER_FILE), "").expect("provider");
    fs::create_dir_all(xrt.join("lib")).expect("mkdir");
    Tree { root, venv, xrt }
}

fn npu_inputs(t: &Tree, worker_exe: PathBuf) -> EnvInputs {
    EnvInputs {
        provider_declared: true,
        ryzenai_root: Some(t.venv.clone()),
        xrt_root_knob: Some(t.xrt.clone()),
        xilinx_xrt: Some("/elsewhere/xrt".into()),
        ld_library_path: Some("/usr/local/lib:/opt/other".into()),
        ryzenai_ep_path: None,
        system_lib_dir: Some("/lib/x86_64-linux-gnu".into()),
        worker_exe,
    }
}

/// Starts an NPU worker over `inputs`; returns what it reported and the load error.
fn npu_worker(t: &Tree, inputs: EnvInputs) -> (Vec<(String, Option<String>)>, EngineError) {
    let mut cfg = cpu_config();
    cfg.ort.device = Device::Npu;
    cfg.env = inputs;
    cfg.roots = SystemRoots::under(t.root.join("sys-root"));
    let mut w = WorkerEngine::new(cfg);
    let err = w.start().expect_err("no NPU here");
    let hello = w.handle().hello().expect("the worker said hello");
    (hello.env.into_iter().collect(), err)
}

fn expected(plan: &EnvPlan) -> Vec<(String, Option<String>)> {
    let mut v: Vec<(String, Option<String>)> = plan
        .vars()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), Some(v.to_string_lossy().into_owned())))
        .collect();
    // Reported beside the plan's: XRT's configuration file, as the worker inherits it.
    v.push((
        "XRT_INI_PATH".to_owned(),
        std::env::var("XRT_INI_PATH").ok(),
    ));
    v.sort();
    v
}

#[test]
fn the_npu_worker_gets_exactly_the_planned_environment() {
    let t = fake_tree("worker-env");
    // Provider in the venv; ONEBIT_XRT_ROOT beats $XILINX_XRT; the old search path last.
    let inputs = npu_inputs(&t, common::bin());
    let plan = worker_env(&inputs).expect("plan");
    let EnvPlan::Set(w) = &plan else {
        panic!("expected a plan")
    };
    assert!(!w.provider_beside_worker);
    let (env, err) = npu_worker(&t, inputs);
    assert_eq!(env, expected(&plan));
    assert_eq!(
        env[0].1.as_deref(),
        Some(
            format!(
                "/lib/x86_64-linux-gnu:{}:{}:/usr/local/lib:/opt/other",
                t.venv.join("deployment/lib").display(),
                t.xrt.join("lib").display()
            )
            .as_str()
        )
    );
    let msg = err.to_string();
    let provider = t.venv.join("deployment/lib").join(PROVIDER_FILE);
    assert!(
        msg.contains("RyzenAI provider: registering the provider library")
            && msg.contains(&provider.display().to_string()),
        "{msg}"
    );

    // A worker with its own provider copy beside it: its directory before the venv.
    let bin_dir = t.root.join("bin");
    fs::create_dir_all(&bin_dir).expect("mkdir");
    symlink(common::bin(), bin_dir.join("onebit-tts")).expect("symlink");
    fs::write(bin_dir.join(PROVIDER_FILE), "").expect("provider copy");
    let mut inputs = npu_inputs(&t, bin_dir.join("onebit-tts"));
    inputs.xrt_root_knob = None;
    let plan = worker_env(&inputs).expect("plan");
    let (env, err) = npu_worker(&t, inputs);
    assert_eq!(env, expected(&plan));
    let ld = env[0].1.clone().expect("LD_LIBRARY_PATH");
    assert!(
        ld.starts_with(&format!(
            "/lib/x86_64-linux-gnu:{}:{}:/elsewhere/xrt/lib",
            bin_dir.display(),
            t.venv.join("deployment/lib").display()
        )),
        "{ld}"
    );
    assert_eq!(
        env[1],
        (
            "RYZENAI_EP_PATH".to_owned(),
            Some(bin_dir.join(PROVIDER_FILE).display().to_string())
        )
    );
    assert_eq!(
        env[2],
        (
            "RYZEN_AI_INSTALLATION_PATH".into(),
            Some(t.venv.display().to_string())
        )
    );
    assert_eq!(env[3], ("XILINX_XRT".into(), Some("/elsewhere/xrt".into())));
    assert!(
        err.to_string()
            .contains(&bin_dir.join(PROVIDER_FILE).display().to_string())
    );

    // A RYZENAI_EP_PATH the user exported reaches the worker as it is, and the provider is
    // registered from it.
    let mine = t.root.join("mine").join(PROVIDER_FILE);
    let mut inputs = npu_inputs(&t, common::bin());
    inputs.ryzenai_ep_path = Some(mine.clone());
    let (env, err) = npu_worker(&t, inputs);
    assert_eq!(
        env[1],
        (
            "RYZENAI_EP_PATH".to_owned(),
            Some(mine.display().to_string())
        )
    );
    assert!(
        err.to_string().contains(&mine.display().to_string()),
        "{err}"
    );

    // The knob unset: the worker inherits this process's environment unchanged.
    let mut inputs = npu_inputs(&t, common::bin());
    inputs.ryzenai_root = None;
    assert!(matches!(worker_env(&inputs), Ok(EnvPlan::Unchanged(_))));
    let (env, _) = npu_worker(&t, inputs);
    let ours: Vec<(String, Option<String>)> = [
        "LD_LIBRARY_PATH",
        "RYZENAI_EP_PATH",
        "RYZEN_AI_INSTALLATION_PATH",
        "XILINX_XRT",
        "XRT_INI_PATH",
    ]
    .iter()
    .map(|k| {
        (
            (*k).to_owned(),
            std::env::var_os(k).map(|v: OsString| v.to_string_lossy().into_owned()),
        )
    })
    .collect();
    assert_eq!(env, ours);
    let _ = fs::remove_dir_all(&t.root);
}

// ---------------------------------------------------------------------------------------------
// The command line

fn cli(args: &[&str], env: &[(&str, &Path)]) -> std::process::Output {
    common::cli_with(args, env)
}

#[test]
fn device_flags_fail_loudly_without_an_npu() {
    let out = common::tempdir("worker-cli").join("out.wav");
    let model = common::model(MODEL);
    let base = [
        "say",
        "-q",
        "--model",
        model.to_str().expect("utf-8"),
        "--voice",
        "test",
        "-o",
        out.to_str().expect("utf-8"),
    ];
    // auto on a CPU package is cpu, which --require-npu refuses.
    let mut args = base.to_vec();
    args.extend(["--require-npu", "hello"]);
    let o = cli(&args, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("--require-npu: the backbone would run on cpu (auto: the model does not declare the RyzenAI provider)"),
        "{err}"
    );
    // --device npu with a fake venv: the worker starts, the provider cannot be registered,
    // and the error says so in one line.
    let t = fake_tree("worker-cli-npu");
    let mut args = base.to_vec();
    args.extend(["--device", "npu", "hello"]);
    let o = cli(&args, &[("ONEBIT_RYZENAI_ROOT", &t.venv)]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("RyzenAI provider"), "{err}");
    assert!(!out.exists());
    let _ = fs::remove_dir_all(&t.root);
}
