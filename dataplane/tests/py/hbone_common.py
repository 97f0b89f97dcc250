"""Shared pieces of the HBONE test peers (hbone_client.py / hbone_server.py).

HBONE is HTTP/2 CONNECT carried over mutual TLS 1.3 (ALPN "h2", no SNI),
where both sides identify themselves with SPIFFE URI SANs.  This module holds
what both peers need:

* TLS context construction and SPIFFE identity extraction,
* a deterministic payload generator (so tests can compare SHA-256 digests),
* `H2Pump`, a non-blocking loop that moves bytes between a TLS socket and an
  `h2` connection object without ever blocking on a full socket buffer,
* `GracefulH2Connection`, an `h2` connection that keeps working after a
  graceful GOAWAY (h2 4.1 otherwise refuses to send anything more).

Only the standard library and Debian's python3-h2 (with its hyperframe
dependency) are used.
"""

import hashlib
import json
import os
import re
import selectors
import socket
import ssl
import sys
import tempfile
import time

import h2.config
import h2.connection
import h2.events
import h2.settings
from hyperframe.frame import GoAwayFrame

# Flow-control defaults mirror ztunnel (HTTP2_STREAM_WINDOW_SIZE and
# HTTP2_CONNECTION_WINDOW_SIZE), so the peers behave like the real thing.
DEFAULT_STREAM_WINDOW = 4 * 1024 * 1024
DEFAULT_CONN_WINDOW = 16 * 1024 * 1024
# RFC 9113 initial window for both streams and the connection.
H2_INITIAL_WINDOW = 65535
MAX_WINDOW = 2 ** 31 - 1

# We stop handing new DATA to h2 once this much encrypted-but-unsent output
# is queued; this bounds memory and makes the socket, not Python, the
# back-pressure point.
OUTBUF_HIGH_WATER = 1 << 20
READ_CHUNK = 256 * 1024
# Upper bound of plaintext read per loop iteration, so a fast peer cannot
# starve our own writes.
READ_BUDGET = 4 * 1024 * 1024

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "hbone"


def log(msg):
    """Diagnostics go to stderr; stdout is reserved for machine output."""
    print(f"[{PROG}] {msg}", file=sys.stderr, flush=True)


def emit_json(obj):
    """Write one JSON line to stdout (the scripts' result channel)."""
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")
    sys.stdout.flush()


def parse_hostport(value):
    """Parse "host:port" or "[v6]:port" into (host, port)."""
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ValueError(f"bad address {value!r}")
        port = rest[1:]
    else:
        host, sep, port = value.rpartition(":")
        if not sep:
            raise ValueError(f"bad address {value!r} (want HOST:PORT)")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"bad port in {value!r}")
    return host, int(port)


def format_addr(addr):
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


# --------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------

_PEM_CERT = re.compile(
    r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)


def _load_cert_chain(ctx, certs, key):
    """Load our certificate chain from one or more PEM files.

    Each file may hold several certificates; the leaf must come first.  With
    several files (e.g. `--cert cert.pem --cert cert-chain.pem`) their
    certificates are concatenated in order and exact duplicates dropped, so
    it does not matter whether the chain file repeats the leaf.  OpenSSL
    sends everything after the leaf as the chain.
    """
    if isinstance(certs, str):
        certs = [certs]
    if len(certs) == 1:
        ctx.load_cert_chain(certfile=certs[0], keyfile=key)
        return
    blocks = []
    for path in certs:
        with open(path) as f:
            for block in _PEM_CERT.findall(f.read()):
                if block not in blocks:
                    blocks.append(block)
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as tmp:
        tmp.write("\n".join(blocks) + "\n")
        tmp.flush()
        ctx.load_cert_chain(certfile=tmp.name, keyfile=key)


def _base_context(protocol, certs, key, ca):
    ctx = ssl.SSLContext(protocol)
    # HBONE is TLS 1.3 only (ztunnel enables 1.2 only behind a flag).
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cafile=ca)
    _load_cert_chain(ctx, certs, key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


def client_context(cert, key, ca):
    ctx = _base_context(ssl.PROTOCOL_TLS_CLIENT, cert, key, ca)
    # SPIFFE identities are URI SANs, there is no DNS name to match and HBONE
    # sends no SNI.  The chain is still verified against `ca`; the identity
    # is checked separately against the URI SAN.
    ctx.check_hostname = False
    return ctx


def server_context(cert, key, ca):
    ctx = _base_context(ssl.PROTOCOL_TLS_SERVER, cert, key, ca)
    # No resumption in HBONE; also avoids a ticket write racing a client that
    # closes right after the handshake.
    ctx.num_tickets = 0
    return ctx


def peer_identities(tls_sock):
    """All URI SANs of the verified peer leaf certificate."""
    cert = tls_sock.getpeercert() or {}
    return [v for (kind, v) in cert.get("subjectAltName", ()) if kind == "URI"]


def peer_identity(tls_sock):
    """The peer's identity: its first SPIFFE URI SAN (like ztunnel), or None."""
    uris = peer_identities(tls_sock)
    for uri in uris:
        if uri.startswith("spiffe://"):
            return uri
    return uris[0] if uris else None


# --------------------------------------------------------------------------
# Deterministic payload
# --------------------------------------------------------------------------

class Payload:
    """Deterministic pseudo-random bytes, independent of how they are sliced.

    Block k (64 KiB) of stream `index` under `seed` is
    SHAKE-128("ringway-hbone/<seed>/<index>/<k>") truncated to 64 KiB, so the
    content never depends on flow-control windows or frame sizes.
    """

    BLOCK = 64 * 1024

    def __init__(self, seed, index, total):
        self.seed = seed
        self.index = index
        self.remaining = total
        self._block_no = 0
        self._block = b""
        self._pos = 0

    def take(self, n):
        n = min(n, self.remaining)
        parts = []
        while n > 0:
            if self._pos == len(self._block):
                label = f"ringway-hbone/{self.seed}/{self.index}/{self._block_no}"
                self._block = hashlib.shake_128(label.encode()).digest(self.BLOCK)
                self._block_no += 1
                self._pos = 0
            piece = self._block[self._pos:self._pos + n]
            self._pos += len(piece)
            n -= len(piece)
            self.remaining -= len(piece)
            parts.append(piece)
        return b"".join(parts)


# --------------------------------------------------------------------------
# HTTP/2
# --------------------------------------------------------------------------

class GracefulH2Connection(h2.connection.H2Connection):
    """An h2 connection that survives a *received* graceful GOAWAY.

    h2 4.1 moves the whole connection to CLOSED when a GOAWAY arrives and
    drops queued output, so streams the peer promised to finish (ids <=
    last_stream_id) could never complete.  RFC 9113 §6.8 says those streams
    continue; HBONE peers drain that way.  We still report the GOAWAY as a
    ConnectionTerminated event, but leave the state machine OPEN.  The caller
    must not open new streams afterwards.
    """

    def _receive_goaway_frame(self, frame):
        event = h2.events.ConnectionTerminated()
        event.error_code = h2.connection._error_code_from_int(frame.error_code)
        event.last_stream_id = frame.last_stream_id
        event.additional_data = frame.additional_data or None
        return [], [event]

    def goaway_frame_bytes(self, error_code=0, last_stream_id=None):
        """Serialize a GOAWAY without closing our side of the state machine.

        close_connection() would also flip us to CLOSED, which forbids
        finishing in-flight streams; for a graceful drain we send the frame
        ourselves.
        """
        frame = GoAwayFrame(0)
        frame.error_code = error_code
        frame.last_stream_id = (self.highest_inbound_stream_id
                                if last_stream_id is None else last_stream_id)
        return frame.serialize()


def new_connection(client_side, stream_window, conn_window, max_streams=None):
    """Create an h2 connection with HBONE-ish settings and queue its preface."""
    config = h2.config.H2Configuration(
        client_side=client_side,
        header_encoding=None,  # keep raw bytes; we decode leniently ourselves
        # h2 4.1 insists on :scheme and :path in every request, but RFC 9113
        # §8.5 says a CONNECT request has neither.  So the client cannot let
        # h2 validate what it sends, and the server validates requests itself
        # (see hbone_server.classify_request).
        validate_outbound_headers=False,
        validate_inbound_headers=client_side,
    )
    conn = GracefulH2Connection(config=config)
    initial = {
        h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: stream_window,
        h2.settings.SettingCodes.ENABLE_PUSH: 0,
    }
    if max_streams is not None:
        initial[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = max_streams
    # Values given as initial_values are sent in the very first SETTINGS
    # frame and treated by h2 as already in force.  That is safe: until the
    # peer processes them it assumes the smaller default window, so it can
    # only under-use our larger one.
    conn.local_settings = h2.settings.Settings(client=client_side,
                                               initial_values=initial)
    conn.initiate_connection()
    # SETTINGS cannot change the *connection* window; only a WINDOW_UPDATE on
    # stream 0 can.  h2 grows its own notion of the maximum window with it,
    # so its automatic WINDOW_UPDATE thresholds scale accordingly.
    if conn_window > H2_INITIAL_WINDOW:
        conn.increment_flow_control_window(conn_window - H2_INITIAL_WINDOW)
    return conn


def decode_headers(headers):
    """h2 header tuples (bytes) -> list of (str, str), lossless for latin-1."""
    out = []
    for name, value in headers:
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        out.append((name, value))
    return out


def headers_dict(pairs):
    """Header list -> dict; repeated names are joined with ", "."""
    result = {}
    for name, value in pairs:
        result[name] = f"{result[name]}, {value}" if name in result else value
    return result


class PeerClosed(Exception):
    """The transport went away (EOF or TCP reset)."""


class H2Pump:
    """Moves bytes between a non-blocking TLS socket and an h2 connection.

    Writing is never blocking: h2 output is queued in `outbuf` and written
    as the socket accepts it.  Blocking writes would deadlock two peers that
    both push large amounts of data while neither reads (e.g. echo), because
    TCP buffers are far smaller than the HTTP/2 windows.
    """

    def __init__(self, sock, conn):
        self.sock = sock
        self.conn = conn
        sock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.sel.register(sock, selectors.EVENT_READ)
        self._want_write = False
        self.outbuf = bytearray()
        # OpenSSL requires that a write which failed with WANT_WRITE be
        # retried with the same bytes; keep the exact chunk here.
        self._retry = None
        self.eof = False
        self.last_activity = time.monotonic()

    def room(self):
        """How many more bytes of DATA we are willing to queue right now."""
        return OUTBUF_HIGH_WATER - len(self.outbuf)

    def pending_output(self):
        return bool(self.outbuf) or self._retry is not None

    def queue_raw(self, data):
        """Queue bytes produced outside h2 (e.g. a hand-built GOAWAY)."""
        self.outbuf += self.conn.data_to_send()
        self.outbuf += data

    def flush(self):
        """Pull h2 output and write as much as the socket takes now."""
        self.outbuf += self.conn.data_to_send()
        while self._retry is not None or self.outbuf:
            if self._retry is None:
                self._retry = bytes(self.outbuf[:READ_CHUNK])
                del self.outbuf[:len(self._retry)]
            try:
                n = self.sock.send(self._retry)
            except (ssl.SSLWantWriteError, ssl.SSLWantReadError,
                    BlockingIOError, InterruptedError):
                return
            except (ssl.SSLEOFError, ssl.SSLZeroReturnError,
                    BrokenPipeError, ConnectionResetError) as e:
                # The peer is gone.  Other ssl.SSLErrors (alerts) propagate.
                self.eof = True
                raise PeerClosed(str(e)) from e
            self.last_activity = time.monotonic()
            if n < len(self._retry):
                # Not expected without SSL_MODE_ENABLE_PARTIAL_WRITE, but
                # handle it anyway: the rest is a fresh write.
                self.outbuf[:0] = self._retry[n:]
            self._retry = None

    def wait(self, timeout):
        """Sleep until the socket is readable (or writable when we have
        output), or `timeout` seconds pass."""
        want_write = self.pending_output()
        if want_write != self._want_write:
            events = selectors.EVENT_READ
            if want_write:
                events |= selectors.EVENT_WRITE
            self.sel.modify(self.sock, events)
            self._want_write = want_write
        # Decrypted bytes already buffered inside OpenSSL do not make the
        # socket readable; don't sleep on them.
        if self.sock.pending():
            timeout = 0
        self.sel.select(max(0.0, timeout))

    def read(self):
        """Read whatever is available (non-blocking). Sets `eof` on close.

        ssl.SSLError propagates: after the handshake that is a TLS alert,
        e.g. the server rejecting our client certificate in TLS 1.3.
        """
        chunks = []
        total = 0
        while total < READ_BUDGET:
            try:
                data = self.sock.recv(READ_CHUNK)
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError,
                    BlockingIOError, InterruptedError):
                break
            except ConnectionResetError:
                self.eof = True
                break
            if not data:
                self.eof = True
                break
            chunks.append(data)
            total += len(data)
        if total:
            self.last_activity = time.monotonic()
        return b"".join(chunks)

    def drain_and_close(self, deadline):
        """Write remaining output, then wait briefly for the peer's EOF so the
        kernel does not answer unread data with a TCP RST."""
        try:
            while self.pending_output() and time.monotonic() < deadline:
                self.flush()
                if self.pending_output():
                    self.wait(min(0.05, deadline - time.monotonic()))
            # Half-close TCP so the peer sees EOF and closes too.
            # SSLSocket.shutdown() would also discard the TLS state we still
            # need for reading, hence the plain-socket method.
            try:
                socket.socket.shutdown(self.sock, socket.SHUT_WR)
            except OSError:
                pass
            while not self.eof and time.monotonic() < deadline:
                self.wait(min(0.05, deadline - time.monotonic()))
                try:
                    self.read()
                except (ssl.SSLError, OSError):
                    break
        except (PeerClosed, OSError, ssl.SSLError):
            pass
        finally:
            try:
                self.sel.close()
            finally:
                self.sock.close()
