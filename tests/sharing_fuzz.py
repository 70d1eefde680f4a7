"""Structure-aware fuzzing of the sharing surface: real bundles and ``file://`` remotes, damaged.

`build_seed` makes a small real journal (payloads, a bypass, a retention release, so segments carry
``released`` lists), exports it with `export_bundle` and pushes it with `push`. Each case takes the
seed's objects (manifest, heads, segments, payloads) and damages them knowing their structure: JSON
fields and whole documents, msgpack segments re-packed with changed events (some encoded with the
journal's own `encode_event`: an `EventsImported`, a `PayloadsReleased`), ``released`` lists, seqs,
digests (recomputed in the head, or left stale), whole objects; a bundle's ZIP local headers, central
directory and end record too. The damaged bundle is verified and imported, the damaged remote pulled,
each into a fresh journal; what may come out is success or a `StepJournalError` subclass. The
worker that runs the cases under time and memory bounds is `sharing_fuzz_run`.
"""

from __future__ import annotations

import json
import os
import random
import struct
import zipfile
from typing import Dict, List, Tuple

import msgpack

MIB = 1 << 20
PER_CASE_S = 60  # a hang detector only: a case takes milliseconds


def rss_allowed(largest_entry: int) -> int:
    """The peak RSS growth the docs promise for reading objects of at most `largest_entry` bytes."""
    return 96 * MIB + 8 * largest_entry


def build_seed(folder: str) -> Tuple[str, str]:
    """(bundle path, remote folder) of a small real journal under `folder`."""
    import torch

    from stepjournal import Journal
    from stepjournal.sharing import export_bundle, push
    from stepjournal.upkeep import Retention, prune

    journal_path = os.path.join(folder, "seed-journal")
    with Journal(journal_path, run="fuzz", fingerprint={"model": "m"}, sync=False, map_size=16 * MIB) as journal:
        for step in range(8):
            journal.record(step, {"ids": torch.arange(step + 3), "text": f"answer {step}"}, input={"p": step})
        journal.record_bypass(8)
        prune(journal, Retention(keep_last=5))
        journal.record(9, {"ids": torch.ones(4)})
    bundle = os.path.join(folder, "seed.sjbundle")
    export_bundle(journal_path, bundle)
    remote = os.path.join(folder, "seed-remote")
    push(journal_path, f"file://{remote}", segment_events=4)  # several segments per head
    return bundle, remote


def read_objects(bundle: str) -> Dict[str, bytes]:
    with zipfile.ZipFile(bundle) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def read_remote(folder: str) -> Dict[str, bytes]:
    found = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            if not name.endswith(".lock"):
                path = os.path.join(dirpath, name)
                found[os.path.relpath(path, folder)] = open(path, "rb").read()
    return found


# -- mutations of the layout's objects -------------------------------------------------------------------
WILD = [0, -1, 1, 2, 1 << 63, 1 << 64, 10 ** 30, 1.5, True, None, "", "1", "x" * 300, [], {}, [1, 2],
        "ab" * 32, "segments/../../x", float("inf")]
PACKABLE = [v for v in WILD if not isinstance(v, int) or v < 1 << 64]  # what msgpack can write


def _digest(data: bytes) -> str:
    from stepjournal.base._digest import digest_bytes  # private: digests as the store computes them

    return digest_bytes(data).hex()


def _heads(objects: Dict[str, bytes]) -> List[str]:
    return sorted(k for k in objects if k.startswith("heads/"))


def _relist(objects: Dict[str, bytes], name: str, body: bytes) -> None:
    """`name` now holds `body`: its head's entry gets the new size and digest (the damage passes them)."""
    for key in _heads(objects):
        head = _loaded(objects[key])
        for seg in head.get("segments") if isinstance(head.get("segments"), list) else ():
            if isinstance(seg, dict) and seg.get("name") == name:
                seg["nbytes"], seg["digest"] = len(body), _digest(body)
                objects[key] = json.dumps(head).encode()


def _loaded(data: bytes) -> dict:
    """A JSON object an earlier damage of this case left readable, else an empty one."""
    try:
        found = json.loads(data)
    except (ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def _hostile_json(rng: random.Random) -> bytes:
    n = rng.choice([100, 2000, 60_000, 300_000])
    return rng.choice([
        b"[" * n + b"]" * n, b'{"a":' * n + b"1" + b"}" * n, b"[" * n, b'{"format": 1, "x": "' + b"\\" * n + b'"}',
        b'{"format": 1, "s": "' + b'\\"[' * n + b'"}', b"\xff\xfe" + '{"format": 1}'.encode("utf-16-le"),
        b'\xef\xbb\xbf{"format": 1}', b'{"format": 1e999}', b'{"format": NaN}', b'{"format": ' + b"9" * 5000 + b"}",
        b'{"format": 1, "format": 2}', b"\x80\x81", b"", b"null", b'"x"', b"[]" * n, b'""' * n, b"{}",
    ])


def _mutate_json(objects: Dict[str, bytes], name: str, rng: random.Random) -> None:
    how = rng.randrange(4)
    if how == 0:
        objects[name] = _hostile_json(rng)
        return
    if how == 1:
        data = bytearray(objects.get(name, b""))
        for _ in range(rng.randint(1, 3)):
            if data:
                data[rng.randrange(len(data))] = rng.choice(b'{}[]":,\\0 \xff') if rng.random() < 0.5 else rng.randrange(256)
        objects[name] = bytes(data)
        return
    doc = _loaded(objects.get(name, b"{}"))
    segments = doc.get("segments") if isinstance(doc.get("segments"), list) else []
    if segments and how == 2 and isinstance(segments[0], dict):
        seg = segments[0] if len(segments) == 1 else rng.choice([s for s in segments if isinstance(s, dict)] or [{}])
        field = rng.choice(["name", "first", "last", "count", "nbytes", "digest", "extra"])
        if rng.random() < 0.3 and field in ("first", "last", "nbytes"):
            seg[field] = seg.get(field, 0) + rng.choice([-1, 1, 1000])
        elif rng.random() < 0.2:
            seg.pop(field, None)
        else:
            seg[field] = rng.choice(WILD)
        if rng.random() < 0.3:
            rng.choice([segments.reverse, lambda: segments.append(dict(seg)), lambda: segments.remove(seg)])()
    else:
        key = rng.choice(["format", "source", "last_seq", "last_digest", "segments", "kind", "extra"])
        doc[key] = rng.choice(WILD) if rng.random() < 0.8 else doc.get(key)
        if rng.random() < 0.2:
            doc.pop(key, None)
    objects[name] = json.dumps(doc).encode()


def _event_bytes(rng: random.Random, known: List[bytes], digests: List[str]) -> bytes:
    """A foreign event the journal's own encoder writes, or a known event's bytes damaged."""
    from stepjournal.events import CallBypassed, EventsImported, PayloadsReleased
    from stepjournal.events._convert import encode_event  # private: raw event bytes, as stored

    how = rng.randrange(5)
    if how == 0:
        return encode_event(EventsImported(source=rng.choice(["ab" * 16, "x"]), origin="file:///elsewhere",
                                           source_first=rng.choice([1, 3]), source_last=rng.choice([3, 1 << 40]), ts=1.0))
    if how == 1:
        return encode_event(PayloadsReleased(run="fuzz", step=rng.randrange(12), gen_index=0, mode="train",
                                             record_seq=rng.choice([1, 2, 5, 1 << 40]), released=rng.sample(digests, min(2, len(digests))),
                                             retained=[], rule="keep_last", reason="fuzz", ts=2.0))
    if how == 2:
        return encode_event(CallBypassed(session="s", run="fuzz", step=rng.randrange(12), gen_index=0, mode="validate",
                                         policy="bypass", reason="fuzz", ts=3.0))
    data = bytearray(rng.choice(known))
    if how == 3:
        data[rng.randrange(len(data))] = rng.randrange(256)
    else:
        del data[rng.randrange(len(data)):]
    return bytes(data)


def _mutate_segment(objects: Dict[str, bytes], name: str, rng: random.Random, digests: List[str]) -> None:
    body = objects[name]
    try:  # an earlier damage of this case may have left it unreadable (or a bomb: never unpacked here)
        seg = msgpack.unpackb(body, raw=False, strict_map_key=False, max_array_len=4096, max_map_len=8)
        readable = isinstance(seg, dict) and isinstance(seg.get("events"), list) and all(
            isinstance(e, list) and len(e) == 2 for e in seg["events"]) and len(body) > 8
    except Exception:
        readable = False
    if not readable or rng.random() < 0.25:  # raw bytes: flips, a truncation, nested empty arrays, a lying length
        data = bytearray(body)
        how = rng.randrange(4)
        if how == 0:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        elif how == 1:
            del data[rng.randrange(len(data)):]
        elif how == 2:
            n = rng.choice([1000, 1 << 20, 4 << 20])
            at = rng.randrange(len(data))
            data[at:at] = rng.choice([b"\x91" * n + b"\x90", b"\xdd" + struct.pack(">I", n) + b"\x90" * n])
        else:
            at = rng.randrange(max(1, len(data) - 5))
            data[at:at + 5] = rng.choice([b"\xdd\xff\xff\xff\xff", b"\xc6\x7f\xff\xff\xff", b"\xdf\x00\x01\x00\x00"])
        new = bytes(data)
    else:
        events = seg["events"]
        known = [raw for _seq, raw in events if isinstance(raw, bytes) and raw] or [b"\x80"]
        how = rng.randrange(8)
        if how == 0 and events:
            events[rng.randrange(len(events))][1] = _event_bytes(rng, known, digests)
        elif how == 1:
            seq = rng.choice([events[-1][0] + 1 if events else 1, 0, 1 << 62])
            events.insert(rng.randrange(len(events) + 1), [seq, _event_bytes(rng, known, digests)])
        elif how == 2 and events:
            rng.choice([events.reverse, lambda: events.append(list(events[0])), events.pop])()
        elif how == 3 and events:
            events[rng.randrange(len(events))][0] = rng.choice(PACKABLE[:8])
        elif how == 4:
            seg["released"] = rng.choice([digests[:3], ["zz" * 32], [1, 2], "x", [d.upper() for d in digests[:2]],
                                          digests * 50, [[]]])
        elif how == 5:
            seg[rng.choice(["format", "source", "extra", "events"])] = rng.choice(PACKABLE + [[[[]]]])
        elif how == 6 and events:
            events[rng.randrange(len(events))] = rng.choice([[1], [1, 2, 3], {"a": 1}, [1, "text"], [[[[]]]]])
        else:
            seg.pop(rng.choice(["format", "source", "events", "released"]), None)
        new = msgpack.packb(seg, use_bin_type=True)
    objects[name] = new
    if rng.random() < 0.7:  # else the head's digest is left stale
        _relist(objects, name, new)


def mutate_objects(seed: Dict[str, bytes], rng: random.Random) -> Dict[str, bytes]:
    objects = dict(seed)
    digests = [k[len("payloads/"):] for k in sorted(objects) if k.startswith("payloads/")]
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        target = rng.choice(["json", "segment", "segment", "segment", "payload", "object"])
        segments = sorted(k for k in objects if k.startswith("segments/"))
        payloads = sorted(k for k in objects if k.startswith("payloads/"))
        if target == "json":
            _mutate_json(objects, rng.choice(["stepjournal-remote.json"] + _heads(objects)), rng)
        elif target == "segment" and segments:
            _mutate_segment(objects, rng.choice(segments), rng, digests)
        elif target == "payload" and payloads:
            name = rng.choice(payloads)
            data = bytearray(objects[name])
            rng.choice([lambda: data.__setitem__(rng.randrange(len(data)), rng.randrange(256)),
                        lambda: data.__delitem__(slice(rng.randrange(len(data)), None)),
                        lambda: data.extend(b"\0" * rng.choice([1, 4096]))])()
            objects[name] = bytes(data)
        else:
            name = rng.choice(sorted(objects))
            how = rng.randrange(3)
            if how == 0:
                del objects[name]
            elif how == 1:
                objects[name] = objects[rng.choice(sorted(objects))]  # another object's bytes
            else:
                objects[rng.choice(["payloads/" + "0" * 64, "heads/" + "0" * 32 + ".json", "notes.txt"])] = b"{}"
    return objects
