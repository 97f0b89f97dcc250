//! Which CPUs get an executor, and whether it is pinned there: decided
//! once at startup from `--cores`, the pinning flags, the affinity mask and
//! the cgroup limits ([`super::cgroup`]). No I/O here but reading those
//! facts ([`CpuFacts::read`]); the decision has its table tests beside it.

use anyhow::{bail, Context};

use super::cgroup::{format_cpu_amount, format_cpu_list, plural, CpuQuota};

/// Whether executors are pinned to their CPUs (`--pin`, `--no-pin`, or
/// neither: decided from the CPUs, see [`plan_cores`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinMode {
    Auto,
    On,
    Off,
}

/// What this process may run on, as the kernel and the cgroups say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuFacts {
    /// The affinity mask (sched_getaffinity: taskset, cpusets).
    pub affinity: Vec<usize>,
    /// The machine's online CPUs; None if unknown.
    pub online: Option<Vec<usize>>,
    /// The cgroup cpuset's effective CPUs; None if unknown.
    pub cpuset: Option<Vec<usize>>,
    /// The tightest cgroup CPU quota; None if there is none.
    pub quota: Option<CpuQuota>,
}

impl CpuFacts {
    /// This process's, read from the kernel.
    pub fn read() -> Self {
        let root = std::path::Path::new("/");
        let cgroup = super::cgroup::read_cgroup_cpu(root);
        CpuFacts {
            affinity: allowed_cpus(),
            online: super::cgroup::read_online_cpus(root),
            cpuset: cgroup.cpuset,
            quota: cgroup.quota,
        }
    }
}

/// Which CPUs get an executor, whether it is pinned there, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorePlan {
    pub cpus: Vec<usize>,
    pub pin: bool,
    /// Why these CPUs, for the startup log and /config_dump.
    pub cores_reason: String,
    /// Why pinned or not.
    pub pin_reason: String,
    /// Something the operator should fix (more executors than the CPU
    /// quota pays for).
    pub warning: Option<String>,
}

/// Decides the executors' CPUs and pinning from `--cores` (`spec`), the
/// pinning flags and what the process may use (`facts`).
///
/// CPUs this process may use: the affinity mask, within the cgroup cpuset.
/// Without `--cores`, one executor per such CPU, but no more than the
/// cgroup CPU quota rounded up (the first N of them). The quota caps all
/// threads together: with more busy executors than it pays for, the whole
/// cgroup is throttled (stopped until the next period, 100 ms by
/// default), which shows as latency spikes. It is rounded up (1.5 CPUs →
/// 2 executors) so the whole quota can be used, as the JVM and .NET size
/// their thread pools; rounding down would leave paid-for CPU idle, and
/// with an io_uring executor per core an idle executor costs nothing.
/// A fractional quota can therefore still be throttled when every
/// executor is busy; `--cores` set to the whole CPUs avoids that.
///
/// Pinning, unless `--pin` or `--no-pin` says: on only when the CPUs look
/// like ringway's own. That is what Kubernetes' static CPU manager policy
/// gives a Guaranteed pod with an integer CPU request: a cpuset of
/// exclusive CPUs (so the affinity mask leaves out other online CPUs) and
/// a CPU quota of exactly that many CPUs. Each half alone proves nothing:
/// a container in the shared pool of a node with exclusive pods also has
/// a narrowed mask, but its quota (if any) is not the mask's size or it
/// has none; and a quota equal to every online CPU is a shared machine.
/// Pinning on shared CPUs makes an executor wait behind other work on its
/// CPU (docs/performance/pinning.md), so "unsure" means unpinned. One such case is
/// common: Kubernetes' DisableCPUQuotaWithExclusiveCPUs (kubernetes#127525,
/// on by default in recent releases) gives exclusive CPUs no quota at all,
/// and then nothing here tells them from a shared pool, whose containers
/// without a CPU limit have no quota either; `--pin` is the answer there.
pub fn plan_cores(
    spec: Option<&str>,
    facts: &CpuFacts,
    pin_mode: PinMode,
) -> anyhow::Result<CorePlan> {
    let (allowed, allowed_why) = allowed_of(facts);
    if allowed.is_empty() {
        bail!("no CPUs are available to this process");
    }
    let quota = facts.quota.as_ref();
    let (cpus, cores_reason) = match spec.map(str::trim) {
        None | Some("") => {
            let n = allowed.len();
            match quota {
                None => (
                    allowed.clone(),
                    format!(
                        "no cgroup CPU quota → {}, one per allowed CPU ({allowed_why})",
                        plural(n, "executor")
                    ),
                ),
                Some(q) => {
                    let k = q.cpus_rounded_up();
                    let amount = format!(
                        "{q} = {}{}",
                        format_cpu_amount(q.cpus()),
                        if q.is_exactly(k) { "" } else { ", rounded up" }
                    );
                    let at = format!("set in {}", q.file().display());
                    if k < n {
                        (
                            allowed[..k].to_vec(),
                            format!(
                                "{amount} → {} ({allowed_why} allows {n}; {at})",
                                plural(k, "executor")
                            ),
                        )
                    } else {
                        (
                            allowed.clone(),
                            format!(
                                "{amount}, not fewer than the {} → {} ({allowed_why}; {at})",
                                plural(n, "allowed CPU"),
                                plural(n, "executor")
                            ),
                        )
                    }
                }
            }
        }
        Some(s) if s.chars().all(|c| c.is_ascii_digit()) => {
            let n: usize = s.parse().context("invalid --cores count")?;
            if n == 0 {
                bail!("--cores 0: at least one core is needed");
            }
            if n > allowed.len() {
                bail!(
                    "--cores {n}: only {} CPUs are available to this process ({})",
                    allowed.len(),
                    format_cpus(&allowed)
                );
            }
            let cpus = allowed[..n].to_vec();
            let why = format!(
                "--cores {n} → CPUs {}, the first {n} of {allowed_why}",
                format_cpu_list(&cpus)
            );
            (cpus, why)
        }
        Some(s) => {
            let cpus = parse_cores_list(s, &allowed)?;
            let why = format!("--cores {s} → CPUs {}", format_cpu_list(&cpus));
            (cpus, why)
        }
    };
    let warning = quota
        .filter(|q| cpus.len() > q.cpus_rounded_up())
        .map(|q| {
            format!(
                "{} but the {q} pays for {}: when they are all busy the cgroup is throttled (stopped until the next period); --cores {} avoids it",
                plural(cpus.len(), "executor"),
                format_cpu_amount(q.cpus()),
                q.cpus_rounded_up()
            )
        });
    let (pin, pin_reason) = decide_pin(pin_mode, &allowed, facts.online.as_deref(), quota);
    Ok(CorePlan {
        cpus,
        pin,
        cores_reason,
        pin_reason,
        warning,
    })
}

/// The CPUs this process may use (affinity within the cpuset) and how
/// that was found, e.g. "affinity 0-7" or "affinity 0-7 ∩ cpuset 0-3 = 0-3".
/// How many CPUs this process may use (what `--cores` may count up to).
pub fn allowed_cpu_count(facts: &CpuFacts) -> usize {
    allowed_of(facts).0.len()
}

fn allowed_of(facts: &CpuFacts) -> (Vec<usize>, String) {
    let affinity = &facts.affinity;
    let a = format_cpu_list(affinity);
    let Some(cpuset) = &facts.cpuset else {
        return (affinity.clone(), format!("affinity {a}"));
    };
    let both: Vec<usize> = affinity
        .iter()
        .copied()
        .filter(|c| cpuset.contains(c))
        .collect();
    let c = format_cpu_list(cpuset);
    if both.len() == affinity.len() {
        (both, format!("affinity {a}"))
    } else if both.is_empty() {
        // The kernel keeps the mask inside the cpuset, so this cpuset is
        // not the one in force: trust the mask.
        (
            affinity.clone(),
            format!("affinity {a}; cpuset {c} shares none of it, ignored"),
        )
    } else {
        let b = format_cpu_list(&both);
        (both, format!("affinity {a} ∩ cpuset {c} = {b}"))
    }
}

/// The pinning decision (see [`plan_cores`]) and its reason.
fn decide_pin(
    mode: PinMode,
    allowed: &[usize],
    online: Option<&[usize]>,
    quota: Option<&CpuQuota>,
) -> (bool, String) {
    match mode {
        PinMode::On => return (true, "pinning on: --pin".into()),
        PinMode::Off => return (false, "pinning off: --no-pin".into()),
        PinMode::Auto => {}
    }
    let a = format_cpu_list(allowed);
    let Some(online) = online else {
        return (
            false,
            format!("pinning off: the online CPUs are unknown, so whether CPUs {a} are ringway's own cannot be told (--pin if they are)"),
        );
    };
    let o = format_cpu_list(online);
    if online.iter().all(|c| allowed.contains(c)) {
        return (
            false,
            format!("pinning off: CPUs are shared (affinity {a} = all online CPUs)"),
        );
    }
    let n = allowed.len();
    match quota {
        None => (
            false,
            format!("pinning off: CPUs {a} of online {o} but no cgroup CPU quota: a shared pool, or exclusive CPUs whose quota Kubernetes dropped (DisableCPUQuotaWithExclusiveCPUs), which cannot be told apart; --pin if they are ringway's own"),
        ),
        Some(q) if !q.is_exactly(n) => (
            false,
            format!(
                "pinning off: CPUs {a} of online {o} but the {q} is {}, not {n}: a shared pool",
                format_cpu_amount(q.cpus())
            ),
        ),
        Some(q) => (
            true,
            format!(
                "pinning on: CPUs {a} of online {o} with a {q} of exactly {} look exclusive (Kubernetes' static CPU manager policy, Guaranteed pod)",
                plural(n, "CPU")
            ),
        ),
    }
}

/// A `--cores` CPU list ("0-3,6-6") resolved against the allowed CPUs.
fn parse_cores_list(s: &str, allowed: &[usize]) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.trim(), b.trim()),
            None => bail!(
                "--cores {s:?}: {part:?} is neither a count nor a range; write a single CPU as \"{part}-{part}\""
            ),
        };
        let lo: usize = lo
            .parse()
            .with_context(|| format!("--cores: bad CPU number in {part:?}"))?;
        let hi: usize = hi
            .parse()
            .with_context(|| format!("--cores: bad CPU number in {part:?}"))?;
        if lo > hi {
            bail!("--cores: empty range {part:?}");
        }
        for cpu in lo..=hi {
            if !allowed.contains(&cpu) {
                bail!(
                    "--cores: CPU {cpu} does not exist or is not available to this process (available: {})",
                    format_cpus(allowed)
                );
            }
            if !cpus.contains(&cpu) {
                cpus.push(cpu);
            }
        }
    }
    if cpus.is_empty() {
        bail!("--cores {s:?} names no CPU");
    }
    Ok(cpus)
}

pub fn format_cpus(cpus: &[usize]) -> String {
    cpus.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// The CPUs in this thread's affinity mask (respects taskset and cgroup
/// cpusets, unlike a plain CPU count).
pub fn allowed_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is an empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        let n = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        return (0..n).collect();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: c < CPU_SETSIZE, inside the set.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Facts of a machine where `affinity` is every online CPU and there
    /// are no cgroup limits.
    fn plain(affinity: &[usize]) -> CpuFacts {
        CpuFacts {
            affinity: affinity.to_vec(),
            online: Some(affinity.to_vec()),
            ..CpuFacts::default()
        }
    }

    fn quota(quota_us: u64, period_us: u64) -> Option<CpuQuota> {
        Some(CpuQuota {
            quota_us,
            period_us,
            version: crate::app::cgroup::CgroupVersion::V2,
            dir: "/sys/fs/cgroup".into(),
        })
    }

    #[test]
    fn cores_count_and_lists() {
        let facts = plain(&[0, 1, 2, 3]);
        let cpus = |spec, pin| plan_cores(spec, &facts, pin).unwrap().cpus;
        assert_eq!(cpus(None, PinMode::On), vec![0, 1, 2, 3]);
        assert_eq!(cpus(Some("2"), PinMode::On), vec![0, 1]);
        assert_eq!(cpus(Some("1-2,0-0"), PinMode::Off), vec![1, 2, 0]);
        assert_eq!(cpus(Some("3-3"), PinMode::Auto), vec![3]);
    }

    #[test]
    fn cores_errors_are_clear() {
        let facts = plain(&[0, 1]);
        let err = |spec| {
            plan_cores(Some(spec), &facts, PinMode::Auto)
                .unwrap_err()
                .to_string()
        };
        let e = err("0-5");
        assert!(e.contains("CPU 2 does not exist"), "{e}");
        let e = err("3");
        assert!(e.contains("only 2 CPUs"), "{e}");
        let e = err("0");
        assert!(e.contains("at least one"), "{e}");
        let e = err("1,0");
        assert!(e.contains("neither a count nor a range"), "{e}");
        assert!(plan_cores(Some("2-1"), &facts, PinMode::Auto).is_err());
        assert!(plan_cores(None, &plain(&[]), PinMode::Auto).is_err());
    }

    /// The whole decision, one row per situation: which CPUs, pinned or
    /// not, and words each reason must contain.
    #[test]
    fn plan_from_affinity_cpuset_quota_and_flags() {
        struct Case {
            name: &'static str,
            affinity: Vec<usize>,
            online: Option<Vec<usize>>,
            cpuset: Option<Vec<usize>>,
            quota: Option<CpuQuota>,
            spec: Option<&'static str>,
            mode: PinMode,
            cpus: Vec<usize>,
            pin: bool,
            cores_reason: &'static [&'static str],
            pin_reason: &'static [&'static str],
            warns: bool,
        }
        let all8: Vec<usize> = (0..8).collect();
        let base = |name| Case {
            name,
            affinity: all8.clone(),
            online: Some(all8.clone()),
            cpuset: None,
            quota: None,
            spec: None,
            mode: PinMode::Auto,
            cpus: all8.clone(),
            pin: false,
            cores_reason: &[],
            pin_reason: &[],
            warns: false,
        };
        let cases = [
            Case {
                cores_reason: &["no cgroup CPU quota → 8 executors", "affinity 0-7"],
                pin_reason: &["pinning off: CPUs are shared (affinity 0-7 = all online CPUs)"],
                ..base("no limits: every CPU, unpinned")
            },
            Case {
                quota: quota(200_000, 100_000),
                cpus: vec![0, 1],
                cores_reason: &[
                    "cgroup cpu.max 200000/100000 = 2 CPUs → 2 executors (affinity 0-7 allows 8",
                    "/sys/fs/cgroup/cpu.max",
                ],
                pin_reason: &["all online CPUs"],
                ..base("quota of 2 on 8 CPUs: the first 2, unpinned (shared)")
            },
            Case {
                quota: quota(150_000, 100_000),
                cpus: vec![0, 1],
                cores_reason: &["= 1.5 CPUs, rounded up → 2 executors"],
                ..base("fractional quota rounds up")
            },
            Case {
                quota: quota(10_000, 100_000),
                cpus: vec![0],
                cores_reason: &["= 0.1 CPUs, rounded up → 1 executor"],
                ..base("a tenth of a CPU still gets one executor")
            },
            Case {
                quota: Some(CpuQuota {
                    quota_us: 100_000,
                    period_us: 100_000,
                    version: crate::app::cgroup::CgroupVersion::V1,
                    dir: "/sys/fs/cgroup/cpu/docker/abc".into(),
                }),
                cpus: vec![0],
                cores_reason: &[
                    "cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us 100000/100000 = 1 CPU → 1 executor",
                    "/sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us",
                ],
                ..base("cgroup v1 quota")
            },
            Case {
                affinity: vec![0, 1],
                quota: quota(400_000, 100_000),
                cpus: vec![0, 1],
                cores_reason: &["= 4 CPUs, not fewer than the 2 allowed CPUs → 2 executors"],
                pin_reason: &["pinning off: CPUs 0-1 of online 0-7 but the cgroup cpu.max 400000/100000 is 4 CPUs, not 2"],
                ..base("quota above the affinity: the affinity decides")
            },
            Case {
                affinity: vec![4, 5],
                cpuset: Some(vec![4, 5]),
                quota: quota(200_000, 100_000),
                cpus: vec![4, 5],
                pin: true,
                cores_reason: &["= 2 CPUs, not fewer than the 2 allowed CPUs → 2 executors (affinity 4-5"],
                pin_reason: &["pinning on: CPUs 4-5 of online 0-7", "exactly 2 CPUs look exclusive"],
                ..base("static CPU manager: exclusive CPUs, quota to match → pinned")
            },
            Case {
                cpuset: Some(vec![2, 3]),
                quota: quota(200_000, 100_000),
                cpus: vec![2, 3],
                pin: true,
                cores_reason: &["affinity 0-7 ∩ cpuset 2-3 = 2-3"],
                pin_reason: &["CPUs 2-3 of online 0-7"],
                ..base("the cpuset narrows a wider mask")
            },
            Case {
                cpuset: Some(vec![9]),
                cores_reason: &["cpuset 9 shares none of it, ignored"],
                pin_reason: &["all online CPUs"],
                ..base("a cpuset disjoint from the mask is not the one in force")
            },
            Case {
                affinity: vec![2, 3, 4, 5, 6, 7],
                cpus: vec![2, 3, 4, 5, 6, 7],
                pin_reason: &["CPUs 2-7 of online 0-7 but no cgroup CPU quota"],
                ..base("shared pool without a quota (BestEffort): unpinned")
            },
            Case {
                affinity: vec![2, 3, 4, 5, 6, 7],
                quota: quota(250_000, 100_000),
                cpus: vec![2, 3, 4],
                pin_reason: &["is 2.5 CPUs, not 6"],
                ..base("shared pool with a fractional limit (Burstable): unpinned")
            },
            Case {
                affinity: vec![2, 3],
                quota: quota(300_000, 100_000),
                cpus: vec![2, 3],
                pin_reason: &["is 3 CPUs, not 2"],
                ..base("whole quota that is not the mask's size: unpinned")
            },
            Case {
                affinity: vec![4, 5],
                quota: quota(200_000, 100_000),
                cpus: vec![4, 5],
                mode: PinMode::Off,
                pin_reason: &["pinning off: --no-pin"],
                ..base("--no-pin wins over exclusive CPUs")
            },
            Case {
                mode: PinMode::On,
                pin: true,
                pin_reason: &["pinning on: --pin"],
                ..base("--pin wins over shared CPUs")
            },
            Case {
                affinity: vec![4, 5],
                quota: quota(200_000, 100_000),
                spec: Some("5-5"),
                cpus: vec![5],
                pin: true,
                cores_reason: &["--cores 5-5 → CPUs 5"],
                ..base("a --cores list on exclusive CPUs: the same pinning rule")
            },
            Case {
                spec: Some("3-3"),
                cpus: vec![3],
                cores_reason: &["--cores 3-3 → CPUs 3"],
                pin_reason: &["all online CPUs"],
                ..base("a --cores list on shared CPUs implies no pinning")
            },
            Case {
                quota: quota(100_000, 100_000),
                spec: Some("4"),
                cpus: vec![0, 1, 2, 3],
                cores_reason: &["--cores 4 → CPUs 0-3, the first 4 of affinity 0-7"],
                warns: true,
                ..base("--cores above the quota: obeyed, with a warning")
            },
            Case {
                affinity: vec![0, 1, 2, 3],
                online: None,
                quota: quota(400_000, 100_000),
                cpus: vec![0, 1, 2, 3],
                pin_reason: &["online CPUs are unknown"],
                ..base("online CPUs unknown: unpinned")
            },
        ];
        for c in cases {
            let facts = CpuFacts {
                affinity: c.affinity,
                online: c.online,
                cpuset: c.cpuset,
                quota: c.quota,
            };
            let plan = plan_cores(c.spec, &facts, c.mode).unwrap();
            assert_eq!(plan.cpus, c.cpus, "{}: {plan:?}", c.name);
            assert_eq!(plan.pin, c.pin, "{}: {plan:?}", c.name);
            for want in c.cores_reason {
                assert!(
                    plan.cores_reason.contains(want),
                    "{}: {want:?} not in {:?}",
                    c.name,
                    plan.cores_reason
                );
            }
            for want in c.pin_reason {
                assert!(
                    plan.pin_reason.contains(want),
                    "{}: {want:?} not in {:?}",
                    c.name,
                    plan.pin_reason
                );
            }
            assert_eq!(plan.warning.is_some(), c.warns, "{}: {plan:?}", c.name);
            if let Some(w) = &plan.warning {
                assert!(w.contains("--cores 1 avoids it"), "{}: {w}", c.name);
            }
        }
    }
}
