"""The benchmark harness runs end to end at tiny sizes and reports every goal; speed is never asserted."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # the benchmarks, in fresh processes: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]
GOALS = {
    "replay_vs_plain_read",
    "replay_speedup_vs_verl_load",
    "record_vs_plain_write_fsync",
    "record_vs_verl_save",
    "record_growing_vs_plain_write_fsync",
    "record_growing_vs_verl_save",
    "record_growing_tuned_malloc_vs_plain_write_fsync",  # glibc's allocator keeping freed memory (Linux)
    "record_growing_tuned_malloc_vs_verl_save",
    "record_growing_peak_rss_added_vs_payload",
    "record_growing_tuned_malloc_peak_rss_added_vs_payload",
    "group_commit_records_per_s_at_64",  # 64 threads recording 1 KiB tool responses (issue 49)
    "group_commit_p99_at_64",
    "group_commit_one_caller_vs_one_commit_per_call",
    "group_commit_records_per_s_at_64_coroutines",  # the same from 64 coroutines awaiting Journal.arecord
    "group_commit_p99_at_64_coroutines",
    "group_commit_one_caller_vs_one_commit_per_call_coroutines",
    "record_isolated_vs_plain_write_fsync",  # each write after os.sync(), with the device flushes a record
    "lookup_ms_per_decision",
    "lookup_speedup_vs_folder_scan",
    "passthrough_overhead_us",
    "disk_bytes_compressed_vs_verl_dp",
    "replay_peak_rss_vs_payload",
    "cli_start_help_s",
    "cli_start_version_s",
    "cli_start_diff_s",  # each verb of issue 48 on the demo journal, typed as a user types it
    "cli_start_audit_s",
    "cli_start_runs_s",
    "cli_start_status_s",
    "cli_start_show_s",
    "cli_start_show_text_s",
    "diff_equal_1000_steps_s",
    "diff_differing_pair_vs_loads",
    "push_vs_client_put",
    "pull_vs_client_get_durable",
    "cold_replay_vs_client_get",
    "push_cli_vs_client_put",
    "clone_cli_vs_client_get_durable",
    "verify_batch_gb_s",
    "verify_small_gb_s",
}


@pytest.fixture(scope="module")
def quick_report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "report.json"
    work = tmp_path_factory.mktemp("bench-work")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--out", str(out), "--workdir", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        # A hang detector, not a timing: the quick run (the demo journal and its verbs, twelve fresh processes of
        # group commit) ran past 600 s beside two CPU burners and a full suite on two cores.
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    printed = json.loads(done.stdout)
    assert printed == json.loads(out.read_text())
    assert not any(work.iterdir()), "the harness leaves its work folder empty"
    return printed


def test_quick_run_reports_every_goal_with_measured_value_and_verdict(quick_report):
    assert set(quick_report["goals"]) == GOALS
    for name, goal in quick_report["goals"].items():
        assert set(goal) >= {"measured", "goal", "met"}, name
        assert isinstance(goal["met"], bool), name
        if goal["measured"] is None:  # a verb that failed on the demo journal: the row says how, and is not met
            assert name.startswith("cli_start_") and goal["note"].startswith("not measured: exited "), (name, goal)
            assert goal["met"] is False, name
        else:
            assert isinstance(goal["measured"], (int, float)), name


def test_quick_run_starts_each_reading_verb_on_the_demo_journal_as_typed(quick_report):
    started = quick_report["figures"]["verb_start"]
    assert started["stepjournal"].endswith("/stepjournal")  # the installed command, not python -m
    for verb in ("diff", "audit", "runs", "status", "show"):  # these run on today's demo journal
        assert started[verb]["median_s"] > 0 and started[verb]["line"].startswith("stepjournal "), verb
        assert quick_report["goals"][f"cli_start_{verb}_s"]["goal"] == (0.8 if verb == "show" else 0.3), verb


def test_quick_run_reports_the_machine(quick_report):
    machine = quick_report["machine"]
    for key in ("cpu_count", "python", "torch", "py_lmdb", "lmdb", "date_utc", "load_average_start"):
        assert machine[key], key


def test_quick_run_replays_every_byte_it_recorded(quick_report):
    tensor_bytes = quick_report["workload"]["tensor_bytes"]
    replay = quick_report["figures"]["replay"]
    for name in ("journal_dict", "journal_dataproto", "journal_zstd", "verl", "plain"):
        assert replay[name]["loaded_tensor_bytes"] == tensor_bytes, name
        assert replay[name]["reps"] == quick_report["workload"]["repetitions"], name


def test_quick_run_records_as_a_trainer_records_a_new_batch_a_step_into_a_fresh_journal(quick_report):
    growing = quick_report["figures"]["record_growing"]
    assert set(growing["wall_s"]) == {"plain_write_fsync", "journal_dump", "verl_save_to_disk"}
    assert all(len(samples) == growing["steps"] == 3 for samples in growing["wall_s"].values())
    # Every step's batch was new, so the journal holds each one: nothing was deduplicated away.
    assert growing["journal_folder"]["allocated"] >= growing["steps"] * growing["payload_tensor_bytes"]
    # What each record added to the peak resident memory, read from the kernel (VmHWM) on Linux.
    assert len(growing["record_peak_rss_added_bytes"]) == growing["steps"]
    assert growing["ratios"]["record_peak_rss_added_vs_payload"] >= 0
    # The same again in a child whose allocator keeps freed memory: the two variables, as typed in
    # performance.md's "Recording and the allocator".
    tuned = growing["tuned_malloc"]
    documented = dict(re.findall(r"^export (MALLOC_\w+)=(\d+)", (ROOT / "docs" / "performance.md").read_text(), re.M))
    assert tuned["env"] == documented == {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
    assert all(len(samples) == tuned["steps"] == 3 for samples in tuned["wall_s"].values())
    assert tuned["journal_folder"]["allocated"] >= tuned["steps"] * tuned["payload_tensor_bytes"]


def test_quick_run_measures_push_pull_and_a_cold_replay_against_a_real_s3_server(quick_report):
    remote = quick_report["figures"]["remote"]
    assert remote["steps"] == 2 and remote["payload_bytes"] > 0
    assert set(remote["median_s"]) == {"raw_put", "raw_get", "push", "pull", "raw_get_durable", "raw_get_one", "cold_replay",
                                       "push_cli"}
    assert all(value > 0 for value in remote["median_s"].values())


def test_quick_run_shares_through_the_command_line_as_typed(quick_report):
    shared = quick_report["figures"]["share_cli"]
    assert shared["payloads"] == 8 and shared["payload_bytes"] >= 8 * (84_000_000 // 20 // 8)
    assert set(shared["times_s"]) == {"client_put", "push_cli", "client_get_durable", "clone_cli"}
    assert all(len(v) == shared["repetitions"] and min(v) > 0 for v in shared["times_s"].values())


def test_quick_run_replays_cold_beside_warm(quick_report):
    replay = quick_report["figures"]["replay"]
    for name in ("journal_dict", "journal_dataproto", "verl", "plain"):
        assert replay[name]["cold_median_s"] > 0, name
    assert quick_report["ratios"]["dataproto"]["cold_replay_vs_cold_plain_read"] > 0


def test_quick_run_lookup_and_scan_agree_on_the_step_count(quick_report):
    ratios = quick_report["ratios"]["lookup"]
    assert ratios["recorded_steps"] == 300 and ratios["step_folders"] == 100
    assert "verl_rollout_skip_scan" in quick_report["figures"]["scan"], "verl's own scan was cross-checked"


def test_quick_run_measures_verify_in_a_fresh_process_in_bytes_per_second(quick_report):
    verify = quick_report["figures"]["verify"]
    for name in ("batch", "small"):
        assert verify[name]["payload_bytes"] > 0 and verify[name]["cli_wall_s"] > 0 and verify[name]["cli_cpu_s"] > 0
        rate = verify[name]["payload_bytes"] / verify[name]["cli_wall_s"] / 1e9
        assert verify[name]["cli_gb_s"] == pytest.approx(rate, abs=2e-3)
    assert set(quick_report["goals"]["verify_batch_gb_s"]) >= {"measured", "goal", "met"}


def test_every_goal_is_one_row_of_one_table_with_its_verdict(quick_report, monkeypatch):
    from rich.console import Console

    monkeypatch.syspath_prepend(str(ROOT))  # the benchmarks are the project's folder, not an installed package
    from benchmarks._cli import goal_table

    console = Console(record=True, width=240)
    console.print(goal_table(quick_report["goals"]))
    rows = {line.split("│")[1].strip(): line for line in console.export_text().splitlines() if line.startswith("│")}
    assert set(rows) == GOALS
    for name, goal in quick_report["goals"].items():
        assert rows[name].rstrip(" │").endswith("met" if goal["met"] else "NOT MET"), rows[name]
