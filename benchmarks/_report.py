"""Turn the measured figures into the ratios and goals of issue 7."""

from __future__ import annotations

from typing import Any, Dict, Optional

__all__ = ["goals_and_ratios"]


def _goal(measured: Optional[float], goal: float, op: str, unit: str, basis: str) -> Dict[str, Any]:
    if measured is None:
        return {"measured": None, "goal": goal, "op": op, "unit": unit, "met": False, "basis": basis,
                "note": "not measured in this run"}
    met = measured <= goal if op == "<=" else measured >= goal
    return {"measured": round(measured, 4), "goal": goal, "op": op, "unit": unit, "met": bool(met), "basis": basis}


def _median(section: Dict[str, Any], name: str) -> Optional[float]:
    found = section.get(name)
    return None if found is None else found["median_s"]


def _div(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return None if a is None or not b else a / b


def goals_and_ratios(figures: Dict[str, Any], main: str) -> Dict[str, Any]:
    """Ratios for every workload format, and the goals evaluated on `main` (DataProto when available)."""
    record, replay = figures["record"], figures["replay"]
    sizes = record["sizes"]
    payload = sizes["payload_tensor_bytes"]
    ratios: Dict[str, Any] = {}
    for fmt in ("dict", "dataproto"):
        rec = _median(record, f"journal_record_{fmt}")
        rep = _median(replay, f"journal_{fmt}")
        if rec is None:
            continue
        ratios[fmt] = {
            "record_vs_plain_write_fsync": _div(rec, _median(record, "plain_write_fsync")),
            "record_vs_verl_save_to_disk": _div(rec, _median(record, "verl_save_to_disk")),
            "replay_vs_plain_read": _div(rep, _median(replay, "plain")),
            "cold_replay_vs_cold_plain_read": _div(replay[f"journal_{fmt}"].get("cold_median_s"),
                                                   replay.get("plain", {}).get("cold_median_s")),
            "replay_vs_plain_readinto_numpy": _div(rep, _median(replay, "plain_into")),
            "verl_load_from_disk_vs_replay": _div(_median(replay, "verl"), rep),
            "replay_peak_rss_vs_payload": _div(replay[f"journal_{fmt}"]["peak_rss_delta_bytes"], payload),
            "disk_bytes_vs_verl_dp": _div(sizes["journal_disk_growth_per_step_bytes"][fmt], sizes.get("verl_dp_bytes")),
        }
    ratios["zstd"] = {
        "record_vs_plain_write_fsync": _div(_median(record, "journal_record_zstd"), _median(record, "plain_write_fsync")),
        "replay_vs_plain_read": _div(_median(replay, "journal_zstd"), _median(replay, "plain")),
        "disk_bytes_vs_verl_dp": _div(sizes["journal_disk_growth_per_step_bytes"]["zstd"], sizes.get("verl_dp_bytes")),
        "disk_bytes_vs_payload": _div(sizes["journal_disk_growth_per_step_bytes"]["zstd"], payload),
    }
    ratios["verl"] = {
        "verl_save_vs_plain_write_fsync": _div(_median(record, "verl_save_to_disk"), _median(record, "plain_write_fsync")),
        "verl_load_vs_plain_read": _div(_median(replay, "verl"), _median(replay, "plain")),
        "verl_load_peak_rss_vs_payload": _div(replay.get("verl", {}).get("peak_rss_delta_bytes"), payload),
        "verl_dp_bytes_vs_payload": _div(sizes.get("verl_dp_bytes"), payload),
    }

    lookup, scan, passthrough = figures["lookup"], figures["scan"], figures["passthrough"]
    decision = max(lookup[p]["steady_state"]["median_s"] for p in ("nearest", "repeat"))
    first_call = max(lookup[p]["first_call_fresh_handle"]["median_s"] for p in ("nearest", "repeat"))
    scan_s = scan["reimplemented_scan"]["median_s"]
    ratios["lookup"] = {
        "decision_ms_steady": decision * 1e3,
        "decision_ms_first_call_fresh_handle": first_call * 1e3,
        "folder_scan_vs_decision_steady": scan_s / decision,
        "folder_scan_vs_decision_first_call": scan_s / first_call,
        "recorded_steps": lookup["recorded_steps"],
        "step_folders": scan["step_folders"],
    }
    overhead_us = (passthrough["durable"]["median_s"] - passthrough["bare_call_s"]) * 1e6
    ratios["passthrough"] = {
        "overhead_us_durable": overhead_us,
        "overhead_us_sync_false": (passthrough["sync_false"]["median_s"] - passthrough["bare_call_s"]) * 1e6,
    }

    r = ratios[main]
    n = lookup["recorded_steps"]
    goals = {
        "replay_vs_plain_read": _goal(r["replay_vs_plain_read"], 1.0, "<=", "x", f"{main}, fresh process, page cache warm"),
        "replay_speedup_vs_verl_load": _goal(r["verl_load_from_disk_vs_replay"], 5.0, ">=", "x", f"{main} vs DataProto.load_from_disk"),
        "record_vs_plain_write_fsync": _goal(r["record_vs_plain_write_fsync"], 1.2, "<=", "x", f"{main}, durable (sync=True)"),
        "record_vs_verl_save": _goal(r["record_vs_verl_save_to_disk"], 1.0, "<=", "x", f"{main}, durable vs verl's non-durable dump"),
        "lookup_ms_per_decision": _goal(decision * 1e3, 1.0, "<=", "ms", f"max of nearest/repeat, steady state, {n} steps"),
        "lookup_speedup_vs_folder_scan": _goal(scan_s / decision, 100.0, ">=", "x", f"{scan['step_folders']} step folders vs {n} steps"),
        "passthrough_overhead_us": _goal(overhead_us, 100.0, "<=", "us", "durable journal (sync=True), per call"),
        "disk_bytes_compressed_vs_verl_dp": _goal(ratios["zstd"]["disk_bytes_vs_verl_dp"], 0.4, "<=", "x", f"zstd, {main}, journal growth per step vs .dp file"),
        "replay_peak_rss_vs_payload": _goal(r["replay_peak_rss_vs_payload"], 1.5, "<=", "x", f"{main}, first replay in a fresh process"),
    }
    goals.update(figures.get("cli_start", {}).get("goals", {}))
    goals.update(figures.get("verb_start", {}).get("goals", {}))
    for section in ("record_growing", "record_isolated", "group_commit", "diff", "remote", "share_cli", "verify"):
        goals.update(figures.get(section, {}).get("goals", {}))
    return {"ratios": _rounded(ratios), "goals": goals}


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, float):
        return round(value, 4)
    return value
