//! `ringway-perf passthrough`: single-process side-by-side benchmark of
//! direct TCP vs ringway passthrough in splice mode vs copy mode, on
//! loopback inside a redirect rig. Rounds alternate the variants so drift
//! on a shared machine hits all of them alike; results are medians and
//! ratios against direct TCP measured in the same run.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

use crate::dial::Dialer;
use crate::procstat::{self, Processes};
use crate::report::fmt_num;
use crate::rig::Netns;
use crate::stats::{median, ratio};
use crate::supervise::Supervised;
use crate::throughput::{self, Direction};

#[derive(clap::Args, Debug)]
pub struct PassthroughArgs {
    /// The ringway binary (default: next to this one).
    #[arg(long)]
    pub ringway: Option<PathBuf>,
    /// Rounds; each runs every variant once.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Bytes per stream per run (suffixes K, M, G = KiB, MiB, GiB).
    #[arg(long, default_value = "1G", value_parser = crate::units::parse_size)]
    pub bytes: u64,
    /// Parallel streams.
    #[arg(long, default_value_t = 1)]
    pub streams: usize,
    #[arg(long, value_enum, default_value = "up")]
    pub direction: Direction,
    /// `--cores` given to ringway.
    #[arg(long, default_value = "2")]
    pub cores: String,
    /// Results folder (JSON + Markdown).
    #[arg(long, default_value = "perf-results")]
    pub out: PathBuf,
}

#[derive(Serialize)]
struct VariantResult {
    name: &'static str,
    gbit_per_s: Vec<f64>,
    median_gbit_per_s: Option<f64>,
    ratio_vs_direct: Option<f64>,
    /// ringway's own CPU seconds per GiB moved (None for direct).
    proxy_cpu_s_per_gib: Vec<f64>,
    median_proxy_cpu_s_per_gib: Option<f64>,
    /// ringway's resident memory after the last round.
    proxy_rss_mib: Option<f64>,
}

const DIRECT_PORT: u16 = 5201;
const SPLICE_PORT: u16 = 5202;
const COPY_PORT: u16 = 5203;

pub fn run(args: PassthroughArgs) -> anyhow::Result<()> {
    let bin = crate::ringway_bin(args.ringway.as_deref())?;
    std::fs::create_dir_all(&args.out)?;
    let rig = Netns::new("rwperf")?;
    rig.redirect(&[(SPLICE_PORT, 15001), (COPY_PORT, 15011)])?;
    let cfg = args.out.join("empty-config.yaml");
    // No workloads: every destination is plain passthrough.
    std::fs::write(&cfg, "workloads: []\nservices: []\npolicies: []\n")?;
    rig.enter(|| {
        crate::server::spawn(&[
            SocketAddr::from(([127, 0, 0, 1], DIRECT_PORT)),
            SocketAddr::from(([127, 0, 0, 1], SPLICE_PORT)),
            SocketAddr::from(([127, 0, 0, 1], COPY_PORT)),
        ])
    })??;
    let side = crate::rig::side_listener_args(&bin)?;
    let proxy_args = |mode: &str, outbound: u16| -> Vec<String> {
        let mut v: Vec<String> = [
            "--config",
            cfg.to_str().unwrap(),
            "--cores",
            &args.cores,
            "--copy-mode",
            mode,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.extend(crate::rig::listener_args(
            &format!("127.0.0.1:{outbound}"),
            crate::rig::ANY_PORT,
        ));
        v.extend(side.iter().cloned());
        v
    };
    let start = |name: &str, mode: &str, port: u16| {
        Supervised::ringway(&rig, &bin, name, &proxy_args(mode, port), "warn", &args.out)
    };
    let splice = start("ringway-splice", "splice", 15001)?;
    let copy = start("ringway-copy", "copy", 15011)?;

    let variants: [(&'static str, u16, Option<&Supervised>); 3] = [
        ("direct", DIRECT_PORT, None),
        ("ringway splice", SPLICE_PORT, Some(&splice)),
        ("ringway copy", COPY_PORT, Some(&copy)),
    ];
    let mut gbps: Vec<Vec<f64>> = vec![Vec::new(); 3];
    let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); 3];
    // Warm-up: one short run each (page cache, TCP autotuning, pipe pool).
    for (_, port, _) in &variants {
        let port = *port;
        rig.enter(move || {
            throughput::run(
                &Dialer::direct(SocketAddr::from(([127, 0, 0, 1], port))),
                throughput::Params {
                    streams: 1,
                    bytes_per_stream: 64 << 20,
                    direction: Direction::Up,
                },
                &Processes::default(),
            )
        })??;
    }
    for round in 0..args.rounds {
        for k in 0..3 {
            let i = (round + k) % 3; // rotate the order every round
            let (name, port, proxy) = variants[i];
            let procs = Processes::new(proxy.map(|p| p.pid()).into_iter().collect());
            let params = throughput::Params {
                streams: args.streams,
                bytes_per_stream: args.bytes,
                direction: args.direction,
            };
            let r = rig
                .enter(move || {
                    throughput::run(
                        &Dialer::direct(SocketAddr::from(([127, 0, 0, 1], port))),
                        params,
                        &procs,
                    )
                })?
                .with_context(|| format!("{name} run failed"))?;
            if let Some(c) = r.proxy_cpu_s_per_gib {
                cpu[i].push(c);
            }
            gbps[i].push(r.gbit_per_s);
            eprintln!(
                "round {}/{}: {name:>15}: {:6.2} Gbit/s",
                round + 1,
                args.rounds,
                r.gbit_per_s
            );
        }
    }
    let direct = median(&gbps[0]);
    let results: Vec<VariantResult> = (0..3)
        .map(|i| VariantResult {
            name: variants[i].0,
            median_gbit_per_s: median(&gbps[i]),
            ratio_vs_direct: ratio(median(&gbps[i]), direct),
            gbit_per_s: gbps[i].clone(),
            median_proxy_cpu_s_per_gib: median(&cpu[i]),
            proxy_cpu_s_per_gib: cpu[i].clone(),
            proxy_rss_mib: variants[i]
                .2
                .and_then(|p| procstat::rss_bytes(p.pid()).ok())
                .map(|b| b as f64 / (1 << 20) as f64),
        })
        .collect();
    let cpu_ratio = ratio(
        results[1].median_proxy_cpu_s_per_gib,
        results[2].median_proxy_cpu_s_per_gib,
    );
    let md = markdown(&args, &results, cpu_ratio);
    println!("{md}");
    let json = serde_json::to_string_pretty(&results)?;
    std::fs::write(args.out.join("passthrough.json"), json)?;
    std::fs::write(args.out.join("passthrough.md"), &md)?;
    eprintln!(
        "results written to {}/passthrough.{{json,md}}",
        args.out.display()
    );
    Ok(())
}

fn markdown(args: &PassthroughArgs, results: &[VariantResult], cpu_ratio: Option<f64>) -> String {
    let mut s = format!(
        "Passthrough throughput, {} stream(s) × {} MiB {:?}, {} rounds, ringway --cores {} (medians; ratios within this run)\n\n",
        args.streams,
        args.bytes >> 20,
        args.direction,
        args.rounds,
        args.cores
    );
    s += "| variant | Gbit/s | × direct | proxy CPU s/GiB | proxy RSS MiB |\n|---|---|---|---|---|\n";
    for r in results {
        s += &format!(
            "| {} | {} | {} | {} | {} |\n",
            r.name,
            fmt_num(r.median_gbit_per_s, 2),
            fmt_num(r.ratio_vs_direct, 2),
            fmt_num(r.median_proxy_cpu_s_per_gib, 3),
            fmt_num(r.proxy_rss_mib, 1)
        );
    }
    s += &format!(
        "\nsplice CPU per GiB ÷ copy CPU per GiB: {}\n",
        fmt_num(cpu_ratio, 2)
    );
    s
}
