"""stepjournal for verl: journal ``generate_sequences``, read verl's skip configs, import its dumps.

Importing this module registers the ``verl.DataProto`` and ``verl.TQBatch`` payload codecs, so
journals holding them can be written and read. A process that never imports it loads them on first
sight all the same: `register_dataproto_codec` and `register_tq_codec` are codec plugins (pyproject's
``stepjournal.codecs`` and ``stepjournal.codec_names`` entry points).

Three ways in (docs/verl.md shows each):

- ``attach(trainer)`` before ``trainer.fit`` (steps from ``trainer.global_steps``): verl's V1
  ``PPOTrainer`` (its default) or the legacy ``RayPPOTrainer``;
- no code: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=
  stepjournal.adapters.verl.JournaledAgentLoopManager`` plus a ``stepjournal`` section or an existing
  verl skip section;
- fully-async rollouter: `install_fully_async` (as Ray's ``worker_process_setup_hook``).

Needs the ``verl`` extra, except `read_verl_config` (and the config and error types),
which are plain Python: without verl they import, and the other names raise `ImportError` naming
the extra.

The package has the inner shape of every adapter (docs/adapters.md): ``_config`` (verl's config
forms), ``_codec`` (the DataProto codec), ``_hooks`` (the wrapped ``generate_sequences``),
``_attach`` (the ways to install it), ``_import`` (verl's dumps into a journal), ``_errors``, with
``_nodes`` (reading dict / OmegaConf / dataclass configs) and ``_fingerprint`` under ``_config``; the V1
(TransferQueue) trainer has the same shape in ``v1/``: ``v1._codec`` (its batches), ``v1._hooks`` (submit
and sample), ``v1._stages`` (reward, log-probs, values and metrics) and ``v1._import`` (its ``tq_batch.pt`` dumps).
"""

from __future__ import annotations

from typing import Any

from ._config import VerlJournalConfig, read_verl_config, verl_fingerprint, verl_run_key
from ._fingerprint import TOKENIZER_KEYS
from ._errors import (
    MissingInputError, NoOutcomeError, PickleRefusedError, RecordedToolError, VerlAdapterError, VerlDumpError,
    VerlStepError,
)

# verl and the modules its import needs (the `verl` extra).
_VERL_MODULES = frozenset({"verl", "tensordict", "ray", "cachetools", "fastapi", "uvicorn"})
# Reading verl configs is plain Python; everything else works on verl's objects. Without verl the
# config part still imports, and the rest fails on use with the install hint.
_MISSING_VERL: Any = None
try:
    from ._attach import (
        attach,
        install_fully_async,
        make_journaled_agent_loop_manager,
        rollout_from_config,
        wrap_generate_sequences,
    )
    from ._codec import CODEC_NAME, dataproto_diff, decode_dataproto, encode_dataproto, register_dataproto_codec
    from ._calls import feed_index_step, meta_step, validate_mode
    from ._hooks import JournaledRollout, align_batch
    from ._tool_loop import ToolCallPlace, current_tool_call_place, make_journaled_tool_agent_loop, tool_engine_for
    from ._import import ImportedRecord, ImportReport, SkippedDump, VerlDump, find_verl_dumps, import_verl_dumps
    from .v1._codec import TQ_CODEC_NAME, TQBatch, decode_tq_batch, encode_tq_batch, register_tq_codec, tq_batch_diff
    from .v1._hooks import V1_TRAINER_MODES, V1Journal, attach_v1, is_v1_trainer, remap_tq_batch, v1_trainer_mode
    from .v1._stages import VERL_STAGES, V1Stages
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.split(".")[0] not in _VERL_MODULES:
        raise
    _MISSING_VERL = exc

__all__ = [
    "attach",
    "JournaledRollout",
    "JournaledAgentLoopManager",
    "JournaledToolAgentLoop",
    "make_journaled_tool_agent_loop",
    "tool_engine_for",
    "ToolCallPlace",
    "current_tool_call_place",
    "install_fully_async",
    "wrap_generate_sequences",
    "rollout_from_config",
    "align_batch",
    "read_verl_config",
    "VerlJournalConfig",
    "verl_run_key",
    "verl_fingerprint",
    "TOKENIZER_KEYS",
    "import_verl_dumps",
    "find_verl_dumps",
    "ImportReport",
    "ImportedRecord",
    "SkippedDump",
    "VerlDump",
    "dataproto_diff",
    "encode_dataproto",
    "decode_dataproto",
    "CODEC_NAME",
    "register_dataproto_codec",
    "register_tq_codec",
    "meta_step",
    "feed_index_step",
    "validate_mode",
    "VerlAdapterError",
    "VerlStepError",
    "MissingInputError",
    "NoOutcomeError",
    "PickleRefusedError",
    "RecordedToolError",
    "VerlDumpError",
    "V1Journal",
    "attach_v1",
    "is_v1_trainer",
    "v1_trainer_mode",
    "V1_TRAINER_MODES",
    "remap_tq_batch",
    "TQBatch",
    "TQ_CODEC_NAME",
    "encode_tq_batch",
    "decode_tq_batch",
    "tq_batch_diff",
    "VERL_STAGES",
    "V1Stages",
]

if _MISSING_VERL is None:
    register_dataproto_codec()
    register_tq_codec()


from .._extras import missing_extra  # noqa: E402


def __getattr__(name: str) -> Any:
    if name in __all__ and _MISSING_VERL is not None:
        raise missing_extra(
            __name__, name, _MISSING_VERL, "verl", "verl", "; read_verl_config and the errors work without it"
        )
    # Built on first use: importing verl's agent loop pulls in its serving stack, which plain
    # journaling and dump import do not need.
    if name == "JournaledAgentLoopManager":
        return make_journaled_agent_loop_manager()
    if name == "JournaledToolAgentLoop":
        return make_journaled_tool_agent_loop()
    raise AttributeError(f"module 'stepjournal.adapters.verl' has no attribute {name!r}")
