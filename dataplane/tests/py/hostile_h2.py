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

Prints one JSON line: how long the connection stayed open, the PINGs seen,
when a GOAWAY came (seconds since the TLS handshake).
"""

import argparse
import socket
import struct
import sys
import time

from hbone_common import client_context, emit_json

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, SETTINGS, PING, GOAWAY, CONTINUATION = 0, 1, 4, 6, 7, 9
ACK, END_HEADERS = 0x1, 0x4


def frame(kind, flags, stream, payload=b""):
    head = struct.pack(">I", len(payload))[1:] + bytes([kind, flags])
    return head + struct.pack(">I", stream) + payload


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
    tls.sendall(PREFACE + frame(SETTINGS, 0, 0))
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
