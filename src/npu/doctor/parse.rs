//! Parsers for the small text files and outputs the doctor reads. Each takes text, so tests
//! feed strings; none touches the file system.

use std::cmp::Ordering;

/// What `ldd` says will not load: `NAME => not found` and ``version `V' not found (required by
/// LIB)`` lines, as glibc's loader prints them (stdout, and stderr for the version lines).
pub fn ldd_problems(stdout: &str, stderr: &str) -> Vec<String> {
    let mut v = Vec::new();
    for line in stdout.lines().chain(stderr.lines()) {
        let line = line.trim().trim_start_matches("ldd: ").trim();
        if let Some((name, rest)) = line.split_once("=>")
            && rest.trim() == "not found"
        {
            v.push(format!("{} not found", name.trim()));
        } else if line.contains("version `") && line.contains("not found") {
            // "/path/lib.so: /lib/.../libstdc++.so.6: version `GLIBCXX_3.4.32' not found
            // (required by /path/lib.so)": from the first "version" on names it all.
            let at = line.find("version `").unwrap_or(0);
            let lib = line[..at].trim_end_matches([':', ' ']);
            let lib = lib.rsplit(": ").next().unwrap_or(lib);
            v.push(format!("{lib}: {}", &line[at..]));
        }
    }
    v.dedup();
    v
}

/// `key`'s value in `[section]` of an ini file as XRT reads xrt.ini (boost's ini parser: names
/// compared exactly, `;` and `#` start comment lines, the last of repeated keys wins).
pub fn ini_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut current = String::new();
    let mut found = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = name.trim().to_owned();
            continue;
        }
        if current == section
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == key
        {
            found = Some(v.trim().to_owned());
        }
    }
    found
}

/// Leading numeric components of a version: `1.0.0.166` -> `[1, 0, 0, 166]`,
/// `2.19.0_20250122` -> `[2, 19, 0]`, `v0.6` -> `[0, 6]`. None when there is no number at all.
pub fn version_parts(s: &str) -> Option<Vec<u64>> {
    let s = s.trim().trim_start_matches(['v', 'V']);
    let mut parts = Vec::new();
    for piece in s.split('.') {
        let digits: String = piece.chars().take_while(|c| c.is_ascii_digit()).collect();
        let Ok(n) = digits.parse::<u64>() else { break };
        parts.push(n);
        // "0_2025" ends the version at the first non-digit.
        if digits.len() != piece.len() {
            break;
        }
    }
    (!parts.is_empty()).then_some(parts)
}

/// Component-wise comparison, missing components counting as 0 (`1.1` == `1.1.0.0`).
pub fn compare_versions(a: &[u64], b: &[u64]) -> Ordering {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            a.get(i)
                .copied()
                .unwrap_or(0)
                .cmp(&b.get(i).copied().unwrap_or(0))
        })
        .find(|o| o.is_ne())
        .unwrap_or(Ordering::Equal)
}

/// What `xrt-smi examine` says about XRT and the NPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XrtSmi {
    pub xrt_version: Option<String>,
    pub firmware_version: Option<String>,
    pub driver_version: Option<String>,
    /// Rows under "Device(s) Present" (0 when the table is missing or empty).
    pub devices: usize,
}

/// Parses the text report: `Key : value` lines grouped under unindented section titles. The
/// XRT version is the `Version` of the `XRT` section (the "System Configuration" section has
/// a `Version` too: the kernel's build string).
pub fn parse_xrt_smi(text: &str) -> XrtSmi {
    let mut out = XrtSmi::default();
    let mut section = String::new();
    let mut in_devices = false;
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        if trimmed.starts_with('|') {
            // Table rows: header, ruler, then one row per device ("|[0000:c5:00.1]  |NPU ...|").
            if in_devices && trimmed.starts_with("|[") {
                out.devices += 1;
            }
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':').filter(|_| line.starts_with(' ')) else {
            section = trimmed.to_string();
            in_devices = section.starts_with("Device(s) Present");
            continue;
        };
        let (key, value) = (key.trim(), value.trim().to_string());
        match key {
            "Version" if section == "XRT" => out.xrt_version = Some(value),
            "NPU Firmware Version" | "Firmware Version" => out.firmware_version = Some(value),
            "amdxdna Version" | "NPU Driver Version" => out.driver_version = Some(value),
            _ => {}
        }
    }
    out
}

/// A `Key:   value kB` line of /proc/meminfo, the number only.
pub fn meminfo_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.split_whitespace().next()?.parse().ok())?
    })
}

/// Undoes the octal escapes /proc/mounts uses for space, tab, newline and backslash.
fn unescape_mount_field(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether /proc/mounts has a `fstype` mount at `mount_point`.
pub fn has_mount(mounts: &str, mount_point: &str, fstype: &str) -> bool {
    mounts.lines().any(|l| {
        let mut f = l.split_whitespace();
        let (_src, Some(mp), Some(ty)) = (f.next(), f.next(), f.next()) else {
            return false;
        };
        ty == fstype && unescape_mount_field(mp) == mount_point
    })
}

/// An /etc/group entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

pub fn parse_groups(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let mut f = l.split(':');
            let name = f.next()?.to_string();
            let _pw = f.next()?;
            let gid = f.next()?.trim().parse().ok()?;
            let members = f
                .next()
                .unwrap_or("")
                .split(',')
                .map(str::trim)
                .filter(|m| !m.is_empty())
                .map(String::from)
                .collect();
            Some(GroupEntry { name, gid, members })
        })
        .collect()
}

/// The user name of `uid` in /etc/passwd.
pub fn passwd_name(text: &str, uid: u32) -> Option<String> {
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _pw = f.next()?;
        (f.next()?.trim().parse::<u32>().ok()? == uid).then(|| name.to_string())
    })
}

/// The taint flags of a loaded module in /proc/modules (`amdxdna 200704 0 - Live 0x0 (OE)`):
/// `Some("")` when loaded untainted, `Some("OE")` for an out-of-tree unsigned build, None when
/// not listed.
pub fn module_taint(modules: &str, name: &str) -> Option<String> {
    modules.lines().find_map(|l| {
        let mut f = l.split_whitespace();
        (f.next()? == name).then(|| {
            l.rsplit_once('(')
                .and_then(|(_, t)| t.strip_suffix(')'))
                .unwrap_or("")
                .to_string()
        })
    })
}

/// `version = 3.12.9` (or `version_info = 3.12.9.final.0`) from pyvenv.cfg.
pub fn pyvenv_version(cfg: &str) -> Option<String> {
    let mut found = None;
    for l in cfg.lines() {
        if let Some((k, v)) = l.split_once('=') {
            match k.trim() {
                "version" => return Some(v.trim().to_string()),
                "version_info" => found = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    found
}

/// The DRM driver version the kernel printed when amdxdna bound the device:
/// `[drm] Initialized amdxdna 0.1.0 for 0000:c5:00.1 on minor 0` -> `0.1.0`. The last one wins
/// (a module reload prints again).
pub fn drm_version_from_log(log: &str) -> Option<String> {
    log.lines().rev().find_map(|l| {
        let rest = &l[l.find("Initialized amdxdna ")? + "Initialized amdxdna ".len()..];
        rest.split_whitespace().next().map(String::from)
    })
}

/// `0 0 4294967295` in /proc/self/uid_map is the initial user namespace; anything else means a
/// user namespace (a rootless container), where host groups such as render are not mapped.
pub fn in_user_namespace(uid_map: &str) -> bool {
    let first: Vec<&str> = uid_map.split_whitespace().take(3).collect();
    first != ["0", "0", "4294967295"]
}

/// `Name:` and `Version:` of a Python package's dist-info METADATA (RFC 822 style headers; the
/// body after the first blank line is the description and may quote anything).
pub fn dist_info_metadata(text: &str) -> Option<(String, String)> {
    let (mut name, mut version) = (None, None);
    for l in text.lines() {
        if l.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            match k.trim() {
                "Name" => name = Some(v.trim().to_string()),
                "Version" => version = Some(v.trim().to_string()),
                _ => {}
            }
        }
    }
    Some((name?, version?))
}

/// A package name as pip compares them (PEP 503): lowercase, runs of `-_.` as one `_`.
pub fn normalize_package_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('_') {
                out.push('_');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// A kernel log line from the NPU driver: amdxdna's own prefix, its aie2_* functions, or
/// anything naming xdna (the DRM driver name `amdxdna_accel_driver`, the XRT shim).
pub fn is_npu_driver_line(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    l.contains("xdna") || l.contains("aie2")
}

/// Whether a line reports a failure: fail/error/timeout in any case (`failed`, `Error`,
/// `timed out`, `TDR timeout`).
pub fn says_failure(line: &str) -> bool {
    let l = line.to_ascii_lowercase();
    ["fail", "error", "timeout", "timed out"]
        .iter()
        .any(|w| l.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(version_parts("1.0.0.166"), Some(vec![1, 0, 0, 166]));
        assert_eq!(version_parts("2.19.0_20250122"), Some(vec![2, 19, 0]));
        assert_eq!(version_parts(" v0.6\n"), Some(vec![0, 6]));
        assert_eq!(version_parts("unknown"), None);
        assert_eq!(compare_versions(&[1, 1], &[1, 1, 0, 0]), Ordering::Equal);
        assert_eq!(compare_versions(&[1, 0, 0, 166], &[1, 1]), Ordering::Less);
        assert_eq!(compare_versions(&[0, 10], &[0, 6]), Ordering::Greater);
    }

    const SMI: &str = "\
System Configuration
  OS Name              : Linux
  Release              : 6.18.0
  Version              : #1 SMP PREEMPT_DYNAMIC
  Machine              : x86_64

XRT
  Version              : 2.19.0
  Branch               : HEAD
  amdxdna Version      : 2.19.0_20250122, abcdef
  NPU Firmware Version : 1.0.0.166

Device(s) Present
|BDF             |Name          |
|----------------|--------------|
|[0000:c5:00.1]  |NPU Strix Halo|
";

    #[test]
    fn xrt_smi_text() {
        let s = parse_xrt_smi(SMI);
        assert_eq!(s.xrt_version.as_deref(), Some("2.19.0"));
        assert_eq!(s.firmware_version.as_deref(), Some("1.0.0.166"));
        assert_eq!(s.driver_version.as_deref(), Some("2.19.0_20250122, abcdef"));
        assert_eq!(s.devices, 1);
        assert_eq!(parse_xrt_smi("").devices, 0);
    }

    #[test]
    fn proc_files() {
        let mi =
            "MemTotal:       131072000 kB\nHugePages_Total:      16\nHugePages_Free:       16\n";
        assert_eq!(meminfo_value(mi, "HugePages_Total"), Some(16));
        assert_eq!(meminfo_value(mi, "Nope"), None);
        let mounts = "proc /proc proc rw 0 0\nhugetlbfs /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\nx /a\\040b tmpfs rw 0 0\n";
        assert!(has_mount(mounts, "/dev/hugepages", "hugetlbfs"));
        assert!(!has_mount(mounts, "/dev/hugepages", "tmpfs"));
        assert!(has_mount(mounts, "/a b", "tmpfs"));
        let m = "kvm 1 0 - Live 0x0\namdxdna 200704 0 - Live 0x0000000000000000 (OE)\n";
        assert_eq!(module_taint(m, "amdxdna").as_deref(), Some("OE"));
        assert_eq!(module_taint(m, "kvm").as_deref(), Some(""));
        assert_eq!(module_taint(m, "amdgpu"), None);
        assert!(!in_user_namespace("         0          0 4294967295\n"));
        assert!(in_user_namespace("         0       1000          1\n"));
    }

    #[test]
    fn etc_files() {
        let g = parse_groups("root:x:0:\nrender:x:992:alice,bob\n#c\nbad\n");
        assert_eq!(g.len(), 2);
        assert_eq!(g[1].name, "render");
        assert_eq!(g[1].gid, 992);
        assert_eq!(g[1].members, ["alice", "bob"]);
        assert_eq!(
            passwd_name(
                "root:x:0:0::/root:/bin/sh\nalice:x:1000:1000::/home/alice:/bin/sh\n",
                1000
            )
            .as_deref(),
            Some("alice")
        );
    }

    #[test]
    fn logs_and_cfg() {
        let log = "[    3.1] [drm] Initialized amdxdna 0.1.0 for 0000:c5:00.1 on minor 0\n";
        assert_eq!(drm_version_from_log(log).as_deref(), Some("0.1.0"));
        assert_eq!(drm_version_from_log("nothing"), None);
        assert_eq!(
            pyvenv_version("home = /usr/bin\nversion_info = 3.12.9.final.0\n").as_deref(),
            Some("3.12.9.final.0")
        );
        assert_eq!(
            pyvenv_version("home = /usr/bin\nversion = 3.12.3\n").as_deref(),
            Some("3.12.3")
        );
    }

    #[test]
    fn dist_info() {
        let m =
            "Metadata-Version: 2.1\nName: onnxruntime-vitisai\nVersion: 1.23.2\n\nName: not this\n";
        assert_eq!(
            dist_info_metadata(m),
            Some(("onnxruntime-vitisai".into(), "1.23.2".into()))
        );
        assert_eq!(dist_info_metadata("Name: x\n"), None);
        assert_eq!(
            normalize_package_name("ONNXRuntime-GenAI.ryzenai"),
            "onnxruntime_genai_ryzenai"
        );
        assert_eq!(
            normalize_package_name("onnxruntime__genai"),
            "onnxruntime_genai"
        );
    }

    #[test]
    fn kernel_log_lines() {
        let l = "[ 9.1] amdxdna 0000:c5:00.1: aie2_tdr: TDR Timeout";
        assert!(is_npu_driver_line(l) && says_failure(l));
        assert!(is_npu_driver_line(
            "[drm] Initialized amdxdna_accel_driver 0.7.0"
        ));
        assert!(!is_npu_driver_line(
            "usb 1-1: device descriptor read/64, error -71"
        ));
        assert!(says_failure(
            "amdxdna: Unknown symbol drm_sched_init (err -2), FAILED"
        ));
        assert!(!says_failure(
            "[drm] Initialized amdxdna 0.6.0 for 0000:c5:00.1 on minor 0"
        ));
    }
}
