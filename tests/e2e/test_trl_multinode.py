"""TRL under `accelerate` on two "nodes", shared through a real S3 server, replayed on another topology.

Two launches of one process each (``--num_machines 2 --machine_rank 0/1``: one torch.distributed
group over 127.0.0.1, as two machines form one) record GRPO, each node into a journal folder on its
own disk (LMDB is not shared between machines). Each node pushes its journal to one remote; a third
machine clones it and replays with a single launch of two processes (one node), each rank its own
shard bit for bit, generate never called. Its audit says which node's journal each shard came from.

Real: accelerate's launcher, torch.distributed (gloo, CPU), TRL's GRPOTrainer, a moto S3 server on
127.0.0.1 spoken to by obstore. The push, clone and audit lines are the ones in docs/sharing.md
"Topologies", typed through a shell on the machine they are written for.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import sharing_docs
from doc_lines import run_line
from s3_server import client_env, free_port, make_bucket, s3_server  # noqa: F401  (fixture)
from test_trl_accelerate import BIN, DRIVER, ranks

from stepjournal import Journal
from stepjournal.sharing._remote import journal_id  # private: the remote layout

pytestmark = pytest.mark.e2e  # accelerate launches on two machines: `make test-fast` leaves it out

DOC_LINES = sharing_docs.topology_doc_lines({"node 0", "node 1", "machine B"})


def _on(lines: list, machine: str, env: dict, cwd: Path) -> list:
    """Run the documented lines written for `machine`; return what each printed."""
    done = []
    for where, line in lines:
        if where == machine:
            ran = run_line(line, cwd, env=env, timeout=900)
            assert ran.returncode == 0, f"{line}: {ran.stderr}"
            done.append(ran.stdout)
    return done


def test_two_nodes_record_apart_push_to_one_remote_and_one_machine_with_two_processes_replays_each_rank(
        tmp_path, s3_server):  # noqa: F811
    env = {**os.environ, **client_env(s3_server), "PATH": f"{BIN}:{os.environ['PATH']}", "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1"}
    port = free_port()
    node = {rank: tmp_path / f"node{rank}" / "journal" for rank in (0, 1)}
    nodes = [
        subprocess.Popen(["bash", "-c",
                          f"accelerate launch --multi_gpu --num_machines 2 --machine_rank {rank} --num_processes 2 "
                          f"--main_process_ip 127.0.0.1 --main_process_port {port} --mixed_precision no "
                          f"--dynamo_backend no {DRIVER} {node[rank]} dump {tmp_path / 'recorded'}"],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]
    for launched in nodes:
        _, stderr = launched.communicate(timeout=900)
        assert launched.returncode == 0, stderr[-3000:]
    recorded = ranks(tmp_path / "recorded")
    assert sorted(recorded) == [0, 1] and all(r["num_processes"] == 2 for r in recorded.values())
    for rank in (0, 1):
        assert recorded[rank]["counts"]["generated"] == 2 and recorded[rank]["calls"]["generate"] == 2
        with Journal(str(node[rank]), readonly=True, run="grpo") as journal:  # each node holds its own rank only
            assert {r.mode for r in journal.audit() if r.stage == "generate"} == {f"train/p{rank}"}
    assert recorded[0]["logged"] == recorded[1]["logged"]  # the ranks' logs are reduced over both nodes

    bucket = f"s3://{make_bucket(s3_server)}"
    lines = [(machine, line.replace("s3://bucket", bucket))
             for machine, line in sharing_docs.topology_commands({"node 0", "node 1", "machine B"})]
    assert [machine for machine, _ in lines] == ["node 0", "node 1", "machine B", "machine B", "machine B"]
    _on(lines, "node 0", env, tmp_path)  # stepjournal push node0/journal s3://...
    _on(lines, "node 1", env, tmp_path)
    clone_lines = [(machine, line) for machine, line in lines if line.startswith("stepjournal clone")]
    _on(clone_lines, "machine B", env, tmp_path)  # stepjournal clone s3://... machine-b/journal
    machine_b = tmp_path / "machine-b" / "journal"
    # The page's launch line, typed on machine B: its train.py replays machine-b/journal.
    (tmp_path / "replayed").mkdir()
    (tmp_path / "train.py").write_text(
        "import runpy, sys\n"
        f"sys.argv = [{str(DRIVER)!r}, {str(machine_b)!r}, 'replay', {str(tmp_path / 'replayed')!r}]\n"
        f"runpy.run_path({str(DRIVER)!r}, run_name='__main__')\n")
    launch_lines = [(machine, line) for machine, line in lines if "accelerate launch" in line]
    _on(launch_lines, "machine B", env, tmp_path)  # CUDA_VISIBLE_DEVICES="" accelerate launch ... train.py
    replayed = ranks(tmp_path / "replayed")
    assert sorted(replayed) == [0, 1] and all(r["num_processes"] == 2 for r in replayed.values())  # two processes
    for rank in (0, 1):
        assert replayed[rank]["counts"] == {**replayed[rank]["counts"], "replayed": 2, "generated": 0}
        assert replayed[rank]["calls"]["generate"] == 0
        assert replayed[rank]["logged"] == recorded[rank]["logged"]  # bit for bit, every logged value

    audit_lines = [(machine, line) for machine, line in lines if "audit" in line]
    (printed,) = _on(audit_lines, "machine B", env, tmp_path)  # stepjournal audit machine-b/journal --json
    rows = [r for r in json.loads(printed) if r["stage"] == "generate"]
    ids = {}
    for rank in (0, 1):
        with Journal(str(node[rank]), readonly=True) as journal:
            ids[rank] = journal_id(journal)
    assert ids[0] != ids[1]
    assert {(r["mode"], r["origin_journal"]) for r in rows if r["action"] == "generated"} == {
        ("train/p0", ids[0]), ("train/p1", ids[1])}
    assert {r["mode"] for r in rows if r["action"] == "replayed"} == {"train/p0", "train/p1"}
