"""A hostile HTTP server for the tests: it redirects every request to a URL holding a password, then
refuses the redirected request (400) with an S3-style error whose message quotes that URL.

`redirect_server` (fixture) binds a listening socket on a free port of 127.0.0.1 here, then serves it
from a child process that inherits it: the port accepts connections before the child runs, so no
test waits for the server to come up. Run as a script, this module is that child.
"""

from __future__ import annotations

import http.server
import sys
from typing import Iterator

import pytest

from child_server import adopt_listener, serve_in_child

PASSWORD = "rEdIrEcT-pw-9d2e51-never-shown"


class _Hostile(http.server.BaseHTTPRequestHandler):
    port = 0

    def _answer(self) -> None:
        if not self.path.startswith("/moved/"):
            self.send_response(307)
            self.send_header("Location", f"http://mallory:{PASSWORD}@127.0.0.1:{self.port}/moved{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        # Short, so that the quoted URL falls inside the part of the reply a message shows; a 400 is not retried.
        body = f"<Error><Message>http://mallory:{PASSWORD}@127.0.0.1:{self.port}/</Message></Error>".encode()
        self.send_response(400)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


def _serve(fd: int, port: int) -> None:
    _Hostile.port = port
    adopt_listener(http.server.ThreadingHTTPServer, _Hostile, fd, port).serve_forever()


@pytest.fixture(scope="module")
def redirect_server() -> Iterator[str]:
    """``http://127.0.0.1:<port>``: the hostile server's endpoint."""
    with serve_in_child(__file__) as endpoint:
        yield endpoint


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]))
