"""`make test` sets up what its tests need, or stops at once saying the one command to run.

The tests use two programs that are not Python packages: zsh (the completion tests) and Chromium (the
report's browser tests). As root on Debian, `make test` installs the missing ones with apt-get (that
path runs on every fresh machine CI gets); as another user it stops before building anything, naming
the command. These tests run the Makefile's own recipe through make, as a user other than root where
the suite runs as root, with a PATH that lacks the programs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


@pytest.fixture
def shared_tmp():
    """A folder the other user can reach (pytest's own sit in a folder only root may enter)."""
    with tempfile.TemporaryDirectory(prefix="stepjournal-make-") as folder:
        os.chmod(folder, 0o755)
        yield Path(folder)


def make_in_copy(tmp_path: Path, target: str, programs: dict) -> subprocess.CompletedProcess:
    """Run `make TARGET` over a copy of the Makefile, as a user other than root, with only `programs` on PATH."""
    work = tmp_path / "clone"
    work.mkdir()
    shutil.copy(ROOT / "Makefile", work / "Makefile")
    shutil.copy(ROOT / "constraints.txt", work / "constraints.txt")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, target_path in programs.items():
        os.symlink(target_path, bin_dir / name)
    for path in (tmp_path, work, bin_dir):
        path.chmod(0o777)
    as_user = [] if os.geteuid() != 0 else [shutil.which("setpriv"), f"--reuid={NOBODY}", f"--regid={NOBODY}",
                                            "--clear-groups"]
    return subprocess.run([*as_user, shutil.which("make"), "-s", target], cwd=work, capture_output=True, text=True,
                          env={"PATH": str(bin_dir), "HOME": str(tmp_path)}, timeout=120)


def test_make_test_stops_before_building_anything_and_names_the_command(shared_tmp):
    done = make_in_copy(shared_tmp, "test", {"id": shutil.which("id"), "apt-get": "/usr/bin/apt-get"})
    assert done.returncode != 0
    assert "    sudo apt-get install -y zsh chromium\n" in done.stderr
    assert not (shared_tmp / "clone" / ".venv").exists()  # stopped before the venv, so before any test
    assert done.stdout == ""


def test_make_test_fast_checks_the_same_packages(shared_tmp):
    done = make_in_copy(shared_tmp, "test-fast", {"id": shutil.which("id"), "apt-get": "/usr/bin/apt-get",
                                                "zsh": shutil.which("zsh")})
    assert done.returncode != 0
    assert "    sudo apt-get install -y chromium\n" in done.stderr
    assert not (shared_tmp / "clone" / ".venv").exists()


def test_without_apt_get_it_names_the_packages_to_install(shared_tmp):
    done = make_in_copy(shared_tmp, "system-packages", {"id": shutil.which("id")})
    assert done.returncode != 0
    assert "install zsh chromium with its package manager" in done.stderr


def test_the_check_passes_quietly_where_the_programs_are(shared_tmp):
    chromium = shutil.which("chromium")
    zsh = shutil.which("zsh")
    assert chromium and zsh, "make test installs zsh and chromium before the suite runs"
    done = make_in_copy(shared_tmp, "system-packages", {"id": shutil.which("id"), "zsh": zsh, "chromium": chromium})
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


def test_ci_runs_make_test_alone():
    """CI proves what a new user types: `.ci/run` runs `make test` and nothing else."""
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
                if line.strip() and not line.lstrip().startswith("#")]
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', "make test"]
    assert shlex.split(commands[-1]) == ["make", "test"]
