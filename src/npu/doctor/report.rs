//! The doctor's report: one line per check, as text or JSON, and the exit code.

use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Status {
    /// Not checked, and the line says why (nothing to look at, or not measurable here): never
    /// counted as a pass.
    Skip,
    Pass,
    Warn,
    Fail,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Skip => "SKIP",
            Status::Pass => "PASS",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        })
    }
}

/// One check: a stable `name`, what was found, and for WARN/FAIL the fix in one line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Check {
    pub fn pass(name: &'static str, detail: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Pass,
            detail: detail.into(),
            fix: None,
        }
    }

    pub fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Warn,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }

    /// Not checked: `detail` says why, `next` what would check it.
    pub fn skip(name: &'static str, detail: impl Into<String>, next: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Skip,
            detail: detail.into(),
            fix: Some(next.into()),
        }
    }

    pub fn fail(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Check {
            name,
            status: Status::Fail,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    pub checks: Vec<Check>,
}

#[derive(Serialize)]
struct Counts {
    pass: usize,
    warn: usize,
    fail: usize,
    skip: usize,
}

#[derive(Serialize)]
struct JsonReport<'a> {
    ok: bool,
    summary: Counts,
    checks: &'a [Check],
}

impl Report {
    fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    /// The first check of that name (each kernel-log finding is its own `kernel log` line).
    pub fn check(&self, name: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.name == name)
    }

    pub fn has_failures(&self) -> bool {
        self.count(Status::Fail) > 0
    }

    /// 0 when nothing failed (warnings allowed), else 1.
    pub fn exit_code(&self) -> i32 {
        i32::from(self.has_failures())
    }

    /// One line per check (`PASS  name: detail`), the fix indented under WARN/FAIL (and what
    /// would check a SKIP), and a summary line.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!("{}  {}: {}\n", c.status, c.name, c.detail));
            if let Some(fix) = &c.fix {
                let label = if c.status == Status::Skip {
                    "next"
                } else {
                    "fix"
                };
                out.push_str(&format!("      {label}: {fix}\n"));
            }
        }
        out.push_str(&format!(
            "npu doctor: {} pass, {} warn, {} fail, {} skip\n",
            self.count(Status::Pass),
            self.count(Status::Warn),
            self.count(Status::Fail),
            self.count(Status::Skip)
        ));
        out
    }

    /// `{"ok": bool, "summary": {"pass","warn","fail","skip"}, "checks":
    /// [{name,status,detail,fix?}]}` (a SKIP's `fix` says what would check it).
    pub fn to_json(&self) -> String {
        let r = JsonReport {
            ok: !self.has_failures(),
            summary: Counts {
                pass: self.count(Status::Pass),
                warn: self.count(Status::Warn),
                fail: self.count(Status::Fail),
                skip: self.count(Status::Skip),
            },
            checks: &self.checks,
        };
        // Serializing plain strings, numbers and enums cannot fail; keep a valid JSON fallback
        // rather than a panic path anyway.
        serde_json::to_string_pretty(&r)
            .unwrap_or_else(|e| format!("{{\"ok\":false,\"error\":{:?}}}", e.to_string()))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Report {
        Report {
            checks: vec![
                Check::pass("memlock", "unlimited"),
                Check::fail("accel node", "missing", "sudo modprobe amdxdna"),
            ],
        }
    }

    #[test]
    fn text_and_exit_code() {
        let r = report();
        let t = r.to_text();
        assert!(t.starts_with("PASS  memlock: unlimited\nFAIL  accel node: missing\n      fix: sudo modprobe amdxdna\n"), "{t}");
        assert!(
            t.ends_with("npu doctor: 1 pass, 0 warn, 1 fail, 0 skip\n"),
            "{t}"
        );
        assert_eq!(r.exit_code(), 1);
        let ok = Report {
            checks: vec![
                Check::warn("hugepages", "none", "reserve some"),
                Check::skip("residency", "not measured", "npu probe"),
            ],
        };
        assert_eq!(ok.exit_code(), 0);
        let t = ok.to_text();
        assert!(
            t.contains("SKIP  residency: not measured\n      next: npu probe\n"),
            "{t}"
        );
        assert!(t.ends_with("0 pass, 1 warn, 0 fail, 1 skip\n"), "{t}");
    }

    #[test]
    fn json_shape() {
        let v: serde_json::Value = serde_json::from_str(&report().to_json()).expect("json");
        assert_eq!(v["ok"], false);
        assert_eq!(v["summary"]["fail"], 1);
        assert_eq!(v["checks"][0]["status"], "PASS");
        assert!(v["checks"][0].get("fix").is_none());
        assert_eq!(v["checks"][1]["fix"], "sudo modprobe amdxdna");
    }
}
