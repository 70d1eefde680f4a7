"""The run key and the fingerprint of a verl config, and what a verl dump folder's name spells of them."""

from __future__ import annotations

import re
from typing import Any, Dict, Mapping, Optional, Tuple

from .._tokenizer_keys import VERL_TOKENIZER_KEYS
from ._nodes import select

__all__ = [
    "GENERATION_KEYS",
    "verl_run_key",
    "verl_fingerprint",
    "config_fingerprint_extras",
    "fingerprint_from_dump_folder",
    "v1_file_identity",
]


def _scalar(value: Any) -> Any:
    """A fingerprint value as both a config and a dump folder name spell it (int, str or None)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value)
    if re.fullmatch(r"-?[0-9]+", text):
        return int(text)
    return None if text == "None" else text


def verl_run_key(cfg: Any) -> str:
    """``{trainer.experiment_name}_{trainer.project_name}``: the folder verl names its dumps after."""
    experiment = select(cfg, "trainer.experiment_name", None)
    project = select(cfg, "trainer.project_name", None)
    if experiment is None:
        experiment = "default_experiment_name"
    if project is None:
        project = "default_project_name"
    return f"{experiment}_{project}"


# What else changes what generation produces: fingerprint key -> config key. A key enters the
# fingerprint only when the config sets it (not None), so configs and imported dumps that do not
# name it still match each other.
GENERATION_KEYS = {
    "verl.model_path": "actor_rollout_ref.model.path",
    "verl.tokenizer_path": "actor_rollout_ref.model.tokenizer_path",
    "verl.chat_template": "actor_rollout_ref.model.custom_chat_template",
    "verl.temperature": "actor_rollout_ref.rollout.temperature",
    "verl.top_p": "actor_rollout_ref.rollout.top_p",
    "verl.top_k": "actor_rollout_ref.rollout.top_k",
    "verl.do_sample": "actor_rollout_ref.rollout.do_sample",
    "verl.train_files": "data.train_files",
}


# Where verl loads a run's tokenizer from: the first of these a recording's fingerprint holds (the CLI reads them
# from `stepjournal.adapters._tokenizer_keys`, without importing verl); each is a key of `GENERATION_KEYS` above.
TOKENIZER_KEYS = VERL_TOKENIZER_KEYS


def verl_fingerprint(cfg: Any) -> Dict[str, Any]:
    """What a recorded generation must match (docs/verl.md lists each key).

    Always: generation batch size (``data.gen_batch_size``, else ``data.train_batch_size``, as verl's
    dumps use), ``rollout.n``, prompt and response lengths. When the config sets them: model and
    tokenizer paths, custom chat template, temperature, top_p, top_k, do_sample and the train files
    (`GENERATION_KEYS`).
    """
    gbs = select(cfg, "data.gen_batch_size", None)
    if gbs is None:
        gbs = select(cfg, "data.train_batch_size", 0)
    found = {
        "verl.gen_batch_size": _scalar(gbs),
        "verl.rollout_n": _scalar(select(cfg, "actor_rollout_ref.rollout.n", 0)),
        "verl.max_prompt_length": _scalar(select(cfg, "data.max_prompt_length", 0)),
        "verl.max_response_length": _scalar(select(cfg, "data.max_response_length", 0)),
    }
    for name, key in GENERATION_KEYS.items():
        value = select(cfg, key, None)
        if isinstance(value, (list, tuple)):
            value = ",".join(str(v) for v in value)
        if isinstance(value, float) and not value.is_integer():
            found[name] = value
        elif value is not None:
            found[name] = _scalar(value)
    return found


def config_fingerprint_extras(cfg: Any) -> Dict[str, Any]:
    """The fingerprint values a dump folder's name cannot spell, read from the verl config that made the dumps.

    The `GENERATION_KEYS` the config sets, then its ``stepjournal.fingerprint`` extras, less its
    ``stepjournal.fingerprint_ignore`` keys: what `import_verl_dumps` adds to each imported record
    when given ``config=``.
    """
    found = {k: v for k, v in verl_fingerprint(cfg).items() if k in GENERATION_KEYS}
    extras = select(cfg, "stepjournal.fingerprint", None) or {}
    if isinstance(extras, Mapping):
        found.update(extras)
    for key in select(cfg, "stepjournal.fingerprint_ignore", None) or []:
        found.pop(key, None)
    return found


_DUMP_FOLDER = re.compile(r"^GBS(?P<gbs>[^_]+)_N(?P<n>[^_]+)_in(?P<prompt>[^_]+)_out(?P<response>.+)$")
_V1_FILE = re.compile(r"^(?P<run>.+)_GBS(?P<gbs>[^_]+)__N(?P<n>.+)$")


def fingerprint_from_dump_folder(name: str) -> Optional[Dict[str, Any]]:
    """The fingerprint that a verl dump folder name ``GBS{gbs}_N{n}_in{prompt}_out{response}`` spells, or None."""
    match = _DUMP_FOLDER.match(name)
    if match is None:
        return None
    return {
        "verl.gen_batch_size": _scalar(match["gbs"]),
        "verl.rollout_n": _scalar(match["n"]),
        "verl.max_prompt_length": _scalar(match["prompt"]),
        "verl.max_response_length": _scalar(match["response"]),
    }


def v1_file_identity(name: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Run key and partial fingerprint of a v1 dump file ``{exp}_{proj}_GBS{gbs}__N{n}``, or None."""
    match = _V1_FILE.match(name)
    if match is None:
        return None
    return match["run"], {"verl.gen_batch_size": _scalar(match["gbs"]), "verl.rollout_n": _scalar(match["n"])}
