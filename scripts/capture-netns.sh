#!/usr/bin/env bash
# Installs ringway's capture rules inside a network namespace (a pod's),
# the rule shape istio-cni installs for ztunnel:
#
#   - egress TCP → ringway's outbound listener 15001, except ringway's own
#     sockets (SO_MARK 0x539, low 12 bits) and loopback;
#   - ingress TCP to the given application ports → the inbound plaintext
#     listener 15006; port 15008 (inbound HBONE) is never redirected.
#
#   scripts/capture-netns.sh <netns> [inbound-ports, e.g. "8080, 9000-9100"]
#   scripts/capture-netns.sh <netns> --remove
#
# Idempotent: a second run replaces the first's rules (one nft transaction,
# so there is no moment without them); --remove is quiet when nothing is
# installed. Needs root (CAP_NET_ADMIN). For the return path of spoofed
# sources (--orig-src), see scripts/orig-src-rules.sh.
set -euo pipefail
ns=${1:?usage: capture-netns.sh <netns> [inbound-ports|--remove]}
if [ "$(id -u)" != 0 ]; then
  echo "capture-netns.sh: needs root (CAP_NET_ADMIN) to change nftables in netns $ns" >&2
  exit 1
fi
if ! ip netns list | awk '{print $1}' | grep -qx "$ns"; then
  echo "capture-netns.sh: no network namespace named $ns" >&2
  exit 1
fi
if [ "${2:-}" = "--remove" ]; then
  ip netns exec "$ns" nft delete table inet ringway 2>/dev/null || true
  exit 0
fi
inbound=${2:-}
{
  # add + delete + define: replaces an earlier install atomically.
  echo "add table inet ringway"
  echo "delete table inet ringway"
  echo "table inet ringway {"
  echo "  chain outbound {"
  echo "    type nat hook output priority -100; policy accept;"
  echo "    oifname \"lo\" return"
  echo "    meta l4proto tcp meta mark & 0xfff == 0x539 return"
  echo "    meta l4proto tcp redirect to :15001"
  echo "  }"
  if [ -n "$inbound" ]; then
    echo "  chain inbound {"
    echo "    type nat hook prerouting priority -100; policy accept;"
    echo "    tcp dport 15008 return"
    echo "    tcp dport { $inbound } redirect to :15006"
    echo "  }"
  fi
  echo "}"
} | ip netns exec "$ns" nft -f -
