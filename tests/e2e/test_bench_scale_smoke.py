"""The two scale runs of `make bench-scale` run end to end at tiny sizes; speed is never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # the scale benchmark, in fresh processes: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, tmp_path: Path) -> dict:
    done = subprocess.run([sys.executable, "-m", *args, "--workdir", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert not any(tmp_path.iterdir()), "the run leaves its work folder empty"
    return json.loads(done.stdout)


def test_the_million_event_scale_run_measures_every_goal_on_a_small_journal(tmp_path):
    report = _run("benchmarks._scale", "--events", "300", "--skip-decisions", tmp_path=tmp_path)
    figures = report["figures"]
    assert figures["journal"]["recorded_steps"] == 300
    for command in ("reindex", "runs_json", "audit_json"):
        assert figures[command]["rc"] == 0, (command, figures[command])
    assert {"audit_json_events_per_s", "audit_first_screen_s", "runs_s", "reindex_s", "cli_start_help_s"} <= set(report["goals"])
    assert all(isinstance(g["met"], bool) and g["measured"] > 0 for g in report["goals"].values())


def test_the_big_payload_scale_run_replays_a_recorded_step_and_checks_every_command(tmp_path):
    report = _run("benchmarks._scale_big", "--steps", "3", "--quick", "--trials", "1", tmp_path=tmp_path)
    figures = report["figures"]
    assert figures["journal"]["recorded_steps"] == 3
    assert figures["journal"]["payload_bytes"] >= 3 * figures["build"]["payload_tensor_bytes"]  # 3 new payloads
    for command in ("runs_json", "audit_json", "timeline", "verify"):
        assert figures[command]["rc"] == 0, (command, figures[command])
    assert {d["action"] for d in figures["decisions"].values()} == {"replayed"}
    assert report["summary"]["on_disk_bytes"] > 0


def test_the_report_scale_run_writes_the_report_of_a_journal_it_grew_and_measures_it(tmp_path):
    report = _run("benchmarks._bench_report", "--steps", "12", "--samples", "20", tmp_path=tmp_path)
    figures = report["figures"]
    assert (figures["steps"], figures["samples_per_step"]) == (12, 20)
    assert figures["report"]["rc"] == 0, figures["report"]
    done = figures["report"]
    assert done["file_bytes"] > 0 and done["peak_rss_bytes"] >= done["peak_anon_bytes"] > 0
    assert {"report_file_bytes", "report_peak_anon_bytes"} == set(report["goals"])
    assert all(isinstance(g["met"], bool) and g["measured"] > 0 for g in report["goals"].values())
