"""Third-party policies found through a real `stepjournal.policies` entry point (a dist-info on sys.path)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN_SOURCE = '''
import attrs
from stepjournal.policies import GenerateCall, ServeRecorded


@attrs.frozen
class EveryOther:
    """Replay the previous step on even steps, generate and store on odd ones."""

    name: str = attrs.field(default="every_other", init=False)

    def decide(self, ctx, view):
        if ctx.step % 2 == 0:
            found = view.lookup(ctx.step - 1, ctx.gen_index)
            if found is not None:
                return ServeRecorded(found, reason=f"every_other: step {ctx.step - 1}")
        return GenerateCall(reason="every_other: odd step")


class NotAPolicy:
    pass


def make_not_a_policy():
    return NotAPolicy()
'''


def install_plugin(site: Path, entries: dict[str, str], *, module_source: str = PLUGIN_SOURCE) -> None:
    """Lay out a module and the dist-info of a distribution `sj-example-plugin` declaring `entries`."""
    (site / "sj_example_plugin.py").write_text(module_source)
    info = site / "sj_example_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sj-example-plugin\nVersion: 1.0\n")
    lines = "\n".join(f"{name} = {target}" for name, target in entries.items())
    (info / "entry_points.txt").write_text(f"[stepjournal.policies]\n{lines}\n")


def run_python(site: Path, code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(site), **env}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=environ, timeout=120
    )


@pytest.fixture
def site(tmp_path):
    path = tmp_path / "site"
    path.mkdir()
    install_plugin(
        path,
        {
            "every_other": "sj_example_plugin:EveryOther",
            "not_a_policy": "sj_example_plugin:make_not_a_policy",
            "broken": "sj_example_plugin_missing:Thing",
        },
    )
    return path


def test_plugin_policy_is_used_by_name_in_a_spec(site, tmp_path):
    result = run_python(
        site,
        f"""
        import sys
        from stepjournal import Journal
        from stepjournal.policies import Engine, parse, plugin_names
        assert "every_other" in plugin_names()
        assert "sj_example_plugin" not in sys.modules  # discovery does not import plugins
        policy = parse("every_other@1-;passthrough")
        assert "sj_example_plugin" in sys.modules
        with Journal({str(tmp_path / 'j')!r}) as j:
            engine = Engine(j, policy)
            actions = [engine.call(s, lambda: {{"s": s}}).action for s in range(1, 5)]
        print(actions)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "['generated', 'replayed', 'generated', 'replayed']"


def test_plugin_that_fails_to_import_is_named_with_its_distribution(site):
    result = run_python(
        site,
        """
        from stepjournal.policies import PluginError, parse
        try:
            parse("broken")
        except PluginError as exc:
            print(exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "'broken'" in result.stdout and "sj-example-plugin" in result.stdout
    assert "sj_example_plugin_missing" in result.stdout


def test_plugin_that_is_not_a_policy_is_rejected(site):
    result = run_python(
        site,
        """
        from stepjournal.policies import PluginError, parse
        try:
            parse("not_a_policy")
        except PluginError as exc:
            print(exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert "not a policy" in result.stdout and "NotAPolicy" in result.stdout


def test_disabling_autoload_hides_plugins(site):
    result = run_python(
        site,
        """
        from stepjournal.policies import SpecError, parse, plugin_names
        assert plugin_names() == {}
        try:
            parse("every_other")
        except SpecError as exc:
            print(exc)
        """,
        STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    assert result.returncode == 0, result.stderr
    assert "STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD" in result.stdout
