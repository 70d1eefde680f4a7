"""A `python -m stepjournal` that has already imported: the process `cli_support.run_cli` forks each command from.

No tests here. `cli_support` starts one per test process (``python tests/cli_forkserver.py FD``, FD one end of
a ``SOCK_SEQPACKET`` socket pair). It imports what a command's start imports (the CLI) and what most commands
import when they run (torch, the payload codec), says ``ready``, and then, for each request (a JSON object:
``args``, ``cwd``, ``env``, with the command's stdin, stdout and stderr as three file descriptors), forks a
child and answers ``{"pid": ...}``, then ``{"returncode": ...}`` once the child has exited. One command at a
time: the client waits for the second answer before it sends another.

The child becomes the command: its descriptors 0, 1 and 2 are the three it was given, it moves to ``cwd``,
takes ``env`` as its whole environment, puts its working folder first on ``sys.path`` as ``python -m`` does,
and runs the ``stepjournal`` package as ``__main__`` (`runpy`). It then ends as an interpreter ends, as far
as a command can see (`_run_command`): what ``SystemExit`` carries is its exit status, an uncaught exception
prints its traceback and exits 1, and the threads, the atexit handlers and the flush of stdout are waited for. What it cannot share with a fresh process is what the interpreter
reads at its start (the ``PYTHON*`` variables, the locale, torch's threading variables); `cli_support` starts
a fresh process for a command whose environment differs there.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import socket
import sys
import threading


def _serve(sock: socket.socket) -> bool:
    """Answer requests until the client closes its end; True in a forked child, which then runs its command.
    One command at a time (the client sends the next after the last one's status), so the server waits for it."""
    while True:
        message, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 3)
        if not message:
            return False
        pid = os.fork()
        if pid == 0:
            sock.close()
            _become(json.loads(message), fds)
            return True
        for fd in fds:
            os.close(fd)
        sock.send(json.dumps({"pid": pid}).encode())
        _, status = os.waitpid(pid, 0)
        sock.send(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode())


def _become(request: dict, fds: list) -> None:
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    # The standard streams an interpreter builds for these descriptors (Python/pylifecycle.c: create_stdio),
    # with the encoding and errors this interpreter chose at its start, from the same environment.
    sys.stdin = sys.__stdin__ = _stdio(0, "r", sys.stdin.errors, line_buffering=False)
    sys.stdout = sys.__stdout__ = _stdio(1, "w", sys.stdout.errors, line_buffering=os.isatty(1))
    sys.stderr = sys.__stderr__ = _stdio(2, "w", sys.stderr.errors, line_buffering=True)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[0] = os.getcwd()
    sys.argv = ["-m", *request["args"]]


def _stdio(fd: int, mode: str, errors: str, *, line_buffering: bool):
    stream = open(fd, mode, encoding=sys.stdout.encoding, errors=errors, newline="\n", closefd=False)
    stream.reconfigure(line_buffering=line_buffering)
    stream.buffer.raw.name = ("<stdin>", "<stdout>", "<stderr>")[fd]
    return stream


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    import torch  # noqa: F401  (most commands decode a payload; a fresh process pays ~0.8 s for this import)

    import stepjournal.adapters.cli._app  # noqa: F401  # private: a CLI helper under test
    import stepjournal.payloads._codec  # noqa: F401  # private: the codec's internals

    sock.send(b"ready")
    if _serve(sock):
        os._exit(_run_command())


def _run_command() -> int:
    """The command run as ``python -m stepjournal`` runs it, and the exit status an interpreter would end with.

    What the interpreter's end does that a command can see (Python/pylifecycle.c: Py_FinalizeEx) is done
    here: wait for the threads that are not daemons, run the atexit handlers, flush stdout and stderr (a
    failed flush of stdout makes the status 120). The teardown of the modules after it is skipped: with
    torch imported it takes 0.3 s, and a command cannot see it.
    """
    try:
        runpy.run_module("stepjournal", run_name="__main__", alter_sys=True)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            if stream is sys.stdout:
                status = 120
    return status


def _exit_status(code: object) -> int:
    """What ``sys.exit(code)`` makes an interpreter exit with (None: 0; another object is printed: 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    main()
