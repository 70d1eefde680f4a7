"""Shared fixtures: every test gets a real LMDB journal folder under pytest's tmp_path."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from tiers import marked_e2e, starts

TESTS = Path(__file__).resolve().parent
# The group of the files that start a Ray cluster, an accelerate launch or verl's V1 harness (tests/tiers.py).
CLUSTER_GROUP = "cluster"

settings.register_profile(
    "default", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
# CI runs the same examples every time, so a red build is reproducible from its log alone.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True, database=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "default"))

# The CLI honours COLUMNS (and a pager) the way a user's shell sets them. A CI shell may export them,
# and GNU readline (which pytest imports before any conftest) writes COLUMNS and LINES into the C
# environment that subprocesses inherit, behind os.environ's back: so tests start from none, in both;
# a test that wants a width or a pager sets it for its own command.
for _name in ("COLUMNS", "LINES", "PAGER"):
    os.environ.pop(_name, None)
    os.unsetenv(_name)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Shape the parallel run (``make test`` runs ``pytest -n auto --dist loadgroup``).

    Each test file is one group, run whole by one worker, so its module fixtures are built once; the
    files that start a cluster-wide run share one group and run one after another, never two Ray
    clusters or accelerate launches at once. End-to-end files come first: the longest groups start
    early instead of leaving one worker busy alone at the end. Each file's tests keep their order.
    """
    files = {}
    for item in items:
        path = Path(str(item.path))
        if path not in files:
            files[path] = (CLUSTER_GROUP if starts(path, TESTS) else path.stem, marked_e2e(path))
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(files[path][0]))
    items.sort(key=lambda item: not files[Path(str(item.path))][1])


@pytest.fixture
def jpath(tmp_path):
    """A path for a new journal folder (not created yet)."""
    return str(tmp_path / "journal")


@pytest.fixture
def lmdb_payloads(monkeypatch):
    """Journals opened in the test keep large payloads in LMDB, as journals made before payload files
    hold them (`FILE_FROM` out of reach)."""
    import stepjournal.payloads._payload_store as payload_store

    monkeypatch.setattr(payload_store, "FILE_FROM", 1 << 62)
