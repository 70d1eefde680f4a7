"""The event schema is written once: the attrs classes of `_events.py`, with their tags and versions.

The fast readers decode call events without building them. `_call_rows` takes its checks from the
classes' declared fields (`_schema.fields_of`); `_native_rows` derives msgspec structs from them, whose
types and ranges msgspec checks in C, so the derivation is compared here with the classes (fields, which
have defaults, types, tag, version) and a drift fails. The action each call event is named by is written once
(`CALL_ACTIONS`); the source of the project is read for any other map of a call event to its action.
Each check is also run on a planted drift, so a checker that stopped seeing one fails here too.
"""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import List, Optional, Tuple

import attrs
import msgspec.inspect as mi
import pytest

from stepjournal.index import _native_rows  # private: the fast decoder under test
from stepjournal.tools import ACTIONS
from stepjournal.events._events import (  # private: event classes and maps, below the face
    CALL_ACTIONS, EVENT_TYPES, CallEvent, CallRefused, GenerationRecorded, PayloadRef, ReplayServed,
)
from stepjournal.events._schema import TEXT, event_field, fields_of  # private: the one schema under test

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("journal", "policies", "adapters")
ACTION_MAP_HOME = Path("journal/events/_events.py")
STRUCT_ONLY = {"v", "crc32"}  # the stored envelope: the version and the checksum (the tag is the struct's)
_HINT_KIND = {str: "str", int: "int", float: "float", PayloadRef: "ref"}


def _hint_kinds(hint: object) -> frozenset:
    args = typing.get_args(hint) if typing.get_origin(hint) is typing.Union else (hint,)
    return frozenset("none" if arg is type(None) else _HINT_KIND.get(arg, repr(arg)) for arg in args)


def _struct_kinds(info: mi.Type) -> frozenset:
    kinds = set()
    for one in info.types if isinstance(info, mi.UnionType) else (info,):
        if isinstance(one, mi.LiteralType):
            kinds.update(_HINT_KIND[type(value)] for value in one.values)
        elif isinstance(one, mi.StructType):
            kinds.add("ref" if one.cls is _native_rows._Ref else one.cls.__name__)
        else:
            kinds.add({mi.StrType: "str", mi.IntType: "int", mi.FloatType: "float", mi.NoneType: "none"}
                      .get(type(one), type(one).__name__))
    return frozenset(kinds)


def schema_drift(struct: type, cls: type, tag_version: Optional[Tuple[str, int]] = None) -> List[str]:
    """How the msgspec `struct` differs from the attrs `cls` it decodes (empty when they agree)."""
    found: List[str] = []
    fields = {f.name: f for f in mi.type_info(struct).fields}
    if tag_version is not None:
        tag, version = tag_version
        if struct.__struct_config__.tag != tag:
            found.append(f"tag {struct.__struct_config__.tag!r}, the class's is {tag!r}")
        v = fields.pop("v", None)
        if v is None or v.type != mi.LiteralType(values=(version,)):
            found.append(f"version {v and v.type}, the class's is {version}")
        fields.pop("crc32", None)
    hints = typing.get_type_hints(cls)
    ours = {a.name: a for a in attrs.fields(cls)}
    found += [f"field {name} is in the class, not the struct" for name in ours.keys() - fields.keys()]
    found += [f"field {name} is in the struct, not the class" for name in fields.keys() - ours.keys()]
    for name in ours.keys() & fields.keys():
        required = ours[name].default is attrs.NOTHING
        if fields[name].required != required:
            found.append(f"field {name}: {'required' if required else 'optional'} in the class, not in the struct")
        if _struct_kinds(fields[name].type) != _hint_kinds(hints[name]):
            found.append(f"field {name}: {sorted(_hint_kinds(hints[name]))} in the class, "
                         f"{sorted(_struct_kinds(fields[name].type))} in the struct")
    return found


@pytest.mark.parametrize("struct", list(_native_rows._EVENT_OF), ids=lambda s: s.__name__)
def test_each_native_struct_holds_its_event_classs_fields_defaults_types_tag_and_version(struct):
    cls = _native_rows._EVENT_OF[struct]
    assert schema_drift(struct, cls, EVENT_TYPES[cls]) == []


def test_the_native_payload_ref_struct_holds_payload_refs_fields():
    assert schema_drift(_native_rows._Ref, PayloadRef) == []


def test_there_is_a_native_struct_for_every_call_event_and_no_other():
    assert sorted(c.__name__ for c in _native_rows._EVENT_OF.values()) == sorted(c.__name__ for c in CALL_ACTIONS)


_REFUSED = _native_rows._STRUCT_OF[CallRefused]
_REPLAYED = _native_rows._STRUCT_OF[ReplayServed]


@attrs.frozen
class _GeneratedWithANewField(GenerationRecorded):
    extra: str = event_field(TEXT, default="")


class _RefusedWithANewField(_REFUSED, tag="call_refused"):
    extra: int = 0


class _RefusedWithAnOptionalReason(_REFUSED, tag="call_refused"):
    reason: Optional[str]


@pytest.mark.parametrize("struct, cls, tag_version, drift", [
    (_native_rows._Generated, _GeneratedWithANewField, EVENT_TYPES[GenerationRecorded], "field extra is in the class"),
    (_RefusedWithANewField, CallRefused, EVENT_TYPES[CallRefused], "field extra is in the struct"),
    (_RefusedWithAnOptionalReason, CallRefused, EVENT_TYPES[CallRefused], "field reason: ['str'] in the class"),
    (_REFUSED, CallRefused, ("call_refused", 3), "the class's is 3"),
    (_REFUSED, CallRefused, ("call_refused_v2", 2), "the class's is 'call_refused_v2'"),
    (_REPLAYED, GenerationRecorded, EVENT_TYPES[GenerationRecorded], "field source_seq is in the struct"),
], ids=["class-field", "struct-field", "type", "version", "tag", "other-class"])
def test_the_schema_check_reports_a_planted_drift(struct, cls, tag_version, drift):
    assert any(drift in line for line in schema_drift(struct, cls, tag_version))


def test_the_readers_derived_lists_follow_a_field_added_to_an_event_class(monkeypatch):
    """What `_call_rows` accepts and what `_native_rows` counts come from the class, not from a copy."""
    from stepjournal.events import _events  # private: event classes and maps, below the face

    before = _events.field_names(GenerationRecorded)
    allowed, required = _events.field_names(_GeneratedWithANewField)
    assert allowed == before[0] | {"extra"} and required == before[1]
    assert [f.name for f in fields_of(_GeneratedWithANewField)][-1] == "extra"
    assert _native_rows._KEYS[_native_rows._Generated] == len(before[1]) + len(STRUCT_ONLY) + 1  # + the tag


@pytest.mark.parametrize("cls", [PayloadRef, *CALL_ACTIONS], ids=lambda c: c.__name__)
def test_each_fields_optional_flag_agrees_with_its_annotation(cls):
    """`event_field(..., optional=True)` and ``Optional[...]`` say the same (None passes the validator)."""
    for field in fields_of(cls):
        assert (type(None) in typing.get_args(field.hint)) == field.optional, field.name


def action_maps(source: str) -> List[int]:
    """Lines of dict literals that map call events to actions (``{Cls: "generated"}``, keyed by anything but a
    string) or place the actions (``{"generated": 2, "replayed": 3}``, distinct ints: an order of them)."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Dict):
            continue
        pairs = [(k.value if isinstance(k, ast.Constant) else k, v.value if isinstance(v, ast.Constant) else v)
                 for k, v in zip(node.keys, node.values)]
        named = any(v in ACTIONS and not isinstance(k, str) for k, v in pairs if isinstance(v, str))
        places = [v for k, v in pairs if isinstance(k, str) and k in ACTIONS and type(v) is int]
        if named or (len(places) > 1 and len(set(places)) == len(places)):
            lines.append(node.lineno)
    return lines


def test_the_call_event_to_action_map_is_written_once():
    found = {}
    for folder in SOURCE_FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            lines = action_maps(path.read_text(encoding="utf-8"))
            if lines:
                found[str(path.relative_to(ROOT))] = lines
    assert list(found) == [str(ACTION_MAP_HOME)], found


@pytest.mark.parametrize("source", [
    '_ACTION = {GenerationRecorded: "generated", ReplayServed: "replayed"}',
    '_ACTION = {_Generated: "generated", _Replayed: "replayed"}',
    '_AT_OF_ACTION = {"generated": 2, "replayed": 3, "bypassed": 4, "refused": 5}',
])
def test_the_action_map_check_finds_a_second_copy(source):
    assert action_maps(source) == [1]


def test_the_action_map_check_passes_maps_keyed_by_action_to_other_things():
    assert action_maps('STYLE = {"generated": "green", "replayed": "blue"}\nN = {"generated": 0, "replayed": 0}') == []


def test_the_actions_follow_the_one_map():
    assert ACTIONS == tuple(CALL_ACTIONS.values())
    assert {s: CALL_ACTIONS[c] for s, c in _native_rows._EVENT_OF.items()} == _native_rows._ACTION


def test_the_call_event_type_names_the_classes_of_the_action_map():
    assert typing.get_args(CallEvent) == tuple(CALL_ACTIONS)
