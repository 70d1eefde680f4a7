"""Read the dumps of verl's V1 skip (``RolloutTqSkip``, ``skip.rollout_tq``) for `import_verl_dumps`.

Layout: ``{run}/GBS{g}_N{n}_in{p}_out{r}/{step}/{inner}/tq_batch.pt`` + ``meta.json`` (written last),
one ``inner`` folder per mini-batch a step sampled (``parameter_sync_step > 1`` makes several). A
``tq_batch.pt`` is ``torch.save({"tensordict", "tags", "keys", "global_steps"})``: a pickle, read
only when the caller trusts it (``trust_pickle=True``).
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable

from .._errors import VerlDumpError
from ._codec import TQBatch

__all__ = ["V1_DUMP_FILE", "is_v1_dump_folder", "load_tq_dump"]

V1_DUMP_FILE = "tq_batch.pt"


def is_v1_dump_folder(parent: str, name: str) -> bool:
    """``parent/name`` is ``{step}/{inner}`` holding a ``tq_batch.pt``."""
    return (
        name.isdigit()
        and os.path.basename(parent).isdigit()
        and os.path.isfile(os.path.join(parent, name, V1_DUMP_FILE))
    )


def load_tq_dump(folder: str, *, open_file: Callable[[str], Any] = functools.partial(open, mode="rb")) -> TQBatch:
    """The `TQBatch` a ``tq_batch.pt`` holds (unpickles it: call only for trusted dumps).

    `open_file` opens the dump for reading; the importer passes one that refuses a file whose links
    lead out of the dump folder, so trusting a folder's pickles never extends beyond it.
    """
    import torch
    from tensordict import TensorDictBase

    path = os.path.join(folder, V1_DUMP_FILE)
    with open_file(path) as fh:
        payload: Any = torch.load(fh, weights_only=False)  # pickle-ok: verl's V1 dumps, only with trust_pickle=True
    if not isinstance(payload, dict) or not {"tensordict", "tags", "keys"} <= set(payload):
        raise VerlDumpError(f"{path} is not a RolloutTqSkip dump (a dict with tensordict, tags and keys)")
    fields, keys, tags = payload["tensordict"], payload["keys"], payload["tags"]
    if not isinstance(fields, TensorDictBase) or len(keys) != len(tags) or len(keys) != fields.batch_size[0]:
        raise VerlDumpError(f"{path}: {len(keys)} keys, {len(tags)} tags and the fields' rows do not line up")
    return TQBatch(fields=fields, keys=[str(k) for k in keys], tags=[dict(t) for t in tags], partition_id="train")
