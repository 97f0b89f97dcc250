//! What a container limits this process's CPUs to, besides its affinity
//! mask: the cgroup CPU quota (CFS bandwidth: cgroup v2 `cpu.max`, v1
//! `cpu.cfs_quota_us` / `cpu.cfs_period_us`), the cgroup cpuset, and the
//! CPUs the machine has online. [`crate::app::plan::plan_cores`] turns them
//! into an executor count and a pinning decision.
//!
//! Parsing and reading are apart so both can be tested: the parsers on
//! sample file contents, the reader on a fake tree. Every absolute path
//! (`/proc/self/cgroup`, mount points from `/proc/self/mountinfo`, ...) is
//! read under a `root`, which is `/` outside tests; paths in messages are
//! the absolute ones.
//!
//! Where the files are: `/proc/self/cgroup` names this process's cgroup
//! per hierarchy ("0::<path>" for v2, "<n>:<controllers>:<path>" for v1);
//! `/proc/self/mountinfo` says where each hierarchy is mounted and which
//! part of it the mount shows (its root: a container without a cgroup
//! namespace may see only its own subtree, mounted at /sys/fs/cgroup).
//! A quota set on any ancestor applies too (the kernel throttles a cgroup
//! when any cgroup above it runs out), so every directory from ours up to
//! the mount point is read and the tightest quota wins. In a container
//! with a cgroup namespace our path is "/", and that directory is the
//! container's own cgroup: its `cpu.max` is read directly.
//! Missing or unreadable files mean "no limit known there"; a host that
//! has both hierarchies (hybrid) is read in both.

use std::fmt;
use std::path::{Component, Path, PathBuf};

/// A CFS bandwidth limit: the cgroup's threads together may run
/// `quota_us` of CPU time per `period_us`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuQuota {
    pub quota_us: u64,
    pub period_us: u64,
    pub version: CgroupVersion,
    /// The directory whose file set it (absolute).
    pub dir: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

impl CpuQuota {
    /// How many CPUs' worth of time it pays for (1.5 for 150000/100000).
    pub fn cpus(&self) -> f64 {
        self.quota_us as f64 / self.period_us as f64
    }

    /// Whole CPUs, rounded up, at least one: the executor count that can
    /// use the whole quota (see [`crate::app::plan::plan_cores`]).
    pub fn cpus_rounded_up(&self) -> usize {
        usize::try_from(self.quota_us.div_ceil(self.period_us))
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// The quota is exactly `n` whole CPUs.
    pub fn is_exactly(&self, n: usize) -> bool {
        (n as u64).checked_mul(self.period_us) == Some(self.quota_us)
    }

    /// A smaller share of CPU than `other` (compared as fractions).
    fn tighter_than(&self, other: &CpuQuota) -> bool {
        u128::from(self.quota_us) * u128::from(other.period_us)
            < u128::from(other.quota_us) * u128::from(self.period_us)
    }

    /// The file it came from, for messages.
    pub fn file(&self) -> PathBuf {
        match self.version {
            CgroupVersion::V2 => self.dir.join("cpu.max"),
            CgroupVersion::V1 => self.dir.join("cpu.cfs_quota_us"),
        }
    }
}

impl fmt::Display for CpuQuota {
    /// "cgroup cpu.max 200000/100000" or
    /// "cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us 200000/100000".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.version {
            CgroupVersion::V2 => "cgroup cpu.max",
            CgroupVersion::V1 => "cgroup v1 cpu.cfs_quota_us/cpu.cfs_period_us",
        };
        write!(f, "{name} {}/{}", self.quota_us, self.period_us)
    }
}

/// An amount of CPU for people: "1 CPU", "1.5 CPUs", "0.25 CPUs".
pub fn format_cpu_amount(cpus: f64) -> String {
    let s = format!("{cpus:.2}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "1" {
        "1 CPU".to_owned()
    } else {
        format!("{s} CPUs")
    }
}

/// "1 executor", "2 executors".
pub fn plural(n: usize, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// What the cgroups say about this process's CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupCpu {
    /// The tightest CPU quota on the way from our cgroup to the root of
    /// the mounted hierarchy; None when there is none (or it is unknown).
    pub quota: Option<CpuQuota>,
    /// The cpuset's effective CPUs (the kernel already keeps the affinity
    /// mask inside it; read anyway, so a stale or odd mask cannot win).
    pub cpuset: Option<Vec<usize>>,
}

/// Reads the cgroup CPU limits of this process (`root` is `/` outside
/// tests).
pub fn read_cgroup_cpu(root: &Path) -> CgroupCpu {
    let Some(own) = read(root, Path::new("/proc/self/cgroup")) else {
        return CgroupCpu::default();
    };
    let own = parse_proc_cgroup(&own);
    let mounts = match read(root, Path::new("/proc/self/mountinfo")) {
        Some(text) => parse_mountinfo(&text),
        // No mountinfo (an odd /proc): assume the usual v2 mount.
        None => vec![CgroupMount {
            root: "/".into(),
            mount_point: "/sys/fs/cgroup".into(),
            v2: true,
            options: Vec::new(),
        }],
    };

    let mut quotas = Vec::new();
    let mut cpuset = None;
    if let (Some(path), Some(mount)) = (&own.v2, mounts.iter().find(|m| m.v2)) {
        for dir in walk_up(mount, path) {
            if let Some(text) = read(root, &dir.join("cpu.max")) {
                match parse_cpu_max(&text) {
                    Ok(Some((quota_us, period_us))) => quotas.push(CpuQuota {
                        quota_us,
                        period_us,
                        version: CgroupVersion::V2,
                        dir: dir.clone(),
                    }),
                    Ok(None) => {}
                    Err(e) => tracing::debug!(dir = %dir.display(), "cpu.max: {e}"),
                }
            }
            if cpuset.is_none() {
                cpuset = read_cpuset(root, &dir, &["cpuset.cpus.effective"]);
            }
        }
    }
    for (controllers, path) in &own.v1 {
        let has = |c: &str| controllers.iter().any(|x| x == c);
        let mount_for = |c: &str| {
            mounts
                .iter()
                .find(|m| !m.v2 && m.options.iter().any(|o| o == c))
        };
        if has("cpu") {
            if let Some(mount) = mount_for("cpu") {
                for dir in walk_up(mount, path) {
                    let quota = read(root, &dir.join("cpu.cfs_quota_us"));
                    let period = read(root, &dir.join("cpu.cfs_period_us"));
                    if let (Some(q), Some(p)) = (quota, period) {
                        match parse_cfs(&q, &p) {
                            Ok(Some((quota_us, period_us))) => quotas.push(CpuQuota {
                                quota_us,
                                period_us,
                                version: CgroupVersion::V1,
                                dir: dir.clone(),
                            }),
                            Ok(None) => {}
                            Err(e) => tracing::debug!(dir = %dir.display(), "cfs quota: {e}"),
                        }
                    }
                }
            }
        }
        if has("cpuset") && cpuset.is_none() {
            if let Some(mount) = mount_for("cpuset") {
                for dir in walk_up(mount, path) {
                    cpuset = read_cpuset(root, &dir, &["cpuset.effective_cpus", "cpuset.cpus"]);
                    if cpuset.is_some() {
                        break;
                    }
                }
            }
        }
    }
    let quota = quotas
        .into_iter()
        .reduce(|a, b| if b.tighter_than(&a) { b } else { a });
    CgroupCpu { quota, cpuset }
}

/// The CPUs the machine has online (`/sys/devices/system/cpu/online`).
pub fn read_online_cpus(root: &Path) -> Option<Vec<usize>> {
    let text = read(root, Path::new("/sys/devices/system/cpu/online"))?;
    parse_cpu_list(&text).ok().filter(|l| !l.is_empty())
}

/// The first of `names` in `dir` that holds a non-empty CPU list.
fn read_cpuset(root: &Path, dir: &Path, names: &[&str]) -> Option<Vec<usize>> {
    names.iter().find_map(|name| {
        let text = read(root, &dir.join(name))?;
        parse_cpu_list(&text).ok().filter(|l| !l.is_empty())
    })
}

/// Reads the absolute `path` under `root`.
fn read(root: &Path, path: &Path) -> Option<String> {
    let relative = path.strip_prefix("/").unwrap_or(path);
    std::fs::read_to_string(root.join(relative)).ok()
}

/// Our cgroups as `/proc/self/cgroup` lists them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcCgroup {
    /// The v2 path ("0::<path>").
    pub v2: Option<String>,
    /// v1 hierarchies: (controllers, path), e.g. (["cpu", "cpuacct"], "/a").
    pub v1: Vec<(Vec<String>, String)>,
}

pub fn parse_proc_cgroup(text: &str) -> ProcCgroup {
    let mut out = ProcCgroup::default();
    for line in text.lines() {
        // The path may itself contain ':'; only the first two separate.
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            out.v2 = Some(path.to_owned());
        } else {
            out.v1.push((
                controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_owned)
                    .collect(),
                path.to_owned(),
            ));
        }
    }
    out
}

/// A cgroup filesystem mount from `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupMount {
    /// Which cgroup of the hierarchy the mount shows.
    pub root: String,
    pub mount_point: PathBuf,
    pub v2: bool,
    /// Super options: for v1, the controllers ("rw,cpu,cpuacct").
    pub options: Vec<String>,
}

/// The cgroup mounts in a mountinfo text, in order. A line is
/// "id parent major:minor root mount-point options [optional...] - fstype
/// source super-options" (proc(5)).
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.is_empty() {
            continue;
        }
        let v2 = match right[0] {
            "cgroup2" => true,
            "cgroup" => false,
            _ => continue,
        };
        mounts.push(CgroupMount {
            root: unescape_mountinfo(left[3]),
            mount_point: PathBuf::from(unescape_mountinfo(left[4])),
            v2,
            options: right
                .get(2)
                .map(|o| o.split(',').map(str::to_owned).collect())
                .unwrap_or_default(),
        });
    }
    mounts
}

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| {
            bytes[i] == b'\\' && d[0] <= b'3' && d.iter().all(|c| (b'0'..=b'7').contains(c))
        });
        if let Some(d) = octal {
            out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The directories from our cgroup (`path`, as /proc/self/cgroup names it)
/// up to the mount point. A path outside what the mount shows (another
/// namespace's view, "/.." entries) reads the mount point alone: that is
/// the closest cgroup the mount shows of ours.
fn walk_up(mount: &CgroupMount, path: &str) -> Vec<PathBuf> {
    let leaf = match Path::new(path).strip_prefix(&mount.root) {
        Ok(rest)
            if rest.components().next().is_some()
                && rest.components().all(|c| matches!(c, Component::Normal(_))) =>
        {
            mount.mount_point.join(rest)
        }
        _ => mount.mount_point.clone(),
    };
    leaf.ancestors()
        .take_while(|d| d.starts_with(&mount.mount_point))
        .map(Path::to_path_buf)
        .collect()
}

/// cgroup v2 `cpu.max`: "max 100000" (no limit) or "200000 100000"; the
/// period may be left out (the kernel's default, 100000).
pub fn parse_cpu_max(text: &str) -> Result<Option<(u64, u64)>, String> {
    let mut words = text.split_whitespace();
    let quota = words.next().ok_or("empty")?;
    let period = match words.next() {
        Some(p) => p.parse::<u64>().map_err(|_| format!("bad period {p:?}"))?,
        None => 100_000,
    };
    if words.next().is_some() {
        return Err(format!("unexpected {text:?}"));
    }
    if period == 0 {
        return Err("period 0".into());
    }
    if quota == "max" {
        return Ok(None);
    }
    let quota = quota
        .parse::<u64>()
        .map_err(|_| format!("bad quota {quota:?}"))?;
    if quota == 0 {
        return Err("quota 0".into());
    }
    Ok(Some((quota, period)))
}

/// cgroup v1 `cpu.cfs_quota_us` ("-1": no limit) and `cpu.cfs_period_us`.
pub fn parse_cfs(quota: &str, period: &str) -> Result<Option<(u64, u64)>, String> {
    let quota: i64 = quota
        .trim()
        .parse()
        .map_err(|_| format!("bad cpu.cfs_quota_us {quota:?}"))?;
    let period: u64 = period
        .trim()
        .parse()
        .map_err(|_| format!("bad cpu.cfs_period_us {period:?}"))?;
    if quota < 0 {
        return Ok(None);
    }
    if quota == 0 || period == 0 {
        return Err(format!("quota {quota} period {period}"));
    }
    Ok(Some((quota as u64, period)))
}

/// The kernel's CPU list format: "0-3,6", "" (none), with a newline.
pub fn parse_cpu_list(text: &str) -> Result<Vec<usize>, String> {
    /// Far above any machine's CPU count; stops a garbled range from
    /// allocating without bound.
    const MAX_CPU: usize = 1 << 16;
    let mut cpus = Vec::new();
    for part in text.trim().split(',').map(str::trim) {
        if part.is_empty() {
            continue;
        }
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let parse = |s: &str| {
            s.parse::<usize>()
                .ok()
                .filter(|&c| c < MAX_CPU)
                .ok_or_else(|| format!("bad CPU list {text:?}"))
        };
        let (lo, hi) = (parse(lo)?, parse(hi)?);
        if lo > hi {
            return Err(format!("bad CPU list {text:?}"));
        }
        cpus.extend(lo..=hi);
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// A CPU list in the kernel's format ("0-3,6"), keeping the given order.
pub fn format_cpu_list(cpus: &[usize]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j == i {
            out.push_str(&cpus[i].to_string());
        } else {
            out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        }
        i = j + 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parser's answer, errors reduced to "some error".
    type Parsed = Result<Option<(u64, u64)>, ()>;

    #[test]
    fn cpu_max() {
        let cases: &[(&str, Parsed)] = &[
            ("max 100000\n", Ok(None)),
            ("max\n", Ok(None)),
            ("200000 100000\n", Ok(Some((200_000, 100_000)))),
            ("150000 100000", Ok(Some((150_000, 100_000)))),
            ("50000 200000\n", Ok(Some((50_000, 200_000)))),
            ("300000\n", Ok(Some((300_000, 100_000)))),
            ("", Err(())),
            ("lots 100000", Err(())),
            ("100000 0", Err(())),
            ("0 100000", Err(())),
            ("1 2 3", Err(())),
        ];
        for (text, want) in cases {
            assert_eq!(parse_cpu_max(text).map_err(|_| ()), *want, "{text:?}");
        }
    }

    #[test]
    fn cfs_quota_v1() {
        let cases: &[(&str, &str, Parsed)] = &[
            ("-1\n", "100000\n", Ok(None)),
            ("100000\n", "100000\n", Ok(Some((100_000, 100_000)))),
            ("150000\n", "100000\n", Ok(Some((150_000, 100_000)))),
            ("25000", "50000", Ok(Some((25_000, 50_000)))),
            ("x", "100000", Err(())),
            ("100000", "", Err(())),
            ("100000", "0", Err(())),
        ];
        for (q, p, want) in cases {
            assert_eq!(parse_cfs(q, p).map_err(|_| ()), *want, "{q:?} {p:?}");
        }
    }

    #[test]
    fn cpu_lists() {
        let cases: &[(&str, Result<Vec<usize>, ()>)] = &[
            ("0-7\n", Ok((0..8).collect())),
            ("0\n", Ok(vec![0])),
            ("0-1,4,6-7\n", Ok(vec![0, 1, 4, 6, 7])),
            ("3,1-2", Ok(vec![1, 2, 3])),
            ("\n", Ok(vec![])),
            ("2-1", Err(())),
            ("a-b", Err(())),
            ("0-99999999", Err(())),
        ];
        for (text, want) in cases {
            assert_eq!(parse_cpu_list(text).map_err(|_| ()), *want, "{text:?}");
        }
        assert_eq!(format_cpu_list(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(format_cpu_list(&[1, 2, 0]), "1-2,0");
        assert_eq!(format_cpu_list(&[5]), "5");
        assert_eq!(format_cpu_list(&[]), "");
    }

    #[test]
    fn quota_arithmetic() {
        let q = |quota_us, period_us| CpuQuota {
            quota_us,
            period_us,
            version: CgroupVersion::V2,
            dir: "/sys/fs/cgroup".into(),
        };
        assert_eq!(q(150_000, 100_000).cpus_rounded_up(), 2);
        assert_eq!(q(200_000, 100_000).cpus_rounded_up(), 2);
        assert_eq!(q(10_000, 100_000).cpus_rounded_up(), 1);
        assert!(q(200_000, 100_000).is_exactly(2));
        assert!(!q(150_000, 100_000).is_exactly(1));
        assert!(q(50_000, 100_000).tighter_than(&q(100_000, 100_000)));
        assert!(!q(100_000, 50_000).tighter_than(&q(150_000, 100_000)));
        assert_eq!(format_cpu_amount(1.5), "1.5 CPUs");
        assert_eq!(format_cpu_amount(1.0), "1 CPU");
        assert_eq!(format_cpu_amount(2.0), "2 CPUs");
        assert_eq!(format_cpu_amount(0.25), "0.25 CPUs");
        assert_eq!(plural(1, "executor"), "1 executor");
        assert_eq!(plural(3, "executor"), "3 executors");
        assert_eq!(
            q(150_000, 100_000).to_string(),
            "cgroup cpu.max 150000/100000"
        );
    }

    #[test]
    fn proc_self_cgroup() {
        let v2 = parse_proc_cgroup("0::/kubepods.slice/pod1/ctr\n");
        assert_eq!(v2.v2.as_deref(), Some("/kubepods.slice/pod1/ctr"));
        assert!(v2.v1.is_empty());

        let hybrid =
            parse_proc_cgroup("9:name=systemd:/\n4:memory:/a:b\n3:cpu,cpuacct:/docker/abc\n0::/\n");
        assert_eq!(hybrid.v2.as_deref(), Some("/"));
        assert_eq!(
            hybrid.v1,
            vec![
                (vec!["name=systemd".to_owned()], "/".to_owned()),
                (vec!["memory".to_owned()], "/a:b".to_owned()),
                (
                    vec!["cpu".to_owned(), "cpuacct".to_owned()],
                    "/docker/abc".to_owned()
                ),
            ]
        );
    }

    #[test]
    fn mountinfo_finds_cgroup_mounts() {
        let text = "\
22 28 0:21 / /proc rw,nosuid - proc proc rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
32 31 0:29 /docker/abc /sys/fs/cgroup/cpu,cpuacct rw,relatime master:5 - cgroup cgroup rw,cpu,cpuacct
33 31 0:30 / /mnt/with\\040space rw - cgroup cgroup rw,cpuset
";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(m[0].v2);
        assert_eq!(m[0].mount_point, PathBuf::from("/sys/fs/cgroup"));
        assert!(!m[1].v2);
        assert_eq!(m[1].root, "/docker/abc");
        assert_eq!(m[1].options, ["rw", "cpu", "cpuacct"]);
        assert_eq!(m[2].mount_point, PathBuf::from("/mnt/with space"));
    }

    #[test]
    fn walk_up_stops_at_the_mount() {
        let mount = |root: &str, at: &str| CgroupMount {
            root: root.into(),
            mount_point: at.into(),
            v2: true,
            options: vec![],
        };
        let dirs = |v: Vec<PathBuf>| {
            v.into_iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            dirs(walk_up(&mount("/", "/sys/fs/cgroup"), "/a/b")),
            ["/sys/fs/cgroup/a/b", "/sys/fs/cgroup/a", "/sys/fs/cgroup"]
        );
        // Cgroup namespace: our cgroup is the namespace's root.
        assert_eq!(
            dirs(walk_up(&mount("/", "/sys/fs/cgroup"), "/")),
            ["/sys/fs/cgroup"]
        );
        // The mount shows only our container's subtree.
        assert_eq!(
            dirs(walk_up(
                &mount("/docker/abc", "/sys/fs/cgroup"),
                "/docker/abc/x"
            )),
            ["/sys/fs/cgroup/x", "/sys/fs/cgroup"]
        );
        // A path the mount does not show.
        assert_eq!(
            dirs(walk_up(&mount("/docker/abc", "/sys/fs/cgroup"), "/other")),
            ["/sys/fs/cgroup"]
        );
        assert_eq!(
            dirs(walk_up(&mount("/", "/sys/fs/cgroup"), "/../..")),
            ["/sys/fs/cgroup"]
        );
    }

    /// A fake root: `files` are (absolute path, contents).
    fn fake_root(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path.trim_start_matches('/'));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    const V2_MOUNTINFO: &str =
        "30 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n";

    #[test]
    fn reads_v2_in_a_container_namespace() {
        // Inside a cgroup namespace: path "/", cpu.max at the mount point.
        let root = fake_root(&[
            ("/proc/self/cgroup", "0::/\n"),
            ("/proc/self/mountinfo", V2_MOUNTINFO),
            ("/sys/fs/cgroup/cpu.max", "200000 100000\n"),
            ("/sys/fs/cgroup/cpuset.cpus.effective", "2-3\n"),
            ("/sys/devices/system/cpu/online", "0-7\n"),
        ]);
        let cg = read_cgroup_cpu(root.path());
        let q = cg.quota.unwrap();
        assert_eq!((q.quota_us, q.period_us), (200_000, 100_000));
        assert_eq!(q.dir, PathBuf::from("/sys/fs/cgroup"));
        assert_eq!(q.file(), PathBuf::from("/sys/fs/cgroup/cpu.max"));
        assert_eq!(cg.cpuset, Some(vec![2, 3]));
        assert_eq!(read_online_cpus(root.path()), Some((0..8).collect()));
    }

    #[test]
    fn reads_v2_nested_taking_the_tightest_ancestor() {
        // The pod's limit (1.5) is tighter than the container's own (max)
        // and than the slice above (4).
        let root = fake_root(&[
            ("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n"),
            ("/proc/self/mountinfo", V2_MOUNTINFO),
            ("/sys/fs/cgroup/cpu.max", "max 100000\n"),
            ("/sys/fs/cgroup/kubepods/cpu.max", "400000 100000\n"),
            ("/sys/fs/cgroup/kubepods/pod1/cpu.max", "150000 100000\n"),
            ("/sys/fs/cgroup/kubepods/pod1/ctr/cpu.max", "max 100000\n"),
            ("/sys/fs/cgroup/kubepods/cpuset.cpus.effective", "0-3\n"),
        ]);
        let cg = read_cgroup_cpu(root.path());
        let q = cg.quota.unwrap();
        assert_eq!((q.quota_us, q.period_us), (150_000, 100_000));
        assert_eq!(q.dir, PathBuf::from("/sys/fs/cgroup/kubepods/pod1"));
        // The nearest cpuset with the controller on.
        assert_eq!(cg.cpuset, Some(vec![0, 1, 2, 3]));
    }

    #[test]
    fn reads_v1_and_hybrid() {
        let root = fake_root(&[
            (
                "/proc/self/cgroup",
                "4:memory:/x\n3:cpuset:/docker/abc\n1:cpu,cpuacct:/docker/abc\n0::/\n",
            ),
            (
                "/proc/self/mountinfo",
                "\
41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
",
            ),
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n"),
            (
                "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us",
                "50000\n",
            ),
            (
                "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us",
                "100000\n",
            ),
            (
                "/sys/fs/cgroup/cpuset/docker/abc/cpuset.effective_cpus",
                "1\n",
            ),
            ("/sys/fs/cgroup/cpuset/docker/abc/cpuset.cpus", "0-1\n"),
        ]);
        let cg = read_cgroup_cpu(root.path());
        let q = cg.quota.unwrap();
        assert_eq!(
            (q.quota_us, q.period_us, q.version),
            (50_000, 100_000, CgroupVersion::V1)
        );
        assert_eq!(
            q.file(),
            PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us")
        );
        assert_eq!(cg.cpuset, Some(vec![1]));
    }

    #[test]
    fn v1_unlimited_and_missing_files_mean_no_limit() {
        let v1 = fake_root(&[
            ("/proc/self/cgroup", "1:cpu:/\n"),
            (
                "/proc/self/mountinfo",
                "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n",
            ),
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        assert_eq!(read_cgroup_cpu(v1.path()), CgroupCpu::default());

        // v2 root cgroup: no cpu.max there at all.
        let v2_root = fake_root(&[
            ("/proc/self/cgroup", "0::/\n"),
            ("/proc/self/mountinfo", V2_MOUNTINFO),
        ]);
        assert_eq!(read_cgroup_cpu(v2_root.path()), CgroupCpu::default());

        // Nothing readable at all.
        let empty = fake_root(&[]);
        assert_eq!(read_cgroup_cpu(empty.path()), CgroupCpu::default());
        assert_eq!(read_online_cpus(empty.path()), None);

        // No mountinfo: the usual /sys/fs/cgroup is assumed.
        let no_mountinfo = fake_root(&[
            ("/proc/self/cgroup", "0::/\n"),
            ("/sys/fs/cgroup/cpu.max", "100000 100000\n"),
        ]);
        let q = read_cgroup_cpu(no_mountinfo.path()).quota.unwrap();
        assert_eq!((q.quota_us, q.period_us), (100_000, 100_000));

        // A garbled file is no limit, not a failure.
        let garbled = fake_root(&[
            ("/proc/self/cgroup", "0::/\n"),
            ("/proc/self/mountinfo", V2_MOUNTINFO),
            ("/sys/fs/cgroup/cpu.max", "lots\n"),
        ]);
        assert_eq!(read_cgroup_cpu(garbled.path()).quota, None);
    }
}
