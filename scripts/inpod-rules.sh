#!/usr/bin/env bash
# Installs, inside one pod's network namespace, the redirection rules Istio's
# CNI agent (istio-cni, ambient "in-pod" mode) installs there for ztunnel, so
# that ringway listening on 15001/15006/15008 inside that namespace sees the
# same traffic ztunnel would. Same marks, masks, ports and rule order as
# istio-cni's nftables backend (tables istio-ambient-{nat,mangle,raw}),
# gathered here into one table, inet ringway-inpod:
#
#   nat, prerouting (priority -100), traffic entering the pod:
#     - TCP from the kubelet probe address (istio-cni SNATs node-local
#       health probes to 169.254.7.127 / fd16:9254:7127:1337:ffff:ffff:ffff:ffff)
#       is left alone: probes reach the application directly;
#     - TCP not to loopback, not to 15008 (HBONE goes straight to its
#       listener) and not marked as ringway's (mark & 0xfff != 0x539)
#       → REDIRECT to 15006 (plaintext inbound).
#   nat, output (priority -100), traffic leaving the pod's own sockets:
#     - TCP back to the probe address is left alone;
#     - DNS (UDP and TCP port 53) to a non-loopback resolver and not
#       marked as ringway's → 15053, where ringway's DNS proxy listens in
#       the pod (istio-cni's default since Istio 1.25; --no-dns leaves
#       DNS alone);
#     - connections carrying the return-path mark 0x111 are left alone;
#     - anything routed over lo (the pod calling itself) is left alone;
#     - other TCP not marked as ringway's → REDIRECT to 15001 (outbound).
#   mangle, prerouting (priority -150): a packet carrying ringway's mark on
#     the way in (ringway, connecting to the application from the client's
#     address with IP_TRANSPARENT, loops over lo) marks its connection
#     (ct mark 0x111, low 12 bits only).
#   mangle, output (route hook, priority -150): packets of a connection so
#     marked (the application's replies to that foreign address) take the
#     connection's mark as their packet mark, and are routed again: the
#     policy rule "fwmark 0x111/0xfff lookup 100" (pref 32764) sends them to
#     table 100, whose one route "local 0.0.0.0/0 dev lo" (and ::/0) delivers
#     them locally, to ringway's transparent socket, instead of out of the
#     pod to the real client.
#   raw (priority -300, with DNS capture): ringway's own DNS queries
#     upstream and their answers get conntrack zone 1, apart from the pod's
#     queries (whose redirected flows could otherwise share their tuple).
#
#   scripts/inpod-rules.sh <netns> [options]             install (or replace)
#   scripts/inpod-rules.sh <netns> --remove [--table N]  remove
#   scripts/inpod-rules.sh --print [options]             print the nft rules
#
# Options (defaults are istio-cni's):
#   --mark M            ringway's SO_MARK, at most 0xfff (0x539; or $RINGWAY_MARK,
#                       the variable ringway's own --mark reads)
#   --outbound-port P   outbound capture listener (15001)
#   --inbound-port P    plaintext inbound listener (15006)
#   --hbone-port P      HBONE listener, never redirected (15008)
#   --probe-addr A      IPv4 source of kubelet probes (169.254.7.127)
#   --probe-addr6 A     IPv6 source of kubelet probes (fd16:9254:7127:1337:ffff:ffff:ffff:ffff)
#   --dns-port P        the DNS proxy's port in the pod (15053)
#   --no-dns            leave DNS alone (istio-cni's cni.ambient.dnsCapture=false);
#                       --dns, capture on, is the default
#   --table N           routing table of the return path (100)
#
# Idempotent: installing again replaces the table in one nft transaction
# (no moment without rules, never two copies) and leaves one policy rule
# per address family; --remove is quiet when nothing is installed. Needs
# root (CAP_NET_ADMIN, and CAP_SYS_ADMIN to enter the namespace).
set -euo pipefail

prog=inpod-rules.sh
nft_table="inet ringway-inpod"
# The return-path mark and the mask both marks are compared under; the
# policy rule's preference. Fixed, as in istio-cni.
ret_mark=0x111
mask=0xfff
rule_pref=32764

# The usage lines and options of the comment above.
help_text() {
  sed -n '/^#   scripts\/inpod-rules.sh <netns> \[options\]/,/^#   --table/p' "$0" | sed 's/^# \{0,1\}//'
}
usage() {
  help_text >&2
  exit 2
}

die() {
  echo "$prog: $*" >&2
  exit 1
}

netns="" action=install
mark=${RINGWAY_MARK:-0x539}
out_port=15001 in_port=15006 hbone_port=15008 dns_port=15053
probe4=169.254.7.127 probe6=fd16:9254:7127:1337:ffff:ffff:ffff:ffff
dns=1 table=100

need_value() {
  [ $# -ge 2 ] && [ -n "$2" ] || die "$1 needs a value"
}
while [ $# -gt 0 ]; do
  case "$1" in
    --remove) action=remove; shift ;;
    --print) action=print; shift ;;
    --mark) need_value "$@"; mark=$2; shift 2 ;;
    --outbound-port) need_value "$@"; out_port=$2; shift 2 ;;
    --inbound-port) need_value "$@"; in_port=$2; shift 2 ;;
    --hbone-port) need_value "$@"; hbone_port=$2; shift 2 ;;
    --probe-addr) need_value "$@"; probe4=$2; shift 2 ;;
    --probe-addr6) need_value "$@"; probe6=$2; shift 2 ;;
    --dns) dns=1; shift ;;
    --no-dns) dns=0; shift ;;
    --dns-port) need_value "$@"; dns_port=$2; shift 2 ;;
    --table) need_value "$@"; table=$2; shift 2 ;;
    -h | --help) help_text; exit 0 ;;
    -*) echo "$prog: unknown option $1" >&2; usage ;;
    *)
      [ -z "$netns" ] || die "one network namespace at a time (got $netns and $1)"
      netns=$1; shift ;;
  esac
done

# Values are checked here, before anything runs as root, so a typo is named
# rather than surfacing as an nft parse error.
is_number() { [[ $1 =~ ^(0[xX][0-9a-fA-F]+|0|[1-9][0-9]*)$ ]]; }
for p in "$out_port" "$in_port" "$hbone_port" "$dns_port"; do
  { is_number "$p" && [ $((p)) -ge 1 ] && [ $((p)) -le 65535 ]; } || die "not a port: $p"
done
is_number "$mark" || die "not a mark: $mark"
[ $((mark)) -ne 0 ] || die "mark 0 cannot tell ringway's sockets apart; use ringway's --mark value"
[ $((mark)) -le $((mask)) ] || die "mark $mark does not fit the mask $mask istio-cni compares under"
[ $((mark)) -ne $((ret_mark)) ] || die "mark $mark is the return-path mark $ret_mark"
{ is_number "$table" && [ $((table)) -ge 1 ] && [ $((table)) -lt 253 ]; } ||
  die "not a routing table for the return path: $table (1-252)"
[[ $probe4 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "not an IPv4 address: $probe4"
[[ $probe6 =~ ^[0-9a-fA-F:.]+$ && $probe6 == *:* ]] || die "not an IPv6 address: $probe6"
mark=$(printf '0x%x' $((mark)))

# The nftables rules, as one transaction: "add" then "delete" empties any
# earlier copy (and does not fail when there is none), then the table is
# defined afresh.
rules() {
  local m="meta mark & $mask"
  cat <<EOF
# ringway's in-pod redirection rules, as rendered by scripts/inpod-rules.sh
# --print (DNS capture $( [ "$dns" = 1 ] && echo on || echo off )). Load inside the pod's network namespace:
#   ip netns exec <pod> nft -f <this file>
# The return path also needs, in that namespace:
#   ip -4 rule add fwmark $ret_mark/$mask pref $rule_pref lookup $table
#   ip -4 route replace local 0.0.0.0/0 dev lo table $table
#   ip -6 rule add fwmark $ret_mark/$mask pref $rule_pref lookup $table
#   ip -6 route replace local ::/0 dev lo table $table
add table $nft_table
delete table $nft_table
table $nft_table {
  chain nat-prerouting {
    type nat hook prerouting priority -100; policy accept;
    meta l4proto tcp ip saddr $probe4 accept
    meta l4proto tcp ip6 saddr $probe6 accept
    ip daddr != 127.0.0.1 tcp dport != $hbone_port $m != $mark redirect to :$in_port
    ip6 daddr != ::1 tcp dport != $hbone_port $m != $mark redirect to :$in_port
  }
  chain nat-output {
    type nat hook output priority -100; policy accept;
    meta l4proto tcp ip daddr $probe4 accept
    meta l4proto tcp ip6 daddr $probe6 accept
EOF
  if [ "$dns" = 1 ]; then
    cat <<EOF
    oifname != "lo" $m != $mark udp dport 53 redirect to :$dns_port
    ip daddr != 127.0.0.1 tcp dport 53 $m != $mark redirect to :$dns_port
    ip6 daddr != ::1 tcp dport 53 $m != $mark redirect to :$dns_port
EOF
  fi
  cat <<EOF
    meta l4proto tcp $m == $ret_mark accept
    oifname "lo" ip daddr != 127.0.0.1 accept
    oifname "lo" ip6 daddr != ::1 accept
    meta l4proto tcp ip daddr != 127.0.0.1 $m != $mark redirect to :$out_port
    meta l4proto tcp ip6 daddr != ::1 $m != $mark redirect to :$out_port
  }
  chain mangle-prerouting {
    type filter hook prerouting priority -150; policy accept;
    $m == $mark ct mark set ct mark & 0xfffff000 | $ret_mark
  }
  chain mangle-output {
    type route hook output priority -150; policy accept;
    ct mark & $mask == $ret_mark meta mark set ct mark
  }
EOF
  if [ "$dns" = 1 ]; then
    cat <<EOF
  chain raw-prerouting {
    type filter hook prerouting priority -300; policy accept;
    udp sport 53 $m != $mark ct zone set 1
  }
  chain raw-output {
    type filter hook output priority -300; policy accept;
    udp dport 53 $m == $mark ct zone set 1
  }
EOF
  fi
  echo "}"
}

if [ "$action" = print ]; then
  [ -z "$netns" ] || die "--print takes no network namespace"
  rules
  exit 0
fi

[ -n "$netns" ] || usage
if [ "$(id -u)" != 0 ]; then
  die "needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) to change nftables and routing in netns $netns"
fi
for tool in ip nft; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (apt-get install -y iproute2 nftables)"
done
if ! ip netns list | awk '{print $1}' | grep -qxF -- "$netns"; then
  die "no network namespace named $netns"
fi

in_ns() { ip netns exec "$netns" "$@"; }

# IPv6 in the namespace: the v6 return path only where lo has IPv6 (as
# istio-cni; the ip6 nft rules are harmless either way). The kernel takes
# an IPv6 route through lo only while lo is up, as it is in every pod.
v6=0
if [ "$(in_ns cat /proc/sys/net/ipv6/conf/lo/disable_ipv6 2>/dev/null || echo 1)" = 0 ]; then
  if in_ns ip link show lo | grep -q '[<,]UP[,>]'; then
    v6=1
  elif [ "$action" = install ]; then
    echo "$prog: lo is down in $netns: no IPv6 return path (bring lo up and run again)" >&2
  fi
fi
families=(-4)
[ "$v6" = 1 ] && families+=(-6)

any_route() { if [ "$1" = -6 ]; then echo ::/0; else echo 0.0.0.0/0; fi; }

# Is our policy rule there (exactly: mark/mask, preference, table)?
have_rule() {
  in_ns ip "$1" rule show pref "$rule_pref" 2>/dev/null |
    grep -q "fwmark $ret_mark/$mask lookup $table\b"
}

remove_route_bits() {
  local fam
  for fam in -4 -6; do
    while in_ns ip "$fam" rule del fwmark "$ret_mark/$mask" pref "$rule_pref" lookup "$table" 2>/dev/null; do :; done
    # Only the one route this script adds: the table could hold others.
    in_ns ip "$fam" route del local "$(any_route "$fam")" dev lo table "$table" 2>/dev/null || true
  done
}

if [ "$action" = remove ]; then
  in_ns nft delete table $nft_table 2>/dev/null || true
  remove_route_bits
  exit 0
fi

# Refuse a routing table that holds routes this script did not add: its
# lookup would catch the return path's packets.
for fam in "${families[@]}"; do
  other=$(in_ns ip "$fam" route show table "$table" 2>/dev/null |
    grep -v "^local \(0.0.0.0/0\|default\|::/0\) dev lo" || true)
  if [ -n "$other" ]; then
    die "routing table $table in $netns already holds other routes; pick another with --table:
$other"
  fi
done

rules | in_ns nft -f - || die "nft refused the rules (above) in netns $netns"
for fam in "${families[@]}"; do
  in_ns ip "$fam" route replace local "$(any_route "$fam")" dev lo table "$table"
  have_rule "$fam" ||
    in_ns ip "$fam" rule add fwmark "$ret_mark/$mask" pref "$rule_pref" lookup "$table"
done
