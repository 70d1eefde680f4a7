"""Paths and permissions: nothing from a config escapes the journal folder; folders are owner-only.

Run keys are LMDB keys, never paths. Journal paths a config gives relative to a base folder go
through `resolve_journal_path`. A journal folder is created owner-only, LMDB's files inside it may
not be symbolic links, and a journal that others can write is reported by `security_warnings`.
Pickled dumps are imported only with --trust-pickle.
"""

from __future__ import annotations

import os
import pickle
import re
import stat
from pathlib import Path

import pytest

from stepjournal import Journal
from stepjournal.base import resolve_journal_path
from stepjournal.errors import UnsafePathError

from log_capture import captured_events
from reliability_support import report, worker_context
from cli_support import run_cli


def _tree(root: Path) -> set:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("run", ["../../escape", "/etc/passwd", "a/../../b", "..", "C:\\x", "~root/.ssh", "run\x7f"])
def test_run_keys_are_lmdb_keys_and_never_reach_the_file_system(tmp_path, run):
    path = tmp_path / "sub" / "journal"
    with Journal(path, run=run) as journal:
        journal.record(1, {"a": 1})
        assert journal.recorded_steps() == [1]
        assert journal.load_output(journal.lookup(1)) == {"a": 1}
    tree = _tree(tmp_path)
    # The live-writer lock is named by a digest of the run key, never by its text.
    (lock,) = [name for name in tree if name.startswith("sub/journal/writer-")]
    assert re.fullmatch(r"sub/journal/writer-[0-9a-f]{32}\.lock", lock)
    assert tree - {lock} == {"sub", "sub/journal", "sub/journal/data.mdb", "sub/journal/lock.mdb"}


def test_a_config_path_inside_the_base_folder_resolves(tmp_path):
    base = tmp_path / "dumps"
    base.mkdir()
    assert resolve_journal_path(base, "stepjournal") == str(base / "stepjournal")
    assert resolve_journal_path(str(base), "runs/exp1/../exp2") == str(base / "runs" / "exp2")
    (base / "inside").mkdir()
    os.symlink(base / "inside", base / "link")  # a link that stays inside is fine
    assert resolve_journal_path(base, "link/j") == str(base / "inside" / "j")


@pytest.mark.parametrize("bad", ["../outside", "a/../../outside", "..", ".", "", " ", "/abs/journal", "a\x00b"])
def test_a_config_path_that_leaves_the_base_folder_is_refused(tmp_path, bad):
    base = tmp_path / "dumps"
    base.mkdir()
    with pytest.raises(UnsafePathError):
        resolve_journal_path(base, bad)


def test_a_symbolic_link_out_of_the_base_folder_is_refused(tmp_path):
    base, elsewhere = tmp_path / "dumps", tmp_path / "elsewhere"
    base.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, base / "stepjournal")
    with pytest.raises(UnsafePathError, match="outside"):
        resolve_journal_path(base, "stepjournal")
    os.symlink("/etc", base / "etc")
    with pytest.raises(UnsafePathError, match="outside"):
        resolve_journal_path(base, "etc/journal")


def test_lmdb_files_that_are_symbolic_links_are_refused(tmp_path):
    path = tmp_path / "journal"
    Journal(path).close()
    target = tmp_path / "elsewhere.mdb"
    os.replace(path / "data.mdb", target)
    os.symlink(target, path / "data.mdb")
    for readonly in (False, True):
        with pytest.raises(UnsafePathError, match="symbolic link"):
            Journal(path, readonly=readonly)


def test_a_journal_folder_given_as_a_link_is_followed(tmp_path):
    """The user's own path may be a link (to a bigger disk): it is used as given."""
    real = tmp_path / "big-disk" / "journal"
    real.parent.mkdir()
    os.symlink(real.parent, tmp_path / "link")
    with Journal(tmp_path / "link" / "journal") as journal:
        journal.record(1, {"a": 1})
    assert (real / "data.mdb").exists()


def _create_with_umask_zero(path: str) -> None:
    os.umask(0)
    Journal(path).close()


def test_journal_folders_and_files_are_owner_only_even_with_a_permissive_umask(tmp_path):
    path = str(tmp_path / "journal")
    proc = worker_context().Process(target=_create_with_umask_zero, args=(path,))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o700
    for name in ("data.mdb", "lock.mdb"):
        assert stat.S_IMODE(os.stat(os.path.join(path, name)).st_mode) == 0o600
    with Journal(path, readonly=True) as journal:
        assert journal.security_warnings() == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_journal_folder_writable_by_others_is_reported(tmp_path, mode):
    path = tmp_path / "journal"
    Journal(path).close()
    os.chmod(path, mode)
    with captured_events() as logs:
        journal = Journal(path, readonly=True)
    try:
        (warning,) = journal.security_warnings()
        assert "journal folder" in warning and "writable by" in warning and "chmod 700" in warning
        assert any(e["event"] == "journal_folder_writable_by_others" for e in logs)
    finally:
        journal.close()
        os.chmod(path, 0o700)


def test_lmdb_files_writable_by_others_and_an_open_parent_are_reported(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    path = parent / "journal"
    Journal(path).close()
    os.chmod(path / "data.mdb", 0o666)
    os.chmod(parent, 0o777)
    with Journal(path, readonly=True) as journal:
        warnings = journal.security_warnings()
    assert any("data.mdb" in w and "writable by others" in w for w in warnings)
    assert any("sticky" in w for w in warnings)
    os.chmod(parent, 0o1777)  # like /tmp: others cannot rename what is not theirs
    with Journal(path, readonly=True) as journal:
        assert not any("sticky" in w for w in journal.security_warnings())
    os.chmod(parent, 0o755)
    report("permissions", warnings_checked=["folder g+w/o+w", "lmdb files o+w", "parent o+w without sticky"])


class _Marker:
    """Unpickling this creates a file: it stands for any code a pickle can run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_pickled_verl_dumps_are_not_loaded_without_trust_pickle_from_the_cli(tmp_path):
    marker = tmp_path / "code-ran"
    payload = pickle.dumps(_Marker(str(marker)))
    pickle.loads(pickle.dumps(_Marker(str(tmp_path / "probe"))))
    assert (tmp_path / "probe").exists(), "the pickle used below really runs code when loaded"
    step = tmp_path / "dumps" / "exp_proj" / "GBS4_N2_in6_out5" / "1"
    step.mkdir(parents=True)
    (step / "gen_batch.dp").write_bytes(payload)
    (step / "meta.json").write_text('{"global_steps": 1}')
    journal = tmp_path / "journal"
    done = run_cli("import-verl", str(tmp_path / "dumps"), "--into", str(journal))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--trust-pickle" in done.stderr + done.stdout
    assert not marker.exists() and not journal.exists()
