#!/usr/bin/env bash
# Runs ringway's whole test suite. Needs root: the traffic-path tests build
# private network namespaces with real nftables capture rules. As another
# user it re-runs itself under sudo, keeping PATH and the cargo, rustup and
# RINGWAY_* variables (scripts/lib/common.sh); without sudo it says so.
# Installs the system tools the tests use when they are missing
# (Debian/Ubuntu). Extra arguments go to `cargo test`.
#
#   scripts/test.sh                       # as root, or via sudo
#   scripts/test.sh -- --test-threads 1
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
rerun_as_root "network namespaces and nftables" "$0" "$@"
cd "$(dirname "$0")/.."

need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
/usr/bin/python3 -c 'import h2' >/dev/null 2>&1 || need+=(python3 python3-h2)
# dig: the DNS proxy's test (dataplane/tests/dns.rs) asks ringway with it.
command -v dig >/dev/null 2>&1 || need+=(dnsutils)
# promtool (Prometheus's checker) validates a real scrape of 15020.
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# runc and umoci: the deploy and image checks run ringway in a container.
# Installed here, once, rather than by those two tests at the same time
# (parallel apt-get runs fight over dpkg's lock).
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v umoci >/dev/null 2>&1 || need+=(umoci)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

# io_uring executors lock a little memory; many tests open many sockets.
ulimit -l unlimited 2>/dev/null || true
ulimit -n 65536 2>/dev/null || true

# The real Istio ztunnel is the peer of the differential authorization test
# (dataplane/tests/ztunnel_diff.rs) and of the perf harness's ztunnel rig
# (perf/tests/ztunnel_rig.rs). It is never built from this tree: a prebuilt
# binary beside the repository, or RINGWAY_ZTUNNEL=<path>. Without one,
# RINGWAY_ZTUNNEL=absent makes those tests say they did not run.
ztunnel_note=""
if [ -z "${RINGWAY_ZTUNNEL:-}" ]; then
  if [ -x "$(pwd)/../shared/peers/ztunnel/ztunnel" ]; then
    export RINGWAY_ZTUNNEL="$(pwd)/../shared/peers/ztunnel/ztunnel"
  else
    export RINGWAY_ZTUNNEL=absent
    ztunnel_note="NOTE: no ztunnel peer at $(pwd)/../shared/peers/ztunnel/ztunnel and RINGWAY_ZTUNNEL unset: the tests against ztunnel (differential authorization, perf ztunnel rig) are NOT RUN (set RINGWAY_ZTUNNEL=<path to ztunnel>)"
    echo "$ztunnel_note" >&2
  fi
fi

status=0
cargo test --workspace --locked "$@" || status=$?
if [ -n "$ztunnel_note" ]; then
  echo "$ztunnel_note" >&2
fi
exit "$status"
