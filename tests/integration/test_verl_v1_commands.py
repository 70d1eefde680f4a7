"""Every verl command line in docs/verl.md and docs/stages.md works as typed: through a real shell, then verl's own Hydra.

Each ```console block that runs ``python -m verl...`` is run by ``bash -c`` with ``python`` on PATH
replaced by a tiny script that writes down its argv; the overrides it received are composed by Hydra
from the config the module's ``@hydra.main`` names (``ppo_trainer.yaml`` for ``main_ppo``), as
``--cfg job`` would, and the composed config must reach stepjournal as the ``<!-- verl-command: ... -->``
line above the block says.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from doc_lines import command_lines, shell_argv
from verl_support import ENTRY_POINTS, compose

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("docs/verl.md", "docs/stages.md")
DOC_LINES = [line for page in PAGES for line in command_lines(page) if line.text.startswith("python -m verl.")]
BLOCK = re.compile(r"(?:<!-- verl-command: (?P<expect>[^\n]*?) -->\n)?```console\n(?P<body>.*?)^```", re.S | re.M)

def verl_blocks():
    found = []
    for page in PAGES:
        for match in BLOCK.finditer((ROOT / page).read_text(encoding="utf-8")):
            if "python -m verl." in match["body"]:
                found.append((match["expect"], match["body"]))
    return found



def test_docs_show_verl_command_lines_and_each_says_what_it_configures():
    blocks = verl_blocks()
    assert len(blocks) >= 4 and len(blocks) == len(DOC_LINES)  # one command line a block
    assert all(expect for expect, _ in blocks), "a verl command line in docs/verl.md has no verl-command line"


@pytest.mark.parametrize("expect,body", verl_blocks(), ids=lambda v: v.split()[0] if " " in v else "block")
def test_a_documented_verl_command_line_composes_and_configures_stepjournal(expect, body, tmp_path):
    from stepjournal.adapters.verl import make_journaled_agent_loop_manager, read_verl_config
    from verl.utils.import_utils import load_class_from_fqn

    argv = shell_argv(tmp_path, body)
    assert argv[0] == "-m" and argv[1] in ENTRY_POINTS
    config = compose(argv[1], [a for a in argv[2:] if a != "--cfg" and a != "job"])
    wanted = dict(item.split("=", 1) for item in expect.split())
    found = read_verl_config(config)
    assert found.form == wanted["form"]
    assert found.policy == wanted["policy"]
    if "path" in wanted:
        assert found.path == wanted["path"]
    if "stages" in wanted:
        from stepjournal.adapters.verl.v1._stages import (  # private: a verl adapter internal under test
            check_verl_stages,
        )

        assert check_verl_stages(found.policy).stages == tuple(wanted["stages"].split(","))
    if "step_source" in wanted:
        assert found.step_source == wanted["step_source"]
    if "payload_store" in wanted:
        assert found.engine.payload_store == wanted["payload_store"]
    if "manager" in wanted:
        fqn = config.actor_rollout_ref.rollout.agent.agent_loop_manager_class
        assert load_class_from_fqn(fqn, "AgentLoopManager") is make_journaled_agent_loop_manager()
    if "setup_hook" in wanted:
        hook = config.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook
        import stepjournal.adapters.verl as adapter

        assert hook == f"stepjournal.adapters.verl.{wanted['setup_hook']}"
        assert callable(getattr(adapter, wanted["setup_hook"]))


def test_the_spellings_the_docs_used_to_show_fail_in_verls_hydra(tmp_path):
    """Without `+` the manager key is not in verl 0.9.1's struct config; single quotes die in the shell."""
    from hydra.errors import ConfigCompositionException, OverrideParseException

    with pytest.raises(ConfigCompositionException):
        compose("verl.trainer.main_ppo", [
            "actor_rollout_ref.rollout.agent.agent_loop_manager_class=stepjournal.adapters.verl.JournaledAgentLoopManager"])
    argv = shell_argv(tmp_path, "python -m verl.trainer.main_ppo +stepjournal.policy='dump@1-5;repeat'")
    assert argv[2] == "+stepjournal.policy=dump@1-5;repeat"
    with pytest.raises(OverrideParseException):
        compose("verl.trainer.main_ppo", argv[2:])
