"""The journal's key layout, in one place: event sequence numbers and the generation-index keys.

- ``events``: the sequence number, u64 big-endian (so LMDB's byte order is log order).
- ``gen``: ``run \\0 mode \\0 stage \\0 step(u64 BE) gen_index(u32 BE)`` (layout 2): for one
  (run, mode, stage) the keys sort by step, then by generation index, which is what nearest-step
  lookups walk. Layout 1 (no stages) has ``run \\0 mode \\0 step gen_index``; a
  writable open rebuilds such an index in the new layout (`META_LAYOUT` says which one is on disk).
- ``sessions``: the session id, UTF-8 (`session_key`); the value is a `seq_key`.
- ``steps``: ``run \\0 mode \\0 stage \\0 ordinal(u64 BE)`` (`rank_key`) -> step (u64 BE): the
  distinct recorded steps of one (run, mode, stage) in ascending order, numbered from 0, so the n-th
  step is one read.
- ``runs``: see `_runs_index` (``g`` run/stage/mode rows, ``s`` run sessions).
- ``rows``: the seq (`seq_key`) -> the audit row's text; see `_rows_index`.
- ``meta``: `META_FORMAT`, `META_READ_FORMAT`, `META_WRITTEN_BY`, `META_CREATED`, `META_SESSIONS_INDEX`,
  `META_STEPS_INDEX`, `META_RUNS_INDEX`, `META_ROWS_INDEX`, `META_LAYOUT`.

LMDB keys are at most 511 bytes, so run, mode and stage are checked on their encoded length, with
the separators and the 12 bytes of step and index counted in.
"""

from __future__ import annotations

import struct
from typing import NamedTuple, Optional

from ..base._errors import InvalidKeyError

__all__ = [
    "MAX_STEP",
    "MAX_GEN_INDEX",
    "MAX_KEY_BYTES",
    "GenKey",
    "seq_key",
    "seq_of",
    "session_key",
    "META_FORMAT",
    "META_READ_FORMAT",
    "META_WRITTEN_BY",
    "META_CREATED",
    "META_SESSIONS_INDEX",
    "META_STEPS_INDEX",
    "META_RUNS_INDEX",
    "META_ROWS_INDEX",
    "META_LAYOUT",
    "LAYOUT_VERSION",
    "DEFAULT_STAGE",
    "DEFAULT_MODE",
    "check_stage",
    "rank_key",
    "prefix_end",
    "gen_prefix",
    "gen_key",
    "gen_key_at",
    "parse_gen_key",
    "check_key",
    "check_step",
]

MAX_STEP = (1 << 63) - 1
MAX_GEN_INDEX = (1 << 32) - 1
# LMDB's compile-time key limit (mdb_env_get_maxkeysize) of the builds py-lmdb ships.
MAX_KEY_BYTES = 511
_STEP_AND_INDEX = 12
# ``meta`` keys: the format version, the creation time, and "the sessions index is built".
META_FORMAT = b"format"
# The oldest format whose libraries read the journal rightly (absent: the format itself), and the
# stepjournal version that last opened it for writing (see `storage._format`).
META_READ_FORMAT = b"read_format"
META_WRITTEN_BY = b"written_by"
META_CREATED = b"created"
META_SESSIONS_INDEX = b"sessions_index"
META_STEPS_INDEX = b"steps_index"
# The seq of the last event the ``runs`` index folded in (absent: no runs index, `_runs_index`).
META_RUNS_INDEX = b"runs_index"
# The audit schema of the ``rows`` projection and the seq of the last event it folded in (`_rows_index`).
META_ROWS_INDEX = b"rows_index"
# The layout of the ``gen`` and ``steps`` keys on disk: absent means 1 (no stage in the key).
META_LAYOUT = b"layout"
LAYOUT_VERSION = 2
# The stage of a call that names none, and of every call a v1 event holds.
DEFAULT_STAGE = "generate"
# The mode of a call nobody named another for (the training steps; ``"validate"`` ... are the others).
DEFAULT_MODE = "train"


class GenKey(NamedTuple):
    """A parsed generation-index key."""

    run: str
    mode: str
    step: int
    gen_index: int
    stage: str = DEFAULT_STAGE


def seq_key(seq: int) -> bytes:
    """The ``events`` key of sequence number `seq`."""
    return seq.to_bytes(8, "big")


def seq_of(key: bytes) -> int:
    """The sequence number an ``events`` key (or a stored index value) names."""
    return int.from_bytes(key, "big")


def session_key(session: str) -> bytes:
    """The ``sessions`` index key of a session id."""
    return session.encode()


def gen_prefix(run: str, mode: str, stage: str = DEFAULT_STAGE, *, layout: int = LAYOUT_VERSION) -> bytes:
    """The prefix every index key of (run, mode, stage) starts with.

    `layout` 1 (an index without stages, read as it is by a read-only journal) has no stage: only the
    ``"generate"`` stage exists there.
    """
    if layout == 1:
        return run.encode() + b"\x00" + mode.encode() + b"\x00"
    return run.encode() + b"\x00" + mode.encode() + b"\x00" + stage.encode() + b"\x00"


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key that starts with `prefix` (a `gen_prefix`, which ends in NUL)."""
    return prefix[:-1] + b"\x01"


def rank_key(prefix: bytes, ordinal: int) -> bytes:
    """The ``steps`` key of the `ordinal`-th distinct recorded step under `prefix` (a `gen_prefix`)."""
    return prefix + ordinal.to_bytes(8, "big")


def gen_key(run: str, mode: str, step: int, gen_index: int, stage: str = DEFAULT_STAGE, *,
            layout: int = LAYOUT_VERSION) -> bytes:
    """The ``gen`` index key of one call (`layout` as for `gen_prefix`)."""
    return gen_key_at(gen_prefix(run, mode, stage, layout=layout), step, gen_index)


_STEP_INDEX = struct.Struct(">QI")  # the step in 8 bytes and the call's index in 4


def gen_key_at(prefix: bytes, step: int, gen_index: int, _pack=_STEP_INDEX.pack) -> bytes:
    """`gen_key` under a `gen_prefix` already made (a writer of many keys makes each prefix once): the
    step in 8 bytes and the call's index in 4, big-endian, so keys sort as (step, index)."""
    return prefix + _pack(step, gen_index)


def parse_gen_key(key: bytes) -> Optional[GenKey]:
    """The fields of an index key, or None when `key` is not one this version writes."""
    key = bytes(key)
    tail = key[-_STEP_AND_INDEX:]
    parts = key[:-_STEP_AND_INDEX].split(b"\x00")
    if len(key) <= _STEP_AND_INDEX or len(parts) != 4 or parts[3] != b"":
        return None
    try:
        run, mode, stage = parts[0].decode(), parts[1].decode(), parts[2].decode()
    except UnicodeDecodeError:
        return None
    return GenKey(run, mode, int.from_bytes(tail[:8], "big"), int.from_bytes(tail[8:], "big"), stage)


def check_stage(stage: str) -> None:
    """Refuse a stage name that cannot be part of an index key (empty, NUL, not UTF-8, not a str)."""
    check_key("default", DEFAULT_MODE, stage)


# (run, mode, stage) triples that passed `check_key`: every event decoded checks its key, and a journal
# holds few distinct ones. Only exact `str` triples are kept (nothing else equals them); bounded.
_GOOD_KEYS: set = set()
_GOOD_KEYS_MAX = 4096


def check_key(run: str, mode: str, stage: str = DEFAULT_STAGE) -> None:
    """Refuse a run key, mode or stage that cannot be part of an index key, naming the limit."""
    if type(run) is str and type(mode) is str and type(stage) is str:
        if (run, mode, stage) in _GOOD_KEYS:
            return
        _check_key(run, mode, stage)
        if len(_GOOD_KEYS) < _GOOD_KEYS_MAX:
            _GOOD_KEYS.add((run, mode, stage))
        return
    _check_key(run, mode, stage)


def _check_key(run: str, mode: str, stage: str) -> None:
    for label, value in (("run key", run), ("mode", mode), ("stage", stage)):
        if not isinstance(value, str) or not value or "\x00" in value:
            raise InvalidKeyError(f"{label} {value!r} is not valid: use a non-empty string without NUL")
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidKeyError(
                f"{label} {value!r} is not valid: it holds a lone surrogate, not UTF-8 text") from None
    size = len(gen_prefix(run, mode, stage)) + _STEP_AND_INDEX
    if size > MAX_KEY_BYTES:
        stage_bytes = len(stage.encode())
        used = size - _STEP_AND_INDEX - 3 - stage_bytes
        if stage_bytes > MAX_KEY_BYTES - _STEP_AND_INDEX - 3 - 2:  # no room left for a one-byte run key and mode
            raise InvalidKeyError(
                f"stage {stage[:40]!r} takes {stage_bytes} bytes encoded as UTF-8; it may take at most "
                f"{MAX_KEY_BYTES - _STEP_AND_INDEX - 3 - 2} with a run key and a mode of one byte each (LMDB keys are "
                f"at most {MAX_KEY_BYTES} bytes): use a shorter stage")
        raise InvalidKeyError(
            f"run key and mode take {used} bytes encoded as UTF-8; together they may take at most "
            f"{MAX_KEY_BYTES - _STEP_AND_INDEX - 3 - stage_bytes} with stage {stage[:40]!r} (LMDB keys are at "
            f"most {MAX_KEY_BYTES} bytes): use a shorter run key or mode (run={run[:40]!r}…, mode {mode[:40]!r}…)"
        )


def check_step(step: int, gen_index: int = 0) -> None:
    """Refuse a step or generation index outside the key's fixed-width fields."""
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= MAX_STEP:
        raise InvalidKeyError(f"step {step!r} is not valid: use an int from 0 to 2**63-1")
    if not isinstance(gen_index, int) or isinstance(gen_index, bool) or not 0 <= gen_index <= MAX_GEN_INDEX:
        raise InvalidKeyError(f"gen_index {gen_index!r} is not valid: use an int from 0 to 2**32-1")
