//! Executors and pinning from a real cgroup: ringway started inside a
//! cgroup with a CPU quota (and a cpuset) must size itself to them, say why
//! in its log and in /config_dump, and pin only on CPUs that look
//! exclusive.
//!
//! Uses whichever hierarchy holds the controller on this machine: cgroup
//! v2 (`cpu.max`, `cpuset.cpus`, where the parent's
//! `cgroup.subtree_control` has it) or v1 (`cpu.cfs_quota_us` under the cpu
//! mount, `cpuset.cpus` under the cpuset mount). ringway is moved in
//! between fork and exec, so it never runs outside. Needs root, and at
//! least two CPUs for a limit to show. Every cgroup a test makes is
//! removed when the test ends, also when it fails.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use ringway_dataplane::app::cgroup::{parse_cpu_list, parse_mountinfo, parse_proc_cgroup};

/// Every listener on a free loopback port.
fn any_port() -> Vec<&'static str> {
    [
        &common::LOOPBACK_TRAFFIC[..],
        &["--admin-addr", "127.0.0.1:0"],
    ]
    .concat()
}

/// Where a test may make a cgroup with `controller` on: the parent
/// directory, and whether it is cgroup v2.
fn cgroup_parent(controller: &str) -> (PathBuf, bool) {
    common::require_root();
    let mounts = parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap());
    let own = parse_proc_cgroup(&std::fs::read_to_string("/proc/self/cgroup").unwrap());
    let under =
        |mount_point: &Path, root: &str, path: &str| match Path::new(path).strip_prefix(root) {
            Ok(rest) if rest.as_os_str().is_empty() => mount_point.to_path_buf(),
            Ok(rest) => mount_point.join(rest),
            Err(_) => mount_point.to_path_buf(),
        };
    // v1: the controller has a hierarchy of its own; any cgroup in it has it.
    if let Some(m) = mounts
        .iter()
        .find(|m| !m.v2 && m.options.iter().any(|o| o == controller))
    {
        let path = own
            .v1
            .iter()
            .find(|(cs, _)| cs.iter().any(|c| c == controller))
            .map(|(_, p)| p.as_str())
            .unwrap_or("/");
        return (under(&m.mount_point, &m.root, path), false);
    }
    // v2: our own cgroup or the hierarchy's root, whichever hands the
    // controller down to its children. Enabling it ourselves would change
    // how this machine shares CPU, so the test does not.
    let m = mounts.iter().find(|m| m.v2).unwrap_or_else(|| {
        panic!("no cgroup hierarchy with the {controller} controller is mounted here")
    });
    let mut candidates = vec![m.mount_point.clone()];
    if let Some(path) = &own.v2 {
        candidates.insert(0, under(&m.mount_point, &m.root, path));
    }
    for dir in candidates {
        let enabled =
            std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
        if enabled.split_whitespace().any(|c| c == controller) {
            return (dir, true);
        }
    }
    panic!(
        "cgroup v2 at {} does not hand the {controller} controller down (not in \
         cgroup.subtree_control of this process's cgroup or the root); enable it \
         (echo +{controller} > .../cgroup.subtree_control) to run this test",
        m.mount_point.display()
    );
}

/// The cgroups one test makes, removed on drop: ringway's processes still
/// in them are killed (they are this test's), then the directories are
/// removed, innermost first.
#[derive(Default)]
struct TestCgroups {
    made: Vec<PathBuf>,
    /// The `cgroup.procs` files ringway joins.
    join: Vec<PathBuf>,
}

impl TestCgroups {
    fn make(&mut self, parent: &Path, name: &str) -> PathBuf {
        let dir = parent.join(name);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot make the cgroup {}: {e}", dir.display()));
        self.made.push(dir.clone());
        dir
    }

    fn set(&self, dir: &Path, file: &str, value: &str) {
        std::fs::write(dir.join(file), value)
            .unwrap_or_else(|e| panic!("cannot write {value:?} to {}/{file}: {e}", dir.display()));
    }

    /// ringway will run in `dir`.
    fn join(&mut self, dir: &Path) {
        self.join.push(dir.join("cgroup.procs"));
    }

    /// Moves the child into the cgroups between fork and exec.
    fn apply(&self, cmd: &mut Command) {
        let files: Vec<CString> = self
            .join
            .iter()
            .map(|p| CString::new(p.as_os_str().as_bytes()).unwrap())
            .collect();
        let enter = move || {
            for f in &files {
                // SAFETY: open, write and close are async-signal-safe and
                // allocate nothing; `f` is a NUL-terminated path. Writing
                // "0" to cgroup.procs moves the writing process itself.
                unsafe {
                    let fd = libc::open(f.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    let n = libc::write(fd, b"0".as_ptr().cast(), 1);
                    let err = std::io::Error::last_os_error();
                    libc::close(fd);
                    if n != 1 {
                        return Err(err);
                    }
                }
            }
            Ok(())
        };
        // SAFETY: the closure runs in the forked child before exec and only
        // makes async-signal-safe calls (see above).
        unsafe { cmd.pre_exec(enter) };
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for dir in self.made.iter().rev() {
            let pids = |d: &Path| -> Vec<i32> {
                std::fs::read_to_string(d.join("cgroup.procs"))
                    .unwrap_or_default()
                    .lines()
                    .filter_map(|l| l.trim().parse().ok())
                    .collect()
            };
            for pid in pids(dir) {
                // SAFETY: plain syscall; the pid is a process this test put
                // in its own cgroup (a ringway the helper did not reap).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) if Instant::now() > deadline => {
                        eprintln!("could not remove the test cgroup {}: {e}", dir.display());
                        break;
                    }
                    Err(_) => {
                        // Dying processes leave on their own; anything else
                        // goes to the parent so the directory can go.
                        if let Some(parent) = dir.parent() {
                            for pid in pids(dir) {
                                let _ =
                                    std::fs::write(parent.join("cgroup.procs"), pid.to_string());
                            }
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            }
        }
    }
}

/// This test process's CPUs; the tests need two to show a limit.
fn own_cpus() -> Vec<usize> {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = text
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list in /proc/self/status");
    let cpus = parse_cpu_list(list).unwrap();
    assert!(
        cpus.len() >= 2,
        "these tests need at least two CPUs to show a limit; this process has {cpus:?}"
    );
    cpus
}

fn cores_planned(rw: &common::Ringway) -> serde_json::Value {
    rw.wait_log("cores planned", |l| l["message"] == "cores planned")
}

fn config_dump(rw: &common::Ringway) -> serde_json::Value {
    let (status, body) = rw.http_get("admin", "/config_dump");
    assert!(status.contains("200"), "{status}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["config"].clone()
}

/// A quota of one CPU set on the parent of ringway's cgroup: one
/// executor, found by walking up, and unpinned (its CPUs are shared).
#[test]
fn a_cgroup_quota_of_one_cpu_gives_one_executor() {
    own_cpus();
    let (parent, v2) = cgroup_parent("cpu");
    let mut cg = TestCgroups::default();
    let outer = cg.make(&parent, &format!("ringway-test-{}-q1", std::process::id()));
    if v2 {
        cg.set(&outer, "cpu.max", "100000 100000");
    } else {
        cg.set(&outer, "cpu.cfs_period_us", "100000");
        cg.set(&outer, "cpu.cfs_quota_us", "100000");
    }
    let leaf = cg.make(&outer, "leaf");
    cg.join(&leaf);
    let rw = common::Ringway::start_with_command(&any_port(), |cmd| cg.apply(cmd));

    assert_eq!(rw.listeners["cores"], 1, "{}", rw.listeners);
    let line = cores_planned(&rw);
    let why = line["cores_reason"].as_str().unwrap();
    assert!(why.contains("100000/100000 = 1 CPU → 1 executor"), "{why}");
    assert!(why.contains(&outer.display().to_string()), "{why}");
    assert_eq!(line["pinned"], false, "{line}");
    assert!(
        line["pin_reason"].as_str().unwrap().contains("pinning off"),
        "{line}"
    );
    let config = config_dump(&rw);
    assert_eq!(config["coresReason"], line["cores_reason"], "{config}");
    assert_eq!(config["pinReason"], line["pin_reason"], "{config}");
    assert_eq!(config["cores"].as_array().unwrap().len(), 1, "{config}");
}

/// 1.5 CPUs: rounded up to two executors.
#[test]
fn a_fractional_cgroup_quota_rounds_up() {
    own_cpus();
    let (parent, v2) = cgroup_parent("cpu");
    let mut cg = TestCgroups::default();
    let dir = cg.make(&parent, &format!("ringway-test-{}-q15", std::process::id()));
    if v2 {
        cg.set(&dir, "cpu.max", "150000 100000");
    } else {
        cg.set(&dir, "cpu.cfs_period_us", "100000");
        cg.set(&dir, "cpu.cfs_quota_us", "150000");
    }
    cg.join(&dir);
    let rw = common::Ringway::start_with_command(&any_port(), |cmd| cg.apply(cmd));

    assert_eq!(rw.listeners["cores"], 2, "{}", rw.listeners);
    let line = cores_planned(&rw);
    let why = line["cores_reason"].as_str().unwrap();
    assert!(why.contains("= 1.5 CPUs, rounded up"), "{why}");
}

/// What Kubernetes' static CPU manager gives a Guaranteed pod with one
/// whole CPU: a cpuset of one CPU and a quota of exactly one. ringway runs
/// one executor on that CPU, pinned.
#[test]
fn an_exclusive_cpuset_with_a_matching_quota_is_pinned() {
    let cpus = own_cpus();
    let cpu = *cpus.last().unwrap();
    let name = format!("ringway-test-{}-excl", std::process::id());
    let (cpu_parent, v2) = cgroup_parent("cpu");
    let mut cg = TestCgroups::default();
    if v2 {
        let (cpuset_parent, _) = cgroup_parent("cpuset");
        assert_eq!(
            cpuset_parent, cpu_parent,
            "cpu and cpuset are handed down by different cgroups"
        );
        let dir = cg.make(&cpu_parent, &name);
        cg.set(&dir, "cpu.max", "100000 100000");
        cg.set(&dir, "cpuset.cpus", &cpu.to_string());
        cg.join(&dir);
    } else {
        let dir = cg.make(&cpu_parent, &name);
        cg.set(&dir, "cpu.cfs_period_us", "100000");
        cg.set(&dir, "cpu.cfs_quota_us", "100000");
        cg.join(&dir);
        let (cpuset_parent, _) = cgroup_parent("cpuset");
        let set = cg.make(&cpuset_parent, &name);
        // v1 takes no task into a cpuset without memory nodes.
        let mems = std::fs::read_to_string(cpuset_parent.join("cpuset.mems")).unwrap();
        cg.set(&set, "cpuset.mems", mems.trim());
        cg.set(&set, "cpuset.cpus", &cpu.to_string());
        cg.join(&set);
    }
    let rw = common::Ringway::start_with_command(&any_port(), |cmd| cg.apply(cmd));

    assert_eq!(rw.listeners["cores"], 1, "{}", rw.listeners);
    let line = cores_planned(&rw);
    assert_eq!(line["cores"], cpu.to_string(), "{line}");
    assert_eq!(line["pinned"], true, "{line}");
    let why = line["pin_reason"].as_str().unwrap();
    assert!(why.contains("look exclusive"), "{why}");
    let config = config_dump(&rw);
    assert_eq!(config["pinned"], true, "{config}");
    assert_eq!(config["cores"], serde_json::json!([cpu]), "{config}");
}
