"""Find and edit LMDB's own pages in a data.mdb file, to craft hostile journals.

This reads the file with its own small parser of LMDB 0.9's layout (not stepjournal's checker, so that
the tests do not grade the checker with itself). Journals built by the tests are small: each tree is
found by walking down first children.
"""

from __future__ import annotations

import struct
from typing import Dict, List, NamedTuple

PAGEHDR = 16
F_BIGDATA, F_SUBDATA = 0x01, 0x02
P_BRANCH, P_LEAF = 0x01, 0x02


class Db(NamedTuple):
    depth: int
    root: int
    record_at: int  # file offset of the 48-byte MDB_db record (in a meta page or a main-tree leaf)


class Node(NamedTuple):
    at: int  # file offset of the node header
    flags: int
    key: bytes
    data_at: int  # file offset of the data (the overflow page number for bigdata)
    dsize: int


def read(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def page_size(data: bytes) -> int:
    return struct.unpack_from("<I", data, PAGEHDR + 24)[0]  # mm_dbs[FREE].md_pad


def newest_meta(data: bytes) -> int:
    """File offset of the MDB_meta of the newest meta page."""
    psize = page_size(data)
    offsets = [PAGEHDR, psize + PAGEHDR]
    txnids = [struct.unpack_from("<Q", data, off + 128)[0] for off in offsets]
    return offsets[txnids[1] > txnids[0]]


def main_db(data: bytes) -> Db:
    meta = newest_meta(data)
    record = meta + 24 + 48
    depth, = struct.unpack_from("<H", data, record + 6)
    root, = struct.unpack_from("<Q", data, record + 40)
    return Db(depth, root, record)


def nodes(data: bytes, pgno: int) -> List[Node]:
    psize = page_size(data)
    base = pgno * psize
    _own, _pad, flags, lower, _upper = struct.unpack_from("<QHHHH", data, base)
    found = []
    for i in range((lower - PAGEHDR) // 2):
        (ptr,) = struct.unpack_from("<H", data, base + PAGEHDR + 2 * i)
        lo, hi, nflags, ksize = struct.unpack_from("<HHHH", data, base + ptr)
        key = data[base + ptr + 8 : base + ptr + 8 + ksize]
        found.append(Node(base + ptr, nflags if flags & P_LEAF else 0, key, base + ptr + 8 + ksize, lo | hi << 16))
    return found


def page_flags(data: bytes, pgno: int) -> int:
    return struct.unpack_from("<H", data, pgno * page_size(data) + 10)[0]


def child(data: bytes, node: Node) -> int:
    """The page number a branch node points at."""
    lo, hi, flags = struct.unpack_from("<HHH", data, node.at)
    return lo | hi << 16 | flags << 32


def named_dbs(data: bytes) -> Dict[str, Db]:
    main = main_db(data)
    pgno = main.root
    while page_flags(data, pgno) & P_BRANCH:
        pgno = child(data, nodes(data, pgno)[0])
    out = {}
    for node in nodes(data, pgno):
        if node.flags & F_SUBDATA:
            depth, = struct.unpack_from("<H", data, node.data_at + 6)
            root, = struct.unpack_from("<Q", data, node.data_at + 40)
            out[node.key.decode()] = Db(depth, root, node.data_at)
    return out


def first_leaf(data: bytes, db: Db) -> int:
    pgno = db.root
    while page_flags(data, pgno) & P_BRANCH:
        pgno = child(data, nodes(data, pgno)[0])
    return pgno


def patch(path: str, offset: int, fmt: str, *values: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(struct.pack(fmt, *values))
