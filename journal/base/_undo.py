"""`undone_on_failure`: a verb that fails while it creates a journal leaves nothing behind.

`clone`, `pull` and `import_bundle` create the journal folder they write into when it is missing. A
wrong URL, a missing remote or a file that is not a bundle must not leave an empty journal there (a
corrected `clone` would then refuse the folder), and neither must a bundle damaged halfway: a journal
that holds part of what was asked for is not what was asked for. So whatever such a call created
is removed when it raises, and only that:

- the folder did not exist: the folder is removed, with every parent folder the call created;
- the folder existed and held no journal (an empty folder): the files the call added are removed,
  the folder stays;
- the folder held a journal already: nothing is removed (the runs committed stay, and the error names
  what was not brought in);
- another process wrote into the journal the call created, or has it open, when the call fails
  (`kept` says so, its caller knowing journals): nothing is removed, since what that process
  acknowledged is there too.

A `KeyboardInterrupt` or a kill removes nothing: what a pull committed is kept, and pulling again
resumes after it.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Callable, Iterator, Optional, Set, Union

__all__ = ["undone_on_failure", "remove_entry"]


def _first_missing(folder: str) -> Optional[str]:
    """The outermost folder of `folder`'s path that does not exist yet (None when `folder` exists)."""
    missing = None
    while not os.path.lexists(folder):
        missing = folder
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return missing


@contextmanager
def undone_on_failure(path: Union[str, "os.PathLike[str]"], *,
                      kept: Callable[[str], bool] = lambda folder: False) -> Iterator[None]:
    """Run the block; when it raises an `Exception`, remove what it created at the journal folder `path`,
    unless `kept(folder)` (another process has the journal open, or wrote into it)."""
    folder = os.path.abspath(os.fspath(path))
    if os.path.lexists(os.path.join(folder, "data.mdb")):
        yield  # an existing journal: what was committed into it stays
        return
    created = _first_missing(folder)
    before: Optional[Set[str]] = None
    if created is None and os.path.isdir(folder):
        before = set(os.listdir(folder))
    try:
        yield
    except Exception:
        if os.path.lexists(os.path.join(folder, "data.mdb")) and kept(folder):
            raise
        if created is not None:
            shutil.rmtree(created, ignore_errors=True)
        elif before is not None:
            for name in set(os.listdir(folder)) - before:
                remove_entry(os.path.join(folder, name))
        raise


def remove_entry(path: str) -> None:
    """Remove what is at `path`: a folder with what it holds, or anything else, a link itself (never what it
    points to); nothing when there is nothing."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
