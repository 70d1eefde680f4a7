"""``stepjournal verl-config CONFIG.yaml``: a verl config's rollout skip, moved to stepjournal in one line.

It reads the config with `read_verl_config` (any skip form: ``skip.*``, ``rollout.skip*``, a
``stepjournal`` section) and prints the Hydra overrides that journal the same steps with the same
policy, quoted for the shell (a spec holds ``;`` and ``,``, which bash and Hydra each cut), then the
same as YAML to paste into the config. docs/verl.md ("Migration in one line") shows it;
tests/integration/test_verl_config_cli.py feeds the printed line through bash into verl's Hydra.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any, Dict, List, Tuple

from rich.console import Console

from ._render import Failure, print_line

__all__ = ["add_arguments", "run", "hydra_value", "shell_word"]

_MANAGER_KEY = "actor_rollout_ref.rollout.agent.agent_loop_manager_class"
_MANAGER = "stepjournal.adapters.verl.JournaledAgentLoopManager"
_HOOK_KEY = "ray_kwargs.ray_init.runtime_env.worker_process_setup_hook"
_HOOK = "stepjournal.adapters.verl.install_fully_async"
_SECTION = "+stepjournal=verl"  # the structured section Hydra checks (adapters/verl/hydra_plugins/stepjournal_verl)
# Each old form: the key that turns it off, and the key its dump folder was read from.
_OLD_FORMS: Dict[str, Tuple[str, str]] = {
    "rollout_skip_v1": ("actor_rollout_ref.rollout.skip_rollout", "actor_rollout_ref.rollout.skip_dump_dir"),
    "rollout_skip_v2": ("actor_rollout_ref.rollout.skip.enable", "actor_rollout_ref.rollout.skip.dump_dir"),
    "rollout_skip_v2_pre": ("actor_rollout_ref.rollout.skip.enable", "actor_rollout_ref.rollout.skip.dump_dir"),
    **{f"skip_manager.{role}": (f"skip.{role}.enable", f"skip.{role}.dump_dir")
       for role in ("rollout", "async_rollout", "rollout_tq")},
}
_HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./-]*[A-Za-z_][A-Za-z0-9_./-]*")  # no quoting needed in an override
_HYDRA_WORDS = {"true", "false", "null", "nan", "inf"}
_SHELL_PLAIN = re.compile(r"[A-Za-z0-9_./=+@:,%-]+")
_SHELL_DOUBLE_BREAKS = set('"$`\\!')


def hydra_value(value: str) -> str:
    """`value` as a Hydra override value that stays this string: as is when Hydra reads it so, else quoted
    (``'cache@1-5;repeat'``: Hydra's grammar stops at ``;`` and reads ``,`` as a sweep)."""
    if _HYDRA_PLAIN.fullmatch(value) and value.lower() not in _HYDRA_WORDS and not _number(value):
        return value
    # Inside quotes Hydra reads a backslash as one unless it stands before a quote or at the end.
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'").replace("${", "\\${")
    return f"'{escaped}'"


def _number(value: str) -> bool:
    """Whether Hydra could read `value` as a number (``1e3`` is the float 1000.0); Python's float reads a
    superset of Hydra's numbers (``1_000``, ``infinity``), so such a value is quoted."""
    try:
        float(value)
    except ValueError:
        return False
    return True


def shell_word(word: str) -> str:
    """`word` quoted so that bash and zsh hand it over unchanged (double quotes, as docs/verl.md writes them)."""
    if _SHELL_PLAIN.fullmatch(word):
        return word
    if not _SHELL_DOUBLE_BREAKS & set(word):
        return f'"{word}"'
    return "'" + word.replace("'", "'\"'\"'") + "'"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal verl-config``."""
    p.description = ("Read a verl config (YAML) with any rollout-skip form and print the Hydra overrides that "
                     "journal the same steps with stepjournal, quoted for the shell, then the same as YAML. "
                     "Reads and writes no journal.")
    p.add_argument("config", metavar="CONFIG", help="the verl config: your trainer YAML, or a run's .hydra/config.yaml")


def _load(path: str) -> Any:
    import stat

    from omegaconf import OmegaConf

    try:
        # A FIFO or a device would be read until a writer closes it (forever, for /dev/zero): a config is a file.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise Failure(f"{path!r} is not a regular file: give the verl config's YAML file")
        return OmegaConf.load(path)
    except Failure:
        raise
    except Exception as exc:  # a missing file or YAML that does not parse: say which
        raise Failure(f"{path!r} cannot be read as a verl config: {exc}") from None


def _has(cfg: Any, dotted: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, dotted, default=_Absent) is not _Absent


class _Absent:
    """A key the config does not hold."""


def _dump_dir(cfg: Any, key: str) -> Any:
    """The dump folder as the config spells it (``~`` kept); None when unset (the section's default is verl's)."""
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, key, default=None)
    return value if isinstance(value, str) and value.strip() else None


def migration(cfg: Any) -> Tuple[Any, List[Tuple[str, Any]], Dict[str, Any]]:
    """What moving `cfg` to stepjournal takes: (what `read_verl_config` read, the overrides as (key, value),
    the YAML as a mapping).

    Raises:
        Failure: the config enables no skip form, or is already on stepjournal's structured section.
    """
    from stepjournal.adapters.verl import read_verl_config

    found = read_verl_config(cfg)
    if found is None:
        raise Failure("the config enables no rollout-skip form (skip.*.enable, actor_rollout_ref.rollout.skip*): "
                      "nothing to move; to start journaling add +stepjournal=verl stepjournal.policy=cache "
                      "stepjournal.dump_dir=DIR (docs/verl.md)")
    overrides: List[Tuple[str, Any]] = []
    feed_index = found.step_source == "feed_index"
    hook, hook_value = (_HOOK_KEY, _HOOK) if feed_index else (_MANAGER_KEY, _MANAGER)
    overrides.append(((hook if _has(cfg, hook) else f"+{hook}"), hook_value))
    yaml: Dict[str, Any] = {}
    if found.form == "stepjournal":
        # The file's own section stays as it is: `+stepjournal=verl` on the command line would be merged
        # after the file and reset its keys (the file lists `- stepjournal: verl` to have them checked).
        return found, overrides, yaml
    off, dump_key = _OLD_FORMS[found.form]
    overrides.append((_SECTION, None))
    overrides.append(("stepjournal.policy", found.policy))
    dump_dir = _dump_dir(cfg, dump_key)
    if dump_dir is not None:
        overrides.append(("stepjournal.dump_dir", dump_dir))
    overrides.append((off, False))
    node: Dict[str, Any] = yaml
    *parents, last = off.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = False
    yaml["stepjournal"] = {"policy": found.policy, **({"dump_dir": dump_dir} if dump_dir is not None else {})}
    return found, overrides, yaml


def override_line(overrides: List[Tuple[str, Any]]) -> str:
    """The overrides as one line to paste, each word quoted for the shell."""
    words = []
    for key, value in overrides:
        if value is None:
            words.append(shell_word(key))
        elif isinstance(value, bool):
            words.append(shell_word(f"{key}={str(value).lower()}"))
        else:
            words.append(shell_word(f"{key}={hydra_value(str(value))}"))
    return " ".join(words)


def _yaml_text(mapping: Dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(mapping, sort_keys=False, default_flow_style=False).rstrip("\n")


def _comment(text: str) -> str:
    """`text` for a ``#`` line: a newline in a path or run key would end the comment, and the rest would run
    when the output is pasted into a shell, so a value with an unprintable character is shown as Python writes it."""
    return text if text.isprintable() else repr(text)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Print the overrides and the YAML that move CONFIG's rollout skip to stepjournal."""
    cfg = _load(args.config)
    found, overrides, yaml = migration(cfg)

    def say(text: str) -> None:
        print_line(out, text, markup=False, emoji=False)

    say(f"# {_comment(args.config)}: {found.form} -> stepjournal policy {found.policy}, "
        f"journal {_comment(found.path)}, run {_comment(found.run)}")
    say("# add these overrides to the verl command line (quoted for the shell; +stepjournal=verl checks the keys):")
    say(override_line(overrides))
    if found.form == "stepjournal":
        say("# the config's stepjournal section stays; for checked keys list `- stepjournal: verl` before `_self_` "
            "in its defaults list")
    if yaml:
        say("")
        say("# or put this in the YAML (and `- stepjournal: verl` before `_self_` in its defaults list, "
            "for checked keys):")
        say(_yaml_text(yaml))
    return 0

