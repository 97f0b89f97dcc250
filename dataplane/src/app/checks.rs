//! What the host must allow before any core starts, each failure named with
//! its cause and its fix: io_uring itself (seccomp, the sysctl, the
//! kernel), locked memory for the rings, and enough file descriptors.

use anyhow::bail;

/// Locked memory one core's ring needs: the kernel charges io_uring's
/// submission and completion queues (1024 + 8192 entries, about 200 KiB)
/// to RLIMIT_MEMLOCK unless the process may lock memory anyway.
const MEMLOCK_PER_CORE: u64 = 256 << 10;

/// Raises the soft RLIMIT_MEMLOCK to the hard one, then fails fast, naming
/// the limit and the fix, if `cores` rings still do not fit (io_uring_setup
/// would only say ENOMEM).
pub fn check_memlock(cores: usize) -> anyhow::Result<()> {
    let needed = MEMLOCK_PER_CORE * cores as u64;
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Ok(());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) } == 0 {
            lim = raised;
        }
    }
    // SAFETY: plain syscall without arguments.
    if lim.rlim_cur < needed && unsafe { libc::geteuid() } != 0 {
        bail!(
            "RLIMIT_MEMLOCK is {} KiB; {cores} io_uring core(s) need about {} KiB. Raise it (`ulimit -l {}`, or LimitMEMLOCK= in systemd), run as root, or use fewer --cores",
            lim.rlim_cur / 1024,
            needed / 1024,
            needed / 1024
        );
    }
    Ok(())
}

/// Fails fast, naming the cause and the fix, when this process cannot set
/// up an io_uring at all: a container's seccomp profile blocking it
/// (containerd 2 and Docker 25+ do by default), the `kernel.io_uring_disabled`
/// sysctl, or a kernel without it. Otherwise each core would only fail
/// with a bare errno.
pub fn check_io_uring() -> anyhow::Result<()> {
    match io_uring::IoUring::new(2) {
        Ok(_) => Ok(()),
        Err(e) => {
            let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .ok()
                .and_then(|v| v.trim().parse::<u8>().ok());
            bail!("{}", io_uring_diagnosis(&e, sysctl))
        }
    }
}

/// Why io_uring_setup failed with `e`, and what to do about it, given
/// `kernel.io_uring_disabled` (None: not readable or not present).
pub fn io_uring_diagnosis(e: &std::io::Error, sysctl: Option<u8>) -> String {
    let fix_seccomp = "run ringway with a seccomp profile that allows io_uring_setup, \
        io_uring_enter and io_uring_register on top of the runtime default: ringway \
        ships one as deploy/seccomp/ringway.json (install it on the node as \
        /var/lib/kubelet/seccomp/profiles/ringway.json; the Helm chart's default \
        seccompProfile refers to it), or use seccompProfile: Unconfined";
    match (e.raw_os_error(), sysctl) {
        (_, Some(2)) => format!(
            "io_uring is disabled on this host (sysctl kernel.io_uring_disabled=2): \
             set it to 0 (`sysctl -w kernel.io_uring_disabled=0`); ringway needs io_uring ({e})"
        ),
        (Some(libc::EPERM), Some(1)) => format!(
            "io_uring is restricted on this host (sysctl kernel.io_uring_disabled=1) and this \
             process is neither in kernel.io_uring_group nor CAP_SYS_ADMIN: set the sysctl to \
             0 or run ringway in that group ({e})"
        ),
        (Some(libc::EPERM), _) => format!(
            "io_uring_setup is not permitted ({e}): most likely the container runtime's \
             default seccomp profile blocks io_uring; {fix_seccomp}"
        ),
        (Some(libc::ENOSYS), _) => format!(
            "io_uring_setup is not available ({e}): either this kernel lacks io_uring \
             (ringway needs Linux 5.19 or later) or a seccomp profile answers ENOSYS for it; \
             {fix_seccomp}"
        ),
        (Some(libc::ENOMEM), _) => format!(
            "io_uring_setup ran out of locked memory ({e}): raise RLIMIT_MEMLOCK \
             (`ulimit -l`, LimitMEMLOCK= in systemd, or the container's memlock ulimit)"
        ),
        _ => format!("cannot set up an io_uring: {e}"),
    }
}

/// Raises RLIMIT_NOFILE to its hard limit, as ztunnel does: a busy node
/// proxy holds several fds per connection (two sockets, and pipes while
/// bytes move). Returns the soft limit now in force (what the connection
/// caps are derived from).
pub fn raise_nofile() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return 1024;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct we pass.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    lim.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each way io_uring can be unavailable names its cause and its fix.
    #[test]
    fn io_uring_failures_say_why_and_what_to_do() {
        let err = |errno| std::io::Error::from_raw_os_error(errno);
        let cases = [
            (libc::EPERM, None, "allows io_uring_setup, io_uring_enter"),
            (libc::EPERM, None, "deploy/seccomp/ringway.json"),
            (
                libc::EPERM,
                Some(0),
                "default seccomp profile blocks io_uring",
            ),
            (libc::EPERM, Some(1), "kernel.io_uring_group"),
            (libc::EPERM, Some(2), "sysctl -w kernel.io_uring_disabled=0"),
            (libc::ENOSYS, None, "Linux 5.19 or later"),
            (libc::ENOMEM, None, "RLIMIT_MEMLOCK"),
            (libc::EINVAL, None, "cannot set up an io_uring"),
        ];
        for (errno, sysctl, expected) in cases {
            let why = io_uring_diagnosis(&err(errno), sysctl);
            assert!(why.contains(expected), "{errno} {sysctl:?}: {why}");
        }
        // And here, where the tests run, it works.
        check_io_uring().unwrap();
    }
}
