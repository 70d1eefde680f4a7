"""Every shape at every path a journal owns: a link (to a folder outside, to a file outside, dangling), a FIFO,
a plain file, a folder or a hard link at ``payloads/``, ``payloads/tmp/``, a two-digit folder, a payload
file, ``remotes.json``, the config's old temporary name, the writer lock and ``lock.mdb``, then the verbs that
touch them.

`tests/folder_shapes.py` builds the cases (every single shape with every single verb, then two shapes with
two to four verbs) and runs them in a worker process with an alarm per case (a verb that hangs on a FIFO
kills it; the parent names the case). Each verb must end in a result or a one-line `StepJournalError`, and
the sentinel folder beside the journal, which the links point into, must keep its names, contents and mtimes.
"""

from __future__ import annotations

from reliability_support import fuzz_worker, report

CASES = 2_000


def test_every_shape_at_every_owned_path_ends_in_a_result_or_one_error_line_and_touches_nothing_outside(tmp_path):
    from folder_shapes import PATHS, SHAPES, VERBS, run_cases

    out = str(tmp_path / "folder-shapes.json")
    result = fuzz_worker(run_cases, (0, CASES, str(tmp_path), out), out, "rebuild it with folder_shapes.make_case")
    assert result["failures"] == []
    assert result["cases"] == CASES >= len(PATHS) * len(SHAPES) * len(VERBS)
    # Each verb both ran through and was refused somewhere: the shapes reached the code that opens them.
    counts = result["counts"]
    for verb in VERBS:
        assert counts.get(f"{verb}:ok", 0) > 0, (verb, counts)
    assert all(any(k.startswith(f"{verb}:") and not k.endswith(":ok") for k in counts) for verb in VERBS), counts
    report("fuzz_folder_shapes", cases=result["cases"], untyped_errors=0, hangs=0, outside_changed=0,
           **{k: v for k, v in sorted(counts.items())})
