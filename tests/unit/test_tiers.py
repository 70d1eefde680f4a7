"""The test tiers hold: a test file that starts a Ray cluster, an accelerate launch or verl's V1 harness is `e2e`
and lives in tests/e2e/; a file in tests/unit/ starts no process or server; every test file is in a tier's folder.

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

from tiers import CLUSTER_GROUP, marked_e2e, misplaced, starts, worker_group

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent


def unmarked(folder: Path, skip: Set[Path] = frozenset()) -> Dict[str, List[str]]:
    """Test files under `folder` that start an end-to-end run without the ``e2e`` marker, with what they
    start (the support modules they import are `folder`'s own)."""
    return {path.name: found for path in sorted(folder.rglob("test_*.py"))
            if path not in skip and not marked_e2e(path) and (found := starts(path, folder))}


# -- the project ----------------------------------------------------------------------------------------
def test_every_test_file_that_starts_a_cluster_a_launch_or_the_v1_harness_is_marked_e2e():
    assert unmarked(TESTS, skip={Path(__file__).resolve()}) == {}


def test_every_test_file_is_in_its_tiers_folder():
    assert misplaced(TESTS) == {}
    assert {p.parent.name for p in TESTS.rglob("test_*.py")} == {"unit", "integration", "e2e"}


def test_the_files_that_start_a_cluster_wide_run_share_one_worker_group_and_the_others_have_their_own():
    files = sorted(TESTS.rglob("test_*.py"))
    groups = {path.name: worker_group(path, TESTS) for path in files}
    cluster = sorted(name for name, group in groups.items() if group == CLUSTER_GROUP)
    assert {"test_verl_v1_e2e.py", "test_verl_multinode.py", "test_trl_accelerate.py"} <= set(cluster)
    others = [group for group in groups.values() if group != CLUSTER_GROUP]
    assert len(set(others)) == len(others) == len(files) - len(cluster)


def test_the_e2e_marker_is_registered_and_make_test_fast_leaves_it_out():
    assert re.search(r'^\s*"e2e: ', (ROOT / "pyproject.toml").read_text(), re.M)
    fast = re.search(r"^test-fast:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)  # its recipe's lines
    assert fast is not None
    runs = [line for line in fast.group(1).splitlines() if "bin/pytest" in line]
    assert len(runs) == 1 and '-m "not soak and not e2e"' in runs[0]


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


@pytest.mark.parametrize("where, text, why", [
    ("test_a.py", "def test_x():\n    pass\n", "is in no tier's folder (tests/unit, tests/integration, tests/e2e)"),
    ("unit/test_a.py", "import subprocess\n\ndef test_x():\n    subprocess.run(['true'])\n",
     "starts a process or a server (subprocess): it belongs in tests/integration"),
    ("integration/test_a.py", "import pytest\npytestmark = pytest.mark.e2e\n", "is marked e2e outside tests/e2e"),
    ("e2e/test_a.py", "def test_x():\n    pass\n", "is in tests/e2e without the e2e marker"),
    ("unit/test_a.py", "from test_b import helper\n",
     "imports test_b, not a test module of its folder: shared helpers go in a tests/ module"),
])
def test_the_tier_checker_finds_a_file_outside_its_tiers_folder(tmp_path, where, text, why):
    (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / where).write_text(text)
    assert misplaced(tmp_path) == {where: why}


def test_the_tier_checker_passes_files_in_their_folders(tmp_path):
    for where, text in [("unit/test_a.py", "def test_x():\n    assert 1\n"),
                        ("integration/test_b.py", "import subprocess\n"),
                        ("e2e/test_c.py", "import pytest\npytestmark = pytest.mark.e2e\n")]:
        (tmp_path / where).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / where).write_text(text)
    assert misplaced(tmp_path) == {}


def test_the_checker_does_not_count_another_marker(tmp_path):
    folder = _folder(tmp_path, {"test_a.py": "import pytest\npytestmark = pytest.mark.soak\n\ndef test_x():\n    ray.init()\n"})
    assert unmarked(folder) == {"test_a.py": ["a Ray cluster"]}
