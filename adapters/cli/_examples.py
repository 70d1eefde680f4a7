"""Two or three real command lines per verb, shown at the end of ``stepjournal VERB --help``.

Each line is checked by the parser itself in tests/integration/test_cli_help.py, so an example cannot name an
option that does not exist.
"""

from __future__ import annotations

from typing import Dict, Tuple

__all__ = ["EXAMPLES", "examples_text"]

# verb -> ((command line, what it does), ...)
EXAMPLES: Dict[str, Tuple[Tuple[str, str], ...]] = {
    "runs": (
        ("stepjournal runs runs/grpo", "runs and sessions, fitted to the terminal"),
        ("stepjournal runs runs/grpo --wide", "every column"),
        ("stepjournal runs runs/grpo --stage reward --json", "the reward stage's counts, as JSON"),
    ),
    "audit": (
        ("stepjournal audit runs/grpo --steps 100-200", "what happened to each call of steps 100-200"),
        ("stepjournal audit runs/grpo --summary", "one line per range of steps that went alike"),
        ("stepjournal audit runs/grpo --action refused --csv > refused.csv", "every refused call, as CSV"),
    ),
    "show": (
        ("stepjournal show runs/grpo 40", "the generate output of step 40: keys, dtypes, shapes"),
        ("stepjournal show runs/grpo 40 --stage reward", "its rewards"),
        ("stepjournal show runs/grpo 40 --text", "each sample decoded, with its reward"),
    ),
    "verify": (
        ("stepjournal verify runs/grpo", "re-hash every payload and decode every event"),
        ("stepjournal verify team.bundle", "check a bundle before importing it"),
    ),
    "export": (
        ("stepjournal export runs/grpo --to exported --steps 1-10", "steps 1-10 as safetensors + JSON"),
        ("stepjournal export runs/grpo --bundle team.bundle --steps 1-50", "steps 1-50 in one portable file"),
        ("stepjournal export runs/grpo --tensorboard tb", "each session as a TensorBoard run, beside the training's"),
    ),
    "import": (
        ("stepjournal import team.bundle runs/grpo", "bring a bundle's records into a journal"),
        ("stepjournal import team.bundle runs/grpo --as grpo-colleague", "under another run key"),
    ),
    "timeline": (
        ("stepjournal timeline runs/grpo --out grpo.html", "the whole run as one HTML page"),
        ("stepjournal timeline runs/grpo --steps 1-200 --out start.png", "its first 200 steps as a PNG"),
    ),
    "reindex": (
        ("stepjournal reindex runs/grpo", "rebuild the index from the event log"),
        ("stepjournal reindex runs/grpo -v", "the same, saying what it does"),
    ),
    "prune": (
        ("stepjournal prune runs/grpo --keep-last 100 --dry-run", "what keeping the last 100 steps would release"),
        ("stepjournal prune runs/grpo --max-bytes 50G --pin 1-10", "stay under 50 GB, never releasing steps 1-10"),
        ("stepjournal prune runs/grpo", "no rule: delete only bytes earlier releases left stored"),
    ),
    "compact": (
        ("stepjournal compact runs/grpo", "give the space prune freed back to the disk"),
        ("stepjournal compact runs/grpo --to runs/grpo-compacted", "write a compacted copy instead"),
    ),
    "verl-config": (
        ("stepjournal verl-config ppo_trainer.yaml", "the overrides to paste (quoted for the shell) and the YAML"),
        ("stepjournal verl-config outputs/2026-11-30/10-00-00/.hydra/config.yaml", "the same for a run's saved config"),
    ),
    "import-verl": (
        ("stepjournal import-verl /data/rollout_dump --into runs/grpo --trust-pickle",
         "verl RolloutSkip dumps into a journal (unpickles them: your own dumps only)"),
        ("stepjournal import-verl /data/rollout_dump --into runs/grpo --trust-pickle --json", "the report as JSON"),
    ),
    "plugins": (
        ("stepjournal plugins", "the installed policy plugins and whether each loads"),
        ("stepjournal plugins --json", "the same, as JSON"),
    ),
    "report": (
        ("stepjournal report runs/grpo -o grpo.html", "the run in one HTML file: charts, samples, search"),
        ("stepjournal report runs/grpo -o grpo.html --samples 32 --chars 500", "more samples a step, shorter text"),
        ("stepjournal report runs/grpo -o replay.html --session s2", "one session's calls and metrics"),
    ),
    "completion": (
        ("stepjournal completion bash", 'the bash script; in ~/.bashrc: eval "$(stepjournal completion bash)"'),
        ("stepjournal completion zsh", 'the zsh script; in ~/.zshrc: eval "$(stepjournal completion zsh)"'),
    ),
    "push": (
        ("stepjournal push runs/grpo", "send what is new to the journal's default remote"),
        ("stepjournal push runs/grpo s3://bucket/team/grpo", "to a URL"),
    ),
    "pull": (
        ("stepjournal pull runs/grpo", "bring in what was pushed to the default remote"),
        ("stepjournal pull origin runs/grpo --keep ours", "keep serving this journal's records where they differ"),
    ),
    "clone": (
        ("stepjournal clone s3://bucket/team/grpo runs/grpo", "a new journal from a remote, which it names origin"),
        ("stepjournal clone /mnt/shared/grpo runs/grpo --json", "from a folder, the report as JSON"),
        ("stepjournal clone team runs/grpo", "from one of your own remotes (stepjournal remote add --global)"),
    ),
    "status": (
        ("stepjournal status runs/grpo", "what push would send and pull would fetch (sends nothing)"),
        ("stepjournal status runs/grpo origin --json", "against a named remote, as JSON"),
    ),
    "remote": (
        ("stepjournal remote add runs/grpo origin s3://bucket/team/grpo", "name a remote (the first is the default)"),
        ("stepjournal remote list runs/grpo", "the journal's remotes"),
        ("stepjournal remote add --global team s3://bucket/team", "a name of your own, for every journal and clone"),
    ),
    "diff": (
        ("stepjournal diff run-a run-b", "where two runs' recordings part"),
        ("stepjournal diff runs/grpo runs/grpo --session-a s1 --session-b s2", "a replay against its recording"),
        ("stepjournal diff run-a run-b --stage reward --tol reward=1e-6 --plot diff.html", "rewards only, drawn"),
    ),
}


def examples_text(verb: str) -> str:
    """The ``examples:`` paragraph of a verb's help."""
    lines = ["examples:"]
    for command, what in EXAMPLES[verb]:
        lines += [f"  {command}", f"      {what}"]
    return "\n".join(lines)
