"""Direct access to a journal's LMDB databases, bypassing stepjournal, to damage them on purpose."""

from __future__ import annotations

import os

import lmdb


def _room(path: str) -> int:
    """A map size with room to rewrite a value of the journal at `path` (LMDB's default is 10 MiB)."""
    return os.path.getsize(os.path.join(path, "data.mdb")) + (64 << 20)


def flip_byte(path: str, db_name: str, key: bytes | None = None, offset: int = -1) -> bytes:
    """Flip one byte of a value in a named database (the first key when `key` is None); return the key."""
    env = lmdb.open(path, max_dbs=8, subdir=True, map_size=_room(path))
    try:
        db = env.open_db(db_name.encode())
        with env.begin(write=True, db=db) as txn:
            if key is None:
                cur = txn.cursor()
                assert cur.first(), f"{db_name} is empty"
                key = bytes(cur.key())
            value = bytearray(txn.get(key))
            value[offset] ^= 0xFF
            txn.put(key, bytes(value))
        return key
    finally:
        env.close()


def flip_payload_byte(path: str, key: bytes, offset: int = -1) -> None:
    """Flip one byte of the stored payload `key`, in its payload file or, without one, in LMDB."""
    name = key.hex()
    file = os.path.join(path, "payloads", name[:2], name[2:])
    if not os.path.exists(file):
        flip_byte(path, "payloads", key=key, offset=offset)
        return
    data = bytearray(open(file, "rb").read())
    data[offset] ^= 0xFF
    with open(file, "wb") as f:
        f.write(data)


def put_raw(path: str, db_name: str, key: bytes, value: bytes) -> None:
    """Overwrite one value in a named database with raw bytes."""
    env = lmdb.open(path, max_dbs=8, subdir=True, map_size=_room(path))
    try:
        db = env.open_db(db_name.encode())
        with env.begin(write=True, db=db) as txn:
            txn.put(key, value)
    finally:
        env.close()


def delete_raw(path: str, db_name: str, key: bytes) -> None:
    """Delete one key of a named database."""
    env = lmdb.open(path, max_dbs=8, subdir=True, map_size=_room(path))
    try:
        db = env.open_db(db_name.encode())
        with env.begin(write=True, db=db) as txn:
            assert txn.delete(key), f"{key!r} is not in {db_name}"
    finally:
        env.close()


def items(path: str, db_name: str) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of a named database."""
    env = lmdb.open(path, max_dbs=8, subdir=True, readonly=True)
    try:
        db = env.open_db(db_name.encode(), create=False)
        with env.begin(db=db) as txn:
            return [(bytes(k), bytes(v)) for k, v in txn.cursor()]
    finally:
        env.close()


def drop_db(path: str, db_name: str) -> None:
    """Remove a named database whole, as a journal format without it would have none."""
    env = lmdb.open(path, max_dbs=8, subdir=True, map_size=_room(path))
    try:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(db_name.encode(), txn=txn, create=False), delete=True)
    finally:
        env.close()


def tables(path: str) -> list[bytes]:
    """The names of the journal's named databases (the keys of LMDB's main database)."""
    env = lmdb.open(path, max_dbs=8, subdir=True, readonly=True)
    try:
        with env.begin() as txn:
            return [bytes(k) for k, _ in txn.cursor()]
    finally:
        env.close()
