"""TRL's real `GRPOTrainer` with tools, on the CPU, for the tool-call tests and their child processes.

Real: the trainer, its chat template (TRL's Qwen2.5 template, so TRL sets its own response schema and
parses the tool calls itself), its tool loop, the tools (tests/agent_tools.py's calculator, and its
sandbox that runs Python in a subprocess) and a tiny Qwen2 that trains on what is generated.

A stand-in: generation only. `StandInGRPOTrainer._generate_single_turn` writes the next assistant
turn as the chat template's tool-call text, from the conversation so far (the tool responses it
reads) and numbers drawn from torch's seeded generator. The tiny model cannot learn to call tools:
it trains on the stand-in's tokens, which it did not sample. ``change=(step, sample)`` makes the
stand-in write another request at turn 1 of that sample (a live generation that changed).

Two setups, each a script of turns:

- ``tools``: ``tools=[calculator, python]`` (a sync function, an async one that runs a fresh
  subprocess): turn 1 ``calculator(a*b)`` → v; turn 2 ``python(print(v+1))`` and ``calculator(v-1)``;
  turn 3 ``calculator(w*2)`` with the python output w; then an answer.
- ``env``: ``environment_factory=SandboxEnv``, a stateful sandbox (reset, ``python`` that runs the
  sample's whole program again in a subprocess, ``get_reward``): turn 1 ``python(x = a*b)``, turn 2
  ``python(print(x + 1))``, turn 3 ``python(print(<output> * 2))``, then an answer.

Each recording costs a real training run: `recording` and `replay` make each setup's recording (and its replay)
once per test run, for every test file that reads them; each phase that writes runs on `copy_recording`'s copy.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from agent_tools import Calculator, Sandbox
from trl_tiny import tiny_model

if TYPE_CHECKING:
    from pytest import TempPathFactory

    from doc_lines import DocLine

KINDS = ("tools", "env")
STEPS = 4  # steps_per_generation=2: TRL generates (and calls the tools) at steps 0 and 2
GENERATION_STEPS = (0, 2)
SPECIAL = ["<|pad|>", "<|im_end|>", "<|im_start|>", "<tool_call>", "</tool_call>", "<tool_response>",
           "</tool_response>"]
_RESPONSE = re.compile(r"<tool_response>\n(.*?)\n</tool_response>", re.S)

# What the tools really did in this process: each run of the calculator and each sandbox operation.
CALCULATOR = Calculator()
SANDBOX = Sandbox()


def calculator(expression: str) -> str:
    """Evaluate integer arithmetic.

    Args:
        expression: the arithmetic, such as 3*4-1.
    """
    return CALCULATOR(expression)


async def python(code: str) -> str:
    """Run Python code in a fresh interpreter and return what it printed.

    Args:
        code: the program.
    """
    instance = f"one-shot-{SANDBOX.runs}"
    SANDBOX.programs[instance] = []  # a fresh program: this tool keeps no state between calls
    try:
        return await SANDBOX.aexecute(instance, code)
    finally:
        del SANDBOX.programs[instance]


class SandboxEnv:
    """A stateful sandbox: its program is every line it ran; each ``python`` runs it all again."""

    made = 0

    def __init__(self) -> None:
        self.name = f"env{SandboxEnv.made}"
        SandboxEnv.made += 1
        self.outputs: List[str] = []

    def reset(self, **kwargs: Any) -> str:
        if self.name in SANDBOX.programs:
            SANDBOX.release(self.name)
        SANDBOX.create(self.name)
        self.outputs = []
        return " (sandbox ready)"

    def python(self, code: str) -> str:
        """Run Python code after everything this sandbox ran before; returns what it printed.

        Args:
            code: the new lines.
        """
        output = SANDBOX.execute(self.name, code)
        self.outputs.append(output)
        return output

    def get_reward(self) -> float:
        last = self.outputs[-1].splitlines()[-1] if self.outputs and self.outputs[-1] else ""
        return float(last) / 100.0 if last.lstrip("-").isdigit() else 0.0


def executions() -> Dict[str, int]:
    """The tools' real executions so far in this process."""
    return {"calculator": CALCULATOR.runs, "sandbox": SANDBOX.runs}


def tool_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE trained in-process, with the tokens of TRL's Qwen2.5 chat template as special
    tokens and that template set, so TRL adds its own response schema and parses the tool calls."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    corpus = [qwen2_5_chat_template, '{"name": "calculator", "arguments": {"expression": "12*34"}}',
              '{"name": "python", "arguments": {"code": "print(x + 1)"}}', "answer", "compute"]
    bpe.train_from_iterator(corpus * 4, trainer=trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>", eos_token="<|im_end|>",
                                        padding_side="left")
    tokenizer.chat_template = qwen2_5_chat_template
    return tokenizer


def _call(name: str, **arguments: Any) -> str:
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class StandInGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose generation is a seeded stand-in that writes tool calls (see the module's docstring)."""

    def __init__(self, *args: Any, kind: str, change: Optional[Tuple[int, int]] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kind = kind
        self.change = change
        self._firsts: List[List[int]] = []  # the batch's first turns (prompt + completion), to tell its samples
        self.batches: List[Dict[str, Any]] = []  # per rollout batch: its step, completions and rewards

    def _generate_and_score_completions(self, inputs):
        scored = super()._generate_and_score_completions(inputs)
        self.batches.append({
            "step": int(self.state.global_step), "completions": list(self._logs["completion"]),
            "rewards": {name: list(values) for name, values in self._logs["rewards"].items()},
        })
        return scored

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        tok = self.processing_class
        first = num_generations != 1  # TRL's tool loop asks one completion per sample; the first turn, the group
        completions = []
        for row, ids in enumerate(prompt_ids):
            text = tok.decode(ids)
            responses = _RESPONSE.findall(text)
            sample = row if first else next(i for i, f in enumerate(self._firsts) if ids[: len(f)] == f)
            changed = self.change == (int(self.state.global_step), sample)
            completions.append(tok.encode(self._next_turn(responses, changed), add_special_tokens=False))
        if first:
            self._firsts = [list(ids) + done for ids, done in zip(prompt_ids, completions)]
        return completions, None

    def _next_turn(self, responses: List[str], changed: bool) -> str:
        end = "<|im_end|>"
        if not responses:
            a, b = (int(n) for n in torch.randint(11, 99, (2,)))
            if self.kind == "tools":
                return _call("calculator", expression=f"{a}*{b}") + end
            return _call("python", code=f"x = {a}*{b}") + end
        if self.kind == "tools":
            if len(responses) == 1:
                v = responses[0]
                return _call("python", code=f"print({v}+{2 if changed else 1})") + "\n" + _call(
                    "calculator", expression=f"{v}-1") + end
            if len(responses) == 3:
                return _call("calculator", expression=f"{responses[2]}*2") + end
            return f"answer {responses[-1]}" + end
        if len(responses) == 1:
            return _call("python", code=f"print(x + {2 if changed else 1})") + end
        if len(responses) == 2:
            return _call("python", code=f"print({responses[1]} * 2)") + end
        return f"answer {responses[-1].splitlines()[-1]}" + end


def answer_reward(completions, **kwargs) -> List[float]:
    """The answer's last digit over 9 for a conversation that ends in one (rewards that differ, so GRPO's
    advantages and loss are not zero), else 0."""
    found = [re.fullmatch(r"answer -?\d*(\d)", c[-1].get("content", "")) if c else None for c in completions]
    return [int(match.group(1)) / 9 if match else 0.0 for match in found]


def trainer(kind: str, out: Path, change: Optional[Tuple[int, int]] = None) -> StandInGRPOTrainer:
    tokenizer = tool_tokenizer()
    model = tiny_model(tokenizer, max_positions=1024)
    args = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=4, num_generations=4, steps_per_generation=2,
        max_completion_length=256, max_steps=STEPS, logging_steps=1, learning_rate=1e-2,
        lr_scheduler_type="constant", beta=0.0, bf16=False, use_cpu=True, report_to=[], save_strategy="no",
        seed=7, disable_tqdm=True,
    )
    prompts = Dataset.from_dict({"prompt": [[{"role": "user", "content": "compute"}],
                                            [{"role": "user", "content": "compute again"}]]})
    extra: Dict[str, Any] = ({"tools": [calculator, python]} if kind == "tools"
                             else {"environment_factory": SandboxEnv})
    return StandInGRPOTrainer(model=model, reward_funcs=answer_reward, args=args, train_dataset=prompts,
                              processing_class=tokenizer, kind=kind, change=change, **extra)



# What the docs' train_tools.py is: a TRL script that imports nothing of stepjournal.
SCRIPT = "import sys\n\nfrom trl_tool_runs import main\n\nsys.exit(main(sys.argv[1]))\n"
CHANGE = "0,2"  # the stand-in writes another request at turn 2 of sample 2, at step 0


def phase_env(kind: str, change: bool = False) -> Dict[str, Any]:
    """The environment a phase runs in (None removes a name): offline, this folder importable, the setup's kind."""
    return {"PYTHONPATH": str(Path(__file__).resolve().parent), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "STEPJOURNAL_RUN": None, "TRL_EXPERIMENTAL_SILENCE": "1", "TOOL_KIND": kind,
            "TOOL_CHANGE": CHANGE if change else None}


def run_phase(line: str, folder: Path, kind: str, *, change: bool = False) -> Dict[str, Any]:
    """One docs line through bash in `folder` (holding `SCRIPT` as train_tools.py), in a new process: what the
    script wrote to its output folder, the line's last word."""
    import json

    from doc_lines import run_line

    done = run_line(line, folder, env=phase_env(kind, change))
    assert done.returncode == 0, done.stderr[-4000:]
    out = line.split()[-1]
    return json.loads((folder / out / "result.json").read_text())


def copy_recording(recorded: Path, folder: Path) -> Path:
    """A folder holding the script and a copy of the journal recorded in `recorded` (each phase its own): every
    file of the journal's folder (LMDB's data.mdb and lock.mdb, the payload files), as a user's ``cp -r`` copies it."""
    import shutil

    folder.mkdir()
    (folder / "train_tools.py").write_text(SCRIPT)
    shutil.copytree(recorded / "runs", folder / "runs")
    return folder


def doc_lines() -> List[DocLine]:
    """docs/agents.md's lines for this setup: record, replay, tools replayed live, changed (cache), audit."""
    from doc_lines import command_lines

    return command_lines("docs/agents.md", section="TRL: tools= and environment_factory")


def _fingerprint(folder: Path) -> Dict[str, str]:
    """Each file under `folder` by its bytes' digest, less LMDB's lock.mdb (a reader takes its slot there)."""
    import hashlib

    return {str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file() and path.name != "lock.mdb"}


def made_once(tmp_path_factory: TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """The folder `name` that `make` fills once per test run, for every test file that asks: in one pytest
    process, or in the first of pytest-xdist's workers to ask (the others wait on a lock in the run's folder,
    which holds each worker's own, and take what it made). No test may write to it (each phase works on
    `copy_recording`'s copy): each time it is handed out, its bytes are checked against what `make` left.
    A `make` that failed leaves nothing made: the next to ask makes it afresh (and fails as loudly)."""
    import fcntl
    import json
    import os
    import shutil

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, made = root / name, root / f"{name}.made.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
        if not made.exists():
            shutil.rmtree(folder, ignore_errors=True)
            make(folder)
            made.write_text(json.dumps(_fingerprint(folder)))
    assert_unchanged(folder)
    return folder


def assert_unchanged(folder: Path) -> None:
    """Fail when a byte of `made_once`'s `folder` changed since it was made: a test wrote to a shared recording."""
    import json

    made = json.loads((folder.parent / f"{folder.name}.made.json").read_text())
    assert _fingerprint(folder) == made, f"a test wrote to the shared {folder}: write to copy_recording's copy"


def recording(tmp_path_factory: TempPathFactory, kind: str) -> Tuple[Path, Dict[str, Any]]:
    """The setup `kind` recorded with docs/agents.md's first line (a new process), once per test run: its folder,
    which no test may write to, and what the script wrote (`main`)."""
    record = doc_lines()[0].text

    def make(folder: Path) -> None:
        folder.mkdir()
        (folder / "train_tools.py").write_text(SCRIPT)
        run_phase(record, folder, kind)

    return _result(made_once(tmp_path_factory, f"trl-{kind}", make), record)


def replay(tmp_path_factory: TempPathFactory, kind: str) -> Tuple[Path, Dict[str, Any]]:
    """`recording`'s copy replayed (generation and tools) with docs/agents.md's second line, once per test run:
    one journal holding the recording's session, then the replay's; the folder, which no test may write to, and
    what the replaying script wrote."""
    recorded, _ = recording(tmp_path_factory, kind)
    line = doc_lines()[1].text

    def make(folder: Path) -> None:
        run_phase(line, copy_recording(recorded, folder), kind)

    return _result(made_once(tmp_path_factory, f"trl-{kind}-replay", make), line)


def _result(folder: Path, line: str) -> Tuple[Path, Dict[str, Any]]:
    import json

    return folder, json.loads((folder / line.split()[-1] / "result.json").read_text())


def main(out: str) -> int:
    """Train the setup ``TOOL_KIND`` names (``tools`` or ``env``), its stand-in changed where ``TOOL_CHANGE=STEP,SAMPLE``
    says; write what it did to OUT/result.json: each rollout batch, the logged values (floats as exact hex), the
    tools' real executions, and the call the rule refused (which stops training), if any.

    It imports nothing of stepjournal: ``python -m stepjournal.adapters.trl`` journals it (docs/agents.md).
    """
    import json
    import os

    from trl_tiny import logged

    change = os.environ.get("TOOL_CHANGE")
    run = trainer(os.environ["TOOL_KIND"], Path(out), tuple(int(n) for n in change.split(",")) if change else None)
    refused = None
    try:
        run.train()
    except Exception as error:  # a refusal of the journal's rule: its typed error, as a user sees it
        if type(error).__name__ != "ToolReplayMissError":
            raise
        refused = {"error": type(error).__name__, "stage": error.stage, "key": str(error.key),
                   "request": str(error.request), "step": error.step}
    Path(out, "result.json").write_text(json.dumps({
        "batches": run.batches, "logged": logged(run), "executions": executions(), "refused": refused}))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1]))
