"""The library is quiet: its log events go to stdlib `logging` under ``stepjournal``, never to stdout."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

from stepjournal import Journal, journaled

from log_capture import captured_events

USER_SCRIPT = textwrap.dedent(
    """
    import sys
    from stepjournal import Journal, journaled

    with Journal(sys.argv[1], run="quiet") as journal:
        rollout = journaled(lambda prompts: {"y": prompts}, journal, "cache")
        for step in (1, 2, 2):
            rollout([step], step=step)
    with Journal(sys.argv[1], run="quiet") as journal:
        replay = journaled(lambda prompts: 1 / 0, journal, "replay")
        replay([1], step=1)
    print("result 42")
    """
)


def _run(code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_a_user_script_prints_only_what_it_prints_itself(tmp_path):
    done = _run(USER_SCRIPT, str(tmp_path / "j"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "result 42\n"
    assert done.stderr == ""


def test_logging_basic_config_at_info_shows_the_key_value_events_on_stderr(tmp_path):
    code = "import logging; logging.basicConfig(level=logging.INFO)\n" + USER_SCRIPT
    done = _run(code, str(tmp_path / "j"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == "result 42\n"
    assert "INFO:stepjournal.policies._engine:" in done.stderr and "step=1" in done.stderr


def test_the_stepjournal_logger_level_silences_the_library(tmp_path):
    code = (
        "import logging; logging.basicConfig(level=logging.DEBUG)\n"
        "logging.getLogger('stepjournal').setLevel(logging.ERROR)\n" + USER_SCRIPT
    )
    done = _run(code, str(tmp_path / "j"))
    assert done.returncode == 0, done.stderr
    assert "stepjournal" not in done.stderr


def test_records_carry_the_event_fields_for_json_formatters(jpath):
    with captured_events(logging.DEBUG) as events, Journal(jpath, run="fields") as journal:
        journaled(lambda x: {"y": x}, journal, "cache")(1, step=3)
    recorded = [e for e in events if e.get("step") == 3]
    assert recorded, events
    assert all(isinstance(e["event"], str) for e in recorded)
    json.dumps(recorded, default=str)  # plain data a JSON formatter can write
