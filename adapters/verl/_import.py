"""Import the rollout dumps of verl's RolloutSkip (v1, v2) and SkipManager into a journal.

Layouts read (``run`` is verl's ``{experiment_name}_{project_name}`` folder):

- ``skip_manager``: ``run/GBS{g}_N{n}_in{p}_out{r}/{step}/gen_batch.dp`` + meta.json. Step: the folder
  name; index 0; input: none.
- ``rollout_skip_v2``: ``run/GBS.../genstep_{NNNNNN}/{gen_batch,new_batch}.dp`` + meta.json. Step: meta's
  global_steps; index: the order of the gen steps; input: new_batch.
- ``rollout_skip_v2_pre``: ``run/GBS.../genstep_{NNNNNN}.pkl`` (a dict of compressed pickles). Step:
  NNNNNN; index 0; input: new_batch.
- ``rollout_skip_v1``: ``{run}_GBS{g}__N{n}`` (one pickled DataProto). Step 1; index 0; input: none.
- ``rollout_tq`` (V1): ``run/GBS.../{step}/{inner}/tq_batch.pt`` + meta.json (torch.save). Step: the step
  folder; index: the inner folder; input: none.

Every dump file is a Python pickle: loading one runs whatever code it names. Nothing is read until the
caller passes ``trust_pickle=True``; only the file listing is looked at before that. SkipManager and v2
write meta.json last, so a step folder without it is an interrupted dump and is skipped.
"""

from __future__ import annotations

import errno
import json
import os
import pickle  # pickle-ok: only import_verl_dumps(trust_pickle=True) unpickles, to migrate verl dumps
import re
import stat
import zlib
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

import attrs
import zstandard
from verl.protocol import DataProto

from stepjournal.log import get_logger
from stepjournal import Journal, errors

from ._fingerprint import config_fingerprint_extras, fingerprint_from_dump_folder, v1_file_identity
from ._errors import PickleRefusedError, VerlDumpError
from .v1._codec import TQBatch
from .v1._import import is_v1_dump_folder, load_tq_dump

__all__ = ["import_verl_dumps", "ImportReport", "ImportedRecord", "SkippedDump", "find_verl_dumps", "VerlDump"]

log = get_logger(__name__)

_GENSTEP_DIR = re.compile(r"^genstep_(?P<n>[0-9]+)$")
_GENSTEP_PKL = re.compile(r"^genstep_(?P<n>[0-9]+)\.pkl$")
_STEP_DIR = re.compile(r"^(?P<n>[0-9]+)$")
# The pickle files each dump form holds, as its refusal names them.
_PICKLE_FILES = {
    "rollout_tq": "tq_batch.pt (torch.save)",
    "skip_manager": "gen_batch.dp",
    "rollout_skip_v2": "gen_batch.dp, new_batch.dp",
    "rollout_skip_v2_pre": "genstep_NNNNNN.pkl",
    "rollout_skip_v1": "the v1 dump file",
}


def _pickle_why(dumps: "List[VerlDump]") -> str:
    """Why the dumps found are refused, naming the files they are."""
    files = ", ".join(dict.fromkeys(_PICKLE_FILES.get(d.form, d.form) for d in dumps))
    return (
        f"these dump files ({files}) are Python pickles: loading one runs any code it was made to run, "
        "so a dump folder that someone else could write to can take over this process"
    )


@attrs.frozen
class VerlDump:
    """One dump found on disk (nothing read yet).

    Attributes:
        form: ``rollout_tq`` (V1), ``skip_manager``, ``rollout_skip_v2``, ``rollout_skip_v2_pre`` or
            ``rollout_skip_v1``.
        path: the step folder or dump file.
        run: the run key (verl's ``{experiment}_{project}`` folder).
        fingerprint: what the folder names say (batch size, n, prompt and response lengths).
        order: the step (or v2's gen step) the name says.
    """

    form: str
    path: str
    run: str
    fingerprint: Dict[str, Any]
    order: int


@attrs.frozen
class ImportedRecord:
    """A dump written to the journal."""

    run: str
    step: int
    gen_index: int
    form: str
    source: str
    seq: int
    stored_input: bool


@attrs.frozen
class SkippedDump:
    """A dump that was not imported, and why."""

    source: str
    reason: str


@attrs.frozen
class ImportReport:
    """What `import_verl_dumps` did.

    Attributes:
        journal: the journal folder written to.
        imported: the records written, in order.
        skipped: dumps left out on purpose (interrupted, already in the journal, unsafe link).
        failed: dumps that could not be read or stored.
    """

    journal: str
    imported: Tuple[ImportedRecord, ...] = ()
    skipped: Tuple[SkippedDump, ...] = ()
    failed: Tuple[SkippedDump, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failed

    def to_json(self) -> Dict[str, Any]:
        return {
            "journal": self.journal,
            "imported": [attrs.asdict(r) for r in self.imported],
            "skipped": [attrs.asdict(r) for r in self.skipped],
            "failed": [attrs.asdict(r) for r in self.failed],
        }


def _inside(root: str, path: str) -> bool:
    real = os.path.realpath(path)
    return real == root or real.startswith(root + os.sep)


def find_verl_dumps(dump_dir: Union[str, os.PathLike]) -> Tuple[List[VerlDump], List[SkippedDump]]:
    """List the verl dumps under `dump_dir` by their names alone (no file is opened).

    Returns:
        The dumps found, and the entries left out (links leaving `dump_dir`, unknown run folders).

    Raises:
        VerlDumpError: `dump_dir` is not a folder.
    """
    root = os.path.realpath(os.path.expanduser(os.fspath(dump_dir)))
    if not os.path.isdir(root):
        raise VerlDumpError(f"{dump_dir!r} is not a folder: give the dump_dir of your verl config")
    found: List[VerlDump] = []
    skipped: List[SkippedDump] = []

    def identity(folder: str) -> Optional[Tuple[str, Dict[str, Any]]]:
        fingerprint = fingerprint_from_dump_folder(os.path.basename(folder))
        if fingerprint is None:
            return None
        return os.path.basename(os.path.dirname(folder)), fingerprint

    for here, dirs, files in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(dirs):
            full = os.path.join(here, name)
            if os.path.islink(full):
                if not _inside(root, full):
                    skipped.append(SkippedDump(full, "link leaves the dump folder; not followed"))
                continue
            if is_v1_dump_folder(here, name):
                ident = identity(os.path.dirname(here))
                if ident is None:
                    skipped.append(SkippedDump(full, "grandparent folder is not GBS{g}_N{n}_in{p}_out{r}"))
                else:
                    found.append(VerlDump("rollout_tq", full, ident[0], ident[1], int(os.path.basename(here))))
                continue
            for pattern, form in ((_GENSTEP_DIR, "rollout_skip_v2"), (_STEP_DIR, "skip_manager")):
                match = pattern.match(name)
                if match and os.path.isfile(os.path.join(full, "gen_batch.dp")):
                    if not _inside(root, os.path.join(full, "gen_batch.dp")):
                        continue  # reported with the folder's files below; never read
                    ident = identity(here)
                    if ident is None:
                        skipped.append(SkippedDump(full, "parent folder is not GBS{g}_N{n}_in{p}_out{r}"))
                    else:
                        found.append(VerlDump(form, full, ident[0], ident[1], int(match["n"])))
        for name in sorted(files):
            full = os.path.join(here, name)
            if os.path.islink(full) and not _inside(root, full):
                skipped.append(SkippedDump(full, "link leaves the dump folder; not read"))
                continue
            match = _GENSTEP_PKL.match(name)
            if match:
                ident = identity(here)
                if ident is None:
                    skipped.append(SkippedDump(full, "parent folder is not GBS{g}_N{n}_in{p}_out{r}"))
                else:
                    found.append(VerlDump("rollout_skip_v2_pre", full, ident[0], ident[1], int(match["n"])))
                continue
            v1 = v1_file_identity(name)
            if v1 is not None and "." not in name:
                found.append(VerlDump("rollout_skip_v1", full, v1[0], v1[1], 1))
    found.sort(key=lambda d: (d.run, sorted(d.fingerprint.items(), key=str), d.order, _inner(d), d.path))
    return found, skipped


def _inner(dump: VerlDump) -> int:
    """A V1 dump's mini-batch index (its ``{inner}`` folder); 0 for the other forms."""
    return int(os.path.basename(dump.path)) if dump.form == "rollout_tq" else 0


_LAYOUTS = (
    "{run}/GBS{g}_N{n}_in{p}_out{r}/{step}/{inner}/tq_batch.pt (V1 skip.rollout_tq), "
    "{run}/GBS.../{step}/gen_batch.dp (SkipManager), {run}/GBS.../genstep_NNNNNN/gen_batch.dp (RolloutSkip v2), "
    "{run}/GBS.../genstep_NNNNNN.pkl (v2 pre-release), {exp}_{proj}_GBS{g}__N{n} (RolloutSkip v1)"
)


def _open_inside(root: str, path: str, text: bool = False) -> Any:
    """Open a dump file for reading only when it really lies inside `root` (links resolved).

    Trusting the pickles of a folder never extends to files a link in it points at: the resolved
    path must be under `root`, and it is opened with ``O_NOFOLLOW`` so that a link swapped in after
    the check is refused too. Every file the import reads comes through here.

    Raises:
        VerlDumpError: the file leads out of the dump folder, or is not a plain file.
    """
    real = os.path.realpath(path)
    if not real.startswith(root + os.sep):
        raise VerlDumpError(f"{path} is a link that leaves the dump folder ({real}); not read")
    try:
        # O_NONBLOCK: a FIFO put in place of a dump must not hang the import (no effect on files).
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise VerlDumpError(f"{path} became a link while it was being read; not read") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise VerlDumpError(f"{path} is not a plain file; not read")
    return os.fdopen(fd, "r", encoding="utf-8") if text else os.fdopen(fd, "rb")


def _load_pickle(root: str, path: str) -> Any:
    with _open_inside(root, path) as fh:
        return pickle.load(fh)  # pickle-ok: verl's dumps are pickles; reached only with trust_pickle=True


def _load_dataproto(root: str, path: str) -> DataProto:
    value = _load_pickle(root, path)
    if not isinstance(value, DataProto):
        raise VerlDumpError(f"{path} holds a {type(value).__name__}, not a verl DataProto")
    return value


def _decompress(blob: bytes, name: str) -> bytes:
    if name == "zlib":
        return zlib.decompress(blob)
    if name == "pyzstd":
        return zstandard.ZstdDecompressor().decompressobj().decompress(blob)
    raise VerlDumpError(f"unknown compresser {name!r} in a v2-pre dump")


def _load_v2_pre(root: str, path: str) -> Tuple[DataProto, Optional[DataProto]]:
    data = _load_pickle(root, path)
    if not isinstance(data, dict) or "gen_batch" not in data:
        raise VerlDumpError(f"{path} is not a RolloutSkip dump (a dict with gen_batch and new_batch)")
    for key in data.get("compressed", []) or []:
        raw = _decompress(data[key], data.get("compresser_name", "zlib"))
        data[key] = pickle.loads(raw)  # pickle-ok: the inner pickles of a trusted v2-pre dump
    out, inp = data["gen_batch"], data.get("new_batch")
    if not isinstance(out, DataProto) or (inp is not None and not isinstance(inp, DataProto)):
        raise VerlDumpError(f"{path} does not hold DataProtos under gen_batch/new_batch")
    return out, inp


def _read_meta(root: str, folder: str) -> Optional[Dict[str, Any]]:
    path = os.path.join(folder, "meta.json")
    if not os.path.isfile(path):
        return None
    with _open_inside(root, path, text=True) as fh:
        meta = json.load(fh)
    if not isinstance(meta, dict):
        raise VerlDumpError(f"{path} is not a JSON object")
    return meta


def _lengths_from(output: DataProto) -> Dict[str, Any]:
    """v1 folder names lack the lengths; verl pads prompts and responses to them, so read the shapes."""
    found: Dict[str, Any] = {}
    batch = output.batch
    if batch is not None:
        if "prompts" in batch.keys():
            found["verl.max_prompt_length"] = int(batch["prompts"].shape[-1])
        if "responses" in batch.keys():
            found["verl.max_response_length"] = int(batch["responses"].shape[-1])
    return found


def import_verl_dumps(
    dump_dir: Union[str, os.PathLike],
    journal: Union[str, os.PathLike, Journal],
    *,
    trust_pickle: bool = False,
    progress: Optional[Callable[[int, int], None]] = None,
    fingerprint: Optional[Dict[str, Any]] = None,
    replace: bool = False,
    config: Any = None,
) -> ImportReport:
    """Import verl v1/v2/SkipManager dump folders into a journal, keeping their steps.

    Each dump becomes a `GenerationRecorded` event marked ``imported_from="verl-<form>:<path>"``, under
    the run key of its ``{experiment}_{project}`` folder and the fingerprint its folder names spell,
    so a verl config read by `read_verl_config` replays it.

    Args:
        dump_dir: verl's ``dump_dir`` (or any folder below it).
        journal: the journal folder, or an open writable `Journal` (its path and compression are used).
        trust_pickle: must be True: the dump files are pickles (see `PickleRefusedError`).
        progress: called as ``progress(done, total)`` after each dump.
        fingerprint: extra or corrected fingerprint values (e.g. those of a ``stepjournal.fingerprint``
            section), merged over what the folder names say.
        config: the verl config of the run that wrote the dumps (dict, OmegaConf, or the
            ``.hydra/config.yaml`` Hydra saved, loaded): its model, tokenizer, sampling settings and train
            files (`config_fingerprint_extras`) join each record's fingerprint, so that config replays
            them; without it the records carry only what the folder names spell.
        replace: import a dump even when the journal already has a record at its step and index
            (the import then becomes the one replayed); by default such dumps are skipped.

    Returns:
        An `ImportReport`.

    Raises:
        PickleRefusedError: `trust_pickle` is not True; nothing was read.
        VerlDumpError: `dump_dir` is not a folder, or holds no dump of any layout above (the message lists them).
    """
    if config is not None:
        fingerprint = {**config_fingerprint_extras(config), **(fingerprint or {})}
    dumps, skipped = find_verl_dumps(dump_dir)
    if not dumps:
        left = f"; left out: {'; '.join(f'{s.source} ({s.reason})' for s in skipped)}" if skipped else ""
        raise VerlDumpError(
            f"no verl dumps found under {os.fspath(dump_dir)!r}: looked for {_LAYOUTS}{left}. "
            "Give the dump_dir of your verl config (or a folder below it)"
        )
    if trust_pickle is not True:
        raise PickleRefusedError(
            f"refusing to import {len(dumps)} verl dump(s) from {os.fspath(dump_dir)!r}: {_pickle_why(dumps)}. "
            "Nothing was read. If you made these dumps yourself and nobody else can write to that folder, "
            "run again with trust_pickle=True (CLI: --trust-pickle)"
        )
    if isinstance(journal, Journal):
        path, compression = journal.path, journal.compression
    else:
        path, compression = os.fspath(journal), None
    root = os.path.realpath(os.path.expanduser(os.fspath(dump_dir)))
    imported: List[ImportedRecord] = []
    failed: List[SkippedDump] = []
    skipped = list(skipped)
    journals: Dict[Tuple[str, Tuple[Tuple[str, Any], ...]], Journal] = {}
    gen_counts: Dict[Tuple[str, Tuple[Tuple[str, Any], ...], int], int] = {}
    loaded: List[Tuple[VerlDump, int, int, Union[DataProto, TQBatch], Optional[DataProto], Dict[str, Any]]] = []
    total = len(dumps)

    try:
        # Read every dump first: v2 numbers calls by gen step, and the index within a train step
        # follows their order.
        for done, dump in enumerate(dumps, 1):
            rel = os.path.relpath(dump.path, root)
            output: Union[DataProto, TQBatch]  # a V1 dump holds a TQBatch, every other form a DataProto
            given: Optional[DataProto]
            try:
                if dump.form == "rollout_tq":
                    meta = _read_meta(root, dump.path)
                    if meta is None:
                        skipped.append(SkippedDump(rel, "meta.json is missing: the dump was interrupted"))
                        continue
                    output = load_tq_dump(dump.path, open_file=lambda p: _open_inside(root, p))
                    given, step = None, dump.order
                elif dump.form in ("skip_manager", "rollout_skip_v2"):
                    meta = _read_meta(root, dump.path)
                    if meta is None:
                        skipped.append(SkippedDump(rel, "meta.json is missing: the dump was interrupted"))
                        continue
                    output = _load_dataproto(root, os.path.join(dump.path, "gen_batch.dp"))
                    given = None
                    if dump.form == "rollout_skip_v2":
                        step = meta.get("global_steps", dump.order)
                        new_batch = os.path.join(dump.path, "new_batch.dp")
                        if os.path.isfile(new_batch):
                            given = _load_dataproto(root, new_batch)
                    else:
                        step = dump.order
                        if meta.get("global_steps", step) != step:
                            log.warning("verl_dump_step_mismatch", path=rel, folder=step, meta=meta.get("global_steps"))
                elif dump.form == "rollout_skip_v2_pre":
                    output, given = _load_v2_pre(root, dump.path)
                    step = dump.order
                else:
                    output, given, step = _load_dataproto(root, dump.path), None, 1
                if not isinstance(step, int) or isinstance(step, bool) or step < 0:
                    raise VerlDumpError(f"step {step!r} in {rel} is not an int >= 0")
                fp = dict(dump.fingerprint)
                if dump.form == "rollout_skip_v1" and isinstance(output, DataProto):  # a v1 dump is a DataProto
                    fp.update(_lengths_from(output))
                fp.update(fingerprint or {})
                loaded.append((dump, step, 0, output, given, fp))
            except (OSError, ValueError, errors.StepJournalError, pickle.UnpicklingError, EOFError, AttributeError,
                    ImportError, TypeError, KeyError, zlib.error, zstandard.ZstdError) as exc:
                failed.append(SkippedDump(rel, f"{type(exc).__name__}: {exc}"))
            finally:
                if progress is not None:
                    progress(done, total)

        for dump, step, _, output, given, fp in loaded:
            rel = os.path.relpath(dump.path, root)
            fp_key = tuple(sorted(fp.items(), key=lambda kv: kv[0]))
            count_key = (dump.run, fp_key, step)
            gen_index = gen_counts.get(count_key, 0)
            gen_counts[count_key] = gen_index + 1
            if dump.form == "rollout_tq":
                gen_index = _inner(dump)  # the mini-batch's own folder, not the order it was found in
            target = journals.get((dump.run, fp_key))
            if target is None:
                target = Journal(path, run=dump.run, fingerprint=fp, compression=compression)
                journals[(dump.run, fp_key)] = target
            existing = target.lookup(step, gen_index)
            if existing is not None and not replace:
                why = "already imported" if existing.event.imported_from else "the journal already has this call"
                skipped.append(SkippedDump(rel, f"{why} (step {step} index {gen_index}, event #{existing.seq})"))
                continue
            try:
                recorded = target.record(step, output, gen_index=gen_index, input=given, policy="import-verl",
                                         reason=f"imported from a verl {dump.form} dump",
                                         imported_from=f"verl-{dump.form}:{rel}")
            except errors.StepJournalError as exc:
                failed.append(SkippedDump(rel, f"{type(exc).__name__}: {exc}"))
                continue
            imported.append(
                ImportedRecord(dump.run, step, gen_index, dump.form, rel, recorded.seq, given is not None)
            )
            log.info("verl_dump_imported", source=rel, run=dump.run, step=step, gen_index=gen_index, seq=recorded.seq)
    finally:
        for opened in journals.values():
            opened.close()
    return ImportReport(path, tuple(imported), tuple(skipped), tuple(failed))
