# Does this kernel have the tls ULP? (run: python3 ulp_probe.py)
import socket, errno, os
TCP_ULP = 31
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
c = socket.socket(); c.connect(l.getsockname()); s, _ = l.accept()
for name in (b"tls", b"mptcp", b"nonexistent"):
    try:
        c.setsockopt(socket.IPPROTO_TCP, TCP_ULP, name)
        print(name, "ok")
    except OSError as e:
        print(name, "->", errno.errorcode.get(e.errno), e.strerror)
try:
    print("getsockopt TCP_ULP:", s.getsockopt(socket.IPPROTO_TCP, TCP_ULP, 16))
except OSError as e:
    print("getsockopt", e)
