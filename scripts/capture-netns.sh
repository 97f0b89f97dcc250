#!/usr/bin/env bash
# Installs ringway's capture rules inside a network namespace (a pod's):
# outbound TCP → 15001 (except ringway's own sockets, SO_MARK 0x539), and
# inbound TCP on the given ports → 15006. The same rule shape the tests use.
#
#   scripts/capture-netns.sh <netns> [inbound-ports, e.g. "8080, 9000-9100"]
#   scripts/capture-netns.sh <netns> --remove
set -euo pipefail
ns=${1:?usage: capture-netns.sh <netns> [inbound-ports|--remove]}
if [ "${2:-}" = "--remove" ]; then
  ip netns exec "$ns" nft delete table inet ringway 2>/dev/null || true
  exit 0
fi
inbound=${2:-}
{
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
    echo "    tcp dport { $inbound } redirect to :15006"
    echo "  }"
  fi
  echo "}"
} | ip netns exec "$ns" nft -f -
