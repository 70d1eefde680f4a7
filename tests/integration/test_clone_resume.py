"""An interrupted clone resumes with `pull`: the clone names ``origin`` before its first transfer.

A clone is stopped at an observed point of its work (tests/kill_points.py), never after a delay: by SIGKILL
at a progress point against the real S3 server (moto on 127.0.0.1), and by Ctrl-C (SIGINT) on the command
line at an LMDB commit, where the child sends it to itself once the parent answers its point so. Either way
the folder is a journal whose default remote is the source: a second `clone` into it says to pull, and
``stepjournal pull DEST`` (or ``pull DEST origin``) brings the rest, ending equal to the source, each event once.
"""

from __future__ import annotations

import os

import pytest
import torch

from kill_points import start_script
from s3_server import s3_env, s3_server, subprocess_env  # noqa: F401  (fixtures)
from stepjournal import Journal
from stepjournal.errors import JournalError
from stepjournal.sharing import clone, list_remotes, push
from stepjournal.adapters.cli import main
from stepjournal.events._events import EventsImported  # private: event classes and maps, below the face

STEPS = 12  # + the session: 13 events
SEGMENT = 2  # events a segment holds: one pulled run (and one progress point) each

KILLED = """
import sys
from kill_points import Lockstep
from stepjournal.sharing import clone
clone(sys.argv[1], sys.argv[2], progress=Lockstep.inherited().progress)
"""

INTERRUPTED = """
import sys
from kill_points import Lockstep
from stepjournal.adapters.cli import main
lockstep = Lockstep.inherited()
sys.stderr = open(sys.argv[3], "w", buffering=1)
with lockstep.lmdb_writes():
    code = main(["clone", sys.argv[1], sys.argv[2]])
sys.exit(code)
"""


def recorded(path) -> list:
    with Journal(str(path), run="exp") as journal:
        for step in range(1, STEPS + 1):
            journal.record(step, {"ids": torch.arange(32) * step})
    with Journal(str(path), readonly=True) as journal:
        return [bytes(raw) for _seq, raw in journal.raw_events()]


def imported(path) -> list:
    """The stored bytes of every pulled event, in the journal's order (a duplicate would show twice)."""
    out = []
    with Journal(str(path), readonly=True) as journal:
        raws = dict(journal.raw_events())
        for seq, event in journal.events(types=[EventsImported]):
            out += [bytes(raws[seq + 1 + k]) for k in range(event.source_last - event.source_first + 1)]
    return out


def ends_equal_to_the_source(dest, events, url, capsys, *pull_words) -> None:
    """`dest` names `url` origin, refuses a second clone, and ``stepjournal pull`` brings it to `events`."""
    assert [(r.name, r.url, r.default) for r in list_remotes(str(dest))] == [("origin", url, True)]
    with pytest.raises(JournalError, match="use pull .*stepjournal pull"):
        clone(url, str(dest))
    assert main(["pull", *pull_words]) == 0
    said = capsys.readouterr()
    assert f"from {'remote origin' if len(pull_words) > 1 else 'its default remote'} ({url}) into {dest}" in said.out
    assert imported(dest) == events  # each once, in order, bit-identical
    with Journal(str(dest), readonly=True, run="exp") as journal:
        assert journal.recorded_steps() == list(range(1, STEPS + 1)) and journal.verify() == []


def test_a_clone_killed_mid_transfer_resumes_with_pull_of_the_folder_alone(tmp_path, s3_env, s3_server, capsys):
    events = recorded(tmp_path / "a")
    push(str(tmp_path / "a"), s3_env, segment_events=SEGMENT)
    dest = tmp_path / "b"
    child = start_script(KILLED, s3_env, str(dest), env=subprocess_env(s3_server))
    said = child.run_to(lambda label: label.endswith(f" {3 * SEGMENT}/{len(events)}"))  # three runs committed
    assert said[-1].startswith("pull ")
    assert 0 < len(imported(dest)) < len(events)  # killed mid-transfer
    ends_equal_to_the_source(dest, events, s3_env, capsys, str(dest))


def test_a_clone_interrupted_by_ctrl_c_says_pull_resumes_it_and_pull_in_gits_order_does(tmp_path, capsys):
    events = recorded(tmp_path / "a")
    remote = tmp_path / "remote"
    push(str(tmp_path / "a"), str(remote), segment_events=SEGMENT)
    dest, stderr = tmp_path / "b", tmp_path / "stderr.txt"
    child = start_script(INTERRUPTED, str(remote), str(dest), str(stderr))
    commits = 0
    while True:  # the journal made (1), then two pulled runs (2, 3): interrupted at the third commit's end
        label = child.next_point()
        assert label is not None, f"the clone ended before the chosen point, after {child.seen[-3:]}"
        commits += label == "lmdb committed"
        if commits == 3:
            break
        child.go()
    child.interrupt()  # Ctrl-C at the point (the main thread's): KeyboardInterrupt is raised there
    child.finish(exits=(130,))
    assert 0 < len(imported(dest)) < len(events)
    shown = stderr.read_text()
    assert shown.splitlines()[-1] == (f"stepjournal: interrupted; what was done is kept; running stepjournal pull "
                                      f"{dest} again resumes it"), shown
    ends_equal_to_the_source(dest, events, remote.as_uri(), capsys, str(dest), "origin")


def test_pull_takes_its_two_words_in_either_order_and_refuses_an_ambiguous_pair(tmp_path, capsys, monkeypatch):
    from stepjournal.errors import RemoteConfigError
    from stepjournal.sharing import add_remote, pull_words

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    recorded(tmp_path / "a")
    push(str(tmp_path / "a"), str(tmp_path / "remote"))
    clone(str(tmp_path / "remote"), str(tmp_path / "b"))
    b = str(tmp_path / "b")
    assert (pull_words(b, "origin").remote, pull_words(b, "origin").swapped) == ("origin", True)
    assert (pull_words("origin", b).journal, pull_words("origin", b).swapped) == (b, False)
    assert pull_words(str(tmp_path / "remote"), str(tmp_path / "new")).journal == str(tmp_path / "new")
    assert pull_words(str(tmp_path / "new"), str(tmp_path / "remote")).journal == str(tmp_path / "new")
    for argv in (["pull", b, "origin"], ["pull", "origin", b]):
        assert main(argv) == 0
        said = capsys.readouterr()
        assert said.out.endswith(f"from remote origin ({(tmp_path / 'remote').as_uri()}) into {b}\n"), said.out
    add_remote(None, "team", (tmp_path / "remote").as_uri())
    add_remote(None, "mirror", (tmp_path / "remote").as_uri())
    with pytest.raises(RemoteConfigError, match="read two ways: pull from remote 'team' into journal 'mirror', "
                                                "or from remote 'mirror' into journal 'team'"):
        pull_words("team", "mirror")
    assert main(["pull", "team", "mirror"]) == 1 and "read two ways" in capsys.readouterr().err
    assert not os.path.exists("mirror") and not os.path.exists("team")
