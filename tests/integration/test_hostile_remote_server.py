"""A hostile S3 server: replies whose framing disagrees with the size they announce, bodies that never
end or stall, and what stepjournal's reads make of them.

The server is real sockets on 127.0.0.1 (a thread per connection) speaking just enough of S3 for
obstore's GET: each test gives it the reply to write. obstore speaks HTTP to it; nothing is mocked.
What obstore 0.12.1 does, as these tests show: it holds a plain body to its ``Content-Length``, refuses
a reply without one and two that disagree, and resumes a cut body with a ``Range`` request; but a
``Transfer-Encoding: chunked`` body beside a ``Content-Length`` is read to its last chunk (the chunks
win, the header is reported as the size), so `Remote` streams and counts instead of trusting it.
A LIST reply and an error reply's body are read whole by obstore: only the timeout ends those.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from typing import Callable, Iterator, List

import pytest
import torch

from stepjournal.testing import payload_of as payload
from s3_server import client_env
from stepjournal import Journal
from stepjournal.errors import IntegrityError, RemoteError
from stepjournal.payloads import ObjectPayloadStore
from stepjournal.payloads._object_client import Remote  # private: the object client under test

HEAD = b"Last-Modified: Tue, 01 Dec 2026 00:00:00 GMT\r\nETag: \"e\"\r\nConnection: close\r\n"
PIECE = b"x" * (1 << 20)


class Wire:
    """One connection of the server: the request it read, and `send`, which counts what went out."""

    def __init__(self, conn: socket.socket, request: bytes, server: "HostileServer") -> None:
        self.conn, self.request, self.server = conn, request, server

    @property
    def range(self) -> bytes:
        for line in self.request.split(b"\r\n"):
            if line.lower().startswith(b"range:"):
                return line.split(b":", 1)[1].strip()
        return b""

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # counted as it goes out, so a send cut short by the client counts what it took
            done = self.conn.send(view)
            self.server.sent += done
            view = view[done:]

    def chunk(self, data: bytes) -> None:
        self.send(b"%x\r\n" % len(data) + data + b"\r\n")


class HostileServer:
    """Answers every request on a free port of 127.0.0.1 with `reply(wire)`, until `close`."""

    def __init__(self, reply: Callable[[Wire], None]) -> None:
        self.reply = reply
        self.sent = 0
        self.requests: List[bytes] = []
        self.stopped = threading.Event()
        self.conns: List[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            worker = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self.threads.append(worker)
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            request = b""
            while b"\r\n\r\n" not in request:
                got = conn.recv(65536)
                if not got:
                    return
                request += got
            self.requests.append(request.split(b"\r\n\r\n")[0])
            try:
                self.reply(Wire(conn, request, self))
            except OSError:
                pass  # the client hung up: what a refused reply should make it do

    def close(self) -> None:
        """Stop: wakes the accept loop and every send still blocked on a client that stopped reading."""
        self.stopped.set()
        for sock in [self.listener, *self.conns]:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed
        self.listener.close()
        for thread in self.threads:
            thread.join(timeout=10)


@pytest.fixture
def serve(monkeypatch) -> Iterator[Callable[[Callable[[Wire], None]], HostileServer]]:
    """`serve(reply)` starts a hostile server and points the client's environment at it."""
    started: List[HostileServer] = []

    def start(reply: Callable[[Wire], None]) -> HostileServer:
        server = HostileServer(reply)
        started.append(server)
        for key, value in client_env(server.endpoint).items():
            monkeypatch.setenv(key, value)
        return server

    yield start
    for server in started:
        server.close()


def ok(length: int, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + HEAD + extra + b"Content-Length: %d\r\n\r\n" % length


def chunked_beside(length: int) -> bytes:
    return b"HTTP/1.1 200 OK\r\n" + HEAD + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n" % length


LIMIT = 1 << 20


def test_a_chunked_body_longer_than_the_content_length_beside_it_is_refused_after_one_chunk(serve):
    def reply(wire: Wire) -> None:
        wire.send(chunked_beside(1000))
        for _ in range(64):  # 64 MiB where 1 000 bytes were announced
            wire.chunk(PIECE)
        wire.send(b"0\r\n\r\n")

    server = serve(reply)
    with pytest.raises(IntegrityError, match=r"s3://bkt/obj announced 1000 bytes and sends more") as caught:
        Remote("s3://bkt").get("obj", limit=LIMIT)
    assert caught.value.detail == "oversized object"
    assert "push the object again" in str(caught.value)
    server.close()
    assert server.sent < 16 << 20  # what the socket buffers hold, not the 64 MiB the server had


def test_a_body_that_never_ends_behind_a_small_content_length_is_refused_within_seconds(serve):
    def reply(wire: Wire) -> None:
        wire.send(chunked_beside(1000))
        while not wire.server.stopped.is_set():
            wire.chunk(PIECE)

    server = serve(reply)
    started = time.monotonic()
    with pytest.raises(IntegrityError, match="announced 1000 bytes and sends more"):
        Remote("s3://bkt").get("obj", limit=LIMIT)
    assert time.monotonic() - started < 10  # obstore's own read would collect until its 30 s timeout
    server.close()
    assert server.sent < 16 << 20


def test_a_chunked_body_shorter_than_the_content_length_beside_it_is_refused_as_truncated(serve):
    def reply(wire: Wire) -> None:
        wire.send(chunked_beside(1000))
        wire.chunk(b"y" * 10)
        wire.send(b"0\r\n\r\n")

    serve(reply)
    with pytest.raises(IntegrityError, match="announced 1000 bytes and sent 10: truncated") as caught:
        Remote("s3://bkt").get("obj", limit=LIMIT)
    assert caught.value.detail == "truncated object"


def test_a_plain_body_longer_than_its_content_length_is_cut_at_the_content_length_by_the_client(serve):
    digest, raw = payload({"ids": torch.arange(100)})

    def reply(wire: Wire) -> None:
        wire.send(ok(len(raw)) + raw)
        for _ in range(64):
            wire.send(PIECE)

    server = serve(reply)
    store = ObjectPayloadStore("s3://bkt")
    assert store.get(digest, nbytes=len(raw)) == raw
    server.close()
    assert server.sent < 16 << 20  # the client hung up after the announced bytes


def test_a_content_range_that_disagrees_with_the_content_length_is_ignored_and_the_size_bound_holds(serve):
    def reply(wire: Wire) -> None:
        wire.send(b"HTTP/1.1 206 Partial Content\r\n" + HEAD
                  + b"Content-Range: bytes 0-999/1000\r\nContent-Length: %d\r\n\r\n" % (64 << 20))
        for _ in range(64):
            wire.send(PIECE)

    server = serve(reply)
    with pytest.raises(IntegrityError, match=r"is 67108864 bytes, more than the 1048576 it may hold; not read"):
        Remote("s3://bkt").get("obj", limit=LIMIT)
    server.close()
    assert server.sent < 16 << 20


def test_a_chunked_body_without_a_content_length_is_a_remote_error_naming_the_object(serve):
    def reply(wire: Wire) -> None:
        wire.send(b"HTTP/1.1 200 OK\r\n" + HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        wire.chunk(b"y" * 10)
        wire.send(b"0\r\n\r\n")

    serve(reply)
    with pytest.raises(RemoteError, match=r"reading s3://bkt/obj failed: .*Content-Length"):
        Remote("s3://bkt").get("obj", limit=LIMIT)


def test_two_content_lengths_that_disagree_are_a_remote_error_naming_the_object(serve):
    def reply(wire: Wire) -> None:
        wire.send(b"HTTP/1.1 200 OK\r\n" + HEAD + b"Content-Length: 10\r\nContent-Length: 5000\r\n\r\n" + b"y" * 5000)

    serve(reply)
    with pytest.raises(RemoteError, match=r"reading s3://bkt/obj failed"):
        Remote("s3://bkt").get("obj", limit=LIMIT)


def test_a_body_cut_short_is_asked_for_again_by_range_and_a_reply_that_ignores_the_range_is_a_remote_error(serve):
    def reply(wire: Wire) -> None:
        wire.send(ok(1000) + b"y" * 10)  # then hang up

    server = serve(reply)
    with pytest.raises(RemoteError, match=r"reading s3://bkt/obj failed: .*Content-Range"):
        Remote("s3://bkt").get("obj", limit=LIMIT)
    assert any(b"range: bytes=10-999" in request.lower() for request in server.requests)


def test_a_gzip_encoded_body_is_not_inflated_by_the_client_and_fails_its_digest(serve):
    digest, raw = payload({"ids": torch.zeros(1 << 16)})
    bomb = gzip.compress(bytes(64 << 20))  # 64 MiB of zeros in ~64 KB

    def reply(wire: Wire) -> None:
        wire.send(ok(len(bomb), b"Content-Encoding: gzip\r\n") + bomb)

    serve(reply)
    with pytest.raises(IntegrityError):
        ObjectPayloadStore("s3://bkt").get(digest, nbytes=len(raw))


@pytest.mark.parametrize("setting", ["timeout", "read_timeout"])
def test_a_body_that_stalls_ends_with_a_remote_error_within_the_configured_timeout(serve, setting):
    def reply(wire: Wire) -> None:
        wanted = wire.range  # the client's retries ask for the rest: answer them honestly, then stall again
        if wanted:
            start = int(wanted.split(b"=")[1].split(b"-")[0])
            wire.send(b"HTTP/1.1 206 Partial Content\r\n" + HEAD
                      + b"Content-Range: bytes %d-999/1000\r\nContent-Length: %d\r\n\r\n" % (start, 1000 - start))
        else:
            wire.send(ok(1000))
        wire.send(b"y" * 10)
        wire.server.stopped.wait(60)

    server = serve(reply)
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"reading s3://bkt/obj failed"):
        Remote("s3://bkt", options={setting: "1s"}).get("obj", limit=LIMIT)  # plain HTTP still from the env
    elapsed = time.monotonic() - started
    assert 1 <= elapsed < 15  # three tries (max_retries=2) of 1 s each, and the client's back-off
    assert len(server.requests) == 3


def test_a_replay_from_a_server_that_sends_more_than_it_announced_is_refused_naming_the_step(tmp_path, serve):
    folder = tmp_path / "remote"
    with Journal(str(tmp_path / "j"), payload_store=folder.resolve().as_uri()) as journal:
        rec = journal.record(7, {"ids": torch.arange(1000)})
    blob = (folder / "payloads" / rec.event.output.digest).read_bytes()

    def reply(wire: Wire) -> None:
        wire.send(chunked_beside(len(blob)))
        wire.chunk(blob)
        while not wire.server.stopped.is_set():
            wire.chunk(PIECE)

    serve(reply)
    with Journal(str(tmp_path / "j"), readonly=True, payload_store=ObjectPayloadStore("s3://bkt")) as journal:
        with pytest.raises(IntegrityError, match=r"announced \d+ bytes and sends more"):
            journal.load_output(journal.lookup(7))


def test_an_honest_server_still_serves_a_payload_through_the_counted_stream(tmp_path, serve):
    digest, raw = payload({"ids": torch.arange(1 << 16)})

    def reply(wire: Wire) -> None:
        wire.send(ok(len(raw)) + raw)

    serve(reply)
    assert ObjectPayloadStore("s3://bkt").get(digest, nbytes=len(raw)) == raw


def test_a_setting_the_store_cannot_take_is_a_remote_error_not_a_rust_panic():
    # obstore panics (a BaseException) on a client setting spelled as the store's: "aws_timeout".
    with pytest.raises(RemoteError, match="cannot open the object store 's3://bkt'"):
        Remote("s3://bkt", options={"aws_timeout": "1s"})


def test_a_listing_whose_reply_never_ends_is_a_remote_error_within_the_configured_timeout(serve):
    # Not bounded in memory: obstore collects a LIST reply whole before parsing it (docs/reliability.md);
    # only its timeout ends it. The server sends ~100 MiB/s here so the test stays small.
    def reply(wire: Wire) -> None:
        wire.send(b"HTTP/1.1 200 OK\r\n" + HEAD + b"Content-Type: application/xml\r\nTransfer-Encoding: chunked\r\n\r\n")
        wire.chunk(b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>bkt</Name><Contents><Key>heads/')
        while not wire.server.stopped.wait(0.01):
            wire.chunk(PIECE)

    serve(reply)
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"listing s3://bkt/heads/ failed"):
        Remote("s3://bkt", options={"timeout": "1s"}).keys("heads/")
    assert time.monotonic() - started < 10


def test_an_error_reply_whose_body_never_ends_is_a_remote_error_within_the_configured_timeout(serve):
    # Not bounded in memory either: obstore reads an error reply's body whole for its message.
    def reply(wire: Wire) -> None:
        wire.send(b"HTTP/1.1 403 Forbidden\r\n" + HEAD + b"Transfer-Encoding: chunked\r\n\r\n")
        while not wire.server.stopped.wait(0.01):
            wire.chunk(PIECE)

    serve(reply)
    started = time.monotonic()
    with pytest.raises(RemoteError, match=r"reading s3://bkt/obj failed"):
        Remote("s3://bkt", options={"timeout": "1s"}).get("obj", limit=LIMIT)
    assert time.monotonic() - started < 10
