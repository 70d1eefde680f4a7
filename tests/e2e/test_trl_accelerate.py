"""TRL under `accelerate` with 2 CPU processes: one journal folder records both ranks, the recording
travels to "another machine" (push to a remote, clone), and a second 2-process launch there replays
each rank's shard bit for bit without generating. A launch with another number of processes is
refused, naming why.

Real: accelerate's launcher and torch.distributed (gloo, CPU), TRL's GRPOTrainer, LMDB shared by two
processes. The launches are typed as a user types them, through a shell.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stepjournal import Journal
from stepjournal.sharing import clone, push

pytestmark = pytest.mark.e2e  # accelerate launches: `make test-fast` leaves it out

HERE = Path(__file__).resolve().parent.parent
BIN = os.path.dirname(sys.executable)
DRIVER = HERE / "trl_accelerate_driver.py"


def launch(journal: Path, policy: str, out: Path, processes: int = 2) -> subprocess.CompletedProcess:
    out.mkdir(parents=True, exist_ok=True)
    if processes == 1:
        command = f"python {DRIVER} {journal} {policy} {out}"
    else:
        command = (f"accelerate launch --multi_gpu --num_processes {processes} --num_machines 1 --mixed_precision no "
                   f"--dynamo_backend no {DRIVER} {journal} {policy} {out}")
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=900)


def failure(result: subprocess.CompletedProcess) -> str:
    """What a failed launch said: each rank's own lines (torchrun prefixes them ``[rankN]:``), which the
    launcher's summary at the end of stderr does not hold, then that summary."""
    own: dict = {}
    for line in result.stderr.splitlines():
        if line.startswith("[rank"):
            own.setdefault(line.split("]", 1)[0], []).append(line)
    said = "\n".join("\n".join(lines[-40:]) for _, lines in sorted(own.items()))
    return said + "\n-- the launcher's end --\n" + result.stderr[-2000:]


def ranks(out: Path) -> dict:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


@pytest.fixture(scope="module")
def two_process_recording(tmp_path_factory):
    """One 2-process GRPO recording: (journal folder, what each rank logged, the launch's stderr)."""
    folder = tmp_path_factory.mktemp("accelerate")
    journal = folder / "machine-a" / "journal"
    recording = launch(journal, "dump", folder / "recorded")
    assert recording.returncode == 0, failure(recording)
    return journal, ranks(folder / "recorded"), recording.stderr


def test_two_accelerate_processes_record_one_journal_and_a_second_launch_elsewhere_replays_each_rank(
        tmp_path, two_process_recording):
    machine_a, recorded, stderr = two_process_recording
    machine_b = tmp_path / "machine-b" / "journal"
    assert sorted(recorded) == [0, 1] and all(r["num_processes"] == 2 for r in recorded.values())
    for rank in recorded.values():
        assert rank["counts"]["generated"] == 2 and rank["calls"]["generate"] == 2
    assert recorded[0]["logged"] == recorded[1]["logged"]  # the ranks' logs are reduced over both
    assert "run_recorded_by_two_sessions" not in stderr  # two ranks, two modes: not two writers
    with Journal(str(machine_a), readonly=True, run="grpo") as journal:
        shards = {r.mode for r in journal.audit() if r.stage == "generate"}
        assert shards == {"train/p0", "train/p1"}
        assert journal.recorded_steps(mode="train/p0") == journal.recorded_steps(mode="train/p1") == [0, 2]

    remote = (tmp_path / "remote").as_uri()
    push(str(machine_a), remote)
    clone(remote, str(machine_b))
    replaying = launch(machine_b, "replay", tmp_path / "replayed")
    assert replaying.returncode == 0, failure(replaying)
    replayed = ranks(tmp_path / "replayed")
    for rank in (0, 1):
        assert replayed[rank]["counts"]["replayed"] == 2 and replayed[rank]["counts"]["generated"] == 0
        assert replayed[rank]["calls"]["generate"] == 0
        assert replayed[rank]["logged"] == recorded[rank]["logged"]  # bit for bit, every logged value


def test_replaying_a_two_process_recording_with_one_process_is_refused_naming_the_process_count(
        tmp_path, two_process_recording):
    journal = tmp_path / "journal"
    shutil.copytree(two_process_recording[0], journal)
    single = launch(journal, "replay", tmp_path / "single", processes=1)
    assert single.returncode != 0
    assert "ReplayMissError" in single.stderr
    assert "was recorded by 2 process(es) (num_processes=2) and this launch runs 1" in single.stderr
    assert "launch with --num_processes 2" in single.stderr
