"""One session is never shown as another's: in `report`, `show --text` and `Journal.samples`, a step's recording
and each later session (a refused replay, a replay that computed its rewards live) stay apart, and a start that
fails on its policy spec leaves no empty session behind (`runs`).

The journals are made as a trainer makes them: a rollout and a reward function under `journaled`, one
`Journal` per session; the command line runs in a process of its own (`run_cli`).
"""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from stepjournal import Journal
from stepjournal.adapters import journaled
from stepjournal.policies import Engine, FingerprintMismatchError, SpecError
from cli_support import run_cli
from test_report import browser, open_report  # noqa: F401  (browser: the fixture, a headless Chromium)
from test_samples import tokenizer_dir  # noqa: F401  (the fixture: a real tokenizer saved to a folder)

RECORDED_REWARD = 1.0


def rollout(step: int, answer: int = 0) -> dict:
    return {"prompt_ids": [[2, 3], [2, 4]], "response_ids": [[5, step], [6, step + answer, 7]]}


def session(path: str, generate_policy: str, reward_policy: str, reward: float, *, steps=(1, 2),
            model: str = "m", answer: int = 0) -> None:
    """One session of a trainer: each step generates (or replays) and then scores its samples."""
    with Journal(path, run="exp", fingerprint={"model": model}) as journal:
        generate = journaled(lambda step: rollout(step, answer), journal, generate_policy)
        score = journaled(lambda batch, step: {"rewards": torch.full((len(batch["response_ids"]),), reward)},
                          journal, reward_policy, stage="reward")
        for step in steps:
            score(generate(step=step), step=step)


def report_data(path: str, tmp_path) -> dict:
    """The data `report` embeds in its page, by step."""
    page = tmp_path / "run.html"
    done = run_cli("report", path, "-o", str(page), "--no-text")
    assert done.returncode == 0, done.stderr
    embedded = re.search(r'<script type="application/json" id="data">(.*?)</script>', page.read_text(), re.S)
    return {entry["step"]: entry for entry in json.loads(embedded.group(1))["steps"]}


def show_text(path: str, step: int, tokenizer: str) -> list:
    """``show STEP --text --json``'s samples: (action, rewards, session) of each."""
    done = run_cli("show", path, str(step), "--text", "--json", "--tokenizer", tokenizer)
    assert done.returncode == 0, done.stderr
    return [(s["action"], s["rewards"], s.get("session")) for s in json.loads(done.stdout)["samples"]]


def session_ids(path: str) -> list:
    with Journal(path, readonly=True) as journal:
        return [opened.session for _, opened in journal.sessions()]


# -- a refused replay session ----------------------------------------------------------------------------------------
def test_a_refused_replay_session_does_not_replace_the_recorded_step(tmp_path, tokenizer_dir):  # noqa: F811
    path = str(tmp_path / "j")
    session(path, "dump", "dump", RECORDED_REWARD)
    with pytest.raises(FingerprintMismatchError):  # another model: the replay's check refuses step 1
        session(path, "replay", "replay", 5.0, model="other")
    recording, _ = session_ids(path)
    with Journal(path, readonly=True) as journal:
        assert [r.action for r in journal.audit(steps={1}, stage="generate")] == ["generated", "refused"]
    steps = report_data(path, tmp_path)
    # Step 1 is still its recording, with its own rewards; the refusal is s2's, shown apart.
    assert (steps[1]["action"], steps[1]["mean"]) == ("generated", RECORDED_REWARD)
    assert steps[1]["session"] == "s1"
    assert steps[1]["others"] == [{"session": "s2", "action": "refused", "source_step": None}]
    assert [s["rewards"] for s in steps[1]["samples"]] == [{"reward": RECORDED_REWARD}] * 2
    assert (steps[2]["action"], steps[2]["others"]) == ("generated", [])  # s2 never reached step 2
    assert set(steps[1]["durations"]) == {"generate", "reward"}  # s1's calls only
    # Every per-step view shows the recording too.
    shown = run_cli("show", path, "1", "--json")
    assert shown.returncode == 0, shown.stderr
    assert (json.loads(shown.stdout)["call"]["action"], json.loads(shown.stdout)["call"]["session"]) == (
        "generated", recording)
    assert show_text(path, 1, tokenizer_dir) == [("generated", {"reward": RECORDED_REWARD}, recording)] * 2


def test_the_report_page_names_each_session_of_a_step_apart(tmp_path, browser):  # noqa: F811
    path = str(tmp_path / "j")
    session(path, "dump", "dump", RECORDED_REWARD)
    with pytest.raises(FingerprintMismatchError):
        session(path, "replay", "replay", 5.0, model="other")
    page = tmp_path / "run.html"
    assert run_cli("report", path, "-o", str(page), "--no-text").returncode == 0
    tab, problems = open_report(browser, page)
    assert tab.locator("tr.step").first.locator("td").nth(1).inner_text() == "generated (s1) · s2: refused"
    assert tab.locator("tr.step").nth(1).locator("td").nth(1).inner_text() == "generated"
    tab.click('tr.step[data-step="1"]')
    assert tab.inner_text("#samples h3").startswith("step 1: generated (s1) · s2: refused · 2 samples")
    assert problems == []


# -- a replay that computed its rewards live -------------------------------------------------------------------------
def test_a_replay_that_scored_live_without_storing_is_not_shown_with_the_recordings_rewards(tmp_path, tokenizer_dir):  # noqa: F811
    path = str(tmp_path / "j")
    session(path, "dump", "dump", RECORDED_REWARD)
    session(path, "replay", "passthrough", 7.0)  # the rewards ran live (7.0) and were not stored
    _, replay = session_ids(path)
    assert show_text(path, 1, tokenizer_dir) == [("replayed", {}, replay)] * 2
    steps = report_data(path, tmp_path)
    assert (steps[1]["action"], steps[1]["mean"]) == ("replayed", None)
    assert [s["rewards"] for s in steps[1]["samples"]] == [{}, {}]
    assert steps[1]["session"] == "s2"
    assert steps[1]["others"] == [{"session": "s1", "action": "generated", "source_step": None}]


def test_a_replay_shows_the_rewards_it_computed_and_never_a_later_sessions(tmp_path, tokenizer_dir):  # noqa: F811
    path = str(tmp_path / "j")
    session(path, "dump", "dump", RECORDED_REWARD)
    session(path, "replay", "dump", 7.0)  # generate replayed, rewards computed live and stored
    session(path, "passthrough", "dump", 9.0)  # generated again, not stored: nothing to show; its rewards stored
    _, replay, _ = session_ids(path)
    # The call shown is s2's replay (s3 stored no generation): s2's rewards, not s3's nor s1's.
    with Journal(path, readonly=True) as journal:
        assert [(s.action, s.rewards) for s in journal.samples(1)] == [("replayed", {"reward": 7.0})] * 2
    assert show_text(path, 1, tokenizer_dir) == [("replayed", {"reward": 7.0}, replay)] * 2
    steps = report_data(path, tmp_path)
    assert (steps[1]["action"], steps[1]["mean"], steps[1]["session"]) == ("replayed", 7.0, "s2")
    assert [o["session"] for o in steps[1]["others"]] == ["s1", "s3"]


def test_diff_text_shows_the_compared_recording_not_a_later_replay_session(tmp_path, tokenizer_dir):  # noqa: F811
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    session(a, "dump", "dump", RECORDED_REWARD)
    session(a, "replay", "dump", 7.0)  # a later session of A replays step 1 and scores it 7.0
    session(b, "dump", "dump", RECORDED_REWARD, answer=8)
    done = run_cli("diff", a, b, "--text", "--json", "--tokenizer", tokenizer_dir)
    assert done.returncode == 1, done.stderr
    text = json.loads(done.stdout)["text"]
    # A's side is the recording the diff compared (s1's): its reward, not the replay session's 7.0.
    assert (text["step"], text["a"]["rewards"], text["b"]["rewards"]) == (1, {"reward": RECORDED_REWARD},
                                                                        {"reward": RECORDED_REWARD})
    assert (text["a"]["action"], text["a"]["session"]) == ("generated", session_ids(a)[0])
    with Journal(a, readonly=True) as journal:  # one session's samples: its call, with its rewards
        assert {(s.action, s.rewards["reward"]) for s in journal.samples(1, session=session_ids(a)[1])} == {
            ("replayed", 7.0)}


# -- a start that fails ----------------------------------------------------------------------------------------------
def test_a_policy_spec_refused_after_the_journal_opened_leaves_no_session_behind(tmp_path):
    path = str(tmp_path / "j")
    session(path, "dump", "dump", RECORDED_REWARD)
    before = run_cli("runs", path, "--json")
    assert before.returncode == 0, before.stderr
    with Journal(path, run="exp", fingerprint={"model": "m"}) as journal:
        with pytest.raises(SpecError, match="replya"):
            journaled(lambda step: rollout(step), journal, "replya")
        with pytest.raises(SpecError, match="replya"):
            Engine(journal, "generate:cache/reward:replya")
    after = run_cli("runs", path, "--json")
    assert after.returncode == 0, after.stderr
    assert [len(r["sessions"]) for r in json.loads(after.stdout)] == [1]
    assert after.stdout == before.stdout
    assert sorted(report_data(path, tmp_path)) == [1, 2]
    with Journal(path, run="exp", fingerprint={"model": "m"}) as journal:  # the next start is s2, with its call
        journaled(lambda step: rollout(step), journal, "replay")(step=1)
    assert [s["session"] for s in json.loads(run_cli("runs", path, "--json").stdout)[0]["sessions"]] == session_ids(path)
    assert report_data(path, tmp_path)[1]["session"] == "s2"


def test_a_verl_attach_refused_for_its_stage_spec_leaves_no_session_behind(tmp_path):
    from stepjournal.adapters.verl import attach
    from stepjournal.policies import ConfigError
    from verl_support import FakeGenerator, MiniPPOTrainer, verl_config

    recorded = MiniPPOTrainer(verl_config(str(tmp_path), policy="dump"), FakeGenerator())
    recorded.journaled = attach(recorded)
    try:
        recorded.fit(start=1)
    finally:
        recorded.journaled.close()
    path = os.path.join(str(tmp_path), "stepjournal")
    before = run_cli("runs", path, "--json")
    assert before.returncode == 0, before.stderr
    trainer = MiniPPOTrainer(verl_config(str(tmp_path), policy="generate:replay/rewrd:replay"), FakeGenerator())
    with pytest.raises(ConfigError, match="unknown stage 'rewrd'"):
        attach(trainer)
    after = run_cli("runs", path, "--json")
    assert after.returncode == 0, after.stderr
    assert [len(r["sessions"]) for r in json.loads(after.stdout)] == [1]
    assert after.stdout == before.stdout
