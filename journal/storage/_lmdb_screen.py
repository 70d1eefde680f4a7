"""A vectorised screen of a named LMDB database's pages: the fast path of `_lmdb_check`.

`_lmdb_check` walks every tree page of ``data.mdb`` node by node in Python, which is exact and names
what is wrong, but costs about a second per 100 000 pages (a journal of a million events holds over
100 000). This module checks the same conditions for one named database a whole tree level at a
time with numpy: the pages of a level are read with ``pread`` (runs of adjacent pages in one call),
their headers, node pointers and node headers are parsed as arrays, and every condition the exact
walk checks on a page or a node is checked on all of them at once.

It answers only "every condition holds" (the tree's pages, in walk order) or "something does not"
(None). It never explains: on None the caller runs the exact walk, which finds the first problem and
words it. So a damaged or crafted file costs the exact walk, and a sound one the screen. The screen
must never pass what the exact walk refuses; tests/unit/test_lmdb_screen.py checks that on mutated files.
"""

from __future__ import annotations

import os
from typing import List, Optional, Tuple

import numpy as np

__all__ = ["screen_tree"]

P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
_P_IGNORED = 0x10 | 0x4000 | 0x8000
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
_PAGEHDRSZ, _NODESZ = 16, 8
_RUN_PAGES = 256  # the most adjacent pages read by one pread
_CHUNK_PAGES = 4096  # pages parsed at once (bounds the memory of one level's arrays)


def _read_pages(fd: int, pgnos: np.ndarray, psize: int) -> Optional[np.ndarray]:
    """The pages `pgnos` (sorted, distinct) as an (n, psize) uint8 array, or None if the file is short."""
    out = np.empty((len(pgnos), psize), dtype=np.uint8)
    flat = out.reshape(-1)
    starts = np.flatnonzero(np.diff(pgnos, prepend=pgnos[0] - 2) != 1)
    bounds = list(starts) + [len(pgnos)]
    for begin, end in zip(bounds[:-1], bounds[1:]):
        for at in range(begin, end, _RUN_PAGES):
            upto = min(end, at + _RUN_PAGES)
            length = (upto - at) * psize
            got = os.preadv(fd, [flat[at * psize:upto * psize].data], int(pgnos[at]) * psize)
            if got != length:
                return None
    return out


def _u64(arr: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Little-endian uint64 at byte offsets `at` of the flat array `arr` (any alignment)."""
    value = np.zeros(len(at), dtype=np.uint64)
    for i in range(8):
        value |= arr[at + i].astype(np.uint64) << np.uint64(8 * i)
    return value


def _level(fd: int, pgnos: np.ndarray, psize: int, leaf: bool, *, root_level: bool = False
           ) -> Optional[Tuple[np.ndarray, List[Tuple[int, int, int]]]]:
    """Check one chunk of one level's pages; return (children, overflow values) or None.

    children: the page numbers the branch nodes point at (empty on a leaf level); overflow values:
    (page, first overflow page, size) of each leaf node holding its value in overflow pages.
    """
    pages = _read_pages(fd, pgnos, psize)
    if pages is None:
        return None
    flat = pages.reshape(-1)
    own = pages[:, 0:8].copy().view("<u8").reshape(-1)
    flags = pages[:, 10:12].copy().view("<u2").reshape(-1).astype(np.int64)
    lower = pages[:, 12:14].copy().view("<u2").reshape(-1).astype(np.int64)
    upper = pages[:, 14:16].copy().view("<u2").reshape(-1).astype(np.int64)
    kind = flags & ~_P_IGNORED
    if not (np.array_equal(own, pgnos) and np.all(kind == (P_LEAF if leaf else P_BRANCH))):
        return None
    if not np.all((lower >= _PAGEHDRSZ) & (lower <= upper) & (upper <= psize) & ((lower - _PAGEHDRSZ) % 2 == 0)):
        return None
    count = (lower - _PAGEHDRSZ) // 2
    if (not leaf or not root_level) and not np.all(count >= 1):
        return None  # an empty branch, or an empty leaf below a branch (see `_lmdb_check`)
    widest = int(count.max()) if len(count) else 0
    if widest == 0:
        return np.empty(0, dtype=np.uint64), []
    pointers = pages[:, _PAGEHDRSZ:_PAGEHDRSZ + 2 * widest].copy().view("<u2").astype(np.int64)
    present = np.arange(widest) < count[:, None]
    offsets = pointers[present]
    page_of = np.repeat(np.arange(len(pgnos)), count)
    if not np.all((offsets >= upper[page_of]) & (offsets % 2 == 0) & (offsets + _NODESZ <= psize)):
        return None
    half = (page_of * psize + offsets) // 2  # node headers are 2-aligned (checked above)
    words = flat.view("<u2")
    lo, hi, nflags, ksize = (words[half + i].astype(np.int64) for i in range(4))
    key_end = offsets + _NODESZ + ksize
    if not np.all(key_end <= psize):
        return None
    if not leaf:
        return (lo | hi << 16 | nflags << 32).astype(np.uint64), []
    dsize = lo | hi << 16
    if np.any(nflags & ~(F_BIGDATA | F_SUBDATA)) or np.any(nflags & F_SUBDATA):
        return None  # a named database holds no databases (and duplicate data is refused)
    big = (nflags & F_BIGDATA) != 0
    if not np.all(big | (key_end + dsize <= psize)):
        return None
    if not np.all(~big | (key_end + 8 <= psize)):
        return None
    overflow: List[Tuple[int, int, int]] = []
    if big.any():
        firsts = _u64(flat, (page_of * psize + key_end)[big])
        overflow = list(zip(pgnos[page_of[big]].tolist(), firsts.tolist(), dsize[big].tolist()))
    return np.empty(0, dtype=np.uint64), overflow


def screen_tree(fd: int, psize: int, pages: int, root: int, depth: int, seen: set
                ) -> Optional[Tuple[np.ndarray, List[Tuple[int, int, int]]]]:
    """Check a named database's tree; return (its pages, its overflow values) or None.

    Args:
        fd: the open ``data.mdb``.
        psize: the page size; pages: the count of committed pages (valid numbers are 2 to pages - 1).
        root, depth: the database's root page and depth (already checked to be 1 to 32 by the caller).
        seen: the pages other trees hold; a page in two trees, or twice in this one, fails the screen.

    The overflow values are checked by the caller (a header read each, as the exact walk does).
    """
    frontier = np.array([root], dtype=np.uint64)
    walked: List[np.ndarray] = []
    overflow: List[Tuple[int, int, int]] = []
    for level in range(1, depth + 1):
        if len(frontier) == 0:
            return None  # a branch level whose pages point nowhere (the exact walk says which)
        if np.any(frontier < 2) or np.any(frontier >= pages):
            return None
        ordered = np.sort(frontier)
        if np.any(ordered[1:] == ordered[:-1]):
            return None
        if seen and any(int(p) in seen for p in ordered):
            return None
        walked.append(ordered)
        leaf = level == depth
        children: List[np.ndarray] = []
        for at in range(0, len(ordered), _CHUNK_PAGES):
            done = _level(fd, ordered[at:at + _CHUNK_PAGES], psize, leaf, root_level=level == 1)
            if done is None:
                return None
            children.append(done[0])
            overflow.extend(done[1])
        frontier = np.concatenate(children) if children else np.empty(0, dtype=np.uint64)
    every = np.sort(np.concatenate(walked))
    if np.any(every[1:] == every[:-1]):
        return None  # a page on two levels: a cycle
    return every, overflow
