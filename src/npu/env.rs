//! The worker child's environment for the RyzenAI route (reference: "The child environment").
//!
//! The dynamic loader reads LD_LIBRARY_PATH once, at process start, so the NPU engine runs in a
//! worker child whose environment the parent builds here. [`worker_env`] is a pure function of
//! [`EnvInputs`] (plus one look at the worker's own directory) so tests can check every rule
//! exactly:
//!
//! - only when the model declares RyzenAI in its genai_config provider options *and*
//!   ONEBIT_RYZENAI_ROOT names the venv; otherwise the environment is left unchanged;
//! - XILINX_XRT = ONEBIT_XRT_ROOT, else $XILINX_XRT, else /opt/xilinx/xrt;
//! - LD_LIBRARY_PATH in the order AMD's Ryzen AI 1.8 Linux instructions give it (`source
//!   <xrt>/setup.sh`, which prepends `<xrt>/lib`, then `export
//!   LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:deployment/lib:$LD_LIBRARY_PATH`): the system's
//!   multiarch library directory, the worker's own directory if it holds the provider library
//!   (a worker built against the venv), `<venv>/deployment/lib`, `<xrt>/lib`, then whatever was
//!   there before. One measured exception: where the venv's or the worker's directory bundles
//!   XRT libraries of its own (`libxrt_*`; a stale libxrt_coreutil.so.2.19 from the venv's voe
//!   wheel was seen to win over the installed XRT and break the device), `<xrt>/lib` goes first
//!   and the plan says why. No empty entries (an empty entry means "the current directory" to
//!   ld.so), no duplicates (first one wins);
//! - RYZEN_AI_INSTALLATION_PATH = the venv, as AMD's venv activation exports it;
//! - RYZENAI_EP_PATH = the user's own when set (onnxruntime-genai always takes it first), else the
//!   provider library beside the worker if there, else in the venv.
//!
//! [`provider_library`] is where a process with that environment registers the provider from,
//! in onnxruntime-genai's order, through the crate's one native-library search
//! ([`crate::native`]).

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{NpuError, PROVIDER_FILE};

/// Knob naming the RyzenAI 1.8 venv; unset means the NPU route is off. Owned by the native
/// library search, which looks in the venv for every library.
pub use crate::native::{RYZENAI_ROOT_VAR, venv_lib_dir};
/// Knob naming the XRT tree (e.g. debs extracted with `dpkg-deb -x`); wins over $XILINX_XRT.
pub const XRT_ROOT_VAR: &str = "ONEBIT_XRT_ROOT";
pub const XILINX_XRT_VAR: &str = "XILINX_XRT";
pub const LD_LIBRARY_PATH_VAR: &str = "LD_LIBRARY_PATH";
/// Read by onnxruntime-genai (and by our engine) to find the provider library.
pub const RYZENAI_EP_PATH_VAR: &str = "RYZENAI_EP_PATH";
/// The RyzenAI venv root, as AMD's venv activation exports it (AMD's Linux instructions and
/// tools read it to find the installation).
pub const RYZEN_AI_INSTALLATION_PATH_VAR: &str = "RYZEN_AI_INSTALLATION_PATH";
/// Where the vendor's XRT packages install.
pub const DEFAULT_XRT_ROOT: &str = "/opt/xilinx/xrt";

/// Everything the environment rules depend on. Paths should be absolute: the child may run in
/// another directory, and a relative LD_LIBRARY_PATH entry is resolved against the child's cwd.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvInputs {
    /// genai_config.json declares RyzenAI in `provider_options`.
    pub provider_declared: bool,
    /// ONEBIT_RYZENAI_ROOT: the RyzenAI venv.
    pub ryzenai_root: Option<PathBuf>,
    /// ONEBIT_XRT_ROOT.
    pub xrt_root_knob: Option<PathBuf>,
    /// $XILINX_XRT as the parent sees it.
    pub xilinx_xrt: Option<PathBuf>,
    /// The parent's LD_LIBRARY_PATH.
    pub ld_library_path: Option<OsString>,
    /// The parent's RYZENAI_EP_PATH (kept as the user set it).
    pub ryzenai_ep_path: Option<PathBuf>,
    /// The system's multiarch library directory AMD's instructions put first
    /// (`/lib/x86_64-linux-gnu`); `None` leaves it out.
    pub system_lib_dir: Option<PathBuf>,
    /// The executable the worker runs (normally the parent's own `current_exe()`).
    pub worker_exe: PathBuf,
}

impl EnvInputs {
    /// Reads the knobs from this process's environment. Empty variables count as unset (a shell
    /// `export X=` means "off", not "the current directory"), and relative paths are made
    /// absolute against the current directory so the child sees the same directories.
    pub fn from_process(provider_declared: bool, worker_exe: PathBuf) -> Self {
        EnvInputs {
            provider_declared,
            ryzenai_root: path_var(RYZENAI_ROOT_VAR),
            xrt_root_knob: path_var(XRT_ROOT_VAR),
            xilinx_xrt: path_var(XILINX_XRT_VAR),
            ld_library_path: std::env::var_os(LD_LIBRARY_PATH_VAR),
            ryzenai_ep_path: path_var(RYZENAI_EP_PATH_VAR),
            system_lib_dir: Some(system_lib_dir()),
            worker_exe: absolute(worker_exe),
        }
    }
}

/// `/lib/<arch>-linux-gnu`, the Debian/Ubuntu multiarch directory of this build's architecture.
pub fn system_lib_dir() -> PathBuf {
    PathBuf::from(format!("/lib/{}-linux-gnu", std::env::consts::ARCH))
}

fn path_var(name: &str) -> Option<PathBuf> {
    crate::native::env_path(name).map(absolute)
}

fn absolute(p: PathBuf) -> PathBuf {
    // std::path::absolute only fails for an empty path or an unreadable cwd; then keep it as is.
    std::path::absolute(&p).unwrap_or(p)
}

/// Where XILINX_XRT came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum XrtSource {
    /// ONEBIT_XRT_ROOT.
    Knob,
    /// $XILINX_XRT.
    XilinxXrt,
    /// Neither set: /opt/xilinx/xrt.
    Default,
}

impl fmt::Display for XrtSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            XrtSource::Knob => XRT_ROOT_VAR,
            XrtSource::XilinxXrt => "$XILINX_XRT",
            XrtSource::Default => "default",
        })
    }
}

/// XILINX_XRT = ONEBIT_XRT_ROOT, else $XILINX_XRT, else /opt/xilinx/xrt.
pub fn xrt_root(knob: Option<&Path>, xilinx_xrt: Option<&Path>) -> (PathBuf, XrtSource) {
    match (knob, xilinx_xrt) {
        (Some(k), _) => (k.to_path_buf(), XrtSource::Knob),
        (None, Some(x)) => (x.to_path_buf(), XrtSource::XilinxXrt),
        (None, None) => (PathBuf::from(DEFAULT_XRT_ROOT), XrtSource::Default),
    }
}

/// The variables the worker gets on the NPU route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEnv {
    pub xilinx_xrt: PathBuf,
    pub xrt_source: XrtSource,
    pub ld_library_path: OsString,
    pub ryzenai_ep_path: PathBuf,
    /// RYZENAI_EP_PATH is the one the user exported.
    pub ep_path_from_user: bool,
    /// RYZEN_AI_INSTALLATION_PATH: the venv (ONEBIT_RYZENAI_ROOT).
    pub ryzen_ai_installation_path: PathBuf,
    /// The worker's directory holds its own provider copy (it was built against the venv).
    pub provider_beside_worker: bool,
    /// Why `<xrt>/lib` was put before the venv's libraries, against AMD's order (`None`: AMD's
    /// order).
    pub xrt_first: Option<String>,
}

/// Why the environment is left as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unchanged {
    /// genai_config.json declares no RyzenAI provider: a CPU model.
    CpuModel,
    /// ONEBIT_RYZENAI_ROOT is unset.
    NoRyzenAiRoot,
}

impl fmt::Display for Unchanged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unchanged::CpuModel => "the model does not declare the RyzenAI provider",
            Unchanged::NoRyzenAiRoot => "ONEBIT_RYZENAI_ROOT is not set",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvPlan {
    /// The child inherits the parent's environment as is.
    Unchanged(Unchanged),
    Set(WorkerEnv),
}

impl EnvPlan {
    /// The variables to set, in a fixed order; empty when unchanged.
    pub fn vars(&self) -> Vec<(&'static str, OsString)> {
        match self {
            EnvPlan::Unchanged(_) => Vec::new(),
            EnvPlan::Set(w) => vec![
                (XILINX_XRT_VAR, w.xilinx_xrt.clone().into_os_string()),
                (LD_LIBRARY_PATH_VAR, w.ld_library_path.clone()),
                (
                    RYZENAI_EP_PATH_VAR,
                    w.ryzenai_ep_path.clone().into_os_string(),
                ),
                (
                    RYZEN_AI_INSTALLATION_PATH_VAR,
                    w.ryzen_ai_installation_path.clone().into_os_string(),
                ),
            ],
        }
    }

    /// Sets the plan's variables on the worker's command (nothing when unchanged).
    pub fn apply(&self, cmd: &mut Command) {
        for (k, v) in self.vars() {
            cmd.env(k, v);
        }
    }
}

impl fmt::Display for EnvPlan {
    /// One log line: `worker env: unchanged (...)` or `worker env: XILINX_XRT=... ...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EnvPlan::Unchanged(why) => write!(f, "worker env: unchanged ({why})"),
            EnvPlan::Set(w) => write!(f, "worker env: {w}"),
        }
    }
}

impl fmt::Display for WorkerEnv {
    /// The variables and why each has its value: `XILINX_XRT=... (...) LD_LIBRARY_PATH=...`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self;
        write!(
            f,
            "XILINX_XRT={} ({}) LD_LIBRARY_PATH={}{} RYZENAI_EP_PATH={}{} \
             RYZEN_AI_INSTALLATION_PATH={}",
            w.xilinx_xrt.display(),
            w.xrt_source,
            Path::new(&w.ld_library_path).display(),
            match &w.xrt_first {
                Some(why) => format!(" (XRT first: {why})"),
                None => " (AMD's order)".to_owned(),
            },
            w.ryzenai_ep_path.display(),
            if w.ep_path_from_user {
                " (yours)"
            } else if w.provider_beside_worker {
                " (provider beside the worker)"
            } else {
                ""
            },
            w.ryzen_ai_installation_path.display()
        )
    }
}

/// The worker's environment (see the module docs for the rules). The one thing read from disk is
/// whether the worker's directory holds [`PROVIDER_FILE`]. Fails only when a directory to be put
/// on LD_LIBRARY_PATH contains `:`, which the variable cannot express.
pub fn worker_env(inputs: &EnvInputs) -> Result<EnvPlan, NpuError> {
    if !inputs.provider_declared {
        return Ok(EnvPlan::Unchanged(Unchanged::CpuModel));
    }
    let Some(venv) = inputs.ryzenai_root.as_deref() else {
        return Ok(EnvPlan::Unchanged(Unchanged::NoRyzenAiRoot));
    };
    let (xrt, xrt_source) = xrt_root(
        inputs.xrt_root_knob.as_deref(),
        inputs.xilinx_xrt.as_deref(),
    );
    let venv_lib = venv_lib_dir(venv);
    let worker_dir = inputs
        .worker_exe
        .parent()
        .filter(|d| !d.as_os_str().is_empty());
    let beside = worker_dir.filter(|d| d.join(PROVIDER_FILE).is_file());

    let mut venv_dirs = Vec::new();
    if let Some(dir) = beside {
        venv_dirs.push(("worker directory", dir.to_path_buf()));
    }
    venv_dirs.push(("ONEBIT_RYZENAI_ROOT/deployment/lib", venv_lib.clone()));
    let xrt_first = venv_dirs.iter().find_map(|(_, dir)| {
        bundled_xrt(dir).map(|lib| {
            format!(
                "{} bundles {lib}, which must not win over the installed XRT",
                dir.display()
            )
        })
    });
    let xrt_lib = ("XILINX_XRT/lib", xrt.join("lib"));
    let mut front = Vec::new();
    if let Some(sys) = &inputs.system_lib_dir {
        front.push(("system libraries", sys.clone()));
    }
    if xrt_first.is_some() {
        front.push(xrt_lib);
        front.extend(venv_dirs);
    } else {
        front.extend(venv_dirs);
        front.push(xrt_lib);
    }
    for (var, dir) in &front {
        if dir.as_os_str().as_bytes().contains(&b':') {
            return Err(NpuError::ColonInPath {
                var,
                path: dir.clone(),
            });
        }
    }

    let mut entries: Vec<OsString> = front.into_iter().map(|(_, d)| d.into()).collect();
    if let Some(old) = &inputs.ld_library_path {
        entries.extend(split_search_path(old));
    }
    let ld_library_path = join_search_path(dedup_paths(entries));

    let ryzenai_ep_path = match (&inputs.ryzenai_ep_path, beside) {
        (Some(user), _) => user.clone(),
        (None, Some(dir)) => dir.join(PROVIDER_FILE),
        (None, None) => venv_lib.join(PROVIDER_FILE),
    };
    Ok(EnvPlan::Set(WorkerEnv {
        xilinx_xrt: xrt,
        xrt_source,
        ld_library_path,
        ryzenai_ep_path,
        ep_path_from_user: inputs.ryzenai_ep_path.is_some(),
        ryzen_ai_installation_path: venv.to_path_buf(),
        provider_beside_worker: beside.is_some(),
        xrt_first,
    }))
}

/// The first XRT library (`libxrt_*`, by sorted name) in `dir`, if it bundles any.
fn bundled_xrt(dir: &Path) -> Option<String> {
    files_starting(dir, "libxrt_")
        .into_iter()
        .find(|n| n.contains(".so"))
}

/// The names in `dir` that start with `prefix`, sorted (none when it cannot be read).
pub(crate) fn files_starting(dir: &Path, prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(prefix))
        .collect();
    v.sort();
    v
}

/// The non-empty entries of a `:`-separated search path.
pub fn split_search_path(value: &OsStr) -> impl Iterator<Item = OsString> + '_ {
    value
        .as_bytes()
        .split(|b| *b == b':')
        .filter(|e| !e.is_empty())
        .map(|e| OsString::from_vec(e.to_vec()))
}

/// Keeps the first of entries that name the same directory. `Path` equality ignores trailing and
/// doubled slashes and `.` components, so `/a/b/` and `/a//b` count as `/a/b`.
fn dedup_paths(entries: Vec<OsString>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::with_capacity(entries.len());
    for e in entries {
        if !out.iter().any(|o| Path::new(o) == Path::new(&e)) {
            out.push(e);
        }
    }
    out
}

fn join_search_path(entries: Vec<OsString>) -> OsString {
    let mut out = OsString::new();
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push(":");
        }
        out.push(e);
    }
    out
}

/// The provider library name older onnxruntime-genai builds look for on Linux (no `lib` prefix;
/// the reference's `./onnxruntime_providers_ryzenai.so`).
pub const LEGACY_PROVIDER_FILE: &str = "onnxruntime_providers_ryzenai.so";

/// What [`provider_library`] looks at.
#[derive(Debug, Clone, Default)]
pub struct ProviderSearch {
    /// RYZENAI_EP_PATH in the process that registers the provider.
    pub ep_path_env: Option<OsString>,
    /// Directories of the loaded libraries, in onnxruntime-genai's order: onnxruntime-genai's
    /// library, ONNX Runtime's library, the executable.
    pub loaded_library_dirs: Vec<PathBuf>,
    /// The current working directory.
    pub cwd: PathBuf,
}

impl ProviderSearch {
    /// RYZENAI_EP_PATH and the cwd of this process; the caller names the loaded libraries'
    /// directories (it knows which libonnxruntime it loaded).
    pub fn from_process(loaded_library_dirs: Vec<PathBuf>) -> Self {
        ProviderSearch {
            ep_path_env: std::env::var_os(RYZENAI_EP_PATH_VAR),
            loaded_library_dirs,
            cwd: std::env::current_dir().unwrap_or_default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderSource {
    EpPathEnv,
    BesideLoadedLibrary,
    WorkingDirectory,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderLibrary {
    pub path: PathBuf,
    pub source: ProviderSource,
}

/// Where the RyzenAI provider library is registered from, in onnxruntime-genai's order
/// (src/ryzenai/interface.cpp):
///
/// 1. RYZENAI_EP_PATH when set and non-empty, taken as is (not checked for existence);
/// 2. the first of the loaded libraries' directories (genai's library, ONNX Runtime's, the
///    executable's) that holds the library — genai does this step on Windows only, which is
///    why the worker's environment must carry RYZENAI_EP_PATH on Linux; our own engine does it
///    on Linux too;
/// 3. else `<cwd>/libonnxruntime_providers_ryzenai.so`, unchecked (registration then fails with
///    ONNX Runtime's own error naming that path).
///
/// onnxruntime-genai up to 0.14 (the one Ryzen AI 1.8 ships) skipped all of this when a library
/// of that name was already loaded in the process; 0.15 and later always search. Older genai
/// builds used [`LEGACY_PROVIDER_FILE`] on Linux; step 2 accepts that name too.
pub fn provider_library(search: &ProviderSearch) -> ProviderLibrary {
    const EP_PATH: &str = RYZENAI_EP_PATH_VAR;
    const BESIDE: &str = "beside a loaded library";
    const CWD: &str = "the working directory";
    let mut places = crate::native::Search::new(
        "the RyzenAI provider library",
        "set RYZENAI_EP_PATH to the provider library",
    );
    if let Some(p) = search.ep_path_env.as_ref().filter(|p| !p.is_empty()) {
        places = places.as_is(EP_PATH, p);
    }
    for dir in &search.loaded_library_dirs {
        for name in [PROVIDER_FILE, LEGACY_PROVIDER_FILE] {
            places = places.at(BESIDE, dir.join(name));
        }
    }
    let found = places
        .as_is(CWD, search.cwd.join(PROVIDER_FILE))
        .first(|place| Ok(place.source));
    match found {
        Ok(f) => ProviderLibrary {
            source: match f.lib {
                EP_PATH => ProviderSource::EpPathEnv,
                BESIDE => ProviderSource::BesideLoadedLibrary,
                _ => ProviderSource::WorkingDirectory,
            },
            path: f.place.path,
        },
        // The last place is taken as it is, so the search always ends there at the latest.
        Err(_) => ProviderLibrary {
            path: search.cwd.join(PROVIDER_FILE),
            source: ProviderSource::WorkingDirectory,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn tmp(tag: &str) -> crate::testutil::TempDir {
        crate::testutil::tempdir(&format!("npu-env-{tag}"))
    }

    fn inputs(worker_dir: &Path) -> EnvInputs {
        EnvInputs {
            provider_declared: true,
            ryzenai_root: Some("/venv".into()),
            xrt_root_knob: None,
            xilinx_xrt: None,
            ld_library_path: None,
            ryzenai_ep_path: None,
            system_lib_dir: Some("/lib/x86_64-linux-gnu".into()),
            worker_exe: worker_dir.join("onebit-tts"),
        }
    }

    fn set(plan: EnvPlan) -> WorkerEnv {
        match plan {
            EnvPlan::Set(w) => w,
            EnvPlan::Unchanged(why) => panic!("unexpectedly unchanged: {why}"),
        }
    }

    #[test]
    fn venv_first_when_no_provider_beside_the_worker() {
        let t = tmp("plain");
        let w = set(worker_env(&inputs(&t)).expect("plan"));
        assert_eq!(w.xilinx_xrt, Path::new("/opt/xilinx/xrt"));
        assert_eq!(w.xrt_source, XrtSource::Default);
        // AMD's Ryzen AI 1.8 order: system libraries, deployment/lib, then XRT's setup.
        assert_eq!(
            w.ld_library_path,
            "/lib/x86_64-linux-gnu:/venv/deployment/lib:/opt/xilinx/xrt/lib"
        );
        assert_eq!(w.xrt_first, None);
        assert_eq!(
            w.ryzenai_ep_path,
            Path::new("/venv/deployment/lib/libonnxruntime_providers_ryzenai.so")
        );
        assert!(!w.provider_beside_worker);
        assert!(!w.ep_path_from_user);
    }

    #[test]
    fn worker_dir_before_venv_when_provider_beside_it() {
        let t = tmp("beside");
        fs::write(t.join(PROVIDER_FILE), b"").expect("write");
        let w = set(worker_env(&inputs(&t)).expect("plan"));
        assert_eq!(
            w.ld_library_path,
            OsString::from(format!(
                "/lib/x86_64-linux-gnu:{}:/venv/deployment/lib:/opt/xilinx/xrt/lib",
                t.display()
            ))
        );
        assert_eq!(w.ryzenai_ep_path, t.join(PROVIDER_FILE));
        assert!(w.provider_beside_worker);
    }

    #[test]
    fn a_directory_named_like_the_provider_does_not_count() {
        let t = tmp("dirnamed");
        fs::create_dir(t.join(PROVIDER_FILE)).expect("mkdir");
        assert!(!set(worker_env(&inputs(&t)).expect("plan")).provider_beside_worker);
    }

    #[test]
    fn xilinx_xrt_sources_in_order() {
        let t = tmp("xrt");
        let mut i = inputs(&t);
        i.xilinx_xrt = Some("/env/xrt".into());
        let w = set(worker_env(&i).expect("plan"));
        assert_eq!(w.xilinx_xrt, Path::new("/env/xrt"));
        assert_eq!(w.xrt_source, XrtSource::XilinxXrt);
        assert_eq!(
            w.ld_library_path,
            "/lib/x86_64-linux-gnu:/venv/deployment/lib:/env/xrt/lib"
        );

        i.xrt_root_knob = Some("/knob/xrt".into());
        let w = set(worker_env(&i).expect("plan"));
        assert_eq!(w.xilinx_xrt, Path::new("/knob/xrt"));
        assert_eq!(w.xrt_source, XrtSource::Knob);
        assert_eq!(
            w.ld_library_path,
            "/lib/x86_64-linux-gnu:/venv/deployment/lib:/knob/xrt/lib"
        );
    }

    #[test]
    fn unchanged_without_knob_or_for_a_cpu_model() {
        let t = tmp("unchanged");
        let mut i = inputs(&t);
        i.ryzenai_root = None;
        let plan = worker_env(&i).expect("plan");
        assert_eq!(plan, EnvPlan::Unchanged(Unchanged::NoRyzenAiRoot));
        assert!(plan.vars().is_empty());

        let mut i = inputs(&t);
        i.provider_declared = false;
        assert_eq!(
            worker_env(&i).expect("plan"),
            EnvPlan::Unchanged(Unchanged::CpuModel)
        );
    }

    #[test]
    fn old_search_path_kept_last_without_empties_or_duplicates() {
        let t = tmp("dedup");
        let mut i = inputs(&t);
        i.ld_library_path = Some(
            "/usr/local/lib::/venv/deployment/lib/:/opt/xilinx/xrt/lib:/usr/local/lib:".into(),
        );
        let w = set(worker_env(&i).expect("plan"));
        assert_eq!(
            w.ld_library_path,
            "/lib/x86_64-linux-gnu:/venv/deployment/lib:/opt/xilinx/xrt/lib:/usr/local/lib"
        );
    }

    #[test]
    fn a_venv_that_bundles_xrt_libraries_puts_the_installed_xrt_first_and_says_why() {
        let t = tmp("bundled");
        let venv = t.join("venv");
        let lib = venv_lib_dir(&venv);
        fs::create_dir_all(&lib).expect("mkdir");
        fs::write(lib.join("libxrt_coreutil.so.2.19.0"), b"").expect("write");
        let mut i = inputs(&t);
        i.ryzenai_root = Some(venv.clone());
        let w = set(worker_env(&i).expect("plan"));
        assert_eq!(
            w.ld_library_path,
            OsString::from(format!(
                "/lib/x86_64-linux-gnu:/opt/xilinx/xrt/lib:{}",
                lib.display()
            ))
        );
        let why = w.xrt_first.clone().expect("a reason");
        assert!(why.contains("libxrt_coreutil.so.2.19.0"), "{why}");
        assert!(
            EnvPlan::Set(w).to_string().contains("XRT first: "),
            "the log line says why"
        );
    }

    #[test]
    fn a_ryzenai_ep_path_the_user_exported_is_kept() {
        let t = tmp("userpath");
        fs::write(t.join(PROVIDER_FILE), b"").expect("write");
        let mut i = inputs(&t);
        i.ryzenai_ep_path = Some("/mine/libonnxruntime_providers_ryzenai.so".into());
        let plan = worker_env(&i).expect("plan");
        let w = set(plan.clone());
        assert_eq!(
            w.ryzenai_ep_path,
            Path::new("/mine/libonnxruntime_providers_ryzenai.so")
        );
        assert!(w.ep_path_from_user);
        assert!(plan.to_string().contains("(yours)"), "{plan}");
    }

    #[test]
    fn a_colon_in_a_directory_is_an_error() {
        let t = tmp("colon");
        let mut i = inputs(&t);
        i.ryzenai_root = Some("/ve:nv".into());
        assert!(matches!(worker_env(&i), Err(NpuError::ColonInPath { .. })));
    }

    #[test]
    fn apply_and_display() {
        let t = tmp("apply");
        let plan = worker_env(&inputs(&t)).expect("plan");
        let mut cmd = Command::new("true");
        plan.apply(&mut cmd);
        let vars: Vec<_> = cmd.get_envs().collect();
        assert_eq!(vars.len(), 4);
        let line = plan.to_string();
        assert!(
            line.contains("XILINX_XRT=/opt/xilinx/xrt (default)"),
            "{line}"
        );
        assert!(
            line.contains("RYZENAI_EP_PATH=/venv/deployment/lib/"),
            "{line}"
        );
    }

    #[test]
    fn provider_library_order() {
        let t = tmp("provider");
        let a = t.join("a");
        let b = t.join("b");
        fs::create_dir_all(&a).expect("mkdir");
        fs::create_dir_all(&b).expect("mkdir");
        fs::write(b.join(LEGACY_PROVIDER_FILE), b"").expect("write");
        let mut s = ProviderSearch {
            ep_path_env: Some("/x/libp.so".into()),
            loaded_library_dirs: vec![a.clone(), b.clone()],
            cwd: "/work".into(),
        };
        let p = provider_library(&s);
        assert_eq!(p.source, ProviderSource::EpPathEnv);
        assert_eq!(p.path, Path::new("/x/libp.so"));

        s.ep_path_env = Some(OsString::new());
        let p = provider_library(&s);
        assert_eq!(p.source, ProviderSource::BesideLoadedLibrary);
        assert_eq!(p.path, b.join(LEGACY_PROVIDER_FILE));

        fs::write(a.join(PROVIDER_FILE), b"").expect("write");
        assert_eq!(provider_library(&s).path, a.join(PROVIDER_FILE));

        s.loaded_library_dirs.clear();
        let p = provider_library(&s);
        assert_eq!(p.source, ProviderSource::WorkingDirectory);
        assert_eq!(p.path, Path::new("/work").join(PROVIDER_FILE));
    }
}
