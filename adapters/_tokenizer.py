"""The run's tokenizer, kept in the journal and read back as data (docs/journal.md, "The run's tokenizer").

On disk it is an ordinary recorded call, so that every tool that keeps, copies, checks or prunes payloads
(push, pull, bundles, ``verify``, ``compact``, retention) keeps the tokenizer with the calls it decodes: a
`GenerationRecorded` of the stage and mode ``tokenizer`` (`TOKENIZER_STAGE`; its own mode, so that the views of
the ``train`` mode's steps, such as ``report``, never take it for a step), step 0, call #0, whose
output payload is the tokenizer document, a dict of strings::

    {"format": "stepjournal.tokenizer", "version": 1,
     "tokenizer_json": <the tokenizers library's tokenizer.json, as text>,
     "special_tokens": {"eos_token": "<|im_end|>", "pad_token": ..., "additional_special_tokens": [...]},
     "chat_template": <the Jinja text, or None>}

The payload is content-addressed: a run holds one record per distinct document (`record_tokenizer` writes
none when the run already holds the same one). It is read back with the ``tokenizers`` library's
`Tokenizer.from_str`, which parses JSON and runs nothing: no ``transformers`` auto class, no remote code, no
pickle. A document that is not of this form, or larger than `MAX_DOCUMENT_BYTES`, is refused with
`TokenizerDocumentError`, in one line.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

from stepjournal import Journal
from stepjournal.errors import StepJournalError
from stepjournal.events import GenerationRecorded

__all__ = [
    "TOKENIZER_STAGE",
    "MAX_DOCUMENT_BYTES",
    "TokenizerDocumentError",
    "StoredTokenizer",
    "tokenizer_document",
    "record_tokenizer",
    "journal_tokenizer",
    "recorded_tokenizer",
]

TOKENIZER_STAGE = "tokenizer"
FORMAT = "stepjournal.tokenizer"
VERSION = 1
# Gemma 3's tokenizer.json, among the largest in use, is about 33 MB; a document past this is not a tokenizer.
MAX_DOCUMENT_BYTES = 64 << 20
_KEYS = frozenset({"format", "version", "tokenizer_json", "special_tokens", "chat_template"})
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_MAX_SPECIAL = 100_000


class TokenizerDocumentError(StepJournalError):
    """The journal's tokenizer document is not one `record_tokenizer` writes (damaged, hostile or of a newer
    version): it is refused, never loaded. Read the journal with ``--tokenizer PATH`` instead."""


def _backend(tokenizer: Any) -> Tuple[Any, Any]:
    """(the ``tokenizers.Tokenizer`` behind `tokenizer`, the object holding its special tokens), or (None, None):
    a multimodal processor holds its tokenizer; a ``transformers`` fast tokenizer holds a backend; a slow one
    (pure Python, no tokenizer.json) has none."""
    held = getattr(tokenizer, "tokenizer", None)
    if held is not None and held is not tokenizer:
        tokenizer = held
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and callable(getattr(backend, "to_str", None)):
        return backend, tokenizer
    if callable(getattr(tokenizer, "to_str", None)):  # a `tokenizers.Tokenizer` itself
        return tokenizer, None
    return None, None


def _special_tokens(holder: Any) -> Dict[str, Any]:
    found: Dict[str, Any] = {}
    mapping = getattr(holder, "special_tokens_map", None)
    if isinstance(mapping, Mapping):
        for key, value in mapping.items():
            if isinstance(key, str) and isinstance(value, str):
                found[key] = value
            elif isinstance(key, str) and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                found[key] = list(value)
    # transformers 5 keeps the added special tokens apart from the map (``extra_special_tokens``), 4 in it
    for name in ("extra_special_tokens", "additional_special_tokens"):
        extra = getattr(holder, name, None)
        if isinstance(extra, (list, tuple)) and extra and all(isinstance(v, str) for v in extra):
            found.setdefault("additional_special_tokens", list(extra))
    return found


def tokenizer_document(tokenizer: Any, chat_template: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The document `record_tokenizer` stores for `tokenizer`, or None when it has no ``tokenizer.json`` form.

    Args:
        tokenizer: a ``transformers`` fast tokenizer (``PreTrainedTokenizerFast``), a processor holding one
            (``processor.tokenizer``), or a ``tokenizers.Tokenizer``.
        chat_template: the chat template; default: the tokenizer's (or processor's) own.
    """
    backend, holder = _backend(tokenizer)
    if backend is None:
        return None
    if chat_template is None:
        for source in (tokenizer, holder):
            template = getattr(source, "chat_template", None)
            if isinstance(template, str) and template:
                chat_template = template
                break
    return {
        "format": FORMAT,
        "version": VERSION,
        "tokenizer_json": backend.to_str(),
        "special_tokens": _special_tokens(holder),
        "chat_template": chat_template,
    }


def _latest(journal: Journal, run: str) -> Optional[Tuple[int, GenerationRecorded]]:
    """(seq, event) of the run's latest tokenizer record with a stored document (the step index: no log scan)."""
    found = journal.lookup(0, 0, mode=TOKENIZER_STAGE, run=run, stage=TOKENIZER_STAGE)
    if found is None or not isinstance(found.event, GenerationRecorded) or found.event.output is None:
        return None
    return found.seq, found.event


def record_tokenizer(journal: Journal, tokenizer: Any, *, chat_template: Optional[str] = None) -> Optional[int]:
    """Keep `tokenizer` in the journal, for the run `journal` records: ``show --text``, ``diff --text`` and
    ``report`` then decode with it, with no flag (docs/reading.md).

    Stored once: nothing is written when the run already holds the same document. The TRL and verl adapters
    call it when they attach; call it yourself in a loop of your own (``journaled``), once, after opening the
    journal.

    Args:
        journal: an open, writable `Journal`.
        tokenizer: a ``transformers`` fast tokenizer, a processor holding one, or a ``tokenizers.Tokenizer``.
        chat_template: the chat template to keep; default: the tokenizer's own.

    Returns:
        The record's event number, or None when nothing was written (already held, or `tokenizer` is a slow
        tokenizer with no ``tokenizer.json`` form: then pass ``--tokenizer PATH`` when reading).
    """
    document = tokenizer_document(tokenizer, chat_template)
    if document is None:
        return None
    prepared = journal.prepare(document)
    held = _latest(journal, journal.run)
    if held is not None and held[1].output is not None and held[1].output.digest == prepared.digest:
        return None
    recorded = journal.record(0, prepared, mode=TOKENIZER_STAGE, stage=TOKENIZER_STAGE, policy="tokenizer",
                              reason="the run's tokenizer, kept to decode its token ids")
    return recorded.seq


class StoredTokenizer:
    """A tokenizer read back from a journal: decodes token ids, as `Journal.samples` asks.

    Attributes:
        special_tokens: the recorded special tokens (``eos_token``, ``pad_token`` ...).
        chat_template: the recorded chat template, or None.
        eos_token_id, pad_token_id: the ids of those special tokens, or None.
        digest: the stored document's digest.
    """

    def __init__(self, backend: Any, special_tokens: Mapping[str, Any], chat_template: Optional[str],
                 digest: str) -> None:
        self.backend = backend
        self.special_tokens = dict(special_tokens)
        self.chat_template = chat_template
        self.digest = digest
        self.eos_token_id = self._id("eos_token")
        self.pad_token_id = self._id("pad_token")

    def _id(self, name: str) -> Optional[int]:
        token = self.special_tokens.get(name)
        return self.backend.token_to_id(token) if isinstance(token, str) else None

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        """The text of `ids` (a list of ints)."""
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def __repr__(self) -> str:
        return f"StoredTokenizer(digest={self.digest[:12]}…, vocab={self.backend.get_vocab_size()})"


def _refuse(seq: int, why: str) -> TokenizerDocumentError:
    return TokenizerDocumentError(f"the tokenizer recorded at event #{seq} is refused: {why}")


def _checked(document: Any, seq: int) -> Dict[str, Any]:
    """`document` when it is of `record_tokenizer`'s form, else `TokenizerDocumentError` naming what is wrong."""
    if not isinstance(document, dict):
        raise _refuse(seq, f"it is a {type(document).__name__}, not a dict of strings")
    if document.get("format") != FORMAT:
        raise _refuse(seq, f"its format is not {FORMAT!r}")
    if document.get("version") != VERSION:
        raise _refuse(seq, f"its version {str(document.get('version'))[:20]} is not {VERSION} (written by a newer "
                           "stepjournal? upgrade)")
    extra = set(document) - _KEYS
    if extra:
        raise _refuse(seq, f"it holds unknown keys ({', '.join(sorted(map(str, extra)))[:80]})")
    if not isinstance(document.get("tokenizer_json"), str):
        raise _refuse(seq, "its tokenizer_json is not text")
    if not isinstance(document.get("chat_template"), (str, type(None))):
        raise _refuse(seq, "its chat_template is neither text nor None")
    special = document.get("special_tokens")
    if not isinstance(special, dict) or len(special) > _MAX_SPECIAL or not all(
        isinstance(k, str) and (isinstance(v, str) or isinstance(v, list) and all(isinstance(t, str) for t in v))
        for k, v in special.items()
    ):
        raise _refuse(seq, "its special_tokens is not a map of names to tokens")
    return document


def _load(journal: Journal, seq: int, event: GenerationRecorded, load: Any = None) -> StoredTokenizer:
    ref = event.output
    assert ref is not None  # `_latest` keeps stored documents only
    if ref.nbytes > MAX_DOCUMENT_BYTES:
        raise _refuse(seq, f"it takes {ref.nbytes} bytes, more than the {MAX_DOCUMENT_BYTES} a tokenizer takes")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TokenizerDocumentError("decoding the journal's tokenizer needs the tokenizers library: "
                                     "pip install tokenizers") from None
    try:
        document = _checked((load or journal.load)(ref, step=0), seq)
    except StepJournalError as exc:
        if isinstance(exc, TokenizerDocumentError):
            raise
        raise _refuse(seq, str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    try:
        backend = Tokenizer.from_str(document["tokenizer_json"])  # JSON parsed in Rust: data, never code
    except Exception as exc:  # the library raises its own Exception subclass for any malformed document
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise _refuse(seq, f"the tokenizers library cannot read it ({first})") from None
    return StoredTokenizer(backend, document["special_tokens"], document["chat_template"], ref.digest)


def recorded_tokenizer(journal: Journal, run: str) -> Optional[Tuple[int, Any]]:
    """(seq, event) of the tokenizer record that decodes `run`'s calls (its latest), or None when it kept none."""
    return _latest(journal, run)


def journal_tokenizer(journal: Journal, run: str, *, load: Any = None) -> Optional[StoredTokenizer]:
    """The tokenizer `run` kept in the journal (`record_tokenizer`), loaded as data; None when it kept none.

    Args:
        journal: an open `Journal` (read-only is enough).
        run: the run key.
        load: how the document's payload is loaded, ``load(ref, step=...)`` (default `Journal.load`).

    Raises:
        TokenizerDocumentError: the document is refused (not of `record_tokenizer`'s form, too large, not a
            tokenizer the ``tokenizers`` library reads), or that library is not installed.
    """
    found = _latest(journal, run)
    return None if found is None else _load(journal, *found, load)
