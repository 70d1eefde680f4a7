"""The vectorised screen (journal/storage/_lmdb_screen.py) never passes what the node-by-node walk refuses.

`check_data_file(screen=False)` walks every tree node by node: the reference. With the screen on, a
sound file must give the same figures, and a damaged one the same refusal, word for word. Files are
damaged here at random, seeded, in the places a walk reads: page headers, node pointers, node
headers and keys, and anywhere on a page.
"""

from __future__ import annotations

import os
import random
import shutil
import sys

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import IntegrityError
from stepjournal.storage._lmdb_check import check_data_file  # private: the LMDB file checks under test


def _outcome(path: str, screen: bool):
    try:
        return ("passed", check_data_file(path, screen=screen))
    except IntegrityError as exc:
        return ("refused", str(exc))


@pytest.fixture(scope="module")
def sound(tmp_path_factory) -> str:
    """A journal with trees three levels deep (thousands of small records) and overflow payloads."""
    path = str(tmp_path_factory.mktemp("screen") / "journal")
    with Journal(path, sync=False) as journal:
        tiny = journal.prepare(b"x")
        for step in range(1, 6001):
            journal.record(step, tiny)
        for step in range(6001, 6041):
            journal.record(step, {"ids": torch.arange(2000 + step)}, input={"prompt": f"p{step}"})
    with Journal(path, run="zipped", compression="zstd") as journal:
        journal.record(1, {"text": "z" * 50_000})
    return path


def test_a_sound_journal_gives_the_same_figures_with_and_without_the_screen(sound):
    data = os.path.join(sound, "data.mdb")
    screened, walked = check_data_file(data), check_data_file(data, screen=False)
    assert screened == walked
    assert walked.overflow_values >= 40 and walked.tree_pages > 100


def _page_size(data: str) -> int:
    with open(data, "rb") as fh:
        fh.seek(16 + 24)
        return int.from_bytes(fh.read(4), "little")


def _tree_pages(data: str, psize: int) -> list:
    """The pages that say they are branch or leaf pages (the ones a walk parses node by node)."""
    found = []
    with open(data, "rb") as fh:
        raw = fh.read()
    for page in range(2, len(raw) // psize):
        header = raw[page * psize:page * psize + 16]
        if int.from_bytes(header[:8], "little") == page and int.from_bytes(header[10:12], "little") & 0x03:
            found.append(page)
    return found


def _node_byte(fh, page: int, psize: int, rng: random.Random) -> int:
    """An offset inside one of the page's node headers (size, flags, key size), or a random one."""
    fh.seek(page * psize)
    raw = fh.read(psize)
    lower = int.from_bytes(raw[12:14], "little")
    count = (lower - 16) // 2 if 16 <= lower <= psize else 0
    if count <= 0:
        return rng.randrange(psize)
    pointer = 16 + 2 * rng.randrange(min(count, (psize - 16) // 2))
    node = int.from_bytes(raw[pointer:pointer + 2], "little")
    return min(psize - 1, node + rng.randrange(8))


@pytest.mark.parametrize("seed", range(4))
def test_a_randomly_damaged_file_gets_the_walks_verdict_word_for_word(sound, tmp_path, seed):
    rng = random.Random(seed)
    source = os.path.join(sound, "data.mdb")
    psize = _page_size(source)
    tree_pages = _tree_pages(source, psize)
    verdicts = {"passed": 0, "refused": 0}
    for trial in range(100):
        data = str(tmp_path / f"data{trial}.mdb")
        shutil.copyfile(source, data)
        with open(data, "r+b") as fh:
            for _ in range(rng.choice([1, 1, 2, 4])):
                page = rng.choice(tree_pages)
                where = rng.choice([rng.randrange(0, 16), rng.randrange(16, 96), rng.randrange(psize),
                                    _node_byte(fh, page, psize, rng), _node_byte(fh, page, psize, rng)])
                fh.seek(page * psize + where)
                old = fh.read(1)[0]
                fh.seek(page * psize + where)
                fh.write(bytes([old ^ (1 << rng.randrange(8)) if rng.random() < 0.7 else rng.randrange(256)]))
        walked = _outcome(data, screen=False)
        assert _outcome(data, screen=True) == walked, f"trial {trial}"
        verdicts[walked[0]] += 1
        os.unlink(data)
    # Both verdicts were reached: damage in a payload's bytes passes, damage in the structure is refused.
    assert verdicts["passed"] > 0 and verdicts["refused"] > 0, verdicts


def test_an_empty_leaf_below_a_branch_is_refused_by_the_screen_and_the_walk_alike(sound, tmp_path):
    """An emptied leaf does not crash LMDB: its cursor steps over it and the entries on it vanish."""
    source = os.path.join(sound, "data.mdb")
    psize = _page_size(source)
    with open(source, "rb") as fh:
        raw = fh.read()
    leaves = [p for p in _tree_pages(source, psize) if int.from_bytes(raw[p * psize + 10:p * psize + 12], "little") & 0x02]
    data = str(tmp_path / "data.mdb")
    emptied = 0
    for leaf in leaves:
        shutil.copyfile(source, data)
        with open(data, "r+b") as fh:
            fh.seek(leaf * psize + 12)
            fh.write((16).to_bytes(2, "little"))  # mp_lower at the header's end: no nodes
        walked = _outcome(data, screen=False)
        if walked[0] == "passed":
            continue  # the leaf was a tree's root (an empty root is an empty tree)
        emptied += 1
        assert walked[1].endswith(" holds no entries. LMDB trusts its pages and would read outside the file "
                                  "(the process dies of SIGBUS) or loop, so it is not opened. Restore it from a copy")
        assert _outcome(data, screen=True) == walked, leaf
        if emptied == 12:
            break
    assert emptied == 12


def test_a_process_without_numpy_walks_trees_the_import_would_not_pay_for(monkeypatch):
    from stepjournal.storage import _lmdb_check  # private: the LMDB file checks under test

    assert _lmdb_check._screens(_lmdb_check._SCREEN_FROM)  # numpy is loaded here (torch is)
    assert not _lmdb_check._screens(_lmdb_check._SCREEN_FROM - 1)
    monkeypatch.delitem(sys.modules, "numpy")
    assert not _lmdb_check._screens(_lmdb_check._SCREEN_IMPORTS_NUMPY_FROM - 1)
    assert _lmdb_check._screens(_lmdb_check._SCREEN_IMPORTS_NUMPY_FROM)
