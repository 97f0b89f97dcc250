#!/usr/bin/env python3
# The estimate in docs/ktls.md: per-GiB CPU by category from the two profile
# runs (shares x the run's proxy CPU s/GiB x the A/B split of CPU ticks while
# recording), and what a kTLS + splice data path keeps of each (keep factor).
import json
import os
D=os.path.dirname(os.path.abspath(__file__))
runs={1:dict(total=1.8200, a=820, b=603), 2:dict(total=1.7733, a=431, b=366)}
groups=[
 ('kernel: socket copies (copy_to/from_user)', ['k: socket copies'], 0.0),
 ('kernel: TCP/IP stack, veth/lo, softirq', ['k: TCP/IP'], 1.0),
 ('kernel: scheduler, context switches, wake-ups', ['k: scheduler','k: wake-ups'], 1.0),
 ('kernel: io_uring', ['k: io_uring'], 1.0),
 ('kernel: syscall entry, memory, other', ['k: syscall','k: memory','k: other'], 1.0),
 ('user: AES-GCM + GHASH (ring)', ['u: AES-GCM','u: GHASH','u: ring, other'], 1.0),
 ('user: memcpy/memmove/memset', ['u: memcpy','u: memset'], 0.0),
 ('user: rustls record handling + tokio-rustls', ['u: rustls','u: tokio-rustls'], 0.0),
 ('user: h2 framing and streams', ['u: h2'], 0.25),
 ('user: allocator (jemalloc)', ['u: allocator'], 0.25),
 ('user: executor + io_uring reactor', ['u: executor'], 1.0),
 ('user: pump, bytes, libc wrappers, other', ['u: ringway','u: bytes','u: libc','u: other'], 0.5),
]
out={}
for r,meta in runs.items():
    share={'a':meta['a']/(meta['a']+meta['b']),'b':meta['b']/(meta['a']+meta['b'])}
    bd={p:json.load(open(f'{D}/profile-run{r}/breakdown-ringway-{p}.json'))['cats'] for p in 'ab'}
    rows=[]
    for name,prefixes,keep in groups:
        pa=sum(v for c,v in bd['a'].items() if any(c.startswith(x) for x in prefixes))
        pb=sum(v for c,v in bd['b'].items() if any(c.startswith(x) for x in prefixes))
        sa=meta['total']*share['a']*pa/100; sb=meta['total']*share['b']*pb/100
        rows.append((name,pa,pb,sa,sb,keep))
    out[r]=(rows,share,meta)
for r,(rows,share,meta) in out.items():
    print(f'run {r}: total {meta["total"]} s/GiB, A {share["a"]*100:.0f}% B {share["b"]*100:.0f}%')
    tot=0; kept=0
    for name,pa,pb,sa,sb,keep in rows:
        print('  %-50s A %5.1f%%  B %5.1f%%   A+B %.3f s/GiB  (%4.1f%%)  kept %.3f'%(name,pa,pb,sa+sb,100*(sa+sb)/meta['total'],(sa+sb)*keep))
        tot+=sa+sb; kept+=(sa+sb)*keep
    print('  sum %.3f  kept %.3f  removed %.3f (%.1f%%)'%(tot,kept,tot-kept,100*(tot-kept)/tot))
    for added in (0.06,0.15):
        print('   + added kTLS/splice %.2f -> %.2f s/GiB (%.2fx today)'%(added,kept+added,(kept+added)/tot))
