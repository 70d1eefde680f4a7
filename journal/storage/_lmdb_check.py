"""A structural check of an LMDB data file, made before LMDB is trusted with it.

LMDB checks nothing of its own pages beyond the last committed page number. A leaf node flagged as
an overflow value ("bigdata") may claim any size, and LMDB hands out a view of that many bytes from
the memory map: reading past the end of ``data.mdb`` kills the process with SIGBUS, which no
``except`` catches. So before any B-tree page is read through LMDB, this module reads the file itself
(``pread``, never a mapping, so that it cannot fault) and walks every tree LMDB could touch: the
free-page tree, the main tree and every named database under it. Each page number must lie inside
the file and below the last committed page, each page must be what its parent says (its own number,
branch or leaf at the right depth), every node must lie inside its page, and every overflow value's
extent (its first page plus the pages its size needs) must lie inside the file too.

The work is bounded by the file: each tree page is read once (a page reached twice is a cycle or a
shared subtree, and refused), overflow pages are not read beyond their 16-byte header, and the walk
uses an explicit stack no deeper than LMDB's own cursor (32 levels).
The named databases (events, payloads, indices: nearly all the pages) are first screened a level
at a time by `_lmdb_screen`, which checks the same conditions with numpy; only a tree it does not
pass is walked node by node here, so that the error names the first problem.

A read-only journal may instead be checked as it is read (`check_tree`): the main tree and the small
trees at open, then each other named database whole the first time it is used, and the event log only
where a read goes (the pages a read of a key range can touch: the root-to-leaf paths of the range and
the leaf after it, where LMDB's cursor steps next). Either way no page is read through LMDB before it
has passed the checks here; a damaged tree is refused with the same words when it is first read.

The layout parsed here is LMDB 0.9's (the one py-lmdb bundles), on a 64-bit little-endian machine.
"""

from __future__ import annotations

import os
import struct
import sys
from typing import Iterable, List, NamedTuple, Optional, Tuple

import lmdb

from ..base._errors import IntegrityError, JournalError
from ..base._log import get_logger

__all__ = ["check_data_file", "check_env_structure", "check_file_size", "check_tree", "newest_txnid", "CheckStats",
           "KEY_ABOVE_ALL"]

log = get_logger(__name__)

_PAGEHDR = struct.Struct("<QHHHH")  # mp_pgno, mp_pad, mp_flags, mp_lower, mp_upper (mp_pages overlays the last two)
_PAGEHDRSZ = _PAGEHDR.size
_NODE = struct.Struct("<HHHH")  # mn_lo, mn_hi, mn_flags, mn_ksize
_NODESZ = _NODE.size
_DB = struct.Struct("<IHHQQQQQ")  # md_pad, md_flags, md_depth, branch, leaf, overflow pages, entries, md_root
_META = struct.Struct("<IIQQ" + _DB.format[1:] * 2 + "QQ")  # magic, version, address, mapsize, dbs[2], last_pg, txnid
_U64 = struct.Struct("<Q")

_MAGIC = 0xBEEFC0DE
_VERSION = 1
_P_INVALID = (1 << 64) - 1
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
_P_IGNORED = 0x10 | 0x4000 | 0x8000  # P_DIRTY, P_LOOSE, P_KEEP: in-memory marks
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
# Database flags that make LMDB read values as nested trees or fixed-size arrays; no journal uses them.
_DUP_FLAGS = 0x04 | 0x10 | 0x20 | 0x40  # MDB_DUPSORT, MDB_DUPFIXED, MDB_INTEGERDUP, MDB_REVERSEDUP
_MAX_DEPTH = 32  # LMDB's CURSOR_STACK
_STRUCTURE_RETRIES = 8
_MIN_PSIZE, _MAX_PSIZE = 256, 1 << 16
_SCREEN_FROM = 64  # tree pages (as the record counts them) from which a tree is screened first
# ... once numpy is loaded. Importing it costs ~40 ms, the exact walk ~7.6 us a page and the screen ~2.7:
# a process that has not loaded numpy walks trees under this many pages (measured: docs/performance.md).
_SCREEN_IMPORTS_NUMPY_FROM = 8192
_LEFTMOST = (b"", b"")  # the keys of a walk down the first children only (no key is empty)
KEY_ABOVE_ALL = b"\xff" * 512  # above every key LMDB can hold (511 bytes at most): `lo` of a read of the last key


class CheckStats(NamedTuple):
    """What a check read: tree pages walked, overflow values checked, bytes of the file, its snapshot."""

    tree_pages: int
    overflow_values: int
    file_bytes: int
    txnid: int


class _Meta(NamedTuple):
    psize: int
    mapsize: int
    free: tuple
    main: tuple
    last_pgno: int
    txnid: int


class _Damaged(Exception):
    """Raised inside the walk; turned into an `IntegrityError` naming the journal."""


def _read(fd: int, offset: int, length: int) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise _Damaged(f"{length} bytes at offset {offset} are past the end of the file")
    return data


def _metas(fd: int, size: int) -> Tuple[_Meta, _Meta]:
    if size < _PAGEHDRSZ + _META.size:
        raise _Damaged(f"the file holds {size} bytes, fewer than one meta page")
    first = _meta(_read(fd, _PAGEHDRSZ, _META.size), 0)
    if first.psize * 2 > size:
        raise _Damaged(f"the file holds {size} bytes, fewer than its two {first.psize}-byte meta pages")
    second = _meta(_read(fd, first.psize + _PAGEHDRSZ, _META.size), 1)
    if second.psize != first.psize:
        raise _Damaged(f"the meta pages disagree on the page size ({first.psize}, {second.psize})")
    return first, second


def _meta(raw: bytes, index: int) -> _Meta:
    fields = _META.unpack(raw)
    magic, version, _address, mapsize = fields[:4]
    free, main = fields[4:12], fields[12:20]
    last_pgno, txnid = fields[20:22]
    if magic != _MAGIC or version != _VERSION:
        raise _Damaged(f"meta page {index} is not an LMDB 0.9 meta page (magic {magic:#x}, version {version})")
    psize = free[0]  # LMDB keeps the page size in the free tree's md_pad
    if not _MIN_PSIZE <= psize <= _MAX_PSIZE or psize & (psize - 1):
        raise _Damaged(f"meta page {index} gives a page size of {psize}")
    return _Meta(psize, mapsize, free, main, last_pgno, txnid)


def newest_txnid(path: str) -> Optional[int]:
    """The transaction id of the newest meta page of `path`, or None when they cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        first, second = _metas(fd, os.fstat(fd).st_size)
        return max(first.txnid, second.txnid)
    except (_Damaged, OSError):
        return None
    finally:
        os.close(fd)


def _screens(tree_pages: int) -> bool:
    """Whether a tree of `tree_pages` pages is screened (`_lmdb_screen`) before, or instead of, the exact walk."""
    return tree_pages >= (_SCREEN_FROM if "numpy" in sys.modules else _SCREEN_IMPORTS_NUMPY_FROM)


class _PageWalk:
    def __init__(self, fd: int, psize: int, pages: int, *, screen: bool = True) -> None:
        self.fd = fd
        self.screen = screen  # named trees through `_lmdb_screen` first (False: node by node only)
        self.psize = psize
        self.pages = pages  # page numbers below this are inside the file and committed
        self.seen: set = set()
        self.overflow_values = 0

    def tree(self, name: str, db: tuple, *, main: bool = False, free: bool = False,
             keys: Optional[Tuple[bytes, Optional[bytes]]] = None) -> List[Tuple[str, tuple]]:
        """Walk one database; return the named databases a main tree holds.

        keys: (lo, hi) to walk only the pages a read of the keys lo..hi (hi None: to the end) can
        touch: on each branch page the children whose keys meet the range, and the next child's
        leftmost path (a cursor stepping past the range reads that leaf). None: the whole tree.
        """
        _pad, flags, depth, _branch, _leaf, _overflow, _entries, root = db
        if flags & _DUP_FLAGS:
            raise _Damaged(f"database {name} has duplicate-key flags ({flags:#x}) that no journal uses")
        if root == _P_INVALID:
            return []
        if not 1 <= depth <= _MAX_DEPTH:
            raise _Damaged(f"database {name} claims a depth of {depth} (LMDB handles 1 to {_MAX_DEPTH})")
        if not main and not free and self.screen and keys is None and _screens(_branch + _leaf):
            from ._lmdb_screen import screen_tree  # numpy: imported for a tree large enough to need it

            screened = screen_tree(self.fd, self.psize, self.pages, root, depth, self.seen)
            if screened is not None:
                tree_pages, overflow = screened
                for pgno, first, dsize in overflow:
                    self._overflow(name, pgno, first, dsize, read=False)
                self.seen.update(tree_pages.tolist())
                return []
            # Something in this tree is wrong: the walk below finds the first problem and says it.
        named: List[Tuple[str, tuple]] = []
        stack = [(root, 1, "its root", keys)]
        while stack:
            pgno, level, parent, wanted = stack.pop()
            page = self._page(name, pgno, parent)
            kind = page[1]
            if kind == P_BRANCH and level >= depth or kind == P_LEAF and level != depth:
                raise _Damaged(f"page {pgno} of database {name} is a {'branch' if kind == P_BRANCH else 'leaf'} "
                               f"at level {level} of a tree {depth} deep")
            if kind == P_BRANCH and wanted is not None:
                stack.extend(self._children_for(name, pgno, page, level, wanted))
                continue
            for offset in page[2]:
                raw = page[0]
                lo, hi, nflags, ksize = _NODE.unpack_from(raw, offset)
                key_end = offset + _NODESZ + ksize
                if key_end > self.psize:
                    raise _Damaged(f"a key on page {pgno} of database {name} runs past the page")
                if kind == P_BRANCH:
                    child = lo | hi << 16 | nflags << 32
                    stack.append((child, level + 1, f"branch page {pgno}", None))
                    continue
                dsize = lo | hi << 16
                if nflags & ~(F_BIGDATA | F_SUBDATA | F_DUPDATA) or nflags & F_DUPDATA:
                    raise _Damaged(f"a node on page {pgno} of database {name} has flags {nflags:#x} no journal uses")
                if nflags & F_BIGDATA:
                    if key_end + 8 > self.psize:
                        raise _Damaged(f"an overflow node on page {pgno} of database {name} runs past the page")
                    (first,) = _U64.unpack_from(raw, key_end)
                    value = self._overflow(name, pgno, first, dsize, read=free)
                elif key_end + dsize > self.psize:
                    raise _Damaged(f"a value on page {pgno} of database {name} runs past the page")
                else:
                    value = raw[key_end:key_end + dsize]
                if nflags & F_SUBDATA:
                    if not main or nflags & F_BIGDATA or dsize != _DB.size:
                        raise _Damaged(f"a node on page {pgno} of database {name} claims to hold a database")
                    sub = bytes(raw[offset + _NODESZ:key_end]).decode("utf-8", "replace")[:64]
                    named.append((repr(sub), _DB.unpack(value)))
                elif free:
                    self._free_list(pgno, value)
        return named

    def _children_for(self, name: str, pgno: int, page: Tuple[bytes, int, Tuple[int, ...]], level: int,
                      wanted: Tuple[bytes, Optional[bytes]]) -> List[tuple]:
        """The children of a branch page a read of `wanted` (lo, hi) can reach, as stack entries.

        Child i holds the keys from its node's key (the first node's counts as below every key) up
        to the next node's. The keys must rise, as LMDB's binary search assumes: otherwise the
        search could reach a child this walk did not choose.
        """
        raw, _kind, offsets = page
        lo, hi = wanted
        keys, children = [], []
        for offset in offsets:
            nlo, nhi, nflags, ksize = _NODE.unpack_from(raw, offset)
            if offset + _NODESZ + ksize > self.psize:
                raise _Damaged(f"a key on page {pgno} of database {name} runs past the page")
            keys.append(bytes(raw[offset + _NODESZ:offset + _NODESZ + ksize]))
            children.append(nlo | nhi << 16 | nflags << 32)
        if any(keys[i] >= keys[i + 1] for i in range(1, len(keys) - 1)):
            raise _Damaged(f"the keys of branch page {pgno} of database {name} are out of order")
        parent = f"branch page {pgno}"
        if wanted == _LEFTMOST:
            return [(children[0], level + 1, parent, _LEFTMOST)]
        chosen = [i for i in range(len(children))
                  if (hi is None or i == 0 or keys[i] <= hi) and (i + 1 == len(children) or keys[i + 1] > lo)]
        entries = [(children[i], level + 1, parent, wanted) for i in chosen]
        after = chosen[-1] + 1 if chosen else 0
        if after < len(children):  # where a cursor goes past the range: that child's leftmost leaf
            entries.append((children[after], level + 1, parent, _LEFTMOST))
        return entries[::-1]  # popped in key order

    def _page(self, name: str, pgno: int, parent: str) -> Tuple[bytes, int, Tuple[int, ...]]:
        if pgno >= self.pages:
            raise _Damaged(f"{parent} of database {name} points at page {pgno}, beyond the {self.pages} pages "
                           "committed in the file")
        if pgno < 2:
            raise _Damaged(f"{parent} of database {name} points at meta page {pgno}")
        if pgno in self.seen:
            raise _Damaged(f"{parent} of database {name} points at page {pgno} a second time (a cycle)")
        self.seen.add(pgno)
        raw = _read(self.fd, pgno * self.psize, self.psize)
        own, _pad, flags, lower, upper = _PAGEHDR.unpack_from(raw)
        kind = flags & ~_P_IGNORED
        if own != pgno or kind not in (P_BRANCH, P_LEAF):
            raise _Damaged(f"page {pgno} of database {name} is not a tree page (it says page {own}, flags {flags:#x})")
        if not _PAGEHDRSZ <= lower <= upper <= self.psize or (lower - _PAGEHDRSZ) % 2:
            raise _Damaged(f"page {pgno} of database {name} has a broken header (lower {lower}, upper {upper})")
        count = (lower - _PAGEHDRSZ) // 2
        if kind == P_BRANCH and count < 1:
            raise _Damaged(f"branch page {pgno} of database {name} has no children")
        if kind == P_LEAF and count < 1 and parent != "its root":
            # LMDB merges a leaf that loses its last entry away; an empty one below a branch only hides
            # the keys that were on it (a cursor steps over it silently).
            raise _Damaged(f"leaf page {pgno} of database {name} holds no entries")
        offsets = struct.unpack_from(f"<{count}H", raw, _PAGEHDRSZ)
        for offset in offsets:
            if offset < upper or offset % 2 or offset + _NODESZ > self.psize:
                raise _Damaged(f"a node on page {pgno} of database {name} lies outside the page's node area")
        return raw, kind, offsets

    def _overflow(self, name: str, pgno: int, first: int, dsize: int, *, read: bool) -> bytes:
        self.overflow_values += 1
        where = f"an overflow value on page {pgno} of database {name}"
        if not 2 <= first < self.pages:
            raise _Damaged(f"{where} starts at page {first}, outside the {self.pages} pages committed in the file")
        own, _pad, flags, lower, upper = _PAGEHDR.unpack(_read(self.fd, first * self.psize, _PAGEHDRSZ))
        pages = lower | upper << 16  # mp_pages overlays mp_lower and mp_upper
        if own != first or flags & ~_P_IGNORED != P_OVERFLOW or pages < 1:
            raise _Damaged(f"{where} points at page {first}, which is not an overflow page")
        if first + pages > self.pages:
            raise _Damaged(f"{where} spans pages {first} to {first + pages - 1}, beyond the {self.pages} pages "
                           "committed in the file")
        if _PAGEHDRSZ + dsize > pages * self.psize:
            raise _Damaged(f"{where} claims {dsize} bytes, more than its {pages} pages hold (it would be read "
                           "past them)")
        return _read(self.fd, first * self.psize + _PAGEHDRSZ, dsize) if read else b""

    def _free_list(self, pgno: int, value: bytes) -> None:
        # A free-page list: a count, then that many page numbers; a writer reuses them.
        if len(value) < 8 or len(value) % 8:
            raise _Damaged(f"a free-page list on page {pgno} is {len(value)} bytes long")
        numbers = struct.unpack(f"<{len(value) // 8}Q", value)
        if numbers[0] != len(numbers) - 1 or (
                len(numbers) > 1 and not (2 <= min(numbers[1:]) and max(numbers[1:]) < self.pages)):
            raise _Damaged(f"a free-page list on page {pgno} names pages outside the file")


def check_data_file(path: str, *, journal: str = "", pinned_txnid: Optional[int] = None,
                    screen: bool = True, trees: Optional[Iterable[str]] = None) -> CheckStats:
    """Walk the LMDB file at `path` and refuse it unless every page LMDB could read lies inside it.

    Args:
        path: the ``data.mdb`` file.
        journal: the journal path, for the error message.
        pinned_txnid: the id of a read transaction the caller holds on the file; the snapshot checked
            is the newest, never older than it (the caller's transaction keeps those pages from reuse).
        screen: check each named database's tree a level at a time first (`_lmdb_screen`); the
            node-by-node walk then runs only on a tree the screen does not pass. False walks every
            tree node by node (the reference the screen is tested against).
        trees: the named databases to walk (the main tree always is), for a read-only environment
            (no writer in it: the free-page tree is left out too); None: all, free pages included.
            The others must be checked (`check_tree`) before LMDB reads them.

    Returns:
        What was read.

    Raises:
        IntegrityError: the structure is damaged (or was crafted) so that LMDB could read outside
            the file; nothing was read through LMDB.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        try:
            first, second = _metas(fd, size)
            meta = second if first.txnid < second.txnid else first  # LMDB's own choice
            if pinned_txnid is not None and meta.txnid < pinned_txnid:
                raise _Damaged(f"its newest meta page (transaction {meta.txnid}) is older than the snapshot "
                               f"LMDB opened ({pinned_txnid})")
            pages = size // meta.psize
            if meta.last_pgno + 1 > pages:
                raise _Damaged(f"its last committed page {meta.last_pgno} lies beyond the end of the file "
                               f"({pages} pages): the file was truncated")
            walk = _PageWalk(fd, meta.psize, meta.last_pgno + 1, screen=screen)
            if trees is None:  # a read-only journal checked as read never writes: LMDB reads no free page then
                walk.tree("(free pages)", meta.free, free=True)
            only = None if trees is None else {repr(t) for t in trees}
            for name, db in walk.tree("(main)", meta.main, main=True):
                if only is None or name in only:
                    walk.tree(name, db)
        except (_Damaged, struct.error) as exc:
            raise _refusal(exc, journal or path) from None
        return CheckStats(len(walk.seen), walk.overflow_values, size, meta.txnid)
    finally:
        os.close(fd)


def _refusal(exc: Exception, journal: str) -> IntegrityError:
    return IntegrityError(
        f"journal {journal!r} is damaged or was crafted: in data.mdb, {exc}. LMDB trusts its "
        "pages and would read outside the file (the process dies of SIGBUS) or loop, so it is not opened. "
        "Restore it from a copy",
        detail=f"data.mdb structure: {exc}",
    )


def check_tree(path: str, name: str, record: bytes, *, psize: int, last_pgno: int, journal: str = "",
               keys: Optional[Tuple[bytes, Optional[bytes]]] = None) -> CheckStats:
    """Check one named database of the LMDB file at `path`, whole or where a read of `keys` goes.

    Args:
        path: the ``data.mdb`` file.
        name: the database's name; record: its 48-byte record in the main tree, as the caller's read
            transaction sees it (that transaction keeps the tree's pages from reuse meanwhile).
        psize: the page size; last_pgno: the newest committed page (pages past it, or past the end
            of the file, are refused).
        journal: the journal path, for the error message.
        keys: (lo, hi): only the pages a read of the keys lo..hi can touch (hi None: to the end;
            lo `KEY_ABOVE_ALL`: the last key). None: the whole tree.

    Raises:
        IntegrityError: the tree is damaged (or was crafted), in the words of `check_data_file`.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            if len(record) != _DB.size:
                raise _Damaged(f"the record of database {name!r} is {len(record)} bytes long")
            pages = min(os.fstat(fd).st_size // psize, last_pgno + 1)
            walk = _PageWalk(fd, psize, pages)
            walk.tree(repr(name), _DB.unpack(record), keys=keys)
        except (_Damaged, struct.error) as exc:
            raise _refusal(exc, journal or path) from None
        return CheckStats(len(walk.seen), walk.overflow_values, pages * psize, 0)
    finally:
        os.close(fd)


def check_env_structure(env: lmdb.Environment, data_file: str, path: str,
                        trees: Optional[Iterable[str]] = None) -> None:
    """Walk data.mdb's trees before LMDB reads any of them (see `_lmdb_check`); refuse what would fault.

    Runs at the first open of a path in each process, in every mode: a process cannot tell a journal
    it wrote from one it was handed. A read transaction pins the snapshot meanwhile, so a writer in
    another process cannot reuse its pages; a meta page read while that writer commits may be torn,
    so a failed check is retried when the file's newest transaction moved in the meantime.
    `trees`: the named databases to check (None: all); the others are checked as read (`_store.Store.db`).
    """
    for _ in range(_STRUCTURE_RETRIES):
        before = newest_txnid(data_file)
        try:
            reading = env.begin()
        except lmdb.MapResizedError:
            # Another process grew the map between this process's open and now: adopt the new size.
            env.set_mapsize(0)
            continue
        with reading as txn:
            try:
                stats = check_data_file(data_file, journal=path, pinned_txnid=txn.id(), trees=trees)
            except IntegrityError:
                if newest_txnid(data_file) != before:
                    continue  # a writer committed while the file was read: look again
                raise
        log.debug("journal_structure_checked", path=path, tree_pages=stats.tree_pages,
                  overflow_values=stats.overflow_values, file_bytes=stats.file_bytes)
        return
    raise JournalError(f"journal {path!r} keeps being written while it is opened; try again")


def check_file_size(env: lmdb.Environment, data_file: str, path: str) -> None:
    """Refuse a data file shorter than its last committed page: reading past its end kills the process."""
    needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    actual = os.path.getsize(data_file)
    if actual < needed:
        raise IntegrityError(
            f"journal {path!r} is damaged: data.mdb holds {actual} bytes but its last committed page ends at "
            f"{needed}; the file was truncated. Restore it from a copy",
            detail="data.mdb truncated",
        )
