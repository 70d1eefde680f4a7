"""Third-party policies found through a real `stepjournal.policies` entry point (a dist-info on sys.path)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PLUGIN_SOURCE = '''
from typing import Optional

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


@attrs.frozen
class EveryNth:
    """Serve step s from step s-1 when s is a multiple of n; typed arguments for the spec's checks."""

    n: int = 2
    tag: str = "x"
    ratio: float = 1.0
    loud: bool = False
    name: str = attrs.field(default="every_nth", init=False)

    def decide(self, ctx, view):
        if ctx.step % self.n == 0:
            found = view.lookup(ctx.step - 1, ctx.gen_index)
            if found is not None:
                return ServeRecorded(found, reason=f"every_nth: step {ctx.step - 1}")
        return GenerateCall(reason="every_nth: generate")


def make_window(size: int, label: Optional[str] = None):
    """A factory with a required argument."""
    return EveryNth(n=size, tag=label or "window")


class NotAPolicy:
    pass


def make_not_a_policy():
    return NotAPolicy()


NOT_CALLABLE = 3


def make_refusing():
    from stepjournal.policies import PluginError

    raise PluginError("refusing: this plugin needs SJ_REFUSING_OK=1")
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
            "every_nth": "sj_example_plugin:EveryNth",
            "window": "sj_example_plugin:make_window",
            "not_a_policy": "sj_example_plugin:make_not_a_policy",
            "not_callable": "sj_example_plugin:NOT_CALLABLE",
            "broken": "sj_example_plugin_missing:Thing",
            "refusing": "sj_example_plugin:make_refusing",
            "cache": "sj_example_plugin:EveryOther",
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


def parse_error(site: Path, spec: str, error: str, **env: str) -> str:
    """The message of the `error` (a stepjournal.policies class) that parsing `spec` raises, in a subprocess."""
    result = run_python(
        site,
        f"""
        from stepjournal.policies import {error}, parse
        try:
            parse({spec!r})
        except {error} as exc:
            print(exc)
        else:
            print("parsed")
        """,
        **env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_plugin_that_fails_to_import_is_named_with_its_distribution(site):
    message = parse_error(site, "broken", "PluginError")
    assert "'broken'" in message and "sj-example-plugin" in message
    assert "sj_example_plugin_missing" in message


def test_plugin_that_is_not_a_policy_is_rejected(site):
    message = parse_error(site, "not_a_policy", "PluginError")
    assert "not a policy" in message and "NotAPolicy" in message


def test_disabling_autoload_hides_plugins(site):
    result = run_python(
        site,
        """
        from stepjournal.policies import SpecError, parse, plugin_names, plugin_report
        assert plugin_names() == {} and plugin_report() == ()
        try:
            parse("every_other")
        except SpecError as exc:
            print(exc)
        """,
        STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD="1",
    )
    assert result.returncode == 0, result.stderr
    assert "STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD" in result.stdout


def test_plugin_that_fails_to_load_in_a_config_names_plugin_distribution_and_import_error(site, tmp_path):
    """Not `unknown error (...) @ config`: a PluginError with the plugin, its distribution and the cause."""
    result = run_python(
        site,
        f"""
        from stepjournal.policies import ConfigError, PluginError, PluginLoadError, load_config
        try:
            load_config({{"path": {str(tmp_path / 'j')!r}, "policy": "dump@1-3;broken"}})
        except PluginError as exc:
            assert isinstance(exc, PluginLoadError) and isinstance(exc, ConfigError)
            print(exc.plugin, exc.target, exc.distribution, exc.version, sep="|")
            print(exc.error)
            print(exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    fields, error, message = result.stdout.strip().splitlines()[-3:]
    assert fields == "broken|sj_example_plugin_missing:Thing|sj-example-plugin|1.0"
    assert error == "ModuleNotFoundError: No module named 'sj_example_plugin_missing'"
    assert "unknown error" not in message
    assert all(part in message for part in ("'broken'", "sj-example-plugin 1.0", "ModuleNotFoundError", error))


def test_plugin_error_that_is_no_config_error_passes_through_load_config_as_it_is(site, tmp_path):
    """`_find_config_error` passes any PluginError through, not only those that are also ConfigErrors."""
    result = run_python(
        site,
        f"""
        from stepjournal.policies import ConfigError, PluginError, load_config
        try:
            load_config({{"path": {str(tmp_path / 'j')!r}, "policy": "refusing"}})
        except PluginError as exc:
            assert not isinstance(exc, ConfigError)
            print(exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "refusing: this plugin needs SJ_REFUSING_OK=1"


def test_plugin_report_says_which_plugins_load_and_why_the_others_do_not(site):
    result = run_python(
        site,
        """
        import json
        import attrs
        from stepjournal.policies import PluginStatus, plugin_report
        report = plugin_report()
        assert all(isinstance(status, PluginStatus) for status in report)
        print(json.dumps([attrs.asdict(status) for status in report]))
        """,
    )
    assert result.returncode == 0, result.stderr
    report = {row["name"]: row for row in json.loads(result.stdout.strip().splitlines()[-1])}
    assert list(report) == sorted(report)
    assert report["every_other"] == {
        "name": "every_other", "target": "sj_example_plugin:EveryOther", "distribution": "sj-example-plugin",
        "version": "1.0", "loads": True, "error": None, "shadowed": False,
    }
    assert report["window"]["loads"] is True  # needs an argument: importing it is all that can be checked
    assert report["broken"]["loads"] is False
    assert report["broken"]["error"] == "ModuleNotFoundError: No module named 'sj_example_plugin_missing'"
    assert report["not_a_policy"]["loads"] is False and "NotAPolicy, not a policy" in report["not_a_policy"]["error"]
    assert report["not_callable"]["loads"] is False and "int is not a policy" in report["not_callable"]["error"]
    assert report["cache"]["shadowed"] is True and report["cache"]["loads"] is True


def test_plugin_name_typo_suggests_the_closest_plugin_name(site):
    message = parse_error(site, "every_othr@1-;passthrough", "SpecError")
    assert "unknown policy 'every_othr' (did you mean 'every_other'" in message


def test_plugin_arguments_are_converted_to_the_annotated_types_when_the_spec_is_parsed(site):
    result = run_python(
        site,
        """
        from stepjournal.policies import parse, policy_by_name
        policy = parse("every_nth(n=3, tag=123, ratio=2, loud=true)")
        print(repr(policy.n), repr(policy.tag), repr(policy.ratio), repr(policy.loud))
        window = parse("window(size=4, label=none)")
        print(repr(window.n), repr(window.tag))
        print(repr(policy_by_name("every_nth", ratio=3).ratio))
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-3:] == ["3 '123' 2.0 True", "4 'window'", "3.0"]


WRONG_ARGUMENTS = {
    "every_nth(n=abc)": "policy 'every_nth' (plugin sj_example_plugin:EveryNth from distribution "
    "sj-example-plugin 1.0): argument n must be an int, got 'abc'",
    "every_nth(n=1.5)": "argument n must be an int, got '1.5'",
    "every_nth(loud=yes)": "argument loud must be a bool (true or false), got 'yes'",
    "every_nth(ratio=fast)": "argument ratio must be a float, got 'fast'",
    "every_nth(size=3)": "does not accept argument size=3: it takes n, tag, ratio, loud",
    "window(size=x)": "argument size must be an int, got 'x'",
    "window(label=1)": "missing 1 required positional argument: 'size'",
}


def test_plugin_arguments_of_the_wrong_type_fail_when_the_spec_is_parsed(site):
    """`every_nth(n=abc)` used to parse and fail at the first call with a raw TypeError."""
    result = run_python(
        site,
        f"""
        import json
        from stepjournal.policies import SpecError, parse, policy_by_name
        messages = {{}}
        for spec in {sorted(WRONG_ARGUMENTS)!r}:
            try:
                parse(spec)
            except SpecError as exc:
                messages[spec] = str(exc)
        try:
            policy_by_name("every_nth", n="3")
        except SpecError as exc:
            messages["python"] = str(exc)
        print(json.dumps(messages))
        """,
    )
    assert result.returncode == 0, result.stderr
    messages = json.loads(result.stdout.strip().splitlines()[-1])
    for spec, message in WRONG_ARGUMENTS.items():
        assert message in messages.get(spec, "parsed"), (spec, messages.get(spec))
    assert "argument n must be an int, got '3'" in messages["python"]
