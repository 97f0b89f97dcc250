#!/usr/bin/env bash
# Builds release binaries and runs `dns-bench`: the DNS proxy under dnsperf
# (issue 23), ringway beside Istio's ztunnel in one run: queries/s at
# saturation, latency p50/p99 at a fixed rate, the proxies' CPU per 1 000
# queries and RSS, for mesh names and for forwarded names (against a fast
# upstream resolver the bench runs), as ringway ÷ ztunnel; 3 rounds with
# the proxies' order rotating. About 4 minutes. Results land in
# dns-results/ (results.md, results.json, logs).
#
# Needs root (network namespaces, and /etc/netns/<ns>/resolv.conf for
# ztunnel's upstream); as another user it re-runs itself under sudo
# (keeping PATH and the cargo and RINGWAY variables). Installs dnsperf
# (Debian package) when missing. The binaries are built into, and run from,
# cargo's target directory ($CARGO_TARGET_DIR when set). ztunnel is found
# as the other benches find it (RINGWAY_ZTUNNEL, else the peer beside the
# repository). Extra arguments go to dns-bench, e.g. --rounds 5, --seconds
# 15, --workers 2, --out perf-results/dns-<commit>.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
rerun_as_root "the bench uses network namespaces" "$0" "$@"
cd "$(dirname "$0")/.."

if ! command -v dnsperf >/dev/null 2>&1; then
  echo "installing: dnsperf"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq dnsperf >/dev/null
fi

cargo build --release --locked -p ringway-dataplane -p ringway-perf --bin ringway --bin dns-bench
target=$(ringway_target_dir)
case " $* " in *" --out "*) ;; *) set -- --out dns-results "$@" ;; esac
exec "$target/release/dns-bench" "$@"
