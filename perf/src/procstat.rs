//! What proxy processes cost, read from /proc: CPU seconds (user + system,
//! all threads) and resident memory, summed over a set of processes and
//! their descendants (a peer proxy may be started through a wrapper).

use std::io;

/// utime + stime of `pid` (all threads), in seconds.
pub fn cpu_seconds(pid: u32) -> io::Result<f64> {
    let fields = stat_fields(pid)?;
    // After ')': state is field 3, so utime (14) and stime (15) sit at 11, 12.
    let parse = |i: usize| -> io::Result<f64> {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .ok_or_else(|| io::Error::other("malformed /proc/pid/stat"))
    };
    // SAFETY: sysconf takes no memory.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((parse(11)? + parse(12)?) / ticks)
}

/// The fields of /proc/pid/stat after the command name.
fn stat_fields(pid: u32) -> io::Result<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name (field 2) may contain spaces; fields resume after ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::other("malformed /proc/pid/stat"))?;
    Ok(rest.split_whitespace().map(str::to_string).collect())
}

/// The numeric fields of /proc/<pid>/status (a thread's too: `pid` may
/// be a task id), `kB` ones in bytes.
fn status(pid: u32) -> io::Result<std::collections::BTreeMap<String, u64>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mut out = std::collections::BTreeMap::new();
    for (key, value) in text.lines().filter_map(|l| l.split_once(':')) {
        let (v, unit) = match value.trim().strip_suffix("kB") {
            Some(kb) => (kb.trim(), 1024),
            None => (value.trim(), 1),
        };
        if let Ok(n) = v.parse::<u64>() {
            out.insert(key.to_string(), n * unit);
        }
    }
    Ok(out)
}

/// Field `key` of [`status`].
fn status_field(pid: u32, key: &str) -> io::Result<u64> {
    status(pid)?
        .get(key)
        .copied()
        .ok_or_else(|| io::Error::other(format!("no {key} in /proc/{pid}/status")))
}

/// VmRSS of `pid` in bytes.
pub fn rss_bytes(pid: u32) -> io::Result<u64> {
    status_field(pid, "VmRSS")
}

/// `roots` and every live descendant.
pub fn with_descendants(roots: &[u32]) -> Vec<u32> {
    let mut parent_of = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            // Field 4 (ppid) is index 1 after the command name.
            if let Some(ppid) = stat_fields(pid)
                .ok()
                .and_then(|f| f.get(1).and_then(|p| p.parse::<u32>().ok()))
            {
                parent_of.push((pid, ppid));
            }
        }
    }
    let mut all: Vec<u32> = roots.to_vec();
    let mut i = 0;
    while i < all.len() {
        let p = all[i];
        for &(child, parent) in &parent_of {
            if parent == p && !all.contains(&child) {
                all.push(child);
            }
        }
        i += 1;
    }
    all
}

/// The threads (task ids) of `pids`.
pub fn threads(pids: &[u32]) -> Vec<u32> {
    let mut tids = Vec::new();
    for pid in pids {
        if let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            tids.extend(
                dir.flatten()
                    .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok())),
            );
        }
    }
    tids.sort_unstable();
    tids.dedup();
    tids
}

/// Context switches of one thread so far: (voluntary, involuntary), from
/// /proc/<tid>/status (a process's own status only counts its main thread).
pub fn ctx_switches(tid: u32) -> io::Result<(u64, u64)> {
    Ok((
        status_field(tid, "voluntary_ctxt_switches")?,
        status_field(tid, "nonvoluntary_ctxt_switches")?,
    ))
}

/// The processes that make up one proxy variant (e.g. both ringways of an
/// HBONE path). Empty for "no proxy".
#[derive(Clone, Debug, Default)]
pub struct Processes {
    pub roots: Vec<u32>,
}

impl Processes {
    pub fn new(roots: Vec<u32>) -> Processes {
        Processes { roots }
    }

    pub fn is_empty(&self) -> bool {
        self.roots.is_empty()
    }

    /// `of` summed over the processes and their descendants now (None
    /// without processes). A descendant that exited in between counts
    /// nothing (its CPU time is gone); a root that did is an error.
    fn sum<T: std::ops::AddAssign + Default>(
        &self,
        of: impl Fn(u32) -> io::Result<T>,
    ) -> io::Result<Option<T>> {
        if self.is_empty() {
            return Ok(None);
        }
        let mut total = T::default();
        for pid in with_descendants(&self.roots) {
            match of(pid) {
                Ok(x) => total += x,
                Err(_) if !self.roots.contains(&pid) => {}
                Err(e) => return Err(io::Error::new(e.kind(), format!("pid {pid}: {e}"))),
            }
        }
        Ok(Some(total))
    }

    /// Total CPU seconds so far (None without processes).
    pub fn cpu_seconds(&self) -> io::Result<Option<f64>> {
        self.sum(cpu_seconds)
    }

    /// Every thread of the processes and their descendants, now.
    pub fn threads(&self) -> Vec<u32> {
        threads(&with_descendants(&self.roots))
    }

    /// Total resident memory (None without processes).
    pub fn rss_bytes(&self) -> io::Result<Option<u64>> {
        self.sum(rss_bytes)
    }
}

/// CPU seconds a set of processes spends between `start` and `finish`.
pub struct CpuMeter<'a> {
    procs: &'a Processes,
    start: Option<f64>,
}

impl<'a> CpuMeter<'a> {
    pub fn start(procs: &'a Processes) -> io::Result<CpuMeter<'a>> {
        Ok(CpuMeter {
            procs,
            start: procs.cpu_seconds()?,
        })
    }

    pub fn finish(self) -> io::Result<Option<f64>> {
        Ok(match (self.start, self.procs.cpu_seconds()?) {
            (Some(a), Some(b)) => Some((b - a).max(0.0)),
            _ => None,
        })
    }
}

/// The `kB` fields of /proc/PID/status we report, in bytes.
pub fn memory_status(pid: u32) -> anyhow::Result<std::collections::BTreeMap<String, u64>> {
    let mut out = status(pid)?;
    out.retain(|k, _| ["VmRSS", "VmHWM", "RssAnon", "RssFile", "VmData"].contains(&k.as_str()));
    if !out.contains_key("VmRSS") {
        anyhow::bail!("no VmRSS for pid {pid}");
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let pid = std::process::id();
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(cpu_seconds(pid).unwrap() > 0.0);
        assert!(rss_bytes(pid).unwrap() > 100 * 1024);
        let m = memory_status(pid).unwrap();
        assert!(m["VmHWM"] >= m["VmRSS"] && m["VmRSS"] > 100 * 1024, "{m:?}");
        assert!(!m.contains_key("Threads"), "only the memory fields");
    }

    #[test]
    fn counts_threads_and_their_context_switches() {
        let me = std::process::id();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        let tids = threads(&[me]);
        assert!(tids.len() >= 2 && tids.contains(&me), "{tids:?}");
        // The helper thread blocks in recv: at least one voluntary switch.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let total: u64 = tids
            .iter()
            .filter_map(|&t| ctx_switches(t).ok())
            .map(|(v, _)| v)
            .sum();
        assert!(total >= 1);
        tx.send(()).unwrap();
        t.join().unwrap().unwrap();
    }

    #[test]
    fn sums_over_children() {
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let me = std::process::id();
        let set = with_descendants(&[me]);
        assert!(set.contains(&child.id()), "{set:?}");
        let procs = Processes::new(vec![child.id()]);
        assert!(procs.rss_bytes().unwrap().unwrap() > 0);
        assert!(procs.cpu_seconds().unwrap().unwrap() >= 0.0);
        assert!(Processes::new(vec![me]).cpu_seconds().unwrap().unwrap() > 0.0);
        assert_eq!(Processes::default().cpu_seconds().unwrap(), None);
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
