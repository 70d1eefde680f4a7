"""`missing_extra`: the ImportError a facade raises for a name whose framework is not installed."""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(module: str, name: str, cause: ModuleNotFoundError, framework: str, extra: str,
                  note: str = "") -> ImportError:
    """An ImportError naming the framework that is missing and the install of stepjournal's extra for it from a
    clone (stepjournal is installed from a clone or a wheel, never by name from an index)."""
    error = ImportError(
        f"{module}.{name} needs {framework} ({cause.name} is not installed): install it as stepjournal's "
        f"`{extra}` extra pins it, in a clone of stepjournal: `pip install -e '.[{extra}]'`{note}",
        name=cause.name,
    )
    error.__cause__ = cause
    return error
