"""`make test` runs the linter and the type checker first, and stops when either finds anything.

These run the Makefile's own `lint` recipe through make, over a copy of the package with one planted fault,
with the project's venv (`-o .venv/.test`: the venv is not rebuilt).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_test_runs_ruff_and_mypy_before_pytest():
    done = subprocess.run([shutil.which("make"), "-n", "-o", ".venv/.test", "-o", "system-packages", "test"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    ruff = next(i for i, line in enumerate(lines) if "/bin/ruff check" in line)
    mypy = next(i for i, line in enumerate(lines) if line.endswith("/bin/mypy"))
    pytest = next(i for i, line in enumerate(lines) if "/bin/pytest" in line)
    assert ruff < mypy < pytest


def _copy(tmp_path: Path) -> Path:
    work = tmp_path / "clone"
    work.mkdir()
    for name in ("journal", "policies", "adapters"):
        shutil.copytree(ROOT / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "Makefile", "constraints.txt"):
        shutil.copy2(ROOT / name, work / name)
    os.symlink(ROOT / ".venv", work / ".venv")
    if (ROOT / "build" / "mypy-cache").is_dir():  # a warm cache: only the planted module is checked afresh
        shutil.copytree(ROOT / "build" / "mypy-cache", work / "build" / "mypy-cache")
    return work


def _lint(work: Path) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("make"), "-s", "-o", ".venv/.test", "lint"], cwd=work, capture_output=True,
                          text=True, timeout=900)


def test_make_lint_fails_on_a_planted_eval_and_stops_before_mypy(tmp_path):
    work = _copy(tmp_path)
    (work / "policies" / "_planted.py").write_text('"""Planted."""\n\nVALUE = eval("1 + 1")\n')
    done = _lint(work)
    assert done.returncode != 0
    assert done.stdout.startswith("S307 ") and "--> policies/_planted.py:3:9" in done.stdout
    assert not (work / "build" / "typecheck").exists()  # the recipe stopped at ruff


def test_make_lint_fails_on_a_planted_type_error_in_a_module_of_the_package(tmp_path):
    work = _copy(tmp_path)
    (work / "journal" / "upkeep" / "_planted.py").write_text(
        '"""Planted."""\n\nfrom ..base._version import JOURNAL_FORMAT\n\nCOUNT: int = JOURNAL_FORMAT + "1"\n')
    done = _lint(work)
    assert done.returncode != 0
    assert "build/typecheck/stepjournal/upkeep/_planted.py:5: error:" in done.stdout, done.stdout + done.stderr
    assert "[operator]" in done.stdout or "[assignment]" in done.stdout
