//! onnxruntime-genai (OGA) as a [`Backbone`], through its C API (`ort_genai_c.h`) loaded at run
//! time with libloading.
//!
//! OGA only runs the model and keeps the KV cache here: sampling and stop rules stay ours (the
//! shared [`super::generate`] loop). A sequence is driven like this:
//!
//! - prefill: `OgaGenerator_AppendTokens(prompt)` runs the model at once; `OgaGenerator_GetLogits`
//!   copies out the logits of the last position;
//! - each step, in [`OgaStep::Append`] mode (the default): `AppendTokens([picked])` runs the picked
//!   token at once, then `GetLogits`. OGA never samples and never sees our choice before it runs;
//! - in [`OgaStep::Generate`] mode, for builds or devices that refuse a second `AppendTokens`
//!   ("continuous decoding"): `SetLogits` with every logit but the picked one at -inf,
//!   `GenerateNextToken` (greedy, so OGA selects exactly our token; checked with `GetNextTokens`).
//!   OGA runs lazily: `GenerateNextToken` only appends the token, and the model run for it
//!   happens inside the next `GetLogits` (or `GenerateNextToken`/`AppendTokens`), which is where
//!   we read its logits. [`OgaStep::Auto`] starts in append mode and switches for good when OGA
//!   refuses continuous decoding.
//!
//! `reset` rewinds the generator to 0 (`OgaGenerator_RewindTo`), or drops it when the model type
//! cannot rewind; a new generator is created on the next append.
//!
//! The library itself is found by the crate's one native-library search ([`crate::native`]):
//! `--oga-lib` or `$ONEBIT_OGA_LIB` alone when given, else the RyzenAI venv, `.onebit/oga/lib`,
//! python3's `onnxruntime_genai` package.
//!
//! OGA itself loads ONNX Runtime with `dlopen` (`$ORT_LIB_PATH`, `libonnxruntime.so`, the same
//! name beside libonnxruntime-genai.so, then `libonnxruntime.so.1`). The engine loads ONNX Runtime
//! through [`crate::runtime`] first, so that the last name resolves to the library already in the
//! process (its soname is `libonnxruntime.so.1`) and the codec and OGA share one runtime; after
//! loading a model it warns when two different ONNX Runtime files are mapped anyway.

use std::ffi::{CStr, CString, c_char, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use libloading::os::unix::{Library, RTLD_LOCAL, RTLD_NOW};

use super::{Backbone, EngineError, KvMode};
use crate::native;
use crate::package::logits::LOGITS_MANIFEST;
use crate::package::{BackbonePackage, ModelPackage};

/// Environment variable naming libonnxruntime-genai.so (the CLI's `--oga-lib`).
pub const OGA_LIB_VAR: &str = "ONEBIT_OGA_LIB";
/// File name of the library in the RyzenAI venv, `.onebit/oga/lib` and the PyPI wheel.
pub const OGA_LIB_FILE: &str = "libonnxruntime-genai.so";
/// Oldest onnxruntime-genai whose C API has what this engine binds (GetLogits/SetLogits,
/// RewindTo, AppendTokens on a generator).
pub const MIN_VERSION: (u32, u32, u32) = (0, 6, 0);

/// OgaElementType_float32.
const OGA_FLOAT32: i32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum OgaLoadError {
    #[error(transparent)]
    NotFound(#[from] native::NotFound),
    #[error("{}: cannot load it as a shared library: {reason}", .path.display())]
    Load { path: PathBuf, reason: String },
    #[error("{}: not an onnxruntime-genai library (it has no {symbol}); pass the path of {OGA_LIB_FILE} to --oga-lib", .path.display())]
    NotOga { path: PathBuf, symbol: &'static str },
    #[error(
        "{}: onnxruntime-genai {version} lacks {symbol}, which the oga engine needs; use onnxruntime-genai {}.{}.{} or newer",
        .path.display(), MIN_VERSION.0, MIN_VERSION.1, MIN_VERSION.2
    )]
    MissingSymbol {
        path: PathBuf,
        version: String,
        symbol: &'static str,
    },
    #[error(
        "{}: onnxruntime-genai {found} is older than {}.{}.{}, the oldest the oga engine supports",
        .path.display(), MIN_VERSION.0, MIN_VERSION.1, MIN_VERSION.2
    )]
    TooOld { path: PathBuf, found: String },
    #[error(
        "onnxruntime-genai is already loaded from {} in this process; it cannot also load {}",
        .loaded.display(), .requested.display()
    )]
    AlreadyLoaded { loaded: PathBuf, requested: PathBuf },
}

impl OgaLoadError {
    /// Why a place was refused, without the path (the search names it).
    fn why(&self) -> String {
        let full = self.to_string();
        let path = match self {
            OgaLoadError::Load { path, .. }
            | OgaLoadError::NotOga { path, .. }
            | OgaLoadError::MissingSymbol { path, .. }
            | OgaLoadError::TooOld { path, .. } => path,
            OgaLoadError::NotFound(_) | OgaLoadError::AlreadyLoaded { .. } => return full,
        };
        full.strip_prefix(&format!("{}: ", path.display()))
            .map_or_else(|| full.clone(), str::to_owned)
    }
}

// Opaque OGA handles.
enum OgaResult {}
enum OgaConfig {}
enum OgaModel {}
enum OgaGeneratorParams {}
enum OgaGenerator {}
enum OgaTensor {}

type Res = *mut OgaResult;

/// The bound C API. Field names follow the C functions (`OgaX` -> `x`).
struct Api {
    result_get_error: unsafe extern "C" fn(*const OgaResult) -> *const c_char,
    destroy_result: unsafe extern "C" fn(*mut OgaResult),
    create_config: unsafe extern "C" fn(*const c_char, *mut *mut OgaConfig) -> Res,
    destroy_config: unsafe extern "C" fn(*mut OgaConfig),
    config_clear_providers: unsafe extern "C" fn(*mut OgaConfig) -> Res,
    config_append_provider: unsafe extern "C" fn(*mut OgaConfig, *const c_char) -> Res,
    create_model_from_config: unsafe extern "C" fn(*const OgaConfig, *mut *mut OgaModel) -> Res,
    destroy_model: unsafe extern "C" fn(*mut OgaModel),
    create_generator_params:
        unsafe extern "C" fn(*const OgaModel, *mut *mut OgaGeneratorParams) -> Res,
    destroy_generator_params: unsafe extern "C" fn(*mut OgaGeneratorParams),
    generator_params_set_search_number:
        unsafe extern "C" fn(*mut OgaGeneratorParams, *const c_char, f64) -> Res,
    generator_params_set_search_bool:
        unsafe extern "C" fn(*mut OgaGeneratorParams, *const c_char, bool) -> Res,
    create_generator: unsafe extern "C" fn(
        *const OgaModel,
        *const OgaGeneratorParams,
        *mut *mut OgaGenerator,
    ) -> Res,
    destroy_generator: unsafe extern "C" fn(*mut OgaGenerator),
    generator_append_tokens: unsafe extern "C" fn(*mut OgaGenerator, *const i32, usize) -> Res,
    generator_get_logits: unsafe extern "C" fn(*mut OgaGenerator, *mut *mut OgaTensor) -> Res,
    generator_set_logits: unsafe extern "C" fn(*mut OgaGenerator, *mut OgaTensor) -> Res,
    generator_generate_next_token: unsafe extern "C" fn(*mut OgaGenerator) -> Res,
    generator_get_next_tokens:
        unsafe extern "C" fn(*const OgaGenerator, *mut *const i32, *mut usize) -> Res,
    generator_rewind_to: unsafe extern "C" fn(*mut OgaGenerator, usize) -> Res,
    create_tensor_from_buffer:
        unsafe extern "C" fn(*mut c_void, *const i64, usize, i32, *mut *mut OgaTensor) -> Res,
    destroy_tensor: unsafe extern "C" fn(*mut OgaTensor),
    tensor_get_type: unsafe extern "C" fn(*mut OgaTensor, *mut i32) -> Res,
    tensor_get_shape_rank: unsafe extern "C" fn(*mut OgaTensor, *mut usize) -> Res,
    tensor_get_shape: unsafe extern "C" fn(*mut OgaTensor, *mut i64, usize) -> Res,
    tensor_get_data: unsafe extern "C" fn(*mut OgaTensor, *mut *mut c_void) -> Res,
    // Optional: used when present, or only for the features that need them.
    config_overlay: Option<unsafe extern "C" fn(*mut OgaConfig, *const c_char) -> Res>,
    model_get_type: Option<unsafe extern "C" fn(*const OgaModel, *mut *const c_char) -> Res>,
    model_get_device_type: Option<unsafe extern "C" fn(*const OgaModel, *mut *const c_char) -> Res>,
    destroy_string: Option<unsafe extern "C" fn(*const c_char)>,
    set_telemetry_enabled: Option<unsafe extern "C" fn(bool)>,
}

/// A loaded libonnxruntime-genai.so: where it came from, its version and its bound API. Loaded
/// once per process and never unloaded.
pub struct OgaLibrary {
    path: PathBuf,
    source: &'static str,
    version: Option<String>,
    api: Api,
    _lib: Library,
}

impl std::fmt::Debug for OgaLibrary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OgaLibrary")
            .field("path", &self.path)
            .field("source", &self.source)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl OgaLibrary {
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// Which rule found it (`--oga-lib`, `ONEBIT_RYZENAI_ROOT`, ...).
    pub fn source(&self) -> &'static str {
        self.source
    }
    /// The version, when the library or its package says (`None`: unknown; the symbol check
    /// still passed).
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// Turns a returned OgaResult into OGA's error text (and frees it).
    fn check(&self, call: &'static str, r: Res) -> Result<(), EngineError> {
        if r.is_null() {
            return Ok(());
        }
        // SAFETY: a non-null OgaResult from this library; its string lives until it is destroyed.
        let message = unsafe {
            let p = (self.api.result_get_error)(r);
            let m = if p.is_null() {
                "(no error text)".to_owned()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            };
            (self.api.destroy_result)(r);
            m
        };
        Err(EngineError::Oga { call, message })
    }

    /// An OGA-owned string (freed after copying).
    fn take_string(&self, p: *const c_char) -> String {
        if p.is_null() {
            return String::new();
        }
        // SAFETY: a NUL-terminated string OGA returned for us to free with OgaDestroyString.
        unsafe {
            let s = CStr::from_ptr(p).to_string_lossy().into_owned();
            if let Some(free) = self.api.destroy_string {
                free(p);
            }
            s
        }
    }
}

fn parse_version(s: &str) -> Option<(u32, u32, u32)> {
    let mut it = s
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(str::parse::<u32>);
    let major = it.next()?.ok()?;
    let minor = it.next()?.ok()?;
    let patch = it.next().and_then(Result::ok).unwrap_or(0);
    Some((major, minor, patch))
}

fn looks_like_version(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 32
        && s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-' || c == '+')
        && parse_version(s).is_some()
}

/// OGA's C API has no version call, so the version comes from what travels with the library:
/// the PyPI wheel's `__init__.py` beside it, a `VERSION` file beside it (for hand-made installs),
/// else the version string the library embeds for its telemetry records (`sdkVersion`, present
/// in the official builds).
fn detect_version(lib: &Path) -> Option<String> {
    let mut dirs: Vec<PathBuf> = lib.parent().map(Path::to_path_buf).into_iter().collect();
    if let Some(d) = std::fs::canonicalize(lib)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        && !dirs.contains(&d)
    {
        dirs.push(d);
    }
    for dir in &dirs {
        if let Ok(s) = std::fs::read_to_string(dir.join("__init__.py"))
            && let Some(v) = s.lines().find_map(|l| {
                let rest = l.trim().strip_prefix("__version__")?.trim_start();
                let rest = rest.strip_prefix('=')?.trim();
                Some(rest.trim_matches(|c| c == '"' || c == '\'').to_owned())
            })
            && looks_like_version(&v)
        {
            return Some(v);
        }
        if let Ok(s) = std::fs::read_to_string(dir.join("VERSION")) {
            let v = s.trim();
            if looks_like_version(v) {
                return Some(v.to_owned());
            }
        }
    }
    let bytes = std::fs::read(lib).ok()?;
    const KEY: &[u8] = b"sdkVersion\0";
    let at = bytes.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let end = bytes[at..].iter().take(33).position(|&b| b == 0)?;
    let v = std::str::from_utf8(&bytes[at..at + end]).ok()?;
    looks_like_version(v).then(|| v.to_owned())
}

/// Opens one candidate: dlopen (RTLD_NOW, so unresolved dependencies fail here and not at a
/// call), then every symbol, then the version.
fn open(path: &Path, source: &'static str) -> Result<OgaLibrary, OgaLoadError> {
    if !path.exists() {
        return Err(OgaLoadError::Load {
            path: path.to_path_buf(),
            reason: "no such file".into(),
        });
    }
    // SAFETY: loading runs the library's initialisers; libonnxruntime-genai's are plain C++
    // static constructors. A library that is not OGA is rejected below before any call.
    let lib = unsafe { Library::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
        // dlerror's text is the error's source; the error itself only says "dlopen failed".
        let reason = std::error::Error::source(&e).map_or_else(|| e.to_string(), |s| s.to_string());
        OgaLoadError::Load {
            path: path.to_path_buf(),
            reason,
        }
    })?;
    let has = |name: &str| {
        // SAFETY: only looks the symbol up.
        unsafe { lib.get::<*const c_void>(name) }.is_ok()
    };
    for symbol in ["OgaCreateConfig", "OgaResultGetError"] {
        if !has(symbol) {
            return Err(OgaLoadError::NotOga {
                path: path.to_path_buf(),
                symbol,
            });
        }
    }
    let version = detect_version(path);
    if let Some(v) = &version
        && parse_version(v).is_some_and(|p| p < MIN_VERSION)
    {
        return Err(OgaLoadError::TooOld {
            path: path.to_path_buf(),
            found: v.clone(),
        });
    }
    let missing = |symbol: &'static str| OgaLoadError::MissingSymbol {
        path: path.to_path_buf(),
        version: version
            .clone()
            .unwrap_or_else(|| "(version unknown)".into()),
        symbol,
    };
    macro_rules! req {
        ($name:literal) => {
            // SAFETY: the field's type is the C declaration of this symbol in ort_genai_c.h.
            match unsafe { lib.get($name) } {
                Ok(s) => *s,
                Err(_) => return Err(missing($name)),
            }
        };
    }
    macro_rules! opt {
        ($name:literal) => {
            // SAFETY: as above.
            unsafe { lib.get($name) }.ok().map(|s| *s)
        };
    }
    let api = Api {
        result_get_error: req!("OgaResultGetError"),
        destroy_result: req!("OgaDestroyResult"),
        create_config: req!("OgaCreateConfig"),
        destroy_config: req!("OgaDestroyConfig"),
        config_clear_providers: req!("OgaConfigClearProviders"),
        config_append_provider: req!("OgaConfigAppendProvider"),
        create_model_from_config: req!("OgaCreateModelFromConfig"),
        destroy_model: req!("OgaDestroyModel"),
        create_generator_params: req!("OgaCreateGeneratorParams"),
        destroy_generator_params: req!("OgaDestroyGeneratorParams"),
        generator_params_set_search_number: req!("OgaGeneratorParamsSetSearchNumber"),
        generator_params_set_search_bool: req!("OgaGeneratorParamsSetSearchBool"),
        create_generator: req!("OgaCreateGenerator"),
        destroy_generator: req!("OgaDestroyGenerator"),
        generator_append_tokens: req!("OgaGenerator_AppendTokens"),
        generator_get_logits: req!("OgaGenerator_GetLogits"),
        generator_set_logits: req!("OgaGenerator_SetLogits"),
        generator_generate_next_token: req!("OgaGenerator_GenerateNextToken"),
        generator_get_next_tokens: req!("OgaGenerator_GetNextTokens"),
        generator_rewind_to: req!("OgaGenerator_RewindTo"),
        create_tensor_from_buffer: req!("OgaCreateTensorFromBuffer"),
        destroy_tensor: req!("OgaDestroyTensor"),
        tensor_get_type: req!("OgaTensorGetType"),
        tensor_get_shape_rank: req!("OgaTensorGetShapeRank"),
        tensor_get_shape: req!("OgaTensorGetShape"),
        tensor_get_data: req!("OgaTensorGetData"),
        config_overlay: opt!("OgaConfigOverlay"),
        model_get_type: opt!("OgaModelGetType"),
        model_get_device_type: opt!("OgaModelGetDeviceType"),
        destroy_string: opt!("OgaDestroyString"),
        set_telemetry_enabled: opt!("OgaSetTelemetryEnabled"),
    };
    if let Some(off) = api.set_telemetry_enabled {
        // SAFETY: a plain setter; nothing else of OGA has been called yet.
        unsafe { off(false) };
    }
    Ok(OgaLibrary {
        path: path.to_path_buf(),
        source,
        version,
        api,
        _lib: lib,
    })
}

fn python_oga() -> Result<PathBuf, String> {
    // find_spec locates the package without importing it (importing loads onnxruntime).
    let dir = native::python_dir(
        "import importlib.util as u; s = u.find_spec('onnxruntime_genai'); print(list(s.submodule_search_locations)[0] if s else '')",
        "python3 has no onnxruntime_genai package",
    )?;
    Ok(dir.join(OGA_LIB_FILE))
}

static LOADED: OnceLock<OgaLibrary> = OnceLock::new();
static INIT_LOCK: Mutex<()> = Mutex::new(());

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Loads onnxruntime-genai once per process. `explicit` (the `--oga-lib` flag), else
/// `$ONEBIT_OGA_LIB`, is the only candidate when given; otherwise the RyzenAI venv
/// (`$ONEBIT_RYZENAI_ROOT/deployment/lib`), the project-local `.onebit/oga/lib`, then python3's
/// `onnxruntime_genai` package, first that loads wins.
pub fn library(explicit: Option<&Path>) -> Result<&'static OgaLibrary, OgaLoadError> {
    let explicit: Option<(&'static str, PathBuf)> = match explicit {
        Some(p) => Some(("--oga-lib", p.to_path_buf())),
        None => native::env_path(OGA_LIB_VAR).map(|p| (OGA_LIB_VAR, p)),
    };
    let reuse = |l: &'static OgaLibrary| match &explicit {
        Some((_, p)) if !same_file(p, &l.path) => {
            // Say what is wrong with the requested file when it is not OGA at all, without
            // loading a second copy: OGA's exported names are in its dynamic string table.
            let is_oga = std::fs::read(p)
                .map(|b| b.windows(15).any(|w| w == b"OgaCreateConfig"))
                .unwrap_or(false);
            Err(if !p.exists() {
                OgaLoadError::Load {
                    path: p.clone(),
                    reason: "no such file".into(),
                }
            } else if is_oga {
                OgaLoadError::AlreadyLoaded {
                    loaded: l.path.clone(),
                    requested: p.clone(),
                }
            } else {
                OgaLoadError::NotOga {
                    path: p.clone(),
                    symbol: "OgaCreateConfig",
                }
            })
        }
        _ => Ok(l),
    };
    if let Some(l) = LOADED.get() {
        return reuse(l);
    }
    let _guard = INIT_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = LOADED.get() {
        return reuse(l);
    }
    let loaded = if let Some((source, path)) = &explicit {
        open(path, source)?
    } else {
        native::Search::new(
            "onnxruntime-genai (libonnxruntime-genai.so)",
            "run `scripts/setup.sh` (copies it into .onebit/oga/lib), or pass --oga-lib PATH / set ONEBIT_OGA_LIB",
        )
        .ryzenai_venv(OGA_LIB_FILE)
        .project_local(&format!("oga/lib/{OGA_LIB_FILE}"))
        .python("python3 onnxruntime_genai", python_oga)
        .first(|place| open(&place.path, place.source).map_err(|e| e.why()))?
        .lib
    };
    if loaded.version.is_none() {
        tracing::warn!(
            path = %loaded.path.display(),
            "onnxruntime-genai's version is unknown (no package metadata beside it); its C API has every function the oga engine binds"
        );
    }
    tracing::info!(
        path = %loaded.path.display(),
        source = loaded.source,
        version = loaded.version.as_deref().unwrap_or("unknown"),
        "onnxruntime-genai loaded"
    );
    Ok(LOADED.get_or_init(|| loaded))
}

/// How a decode step hands our token to OGA (see the module docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OgaStep {
    /// Append mode, switching to generate mode if OGA refuses continuous decoding.
    #[default]
    Auto,
    /// `AppendTokens([token])`: the token runs at once.
    Append,
    /// `SetLogits` + `GenerateNextToken`: OGA appends our token and runs it lazily.
    Generate,
}

/// Settings of the OGA backbone; `None` means the package's genai_config.json decides.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct OgaOptions {
    /// libonnxruntime-genai.so (the `--oga-lib` flag); see [`library`] for the search.
    pub lib: Option<PathBuf>,
    /// libonnxruntime.so for the process ([`crate::runtime`]); OGA uses the same one.
    pub ort_lib: Option<PathBuf>,
    /// Execution providers, replacing the package's (`Some(vec![])`: CPU only).
    pub providers: Option<Vec<String>>,
    pub intra_threads: Option<usize>,
    /// Overrides `search.past_present_share_buffer`.
    pub kv_mode: Option<KvMode>,
    pub step: OgaStep,
}

/// An owned OGA object, destroyed on drop.
struct Owned<T> {
    ptr: *mut T,
    destroy: unsafe extern "C" fn(*mut T),
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.ptr.is_null() {
            // SAFETY: created by this library, destroyed once.
            unsafe { (self.destroy)(self.ptr) };
        }
    }
}

/// The onnxruntime-genai backbone.
pub struct OgaBackbone {
    // Fields drop in order: the generator before its params, the model and the config.
    generator: Option<Owned<OgaGenerator>>,
    params: Owned<OgaGeneratorParams>,
    model: Owned<OgaModel>,
    _config: Owned<OgaConfig>,
    lib: &'static OgaLibrary,
    vocab: usize,
    budget: usize,
    len: usize,
    step: OgaStep,
    /// False once RewindTo failed (e.g. decoder-pipeline models): reset recreates the generator.
    can_rewind: bool,
    logits: Vec<f32>,
    /// Shape of OGA's logits tensor ([batch, 1, vocab]), for SetLogits.
    logits_shape: Vec<i64>,
    /// Generate mode's forced logits: -inf everywhere but the picked token.
    forced: Vec<f32>,
    kv: KvMode,
    desc_head: String,
}

// SAFETY: the OGA objects are owned by this value alone and are only used through `&mut self`,
// one call at a time; OGA keeps no thread affinity for them (its API is not thread-safe, which
// is why the backbone is Send but not Sync).
unsafe impl Send for OgaBackbone {}

impl OgaBackbone {
    /// Loads the package with onnxruntime-genai. ONNX Runtime is loaded first through
    /// [`crate::runtime`] (`opts.ort_lib`), so OGA finds the same library.
    pub fn load(pkg: &ModelPackage, opts: &OgaOptions) -> Result<Self, crate::Error> {
        crate::runtime::environment(opts.ort_lib.as_deref())?;
        Ok(Self::load_backbone(&pkg.backbone(), opts)?)
    }

    /// Loads from the backbone's part of a package (what the engine worker has), with the
    /// ONNX Runtime this process already loaded.
    pub fn load_backbone(pkg: &BackbonePackage, opts: &OgaOptions) -> Result<Self, EngineError> {
        // onnxruntime-genai reads logits as one row entry per vocabulary id; a head cut to the
        // speech ids (`models optimize`) would fail inside it with a shape error, so refuse first.
        if pkg.logits.speech_head.is_some() {
            return Err(EngineError::OgaCompactHead {
                manifest: pkg.dir.join(LOGITS_MANIFEST),
                source_package: pkg.logits.source.clone(),
            });
        }
        let lib = library(opts.lib.as_deref()).map_err(EngineError::from)?;
        Self::with_library(lib, pkg, opts)
    }

    fn with_library(
        lib: &'static OgaLibrary,
        pkg: &BackbonePackage,
        opts: &OgaOptions,
    ) -> Result<Self, EngineError> {
        let api = &lib.api;
        let dir = pkg.dir.to_str().ok_or_else(|| {
            EngineError::Params(format!(
                "{}: onnxruntime-genai needs a UTF-8 path",
                pkg.dir.display()
            ))
        })?;
        let dir = CString::new(dir)
            .map_err(|_| EngineError::Params("the package path contains a NUL byte".into()))?;
        let mut raw: *mut OgaConfig = std::ptr::null_mut();
        // SAFETY: valid C string and out pointer.
        lib.check("OgaCreateConfig", unsafe {
            (api.create_config)(dir.as_ptr(), &mut raw)
        })?;
        let config = Owned {
            ptr: raw,
            destroy: api.destroy_config,
        };
        let mut overlay = serde_json::Map::new();
        if let Some(n) = opts.intra_threads {
            overlay.insert(
                "model".into(),
                serde_json::json!({"decoder": {"session_options": {"intra_op_num_threads": n}}}),
            );
        }
        if let Some(kv) = opts.kv_mode {
            overlay.insert(
                "search".into(),
                serde_json::json!({"past_present_share_buffer": kv == KvMode::Shared}),
            );
        }
        if !overlay.is_empty() {
            let Some(apply) = api.config_overlay else {
                return Err(EngineError::Params(format!(
                    "{}: this onnxruntime-genai has no OgaConfigOverlay, needed for --threads/--kv with the oga engine",
                    lib.path.display()
                )));
            };
            let json = CString::new(serde_json::Value::Object(overlay).to_string())
                .expect("JSON has no NUL");
            // SAFETY: valid config and C string.
            lib.check("OgaConfigOverlay", unsafe {
                apply(config.ptr, json.as_ptr())
            })?;
        }
        if let Some(providers) = &opts.providers {
            // SAFETY: valid config.
            lib.check("OgaConfigClearProviders", unsafe {
                (api.config_clear_providers)(config.ptr)
            })?;
            for p in providers {
                let c = CString::new(p.as_str()).map_err(|_| {
                    EngineError::Params(format!("provider name {p:?} contains a NUL byte"))
                })?;
                // SAFETY: valid config and C string.
                lib.check("OgaConfigAppendProvider", unsafe {
                    (api.config_append_provider)(config.ptr, c.as_ptr())
                })?;
            }
        }
        let mut raw: *mut OgaModel = std::ptr::null_mut();
        // SAFETY: valid config and out pointer.
        lib.check("OgaCreateModelFromConfig", unsafe {
            (api.create_model_from_config)(config.ptr, &mut raw)
        })?;
        let model = Owned {
            ptr: raw,
            destroy: api.destroy_model,
        };
        warn_on_second_runtime();

        let budget = pkg.genai.token_budget();
        let mut raw: *mut OgaGeneratorParams = std::ptr::null_mut();
        // SAFETY: valid model and out pointer.
        lib.check("OgaCreateGeneratorParams", unsafe {
            (api.create_generator_params)(model.ptr, &mut raw)
        })?;
        let params = Owned {
            ptr: raw,
            destroy: api.destroy_generator_params,
        };
        // OGA's own search is only used in generate mode, where it must select exactly the
        // token we forced: greedy, and nothing that edits logits.
        for (name, value) in [
            ("max_length", budget as f64),
            ("min_length", 0.0),
            ("repetition_penalty", 1.0),
        ] {
            let c = CString::new(name).expect("static name");
            // SAFETY: valid params and C string.
            lib.check("OgaGeneratorParamsSetSearchNumber", unsafe {
                (api.generator_params_set_search_number)(params.ptr, c.as_ptr(), value)
            })?;
        }
        let c = CString::new("do_sample").expect("static name");
        // SAFETY: valid params and C string.
        lib.check("OgaGeneratorParamsSetSearchBool", unsafe {
            (api.generator_params_set_search_bool)(params.ptr, c.as_ptr(), false)
        })?;

        let model_string =
            |f: Option<unsafe extern "C" fn(*const OgaModel, *mut *const c_char) -> Res>,
             call: &'static str| {
                let f = f?;
                let mut out: *const c_char = std::ptr::null();
                // SAFETY: valid model and out pointer; the string is freed by take_string.
                lib.check(call, unsafe { f(model.ptr, &mut out) }).ok()?;
                Some(lib.take_string(out))
            };
        let model_type = model_string(api.model_get_type, "OgaModelGetType")
            .unwrap_or_else(|| pkg.genai.model.model_type.clone());
        let device = model_string(api.model_get_device_type, "OgaModelGetDeviceType")
            .unwrap_or_else(|| "?".into());
        let kv = opts
            .kv_mode
            .unwrap_or(if pkg.genai.search.past_present_share_buffer {
                KvMode::Shared
            } else {
                KvMode::Growing
            });
        let desc_head = format!(
            "oga {} ({model_type} on {device}, {}",
            lib.version().unwrap_or("(version unknown)"),
            match kv {
                KvMode::Growing => "growing KV".to_owned(),
                KvMode::Shared => format!("shared KV buffer of {budget}"),
            },
        );
        let vocab = pkg.genai.model.vocab_size;
        Ok(Self {
            generator: None,
            params,
            model,
            _config: config,
            lib,
            vocab,
            budget,
            len: 0,
            step: opts.step,
            can_rewind: true,
            logits: Vec::with_capacity(vocab),
            logits_shape: Vec::new(),
            forced: Vec::new(),
            kv,
            desc_head,
        })
    }

    /// The loaded library.
    pub fn library(&self) -> &'static OgaLibrary {
        self.lib
    }

    /// The step mode in use (an `Auto` backbone reports what it settled on once it knows).
    pub fn step(&self) -> OgaStep {
        self.step
    }

    pub fn kv_mode(&self) -> KvMode {
        self.kv
    }

    fn generator(&mut self) -> Result<*mut OgaGenerator, EngineError> {
        if let Some(g) = &self.generator {
            return Ok(g.ptr);
        }
        let api = &self.lib.api;
        let mut raw: *mut OgaGenerator = std::ptr::null_mut();
        // SAFETY: valid model, params and out pointer.
        self.lib.check("OgaCreateGenerator", unsafe {
            (api.create_generator)(self.model.ptr, self.params.ptr, &mut raw)
        })?;
        self.generator = Some(Owned {
            ptr: raw,
            destroy: api.destroy_generator,
        });
        Ok(raw)
    }

    fn append_tokens(&mut self, g: *mut OgaGenerator, ids: &[i32]) -> Result<(), EngineError> {
        // SAFETY: valid generator; `ids` outlives the call.
        self.lib.check("OgaGenerator_AppendTokens", unsafe {
            (self.lib.api.generator_append_tokens)(g, ids.as_ptr(), ids.len())
        })
    }

    /// Copies the last position's logits out of OGA (running a pending token first, which is
    /// how OGA's lazy order works after GenerateNextToken).
    fn read_logits(&mut self, g: *mut OgaGenerator) -> Result<(), EngineError> {
        let lib = self.lib;
        let api = &lib.api;
        let mut raw: *mut OgaTensor = std::ptr::null_mut();
        // SAFETY: valid generator and out pointer.
        lib.check("OgaGenerator_GetLogits", unsafe {
            (api.generator_get_logits)(g, &mut raw)
        })?;
        let t = Owned {
            ptr: raw,
            destroy: api.destroy_tensor,
        };
        let mut ty = 0i32;
        // SAFETY: valid tensor and out pointer.
        lib.check("OgaTensorGetType", unsafe {
            (api.tensor_get_type)(t.ptr, &mut ty)
        })?;
        if ty != OGA_FLOAT32 {
            return Err(EngineError::Graph(format!(
                "onnxruntime-genai returned logits of element type {ty}, expected float32"
            )));
        }
        let mut rank = 0usize;
        // SAFETY: valid tensor and out pointer.
        lib.check("OgaTensorGetShapeRank", unsafe {
            (api.tensor_get_shape_rank)(t.ptr, &mut rank)
        })?;
        let mut shape = vec![0i64; rank];
        // SAFETY: `shape` has `rank` elements.
        lib.check("OgaTensorGetShape", unsafe {
            (api.tensor_get_shape)(t.ptr, shape.as_mut_ptr(), rank)
        })?;
        let count = shape
            .iter()
            .try_fold(1usize, |n, &d| usize::try_from(d).ok().map(|d| n * d));
        let vocab = self.vocab;
        let count = match count {
            Some(c) if c >= vocab && c % vocab == 0 && shape.last() == Some(&(vocab as i64)) => c,
            _ => {
                return Err(EngineError::Graph(format!(
                    "onnxruntime-genai logits have shape {shape:?}, which does not end in vocab_size {vocab}"
                )));
            }
        };
        let mut data: *mut c_void = std::ptr::null_mut();
        // SAFETY: valid tensor and out pointer.
        lib.check("OgaTensorGetData", unsafe {
            (api.tensor_get_data)(t.ptr, &mut data)
        })?;
        if data.is_null() {
            return Err(EngineError::Graph(
                "onnxruntime-genai returned logits without data".into(),
            ));
        }
        // SAFETY: a float32 CPU tensor of `count` elements, alive until `t` drops.
        let all = unsafe { std::slice::from_raw_parts(data as *const f32, count) };
        self.logits.clear();
        self.logits.extend_from_slice(&all[count - vocab..]);
        self.logits_shape = shape;
        Ok(())
    }

    /// Generate mode: makes OGA's greedy search select `token` (logits forced to -inf elsewhere),
    /// then reads the logits, which runs the token.
    fn generate_step(&mut self, g: *mut OgaGenerator, token: u32) -> Result<(), EngineError> {
        let lib = self.lib;
        let api = &lib.api;
        let t = token as usize;
        if t >= self.vocab {
            return Err(EngineError::Params(format!(
                "token {token} is outside the vocabulary of {}",
                self.vocab
            )));
        }
        let count = self
            .logits_shape
            .iter()
            .map(|&d| d as usize)
            .product::<usize>();
        if self.forced.len() != count {
            self.forced = vec![f32::NEG_INFINITY; count];
        }
        // Every batch row (there is one) gets the same forced row.
        for row in self.forced.chunks_mut(self.vocab) {
            row[t] = 0.0;
        }
        let mut raw: *mut OgaTensor = std::ptr::null_mut();
        // SAFETY: `forced` holds `count` floats of the shape given, and outlives the tensor.
        let made = lib.check("OgaCreateTensorFromBuffer", unsafe {
            (api.create_tensor_from_buffer)(
                self.forced.as_mut_ptr().cast(),
                self.logits_shape.as_ptr(),
                self.logits_shape.len(),
                OGA_FLOAT32,
                &mut raw,
            )
        });
        let set = made.and_then(|()| {
            let tensor = Owned {
                ptr: raw,
                destroy: api.destroy_tensor,
            };
            // SAFETY: valid generator and tensor; OGA copies the values.
            lib.check("OgaGenerator_SetLogits", unsafe {
                (api.generator_set_logits)(g, tensor.ptr)
            })
        });
        for row in self.forced.chunks_mut(self.vocab) {
            row[t] = f32::NEG_INFINITY;
        }
        set?;
        // SAFETY: valid generator.
        lib.check("OgaGenerator_GenerateNextToken", unsafe {
            (api.generator_generate_next_token)(g)
        })?;
        let mut out: *const i32 = std::ptr::null();
        let mut n = 0usize;
        // SAFETY: valid generator and out pointers; the array lives until the next OGA call.
        lib.check("OgaGenerator_GetNextTokens", unsafe {
            (api.generator_get_next_tokens)(g, &mut out, &mut n)
        })?;
        // SAFETY: `n` tokens at `out`.
        let picked = (!out.is_null() && n > 0).then(|| unsafe { *out });
        if picked != Some(token as i32) {
            return Err(EngineError::Oga {
                call: "OgaGenerator_GetNextTokens",
                message: format!("selected {picked:?} instead of the forced token {token}"),
            });
        }
        self.read_logits(g)
    }

    fn try_append(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        let ids: Vec<i32> = tokens
            .iter()
            .map(|&t| i32::try_from(t))
            .collect::<Result<_, _>>()
            .map_err(|_| EngineError::Params("a token id does not fit in int32".into()))?;
        if self.generator.is_none() {
            // A new generator starts an empty sequence.
            self.len = 0;
        }
        let g = self.generator()?;
        if self.len == 0 || self.step != OgaStep::Generate {
            match self.append_tokens(g, &ids) {
                Ok(()) => return self.read_logits(g),
                Err(EngineError::Oga { message, .. })
                    if self.len > 0
                        && self.step == OgaStep::Auto
                        && message.contains("Continuous decoding is not supported") =>
                {
                    tracing::info!(
                        "onnxruntime-genai refuses continuous decoding here ({message}); the oga engine hands over tokens with SetLogits + GenerateNextToken from now on"
                    );
                    self.step = OgaStep::Generate;
                }
                Err(e) => return Err(e),
            }
        }
        for &t in tokens {
            self.generate_step(g, t)?;
        }
        Ok(())
    }
}

/// Warns when more than one ONNX Runtime file is mapped: OGA then runs on another runtime than
/// the codec (ORT_LIB_PATH pins OGA's choice).
fn warn_on_second_runtime() {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let mut seen: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        let p = Path::new(path);
        if p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("libonnxruntime.so"))
        {
            let p = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
            if !seen.contains(&p) {
                seen.push(p);
            }
        }
    }
    if seen.len() > 1 {
        tracing::warn!(
            libraries = ?seen,
            "more than one ONNX Runtime library is loaded: onnxruntime-genai found another one than onebit-tts loaded; set ORT_LIB_PATH to pin OGA's"
        );
    }
}

impl Backbone for OgaBackbone {
    fn reset(&mut self) {
        if self.len == 0 {
            return;
        }
        self.len = 0;
        let Some(g) = &self.generator else {
            return;
        };
        if self.can_rewind {
            // SAFETY: valid generator.
            let r = unsafe { (self.lib.api.generator_rewind_to)(g.ptr, 0) };
            match self.lib.check("OgaGenerator_RewindTo", r) {
                Ok(()) => return,
                Err(e) => {
                    tracing::debug!("{e}; the oga engine recreates the generator per sequence");
                    self.can_rewind = false;
                }
            }
        }
        self.generator = None;
    }

    fn append(&mut self, tokens: &[u32]) -> Result<&[f32], EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Params("nothing to append".into()));
        }
        if self.len + tokens.len() > self.budget {
            return Err(EngineError::PromptTooLong {
                prompt: self.len + tokens.len(),
                budget: self.budget,
            });
        }
        if let Err(e) = self.try_append(tokens) {
            // A failed call leaves the generator in an unknown state; the next sequence gets a
            // new one.
            self.generator = None;
            self.len = 0;
            return Err(e);
        }
        self.len += tokens.len();
        Ok(&self.logits)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn budget(&self) -> usize {
        self.budget
    }

    fn describe(&self) -> String {
        format!(
            "{}, {} steps, {})",
            self.desc_head,
            match self.step {
                OgaStep::Auto | OgaStep::Append => "append",
                OgaStep::Generate => "generate",
            },
            self.lib.path.display()
        )
    }
}

/// Loads the package's backbone with onnxruntime-genai.
pub fn load(pkg: &ModelPackage, opts: &OgaOptions) -> Result<OgaBackbone, crate::Error> {
    OgaBackbone::load(pkg, opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_parse_and_compare() {
        assert_eq!(parse_version("0.18.0"), Some((0, 18, 0)));
        assert_eq!(parse_version("0.7.1rc2"), Some((0, 7, 1)));
        assert_eq!(parse_version("1.2"), Some((1, 2, 0)));
        assert!(parse_version("x").is_none());
        assert!(parse_version("0.5.2").unwrap() < MIN_VERSION);
        assert!(looks_like_version("0.18.0") && !looks_like_version("libraryVersion"));
    }
}
