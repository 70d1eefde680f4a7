"""stepjournal's benchmarks against plain files and verl's rollout dumps (issue 7).

Run ``make bench`` (or ``python -m benchmarks`` from the repository root); see docs/performance.md.
"""

from ._cli import main, run

__all__ = ["main", "run"]
