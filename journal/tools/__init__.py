"""`stepjournal.tools`: the read side of a journal, for the command line and any reader of one.

Diff (`diff_journals` stays at the top level too) and its report, the structural comparison and its
tolerances, export, the tool calls' rows, and the helpers the command line uses: the audit's rows and
their text, sample views, the key layout's parser, the journal's time format and digests, and the one
converter's structuring seam. The face is lazy (`lazy_face`): a command that needs one name loads only its
module, so ``--help`` never loads numpy (docs/architecture.md, "The read-side namespace").

The modules of this folder (``_diff``, ``_export`` ...) are the journal's own; what other rooms use is
named here.
"""

from typing import TYPE_CHECKING

from ..base._face import lazy_face

if TYPE_CHECKING:
    from ..base._digest import digest_hex
    from ..events._events import CALL_EVENT_TYPES, check_fingerprint, iso_time
    from ..events._keys import GenKey, parse_gen_key
    from ..events._structure import structure
    from ..index._audit import ACTIONS, AUDIT_FIELDS
    from ..index._call_rows import json_rows, releases_of
    from ..index._row_text import JSON_RAW, SURROGATE, rows_text
    from ..index._samples import samples, samples_of_steps
    from ._compare import Comparison, Difference, compare_values, json_float
    from ._diff import diff_journals
    from ._diff_report import DIFF_SCHEMA_VERSION, DiffReport, DiffSide, PairDiff, compact_steps, stage_order
    from ._export import EXPORT_FORMAT_VERSION, OpaqueReader, OpaqueValue, choose_run, export_payloads
    from ._tolerance import DTYPE_TOLERANCES, Tolerance, Tolerances
    from ._tool_rows import ToolCallRow, ToolStepSummary, first_tool_difference, tool_call_rows, tool_step_summaries

__all__ = [
    "diff_journals",
    "DiffReport",
    "DiffSide",
    "PairDiff",
    "DIFF_SCHEMA_VERSION",
    "Comparison",
    "Difference",
    "compare_values",
    "Tolerance",
    "Tolerances",
    "DTYPE_TOLERANCES",
    "export_payloads",
    "OpaqueReader",
    "OpaqueValue",
    "EXPORT_FORMAT_VERSION",
    "ToolCallRow",
    "ToolStepSummary",
    "tool_call_rows",
    "tool_step_summaries",
    "first_tool_difference",
    "json_rows",
    "releases_of",
    "rows_text",
    "JSON_RAW",
    "SURROGATE",
    "AUDIT_FIELDS",
    "ACTIONS",
    "samples",
    "samples_of_steps",
    "iso_time",
    "CALL_EVENT_TYPES",
    "check_fingerprint",
    "GenKey",
    "parse_gen_key",
    "structure",
    "digest_hex",
    "choose_run",
    "json_float",
    "stage_order",
    "compact_steps",
]

__getattr__, __dir__ = lazy_face(globals())
