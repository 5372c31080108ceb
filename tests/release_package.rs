//! The release package (scripts/package.sh; docs/deploy.md, "Release package"), made from this
//! test build's own binary, so no release build is needed: what the archive must and must not
//! hold, that its binary and libraries need nothing outside it but the base system, and that it
//! runs unpacked in a temporary directory with a clean environment (no LD_LIBRARY_PATH, no
//! ONEBIT_* variables, no `.onebit` but its own).

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The newest glibc symbol version the package may need: the minimum docs/deploy.md states.
/// A build that needs a newer one fails here until the documented minimum is raised with it.
const NEWEST_GLIBC: [u32; 2] = [2, 34];
/// The same for libstdc++ (GLIBCXX_3.4.29: GCC 11's).
const NEWEST_GLIBCXX: [u32; 3] = [3, 4, 29];

/// What the package may take from the system (docs/deploy.md, "What it needs"): glibc's
/// libraries, the dynamic loader and GCC's runtime libraries. Anything else must be inside it.
const BASE_SYSTEM: &[&str] = &[
    "linux-vdso.so.1",
    "ld-linux-x86-64.so.2",
    "libc.so.6",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libutil.so.1",
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libgomp.so.1",
];

/// Names that belong to AMD's Ryzen AI Software, XRT or ONNX Runtime's RyzenAI/VitisAI providers
/// (matched case-insensitively anywhere in a path): none of it may be redistributed with the
/// package (NOTICE, "Not included"). Execution-provider libraries of any kind are refused too: the
/// package ships the CPU ONNX Runtime only.
const AMD_NAMES: &[&str] = &[
    "ryzenai",
    "ryzen_ai",
    "ryzen-ai",
    "ryzen ai",
    "vitisai",
    "vitis_ai",
    "vitis-ai",
    "libxrt",
    "xrt_core",
    "/xrt/",
    "amd_license",
    "amd-license",
    "xclbin",
    "libamdxdna",
    "onnxruntime_providers",
    "dyn_dispatch_core",
];

/// The AMD name in `path`, if any.
fn amd_name(path: &str) -> Option<&'static str> {
    let lower = path.to_ascii_lowercase();
    AMD_NAMES.iter().copied().find(|n| lower.contains(n))
}

/// Each shared library the package may carry, with the licence text that must travel with it
/// and a line that text must contain.
const LIBRARIES: &[(&str, &[(&str, &str)])] = &[
    (
        ".onebit/onnxruntime/lib/libonnxruntime.so.",
        &[
            (".onebit/onnxruntime/LICENSE", "MIT License"),
            (".onebit/onnxruntime/ThirdPartyNotices.txt", "THIRD PARTY"),
        ],
    ),
    (
        ".onebit/oga/lib/libonnxruntime-genai.so",
        &[
            (".onebit/oga/LICENSE", "MIT License"),
            (".onebit/oga/ThirdPartyNotices.txt", "THIRD PARTY"),
        ],
    ),
    (
        ".onebit/neutts/libespeak-ng.so.1",
        &[
            (".onebit/neutts/COPYING", "GNU GENERAL PUBLIC LICENSE"),
            (".onebit/neutts/COPYING", "Version 3, 29 June 2007"),
        ],
    ),
];

/// The package, made and unpacked once for every test here.
struct Package {
    /// The unpacked `onebit-tts-VERSION/`.
    root: PathBuf,
    /// A scratch directory outside the checkout (runs use it as their cwd and HOME).
    scratch: PathBuf,
    /// The archive's entries, without the top directory's name.
    names: Vec<String>,
    /// The debug archive's entries, the same way.
    debug_names: Vec<String>,
    /// The unpacked debug file.
    debug_file: PathBuf,
}

enum Made {
    Ready(Package),
    /// Why the package cannot be made here (a missing tool or runtime install): a skip.
    Skip(String),
    /// Making it failed: every test here fails with this message (made once, not once a test).
    Failed(String),
}

fn made() -> &'static Made {
    static MADE: OnceLock<Made> = OnceLock::new();
    MADE.get_or_init(|| {
        std::panic::catch_unwind(make).unwrap_or_else(|e| {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            Made::Failed(why)
        })
    })
}

/// The package, or None after reporting the skip for `test`.
fn package(test: &str) -> Option<&'static Package> {
    match made() {
        Made::Ready(p) => Some(p),
        Made::Skip(why) => {
            common::skip(test, why);
            None
        }
        Made::Failed(why) => panic!("making the package failed: {why}"),
    }
}

fn output(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn checked(cmd: &mut Command) -> String {
    let out = output(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        common::stdout(&out),
        common::stderr(&out)
    );
    common::stdout(&out)
}

fn has_tool(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn make() -> Made {
    for tool in ["patchelf", "objcopy", "readelf", "ldd", "tar", "python3"] {
        if !has_tool(tool) {
            return Made::Skip(format!("{tool} missing (scripts/setup.sh installs it)"));
        }
    }
    if !common::repo().join(".onebit/onnxruntime/lib").is_dir() {
        return Made::Skip(".onebit runtime missing (run scripts/setup.sh)".into());
    }
    // Outside the checkout, whose .onebit would otherwise be found beside the binary's ancestors
    // and hide anything the package lacks. Runs of ended processes are swept first.
    let base = std::env::temp_dir().join("onebit-release-package");
    std::fs::create_dir_all(&base).unwrap();
    common::sweep_ended(&base);
    let scratch = base.join(format!("run-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();
    for dir in scratch.ancestors() {
        assert!(
            !dir.join(".onebit").exists(),
            "{} holds a .onebit: the unpacked package would find it; set TMPDIR elsewhere",
            dir.display()
        );
    }

    let dist = scratch.join("dist");
    let log = checked(
        Command::new("bash")
            .arg(common::repo().join("scripts/package.sh"))
            .arg("--binary")
            .arg(common::bin())
            .arg("--out")
            .arg(&dist)
            .env("TMPDIR", &scratch),
    );
    eprint!("{log}");
    let stem = format!("onebit-tts-{VERSION}-linux-x86_64");
    let archive = dist.join(format!("{stem}.tar.gz"));
    let debug_archive = dist.join(format!("{stem}.debug.tar.gz"));
    let top = format!("onebit-tts-{VERSION}/");
    let list = |a: &Path| -> Vec<String> {
        checked(Command::new("tar").arg("tzf").arg(a))
            .lines()
            .map(|n| {
                n.strip_prefix(&top)
                    .unwrap_or_else(|| panic!("{n:?} in {} is not under {top}", a.display()))
                    .to_owned()
            })
            .collect()
    };
    let names = list(&archive);
    let debug_names = list(&debug_archive);
    let unpacked = scratch.join("unpacked");
    std::fs::create_dir_all(&unpacked).unwrap();
    checked(
        Command::new("tar")
            .arg("xzf")
            .arg(&archive)
            .arg("-C")
            .arg(&unpacked),
    );
    let debug_dir = scratch.join("debug");
    std::fs::create_dir_all(&debug_dir).unwrap();
    checked(
        Command::new("tar")
            .arg("xzf")
            .arg(&debug_archive)
            .arg("-C")
            .arg(&debug_dir),
    );
    let sums = std::fs::read_to_string(dist.join(format!("{stem}.sha256"))).unwrap();
    assert!(
        sums.contains(&format!("{stem}.tar.gz")) && sums.contains(&format!("{stem}.debug.tar.gz")),
        "{sums}"
    );
    Made::Ready(Package {
        root: unpacked.join(top.trim_end_matches('/')),
        debug_file: debug_dir.join(&top).join("bin/onebit-tts.debug"),
        scratch,
        names,
        debug_names,
    })
}

/// Every regular file under `dir` whose content starts with the ELF magic, symlinks not followed.
fn elf_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            out.extend(elf_files(&e.path()));
        } else if t.is_file() {
            let mut magic = [0u8; 4];
            let n = std::fs::File::open(e.path())
                .and_then(|mut f| f.read(&mut magic))
                .unwrap();
            if n == 4 && magic == *b"\x7fELF" {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

fn rel<'a>(p: &'a Package, path: &'a Path) -> String {
    path.strip_prefix(&p.root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// A file's ELF section headers: (name, file offset, size).
fn sections(bytes: &[u8]) -> Vec<(String, usize, usize)> {
    let u16_at = |o: usize| u16::from_le_bytes(bytes[o..o + 2].try_into().unwrap()) as usize;
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap()) as usize;
    assert_eq!(&bytes[..5], b"\x7fELF\x02", "a 64-bit ELF file");
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 24);
    (0..shnum)
        .map(|i| {
            let h = header(i);
            let name_at = strtab + u32_at(h);
            let end = bytes[name_at..].iter().position(|&b| b == 0).unwrap();
            let name = String::from_utf8_lossy(&bytes[name_at..name_at + end]).into_owned();
            (name, u64_at(h + 24), u64_at(h + 32))
        })
        .collect()
}

/// CRC-32 (IEEE, as zlib and .gnu_debuglink compute it).
fn crc32(bytes: &[u8]) -> u32 {
    let table: Vec<u32> = (0..256u32)
        .map(|n| {
            (0..8).fold(n, |c, _| {
                if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                }
            })
        })
        .collect();
    !bytes.iter().fold(!0u32, |c, &b| {
        table[((c ^ u32::from(b)) & 0xff) as usize] ^ (c >> 8)
    })
}

#[test]
fn the_amd_name_check_catches_the_ryzen_ai_software_and_nothing_we_ship() {
    for bad in [
        "lib/libonnxruntime_providers_ryzenai.so",
        "lib/libonnxruntime_vitisai_ep.so.1.0.0",
        "lib/libonnxruntime_providers_shared.so",
        "lib/libxrt_coreutil.so.2",
        "opt/xilinx/xrt/lib/libxrt_driver_xdna.so",
        "licenses/AMD_LICENSE",
        "RyzenAI-SW/deployment/lib/libdyn_dispatch_core.so",
        "voe-4.0-linux_x86_64/4x4.xclbin",
    ] {
        assert!(amd_name(bad).is_some(), "{bad}");
    }
    for good in [
        ".onebit/onnxruntime/lib/libonnxruntime.so.1.31.1",
        ".onebit/oga/lib/libonnxruntime-genai.so",
        "docs/npu.md",
        "voices/dave.json",
        ".onebit/neutts/espeak-ng-data/phontab",
    ] {
        assert_eq!(amd_name(good), None, "{good}");
    }
}

#[test]
fn the_archive_holds_the_documented_layout_and_no_models() {
    let Some(p) = package("the_archive_holds_the_documented_layout_and_no_models") else {
        return;
    };
    let names: BTreeSet<&str> = p.names.iter().map(|n| n.trim_end_matches('/')).collect();
    for need in [
        "bin/onebit-tts",
        ".onebit/onnxruntime/lib/libonnxruntime.so",
        ".onebit/oga/lib/libonnxruntime-genai.so",
        ".onebit/neutts/libespeak-ng.so.1",
        ".onebit/neutts/espeak-ng-data/phontab",
        "voices/test.json",
        "voices/dave.json",
        "samples/LICENSE",
        "docs/api.md",
        "README.md",
        "LICENSE",
        "NOTICE",
        "licenses/crates.txt",
        "licenses/GPL-3.0.txt",
        "licenses/LGPL-3.0.txt",
    ] {
        assert!(names.contains(need), "the archive lacks {need}");
    }
    let tops: BTreeSet<&str> = names
        .iter()
        .filter_map(|n| n.split('/').next())
        .filter(|t| !t.is_empty())
        .collect();
    let allowed: BTreeSet<&str> = [
        "bin",
        ".onebit",
        "voices",
        "samples",
        "docs",
        "licenses",
        "README.md",
        "LICENSE",
        "NOTICE",
    ]
    .into();
    assert!(
        tops.is_subset(&allowed),
        "unexpected top entries: {:?}",
        tops.difference(&allowed)
    );
    let homes: BTreeSet<&str> = names
        .iter()
        .filter_map(|n| n.strip_prefix(".onebit/")?.split('/').next())
        .filter(|t| !t.is_empty())
        .collect();
    let runtime: BTreeSet<&str> = ["onnxruntime", "oga", "neutts", "tn"].into();
    assert!(
        homes.is_subset(&runtime),
        "only the runtime goes into .onebit (no venv, node, llama tools): {:?}",
        homes.difference(&runtime)
    );
    for n in &names {
        assert!(
            !n.starts_with("models") && !n.ends_with(".onnx") && !n.ends_with(".gguf"),
            "no models in the package: {n}"
        );
        assert!(!n.starts_with("voices/custom"), "no custom voices: {n}");
    }
    // The binary: stripped, its debug info in the debug archive under the name its
    // .gnu_debuglink gives, with that file's CRC.
    let bin = std::fs::read(p.root.join("bin/onebit-tts")).unwrap();
    let secs = sections(&bin);
    let stripped: Vec<&str> = secs
        .iter()
        .map(|s| s.0.as_str())
        // .debug_gdb_scripts is loaded with the program (rustc's pretty-printer hint), not
        // debug info: strip keeps it.
        .filter(|n| (n.starts_with(".debug_") && *n != ".debug_gdb_scripts") || *n == ".symtab")
        .collect();
    assert!(stripped.is_empty(), "not stripped: {stripped:?}");
    let (_, at, len) = secs
        .iter()
        .find(|s| s.0 == ".gnu_debuglink")
        .expect("a .gnu_debuglink section");
    let link = &bin[*at..at + len];
    let end = link.iter().position(|&b| b == 0).unwrap();
    assert_eq!(&link[..end], b"onebit-tts.debug");
    let want_crc = u32::from_le_bytes(link[len - 4..].try_into().unwrap());
    let debug = std::fs::read(&p.debug_file).unwrap();
    assert_eq!(
        crc32(&debug),
        want_crc,
        "the debug file is the one the binary links to"
    );
    assert!(
        sections(&debug).iter().any(|s| s.0 == ".debug_line"),
        "the debug file keeps the line tables"
    );
    let debug_files: Vec<&String> = p
        .debug_names
        .iter()
        .filter(|n| !n.is_empty() && !n.ends_with('/'))
        .collect();
    assert_eq!(debug_files, ["bin/onebit-tts.debug"]);
    // Symlinks stay inside the package.
    for n in &p.names {
        let path = p.root.join(n.trim_end_matches('/'));
        if path.is_symlink() {
            let target = std::fs::canonicalize(&path).unwrap();
            assert!(
                target.starts_with(std::fs::canonicalize(&p.root).unwrap()),
                "{n} -> {target:?}"
            );
        }
    }
}

#[test]
fn nothing_of_amds_ryzen_ai_software_is_in_the_archive() {
    let Some(p) = package("nothing_of_amds_ryzen_ai_software_is_in_the_archive") else {
        return;
    };
    for n in p.names.iter().chain(&p.debug_names) {
        assert!(amd_name(n).is_none(), "{n}: {:?} is AMD's", amd_name(n));
    }
    for f in elf_files(&p.root) {
        let dynamic = checked(Command::new("readelf").args(["-d", "-W"]).arg(&f));
        for line in dynamic.lines().filter(|l| l.contains("(NEEDED)")) {
            assert!(amd_name(line).is_none(), "{}: {line}", rel(p, &f));
        }
    }
}

#[test]
fn every_library_it_carries_has_its_licence_text() {
    let Some(p) = package("every_library_it_carries_has_its_licence_text") else {
        return;
    };
    let read =
        |r: &str| std::fs::read_to_string(p.root.join(r)).unwrap_or_else(|e| panic!("{r}: {e}"));
    for f in elf_files(&p.root) {
        let r = rel(p, &f);
        if r == "bin/onebit-tts" {
            continue;
        }
        let (_, texts) = LIBRARIES
            .iter()
            .find(|(lib, _)| r.starts_with(lib))
            .unwrap_or_else(|| panic!("{r}: a library with no known licence text"));
        for (text, line) in *texts {
            assert!(read(text).contains(line), "{text} (for {r}) lacks {line:?}");
        }
    }
    // What the binary has built in: every crate's licence and the vendored C libraries'.
    let crates = read("licenses/crates.txt");
    for (krate, text, line) in [
        ("llama-cpp-sys-2", "llama.cpp__LICENSE", "MIT License"),
        ("opusic-sys", "opus__COPYING", "Redistribution and use"),
        (
            "mp3lame-sys",
            "lame-3.100__COPYING",
            "GNU LIBRARY GENERAL PUBLIC LICENSE",
        ),
        ("onig_sys", "oniguruma__COPYING", "Redistribution and use"),
    ] {
        let entry = crates
            .lines()
            .find(|l| l.starts_with(&format!("{krate} ")))
            .unwrap_or_else(|| panic!("licenses/crates.txt has no {krate}"));
        let version = entry.split(['\t', ' ']).nth(1).unwrap();
        let path = format!("licenses/crates/{krate}-{version}/{text}");
        assert!(read(&path).contains(line), "{path} lacks {line:?}");
    }
    for l in crates.lines().filter(|l| !l.starts_with('#')) {
        let fields: Vec<&str> = l.split('\t').collect();
        assert_eq!(fields.len(), 3, "{l}");
        assert!(fields[1] != "?", "a crate with no licence: {l}");
    }
    assert!(read("licenses/LGPL-3.0.txt").contains("GNU LESSER GENERAL PUBLIC LICENSE"));
    assert!(read("licenses/GPL-3.0.txt").contains("GNU GENERAL PUBLIC LICENSE"));
    assert!(read("LICENSE").contains("Apache License"));
    assert!(read("NOTICE").contains("GPL-3.0-or-later"));
    assert!(read("samples/LICENSE").contains("NeuTTS Open License"));
    assert!(read(".onebit/tn/damga-1.0.5/LICENSE").contains("Apache License"));
    assert!(read(".onebit/tn/damga-1.0.5/NOTICE").contains("Mihu AI"));
}

#[test]
fn text_is_normalised_with_the_grammars_it_carries() {
    let Some(p) = package("text_is_normalised_with_the_grammars_it_carries") else {
        return;
    };
    for (lang, text, spoken) in [
        (
            "en-us",
            "It costs $5.50.",
            "It costs five dollars fifty cents.",
        ),
        ("de", "Am 3. Mai.", "Am dritten Mai."),
    ] {
        let out = checked(clean(p, "normalize").args(["normalize", "--language", lang, text]));
        assert_eq!(out, format!("{spoken}\n"), "{lang}");
    }
}

/// The newest `PREFIX_x.y[.z]` version that `readelf -V` lists among a file's needs.
fn newest_need(versions: &str, prefix: &str) -> Option<Vec<u32>> {
    versions
        .split_whitespace()
        .filter_map(|w| w.strip_prefix(prefix))
        .filter_map(|v| {
            v.split('.')
                .map(|n| n.parse().ok())
                .collect::<Option<Vec<u32>>>()
        })
        .max()
}

#[test]
fn its_binary_and_libraries_need_nothing_outside_it_but_the_base_system() {
    let Some(p) = package("its_binary_and_libraries_need_nothing_outside_it_but_the_base_system")
    else {
        return;
    };
    let root = std::fs::canonicalize(&p.root).unwrap();
    let base = |path: &str| {
        let name = path.rsplit('/').next().unwrap_or(path);
        BASE_SYSTEM
            .iter()
            .any(|b| name == *b || name.starts_with(&format!("{b}.")))
    };
    let elves = elf_files(&p.root);
    assert!(elves.len() >= 4, "{elves:?}");
    let (mut glibc, mut glibcxx) = (Vec::new(), Vec::new());
    for f in &elves {
        let r = rel(p, f);
        let ldd = checked(
            Command::new("ldd")
                .arg(f)
                .env_clear()
                .env("PATH", "/usr/bin:/bin"),
        );
        for line in ldd.lines().map(str::trim).filter(|l| !l.is_empty()) {
            assert!(!line.contains("not found"), "{r}: {line}\n{ldd}");
            // `name => /path (0x…)`, or `/path (0x…)` for the loader, or `name (0x…)` for the vDSO.
            let path = line
                .split(" => ")
                .last()
                .unwrap()
                .split(" (")
                .next()
                .unwrap();
            let inside = Path::new(path).starts_with(&root);
            assert!(
                inside || base(path),
                "{r} resolves {line} outside the package:\n{ldd}"
            );
        }
        let dynamic = checked(Command::new("readelf").args(["-d", "-W"]).arg(f));
        for line in dynamic
            .lines()
            .filter(|l| l.contains("(RPATH)") || l.contains("(RUNPATH)"))
        {
            let paths = line.split('[').nth(1).unwrap().trim_end_matches(']');
            for path in paths.split(':') {
                assert!(
                    path.starts_with("$ORIGIN"),
                    "{r}: {line} searches outside itself"
                );
            }
        }
        if r == "bin/onebit-tts" {
            assert!(
                dynamic.contains("(RUNPATH)") && dynamic.contains("[$ORIGIN/../lib]"),
                "{dynamic}"
            );
        }
        let versions = checked(Command::new("readelf").args(["-V", "-W"]).arg(f));
        glibc.extend(newest_need(&versions, "GLIBC_"));
        glibcxx.extend(newest_need(&versions, "GLIBCXX_"));
    }
    let glibc = glibc.into_iter().max().unwrap();
    let glibcxx = glibcxx.into_iter().max().unwrap();
    eprintln!("the package needs glibc {glibc:?} and GLIBCXX {glibcxx:?}");
    assert!(
        glibc <= NEWEST_GLIBC.to_vec() && glibcxx <= NEWEST_GLIBCXX.to_vec(),
        "the package now needs glibc {glibc:?} / GLIBCXX {glibcxx:?}, newer than docs/deploy.md \
         states ({NEWEST_GLIBC:?} / {NEWEST_GLIBCXX:?}): raise the documented minimum and the \
         constants here, or build on an older system"
    );
}

/// The package's binary with nothing of the test's environment: no LD_LIBRARY_PATH, no ONEBIT_*
/// settings, HOME and the working directory in the scratch directory.
fn clean(p: &Package, tag: &str) -> Command {
    let run = p.scratch.join(tag);
    let home = run.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let mut cmd = Command::new(p.root.join("bin/onebit-tts"));
    cmd.env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/bin:/bin")
        .current_dir(&run)
        .stdin(Stdio::null());
    cmd
}

#[test]
fn say_speaks_from_the_unpacked_package_with_a_clean_environment() {
    let Some(p) = package("say_speaks_from_the_unpacked_package_with_a_clean_environment") else {
        return;
    };
    let model = common::model("tiny");
    let root = std::fs::canonicalize(&p.root)
        .unwrap()
        .display()
        .to_string();
    // The default engine (ONNX Runtime), then onnxruntime-genai's: each library from the package.
    for (engine, loaded, dir) in [
        ("ort", "ONNX Runtime loaded", "onnxruntime/lib"),
        ("oga", "onnxruntime-genai loaded", "oga/lib"),
    ] {
        let out = output(
            clean(p, "say")
                .args(["--verbose", "say", "--engine", engine, "--model"])
                .arg(&model)
                .args(["--voice", "test", "-o", &format!("{engine}.wav"), "Hello."]),
        );
        let log = common::stderr(&out);
        assert!(out.status.success(), "{engine}: {log}");
        let line = log
            .lines()
            .find(|l| l.contains(loaded))
            .unwrap_or_else(|| panic!("{engine}: no {loaded:?} line:\n{log}"));
        assert!(
            line.contains(&format!("path={root}/.onebit/{dir}/")),
            "{engine}: {line}"
        );
        assert!(!log.contains("system espeak-ng"), "{log}");
        let wav = p.scratch.join(format!("say/{engine}.wav"));
        let reader = hound::WavReader::open(&wav).expect("a WAV file");
        let spec = reader.spec();
        assert_eq!(
            (spec.channels, spec.sample_rate, spec.bits_per_sample),
            (1, 24_000, 16)
        );
        let samples: Vec<i16> = reader.into_samples().map(Result::unwrap).collect();
        assert!(samples.len() > 4_800, "{engine}: {} samples", samples.len());
        assert!(samples.iter().any(|&s| s != 0), "{engine}: silence");
    }
}

/// `method path` over HTTP/1.0 (the server closes after answering): status and body, or None
/// while nothing answers.
fn http(addr: SocketAddr, method: &str, path: &str, json: Option<&str>) -> Option<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let body = json.unwrap_or("");
    let kind = if json.is_some() {
        "Content-Type: application/json\r\n"
    } else {
        ""
    };
    write!(
        s,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{kind}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut response = Vec::new();
    s.read_to_end(&mut response).ok()?;
    let split = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&response[..split]);
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, response[split + 4..].to_vec()))
}

/// The shared objects mapped into process `pid` (from /proc/PID/maps), by path.
fn mapped_libraries(pid: u32) -> BTreeSet<String> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter(|path| path.starts_with('/') && path.contains(".so"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn serve_answers_from_the_unpacked_package_and_stops_on_sigterm() {
    let Some(p) = package("serve_answers_from_the_unpacked_package_and_stops_on_sigterm") else {
        return;
    };
    let mut child = clean(p, "serve")
        .arg("serve")
        .arg("--model")
        .arg(common::model("tiny"))
        .args(["--host", "127.0.0.1", "--port", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = String::new();
    let mut collect = |until: Option<&str>, limit: Duration| -> Option<String> {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let line = rx.recv_timeout(left).ok()?;
            log.push_str(&line);
            log.push('\n');
            if until.is_some_and(|u| line.contains(u)) {
                return Some(line);
            }
        }
    };
    // The server logs the address it bound (port 0: the kernel's choice).
    let Some(listening) = collect(Some("listening"), Duration::from_secs(120)) else {
        let _ = child.kill();
        let _ = child.wait();
        collect(None, Duration::from_secs(2));
        panic!("the server never said where it listens:\n{log}");
    };
    let addr: SocketAddr = listening
        .split("addr=")
        .nth(1)
        .and_then(|a| a.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {listening:?}"));
    // Bounded: it accepts once it has said so, so the first try should answer.
    let health = (0..100).find_map(|_| {
        let r = http(addr, "GET", "/health", None);
        if r.is_none() {
            std::thread::sleep(Duration::from_millis(50));
        }
        r
    });
    let speech = http(
        addr,
        "POST",
        "/v1/audio/speech",
        Some(r#"{"input": "Hello.", "voice": "test", "response_format": "wav"}"#),
    );
    let mapped = mapped_libraries(child.id());
    // SIGTERM, then a bounded wait for the graceful exit.
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) },
        0
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    collect(None, Duration::from_secs(5));

    let (code, body) = health.unwrap_or_else(|| panic!("/health never answered:\n{log}"));
    assert_eq!(code, 200, "{}\n{log}", String::from_utf8_lossy(&body));
    let (code, wav) = speech.unwrap_or_else(|| panic!("no speech answer:\n{log}"));
    assert_eq!(code, 200, "{}\n{log}", String::from_utf8_lossy(&wav));
    let reader = hound::WavReader::new(std::io::Cursor::new(wav)).expect("a WAV body");
    assert!(reader.duration() > 0);
    // Every library the server had loaded: its own from the package, the rest the base system's.
    let root = std::fs::canonicalize(&p.root)
        .unwrap()
        .display()
        .to_string();
    for lib in [
        "/.onebit/onnxruntime/lib/libonnxruntime.so.",
        "/.onebit/neutts/libespeak-ng.so.1",
    ] {
        assert!(
            mapped
                .iter()
                .any(|m| m.starts_with(&format!("{root}{lib}"))),
            "{root}{lib} is not loaded: {mapped:#?}"
        );
    }
    for m in &mapped {
        let name = m.rsplit('/').next().unwrap();
        let base = BASE_SYSTEM
            .iter()
            .any(|b| name == *b || name.starts_with(&format!("{b}.")));
        assert!(
            m.starts_with(&root) || base,
            "the server loaded {m} from outside the package"
        );
    }
    let status = status.unwrap_or_else(|| panic!("still running 60 s after SIGTERM:\n{log}"));
    assert!(status.success(), "{status}\n{log}");
}
