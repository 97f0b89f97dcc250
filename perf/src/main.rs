//! `ringway-perf`: reproducible, side-by-side performance numbers for
//! ringway. Tests assert behaviour; this reports numbers.

mod passthrough;
mod procstat;
mod rig;
mod server;
mod stats;
mod throughput;
mod wire;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ringway-perf",
    version,
    about = "ringway's performance harness"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Sink / source / echo server for every scenario.
    Serve {
        /// Addresses to listen on (comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1:5201")]
        listen: Vec<SocketAddr>,
    },
    /// N parallel streams of X bytes against a `serve` target.
    Throughput {
        #[arg(long)]
        target: SocketAddr,
        #[arg(long, default_value_t = 1)]
        streams: usize,
        #[arg(long, default_value = "2G", value_parser = parse_size)]
        bytes: u64,
        #[arg(long, value_enum, default_value = "up")]
        direction: throughput::Direction,
    },
    /// Direct TCP vs ringway passthrough (splice and copy), side by side.
    Passthrough(passthrough::PassthroughArgs),
}

/// "64K", "512M", "2G" (binary units) or a plain byte count.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = match s.chars().last() {
        Some('K' | 'k') => (&s[..s.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&s[..s.len() - 1], 1 << 20),
        Some('G' | 'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid size {s:?} (examples: 4096, 64K, 512M, 2G)"))
}

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
        bail!("ringway binary not found at {} (build it: cargo build --release -p ringway-dataplane, or pass --ringway)", path.display());
    }
    Ok(path)
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().cmd {
        Cmd::Serve { listen } => {
            let bound = server::spawn(&listen)?;
            eprintln!("serving on {bound:?}");
            loop {
                std::thread::park();
            }
        }
        Cmd::Throughput {
            target,
            streams,
            bytes,
            direction,
        } => {
            let r = throughput::run(target, streams, bytes, direction)?;
            println!("{}", serde_json::to_string_pretty(&r)?);
        }
        Cmd::Passthrough(args) => passthrough::run(args)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert!(parse_size("2T").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn throughput_against_local_server_moves_every_byte() {
        let addr = server::spawn(&["127.0.0.1:0".parse().unwrap()]).unwrap()[0];
        for dir in [
            throughput::Direction::Up,
            throughput::Direction::Down,
            throughput::Direction::Both,
        ] {
            let r = throughput::run(addr, 3, 1 << 20, dir).unwrap();
            let per = if dir == throughput::Direction::Both {
                2
            } else {
                1
            };
            assert_eq!(r.bytes, 3 * (1 << 20) * per);
            assert!(r.gbit_per_s > 0.0 && r.seconds > 0.0);
        }
    }
}
