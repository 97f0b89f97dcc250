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
# fixed ports). As another user it re-runs itself under sudo for that
# (keeping PATH and the cargo and RINGWAY variables), unless --no-ztunnel
# is given; without sudo it runs ringway alone (--no-ztunnel). The
# binaries are built into, and run from, cargo's target directory
# ($CARGO_TARGET_DIR when set). Extra arguments go
# to scale-bench, e.g. --sizes 100000:10000 or --variants
# ringway,ringway-node,ringway-nodecay,ringway-bgthread,ztunnel. See
# perf/README.md.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
with_ztunnel=true
case " $* " in *" --no-ztunnel "*) with_ztunnel=false ;; esac
if $with_ztunnel && command -v sudo >/dev/null 2>&1; then
  rerun_as_root "ztunnel runs in a network namespace of its own" "$0" "$@"
fi
cd "$(dirname "$0")/.."

cargo build --release --locked -p ringway-dataplane -p ringway-perf --bin ringway --bin scale-bench
target=$(ringway_target_dir)
extra=()
if $with_ztunnel && [ "$(id -u)" -ne 0 ]; then
  echo "scripts/scale-bench.sh: not root and no sudo: ringway only (ztunnel needs a network namespace)" >&2
  extra+=(--no-ztunnel)
fi
exec "$target/release/scale-bench" --out scale-results "${extra[@]}" "$@"
