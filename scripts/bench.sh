#!/usr/bin/env bash
# Builds release binaries and runs the side-by-side passthrough benchmark
# (direct TCP vs ringway splice vs ringway copy) in a private network
# namespace. Needs root. Extra arguments go to `ringway-perf passthrough`
# (e.g. --rounds 7 --bytes 2G --cores 1).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nft >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq nftables >/dev/null; }
cargo build --release --locked -p ringway-dataplane -p ringway-perf
ulimit -l unlimited 2>/dev/null || true
exec target/release/ringway-perf passthrough --out perf-results "$@"
