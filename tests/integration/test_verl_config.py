"""Every verl rollout-skip config form becomes the intended stepjournal policy; conflicts and bad values fail.

The base config is verl 0.9.1's own generated PPO trainer config, loaded with OmegaConf.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

from stepjournal import Journal
from stepjournal.adapters.verl import read_verl_config, verl_fingerprint, verl_run_key
from stepjournal.policies import ConfigError, Engine, EngineOptions, FingerprintMismatchError, parse

BASE = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
DUMPS = "/data/dumps"


def verl_cfg(overrides: dict, *, as_dict: bool = False):
    cfg = OmegaConf.load(BASE)
    cfg = OmegaConf.merge(cfg, OmegaConf.create(overrides))
    return OmegaConf.to_container(cfg, resolve=False) if as_dict else cfg


def rollout(**keys) -> dict:
    return {"actor_rollout_ref": {"rollout": keys}}


def manager(role: str, **keys) -> dict:
    return {"skip": {role: keys}}


FORMS = [
    # name, overrides, form, policy spec, journal path, step source
    ("native spec + path", {"stepjournal": {"policy": "dump@1-5;repeat", "path": "/data/j"}},
     "stepjournal", "dump@1-5;repeat", "/data/j", "auto"),
    ("native under dump_dir", {"stepjournal": {"policy": "cache", "dump_dir": DUMPS}},
     "stepjournal", "cache", f"{DUMPS}/stepjournal", "auto"),
    ("native, async", {"stepjournal": {"policy": "cache", "path": "/data/j", "step_source": "feed_index"}},
     "stepjournal", "cache", "/data/j", "feed_index"),
    ("v1 skip_rollout", rollout(skip_rollout=True, skip_dump_dir=DUMPS),
     "rollout_skip_v1", "cache@1;repeat_last", f"{DUMPS}/stepjournal", "global_steps"),
    ("v2 repeat", rollout(skip={"enable": True, "dump_dir": DUMPS, "max_dump_step": 5, "action": "repeat"}),
     "rollout_skip_v2", "cache@1-5;repeat", f"{DUMPS}/stepjournal", "global_steps"),
    ("v2 repeat_last", rollout(skip={"enable": True, "dump_dir": DUMPS, "max_dump_step": 1, "action": "repeat_last"}),
     "rollout_skip_v2", "cache@1;repeat_last", f"{DUMPS}/stepjournal", "global_steps"),
    ("v2 cache really caches", rollout(skip={"enable": True, "dump_dir": DUMPS, "max_dump_step": 3, "action": "cache"}),
     "rollout_skip_v2", "cache@1-3;cache", f"{DUMPS}/stepjournal", "global_steps"),
    ("v2 no dump steps", rollout(skip={"enable": True, "dump_dir": DUMPS, "max_dump_step": 0, "action": "cache"}),
     "rollout_skip_v2", "cache", f"{DUMPS}/stepjournal", "global_steps"),
    ("v2 defaults", rollout(skip={"enable": True, "dump_dir": DUMPS}),
     "rollout_skip_v2", "cache@1;repeat", f"{DUMPS}/stepjournal", "global_steps"),
    ("v2-pre rollout", rollout(skip={"enable": True, "dump_dir": DUMPS, "dump_step": 3, "post_dump_action": "rollout"}),
     "rollout_skip_v2_pre", "cache@1-3;passthrough", f"{DUMPS}/stepjournal", "global_steps"),
    ("v2-pre rollout_with_dump", rollout(skip={"enable": True, "dump_dir": DUMPS, "dump_step": 2,
                                               "post_dump_action": "rollout_with_dump"}),
     "rollout_skip_v2_pre", "cache@1-2;dump", f"{DUMPS}/stepjournal", "global_steps"),
    ("SkipManager cache", manager("rollout", enable=True, dump_dir=DUMPS, steps=[1, 2, 3, 7], action="cache"),
     "skip_manager.rollout", "cache@1-3,7;passthrough", f"{DUMPS}/stepjournal", "global_steps"),
    ("SkipManager repeat", manager("rollout", enable=True, dump_dir=DUMPS, steps=[2, 5], action="repeat"),
     "skip_manager.rollout", "nearest@2,5;passthrough", f"{DUMPS}/stepjournal", "global_steps"),
    ("SkipManager no steps", manager("rollout", enable=True, dump_dir=DUMPS, steps=[], action="cache"),
     "skip_manager.rollout", "passthrough", f"{DUMPS}/stepjournal", "global_steps"),
    ("SkipManager async", manager("async_rollout", enable=True, dump_dir=DUMPS, steps=[0, 1, 2, 3], action="cache"),
     "skip_manager.async_rollout", "cache@0-3;passthrough", f"{DUMPS}/stepjournal", "feed_index"),
]


@pytest.mark.parametrize("as_dict", [False, True], ids=["omegaconf", "dict"])
@pytest.mark.parametrize("name,overrides,form,spec,path,step_source", FORMS, ids=[f[0] for f in FORMS])
def test_each_config_form_gives_the_intended_policy(name, overrides, form, spec, path, step_source, as_dict):
    found = read_verl_config(verl_cfg(overrides, as_dict=as_dict))
    assert (found.form, found.policy, found.path, found.step_source) == (form, spec, path, step_source)
    assert found.run == "gsm8k_verl_examples"
    assert found.fingerprint == {
        "verl.gen_batch_size": 1024, "verl.rollout_n": 1, "verl.max_prompt_length": 512, "verl.max_response_length": 512,
        # what verl's generated defaults set of what changes generation (docs/verl.md, "The fingerprint")
        "verl.model_path": "~/models/deepseek-llm-7b-chat", "verl.temperature": 1, "verl.top_p": 1, "verl.top_k": -1,
        "verl.do_sample": True, "verl.train_files": "~/data/rlhf/gsm8k/train.parquet",
    }
    parse(found.policy)


def test_nothing_enabled_gives_none():
    assert read_verl_config(verl_cfg({})) is None
    assert read_verl_config(verl_cfg({"stepjournal": {"enable": False, "policy": "cache"}})) is None


def test_run_key_and_fingerprint_follow_verls_dump_folder_naming():
    cfg = verl_cfg({"trainer": {"experiment_name": "dapo_qwen", "project_name": "math"},
                    "data": {"gen_batch_size": 96, "train_batch_size": 32, "max_prompt_length": 2048,
                             "max_response_length": 8192},
                    "actor_rollout_ref": {"rollout": {"n": 16}},
                    "stepjournal": {"policy": "cache", "path": "/j", "fingerprint": {"model": "Qwen2.5-7B", "seed": 7}}})
    assert verl_run_key(cfg) == "dapo_qwen_math"
    folder_keys = ("verl.gen_batch_size", "verl.rollout_n", "verl.max_prompt_length", "verl.max_response_length")
    assert {k: verl_fingerprint(cfg)[k] for k in folder_keys} == {"verl.gen_batch_size": 96, "verl.rollout_n": 16,
                                                                 "verl.max_prompt_length": 2048,
                                                                 "verl.max_response_length": 8192}
    assert read_verl_config(cfg).fingerprint["model"] == "Qwen2.5-7B"


def test_a_dump_dir_cannot_move_the_journal_outside_it():
    found = read_verl_config(verl_cfg(manager("rollout", enable=True, dump_dir="/data/../data/dumps/./x/..", steps=[1])))
    assert found.path == "/data/dumps/stepjournal"
    home = read_verl_config(verl_cfg(rollout(skip_rollout=True)))
    assert home.path == os.path.join(os.path.expanduser("~/.verl/rollout_dump"), "stepjournal")


CONFLICTS = [
    ("native + v2", {"stepjournal": {"policy": "cache", "path": "/j"}, **rollout(skip={"enable": True})}),
    ("v1 + SkipManager", {**rollout(skip_rollout=True), **manager("rollout", enable=True, steps=[1])}),
    ("rollout + async_rollout", {"skip": {"rollout": {"enable": True, "steps": [1]},
                                          "async_rollout": {"enable": True, "steps": [1]}}}),
]


@pytest.mark.parametrize("name,overrides", CONFLICTS, ids=[c[0] for c in CONFLICTS])
def test_two_forms_enabled_at_once_is_an_error(name, overrides):
    with pytest.raises(ConfigError, match="enables 2 rollout-skip forms at once"):
        read_verl_config(verl_cfg(overrides))


BAD = [
    ("v2 action", rollout(skip={"enable": True, "action": "random"}), r"skip.action='random' is not valid"),
    ("v2 max_dump_step", rollout(skip={"enable": True, "max_dump_step": -1}), r"max_dump_step=-1 must be an integer"),
    ("v2 repeat without dump steps", rollout(skip={"enable": True, "max_dump_step": 0, "action": "repeat"}),
     "needs action=cache"),
    ("v2 mixed keys", rollout(skip={"enable": True, "max_dump_step": 2, "dump_step": 2}), "mixes the v2 keys"),
    ("v2 unknown key", rollout(skip={"enable": True, "steps": [1]}), "unknown keys"),
    ("v1 enable not bool", rollout(skip_rollout="yes"), "skip_rollout='yes' must be true or false"),
    ("SkipManager steps", manager("rollout", enable=True, steps=["3"]), "steps=.* must be a list of non-negative"),
    ("SkipManager action", manager("rollout", enable=True, steps=[1], action="repeat_last"),
     "action='repeat_last' is not valid: use one of cache, repeat"),
    ("native unknown key", {"stepjournal": {"policy": "cache", "path": "/j", "polcy": "x"}}, r"unknown keys \['polcy'\]"),
    ("native no policy", {"stepjournal": {"path": "/j"}}, "stepjournal.policy is missing"),
    ("native bad spec", {"stepjournal": {"policy": "cache@1-;;", "path": "/j"}}, "not a valid policy spec|not valid"),
    ("native path and dump_dir", {"stepjournal": {"policy": "cache", "path": "/j", "dump_dir": "/d"}}, "keep one"),
    ("native step source", {"stepjournal": {"policy": "cache", "path": "/j", "step_source": "epoch"}},
     "step_source='epoch' is not valid"),
]


@pytest.mark.parametrize("name,overrides,message", BAD, ids=[b[0] for b in BAD])
def test_a_bad_value_is_a_clear_error(name, overrides, message):
    with pytest.raises(ConfigError, match=message):
        read_verl_config(verl_cfg(overrides))


# -- the policies do what each verl form did ---------------------------------------------------------------


def simulate(tmp_path, overrides, steps, runs=2):
    """Run `steps` through the engine `runs` times; return per run [(step, action, source step)]."""
    found = read_verl_config(verl_cfg({**overrides}))
    out = []
    for _ in range(runs):
        with Journal(str(tmp_path / "j"), run=found.run, fingerprint=found.fingerprint) as journal:
            engine = Engine(journal, parse(found.policy))
            calls = []
            for step in steps:
                outcome = engine.call(step, lambda: {"step": step})
                source = outcome.source.step if outcome.source is not None and outcome.action == "replayed" else None
                stored = outcome.source is not None and outcome.source.event.output is not None
                calls.append((step, outcome.action if outcome.action != "generated" or stored else "ran", source))
            out.append(calls)
    return out


def test_v1_records_the_first_step_and_serves_it_for_every_step(tmp_path):
    first, second = simulate(tmp_path, rollout(skip_rollout=True, skip_dump_dir=str(tmp_path)), [1, 2, 3, 4])
    assert first == [(1, "generated", None), (2, "replayed", 1), (3, "replayed", 1), (4, "replayed", 1)]
    assert second == [(1, "replayed", 1), (2, "replayed", 1), (3, "replayed", 1), (4, "replayed", 1)]


def test_v2_repeat_cycles_through_the_dump_steps(tmp_path):
    first, _ = simulate(tmp_path, rollout(skip={"enable": True, "max_dump_step": 2, "action": "repeat",
                                                "dump_dir": str(tmp_path)}), [1, 2, 3, 4, 5])
    assert first == [(1, "generated", None), (2, "generated", None), (3, "replayed", 1), (4, "replayed", 2),
                     (5, "replayed", 1)]


def test_skip_manager_touches_only_its_steps(tmp_path):
    first, second = simulate(tmp_path, manager("rollout", enable=True, steps=[2, 3], action="cache",
                                               dump_dir=str(tmp_path)), [1, 2, 3, 4])
    assert first == [(1, "ran", None), (2, "generated", None), (3, "generated", None), (4, "ran", None)]
    assert second == [(1, "ran", None), (2, "replayed", 2), (3, "replayed", 3), (4, "ran", None)]


def test_skip_manager_repeat_serves_the_nearest_dumped_step(tmp_path):
    first, _ = simulate(tmp_path, manager("rollout", enable=True, steps=[2, 5], action="repeat",
                                          dump_dir=str(tmp_path)), [2, 5])
    assert first == [(2, "generated", None), (5, "replayed", 2)]


def test_records_made_under_another_rollout_n_are_refused(tmp_path):
    dump = manager("rollout", enable=True, steps=[1], action="cache", dump_dir=str(tmp_path))
    simulate(tmp_path, dump, [1], runs=1)
    with pytest.raises(FingerprintMismatchError, match="verl.rollout_n"):
        simulate(tmp_path, {**dump, "actor_rollout_ref": {"rollout": {"n": 8}}}, [1], runs=1)


def test_every_engine_option_is_a_key_of_the_stepjournal_section():
    """on_corrupt (promised in configs by docs/reliability.md) and every other engine option are read."""
    section = {"policy": "cache", "path": "/data/j", "on_corrupt": "regenerate", "verify_input": True,
               "on_input_mismatch": "error", "allow_fingerprint_mismatch": True, "bypass_modes": ["validate", "eval"],
               "on_stage_input_mismatch": "generate", "check_prompts": "same_step"}
    found = read_verl_config(verl_cfg({"stepjournal": section}))
    assert found.engine.options == EngineOptions(on_corrupt="regenerate", verify_input=True, on_input_mismatch="error",
                                                 allow_fingerprint_mismatch=True, bypass_modes=("validate", "eval"),
                                                 on_stage_input_mismatch="generate", check_prompts="same_step")
    assert set(EngineOptions.names()) <= {key.split(".", 1)[1] for key in found.keys}
    with pytest.raises(ConfigError, match="on_corrupt=.ignore. is not valid"):
        read_verl_config(verl_cfg({"stepjournal": {"policy": "cache", "path": "/data/j", "on_corrupt": "ignore"}}))


def test_verls_own_config_dataclasses_are_read_too():
    from verl.utils.skip.config import RolloutSkipConfig, SkipManagerConfig

    cfg = {"trainer": {"experiment_name": "e", "project_name": "p"},
           "skip": SkipManagerConfig(rollout=RolloutSkipConfig(enable=True, dump_dir="/d", steps=[4, 5], action="repeat"))}
    found = read_verl_config(cfg)
    assert (found.form, found.policy, found.path, found.run) == ("skip_manager.rollout", "nearest@4-5;passthrough",
                                                                 "/d/stepjournal", "e_p")


def test_a_stepjournal_link_planted_in_a_shared_dump_dir_is_refused(tmp_path):
    """verl's dump_dir may be shared; a `stepjournal` symlink in it must not redirect the journal."""
    from stepjournal.errors import UnsafePathError
    from stepjournal.adapters.verl import read_verl_config

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "stepjournal").symlink_to(elsewhere)
    with pytest.raises(UnsafePathError, match="stepjournal"):
        read_verl_config(verl_cfg({"stepjournal": {"policy": "cache", "dump_dir": str(shared)}}))


def test_without_verl_the_config_reader_imports_and_the_rest_names_the_extra(tmp_path):
    """verl and tensordict blocked: `read_verl_config` works, `attach` raises ImportError with the pip hint."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('verl', 'tensordict'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import stepjournal.adapters.verl as v\n"
        "found = v.read_verl_config({'trainer': {'experiment_name': 'e', 'project_name': 'p'},\n"
        "                            'stepjournal': {'policy': 'cache', 'path': 'j'}})\n"
        "assert (found.policy, found.run) == ('cache', 'e_p'), found\n"
        "assert issubclass(v.VerlStepError, v.VerlAdapterError)\n"
        "try:\n"
        "    from stepjournal.adapters.verl import attach\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('attach imported without verl')\n"
        "assert 'verl' not in sys.modules and 'tensordict' not in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "pip install -e '.[verl]'" in result.stdout
    assert "attach needs verl" in result.stdout
