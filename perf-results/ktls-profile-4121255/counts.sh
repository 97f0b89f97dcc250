#!/bin/bash
# During one suite throughput run: count the ringways' system calls by type and
# the size of every skb handed to a device, first while passthrough bulk flows
# (ringway A busy, B idle), then while HBONE bulk flows (B busy).
set -u
OUT=$(realpath -m "$1"); mkdir -p $OUT; cd "$(dirname "$0")/../.."
target/release/ringway-perf suite --scenarios throughput --streams 1 --bytes 12G --rounds 1 \
  --no-calibrate --out $OUT/suite > $OUT/suite.log 2>&1 &
SUITE=$!
cpu_of() { awk '{print $14+$15}' /proc/$1/stat 2>/dev/null || echo 0; }
EV=syscalls:sys_enter_sendmsg,syscalls:sys_enter_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_enter_recvmsg,syscalls:sys_enter_io_uring_enter,syscalls:sys_enter_splice,syscalls:sys_enter_writev,syscalls:sys_enter_write,syscalls:sys_enter_read,syscalls:sys_enter_readv
A=""; B=""; donept=0; donehb=0
for i in $(seq 1 300); do
  sleep 0.5; kill -0 $SUITE 2>/dev/null || break
  if [ -z "$B" ]; then
    l=$(grep -m1 "started ringway pair 0" $OUT/suite.log) || continue
    A=$(echo "$l" | sed -E 's/.*node A pid ([0-9]+).*/\1/'); B=$(echo "$l" | sed -E 's/.*node B pid ([0-9]+).*/\1/')
  fi
  a1=$(cpu_of $A); b1=$(cpu_of $B); sleep 0.5; a2=$(cpu_of $A); b2=$(cpu_of $B)
  if [ $donept = 0 ] && [ $((a2-a1)) -ge 10 ] && [ $((b2-b1)) -le 1 ]; then
    echo "passthrough phase $(date +%T)" >> $OUT/counts.log
    perf stat -e $EV -p $A -o $OUT/pt-syscalls-a.txt -- sleep 3 & S1=$!
    perf record -e net:net_dev_xmit -a -o $OUT/pt-xmit.data -- sleep 3 2>/dev/null
    wait $S1; donept=1
  elif [ $donehb = 0 ] && [ $((b2-b1)) -ge 5 ]; then
    echo "hbone phase $(date +%T)" >> $OUT/counts.log
    perf stat -e $EV -p $A -o $OUT/hbone-syscalls-a.txt -- sleep 3 & S1=$!
    perf stat -e $EV -p $B -o $OUT/hbone-syscalls-b.txt -- sleep 3 & S2=$!
    perf record -e net:net_dev_xmit -a -o $OUT/hbone-xmit.data -- sleep 3 2>/dev/null
    wait $S1 $S2; donehb=1
  fi
done
wait $SUITE
grep "round 1/1" $OUT/suite.log >> $OUT/counts.log
