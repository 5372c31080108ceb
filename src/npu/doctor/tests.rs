//! Every doctor check, PASS and FAIL, over a fake system tree in a temp dir.

use std::cell::RefCell;
use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::*;
use crate::npu::NpuError;
use crate::npu::xdna::fake::{Driver, FakeXdna, ctx};
use crate::npu::xdna::{CountersError, HwContexts, read_contexts, read_node};

struct Fake {
    root: crate::testutil::TempDir,
    /// Owner and group of files we create (whoever runs the tests).
    uid: u32,
    gid: u32,
}

fn write(p: &Path, text: &str) {
    fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    fs::write(p, text).expect("write");
}

impl Fake {
    /// A system on which every check passes.
    fn healthy(tag: &str) -> Fake {
        let root = crate::testutil::tempdir(&format!("npu-doctor-{tag}"));
        let m = fs::metadata(&root).expect("meta");
        let f = Fake {
            root,
            uid: m.uid(),
            gid: m.gid(),
        };
        let r = f.roots();
        write(
            &r.proc.join("modules"),
            "kvm 1 0 - Live 0x0\namdxdna 200704 0 - Live 0x0\n",
        );
        write(&r.proc.join("sys/kernel/osrelease"), "6.18.0\n");
        write(
            &r.proc.join("self/uid_map"),
            "         0          0 4294967295\n",
        );
        write(
            &r.proc.join("meminfo"),
            "MemTotal: 1 kB\nHugePages_Total:      16\n",
        );
        write(
            &r.proc.join("mounts"),
            &format!(
                "proc /proc proc rw 0 0\nhugetlbfs {} hugetlbfs rw,pagesize=2M 0 0\n",
                r.hugepages_mount().display()
            ),
        );
        let pci = f.pci_dir();
        write(&pci.join("vendor"), "0x1022\n");
        write(&pci.join("device"), "0x17f0\n");
        write(&pci.join("revision"), "0x11\n");
        fs::create_dir_all(r.sys.join("bus/pci/drivers/amdxdna")).expect("mkdir");
        symlink("../../../bus/pci/drivers/amdxdna", pci.join("driver")).expect("symlink");
        let gpu = r.pci_devices().join("0000:c4:00.0");
        write(&gpu.join("vendor"), "0x1002\n");
        write(&gpu.join("device"), "0x1586\n");
        write(&r.accel_sysfs_device().join("fw_version"), "1.1.0.5\n");
        write(&r.lib.join("firmware/amdnpu/17f0_11/npu.sbin.zst"), "fw");
        write(&r.etc.join("group"), &format!("render:x:{}:\n", f.gid));
        write(
            &r.etc.join("passwd"),
            "root:x:0:0::/root:/bin/sh\nalice:x:4242:4242::/home/alice:/bin/sh\n",
        );
        f.set_accel_mode(0o660);
        // XRT extracted from the debs, and the RyzenAI venv.
        let xrt = f.xrt();
        write(&xrt.join("lib/libxrt_coreutil.so.2.19.0"), "");
        write(&xrt.join("lib/libxrt_driver_xdna.so.2"), "");
        write(
            &xrt.join("version.json"),
            r#"{ "BUILD_VERSION" : "2.19.0" }"#,
        );
        write(&xrt.join("bin/xrt-smi"), "");
        let lib = f.venv().join("deployment/lib");
        write(&lib.join("libonnxruntime-genai.so"), "");
        write(&lib.join("libonnxruntime.so"), "");
        write(&lib.join(PROVIDER_FILE), "");
        write(&f.venv().join("bin/python3.12"), "");
        f.set_venv_package("onnxruntime_vitisai", "onnxruntime-vitisai", "1.24.2");
        f.set_venv_package("onnxruntime_genai", "onnxruntime-genai", "0.11.2");
        f
    }

    /// A pip-installed package in the venv: `<dist>-<version>.dist-info/METADATA`.
    fn set_venv_package(&self, dist: &str, name: &str, version: &str) {
        let site = self.venv().join("lib/python3.12/site-packages");
        for old in files_starting(&site, &format!("{dist}-")) {
            fs::remove_dir_all(site.join(old)).expect("rm");
        }
        write(
            &site.join(format!("{dist}-{version}.dist-info/METADATA")),
            &format!("Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nVersion: 0.0\n"),
        );
    }

    fn roots(&self) -> SystemRoots {
        SystemRoots::under(&self.root)
    }
    fn pci_dir(&self) -> PathBuf {
        self.roots().pci_devices().join("0000:c5:00.1")
    }
    fn xrt(&self) -> PathBuf {
        self.root.join("xrt/opt/xilinx/xrt")
    }
    fn venv(&self) -> PathBuf {
        self.root.join("venv")
    }
    fn set_accel_mode(&self, mode: u32) {
        let node = self.roots().accel_node();
        write(&node, "");
        fs::set_permissions(&node, fs::Permissions::from_mode(mode)).expect("chmod");
    }
    fn inputs(&self) -> DoctorInputs {
        DoctorInputs {
            roots: self.roots(),
            ryzenai_root: Some(self.venv()),
            xrt_root_knob: Some(self.xrt()),
            xilinx_xrt: None,
            worker_exe: Some(self.root.join("bin/onebit-tts")),
            xrt_ini: None,
            cwd: None,
            probed: None,
        }
    }
    /// A user who is not the files' owner, in the files' group (render).
    fn host(&self) -> FakeHost {
        FakeHost {
            id: Identity {
                uid: self.uid.wrapping_add(4242),
                gid: self.gid.wrapping_add(1),
                groups: vec![self.gid],
            },
            memlock: Ok(Memlock {
                soft: Limit::Unlimited,
                hard: Limit::Unlimited,
            }),
            log: Some(
                "[    3.1] [drm] Initialized amdxdna 0.6.0 for 0000:c5:00.1 on minor 0\n".into(),
            ),
            smi: Some(CommandOutput {
                code: Some(0),
                stdout: "XRT\n  Version              : 2.19.0\n  NPU Firmware Version : 1.1.0.5\n\
                         Device(s) Present\n|BDF  |Name |\n|-----|-----|\n|[0000:c5:00.1] |NPU|\n"
                    .into(),
                stderr: String::new(),
            }),
            access: None,
            ran: RefCell::new(Vec::new()),
            modinfo: Some(
                "filename:       /lib/modules/6.18.0/kernel/drivers/accel/amdxdna/amdxdna.ko.zst\n\
                 license:        GPL\n"
                    .into(),
            ),
            xdna: Some(Driver::Mainline),
            ldd: CommandOutput {
                code: Some(0),
                stdout: "\tlinux-vdso.so.1 (0x00007ffd)\n\tlibonnxruntime.so.1 => \
                         /venv/deployment/lib/libonnxruntime.so.1 (0x00007f01)\n\t\
                         libstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f02)\n"
                    .into(),
                stderr: String::new(),
            },
        }
    }
}

/// A command the fake host was asked to run: program and extra environment.
type Ran = (PathBuf, Vec<(String, OsString)>);

struct FakeHost {
    id: Identity,
    memlock: Result<Memlock, String>,
    log: Option<String>,
    smi: Option<CommandOutput>,
    access: Option<bool>,
    ran: RefCell<Vec<Ran>>,
    modinfo: Option<String>,
    /// The driver the accel node answers as (`None`: the real ioctl on the fake tree's node).
    xdna: Option<Driver>,
    /// What `ldd` of the provider library prints.
    ldd: CommandOutput,
}

impl Host for FakeHost {
    fn identity(&self) -> Identity {
        self.id.clone()
    }
    fn memlock(&self) -> Result<Memlock, NpuError> {
        self.memlock.clone().map_err(|reason| NpuError::Command {
            program: "getrlimit".into(),
            reason,
        })
    }
    fn kernel_log(&self) -> Result<String, NpuError> {
        self.log.clone().ok_or(NpuError::Command {
            program: "dmesg".into(),
            reason: "Operation not permitted".into(),
        })
    }
    fn run(
        &self,
        program: &Path,
        _args: &[&str],
        env: &[(&str, OsString)],
    ) -> Result<CommandOutput, NpuError> {
        if program == Path::new("ldd") {
            return Ok(self.ldd.clone());
        }
        self.ran.borrow_mut().push((
            program.to_path_buf(),
            env.iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        ));
        self.smi.clone().ok_or(NpuError::Command {
            program: program.display().to_string(),
            reason: "not found".into(),
        })
    }
    fn access_rw(&self, _path: &Path) -> Option<bool> {
        self.access
    }
    fn modinfo(&self, module: &str) -> Result<String, NpuError> {
        self.modinfo.clone().ok_or(NpuError::Command {
            program: format!("modinfo {module}"),
            reason: "modinfo: ERROR: Module amdxdna not found.".into(),
        })
    }
    fn hw_contexts(&self, node: &Path) -> Result<HwContexts, CountersError> {
        match self.xdna {
            // Two contexts of another process, as a busy machine has.
            Some(d) => read_contexts(&FakeXdna::new(d, vec![ctx(1, 77, 5), ctx(2, 77, 9)])),
            None => read_node(node),
        }
    }
}

/// A check's fix, or "" when it has none.
fn fix(c: &Check) -> &str {
    c.fix.as_deref().unwrap_or("")
}

fn only<'r>(r: &'r Report, name: &str) -> &'r Check {
    let v: Vec<&Check> = r.checks.iter().filter(|c| c.name == name).collect();
    assert_eq!(v.len(), 1, "{name}: {}", r.to_text());
    v[0]
}

fn status(r: &Report, name: &str) -> Status {
    only(r, name).status
}

#[test]
fn healthy_system_passes_everything() {
    let f = Fake::healthy("ok");
    let h = f.host();
    let r = run(&f.inputs(), &h);
    for c in &r.checks {
        // Residency needs a probe: the doctor alone never claims it.
        if c.name == names::RESIDENCY {
            assert_eq!(c.status, Status::Skip, "{}", r.to_text());
            continue;
        }
        assert_eq!(c.status, Status::Pass, "{}", r.to_text());
        assert!(c.fix.is_none());
    }
    assert_eq!(r.exit_code(), 0);
    assert_eq!(r.checks.len(), 22, "{}", r.to_text());
    assert!(r.to_text().ends_with("21 pass, 0 warn, 0 fail, 1 skip\n"));
    assert!(
        only(&r, names::PROVIDER_LIBS).detail.ends_with(
            "the 4 libraries they link resolve, with every symbol version, on the worker's \
             LD_LIBRARY_PATH (libraries opened later with dlopen are not covered)"
        ),
        "{}",
        r.to_text()
    );
    assert_eq!(
        only(&r, names::HW_COUNTERS).detail,
        "GET_ARRAY(HW_CONTEXT_ALL) answered by amdxdna_accel_driver 0.6.0: 2 hardware contexts \
         (what residency counts)"
    );
    assert!(
        only(&r, names::DRIVER)
            .detail
            .starts_with("in-tree (the kernel's own): /lib/modules/6.18.0/kernel/drivers/accel/")
    );
    assert_eq!(
        only(&r, names::DRM_VERSION).detail,
        "0.6.0 (DRM_IOCTL_VERSION), >= 0.6"
    );
    assert!(only(&r, names::XRT).detail.starts_with("2.19.0 at "));
    assert!(only(&r, names::PCI).detail.contains("rev 0x11"));
    // xrt-smi ran with the XRT's own environment.
    let ran = h.ran.borrow();
    assert_eq!(ran[0].0, f.xrt().join("bin/xrt-smi"));
    assert!(
        ran[0]
            .1
            .iter()
            .any(|(k, v)| k == "LD_LIBRARY_PATH" && *v == f.xrt().join("lib").into_os_string())
    );
}

#[test]
fn module() {
    let f = Fake::healthy("mod");
    let r = f.roots();
    write(&r.proc.join("modules"), "kvm 1 0 - Live 0x0\n");
    let rep = run(&f.inputs(), &f.host());
    let c = only(&rep, names::MODULE);
    assert_eq!(c.status, Status::Fail);
    assert!(fix(c).contains("modprobe amdxdna"));
    // Built in: no /proc/modules line but /sys/module/amdxdna.
    fs::create_dir_all(r.sys.join("module/amdxdna")).expect("mkdir");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::MODULE), Status::Pass);
    assert!(only(&rep, names::MODULE).detail.contains("built in"));
    // Out of tree (the vendor DKMS driver).
    write(
        &r.proc.join("modules"),
        "amdxdna 200704 0 - Live 0x0 (OE)\n",
    );
    // AMD's Ryzen AI 1.8 install puts exactly this one there: a supported route.
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::MODULE), Status::Pass);
    assert!(
        only(&rep, names::MODULE)
            .detail
            .contains("AMD's DKMS driver")
    );
}

#[test]
fn which_driver_build_is_loaded() {
    let f = Fake::healthy("driver");
    let mut h = f.host();
    h.modinfo = Some(
        "filename:       /lib/modules/6.14.0-27-generic/updates/dkms/amdxdna.ko.zst\n\
         version:        2.25.0_20260102\n"
            .into(),
    );
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::DRIVER);
    assert_eq!(c.status, Status::Pass);
    assert_eq!(
        c.detail,
        "out-of-tree (DKMS; AMD's xrt_plugin amdxdna): \
         /lib/modules/6.14.0-27-generic/updates/dkms/amdxdna.ko.zst, version 2.25.0_20260102"
    );
    // modinfo could not say: unknown, never a pass.
    h.modinfo = None;
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::DRIVER);
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.starts_with("unknown: "), "{}", c.detail);
}

#[test]
fn the_provider_libraries_must_resolve_on_the_workers_path() {
    let f = Fake::healthy("ldd");
    let mut h = f.host();
    // As glibc's ldd prints an older libstdc++ and a missing boost.
    h.ldd = CommandOutput {
        code: Some(1),
        stdout: "\tlibboost_filesystem.so.1.74.0 => not found\n\tlibstdc++.so.6 => \
                 /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f02)\n"
            .into(),
        stderr: "/venv/deployment/lib/libonnxruntime_providers_ryzenai.so: \
                 /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found \
                 (required by /venv/deployment/lib/libonnxruntime_providers_ryzenai.so)\n"
            .into(),
    };
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::PROVIDER_LIBS);
    assert_eq!(c.status, Status::Fail, "{}", rep.to_text());
    assert!(
        c.detail.ends_with(
            "with the worker's LD_LIBRARY_PATH: libboost_filesystem.so.1.74.0 not found; \
             /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required \
             by /venv/deployment/lib/libonnxruntime_providers_ryzenai.so)"
        ),
        "{}",
        c.detail
    );
    assert!(fix(c).contains("Ubuntu 24.04"), "{}", fix(c));
}

#[test]
fn the_xrt_heap_against_what_the_driver_grants() {
    let f = Fake::healthy("heap");
    let mut h = f.host();
    // In-tree driver, no xrt.ini: XRT's one page, all the driver grants.
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::XRT_HEAP);
    assert_eq!(c.status, Status::Pass, "{}", rep.to_text());
    assert!(
        c.detail.starts_with(
            "num_heap_pages = 1 from no xrt.ini (XRT's default): XRT asks for a 64 MiB device \
             heap, the most the kernel's own amdxdna grants a client (AIE2_DEVM_SIZE)"
        ),
        "{}",
        c.detail
    );
    // AMD's LLM setting on the in-tree driver: the allocation cannot succeed.
    let ini = f.root.join("etc/xrt.ini");
    write(
        &ini,
        "; AMD's LLM setting\n[Runtime]\nverbosity = 4\n[Debug]\nnum_heap_pages = 8\n",
    );
    let mut i = f.inputs();
    i.xrt_ini = Some(ini.clone());
    let rep = run(&i, &h);
    let c = only(&rep, names::XRT_HEAP);
    assert_eq!(c.status, Status::Fail, "{}", rep.to_text());
    assert_eq!(
        c.detail,
        format!(
            "num_heap_pages = 8 from {} ($XRT_INI_PATH): XRT asks for a 512 MiB device heap, but \
             the kernel's own amdxdna grants a client at most 64 MiB (AIE2_DEVM_SIZE): the heap \
             allocation fails",
            ini.display()
        )
    );
    assert!(fix(c).contains("route A"), "{}", fix(c));
    // AMD's driver with 8 pages: as AMD's instructions set it.
    h.modinfo = Some("filename:       /lib/modules/6.14.0/updates/dkms/amdxdna.ko.zst\n".into());
    let rep = run(&i, &h);
    assert_eq!(
        status(&rep, names::XRT_HEAP),
        Status::Pass,
        "{}",
        rep.to_text()
    );
    // AMD's driver without the setting: the fix names it.
    i.xrt_ini = None;
    let rep = run(&i, &h);
    let c = only(&rep, names::XRT_HEAP);
    assert_eq!(c.status, Status::Warn);
    assert!(fix(c).contains("num_heap_pages = 8"), "{}", fix(c));
    // An xrt.ini beside the worker is read when XRT_INI_PATH is unset.
    write(&f.root.join("bin/xrt.ini"), "[Debug]\nnum_heap_pages=8\n");
    let rep = run(&i, &h);
    let c = only(&rep, names::XRT_HEAP);
    assert_eq!(c.status, Status::Pass);
    assert!(c.detail.contains("(beside the worker)"), "{}", c.detail);
    // A bad value, and an XRT_INI_PATH that names nothing, fail.
    write(&ini, "[Debug]\nnum_heap_pages = eight\n");
    i.xrt_ini = Some(ini);
    assert_eq!(status(&run(&i, &h), names::XRT_HEAP), Status::Fail);
    i.xrt_ini = Some(f.root.join("nowhere/xrt.ini"));
    let rep = run(&i, &h);
    let c = only(&rep, names::XRT_HEAP);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.starts_with("XRT_INI_PATH="), "{}", c.detail);
}

#[test]
fn the_hardware_context_query_is_run_and_never_passed_unrun() {
    let f = Fake::healthy("hwctx");
    // The fake tree's node is a regular file: the real ioctl answers ENOTTY.
    let mut h = f.host();
    h.xdna = None;
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::HW_COUNTERS);
    assert_eq!(c.status, Status::Fail, "{}", rep.to_text());
    assert!(c.detail.contains("ENOTTY"), "{}", c.detail);
    // The version then comes from the kernel log.
    assert!(only(&rep, names::DRM_VERSION).detail.contains("kernel log"));
    // Linux 6.14-6.17 (driver 0.0): GET_INFO answers.
    h.xdna = Some(Driver::Mainline0);
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::HW_COUNTERS);
    assert_eq!(c.status, Status::Pass);
    assert!(
        c.detail.starts_with("GET_INFO(QUERY_HW_CONTEXTS) answered"),
        "{}",
        c.detail
    );
    // Another driver behind the node.
    h.xdna = Some(Driver::Other);
    assert_eq!(
        status(&run(&f.inputs(), &h), names::HW_COUNTERS),
        Status::Fail
    );
    // No node: not run.
    fs::remove_file(f.roots().accel_node()).expect("rm");
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::HW_COUNTERS);
    assert_eq!(c.status, Status::Skip);
    assert!(c.detail.starts_with("not run: "), "{}", c.detail);
}

#[test]
fn pci_device() {
    let f = Fake::healthy("pci");
    let pci = f.pci_dir();
    fs::remove_file(pci.join("driver")).expect("rm");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::PCI), Status::Fail);
    assert!(only(&rep, names::PCI).detail.contains("no driver bound"));
    write(&pci.join("device"), "0x1502\n");
    let rep = run(&f.inputs(), &f.host());
    assert!(only(&rep, names::PCI).detail.contains("Phoenix"));
    fs::remove_dir_all(&pci).expect("rm");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::PCI), Status::Fail);
    assert_eq!(rep.exit_code(), 1);
}

#[test]
fn firmware_file_is_the_one_the_driver_requests() {
    let f = Fake::healthy("fw");
    let r = f.roots();
    let fw = r.lib.join("firmware/amdnpu");
    let fw_status = |f: &Fake| only(&run(&f.inputs(), &f.host()), names::FIRMWARE_FILE).clone();
    fs::remove_dir_all(fw.join("17f0_11")).expect("rm");
    // A file for another revision does not count.
    write(&fw.join("17f0_10/npu.sbin"), "fw");
    let c = fw_status(&f);
    assert_eq!(c.status, Status::Fail);
    assert!(
        c.detail
            .contains("amdnpu/17f0_11/{npu_7.sbin,npu.sbin}[.zst|.xz]"),
        "{}",
        c.detail
    );
    assert!(c.detail.contains("rev 0x11"), "{}", c.detail);
    // A versioned blob without the npu.sbin link is not a name the driver asks for; nor is a
    // dangling link (linux-firmware's link to a removed blob).
    write(&fw.join("17f0_11/npu.sbin.1.1.2.65.zst"), "fw");
    symlink("npu.sbin.gone.zst", fw.join("17f0_11/npu.sbin.zst")).expect("symlink");
    assert_eq!(fw_status(&f).status, Status::Fail);
    fs::remove_file(fw.join("17f0_11/npu.sbin.zst")).expect("rm");
    symlink("npu.sbin.1.1.2.65.zst", fw.join("17f0_11/npu.sbin.zst")).expect("symlink");
    let c = fw_status(&f);
    assert_eq!(c.status, Status::Pass, "{}", c.detail);
    assert!(
        c.detail.starts_with("amdnpu/17f0_11/npu.sbin.zst in "),
        "{}",
        c.detail
    );

    // npu_7.sbin alone: only drivers with the 2026 fallback ask for it.
    fs::remove_dir_all(fw.join("17f0_11")).expect("rm");
    write(
        &r.lib.join("firmware/updates/amdnpu/17f0_11/npu_7.sbin.xz"),
        "fw",
    );
    let c = fw_status(&f);
    assert_eq!(c.status, Status::Warn, "{}", c.detail);
    assert!(c.detail.contains("updates"), "{}", c.detail);
    assert!(c.detail.contains("no npu.sbin"), "{}", c.detail);
    write(
        &r.lib.join("firmware/updates/amdnpu/17f0_11/npu.sbin"),
        "fw",
    );
    let c = fw_status(&f);
    assert_eq!(c.status, Status::Pass, "{}", c.detail);
    assert!(
        c.detail
            .contains("npu_7.sbin.xz, amdnpu/17f0_11/npu.sbin in"),
        "{}",
        c.detail
    );

    // Revision 0x20 (npu6) requests the 17f0_10 directory, not 17f0_20.
    write(&f.pci_dir().join("revision"), "0x20\n");
    write(&fw.join("17f0_20/npu.sbin"), "fw");
    fs::remove_dir_all(fw.join("17f0_10")).expect("rm");
    let c = fw_status(&f);
    assert_eq!(c.status, Status::Fail, "{}", c.detail);
    assert!(c.detail.contains("amdnpu/17f0_10/"), "{}", c.detail);
    write(&fw.join("17f0_10/npu.sbin.zst"), "fw");
    assert_eq!(fw_status(&f).status, Status::Pass);

    // A revision the driver table does not list.
    write(&f.pci_dir().join("revision"), "0x42\n");
    let c = fw_status(&f);
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.contains("rev 0x42"), "{}", c.detail);

    // No NPU at all: nothing to match a file against.
    fs::remove_dir_all(f.pci_dir()).expect("rm");
    assert_eq!(fw_status(&f).status, Status::Skip);
}

#[test]
fn accel_node_access() {
    let f = Fake::healthy("accel");
    // Not in the render group.
    let mut h = f.host();
    h.id.groups.clear();
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::ACCEL);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("not in group render"), "{}", c.detail);
    assert!(fix(c).contains("usermod -aG render"));

    // In /etc/group already, but the session predates it.
    write(
        &f.roots().etc.join("group"),
        &format!("render:x:{}:alice\n", f.gid),
    );
    write(
        &f.roots().etc.join("passwd"),
        &format!("alice:x:{}:1::/h:/bin/sh\n", h.id.uid),
    );
    let rep = run(&f.inputs(), &h);
    assert!(fix(only(&rep, names::ACCEL)).contains("log out and in"));

    // An ACL (access(2) says yes) passes despite the bits.
    h.access = Some(true);
    let rep = run(&f.inputs(), &h);
    assert_eq!(status(&rep, names::ACCEL), Status::Pass);
    assert!(only(&rep, names::ACCEL).detail.contains("ACL"));

    // Group without rw: a udev rule is the fix.
    let h = f.host();
    f.set_accel_mode(0o600);
    let c = only(&run(&f.inputs(), &h), names::ACCEL).clone();
    assert_eq!(c.status, Status::Fail);
    assert!(fix(&c).contains("udev"));

    // Rootless container: the node's group shows as the overflow gid.
    f.set_accel_mode(0o660);
    let mut h = f.host();
    h.id.groups.clear();
    write(
        &f.roots().proc.join("sys/kernel/overflowgid"),
        &format!("{}\n", f.gid),
    );
    write(&f.roots().proc.join("self/uid_map"), "0 1000 1\n");
    let c = only(&run(&f.inputs(), &h), names::ACCEL).clone();
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("rootless container"), "{}", c.detail);
    assert!(c.detail.contains("in a user namespace"));

    // Missing node.
    fs::remove_file(f.roots().accel_node()).expect("rm");
    let c = only(&run(&f.inputs(), &f.host()), names::ACCEL).clone();
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("does not exist"));
}

#[test]
fn memlock() {
    let f = Fake::healthy("memlock");
    let mut h = f.host();
    h.memlock = Ok(Memlock {
        soft: Limit::Bytes(8 << 20),
        hard: Limit::Bytes(8 << 20),
    });
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::MEMLOCK);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("soft 8 MiB"), "{}", c.detail);
    assert!(fix(c).contains("--ulimit memlock=-1"));
    h.memlock = Ok(Memlock {
        soft: Limit::Bytes(8 << 20),
        hard: Limit::Unlimited,
    });
    let rep = run(&f.inputs(), &h);
    assert!(fix(only(&rep, names::MEMLOCK)).contains("ulimit -l unlimited"));
    h.memlock = Err("EPERM".into());
    assert_eq!(status(&run(&f.inputs(), &h), names::MEMLOCK), Status::Warn);
}

#[test]
fn hugepages() {
    let f = Fake::healthy("huge");
    let r = f.roots();
    write(&r.proc.join("meminfo"), "HugePages_Total:       0\n");
    write(&r.proc.join("mounts"), "proc /proc proc rw 0 0\n");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::HUGEPAGES), Status::Warn);
    assert_eq!(status(&rep, names::HUGEPAGES_MOUNT), Status::Warn);
    assert!(fix(only(&rep, names::HUGEPAGES)).contains("nr_hugepages"));
}

#[test]
fn xrt() {
    let f = Fake::healthy("xrt");
    // xrt-smi failing is a warning; the version still comes from version.json.
    let mut h = f.host();
    h.smi = Some(CommandOutput {
        code: Some(1),
        stdout: String::new(),
        stderr: "ERROR: No devices found\n".into(),
    });
    let rep = run(&f.inputs(), &h);
    let c = only(&rep, names::XRT);
    assert_eq!(c.status, Status::Warn);
    assert!(c.detail.contains("No devices found"), "{}", c.detail);
    // Without version.json and xrt-smi: the soname says the version.
    fs::remove_file(f.xrt().join("version.json")).expect("rm");
    fs::remove_file(f.xrt().join("bin/xrt-smi")).expect("rm");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::XRT), Status::Pass);
    assert!(only(&rep, names::XRT).detail.starts_with("2.19.0 at "));
    // No NPU shim.
    fs::remove_file(f.xrt().join("lib/libxrt_driver_xdna.so.2")).expect("rm");
    let c = only(&run(&f.inputs(), &f.host()), names::XRT).clone();
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("libxrt_driver_xdna"));
    // No XRT at all where the knob points; the fix says how to get one without dpkg -i.
    let mut i = f.inputs();
    i.xrt_root_knob = Some(f.root.join("nowhere"));
    let rep = run(&i, &f.host());
    let c = only(&rep, names::XRT);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("ONEBIT_XRT_ROOT"));
    assert!(fix(c).contains("dpkg-deb -x"));
}

#[test]
fn venv_layout_python_and_provider() {
    let f = Fake::healthy("venv");
    let mut i = f.inputs();
    i.ryzenai_root = None;
    let rep = run(&i, &f.host());
    assert_eq!(status(&rep, names::VENV), Status::Fail);
    assert!(rep.check(names::PYTHON).is_none());

    let lib = f.venv().join("deployment/lib");
    fs::remove_file(lib.join("libonnxruntime-genai.so")).expect("rm");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::VENV), Status::Fail);
    write(&lib.join("libonnxruntime-genai.so"), "");

    fs::remove_file(f.venv().join("bin/python3.12")).expect("rm");
    write(
        &f.venv().join("pyvenv.cfg"),
        "home = /usr/bin\nversion = 3.11.9\n",
    );
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::PYTHON), Status::Fail);
    write(
        &f.venv().join("pyvenv.cfg"),
        "home = /usr/bin\nversion_info = 3.12.9.final.0\n",
    );
    assert_eq!(
        status(&run(&f.inputs(), &f.host()), names::PYTHON),
        Status::Pass
    );

    fs::remove_file(lib.join(PROVIDER_FILE)).expect("rm");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::PROVIDER), Status::Fail);
    // A copy beside the worker is enough (and wins).
    write(&f.root.join("bin").join(PROVIDER_FILE), "");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::PROVIDER), Status::Pass);
    assert!(
        only(&rep, names::PROVIDER)
            .detail
            .contains("beside the worker")
    );
    assert!(
        only(&rep, names::WORKER_ENV)
            .detail
            .contains("provider beside the worker")
    );
}

#[test]
fn stale_libxrt_in_the_venv() {
    let f = Fake::healthy("stale");
    let stale = f
        .venv()
        .join("lib/python3.12/site-packages/voe/lib/libxrt_coreutil.so.2.19");
    write(&stale, "");
    let rep = run(&f.inputs(), &f.host());
    let c = only(&rep, names::STALE_XRT);
    assert_eq!(c.status, Status::Pass);
    assert!(
        c.detail.contains("voe/lib/libxrt_coreutil.so.2.19"),
        "{}",
        c.detail
    );
    // With no XRT of its own to put first, the stale copy would be the one loaded.
    let mut i = f.inputs();
    i.xrt_root_knob = Some(f.root.join("nowhere"));
    assert_eq!(status(&run(&i, &f.host()), names::STALE_XRT), Status::Fail);
}

#[test]
fn versions_against_the_minimums() {
    let f = Fake::healthy("versions");
    write(
        &f.roots().accel_sysfs_device().join("fw_version"),
        "1.0.0.166\n",
    );
    let mut h = f.host();
    // No answer from the device: the kernel log's version.
    h.xdna = None;
    h.log = Some("[drm] Initialized amdxdna 0.1.0 for 0000:c5:00.1 on minor 0\n".into());
    let rep = run(&f.inputs(), &h);
    assert_eq!(status(&rep, names::FW_VERSION), Status::Warn);
    assert!(
        only(&rep, names::FW_VERSION)
            .detail
            .contains("1.0.0.166 (sysfs) is below 1.1.0.0")
    );
    assert_eq!(status(&rep, names::DRM_VERSION), Status::Warn);
    // No sysfs attribute: xrt-smi's answer is used.
    fs::remove_file(f.roots().accel_sysfs_device().join("fw_version")).expect("rm");
    let rep = run(&f.inputs(), &f.host());
    assert_eq!(status(&rep, names::FW_VERSION), Status::Pass);
    assert!(only(&rep, names::FW_VERSION).detail.contains("xrt-smi"));
}

#[test]
fn kernel_log_failures() {
    let f = Fake::healthy("klog");
    let mut h = f.host();
    h.log = Some(
        "[ 5.0] amdxdna 0000:c5:00.1: aie2_check_protocol: Incompatible firmware protocol major 7 minor 2\n\
         [ 5.1] amdxdna 0000:c5:00.1: aie2_hw_start: firmware is not alive\n\
         [ 9.0] amdxdna 0000:c5:00.1: amdxdna_cmd_submit: HW Context is not ready\n\
         [ 9.5] amdxdna 0000:c5:00.1: aie2_hwctx_restart: Map host buf failed, ret -12\n\
         [ 9.6] amdxdna 0000:c5:00.1: amdxdna_drm_close: Resume failed, ret -5\n"
            .into(),
    );
    let rep = run(&f.inputs(), &h);
    let kl: Vec<&Check> = rep
        .checks
        .iter()
        .filter(|c| c.name == names::KERNEL_LOG)
        .collect();
    assert_eq!(kl.len(), 5, "{}", rep.to_text());
    assert!(
        kl.iter()
            .all(|c| c.status == Status::Fail && c.fix.is_some())
    );
    assert!(kl[0].detail.contains("major 7 minor 2"));
    assert_eq!(rep.exit_code(), 1);
    // Unreadable log: a warning, not a failure; nor the device's own answer, the version is
    // unknown.
    h.log = None;
    h.xdna = None;
    let rep = run(&f.inputs(), &h);
    assert_eq!(status(&rep, names::KERNEL_LOG), Status::Warn);
    assert_eq!(status(&rep, names::DRM_VERSION), Status::Warn);
}

#[test]
fn json_rendering_of_a_real_run() {
    let f = Fake::healthy("json");
    let mut h = f.host();
    h.memlock = Ok(Memlock {
        soft: Limit::Bytes(64 << 10),
        hard: Limit::Bytes(64 << 10),
    });
    let rep = run(&f.inputs(), &h);
    let v: serde_json::Value = serde_json::from_str(&rep.to_json()).expect("json");
    assert_eq!(v["ok"], false);
    assert_eq!(v["summary"]["fail"], 1);
    let m = v["checks"]
        .as_array()
        .expect("array")
        .iter()
        .find(|c| c["name"] == "memlock")
        .expect("memlock")
        .clone();
    assert_eq!(m["status"], "FAIL");
    assert!(m["fix"].as_str().is_some());
}

#[test]
fn worker_env_line() {
    let f = Fake::healthy("wenv");
    let rep = run(&f.inputs(), &f.host());
    let c = only(&rep, names::WORKER_ENV);
    assert!(c.detail.starts_with("XILINX_XRT="), "{}", c.detail);
    assert!(c.detail.contains("(ONEBIT_XRT_ROOT)"), "{}", c.detail);
    // A venv whose path has a ':' cannot be put on LD_LIBRARY_PATH.
    let colon = f.root.join("ve:nv");
    fs::rename(f.venv(), &colon).expect("rename");
    let mut i = f.inputs();
    i.ryzenai_root = Some(colon);
    let rep = run(&i, &f.host());
    let c = only(&rep, names::WORKER_ENV);
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("contains ':'"), "{}", c.detail);
}

#[test]
fn kernel_log_is_not_a_pass_without_a_driver_to_look_at() {
    let f = Fake::healthy("klog-nomod");
    write(&f.roots().proc.join("modules"), "kvm 1 0 - Live 0x0\n");
    let mut h = f.host();
    h.log = Some("[ 1.0] usb 1-1: new device\n".into());
    let c = only(&run(&f.inputs(), &h), names::KERNEL_LOG).clone();
    assert_eq!(c.status, Status::Skip, "{}", c.detail);
    assert!(c.detail.contains("not loaded"), "{}", c.detail);
    // ...unless the log says why it is not loaded: built for another kernel.
    h.log = Some(
        "[ 2.0] amdxdna: Unknown symbol drm_sched_job_init (err -2)\n\
         [ 2.0] amdxdna: Unknown symbol drm_gem_shmem_vmap (err -2)\n"
            .into(),
    );
    let c = only(&run(&f.inputs(), &h), names::KERNEL_LOG).clone();
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("another kernel"), "{}", c.detail);
    assert!(c.detail.contains("(2 since boot)"), "{}", c.detail);
    assert!(fix(&c).contains("dkms"));
    // Loaded, but the log no longer has any driver line: nothing vouches for it either.
    let f = Fake::healthy("klog-wrapped");
    let mut h = f.host();
    h.log = Some("[ 9999.0] usb 1-1: new device\n".into());
    let c = only(&run(&f.inputs(), &h), names::KERNEL_LOG).clone();
    assert_eq!(c.status, Status::Skip, "{}", c.detail);
    assert!(fix(&c).contains("journalctl"));
}

#[test]
fn kernel_log_flags_every_driver_line_that_fails() {
    let f = Fake::healthy("klog-other");
    let mut h = f.host();
    h.log = Some(
        "[ 3.1] [drm] Initialized amdxdna 0.6.0 for 0000:c5:00.1 on minor 0\n\
         [ 5.0] usb 1-1: device descriptor read/64, error -71\n\
         [ 9.0] amdxdna 0000:c5:00.1: aie2_tdr_work: TDR TimeOut, ctx 3\n\
         [ 9.1] amdxdna 0000:c5:00.1: aie2_sched_job_run: Error submitting cmd\n\
         [ 9.2] [drm:amdxdna_gem_pin [amdxdna]] *ERROR* pin failed -12\n"
            .into(),
    );
    let c = only(&run(&f.inputs(), &h), names::KERNEL_LOG).clone();
    assert_eq!(c.status, Status::Warn, "{}", c.detail);
    assert!(
        c.detail.starts_with("3 other NPU driver line(s)"),
        "{}",
        c.detail
    );
    assert!(c.detail.contains("pin failed -12"), "{}", c.detail);
    // A known failure is its own FAIL line, not counted again among the others.
    h.log = Some(
        "amdxdna 0000:c5:00.1: aie2_hwctx_restart: Map host buf failed, ret -12\n\
         amdxdna 0000:c5:00.1: aie2_tdr_work: timeout\n"
            .into(),
    );
    let rep = run(&f.inputs(), &h);
    let kl: Vec<&Check> = rep
        .checks
        .iter()
        .filter(|c| c.name == names::KERNEL_LOG)
        .collect();
    assert_eq!(kl.len(), 2, "{}", rep.to_text());
    assert_eq!(kl[0].status, Status::Fail);
    assert_eq!(kl[1].status, Status::Warn);
    assert!(kl[1].detail.starts_with("1 other"), "{}", kl[1].detail);
}

#[test]
fn xrt_passes_only_with_real_libraries() {
    let f = Fake::healthy("xrt-libs");
    let lib = f.xrt().join("lib");
    // A directory with the shim but no libxrt_coreutil.so*.
    fs::remove_file(lib.join("libxrt_coreutil.so.2.19.0")).expect("rm");
    write(&lib.join("libxrt_core.so.2"), "");
    let c = only(&run(&f.inputs(), &f.host()), names::XRT).clone();
    assert_eq!(c.status, Status::Fail);
    assert!(c.detail.contains("libxrt_coreutil.so"), "{}", c.detail);
    assert!(fix(&c).contains("ONEBIT_XRT_ROOT"));
    // A dangling symlink by that name is not a library.
    symlink(
        "libxrt_coreutil.so.2.19.0",
        lib.join("libxrt_coreutil.so.2"),
    )
    .expect("symlink");
    assert_eq!(
        status(&run(&f.inputs(), &f.host()), names::XRT),
        Status::Fail
    );
    write(&lib.join("libxrt_coreutil.so.2.19.0"), "");
    assert_eq!(
        status(&run(&f.inputs(), &f.host()), names::XRT),
        Status::Pass
    );
}

#[test]
fn venv_runtime_versions_against_the_pairing() {
    let f = Fake::healthy("venv-rt");
    let c = only(&run(&f.inputs(), &f.host()), names::VENV_RUNTIME).clone();
    assert_eq!(c.status, Status::Pass, "{}", c.detail);
    assert!(
        c.detail
            .contains("ONNX Runtime 1.24.2 (onnxruntime_vitisai-1.24.2.dist-info METADATA)"),
        "{}",
        c.detail
    );
    assert!(
        c.detail.contains("onnxruntime-genai 0.11.2"),
        "{}",
        c.detail
    );
    // Older than our engine can drive: only onnxruntime-genai's loop can run, both named.
    f.set_venv_package("onnxruntime_vitisai", "onnxruntime-vitisai", "1.23.2");
    let c = only(&run(&f.inputs(), &f.host()), names::VENV_RUNTIME).clone();
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.detail.contains(&format!(
            "ONNX Runtime 1.23.2 (onnxruntime_vitisai-1.23.2.dist-info METADATA) is below {}",
            crate::runtime::min_version()
        )),
        "{}",
        c.detail
    );
    assert!(c.detail.contains("only --engine oga"), "{}", c.detail);
    assert!(
        c.detail.contains("onnxruntime-genai 0.11.2"),
        "{}",
        c.detail
    );
    assert!(fix(&c).contains("--engine oga"));
    // onnxruntime-extensions has its own versions: it is not the runtime.
    let site = f.venv().join("lib/python3.12/site-packages");
    fs::remove_dir_all(site.join("onnxruntime_vitisai-1.23.2.dist-info")).expect("rm");
    f.set_venv_package("onnxruntime_extensions", "onnxruntime-extensions", "0.14.0");
    let c = only(&run(&f.inputs(), &f.host()), names::VENV_RUNTIME).clone();
    assert_eq!(c.status, Status::Warn);
    assert!(
        c.detail.starts_with("ONNX Runtime version unknown"),
        "{}",
        c.detail
    );
}

#[test]
fn memlock_fixes_name_shell_systemd_and_containers() {
    let f = Fake::healthy("memlock-fix");
    let mut h = f.host();
    for hard in [Limit::Unlimited, Limit::Bytes(8 << 20)] {
        h.memlock = Ok(Memlock {
            soft: Limit::Bytes(8 << 20),
            hard,
        });
        let c = only(&run(&f.inputs(), &h), names::MEMLOCK).clone();
        assert_eq!(c.status, Status::Fail);
        assert!(c.detail.contains("device mapping fail"), "{}", c.detail);
        let fix = c.fix.unwrap_or_default();
        for want in ["unlimited", "LimitMEMLOCK=infinity", "--ulimit memlock=-1"] {
            assert!(fix.contains(want), "{want}: {fix}");
        }
    }
}

#[test]
fn residency_line_needs_a_probe() {
    use crate::npu::residency::{Residency, ResidencyState};
    let f = Fake::healthy("residency");
    let c = only(&run(&f.inputs(), &f.host()), names::RESIDENCY).clone();
    assert_eq!(c.status, Status::Skip);
    assert_eq!(c.detail, "not measured by doctor");
    assert!(fix(&c).contains("npu probe --model PKG"));
    let probed = |state, reasons: &[&str]| Probed {
        package: "/m/pkg".into(),
        residency: Residency {
            state,
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            evidence: Default::default(),
            ours: None,
        },
    };
    let mut i = f.inputs();
    i.probed = Some(probed(
        ResidencyState::Proven,
        &["412/412 nodes on the provider"],
    ));
    let c = only(&run(&i, &f.host()), names::RESIDENCY).clone();
    assert_eq!(c.status, Status::Pass);
    assert_eq!(c.detail, "proven for /m/pkg: 412/412 nodes on the provider");
    for state in [ResidencyState::Unproven, ResidencyState::Failed] {
        i.probed = Some(probed(
            state,
            &["provider declined 3 nodes", "no busy time"],
        ));
        let rep = run(&i, &f.host());
        let c = only(&rep, names::RESIDENCY);
        assert_eq!(c.status, Status::Fail);
        assert!(
            c.detail.contains("provider declined 3 nodes; no busy time"),
            "{}",
            c.detail
        );
        assert_eq!(rep.exit_code(), 1);
    }
}
