"""`stepjournal verl-config` moves a verl config's rollout skip to stepjournal in one pasted line, and the
`stepjournal` section Hydra composes is checked, with a did-you-mean for a misspelled key.

The configs are verl 0.9.1's own generated PPO trainer config with one of its ``skip.*`` sections
enabled. The printed line goes, as a user pastes it, through bash into verl's own Hydra composition
(`python` on PATH replaced by a script that writes down its argv, as in test_verl_v1_commands.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import verl
from omegaconf import OmegaConf

from doc_lines import command_lines, run_line, shell_argv, shown_under
from verl_support import compose

from stepjournal.adapters.verl import read_verl_config

VERL_CONFIG = Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml"
DOC_LINES = [line for line in command_lines("docs/verl.md") if line.text.startswith("stepjournal verl-config ")]

SKIPS = [
    # name, skip section enabled in verl's config, the stepjournal policy it means
    ("rollout_tq repeat", "rollout_tq", {"steps": [1, 2, 3, 7], "action": "repeat", "dump_dir": "/ckpt/rollouts"},
     "nearest@1-3,7;passthrough"),
    ("rollout cache, a dump_dir bash and Hydra would cut", "rollout",
     {"steps": [2, 4], "action": "cache", "dump_dir": "/ckpt/it's a;dir,$HOME"}, "cache@2,4;passthrough"),
    ("async_rollout, verl's default dump_dir", "async_rollout", {"steps": [0, 1, 2], "action": "cache"},
     "cache@0-2;passthrough"),
]


def skip_config(folder: Path, role: str, keys: dict) -> Path:
    """verl's own generated trainer config with `skip.<role>` enabled, written as a user's YAML."""
    cfg = OmegaConf.load(VERL_CONFIG)
    OmegaConf.update(cfg, f"skip.{role}", {"enable": True, **keys}, merge=True)
    path = folder / "my_ppo.yaml"
    OmegaConf.save(cfg, path)
    return path


def pasted_line(stdout: str) -> str:
    """The line a user copies: the first one that is not a comment."""
    return next(line for line in stdout.splitlines() if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize("name,role,keys,policy", SKIPS, ids=[s[0] for s in SKIPS])
def test_the_printed_line_composes_in_verls_hydra_to_the_same_policy(name, role, keys, policy, tmp_path):
    config = skip_config(tmp_path, role, keys)
    before = read_verl_config(OmegaConf.load(config))
    assert before.policy == policy

    done = run_line(f"stepjournal verl-config {config}", tmp_path)
    assert done.returncode == 0, done.stderr
    line = pasted_line(done.stdout)
    argv = shell_argv(tmp_path, f"python -m verl.trainer.main_ppo --config-path {tmp_path} --config-name my_ppo {line}")
    assert argv[:6] == ["-m", "verl.trainer.main_ppo", "--config-path", str(tmp_path), "--config-name", "my_ppo"]

    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        composed = hydra_compose(config_name="my_ppo", overrides=argv[6:])
    after = read_verl_config(composed)
    assert after.form == "stepjournal"
    assert (after.policy, after.path, after.run, after.fingerprint) == (before.policy, before.path, before.run,
                                                                        before.fingerprint)
    assert composed.skip[role].enable is False
    if role == "async_rollout":  # the fully-async rollouter is journaled by Ray's setup hook, by feed index
        assert composed.ray_kwargs.ray_init.runtime_env.worker_process_setup_hook == \
            "stepjournal.adapters.verl.install_fully_async"
    else:
        assert composed.actor_rollout_ref.rollout.agent.agent_loop_manager_class == \
            "stepjournal.adapters.verl.JournaledAgentLoopManager"

    # The YAML it prints, put into the config instead, reads the same.
    yaml_text = done.stdout.split("for checked keys):\n", 1)[1]
    edited = OmegaConf.merge(OmegaConf.load(config), OmegaConf.create(yaml_text))
    pasted = read_verl_config(edited)
    assert (pasted.form, pasted.policy, pasted.path) == ("stepjournal", before.policy, before.path)


def test_a_config_already_on_stepjournal_keeps_its_section(tmp_path):
    """Its own section is not reset by the printed line (Hydra merges `+stepjournal=verl` after the file)."""
    cfg = OmegaConf.load(VERL_CONFIG)
    cfg.stepjournal = {"policy": "cache@1-5;repeat", "dump_dir": "/ckpt/rollouts", "fingerprint": {"data": 3}}
    OmegaConf.save(cfg, tmp_path / "my_ppo.yaml")
    before = read_verl_config(cfg)
    done = run_line("stepjournal verl-config my_ppo.yaml", tmp_path)
    assert done.returncode == 0, done.stderr
    argv = shell_argv(tmp_path, f"python {pasted_line(done.stdout)}")

    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        after = read_verl_config(hydra_compose(config_name="my_ppo", overrides=argv))
    assert (after.policy, after.path, after.fingerprint) == (before.policy, before.path, before.fingerprint)


def test_the_docs_line_prints_what_the_page_shows(tmp_path):
    """docs/verl.md's `stepjournal verl-config my_ppo.yaml`, on verl's config with skip.rollout_tq enabled."""
    (line,) = DOC_LINES
    config = skip_config(tmp_path, "rollout_tq", {"steps": [1, 2, 3, 7], "action": "repeat", "dump_dir": "/ckpt/rollouts"})
    assert line.text == f"stepjournal verl-config {config.name}"
    done = run_line(line.text, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == shown_under(line)


def test_a_config_with_no_skip_form_says_there_is_nothing_to_move(tmp_path):
    config = tmp_path / "plain.yaml"
    OmegaConf.save(OmegaConf.load(VERL_CONFIG), config)
    done = run_line(f"stepjournal verl-config {config}", tmp_path)
    assert done.returncode == 1
    assert "enables no rollout-skip form" in done.stderr and "+stepjournal=verl" in done.stderr


@pytest.mark.parametrize("shell", ["bash", "zsh"])
@pytest.mark.parametrize("value", ["cache@1-5;repeat", "nearest@1-3,7;passthrough", "/a b/c", "it's", "$HOME",
                                   "${oc.env:HOME}", "back\\slash", "it\\'s", "end\\", "true", "12", "~/x", "a!b", 'say "hi"',
                                   "1e3", "1_000", "-5.", "infinity", "a\nb", "tab\there", "sn☃w", "`id`$(id)", "a;b&c|d>e<f",
                                   "*?[x]", "{a,b}", "#x", " lead", "%^=x"])
def test_a_printed_value_reaches_hydra_unchanged_through_the_shell(value, shell, tmp_path):
    """As pasted into bash or zsh; `1e3` is a word Hydra reads as the float 1000.0 unless quoted."""
    from stepjournal.adapters.cli._verl_config import override_line  # private: a CLI helper under test

    line = "python " + override_line([("+stepjournal", "verl"), ("stepjournal.policy", value)])
    argv = shell_argv(tmp_path, line, shell=shell)
    assert compose("verl.trainer.main_ppo", argv).stepjournal.policy == value


def test_a_config_that_is_not_a_regular_file_is_refused_not_read(tmp_path):
    """A FIFO (or /dev/zero) would be read until a writer closes it: verl-config would hang."""
    os.mkfifo(tmp_path / "pipe.yaml")
    os.symlink(tmp_path / "pipe.yaml", tmp_path / "link.yaml")
    (tmp_path / "folder.yaml").mkdir()
    for name in ("pipe.yaml", "link.yaml", "folder.yaml"):
        done = run_line(f"stepjournal verl-config {name}", tmp_path, timeout=120)  # a hang detector only
        assert done.returncode == 1
        assert done.stderr.startswith(f"stepjournal: error: '{name}' ") and len(done.stderr.splitlines()) == 1


@pytest.mark.parametrize("dump_dir,reason", [
    ("${oc.env:STEPJOURNAL_TEST_UNSET}", "Environment variable 'STEPJOURNAL_TEST_UNSET' not found"),
    ("${hydra:runtime.output_dir}/dumps", "Unsupported interpolation type hydra"),
    ("???", "Missing mandatory value"),  # not a folder named `???`
])
def test_a_value_that_does_not_resolve_outside_hydra_is_one_line_naming_the_key(dump_dir, reason, tmp_path):
    config = skip_config(tmp_path, "rollout", {"steps": [1, 2]})
    cfg = OmegaConf.load(config)
    cfg.skip.rollout.dump_dir = dump_dir  # set, not merged: a merge keeps the old value under `???`
    OmegaConf.save(cfg, config)
    done = run_line(f"stepjournal verl-config {config}", tmp_path, env={"STEPJOURNAL_TEST_UNSET": None})
    assert done.returncode == 1
    assert done.stderr.startswith("stepjournal: error: verl config key 'skip.rollout.dump_dir' cannot be read: ")
    assert reason in done.stderr and len(done.stderr.splitlines()) == 1


def test_a_newline_in_the_run_key_or_path_stays_inside_the_comment(tmp_path):
    """Pasting the whole output into a shell must not run the text after a newline of the header."""
    config = skip_config(tmp_path, "rollout", {"steps": [1], "dump_dir": "/ckpt/a\nb"})
    cfg = OmegaConf.load(config)
    cfg.trainer.experiment_name = "exp\nrm -rf x"
    OmegaConf.save(cfg, config)
    done = run_line(f"stepjournal verl-config {config}", tmp_path)
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert header.startswith("# ") and "'/ckpt/a\\nb/stepjournal'" in header and "'exp\\nrm -rf x_" in header
    assert not any(line.startswith("rm ") for line in done.stdout.splitlines())


# -- the structured section ------------------------------------------------------------------------------


def test_a_misspelled_key_fails_when_verls_hydra_composes_and_names_the_key_meant(tmp_path):
    """A fresh `python -m verl.trainer.main_ppo`: Hydra finds the section through its plugin discovery."""
    done = run_line("python -m verl.trainer.main_ppo +stepjournal=verl stepjournal.polcy=cache", tmp_path,
                    env={"HYDRA_FULL_ERROR": None})
    assert done.returncode == 1
    assert "Could not override 'stepjournal.polcy'" in done.stderr
    assert "stepjournal has no key 'polcy' (did you mean 'policy'?)" in done.stderr


def test_the_section_types_its_keys_and_composes_what_read_verl_config_reads():
    from hydra.errors import ConfigCompositionException

    composed = compose("verl.trainer.main_ppo", ["+stepjournal=verl", "stepjournal.policy='cache@1-5;repeat'",
                                                 "stepjournal.dump_dir=/ckpt/rollouts", "stepjournal.verify_input=true"])
    found = read_verl_config(composed)
    assert (found.form, found.policy, found.path) == ("stepjournal", "cache@1-5;repeat", "/ckpt/rollouts/stepjournal")
    assert found.engine.options.verify_input is True
    with pytest.raises(ConfigCompositionException, match="did you mean 'dump_dir'"):
        compose("verl.trainer.main_ppo", ["+stepjournal=verl", "stepjournal.dumpdir=/x"])
    with pytest.raises(ConfigCompositionException, match=r"\+stepjournal=verl"):  # the section not selected
        compose("verl.trainer.main_ppo", ["stepjournal.policy=cache"])
    with pytest.raises(ConfigCompositionException):  # typed: a bool key takes no word
        compose("verl.trainer.main_ppo", ["+stepjournal=verl", "stepjournal.verify_input=maybe"])


def test_a_misspelled_key_in_a_config_file_fails_when_hydra_composes_it(tmp_path):
    """The section selected in the file's defaults list: its keys are checked as the file merges."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import ConfigCompositionException

    for name, key in (("good", "policy"), ("typo", "polcy")):
        (tmp_path / f"{name}.yaml").write_text(
            f"defaults:\n  - stepjournal: verl\n  - _self_\nstepjournal:\n  {key}: cache\n  dump_dir: /ckpt\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        assert read_verl_config(hydra_compose(config_name="good")).policy == "cache"
        with pytest.raises(ConfigCompositionException, match=r"stepjournal has no key 'polcy' \(did you mean 'policy'\?\)"):
            hydra_compose(config_name="typo")


def test_a_key_added_past_the_check_is_refused_by_the_reader_with_the_key_meant():
    """`+stepjournal.polcy=` adds past Hydra's check (Hydra's own `+`); the reader refuses it before any journal opens."""
    from stepjournal.policies import ConfigError

    composed = compose("verl.trainer.main_ppo", ["+stepjournal=verl", "+stepjournal.polcy=cache"])
    with pytest.raises(ConfigError, match=r"did you mean 'policy' for 'polcy'"):
        read_verl_config(composed)


def test_the_structured_section_declares_exactly_the_keys_the_reader_reads():
    from hydra_plugins.stepjournal_verl import StepJournalSection, keys

    from stepjournal.adapters.verl._config import _NATIVE_KEYS  # private: a verl adapter internal under test

    assert sorted(keys()) == sorted(_NATIVE_KEYS)
    assert StepJournalSection().enable is True


def test_the_section_module_imports_neither_stepjournal_nor_verl():
    """Every Hydra application of the environment imports it: it must stay light."""
    import subprocess

    code = ("import sys, hydra_plugins.stepjournal_verl; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('stepjournal', 'verl', 'torch')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


APP = """\
import hydra


@hydra.main(version_base=None, config_path=".", config_name="cfg")
def main(cfg):
    print(dict(cfg))


main()
"""


@pytest.mark.parametrize("config,override,hydras_own", [
    ("stepjournal:\n  foo: 1\n", "stepjournal.bar=2",
     "Could not override 'stepjournal.bar'.\nTo append to your config use +stepjournal.bar=2\n"
     "Key 'bar' is not in struct\n    full_key: stepjournal.bar\n    object_type=dict\n"),
    ("other: 1\n", "stepjournal.x=1",
     "Could not override 'stepjournal.x'.\nTo append to your config use +stepjournal.x=1\n"
     "Key 'stepjournal' is not in struct\n    full_key: stepjournal\n    object_type=dict\n"),
])
def test_another_hydra_app_keeps_hydras_own_message(config, override, hydras_own, tmp_path):
    """The plugin runs in every Hydra application: one with its own `stepjournal` key, or none, gets no verl hint."""
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "cfg.yaml").write_text(config)
    done = run_line(f"python app.py {override}", tmp_path, env={"HYDRA_FULL_ERROR": None})
    assert done.returncode == 1
    assert done.stderr == hydras_own + "\nSet the environment variable HYDRA_FULL_ERROR=1 for a complete stack trace.\n"


def test_another_hydras_private_layout_keeps_the_section_registered_and_checked():
    """Only the did-you-mean rests on Hydra 1.3's private composition steps; `+stepjournal=verl` is public ConfigStore."""
    import subprocess

    code = """
import sys, types
sys.path.insert(0, sys.argv[1])
import hydra._internal.config_loader_impl as real
sys.modules["hydra._internal.config_loader_impl"] = types.ModuleType("moved")  # a Hydra that moved it
import hydra_plugins.stepjournal_verl
sys.modules["hydra._internal.config_loader_impl"] = real
assert not getattr(real.ConfigLoaderImpl._apply_overrides_to_config, "stepjournal_suggests", False)
from hydra.errors import ConfigCompositionException
from verl_support import compose
print(compose("verl.trainer.main_ppo", ["+stepjournal=verl", "stepjournal.policy=cache"]).stepjournal.policy)
try:
    compose("verl.trainer.main_ppo", ["+stepjournal=verl", "stepjournal.polcy=cache"])
except ConfigCompositionException as exc:
    print("refused", "StepJournalSection" in str(exc.__cause__))
"""
    done = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parents[1])], capture_output=True,
                          text=True, timeout=600)  # a hang detector only
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-3:] == ["cache", "refused", "True"]
