"""A test server in a child process, listening before the child runs: no test waits for it to come up.

`serve_in_child` binds a listening socket on a free port of 127.0.0.1 here, then starts a script that
inherits it (its arguments: the socket's file descriptor, the port, then the caller's) and serves it.
No tests here.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from typing import Iterator

__all__ = ["serve_in_child", "adopt_listener"]


@contextlib.contextmanager
def serve_in_child(script: str, *args: str) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` while `script` serves it from a child process; the child is stopped after."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    child = subprocess.Popen([sys.executable, script, str(listener.fileno()), str(port), *args],
                             pass_fds=[listener.fileno()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listener.close()  # the child holds it now
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        child.terminate()
        child.wait(timeout=10)


def adopt_listener(server_class: type, handler: type, fd: int, port: int) -> object:
    """In the child: an ``http.server`` server of `server_class` on the inherited listening socket `fd`."""
    server = server_class(("127.0.0.1", port), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=fd)
    return server
