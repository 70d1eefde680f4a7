"""The calculator as a verl ``@function_tool`` (loaded by verl from ``multi_turn.function_tool_path``).

Each execution appends a line to ``$VERL_TOOL_COUNTS/calculator``: the count the tests read is what the
tool did, in the agent-loop worker's process.
"""

from __future__ import annotations

import os

from verl.tools.function_tool import function_tool

from agent_tools import Calculator

_CALCULATOR = Calculator()


@function_tool
def calculator(expression: str) -> str:
    """Evaluate integer arithmetic.

    Args:
        expression: the arithmetic to evaluate, e.g. "3+4".
    """
    with open(os.path.join(os.environ["VERL_TOOL_COUNTS"], "calculator"), "a") as fh:
        fh.write(f"{expression}\n")
    return _CALCULATOR(expression)
