"""The command line as a user runs it, ``python -m stepjournal ...`` in a fresh process: one helper for every test.

No tests here. `run_cli` runs a command to its end; `CLI` is the command's first words, for a test that
starts processes itself (several at once, or one it reads while it runs).
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Mapping, Optional, Union

__all__ = ["CLI", "run_cli", "ok"]

CLI = (sys.executable, "-m", "stepjournal")


def run_cli(
    *args: str,
    cwd: Union[str, os.PathLike, None] = None,
    env: Optional[Mapping[str, Optional[str]]] = None,
    text: bool = True,
    timeout: float = 300,
) -> subprocess.CompletedProcess:
    """Run ``python -m stepjournal ARGS`` to its end and return what it did (output captured).

    Args:
        env: variables for this command on top of this process's environment (``{"COLUMNS": "100"}``);
            None as a value removes the variable.
        text: decode the output; False keeps the bytes, to see exactly what the CLI wrote.
        timeout: a bound on a hung command, not a measure: no test depends on it.
    """
    environ = None
    if env:
        environ = {key: value for key, value in {**os.environ, **env}.items() if value is not None}
    return subprocess.run([*CLI, *args], capture_output=True, text=text, cwd=cwd, env=environ, timeout=timeout)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """`result` after checking that the command succeeded without a traceback."""
    assert result.returncode == 0, f"{result.args} failed ({result.returncode}):\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return result
