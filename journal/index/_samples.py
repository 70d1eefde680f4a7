"""`samples`: the samples of one generate call, as token ids (and text, given the run's tokenizer), side by
side with the rewards and log-probs the run's other stages journaled at that step.

Nothing here writes, and neither torch nor a tokenizer library is imported (a tensor is known by torch being
imported already, by the decode that made it): a caller that wants text passes a tokenizer
(anything with ``decode(ids, skip_special_tokens=...)``; ``eos_token_id`` and ``pad_token_id`` are read when
present). The forms read, by key of the call's output (and of its stored input for the prompts):

- TRL's: ``completion_ids`` (one list of ids per sample), the prompts as ``prompt_ids`` in the stored input;
- verl's batch (a ``DataProto``'s ``batch``, or a plain dict of the same keys): ``responses`` and ``prompts``
  (2-D, padded), ``attention_mask`` over prompt and response, and ``response_mask`` when present; and
  verl V1's ``TQBatch`` (its ``fields``), whose ``prompts`` and ``responses`` are jagged nested tensors,
  one row per sample without padding;
- a plain dict: ``response_ids`` / ``prompt_ids`` (lists of ids, or 2-D tensors padded with the
  tokenizer's ``pad_token_id``).

Rewards come from each stage named ``reward`` or ``reward.<name>`` at the same step (``rewards``, one
number per sample; ``token_level_scores`` / ``token_level_rewards`` / a reward model's ``rm_scores``, summed
over the response), log-probs from ``old_log_prob`` (``old_log_probs``, or TRL's ``outputs[0]``), as a mean
over the response's tokens. A stage output may hold them itself, in a ``DataProto``'s ``batch``, or, as verl
V1's stages record them, in the ``fields`` of a ``{"fields": TQBatch, "metrics": ...}`` dict. They are the
ones the session that made the call shown journaled: a replay session's own, never its recording's (none
when that session stored none).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ..base._errors import JournalError
from ..events._events import CALL_EVENT_TYPES, GenerationRecorded, ReplayServed

__all__ = ["Sample", "samples", "samples_of_steps"]

# How a payload is loaded: ``load(ref, step=...)``, `Journal.load` unless a reader passes its own.
Load = Callable[..., Any]


def _tensor(value: Any) -> bool:
    """`value` is a torch tensor: known without importing torch (values decoded without it hold none)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _torch_dtype(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.dtype)

_RESPONSE_KEYS = ("completion_ids", "response_ids", "responses")
_PROMPT_KEYS = ("prompt_ids", "prompts")
_REWARD_KEYS = ("rewards", "token_level_scores", "token_level_rewards", "rm_scores", "reward")
_LOGPROB_STAGE = "old_log_prob"
_MODEL_MASK_KEYS = ("tool_mask", "env_mask")  # TRL's: 1 for the model's tokens, 0 for a tool's; verl's is response_mask


@attrs.frozen
class Sample:
    """One sample of a generate call.

    Attributes:
        step, index: the call's step and this sample's place in its batch.
        prompt_ids, response_ids: the tokens, padding left out as the trainer masks it.
        prompt, response: the decoded text (None without a tokenizer).
        truncated: the response ends without the end-of-sequence token (None when it is not known).
        rewards: per reward stage (``reward``, ``reward.length`` ...), this sample's reward.
        logprob_mean: the mean of the response's per-token log-probs (``old_log_prob``), or None.
        action: ``"generated"`` or ``"replayed"``.
        source_run, source_step, source_gen_index: for a replayed call, the recorded call it served.
        session: the session that made the call shown (its rewards and log-probs are that session's too).
        turns: a multi-turn response's model-written parts, in order, one per assistant turn: where the output
            marks the tokens a tool wrote (verl's ``response_mask``, TRL's ``tool_mask`` or ``env_mask``: 1 for
            the model's tokens, 0 for a tool's), the runs of the model's tokens between them; else empty.
            Where each turn is a generate call of its own (TRL's tool loop: the step's later calls continue the
            conversations of the first), each call's response ids for this sample: see `turn_events`.
        turn_texts: `turns` decoded (empty without a tokenizer).
        turn_events: where each turn is a generate call of its own, the seq of each turn's call event (the tool
            calls journaled after it, before the next, are the ones that turn made); empty when the turns are the
            runs of one response.
    """

    step: int
    index: int
    prompt_ids: Tuple[int, ...]
    response_ids: Tuple[int, ...]
    prompt: Optional[str] = None
    response: Optional[str] = None
    truncated: Optional[bool] = None
    rewards: Mapping[str, float] = attrs.field(factory=dict)
    logprob_mean: Optional[float] = None
    action: str = "generated"
    source_run: Optional[str] = None
    source_step: Optional[int] = None
    source_gen_index: Optional[int] = None
    session: Optional[str] = None
    turns: Tuple[Tuple[int, ...], ...] = ()
    turn_texts: Tuple[str, ...] = ()
    turn_events: Tuple[int, ...] = ()

    @property
    def response_length(self) -> int:
        return len(self.response_ids)

    def to_json(self) -> Dict[str, Any]:
        row = attrs.asdict(self)
        row["prompt_ids"], row["response_ids"] = list(self.prompt_ids), list(self.response_ids)
        row["turns"], row["turn_texts"] = [list(t) for t in self.turns], list(self.turn_texts)
        row["turn_events"] = list(self.turn_events)
        row["response_length"] = self.response_length
        # JSON holds no infinity: a reward of ±inf (a crafted or overflowed one) is null, as the report shows it
        row["rewards"] = {k: v if math.isfinite(v) else None for k, v in self.rewards.items()}
        return row


def _holders(value: Any) -> List[Any]:
    """Where a payload keeps its named fields: itself, a ``DataProto``'s ``batch``, a ``TQBatch``'s ``fields``,
    and the same one level down under a ``"fields"`` entry (verl V1's stage outputs: ``{"fields": TQBatch, ...}``)."""
    outer = [value]
    if isinstance(value, Mapping) and value.get("fields") is not None:
        outer.append(value["fields"])
    found = [h for o in outer for h in (o, getattr(o, "batch", None), getattr(o, "fields", None))]
    return [h for h in found if h is not None]


def _field(value: Any, keys: Sequence[str]) -> Any:
    """The first of `keys` a payload holds (see `_holders`), else None."""
    for holder in _holders(value):
        for key in keys:
            try:
                found = holder[key] if isinstance(holder, Mapping) or hasattr(holder, "keys") else None
            except (KeyError, TypeError):
                found = None
            if found is not None:
                return found
    return None


def _rows(ids: Any, mask: Any = None, pad: Optional[int] = None) -> List[Tuple[int, ...]]:
    """Token ids per sample: a list of lists as it is; a 2-D tensor or array by its mask (1 keeps), or with
    trailing (responses) or leading (prompts) `pad` ids left out when there is no mask."""
    if isinstance(ids, (list, tuple)):
        return [_listed(row) for row in ids]
    if _tensor(ids) and ids.is_nested:  # jagged: each row its own length, no padding
        if ids.dtype.is_floating_point or ids.dtype.is_complex:
            raise JournalError(f"token ids of type {ids.dtype}: expected integers")
        return [tuple(row.tolist()) for row in ids.unbind()]
    array = ids.detach().cpu().numpy() if _tensor(ids) else np.asarray(ids)
    if array.ndim != 2:
        raise JournalError(f"token ids of shape {list(array.shape)}: expected one row per sample (2-D)")
    if array.dtype.kind not in "iub":
        raise JournalError(f"token ids of type {array.dtype}: expected integers")
    if mask is not None:
        keep = (mask.detach().cpu().numpy() if _tensor(mask) else np.asarray(mask)).astype(bool)
        if keep.shape != array.shape:
            raise JournalError(f"a mask of shape {list(keep.shape)} over token ids of shape {list(array.shape)}: "
                               "expected one mask value per token")
        return [tuple(row[k].tolist()) for row, k in zip(array, keep)]
    rows = array.tolist()  # Python ints, row by row, in one C pass
    if pad is not None:
        rows = [_strip(row, pad) for row in rows]
    return [tuple(row) for row in rows]


def _listed(row: Any) -> Tuple[int, ...]:
    """One sample's ids given as a list: integers only (never text parsed as a number)."""
    if not isinstance(row, (list, tuple)) or not all(isinstance(t, (int, np.integer)) for t in row):
        raise JournalError(f"token ids given as {type(row).__name__} {_preview(row)}: expected a list of integers "
                           "per sample")
    return tuple(int(t) for t in row)


def _preview(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:60] + "..."


def _numbers(value: Any, what: str) -> np.ndarray:
    """`value` as an array of floats, or a one-line error naming what it holds instead."""
    _real(value, what)
    try:
        return value.detach().float().cpu().numpy() if _tensor(value) else np.asarray(value, dtype=float)
    except (TypeError, ValueError, OverflowError):
        raise JournalError(f"{what} given as {type(value).__name__} {_preview(value)}: expected numbers") from None


def _real(value: Any, what: str) -> None:
    """Refuse complex numbers: a cast to float would show only their real part (and warn on stderr)."""
    dtype: Any = getattr(value, "dtype", None)  # a torch or numpy dtype, or anything a crafted payload holds
    try:
        complex_ = dtype.is_complex if _torch_dtype(dtype) else dtype is not None and np.dtype(dtype).kind == "c"
    except TypeError:  # a dtype numpy does not know: the cast below names it
        complex_ = False
    if complex_:
        raise JournalError(f"{what} given as {type(value).__name__} {_preview(value)}: expected real numbers")


def _decode(tokenizer: Any, ids: Sequence[int], step: int, index: int) -> str:
    try:
        return tokenizer.decode(list(ids), skip_special_tokens=True)
    except (OverflowError, ValueError, TypeError, IndexError) as exc:  # ids outside the vocabulary (-1, 2**40)
        raise JournalError(f"sample {index} at step {step} holds token ids the tokenizer cannot decode "
                           f"(from {min(ids)} to {max(ids)}): {exc}") from None


def _strip(row: List[int], pad: int) -> List[int]:
    start, end = 0, len(row)
    while start < end and row[start] == pad:
        start += 1
    while end > start and row[end - 1] == pad:
        end -= 1
    return row[start:end]


def _masks(output: Any, prompts: Any, responses: Any) -> Tuple[Any, Any]:
    """(prompt mask, response mask) of verl's padded batch: ``attention_mask`` spans prompt then response.
    Jagged rows carry no padding: no mask."""
    if any(_tensor(t) and t.is_nested for t in (prompts, responses)):
        return None, None
    response_mask = _field(output, ("response_mask",))
    attention = _field(output, ("attention_mask",))
    prompt_mask = None
    if attention is not None and getattr(attention, "ndim", None) != 2:
        raise JournalError(f"attention_mask of shape {list(getattr(attention, 'shape', ()))}: expected one row per "
                           "sample (2-D)")
    if attention is not None and prompts is not None and hasattr(prompts, "shape"):
        prompt_mask = attention[:, : prompts.shape[-1]]
        if response_mask is None and hasattr(responses, "shape"):
            response_mask = attention[:, prompts.shape[-1]:]
    return prompt_mask, response_mask


def _as_rows(value: Any) -> List[List[int]]:
    """A per-token value as one list per sample: lists as they are, a jagged tensor row by row, a 2-D one whole."""
    if isinstance(value, (list, tuple)):
        return [[int(v) for v in row] for row in value]
    if _tensor(value):
        return [row.tolist() for row in value.unbind()] if value.is_nested else value.tolist()
    return np.asarray(value).tolist()


def _turn_rows(output: Any, prompts: Any, responses: Any) -> Optional[List[Tuple[Tuple[int, ...], ...]]]:
    """Each sample's turns (`Sample.turns`): the runs of the model's tokens of its response, where the output
    marks a tool's tokens (0 among 1s) in a mask beside the ids; None when it marks none (a single-turn response,
    or a form without such a mask). A padded batch's padding (``attention_mask`` 0) is no turn's."""
    mask = _field(output, _MODEL_MASK_KEYS)
    padded = None
    if mask is None:
        mask = _field(output, ("response_mask",))
        attention = _field(output, ("attention_mask",))
        if mask is not None and attention is not None and hasattr(prompts, "shape") and not (
                _tensor(attention) and attention.is_nested):
            padded = _as_rows(attention[:, prompts.shape[-1]:])
    if mask is None:
        return None
    ids, marks = _as_rows(responses), _as_rows(mask)
    if len(ids) != len(marks) or any(len(a) != len(b) for a, b in zip(ids, marks)):
        return None  # not one mark per token: nothing to split by
    if padded is not None and (len(padded) != len(ids) or any(len(a) != len(b) for a, b in zip(ids, padded))):
        return None
    turns, tool_written = [], False
    for i, (row, marked) in enumerate(zip(ids, marks)):
        keep = padded[i] if padded is not None else [1] * len(row)
        runs: List[List[int]] = []
        inside = False
        for token, model, real in zip(row, marked, keep):
            if not real:
                continue
            if model and not inside:
                runs.append([])
            if model:
                runs[-1].append(int(token))
            tool_written = tool_written or not model
            inside = bool(model)
        turns.append(tuple(tuple(r) for r in runs))
    return turns if tool_written else None  # no tool wrote a token anywhere: single-turn responses


def _per_sample(value: Any, lengths: Sequence[int]) -> Optional[List[float]]:
    """One number per sample: a 1-D value as it is, a 2-D one summed over each response's tokens."""
    if value is None:
        return None
    if _tensor(value) and value.is_nested:
        _real(value, "rewards")
        rows = [row.detach().float().sum().item() for row in value.unbind()]
        return rows if len(rows) == len(lengths) else None
    array = _numbers(value, "rewards")
    if array.ndim == 1 and len(array) == len(lengths):
        return [float(v) for v in array]
    if array.ndim == 2 and len(array) == len(lengths):
        with np.errstate(over="ignore", invalid="ignore"):  # a sum past the float range is inf, said as such
            return [float(row[:n].sum()) for row, n in zip(array, lengths)]
    return None


def _mean_logprob(value: Any, lengths: Sequence[int]) -> Optional[List[Optional[float]]]:
    logps = _field(value, ("old_log_probs",))
    outputs = value.get("outputs") if isinstance(value, Mapping) else None
    if logps is None and isinstance(outputs, (list, tuple)) and outputs:
        logps = outputs[0]  # TRL: (per-token log-probs, entropies ...)
    if logps is None and _tensor(value):
        logps = value
    if _tensor(logps) and logps.is_nested:
        _real(logps, "log-probs")
        rows = [row.detach().float() for row in logps.unbind()]
        return [float(r.mean()) if r.numel() else None for r in rows] if len(rows) == len(lengths) else None
    if not (_tensor(logps) or isinstance(logps, np.ndarray)) or logps.ndim != 2 or len(logps) != len(lengths):
        return None
    array = _numbers(logps, "log-probs")
    with np.errstate(over="ignore", invalid="ignore"):
        return [float(row[:n].mean()) if n else None for row, n in zip(array, lengths)]


# (step, session, stage) -> (seq, event) of that session's latest call of a side stage (reward, log-probs).
_SideCalls = Dict[Tuple[int, str, str], Tuple[int, Any]]
# (step, session) -> (seq, event) of each of that session's generate calls after the one shown, in log order.
_LaterCalls = Dict[Tuple[int, str], List[Tuple[int, Any]]]


def _served(journal: Any, run: str, mode: str, steps: Any, gen_index: int, side_stages: Sequence[str],
            session: Optional[str] = None) -> Tuple[Dict[int, Tuple[int, Any]], _SideCalls, _LaterCalls]:
    """One read of the log: step -> (seq, event) of the latest generate call with an output at each of `steps`
    (of `session` only, when given), each session's latest call of each side stage there, and each session's
    generate calls with an output and a later index (the later turns of a tool loop that generates per turn)."""
    latest: Dict[int, Tuple[int, Any]] = {}
    side: _SideCalls = {}
    later: _LaterCalls = {}
    for seq, event in journal.events(run=run, steps=steps, types=CALL_EVENT_TYPES):
        if event.mode != mode or event.gen_index < gen_index:
            continue
        if event.stage in side_stages and event.gen_index == gen_index:
            side[(event.step, event.session, event.stage)] = (seq, event)
        elif (event.stage == "generate" and isinstance(event, (GenerationRecorded, ReplayServed))
              and event.output is not None and session in (None, event.session)):
            if event.gen_index == gen_index:
                latest[event.step] = (seq, event)
            else:
                later.setdefault((event.step, event.session), []).append((seq, event))
    return latest, side, later


def _source(journal: Any, seq: int, event: Any) -> Tuple[Any, Optional[Any]]:
    """A replay as read here, and the record it served (None for a record)."""
    if not isinstance(event, ReplayServed):
        return event, None
    event = journal.as_read_here(seq, event)  # a pulled replay names its record by the seq it had there
    found = journal.event(event.source_seq) if event.source_seq <= journal.last_seq() else None  # one read
    return event, found if isinstance(found, GenerationRecorded) else None


def _the_run(journal: Any) -> str:
    """The journal's run key when it has calls, else its only run with calls."""
    runs = [s.run for s in journal.run_summaries() if s.calls]
    if journal.run in runs or not runs:
        return journal.run
    if len(runs) > 1:
        raise JournalError(f"journal {journal.path} holds several runs ({', '.join(runs)}); choose one with run=")
    return runs[0]


def samples(journal: Any, step: int, *, run: Optional[str] = None, mode: str = "train", gen_index: int = 0,
            tokenizer: Any = None, decoded: Optional[int] = None, session: Optional[str] = None,
            load: Optional[Load] = None) -> List[Sample]:
    """The samples of the generate call served at `step` (its latest call: recorded, or replayed from
    another step), with the rewards and mean log-probs of the run's stages at that step.

    Args:
        journal: an open `Journal` (read-only is enough).
        run, mode, gen_index: which call (default: the journal's run, or its only run with calls; ``"train"``;
            call 0).
        tokenizer: decodes the ids into ``prompt`` and ``response`` (special tokens left out); None: ids only.
        decoded: decode only the first `decoded` samples (the rest keep ids, rewards and lengths, with no
            text); None: all of them.
        session: only this session's calls (its id): the call it recorded or replayed there; None: the
            latest call of any session.
        load: how a payload is loaded, ``load(ref, step=...)`` (default `journal.load`); ``show --text``
            reads plain payloads without torch.

    Raises:
        JournalError: no generate call with an output there, or its payload holds no response ids in a
            form above.
    """
    run = run or _the_run(journal)
    stages = _side_stages(journal, run)
    served, side, later = _served(journal, run, mode, {step}, gen_index, stages, session)
    if step not in served:
        of = "" if session is None else f" of session {session}"
        raise JournalError(f"run {run!r} has no {mode} generate call #{gen_index} with an output at step {step}{of}")
    return _read(journal, step, *served[step], stages, side, later, tokenizer, decoded, load or journal.load)


def samples_of_steps(journal: Any, steps: Any = None, *, run: Optional[str] = None, mode: str = "train",
                     gen_index: int = 0, tokenizer: Any = None,
                     decoded: Optional[int] = None,
                     session: Optional[str] = None) -> Iterator[Tuple[int, List[Sample]]]:
    """(step, its samples) for every step of `steps` (None: all) with a generate call (of `session` only, when
    given), in step order: as `samples` for each, the log read once. One step's samples are in memory at a time."""
    run = run or _the_run(journal)
    stages = _side_stages(journal, run)
    served, side, later = _served(journal, run, mode, steps, gen_index, stages, session)
    for step in sorted(served):
        yield step, _read(journal, step, *served[step], stages, side, later, tokenizer, decoded, journal.load)


def _finite(value: Optional[float]) -> Optional[float]:
    return value if value is not None and math.isfinite(value) else None


def _side_stages(journal: Any, run: str) -> List[str]:
    return [s for s in journal.stages(run=run) if s == "reward" or s.startswith("reward.") or s == _LOGPROB_STAGE]


def _side_output(load: Load, side: _SideCalls, step: int, session: str, stage: str) -> Any:
    """What `session` journaled for `stage` at `step`: its recorded or replayed output; None when it journaled
    none there, or stored none (a reward computed live and not stored is not shown as another session's)."""
    _, event = side.get((step, session, stage), (None, None))
    if not isinstance(event, (GenerationRecorded, ReplayServed)) or event.output is None:
        return None
    return load(event.output, step=step)


def _read(journal: Any, step: int, seq: int, event: Any, side_stages: Sequence[str], side: _SideCalls,
          later: _LaterCalls, tokenizer: Any, decoded: Optional[int], load: Load) -> List[Sample]:
    session = event.session
    first_seq = seq
    event, source = _source(journal, seq, event)
    output = load(event.output, step=step)
    responses = _field(output, _RESPONSE_KEYS)
    if responses is None:
        raise JournalError(
            f"the generate output at step {step} (event #{seq}) holds none of {', '.join(_RESPONSE_KEYS)}: "
            "no samples to read (docs/reading.md lists the forms read)")
    prompts = _field(output, _PROMPT_KEYS)
    recorded = source if source is not None else event
    if prompts is None and recorded.input is not None:
        prompts = _field(load(recorded.input, step=recorded.step), _PROMPT_KEYS)
    pad = getattr(tokenizer, "pad_token_id", None)
    prompt_mask, response_mask = _masks(output, prompts, responses)
    response_rows = _rows(responses, response_mask, pad)
    prompt_rows = _rows(prompts, prompt_mask, pad) if prompts is not None else [()] * len(response_rows)
    lengths = [len(r) for r in response_rows]
    turn_rows = _turn_rows(output, prompts, responses)
    turn_seqs: Optional[List[Tuple[int, ...]]] = None
    if turn_rows is None and prompts is not None and isinstance(responses, (list, tuple)):
        calls = [(s, e) for s, e in later.get((step, session), []) if s > first_seq]
        chained = _chained_turns(journal, load, step, first_seq, prompt_rows, response_rows, calls)
        if chained is not None:
            turn_rows, turn_seqs = chained
    rewards: Dict[str, List[float]] = {}
    logprobs: Optional[List[Optional[float]]] = None
    for stage in side_stages:
        value = _side_output(load, side, step, session, stage)
        if value is None:
            continue
        if stage == _LOGPROB_STAGE:
            logprobs = _mean_logprob(value, lengths)
        else:
            held = _field(value, _REWARD_KEYS)
            per = _per_sample(value if held is None else held, lengths)
            if per is not None:
                rewards[stage] = per
    eos = getattr(tokenizer, "eos_token_id", None)
    replayed = isinstance(event, ReplayServed)
    out = []
    for i, (prompt_ids, response_ids) in enumerate(zip(prompt_rows, response_rows)):
        text = tokenizer is not None and (decoded is None or i < decoded)
        out.append(Sample(
            step=step, index=i, prompt_ids=prompt_ids, response_ids=response_ids,
            prompt=_decode(tokenizer, prompt_ids, step, i) if text else None,
            response=_decode(tokenizer, response_ids, step, i) if text else None,
            truncated=None if eos is None else eos not in response_ids,
            rewards={stage: values[i] for stage, values in rewards.items()},
            logprob_mean=_finite(None if logprobs is None else logprobs[i]),
            action="replayed" if replayed else "generated",
            source_run=event.source_run if replayed else None,
            source_step=event.source_step if replayed else None,
            source_gen_index=event.source_gen_index if replayed else None,
            session=session,
            turns=turn_rows[i] if turn_rows is not None else (),
            turn_texts=tuple(_decode(tokenizer, t, step, i) for t in turn_rows[i])
            if text and turn_rows is not None else (),
            turn_events=turn_seqs[i] if turn_seqs is not None else (),
        ))
    return out


def _chained_turns(journal: Any, load: Load, step: int, first_seq: int, prompt_rows: Sequence[Tuple[int, ...]],
                   response_rows: Sequence[Tuple[int, ...]], calls: Sequence[Tuple[int, Any]],
                   ) -> Optional[Tuple[List[Tuple[Tuple[int, ...], ...]], List[Tuple[int, ...]]]]:
    """Each sample's turns where each turn is a generate call of its own (TRL's tool loop): the first call's
    response, then the response of each later call (in log order, one per index) whose prompt ids begin with the
    sample's conversation so far (its prompt, its responses and the tool text between them). A later call's rows
    are the samples that go on, in the batch's order: each row is the earliest sample after the previous row's
    that it continues. Returns (turns, each turn's call event seq) per sample; None when no later call continues
    any sample (a single-turn step, or calls of another form)."""
    history = [list(p) + list(r) for p, r in zip(prompt_rows, response_rows)]
    turns: List[List[Tuple[int, ...]]] = [[r] for r in response_rows]
    seqs: List[List[int]] = [[first_seq] for _ in response_rows]
    seen = set()
    for seq, event in calls:
        if event.gen_index in seen:  # a call made again by the same session: the first one goes on from here
            continue
        seen.add(event.gen_index)
        event, source = _source(journal, seq, event)
        recorded = source if source is not None else event
        output = load(event.output, step=step)
        responses = _field(output, _RESPONSE_KEYS)
        prompts = _field(output, _PROMPT_KEYS)
        if prompts is None and recorded.input is not None:
            prompts = _field(load(recorded.input, step=recorded.step), _PROMPT_KEYS)
        if not isinstance(responses, (list, tuple)) or not isinstance(prompts, (list, tuple)):
            break
        start = 0
        for prompt, response in zip(_rows(prompts), _rows(responses)):
            sample = next((i for i in range(start, len(history))
                           if len(prompt) >= len(history[i]) and list(prompt[:len(history[i])]) == history[i]), None)
            if sample is None:
                continue
            history[sample] = list(prompt) + list(response)
            turns[sample].append(response)
            seqs[sample].append(seq)
            start = sample + 1
    if all(len(t) == 1 for t in turns):
        return None
    return [tuple(t) for t in turns], [tuple(s) for s in seqs]
