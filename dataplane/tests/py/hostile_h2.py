#!/usr/bin/env python3
"""A hostile HBONE client for the time-bound tests (tests/hostile_time.rs).

Completes mutual TLS and the HTTP/2 preface by hand (raw frames, so it can
misbehave where the h2 library would not let it), then:

  no-ack       never ACKs the server's SETTINGS, never answers PINGs, and
               sends a header block of --header-bytes without END_HEADERS;
  ping-no-ack  the same, but answers PINGs;
  idle         behaves (ACKs SETTINGS, answers PINGs) for --answer-for
               seconds with no stream open, then stops answering PINGs;
  quiet        behaves and never opens a stream (for the idle timeout).
  flood        behaves (ACKs SETTINGS), then sends --frame frames as fast
               as the socket takes them for --duration seconds, reading the
               server's answers or (--no-read) never reading them
               (tests/hostile_floods.rs); see FLOODS.
  trickle      sends the HTTP/2 preface one byte every --every seconds
               after TLS (tests/hostile_slowloris.rs).

Prints one JSON line: how long the connection stayed open, the PINGs seen,
when a GOAWAY came (seconds since the TLS handshake).
"""

import argparse
import select
import socket
import ssl
import struct
import sys
import time

import hpack

from hbone_common import client_context, emit_json

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = (
    0, 1, 3, 4, 6, 7, 8, 9
)
ACK, END_HEADERS = 0x1, 0x4


def frame(kind, flags, stream, payload=b""):
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
    return head + struct.pack(">I", stream) + payload


# What each --frame of the flood mode sends, over and over. Stream modes
# first open a CONNECT stream (stream 1) to --authority.
FLOODS = {
    # HEADERS without END_HEADERS, then empty CONTINUATIONs: never over
    # the header list limit, only ever more frames.
    "continuation": "a header block that never ends, in empty frames",
    # The same with 16 KiB of literal headers in each: over 64 KiB soon.
    "continuation-big": "a header block that never ends, 16 KiB a frame",
    "settings": "SETTINGS, toggling INITIAL_WINDOW_SIZE",
    "ping": "PING",
    "window": "WINDOW_UPDATE +1 on the connection",
    "window-stream": "WINDOW_UPDATE +1 on an open stream",
    "window-overflow": "WINDOW_UPDATE +2^31-1 on the connection",
    "window-overflow-stream": "WINDOW_UPDATE +2^31-1 on an open stream",
}


class Peer:
    """The server's frames as they come: what the flood's report counts."""

    def __init__(self, tls, start):
        self.tls = tls
        self.start = start
        self.buf = b""
        self.received = 0
        self.counts = {}
        self.goaway_code = None
        self.goaway_after = None
        self.rst_codes = []
        self.status_seen = False
        self.settings_seen = False
        self.closed = None
        # Answers to the server's keepalive PINGs, sent between batches.
        self.pongs_due = b""

    def feed(self, data):
        self.received += len(data)
        self.buf += data
        while len(self.buf) >= 9:
            length = int.from_bytes(self.buf[:3], "big")
            if len(self.buf) < 9 + length:
                break
            kind, flags = self.buf[3], self.buf[4]
            payload = self.buf[9 : 9 + length]
            self.buf = self.buf[9 + length :]
            name = {SETTINGS: "settings", PING: "ping"}.get(kind, str(kind))
            if kind in (SETTINGS, PING) and flags & ACK:
                name += "_ack"
            self.counts[name] = self.counts.get(name, 0) + 1
            if kind == SETTINGS and not flags & ACK:
                self.settings_seen = True
            elif kind == PING and not flags & ACK:
                self.pongs_due += frame(PING, ACK, 0, payload)
            elif kind == HEADERS:
                self.status_seen = True
            elif kind == RST_STREAM:
                self.rst_codes.append(int.from_bytes(payload[:4], "big"))
            elif kind == GOAWAY and self.goaway_code is None:
                self.goaway_after = round(time.monotonic() - self.start, 3)
                self.goaway_code = int.from_bytes(payload[4:8], "big")

    def read_some(self):
        """Reads what is there without blocking; False once closed."""
        while True:
            try:
                data = self.tls.recv(65536)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                return True
            except OSError:
                data = b""
            if not data:
                if self.closed is None:
                    self.closed = round(time.monotonic() - self.start, 3)
                return False
            self.feed(data)

    def wait_for(self, what, limit):
        """Reads (blocking, up to `limit` s) until `what()` holds."""
        end = time.monotonic() + limit
        while not what() and time.monotonic() < end:
            select.select([self.tls], [], [], 0.1)
            if not self.read_some():
                break
        return what()


def window_update(stream, increment):
    return frame(WINDOW_UPDATE, 0, stream, struct.pack(">I", increment))


def batch_for(kind):
    """One batch of flood frames, and the frames in it."""
    n = 4096
    if kind == "continuation":
        return frame(CONTINUATION, 0, 1) * n, n
    if kind == "continuation-big":
        # 78 literal fields (without indexing, new name) of 210 bytes:
        # each counts 238 bytes against the header list limit.
        field = b"\x00\x06x-junk\x7f\x49" + b"y" * 200
        return frame(CONTINUATION, 0, 1, field * 78), 1
    if kind == "settings":
        toggle = [struct.pack(">HI", 4, 65535 + (i % 2)) for i in range(2)]
        return b"".join(frame(SETTINGS, 0, 0, toggle[i % 2]) for i in range(n)), n
    if kind == "ping":
        return b"".join(frame(PING, 0, 0, struct.pack(">Q", i)) for i in range(n)), n
    if kind == "window":
        return window_update(0, 1) * n, n
    if kind == "window-stream":
        return window_update(1, 1) * n, n
    if kind == "window-overflow":
        return window_update(0, 2**31 - 1) * 8, 8
    if kind == "window-overflow-stream":
        return window_update(1, 2**31 - 1) * 8, 8
    raise SystemExit("unknown --frame " + kind)


def flood(tls, a, start):
    peer = Peer(tls, start)
    tls.setblocking(False)
    if not peer.wait_for(lambda: peer.settings_seen, 5):
        return {"mode": "flood", "error": "no SETTINGS from the server"}
    tls.setblocking(True)
    tls.sendall(frame(SETTINGS, ACK, 0))
    first = b""
    if a.frame.startswith("continuation"):
        # The start of a CONNECT's header block, never ended.
        fragment = hpack.Encoder().encode(
            [(":method", "CONNECT"), (":authority", a.authority)]
        )
        first = frame(HEADERS, 0, 1, fragment)
    elif a.frame.endswith("-stream"):
        fragment = hpack.Encoder().encode(
            [(":method", "CONNECT"), (":authority", a.authority)]
        )
        tls.sendall(frame(HEADERS, END_HEADERS, 1, fragment))
        tls.setblocking(False)
        if not peer.wait_for(lambda: peer.status_seen, 5):
            return {"mode": "flood", "error": "no answer to the CONNECT"}
    batch, per_batch = batch_for(a.frame)
    tls.setblocking(False)
    pending = memoryview(first + batch)
    frames = 0
    last_progress = time.monotonic()
    longest_stall = 0.0
    write_error = None
    end = start + a.duration
    while time.monotonic() < end and peer.closed is None and write_error is None:
        readable, writable, _ = select.select(
            [tls] if a.read else [], [tls], [], 0.05
        )
        if readable or (a.read and tls.pending()):
            peer.read_some()
        if not writable:
            longest_stall = max(longest_stall, time.monotonic() - last_progress)
            continue
        try:
            while True:
                sent = tls.send(pending[:16384])
                pending = pending[sent:]
                last_progress = time.monotonic()
                if not pending:
                    frames += per_batch
                    if not a.frame.startswith("continuation"):
                        # (Not inside a header block: that would be a
                        # protocol error of its own.)
                        pending = memoryview(peer.pongs_due + batch)
                        peer.pongs_due = b""
                    else:
                        pending = memoryview(batch)
                    break
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            longest_stall = max(longest_stall, time.monotonic() - last_progress)
        except OSError as e:
            write_error = str(e)
    flooded_for = round(time.monotonic() - start, 3)
    # What the server said last (a GOAWAY), if the socket still has it.
    tls.setblocking(False)
    peer.wait_for(lambda: peer.closed is not None, a.drain)
    return {
        "mode": "flood",
        "frame": a.frame,
        "read": a.read,
        "frames_sent": frames,
        "flooded_for": flooded_for,
        "longest_write_stall": round(longest_stall, 3),
        "write_error": write_error,
        "received_bytes": peer.received,
        "received": peer.counts,
        "goaway_code": peer.goaway_code,
        "goaway_after": peer.goaway_after,
        "rst_codes": sorted(set(peer.rst_codes)),
        "closed_after": peer.closed,
    }


def trickle(tls, a, start):
    """The preface a byte at a time, every --every s, then SETTINGS."""
    tls.settimeout(a.every)
    sent = 0
    closed = None
    for byte in PREFACE + frame(SETTINGS, 0, 0):
        try:
            tls.sendall(bytes([byte]))
            sent += 1
            data = tls.recv(65536)
            if not data:
                break
        except socket.timeout:
            continue
        except OSError:
            break
    else:
        # All sent: wait out the rest of --limit for the close.
        tls.settimeout(max(a.limit - (time.monotonic() - start), 0.1))
        try:
            while tls.recv(65536):
                pass
        except OSError:
            pass
    closed = time.monotonic() - start
    return {
        "mode": "trickle",
        "preface_bytes_sent": sent,
        "open_for": round(closed, 3),
        "hit_limit": closed >= a.limit,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--connect", required=True)
    ap.add_argument("--bind", default=None)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--ca", required=True)
    ap.add_argument("--mode", required=True)
    ap.add_argument("--header-bytes", type=int, default=1 << 20)
    ap.add_argument("--answer-for", type=float, default=0)
    ap.add_argument("--limit", type=float, default=60)
    ap.add_argument("--frame", choices=sorted(FLOODS), default="ping")
    ap.add_argument("--duration", type=float, default=5)
    ap.add_argument("--no-read", dest="read", action="store_false")
    ap.add_argument("--drain", type=float, default=3,
                    help="after the flood: seconds to wait for the close")
    ap.add_argument("--authority", default="127.0.0.1:8081")
    ap.add_argument("--every", type=float, default=0.5)
    a = ap.parse_args()

    host, port = a.connect.rsplit(":", 1)
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if a.bind:
        raw.bind((a.bind, 0))
    raw.connect((host, int(port)))
    ctx = client_context(a.cert, a.key, a.ca)
    ctx.set_alpn_protocols(["h2"])
    tls = ctx.wrap_socket(raw, server_hostname=None)
    start = time.monotonic()
    if a.mode == "trickle":
        emit_json(trickle(tls, a, start))
        return 0
    tls.sendall(PREFACE + frame(SETTINGS, 0, 0))
    if a.mode == "flood":
        emit_json(flood(tls, a, start))
        return 0
    sent = 0
    write_error = None
    if a.mode in ("no-ack", "ping-no-ack") and a.header_bytes > 0:
        # HEADERS then CONTINUATIONs of junk, never END_HEADERS: a header
        # block the server's advertised limit (64 KiB) should refuse, held
        # only by the pre-ACK default.
        chunk = b"\x00" * 16384
        tls.sendall(frame(HEADERS, 0, 1, chunk))
        sent = len(chunk)
        while sent < a.header_bytes:
            try:
                tls.sendall(frame(CONTINUATION, 0, 1, chunk))
            except OSError as e:
                write_error = str(e)
                break
            sent += len(chunk)

    pings = 0
    goaway = None
    goaway_code = None
    buf = b""
    tls.settimeout(0.5)
    while time.monotonic() - start < a.limit:
        try:
            data = tls.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            break
        if not data:
            break
        buf += data
        while buf is not None and len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            if len(buf) < 9 + length:
                break
            kind, flags = buf[3], buf[4]
            payload = buf[9 : 9 + length]
            buf = buf[9 + length :]
            now = time.monotonic() - start
            if kind == SETTINGS and not flags & ACK and a.mode in ("idle", "quiet"):
                try:
                    tls.sendall(frame(SETTINGS, ACK, 0))
                except OSError:
                    buf = None
                    break
            elif kind == PING and not flags & ACK:
                pings += 1
                answer = a.mode in ("ping-no-ack", "quiet") or (
                    a.mode == "idle" and now < a.answer_for
                )
                if answer:
                    try:
                        tls.sendall(frame(PING, ACK, 0, payload))
                    except OSError:
                        buf = None
                        break
            elif kind == GOAWAY and goaway is None:
                goaway = now
                goaway_code = int.from_bytes(payload[4:8], "big")
        if buf is None:
            break
    closed = time.monotonic() - start
    emit_json(
        {
            "mode": a.mode,
            "open_for": round(closed, 3),
            "hit_limit": closed >= a.limit,
            "pings": pings,
            "goaway_after": None if goaway is None else round(goaway, 3),
            "header_bytes_sent": sent,
            "write_error": write_error,
            "goaway_code": goaway_code,
        }
    )


if __name__ == "__main__":
    sys.exit(main())
