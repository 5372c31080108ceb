//! Proof that the model is resident on the NPU (reference: "Residency").
//!
//! A passing request proves nothing: builds fall back to CPU silently, and the EP can decline the
//! graph without a log line. Residency is claimed only when all three hold:
//!
//! 1. `/sys/class/accel/accel0/device/mem_usage` grew across the model load (the parent reads it
//!    before starting the worker and after the worker reports the model loaded);
//! 2. the worker process holds `/dev/accel/accel0` open (a symlink in `/proc/<pid>/fd`);
//! 3. the worker's log names the provider ([`PROVIDER_NAME`]).

use std::fmt;
use std::fs;

use super::lifecycle::holds_accel;
use super::roots::SystemRoots;
use super::{NpuError, PROVIDER_NAME};

/// Reads the device-wide NPU memory use, in bytes.
pub fn read_mem_usage(roots: &SystemRoots) -> Result<u64, NpuError> {
    let path = roots.mem_usage();
    let text = fs::read_to_string(&path).map_err(|e| NpuError::io(&path, e))?;
    parse_mem_usage(&text).ok_or_else(|| NpuError::Parse {
        path,
        what: format!("no byte count in {:?}", text.trim()),
    })
}

/// The first number in the file, with an optional unit (`B`, `K`/`KB`/`KiB`, `M…`, `G…`, all
/// taken as powers of 1024). The attribute's exact format differs between driver builds; only
/// "did it grow" matters, so any consistent reading will do.
pub fn parse_mem_usage(text: &str) -> Option<u64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let rest = &text[start..];
    let digits_end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    let n: u64 = rest[..digits_end].parse().ok()?;
    let unit: String = rest[digits_end..]
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" | "bytes" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return None,
    };
    n.checked_mul(scale)
}

/// Whether a log text names the provider (the worker logs the provider it appended).
pub fn log_names_provider(log: &str) -> bool {
    log.contains(PROVIDER_NAME)
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "residency", content = "reasons", rename_all = "snake_case")]
pub enum Residency {
    Proven,
    /// Every reason the proof failed, not just the first.
    NotProven(Vec<String>),
}

impl Residency {
    pub fn is_proven(&self) -> bool {
        matches!(self, Residency::Proven)
    }
}

impl fmt::Display for Residency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Residency::Proven => f.write_str("npu residency: proven"),
            Residency::NotProven(reasons) => {
                write!(f, "npu residency: not proven: {}", reasons.join("; "))
            }
        }
    }
}

/// Weighs the evidence. `before`/`after` are [`read_mem_usage`] readings (None: unreadable),
/// `pid` the worker, `provider_logged` whether its log named the provider
/// ([`log_names_provider`]).
pub fn prove(
    roots: &SystemRoots,
    before: Option<u64>,
    after: Option<u64>,
    pid: u32,
    provider_logged: bool,
) -> Residency {
    let mut reasons = Vec::new();
    let mem = roots.mem_usage();
    match (before, after) {
        (Some(b), Some(a)) if a > b => {}
        (Some(b), Some(a)) => reasons.push(format!(
            "NPU mem_usage did not grow across the load ({b} -> {a} bytes)"
        )),
        (None, _) => reasons.push(format!(
            "{} was not readable before the load",
            mem.display()
        )),
        (Some(_), None) => {
            reasons.push(format!("{} was not readable after the load", mem.display()))
        }
    }
    match holds_accel(pid, roots) {
        Ok(true) => {}
        Ok(false) => reasons.push(format!(
            "worker pid {pid} does not hold {} open",
            roots.accel_node().display()
        )),
        Err(e) => reasons.push(format!(
            "cannot tell whether worker pid {pid} holds the NPU: {e}"
        )),
    }
    if !provider_logged {
        reasons.push(format!("the worker's log does not name {PROVIDER_NAME}"));
    }
    if reasons.is_empty() {
        Residency::Proven
    } else {
        Residency::NotProven(reasons)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_usage_formats() {
        assert_eq!(parse_mem_usage("123456\n"), Some(123_456));
        assert_eq!(parse_mem_usage("  4096 B"), Some(4096));
        assert_eq!(parse_mem_usage("12 KB\n"), Some(12 * 1024));
        assert_eq!(parse_mem_usage("total: 3M"), Some(3 << 20));
        assert_eq!(parse_mem_usage("2 GiB"), Some(2 << 30));
        assert_eq!(parse_mem_usage("n/a"), None);
        assert_eq!(parse_mem_usage("5 parsecs"), None);
        assert_eq!(parse_mem_usage("99999999999999999999999"), None);
    }

    #[test]
    fn provider_in_log() {
        assert!(log_names_provider(
            "INFO backbone: execution provider RyzenAILightExecutionProvider appended"
        ));
        assert!(!log_names_provider("INFO backbone: execution provider CPU"));
    }

    #[test]
    fn display() {
        assert_eq!(Residency::Proven.to_string(), "npu residency: proven");
        assert_eq!(
            Residency::NotProven(vec!["a".into(), "b".into()]).to_string(),
            "npu residency: not proven: a; b"
        );
        assert_eq!(
            serde_json::to_string(&Residency::Proven).expect("json"),
            r#"{"residency":"proven"}"#
        );
    }
}
