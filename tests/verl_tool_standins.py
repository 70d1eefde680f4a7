"""verl's ToolAgentLoop in the V1 harness: the sandbox ``BaseTool``, the tool-calling LLM server stand-in, the runs.

- `SandboxTool`: a verl ``BaseTool`` over tests/agent_tools.py's `Sandbox`: ``create`` makes an
  instance, ``execute`` really runs the model's code in a Python subprocess, ``release`` drops it. The
  subprocess itself appends a line to ``$VERL_TOOL_COUNTS/sandbox``; create and release append theirs.
- `ToolTokenServer`: the LLM server (vLLM's token-in/token-out ``generate``), a pure function of the
  conversation it is handed (no call counter: samples run concurrently). It writes hermes tool calls,
  ``<tool_call>{json}</tool_call>``, which verl's own ``HermesToolParser`` reads: the calculator on the
  prompt's two numbers, the sandbox on the calculator's answer, the calculator again, then an answer.
  ``configure(changed=True)``: the sandbox code at turn 1 adds one (a live generation that changed there).
- `tool_passes`: the one run of each ``tools_*`` phase (tests/e2e/test_verl_tools.py runs each in a new process).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import uuid
from typing import Any, Dict, List

import ray
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse

from agent_tools import Sandbox

HERE = os.path.dirname(os.path.abspath(__file__))
TOOLS_POLICY = {
    "tools_record": "generate:cache/tools:cache",
    "tools_replay": "generate:replay/tools:replay",
    "tools_live": "generate:passthrough/tools:replay",
    "tools_changed_replay": "generate:passthrough/tools:replay",
    "tools_changed_cache": "generate:passthrough/tools:cache",
}
AGENT_LOOPS = "- name: tool_agent\n  _target_: stepjournal.adapters.verl.JournaledToolAgentLoop\n"


def _count(tool: str, what: str) -> None:
    with open(os.path.join(os.environ["VERL_TOOL_COUNTS"], tool), "a") as fh:
        fh.write(f"{what}\n")


class SandboxTool(BaseTool):
    """A stateful verl tool: an instance per create, code run in a real subprocess by execute."""

    def __init__(self, config: dict, tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.sandbox = Sandbox()

    async def create(self, instance_id: Any = None, **kwargs: Any) -> Any:
        instance = instance_id or uuid.uuid4().hex
        self.sandbox.create(instance)
        _count("sandbox", "create")
        return instance, ToolResponse(text="")

    async def execute(self, instance_id: str, parameters: Dict[str, Any], **kwargs: Any) -> Any:
        counts = os.path.join(os.environ["VERL_TOOL_COUNTS"], "sandbox")
        code = f"open({counts!r}, 'a').write('execute\\n')\n{parameters['code']}"  # written by the subprocess
        out = await asyncio.to_thread(self.sandbox.execute, instance_id, code)
        return ToolResponse(text=out), 0.0, {}

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        self.sandbox.release(instance_id)
        _count("sandbox", "release")


def executions(folder: str) -> Dict[str, int]:
    """The tools' executions, read from the lines they wrote: the calculator's calls, the sandbox's methods."""
    out = {}
    for tool in ("calculator", "sandbox"):
        path = os.path.join(folder, tool)
        out[tool] = len(open(path).read().splitlines()) if os.path.exists(path) else 0
    return out


def write_tool_configs(root: str) -> Dict[str, str]:
    """The sandbox's tool config and the agent-loop config selecting the journaled loop, as files verl reads."""
    tools = os.path.join(root, "tools.yaml")
    loops = os.path.join(root, "agent_loops.yaml")
    schema = {"type": "function", "function": {
        "name": "sandbox", "description": "Run Python code in a sandbox and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "the code"}},
                       "required": ["code"]}}}
    with open(tools, "w") as fh:
        json.dump({"tools": [{"class_name": "verl_tool_standins.SandboxTool", "config": {"type": "native"},
                              "tool_schema": schema}]}, fh)  # JSON is YAML
    with open(loops, "w") as fh:
        fh.write(AGENT_LOOPS)
    return {"tools": tools, "loops": loops}


def tool_overrides(root: str, policy: str, journal_overrides: Any) -> List[str]:
    """A sync V1 run whose agent loop is verl's ToolAgentLoop (journaled), with the calculator and the sandbox."""
    files = write_tool_configs(root)
    rollout = "actor_rollout_ref.rollout"
    return journal_overrides(root, policy) + [
        "data.max_response_length=1024",
        f"{rollout}.agent.default_agent_loop=tool_agent",
        f"{rollout}.agent.agent_loop_config_path={files['loops']}",
        f"{rollout}.multi_turn.enable=true",
        f"{rollout}.multi_turn.format=hermes",
        f"{rollout}.multi_turn.max_assistant_turns=6",
        f"{rollout}.multi_turn.tool_config_path={files['tools']}",
        f"{rollout}.multi_turn.function_tool_path={os.path.join(HERE, 'verl_tool_calculator.py')}",
        "trainer.experiment_name=v1_tools",
    ]


def tool_passes(root: str, phase: str, journal_overrides: Any) -> List[Dict[str, Any]]:
    """The one run of a ``tools_*`` phase: its policy, and the server's behaviour."""
    if phase not in TOOLS_POLICY:
        raise ValueError(f"unknown tool phase {phase!r}: one of {', '.join(TOOLS_POLICY)}")
    return [dict(name=phase, mode="sync", extra=tool_overrides(root, TOOLS_POLICY[phase], journal_overrides),
                 attach=True, tools=True, server_class=ToolTokenServer, changed="changed" in phase)]


def tool_results(journal: Any, sessions_before: List[str]) -> Dict[str, Any]:
    """What the tool tests read: the tools' executions and each tool call this phase journaled (new sessions)."""
    from stepjournal import Journal
    from stepjournal.tools import tool_call_rows

    with Journal(journal.journal.path, readonly=True) as reader:
        rows = [row for row in tool_call_rows(reader) if row.session not in sessions_before]
    return {
        "executions": executions(os.environ["VERL_TOOL_COUNTS"]),
        "tool_calls": [{"step": r.step, "tool": r.tool, "key": str(r.key), "sample": r.key.sample,
                        "outcome": r.outcome, "request": None if r.request is None else str(r.request),
                        "response": None if r.response is None else r.response.text} for r in rows],
        "journal": journal.journal.path,
        "run": journal.journal.run,
    }


def sessions(path: str) -> List[str]:
    """The sessions a journal holds now (none when it does not exist yet)."""
    from stepjournal import Journal

    if not os.path.isdir(path):
        return []
    with Journal(path, readonly=True) as reader:
        return [opened.session for _, opened in reader.sessions()]


_TOOL_MESSAGE = re.compile(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", re.S)


def _number(text: str) -> int:
    """The integer a tool answered, or -99 for anything else (an error the loop showed the model)."""
    return int(text) if re.fullmatch(r"-?\d+", text.strip()) else -99


@ray.remote(num_cpus=0)
class ToolTokenServer:
    """The LLM server stand-in of the tool runs: hermes tool calls, then an answer (see the module doc)."""

    def __init__(self, model_path: str, seed: int, fail: bool) -> None:
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(os.path.join(model_path, "tokenizer.json"))
        self.eos = self.tokenizer.token_to_id("<|im_end|>")
        self.seed, self.fail, self.changed, self.calls, self.global_steps = seed, fail, False, 0, None

    def configure(self, fail: bool, seed: int, changed: bool = False) -> None:
        self.fail, self.seed, self.changed = fail, seed, changed

    def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def call_count(self) -> int:
        return self.calls

    def reply(self, text: str) -> str:
        """What the stand-in writes next, from the conversation so far."""
        a, b = (int(x) for x in re.search(r"What is (\d+) plus (\d+)", text).groups())
        seen = _TOOL_MESSAGE.findall(text)

        def call(name: str, **arguments: Any) -> str:
            return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"

        if len(seen) == 0:
            return call("calculator", expression=f"{a}+{b}")
        if len(seen) == 1:
            return call("sandbox", code=f"print({_number(seen[0])} * 2{' + 1' if self.changed else ''})")
        if len(seen) == 2:
            return call("calculator", expression=f"{_number(seen[1])}-1")
        rng = random.Random(f"{self.seed}:{a}:{b}:{seen}")
        return f"#### {a + b if rng.random() < 0.5 else rng.randint(0, 9)}"

    async def generate(self, prompt_ids: List[int], sampling_params: Dict[str, Any], request_id: str,
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                       mm_processor_kwargs: Any = None, priority: int = 0, kv_transfer_params: Any = None) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        if self.fail:
            raise RuntimeError("the replay run tried to generate")
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        reply = self.reply(text)
        ids = self.tokenizer.encode(reply, add_special_tokens=False).ids + [self.eos]
        rng = random.Random(f"{self.seed}:{text}")
        return TokenOutput(token_ids=ids, log_probs=[round(-rng.random(), 4) for _ in ids], stop_reason="completed",
                           num_preempted=0, extra_fields={"global_steps": self.global_steps, "num_cached_tokens": 0})
