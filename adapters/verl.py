"""stepjournal for verl: journal ``generate_sequences``, read verl's skip configs, import its dumps.

Importing this module registers the ``verl.DataProto`` payload codec, so journals holding DataProtos
can be written and read. A process that reads such a journal without importing it gets
`stepjournal.UnknownCodecError`: ``import stepjournal.adapters.verl`` first.

Three ways in (docs/verl.md shows each):

- ``attach(trainer)`` after ``trainer.init_workers()`` (steps from ``trainer.global_steps``);
- no code: ``actor_rollout_ref.rollout.agent.agent_loop_manager_class=
  stepjournal.adapters.verl.JournaledAgentLoopManager`` plus a ``stepjournal`` section or an existing
  verl skip section;
- fully-async rollouter: `install_fully_async` (as Ray's ``worker_process_setup_hook``).

Needs the ``stepjournal[verl]`` extra.
"""

from __future__ import annotations

from typing import Any

from ._verl_codec import CODEC_NAME, dataproto_diff, decode_dataproto, encode_dataproto, register_dataproto_codec
from ._verl_config import VerlJournalConfig, read_verl_config, verl_fingerprint, verl_run_key
from ._verl_errors import MissingInputError, PickleRefusedError, VerlAdapterError, VerlDumpError, VerlStepError
from ._verl_import import ImportedRecord, ImportReport, SkippedDump, VerlDump, find_verl_dumps, import_verl_dumps
from ._verl_v1 import V1_TRAINER_MODES, V1Journal, attach_v1, is_v1_trainer, remap_tq_batch, v1_trainer_mode
from ._verl_v1_codec import TQ_CODEC_NAME, TQBatch, decode_tq_batch, encode_tq_batch, register_tq_codec, tq_batch_diff
from ._verl_rollout import (
    JournaledRollout,
    align_batch,
    attach,
    feed_index_step,
    install_fully_async,
    make_journaled_agent_loop_manager,
    meta_step,
    rollout_from_config,
    validate_mode,
    wrap_generate_sequences,
)

__all__ = [
    "attach",
    "JournaledRollout",
    "JournaledAgentLoopManager",
    "install_fully_async",
    "wrap_generate_sequences",
    "rollout_from_config",
    "align_batch",
    "read_verl_config",
    "VerlJournalConfig",
    "verl_run_key",
    "verl_fingerprint",
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
    "meta_step",
    "feed_index_step",
    "validate_mode",
    "VerlAdapterError",
    "VerlStepError",
    "MissingInputError",
    "PickleRefusedError",
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
]

register_dataproto_codec()
register_tq_codec()


def __getattr__(name: str) -> Any:
    # Built on first use: importing verl's agent loop pulls in its serving stack, which plain
    # journaling and dump import do not need.
    if name == "JournaledAgentLoopManager":
        return make_journaled_agent_loop_manager()
    raise AttributeError(f"module 'stepjournal.adapters.verl' has no attribute {name!r}")
