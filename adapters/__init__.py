"""Adapters: connect stepjournal to raw training loops, verl and TRL.

`journaled` wraps any rollout function. The verl and TRL adapters live in `stepjournal.adapters.verl`
and `stepjournal.adapters.trl` and need the `stepjournal[verl]` / `stepjournal[trl]` extras.
"""

from ._raw import default_input_of, journaled

__all__ = ["journaled", "default_input_of"]
