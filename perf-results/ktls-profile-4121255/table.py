#!/usr/bin/env python3
# Prints the profile table of docs/ktls.md from profile-run*/breakdown-ringway-*.json.
import json, os
D = os.path.dirname(os.path.abspath(__file__))
cols = [(1, 'a'), (2, 'a'), (1, 'b'), (2, 'b')]
bd = {k: json.load(open(f'{D}/profile-run{k[0]}/breakdown-ringway-{k[1]}.json')) for k in cols}
rows = [
    ('**kernel, all**', ['k:']),
    ('socket copies (`_copy_to_iter`, `_copy_from_iter`, usercopy checks)', ['k: socket copies']),
    ('TCP/IP, veth and loopback, softirq', ['k: TCP/IP']),
    ('scheduler, context switches, reschedule IPIs', ['k: scheduler']),
    ('wake-ups (`sock_def_readable`, `try_to_wake_up`)', ['k: wake-ups']),
    ('io_uring (enter, poll, task work)', ['k: io_uring']),
    ('syscall entry, fd lookup, memory, other', ['k: syscall', 'k: memory', 'k: other']),
    ('**user, all**', ['u:']),
    ('AES-GCM (ring, VAES-AVX2, GHASH stitched in)', ['u: AES-GCM', 'u: ring, other']),
    ('GHASH outside the stitched loop', ['u: GHASH']),
    ('memcpy TX: h2 payload → rustls record', ['u: memcpy TX']),
    ('memcpy RX: read-ahead → rustls deframer', ['u: memcpy RX, TLS read-ahead']),
    ('memcpy RX: decrypted record → rustls plaintext queue', ['u: memcpy RX, decrypted']),
    ('memcpy RX: rustls plaintext → h2 read buffer', ['u: memcpy RX, rustls plaintext']),
    ('memcpy/memset, other (buffer growth, h2 encode)', ['u: memcpy, buffer', 'u: memcpy, h2', 'u: memcpy, other', 'u: memcpy, pump', 'u: memset']),
    ('h2 framing and streams', ['u: h2']),
    ('rustls record handling + tokio-rustls', ['u: rustls', 'u: tokio-rustls']),
    ('allocator (jemalloc)', ['u: allocator']),
    ('executor + io_uring reactor', ['u: executor']),
    ('other (pump, bytes, libc wrappers, std)', ['u: ringway', 'u: bytes', 'u: libc', 'u: other']),
]
print('| % of the process\'s samples | A run 1 | A run 2 | B run 1 | B run 2 |')
print('|---|---:|---:|---:|---:|')
print('| samples | ' + ' | '.join(str(bd[k]['samples']) for k in cols) + ' |')
for name, pre in rows:
    vals = [sum(v for c, v in bd[k]['cats'].items() if any(c.startswith(p) for p in pre)) for k in cols]
    print(f'| {name} | ' + ' | '.join(f'{v:.1f}' if v >= 0.05 else '–' for v in vals) + ' |')
