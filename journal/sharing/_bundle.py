"""Bundles: a selection of a journal in one portable file (`export_bundle`, `import_bundle`, `verify_bundle`).

A bundle is a ZIP archive whose entries are the objects of the remote layout (`_remote`):
``stepjournal-remote.json``, ``payloads/<hex digest>``, ``segments/<journal id>/<first>-<last>.msgpack``
and ``heads/<journal id>.json``, each stored as it is (ZIP method "stored": nothing for ZIP to
decompress, so a bundle cannot hide a decompression bomb from the bounded reads). Importing a bundle
is a pull from it, with the same checks; verifying one reads it without importing anything.

Events keep the journal and seq they were first recorded under: a journal's own events go under its
id, and the events it pulled from another journal (after an `EventsImported`) under that journal's
id with their original seqs, so provenance survives any number of hops.
"""

from __future__ import annotations

import json
import os
import re
import stat
import struct
import zipfile
from typing import Any, Collection, Container, Dict, Iterator, List, Optional, Tuple, Union

import attrs

from ..events._convert import decode_event
from ..base._errors import ImportClaimError, IntegrityError, JournalError, PayloadMissingError, StepJournalError
from ..events._events import Event, EventsImported, PayloadRef, SessionOpened, call_refs
from ._import_checks import IncomingChecks, Renames, check_options
from ..index._import_map import ImportMap
from .._journal import Journal
from ..base._log import get_logger
from ..base._progress import Progress, report_progress
from ..payloads._object_store import ObjectPayloadStore
from ._pull import PullReport, pull_from, written_by_others
from ._remote import Released, journal_id, local_payload
from ._remote_layout import (MANIFEST, check_format, encode_segment, event_in, manifest_bytes, new_head,
                             read_head, read_json, read_segment)
from ..base._undo import undone_on_failure
from ..storage._appender import appender_of
from ..upkeep._verify import VerifyProblem

__all__ = ["BundleReport", "export_bundle", "import_bundle", "verify_bundle"]

log = get_logger(__name__)

_SEGMENT_EVENTS = 4096
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the same selection gives the same bytes
_ENTRY = re.compile(
    r"^(stepjournal-remote\.json|heads/[0-9a-f]{32}\.json|segments/[0-9a-f]{32}/[0-9]{20}-[0-9]{20}\.msgpack"
    r"|payloads/[0-9a-f]{64})$"
)
# What `zipfile` raises on a damaged archive, besides its own BadZipFile: a header naming an unknown
# method or flag (NotImplementedError), a name that is not UTF-8 (UnicodeDecodeError, a ValueError),
# sizes and offsets past the file (EOFError, OSError on a negative seek), short headers (struct.error).
_ZIP_DAMAGE = (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, EOFError, OSError,
               struct.error, KeyError, IndexError, OverflowError)


@attrs.frozen
class BundleReport:
    """What `export_bundle` wrote: events, payloads, the journals they came from, and the file's size."""

    path: str
    events: int
    payloads: int
    sources: Tuple[str, ...]
    nbytes: int


class _Writer:
    """The remote-shaped side `export_bundle` writes: each object one stored ZIP entry, written once."""

    def __init__(self, path: str) -> None:
        self.url = f"bundle:{path}"
        self._zip = zipfile.ZipFile(path, "x", compression=zipfile.ZIP_STORED, allowZip64=True)
        self._names: set = set()
        self.written = 0  # the bytes of the objects written so far

    def put(self, key: str, data: Any, *, create: bool = False) -> bool:
        if key in self._names:
            if create:
                return False
            raise JournalError(f"a bundle object is written once; {key} was already written")  # a bug, never input
        info = zipfile.ZipInfo(key, date_time=_FIXED_TIME)
        info.compress_type = zipfile.ZIP_STORED
        self._zip.writestr(info, bytes(data))
        self._names.add(key)
        self.written += len(data)
        return True

    def close(self) -> None:
        self._zip.close()


class _BundleReader:
    """A bundle read as a remote (`get`, `keys`, `exists`): every read bounded, nothing extracted.

    Raises:
        IntegrityError: the file is not a ZIP archive (any damage `zipfile` finds in its headers), or
            an entry is compressed, duplicated or named outside the remote layout.
    """

    def __init__(self, path: str) -> None:
        self.url = f"bundle:{path}"
        try:
            # Non-blocking, so a FIFO in its place cannot hang the open; checked to be a file first.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise JournalError(f"cannot read the bundle {path!r}: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise IntegrityError(f"{path!r} is not a bundle file (not a regular file)")
        os.set_blocking(fd, True)
        self._file = os.fdopen(fd, "rb")
        try:
            try:
                self._zip = zipfile.ZipFile(self._file)
            except _ZIP_DAMAGE as exc:
                raise IntegrityError(f"{path!r} is not a stepjournal bundle (not a readable ZIP archive: "
                                     f"{type(exc).__name__}: {str(exc)[:200]}); export it again",
                                     detail="damaged archive") from None
            self._infos: Dict[str, zipfile.ZipInfo] = {}
            for info in self._zip.infolist():
                if not _ENTRY.match(info.filename) or info.filename in self._infos:
                    raise IntegrityError(f"bundle {path!r} holds an entry outside the layout: {info.filename[:80]!r}")
                if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1:
                    raise IntegrityError(f"bundle {path!r}: entry {info.filename} is compressed or encrypted; "
                                         "a bundle stores its objects as they are")
                self._infos[info.filename] = info
        except BaseException:
            self._file.close()
            raise

    def get(self, key: str, *, limit: int) -> Optional[bytes]:
        info = self._infos.get(key)
        if info is None:
            return None
        if info.file_size > limit:
            raise IntegrityError(f"object {self.url}/{key} is {info.file_size} bytes, more than the {limit} it may "
                                 "hold; not read", detail="oversized object")
        try:
            with self._zip.open(info) as entry:
                data = entry.read(limit + 1)
        except _ZIP_DAMAGE as exc:  # its local header disagrees with the directory, its CRC is wrong ...
            raise IntegrityError(f"object {self.url}/{key} cannot be read ({type(exc).__name__}: {str(exc)[:200]}): "
                                 "the bundle is damaged; export it again", detail="damaged entry") from None
        if len(data) != info.file_size:
            raise IntegrityError(f"object {self.url}/{key} is truncated", detail="damaged entry")
        return data

    def exists(self, key: str) -> bool:
        return key in self._infos

    def keys(self, prefix: str, *, most: Optional[int] = None) -> List[str]:
        """The bundle's entries under `prefix`, sorted (every one was read with the file: `most` is moot)."""
        return sorted(k for k in self._infos if k.startswith(prefix))

    def close(self) -> None:
        self._zip.close()
        self._file.close()


def _selected(event: Event, runs: Optional[Collection[str]], modes: Optional[Collection[str]],
              stages: Optional[Collection[str]], steps: Optional[Container[int]]) -> bool:
    if isinstance(event, EventsImported):
        return False  # provenance is carried by the ids events are bundled under
    if runs is not None and getattr(event, "run", None) not in runs:
        return False
    if isinstance(event, SessionOpened):
        return True
    return ((modes is None or event.mode in modes) and (stages is None or event.stage in stages)
            and (steps is None or event.step in steps))


def _origins(journal: Journal) -> Iterator[Tuple[str, int, bytes, Any]]:
    """(journal id, seq there, stored bytes, event) of every event but the `EventsImported` markers."""
    own = journal_id(journal)
    source, next_seq, left = own, 0, 0
    for seq, raw in journal.raw_events():
        raw = bytes(raw)
        event = decode_event(raw, seq=seq)
        if isinstance(event, EventsImported):
            source, next_seq, left = event.source, event.source_first, event.source_last - event.source_first + 1
            yield source, 0, raw, event
            continue
        if left:
            yield source, next_seq, raw, event
            next_seq, left = next_seq + 1, left - 1
        else:
            yield own, seq, raw, event


def export_bundle(journal: Union[str, "os.PathLike[str]", Journal], path: Union[str, "os.PathLike[str]"], *,
                  runs: Optional[Collection[str]] = None, modes: Optional[Collection[str]] = None,
                  stages: Optional[Collection[str]] = None,
                  steps: Optional[Container[int]] = None, progress: Progress = None) -> BundleReport:
    """Write a selection of `journal` (a path or an open `Journal`) to the new bundle file `path`.

    Args:
        runs, modes, stages, steps: keep only the calls of these (None: all); the sessions of the
            kept runs come too. `steps` is anything with ``in`` (a `StepRanges`, a set, a range).
        progress: ``progress("bundle", events read, events in all)`` as events are read, and the bytes written
            so far when it asks for them (docs/sharing.md, "Progress").

    Raises:
        JournalError: `path` exists (nothing is overwritten), or nothing was selected.
        IntegrityError: a payload the selection needs is missing or damaged (names the step);
            no file is left behind.
    """
    if not isinstance(journal, Journal):
        with Journal(journal, readonly=True) as opened:
            return export_bundle(opened, path, runs=runs, modes=modes, stages=stages, steps=steps, progress=progress)
    path = os.path.abspath(os.fspath(path))
    if os.path.lexists(path):
        raise JournalError(f"{path!r} exists; a bundle is written to a new file (choose another name or remove it)")
    tmp = f"{path}.partial-{os.getpid()}"
    writer = _Writer(tmp)
    try:
        report = _write(journal, writer, path, runs, modes, stages, steps, progress)
        writer.close()
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
        os.link(tmp, path)  # refuses a file that appeared meanwhile
    except BaseException:
        writer.close()
        raise
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    report = attrs.evolve(report, nbytes=os.path.getsize(path))
    log.info("bundle_exported", path=path, events=report.events, payloads=report.payloads)
    return report


def _write(journal: Journal, writer: _Writer, path: str, runs: Any, modes: Any, stages: Any, steps: Any,
           progress: Progress) -> BundleReport:
    writer.put(MANIFEST, manifest_bytes())
    pending: Dict[str, List[Tuple[int, bytes]]] = {}
    heads: Dict[str, Dict[str, Any]] = {}
    written: set = set()
    payloads = appender_of(journal).local
    events, total = 0, journal.last_seq()
    released = Released(journal)  # read only if a payload is missing
    skipped: Dict[str, set] = {}  # per source: released payloads its next segment names

    def flush(source: str) -> None:
        name, body, entry = encode_segment(source, pending.pop(source), skipped.pop(source, ()))
        writer.put(name, body)
        heads.setdefault(source, new_head(source))["segments"].append(entry)

    for done, (source, seq, raw, event) in enumerate(_origins(journal), start=1):
        if done % 1024 == 0:
            report_progress(progress, "bundle", done, total, moved=writer.written)
        if not _selected(event, runs, modes, stages, steps):
            continue
        for ref in call_refs(event):
            if ref.digest in written:
                continue
            blob, problem = local_payload(payloads, ref)
            if problem == "missing" and ref.digest in released:
                skipped.setdefault(source, set()).add(ref.digest)  # the event goes; its released payload cannot
                continue
            if problem:
                raise IntegrityError(
                    f"payload {ref.digest[:16]}… of step {event.step} is {problem} in {journal.path!r}; "
                    "run `stepjournal verify`, or leave that step out with --steps", step=event.step)
            writer.put(f"payloads/{ref.digest}", blob)
            written.add(ref.digest)
        pending.setdefault(source, []).append((seq, raw))
        events += 1
        if len(pending[source]) >= _SEGMENT_EVENTS:
            flush(source)
    for source in list(pending):
        flush(source)
    # The last report, whatever the count: a bar ends full.
    report_progress(progress, "bundle", total, total, moved=writer.written)
    if not events:
        raise JournalError(f"nothing in {journal.path!r} matches the selection; a bundle needs at least one event")
    for source, head in sorted(heads.items()):
        last = head["segments"][-1]
        head["last_seq"] = last["last"]
        writer.put(f"heads/{source}.json", _json_bytes(head))
    return BundleReport(path, events, len(written), tuple(sorted(heads)), 0)


def _json_bytes(value: Dict[str, Any]) -> bytes:
    return json.dumps(value, sort_keys=True).encode()


def import_bundle(path: Union[str, "os.PathLike[str]"], journal: Union[str, "os.PathLike[str]", Journal], *,
                  progress: Progress = None, runs: Renames = None, keep: Optional[str] = None) -> PullReport:
    """Bring a bundle's events and payloads into `journal` (a path, created when absent, or a `Journal`).

    A pull from the bundle, with its checks: every event it would take is checked (segment digests,
    decoding, what the events claim, the calls they record) before the first run is committed with
    its payloads (docs/sharing.md, "What an import checks"). An event already imported (from this
    bundle, a remote or another bundle of the same journal) is known by its journal and seq, so the
    bundles of one journal's selections can be imported in any order, or twice.

    An import that fails into a journal folder it created removes that folder (`undone_on_failure`),
    even when runs before the damage were committed, unless another process has it open or recorded
    into it meanwhile; an existing journal keeps those runs.

    Args:
        runs: import under other run keys: a run key for every incoming run, or ``{old: new}``.
        keep: ``"ours"``: an incoming record of a call the journal already serves (other bytes, another
            journal) is imported for the audit, and the journal's record stays served.

    Raises:
        IntegrityError: the bundle is damaged (names what and, for payloads, the steps); the events
            that need it were not imported.
        ImportClaimError: a segment claims provenance or a release its journal's log does not prove.
        ImportConflictError: incoming records would change what the journal replays (keep is None).
        RemoteFormatError: the bundle was written by a newer stepjournal.
    """
    check_options(runs, keep)
    reader = _BundleReader(os.path.abspath(os.fspath(path)))  # a file that is not a bundle creates no journal
    try:
        if isinstance(journal, Journal):
            report = pull_from(reader, ObjectPayloadStore.over(reader), journal, progress=progress, runs=runs,
                               keep=keep)
        else:
            with undone_on_failure(journal, kept=written_by_others), Journal(journal, session=False) as opened:
                report = pull_from(reader, ObjectPayloadStore.over(reader), opened, progress=progress, runs=runs,
                                   keep=keep)
    finally:
        reader.close()
    log.info("bundle_imported", path=reader.url, events=report.events_pulled)
    return report


def verify_bundle(path: Any) -> Tuple[int, List[VerifyProblem]]:
    """Check a bundle without importing it: (events it holds, problems found; empty when whole).

    Every segment is checked against its head's digest and decoded, and every payload an event
    names is present and matches its digest.

    Raises:
        IntegrityError: the file is not a bundle at all (not a ZIP, entries outside the layout).
        RemoteFormatError: the bundle was written by a newer stepjournal.
    """
    reader = _BundleReader(os.path.abspath(os.fspath(path)))
    problems: List[VerifyProblem] = []
    events = 0
    try:
        found = read_json(reader, MANIFEST, 1 << 16)
        if found is None:
            raise IntegrityError(f"{reader.url} is not a stepjournal bundle ({MANIFEST} is missing)")
        check_format(reader, MANIFEST, found)
        objects = ObjectPayloadStore.over(reader)
        claims = IncomingChecks(None, ImportMap(), None, None, lambda d: reader.exists(f"payloads/{d}"), several=False)
        checked: Dict[str, Optional[str]] = {}
        for key in reader.keys("heads/"):
            source = key[len("heads/"):-len(".json")]
            try:
                head = read_head(reader, source)
            except StepJournalError as exc:
                problems.append(VerifyProblem("head", key, (), str(exc)))
                continue
            for seg in head["segments"] if head else ():
                try:
                    listed, released = read_segment(reader, source, seg)
                except StepJournalError as exc:
                    problems.append(VerifyProblem("segment", seg["name"], (), str(exc)))
                    continue
                events += len(listed)
                try:
                    claims.segment(source, seg["name"], listed, released)
                except ImportClaimError as exc:
                    problems.append(VerifyProblem("claim", seg["name"], (), str(exc)))
                for _seq, _raw, event in listed:
                    for ref in call_refs(event):
                        if ref.digest in released and not reader.exists(f"payloads/{ref.digest}"):
                            continue  # released by retention before the bundle was written
                        if ref.digest not in checked:
                            checked[ref.digest] = _payload_problem(objects, ref)
                        wrong = checked[ref.digest]
                        if wrong is not None:
                            kind = "missing_payload" if wrong == "missing" else "payload"
                            problems.append(VerifyProblem(kind, ref.digest, (event.step,), wrong))
        try:
            claims.finish(lambda source, seq: _bundled_record(reader, source, seq))
        except ImportClaimError as exc:
            problems.append(VerifyProblem("claim", exc.segment, (), str(exc)))
    finally:
        reader.close()
    return events, _merged(problems)


def _bundled_record(reader: _BundleReader, source: str, seq: int) -> Any:
    """Event `seq` of journal `source` as the bundle holds it, or None (a release's record, checked)."""
    try:
        head = read_head(reader, source)
        return event_in(reader, source, head["segments"] if head else (), seq)
    except StepJournalError:
        pass  # the damaged head or segment is a problem of its own; the release's record is not there
    return None


def _payload_problem(objects: ObjectPayloadStore, ref: PayloadRef) -> Optional[str]:
    try:
        objects.fetch(bytes.fromhex(ref.digest), nbytes=ref.nbytes)  # one bounded, digest-checked read
    except PayloadMissingError:
        return "missing"
    except StepJournalError as exc:
        return str(exc)
    return None


def _merged(problems: List[VerifyProblem]) -> List[VerifyProblem]:
    """One problem per payload, with every step that names it."""
    out: Dict[Tuple[str, str], VerifyProblem] = {}
    for p in problems:
        key = (p.kind, p.where)
        seen = out.get(key)
        out[key] = p if seen is None else attrs.evolve(seen, steps=tuple(sorted(set(seen.steps + p.steps))))
    return list(out.values())

