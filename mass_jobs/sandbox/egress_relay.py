"""The sandbox's side of the egress proxy: the relay a sandboxed command starts behind (the
namespace's loopback port to the proxy's socket, bound into the sandbox) and the proxy variables
the command gets."""

from __future__ import annotations

SANDBOX_PORT = 3128  # where the relay listens on the sandbox's own loopback
SANDBOX_SOCKET = "/run/mass-egress.sock"  # where the proxy's socket shows inside the sandbox


# The relay inside the sandbox (stdlib only; run with `python -I -S -c`): the namespace's loopback
# port -> the proxy's socket. It forks once it listens, so the command starts after it is ready.
FORWARDER = r"""
import os, selectors, socket, sys
port, path = int(sys.argv[1]), sys.argv[2]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", port))
srv.listen(64)
if os.fork():
    os._exit(0)
sel = selectors.DefaultSelector()
sel.register(srv, selectors.EVENT_READ)
peer = {}
def close(s):
    for x in (s, peer.pop(s, None)):
        if x is not None:
            peer.pop(x, None)
            try:
                sel.unregister(x)
            except Exception:
                pass
            x.close()
while True:
    for key, _ in sel.select():
        s = key.fileobj
        if s is srv:
            c, _ = srv.accept()
            u = socket.socket(socket.AF_UNIX)
            try:
                u.connect(path)
            except OSError:
                c.close(); u.close(); continue
            peer[c], peer[u] = u, c
            sel.register(c, selectors.EVENT_READ); sel.register(u, selectors.EVENT_READ)
            continue
        try:
            data = s.recv(65536)
        except OSError:
            data = b""
        if not data:
            close(s); continue
        try:
            peer[s].sendall(data)
        except (OSError, KeyError):
            close(s)
"""


def sandbox_proxy_env(url: str | None = None) -> dict[str, str]:
    """The proxy variables a sandboxed command gets (curl reads the lower-case ones, most tools either):
    the relay on its own loopback, or `url` (the run's proxy on a cluster)."""
    url = url or f"http://127.0.0.1:{SANDBOX_PORT}"
    return {
        "HTTP_PROXY": url,
        "HTTPS_PROXY": url,
        "http_proxy": url,
        "https_proxy": url,
        "NO_PROXY": "",
        "no_proxy": "",
    }
