"""The test tiers hold: a test file that starts a Ray cluster, an accelerate launch or verl's V1 harness is `e2e`.

``make test-fast`` leaves out the ``e2e`` and ``soak`` tiers; ``make test`` (and CI) runs everything. The
check reads each test file and the test-support modules it imports (`ast` and text; it runs nothing), so
a new end-to-end file without the marker, or one that starts a cluster through a helper, fails here.
The checker's own tests run it on tiny synthetic folders.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, List, Set

import pytest

from tiers import marked_e2e, starts

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
def unmarked(folder: Path, skip: Set[Path] = frozenset()) -> Dict[str, List[str]]:
    """Test files of `folder` that start an end-to-end run without the ``e2e`` marker, with what they start."""
    return {path.name: found for path in sorted(folder.glob("test_*.py"))
            if path not in skip and not marked_e2e(path) and (found := starts(path, folder))}


# -- the project ----------------------------------------------------------------------------------------
def test_every_test_file_that_starts_a_cluster_a_launch_or_the_v1_harness_is_marked_e2e():
    assert unmarked(TESTS, skip={Path(__file__).resolve()}) == {}


def test_the_e2e_marker_is_registered_and_make_test_fast_leaves_it_out():
    assert re.search(r'^\s*"e2e: ', (ROOT / "pyproject.toml").read_text(), re.M)
    fast = re.search(r"^test-fast:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert fast is not None and '-m "not soak and not e2e"' in fast.group(1)


# -- the checker itself, on synthetic folders -------------------------------------------------------------
def _folder(tmp_path: Path, files: Dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("source, what", [
    ("import ray\n\ndef test_x():\n    ray.init(num_cpus=2)\n", "a Ray cluster"),
    ("def test_x():\n    run('accelerate launch --cpu driver.py')\n", "an accelerate launch"),
    ("HARNESS = HERE / 'verl_v1_harness.py'\n", "verl's V1 harness"),
])
def test_the_checker_finds_an_unmarked_file_that_starts_an_end_to_end_run(tmp_path, source, what):
    assert unmarked(_folder(tmp_path, {"test_a.py": source})) == {"test_a.py": [what]}


def test_the_checker_follows_a_support_module_that_starts_the_run(tmp_path):
    folder = _folder(tmp_path, {
        "cluster_support.py": "import ray\n\ndef up():\n    ray.init()\n",
        "helpers.py": "from cluster_support import up\n",
        "test_a.py": "from helpers import up\n\ndef test_x():\n    up()\n",
    })
    assert unmarked(folder) == {"test_a.py": ["a Ray cluster"]}


@pytest.mark.parametrize("mark", ["pytestmark = pytest.mark.e2e", "pytestmark = [pytest.mark.e2e, pytest.mark.slow]"])
def test_the_checker_passes_a_marked_file(tmp_path, mark):
    folder = _folder(tmp_path, {"test_a.py": f"import pytest\n{mark}\n\ndef test_x():\n    ray.init()\n"})
    assert unmarked(folder) == {}


def test_the_checker_does_not_count_another_marker(tmp_path):
    folder = _folder(tmp_path, {"test_a.py": "import pytest\npytestmark = pytest.mark.soak\n\ndef test_x():\n    ray.init()\n"})
    assert unmarked(folder) == {"test_a.py": ["a Ray cluster"]}
