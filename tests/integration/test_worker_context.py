"""`worker_context()` (tests/reliability_support.py): the child processes the tests start are as clean as spawned
ones, in the starter's working folder, and a changed environment gets a spawned child."""

from __future__ import annotations

import os

from reliability_support import worker_context


def _report(queue) -> None:
    queue.put((os.getcwd(), os.environ.get("STEPJOURNAL_TEST_MARK")))


def _child_sees(ctx) -> tuple:
    queue = ctx.Queue()
    child = ctx.Process(target=_report, args=(queue,))
    child.start()
    seen = queue.get(timeout=120)
    child.join(60)
    assert child.exitcode == 0
    return seen


def test_a_child_starts_in_the_starters_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    where, mark = _child_sees(worker_context())
    assert where == str(tmp_path) and mark is None


def test_a_changed_environment_gets_a_spawned_child_that_sees_it(monkeypatch):
    first = worker_context().get_start_method()
    monkeypatch.setenv("STEPJOURNAL_TEST_MARK", "1")
    changed = worker_context()
    assert changed.get_start_method() == "spawn"
    assert _child_sees(changed)[1] == "1"
    monkeypatch.delenv("STEPJOURNAL_TEST_MARK")
    assert worker_context().get_start_method() == first


def test_stepjournal_test_spawn_makes_every_child_a_spawned_one(monkeypatch):
    import reliability_support

    monkeypatch.setenv("STEPJOURNAL_TEST_SPAWN", "1")  # as if set before the server started
    monkeypatch.setattr(reliability_support, "_SERVER_ENV",
                        {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"})
    assert worker_context().get_start_method() == "spawn"
    monkeypatch.setenv("STEPJOURNAL_TEST_SPAWN", "0")
    monkeypatch.setattr(reliability_support, "_SERVER_ENV",
                        {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"})
    assert worker_context().get_start_method() == "forkserver"
