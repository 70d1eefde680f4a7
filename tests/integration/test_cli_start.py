"""`stepjournal --help`, `--version` and `completion` start without torch, numpy or structlog: a verb that needs them pays alone.

structlog's package imports rich's traceback and pretty-printing modules, about half of what the
CLI's start imported once torch was gone: the library's loggers build their structlog logger at the
first event their level lets through (journal/base/_log.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is the project's folder, not installed
from benchmarks._cli_start import VERB_GOAL_S, make_demo, verb_lines  # noqa: E402

PROBE = """
import sys
from stepjournal.adapters.cli import main
code = main({argv!r})
heavy = sorted(m for m in ("torch", "numpy", "matplotlib", "safetensors", "structlog", "transformers") if m in sys.modules)
print("heavy:" + ",".join(heavy))
sys.exit(code)
"""


def heavy(done: subprocess.CompletedProcess) -> list:
    """The heavy modules PROBE found loaded after the command."""
    return [name for name in done.stdout.splitlines()[-1].removeprefix("heavy:").split(",") if name]


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["completion", "bash"], ["completion", "zsh"]])
def test_help_version_and_completion_import_no_tensor_library(argv):
    """Completion builds every verb's arguments, at each start of a shell that sources it."""
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert heavy(done) == []


@pytest.mark.parametrize("verb", ["audit", "verify", "export --bundle", "push"])
def test_a_verb_that_decodes_no_payload_imports_no_torch(tmp_path, verb):
    import torch

    from stepjournal import Journal

    with Journal(str(tmp_path / "j"), run="r") as journal:
        journal.record(1, {"x": torch.arange(3)})
    argv = {"audit": ["audit", str(tmp_path / "j")], "verify": ["verify", str(tmp_path / "j")],
            "export --bundle": ["export", str(tmp_path / "j"), "--bundle", str(tmp_path / "b.bundle")],
            "push": ["push", str(tmp_path / "j"), str(tmp_path / "remote")]}[verb]
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "torch" not in heavy(done)


# The verbs of issue 48 that print no tensor, as `make bench` types them on the demo journal.
NO_TENSOR_VERBS = {verb: line for verb, line in verb_lines().items() if line.goal_s == VERB_GOAL_S}


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory):
    """A folder where `make demo` ran, with a folder remote the journal was pushed to."""
    folder = tmp_path_factory.mktemp("demo")
    make_demo(folder)
    return folder


@pytest.mark.parametrize("verb", sorted(NO_TENSOR_VERBS))
def test_a_verb_that_prints_no_tensor_imports_no_tensor_library_on_the_demo_journal(demo_folder, verb):
    """`diff` of the demo's replay against its recording (equal digests: no payload loaded), `audit`, `runs`
    and `status` load neither torch nor numpy: their start is Python's, the CLI's and the journal's."""
    line = NO_TENSOR_VERBS[verb]
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=line.argv)], cwd=demo_folder, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode in line.statuses, done.stderr
    assert heavy(done) == [], (line.text, heavy(done))


@pytest.mark.parametrize("verb", ["runs", "audit", "verify", "diff", "timeline", "report", "status", "show", "export"])
def test_a_path_that_holds_no_journal_is_said_before_torch_is_imported(tmp_path, verb):
    """A mistyped path costs the start, not a tensor library's import (about a second here)."""
    missing = str(tmp_path / "no-such-journal")
    argv = {"diff": ["diff", missing, missing], "timeline": ["timeline", missing, "--out", str(tmp_path / "t.svg")],
            "report": ["report", missing, "--out", str(tmp_path / "r.html")],
            "status": ["status", missing, str(tmp_path / "remote")], "show": ["show", missing, "1"],
            "export": ["export", missing, "--to", str(tmp_path / "out")]}.get(verb, [verb, missing])
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=argv)], capture_output=True, text=True, timeout=120)
    assert done.returncode in (1, 2) and missing in done.stderr, done.stderr
    assert "torch" not in heavy(done)


def test_show_of_a_step_with_no_call_says_so_before_torch_is_imported(tmp_path):
    from stepjournal import Journal

    path = str(tmp_path / "j")
    with Journal(path, run="r") as journal:
        journal.record(1, b"one")
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=["show", path, "7"])], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "no train call at step 7" in done.stderr, done.stderr
    assert "torch" not in heavy(done)


def test_verify_of_a_journal_under_thousands_of_pages_imports_no_numpy(tmp_path):
    """Below `_SCREEN_IMPORTS_NUMPY_FROM` tree pages the exact walk costs less than importing numpy for the screen."""
    import lmdb

    from stepjournal import Journal
    from stepjournal.storage._lmdb_check import (  # private: the LMDB file checks under test
        _SCREEN_FROM, _SCREEN_IMPORTS_NUMPY_FROM,
    )

    path = str(tmp_path / "j")
    with Journal(path, run="r", sync=False) as journal:
        for step in range(1, 1201):
            journal.record(step, b"%d" % step)
    env = lmdb.open(path, readonly=True, lock=False, max_dbs=16)
    with env.begin() as txn:
        stat = txn.stat(env.open_db(b"events", txn=txn, create=False))
    env.close()
    # A tree the screen would take once numpy is loaded, and that is not worth loading it for.
    assert _SCREEN_FROM <= stat["branch_pages"] + stat["leaf_pages"] < _SCREEN_IMPORTS_NUMPY_FROM, stat
    done = subprocess.run([sys.executable, "-c", PROBE.format(argv=["verify", path])], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "journal is whole: 1201 events" in done.stdout
    assert heavy(done) == []


def test_a_verb_that_reads_payloads_still_gets_torch(tmp_path):
    probe = (
        "import sys, torch\n"
        "from stepjournal import Journal\n"
        f"with Journal({str(tmp_path / 'j')!r}) as j: j.record(1, {{'x': torch.arange(3)}})\n"
        "from stepjournal.adapters.cli import main\n"
        f"sys.exit(main(['show', {str(tmp_path / 'j')!r}, '1']))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
