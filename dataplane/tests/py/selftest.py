#!/usr/bin/python3
"""Self-test of hbone_client.py <-> hbone_server.py.

Mints a throwaway PKI with openssl (root -> intermediate -> SPIFFE leaves,
EC P-256, URI SAN only, empty subject like Istio's workload certs, plus an
unrelated root with its own client leaf), then runs the scenarios below
against local servers.  Prints a line per check, exits non-zero on failure.

    /usr/bin/python3 selftest.py [--keep]   # --keep leaves the temp dir
"""

import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import ssl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from hbone_common import Payload  # noqa: E402
import hashlib  # noqa: E402

PY = sys.executable or "/usr/bin/python3"
TD = "spiffe://cluster.local"
CLIENT_ID = f"{TD}/ns/a/sa/client"
SERVER_ID = f"{TD}/ns/b/sa/server"
ROGUE_ID = f"{TD}/ns/a/sa/rogue"
MiB = 1024 * 1024

FAILURES = []


def check(cond, what):
    print(f"  {'ok  ' if cond else 'FAIL'} {what}", flush=True)
    if not cond:
        FAILURES.append(what)
    return cond


# ---------------------------------------------------------------- PKI

def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def make_key(d, name):
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt",
            "ec_paramgen_curve:P-256", "-out", name, cwd=d)


def make_root(d, prefix, cn):
    make_key(d, f"{prefix}.key")
    openssl("req", "-x509", "-new", "-key", f"{prefix}.key", "-sha256",
            "-days", "2", "-subj", f"/O=ringway-selftest/CN={cn}",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-addext", "subjectKeyIdentifier=hash",
            "-out", f"{prefix}.pem", cwd=d)


def sign(d, csr, ca, ext_text, out, serial):
    write(os.path.join(d, out + ".ext"), ext_text)
    openssl("x509", "-req", "-in", csr, "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key",
            "-set_serial", str(serial), "-days", "2", "-sha256",
            "-extfile", out + ".ext", "-out", out, cwd=d)


def make_leaf(d, prefix, ca, spiffe_id, serial, chain_with=None):
    """Leaf with an empty subject and a critical URI SAN (Istio style)."""
    make_key(d, f"{prefix}.key")
    openssl("req", "-new", "-key", f"{prefix}.key", "-subj", "/",
            "-out", f"{prefix}.csr", cwd=d)
    sign(d, f"{prefix}.csr", ca,
         "basicConstraints=critical,CA:FALSE\n"
         "keyUsage=critical,digitalSignature,keyAgreement\n"
         "extendedKeyUsage=serverAuth,clientAuth\n"
         f"subjectAltName=critical,URI:{spiffe_id}\n"
         "authorityKeyIdentifier=keyid\n",
         f"{prefix}.pem", serial)
    if chain_with:
        # Like cert-chain.pem from `ringway cert issue`: leaf, then chain.
        with open(os.path.join(d, f"{prefix}-chain.pem"), "w") as out:
            for part in (f"{prefix}.pem", f"{chain_with}.pem"):
                with open(os.path.join(d, part)) as f:
                    out.write(f.read())


def make_pki(d):
    make_root(d, "root", "root")
    make_key(d, "int.key")
    openssl("req", "-new", "-key", "int.key", "-subj",
            "/O=ringway-selftest/CN=intermediate", "-out", "int.csr", cwd=d)
    sign(d, "int.csr", "root",
         "basicConstraints=critical,CA:TRUE,pathlen:0\n"
         "keyUsage=critical,keyCertSign,cRLSign\n"
         "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n",
         "int.pem", 2)
    make_leaf(d, "server", "int", SERVER_ID, 10, chain_with="int")
    make_leaf(d, "client", "int", CLIENT_ID, 11, chain_with="int")
    make_root(d, "other", "other-root")
    make_leaf(d, "rogue", "other", ROGUE_ID, 20)
    p = lambda n: os.path.join(d, n)  # noqa: E731
    return {
        "root": p("root.pem"), "other_root": p("other.pem"),
        "server": (p("server-chain.pem"), p("server.key")),
        "client": (p("client-chain.pem"), p("client.key")),
        "rogue": (p("rogue.pem"), p("rogue.key")),
        "client_leaf": p("client.pem"), "server_leaf": p("server.pem"),
        "int": p("int.pem"), "server_key": p("server.key"),
    }


# ------------------------------------------------------------- processes

class ServerProc:
    def __init__(self, pki, tmp, name, *extra, certs=None):
        self.log = os.path.join(tmp, f"{name}.jsonl")
        cert, key = pki["server"]
        cert_args = [a for c in (certs or [cert]) for a in ("--cert", c)]
        cmd = [PY, os.path.join(HERE, "hbone_server.py"), "--listen", "127.0.0.1:0",
               *cert_args, "--key", key, "--ca", pki["root"],
               "--log", self.log, "--timeout", "60", *extra]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        ready, _, _ = select.select([self.proc.stdout], [], [], 10)
        line = self.proc.stdout.readline() if ready else ""
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"server {name} did not start: {line!r}")
        self.port = int(line.split()[1])
        self.addr = f"127.0.0.1:{self.port}"

    def records(self, kind="stream"):
        with open(self.log) as f:
            recs = [json.loads(line) for line in f if line.strip()]
        return [r for r in recs if r.get("kind") == kind]

    def wait_records(self, n, kind="stream", timeout=30.0):
        """The server's first n records of `kind`, once it has logged them
        (returns early, so a generous timeout costs nothing; what it has
        after the timeout, for the caller's check to report)."""
        end = time.monotonic() + timeout
        while True:
            recs = self.records(kind)
            if len(recs) >= n or time.monotonic() > end:
                return recs
            time.sleep(0.05)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.strip()]
        summary = json.loads(lines[-1]) if lines else {}
        return self.proc.returncode, summary


def run_client(pki, server, *extra, ident="client", ca=None, authority="10.0.2.7:8080",
               timeout=60, certs=None):
    cert, key = pki[ident]
    cert_args = [a for c in (certs or [cert]) for a in ("--cert", c)]
    cmd = [PY, os.path.join(HERE, "hbone_client.py"), "--connect", server,
           "--authority", authority, *cert_args, "--key", key,
           "--ca", ca or pki["root"], "--timeout", str(timeout), *extra]
    t0 = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 10)
    lines = res.stdout.strip().splitlines()
    out = json.loads(lines[-1]) if lines else {}
    if res.returncode not in (0, 1, 3, 4, 5, 6) or len(lines) != 1:
        sys.stderr.write(res.stderr)
    return res.returncode, out, time.monotonic() - t0


def expected_sha(index, n, seed=0):
    p = Payload(seed, index, n)
    h = hashlib.sha256()
    while p.remaining:
        h.update(p.take(1 << 20))
    return h.hexdigest()


# ----------------------------------------------------------------- tests

HEADERS = {
    "forwarded": 'for="10.0.1.5:41234";host=server.b.svc.cluster.local',
    "baggage": "k8s.cluster.name=Kubernetes,k8s.namespace.name=a,"
               "k8s.deployment.name=client,service.name=client,service.version=v1",
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00",
}


def test_sink(pki, tmp):
    print("sink: 1 stream, 8 MiB, forwarded/baggage/traceparent headers")
    srv = ServerProc(pki, tmp, "sink", "--mode", "sink")
    hdr_args = [a for k, v in HEADERS.items() for a in ("--header", f"{k}={v}")]
    rc, out, dt = run_client(pki, srv.addr, "--send-bytes", str(8 * MiB), "--expect-sink",
                             "--expect-status", "200", "--expect-identity", SERVER_ID,
                             *hdr_args)
    check(rc == 0, f"client exit 0 (got {rc}, {out.get('error')}: {out.get('detail')}) in {dt:.1f}s")
    check(out.get("status") == [200], "status [200]")
    check(out.get("sent") == [8 * MiB] and out.get("received") == [8], "sent 8 MiB, got 8-byte count")
    check(out.get("sha256_sent") == [expected_sha(0, 8 * MiB)], "payload is the documented deterministic one")
    check(out.get("peer_identity") == SERVER_ID, "server identity seen by client")
    check(out.get("tls_version") == "TLSv1.3" and out.get("alpn") == "h2", "TLSv1.3 + h2")
    recs = srv.wait_records(1)
    r = recs[0] if recs else {}
    check(r.get("received") == 8 * MiB and r.get("sent") == 8, "server counted 8 MiB, sent 8")
    check(r.get("sha256_received") == out.get("sha256_sent", [None])[0], "server SHA-256 == client SHA-256")
    check(r.get("peer_identity") == CLIENT_ID, "client identity seen by server")
    check(r.get("authority") == "10.0.2.7:8080", "authority recorded")
    h = r.get("headers", {})
    check(all(h.get(k) == v for k, v in HEADERS.items()), "forwarded/baggage/traceparent recorded")
    check(h.get(":method") == "CONNECT" and ":path" not in h and ":scheme" not in h,
          "plain CONNECT (no :scheme/:path)")
    conns = srv.wait_records(1, kind="connection")
    check(bool(conns) and conns[0].get("sni") is None, "client sent no SNI")
    rc, summary = srv.stop()
    check(rc == 0 and summary.get("h2_errors") == 0, f"server clean exit ({rc}, {summary})")


def test_echo(pki, tmp):
    print("echo: 10 concurrent streams x 1 MiB on one connection")
    srv = ServerProc(pki, tmp, "echo", "--mode", "echo")
    rc, out, dt = run_client(pki, srv.addr, "--streams", "10", "--send-bytes", str(MiB),
                             "--echo", "--expect-status", "200")
    check(rc == 0, f"client exit 0 (got {rc}, {out.get('error')}: {out.get('detail')}) in {dt:.1f}s")
    check(out.get("status") == [200] * 10, "10 x 200")
    check(out.get("received") == [MiB] * 10, "10 x 1 MiB echoed")
    check(out.get("sha256_sent") == out.get("sha256_received"), "echo digests match")
    check(len(set(out.get("sha256_sent", []))) == 10, "each stream has its own payload")
    recs = srv.wait_records(10)
    check(len(recs) == 10 and len({r["conn"] for r in recs}) == 1, "10 streams on one connection")
    check(all(r["received"] == MiB and r["sent"] == MiB and not r["reset"] for r in recs),
          "server echoed every byte")

    print("echo: 0-byte stream (immediate half-close)")
    rc, out, _ = run_client(pki, srv.addr, "--echo", "--expect-status", "200")
    check(rc == 0 and out.get("received") == [0], f"0 bytes ok ({rc}, {out.get('detail')})")

    print("client RST_STREAM after send")
    rc, out, _ = run_client(pki, srv.addr, "--send-bytes", "1000", "--reset-after-send")
    check(rc == 0 and out.get("reset") == [True] and out.get("reset_by") == ["local"],
          f"client reset its stream ({rc})")
    recs = srv.wait_records(13)
    check(bool(recs) and recs[-1].get("reset_by") == "peer" and recs[-1].get("reset_code") == 8,
          "server saw RST_STREAM(CANCEL)")

    print("non-CONNECT and malformed requests")
    rc, out, _ = run_client(pki, srv.addr, "--method", "GET", "--expect-status", "400")
    check(rc == 0 and out.get("status") == [400], f"GET -> 400 ({rc}, {out.get('status')})")
    rc, out, _ = run_client(pki, srv.addr, "--expect-status", "400", authority="no-port")
    check(rc == 0 and out.get("status") == [400], f"bad authority -> 400 ({rc}, {out.get('status')})")
    rc, out, _ = run_client(pki, srv.addr, "--header", ":path=/")
    check(rc == 0 and out.get("reset") == [True] and out.get("reset_code") == [1],
          f"CONNECT with :path -> RST_STREAM(PROTOCOL_ERROR) ({rc}, {out.get('reset_code')})")
    rc, out, _ = run_client(pki, srv.addr, "--method", "GET")
    check(rc == 0 and out.get("status") == [400], "status reported without --expect-status")
    rc, out, _ = run_client(pki, srv.addr, "--method", "GET", "--expect-status", "200")
    check(rc == 1 and out.get("error") == "mismatch", f"--expect-status mismatch -> exit 1 ({rc})")

    print("TLS failures")
    rc, out, _ = run_client(pki, srv.addr, "--send-bytes", "10", ident="rogue")
    check(rc == 3 and out.get("error") == "tls",
          f"client cert from another CA -> exit 3 tls ({rc}, {out.get('detail')})")
    rc, out, _ = run_client(pki, srv.addr, ca=pki["other_root"])
    check(rc == 3 and out.get("error") == "tls",
          f"server not trusted -> exit 3 tls ({rc}, {out.get('detail')})")
    rc, out, _ = run_client(pki, srv.addr, "--expect-identity", f"{TD}/ns/x/sa/other")
    check(rc == 3 and out.get("error") == "tls" and out.get("peer_identity") == SERVER_ID,
          f"identity mismatch -> exit 3 tls ({rc})")
    check(len(srv.wait_records(2, kind="tls_error")) >= 2, "server logged the TLS failures")
    # A TLS client that does not offer h2 must be refused by the server.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(pki["root"])
    ctx.load_cert_chain(*pki["client"])
    ctx.set_alpn_protocols(["http/1.1"])
    with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as raw:
        with ctx.wrap_socket(raw) as s:
            try:
                got = s.recv(1)
            except (ssl.SSLError, OSError):
                got = b""
    check(got == b"", "server closes a connection without ALPN h2")
    recs = srv.wait_records(3, kind="tls_error")
    check(any("ALPN" in r.get("detail", "") for r in recs), "ALPN failure logged")
    rc, summary = srv.stop()
    check(rc == 0 and summary.get("h2_errors") == 0, f"server clean exit ({rc}, {summary})")


def test_small_windows(pki, tmp):
    print("flow control: 64 KiB windows everywhere, 3 x 2 MiB echo")
    srv = ServerProc(pki, tmp, "small", "--mode", "echo", "--window", "65535",
                     "--conn-window", "65535")
    rc, out, dt = run_client(pki, srv.addr, "--streams", "3", "--send-bytes", str(2 * MiB),
                             "--echo", "--window", "16384", "--conn-window", "65535")
    check(rc == 0 and out.get("received") == [2 * MiB] * 3,
          f"echo through small windows ({rc}, {out.get('detail')}) in {dt:.1f}s")
    srv.stop()


def test_server_variants(pki, tmp):
    print("server --status 401 with a response header")
    srv = ServerProc(pki, tmp, "deny", "--status", "401", "--response-header",
                     "baggage=k8s.namespace.name=b")
    rc, out, _ = run_client(pki, srv.addr, "--send-bytes", "100", "--expect-status", "401")
    check(rc == 0 and out.get("sent") == [0], f"401, nothing sent ({rc})")
    check((out.get("response_headers") or [{}])[0].get("baggage") == "k8s.namespace.name=b",
          "response header delivered")
    srv.stop()

    print("server --mode reset")
    srv = ServerProc(pki, tmp, "reset", "--mode", "reset")
    rc, out, _ = run_client(pki, srv.addr, "--send-bytes", "5000")
    check(rc == 0 and out.get("reset") == [True] and out.get("reset_by") == ["peer"]
          and out.get("reset_code") == [8], f"RST_STREAM is a result, not a crash ({rc})")
    rc, out, _ = run_client(pki, srv.addr, "--send-bytes", "5000", "--echo")
    check(rc == 1, f"... but fails --echo ({rc})")
    srv.stop()

    print("server --goaway-after 1: graceful GOAWAY while a 16 MiB echo is in flight")
    srv = ServerProc(pki, tmp, "goaway", "--mode", "echo", "--goaway-after", "1")
    rc, out, _ = run_client(pki, srv.addr, "--send-bytes", str(16 * MiB), "--echo")
    check(rc == 0 and out.get("received") == [16 * MiB],
          f"stream finished after GOAWAY ({rc}, {out.get('detail')})")
    check(out.get("goaway") == {"error_code": 0, "last_stream_id": 1},
          f"client saw GOAWAY(NO_ERROR, last_stream_id=1): {out.get('goaway')}")
    rc, out, _ = run_client(pki, srv.addr, "--send-bytes", "1000", "--echo")
    check(rc == 0, f"next connection works ({rc})")
    conns = srv.wait_records(2, kind="connection")
    check(len(conns) == 2 and all(c.get("error") is None for c in conns),
          "server closed both connections cleanly")
    srv.stop()

    print("server --max-concurrent-streams 2, client --streams 6 (queued opening)")
    srv = ServerProc(pki, tmp, "mcs", "--mode", "echo", "--max-concurrent-streams", "2")
    rc, out, _ = run_client(pki, srv.addr, "--streams", "6", "--send-bytes", "300000", "--echo")
    check(rc == 0 and out.get("received") == [300000] * 6 and not any(out.get("reset", [True])),
          f"6 streams through a limit of 2 ({rc}, {out.get('detail')})")
    srv.stop()

    print("server --max-streams 3")
    srv = ServerProc(pki, tmp, "max", "--mode", "echo", "--max-streams", "3")
    rc, out, _ = run_client(pki, srv.addr, "--streams", "3", "--send-bytes", "1000", "--echo")
    check(rc == 0, f"3 streams ok ({rc}, {out.get('detail')})")
    try:
        srv.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    rc, summary = srv.stop()
    check(rc == 0 and summary.get("reason") == "max-streams" and summary.get("streams") == 3,
          f"server stopped by itself ({rc}, {summary})")


def test_chains(pki, tmp):
    print("certificate chains split over several --cert files")
    srv = ServerProc(pki, tmp, "chain", "--mode", "echo",
                     certs=[pki["server_leaf"], pki["int"]])
    rc, out, _ = run_client(pki, srv.addr, "--echo", "--send-bytes", "1000",
                            certs=[pki["client_leaf"], pki["int"]])
    check(rc == 0, f"leaf + intermediate files ({rc}, {out.get('detail')})")
    rc, out, _ = run_client(pki, srv.addr, "--echo", "--send-bytes", "1000",
                            certs=[pki["client_leaf"], pki["client"][0]])
    check(rc == 0, f"leaf + chain file repeating the leaf ({rc}, {out.get('detail')})")
    rc, out, _ = run_client(pki, srv.addr, certs=[pki["client_leaf"]])
    check(rc == 3 and out.get("error") == "tls",
          f"client leaf without its intermediate is rejected ({rc})")
    srv.stop()
    srv = ServerProc(pki, tmp, "nochain", certs=[pki["server_leaf"]])
    rc, out, _ = run_client(pki, srv.addr)
    check(rc == 3 and out.get("error") == "tls",
          f"server leaf without its intermediate is rejected ({rc})")
    srv.stop()


def test_client_failures(pki, tmp):
    print("client timeouts and connect errors")
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(1)
    port = lsock.getsockname()[1]
    # Accepts, then never speaks TLS.
    held = []
    t = threading.Thread(target=lambda: held.append(lsock.accept()), daemon=True)
    t.start()
    rc, out, dt = run_client(pki, f"127.0.0.1:{port}", timeout=1)
    check(rc == 5 and out.get("error") == "timeout" and dt < 5,
          f"silent server -> exit 5 in {dt:.1f}s ({rc})")
    lsock.close()
    for conn, _ in held:
        conn.close()
    rc, out, _ = run_client(pki, f"127.0.0.1:{port}", timeout=5)
    check(rc == 6 and out.get("error") == "connect", f"refused -> exit 6 ({rc})")


def main():
    keep = "--keep" in sys.argv[1:]
    if shutil.which("openssl") is None:
        print("openssl not found", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="hbone-selftest-")
    try:
        pki = make_pki(tmp)
        for test in (test_sink, test_echo, test_small_windows, test_server_variants,
                     test_chains, test_client_failures):
            try:
                test(pki, tmp)
            except Exception as e:  # report and keep going
                import traceback
                traceback.print_exc()
                check(False, f"{test.__name__} raised {e!r}")
    finally:
        if keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if FAILURES:
        print(f"SELFTEST FAILED: {len(FAILURES)} check(s)")
        for f in FAILURES:
            print(f"  - {f}")
        return 1
    print("SELFTEST PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
