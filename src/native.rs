//! Finding a native shared library at run time: the one search behind ONNX Runtime
//! ([`crate::runtime`]), onnxruntime-genai ([`crate::engine::oga`]) and the RyzenAI provider
//! ([`crate::npu::env::provider_library`]).
//!
//! Nothing native is linked at build time (`ort` is built with `load-dynamic`, the others are
//! opened with dlopen), so each library is looked for the same way. A [`Search`] is an ordered
//! list of places, each named by the rule that put it there (`--ort-lib`, `ORT_DYLIB_PATH`,
//! `ONEBIT_RYZENAI_ROOT`, `project-local (.onebit)`, `python3 onnxruntime`, ...), in the order
//! users expect: an explicit flag, its environment variable, the RyzenAI venv, the project-local
//! install, python3's package. The first place whose library the caller can open wins. A place
//! that does not exist is skipped quietly; one that exists but cannot be used is passed over
//! aloud (a warning names it and what was used instead). When nothing works, [`NotFound`] lists
//! every place tried as `source: path (why)`, then the fix.
//!
//! This module owns the search order and its messages; what "opens" means (load it into ONNX
//! Runtime, bind a C API, or only pick a path for another loader) stays with each caller.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::paths;

/// Knob naming the RyzenAI Software venv: its `deployment/lib` holds the ONNX Runtime, the
/// onnxruntime-genai and the provider libraries the NPU route must use together.
pub const RYZENAI_ROOT_VAR: &str = "ONEBIT_RYZENAI_ROOT";

/// How a place found under `$ONEBIT_RYZENAI_ROOT` is named.
pub const RYZENAI_ROOT_SOURCE: &str = "ONEBIT_RYZENAI_ROOT";
/// How a place under a `.onebit` home ([`crate::paths`]) is named.
pub const PROJECT_LOCAL_SOURCE: &str = "project-local (.onebit)";

/// Why a place was passed over when its file does not exist (such places are not warned about).
const NOT_FOUND: &str = "not found";

/// `$var` as a path, when set and not empty (a shell's `export X=` means "unset", not "here").
pub fn env_path(var: &str) -> Option<PathBuf> {
    std::env::var_os(var)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `<venv>/deployment/lib`: the venv's ONNX Runtime (GenAI), the provider and the AIE libraries.
pub fn venv_lib_dir(venv: &Path) -> PathBuf {
    venv.join("deployment").join("lib")
}

/// `file` in `dir`, else the highest of its versioned names (`file.1.24.0`): wheels and
/// distributions ship only the versioned file.
pub fn newest(dir: &Path, file: &str) -> Option<PathBuf> {
    let plain = dir.join(file);
    if plain.exists() {
        return Some(plain);
    }
    let prefix = format!("{file}.");
    let mut libs: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    libs.sort();
    libs.pop()
}

/// The directory a python3 one-liner prints (a package's location), or why there is none.
/// `missing` says what is absent when the script runs but prints nothing or fails.
pub fn python_dir(script: &str, missing: &str) -> Result<PathBuf, String> {
    let out = Command::new("python3")
        .args(["-c", script])
        .output()
        .map_err(|e| format!("python3 not runnable: {e}"))?;
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if !out.status.success() || dir.is_empty() {
        return Err(missing.to_owned());
    }
    Ok(PathBuf::from(dir))
}

/// One place to look, named by the rule that chose it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub source: &'static str,
    pub path: PathBuf,
}

enum Step {
    /// Opened only when the file exists.
    At(Place),
    /// Handed to the caller whether or not it exists: a path the user named for another loader,
    /// whose own error then names it.
    AsIs(Place),
    /// A place only python3 can say; asked only when every earlier place failed.
    Python {
        source: &'static str,
        find: fn() -> Result<PathBuf, String>,
    },
}

/// Every place tried, each as `source: path (why)`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tried(pub Vec<String>);

impl Tried {
    /// The places that exist but could not be used (the ones worth a warning).
    pub fn passed_over(&self) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .map(String::as_str)
            .filter(|t| !t.ends_with(&format!("({NOT_FOUND})")))
    }
}

impl fmt::Display for Tried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "  - {t}")?;
        }
        Ok(())
    }
}

/// No place held a library that could be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("could not load {what}; tried:\n{tried}\nfix: {fix}")]
pub struct NotFound {
    /// The library, as users know it ("the ONNX Runtime library").
    pub what: &'static str,
    pub tried: Tried,
    /// The command or setting that fixes it.
    pub fix: &'static str,
}

/// What a search found: the opened library, where, and what was passed over first.
#[derive(Debug)]
pub struct Found<T> {
    pub lib: T,
    pub place: Place,
    pub tried: Tried,
}

/// An ordered list of places to look for one library.
pub struct Search {
    what: &'static str,
    fix: &'static str,
    steps: Vec<Step>,
}

impl Search {
    /// A search for `what` ("the ONNX Runtime library"); `fix` is the advice when nothing works.
    pub fn new(what: &'static str, fix: &'static str) -> Self {
        Search {
            what,
            fix,
            steps: Vec::new(),
        }
    }

    /// `path`, named `source`.
    pub fn at(mut self, source: &'static str, path: impl Into<PathBuf>) -> Self {
        self.steps.push(Step::At(Place {
            source,
            path: path.into(),
        }));
        self
    }

    /// `path` when given (a command-line flag), named `source`.
    pub fn given(self, source: &'static str, path: Option<&Path>) -> Self {
        match path {
            Some(p) => self.at(source, p),
            None => self,
        }
    }

    /// `$var`, when set and not empty, named by the variable.
    pub fn env(self, var: &'static str) -> Self {
        let path = env_path(var);
        self.given(var, path.as_deref())
    }

    /// `file` in the RyzenAI venv's `deployment/lib`, when `$ONEBIT_RYZENAI_ROOT` is set.
    pub fn ryzenai_venv(self, file: &str) -> Self {
        match env_path(RYZENAI_ROOT_VAR) {
            Some(root) => self.at(RYZENAI_ROOT_SOURCE, venv_lib_dir(&root).join(file)),
            None => self,
        }
    }

    /// `rel` under every `.onebit` home, in [`paths::onebit_homes`] order.
    pub fn project_local(mut self, rel: &str) -> Self {
        for p in paths::in_homes(rel) {
            self = self.at(PROJECT_LOCAL_SOURCE, p);
        }
        self
    }

    /// `path` handed to the opener as it is, existing or not.
    pub fn as_is(mut self, source: &'static str, path: impl Into<PathBuf>) -> Self {
        self.steps.push(Step::AsIs(Place {
            source,
            path: path.into(),
        }));
        self
    }

    /// The library python3's package holds, asked last (it runs a python3 process).
    pub fn python(mut self, source: &'static str, find: fn() -> Result<PathBuf, String>) -> Self {
        self.steps.push(Step::Python { source, find });
        self
    }

    /// The places known without asking python3, in order (for tests and `doctor`).
    pub fn places(&self) -> Vec<&Place> {
        self.steps
            .iter()
            .filter_map(|s| match s {
                Step::At(p) | Step::AsIs(p) => Some(p),
                Step::Python { .. } => None,
            })
            .collect()
    }

    /// Opens the places in order; the first that `open` accepts wins. `open` says why it refused
    /// a place (the path is added here).
    pub fn first<T>(
        mut self,
        mut open: impl FnMut(&Place) -> Result<T, String>,
    ) -> Result<Found<T>, NotFound> {
        let mut tried = Tried::default();
        let mut attempt = |place: Place, checked: bool, tried: &mut Tried| {
            if checked && !place.path.exists() {
                tried.0.push(format!(
                    "{}: {} ({NOT_FOUND})",
                    place.source,
                    place.path.display()
                ));
                return None;
            }
            match open(&place) {
                Ok(lib) => Some((lib, place)),
                Err(why) => {
                    tried.0.push(format!(
                        "{}: {} ({why})",
                        place.source,
                        place.path.display()
                    ));
                    None
                }
            }
        };
        for step in std::mem::take(&mut self.steps) {
            let found = match step {
                Step::At(place) => attempt(place, true, &mut tried),
                Step::AsIs(place) => attempt(place, false, &mut tried),
                Step::Python { source, find } => match find() {
                    Ok(path) => attempt(Place { source, path }, true, &mut tried),
                    Err(why) => {
                        tried.0.push(format!("{source}: {why}"));
                        None
                    }
                },
            };
            if let Some((lib, place)) = found {
                for t in tried.passed_over() {
                    tracing::warn!(
                        "{}: passed over {t}; using {} ({})",
                        self.what,
                        place.path.display(),
                        place.source
                    );
                }
                return Ok(Found { lib, place, tried });
            }
        }
        Err(NotFound {
            what: self.what,
            tried,
            fix: self.fix,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::testutil::tempdir as tmp;

    #[test]
    fn first_usable_place_wins_and_every_other_is_named() {
        let d = tmp("order");
        let (bad, good) = (d.join("bad.so"), d.join("good.so"));
        std::fs::write(&bad, b"").expect("write");
        std::fs::write(&good, b"").expect("write");
        let found = Search::new("the X library", "install X")
            .at("--flag", d.join("missing.so"))
            .at("VAR", &bad)
            .at("project-local (.onebit)", &good)
            .at("later", &good)
            .first(|p| {
                if p.path == bad {
                    Err("too old".to_owned())
                } else {
                    Ok(p.path.clone())
                }
            })
            .expect("found");
        assert_eq!(found.lib, good);
        assert_eq!(found.place.source, "project-local (.onebit)");
        assert_eq!(
            found.tried.0,
            vec![
                format!("--flag: {} (not found)", d.join("missing.so").display()),
                format!("VAR: {} (too old)", bad.display()),
            ]
        );
        assert_eq!(
            found.tried.passed_over().collect::<Vec<_>>(),
            vec![format!("VAR: {} (too old)", bad.display())]
        );
    }

    #[test]
    fn nothing_found_lists_every_place_and_the_fix() {
        let e = Search::new("the X library", "install X")
            .at("A", "/nonexistent/a.so")
            .python("python3 pkg", || Err("python3 has no pkg".into()))
            .first(|_| Ok(()))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "could not load the X library; tried:\n  - A: /nonexistent/a.so (not found)\n  - \
             python3 pkg: python3 has no pkg\nfix: install X"
        );
    }

    #[test]
    fn as_is_places_reach_the_opener_unchecked() {
        let found = Search::new("the X library", "install X")
            .as_is("RYZENAI_EP_PATH", "/nonexistent/libp.so")
            .first(|p| Ok(p.path.clone()))
            .expect("as is");
        assert_eq!(found.lib, Path::new("/nonexistent/libp.so"));
    }

    #[test]
    fn newest_prefers_the_plain_name_then_the_highest_version() {
        let d = tmp("newest");
        assert_eq!(newest(&d, "libx.so"), None);
        std::fs::write(d.join("libx.so.1.2"), b"").expect("write");
        std::fs::write(d.join("libx.so.1.3"), b"").expect("write");
        std::fs::write(d.join("libxy.so.9"), b"").expect("write");
        assert_eq!(newest(&d, "libx.so"), Some(d.join("libx.so.1.3")));
        std::fs::write(d.join("libx.so"), b"").expect("write");
        assert_eq!(newest(&d, "libx.so"), Some(d.join("libx.so")));
    }
}
