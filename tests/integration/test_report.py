"""`stepjournal report J -o run.html` in a real headless Chromium (Debian's `chromium`, driven by Playwright):
a 3 000-step journal's report loads without console errors, shows its charts, opens a step's samples with
the texts `show --text` prints, finds a known response by search, and names a replayed step's source.

Chromium is not a Python package: `make test` installs it where it is missing (as root, on Debian).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from stepjournal import Journal
from cli_support import run_cli
from test_samples import VOCAB, ids, tokenizer_dir  # noqa: F401  (tokenizer_dir: the fixture)

STEPS, RECORDED, SAMPLES = 3000, 2000, 4
KNOWN_STEP, KNOWN_SAMPLE, KNOWN = 1234, 2, "what is two plus four"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def response(step: int, i: int) -> str:
    if (step, i) == (KNOWN_STEP, KNOWN_SAMPLE):
        return KNOWN  # the only response with these words
    return " ".join(VOCAB[2 + (step * k + i) % 8] for k in (1, 3, 7))


@pytest.fixture(scope="module")
def report(tmp_path_factory, tokenizer_dir):  # noqa: F811
    folder = tmp_path_factory.mktemp("report")
    path = str(folder / "journal")
    with Journal(path, run="exp", fingerprint={"tokenizer": tokenizer_dir}, sync=False) as journal:
        for step in range(1, RECORDED + 1):
            batch = {"prompt_ids": [ids("the cat sat on")] * SAMPLES,
                     "response_ids": [ids(response(step, i)) for i in range(SAMPLES)]}
            journal.record(step, batch)
            journal.record(step, {"rewards": torch.tensor([float((step + i) % 5) for i in range(SAMPLES)])},
                           stage="reward")
    with Journal(path, run="exp", fingerprint={"tokenizer": tokenizer_dir}, sync=False) as journal:
        for step in range(RECORDED + 1, STEPS + 1):  # a later session repeats the recording
            journal.record_replay(step, journal.lookup(step - RECORDED), policy="repeat",
                                  reason=f"repeat: step {step} -> recorded step {step - RECORDED}")
    page = folder / "run.html"
    done = run_cli("report", path, "-o", str(page))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {page} ({STEPS} steps")  # one line, the path whole
    return path, page


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    assert CHROMIUM, "the report tests need Chromium: apt-get install -y chromium (make test installs it as root)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_report(browser, page_file: Path):
    tab = browser.new_page(viewport={"width": 1200, "height": 900})
    problems = []
    tab.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    tab.on("pageerror", lambda error: problems.append(str(error)))
    tab.on("request", lambda request: problems.append(f"network: {request.url}")
           if not request.url.startswith("file://") else None)
    tab.goto(page_file.as_uri())
    return tab, problems


def go_to_step(tab, step: int) -> None:
    """Page the table forward to the page holding `step`, then open the step."""
    for _ in range((step - 1) // 100):
        tab.click("#next")
    tab.click(f'tr.step[data-step="{step}"]')


def test_the_report_loads_offline_without_console_errors_and_shows_its_charts(report, browser, tmp_path):
    _, page_file = report
    tab, problems = open_report(browser, page_file)
    assert tab.locator("#charts figure").count() == 4
    assert tab.locator("#charts polyline").count() >= 3 and tab.locator("#charts rect").count() >= STEPS
    assert tab.locator("tr.step").count() == 100 and tab.inner_text("#where") == f"steps 1-100 of {STEPS}"
    tab.screenshot(path=str(tmp_path / "report.png"), full_page=False)
    assert problems == []
    assert page_file.stat().st_size < 12 * 1024 * 1024


def test_a_click_on_a_step_shows_the_texts_show_text_prints(report, browser):
    path, page_file = report
    tab, problems = open_report(browser, page_file)
    go_to_step(tab, KNOWN_STEP)
    shown = tab.locator("#samples pre.response").all_inner_texts()
    expected = json.loads(run_cli("show", path, str(KNOWN_STEP), "--text", "--json").stdout)["samples"]
    assert shown == [s["response"] for s in expected] and shown[KNOWN_SAMPLE] == KNOWN
    assert tab.locator("#samples pre.prompt").all_inner_texts() == [s["prompt"] for s in expected]
    assert problems == []


def test_a_search_finds_a_known_response(report, browser):
    _, page_file = report
    tab, problems = open_report(browser, page_file)
    tab.fill("#search", "two plus four")
    hits = tab.locator("#hits .hit").all_inner_texts()
    assert hits == [f"step {KNOWN_STEP} · sample {KNOWN_SAMPLE}: {KNOWN}"]
    tab.click("#hits .hit")
    assert tab.inner_text("#samples h3").startswith(f"step {KNOWN_STEP}: generated")
    assert problems == []


def test_a_replayed_step_names_its_source_step(report, browser):
    _, page_file = report
    tab, problems = open_report(browser, page_file)
    go_to_step(tab, 2500)
    assert tab.inner_text("#samples h3").startswith("step 2500: replayed from step 500")
    assert tab.locator("#samples pre.response").all_inner_texts()[0] == response(500, 0)
    assert problems == []


def test_past_the_text_budget_every_embedded_text_is_cut_to_its_share(report, tokenizer_dir, monkeypatch):  # noqa: F811
    from transformers import AutoTokenizer

    from stepjournal.adapters.cli import _report  # private: a CLI helper under test

    path, _ = report
    monkeypatch.setattr(_report, "TEXT_BUDGET", 2 * SAMPLES * STEPS * 10)  # 10 characters a text
    monkeypatch.setattr(_report, "_MIN_CHARS", 5)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    with Journal(path, readonly=True) as journal:
        data = _report.collect(journal, "exp", tokenizer, per_step=SAMPLES, chars=2000)
    texts = [s[k] for e in data["steps"] for s in e["samples"] for k in ("prompt", "response") if s[k]]
    assert len(texts) == 2 * SAMPLES * STEPS and max(len(t) for t in texts) == 11  # 10 and the "…"
    assert "the cat sa…" in texts and sum(t.endswith("…") for t in texts) > STEPS
    assert {e["count"] for e in data["steps"]} == {SAMPLES}  # the summaries still cover every sample


# -- the metrics stage and --session: a TRL-shaped run that journaled only generate and metrics (TRL's default) --
METRIC_STEPS = 30


def trl_logged(step: int, session: int) -> dict:
    return {"loss": 0.5 / step + session, "reward": (step % 7) / 4, "kl": 0.01 * step, "model": "tiny"}


@pytest.fixture(scope="module")
def metrics_report(tmp_path_factory):
    """The recording (s1), then a session replaying its generations and logging its own metrics (s2); the report
    of the run, and of each session."""
    folder = tmp_path_factory.mktemp("metrics")
    path = str(folder / "journal")
    for session in (0, 1):
        with Journal(path, run="trl", sync=False) as journal:
            for step in range(1, METRIC_STEPS + 1):
                if session == 0:
                    journal.record(step, {"prompt_ids": [ids("what is two")] * 2,
                                          "response_ids": [ids("four"), ids(response(step, 1))]})
                else:
                    journal.record_replay(step, journal.lookup(step), policy="replay", reason="replay")
                journal.record(step, trl_logged(step, session), stage="metrics")
    pages = {}
    for name, extra in (("all", []), ("s1", ["--session", "s1"]), ("s2", ["--session", "s2"])):
        pages[name] = folder / f"{name}.html"
        done = run_cli("report", path, "-o", str(pages[name]), "--no-text", *extra)
        assert done.returncode == 0, done.stderr
    with Journal(path, readonly=True) as journal:
        sessions = list(dict.fromkeys(e.session for _, e in journal.sessions()))
        journaled = {(sessions.index(r.session), r.step): journal.load(journal.event(r.seq).output)
                     for r in journal.audit(stage="metrics")}
    return path, pages, journaled


def shown_number(value: float) -> str:
    """A number as the page's metrics line shows it: 4 significant digits (JavaScript's shortest form)."""
    return f"{float(f'{value:.4g}'):g}"


def metrics_line(journaled: dict, session: int, step: int) -> str:
    numbers = {k: v for k, v in journaled[(session, step)].items() if isinstance(v, float)}
    return "metrics: " + " · ".join(f"{k} {shown_number(v)}" for k, v in numbers.items())


def test_the_metrics_stage_is_charted_when_only_generate_was_journaled(metrics_report, browser):
    _, pages, journaled = metrics_report
    tab, problems = open_report(browser, pages["all"])
    charts = tab.locator("#metrics figure")
    assert tab.locator("#metrics figcaption").all_inner_texts() == ["kl", "loss", "reward"]  # "model" is no number
    # Without --session each step shows its generate call's session: the replay (s2), with its own metrics.
    for k, name in enumerate(["kl", "loss", "reward"]):
        values = [journaled[(1, step)][name] for step in range(1, METRIC_STEPS + 1)]
        assert charts.nth(k).locator("text.tick").all_text_contents()[:2] == [f"{max(values):.3g}", f"{min(values):.3g}"]
        (line,) = charts.nth(k).locator("polyline").all()
        assert len(line.get_attribute("points").split()) == METRIC_STEPS
    tab.click('tr.step[data-step="7"]')
    assert tab.inner_text("#samples h3").startswith("step 7: replayed from step 7")
    assert tab.inner_text("#samples p.metrics") == metrics_line(journaled, 1, 7)
    assert problems == []


def test_session_reports_one_sessions_calls_and_metrics(metrics_report, browser):
    _, pages, journaled = metrics_report
    for session, name, served in ((0, "s1", "generated"), (1, "s2", "replayed from step 12")):
        tab, problems = open_report(browser, pages[name])
        assert tab.inner_text("h1").endswith(f"run trl, session {name}")
        tab.click('tr.step[data-step="12"]')
        assert tab.inner_text("#samples h3").startswith(f"step 12: {served} · 2 samples")
        assert tab.inner_text("#samples p.metrics") == metrics_line(journaled, session, 12)
        losses = [journaled[(session, step)]["loss"] for step in range(1, METRIC_STEPS + 1)]
        assert tab.locator("#metrics figure").nth(1).locator("text.tick").all_text_contents()[:2] == [
            f"{max(losses):.3g}", f"{min(losses):.3g}"]
        assert problems == []


def test_an_unknown_session_is_refused_naming_the_runs_sessions(metrics_report, tmp_path):
    path, _, _ = metrics_report
    done = run_cli("report", path, "-o", str(tmp_path / "x.html"), "--no-text", "--session", "s3")
    assert done.returncode == 2 and not (tmp_path / "x.html").exists()
    assert "--session s3: no session matches; its sessions are: s1 (" in done.stderr and ", s2 (" in done.stderr


HOSTILE = "</script><script>alert(1)</script>"


def test_hostile_metric_names_and_numbers_draw_as_text_and_charts_without_errors(tmp_path, browser):
    """A metric named to close the script, one constant at 1e20 (TRL's total_flos: ± 0.5 is lost beside it),
    one spanning -1e308 to 1e308, one past float's range and a NaN: the page loads with no console error and no
    dialog, each name is shown as text, and every point of every chart is a number."""
    path = str(tmp_path / "hostile")
    with Journal(path, run="trl", sync=False) as journal:
        for step, wide in ((1, 1e308), (2, -1e308), (3, 0.0)):
            journal.record(step, {"prompt_ids": [[2]], "response_ids": [[3, 1]]})
            journal.record(step, {HOSTILE: float(step), "total_flos": 1e20, "wide": wide, "huge": 10**400,
                                  "nan": float("nan")}, stage="metrics")
    page = tmp_path / "hostile.html"
    done = run_cli("report", path, "-o", str(page), "--no-text")
    assert done.returncode == 0, done.stderr
    tab, problems = open_report(browser, page)
    dialogs = []
    tab.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    tab.reload()
    # A name whose every value is no number (NaN, 10**400) keeps its chart, empty: the curve a loss gone NaN left.
    assert tab.locator("#metrics figcaption").all_inner_texts() == [HOSTILE, "huge", "nan", "total_flos", "wide"]
    coordinates = [v for p in tab.locator("#metrics polyline").all() for v in
                   p.get_attribute("points").replace(",", " ").split()]
    coordinates += [c.get_attribute(a) for c in tab.locator("#metrics circle").all() for a in ("cx", "cy")]
    assert coordinates and all(float(v) == float(v) and abs(float(v)) < 2000 for v in coordinates), coordinates
    tab.click('tr.step[data-step="2"]')
    assert tab.inner_text("#samples p.metrics") == (f"metrics: {HOSTILE} 2 · total_flos 100000000000000000000 · "
                                                    "wide -1e+308 · huge - · nan -")
    assert problems == [] and dialogs == []


@pytest.fixture(scope="module")
def tools_report(tmp_path_factory):
    """The agent loop of tests/agent_tools.py, recorded with `cache`, then run again with sample 0 changed at turn
    2 (its later calls miss); the report of each session."""
    from agent_tools import run_phase

    folder = tmp_path_factory.mktemp("tools-report")
    path = str(folder / "agents")
    run_phase(path, "cache")
    run_phase(path, "cache", changed_sample=0, shift=True)
    pages = {}
    for name in ("s1", "s2"):
        pages[name] = folder / f"{name}.html"
        done = run_cli("report", path, "-o", str(pages[name]), "--no-text", "--session", name)
        assert done.returncode == 0, done.stderr
    return path, pages


def test_the_report_counts_each_steps_tool_calls_as_audit_tools_does(tools_report, browser):
    path, pages = tools_report
    from stepjournal.tools import tool_call_rows, tool_step_summaries

    with Journal(path, readonly=True) as journal:
        rows = tool_call_rows(journal, payloads=False)
    sessions = list(dict.fromkeys(row.session for row in rows))
    for k, name in enumerate(("s1", "s2")):
        summaries = tool_step_summaries([row for row in rows if row.session == sessions[k]])
        tab, problems = open_report(browser, pages[name])
        assert "tool calls per step: calls, replayed, misses" in tab.locator("#charts figcaption").all_inner_texts()
        assert tab.locator("#steps th").all_inner_texts()[-1] == "tool calls"
        for s in summaries:
            row = tab.locator(f'tr.step[data-step="{s.step}"] td.tools')
            assert row.inner_text() == f"{s.calls} ({s.replayed} replayed, {s.misses} misses)"
            tab.click(f'tr.step[data-step="{s.step}"]')
            line = tab.inner_text("#samples p.tools")
            assert line.startswith(f"tool calls: {s.calls} · replayed {s.replayed} · misses {s.misses} "
                                   f"(refused {s.refused}) · tool time {s.tool_s:.3f} s · saved {s.saved_s:.3f} s")
        assert problems == []
    # The recording ran every call; the changed run replayed all but the changed sample's last three.
    assert [tab.locator(f'tr.step[data-step="{step}"] td.tools').inner_text() for step in (1, 2)] == [
        "21 (18 replayed, 3 misses)"] * 2


def test_a_run_without_tool_calls_has_no_tool_column_or_chart(report, browser):
    _, page = report
    tab, problems = open_report(browser, page)
    assert tab.locator("#steps th").all_inner_texts()[-1] == "samples"
    assert not any("tool calls" in caption for caption in tab.locator("#charts figcaption").all_inner_texts())
    assert problems == []
