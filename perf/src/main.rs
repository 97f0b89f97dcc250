//! `ringway-perf`: the command line over the ringway_perf library.

use std::net::{IpAddr, SocketAddr};

use clap::{Parser, Subcommand};
use ringway_perf::dial::Dialer;
use ringway_perf::procstat::Processes;
use ringway_perf::rr::Limit;
use ringway_perf::units::{parse_duration, parse_size};
use ringway_perf::{
    calibrate, connect, idle, kernel, passthrough, rig, rr, rr_conc, server, soak, socks5, suite,
    throughput,
};
use serde::Serialize;

#[derive(Parser)]
#[command(
    name = "ringway-perf",
    version,
    about = "ringway's performance harness: load generator, sink, rigs and side-by-side benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Where the load goes and which proxy processes to charge for it.
#[derive(clap::Args, Clone)]
struct ClientArgs {
    /// The `ringway-perf serve` address.
    #[arg(long)]
    target: SocketAddr,
    /// Reach the target through this SOCKS5 proxy (CONNECT, no auth).
    #[arg(long)]
    socks: Option<SocketAddr>,
    /// Source address of every connection (e.g. the client workload's IP,
    /// so the proxy knows whose identity to use).
    #[arg(long)]
    bind: Option<IpAddr>,
    /// Run the client inside this network namespace (`ip netns` name), e.g.
    /// one whose egress a proxy captures transparently.
    #[arg(long)]
    netns: Option<String>,
    /// A proxy process to report CPU (and memory) for; repeat for several.
    #[arg(long = "proxy-pid")]
    proxy_pids: Vec<u32>,
}

impl ClientArgs {
    fn dialer(&self) -> Dialer {
        match self.socks {
            Some(s) => Dialer::via_socks5(self.target, s),
            None => Dialer::direct(self.target),
        }
        .bind(self.bind)
    }

    /// Runs `f` (in the namespace, if any) and prints its result as JSON.
    fn run<T: Serialize + Send + 'static>(
        &self,
        f: impl FnOnce(&Dialer, &Processes) -> std::io::Result<T> + Send + 'static,
    ) -> anyhow::Result<()> {
        let dialer = self.dialer();
        let procs = Processes::new(self.proxy_pids.clone());
        let r = match &self.netns {
            Some(ns) => rig::in_netns(ns, move || f(&dialer, &procs))??,
            None => f(&dialer, &procs)?,
        };
        println!("{}", serde_json::to_string_pretty(&r)?);
        Ok(())
    }
}

fn limit(duration: Option<std::time::Duration>, count: Option<u64>, default_secs: u64) -> Limit {
    match (duration, count) {
        (_, Some(c)) => Limit::Count(c),
        (Some(d), None) => Limit::Duration(d),
        (None, None) => Limit::Duration(std::time::Duration::from_secs(default_secs)),
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// The sink / source / responder every scenario talks to.
    Serve {
        /// Addresses to listen on (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:5201")]
        listen: Vec<SocketAddr>,
        /// epoll reactor threads for small-message work (default: CPUs, ≤ 4).
        #[arg(long)]
        threads: Option<usize>,
    },
    /// N parallel streams of X bytes each; Gbit/s.
    Throughput {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long, default_value_t = 1)]
        streams: usize,
        /// Bytes per stream (suffixes K, M, G = KiB, MiB, GiB).
        #[arg(long, default_value = "2G", value_parser = parse_size)]
        bytes: u64,
        #[arg(long, value_enum, default_value = "up")]
        direction: throughput::Direction,
    },
    /// Request/response on C connections; latency percentiles, requests/s.
    Rr {
        #[command(flatten)]
        client: ClientArgs,
        /// Request and response size in bytes.
        #[arg(long, default_value_t = 1)]
        size: u32,
        #[arg(long, default_value_t = 1)]
        connections: usize,
        /// Run this long (default 10s).
        #[arg(long, value_parser = parse_duration, conflicts_with = "requests")]
        duration: Option<std::time::Duration>,
        /// Or stop after this many requests (all connections together).
        #[arg(long)]
        requests: Option<u64>,
        /// Also count the --proxy-pid processes' system calls (perf),
        /// io_uring submissions and context switches over the timed
        /// requests (the suite's rr-kernel scenario).
        #[arg(long, requires = "proxy_pids")]
        count_kernel: bool,
    },
    /// Request/response on C connections at once from a few epoll threads
    /// (closed loop); requests/s, latency, the client threads' CPU.
    RrConc {
        #[command(flatten)]
        client: ClientArgs,
        /// Request and response size in bytes.
        #[arg(long, default_value_t = 1)]
        size: u32,
        #[arg(long, default_value_t = 64)]
        connections: usize,
        /// Client threads, each with an epoll loop (at most one per connection).
        #[arg(long, default_value_t = rr_conc::DEFAULT_THREADS)]
        threads: usize,
        /// Run this long (default 5s).
        #[arg(long, value_parser = parse_duration, conflicts_with = "requests")]
        duration: Option<std::time::Duration>,
        /// Or stop after this many requests (all connections together).
        #[arg(long)]
        requests: Option<u64>,
    },
    /// A new connection per request; connections/s, connect-to-first-byte.
    Connect {
        #[command(flatten)]
        client: ClientArgs,
        /// Workers, each with one connection in flight.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Run this long (default 5s).
        #[arg(long, value_parser = parse_duration, conflicts_with = "count")]
        duration: Option<std::time::Duration>,
        /// Or stop after this many connections.
        #[arg(long)]
        count: Option<u64>,
    },
    /// K idle connections; the proxy's memory per connection (needs --proxy-pid).
    Idle {
        #[command(flatten)]
        client: ClientArgs,
        #[arg(long, default_value_t = 1000)]
        connections: usize,
        /// Wait before reading RSS.
        #[arg(long, default_value = "2s", value_parser = parse_duration)]
        settle: std::time::Duration,
    },
    /// Compare the generator's loopback throughput with iperf3's.
    Calibrate(calibrate::Params),
    /// Everything, side by side, on a two-node netns rig (needs root).
    Suite(Box<suite::SuiteArgs>),
    /// Many connections held for a long time through ringway and ztunnel,
    /// with traffic on a share and config churn; RSS, fds, CPU, p99 over
    /// time (needs root).
    Soak(Box<soak::SoakArgs>),
    /// One soak column's load generator (run by `soak`).
    #[command(hide = true)]
    SoakLoad(soak::LoadArgs),
    /// Direct TCP vs ringway passthrough (splice and copy) on loopback.
    Passthrough(passthrough::PassthroughArgs),
    /// A minimal SOCKS5 relay (CONNECT, no auth): a stand-in peer proxy.
    SocksRelay {
        #[arg(long, default_value = "127.0.0.1:15080")]
        listen: SocketAddr,
    },
}

fn main() -> anyhow::Result<()> {
    ringway_perf::raise_fd_limit();
    match Cli::parse().cmd {
        Cmd::Serve { listen, threads } => {
            let bound = match threads {
                Some(n) => server::spawn_with(&listen, n)?,
                None => server::spawn(&listen)?,
            };
            eprintln!("serving on {bound:?}");
            park()
        }
        Cmd::Throughput {
            client,
            streams,
            bytes,
            direction,
        } => client.run(move |d, p| {
            throughput::run(
                d,
                throughput::Params {
                    streams,
                    bytes_per_stream: bytes,
                    direction,
                },
                p,
            )
        })?,
        Cmd::Rr {
            client,
            size,
            connections,
            duration,
            requests,
            count_kernel,
        } => {
            let params = rr::Params {
                size,
                connections,
                limit: limit(duration, requests, 10),
            };
            match count_kernel {
                true => client.run(move |d, p| kernel::run(d, params, p))?,
                false => client.run(move |d, p| rr::run(d, params, p))?,
            }
        }
        Cmd::RrConc {
            client,
            size,
            connections,
            threads,
            duration,
            requests,
        } => {
            let params = rr_conc::Params {
                size,
                connections,
                threads,
                limit: limit(duration, requests, 5),
            };
            client.run(move |d, p| rr_conc::run(d, params, p))?
        }
        Cmd::Connect {
            client,
            concurrency,
            duration,
            count,
        } => client.run(move |d, p| {
            connect::run(
                d,
                connect::Params {
                    concurrency,
                    limit: limit(duration, count, 5),
                },
                p,
            )
        })?,
        Cmd::Idle {
            client,
            connections,
            settle,
        } => {
            if client.proxy_pids.is_empty() {
                eprintln!("note: without --proxy-pid there is no proxy memory to report");
            }
            client.run(move |d, p| {
                idle::run(
                    d,
                    idle::Params {
                        connections,
                        settle,
                    },
                    p,
                )
            })?
        }
        Cmd::Calibrate(p) => {
            let c = calibrate::run(&p, &mut |l| eprintln!("{l}"))?;
            eprintln!("{}", c.summary());
            println!("{}", serde_json::to_string_pretty(&c)?);
            if !c.pass {
                anyhow::bail!(
                    "the load generator is below {:.0}% of iperf3",
                    p.min_ratio * 100.0
                );
            }
        }
        Cmd::Suite(args) => suite::run(*args)?,
        Cmd::Soak(args) => soak::run(*args)?,
        Cmd::SoakLoad(args) => soak::load(args)?,
        Cmd::Passthrough(args) => passthrough::run(args)?,
        Cmd::SocksRelay { listen } => {
            let bound = socks5::spawn_relay(listen)?;
            eprintln!("SOCKS5 relay on {bound}");
            park()
        }
    }
    Ok(())
}

fn park() -> ! {
    loop {
        std::thread::park();
    }
}
