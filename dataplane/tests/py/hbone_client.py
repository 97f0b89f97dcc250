#!/usr/bin/python3
"""HBONE client for interop tests.

Dials an HBONE endpoint (e.g. ringway's inbound :15008) over mutual TLS 1.3,
opens one or more HTTP/2 CONNECT streams to `--authority`, pushes a
deterministic payload through each, reads the response bytes, and prints ONE
JSON line with the results.  See README.md for the flags and output format.

Exit codes: 0 ok, 1 expectation mismatch, 2 usage/config error, 3 TLS
failure (incl. peer identity mismatch), 4 HTTP/2 failure (GOAWAY/close with
unfinished streams, protocol error), 5 timeout, 6 TCP connect failure.
"""

import argparse
import hashlib
import socket
import ssl
import sys
import time

import h2.connection
import h2.errors
import h2.events
import h2.exceptions

from hbone_common import (DEFAULT_CONN_WINDOW, DEFAULT_STREAM_WINDOW,
                          MAX_WINDOW, H2Pump, Payload, PeerClosed,
                          client_context, decode_headers, emit_json,
                          headers_dict, log, new_connection, parse_hostport,
                          peer_identities, peer_identity)

EXIT_OK = 0
EXIT_MISMATCH = 1
EXIT_CONFIG = 2
EXIT_TLS = 3
EXIT_H2 = 4
EXIT_TIMEOUT = 5
EXIT_CONNECT = 6

MAX_STREAMS = 100


class Fail(Exception):
    def __init__(self, code, kind, detail):
        super().__init__(detail)
        self.code = code
        self.kind = kind
        self.detail = detail


class ClientStream:
    """One CONNECT stream and what happened on it."""

    def __init__(self, index, seed, total):
        self.index = index
        self.sid = None
        self.status = None
        self.response_headers = None
        self.payload = Payload(seed, index, total)
        self.sent = 0
        self.received = 0
        self.sha_sent = hashlib.sha256()
        self.sha_received = hashlib.sha256()
        self.head = bytearray()  # first bytes received, for --expect-sink
        self.local_closed = False
        self.remote_closed = False
        self.reset = False
        self.reset_code = None
        self.reset_by = None
        # Not served: opened above a GOAWAY's last_stream_id, or never
        # opened because a GOAWAY arrived first.
        self.refused = False

    @property
    def sending(self):
        return (self.status == 200 and not self.local_closed
                and not self.reset and not self.refused)

    @property
    def done(self):
        return (self.reset or self.refused
                or (self.local_closed and self.remote_closed))


class Client:
    def __init__(self, args):
        self.args = args
        self.start = time.monotonic()
        self.deadline = self.start + args.timeout
        self.streams = [ClientStream(i, args.seed, args.send_bytes)
                        for i in range(args.streams)]
        self.by_sid = {}
        self.unopened = list(self.streams)
        self.info = {"peer_identity": None, "peer_uris": [],
                     "tls_version": None, "alpn": None, "cipher": None,
                     "goaway": None}
        self.tls = None
        self.conn = None
        self.pump = None
        self.saw_server_frame = False
        self.saw_server_settings = False
        self._rr = 0  # round-robin start index for fair sending

    def remaining(self):
        return self.deadline - time.monotonic()

    # ---------------------------------------------------------------- TLS

    def connect_tls(self):
        a = self.args
        try:
            ctx = client_context(a.cert, a.key, a.ca)
        except (OSError, ssl.SSLError) as e:
            raise Fail(EXIT_CONFIG, "config", f"loading TLS material: {e}")
        host, port = parse_hostport(a.connect)
        try:
            raw = socket.create_connection(
                (host, port), timeout=max(0.1, self.remaining()),
                source_address=(a.bind, 0) if a.bind else None)
        except socket.timeout:
            raise Fail(EXIT_TIMEOUT, "timeout", f"TCP connect to {a.connect}")
        except OSError as e:
            raise Fail(EXIT_CONNECT, "connect", f"{a.connect}: {e}")
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            # server_hostname=None: HBONE sends no SNI.
            tls = ctx.wrap_socket(raw, server_hostname=None,
                                  do_handshake_on_connect=False)
            tls.settimeout(max(0.1, self.remaining()))
            tls.do_handshake()
        except ssl.SSLError as e:
            raw.close()
            raise Fail(EXIT_TLS, "tls", str(e))
        except socket.timeout:
            raw.close()
            raise Fail(EXIT_TIMEOUT, "timeout", "TLS handshake")
        except OSError as e:
            raw.close()
            raise Fail(EXIT_TLS, "tls", f"connection lost in handshake: {e}")
        self.tls = tls
        self.info.update(peer_identity=peer_identity(tls),
                         peer_uris=peer_identities(tls),
                         tls_version=tls.version(),
                         alpn=tls.selected_alpn_protocol(),
                         cipher=tls.cipher()[0])
        if self.info["alpn"] != "h2":
            raise Fail(EXIT_TLS, "tls",
                       f"ALPN h2 not negotiated (got {self.info['alpn']!r})")
        if a.expect_identity:
            # Like ztunnel: the peer is acceptable if one of its URI SANs is
            # among the expected identities.
            if not set(self.info["peer_uris"]) & set(a.expect_identity):
                raise Fail(EXIT_TLS, "tls",
                           f"peer identity {self.info['peer_uris']} not in "
                           f"{a.expect_identity}")

    # ---------------------------------------------------------------- H2

    def request_headers(self):
        a = self.args
        pseudo = [(":method", a.method)]
        if a.method != "CONNECT":
            # Ordinary requests need :scheme and :path (RFC 9113 §8.3.1);
            # CONNECT must not carry them (§8.5).
            pseudo += [(":scheme", "https"), (":path", "/")]
        pseudo.append((":authority", a.authority))
        regular = []
        for item in a.header:
            name, sep, value = item.partition("=")
            if not sep or not name:
                raise Fail(EXIT_CONFIG, "config",
                           f"--header wants name=value, got {item!r}")
            # Extra pseudo-headers (for malformed-request tests) must come
            # before regular ones.
            (pseudo if name.startswith(":") else regular).append((name, value))
        return pseudo + regular

    def open_streams(self):
        """Open queued streams as far as the server's concurrency allows."""
        conn = self.conn
        # Wait for the server's first SETTINGS: until then its
        # MAX_CONCURRENT_STREAMS is unknown (h2 assumes unlimited), and
        # opening too many streams would get them refused.
        if not self.saw_server_settings:
            return
        while self.unopened and self.info["goaway"] is None:
            if conn.open_outbound_streams >= conn.remote_settings.max_concurrent_streams:
                return
            st = self.unopened.pop(0)
            st.sid = conn.get_next_available_stream_id()
            self.by_sid[st.sid] = st
            # A non-CONNECT request has no body here: end it with HEADERS so
            # a server never waits for one before answering.
            end = self.args.method != "CONNECT"
            conn.send_headers(st.sid, self.headers, end_stream=end)
            st.local_closed = end

    def send_one_frame(self, st):
        """Queue one DATA frame for `st` if flow control allows; True if sent."""
        conn = self.conn
        room = self.pump.room()
        if room <= 0 or st.payload.remaining == 0:
            return False
        try:
            # local_flow_control_window = min(stream window, connection
            # window): the amount we may send on this stream right now.
            window = conn.local_flow_control_window(st.sid)
        except h2.exceptions.StreamClosedError:
            return False
        n = min(window, conn.max_outbound_frame_size,
                st.payload.remaining - self.held(), room)
        if n <= 0:
            return False  # blocked until the server sends WINDOW_UPDATE
        chunk = st.payload.take(n)
        conn.send_data(st.sid, chunk)
        st.sent += n
        st.sha_sent.update(chunk)
        return True

    def held(self):
        """Payload bytes kept back for now: with --hold, the second half of
        each stream's payload until --hold seconds after the start (the
        stream stays open meanwhile)."""
        a = self.args
        if a.hold and time.monotonic() - self.start < a.hold:
            return a.send_bytes - a.send_bytes // 2
        return 0

    def produce(self):
        """Push payload into h2, one frame per stream per round (fairness)."""
        active = [st for st in self.streams if st.sending]
        if not active:
            return
        self._rr = (self._rr + 1) % len(active)
        active = active[self._rr:] + active[:self._rr]
        progress = True
        while progress:
            progress = False
            for st in active:
                if self.send_one_frame(st):
                    progress = True
        for st in active:
            if st.payload.remaining:
                continue
            if self.args.reset_after_send:
                self.conn.reset_stream(st.sid, h2.errors.ErrorCodes.CANCEL)
                st.reset, st.reset_by = True, "local"
                st.reset_code = int(h2.errors.ErrorCodes.CANCEL)
            else:
                # END_STREAM = TCP FIN of our side (half-close).
                self.conn.end_stream(st.sid)
                st.local_closed = True

    def handle_event(self, ev):
        st = self.by_sid.get(getattr(ev, "stream_id", None))
        if isinstance(ev, h2.events.ResponseReceived):
            pairs = decode_headers(ev.headers)
            st.response_headers = headers_dict(pairs)
            st.status = int(st.response_headers.get(":status", "0"))
            if st.status != 200 and not st.local_closed and not st.reset:
                # The tunnel was refused; close our side too.  h2 has already
                # parsed the whole batch, so a RST_STREAM that followed the
                # response may have closed the stream under us.
                try:
                    self.conn.end_stream(st.sid)
                except h2.exceptions.StreamClosedError:
                    pass
                st.local_closed = True
        elif isinstance(ev, h2.events.DataReceived):
            if st is not None:
                st.received += len(ev.data)
                st.sha_received.update(ev.data)
                if len(st.head) < 64:
                    st.head += ev.data[:64 - len(st.head)]
            # We consume data immediately, so hand the window back at once.
            # Acknowledge the flow-controlled length, which includes padding,
            # not len(data): otherwise padded frames slowly leak the window.
            self.conn.acknowledge_received_data(ev.flow_controlled_length,
                                                ev.stream_id)
        elif isinstance(ev, h2.events.StreamEnded):
            if st is not None:
                st.remote_closed = True
        elif isinstance(ev, h2.events.StreamReset):
            if st is not None and not st.done:
                st.reset, st.reset_by = True, "peer"
                st.reset_code = int(ev.error_code)
        elif isinstance(ev, h2.events.RemoteSettingsChanged):
            self.saw_server_settings = True
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self.info["goaway"] = {"error_code": int(ev.error_code),
                                   "last_stream_id": ev.last_stream_id}
            log(f"GOAWAY error={ev.error_code!r} last_stream={ev.last_stream_id}")
            # Streams above last_stream_id were never processed; the rest
            # may still complete (graceful drain).
            for s in self.streams:
                if not s.done and (s.sid is None or s.sid > ev.last_stream_id):
                    s.refused = True
            self.unopened.clear()
            if ev.error_code != h2.errors.ErrorCodes.NO_ERROR and not self.all_done():
                raise Fail(EXIT_H2, "h2", f"GOAWAY {ev.error_code!r}")
        # Other events (settings, window updates, pings, priority) need no
        # action: h2 acks SETTINGS/PING itself and produce() rechecks windows.

    def all_done(self):
        return not self.unopened and all(st.done for st in self.streams)

    def run_h2(self):
        a = self.args
        self.headers = self.request_headers()
        self.conn = new_connection(True, a.window, a.conn_window)
        self.pump = H2Pump(self.tls, self.conn)
        try:
            while True:
                self.open_streams()
                self.produce()
                self.pump.flush()
                if self.all_done():
                    break
                if self.pump.eof:
                    self.closed_early()
                left = self.remaining()
                if left <= 0:
                    busy = sum(1 for st in self.streams if not st.done)
                    raise Fail(EXIT_TIMEOUT, "timeout",
                               f"{busy} of {len(self.streams)} streams unfinished")
                self.pump.wait(min(0.5, left))
                data = self.pump.read()
                if data:
                    try:
                        events = self.conn.receive_data(data)
                    except h2.exceptions.ProtocolError as e:
                        self.conn.close_connection(
                            error_code=h2.errors.ErrorCodes.PROTOCOL_ERROR)
                        raise Fail(EXIT_H2, "h2", f"protocol error: {e!r}")
                    if events:
                        self.saw_server_frame = True
                    for ev in events:
                        self.handle_event(ev)
        except PeerClosed:
            self.closed_early()
        except ssl.SSLError as e:
            # In TLS 1.3 the server checks our certificate after our side of
            # the handshake has finished, so a rejection shows up here, as an
            # alert on the first read (or write).
            raise Fail(EXIT_TLS, "tls", str(e))
        finally:
            try:
                if self.conn.state_machine.state != h2.connection.ConnectionState.CLOSED:
                    self.conn.close_connection()
            except h2.exceptions.ProtocolError:
                pass
            self.pump.drain_and_close(
                time.monotonic() + max(0.05, min(1.0, self.remaining())))

    def closed_early(self):
        if self.all_done():
            return
        if not self.saw_server_frame:
            detail = ("connection closed before the server's HTTP/2 preface "
                      "(client certificate rejected?)")
            # A write may notice the close first; the alert explaining it
            # can still be waiting to be read.
            try:
                self.pump.read()
            except (ssl.SSLError, OSError) as e:
                detail = f"{e}; {detail}"
            raise Fail(EXIT_TLS, "tls", detail)
        busy = sum(1 for st in self.streams if not st.done)
        if self.info["goaway"] is not None:
            raise Fail(EXIT_H2, "h2",
                       f"GOAWAY {self.info['goaway']}; {busy} streams unfinished")
        raise Fail(EXIT_H2, "h2", f"connection closed with {busy} streams unfinished")

    # ---------------------------------------------------------- results

    def verify(self):
        a = self.args
        problems = []
        for st in self.streams:
            tag = f"stream {st.index}"
            if st.refused:
                problems.append(f"{tag}: refused by GOAWAY")
                continue
            if a.expect_status is not None and st.status != a.expect_status:
                problems.append(f"{tag}: status {st.status} != {a.expect_status}")
            if a.echo and (st.reset or st.received != st.sent
                           or st.sha_received.digest() != st.sha_sent.digest()):
                problems.append(f"{tag}: echo mismatch (sent {st.sent}, "
                                f"received {st.received}, reset {st.reset})")
            if a.expect_sink:
                count = int.from_bytes(st.head[:8], "big") if st.received == 8 else None
                if st.reset or count != st.sent:
                    problems.append(f"{tag}: sink reply {st.received} bytes "
                                    f"(count {count}), expected count {st.sent}")
        if any(st.refused for st in self.streams):
            raise Fail(EXIT_H2, "h2", "; ".join(problems))
        if problems:
            raise Fail(EXIT_MISMATCH, "mismatch", "; ".join(problems))

    def result(self):
        out = dict(self.info)
        out.update(
            status=[st.status for st in self.streams],
            sent=[st.sent for st in self.streams],
            received=[st.received for st in self.streams],
            sha256_sent=[st.sha_sent.hexdigest() for st in self.streams],
            sha256_received=[st.sha_received.hexdigest() for st in self.streams],
            reset=[st.reset for st in self.streams],
            reset_code=[st.reset_code for st in self.streams],
            reset_by=[st.reset_by for st in self.streams],
            refused=[st.refused for st in self.streams],
            stream_id=[st.sid for st in self.streams],
            response_headers=[st.response_headers for st in self.streams],
            elapsed_ms=int((time.monotonic() - self.start) * 1000),
        )
        return out

    def run(self):
        code = EXIT_OK
        err = None
        try:
            self.connect_tls()
            self.run_h2()
            self.verify()
        except Fail as f:
            code, err = f.code, f
            log(f"{f.kind}: {f.detail}")
        out = self.result()
        if err is not None:
            out["error"], out["detail"] = err.kind, err.detail
        emit_json(out)
        return code


def window_arg(value):
    n = int(value)
    if not 1 <= n <= MAX_WINDOW:
        raise argparse.ArgumentTypeError(f"window must be 1..{MAX_WINDOW}")
    return n


def parse_args(argv):
    p = argparse.ArgumentParser(description="HBONE (HTTP/2 CONNECT over mTLS) test client")
    p.add_argument("--connect", required=True, metavar="HOST:PORT",
                   help="HBONE endpoint to dial, e.g. 10.0.2.7:15008")
    p.add_argument("--authority", required=True, metavar="IP:PORT",
                   help=":authority of the CONNECT request (the tunnel target)")
    p.add_argument("--cert", required=True, action="append",
                   help="client cert PEM, leaf first, optionally followed by its chain; "
                        "repeat to add chain files (duplicates are dropped)")
    p.add_argument("--key", required=True, help="client private key PEM")
    p.add_argument("--ca", required=True, help="root cert(s) PEM to verify the server chain")
    p.add_argument("--expect-identity", action="append", default=[], metavar="SPIFFE_ID",
                   help="require the server's URI SAN to be one of these (repeatable)")
    p.add_argument("--header", action="append", default=[], metavar="NAME=VALUE",
                   help="extra request header (repeatable); a name starting with ':' "
                        "adds a pseudo-header")
    p.add_argument("--method", default="CONNECT",
                   help="request method (non-CONNECT sends :scheme https, :path /, END_STREAM)")
    p.add_argument("--send-bytes", type=int, default=0, metavar="N",
                   help="payload bytes per stream, sent after a 200 (default 0)")
    p.add_argument("--streams", type=int, default=1, metavar="K",
                   help=f"concurrent streams on the one connection (1..{MAX_STREAMS})")
    p.add_argument("--echo", action="store_true",
                   help="expect each stream's response bytes to equal what was sent")
    p.add_argument("--expect-sink", action="store_true",
                   help="expect an 8-byte big-endian count of the bytes sent")
    p.add_argument("--expect-status", type=int, metavar="CODE",
                   help="expect this :status on every stream")
    p.add_argument("--reset-after-send", action="store_true",
                   help="after the payload, send RST_STREAM(CANCEL) instead of END_STREAM")
    p.add_argument("--hold", type=float, default=0.0, metavar="SECONDS",
                   help="send the second half of the payload (and END_STREAM) only "
                        "SECONDS after the start: the stream stays open meanwhile")
    p.add_argument("--seed", type=int, default=0, help="payload seed (default 0)")
    p.add_argument("--window", type=window_arg, default=DEFAULT_STREAM_WINDOW,
                   help=f"our initial stream window (default {DEFAULT_STREAM_WINDOW})")
    p.add_argument("--conn-window", type=window_arg, default=DEFAULT_CONN_WINDOW,
                   help=f"our connection window (default {DEFAULT_CONN_WINDOW})")
    p.add_argument("--bind", metavar="IP", help="source IP for the TCP connection")
    p.add_argument("--timeout", type=float, default=30.0,
                   help="overall deadline in seconds (default 30)")
    args = p.parse_args(argv)
    if not 1 <= args.streams <= MAX_STREAMS:
        p.error(f"--streams must be 1..{MAX_STREAMS}")
    if args.send_bytes < 0:
        p.error("--send-bytes must be >= 0")
    if args.echo and args.expect_sink:
        p.error("--echo and --expect-sink are exclusive")
    try:
        parse_hostport(args.connect)
    except ValueError as e:
        p.error(str(e))
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    return Client(args).run()


if __name__ == "__main__":
    sys.exit(main())
