//! The official OpenAI Python SDK (PyPI `openai`, installed by scripts/setup.sh into
//! .onebit/venv) against the real `onebit-tts serve` binary as a child process on loopback:
//! tests/python/openai_client.py must pass every check, then SIGTERM stops the server with exit 0.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const STARTUP: Duration = Duration::from_secs(120);
const STOP: Duration = Duration::from_secs(15);

fn python() -> PathBuf {
    let py = common::repo().join(".onebit/venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{} cannot import openai: run scripts/setup.sh (it installs the SDK)",
        py.display()
    );
    py
}

/// A loopback port that was free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Status line of `GET path` (HTTP/1.0, so the server closes after answering), or None when the
/// server does not answer yet.
fn get_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if start.elapsed() > limit {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Kills the server if the test fails half-way.
struct Reap(Option<Child>);
impl Drop for Reap {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn the_openai_python_sdk_gets_valid_audio_in_every_format() {
    let python = python();
    let dir = common::tempdir("openai-sdk");
    let server_log = dir.join("server.log");
    let port = free_port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let model = common::model("tiny");
    let child = Command::new(common::bin())
        .args(["serve", "--model"])
        .arg(&model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .current_dir(common::repo())
        .env_remove("ONEBIT_MODEL")
        .env_remove("ONEBIT_PORT")
        .env("ONEBIT_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&server_log).unwrap())
        .spawn()
        .unwrap();
    let mut server = Reap(Some(child));
    let child = server.0.as_mut().unwrap();

    // Ready when /health answers 200; bounded, and failing at once if the server exits.
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the server exited with {status}:\n{}", log(&server_log));
        }
        if get_status(addr, "/health") == Some(200) {
            break;
        }
        assert!(
            start.elapsed() < STARTUP,
            "the server never became healthy:\n{}",
            log(&server_log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    let codes = common::expect("tiny")["test_voice_greedy_codes"]
        .as_u64()
        .unwrap();
    let out = Command::new(&python)
        .arg(common::repo().join("tests/python/openai_client.py"))
        .args(["--base-url", &format!("http://{addr}/v1")])
        .args(["--expect-samples", &(codes * 480).to_string()])
        .arg("--out-dir")
        .arg(dir.join("audio"))
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTP_PROXY")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env_remove("OPENAI_BASE_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "openai_client.py failed:\n{stdout}\n{stderr}\nserver log:\n{}",
        log(&server_log)
    );
    let summary = stdout.lines().last().unwrap_or("");
    assert!(
        summary.ends_with(" passed, 0 failed") && !summary.starts_with("0 "),
        "{summary}"
    );

    // SIGTERM: a graceful stop with exit status 0, promptly (nothing is in flight).
    let sent = Instant::now();
    // SAFETY: kill(2) on the child's own pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let status = wait_exit(child, STOP).unwrap_or_else(|| {
        panic!(
            "the server did not exit within {STOP:?} of SIGTERM:\n{}",
            log(&server_log)
        )
    });
    server.0 = None;
    let log = log(&server_log);
    assert!(status.success(), "exit status {status}:\n{log}");
    assert!(log.contains("shutting down"), "{log}");
    eprintln!(
        "server stopped {:.0} ms after SIGTERM",
        sent.elapsed().as_secs_f64() * 1e3
    );
}
