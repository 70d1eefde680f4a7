"""Shared fixtures: every test gets a real LMDB journal folder under pytest's tmp_path."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

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


@pytest.fixture
def jpath(tmp_path):
    """A path for a new journal folder (not created yet)."""
    return str(tmp_path / "journal")


@pytest.fixture
def lmdb_payloads(monkeypatch):
    """Journals opened in the test keep large payloads in LMDB, as journals made before payload files
    hold them (`FILE_FROM` out of reach)."""
    import stepjournal._payload_store as payload_store

    monkeypatch.setattr(payload_store, "FILE_FROM", 1 << 62)
