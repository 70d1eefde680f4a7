"""What stepjournal's names say to a user: a mistyped verb gets a suggestion, errors print under their public
module (``stepjournal.errors.SpecError``), warnings point at the user's own line, and the library's log lines
carry a ``stepjournal`` prefix when the application configured no logging."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
import warnings

import pytest

import stepjournal
import stepjournal.errors
import stepjournal.policies
from cli_support import run_cli

TWO_WRITERS = textwrap.dedent(
    """
    {setup}
    import sys, torch
    from stepjournal import Journal
    first = Journal(sys.argv[1], run="r")
    first.record(1, {{"x": torch.arange(2)}})
    second = Journal(sys.argv[1], run="r")
    second.record(2, {{"x": torch.arange(2)}})
    """
)


@pytest.mark.parametrize("typed, meant", [("audti", "'audit'"), ("clon", "'clone'"), ("verfy", "'verify'")])
def test_a_mistyped_verb_is_answered_with_the_verb_meant(typed, meant):
    done = run_cli(typed, "journal")
    assert done.returncode == 2
    assert done.stderr == f"stepjournal: error: unknown command '{typed}' (did you mean {meant}?)\n"


def test_a_word_near_no_verb_is_answered_with_the_list_of_verbs():
    done = run_cli("zzzz")
    assert done.returncode == 2 and "unknown command 'zzzz'; the commands: runs, audit, show" in done.stderr


def test_every_error_prints_under_stepjournal_errors_and_is_found_there():
    """The name a traceback or repr shows is one a user can import (pickle and Ray look classes up by it)."""
    for name in stepjournal.errors.__all__:
        cls = getattr(stepjournal.errors, name)
        assert cls.__module__ == "stepjournal.errors", cls
        assert getattr(importlib.import_module(cls.__module__), cls.__qualname__) is cls
    assert stepjournal.policies.SpecError is stepjournal.errors.SpecError  # the policies' own still work
    assert not hasattr(stepjournal, "JournalError")  # the top level offers what users call, not the errors
    assert repr(stepjournal.errors.SpecError("x")) == "SpecError('x')"


def test_every_error_class_of_the_journal_and_the_policies_is_in_stepjournal_errors():
    import stepjournal.upkeep._compact  # noqa: F401  # private: its errors were defined apart before
    import stepjournal.tools._export  # noqa: F401  # private: the exporter's internals

    def every(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from every(sub)

    found = {cls for cls in every(stepjournal.errors.StepJournalError)
             if not cls.__module__.startswith("stepjournal.adapters") and not cls.__name__.startswith("_")}
    assert found - {getattr(stepjournal.errors, n) for n in stepjournal.errors.__all__} == set()


def test_an_uncaught_spec_error_prints_its_public_module():
    code = "from stepjournal.policies import parse\nparse('cahce')\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("stepjournal.errors.SpecError: policy spec clause 1 'cahce'"), last


def test_a_spec_warning_points_at_the_users_line_however_deep_the_library_found_it():
    from stepjournal.policies import SpecWarning, parse, parse_stages

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        parse_stages("generate:cache;dump")  # through _stages, then _spec
        parse("cache;dump")
    assert [(w.category, w.filename, w.lineno) for w in caught] == [(SpecWarning, __file__, line),
                                                                    (SpecWarning, __file__, line + 1)]


def test_an_unconfigured_program_sees_the_librarys_warning_prefixed_stepjournal(tmp_path):
    done = subprocess.run([sys.executable, "-c", TWO_WRITERS.format(setup=""), str(tmp_path / "j")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("stepjournal: warning: run_recorded_by_two_sessions path="), done.stderr
    assert done.stderr.count("\n") == 1


def test_a_program_that_configures_logging_gets_each_warning_once_in_its_own_format(tmp_path):
    setup = "import logging; logging.basicConfig(format='%(name)s|%(levelname)s|%(message)s')"
    done = subprocess.run([sys.executable, "-c", TWO_WRITERS.format(setup=setup), str(tmp_path / "j")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("stepjournal._journal|WARNING|run_recorded_by_two_sessions "), done.stderr
    assert done.stderr.count("\n") == 1


def test_the_adapters_errors_print_under_the_adapters_public_modules():
    import stepjournal.adapters.trl as trl
    import stepjournal.adapters.verl as verl

    from stepjournal.adapters.trl import _errors as trl_errors  # private: a TRL adapter internal under test
    from stepjournal.adapters.verl import _errors as verl_errors  # private: a verl adapter internal under test

    for public, private in ((verl, verl_errors), (trl, trl_errors)):
        for name in private.__all__:
            cls = getattr(public, name)
            assert cls.__module__ == public.__name__ and f"{public.__name__}.{name}" in repr(cls), cls
