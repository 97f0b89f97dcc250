#!/usr/bin/env bash
# Return-path routing for ringway's --orig-src: connections ringway opens to
# a local application from the original client's address (IP_TRANSPARENT).
# The application answers that address, which is not this host's, so
# without these rules its replies would be routed away (to the real client,
# which resets them). The rules, in the namespace where ringway and the
# application run:
#
#   - a packet from one of ringway's sockets (SO_MARK, default 0x539) whose
#     source is not a local address and whose destination is (the
#     application) marks its connection (ct mark 0x111, low 12 bits only);
#   - the replies of such a connection get the routing mark 0x111;
#   - that mark routes through table 133, where everything is local, so the
#     replies reach ringway's transparent socket. Nothing else is marked:
#     ringway's connections to other nodes have local sources, and its own
#     packets keep their mark.
#
#   scripts/orig-src-rules.sh add [--netns NAME] [--mark 0x539] [--table 133]
#   scripts/orig-src-rules.sh del [--netns NAME] [--table 133]
#
# Idempotent: "add" replaces what an earlier "add" installed; "del" removes
# it and is quiet when nothing is there. Needs root (CAP_NET_ADMIN).
set -euo pipefail

usage() {
  sed -n '16,17p' "$0" | sed 's/^# *//' >&2
  exit 2
}

action=${1:-}
[ "$action" = add ] || [ "$action" = del ] || usage
shift
netns="" mark=0x539 table=133
while [ $# -gt 0 ]; do
  case "$1" in
    --netns) netns=${2:?--netns needs a name}; shift 2 ;;
    --mark) mark=${2:?--mark needs a value}; shift 2 ;;
    --table) table=${2:?--table needs a number}; shift 2 ;;
    *) usage ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "orig-src-rules.sh: needs root (CAP_NET_ADMIN) to change nftables and routing rules" >&2
  exit 1
fi
for tool in nft ip; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "orig-src-rules.sh: '$tool' not found (install nftables / iproute2)" >&2
    exit 1
  }
done

in_ns() {
  if [ -n "$netns" ]; then ip netns exec "$netns" "$@"; else "$@"; fi
}

remove() {
  in_ns nft delete table inet ringway_orig_src 2>/dev/null || true
  for family in -4 -6; do
    while in_ns ip "$family" rule del fwmark 0x111/0xfff lookup "$table" 2>/dev/null; do :; done
    # Only the one route this script adds: the table may be someone else's.
    local any=0.0.0.0/0
    [ "$family" = -6 ] && any=::/0
    in_ns ip "$family" route del local "$any" dev lo table "$table" 2>/dev/null || true
  done
}

# Refuse a routing table that holds routes this script did not add.
for family in -4 -6; do
  other=$(in_ns ip "$family" route show table "$table" 2>/dev/null | grep -v '^local \(0.0.0.0/0\|default\|::/0\) dev lo' || true)
  if [ -n "$other" ]; then
    echo "orig-src-rules.sh: routing table $table already holds other routes; pick another with --table:" >&2
    echo "$other" >&2
    exit 1
  fi
done

remove
[ "$action" = del ] && exit 0

in_ns nft -f - <<EOF
table inet ringway_orig_src {
  chain output {
    type route hook output priority mangle; policy accept;
    meta l4proto tcp meta mark & 0xfff == $mark fib saddr type != local fib daddr type local ct mark set ct mark & 0xfffff000 | 0x111
    ct direction reply ct mark & 0xfff == 0x111 meta mark set meta mark & 0xfffff000 | 0x111
  }
}
EOF
in_ns ip -4 rule add fwmark 0x111/0xfff lookup "$table"
in_ns ip -4 route add local 0.0.0.0/0 dev lo table "$table"
# IPv6 may be disabled in the namespace: then only IPv4 needs the route.
in_ns ip -6 rule add fwmark 0x111/0xfff lookup "$table" 2>/dev/null || true
in_ns ip -6 route add local ::/0 dev lo table "$table" 2>/dev/null || true
