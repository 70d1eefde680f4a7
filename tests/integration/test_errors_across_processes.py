"""An error raised in another process arrives as it was raised: its class, its message and its fields.

A spawn pool, a `spawn` DataLoader and Ray send a worker's exception to the parent pickled, and `copy.copy` takes
the same road: Python rebuilds an exception as ``cls(*exc.args)``. An error whose ``__init__`` takes more than the
message (`ReplayMissError`: step and call index; `OptionError`: option, value, allowed) failed to rebuild, and the
parent got `BrokenProcessPool` ("terminated abruptly") instead of the miss and what to do about it.
"""

from __future__ import annotations

import copy
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import pytest

import error_workers
from stepjournal.errors import OptionError, ReplayMissError, RetentionError, StepJournalError


@pytest.mark.parametrize("raise_it, cls", [(error_workers.replay_miss, ReplayMissError),
                                           (error_workers.bad_size, RetentionError),
                                           (error_workers.bad_option, OptionError)],
                         ids=["replay miss", "retention", "engine option"])
def test_an_error_raised_in_a_spawned_worker_reaches_the_parent_whole(tmp_path, raise_it, cls):
    with pytest.raises(cls) as here:
        raise_it(str(tmp_path / "here"))
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(StepJournalError) as there:
            pool.submit(raise_it, str(tmp_path / "there")).result()
    for arrived in (there.value, copy.copy(here.value), copy.deepcopy(here.value)):
        assert type(arrived) is cls and str(arrived) == str(here.value) and arrived.args == here.value.args
        assert vars(arrived) == vars(here.value), cls  # the fields code reads: step, option, value, parts ...


def test_an_error_whose_field_refers_back_to_it_keeps_the_reference_and_its_fields():
    """As a plain exception does: a field holding the error itself (a cause chain kept by hand) is the rebuilt
    error, and its other fields are kept, through pickle (another process's road) and deepcopy."""
    import pickle

    from stepjournal.errors import JournalError

    error = JournalError("the message")
    error.me = error
    for arrived in (pickle.loads(pickle.dumps(error)), copy.deepcopy(error)):
        assert arrived.me is arrived and arrived.parts == error.parts and str(arrived) == str(error)
