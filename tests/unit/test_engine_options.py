"""Engine options defined once (`EngineOptions`) and the call sequence written once, on real LMDB journals."""

from __future__ import annotations

import asyncio
import threading

import attrs
import pytest
import torch
from omegaconf import OmegaConf

from stepjournal import Journal, journaled
from stepjournal.events import CallBypassed, CallRefused, GenerationRecorded, ReplayServed, SessionOpened
from stepjournal.events._convert import converter  # private: raw event bytes, as stored
from stepjournal.events._keys import seq_key  # private: the key layout itself
from stepjournal.policies import (
    CallHooks,
    ConfigError,
    Engine,
    EngineConfig,
    EngineOptions,
    OptionError,
    ReplayMissError,
    load_config,
    open_engine,
)

from lmdb_raw import flip_byte

CHANGED = dict(
    allow_fingerprint_mismatch=True,
    verify_input=True,
    on_input_mismatch="error",
    on_stage_input_mismatch="generate",
    check_prompts="same_step",
    bypass_modes=("validate", "eval"),
    on_corrupt="regenerate",
)


def _calls(journal: Journal) -> list:
    """The journal's call events without what differs between two runs (session, clock, timings)."""
    rows = []
    for _, event in journal.events():
        if isinstance(event, SessionOpened):
            continue
        row = attrs.asdict(event, recurse=False)
        for key in ("session", "ts", "duration_s"):
            row.pop(key, None)
        rows.append((type(event).__name__, row))
    return rows


# -- validation ------------------------------------------------------------------------------------
def test_the_default_options_are_the_engines_old_defaults():
    assert EngineOptions() == EngineOptions(
        allow_fingerprint_mismatch=False,
        verify_input=False,
        on_input_mismatch="generate",
        check_prompts="off",
        bypass_modes=("validate",),
        on_corrupt="error",
    )
    assert EngineOptions.names() == tuple(CHANGED)


@pytest.mark.parametrize(
    "option, value, allowed",
    [
        ("allow_fingerprint_mismatch", "yes", "True or False"),
        ("verify_input", 1, "True or False"),
        ("on_input_mismatch", "ignore", "'generate' or 'error'"),
        ("on_corrupt", "skip", "'error' or 'regenerate'"),
        ("check_prompts", "always", "'off' or 'same_step'"),
        ("bypass_modes", "validate", "a list of mode names"),
        ("bypass_modes", ("validate", 3), "a list of mode names"),
    ],
)
def test_a_bad_value_names_the_option_the_value_and_the_values_it_takes(option, value, allowed):
    with pytest.raises(OptionError) as caught:
        EngineOptions(**{option: value})
    error = caught.value
    assert (error.option, error.value) == (option, value) and allowed in error.allowed
    assert f"{option}={value!r}" in str(error) and allowed in str(error)
    # An OptionError is a ConfigError (configs) and a ValueError (what Engine raised before).
    assert isinstance(error, ConfigError) and isinstance(error, ValueError)


def test_bypass_modes_takes_any_list_of_names_as_a_tuple():
    assert EngineOptions(bypass_modes=["validate", "eval"]).bypass_modes == ("validate", "eval")
    assert EngineOptions(bypass_modes=OmegaConf.create(["eval"])).bypass_modes == ("eval",)
    assert EngineOptions(bypass_modes=[]).bypass_modes == ()


def test_from_mapping_reads_a_dict_or_an_omegaconf_section():
    data = {"verify_input": True, "bypass_modes": ["validate", "eval"], "on_corrupt": "regenerate"}
    expected = EngineOptions(verify_input=True, bypass_modes=("validate", "eval"), on_corrupt="regenerate")
    assert EngineOptions.from_mapping(data) == EngineOptions.from_mapping(OmegaConf.create(data)) == expected
    assert EngineOptions.from_mapping({}) == EngineOptions()


def test_from_mapping_refuses_an_unknown_key_naming_it_and_listing_the_options():
    with pytest.raises(ConfigError) as caught:
        EngineOptions.from_mapping({"verify_inputs": True, "on_corrupt": "error"})
    message = str(caught.value)
    assert "'verify_inputs'" in message and "did you mean 'verify_input'?" in message
    assert all(name in message for name in EngineOptions.names())


def test_from_mapping_refuses_what_is_not_a_mapping_and_bad_values():
    with pytest.raises(ConfigError, match="must be a mapping"):
        EngineOptions.from_mapping(["verify_input"])
    with pytest.raises(OptionError, match="on_input_mismatch='ignore'"):
        EngineOptions.from_mapping({"on_input_mismatch": "ignore"})


# -- the old keyword arguments ---------------------------------------------------------------------
def test_old_keyword_arguments_and_options_give_the_same_settings(jpath):
    options = EngineOptions(**CHANGED)
    with Journal(jpath) as journal:
        assert Engine(journal, "cache", **CHANGED).options == Engine(journal, "cache", options=options).options
        assert journaled(lambda: 1, journal, **CHANGED).engine.options == options
        assert journaled(lambda: 1, journal, options=options).engine.options == options
    assert EngineConfig("j", **CHANGED) == EngineConfig("j", options=options)
    assert load_config({"path": "j", **CHANGED}) == load_config({"path": "j", "options": CHANGED})
    assert load_config({"path": "j", **CHANGED}).options == options


def test_the_options_still_read_as_attributes_of_the_engine_and_the_config(jpath):
    with Journal(jpath) as journal:
        engine = Engine(journal, "cache", options=EngineOptions(bypass_modes=("eval",), on_corrupt="regenerate"))
        assert engine.bypass_modes == ("eval",) and engine.on_corrupt == "regenerate"
        with pytest.raises(AttributeError, match="no_such_thing"):
            engine.no_such_thing
    config = EngineConfig("j", verify_input=True)
    assert config.verify_input is True and config.on_input_mismatch == "generate"
    assert attrs.evolve(config, run="x").options == config.options


@pytest.mark.parametrize("where", ["Engine", "journaled", "EngineConfig"])
def test_options_and_option_keywords_together_are_a_type_error_naming_both(jpath, where):
    options = EngineOptions(verify_input=True)
    with Journal(jpath) as journal:
        make = {
            "Engine": lambda **kw: Engine(journal, "cache", **kw),
            "journaled": lambda **kw: journaled(lambda: 1, journal, "cache", **kw),
            "EngineConfig": lambda **kw: EngineConfig("j", **kw),
        }[where]
        with pytest.raises(TypeError) as caught:
            make(options=options, on_corrupt="regenerate")
    message = str(caught.value)
    assert f"{where}()" in message and "options=" in message and "on_corrupt=" in message
    assert "attrs.evolve(options, on_corrupt='regenerate')" in message


def test_an_unknown_keyword_is_a_type_error_that_lists_the_options(jpath):
    with Journal(jpath) as journal:
        with pytest.raises(TypeError, match="Engine\\(\\) got an unexpected keyword argument 'on_corupt' "
                                            "\\(did you mean 'on_corrupt'\\?\\)"):
            Engine(journal, "cache", on_corupt="regenerate")
        with pytest.raises(TypeError, match="options must be an EngineOptions.*from_mapping"):
            Engine(journal, "cache", options={"verify_input": True})


def test_a_bad_option_keyword_value_is_refused_before_anything_is_journaled(jpath):
    with Journal(jpath) as journal:
        with pytest.raises(OptionError, match="on_corrupt='skip'"):
            journaled(lambda: 1, journal, on_corrupt="skip")
        assert _calls(journal) == []


# -- configs ---------------------------------------------------------------------------------------
def test_a_config_takes_the_options_beside_its_keys_or_nested_but_not_both():
    with pytest.raises(ConfigError, match="both in 'options' and beside it \\(verify_input\\)"):
        load_config({"path": "j", "verify_input": True, "options": {"on_corrupt": "regenerate"}})
    with pytest.raises(ConfigError, match="'verify_inputs' \\(did you mean 'verify_input'\\?\\)"):
        load_config({"path": "j", "options": {"verify_inputs": True}})
    config = load_config("path: j\npolicy: cache\non_corrupt: regenerate\nbypass_modes: []\n")
    assert config.options == EngineOptions(on_corrupt="regenerate", bypass_modes=())
    # What the converter writes out, load_config reads back.
    assert load_config(converter.unstructure(config)) == config


def test_on_corrupt_in_a_config_reaches_the_engine_and_regenerates_a_damaged_record(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        recorded = Engine(journal, "cache").call(1, lambda: {"ids": torch.arange(4)})
    flip_byte(path, "events", key=seq_key(recorded.seq), offset=-20)
    engine = open_engine({"path": path, "policy": "cache", "on_corrupt": "regenerate"})
    try:
        assert engine.options.on_corrupt == "regenerate"
        again = engine.call(1, lambda: {"ids": torch.arange(4)})
        assert again.action == "generated" and "damaged" in again.source.event.reason
    finally:
        engine.journal.close()


# -- one call sequence for sync and async ------------------------------------------------------------
def _scenario(journal: Journal, call) -> list:
    """Record steps 1-2, replay them, bypass a validation call, and miss a replay; return the actions."""
    actions = []
    for policy, step, mode in [("cache", 1, "train"), ("cache", 2, "train"), ("cache", 1, "train"),
                               ("replay", 2, "train"), ("replay", 1, "validate"), ("replay", 9, "train")]:
        engine = Engine(journal, policy, verify_input=True)
        try:
            outcome = call(engine, step, mode)
        except ReplayMissError as exc:
            actions.append(("refused", exc.step))
        else:
            actions.append((outcome.action, outcome.ctx.step, outcome.value["step"]))
    return actions


def test_sync_and_async_calls_journal_the_same_events(tmp_path):
    def generate(step):
        return {"step": step, "ids": torch.full((2,), step)}

    async def agenerate(step):
        await asyncio.sleep(0)
        return generate(step)

    def sync_call(engine, step, mode):
        return engine.call(step, lambda: generate(step), mode=mode, input={"p": step}, input_digest=f"d{step}")

    def async_call(engine, step, mode):
        return asyncio.run(
            engine.acall(step, lambda: agenerate(step), mode=mode, input={"p": step}, input_digest=f"d{step}")
        )

    with Journal(str(tmp_path / "sync"), run="r") as sync_journal:
        sync_actions = _scenario(sync_journal, sync_call)
        sync_events = _calls(sync_journal)
    with Journal(str(tmp_path / "async"), run="r") as async_journal:
        async_actions = _scenario(async_journal, async_call)
        async_events = _calls(async_journal)
    assert sync_actions == async_actions == [
        ("generated", 1, 1), ("generated", 2, 2), ("replayed", 1, 1), ("replayed", 2, 2),
        ("bypassed", 1, 1), ("refused", 9),
    ]
    assert [kind for kind, _ in sync_events] == [
        "GenerationRecorded", "GenerationRecorded", "ReplayServed", "ReplayServed", "CallBypassed", "CallRefused",
    ]
    assert sync_events == async_events


def test_journaled_sync_and_async_functions_journal_the_same_events(tmp_path):
    def rollout(prompt, step):
        return {"step": step, "completion": prompt.upper()}

    async def arollout(prompt, step):
        return rollout(prompt, step)

    options = EngineOptions(verify_input=True, bypass_modes=("eval",))
    results = []
    for name, fn, run in [("sync", rollout, lambda c: c), ("async", arollout, asyncio.run)]:
        with Journal(str(tmp_path / name)) as journal:
            wrapped = journaled(fn, journal, "cache", options=options, mode_of=lambda prompt, step: prompt)
            values = [run(wrapped(prompt, step=step)) for prompt, step in [("train", 1), ("train", 1), ("eval", 1)]]
            wrapped_again = journaled(fn, journal, "cache", options=options, mode_of=lambda prompt, step: prompt)
            values.append(run(wrapped_again("train", step=1)))
            assert wrapped.engine.options == options and wrapped_again.last_outcome.action == "replayed"
            results.append((values, _calls(journal)))
    assert results[0] == results[1]
    values, events = results[0]
    assert [kind for kind, _ in events] == ["GenerationRecorded", "GenerationRecorded", "CallBypassed", "ReplayServed"]


def test_an_error_of_the_generator_reaches_the_caller_as_raised(jpath):
    def fail():
        raise RuntimeError("sampler died")

    async def afail():
        fail()

    with Journal(jpath) as journal:
        engine = Engine(journal, "cache")
        for attempt in (lambda: engine.call(1, fail), lambda: asyncio.run(engine.acall(2, afail))):
            with pytest.raises(RuntimeError, match="sampler died") as caught:
                attempt()
            assert caught.value.__context__ is None and caught.value.__cause__ is None
        assert _calls(journal) == []


# -- the hooks ---------------------------------------------------------------------------------------
def test_hooks_store_the_adapters_form_and_give_the_caller_its_own_value_back(jpath):
    seen = []
    hooks = CallHooks(
        to_stored=lambda ids: {"format": "mine/1", "ids": ids},
        from_stored=lambda outcome: seen.append((outcome.ctx.step, outcome.source.step)) or outcome.value["ids"],
    )
    with Journal(jpath) as journal:
        first = Engine(journal, "cache").call(1, lambda: [1, 2, 3], hooks=hooks)
        stored = journal.load_output(journal.lookup(1))
        again = Engine(journal, "cache").call(1, lambda: [9], hooks=hooks)

        async def generate():
            return [4, 5]

        served = asyncio.run(Engine(journal, "repeat_last").acall(2, generate, hooks=hooks))
    assert (first.action, first.value) == ("generated", [1, 2, 3])
    assert stored == {"format": "mine/1", "ids": [1, 2, 3]}
    assert (again.action, again.value) == ("replayed", [1, 2, 3])
    assert (served.action, served.value) == ("replayed", [1, 2, 3])
    assert seen == [(1, 1), (2, 1)]


def test_run_blocking_runs_the_journal_io_and_the_generator_stays_in_the_loop(jpath):
    loop_thread = threading.get_ident()
    io_threads = []

    async def in_a_thread(work):
        io_threads.append(threading.get_ident())
        return await asyncio.to_thread(work)

    generator_threads = []

    async def generate():
        generator_threads.append(threading.get_ident())
        return {"x": 1}

    prepared_in = []

    def prepare_input():
        prepared_in.append(threading.get_ident())
        return {"prompt": "p"}, "digest-p"

    hooks = CallHooks(run_blocking=in_a_thread, prepare_input=prepare_input)
    with Journal(jpath) as journal:
        outcome = asyncio.run(Engine(journal, "cache").acall(1, generate, hooks=hooks))
        assert journal.lookup(1).event.input_digest == "digest-p"
        assert journal.load_input(journal.lookup(1)) == {"prompt": "p"}
    assert outcome.action == "generated" and outcome.value == {"x": 1}
    # Deciding (with the input's preparation) and recording: two pieces of journal I/O.
    assert len(io_threads) == 2 and generator_threads == [loop_thread]
    assert prepared_in and prepared_in[0] != loop_thread


def test_the_input_is_not_prepared_for_a_bypassed_mode(jpath):
    asked = []

    def input_of(prompt, step):
        asked.append(prompt)
        return {"prompt": prompt}

    with Journal(jpath) as journal:
        wrapped = journaled(lambda prompt, step: prompt, journal, "cache", input_of=input_of,
                            mode_of=lambda prompt, step: "validate" if prompt == "v" else "train")
        assert [wrapped("t", step=1), wrapped("v", step=1)] == ["t", "v"]
        assert asked == ["t"]
        with pytest.raises(TypeError, match="either as input=/input_digest= or through hooks.prepare_input"):
            Engine(journal, "cache").call(2, lambda: 1, input={"a": 1},
                                          hooks=CallHooks(prepare_input=lambda: (None, None)))
        kinds = [kind for kind, _ in _calls(journal)]
    assert kinds == [GenerationRecorded.__name__, CallBypassed.__name__]
    assert ReplayServed.__name__ not in kinds and CallRefused.__name__ not in kinds
