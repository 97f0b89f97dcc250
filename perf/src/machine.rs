//! What the numbers were measured on: machine, kernel, and which ringway.

use std::path::Path;
use std::process::Command;
use std::time::SystemTime;

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub started_utc: String,
    pub hostname: String,
    pub nproc: usize,
    pub cpu_model: String,
    pub mem_total_gib: f64,
    pub kernel: String,
    pub os: String,
    pub ringway_perf_version: String,
    pub ringway: Option<RingwayBuild>,
}

#[derive(Clone, Debug, Serialize)]
pub struct RingwayBuild {
    pub path: String,
    /// `ringway --version`.
    pub version: String,
    /// HEAD of the git checkout the binary was built in (best effort).
    pub commit: Option<String>,
    /// Uncommitted changes in tracked files at measurement time.
    pub dirty: Option<bool>,
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn run(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn describe(ringway: Option<&Path>) -> Machine {
    let cpuinfo = read("/proc/cpuinfo");
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let mem_total_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / (1024.0 * 1024.0))
        .unwrap_or(0.0);
    let os = read("/etc/os-release")
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim_matches('"').to_string())
        .unwrap_or_default();
    Machine {
        started_utc: utc_now(),
        hostname: read("/proc/sys/kernel/hostname").trim().to_string(),
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model,
        mem_total_gib: (mem_total_gib * 10.0).round() / 10.0,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        os,
        ringway_perf_version: env!("CARGO_PKG_VERSION").to_string(),
        ringway: ringway.map(ringway_build),
    }
}

/// HEAD of the git checkout at `dir`, and whether tracked files have
/// uncommitted changes (best effort).
pub fn checkout(dir: &Path) -> (Option<String>, Option<bool>) {
    let git = |args: &[&str]| run(Command::new("git").arg("-C").arg(dir).args(args));
    let commit = git(&["rev-parse", "HEAD"]);
    let dirty = commit.as_ref().and_then(|_| {
        git(&["status", "--porcelain", "--untracked-files=no"]).map(|s| !s.is_empty())
    });
    (commit, dirty)
}

fn ringway_build(bin: &Path) -> RingwayBuild {
    // A binary under $CARGO_TARGET_DIR outside the checkout: the checkout
    // we run from (scripts/bench.sh builds and runs from the repository).
    let (commit, dirty) = match checkout(bin.parent().unwrap_or(Path::new("."))) {
        (None, _) => checkout(Path::new(".")),
        found => found,
    };
    RingwayBuild {
        path: bin.display().to_string(),
        version: run(Command::new(bin).arg("--version")).unwrap_or_else(|| "unknown".into()),
        commit,
        dirty,
    }
}

/// Now as "YYYY-MM-DDTHH:MM:SSZ".
pub fn utc_now() -> String {
    ringway_controlplane::model::time::rfc3339_utc(SystemTime::now())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn describes_this_machine() {
        let m = describe(None);
        assert!(m.nproc >= 1);
        assert!(!m.kernel.is_empty());
    }
}
