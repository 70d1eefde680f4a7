"""`stepjournal export J --tensorboard DIR`: one TensorBoard run per session, read back with TensorBoard's own
reader (`EventAccumulator`), its scalars and texts equal to what the journal holds; and docs/reading.md's viewer
lines, run as typed.

The journal has TRL's shapes: a generate call and a reward stage per step, the `metrics` stage holding what
TRL logs (loss, reward, kl), and at the last step train()'s own log as a second metrics call; a later session
replays the generations and logs its own metrics.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from stepjournal import Journal
from stepjournal.adapters.cli._export_tensorboard import session_folder  # private: a CLI helper under test
from cli_support import run_cli
from doc_lines import command_lines, run_line
from kill_points import start_script
from test_samples import ids, tokenizer_dir  # noqa: F401  (tokenizer_dir: the fixture)

STEPS, SAMPLES = 5, 3
ANSWERS = ["four", "a mat the dog ran", "the cat sat", "two plus two is four", "a dog"]
VIEWERS = "Which viewer, when"  # docs/reading.md's section whose lines run here
DOC_LINES = command_lines("docs/reading.md", section=VIEWERS)


def logged(step: int, session: int) -> dict:
    """What TRL's log records at a step (a string among the numbers, as TRL's logs may hold)."""
    return {"loss": 0.5 / step + session, "reward": step / 4, "kl": 0.01 * step, "epoch": step / STEPS,
            "model_name": "tiny"}


def build(path: str, tokenizer: str = None) -> None:
    fingerprint = {"tokenizer": tokenizer} if tokenizer else {}
    with Journal(path, run="grpo", fingerprint=fingerprint, sync=False) as journal:
        for step in range(1, STEPS + 1):
            responses = [ids(ANSWERS[(step + i) % len(ANSWERS)]) for i in range(SAMPLES)]
            journal.record(step, {"prompt_ids": [ids("what is two")] * SAMPLES, "response_ids": responses},
                           duration_s=1.0 + step / 8)
            journal.record(step, {"rewards": torch.tensor([float(step * i) for i in range(SAMPLES)])}, stage="reward",
                           duration_s=0.25)
            journal.record(step, logged(step, 0), stage="metrics")
        journal.record(STEPS, {"train_loss": 0.75, "loss": 9.0}, stage="metrics", gen_index=1)  # train()'s log
    with Journal(path, run="grpo", fingerprint=fingerprint, sync=False) as journal:
        for step in range(1, STEPS + 1):
            journal.record_replay(step, journal.lookup(step), policy="replay", reason="replay", duration_s=0.125)
            journal.record(step, logged(step, 1), stage="metrics")


@pytest.fixture(scope="module")
def journal_path(tmp_path_factory, tokenizer_dir):  # noqa: F811
    path = str(tmp_path_factory.mktemp("tb") / "grpo")
    build(path, tokenizer_dir)
    return path


def journaled_metrics(journal: Journal, session: str) -> dict:
    """step -> the names and numbers `session`'s metrics calls stored there, a later call's over an earlier's."""
    found: dict = {}
    for r in journal.audit(stage="metrics"):
        if r.session == session:
            found.setdefault(r.step, {}).update(journal.load(journal.event(r.seq).output))
    return found


def read_runs(logdir: Path) -> dict:
    """Each TensorBoard run under `logdir` (its folder relative to it) -> its accumulator, loaded whole."""
    runs = {}
    for folder in sorted({p.parent for p in logdir.rglob("events.out.tfevents.*")}):
        accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "tensors": 0})
        accumulator.Reload()
        runs[str(folder.relative_to(logdir))] = accumulator
    return runs


def series(accumulator: EventAccumulator, tag: str) -> dict:
    return {e.step: e.value for e in accumulator.Scalars(tag)}


def texts(accumulator: EventAccumulator) -> dict:
    return {e.step: e.tensor_proto.string_val[0].decode() for e in accumulator.Tensors("samples/text_summary")}


def test_each_session_is_a_tensorboard_run_whose_scalars_are_the_journals(journal_path, tmp_path):
    done = run_cli("export", journal_path, "--tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 0, done.stderr
    runs = read_runs(tmp_path / "tb")
    names = sorted(runs)
    assert [(n.split(os.sep)[0], n.split(os.sep)[1].split("-")[0]) for n in names] == [("grpo", "s1"), ("grpo", "s2")]
    assert done.stdout.splitlines()[:2] == [f"wrote {tmp_path / 'tb' / n} ({STEPS} steps)" for n in names]
    recording, replay = runs[names[0]], runs[names[1]]
    steps = list(range(1, STEPS + 1))
    with Journal(journal_path, readonly=True) as journal:
        rewards = {s: journal.load_output(journal.lookup(s, stage="reward", run="grpo"))["rewards"].double()
                   for s in steps}
        lengths = {s: [len(x) for x in journal.load_output(journal.lookup(s, run="grpo"))["response_ids"]]
                   for s in steps}
        sessions = list(dict.fromkeys(e.session for _, e in journal.sessions()))
        metrics = [journaled_metrics(journal, session) for session in sessions]
    # float32 is what a TensorBoard scalar holds: compared as float32.
    f32 = lambda v: float(torch.tensor(float(v), dtype=torch.float32))  # noqa: E731
    assert series(recording, "reward/mean") == {s: f32(rewards[s].mean()) for s in steps}
    assert series(recording, "reward/std") == {s: f32(rewards[s].std(unbiased=False)) for s in steps}
    assert series(recording, "response_length/mean") == {s: f32(sum(lengths[s]) / SAMPLES) for s in steps}
    assert series(recording, "samples/count") == {s: SAMPLES for s in steps}
    assert series(recording, "time/generate") == {s: f32(1.0 + s / 8) for s in steps}
    assert series(recording, "time/reward") == {s: 0.25 for s in steps}
    assert series(recording, "calls/generated") == {s: 3 + (s == STEPS) for s in steps}  # generate, reward, metrics
    assert series(recording, "calls/replayed") == {s: 0 for s in steps}
    # The metrics stage: TRL's numbers, the string left out; train()'s later log at the last step wins on `loss`.
    assert {t for t in recording.Tags()["scalars"] if t.startswith("metrics/")} == {
        "metrics/loss", "metrics/reward", "metrics/kl", "metrics/epoch", "metrics/train_loss"}
    assert metrics[0][STEPS]["loss"] == 9.0 and metrics[0][1]["loss"] == logged(1, 0)["loss"]
    for name in ("loss", "reward", "kl", "epoch"):
        assert series(recording, f"metrics/{name}") == {s: f32(metrics[0][s][name]) for s in steps}
    assert series(recording, "metrics/train_loss") == {STEPS: 0.75}
    # The replay session: its own calls and its own metrics, never the recording's.
    assert series(replay, "calls/replayed") == {s: 1 for s in steps}
    assert series(replay, "calls/generated") == {s: 1 for s in steps}  # its metrics call
    assert series(replay, "time/generate") == {s: 0.125 for s in steps}
    assert series(replay, "metrics/loss") == {s: f32(metrics[1][s]["loss"]) for s in steps}
    assert metrics[1][1]["loss"] == logged(1, 1)["loss"] != metrics[0][1]["loss"]
    assert "reward/mean" not in replay.Tags()["scalars"]  # it journaled no reward: none is shown as its own
    # Each point's wall time is when the session journaled the step.
    with Journal(journal_path, readonly=True) as journal:
        at_one = [r.ts for r in journal.audit(steps={1}) if r.session == sessions[0]]
    assert recording.Scalars("time/generate")[0].wall_time == pytest.approx(max(at_one), abs=1e-6)


def test_the_text_summary_is_each_steps_first_samples_decoded_with_the_runs_tokenizer(journal_path, tmp_path,
                                                                                      tokenizer_dir):  # noqa: F811
    from transformers import AutoTokenizer

    done = run_cli("export", journal_path, "--tensorboard", str(tmp_path / "tb"), "--samples", "2")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    recording, replay = read_runs(tmp_path / "tb").values()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    with Journal(journal_path, readonly=True) as journal:
        first = next(e.session for _, e in journal.sessions())
        shown = journal.samples(3, run="grpo", tokenizer=tokenizer, session=first)
    assert [s.response for s in shown] == [ANSWERS[(3 + i) % len(ANSWERS)] for i in range(SAMPLES)]
    assert texts(recording)[3] == "\n\n".join(
        f"**sample {s.index}** · {s.response_length} tokens{' (truncated)' * s.truncated} · "
        f"reward {s.rewards['reward']:g} · generated\n\n    prompt:   {s.prompt}\n    response: {s.response}"
        for s in shown[:2])
    assert texts(replay)[3].startswith(f"**sample 0** · {shown[0].response_length} tokens (truncated) · replayed "
                                       "from step 3\n\n    prompt:   what is two\n")
    assert shown[0].truncated  # the words carry no end-of-sequence token
    assert f"    response: {shown[1].response}" in texts(replay)[3] and "**sample 2**" not in texts(replay)[3]


def test_without_a_tokenizer_the_samples_are_token_ids_and_one_line_says_how_to_get_text(tmp_path):
    path = str(tmp_path / "bare")
    build(path)
    done = run_cli("export", path, "--tensorboard", str(tmp_path / "tb"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["run 'grpo' kept no tokenizer, so ids are shown; for text see docs/reading.md"]
    recording = next(iter(read_runs(tmp_path / "tb").values()))
    with Journal(path, readonly=True) as journal:
        batch = journal.load_output(journal.lookup(2, run="grpo"))
    assert texts(recording)[2].split("\n\n")[1] == (f"    prompt ids:   {batch['prompt_ids'][0]}\n"
                                                    f"    response ids: {batch['response_ids'][0]}")


def test_one_session_a_second_export_into_the_same_folder_and_what_is_refused(journal_path, tmp_path):
    done = run_cli("export", journal_path, "--tensorboard", str(tmp_path / "tb"), "--session", "s2")
    assert done.returncode == 0, done.stderr
    (name,) = read_runs(tmp_path / "tb")
    assert name.split(os.sep)[1].startswith("s2-")
    again = run_cli("export", journal_path, "--tensorboard", str(tmp_path / "tb"))  # every session: s2's is there
    assert again.returncode == 1 and "already holds event files" in again.stderr
    assert list(read_runs(tmp_path / "tb")) == [name]  # checked before anything was written: no s1 either
    unknown = run_cli("export", journal_path, "--tensorboard", str(tmp_path / "tb"), "--session", "s9")
    assert unknown.returncode == 2 and "s1 (" in unknown.stderr and "s2 (" in unknown.stderr
    (tmp_path / "a-file").write_text("")
    not_a_folder = run_cli("export", journal_path, "--tensorboard", str(tmp_path / "a-file"))
    assert not_a_folder.returncode == 1 and f"--tensorboard {tmp_path / 'a-file'} is not a folder" in not_a_folder.stderr
    wrong = run_cli("export", journal_path, "--to", str(tmp_path / "out"), "--samples", "2")
    assert wrong.returncode == 2 and "--samples goes with --tensorboard" in wrong.stderr


def test_a_session_names_its_run(tmp_path):
    """In a journal of two runs, --session needs no --run: export and report take the session's own."""
    path = str(tmp_path / "two")
    for run in ("first", "second"):
        with Journal(path, run=run, sync=False) as journal:
            journal.record(1, {"prompt_ids": [[2]], "response_ids": [[3, 1]]})
    done = run_cli("export", path, "--tensorboard", str(tmp_path / "tb"), "--session", "s2", "--no-text")
    assert done.returncode == 0, done.stderr
    assert [n.split(os.sep)[0] for n in read_runs(tmp_path / "tb")] == ["second"]
    page = run_cli("report", path, "-o", str(tmp_path / "r.html"), "--session", "s2", "--no-text")
    assert page.returncode == 0 and "<title>two: run second, session s2</title>" in (tmp_path / "r.html").read_text()
    mismatched = run_cli("report", path, "-o", str(tmp_path / "r.html"), "--session", "s2", "--run", "first")
    assert mismatched.returncode == 2 and "--session s2 is a session of run second, not first" in mismatched.stderr


def test_without_tensorboard_installed_it_names_the_pip_install_in_one_line(journal_path, tmp_path):
    code = ("import sys; sys.modules['tensorboard'] = None; from stepjournal.adapters.cli import main; "
            "sys.exit(main(['export', sys.argv[1], '--tensorboard', sys.argv[2]]))")
    done = subprocess.run([sys.executable, "-c", code, journal_path, str(tmp_path / "tb")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "stepjournal: error: export --tensorboard needs TensorBoard: pip install tensorboard"]
    assert not (tmp_path / "tb").exists()


def test_the_pages_viewer_lines_run_as_typed(tmp_path, tokenizer_dir):  # noqa: F811
    """docs/reading.md's "Which viewer, when": the report of one session and the TensorBoard export, in a folder
    holding the page's `grpo` journal."""
    build(str(tmp_path / "grpo"), tokenizer_dir)
    lines = [line.text for line in DOC_LINES]
    assert lines == ["stepjournal report grpo -o grpo.html --session s2", "stepjournal export grpo --tensorboard runs"]
    for line in lines:
        done = run_line(line, tmp_path)
        assert done.returncode == 0, done.stderr
    assert (tmp_path / "grpo.html").stat().st_size > 0
    assert sorted(n.split(os.sep)[1][:2] for n in read_runs(tmp_path / "runs")) == ["s1", "s2"]


# -- hostile journals and folders ------------------------------------------------------------------
def test_a_metric_past_floats_range_is_left_out_of_the_export_and_the_report(tmp_path):
    """An int past float's range (10**400) in the metrics stage is a value the step has none of, as NaN is: the
    export and the report go on, the other metrics read back as journaled."""
    path = str(tmp_path / "huge")
    with Journal(path, run="grpo", sync=False) as journal:
        journal.record(1, {"prompt_ids": [[2]], "response_ids": [[3, 1]]})
        journal.record(1, {"huge": 10**400, "nan": float("nan"), "loss": 0.5}, stage="metrics")
    done = run_cli("export", path, "--tensorboard", str(tmp_path / "tb"), "--no-text")
    assert done.returncode == 0, done.stderr
    (recording,) = read_runs(tmp_path / "tb").values()
    assert {t for t in recording.Tags()["scalars"] if t.startswith("metrics/")} == {"metrics/loss"}
    assert series(recording, "metrics/loss") == {1: 0.5}
    page = run_cli("report", path, "-o", str(tmp_path / "r.html"), "--no-text")
    assert page.returncode == 0, page.stderr


def test_what_is_not_a_folder_where_a_folder_goes_is_refused_in_one_line_before_anything_is_written(
        journal_path, tmp_path):
    """DIR, the run's folder or a session's folder as a dead link, a FIFO, a file, or (below DIR) any link: named,
    nothing written."""
    with Journal(journal_path, readonly=True) as journal:
        first = session_folder("grpo", "s1", next(e.ts for _, e in journal.sessions()))
    dead = tmp_path / "dead"
    dead.symlink_to(tmp_path / "nowhere")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    run_file = tmp_path / "run-file"
    run_file.mkdir()
    (run_file / "grpo").write_text("")
    session_link = tmp_path / "session-link"
    (session_link / "grpo").mkdir(parents=True)
    (session_link / first).symlink_to(tmp_path / "nowhere")
    for top, bad in [(dead, dead), (fifo, fifo), (run_file, run_file / "grpo")]:
        done = run_cli("export", journal_path, "--tensorboard", str(top), "--no-text")
        assert done.returncode == 1, (top, done.stderr)
        assert done.stderr.splitlines() == [done.stderr.strip()] and f"{bad} is not a folder" in done.stderr
    # A link below DIR, dead or to a folder outside it (a shared log folder someone else can write), is refused.
    outside = tmp_path / "outside"
    outside.mkdir()
    run_link = tmp_path / "run-link"
    run_link.mkdir()
    (run_link / "grpo").symlink_to(outside)
    for top, bad in [(session_link, session_link / first), (run_link, run_link / "grpo")]:
        done = run_cli("export", journal_path, "--tensorboard", str(top), "--no-text")
        assert done.returncode == 1, (top, done.stderr)
        assert done.stderr.splitlines() == [done.stderr.strip()] and f"{bad} is a link (to " in done.stderr
    assert not (tmp_path / "nowhere").exists() and not list(tmp_path.rglob("events.out.tfevents.*"))
    assert list(outside.iterdir()) == []


def test_a_full_disk_keeps_nothing_of_the_session_and_says_so_in_one_line(tmp_path):
    """A real full tmpfs (a private mount namespace): TensorBoard's writer thread fails; the export says which
    session in one line, with no traceback, and leaves none of its event files (a second export writes it whole)."""
    path = str(tmp_path / "many")
    with Journal(path, run="grpo", sync=False) as journal:
        for step in range(1, 301):
            journal.record(step, {f"m{k}": float(k * step) for k in range(20)}, stage="metrics")
    where = tmp_path / "mnt"
    where.mkdir()
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "stepjournal", "export", path,
                                                  "--tensorboard", str(where / "tb"), "--no-text"])
    done = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k tmpfs {where} && {command}; "
                           f"echo rc=$?; find {where} -type f"], capture_output=True, text=True, timeout=300)
    assert done.stdout.splitlines() == ["rc=1"], (done.stdout, done.stderr)  # no event file left
    assert done.stderr.splitlines() == [done.stderr.strip()], done.stderr
    assert f"writing {where / 'tb' / 'grpo'}" in done.stderr and "No space left on device" in done.stderr
    assert "nothing of this session was kept" in done.stderr


INTERRUPTED = """
import os, sys
from kill_points import Lockstep
from stepjournal.adapters.cli import main
os.makedirs(sys.argv[2])
Lockstep.inherited().filesystem(sys.argv[2])(True)
sys.exit(main(["export", sys.argv[1], "--tensorboard", sys.argv[2], "--no-text"]))
"""


def losses_journal(path: str, steps: int) -> None:
    """A run of `steps` metrics calls, a loss each."""
    with Journal(path, run="grpo", sync=False) as journal:
        for step in range(1, steps + 1):
            journal.record(step, {"loss": 1.0 / step}, stage="metrics")


def wait_at_event_file_open(child, n: int) -> None:
    """Answer the child's points until it waits at its `n`-th opening of an event file."""
    opened = 0
    while True:
        label = child.next_point()
        assert label is not None, f"the export ended before opening an event file {n} times"
        opened += label.startswith("open ") and "events.out.tfevents" in label
        if opened == n:
            return
        child.go()


def test_ctrl_c_while_a_session_is_written_keeps_none_of_it_and_a_second_export_writes_it_whole(tmp_path):
    """Ctrl-C (SIGINT) lands while TensorBoard's writer appends to the session's event file (an observed point):
    the export ends as interrupted, no event file is left, and the same command then writes every step."""
    path = str(tmp_path / "many")
    losses_journal(path, 50)
    tb = tmp_path / "tb"
    child = start_script(INTERRUPTED, path, str(tb))
    wait_at_event_file_open(child, 2)  # in the writer's thread: its creation, then its first append of a step
    # Ctrl-C there: the main thread is interrupted among its steps (the writer holds them back at this point).
    child.interrupt()
    child.finish(exits=(130,))
    assert not list(tb.rglob("events.out.tfevents.*"))
    again = run_cli("export", path, "--tensorboard", str(tb), "--no-text")
    assert again.returncode == 0, again.stderr
    (recording,) = read_runs(tb).values()
    assert sorted(series(recording, "metrics/loss")) == list(range(1, 51))


def test_an_empty_session_is_refused_not_read_as_every_session(journal_path, tmp_path):
    """`--session "$S"` with S unset: report and export name no session, instead of taking the whole run."""
    for argv in (["report", journal_path, "-o", str(tmp_path / "r.html")], ["export", journal_path, "--tensorboard",
                                                                           str(tmp_path / "tb")]):
        done = run_cli(*argv, "--session", "", "--no-text")
        assert done.returncode == 2, done.stderr
        assert "--session '': no session matches; its sessions are: s1 (" in done.stderr
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "tb").exists()


def test_two_exports_into_one_folder_at_once_never_mix_one_sessions_files(tmp_path):
    """A second export runs whole while the first, past its check, is about to create its event file (an observed
    point): the first then finds the other's file, leaves, and the folder holds one complete session."""
    path = str(tmp_path / "j")
    losses_journal(path, 20)
    tb = tmp_path / "tb"
    first = start_script(INTERRUPTED, path, str(tb))
    wait_at_event_file_open(first, 1)
    second = run_cli("export", path, "--tensorboard", str(tb), "--no-text")
    assert second.returncode == 0, second.stderr
    first.go()
    first.finish(exits=(1,))
    (left,) = tb.rglob("events.out.tfevents.*")
    (recording,) = read_runs(tb).values()
    assert sorted(series(recording, "metrics/loss")) == list(range(1, 21))
