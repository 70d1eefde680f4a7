"""A newcomer's first hour, typed at a terminal 80 columns wide (issue 48's "must show").

One session, in the order the README and docs/ lead a new user: the demo, then reading its journal as text and
as a report; docs/trl.md's script, run unedited, then its completions read back with no flag; the run in
TensorBoard; an existing verl config with rollout skip moved to stepjournal by pasting the line `verl-config`
prints. Every command goes through bash on a real pseudo-terminal (`typed_in_terminal`): what is checked is what
the newcomer sees there.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from doc_lines import shell_argv, typed_in_terminal

pytestmark = pytest.mark.e2e  # a GRPO run, verl's Hydra: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 80


def typed(line: str, cwd: Path) -> str:
    """`line` typed at the terminal: it succeeds, prints no traceback and no error, and (a reading verb's
    output) no line wider than the terminal."""
    status, shown = typed_in_terminal(line, cwd, columns=WIDTH)
    assert status == 0, f"$ {line}\n{shown}"
    assert "Traceback" not in shown and "error:" not in shown, f"$ {line}\n{shown}"
    return shown


def fits(line: str, shown: str) -> None:
    wide = [text for text in shown.splitlines() if len(text) > WIDTH]
    assert not wide, f"$ {line} drew lines wider than {WIDTH} columns:\n" + "\n".join(wide)


def squeezed(text: str) -> str:
    """`text` without its whitespace: a line the terminal's width broke still matches."""
    return "".join(text.split())


def test_a_newcomers_hour_at_80_columns(tmp_path):
    home = tmp_path

    # 1. `make demo` runs the demo; the README then reads its journal as text and as a report.
    typed("python -m stepjournal.adapters.demo", home)
    line = "stepjournal show .stepjournal-demo 1 --text"
    shown = typed(line, home)
    fits(line, shown)
    # The demo's generator emits random ids, so the journal keeps no tokenizer: ids, and one line saying how
    # to get text.
    assert re.search(r"\[\d+, \d+", shown), shown
    assert "kept no tokenizer, so ids are shown; for text see docs/reading.md" in shown, shown
    line = "stepjournal report .stepjournal-demo -o demo.html"
    fits(line, typed(line, home))
    assert "<html" in (home / "demo.html").read_text()[:2000].lower()

    # 2. docs/trl.md's complete example, saved as a script and run as it stands; then its completions as text,
    # with no flag: the journal kept the tokenizer the script built.
    page = (ROOT / "docs" / "trl.md").read_text()
    (home / "grpo.py").write_text(re.search(r"^```python\n(.*?)^```", page, re.S | re.M).group(1))
    typed("python grpo.py", home)
    line = "stepjournal show grpo-journal 0 --text"
    shown = typed(line, home)
    fits(line, shown)
    from stepjournal import Journal
    from stepjournal.adapters import journal_tokenizer
    from stepjournal.adapters.cli._render import clean  # private: the CLI's own escaping of control characters

    with Journal(str(home / "grpo-journal"), readonly=True) as journal:
        tokenizer = journal_tokenizer(journal, "tiny-grpo")
        samples = journal.samples(0, run="tiny-grpo", tokenizer=tokenizer)
    # A tiny untrained model's completions hold control characters, which the terminal shows escaped.
    completions = [clean(sample.response) for sample in samples if sample.response.strip()]
    assert completions, "the recorded completions decode to nothing"
    assert all(squeezed(text) in squeezed(shown) for text in completions[:4]), shown

    # 3. The run beside the training curves: TensorBoard's own reader reads what the export wrote.
    line = "stepjournal export grpo-journal --tensorboard tb"
    fits(line, typed(line, home))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted(path.parent for path in (home / "tb").rglob("events.out.tfevents.*"))
    assert len(runs) == 2, runs  # the recording and the replay, one TensorBoard run each
    for run in runs:
        events = EventAccumulator(str(run))
        events.Reload()
        losses = [point.value for point in events.Scalars("metrics/loss")]
        assert len(losses) == 4, (run, losses)  # docs/trl.md trains four steps

    # 4. An existing verl config with rollout skip, moved by pasting the line verl-config prints: it composes
    # in verl's own Hydra to the same policy, journal and run.
    import verl

    cfg = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    OmegaConf.update(cfg, "skip.rollout", {"enable": True, "steps": [1, 2, 3], "action": "cache",
                                           "dump_dir": str(home / "rollouts")}, merge=True)
    OmegaConf.save(cfg, home / "my_ppo.yaml")
    shown = typed("stepjournal verl-config my_ppo.yaml", home)
    pasted = next(text for text in shown.splitlines() if text.strip() and not text.startswith("#"))  # the paste
    argv = shell_argv(home, f"python -m verl.trainer.main_ppo --config-path {home} --config-name my_ppo {pasted}")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from stepjournal.adapters.verl import read_verl_config

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(home), version_base=None):
        composed = compose(config_name="my_ppo", overrides=argv[6:])
    before, after = read_verl_config(OmegaConf.load(home / "my_ppo.yaml")), read_verl_config(composed)
    assert after.form == "stepjournal" and before.policy == "cache@1-3;passthrough"
    assert (after.policy, after.path, after.run) == (before.policy, before.path, before.run)
    assert composed.skip.rollout.enable is False
