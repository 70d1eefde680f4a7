"""`run_conformance`: run a shipped conformance suite's ``test_*`` methods without pytest.

A suite (`stepjournal.testing`'s for payload stores, `stepjournal.policies.testing`'s for policies) is a plain
class; pytest runs a ``Test...`` subclass of it, and this runs the same methods where pytest is not installed.
"""

from __future__ import annotations

import inspect
import tempfile
import traceback
from pathlib import Path
from typing import List

__all__ = ["run_conformance"]


def _test_names(suite: object) -> List[str]:
    """The suite's tests, by name (sorted, as ``dir`` lists them)."""
    return [name for name in dir(type(suite)) if name.startswith("test_") and callable(getattr(suite, name))]


def run_conformance(suite: object) -> int:  # any object with test_* methods
    """Run every ``test_*`` method of `suite`, a test that takes a folder (``tmp_path``) in a fresh temporary
    one; return how many passed.

    Raises:
        AssertionError: naming each test that failed, with what it raised.
    """
    failed = []
    names = _test_names(suite)
    for name in names:
        test = getattr(suite, name)
        try:
            if inspect.signature(test).parameters:
                with tempfile.TemporaryDirectory(prefix="stepjournal-conformance-") as folder:
                    test(Path(folder))
            else:
                test()
        except Exception as exc:
            failed.append(f"{name}: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
    if failed:
        raise AssertionError(f"{len(failed)} of {len(names)} tests of {type(suite).__name__} failed:\n"
                             + "\n".join(failed))
    return len(names)
