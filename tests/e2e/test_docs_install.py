"""The docs' install, make, benchmark and test-suite lines, typed through a shell.

- quickstart.md's install block (and the same lines in trl.md, verl.md and sharing.md), as typed, in a
  fresh clone of this repository (``<this repository>`` is the one word filled in) with a fresh venv's
  ``pip`` first on PATH; the wheel is installed on "another machine", a second fresh venv.
- ``make demo`` (README, quickstart) in that clone, bootstrapping its own ``.venv`` with the extras the
  docs' examples use.
- Lines that would run this suite inside itself or run for many minutes are typed with one addition
  that keeps them short, and the addition is the only change: ``make -n`` for ``make test``,
  ``test-fast``, ``soak``, ``bench``, ``bench-scale`` (the recipe each runs); ``--collect-only`` for
  the ``pytest`` lines of reliability.md (each names files that exist and collects tests); ``--help``
  for the benchmark modules (each flag the line gives is one the module takes), ``--dry-run`` for the
  ``pip`` line that would change this venv. ``make test`` itself is what ``.ci/run`` runs.
- performance.md's ``export MALLOC_...`` lines, as typed, reach a child process.

The clone is of the repository's committed HEAD: run it on a clean tree.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from doc_lines import command_lines, run_line

pytestmark = pytest.mark.e2e  # installs into fresh venvs and bootstraps make demo's: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
ALL = command_lines()
INSTALL = [line for line in ALL if line.page == "docs/quickstart.md" and ("pip " in line.text or "git clone" in line.text)]
PIP_ELSEWHERE = [line for line in ALL if line.page in ("docs/trl.md", "docs/verl.md", "docs/sharing.md")
                 and line.text.startswith("pip install")]
MAKE_DEMO = [line for line in ALL if line.text == "make demo"]
MAKE_DRY = [line for line in ALL if re.fullmatch(r"(\w+=\S+ )?make (test|test-fast|soak|bench|bench-scale)", line.text)]
PYTEST = [line for line in ALL if ".venv/bin/pytest " in line.text]
BENCH = [line for line in ALL if line.text.startswith(".venv/bin/python -m benchmarks")]
PIP_BENCH = [line for line in ALL if line.text.startswith(".venv/bin/pip install")]
MALLOC = [line for line in ALL if line.text.startswith("export MALLOC_")]
DOC_LINES = INSTALL + PIP_ELSEWHERE + MAKE_DEMO + MAKE_DRY + PYTEST + BENCH + PIP_BENCH + MALLOC


# pip's setting (``--compile``, as a variable) that skips byte-compiling what it installs (torch, ray,
# transformers: minutes of CPU): what is installed, and what imports, stays the same; Python compiles a
# module when it first imports it.
NO_COMPILE = {"PIP_COMPILE": "false"}
# The two "machines" are CPU machines, whose pip is set to take PyTorch's CPU build (this repository's
# constraints.txt, the file `make` installs with), as quickstart.md advises for a machine without a GPU:
# the default wheel would bring ~4 GB of CUDA libraries into each venv. The lines typed are unchanged.
CPU_MACHINE = {**NO_COMPILE, "PIP_CONSTRAINT": str(ROOT / "constraints.txt")}


def in_venv(venv: Path, text: str, cwd: Path, timeout: float = 900):
    done = run_line(text, cwd, env={"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", "VIRTUAL_ENV": str(venv),
                                    "PIP_REQUIRE_VIRTUALENV": "true", **CPU_MACHINE}, timeout=timeout)
    assert done.returncode == 0, (text, done.stdout[-2000:], done.stderr[-4000:])
    return done


def fresh_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    return path


@pytest.fixture(scope="module")
def clone(tmp_path_factory) -> Path:
    """quickstart.md's clone line, typed in an empty folder: the clone of this repository."""
    here = tmp_path_factory.mktemp("install")
    (line,) = [line for line in INSTALL if "git clone" in line.text]
    typed = line.text.replace("<this repository>", shlex.quote(str(ROOT))) + " && git rev-parse HEAD"
    done = run_line(typed, here, timeout=300)
    assert done.returncode == 0, done.stderr
    return here / "stepjournal"


def test_the_install_lines_install_the_library_its_extras_and_a_wheel_on_another_machine(clone, tmp_path):
    pip_lines = [line.text for line in INSTALL if line.text.startswith("pip ")]
    assert pip_lines == ["pip install .", 'pip install ".[verl]"', 'pip install ".[trl]"', "pip wheel --no-deps -w dist .",
                         'pip install "dist/stepjournal-0.1.0-py3-none-any.whl[trl]"']
    elsewhere = [line.text for line in PIP_ELSEWHERE]
    assert sorted(elsewhere) == sorted(['pip install ".[trl]"', 'pip install ".[verl]"', 'pip install ".[s3]"'])
    machine_a = fresh_venv(tmp_path / "machine-a")
    for text in pip_lines[:4] + ['pip install ".[s3]"']:
        in_venv(machine_a, text, clone)
    checks = ("import stepjournal, stepjournal.adapters.verl, stepjournal.adapters.trl, obstore, torch; "
              "import importlib.util as u; assert u.find_spec('journal') is None; "
              "assert torch.version.cuda is None, torch.__version__; print(stepjournal.__file__)")  # the CPU build
    where = in_venv(machine_a, f'python -c "{checks}"', tmp_path).stdout.strip()
    assert where.startswith(str(machine_a))  # installed, not the clone's folder
    assert in_venv(machine_a, "stepjournal --version", tmp_path).stdout.startswith("stepjournal 0.1.0")
    wheel = clone / "dist" / "stepjournal-0.1.0-py3-none-any.whl"
    assert wheel.exists()
    machine_b = fresh_venv(tmp_path / "machine-b")
    in_venv(machine_b, pip_lines[4], clone)
    in_venv(machine_b, 'python -c "import stepjournal.adapters.trl, trl"', tmp_path)


def test_make_demo_in_a_fresh_clone_records_then_replays_every_call(clone):
    assert {line.page for line in MAKE_DEMO} == {"README.md", "docs/quickstart.md"}
    done = run_line("make demo", clone, env=NO_COMPILE, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "run 2 generated nothing" in done.stdout
    # The extras the docs' examples use are there (verl.md and trl.md start with their own install line).
    extras = run_line('.venv/bin/python -c "import obstore, matplotlib, safetensors, yaml"', clone)
    assert extras.returncode == 0, extras.stderr


def test_the_make_lines_that_run_the_suite_or_a_benchmark_name_targets_with_their_recipes(clone):
    recipes = {"test": '-m "not soak"', "test-fast": '-m "not soak and not e2e"', "soak": "-m soak",
               "bench": "-m benchmarks", "bench-scale": "-m benchmarks._scale"}
    for line in MAKE_DRY:
        target = line.text.split("make ", 1)[1]
        done = run_line(line.text.replace("make ", "make -n ", 1), clone)
        assert done.returncode == 0 and recipes[target] in done.stdout, (line.text, done.stdout, done.stderr)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    assert ci[-1] == "make test"  # CI runs the README's `make test` as typed


def test_the_reliability_pytest_lines_collect_tests_from_files_that_exist():
    assert len(PYTEST) >= 9
    for line in PYTEST:
        done = run_line(f"{line.text} --collect-only", ROOT, timeout=600)
        assert done.returncode == 0, (line.text, done.stdout[-2000:])
        assert re.search(r"\d+ tests? collected|collected \d+", done.stdout), (line.text, done.stdout[-500:])


def test_each_benchmark_line_gives_flags_its_module_takes():
    assert len(BENCH) >= 7
    for line in BENCH:
        words = shlex.split(line.text)
        module = words[2]
        shown = run_line(f".venv/bin/python -m {module} --help", ROOT, timeout=300)
        assert shown.returncode == 0, (line.text, shown.stderr)
        flags = [w for w in words[3:] if w.startswith("--")]
        assert all(re.search(rf"{re.escape(flag)}\b", shown.stdout) for flag in flags), (line.text, shown.stdout)
    (pip_line,) = PIP_BENCH
    dry = run_line(f"{pip_line.text} --dry-run", ROOT, timeout=600)
    assert dry.returncode == 0, dry.stderr[-2000:]


def test_the_malloc_lines_reach_a_child_process():
    typed = "; ".join(line.text for line in MALLOC)
    done = run_line(f'{typed}; python -c "import os; print(os.environ[\'MALLOC_MMAP_THRESHOLD_\'], '
                    f'os.environ[\'MALLOC_TRIM_THRESHOLD_\'])"', None)
    assert done.returncode == 0 and done.stdout.split() == ["1073741824", "1073741824"], done.stderr
