"""``stepjournal diff A B --text``: at the first divergence, the first sample that differs, decoded on both sides.

The step is the report's first divergence. Its samples are read on each side (`Journal.samples`, with the
tokenizer the run's fingerprint names, or ``--tokenizer``); the first sample whose prompt, tokens or
rewards differ is shown side by side, the first differing token marked, the rewards beside the text.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from rich.console import Console

from stepjournal import DiffReport, Journal

from ._render import cell
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
    decode = lambda part: tokenizer.decode(list(part), skip_special_tokens=True)  # noqa: E731
    whole = decode(ids)
    if offset is None or offset >= len(ids):
        return {"before": whole, "token": "", "after": ""}
    before, through = decode(ids[:offset]), decode(ids[:offset + 1])
    if whole.startswith(through) and through.startswith(before):
        return {"before": before, "token": through[len(before):], "after": whole[len(through):]}
    return {"before": before, "token": tokenizer.decode([ids[offset]], skip_special_tokens=False),
            "after": decode(ids[offset + 1:])}


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
    # The samples are those of the session whose generate call was compared (a side's own session, or the one
    # that recorded the call): never a later replay's, nor rewards another session journaled.
    compared = next((p for p in report.pairs if (p.stage, p.mode, p.step, p.gen_index) == (
        "generate", first.mode, first.step, 0)), None)
    seqs = (compared.seq_a, compared.seq_b) if compared is not None else (None, None)
    for path, side, seq in zip((path_a, path_b), (report.a, report.b), seqs):
        with Journal(path, readonly=True) as journal:
            tokenizers.append(load_tokenizer(journal, side.run, tokenizer_path))
            session = side.session if side.session is not None or seq is None else journal.event(seq).session
            found.append(journal.samples(first.step, run=side.run, mode=first.mode, tokenizer=tokenizers[-1],
                                         session=session))
    for a, b in zip(*found):
        offset = _first_token(a.response_ids, b.response_ids)
        if offset is not None or a.rewards != b.rewards or a.prompt_ids != b.prompt_ids:
            sides = {}
            for label, sample, tokenizer in (("a", a, tokenizers[0]), ("b", b, tokenizers[1])):
                sides[label] = {**sample.to_json(), "marked": _split(tokenizer, sample.response_ids, offset)}
            return {"step": first.step, "sample": a.index, "token_offset": offset, **sides}
    return None


def print_text(found: Optional[Dict[str, Any]], out: Console) -> None:
    """The two samples side by side: rewards, prompt, and the response with its first differing token marked."""
    from rich import box
    from rich.table import Table

    if found is None:
        out.print("text: no sample of the first differing step differs in its prompt, tokens or rewards")
        return
    where = "" if found["token_offset"] is None else f" · first differing token at offset {found['token_offset']}"
    out.print(f"[bold]first differing sample: step {found['step']} · sample {found['sample']}[/]{where}")
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, width=min(out.width, 160))
    table.add_column("", no_wrap=True)
    table.add_column("A", ratio=1, overflow="fold")
    table.add_column("B", ratio=1, overflow="fold")
    a, b = found["a"], found["b"]
    for stage in dict.fromkeys([*a["rewards"], *b["rewards"]]):
        table.add_row(cell(stage), _number(a["rewards"].get(stage)), _number(b["rewards"].get(stage)))
    table.add_row("prompt", cell(a["prompt"]), cell(b["prompt"]))
    table.add_row("response", _marked(a["marked"]), _marked(b["marked"]))
    out.print(table)


def _marked(parts: Dict[str, str]) -> str:
    token = f"[reverse]{cell(parts['token'])}[/]" if parts["token"] else ""
    return f"{cell(parts['before'])}{token}{cell(parts['after'])}"


def _number(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:g}"
