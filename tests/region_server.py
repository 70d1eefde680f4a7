"""An S3 endpoint whose buckets live in one region, as AWS's do: a proxy on 127.0.0.1 in front of the moto server.

moto answers a request signed for any region. AWS does not: a request whose SigV4 credential scope names
another region than the bucket's gets ``400 AuthorizationHeaderMalformed``, "the region 'X' is wrong;
expecting 'Y'", with the bucket's region in ``<Region>``. This server gives that reply to such a request
and passes every other one to moto as it came, and moto's reply back as it is: moto does the S3 work.

`region_server` (fixture) binds a listening socket on a free port here, then serves it from a child
process that inherits it (tests/child_server.py): the port accepts connections before the child
runs, so no test waits for the server. Run as a script, this module is that child.
"""

from __future__ import annotations

import http.client
import http.server
import re
import sys
from typing import Iterator
from urllib.parse import urlsplit

import pytest

from child_server import adopt_listener, serve_in_child

BUCKET_REGION = "eu-west-1"
_SCOPE = re.compile(r"Credential=[^/,]+/\d{8}/([^/,]+)/s3/aws4_request")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class _Regional(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = ("127.0.0.1", 0)

    def _reply(self, status: int, reason: str, headers: list, body: bytes, length: int) -> None:
        self.send_response(status, reason)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        signed = _SCOPE.search(self.headers.get("Authorization", ""))
        if signed and signed.group(1) != BUCKET_REGION:
            error = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>AuthorizationHeaderMalformed</Code>"
                     f"<Message>The authorization header is malformed; the region '{signed.group(1)}' is wrong; "
                     f"expecting '{BUCKET_REGION}'</Message><Region>{BUCKET_REGION}</Region>"
                     "<RequestId>0A1B2C3D4E5F6071</RequestId><HostId>region-server</HostId></Error>").encode()
            headers = [("Content-Type", "application/xml"), ("x-amz-bucket-region", BUCKET_REGION)]
            self._reply(400, "Bad Request", headers, error, len(error))
            return
        upstream = http.client.HTTPConnection(*self.upstream, timeout=120)
        try:
            upstream.request(self.command, self.path, body=body,
                             headers={k: v for k, v in self.headers.items() if k.lower() not in _HOP})
            answer = upstream.getresponse()
            data = answer.read()
            headers = [(k, v) for k, v in answer.getheaders() if k.lower() not in _HOP]
            # A HEAD's reply announces the object's length and carries no body.
            announced = int(answer.getheader("Content-Length") or 0) if self.command == "HEAD" else len(data)
            self._reply(answer.status, answer.reason, headers, data, announced)
        finally:
            upstream.close()

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _answer

    def log_message(self, *args: object) -> None:
        pass


def _serve(fd: int, port: int, upstream: str) -> None:
    parts = urlsplit(upstream)
    _Regional.upstream = (parts.hostname, parts.port)
    adopt_listener(http.server.ThreadingHTTPServer, _Regional, fd, port).serve_forever()


@pytest.fixture(scope="module")
def region_server(s3_server) -> Iterator[str]:
    """``http://127.0.0.1:<port>``: the endpoint whose buckets are in `BUCKET_REGION`, in front of `s3_server`."""
    with serve_in_child(__file__, s3_server) as endpoint:
        yield endpoint


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
