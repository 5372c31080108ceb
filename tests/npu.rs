//! The NPU module from the outside: the worker's environment rules, the doctor over a fake
//! system tree, the residency proof over fake and real /proc fd tables, and the stop policy
//! with real child processes. No NPU is needed: every system file lives in a temp dir.
//!
//! Lifecycle tests never sleep to synchronise: they wait on observable state (a line the child
//! prints, the process state in /proc, a channel from the watchdog).

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use onebit_tts::engine::worker::supervisor::{
    Child, Ending, NeverKill, StopGrace, StopOutcome, StopPolicy,
};
use onebit_tts::npu::doctor::{self, CommandOutput, DoctorInputs, Host, Identity, Limit, Memlock};
use onebit_tts::npu::env::{EnvInputs, EnvPlan, Unchanged, XrtSource, worker_env};
use onebit_tts::npu::residency::{
    Evidence, Placement, ResidencyState, read_mem_usage, sample_accel, sample_mem_usage, weigh_npu,
};
use onebit_tts::npu::xdna::{CountersError, DriverVersion, HwContext, HwContexts, Query};
use onebit_tts::npu::{NpuError, PROVIDER_FILE, PROVIDER_NAME, Status, SystemRoots, holds_accel};

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "onebit-npu-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn write(p: &Path, text: &str) {
    fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    fs::write(p, text).expect("write");
}

// ---------------------------------------------------------------------------------------------
// Worker environment

fn env_inputs(worker_dir: &Path) -> EnvInputs {
    EnvInputs {
        provider_declared: true,
        ryzenai_root: Some("/opt/ryzenai/venv".into()),
        xrt_root_knob: None,
        xilinx_xrt: None,
        ld_library_path: None,
        ryzenai_ep_path: None,
        system_lib_dir: Some("/lib/x86_64-linux-gnu".into()),
        worker_exe: worker_dir.join("onebit-tts"),
    }
}

fn vars(plan: &EnvPlan) -> Vec<(&'static str, OsString)> {
    plan.vars()
}

#[test]
fn env_in_amds_order_when_the_worker_has_no_provider_copy() {
    let t = TempDir::new("env-plain");
    let mut i = env_inputs(&t.0);
    i.ld_library_path = Some("/usr/local/lib".into());
    let plan = worker_env(&i).expect("plan");
    assert_eq!(
        vars(&plan),
        [
            ("XILINX_XRT", OsString::from("/opt/xilinx/xrt")),
            (
                "LD_LIBRARY_PATH",
                OsString::from(
                    "/lib/x86_64-linux-gnu:/opt/ryzenai/venv/deployment/lib:/opt/xilinx/xrt/lib:\
                     /usr/local/lib"
                )
            ),
            (
                "RYZENAI_EP_PATH",
                OsString::from(
                    "/opt/ryzenai/venv/deployment/lib/libonnxruntime_providers_ryzenai.so"
                )
            ),
            (
                "RYZEN_AI_INSTALLATION_PATH",
                OsString::from("/opt/ryzenai/venv")
            ),
        ]
    );
}

#[test]
fn env_worker_dir_before_venv_lib_when_the_provider_is_beside_it() {
    let t = TempDir::new("env-beside");
    write(&t.0.join(PROVIDER_FILE), "");
    let mut i = env_inputs(&t.0);
    i.xilinx_xrt = Some("/usr/xrt".into());
    let plan = worker_env(&i).expect("plan");
    let EnvPlan::Set(w) = plan else {
        panic!("expected a plan")
    };
    assert_eq!(w.xrt_source, XrtSource::XilinxXrt);
    assert_eq!(
        w.ld_library_path,
        OsString::from(format!(
            "/lib/x86_64-linux-gnu:{}:/opt/ryzenai/venv/deployment/lib:/usr/xrt/lib",
            t.0.display()
        ))
    );
    assert_eq!(w.ryzenai_ep_path, t.0.join(PROVIDER_FILE));
}

#[test]
fn env_knob_beats_xilinx_xrt_and_duplicates_go() {
    let t = TempDir::new("env-knob");
    let mut i = env_inputs(&t.0);
    i.xrt_root_knob = Some("/x/xrt".into());
    i.xilinx_xrt = Some("/usr/xrt".into());
    i.ld_library_path = Some(":/x/xrt/lib/::/a:/opt/ryzenai/venv/deployment/lib:/a:".into());
    let EnvPlan::Set(w) = worker_env(&i).expect("plan") else {
        panic!("expected a plan")
    };
    assert_eq!(w.xilinx_xrt, Path::new("/x/xrt"));
    assert_eq!(w.xrt_source, XrtSource::Knob);
    assert_eq!(
        w.ld_library_path,
        OsString::from("/lib/x86_64-linux-gnu:/opt/ryzenai/venv/deployment/lib:/x/xrt/lib:/a")
    );
}

#[test]
fn env_unchanged_for_cpu_models_and_without_the_knob() {
    let t = TempDir::new("env-off");
    let mut i = env_inputs(&t.0);
    i.provider_declared = false;
    assert_eq!(
        worker_env(&i).expect("plan"),
        EnvPlan::Unchanged(Unchanged::CpuModel)
    );
    let mut i = env_inputs(&t.0);
    i.ryzenai_root = None;
    let plan = worker_env(&i).expect("plan");
    assert_eq!(plan, EnvPlan::Unchanged(Unchanged::NoRyzenAiRoot));
    let mut cmd = Command::new("true");
    plan.apply(&mut cmd);
    assert_eq!(cmd.get_envs().count(), 0);
}

#[test]
fn env_reaches_a_real_child() {
    let t = TempDir::new("env-child");
    let plan = worker_env(&env_inputs(&t.0)).expect("plan");
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "printf '%s|%s|%s' \"$XILINX_XRT\" \"$LD_LIBRARY_PATH\" \"$RYZENAI_EP_PATH\"",
    ]);
    plan.apply(&mut cmd);
    let out = cmd.output().expect("sh");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "/opt/xilinx/xrt|/lib/x86_64-linux-gnu:/opt/ryzenai/venv/deployment/lib:\
         /opt/xilinx/xrt/lib|/opt/ryzenai/venv/deployment/lib/libonnxruntime_providers_ryzenai.so"
    );
}

// ---------------------------------------------------------------------------------------------
// Doctor

struct Answers {
    id: Identity,
    memlock: Memlock,
    log: Option<String>,
}

impl Host for Answers {
    fn identity(&self) -> Identity {
        self.id.clone()
    }
    fn memlock(&self) -> Result<Memlock, NpuError> {
        Ok(self.memlock)
    }
    fn kernel_log(&self) -> Result<String, NpuError> {
        self.log.clone().ok_or(NpuError::Command {
            program: "dmesg".into(),
            reason: "Operation not permitted".into(),
        })
    }
    fn run(
        &self,
        program: &Path,
        _args: &[&str],
        _env: &[(&str, OsString)],
    ) -> Result<CommandOutput, NpuError> {
        // The provider's libraries, as a box where they load (the real loader's answers are
        // doctor_checks_that_the_provider_loads_on_the_workers_library_path's).
        if program == Path::new("ldd") {
            return Ok(CommandOutput {
                code: Some(0),
                stdout: "\tlibonnxruntime.so.1 => /venv/deployment/lib/libonnxruntime.so.1 \
                         (0x00007f01)\n"
                    .into(),
                stderr: String::new(),
            });
        }
        Err(NpuError::Command {
            program: program.display().to_string(),
            reason: "not in this test".into(),
        })
    }
    fn modinfo(&self, _module: &str) -> Result<String, NpuError> {
        Ok(
            "filename:       /lib/modules/6.18.0/kernel/drivers/accel/amdxdna/amdxdna.ko.zst\n"
                .into(),
        )
    }
    /// A mainline driver with one other process's context (the fake tree's node is a plain
    /// file, on which the real query answers ENOTTY: the doctor's unit tests cover that).
    fn hw_contexts(&self, _node: &Path) -> Result<HwContexts, CountersError> {
        Ok(HwContexts {
            driver: DriverVersion {
                name: "amdxdna_accel_driver".into(),
                major: 0,
                minor: 6,
                patch: 0,
            },
            query: Query::GetArray,
            contexts: vec![HwContext {
                context_id: 1,
                pid: 77,
                start_col: 0,
                num_col: 4,
                command_submissions: 10,
                command_completions: 10,
            }],
        })
    }
}

/// A Strix Halo box as the doctor sees it, all in a temp dir.
fn fake_system(t: &TempDir) -> DoctorInputs {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let roots = SystemRoots::under(&t.0);
    write(&roots.proc.join("modules"), "amdxdna 200704 0 - Live 0x0\n");
    write(&roots.proc.join("self/uid_map"), "0 0 4294967295\n");
    write(&roots.proc.join("meminfo"), "HugePages_Total:      64\n");
    write(
        &roots.proc.join("mounts"),
        &format!(
            "hugetlbfs {} hugetlbfs rw 0 0\n",
            roots.hugepages_mount().display()
        ),
    );
    let pci = roots.pci_devices().join("0000:c5:00.1");
    write(&pci.join("vendor"), "0x1022\n");
    write(&pci.join("device"), "0x17f0\n");
    write(&pci.join("revision"), "0x11\n");
    fs::create_dir_all(roots.sys.join("bus/pci/drivers/amdxdna")).expect("mkdir");
    symlink("../../../bus/pci/drivers/amdxdna", pci.join("driver")).expect("symlink");
    write(&roots.accel_sysfs_device().join("fw_version"), "1.1.2.0\n");
    write(&roots.lib.join("firmware/amdnpu/17f0_11/npu.sbin"), "fw");
    let node = roots.accel_node();
    write(&node, "");
    fs::set_permissions(&node, fs::Permissions::from_mode(0o660)).expect("chmod");
    let gid = fs::metadata(&node).expect("meta").gid();
    write(&roots.etc.join("group"), &format!("render:x:{gid}:\n"));
    let xrt = t.0.join("xrt");
    write(&xrt.join("lib/libxrt_coreutil.so.2.20.0"), "");
    write(&xrt.join("lib/libxrt_driver_xdna.so.2"), "");
    let venv = t.0.join("venv");
    write(&venv.join("deployment/lib/libonnxruntime-genai.so"), "");
    write(&venv.join("deployment/lib").join(PROVIDER_FILE), "");
    write(&venv.join("pyvenv.cfg"), "version = 3.12.10\n");
    write(
        &venv.join("lib/python3.12/site-packages/onnxruntime-1.24.4.dist-info/METADATA"),
        "Name: onnxruntime\nVersion: 1.24.4\n",
    );
    DoctorInputs {
        roots,
        ryzenai_root: Some(venv),
        xrt_root_knob: Some(xrt),
        xilinx_xrt: None,
        worker_exe: Some(t.0.join("bin/onebit-tts")),
        xrt_ini: None,
        cwd: None,
        probed: None,
    }
}

fn render_user(inputs: &DoctorInputs) -> Answers {
    use std::os::unix::fs::MetadataExt;
    let m = fs::metadata(inputs.roots.accel_node()).expect("node");
    Answers {
        id: Identity {
            uid: m.uid().wrapping_add(1000),
            gid: m.gid().wrapping_add(1),
            groups: vec![m.gid()],
        },
        memlock: Memlock {
            soft: Limit::Unlimited,
            hard: Limit::Unlimited,
        },
        log: Some("[drm] Initialized amdxdna 0.6.0 for 0000:c5:00.1 on minor 0\n".into()),
    }
}

#[test]
fn doctor_passes_a_ready_box() {
    let t = TempDir::new("doctor-ok");
    let inputs = fake_system(&t);
    let report = doctor::run(&inputs, &render_user(&inputs));
    let text = report.to_text();
    // Everything passes but residency, which only a probe can prove.
    assert!(
        report
            .checks
            .iter()
            .all(|c| c.status == Status::Pass || c.name == "residency"),
        "{text}"
    );
    assert_eq!(report.exit_code(), 0);
    assert!(text.contains("PASS  XRT: 2.20.0 at "), "{text}");
    assert!(
        text.contains("SKIP  residency: not measured by doctor"),
        "{text}"
    );
    assert!(
        text.ends_with("npu doctor: 21 pass, 0 warn, 0 fail, 1 skip\n"),
        "{text}"
    );
}

#[test]
fn doctor_names_each_blocker_with_its_fix() {
    let t = TempDir::new("doctor-bad");
    let inputs = fake_system(&t);
    let mut host = render_user(&inputs);
    host.id.groups.clear();
    host.memlock.soft = Limit::Bytes(8 << 20);
    host.memlock.hard = Limit::Bytes(8 << 20);
    host.log = Some(
        "amdxdna 0000:c5:00.1: aie2_check_protocol: Incompatible firmware protocol major 7 minor 2\n"
            .into(),
    );
    fs::remove_file(inputs.roots.lib.join("firmware/amdnpu/17f0_11/npu.sbin")).expect("rm");
    let report = doctor::run(&inputs, &host);
    let failed: Vec<&str> = report
        .checks
        .iter()
        .filter(|c| c.status == Status::Fail)
        .map(|c| c.name)
        .collect();
    assert_eq!(
        failed,
        ["NPU firmware file", "accel node", "memlock", "kernel log"],
        "{}",
        report.to_text()
    );
    assert!(
        report
            .checks
            .iter()
            .filter(|c| c.status != Status::Pass)
            .all(|c| c
                .fix
                .as_deref()
                .is_some_and(|f| !f.is_empty() && !f.contains('\n')))
    );
    assert_eq!(report.exit_code(), 1);
    let v: serde_json::Value = serde_json::from_str(&report.to_json()).expect("json");
    assert_eq!(v["ok"], false);
    assert_eq!(v["summary"]["fail"], 4);
}

// ---------------------------------------------------------------------------------------------
// Residency

/// A fake /proc/<pid>/fd for `pid` whose fd 5 points at `target`.
fn fake_fd(roots: &SystemRoots, pid: u32, target: &Path) {
    let fd = roots.proc_fd_dir(pid);
    fs::create_dir_all(&fd).expect("mkdir");
    symlink("/dev/null", fd.join("0")).expect("symlink");
    symlink(target, fd.join("5")).expect("symlink");
}

/// A fake /proc/<pid>/fdinfo/5 with `busy_ns` of NPU engine time.
fn fake_fdinfo(roots: &SystemRoots, pid: u32, busy_ns: u64) {
    write(
        &roots.proc_fdinfo_dir(pid).join("5"),
        &format!(
            "pos:\t0\nflags:\t02100002\ndrm-driver:\tamdxdna_accel_driver\n\
             drm-engine-npu:\t{busy_ns} ns\ndrm-total-memory:\t2048 KiB\n"
        ),
    );
}

/// `nodes` on the provider holding 90% of the weights, 26 on the CPU holding the rest.
fn placed_on_npu(nodes: usize) -> Option<Placement> {
    Some(Placement {
        nodes: [
            (PROVIDER_NAME.to_owned(), nodes),
            ("CPUExecutionProvider".to_owned(), 26),
        ]
        .into_iter()
        .collect(),
        weight_bytes: Some(
            [
                (PROVIDER_NAME.to_owned(), 900),
                ("CPUExecutionProvider".to_owned(), 100),
            ]
            .into_iter()
            .collect(),
        ),
        total_weight_bytes: Some(1000),
    })
}

#[test]
fn residency_proven_from_placement_and_the_workers_own_busy_time() {
    let t = TempDir::new("res-ok");
    let roots = SystemRoots::under(&t.0);
    write(&roots.accel_node(), "");
    fake_fd(&roots, 4321, &roots.accel_node());
    fake_fdinfo(&roots, 4321, 1_000);
    let mut notes = Vec::new();
    let before = sample_accel(4321, &roots, None, &mut notes);
    fake_fdinfo(&roots, 4321, 901_000);
    let after = sample_accel(4321, &roots, None, &mut notes);
    assert!(notes.is_empty(), "{notes:?}");
    assert_eq!(before.as_ref().map(|u| u.fds), Some(1));
    let r = weigh_npu(Evidence {
        placement: placed_on_npu(3),
        accel_before: before,
        accel_after: after,
        decode_steps: 8,
        ..Evidence::default()
    });
    assert_eq!(r.state, ResidencyState::Proven, "{r}");
    assert_eq!(
        r.to_string(),
        "npu residency: proven: ONNX Runtime placed 3 of 29 nodes, 90.0% of the weights, on \
         RyzenAILightExecutionProvider (CPUExecutionProvider: 26 nodes, 10.0% of weights, \
         RyzenAILightExecutionProvider: 3 nodes, 90.0% of weights); the NPU was busy 900000 ns \
         for this worker over 8 decode steps (drm-engine-*); the worker's accel memory 2097152 \
         -> 2097152 bytes (supporting detail, proves nothing alone); device-wide NPU mem_usage \
         not readable (not every driver has it)"
    );
}

#[test]
fn an_open_accel_fd_without_placement_proves_nothing() {
    // The spike saw exactly this: a load the provider declined still opened the node.
    let t = TempDir::new("res-bad");
    let roots = SystemRoots::under(&t.0);
    write(&roots.accel_node(), "");
    write(&roots.mem_usage(), "1048576\n");
    fake_fd(&roots, 4321, &roots.accel_node());
    fake_fdinfo(&roots, 4321, 1_000);
    let mut notes = Vec::new();
    let mem_before = sample_mem_usage(&roots, &mut notes);
    let before = sample_accel(4321, &roots, None, &mut notes);
    fake_fdinfo(&roots, 4321, 2_000);
    write(&roots.mem_usage(), "734003200\n");
    let r = weigh_npu(Evidence {
        placement: Some(Placement::of_nodes(
            [("CPUExecutionProvider".to_owned(), 29)]
                .into_iter()
                .collect(),
        )),
        accel_before: before,
        accel_after: sample_accel(4321, &roots, None, &mut notes),
        decode_steps: 8,
        mem_usage_before: mem_before,
        mem_usage_after: sample_mem_usage(&roots, &mut notes),
        notes,
        ..Evidence::default()
    });
    assert_eq!(r.state, ResidencyState::Unproven, "{r}");
    assert!(
        r.to_string()
            .contains("placed no node on RyzenAILightExecutionProvider"),
        "{r}"
    );

    // Another process's fd table, a node it does not hold, no mem_usage file: every reason.
    let t = TempDir::new("res-none");
    let roots = SystemRoots::under(&t.0);
    write(&roots.accel_node(), "");
    fake_fd(&roots, 4321, Path::new("/dev/dri/renderD128"));
    let mut notes = Vec::new();
    let r = weigh_npu(Evidence {
        placement: placed_on_npu(1),
        accel_before: sample_accel(4321, &roots, None, &mut notes),
        accel_after: sample_accel(999_999, &roots, None, &mut notes),
        mem_usage_before: sample_mem_usage(&roots, &mut notes),
        notes,
        ..Evidence::default()
    });
    assert_eq!(r.state, ResidencyState::Unproven);
    let text = r.to_string();
    assert!(text.contains("holds no readable accel fd"), "{text}");
    assert!(text.contains("mem_usage not readable"), "{text}");
    assert!(text.contains("accel usage of pid 999999"), "{text}");
    assert!(read_mem_usage(&roots).is_err());
}

#[test]
fn holds_accel_reads_the_real_proc_fd_table() {
    let t = TempDir::new("res-real");
    let mut roots = SystemRoots::under(&t.0);
    roots.proc = PathBuf::from("/proc");
    write(&roots.accel_node(), "");
    let pid = std::process::id();
    assert!(!holds_accel(pid, &roots).expect("fd table"));
    let f = fs::File::open(roots.accel_node()).expect("open");
    assert!(holds_accel(pid, &roots).expect("fd table"));
    drop(f);
    assert!(!holds_accel(pid, &roots).expect("fd table"));
}

// ---------------------------------------------------------------------------------------------
// Lifecycle, with real processes

#[test]
fn stop_grace_from_the_variable() {
    assert_eq!(StopGrace::parse(None).grace, Duration::from_secs(30));
    assert_eq!(
        StopGrace::parse(Some(OsStr::new("5"))).grace,
        Duration::from_secs(5)
    );
    let bad = StopGrace::parse(Some(OsStr::new("5m")));
    assert_eq!(bad.grace, Duration::from_secs(30));
    assert!(
        bad.warning
            .is_some_and(|w| w.contains("ONEBIT_BACKEND_STOP_GRACE_S"))
    );
}

/// The state letter of a live (unreaped) process in /proc/<pid>/stat: R, S, T, Z, ...
fn proc_state(pid: u32) -> Option<char> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may contain spaces; the state follows it.
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Waits (bounded) until the process reaches `state`; the short pause only paces the polling.
fn wait_for_state(pid: u32, state: char) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while proc_state(pid) != Some(state) {
        assert!(
            Instant::now() < deadline,
            "pid {pid} never reached state {state}"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// SIGTERM, `grace`, then SIGKILL if `allow_kill` and the child is not an NPU holder (`holds`
/// stands for a fd table that shows the accel node open).
fn policy(grace: Duration, holds: bool, allow_kill: bool) -> StopPolicy {
    StopPolicy {
        grace,
        allow_kill,
        never_kill: if holds {
            NeverKill::Anyone
        } else {
            NeverKill::Nobody
        },
        ..StopPolicy::default()
    }
}

fn stopped_sleeper() -> Child {
    let child = Child::spawn(Command::new("sleep").arg("1000"), "sleeper").expect("spawn sleep");
    assert!(child.signal(libc::SIGSTOP).expect("SIGSTOP"));
    wait_for_state(child.pid(), 'T');
    child
}

#[test]
fn a_child_that_exits_on_its_own_is_reaped_at_once_and_stop_is_a_no_op() {
    let child =
        Arc::new(Child::spawn(Command::new("sh").args(["-c", "exit 3"]), "worker").expect("spawn"));
    let (tx, rx) = mpsc::channel();
    let _watchdog = child
        .spawn_watchdog(Duration::from_millis(20), move |e| {
            let _ = tx.send(e);
        })
        .expect("watchdog");
    let ending = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("watchdog saw the exit");
    assert_eq!(ending, Ending::Exit(3));
    assert!(!child.alive());
    let t0 = Instant::now();
    let outcome = child
        .stop(&policy(Duration::from_secs(30), true, true))
        .expect("stop");
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "stop() waited {:?}",
        t0.elapsed()
    );
    assert_eq!(outcome, StopOutcome::AlreadyEnded(Ending::Exit(3)));
    assert_eq!(
        outcome.ending().map(|e| e.to_string()).as_deref(),
        Some("exit 3")
    );
    // Nothing can be signalled once reaped (the pid may belong to someone else by now).
    assert!(!child.signal(libc::SIGTERM).expect("no-op"));
}

#[test]
fn stop_finds_an_unreaped_exit_without_waiting() {
    let child = Child::spawn(Command::new("sh").args(["-c", "exit 3"]), "worker").expect("spawn");
    wait_for_state(child.pid(), 'Z');
    let t0 = Instant::now();
    let outcome = child
        .stop(&policy(Duration::from_secs(30), false, true))
        .expect("stop");
    assert!(t0.elapsed() < Duration::from_secs(1));
    assert_eq!(outcome.to_string(), "already ended (exit 3)");
}

#[test]
fn a_child_that_handles_sigterm_ends_with_exit_0() {
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "trap 'exit 0' TERM; echo ready; while :; do sleep 0.05; done",
    ])
    .stdout(Stdio::piped());
    let child = Child::spawn(&mut cmd, "worker").expect("spawn");
    let stdout = child.with_std(|c| c.stdout.take()).expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    assert_eq!(line, "ready\n", "the trap is installed before `ready`");
    let outcome = child
        .stop(&policy(Duration::from_secs(30), true, false))
        .expect("stop");
    let StopOutcome::Ended { ending, after } = outcome else {
        panic!("unexpected {outcome:?}")
    };
    assert_eq!(ending.to_string(), "exit 0");
    assert!(after < Duration::from_secs(10));
}

#[test]
fn a_hung_npu_holder_gets_the_grace_and_is_never_sigkilled() {
    let child = stopped_sleeper();
    let pid = child.pid();
    let t0 = Instant::now();
    let outcome = child
        .stop(&policy(Duration::from_secs(1), true, true))
        .expect("stop");
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
    // Still there, still stopped, not reaped.
    assert!(child.alive());
    assert_eq!(proc_state(pid), Some('T'));
    // Clean up by hand.
    assert!(child.signal(libc::SIGKILL).expect("SIGKILL"));
    assert_eq!(
        child.wait_timeout(Duration::from_secs(10)),
        Some(Ending::Signal(libc::SIGKILL))
    );
}

#[test]
fn a_hung_child_that_is_not_an_npu_holder_is_sigkilled_when_allowed() {
    let child = stopped_sleeper();
    let t0 = Instant::now();
    let outcome = child
        .stop(&policy(Duration::from_secs(1), false, true))
        .expect("stop");
    assert!(t0.elapsed() >= Duration::from_secs(1));
    assert_eq!(
        outcome,
        StopOutcome::Killed(Some(Ending::Signal(libc::SIGKILL)))
    );
    assert_eq!(
        outcome.ending().map(|e| e.to_string()).as_deref(),
        Some("signal 9")
    );
    assert!(!child.alive());
}

#[test]
fn a_hung_child_is_left_running_when_kill_is_not_allowed() {
    let child = stopped_sleeper();
    let pid = child.pid();
    let outcome = child
        .stop(&policy(Duration::ZERO, false, false))
        .expect("stop");
    assert_eq!(
        outcome,
        StopOutcome::LeftRunning {
            pid,
            holds_npu: false
        }
    );
    assert!(child.alive());
    assert!(child.signal(libc::SIGKILL).expect("SIGKILL"));
    assert_eq!(
        child.wait_timeout(Duration::from_secs(10)),
        Some(Ending::Signal(9))
    );
}

#[test]
fn sigterm_goes_to_the_child_only_not_its_group() {
    // The child runs in our process group; if stop() signalled the group, this test process
    // would get SIGTERM too and die.
    let mut cmd = Command::new("sh");
    cmd.args(["-c", "echo ready; exec sleep 1000"])
        .stdout(Stdio::piped());
    let child = Child::spawn(&mut cmd, "worker").expect("spawn");
    let stdout = child.with_std(|c| c.stdout.take()).expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let outcome = child
        .stop(&policy(Duration::from_secs(10), false, false))
        .expect("stop");
    assert_eq!(outcome.ending(), Some(Ending::Signal(libc::SIGTERM)));
}

// ---------------------------------------------------------------------------------------------
// scripts/npu-check.sh: the lock, the kernel log window and the report, with the real doctor,
// a fake `npu probe`, a fake dmesg and no server (SERVE=0). Nothing sleeps: the lock is held by
// a `flock` child the test controls, and the script's own output says when it is waiting.

fn write_exe(p: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    write(p, text);
    fs::set_permissions(p, fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A temp dir with `bin/` (fake dmesg, journalctl and an onebit-tts that is the real binary
/// except for `npu probe`), the kernel log file and the lock path.
struct CheckBox {
    t: TempDir,
}

impl CheckBox {
    fn new(tag: &str) -> CheckBox {
        let t = TempDir::new(tag);
        let bin = t.0.join("bin");
        let real = env!("CARGO_BIN_EXE_onebit-tts");
        // The probe adds kernel lines while it runs, as a real one would: they are the window.
        write_exe(
            &bin.join("onebit-tts"),
            &format!(
                r#"#!/usr/bin/env bash
if [ "$1" = npu ] && [ "$2" = probe ]; then
    {{
        echo '[  101.0] amdxdna 0000:c5:00.1: aie2_tdr_work: TDR timeout, ctx 3'
        echo '[  101.1] AMD-Vi: Event logged [IO_PAGE_FAULT device=0000:c5:00.1 domain=0x0 address=0x0]'
        echo '[  101.2] usb 1-1: device descriptor read/64, error -71'
        echo '[  101.3] audit: "quoted" \back\slash	tab'
    }} >>"$FAKE_DMESG"
    printf '{{\n  "package": "%s",\n  "residency": {{"state": "proven", "reasons": ["fake probe"]}}\n}}\n' "$5"
    exit 0
fi
exec {real} "$@"
"#
            ),
        );
        write_exe(&bin.join("dmesg"), "#!/bin/sh\nexec cat \"$FAKE_DMESG\"\n");
        write_exe(&bin.join("journalctl"), "#!/bin/sh\nexit 1\n");
        write(
            &t.0.join("dmesg.txt"),
            "[    1.0] amdxdna 0000:c5:00.1: boot-time failure before the run\n",
        );
        CheckBox { t }
    }

    fn lock(&self) -> PathBuf {
        self.t.0.join("npu-check.lock")
    }

    fn report(&self) -> PathBuf {
        self.t.0.join("report.json")
    }

    fn script(&self, lock_wait: &str) -> Command {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut cmd = Command::new("bash");
        let path = format!(
            "{}:{}",
            self.t.0.join("bin").display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cmd.arg(root.join("scripts/npu-check.sh"))
            .env("PATH", path)
            .env("FAKE_DMESG", self.t.0.join("dmesg.txt"))
            .env("MODEL", self.t.0.join("pkg"))
            .env("NO_BUILD", "1")
            .env("SERVE", "0")
            .env("BIN", self.t.0.join("bin/onebit-tts"))
            .env("NPU_CHECK_LOCK", self.lock())
            .env("LOCK_WAIT", lock_wait)
            .env("REPORT", self.report())
            .env("TMPDIR", &self.t.0)
            .env_remove("ONEBIT_RYZENAI_ROOT")
            .env_remove("ONEBIT_XRT_ROOT")
            .env_remove("XILINX_XRT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// `flock` holding the lock until its stdin closes; returns once it holds it.
    fn hold_lock(&self) -> std::process::Child {
        let mut holder = Command::new("flock")
            .arg(self.lock())
            .args(["sh", "-c", "echo held; exec cat >/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("flock");
        let mut line = String::new();
        BufReader::new(holder.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert_eq!(line, "held\n");
        holder
    }
}

#[test]
fn npu_check_is_busy_while_another_check_holds_the_lock() {
    let b = CheckBox::new("check-busy");
    let mut holder = b.hold_lock();
    let out = b.script("0").output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("busy: another check holds"), "{stderr}");
    assert!(stderr.contains("LOCK_WAIT"), "{stderr}");
    assert!(!b.report().exists(), "a refused run writes no report");
    drop(holder.stdin.take());
    assert!(holder.wait().expect("wait").success());
}

#[test]
fn npu_check_waits_for_the_lock_then_reports_the_run() {
    let b = CheckBox::new("check-wait");
    let mut holder = b.hold_lock();
    let mut run = b.script("600").spawn().expect("spawn");
    let mut stdout = BufReader::new(run.stdout.take().expect("stdout"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("read");
    assert!(
        first.starts_with("npu-check: waiting up to 600s for "),
        "{first}"
    );
    // The lock goes; the waiting run goes on by itself.
    drop(holder.stdin.take());
    assert!(holder.wait().expect("wait").success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).expect("read");
    let status = run.wait().expect("wait");
    let mut stderr = String::new();
    if let Some(mut e) = run.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).expect("stderr");
    }
    // The TDR timeout and the IOMMU fault in the run's window fail the kernel-log criterion.
    assert_eq!(status.code(), Some(1), "{rest}\n{stderr}");
    assert!(
        rest.contains("PASS  probe: npu probe: residency proven (exit 0)"),
        "{rest}"
    );
    assert!(
        rest.contains("FAIL  kernel log: 2 failure line(s)"),
        "{rest}"
    );

    let text = fs::read_to_string(b.report()).expect("report");
    let v: serde_json::Value = serde_json::from_str(&text).expect("the report is JSON");
    assert_eq!(v["ok"], false);
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["serve"], false);
    // The probe's own JSON, whole, with its exit code.
    assert_eq!(v["probe"]["exit_code"], 0);
    assert_eq!(v["probe"]["report"]["residency"]["state"], "proven");
    assert_eq!(
        v["probe"]["report"]["package"],
        b.t.0.join("pkg").display().to_string()
    );
    // The real doctor's JSON with its exit code; without --model it never claims residency.
    let doctor_ok = v["doctor"]["report"]["ok"].as_bool().expect("doctor ok");
    assert_eq!(v["doctor"]["exit_code"], i32::from(!doctor_ok), "{text}");
    let checks = v["doctor"]["report"]["checks"].as_array().expect("checks");
    assert!(
        checks
            .iter()
            .any(|c| c["name"] == "residency" && c["status"] == "SKIP"),
        "{text}"
    );
    assert!(
        v["versions"]["onebit_tts"]
            .as_str()
            .is_some_and(|s| s.starts_with("onebit-tts ")),
        "{text}"
    );
    // The window is the run's lines only (not the boot line), every one of them, verbatim.
    let lines: Vec<&str> = v["kernel_log"]["lines"]
        .as_array()
        .expect("lines")
        .iter()
        .filter_map(|l| l.as_str())
        .collect();
    assert_eq!(v["kernel_log"]["source"], "dmesg");
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(lines[3], "[  101.3] audit: \"quoted\" \\back\\slash\ttab");
    let flagged = v["kernel_log"]["flagged"].as_array().expect("flagged");
    assert_eq!(flagged.len(), 2, "{text}");
    assert!(
        flagged[0]
            .as_str()
            .is_some_and(|l| l.contains("TDR timeout"))
    );
    assert!(
        flagged[1]
            .as_str()
            .is_some_and(|l| l.contains("IO_PAGE_FAULT"))
    );
    let other = v["kernel_log"]["other"].as_array().expect("other");
    assert_eq!(other.len(), 1, "{text}");
    assert!(other[0].as_str().is_some_and(|l| l.contains("usb 1-1")));
    let criteria = v["criteria"].as_array().expect("criteria");
    let status_of = |name: &str| {
        criteria
            .iter()
            .find(|c| c["name"] == name)
            .map(|c| c["status"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(status_of("probe").as_deref(), Some("PASS"));
    assert_eq!(status_of("kernel log").as_deref(), Some("FAIL"));
    assert_eq!(status_of("kernel log (other)").as_deref(), Some("WARN"));
    assert_eq!(status_of("health"), None, "SERVE=0 starts no server");
}

/// Set in the child that [`a_process_with_an_npu_session_refuses_fork_and_exec`] re-executes.
const GUARD_CHILD: &str = "ONEBIT_TEST_FORK_GUARD_CHILD";

/// The guard in a real process (the test binary run again for this test alone, so the filter
/// never touches the harness running the other tests): once forbidden, spawning a program,
/// `fork` and `vfork`-style spawns fail with EPERM and nothing runs, while threads still start.
#[test]
fn a_process_with_an_npu_session_refuses_fork_and_exec() {
    use onebit_tts::npu::fork_guard;
    if std::env::var_os(GUARD_CHILD).is_some() {
        assert!(
            Command::new("true").status().is_ok(),
            "spawns before the guard"
        );
        // A thread that exists before the guard is bound by it too (TSYNC).
        let (go, wait) = mpsc::channel::<()>();
        let earlier = std::thread::spawn(move || {
            wait.recv().expect("go");
            Command::new("true").status().map_err(|e| e.raw_os_error())
        });
        fork_guard::forbid().expect("forbid");
        go.send(()).expect("send");
        assert_eq!(
            earlier.join().expect("thread").map(|_| ()),
            Err(Some(libc::EPERM)),
            "a thread started before the guard spawned"
        );
        assert!(fork_guard::forbidden());
        fork_guard::forbid().expect("a second call is a no-op");
        let marker = std::env::temp_dir().join(format!("onebit-guard-{}", std::process::id()));
        let e = Command::new("touch")
            .arg(&marker)
            .status()
            .expect_err("spawn refused");
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{e}");
        assert!(!marker.exists(), "the refused program ran");
        // SAFETY: fork in a test process; the child (if the guard failed) exits at once.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: only in a child the guard failed to stop.
            unsafe { libc::_exit(0) };
        }
        assert_eq!(pid, -1, "fork went through");
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::EPERM)
        );
        let t = std::thread::spawn(|| 6 * 7);
        assert_eq!(t.join().expect("thread"), 42, "threads still start");
        println!("guard child: refused as it should");
        return;
    }
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_process_with_an_npu_session_refuses_fork_and_exec",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(GUARD_CHILD, "1")
        .output()
        .expect("run the child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("guard child: refused as it should"),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cc` with `args`, panicking with its output on failure (CI installs a C compiler).
fn cc(args: &[&str]) {
    let out = Command::new("cc")
        .args(args)
        .output()
        .expect("cc (build-essential, which scripts/setup.sh installs)");
    assert!(
        out.status.success(),
        "cc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// doctor's library line with the real loader (`ldd`) on libraries built here: a provider that
/// needs `libonebitdep.so.1` at symbol version DEP_2.0, as AMD's need GLIBCXX or boost
/// versions. It resolves with the right library on the worker's path; it fails, naming the
/// version, when an older copy comes first in the worker's order (the venv before XRT's lib),
/// and naming the file when none is there.
#[test]
fn doctor_checks_that_the_provider_loads_on_the_workers_library_path() {
    use onebit_tts::npu::doctor::{RealHost, libraries_check};
    let t = TempDir::new("doctor-ldd");
    let src = t.0.join("src");
    let venv_lib = t.0.join("venv/deployment/lib");
    let xrt_lib = t.0.join("xrt/lib");
    for d in [&src, &venv_lib, &xrt_lib, &t.0.join("v1"), &t.0.join("v2")] {
        fs::create_dir_all(d).expect("mkdir");
    }
    write(&src.join("dep.c"), "int dep_fn(void) { return 2; }\n");
    write(&src.join("v1.map"), "DEP_1.0 { global: *; };\n");
    write(&src.join("v2.map"), "DEP_2.0 { global: *; };\n");
    write(
        &src.join("provider.c"),
        "extern int dep_fn(void);\nint provider_fn(void) { return dep_fn(); }\n",
    );
    let s = |p: &Path| p.to_str().expect("utf-8").to_owned();
    for v in ["v1", "v2"] {
        let out = t.0.join(v).join("libonebitdep.so.1");
        cc(&[
            "-shared",
            "-fPIC",
            "-Wl,-soname,libonebitdep.so.1",
            &format!("-Wl,--version-script={}", s(&src.join(format!("{v}.map")))),
            &s(&src.join("dep.c")),
            "-o",
            &s(&out),
        ]);
        symlink("libonebitdep.so.1", t.0.join(v).join("libonebitdep.so")).expect("symlink");
    }
    cc(&[
        "-shared",
        "-fPIC",
        &s(&src.join("provider.c")),
        &format!("-L{}", s(&t.0.join("v2"))),
        "-lonebitdep",
        "-o",
        &s(&venv_lib.join(PROVIDER_FILE)),
    ]);
    let mut inputs = env_inputs(&t.0.join("bin"));
    inputs.ryzenai_root = Some(t.0.join("venv"));
    inputs.xrt_root_knob = Some(t.0.join("xrt"));
    let EnvPlan::Set(w) = worker_env(&inputs).expect("plan") else {
        panic!("a plan")
    };
    let check = || libraries_check(&w, &RealHost::default());

    // The library the provider was built against, in the venv: every version resolves.
    fs::copy(
        t.0.join("v2/libonebitdep.so.1"),
        venv_lib.join("libonebitdep.so.1"),
    )
    .expect("cp");
    let c = check();
    assert_eq!(
        c.status,
        Status::Pass,
        "{}: {}",
        c.detail,
        c.fix.unwrap_or_default()
    );
    // XRT's NPU shim, which XRT opens at run time, is checked beside the provider.
    fs::copy(
        venv_lib.join(PROVIDER_FILE),
        xrt_lib.join("libxrt_driver_xdna.so.2"),
    )
    .expect("cp");
    let c = check();
    assert_eq!(c.status, Status::Pass, "{}", c.detail);
    assert!(
        c.detail.contains(&format!(
            " and {}: ",
            xrt_lib.join("libxrt_driver_xdna.so.2").display()
        )),
        "{}",
        c.detail
    );

    // An older copy in the venv, the right one in XRT's lib: AMD's order puts the venv first,
    // so the older one loads and the version is missing.
    fs::copy(
        t.0.join("v1/libonebitdep.so.1"),
        venv_lib.join("libonebitdep.so.1"),
    )
    .expect("cp");
    fs::copy(
        t.0.join("v2/libonebitdep.so.1"),
        xrt_lib.join("libonebitdep.so.1"),
    )
    .expect("cp");
    let c = check();
    assert_eq!(c.status, Status::Fail, "{}", c.detail);
    assert!(
        c.detail.contains(&format!(
            "{}: version `DEP_2.0' not found (required by {})",
            venv_lib.join("libonebitdep.so.1").display(),
            venv_lib.join(PROVIDER_FILE).display()
        )),
        "{}",
        c.detail
    );
    assert!(c.fix.unwrap_or_default().contains("Ubuntu 24.04"));

    // None on the path at all.
    fs::remove_file(venv_lib.join("libonebitdep.so.1")).expect("rm");
    fs::remove_file(xrt_lib.join("libonebitdep.so.1")).expect("rm");
    let c = check();
    assert_eq!(c.status, Status::Fail, "{}", c.detail);
    assert!(
        c.detail.ends_with("libonebitdep.so.1 not found"),
        "{}",
        c.detail
    );
}
