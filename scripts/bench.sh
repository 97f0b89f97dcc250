#!/usr/bin/env bash
# Builds release binaries and runs `ringway-perf suite`: throughput,
# request/response latency, kernel work per request (CPU, system calls by
# type, io_uring submissions, context switches), request/response over 1,
# 16, 64 and 256 concurrent connections (rr-conc), connect rate and
# idle-connection memory on direct TCP, ringway passthrough and ringway
# HBONE, side by side, in a two-node network-namespace rig, after checking
# the load generator against iperf3. Needs root. Results land in
# perf-results/ (results.md, results.json, SVG charts, proxy logs).
#
# Extra arguments go to `ringway-perf suite`, e.g. --quick (about a minute),
# --rounds 7, --cores 1 --cores 2 (core-pinning sweep), --peer ztunnel
# (Istio's ztunnel side by side: its passthrough and HBONE columns, and
# ringway ÷ ztunnel next to ringway ÷ direct), or another proxy with
# --peer-socks/--peer-cmd. See perf/README.md.
#
# As root; as another user it re-runs itself under sudo (keeping PATH and
# the cargo and RINGWAY variables). The binaries are built into, and run
# from, cargo's target directory ($CARGO_TARGET_DIR when set).
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
rerun_as_root "the rig uses network namespaces and nftables" "$0" "$@"
cd "$(dirname "$0")/.."

need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v iperf3 >/dev/null 2>&1 || need+=(iperf3)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
# perf counts the proxies' system calls (rr-kernel). Without it the suite
# still runs and says in results.md that they were not counted.
if ! command -v perf >/dev/null 2>&1; then
  echo "installing: linux-perf (system-call counts)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq linux-perf >/dev/null; } ||
    echo "scripts/bench.sh: could not install linux-perf; system calls will not be counted" >&2
fi

cargo build --release --locked -p ringway-dataplane -p ringway-perf
# io_uring executors lock a little memory; the idle scenario holds thousands
# of sockets (ringway-perf raises its own soft limit to the hard one too).
ulimit -l unlimited 2>/dev/null || true
ulimit -n 65536 2>/dev/null || true
target=$(ringway_target_dir)
exec "$target/release/ringway-perf" suite --out perf-results "$@"
