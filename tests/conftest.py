"""Shared fixtures: every test gets a real LMDB journal folder under pytest's tmp_path."""

from __future__ import annotations

import os
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tiers import CLUSTER_GROUP, marked_e2e, worker_group

TESTS = Path(__file__).resolve().parent

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# CI runs the same examples every time, so a red build is reproducible from its log alone.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

# pytest keeps each test module's assertion-rewritten bytecode in __pycache__ only where the process may write
# bytecode. Where PYTHONDONTWRITEBYTECODE is set (as on these machines) every worker would rewrite all ~110
# test modules at each run (3 s a worker); the pytest processes write it, as `make`'s compileall writes the
# package's (the Makefile). The processes the tests start keep the environment's setting.
sys.dont_write_bytecode = False

# The CLI honours COLUMNS (and a pager) the way a user's shell sets them. A CI shell may export them,
# and GNU readline (which pytest imports before any conftest) writes COLUMNS and LINES into the C
# environment that subprocesses inherit, behind os.environ's back: so tests start from none, in both;
# a test that wants a width or a pager sets it for its own command.
for _name in ("COLUMNS", "LINES", "PAGER"):
    os.environ.pop(_name, None)
    os.unsetenv(_name)

# Ray starts its worker processes at nice 15 (`RAY_worker_niceness`). Beside any other load (a CI
# neighbour, the CPU burners of a loaded run) they then get a few percent of a core, and a V1 recording
# that takes two minutes takes twenty. The tests check what the workers compute, not their priority:
# every Ray the tests start (in-process, harness subprocesses, `ray start`) inherits this.
os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_collection_modifyitems(config, items):
    """The cluster group first, then the other end-to-end files, then the rest (each file's tests keep their
    order): under ``make test``'s parallel run the longest units start early instead of leaving one worker
    busy alone at the end."""
    rank = lru_cache(maxsize=None)(lambda path: 0 if worker_group(path, TESTS) == CLUSTER_GROUP else
                                   1 if marked_e2e(path) else 2)
    items.sort(key=lambda item: rank(Path(str(item.path))))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``make test`` runs ``pytest -n auto --dist loadfile``: each test file runs whole in one worker, so its
    module fixtures are built once, and the files that start a Ray cluster, an accelerate launch or verl's
    V1 harness (tests/tiers.py) are one unit, run one after another, never two clusters at once. Work goes
    out in collection order (``--no-loadscope-reorder``), end-to-end files first."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    root = Path(str(config.rootpath))
    group = lru_cache(maxsize=None)(lambda file: worker_group(root / file, TESTS))

    class ByFileWithClusterGroup(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group(nodeid.split("::", 1)[0])

    return ByFileWithClusterGroup(config, log)


@pytest.fixture
def jpath(tmp_path):
    """A path for a new journal folder (not created yet)."""
    return str(tmp_path / "journal")


@pytest.fixture
def lmdb_payloads(monkeypatch):
    """Journals opened in the test keep large payloads in LMDB, as journals made before payload files
    hold them (`FILE_FROM` out of reach)."""
    import stepjournal.payloads._payload_store as payload_store  # private: the store's internals

    monkeypatch.setattr(payload_store, "FILE_FROM", 1 << 62)
