#!/usr/bin/python3
"""Minimal HBONE server for interop tests.

Accepts mutual-TLS 1.3 connections (ALPN h2, client certificate required),
answers HTTP/2 CONNECT streams and then plays the target application itself:
`echo` returns every byte, `sink` counts bytes and answers with the count,
`reset` resets the stream once data (or END_STREAM) arrives.  Every finished
stream is logged as one JSON line to `--log`, flushed immediately, so tests can
inspect what a client (ringway) sent while the server keeps running.

Prints `READY <port>` once listening, and one JSON summary line when it stops
(after `--max-streams` streams, `--timeout` seconds without network activity,
or SIGTERM/SIGINT).  See README.md for flags, log format and exit codes.
"""

import argparse
import hashlib
import json
import signal
import socket
import ssl
import sys
import threading
import time

import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from hbone_common import (DEFAULT_CONN_WINDOW, DEFAULT_STREAM_WINDOW,
                          MAX_WINDOW, H2Pump, PeerClosed, decode_headers,
                          emit_json, format_addr, headers_dict, log,
                          new_connection, parse_hostport, peer_identities,
                          peer_identity, server_context)

EXIT_OK = 0
EXIT_CONFIG = 2
EXIT_H2 = 4
EXIT_TIMEOUT = 5

# Same as ztunnel's inbound HTTP/2 server.
MAX_CONCURRENT_STREAMS = 200

KNOWN_PSEUDO = {":method", ":scheme", ":path", ":authority", ":protocol"}
# RFC 9113 §8.2.2: connection-specific fields make a request malformed.
CONNECTION_SPECIFIC = {"connection", "keep-alive", "proxy-connection",
                       "transfer-encoding", "upgrade"}


def classify_request(pairs):
    """Decide what to do with a request header block.

    h2's own inbound validation is off (it rejects every CONNECT for lacking
    :scheme/:path), so the RFC 9113 rules are checked here.  Returns one of
      ("malformed", reason) -> RST_STREAM(PROTOCOL_ERROR), like the Rust h2 crate
      ("reject", reason)    -> 400, like ztunnel for non-CONNECT / bad authority
      ("accept", authority)
    """
    pseudo = {}
    seen_regular = False
    for name, value in pairs:
        if name != name.lower():
            return "malformed", f"uppercase header name {name!r}"
        if name.startswith(":"):
            if seen_regular:
                return "malformed", f"pseudo-header {name} after regular headers"
            if name not in KNOWN_PSEUDO:
                return "malformed", f"unknown pseudo-header {name}"
            if name in pseudo:
                return "malformed", f"duplicate pseudo-header {name}"
            pseudo[name] = value
        else:
            seen_regular = True
            if name in CONNECTION_SPECIFIC:
                return "malformed", f"connection-specific header {name}"
            if name == "te" and value != "trailers":
                return "malformed", "te other than trailers"
    method = pseudo.get(":method")
    if method is None:
        return "malformed", "missing :method"
    if method == "CONNECT" and ":protocol" not in pseudo:
        # Plain CONNECT (RFC 9113 §8.5): :scheme and :path are forbidden,
        # :authority is mandatory.
        if ":scheme" in pseudo or ":path" in pseudo:
            return "malformed", "CONNECT with :scheme or :path"
        if ":authority" not in pseudo:
            return "malformed", "CONNECT without :authority"
    else:
        if ":protocol" in pseudo and method != "CONNECT":
            return "malformed", ":protocol on a non-CONNECT request"
        missing = [h for h in (":scheme", ":path") if h not in pseudo]
        if missing:
            return "malformed", f"missing {' '.join(missing)}"
        return "reject", ("extended CONNECT" if method == "CONNECT"
                          else f"method {method} is not CONNECT")
    authority = pseudo[":authority"]
    try:
        host, _port = parse_hostport(authority)
    except ValueError:
        host = ""
    if not host:
        return "reject", f"bad :authority {authority!r}"
    return "accept", authority


class ServerStream:
    def __init__(self, sid):
        self.sid = sid
        self.headers = []
        self.method = None
        self.authority = None
        self.status = None
        self.received = 0
        self.sent = 0
        self.sha_received = hashlib.sha256()
        self.sha_sent = hashlib.sha256()
        self.out = bytearray()      # bytes waiting for send window
        self.end_after_out = False  # send END_STREAM once `out` is drained
        # Echo only: bytes received but not yet acknowledged to the peer,
        # because they are still in `out`.  See ServerConnection.on_data.
        self.unacked = 0
        self.local_closed = False
        self.remote_closed = False
        self.reset = False
        self.reset_code = None
        self.reset_by = None
        self.malformed = None
        self.reject_reason = None
        self.logged = False


class ServerConnection(threading.Thread):
    def __init__(self, server, sock, addr, conn_id):
        super().__init__(daemon=True, name=f"conn-{conn_id}")
        self.server = server
        self.args = server.args
        self.raw = sock
        self.addr = addr
        self.conn_id = conn_id
        self.streams = {}
        self.info = {}
        self.conn = None
        self.pump = None
        self.peer_goaway = False
        self.goaway_sent = False
        self.goaway_last_id = None
        self.requests = 0
        self.error = None
        self._rr = 0

    # ----------------------------------------------------------- records

    def finish(self, st, incomplete=False):
        if st.logged:
            return
        st.logged = True
        rec = {
            "kind": "stream",
            "conn": self.conn_id,
            "stream_id": st.sid,
            "peer_addr": self.info.get("peer_addr"),
            "local_addr": self.info.get("local_addr"),
            "peer_identity": self.info.get("peer_identity"),
            "peer_uris": self.info.get("peer_uris"),
            "method": st.method,
            "authority": st.authority,
            "headers": headers_dict(st.headers),
            "status": st.status,
            "received": st.received,
            "sent": st.sent,
            "sha256_received": st.sha_received.hexdigest(),
            "sha256_sent": st.sha_sent.hexdigest(),
            "reset": st.reset,
            "reset_code": st.reset_code,
            "reset_by": st.reset_by,
            "malformed": st.malformed,
            "reject_reason": st.reject_reason,
            "incomplete": incomplete,
        }
        self.server.record(rec)

    def maybe_finish(self, st):
        if st.reset or (st.local_closed and st.remote_closed):
            self.finish(st)

    # ------------------------------------------------------------- h2 I/O

    def respond(self, st, status, end):
        headers = [(":status", str(status))] + self.server.response_headers
        try:
            self.conn.send_headers(st.sid, headers, end_stream=end)
        except h2.exceptions.StreamClosedError:
            # h2 parses a whole read before we see its events, so the client
            # may already have reset this stream; its StreamReset event
            # follows and logs it.
            return
        st.status = status
        st.local_closed = end

    def reset(self, st, code):
        try:
            self.conn.reset_stream(st.sid, code)
        except h2.exceptions.StreamClosedError:
            pass
        st.reset, st.reset_by, st.reset_code = True, "local", int(code)
        self.release_unacked(st)
        self.finish(st)

    def release_unacked(self, st):
        """Return buffered-but-unechoed bytes to the connection window.

        The stream is gone, so h2 only credits the connection window here;
        forgetting this would shrink the connection window for every other
        stream until the connection stalls.
        """
        st.out.clear()
        if st.unacked:
            self.conn.acknowledge_received_data(st.unacked, st.sid)
            st.unacked = 0

    def send_goaway(self):
        """Queue a graceful GOAWAY (NO_ERROR) once; streams up to the last
        one we have seen are still served, the connection closes after them."""
        if self.goaway_sent:
            return
        self.goaway_last_id = self.conn.highest_inbound_stream_id
        self.pump.queue_raw(self.conn.goaway_frame_bytes(
            last_stream_id=self.goaway_last_id))
        self.goaway_sent = True
        log(f"conn {self.conn_id}: sent GOAWAY last_stream={self.goaway_last_id}")

    def on_request(self, ev):
        st = ServerStream(ev.stream_id)
        self.streams[st.sid] = st
        self.requests += 1
        st.headers = decode_headers(ev.headers)
        pseudo = dict(p for p in st.headers if p[0].startswith(":"))
        st.method = pseudo.get(":method")
        st.authority = pseudo.get(":authority")
        verdict, detail = classify_request(st.headers)
        if self.goaway_last_id is not None and st.sid > self.goaway_last_id:
            # Opened after our GOAWAY crossed it on the wire: not processed,
            # the client may retry it on a new connection.
            st.reject_reason = "after GOAWAY"
            self.reset(st, h2.errors.ErrorCodes.REFUSED_STREAM)
        elif self.args.refuse_after and self.requests > self.args.refuse_after:
            # A connection that looks alive but will not take new streams:
            # what a client's pooled connection meets when the peer is
            # going away without having said so yet.
            st.reject_reason = "refused (--refuse-after)"
            self.reset(st, h2.errors.ErrorCodes.REFUSED_STREAM)
        elif verdict == "malformed":
            log(f"conn {self.conn_id} stream {st.sid}: malformed: {detail}")
            st.malformed = detail
            self.reset(st, h2.errors.ErrorCodes.PROTOCOL_ERROR)
        elif verdict == "reject":
            st.reject_reason = detail
            self.respond(st, 400, end=True)
        elif self.args.status != 200:
            self.respond(st, self.args.status, end=True)
        else:
            self.respond(st, 200, end=False)

    def on_data(self, ev):
        st = self.streams.get(ev.stream_id)
        if st is None or st.logged:
            self.conn.acknowledge_received_data(ev.flow_controlled_length,
                                                ev.stream_id)
            return
        st.received += len(ev.data)
        st.sha_received.update(ev.data)
        tunnel_open = st.status == 200 and not st.local_closed and not st.reset
        if self.args.mode == "echo" and tunnel_open:
            # Back-pressure: the peer gets window back only when the bytes
            # have been echoed (handed to h2 in produce()).  Acknowledging on
            # receipt would let a peer that does not read our echo make us
            # buffer without bound.  Padding is never echoed, so credit it
            # right away.
            st.out += ev.data
            st.unacked += len(ev.data)
            padding = ev.flow_controlled_length - len(ev.data)
            if padding:
                self.conn.acknowledge_received_data(padding, st.sid)
        else:
            # Sink, or data after we refused the tunnel: consumed at once.
            self.conn.acknowledge_received_data(ev.flow_controlled_length,
                                                st.sid)
            if self.args.mode == "reset" and tunnel_open:
                self.reset(st, h2.errors.ErrorCodes.CANCEL)

    def on_stream_ended(self, ev):
        st = self.streams.get(ev.stream_id)
        if st is None or st.logged:
            return
        st.remote_closed = True
        if st.status == 200 and not st.local_closed and not st.reset:
            if self.args.mode == "sink":
                st.out += st.received.to_bytes(8, "big")
                st.end_after_out = True
            elif self.args.mode == "echo":
                # TCP half-close semantics: our FIN follows theirs once all
                # echoed bytes are out.
                st.end_after_out = True
            else:
                self.reset(st, h2.errors.ErrorCodes.CANCEL)
        self.maybe_finish(st)

    def on_reset(self, ev):
        st = self.streams.get(ev.stream_id)
        if st is None or st.logged:
            return
        st.reset, st.reset_by, st.reset_code = True, "peer", int(ev.error_code)
        self.release_unacked(st)
        self.finish(st)

    def handle_event(self, ev):
        if isinstance(ev, h2.events.RequestReceived):
            self.on_request(ev)
        elif isinstance(ev, h2.events.DataReceived):
            self.on_data(ev)
        elif isinstance(ev, h2.events.StreamEnded):
            self.on_stream_ended(ev)
        elif isinstance(ev, h2.events.StreamReset):
            self.on_reset(ev)
        elif isinstance(ev, h2.events.ConnectionTerminated):
            # Graceful or not, the client opens nothing new; streams already
            # running may finish (GracefulH2Connection keeps us OPEN).
            log(f"conn {self.conn_id}: GOAWAY from peer "
                f"error={ev.error_code!r} last_stream={ev.last_stream_id}")
            self.peer_goaway = True
            if ev.error_code != h2.errors.ErrorCodes.NO_ERROR:
                self.error = f"peer GOAWAY {ev.error_code!r}"
        # Settings, pings, window updates and priority need no action: h2
        # answers SETTINGS/PING itself and produce() rechecks send windows.

    def send_one_frame(self, st):
        room = self.pump.room()
        if room <= 0 or not st.out:
            return False
        try:
            window = self.conn.local_flow_control_window(st.sid)
        except h2.exceptions.StreamClosedError:
            return False
        n = min(window, self.conn.max_outbound_frame_size, len(st.out), room)
        if n <= 0:
            return False  # wait for the peer's WINDOW_UPDATE
        chunk = bytes(st.out[:n])
        del st.out[:n]
        self.conn.send_data(st.sid, chunk)
        st.sent += n
        st.sha_sent.update(chunk)
        credit = min(n, st.unacked)
        if credit:
            st.unacked -= credit
            self.conn.acknowledge_received_data(credit, st.sid)
        return True

    def produce(self):
        active = [st for st in self.streams.values()
                  if not st.logged and not st.reset and not st.local_closed]
        if not active:
            return
        # One frame per stream per round so no stream starves the others.
        self._rr = (self._rr + 1) % len(active)
        active = active[self._rr:] + active[:self._rr]
        progress = True
        while progress:
            progress = False
            for st in active:
                if self.send_one_frame(st):
                    progress = True
        for st in active:
            if not st.out and st.end_after_out:
                self.conn.end_stream(st.sid)
                st.local_closed = True
                self.maybe_finish(st)

    # ---------------------------------------------------------- lifecycle

    def handshake(self):
        try:
            self.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.raw.settimeout(10.0)
            tls = self.server.ctx.wrap_socket(self.raw, server_side=True)
        except (ssl.SSLError, OSError) as e:
            self.server.tls_failure(self.conn_id, self.addr, str(e))
            self.raw.close()
            return None
        alpn = tls.selected_alpn_protocol()
        if alpn != "h2":
            self.server.tls_failure(self.conn_id, self.addr,
                                    f"ALPN h2 not negotiated (got {alpn!r})")
            tls.close()
            return None
        self.info = {
            "peer_addr": format_addr(self.addr),
            "local_addr": format_addr(tls.getsockname()),
            "peer_identity": peer_identity(tls),
            "peer_uris": peer_identities(tls),
            "tls_version": tls.version(),
            "alpn": alpn,
            "cipher": tls.cipher()[0],
            "sni": getattr(tls, "hbone_sni", None),
        }
        return tls

    def run(self):
        try:
            self.serve()
        except Exception as e:  # a bug here must not go unnoticed
            import traceback
            traceback.print_exc()
            self.error = f"internal error: {e!r}"
            self.server.count_h2_error()

    def serve(self):
        tls = self.handshake()
        if tls is None:
            return
        a = self.args
        self.conn = new_connection(False, a.window, a.conn_window,
                                   max_streams=a.max_concurrent_streams)
        self.pump = H2Pump(tls, self.conn)
        drain_deadline = None
        try:
            while True:
                if self.server.stop.is_set() and drain_deadline is None:
                    # Graceful drain: GOAWAY but keep serving open streams,
                    # for at most --drain seconds.
                    self.send_goaway()
                    drain_deadline = time.monotonic() + a.drain
                if a.goaway_after and self.requests >= a.goaway_after:
                    self.send_goaway()
                self.produce()
                self.pump.flush()
                self.server.touch(self.pump.last_activity)
                busy = any(not st.logged for st in self.streams.values())
                if self.pump.eof:
                    break
                if (self.goaway_sent or self.peer_goaway) and not busy:
                    break
                if drain_deadline is not None and time.monotonic() > drain_deadline:
                    break
                self.pump.wait(0.2)
                data = self.pump.read()
                if not data:
                    continue
                try:
                    events = self.conn.receive_data(data)
                except h2.exceptions.ProtocolError as e:
                    self.error = f"h2 protocol error: {e!r}"
                    log(f"conn {self.conn_id}: {self.error}")
                    self.server.count_h2_error()
                    self.conn.close_connection(
                        error_code=h2.errors.ErrorCodes.PROTOCOL_ERROR)
                    break
                for ev in events:
                    self.handle_event(ev)
        except PeerClosed as e:
            if any(not st.logged for st in self.streams.values()):
                self.error = f"connection lost: {e}"
        except ssl.SSLError as e:
            # A TLS alert after the handshake.
            self.error = f"tls: {e}"
        finally:
            unfinished = [st for st in self.streams.values() if not st.logged]
            if unfinished and self.error is None:
                self.error = "connection closed with unfinished streams"
            for st in unfinished:
                self.finish(st, incomplete=True)
            try:
                if self.conn.state_machine.state != h2.connection.ConnectionState.CLOSED:
                    self.conn.close_connection()
            except h2.exceptions.ProtocolError:
                pass
            self.pump.drain_and_close(time.monotonic() + 1.0)
            rec = {"kind": "connection", "conn": self.conn_id,
                   "streams": len(self.streams), "error": self.error}
            rec.update(self.info)
            self.server.record(rec)


def _remember_sni(tls_sock, server_name, _ctx):
    tls_sock.hbone_sni = server_name
    return None


class Server:
    def __init__(self, args):
        self.args = args
        self.ctx = server_context(args.cert, args.key, args.ca)
        # Remember the SNI a client sent (HBONE clients send none).
        self.ctx.sni_callback = _remember_sni
        self.response_headers = []
        for item in args.response_header:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise ValueError(f"--response-header wants name=value, got {item!r}")
            self.response_headers.append((name.lower(), value))
        self.log_fp = open(args.log, "w", encoding="utf-8") if args.log else None
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.stop_reason = None
        self.last_activity = time.monotonic()
        self.streams_done = 0
        self.connections = 0
        self.tls_errors = 0
        self.h2_errors = 0
        self.threads = []

    def touch(self, when):
        if when > self.last_activity:
            self.last_activity = when

    def count_h2_error(self):
        with self.lock:
            self.h2_errors += 1

    def record(self, rec):
        with self.lock:
            if self.log_fp is not None:
                self.log_fp.write(json.dumps(rec, sort_keys=True) + "\n")
                self.log_fp.flush()  # tests tail the log while we run
            if rec["kind"] == "stream":
                self.streams_done += 1
                m = self.args.max_streams
                if m and self.streams_done >= m and not self.stop.is_set():
                    self.stop_reason = "max-streams"
                    self.stop.set()

    def tls_failure(self, conn_id, addr, detail):
        log(f"conn {conn_id} from {format_addr(addr)}: TLS failure: {detail}")
        with self.lock:
            self.tls_errors += 1
        self.record({"kind": "tls_error", "conn": conn_id,
                     "peer_addr": format_addr(addr), "detail": detail})

    def on_signal(self, signum, _frame):
        if not self.stop.is_set():
            self.stop_reason = signal.Signals(signum).name
            self.stop.set()

    def serve(self):
        a = self.args
        host, port = parse_hostport(a.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        lsock = socket.socket(family, socket.SOCK_STREAM)
        lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsock.bind((host, port))
        lsock.listen(256)
        lsock.settimeout(0.2)
        print(f"READY {lsock.getsockname()[1]}", flush=True)
        log(f"listening on {format_addr(lsock.getsockname())}, mode {a.mode}")
        self.last_activity = time.monotonic()
        while not self.stop.is_set():
            if a.timeout and time.monotonic() - self.last_activity > a.timeout:
                self.stop_reason = "idle-timeout"
                self.stop.set()
                break
            try:
                sock, addr = lsock.accept()
            except socket.timeout:
                continue
            self.touch(time.monotonic())
            self.connections += 1
            t = ServerConnection(self, sock, addr, self.connections)
            self.threads.append(t)
            t.start()
        lsock.close()
        # Connections send GOAWAY and get `--drain` seconds to finish.
        end = time.monotonic() + a.drain + 1.5
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        if self.log_fp is not None:
            with self.lock:
                self.log_fp.close()
                self.log_fp = None
        code = EXIT_OK
        if self.h2_errors:
            code = EXIT_H2
        elif (self.stop_reason == "idle-timeout" and a.max_streams
              and self.streams_done < a.max_streams):
            code = EXIT_TIMEOUT
        emit_json({"kind": "summary", "reason": self.stop_reason,
                   "streams": self.streams_done, "connections": self.connections,
                   "tls_errors": self.tls_errors, "h2_errors": self.h2_errors,
                   "exit": code})
        return code


def window_arg(value):
    n = int(value)
    if not 1 <= n <= MAX_WINDOW:
        raise argparse.ArgumentTypeError(f"window must be 1..{MAX_WINDOW}")
    return n


def parse_args(argv):
    p = argparse.ArgumentParser(description="HBONE (HTTP/2 CONNECT over mTLS) test server")
    p.add_argument("--listen", required=True, metavar="HOST:PORT",
                   help="address to listen on; port 0 picks one (see READY line)")
    p.add_argument("--cert", required=True, action="append",
                   help="server cert PEM, leaf first, optionally followed by its chain; "
                        "repeat to add chain files (duplicates are dropped)")
    p.add_argument("--key", required=True, help="server private key PEM")
    p.add_argument("--ca", required=True, help="root cert(s) PEM to verify client certs")
    p.add_argument("--mode", choices=("echo", "sink", "reset"), default="echo",
                   help="what to do with tunnel bytes (default echo)")
    p.add_argument("--status", type=int, default=200,
                   help="status for well-formed CONNECTs (default 200; other "
                        "values end the stream at once)")
    p.add_argument("--response-header", action="append", default=[], metavar="NAME=VALUE",
                   help="extra response header on every response (repeatable)")
    p.add_argument("--log", metavar="FILE", help="JSON-lines log (truncated at start)")
    p.add_argument("--max-streams", type=int, default=0, metavar="N",
                   help="stop after N streams were logged (default 0 = never)")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="stop after this many seconds without network activity "
                        "(default 30; 0 = never)")
    p.add_argument("--goaway-after", type=int, default=0, metavar="N",
                   help="send a graceful GOAWAY on each connection once it has "
                        "carried N requests, finish those, then close (default 0 = never)")
    p.add_argument("--refuse-after", type=int, default=0, metavar="N",
                   help="answer RST_STREAM(REFUSED_STREAM) to every stream after "
                        "the first N requests of a connection, keeping the "
                        "connection open (default 0 = never)")
    p.add_argument("--max-concurrent-streams", type=int, default=MAX_CONCURRENT_STREAMS,
                   metavar="N", help="SETTINGS_MAX_CONCURRENT_STREAMS we advertise "
                                     f"(default {MAX_CONCURRENT_STREAMS}, like ztunnel)")
    p.add_argument("--drain", type=float, default=1.0,
                   help="seconds open streams get after our GOAWAY at shutdown (default 1)")
    p.add_argument("--window", type=window_arg, default=DEFAULT_STREAM_WINDOW,
                   help=f"our initial stream window (default {DEFAULT_STREAM_WINDOW})")
    p.add_argument("--conn-window", type=window_arg, default=DEFAULT_CONN_WINDOW,
                   help=f"our connection window (default {DEFAULT_CONN_WINDOW})")
    args = p.parse_args(argv)
    try:
        parse_hostport(args.listen)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        server = Server(args)
    except (OSError, ssl.SSLError, ValueError) as e:
        log(f"config error: {e}")
        emit_json({"kind": "summary", "error": "config", "detail": str(e),
                   "exit": EXIT_CONFIG})
        return EXIT_CONFIG
    signal.signal(signal.SIGTERM, server.on_signal)
    signal.signal(signal.SIGINT, server.on_signal)
    return server.serve()


if __name__ == "__main__":
    sys.exit(main())
