"""Never lose the user's work, never show a raw OS error (issue 14).

An output the codec cannot store does not throw the generator's work away; a journal path that is
unusable raises a `JournalError` naming the path and what to do; two live sessions recording the
same run are told about each other.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import JournalError, UnsupportedValueError
from stepjournal.payloads import CodecRegistry, encode_payload
from stepjournal.policies import Engine, ReplayMissError

import never_lose_work_workers as workers
from log_capture import captured_events
from cli_support import run_cli
from reliability_support import worker_context


class Sample:
    """A user's own class, with no codec registered."""

    def __init__(self, text: str) -> None:
        self.text = text


# ---------------------------------------------------------------------------------------------
# An output that cannot be stored


def test_an_output_that_cannot_be_stored_reaches_the_caller_and_is_journaled_generated_not_stored(tmp_path):
    output = {"ids": torch.arange(3), "score_fn": lambda x: x}
    with Journal(tmp_path / "j") as journal, captured_events(logging.WARNING) as events:
        outcome = Engine(journal, "cache").call(1, lambda: output)
        assert outcome.value is output and outcome.action == "generated"
        assert outcome.source.event.output is None
        why = outcome.source.event.not_stored  # the why as a field of the event, for code to read
        assert why is not None and "score_fn" in why and "lambda is code, not data" in why
        # Not recorded: lookup, the projections and a replay all say so.
        assert journal.lookup(1) is None
        assert journal.recorded_steps() == [] and journal.step_count() == 0
        (record,) = journal.audit()
        assert record.action == "generated" and not record.stored
        assert "generated, not stored" in record.reason and "score_fn" in record.reason
        assert "lambda is code, not data" in record.reason
        with pytest.raises(ReplayMissError):
            Engine(journal, "replay").call(1, lambda: pytest.fail("replay must not generate"))
    (warning,) = [e for e in events if e["event"] == "output_not_stored"]
    assert warning["step"] == 1 and "score_fn" in warning["error"]


def test_a_replay_of_a_step_generated_but_not_stored_says_so_why_and_what_to_do(tmp_path):
    with Journal(tmp_path / "j", run="r") as journal:
        Engine(journal, "cache").call(3, lambda: {"ids": [1], "score_fn": lambda x: x})
        with pytest.raises(ReplayMissError) as info:
            Engine(journal, "replay").call(3, lambda: pytest.fail("replay must not generate"))
    message = str(info.value)
    assert info.value.step == 3 and "step 3 index 0" in message and "run 'r'" in message
    assert "was generated (event #2) but not stored" in message
    assert "score_fn" in message and "lambda is code, not data" in message
    assert "record the step again (dump or cache)" in message and "replay(on_missing=generate)" in message
    assert "nothing recorded" not in message


def test_a_replay_of_a_step_its_policy_did_not_store_names_the_policy(tmp_path):
    with Journal(tmp_path / "j") as journal:
        Engine(journal, "passthrough").call(2, lambda: {"ids": [1]})
        with pytest.raises(ReplayMissError, match=r"but not stored: its policy stored nothing \(passthrough"):
            Engine(journal, "replay").call(2, lambda: pytest.fail("replay must not generate"))
        # Another call index of the step was never generated: the plain miss.
        with pytest.raises(ReplayMissError, match="nothing recorded at step 2 index 1"):
            Engine(journal, "replay").call(2, lambda: None, gen_index=1)


def test_the_next_cache_call_generates_again_and_stores_what_it_can(tmp_path):
    with Journal(tmp_path / "j") as journal:
        engine = Engine(journal, "cache")
        engine.call(1, lambda: {"fh": threading.Lock()})
        second = Engine(journal, "cache").call(1, lambda: {"ids": [1, 2]})
        assert second.action == "generated" and journal.lookup(1) is not None
        assert Engine(journal, "cache").call(1, lambda: pytest.fail("cached")).value == {"ids": [1, 2]}


def test_acall_keeps_an_output_that_cannot_be_stored(tmp_path):
    async def generate():
        return {"sample": Sample("a")}

    with Journal(tmp_path / "j") as journal:
        outcome = asyncio.run(Engine(journal, "dump").acall(3, generate))
        assert outcome.value["sample"].text == "a" and outcome.action == "generated"
        assert journal.lookup(3) is None
        assert "register_codec(Sample" in journal.audit()[0].reason


def test_an_input_that_cannot_be_stored_leaves_the_output_stored(tmp_path):
    with Journal(tmp_path / "j") as journal, open(tmp_path / "f.txt", "w") as fh:
        outcome = Engine(journal, "cache").call(2, lambda: {"ids": [7]}, input={"prompt": "x", "log": fh})
        assert journal.load_output(journal.lookup(2)) == {"ids": [7]}
        assert outcome.source.event.input is None
        reason = journal.audit()[0].reason
        assert "the input cannot be stored" in reason and "open file is a handle" in reason


def test_a_registered_codec_that_fails_does_not_lose_the_output(tmp_path):
    registry = CodecRegistry()

    def broken(sample):
        raise RuntimeError("codec bug")

    registry.register(Sample, "tests.Sample", encode=broken, decode=lambda d: Sample(d))
    with Journal(tmp_path / "j", registry=registry) as journal:
        outcome = Engine(journal, "cache").call(1, lambda: [Sample("kept")])
        assert outcome.value[0].text == "kept" and journal.lookup(1) is None
        assert "RuntimeError: codec bug" in journal.audit()[0].reason


def test_a_codec_failing_with_a_huge_message_does_not_lose_the_output(tmp_path):
    """A codec's error may quote the value (600 000 characters here): the why and the reason that repeats it
    are clipped, so the event stays within an event's size and the caller keeps the output."""
    registry = CodecRegistry()

    def quoting(sample):
        raise ValueError(f"cannot encode {sample.text!r}")

    registry.register(Sample, "tests.Sample", encode=quoting, decode=lambda d: Sample(d))
    with Journal(tmp_path / "j", registry=registry) as journal:
        outcome = Engine(journal, "cache").call(1, lambda: [Sample("x" * 600_000)])
        assert len(outcome.value[0].text) == 600_000 and journal.lookup(1) is None
        why = outcome.source.event.not_stored
        assert why.startswith("the output cannot be stored (ValueError: cannot encode 'xxx") and len(why) < 5000
        assert why.endswith("… (600028 characters))")  # clipped, saying how long the error was
        assert journal.audit()[0].reason.endswith(why)


def _lambda():
    return lambda: 1


@pytest.mark.parametrize(
    "make, advice",
    [
        (_lambda, "lambda is code, not data"),
        (lambda: len, "function is code, not data"),
        (lambda: open(__file__), "open file is a handle"),
        (lambda: socket.socket(), "socket is a connection"),
        (lambda: threading.Lock(), "lock or another thread primitive"),
        (lambda: threading.RLock(), "lock or another thread primitive"),
        (lambda: (i for i in range(3)), "return list(...) of it"),
        (lambda: map(str, [1]), "return list(...) of it"),
        (lambda: Sample, "a class is code, not data"),
    ],
    ids=["lambda", "builtin", "file", "socket", "lock", "rlock", "generator", "iterator", "class"],
)
def test_a_value_that_is_not_data_is_told_what_to_return_instead_of_register_codec(make, advice):
    value = make()
    try:
        with pytest.raises(UnsupportedValueError) as info:
            encode_payload({"out": [value]})
    finally:
        if hasattr(value, "close"):
            value.close()
    message = str(info.value)
    assert "out[0]" in message and advice in message
    assert "register_codec" not in message


def test_an_instance_of_a_users_class_is_told_to_register_a_codec():
    with pytest.raises(UnsupportedValueError, match=r"register_codec\(Sample, \"mypackage.Sample\""):
        encode_payload({"out": Sample("a")})


def test_show_says_generated_not_stored_and_why(tmp_path):
    path = tmp_path / "j"
    with Journal(path) as journal:
        Engine(journal, "cache").call(4, lambda: {"f": print})
    result = run_cli("show", str(path), "4")
    assert result.returncode != 0
    text = " ".join((result.stdout + result.stderr).split())
    assert "was generated, not stored" in text and "function is code, not data" in text


# ---------------------------------------------------------------------------------------------
# A journal path that cannot hold a journal


def test_a_journal_path_that_is_a_file_is_a_journal_error_naming_it(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("mine")
    for readonly in (False, True):
        with pytest.raises(JournalError, match=r"notes\.txt.*is a file, not a journal folder.*move the file away"):
            Journal(path, readonly=readonly)
    with pytest.raises(JournalError, match=r"a part of the path is a file"):
        Journal(path / "journal")
    assert path.read_text() == "mine"


def test_a_folder_of_other_files_is_refused_and_left_as_it_was(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.pt").write_bytes(b"weights")
    with pytest.raises(JournalError) as info:
        Journal(ckpt)
    message = str(info.value)
    assert "'model.pt'" in message and "no journal (data.mdb)" in message
    assert repr(str(ckpt / "stepjournal")) in message  # how to choose another folder
    assert sorted(p.name for p in ckpt.iterdir()) == ["model.pt"]
    # The folder it suggests works, and an empty folder or an existing journal opens as before.
    Journal(ckpt / "stepjournal").close()
    (tmp_path / "empty").mkdir()
    with Journal(tmp_path / "empty") as journal:
        journal.record(1, "x")
    with Journal(tmp_path / "empty") as journal:
        journal.record(2, "y")
        assert len(journal.sessions()) == 2


def _in_mount_namespace(shell: str) -> subprocess.CompletedProcess:
    """Run `shell` as root of a private mount namespace (``unshare -rm``): its tmpfs mounts are real and vanish with it."""
    return subprocess.run(["unshare", "-rm", "sh", "-c", shell], capture_output=True, text=True, timeout=120)


def _python(code: str) -> str:
    return f"{shlex.quote(sys.executable)} -c {shlex.quote(textwrap.dedent(code))}"


OPEN_AND_SAY = """
    import sys
    from stepjournal import Journal
    from stepjournal.errors import JournalError
    for path, readonly in [(p.split("=")[0], p.endswith("=ro")) for p in sys.argv[1:]]:
        try:
            with Journal(path, readonly=readonly) as journal:
                print("opened", path, journal.recorded_steps())
        except JournalError as exc:
            print(type(exc).__name__, exc)
"""


def test_a_read_only_mount_gives_a_journal_error_that_says_to_open_read_only(tmp_path):
    """A real read-only tmpfs (remounted ro after a journal was made on it) in a private mount namespace."""
    where = tmp_path / "mnt"
    where.mkdir()
    make = _python(f"""
        import os
        from stepjournal import Journal
        with Journal({str(where / 'existing')!r}) as journal:
            journal.record(1, {{"ids": [1]}})
        os.mkdir({str(where / 'empty')!r})
    """)
    check = _python(OPEN_AND_SAY)
    targets = " ".join(shlex.quote(f"{where / name}={mode}") for name, mode in
                       [("new", "rw"), ("empty", "rw"), ("existing", "rw"), ("existing", "ro")])
    result = _in_mount_namespace(
        f"mount -t tmpfs tmpfs {where} && {make} && mount -o remount,ro {where} && {check} {targets}"
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 4, result.stdout
    for line, name in zip(lines[:3], ["new", "empty", "existing"]):
        assert line.startswith("JournalError ") and str(where / name) in line
        assert "read-only file system" in line and "readonly=True" in line and "Errno" not in line
    assert lines[3] == f"opened {where / 'existing'} [1]"


def test_a_full_disk_gives_journal_full_error_instead_of_killing_the_process(tmp_path):
    """LMDB creating lock.mdb on a full disk dies of SIGBUS; the journal refuses first (a real, full tmpfs)."""
    where = tmp_path / "mnt"
    where.mkdir()
    result = _in_mount_namespace(
        f"mount -t tmpfs -o size=64k tmpfs {where} && (dd if=/dev/zero of={where}/fill bs=4k count=64 2>/dev/null;"
        f" true) && {_python(OPEN_AND_SAY)} {shlex.quote(str(where / 'j') + '=rw')}"
    )
    assert result.returncode == 0, (result.returncode, result.stderr)
    line = result.stdout.strip()
    assert line.startswith("JournalFullError ") and "bytes free" in line and str(where / "j") in line


DROP_THEN_OPEN = """
    import os, sys, tempfile
    from stepjournal import Journal
    from stepjournal.errors import JournalError
    with tempfile.TemporaryDirectory() as scratch:  # load every module opening and refusing need, while still root
        Journal(os.path.join(scratch, "warm")).close()
        try:
            Journal(os.path.join(scratch, "absent"), readonly=True)
        except JournalError:
            pass
    if os.geteuid() == 0:  # root writes anywhere: become an unprivileged user for the real attempt
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)
    try:
        with Journal(sys.argv[1]) as journal:
            print("opened", journal.recorded_steps())
    except JournalError as exc:
        print(type(exc).__name__, exc)
"""


def test_a_folder_this_user_cannot_write_gives_a_journal_error_not_permission_error(tmp_path):
    """A chmod 0555 parent; under root the child drops to uid 65534 after loading (the interpreter may sit under a 0700 home)."""
    parent = tempfile.mkdtemp(prefix="sj-eacces-")
    try:
        os.chmod(parent, 0o555)
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(DROP_THEN_OPEN), f"{parent}/j"],
            capture_output=True, text=True, timeout=120, cwd="/",
        )
    finally:
        os.chmod(parent, 0o755)
        shutil.rmtree(parent)
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("JournalError ") and f"{parent}/j" in line and "permission denied" in line


# ---------------------------------------------------------------------------------------------
# Two live sessions recording one run


def _second_writer(path, run, *, hold_run="default"):
    """Spawn a process recording step 1 of `hold_run` and staying open, then one recording step 1 of `run`."""
    ctx = worker_context()
    recorded, release, answers = ctx.Event(), ctx.Event(), ctx.Queue()
    first = ctx.Process(target=workers.record_and_hold, args=(str(path), hold_run, recorded, release, answers))
    first.start()
    try:
        assert recorded.wait(120), "the first writer did not record"
        holder = answers.get(timeout=60)
        second = ctx.Process(target=workers.record_and_report, args=(str(path), run, answers))
        second.start()
        report = answers.get(timeout=120)
        second.join(60)
        assert second.exitcode == 0
    finally:
        release.set()
        first.join(60)
    assert first.exitcode == 0
    return holder, report


def test_a_second_live_session_recording_the_same_run_is_warned_with_the_other_sessions_host_and_pid(tmp_path):
    path = tmp_path / "j"
    holder, report = _second_writer(path, "default")
    (warning,) = [w for w in report["warnings"] if w["event"] == "run_recorded_by_two_sessions"]
    assert warning["other_session"] == holder["session"]
    assert warning["other_pid"] == holder["pid"] and warning["other_host"] == holder["host"]
    assert warning["run"] == "default" and warning["session"] == report["session"]
    # Both calls are journaled; the later one is what the step index serves.
    with Journal(path, readonly=True) as journal:
        records = [r for r in journal.audit() if r.step == 1]
        assert [r.session for r in records] == [holder["session"], report["session"]]
        assert journal.load_output(journal.lookup(1)) == {"who": "second"}


def test_sessions_of_other_runs_or_after_the_writer_ended_are_not_warned(tmp_path):
    path = tmp_path / "j"
    _, report = _second_writer(path, "other-run")
    assert report["warnings"] == []
    ctx = worker_context()
    answers = ctx.Queue()
    later = ctx.Process(target=workers.record_and_report, args=(str(path), "default", answers))
    later.start()
    assert answers.get(timeout=120)["warnings"] == []  # the first writer has closed its session
    later.join(60)
    assert later.exitcode == 0


def test_the_processes_of_one_trainer_each_recording_its_own_mode_are_not_two_writers_of_the_run(tmp_path):
    """A multi-process trainer records one run, each process its own mode (TRL: train/p0, train/p1)."""
    with captured_events(logging.WARNING) as events:
        with Journal(tmp_path / "j", run="grpo") as rank0, Journal(tmp_path / "j", run="grpo") as rank1:
            rank0.record(1, [0], mode="train/p0")
            rank1.record(1, [1], mode="train/p1")
            assert events == []
            rank1.record(2, [1], mode="train/p0")  # the same mode as another live session: two writers
    assert [(e["event"], e["mode"]) for e in events] == [("run_recorded_by_two_sessions", "train/p0")]


def test_two_journals_of_one_run_in_one_process_warn_once_and_a_replaying_session_never(tmp_path):
    with Journal(tmp_path / "j") as first, captured_events(logging.WARNING) as events:
        first.record(1, [1])
        with Journal(tmp_path / "j") as reader:
            reader.record_replay(2, reader.lookup(1))  # replays do not claim the run
        assert events == []
        with Journal(tmp_path / "j") as second:
            second.record(2, [2])
            second.record(3, [3])
    assert [e["event"] for e in events] == ["run_recorded_by_two_sessions"]
