"""The command line as a user runs it, ``python -m stepjournal ...`` in a process of its own: one helper for every test.

No tests here. `run_cli` runs a command to its end; `start_cli` starts one on descriptors of the test's (a
pseudo-terminal) and returns at once; `CLI` is the command's first words, for a test that starts processes
itself (several at once, or one it reads while it runs).

A fresh interpreter spends 0.1 s starting the CLI and 0.8 s more importing torch, which most commands need:
most of what the CLI tests cost. So `run_cli` forks each command from a process that has imported them
already (tests/cli_forkserver.py, one per test process): the command still runs in a process of its own,
with its own descriptors (pipes, as ``subprocess.run`` gives), working folder, environment and exit
status. A command whose environment changes what an interpreter reads at its start (``PYTHON*``, the
locale, torch's threading variables) gets a fresh interpreter, as does ``run_cli(..., fresh=True)`` (for a
test about the start itself) and every command while ``STEPJOURNAL_TEST_FRESH_CLI=1`` is set.
tests/integration/test_cli_support.py checks that both routes give the same bytes and exit status.
"""

from __future__ import annotations

import atexit
import json
import locale
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

__all__ = ["CLI", "run_cli", "start_cli", "ok", "forked_commands"]

CLI = (sys.executable, "-m", "stepjournal")
FRESH_ENV = "STEPJOURNAL_TEST_FRESH_CLI"
# What an interpreter (and torch's import) reads from the environment when it starts: a command whose
# values differ from the fork server's cannot be forked from it.
_AT_START = ("PYTHON", "LC_", "LANG", "LANGUAGE", "OMP_", "MKL_", "KMP_", "TORCH_", "CUDA_")


def run_cli(
    *args: str,
    cwd: Union[str, os.PathLike, None] = None,
    env: Optional[Mapping[str, Optional[str]]] = None,
    text: bool = True,
    timeout: float = 300,
    fresh: bool = False,
) -> subprocess.CompletedProcess:
    """Run ``python -m stepjournal ARGS`` to its end and return what it did (output captured).

    Args:
        env: variables for this command on top of this process's environment (``{"COLUMNS": "100"}``);
            None as a value removes the variable.
        text: decode the output; False keeps the bytes, to see exactly what the CLI wrote.
        timeout: a bound on a hung command, not a measure: no test depends on it.
        fresh: a fresh interpreter, never a fork of the prepared one (a test about the command's start).
    """
    environ = None
    if env:
        environ = {key: value for key, value in {**os.environ, **env}.items() if value is not None}
    command_env = environ or dict(os.environ)
    server = _forking(command_env, fresh)
    if server is not None:
        try:
            return server.run(list(args), cwd=cwd, env=command_env, text=text, timeout=timeout)
        finally:
            server.lock.release()
    return subprocess.run([*CLI, *args], capture_output=True, text=text, cwd=cwd, env=environ, timeout=timeout)


def start_cli(*args: str, stdin: int, stdout: int, stderr: int, env: Mapping[str, str]) -> Any:
    """Start ``stepjournal ARGS`` on the descriptors given (a pseudo-terminal's follower for all three) and
    return at once: a handle with `pid`, `poll()`, `wait(timeout)` and `returncode`, as `subprocess.Popen`
    has. `env` is the command's whole environment. Forked from the prepared interpreter where `run_cli` would
    fork it, else a `subprocess.Popen` of the installed ``stepjournal`` script."""
    server = _forking(dict(env), False)
    if server is None:
        script = str(Path(sys.executable).with_name("stepjournal"))
        return subprocess.Popen([script, *args], stdin=stdin, stdout=stdout, stderr=stderr, env=dict(env),
                                close_fds=True)
    try:
        pid = server.start(list(args), [stdin, stdout, stderr], cwd=os.getcwd(), env=dict(env))
    except BaseException:
        server.lock.release()
        raise
    return _Started(server, pid)


def _forking(env: Mapping[str, str], fresh: bool) -> Optional["_ForkServer"]:
    """This process's fork server, its lock held, when a command with `env` may be forked from it; else None."""
    if fresh or os.environ.get(FRESH_ENV, "") not in ("", "0") or not hasattr(os, "fork"):
        return None
    server = _ForkServer.get()
    if server.takes(env) and server.lock.acquire(blocking=False):
        return server
    return None


class _Started:
    """A command `start_cli` forked: the fork server's lock is held until its status is read."""

    def __init__(self, server: "_ForkServer", pid: int) -> None:
        self.server, self.pid, self.returncode = server, pid, None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self._ended(self.server.status(block=False))
        return self.returncode

    def wait(self, timeout: Optional[float] = None) -> int:
        if self.returncode is None:
            self._ended(self.server.status(block=True, timeout=timeout))
            if self.returncode is None:
                raise subprocess.TimeoutExpired([*CLI], timeout or 0)
        return self.returncode

    def _ended(self, status: Optional[int]) -> None:
        if status is not None:
            self.returncode = status
            self.server.lock.release()


def forked_commands() -> int:
    """How many commands this process ran through the fork server so far."""
    return _ForkServer.forked


class _ForkServer:
    """The client of this process's tests/cli_forkserver.py: one command at a time (`lock`)."""

    _server: Optional["_ForkServer"] = None
    _starting = threading.Lock()
    forked = 0

    @classmethod
    def get(cls) -> "_ForkServer":
        """This process's server, started (again, if it ended) on first use."""
        with cls._starting:
            if cls._server is None or cls._server.process.poll() is not None:
                cls._server = cls()
            return cls._server

    def __init__(self) -> None:
        self.lock = threading.Lock()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        script = Path(__file__).with_name("cli_forkserver.py")
        self.process = subprocess.Popen([sys.executable, str(script), str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                        stdin=subprocess.DEVNULL)
        theirs.close()
        self.sock = ours
        self.at_start = {k: v for k, v in os.environ.items() if k.startswith(_AT_START)}
        if self.sock.recv(64) != b"ready":
            raise RuntimeError(f"tests/cli_forkserver.py did not start (exit status {self.process.wait()})")
        atexit.register(self.close)

    def takes(self, env: Mapping[str, str]) -> bool:
        return {k: v for k, v in env.items() if k.startswith(_AT_START)} == self.at_start

    def close(self) -> None:
        self.sock.close()
        self.process.wait()

    def start(self, args: list, fds: list, *, cwd: Union[str, os.PathLike, None], env: Dict[str, str]) -> int:
        """Send one command with its three descriptors (this process keeps its own); its pid."""
        request = {"args": args, "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(), "env": env}
        socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
        _ForkServer.forked += 1
        return json.loads(self.sock.recv(1 << 16))["pid"]

    def status(self, *, block: bool, timeout: Optional[float] = None) -> Optional[int]:
        """The exit status of the command started last, once it has ended (None: not yet, without `block`)."""
        self.sock.settimeout(timeout if block else 0)
        try:
            return json.loads(self.sock.recv(1 << 16))["returncode"]
        except (BlockingIOError, socket.timeout):
            return None
        finally:
            self.sock.settimeout(None)

    def run(self, args: list, *, cwd: Union[str, os.PathLike, None], env: Dict[str, str], text: bool,
            timeout: float) -> subprocess.CompletedProcess:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        try:
            pid = self.start(args, [stdin, out_w, err_w], cwd=cwd, env=env)
        finally:
            for fd in (stdin, out_w, err_w):
                os.close(fd)
        out, err, finished = _read_both(out_r, err_r, time.monotonic() + timeout)
        if not finished:
            os.kill(pid, 9)
        returncode = self.status(block=True)
        command = [*CLI, *args]
        if not finished:
            raise subprocess.TimeoutExpired(command, timeout, out, err)
        if text:
            out, err = _as_text(out), _as_text(err)
        return subprocess.CompletedProcess(command, returncode, out, err)


def _read_both(out_fd: int, err_fd: int, deadline: float):
    """Both pipes read to their end (closed here), or to `deadline`: (stdout, stderr, whether both ended)."""
    chunks = {out_fd: [], err_fd: []}
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for key, _ in selector.select(left):
                data = os.read(key.fd, 1 << 16)
                if data:
                    chunks[key.fd].append(data)
                else:
                    selector.unregister(key.fd)
        finished = not selector.get_map()
    for fd in chunks:
        os.close(fd)
    return b"".join(chunks[out_fd]), b"".join(chunks[err_fd]), finished


def _as_text(data: bytes) -> str:
    """`data` as ``subprocess.run(..., text=True)`` decodes it (the locale's encoding, universal newlines)."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`result` after checking that the command succeeded without a traceback."""
    assert result.returncode == 0, f"{result.args} failed ({result.returncode}):\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result
