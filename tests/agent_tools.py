"""A hand-written agent loop with two real tools, for the tool-call tests.

- a deterministic calculator (arithmetic of numbers, read with `ast`, never `eval`);
- a stateful sandbox whose ``execute`` really runs Python in a subprocess: an instance keeps the code
  it ran, and each ``execute`` runs all of it again with the new line (its state is its program).

The "model" is a seeded stand-in: what it asks for at each turn is a function of the step, the sample
and the responses it read. ``changed_sample`` makes it ask something else at turn 2 for that sample
(a live generation that changed), and ``shift`` makes it add an empty turn before turn 3.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import subprocess
import sys
from typing import Any, Dict, List, Optional

from stepjournal import Journal
from stepjournal.adapters import journaled_tool, tool_turn
from stepjournal.policies import ToolEngine, ToolReplayMissError

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def _arith(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_arith(node.operand)
    raise ValueError(f"not arithmetic: {ast.dump(node)}")


class Calculator:
    """Integer arithmetic; counts its executions."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, expression: str) -> str:
        self.runs += 1
        return str(_arith(ast.parse(expression, mode="eval").body))

    async def acall(self, expression: str) -> str:
        await asyncio.sleep(0)  # let the other samples' calls interleave
        return self(expression)


class Sandbox:
    """Instances that run Python code in a real subprocess; counts its executions (create/execute/release)."""

    def __init__(self) -> None:
        self.programs: Dict[str, List[str]] = {}
        self.runs = 0

    def create(self, instance: str) -> str:
        self.runs += 1
        if instance in self.programs:
            raise RuntimeError(f"instance {instance} exists")
        self.programs[instance] = []
        return f"created {instance}"

    def execute(self, instance: str, code: str) -> str:
        self.runs += 1
        program = self.programs[instance] + [code]  # KeyError: never created in this environment
        done = subprocess.run([sys.executable, "-c", "\n".join(program)], capture_output=True, text=True, timeout=60)
        if done.returncode == 0:
            self.programs[instance] = program
        return (done.stdout + done.stderr).strip()

    async def aexecute(self, instance: str, code: str) -> str:
        self.runs += 1
        program = self.programs[instance] + [code]
        proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "\n".join(program),
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await proc.communicate()
        if proc.returncode == 0:
            self.programs[instance] = program
        return out.decode().strip()

    def release(self, instance: str) -> str:
        self.runs += 1
        del self.programs[instance]
        return f"released {instance}"


class Tools:
    """The two tools, journaled through one `ToolEngine` (the sandbox's three methods share its state)."""

    def __init__(self, journal: Journal, policy: Any) -> None:
        self.calculator, self.sandbox = Calculator(), Sandbox()
        engine = ToolEngine(journal, policy)
        self.engine = engine
        self.calc = journaled_tool(self.calculator, engine, "calculator")
        self.create = journaled_tool(self.sandbox.create, engine, "sandbox.create", environment="sandbox")
        self.execute = journaled_tool(self.sandbox.execute, engine, "sandbox.execute", environment="sandbox")
        self.release = journaled_tool(self.sandbox.release, engine, "sandbox.release", environment="sandbox")

    def executions(self) -> Dict[str, int]:
        return {"calculator": self.calculator.runs, "sandbox": self.sandbox.runs}


def run_sample(tools: Tools, step: int, sample: int, *, changed: bool = False, shift: bool = False) -> List[Any]:
    """One sample's conversation; returns its turns as (turn, tool, arguments, response)."""
    seen: List[Any] = []
    instance = f"i{sample}"

    def ask(turn: int, name: str, fn: Any, **arguments: Any) -> str:
        with tool_turn(step=step, sample=sample, turn=turn):
            response = fn(**arguments)
        seen.append((turn, name, arguments, response))
        return response

    first = ask(0, "calculator", tools.calc, expression=f"{sample}+{step}")
    ask(0, "sandbox.create", tools.create, instance=instance)
    ask(1, "sandbox.execute", tools.execute, instance=instance, code=f"x = {first}")
    doubled = ask(2, "sandbox.execute", tools.execute, instance=instance, code=f"print(x * {3 if changed else 2})")
    last = 4 if shift else 3
    ask(last, "calculator", tools.calc, expression=f"{doubled}-1")
    ask(last, "calculator", tools.calc, expression=f"{sample}+{step}")  # the same request as turn 0
    ask(last, "sandbox.release", tools.release, instance=instance)
    return seen


def run_phase(path: str, policy: Any, changed_sample: Optional[int] = None, shift: bool = False,
              steps: int = 2, samples: int = 3) -> Dict[str, Any]:
    """Every sample of every step, in this process; a replay miss ends its sample and is reported."""
    trajectories, misses = {}, []
    with Journal(path, run="agents") as journal:
        tools = Tools(journal, policy)
        for step in range(1, steps + 1):
            for sample in range(samples):
                changed = changed_sample == sample
                try:
                    trajectories[f"{step}/{sample}"] = run_sample(tools, step, sample, changed=changed,
                                                                  shift=shift and changed)
                except ToolReplayMissError as error:
                    misses.append({"step": error.step, "stage": error.stage, "key": str(error.key),
                                   "request": str(error.request)})
        return {"trajectories": trajectories, "executions": tools.executions(), "misses": misses}


async def _async_sample(tools: "AsyncTools", step: int, sample: int) -> List[Any]:
    seen = []
    with tool_turn(step=step, sample=sample, turn=0):
        first, created = await asyncio.gather(tools.calc(expression=f"{sample}*{step}+1"),
                                              tools.create(instance=f"i{sample}"))
        seen += [first, created]
    with tool_turn(step=step, sample=sample, turn=1):
        seen.append(await tools.execute(instance=f"i{sample}", code=f"print({first} * 10)"))
        seen.append(await tools.release(instance=f"i{sample}"))
    return seen


class AsyncTools:
    """The tools' async forms (the sandbox's execute through asyncio's subprocess), under one engine."""

    def __init__(self, journal: Journal, policy: Any) -> None:
        self.calculator, self.sandbox = Calculator(), Sandbox()
        engine = ToolEngine(journal, policy)

        async def create(instance: str) -> str:
            return self.sandbox.create(instance)

        async def release(instance: str) -> str:
            return self.sandbox.release(instance)

        self.calc = journaled_tool(self.calculator.acall, engine, "calculator")
        self.create = journaled_tool(create, engine, "sandbox.create", environment="sandbox")
        self.execute = journaled_tool(self.sandbox.aexecute, engine, "sandbox.execute", environment="sandbox")
        self.release = journaled_tool(release, engine, "sandbox.release", environment="sandbox")


def run_async_phase(path: str, policy: Any, samples: int = 24) -> Dict[str, Any]:
    """Every sample of one step at once, as concurrent asyncio tasks."""
    async def main() -> Dict[str, Any]:
        with Journal(path, run="agents") as journal:
            tools = AsyncTools(journal, policy)
            results = await asyncio.gather(*(_async_sample(tools, 1, s) for s in range(samples)))
            return {"results": results, "executions": {"calculator": tools.calculator.runs,
                                                       "sandbox": tools.sandbox.runs}}
    return asyncio.run(main())
