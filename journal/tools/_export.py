"""Journal payloads for other tools: the export format, and a reader that needs no codec.

`export_payloads` writes the recorded outputs (and inputs) of one run as safetensors files plus JSON
(docs/audit.md, "export"); the ``stepjournal export`` verb is a thin shell around it. `OpaqueReader`
loads payloads without the codecs they were stored with: a custom-type value comes back as an
`OpaqueValue` holding what its codec stored, and no code of the codec's author runs.

safetensors is not a dependency: `export_payloads` raises `ImportError` naming the
``export`` extra (``pip install 'safetensors>=0.4'``) when it is missing.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ..index._audit import summarize_runs
from ..payloads._codec_registry import CodecRegistry
from ..base._errors import ExportError
from ..events._events import PayloadRef, iso_time
from .._journal import Journal
from ..base._progress import report_progress
from ..base._version import __version__

if TYPE_CHECKING:
    import torch

# torch and numpy are imported where payloads are decoded and flattened: an `OpaqueReader` of a path that
# holds no journal, or a look at which runs it holds (`choose_run`), says so without them.

__all__ = ["EXPORT_FORMAT_VERSION", "ExportError", "OpaqueValue", "OpaqueReader", "export_payloads", "choose_run"]

# The `format_version` of manifest.json and the `schema_version` of every rest.json.
EXPORT_FORMAT_VERSION = 1


class OpaqueValue:
    """A value of a custom type, as its codec stored it: the codec's own code is never run.

    Reading through `OpaqueReader` needs no codec registered (and imports nothing of the user's): what
    a codec stores is made of ordinary values (dicts, tensors, arrays), and those are kept here.

    Attributes:
        name: the codec name the value was stored under (``"verl.DataProto"`` ...).
        value: what that codec's encode returned, decoded as plain values.
    """

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value


def _refuse_encode(value: Any) -> Any:
    raise TypeError("an OpaqueReader only reads payloads")


def _ext_names(node: Any, found: set) -> None:
    if isinstance(node, dict):
        if node.get("kind") == "ext":
            found.add(node["name"])
        for child in node.values():
            _ext_names(child, found)
    elif isinstance(node, list):
        for child in node:
            _ext_names(child, found)


class OpaqueReader:
    """A read-only journal whose loads turn each custom-type value into an `OpaqueValue`.

    Use it to look into a journal written with codecs this process does not have (``with
    OpaqueReader(path) as reader: reader.load(ref, step)``); `export_payloads` reads through it.

    Attributes:
        journal: the read-only `Journal` (its own codec registry, empty at first).
        registry: that registry; a holder type is registered in it for each codec name met.
    """

    def __init__(self, path: str) -> None:
        self.registry = CodecRegistry()
        self.journal = Journal(path, readonly=True, registry=self.registry)

    def __enter__(self) -> "OpaqueReader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.journal.close()

    def close(self) -> None:
        """Close the journal."""
        self.journal.close()

    def load(self, ref: PayloadRef, step: int) -> Any:
        """Load a payload, its digest checked; values of custom types come back as `OpaqueValue`."""
        return _load(self.journal, self.registry, ref, step)


def _load(journal: Journal, registry: CodecRegistry, ref: PayloadRef, step: int) -> Any:
    from ..payloads._codec import describe_payload

    names: set = set()
    _ext_names(describe_payload(journal.payload_bytes(ref.digest), max_items=None), names)
    for name in sorted(names):
        if name not in registry:
            holder = type(f"Opaque[{name}]", (OpaqueValue,), {"__slots__": ()})
            registry.register(holder, name, encode=_refuse_encode, decode=functools.partial(OpaqueValue, name))
    return journal.load(ref, step=step)


# -- the export format ----------------------------------------------------------------------------
_SAFETENSORS_OK: Dict[torch.dtype, bool] = {}
# Ints at least this large (in magnitude) are written as ``{"$int": "0x..."}``, not as JSON numbers.
_INT_LIMIT = 1 << 64


def _safetensors_takes(dtype: torch.dtype) -> bool:
    found = _SAFETENSORS_OK.get(dtype)
    if found is None:
        import torch
        from safetensors.torch import save

        try:
            save({"probe": torch.zeros(1, dtype=dtype)})
            found = True
        except Exception:  # safetensors raises KeyError, ValueError or TypeError for dtypes it lacks
            found = False
        _SAFETENSORS_OK[dtype] = found
    return found


class _Flattener:
    """Split a decoded payload into tensors (by dotted path) and a JSON tree with placeholders.

    Linear in the number of tensors: keys taken are a set, and every tensor safetensors cannot
    hold goes into one raw file per payload (at an offset), not one file each.
    """

    def __init__(self, folder: str, tensors_file: str, raw_file: str) -> None:
        self.folder = folder
        self.tensors_file = tensors_file
        self.raw_name = raw_file
        import numpy
        import torch

        self.np, self.torch = numpy, torch  # imported once a payload is flattened, not with this module
        self.tensors: Dict[str, torch.Tensor] = {}
        self.raw: List[Dict[str, Any]] = []
        self._taken: set = set()
        self._suffix: Dict[str, int] = {}
        self._raw_fh: Optional[Any] = None
        self._raw_size = 0

    def key(self, path: Tuple[str, ...]) -> str:
        # A dict key may hold a lone surrogate, which a safetensors key (UTF-8) cannot: escape it.
        base = (".".join(path) or "value").encode("utf-8", "backslashreplace").decode("utf-8")
        # Suffixes continue from the last one given to this base: a thousand tensors at one path
        # cost a thousand probes, not half a million.
        n = self._suffix.get(base, 1)
        key = base if n == 1 else f"{base}~{n}"
        while key in self._taken:
            n += 1
            key = f"{base}~{n}"
        self._suffix[base] = n
        self._taken.add(key)
        return key

    def raw_file(self, key: str, data: bytes, node: Dict[str, Any]) -> Dict[str, Any]:
        if self._raw_fh is None:
            self._raw_fh = open(os.path.join(self.folder, self.raw_name), "wb")
        self._raw_fh.write(data)
        node = {"$tensor": key, **node, "file": self.raw_name, "offset": self._raw_size, "nbytes": len(data)}
        self._raw_size += len(data)
        self.raw.append(node)
        return node

    def close(self) -> None:
        if self._raw_fh is not None:
            self._raw_fh.close()

    def tensor(self, value: torch.Tensor, path: Tuple[str, ...], kind: str, dtype: str) -> Dict[str, Any]:
        key = self.key(path)
        shape = list(value.shape)
        if _safetensors_takes(value.dtype):
            self.tensors[key] = value.contiguous()
            return {"$tensor": key, "kind": kind, "dtype": dtype, "shape": shape, "file": self.tensors_file}
        # Not a safetensors dtype (complex128, bits8 ...): its bytes, C order, little-endian.
        data = value.contiguous().reshape(-1).view(self.torch.uint8).numpy().tobytes()
        return self.raw_file(key, data, {"kind": kind, "dtype": dtype, "shape": shape, "byteorder": "little"})

    def walk(self, value: Any, path: Tuple[str, ...]) -> Any:
        np, torch = self.np, self.torch
        if isinstance(value, int) and not isinstance(value, bool) and not -_INT_LIMIT < value < _INT_LIMIT:
            # Python refuses to write ints of more than 4 300 digits in decimal; hex has no limit.
            return {"$int": hex(value)}
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, bytes):
            return {"$bytes": base64.b64encode(value).decode("ascii")}
        if isinstance(value, torch.Tensor):
            return self.tensor(value, path, "torch", str(value.dtype))
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "O":
                return {"$object_array": list(value.shape),
                        "items": [self.walk(v, path + (str(i),)) for i, v in enumerate(value.flat)]}
            if value.dtype.kind in "biufc" and value.dtype.isnative:
                try:
                    return self.tensor(torch.from_numpy(np.ascontiguousarray(value)), path, "numpy", value.dtype.str)
                except TypeError:
                    pass  # numpy dtypes torch lacks fall through to raw bytes
            data = np.ascontiguousarray(value).tobytes()
            return self.raw_file(self.key(path), data, {"kind": "numpy", "dtype": value.dtype.str,
                                                        "shape": list(value.shape)})
        if isinstance(value, np.generic):
            item = value.item()
            plain = item is None or isinstance(item, (bool, int, float, str, bytes))
            return {"$numpy_scalar": value.dtype.str, "value": self.walk(item, path) if plain else str(item)}
        if isinstance(value, list):
            return [self.walk(v, path + (str(i),)) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"$tuple": [self.walk(v, path + (str(i),)) for i, v in enumerate(value)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: self.walk(v, path + (k,)) for k, v in value.items()}
            return {"$dict": [[self.walk(k, path + ("key",)), self.walk(v, path + (str(k),))]
                              for k, v in value.items()]}
        if isinstance(value, OpaqueValue):
            return {"$custom": value.name, "value": self.walk(value.value, path)}
        raise TypeError(f"cannot export a {type(value).__name__} at {'.'.join(path) or 'the root'}")


def _export_one(reader: OpaqueReader, ref: PayloadRef, step: int, folder: str, prefix: str) -> List[Dict[str, Any]]:
    """Write one payload into `folder` as ``<prefix>tensors.safetensors`` and ``<prefix>rest.json``.

    Returns:
        Where each tensor went: key, dtype, shape and file.
    """
    from safetensors.torch import save_file

    value = reader.load(ref, step)
    flat = _Flattener(folder, f"{prefix}tensors.safetensors", f"{prefix}raw.bin")
    try:
        tree = flat.walk(value, ())
    finally:
        flat.close()
    if flat.tensors:
        save_file(flat.tensors, os.path.join(folder, flat.tensors_file),
                  metadata={"format": "stepjournal-export", "digest": ref.digest, "step": str(step)})
    with open(os.path.join(folder, f"{prefix}rest.json"), "w", encoding="utf-8") as fh:
        # ASCII with escapes: a string may hold a lone surrogate, which no UTF-8 file can.
        json.dump({"schema_version": EXPORT_FORMAT_VERSION, "digest": ref.digest, "value": tree}, fh, indent=1,
                  allow_nan=False)
    listed = [{"key": k, "dtype": str(t.dtype), "shape": list(t.shape), "file": flat.tensors_file}
              for k, t in flat.tensors.items()]
    return listed + [{"key": r["$tensor"], "dtype": r["dtype"], "shape": r["shape"], "file": r["file"],
                      "offset": r["offset"], "nbytes": r["nbytes"]} for r in flat.raw]


def choose_run(journal: Journal, run: Optional[str]) -> str:
    """The run an export (or a look at one call) is about: `run` when given, else the journal's only run.

    Raises:
        ExportError: `run` has no calls, the journal holds none, or it holds several and none was chosen.
    """
    runs = [s.run for s in summarize_runs(journal) if s.calls]
    if run is not None:
        if run not in runs:
            raise ExportError(f"run {run!r} has no calls in {journal.path}; its runs are: {', '.join(runs) or 'none'}")
        return run
    if not runs:
        raise ExportError(f"journal {journal.path} holds no generate calls")
    if len(runs) > 1:
        raise ExportError(
            f"journal {journal.path} holds several runs ({', '.join(runs)}); choose one with --run (run= in Python)")
    return runs[0]


def _steps_text(steps: Any) -> str:
    # "0-" is how the policies' StepRanges spell every step.
    return "0-" if steps is None else str(steps)


def _need_safetensors() -> None:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        raise ImportError(
            "exporting payloads needs safetensors: install it with `pip install 'safetensors>=0.4'`",
            name="safetensors",
        ) from None


def export_payloads(
    journal: str,
    folder: str,
    *,
    run: Optional[str] = None,
    mode: str = "train",
    steps: Any = None,
    inputs: bool = False,
    progress: Optional[Callable[..., None]] = None,  # (done, total) or (done, total, bytes written)
) -> Dict[str, Any]:
    """Write the recorded outputs of one run into `folder`: one sub-folder per call, and manifest.json.

    The journal is opened read-only through an `OpaqueReader`, so no codec needs to be registered.

    Args:
        journal: the journal folder.
        folder: a new or empty folder to write into (created when missing).
        run: the run key (default: the journal's only run).
        mode: the mode whose recorded outputs are exported.
        steps: the steps to export (a `stepjournal.policies.StepRanges`, or any container of steps;
            default every recorded step).
        inputs: export each call's stored input too.
        progress: called with (done, total) after each call written; with (done, total, bytes written so far)
            when it sets ``counts_bytes`` (docs/sharing.md, "Progress").

    Returns:
        The manifest (also written as ``folder/manifest.json``).

    Raises:
        ImportError: safetensors is not installed (the ``export`` extra).
        ExportError: `folder` exists and is not an empty folder, the run is not found, or it has no
            recorded output at those steps.
    """
    target = os.path.abspath(folder)
    if os.path.lexists(target) and (not os.path.isdir(target) or os.listdir(target)):  # a link to nowhere too
        raise ExportError(f"{folder} exists and is not an empty folder; export into a new one")
    with OpaqueReader(journal) as reader:  # a path that holds no journal is said before safetensors loads torch
        _need_safetensors()
        opened = reader.journal
        run = choose_run(opened, run)
        wanted = [
            (step, index)
            for step in opened.recorded_steps(mode=mode, run=run)
            if steps is None or step in steps
            for index in opened.recorded_indices(step, mode=mode, run=run)
        ]
        if not wanted:
            raise ExportError(f"run {run!r} has no recorded {mode} output at steps {_steps_text(steps)}")
        os.makedirs(target, exist_ok=True)
        entries = []
        written = 0  # the bytes of the files written so far
        for done, (step, index) in enumerate(wanted, 1):
            recorded = opened.lookup(step, index, mode=mode, run=run)
            if recorded is None or recorded.event.output is None:  # listed as recorded just above
                raise ExportError(f"run {run!r} step {step} call {index} no longer has a recorded output: the "
                                  "journal changed during the export (a release or prune ran); export again")
            event, output = recorded.event, recorded.event.output
            name = f"step_{step:06d}_idx_{index}"
            call_folder = os.path.join(target, name)
            os.makedirs(call_folder)
            files = {"output": _export_one(reader, output, step, call_folder, "")}
            if inputs and event.input is not None:
                files["input"] = _export_one(reader, event.input, step, call_folder, "input_")
            entries.append({
                "dir": name,
                "step": step,
                "gen_index": index,
                "seq": recorded.seq,
                "session": event.session,
                "policy": event.policy,
                "reason": event.reason,
                "ts": event.ts,
                "time": iso_time(event.ts),
                "output_digest": output.digest,
                "input_digest": event.input_digest,
                "tensors": files["output"],
                "input_tensors": files.get("input"),
            })
            written += sum(entry.stat().st_size for entry in os.scandir(call_folder))
            report_progress(progress, done, len(wanted), moved=written)
    manifest = {
        "format": "stepjournal-export",
        "format_version": EXPORT_FORMAT_VERSION,
        "stepjournal_version": __version__,
        "journal": os.path.abspath(journal),
        "run": run,
        "mode": mode,
        "steps": _steps_text(steps),
        "entries": entries,
    }
    with open(os.path.join(target, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1)
    return manifest
