//! The README's first commands as a new user meets them: a clean copy of the checkout (only what
//! git tracks: no target/, no .onebit/, no models/, no ../shared beside it).
//!
//! What this covers, and what it cannot: scripts/setup.sh's check of the system prerequisites
//! runs for real (present, and missing ones named with the command that installs them), and so
//! does its free-space check before the downloads (with a stand-in `df`); the
//! copy ships samples/ and the imported voices; scripts/gen-test-models.sh runs in the copy and
//! `say --voice dave` works there with only the copy's voices, models and runtime in reach. Not
//! run: setup.sh's downloads (the venv's packages, the neutts wheel) and the 10-minute
//! `cargo build --release` of scripts/quickstart.sh. The copy's `.onebit/` links to this
//! checkout's installed pieces instead, and the binary is this test's build, linked into the copy's
//! target/release/ so that it finds nothing outside the copy.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::stderr;

/// The files git tracks, copied to `dst` as a clone would have them.
fn clean_copy(dst: &Path) {
    let out = Command::new("git")
        .args(["ls-files", "-z"])
        .current_dir(common::repo())
        .output()
        .expect("git (a fresh clone has it)");
    assert!(out.status.success(), "{}", stderr(&out));
    let files: Vec<&str> = std::str::from_utf8(&out.stdout)
        .unwrap()
        .split('\0')
        .filter(|f| !f.is_empty())
        .collect();
    for top in ["target/", ".onebit", "models/tiny"] {
        assert!(
            !files.iter().any(|f| f.starts_with(top)),
            "{top} must not be tracked"
        );
    }
    for f in files {
        let to = dst.join(f);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(common::repo().join(f), &to).unwrap_or_else(|e| panic!("{f}: {e}"));
    }
}

/// A PATH holding only links to the named tools (those this machine has). python3 links to the
/// interpreter itself: a wrapper (pyenv's shim) would need the tools this PATH leaves out.
fn tool_path(dir: &Path, tools: &[&str]) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    for t in tools {
        let found = if *t == "python3" {
            let o = Command::new("python3")
                .args(["-c", "import sys; print(sys.executable)"])
                .output()
                .expect("python3 (setup.sh needs it)");
            Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
        } else {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(|p| p.join(t))
                .find(|p| p.is_file())
        };
        if let Some(real) = found {
            std::os::unix::fs::symlink(real, dir.join(t)).unwrap();
        }
    }
    dir.to_path_buf()
}

/// A fresh directory outside the checkout: the binary looks for `.onebit/` in every ancestor of
/// its working directory and of itself, so a copy inside the checkout would find the original.
fn outside_tempdir(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("onebit-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// setup.sh's prerequisite check, with only `tools` on the PATH and installing turned off.
fn prereqs(copy: &Path, bin: &Path, tools: &[&str]) -> std::process::Output {
    let path = tool_path(bin, tools);
    Command::new("/bin/bash")
        .arg(copy.join("scripts/setup.sh"))
        .arg("--prereqs-only")
        .env("PATH", path)
        .env("ONEBIT_SETUP_INSTALL", "0")
        .env_remove("PYTHON")
        .output()
        .unwrap()
}

/// The web page's browser test needs it; it is both the command and the Debian package.
const CHROMIUM: &str = "chromium-headless-shell";

#[test]
fn setup_names_missing_prerequisites_and_the_command_that_installs_them() {
    let tmp = common::tempdir("first-run-prereqs");
    let copy = tmp.join("clone");
    clean_copy(&copy);
    // objcopy and readelf (binutils) and patchelf: the release package's tools, always checked.
    let base = [
        "bash", "dirname", "id", "python3", "apt-get", "objcopy", "readelf", "patchelf",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    let o = prereqs(
        &copy,
        &tmp.join("all"),
        &with(&["cc", "make", "cmake", "node", "npm", CHROMIUM]),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        common::stdout(&o).contains("setup: system prerequisites present"),
        "{}",
        common::stdout(&o)
    );
    assert!(
        !copy.join(".onebit").exists(),
        "--prereqs-only installs nothing"
    );

    let apt = Path::new("/usr/bin/apt-get").exists();
    for (extra, missing) in [
        (&["cc", "make", "node", "npm", CHROMIUM][..], "cmake"),
        (&["cmake", "node", "npm", CHROMIUM][..], "build-essential"),
        (&["cc", "make", "cmake", CHROMIUM][..], "nodejs npm"),
        (&["cc", "make", "cmake", "node", "npm"][..], CHROMIUM),
        (
            &[][..],
            "build-essential cmake nodejs npm chromium-headless-shell",
        ),
    ] {
        let o = prereqs(&copy, &tmp.join(missing.replace(' ', "-")), &with(extra));
        assert!(!o.status.success());
        let err = stderr(&o);
        assert!(
            err.contains(&format!("setup: missing system packages: {missing} (")),
            "{err}"
        );
        if apt {
            assert!(
                err.contains(&format!(
                    "run:  sudo apt-get install -y {missing}  and then"
                )),
                "{err}"
            );
        }
    }
}

#[test]
fn setup_stops_before_downloading_when_the_disk_is_too_full() {
    let tmp = common::tempdir("first-run-space");
    let copy = tmp.join("clone");
    clean_copy(&copy);
    // With --build-tools setup.sh also wants the container tests' tools (catatonit is found in
    // podman's libexec directory, not on the PATH).
    let tools = [
        "bash",
        "dirname",
        "id",
        "python3",
        "mkdir",
        "cat",
        "cc",
        "make",
        "cmake",
        "node",
        "npm",
        CHROMIUM,
        "objcopy",
        "readelf",
        "patchelf",
        "podman",
        "runc",
        "debootstrap",
        "haproxy",
    ];
    let bin = tool_path(&tmp.join("bin"), &tools);
    // A stand-in df: POSIX output with the free KiB the test sets, and a record of what it was
    // asked about.
    let asked = tmp.join("df-args");
    common::write_script(
        &bin.join("df"),
        &format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\necho 'Filesystem 1024-blocks Used Available Capacity Mounted on'\necho \"/dev/vdz 264241152 260000000 $FREE_KIB 99% /\"\n",
            asked.display()
        ),
    );
    // setup.sh names its root as `pwd` does: the path it was started by, links kept.
    let root = &copy;
    for (args, free_kib, want) in [
        (
            &["--build-tools"][..],
            2 * 1024 * 1024 + 512,
            format!(
                "setup: 2 GiB free on the disk of {}; this setup needs about 16 GiB (the venv's runtime packages 1 GiB, the model builder's torch with its CUDA libraries 9 GiB, the test build in target/ 6 GiB). Free some space",
                root.display()
            ),
        ),
        (
            &["--release-build"][..],
            4 * 1024 * 1024 - 1,
            format!(
                "setup: 3 GiB free on the disk of {}; this setup needs about 4 GiB (the venv's runtime packages 1 GiB, the release build in target/ 3 GiB). Free some space",
                root.display()
            ),
        ),
        (
            &[][..],
            1024 * 1024 - 1,
            format!(
                "setup: 0 GiB free on the disk of {}; this setup needs about 1 GiB (the venv's runtime packages 1 GiB). Free some space",
                root.display()
            ),
        ),
    ] {
        let o = Command::new("/bin/bash")
            .arg(copy.join("scripts/setup.sh"))
            .args(args)
            .env("PATH", &bin)
            .env("ONEBIT_SETUP_INSTALL", "0")
            .env("FREE_KIB", free_kib.to_string())
            // Should the check let it through, pip fails at once instead of downloading torch.
            .env("PIP_NO_INDEX", "1")
            .env_remove("PYTHON")
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("ONEBIT_SETUP_SPACE_CHECK")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(stderr(&o).contains(&want), "{}", stderr(&o));
        assert!(
            !copy.join(".onebit/venv").exists(),
            "nothing is installed on a full disk"
        );
    }
    assert_eq!(
        std::fs::read_to_string(&asked).unwrap(),
        format!("-Pk {0}\n", root.display()).repeat(3)
    );
}

#[test]
fn a_clean_copy_ships_the_voices_and_says_dave() {
    let tmp = outside_tempdir("first-run-clone");
    let copy = tmp.join("clone");
    clean_copy(&copy);
    assert!(!tmp.join("shared").exists() && !copy.join("models/tiny").exists());
    let readme = std::fs::read_to_string(copy.join("README.md")).unwrap();
    for want in [
        "scripts/quickstart.sh",
        "scripts/test.sh",
        "say --voice dave",
    ] {
        assert!(readme.contains(want), "README lacks {want:?}");
    }
    for f in [
        "samples/LICENSE",
        "samples/README.md",
        "samples/dave.pt",
        "voices/dave.json",
    ] {
        assert!(copy.join(f).is_file(), "{f} missing from a clone");
    }

    // What setup.sh would install, taken from this checkout (see the module comment).
    let home = copy.join(".onebit");
    std::fs::create_dir_all(&home).unwrap();
    for piece in ["venv", "onnxruntime", "neutts"] {
        let ours = common::repo().join(".onebit").join(piece);
        assert!(
            ours.exists(),
            "run scripts/setup.sh: {} missing",
            ours.display()
        );
        std::os::unix::fs::symlink(ours.canonicalize().unwrap(), home.join(piece)).unwrap();
    }
    let o = Command::new("/bin/bash")
        .arg(copy.join("scripts/setup.sh"))
        .arg("--prereqs-only")
        .env("ONEBIT_SETUP_INSTALL", "0")
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "this machine has the prerequisites: {}",
        stderr(&o)
    );
    let o = Command::new("/bin/bash")
        .arg(copy.join("scripts/gen-test-models.sh"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));

    // The binary sits in the copy, so the copy is all it can find (cwd and exe ancestors).
    let exe = copy.join("target/release/onebit-tts");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    if std::fs::hard_link(common::bin(), &exe).is_err() {
        std::fs::copy(common::bin(), &exe).unwrap();
    }
    let o = common::clean_command(&exe, &copy)
        .args(["voices", "list"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let list = common::stdout(&o);
    let dave = list
        .lines()
        .find(|l| l.starts_with("dave "))
        .unwrap_or_else(|| panic!("{list}"));
    assert!(
        dave.contains("en-us")
            && dave.contains("NeuTTS Open License v1.0")
            && dave.contains(&copy.join("voices/dave.json").display().to_string()),
        "{dave}"
    );

    let out = copy.join("hello.wav");
    let o = common::clean_command(&exe, &copy)
        .args(["say", "--voice", "dave", "-o"])
        .arg(&out)
        .arg("Hello from a fresh clone.")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    // The test package's random weights never draw the end token, so the piece ends at its code
    // budget with a warning; a real package ends on its own.
    assert!(
        err.lines()
            .any(|l| l.starts_with("wrote ") && l.contains("s of audio")),
        "{err}"
    );
    let wav = hound::WavReader::open(&out).unwrap();
    assert_eq!(wav.spec().sample_rate, 24_000);
    assert!(wav.len() > 0);
    let _ = std::fs::remove_dir_all(&tmp);
}

/// Repeated test runs do not pile up scratch: each test process's directories under
/// target/test-tmp stay after it ends (for a look after a failure), and a later process's first
/// `common::tempdir` removes those of processes that have ended, never a live one's.
#[test]
fn scratch_of_ended_test_processes_is_swept_and_a_live_ones_kept() {
    let root = common::tempdir("sweep");
    let ended = {
        let mut c = Command::new("true").spawn().unwrap();
        let pid = c.id();
        c.wait().unwrap();
        pid
    };
    // Alive until its stdin closes.
    let mut live = Command::new("cat")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let names = [
        format!("models-{ended}"),
        format!("build-int4-{ended}"),
        format!("say-{}", std::process::id()),
        format!("pull-{}", live.id()),
        "notes-v2".to_string(),
        "loose".to_string(),
    ];
    for n in &names {
        std::fs::create_dir_all(root.join(n).join("inner")).unwrap();
    }
    common::sweep_ended(&root);
    let mut left: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    let mut want = names[2..].to_vec();
    want.sort();
    assert_eq!(left, want);
    drop(live.stdin.take());
    live.wait().unwrap();
}
