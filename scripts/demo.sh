#!/usr/bin/env bash
# ringway in a minute, as root: two "nodes" (network namespaces joined by a
# veth), each holding one pod and that pod's ringway, with the pod's egress
# captured to ringway's 15001 by nftables. A mesh config (ztunnel's
# LOCAL_XDS schema) describes the pods and a Service. The demo sends
#
#   1. pod -> pod       (client on node A to the server pod on node B, which
#                        sees the client's address: --orig-src)
#   2. pod -> Service   (to the Service VIP, load-balanced to the server pod)
#   3. pod -> outside   (to a TCP workload that is not in the mesh)
#
# prints what ringway A decided for each (route, upstream, identities) and
# what ringway B saw, shows that what crossed the wire to port 15008 was TLS
# (a packet tap on node B's interface finds the request text in none of
# the packets), and removes everything it created, even when it fails.
#
#   scripts/demo.sh                       # builds ringway (release) first
#   RINGWAY=path/to/ringway scripts/demo.sh
#
# As root; as another user it re-runs itself under sudo (keeping PATH and
# the cargo and RINGWAY variables). The release build goes where cargo puts
# it: $CARGO_TARGET_DIR when set.
set -euo pipefail
. "$(dirname "$0")/lib/common.sh"
rerun_as_root "it creates network namespaces and nftables rules" "$0" "$@"
cd "$(dirname "$0")/.."
need=()
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ -z "${RINGWAY:-}" ]; then
  echo "== building ringway (release)"
  cargo build --release --quiet --bin ringway
  target=$(ringway_target_dir)
  RINGWAY=$target/release/ringway
fi

TAG="rwdemo$$"
NA="$TAG-a" NB="$TAG-b"
DIR=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  ip netns del "$NA" 2>/dev/null || true
  ip netns del "$NB" 2>/dev/null || true
  rm -rf "$DIR"
  if ip netns list | grep -q "^$TAG"; then
    echo "demo: namespaces left behind: $(ip netns list | grep "^$TAG")" >&2
    exit 1
  fi
  echo "== cleaned up: namespaces $NA and $NB removed"
}
trap cleanup EXIT

CLIENT=10.251.0.1 SERVER=10.251.0.2 LEGACY=10.251.0.3 VIP=10.96.251.10
echo "== two nodes: $NA (client pod $CLIENT) and $NB (server pod $SERVER, non-mesh pod $LEGACY)"
ip netns add "$NA"
ip netns add "$NB"
ip link add "$TAG-va" type veth peer name "$TAG-vb"
ip link set "$TAG-va" netns "$NA"
ip link set "$TAG-vb" netns "$NB"
ip -n "$NA" addr add "$CLIENT/24" dev "$TAG-va"
ip -n "$NB" addr add "$SERVER/24" dev "$TAG-vb"
ip -n "$NB" addr add "$LEGACY/24" dev "$TAG-vb"
for ns in "$NA" "$NB"; do ip -n "$ns" link set lo up; done
ip -n "$NA" link set "$TAG-va" up
ip -n "$NB" link set "$TAG-vb" up
ip -n "$NA" route add 10.96.0.0/16 dev "$TAG-va" # Service VIPs
# The client pod's egress goes to ringway A's 15001, except ringway's own
# sockets (SO_MARK 0x539): the rule shape istio-cni installs in a pod.
scripts/capture-netns.sh "$NA"

cat >"$DIR/mesh.yaml" <<EOF
workloads:
- uid: demo//v1/Pod/shop/client
  name: client
  namespace: shop
  serviceAccount: client
  workloadIps: ["$CLIENT"]
  protocol: HBONE
  node: node-a
  canonicalName: client
- uid: demo//v1/Pod/shop/server
  name: server
  namespace: shop
  serviceAccount: server
  workloadIps: ["$SERVER"]
  protocol: HBONE
  node: node-b
  canonicalName: server
  services:
    shop/server.shop.svc.cluster.local: {80: 8080}
- uid: demo//v1/Pod/legacy/db
  name: db
  namespace: legacy
  workloadIps: ["$LEGACY"]
  protocol: TCP
  node: node-b
services:
- name: server
  namespace: shop
  hostname: server.shop.svc.cluster.local
  vips: ["/$VIP"]
  ports: {80: 8080}
EOF

start_ringway() { # netns node-name [flags]
  local ns=$1 node=$2
  shift 2
  ip netns exec "$ns" "$RINGWAY" --config "$DIR/mesh.yaml" --ca-dir "$DIR/ca" \
    --node-name "$node" --log-format json --readiness-addr 127.0.0.1:15021 "$@" \
    >"$DIR/$node.log" 2>&1 &
  PIDS+=($!)
}
# One CA for both nodes: start A first so that it creates the root.
start_ringway "$NA" node-a
for _ in $(seq 100); do [ -f "$DIR/ca/root-cert.pem" ] && break; sleep 0.1; done
# Node B connects to its applications from the client's own address
# (--orig-src), with the return-path routing that needs.
scripts/orig-src-rules.sh add --netns "$NB"
start_ringway "$NB" node-b --orig-src
for ns in "$NA" "$NB"; do
  ready=""
  for _ in $(seq 100); do
    if ip netns exec "$ns" python3 -c 'import urllib.request,sys; sys.exit(0 if urllib.request.urlopen("http://127.0.0.1:15021/healthz/ready").status==200 else 1)' 2>/dev/null; then
      ready=1; break
    fi
    sleep 0.1
  done
  [ -n "$ready" ] || { echo "demo: ringway in $ns did not become ready; its log:" >&2; cat "$DIR"/*.log >&2; exit 1; }
done
echo "== ringway running on both nodes (readiness 200)"

# The applications on node B: each answers with what it saw.
start_app() { # address port label
  ip netns exec "$NB" python3 - "$@" >/dev/null 2>&1 <<'EOF' &
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind((sys.argv[1], int(sys.argv[2]))); l.listen()
while True:
    c, peer = l.accept()
    req = c.recv(1024).decode(errors="replace").strip()
    c.sendall(f"{sys.argv[3]} got {req!r} from {peer[0]}".encode()); c.close()
EOF
  PIDS+=($!)
}
start_app "$SERVER" 8080 "server pod"
start_app "$LEGACY" 5432 "non-mesh db"
sleep 0.5

# A packet tap on node B's interface: every TCP payload to or from 15008.
ip netns exec "$NB" python3 - "$TAG-vb" "$DIR/tap" <<'EOF' &
import socket, struct, sys
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0800))
s.bind((sys.argv[1], 0))
with open(sys.argv[2], "wb") as out:
    while True:
        f = s.recv(65535)
        ip = f[14:]
        if ip[9] != 6: continue
        ihl = (ip[0] & 15) * 4
        tcp = ip[ihl:]
        sport, dport = struct.unpack("!HH", tcp[:4])
        payload = tcp[(tcp[12] >> 4) * 4:]
        if 15008 in (sport, dport) and payload:
            out.write(struct.pack("!HI", dport, len(payload)) + payload); out.flush()
EOF
PIDS+=($!)
sleep 0.3

ask() { # what, destination
  local reply
  reply=$(ip netns exec "$NA" python3 -c '
import socket, sys
ip, port = sys.argv[1].rsplit(":", 1)
s = socket.create_connection((ip, int(port)), timeout=10)
s.sendall(sys.argv[2].encode()); s.shutdown(socket.SHUT_WR)
print(s.recv(4096).decode(errors="replace"))' "$2" "$1")
  printf '   %-28s -> %s\n' "$1" "$reply"
}
echo "== traffic from the client pod (node A)"
ask "GET /hello (pod to pod)" "$SERVER:8080"
ask "GET /hello (to the Service)" "$VIP:80"
ask "SELECT 1 (to the non-mesh db)" "$LEGACY:5432"
sleep 0.5

# One line per access-log entry of ringway's log $1: its decisions
# (outbound) or what it saw (inbound).
show_log() {
  python3 - "$1" "$2" <<'EOF'
import json, sys
for line in open(sys.argv[1]):
    try: l = json.loads(line)
    except ValueError: continue
    if l.get("scope") != "access": continue
    end = l.get("outcome") or l.get("error")
    service = f"  service={l['dst.service']}" if l.get("dst.service") else ""
    if sys.argv[2] == "outbound":
        print(f"   {l.get('src.workload')} -> {l.get('dst.hbone_addr') or l.get('dst.addr')}"
              f"  route={l.get('route'):<12} via={l.get('dst.addr')}{service}"
              f"  as={l.get('src.identity')}  to={l.get('dst.identity')}  {end}")
    else:
        print(f"   from {l.get('src.identity')} to {l.get('dst.workload')}"
              f" at {l.get('dst.hbone_addr')}{service}: {end}")
EOF
}
echo "== what ringway A decided (its access log)"
show_log "$DIR/node-a.log" outbound
echo "== what ringway B saw (inbound HBONE)"
show_log "$DIR/node-b.log" inbound

echo "== on the wire to port 15008"
python3 - "$DIR/tap" <<'EOF'
import struct, sys
data = open(sys.argv[1], "rb").read()
packets, i = [], 0
while i + 6 <= len(data):
    dport, n = struct.unpack("!HI", data[i:i + 6]); packets.append(data[i + 6:i + 6 + n]); i += 6 + n
first = packets[0][:3].hex() if packets else "-"
plain = sum(b"GET /hello" in p for p in packets)
kind = "a TLS handshake record (16 03 01)" if first == "160301" else f"bytes {first}"
print(f"   {len(packets)} packets with payload; the first starts with {kind};")
print(f"   the request text 'GET /hello' appears in {plain} of them")
if not packets or first != "160301" or plain:
    sys.exit("demo: port 15008 did not carry TLS as expected")
EOF
echo "== done"
