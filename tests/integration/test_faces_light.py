"""Importing the public faces is light: none of the modules behind them runs until a name is asked for."""

from __future__ import annotations

import subprocess
import sys

FACES = ["stepjournal", "stepjournal.base", "stepjournal.events", "stepjournal.index", "stepjournal.payloads",
         "stepjournal.sharing", "stepjournal.upkeep"]


def test_importing_the_faces_runs_none_of_their_modules():
    """A fresh interpreter that imports every face has loaded no private module behind them, nor torch."""
    code = ("import sys\n" + "".join(f"import {name}\n" for name in FACES)
            + "print(sorted(m for m in sys.modules if m.startswith('stepjournal.') and m.rpartition('.')[2]"
              ".startswith('_') and m != 'stepjournal.base._face' and m != 'stepjournal.base._version'), "
              "'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[] False\n"
