//! How ONNX Runtime's intra-op pools are sized, placed and made to wait (the third speed lever).
//!
//! ONNX Runtime's own default is one pool thread per physical core of the machine, spinning while
//! it waits for work. That is right for a dedicated box and wrong in two common cases: a process
//! confined to part of the machine (taskset, a cgroup cpuset or a CPU quota in a container) still
//! gets a thread per core of the whole machine, and a machine with other busy processes turns
//! spinning into lost time slices — on the 2-core development machine, with two other busy
//! processes, decode ran at 15-17 codes/s spinning and 27-32 without (docs/performance.md, lever
//! 3). The tuned policy counts
//! the physical cores this process may actually use, caps that by the CPU quota, gives each pool
//! thread a core of its own on SMT machines, and spins only while a run is in progress (not in
//! the gaps between decode steps, where the codec's session and the server's threads need the
//! cores). Spin-waiting itself stays on by default — on an otherwise idle machine it is worth
//! 1.2-1.35x in decode — and `spin: Some(false)` (`--spin off`) is the setting for shared machines.

use std::collections::BTreeMap;
use std::path::Path;

use ort::session::builder::SessionBuilder;

/// Which defaults the sessions get when no thread count is given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ThreadPolicy {
    /// One thread per usable physical core, pinned one per core on SMT machines, spinning only
    /// inside a run.
    #[default]
    Tuned,
    /// ONNX Runtime's own defaults (the lever switched off, to measure it).
    Ort,
}

impl ThreadPolicy {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "tuned" => Some(Self::Tuned),
            "ort" => Some(Self::Ort),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Tuned => "tuned",
            Self::Ort => "ort",
        }
    }
}

/// The logical CPUs this process may run on, grouped by physical core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTopology {
    /// Each core's usable logical CPU ids, ascending; cores ordered by their first id.
    cores: Vec<Vec<usize>>,
    /// The CPU quota of the process' cgroup in whole CPUs (rounded up), if one is set.
    quota: Option<usize>,
}

impl CpuTopology {
    /// This process: its affinity mask, /sys/devices/system/cpu and its cgroup's cpu.max.
    pub fn detect() -> Self {
        let quota = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|c| cgroup_quota(Path::new("/sys/fs/cgroup"), &c));
        Self::from_sysfs(Path::new("/sys/devices/system/cpu"), &allowed_cpus(), quota)
    }

    /// `root` is a /sys/devices/system/cpu tree; `allowed` the logical CPUs the process may use.
    /// A CPU whose topology cannot be read counts as a core of its own.
    pub fn from_sysfs(root: &Path, allowed: &[usize], quota: Option<usize>) -> Self {
        let mut by_core: BTreeMap<(i64, i64), Vec<usize>> = BTreeMap::new();
        for &cpu in allowed {
            let topo = root.join(format!("cpu{cpu}/topology"));
            let read = |f: &str| -> Option<i64> {
                std::fs::read_to_string(topo.join(f))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            };
            let key = match (read("physical_package_id"), read("core_id")) {
                (Some(p), Some(c)) => (p, c),
                // Unknown topology: its own core, keyed apart from every real one.
                _ => (-1, cpu as i64),
            };
            by_core.entry(key).or_default().push(cpu);
        }
        let mut cores: Vec<Vec<usize>> = by_core
            .into_values()
            .map(|mut v| {
                v.sort_unstable();
                v
            })
            .collect();
        cores.sort_unstable_by_key(|c| c[0]);
        Self { cores, quota }
    }

    pub fn physical_cores(&self) -> usize {
        self.cores.len()
    }

    /// Physical cores this process may keep busy: within its affinity mask and CPU quota.
    pub fn usable_cores(&self) -> usize {
        self.quota
            .map_or(self.physical_cores(), |q| q.min(self.physical_cores()))
            .max(1)
    }

    pub fn logical_cpus(&self) -> usize {
        self.cores.iter().map(Vec::len).sum()
    }

    pub fn quota(&self) -> Option<usize> {
        self.quota
    }
}

/// The settings one session gets; the default leaves everything to ONNX Runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadPlan {
    pub intra_threads: Option<usize>,
    /// `session.intra_op.allow_spinning`; `None` leaves ONNX Runtime's default (on).
    pub spinning: Option<bool>,
    /// `session.force_spinning_stop`: pool threads stop spinning when a run returns.
    pub stop_spinning_between_runs: bool,
    /// `session.intra_op_thread_affinities`: one entry per pool thread but the caller's.
    pub affinities: Option<String>,
}

/// Threads beyond this stop paying for decode (one token's matrix-vector work is split too thin
/// and every operator synchronises them all); the range of machines ends here too.
pub const MAX_THREADS: usize = 16;

impl ThreadPlan {
    /// `explicit` is a thread count the user or the package asked for, `spin` a spin-wait
    /// choice; both win over the policy's.
    pub fn new(
        policy: ThreadPolicy,
        topo: &CpuTopology,
        explicit: Option<usize>,
        spin: Option<bool>,
    ) -> Self {
        match policy {
            ThreadPolicy::Ort => Self {
                intra_threads: explicit,
                spinning: spin,
                stop_spinning_between_runs: false,
                affinities: None,
            },
            ThreadPolicy::Tuned => {
                let usable = topo.usable_cores().min(MAX_THREADS);
                let threads = explicit.unwrap_or(usable).max(1);
                Self {
                    intra_threads: Some(threads),
                    spinning: Some(spin.unwrap_or(true)),
                    stop_spinning_between_runs: true,
                    affinities: pin_one_per_core(topo, threads),
                }
            }
        }
    }

    /// The plan of each of `sessions` sessions that run side by side: the threads shared out
    /// (`threads / sessions`, at least one each) and unpinned, since the pinning lays one pool
    /// over the cores. A plan that leaves the count to ONNX Runtime (`--thread-policy ort`
    /// without `--threads`) leaves it to each session.
    pub fn split(&self, sessions: usize) -> Self {
        if sessions <= 1 {
            return self.clone();
        }
        Self {
            intra_threads: self.intra_threads.map(|n| (n / sessions).max(1)),
            affinities: None,
            ..self.clone()
        }
    }

    /// [`ThreadPlan::new`] for the cores this process may use now ([`CpuTopology::detect`]).
    pub fn for_process(policy: ThreadPolicy, explicit: Option<usize>, spin: Option<bool>) -> Self {
        Self::new(policy, &CpuTopology::detect(), explicit, spin)
    }

    /// Applies the plan to a session builder.
    pub fn apply(&self, mut builder: SessionBuilder) -> ort::Result<SessionBuilder> {
        if let Some(n) = self.intra_threads {
            builder = builder.with_intra_threads(n)?;
        }
        if let Some(spin) = self.spinning {
            builder = builder.with_intra_op_spinning(spin)?;
        }
        if self.stop_spinning_between_runs {
            builder = builder.with_config_entry("session.force_spinning_stop", "1")?;
        }
        if let Some(a) = &self.affinities {
            builder = builder.with_config_entry("session.intra_op_thread_affinities", a)?;
        }
        Ok(builder)
    }

    /// One line for logs and `bench`.
    pub fn describe(&self) -> String {
        format!(
            "{} threads, spinning {}, {}",
            self.intra_threads
                .map_or_else(|| "ORT-default".to_owned(), |n| n.to_string()),
            match (self.spinning, self.stop_spinning_between_runs) {
                (Some(true), true) => "in runs",
                (Some(true), false) => "on",
                (Some(false), _) => "off",
                (None, _) => "ORT-default",
            },
            if self.affinities.is_some() {
                "pinned one per core"
            } else {
                "unpinned"
            }
        )
    }
}

/// On SMT machines, pool threads 1..n each get every logical CPU of their own physical core
/// (ORT's ids are 1-based), so two of them never share a core's execution units; the calling
/// thread, which ORT never pins, is left core 0's share. Without SMT, or when there are more
/// threads than cores, the scheduler already spreads them and pinning only removes its freedom
/// to dodge other processes.
fn pin_one_per_core(topo: &CpuTopology, threads: usize) -> Option<String> {
    let smt = topo.cores.iter().any(|c| c.len() > 1);
    if !smt || threads < 2 || threads > topo.physical_cores() {
        return None;
    }
    let entries: Vec<String> = topo.cores[1..threads]
        .iter()
        .map(|core| {
            core.iter()
                .map(|cpu| (cpu + 1).to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    Some(entries.join(";"))
}

/// The process' affinity mask (all online CPUs when it cannot be read).
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity fills at most its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let rc =
        unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if rc == 0 {
        let cpus: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect();
        if !cpus.is_empty() {
            return cpus;
        }
    }
    (0..std::thread::available_parallelism().map_or(1, |n| n.get())).collect()
}

/// Whole CPUs of a cgroup v2 `cpu.max` quota ("max 100000" = none), rounded up; `cgroup` is the
/// text of /proc/self/cgroup.
fn cgroup_quota(root: &Path, cgroup: &str) -> Option<usize> {
    let rel = cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))?
        .trim_start_matches('/');
    let text = std::fs::read_to_string(root.join(rel).join("cpu.max")).ok()?;
    let mut parts = text.split_whitespace();
    let quota: u64 = parts.next()?.parse().ok()?;
    let period: u64 = parts.next()?.parse().ok()?;
    (period > 0).then(|| quota.div_ceil(period).max(1) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake /sys/devices/system/cpu: `cores` physical cores of `smt` siblings each, numbered
    /// as Linux does on AMD (cpu N and N + cores are siblings).
    fn tree(dir: &Path, cores: usize, smt: usize) {
        for s in 0..smt {
            for c in 0..cores {
                let t = dir.join(format!("cpu{}/topology", s * cores + c));
                std::fs::create_dir_all(&t).unwrap();
                std::fs::write(t.join("physical_package_id"), "0\n").unwrap();
                std::fs::write(t.join("core_id"), format!("{c}\n")).unwrap();
            }
        }
    }

    use crate::testutil::tempdir as tmp;

    #[test]
    fn two_cores_without_smt_get_two_unpinned_threads() {
        let d = tmp("2c");
        tree(&d, 2, 1);
        let topo = CpuTopology::from_sysfs(&d, &[0, 1], None);
        assert_eq!((topo.physical_cores(), topo.logical_cpus()), (2, 2));
        let plan = ThreadPlan::new(ThreadPolicy::Tuned, &topo, None, None);
        assert_eq!(
            plan,
            ThreadPlan {
                intra_threads: Some(2),
                spinning: Some(true),
                stop_spinning_between_runs: true,
                affinities: None
            }
        );
    }

    #[test]
    fn sixteen_smt_cores_pin_each_pool_thread_to_its_own_core() {
        let d = tmp("16c");
        tree(&d, 16, 2);
        let all: Vec<usize> = (0..32).collect();
        let topo = CpuTopology::from_sysfs(&d, &all, None);
        assert_eq!((topo.physical_cores(), topo.logical_cpus()), (16, 32));
        let plan = ThreadPlan::new(ThreadPolicy::Tuned, &topo, None, None);
        assert_eq!(plan.intra_threads, Some(16));
        // cores 1..15, each as both siblings (1-based ids): core 1 = cpus 1 and 17.
        let want: Vec<String> = (1..16).map(|c| format!("{},{}", c + 1, c + 17)).collect();
        assert_eq!(plan.affinities.as_deref(), Some(want.join(";").as_str()));
        // Sessions side by side share the threads out, unpinned; one session keeps the plan.
        assert_eq!(plan.split(1), plan);
        let quarter = plan.split(4);
        assert_eq!((quarter.intra_threads, quarter.affinities), (Some(4), None));
        assert_eq!(quarter.spinning, plan.spinning);
        assert_eq!(plan.split(32).intra_threads, Some(1));
        assert_eq!(ThreadPlan::default().split(4), ThreadPlan::default());
    }

    #[test]
    fn the_affinity_mask_and_the_quota_bound_the_count() {
        let d = tmp("mask");
        tree(&d, 16, 2);
        // taskset -c 0-3,16-19: four cores with both siblings.
        let allowed = [0, 1, 2, 3, 16, 17, 18, 19];
        let topo = CpuTopology::from_sysfs(&d, &allowed, None);
        assert_eq!(topo.physical_cores(), 4);
        let plan = ThreadPlan::new(ThreadPolicy::Tuned, &topo, None, None);
        assert_eq!(plan.intra_threads, Some(4));
        assert_eq!(plan.affinities.as_deref(), Some("2,18;3,19;4,20"));
        // A container with cpu.max "300000 100000" on the same mask: 3 threads.
        let topo = CpuTopology::from_sysfs(&d, &allowed, Some(3));
        assert_eq!(
            ThreadPlan::new(ThreadPolicy::Tuned, &topo, None, None).intra_threads,
            Some(3)
        );
        // 64 cores are capped at MAX_THREADS.
        let d = tmp("64c");
        tree(&d, 64, 1);
        let all: Vec<usize> = (0..64).collect();
        let topo = CpuTopology::from_sysfs(&d, &all, None);
        assert_eq!(
            ThreadPlan::new(ThreadPolicy::Tuned, &topo, None, None).intra_threads,
            Some(MAX_THREADS)
        );
    }

    #[test]
    fn explicit_counts_win_and_the_ort_policy_changes_nothing() {
        let d = tmp("explicit");
        tree(&d, 8, 2);
        let all: Vec<usize> = (0..16).collect();
        let topo = CpuTopology::from_sysfs(&d, &all, None);
        let plan = ThreadPlan::new(ThreadPolicy::Tuned, &topo, Some(3), None);
        assert_eq!(plan.intra_threads, Some(3));
        assert_eq!(plan.affinities.as_deref(), Some("2,10;3,11"));
        // More threads than cores: not pinned.
        let plan = ThreadPlan::new(ThreadPolicy::Tuned, &topo, Some(12), Some(false));
        assert_eq!(
            (plan.intra_threads, plan.spinning, plan.affinities),
            (Some(12), Some(false), None)
        );
        assert_eq!(
            ThreadPlan::new(ThreadPolicy::Ort, &topo, None, None),
            ThreadPlan {
                intra_threads: None,
                spinning: None,
                stop_spinning_between_runs: false,
                affinities: None
            }
        );
        assert_eq!(
            ThreadPlan::new(ThreadPolicy::Ort, &topo, Some(5), None).intra_threads,
            Some(5)
        );
    }

    #[test]
    fn unreadable_topology_counts_each_cpu_as_a_core() {
        let d = tmp("none");
        let topo = CpuTopology::from_sysfs(&d, &[0, 1, 2], None);
        assert_eq!(topo.physical_cores(), 3);
        assert_eq!(
            ThreadPlan::new(ThreadPolicy::Tuned, &topo, None, None).affinities,
            None
        );
    }

    #[test]
    fn cgroup_quota_reads_cpu_max() {
        let d = tmp("cg");
        std::fs::create_dir_all(d.join("app.slice/x")).unwrap();
        std::fs::write(d.join("app.slice/x/cpu.max"), "250000 100000\n").unwrap();
        assert_eq!(cgroup_quota(&d, "0::/app.slice/x\n"), Some(3));
        std::fs::write(d.join("app.slice/x/cpu.max"), "max 100000\n").unwrap();
        assert_eq!(cgroup_quota(&d, "0::/app.slice/x\n"), None);
        assert_eq!(cgroup_quota(&d, "1:cpu:/legacy\n"), None);
    }
}
