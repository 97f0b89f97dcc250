//! ringway-perf: reproducible, side-by-side performance numbers for
//! ringway. Tests assert behaviour; this reports numbers.
//!
//! * scenarios: [`throughput`], [`rr`], [`rr_conc`], [`connect`], [`idle`]
//!   (one module each), driven through a [`dial::Dialer`] (direct, transparently
//!   captured, or SOCKS5);
//! * [`server`]: the sink / responder they talk to;
//! * rigs: [`rig`] (namespaces, capture rules), [`supervise`] (every
//!   process they start) and [`nodes`] (the two-node HBONE rig);
//! * [`suite`]: every scenario × variant, rounds, medians, ratios, report,
//!   charts; [`calibrate`]: the generator against iperf3.

pub mod calibrate;
pub mod charts;
pub mod connect;
pub mod dial;
pub mod epoll;
pub mod http;
pub mod idle;
pub mod kernel;
pub mod latency;
pub mod machine;
pub mod nodes;
pub mod passthrough;
pub mod procstat;
pub mod report;
pub mod rig;
pub mod rr;
pub mod rr_conc;
pub mod scenario;
pub mod server;
pub mod soak;
pub mod socks5;
pub mod stats;
pub mod suite;
pub mod supervise;
pub mod throughput;
pub mod units;
pub mod wire;
pub mod ztunnel;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The ringway binary: explicit, or built next to ringway-perf.
pub fn ringway_bin(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .context("no parent dir")?
            .join("ringway"),
    };
    if !path.exists() {
        bail!(
            "ringway binary not found at {} (build it: cargo build --release -p ringway-dataplane, or pass --ringway)",
            path.display()
        );
    }
    Ok(path.canonicalize()?)
}

/// Raises the open-file limit to its hard maximum: idle and connect
/// scenarios hold thousands of sockets (client and server ends in this
/// process), and child proxies inherit the limit.
pub fn raise_fd_limit() {
    // SAFETY: getrlimit and setrlimit read and write the struct we pass.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
