#!/usr/bin/env bash
# Builds release binaries and runs `scale-bench`: process memory (RSS 2 s
# and 15 s after ready, peak) and time to ready of ringway holding a mesh
# of 20k workloads / 2k services and 100k / 10k, loaded from a LOCAL_XDS
# file, beside Istio's ztunnel loading the same file, with ringway's
# allocator counters and an exact heap accounting of its loading code.
# About 4 minutes. Results land in scale-results/ (results.md,
# results.json).
#
# As root it runs ztunnel too (in a network namespace of its own: it binds
# fixed ports); otherwise ringway alone (--no-ztunnel). Extra arguments go
# to scale-bench, e.g. --sizes 100000:10000 or --variants
# ringway,ringway-node,ringway-nodecay,ringway-bgthread,ztunnel. See
# perf/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build --release --locked -p ringway-dataplane -p ringway-perf --bin ringway --bin scale-bench
target="${CARGO_TARGET_DIR:-target}"
extra=()
if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/scale-bench.sh: not root: ringway only (ztunnel needs a network namespace)" >&2
  extra+=(--no-ztunnel)
fi
exec "$target/release/scale-bench" --out scale-results "${extra[@]}" "$@"
