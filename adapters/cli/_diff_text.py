"""``stepjournal diff A B --text``: at the first divergence, the first sample that differs, decoded on both sides.

The step is the report's first divergence. Its samples are read on each side (`Journal.samples`, with the
tokenizer the run's fingerprint names, or ``--tokenizer``); the first sample whose prompt, tokens or
rewards differ is shown side by side, the first differing token marked, the rewards beside the text.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from rich.console import Console

from stepjournal import Journal
from stepjournal.events import CallBypassed, CallRefused, GenerationRecorded, ReplayServed
from stepjournal.tools import DiffReport
from stepjournal.errors import StepJournalError

from ._preview import EDGE, inline
from ._render import cell, print_line
from ._show_text import load_tokenizer

__all__ = ["first_differing_sample", "print_text"]


def _first_token(a: Sequence[int], b: Sequence[int]) -> Optional[int]:
    """The offset of the first token that differs (the shorter length when one is the other's start)."""
    for offset, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return offset
    return None if len(a) == len(b) else min(len(a), len(b))


def _split(tokenizer: Any, ids: Sequence[int], offset: Optional[int]) -> Dict[str, Any]:
    """The response's text cut around the first differing token: before it, the token, after it. The cuts
    are found in the text of the whole response (a decoder may join tokens with spaces, or merge bytes),
    so the three pieces read as the response does."""
    if tokenizer is None:  # no tokenizer: the ids around the first differing one
        return _split_ids(ids, offset)
    decode = lambda part: tokenizer.decode(list(part), skip_special_tokens=True)  # noqa: E731
    whole = decode(ids)
    if offset is None or offset >= len(ids):
        return {"before": whole, "token": "", "after": ""}
    before, through = decode(ids[:offset]), decode(ids[:offset + 1])
    if whole.startswith(through) and through.startswith(before):
        return {"before": before, "token": through[len(before):], "after": whole[len(through):]}
    return {"before": before, "token": tokenizer.decode([ids[offset]], skip_special_tokens=False),
            "after": decode(ids[offset + 1:])}


def _split_ids(ids: Sequence[int], offset: Optional[int]) -> Dict[str, Any]:
    if offset is None or offset >= len(ids):
        return {"before": f"ids {inline(ids)}", "token": "", "after": ""}
    start, end = max(0, offset - EDGE), offset + 1 + EDGE
    before = ("ids [" + ("..., " if start else "") + "".join(f"{t}, " for t in ids[start:offset]))
    after = "".join(f", {t}" for t in ids[offset + 1:end]) + (", ...]" if end < len(ids) else "]")
    return {"before": before, "token": str(ids[offset]), "after": after}


def first_differing_sample(report: DiffReport, path_a: str, path_b: str,
                           tokenizer_path: Optional[str]) -> Optional[Dict[str, Any]]:
    """The first sample of the first differing step whose prompt, tokens or rewards differ, on both sides
    (None when the runs agree, or every sample of that step is alike). Keys: ``step``, ``sample``,
    ``token_offset`` (None when the tokens are equal), ``a`` and ``b`` (each `Sample.to_json()` plus
    ``marked``: the response before the first differing token, that token, and after it)."""
    first = report.first_divergence
    if first is None:
        return None
    found: List[List[Any]] = []
    tokenizers: List[Any] = []
    notes: List[str] = []
    # A side's samples are one session's: the side's own, or the one that journaled the differing record (its
    # rewards are the ones compared), else the one whose generate call was compared; never a later session's.
    compared = next((p for p in report.pairs if (p.stage, p.mode, p.step, p.gen_index) == (
        "generate", first.mode, first.step, 0)), None)
    for path, side, label in ((path_a, report.a, "seq_a"), (path_b, report.b, "seq_b")):
        with Journal(path, readonly=True) as journal:
            tokenizers.append(load_tokenizer(journal, side.run, tokenizer_path, notes.append))
            seqs = [getattr(p, label) for p in (first, compared) if p is not None]
            found.append(_side_samples(journal, side, first, seqs, tokenizers[-1]))
    for a, b in zip(*found):
        offset = _first_token(a.response_ids, b.response_ids)
        if offset is not None or a.rewards != b.rewards or a.prompt_ids != b.prompt_ids:
            sides = {}
            for label, sample, tokenizer in (("a", a, tokenizers[0]), ("b", b, tokenizers[1])):
                sides[label] = {**sample.to_json(), "marked": _split(tokenizer, sample.response_ids, offset)}
            return {"step": first.step, "sample": a.index, "token_offset": offset, **sides,
                    "notes": list(dict.fromkeys(notes))}
    return None


def _call_session(journal: Journal, seq: int) -> str:
    """The session of the call event at `seq` (a record the diff compared: always a call)."""
    event = journal.event(seq)
    assert isinstance(event, (GenerationRecorded, ReplayServed, CallBypassed, CallRefused))
    return event.session


def _side_samples(journal: Journal, side: Any, first: Any, seqs: Sequence[Optional[int]], tokenizer: Any) -> List[Any]:
    """The samples at the first divergence of one side: of its session, or of the session of the first of
    `seqs` (the records compared) whose session made a generate call there."""
    def read(session: Optional[str]) -> List[Any]:
        return journal.samples(first.step, run=side.run, mode=first.mode, tokenizer=tokenizer, session=session)

    if side.session is not None:
        return read(side.session)
    sessions = list(dict.fromkeys(_call_session(journal, seq) for seq in seqs if seq is not None))
    for session in sessions[:-1]:
        try:
            return read(session)
        except StepJournalError:  # that session journaled no generate call with an output at the step
            continue
    return read(sessions[-1] if sessions else None)


def print_text(found: Optional[Dict[str, Any]], out: Console) -> None:
    """The two samples side by side: rewards, prompt, and the response with its first differing token marked."""
    from rich import box
    from rich.table import Table

    if found is None:
        out.print("text: no sample of the first differing step differs in its prompt, tokens or rewards")
        return
    for note in found.get("notes", ()):
        print_line(out, f"[yellow]{cell(note)}[/]")
    where = "" if found["token_offset"] is None else f" · first differing token at offset {found['token_offset']}"
    out.print(f"[bold]first differing sample: step {found['step']} · sample {found['sample']}[/]{where}")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, width=min(out.width, 160))
    table.add_column("", no_wrap=True)
    table.add_column("A", ratio=1, overflow="fold")
    table.add_column("B", ratio=1, overflow="fold")
    a, b = found["a"], found["b"]
    for stage in dict.fromkeys([*a["rewards"], *b["rewards"]]):
        table.add_row(cell(stage), _number(a["rewards"].get(stage)), _number(b["rewards"].get(stage)))
    table.add_row("prompt", *(cell(side["prompt"]) if side["prompt"] is not None
                              else f"ids {inline(side['prompt_ids'])}" for side in (a, b)))
    table.add_row("response", _marked(a["marked"]), _marked(b["marked"]))
    out.print(table)


def _marked(parts: Dict[str, str]) -> str:
    token = f"[reverse]{cell(parts['token'])}[/]" if parts["token"] else ""
    return f"{cell(parts['before'])}{token}{cell(parts['after'])}"


def _number(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.4g}"  # as the diff's table shows numbers
