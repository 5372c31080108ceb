//! The NPU route against a model of the real provider: the stub RyzenAI plugin EP
//! (tests/stub-ep) loaded by the real ONNX Runtime in a real worker child. What it shows:
//! everything genai_config.json says for the provider reaches it under the right names; custom
//! ops go by library; residency comes from ONNX Runtime's own node placement and the device's
//! counters, so a provider that declines the graph is "unproven", `--device npu` refuses it, and
//! nothing calls such a run "npu"; the venv's ONNX Runtime is paired with its provider or refused.

mod common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;

const PROVIDER: &str = "RyzenAILightExecutionProvider";

/// models/tiny as an NPU package: the RyzenAI provider declared (options as AMD's packages carry
/// them), a config entry and an extra session option key (onnxruntime-genai adds unknown keys as
/// config entries).
fn npu_package(dir: &Path) -> PathBuf {
    common::npu_package(
        dir,
        serde_json::json!({
            "provider_options": [{"RyzenAI": {
                "hybrid_opt_token_backend": "npu", "external_data_file": "model.onnx.data"}}],
            "config_entries": {"onebit.test_entry": "from-config-entries"},
            "onebit.unknown_key": "from-an-unknown-key",
        }),
    )
}

/// The events the stub recorded, one JSON object each.
fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("record line"))
        .collect()
}

fn event<'a>(recs: &'a [Value], name: &str) -> Vec<&'a Value> {
    recs.iter().filter(|r| r["event"] == name).collect()
}

fn probe(pkg: &Path, env: &[(&str, &str)], extra: &[&str]) -> (Output, Value) {
    let pkg = pkg.to_str().unwrap();
    let mut args = vec!["-q", "npu", "probe", "--model", pkg, "--json"];
    args.extend_from_slice(extra);
    let out = common::cli_with(&args, env);
    let json: Value = serde_json::from_str(&common::stdout(&out)).unwrap_or_else(|e| {
        panic!(
            "probe JSON ({e}): {}{}",
            common::stdout(&out),
            common::stderr(&out)
        )
    });
    (out, json)
}

#[test]
fn probe_on_a_declining_provider_says_unproven_and_everything_reached_it() {
    let t = common::tempdir("npu-probe-decline");
    let pkg = npu_package(&t);
    let stub = common::stub_ep();
    let rec = t.join("record.jsonl");
    let (out, j) = probe(
        &pkg,
        &[
            ("ONEBIT_STUB_EP_RECORD", rec.to_str().unwrap()),
            ("ONEBIT_STUB_EP_MODE", "decline"),
        ],
        &["--ep-library", stub.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert_eq!(j["residency"]["state"], "unproven");
    let reasons = j["residency"]["reasons"].to_string();
    assert!(
        reasons.contains("placed no node on RyzenAILightExecutionProvider"),
        "{reasons}"
    );
    // ONNX Runtime's own placement: every node on the CPU.
    let placement = j["placement"]["nodes"]
        .as_object()
        .expect("placement observed");
    assert_eq!(placement.len(), 1, "{placement:?}");
    assert!(placement["CPUExecutionProvider"].as_u64().unwrap() > 0);

    let setup = &j["provider_setup"];
    assert_eq!(setup["library"], stub.to_str().unwrap());
    assert_eq!(setup["library_source"], "EpPathEnv");
    assert_eq!(setup["npu_devices"], 1);
    assert_eq!(setup["custom_ops"]["route"], "library");
    assert_eq!(setup["custom_ops"]["path"], stub.to_str().unwrap());
    assert_eq!(setup["strict"], false);
    let devices = setup["ep_devices"].to_string();
    assert!(
        devices.contains(r#""ep":"RyzenAILightExecutionProvider""#),
        "{devices}"
    );
    assert!(devices.contains(r#""hardware":"NPU""#), "{devices}");

    // What the provider itself received.
    let recs = records(&rec);
    let factories = event(&recs, "create_factories");
    assert_eq!(factories.len(), 1, "{recs:?}");
    assert_eq!(factories[0]["registered_name"], PROVIDER);
    assert_eq!(event(&recs, "register_custom_ops").len(), 1, "{recs:?}");
    let eps = event(&recs, "create_ep");
    assert_eq!(eps.len(), 1, "{recs:?}");
    assert_eq!(
        eps[0]["options"],
        serde_json::json!({"hybrid_opt_token_backend": "npu",
            "external_data_file": "model.onnx.data"})
    );
    let config = &eps[0]["config"];
    assert_eq!(config["model_root"], pkg.to_str().unwrap());
    assert_eq!(config["onebit.test_entry"], "from-config-entries");
    assert_eq!(config["onebit.unknown_key"], "from-an-unknown-key");
    assert_eq!(config["session.record_ep_graph_assignment_info"], "1");
    assert!(config.get("session.disable_cpu_ep_fallback").is_none());
    let caps = event(&recs, "get_capability");
    assert_eq!(caps[0]["claimed"], 0);
    assert!(event(&recs, "compute").is_empty());
}

/// With a compile-cache directory named, the session's model_root is a mirror there (links to
/// the package's files, a writable `.cache/` of its own seeded from the package's), the
/// provider loads through it, and the package is not written.
#[test]
fn the_npu_session_compiles_into_the_named_cache_not_the_model_directory() {
    let t = common::tempdir("npu-probe-cache");
    let pkg = npu_package(&t);
    std::fs::create_dir_all(pkg.join(".cache")).expect("mkdir");
    std::fs::write(pkg.join(".cache/shipped.bin"), "compiled by AMD").expect("write");
    let cache = t.join("npu-cache");
    let rec = t.join("record.jsonl");
    let stub = common::stub_ep();
    let (out, j) = probe(
        &pkg,
        &[
            ("RYZENAI_EP_PATH", stub.to_str().unwrap()),
            ("ONEBIT_STUB_EP_MODE", "decline"),
            ("ONEBIT_STUB_EP_RECORD", rec.to_str().unwrap()),
            ("ONEBIT_NPU_CACHE_DIR", cache.to_str().unwrap()),
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    assert_eq!(j["residency"]["state"], "unproven");
    let recs = records(&rec);
    let eps = event(&recs, "create_ep");
    let root = PathBuf::from(eps[0]["config"]["model_root"].as_str().expect("model_root"));
    assert_eq!(root.parent(), Some(cache.as_path()), "{root:?}");
    let canonical = std::fs::canonicalize(&pkg).expect("canonical");
    assert_eq!(
        std::fs::read_link(root.join("model.onnx")).expect("a link"),
        canonical.join("model.onnx")
    );
    assert_eq!(
        std::fs::read_to_string(root.join(".cache/shipped.bin")).expect("seeded"),
        "compiled by AMD"
    );
    assert!(
        !root
            .join(".cache")
            .symlink_metadata()
            .expect("cache")
            .is_symlink(),
        "the cache is a directory of its own"
    );
}

#[test]
fn probe_on_a_claiming_provider_sees_the_nodes_but_no_device_activity() {
    let t = common::tempdir("npu-probe-claim");
    let pkg = npu_package(&t);
    let rec = t.join("record.jsonl");
    let stub = common::stub_ep();
    let (out, j) = probe(
        &pkg,
        &[
            ("RYZENAI_EP_PATH", stub.to_str().unwrap()),
            ("ONEBIT_STUB_EP_MODE", "claim"),
            ("ONEBIT_STUB_EP_RECORD", rec.to_str().unwrap()),
        ],
        &[],
    );
    // The provider took nodes and computed them in the evidence run, but no NPU did any work
    // for this process: still unproven.
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    let claimed = event(&records(&rec), "get_capability")[0]["claimed"]
        .as_u64()
        .unwrap();
    assert!(claimed > 0);
    assert_eq!(j["placement"]["nodes"][PROVIDER].as_u64(), Some(claimed));
    assert!(!event(&records(&rec), "compute").is_empty());
    assert_eq!(j["residency"]["state"], "unproven");
    // The worker refused fork and exec once its NPU session existed.
    assert!(
        j["fork_guard"]
            .as_str()
            .is_some_and(|g| g.starts_with("refused (seccomp")),
        "{j}"
    );
    let reasons = j["residency"]["reasons"].to_string();
    assert!(!reasons.contains("declined"), "{reasons}");
    assert!(reasons.contains("no readable accel fd"), "{reasons}");
    // The nodes it claimed (Add/Mul of activations) hold none of the model's weights: by
    // weight, the model is on the CPU.
    let total = j["placement"]["total_weight_bytes"]
        .as_u64()
        .expect("weighed");
    assert!(total > 0, "{j}");
    let on_provider = j["placement"]["weight_bytes"][PROVIDER]
        .as_u64()
        .unwrap_or(0);
    assert!(on_provider * 2 < total, "{j}");
    assert!(
        reasons.contains("of the weights (at least 50% needed"),
        "{reasons}"
    );
    // This machine has no accel node: no counters to read (the worker's own reader could not
    // open one); never a pass.
    assert_eq!(j["npu_counters"]["state"], "unavailable", "{j}");
    assert!(
        reasons.contains("hardware-context counters unavailable: /dev/accel/accel0 does not exist"),
        "{reasons}"
    );
}

#[test]
fn strict_mode_turns_a_declined_graph_into_a_failed_setup() {
    let t = common::tempdir("npu-strict");
    let pkg = npu_package(&t);
    let stub = common::stub_ep();
    let (out, j) = probe(
        &pkg,
        &[("RYZENAI_EP_PATH", stub.to_str().unwrap())],
        &["--npu-strict"],
    );
    assert_eq!(out.status.code(), Some(3), "{}", common::stderr(&out));
    assert_eq!(j["residency"]["state"], "failed");
    assert!(j["log_tail"].as_str().is_some_and(|l| !l.is_empty()));
}

#[test]
fn no_provider_library_is_a_failed_setup_that_names_the_path() {
    let t = common::tempdir("npu-nolib");
    let pkg = npu_package(&t);
    let missing = t.join("libonnxruntime_providers_ryzenai.so");
    let (out, j) = probe(&pkg, &[("RYZENAI_EP_PATH", missing.to_str().unwrap())], &[]);
    assert_eq!(out.status.code(), Some(3));
    let reasons = j["residency"]["reasons"].to_string();
    assert!(reasons.contains(missing.to_str().unwrap()), "{reasons}");
    assert!(
        reasons.contains("registering the provider library"),
        "{reasons}"
    );
    // The counters were not read, and the report says why (issue 54, item 4).
    assert_eq!(j["npu_counters"]["state"], "not_read");
    let why = j["npu_counters"]["reason"].as_str().expect("a reason");
    assert!(
        why.starts_with("no NPU work ran: the provider could not be set up (")
            && why.contains(missing.to_str().unwrap()),
        "{why}"
    );
    // The same in the human report.
    let out = common::cli_with(
        &["-q", "npu", "probe", "--model", pkg.to_str().unwrap()],
        &[("RYZENAI_EP_PATH", missing.to_str().unwrap())],
    );
    let text = common::stdout(&out);
    assert!(
        text.contains("NPU counters       unknown (not read: no NPU work ran: the provider could not be set up ("),
        "{text}"
    );
}

#[test]
fn device_npu_refuses_an_unproven_load_and_never_calls_the_fallback_npu() {
    let t = common::tempdir("npu-say");
    let pkg = npu_package(&t);
    let stub = common::stub_ep();
    let wav = t.join("out.wav");
    let args = |extra: &'static str| {
        let mut a = vec![
            "say".to_owned(),
            "--model".into(),
            pkg.to_str().unwrap().into(),
            "--device".into(),
            "npu".into(),
            "--voice".into(),
            "test".into(),
            "--temperature".into(),
            "0".into(),
            "-o".into(),
            wav.to_str().unwrap().into(),
        ];
        if !extra.is_empty() {
            a.push(extra.into());
        }
        a.push("Hello there.".into());
        a
    };
    let env = [("RYZENAI_EP_PATH", stub.to_str().unwrap())];
    let refused = args("");
    let refused: Vec<&str> = refused.iter().map(String::as_str).collect();
    let out = common::cli_with(&refused, &env);
    let line = common::error_line(&out);
    assert!(
        line.contains("refusing to serve a CPU fallback as the NPU"),
        "{line}"
    );
    assert!(line.contains("--allow-cpu-fallback"), "{line}");
    assert!(!wav.exists(), "no output from a refused load");

    let allowed = args("--allow-cpu-fallback");
    let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
    let out = common::cli_with(&allowed, &env);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(wav.exists());
    let summary = err
        .lines()
        .find(|l| l.starts_with("wrote "))
        .expect("summary line");
    assert!(summary.contains(") on cpu fallback, RTF"), "{summary}");
    assert!(!summary.contains("on npu"), "{summary}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_the_fallback_and_its_evidence() {
    use onebit_tts::engine::{Device, DeviceChoice};
    use onebit_tts::{SynthConfig, Synthesizer};
    let t = common::tempdir("npu-health");
    let pkg = npu_package(&t);
    let cfg = SynthConfig {
        package_dir: pkg,
        voice_dirs: vec![common::repo().join("voices")],
        device: DeviceChoice::Exactly(Device::Npu),
        allow_cpu_fallback: true,
        ep_library: Some(common::stub_ep()),
        worker_exe: Some(common::bin()),
        ..SynthConfig::default()
    };
    let synth = std::sync::Arc::new(
        tokio::task::spawn_blocking(move || Synthesizer::load(&cfg))
            .await
            .unwrap()
            .expect("load with --allow-cpu-fallback"),
    );
    assert_eq!(synth.device_label(), "cpu fallback");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server_cfg = onebit_tts::server::ServerConfig {
        addr,
        device: synth.device_label(),
        ..onebit_tts::server::ServerConfig::default()
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(onebit_tts::server::serve_on(
        listener,
        synth,
        server_cfg,
        async move {
            let _ = stopped.await;
        },
    ));
    let health: Value = reqwest::get(format!("http://{addr}/health"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    assert_eq!(health["device"], "cpu fallback");
    assert_eq!(health["residency"]["state"], "unproven");
    assert!(
        health["residency"]["evidence"]["placement"]["nodes"]["CPUExecutionProvider"]
            .as_u64()
            .is_some_and(|n| n > 0),
        "{health}"
    );
    assert!(
        health["runtime"]
            .as_str()
            .is_some_and(|r| r.contains("libonnxruntime")),
        "{health}"
    );
    assert!(!health.to_string().contains(r#""device":"npu""#));
}

/// A shared library that answers OrtGetApiBase like an ONNX Runtime of `version` and offers no
/// API at all (enough for the version check, which must refuse it before anything else).
fn fake_old_runtime(dir: &Path, version: &str) -> PathBuf {
    let src = dir.join("fake_ort.c");
    std::fs::write(
        &src,
        format!(
            "typedef struct {{ const void* (*GetApi)(unsigned); const char* (*GetVersionString)(void); }} Base;\n\
             static const void* get_api(unsigned v) {{ (void)v; return 0; }}\n\
             static const char* version(void) {{ return \"{version}\"; }}\n\
             static const Base base = {{ get_api, version }};\n\
             const Base* OrtGetApiBase(void) {{ return &base; }}\n"
        ),
    )
    .unwrap();
    let lib = dir.join("libonnxruntime.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = std::process::Command::new(cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("a C compiler (cc) to build the fake runtime");
    assert!(status.success());
    lib
}

/// A RyzenAI venv tree: deployment/lib with an ONNX Runtime and the provider.
fn fake_venv(dir: &Path, runtime: Option<&Path>) -> PathBuf {
    let venv = dir.join("venv");
    let lib = venv.join("deployment/lib");
    std::fs::create_dir_all(&lib).unwrap();
    symlink(
        common::stub_ep(),
        lib.join("libonnxruntime_providers_ryzenai.so"),
    )
    .unwrap();
    if let Some(rt) = runtime {
        symlink(rt, lib.join("libonnxruntime.so")).unwrap();
    }
    venv
}

fn project_runtime() -> PathBuf {
    common::repo().join(".onebit/onnxruntime/lib/libonnxruntime.so")
}

#[test]
fn the_venvs_runtime_is_paired_with_its_provider_or_refused() {
    // New enough: the worker loads the venv's library (not the project's) and its provider.
    let t = common::tempdir("npu-pair-new");
    let pkg = npu_package(&t);
    let venv = fake_venv(&t, Some(&project_runtime()));
    let (out, j) = probe(
        &pkg,
        &[("ONEBIT_RYZENAI_ROOT", venv.to_str().unwrap())],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", common::stderr(&out));
    let runtime = j["runtime"].as_str().expect("runtime");
    assert!(
        runtime.starts_with(&format!(
            "{} (1.31.1; the RyzenAI venv, paired with its provider)",
            venv.join("deployment/lib/libonnxruntime.so").display()
        )),
        "{runtime}"
    );
    assert_eq!(
        j["provider_setup"]["library"],
        venv.join("deployment/lib/libonnxruntime_providers_ryzenai.so")
            .to_str()
            .unwrap()
    );

    // Too old for this build: refused with both versions and the fix, never silently replaced
    // by the project's own runtime.
    let t = common::tempdir("npu-pair-old");
    let pkg = npu_package(&t);
    let old = fake_old_runtime(&t, "1.22.0");
    let venv = fake_venv(&t, Some(&old));
    let (out, j) = probe(
        &pkg,
        &[("ONEBIT_RYZENAI_ROOT", venv.to_str().unwrap())],
        &[],
    );
    assert_eq!(out.status.code(), Some(3), "{}", common::stderr(&out));
    let reasons = j["residency"]["reasons"].to_string();
    assert!(reasons.contains("ONNX Runtime is 1.22.0"), "{reasons}");
    assert!(reasons.contains(">= 1.24"), "{reasons}");
    assert!(reasons.contains("--engine oga"), "{reasons}");
    assert!(j["runtime"].is_null(), "nothing was loaded: {j}");

    // No runtime in the venv at all.
    let t = common::tempdir("npu-pair-none");
    let pkg = npu_package(&t);
    let venv = fake_venv(&t, None);
    let (out, j) = probe(
        &pkg,
        &[("ONEBIT_RYZENAI_ROOT", venv.to_str().unwrap())],
        &[],
    );
    assert_eq!(out.status.code(), Some(3));
    let reasons = j["residency"]["reasons"].to_string();
    assert!(
        reasons.contains("no ONNX Runtime library in the venv"),
        "{reasons}"
    );
}

#[test]
fn bench_labels_an_unproven_npu_run_cpu_fallback() {
    let t = common::tempdir("npu-bench");
    let pkg = npu_package(&t);
    let stub = common::stub_ep();
    let env = [("RYZENAI_EP_PATH", stub.to_str().unwrap())];
    let base = [
        "bench",
        "-q",
        "--model",
        pkg.to_str().unwrap(),
        "--device",
        "npu",
        "--engine-only",
        "--runs",
        "1",
        "--new-tokens",
        "4",
        "--prompt-lens",
        "32",
    ];
    // Refused without the flag, like every other command.
    let line = common::error_line(&common::cli_with(&base, &env));
    assert!(line.contains("refusing to serve a CPU fallback"), "{line}");

    let mut args = base.to_vec();
    args.push("--allow-cpu-fallback");
    let table = common::cli_with(&args, &env);
    assert!(table.status.success(), "{}", common::stderr(&table));
    let out = common::stdout(&table);
    assert!(out.lines().any(|l| l == "device cpu fallback"), "{out}");
    assert!(!out.lines().any(|l| l == "device npu"), "{out}");

    args.push("--json");
    let json = common::cli_with(&args, &env);
    assert!(json.status.success(), "{}", common::stderr(&json));
    let j: Value = serde_json::from_str(&common::stdout(&json)).expect("bench json");
    assert_eq!(j["device"], "cpu fallback");
    assert_eq!(j["residency"]["state"], "unproven");
    assert!(
        j["residency"]["reasons"]
            .to_string()
            .contains("declined the graph"),
        "{j}"
    );
}
