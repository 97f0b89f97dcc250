#!/bin/bash
# One profile run: the suite's HBONE throughput scenario (1 stream), with
# `perf record` attached to ringway A and ringway B while HBONE bulk flows.
# usage: profile.sh OUTDIR BYTES SECONDS
set -u
OUT=$(realpath -m "$1"); BYTES=${2:-6G}; SECS=${3:-6}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
ulimit -l unlimited; ulimit -n 65536
uptime > "$OUT/load-before.txt"
target/release/ringway-perf suite --scenarios throughput --streams 1 --bytes "$BYTES" --rounds 1 \
  --no-calibrate --out "$OUT/suite" > "$OUT/suite.log" 2>&1 &
SUITE=$!
# ringway A and B of this suite: children of the suite.
find_pids() {
  pgrep -P $SUITE -x ringway 2>/dev/null; for c in $(pgrep -P $SUITE); do pgrep -P $c -x ringway; done
}
cpu_of() { awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }
A=""; B=""
for i in $(seq 1 600); do
  sleep 0.5
  kill -0 $SUITE 2>/dev/null || break
  pids=$(find_pids | sort -u)
  [ -z "$pids" ] && continue
  for p in $pids; do
    args=$(tr '\0' ' ' < /proc/$p/cmdline)
    case "$args" in *node-b*|*ringway-b*) B=$p;; *) A=$p;; esac
  done
  [ -n "$B" ] || continue
  c1=$(cpu_of $B); sleep 0.5; c2=$(cpu_of $B)
  if [ $((c2 - c1)) -ge 5 ]; then   # ringway B busy (it carries only HBONE): HBONE bulk is flowing
    echo "HBONE bulk seen: A=$A B=$B at $(date +%T.%N)" >> "$OUT/profile.log"
    tr '\0' ' ' < /proc/$A/cmdline > "$OUT/ringway-a.cmdline"; tr '\0' ' ' < /proc/$B/cmdline > "$OUT/ringway-b.cmdline"
    a0=$(cpu_of $A); b0=$(cpu_of $B)
    perf record -F 999 --call-graph dwarf,16384 -p $A -o "$OUT/ringway-a.data" -- sleep $SECS 2>>"$OUT/profile.log" &
    P1=$!
    perf record -F 999 --call-graph dwarf,16384 -p $B -o "$OUT/ringway-b.data" -- sleep $SECS 2>>"$OUT/profile.log" &
    P2=$!
    wait $P1 $P2
    a1=$(cpu_of $A); b1=$(cpu_of $B)
    echo "ticks during recording: A=$((a1-a0)) B=$((b1-b0)) (of $((SECS*100)) per CPU)" >> "$OUT/profile.log"
    uptime >> "$OUT/profile.log"
    break
  fi
done
wait $SUITE
echo "suite exit $?" >> "$OUT/profile.log"
