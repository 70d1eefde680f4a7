"""`missing_extra`: the ImportError a facade raises for a name whose framework is not installed."""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(module: str, name: str, cause: ModuleNotFoundError, framework: str, extra: str, note: str = "") -> ImportError:
    """An ImportError naming the framework that is missing and the stepjournal extra that installs it."""
    error = ImportError(
        f"{module}.{name} needs {framework} ({cause.name} is not installed): install it with "
        f"`pip install 'stepjournal[{extra}]'`{note}",
        name=cause.name,
    )
    error.__cause__ = cause
    return error
