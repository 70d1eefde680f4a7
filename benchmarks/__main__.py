"""`python -m benchmarks`."""

from ._cli import main

# Guarded: the replay children are spawned, and spawn imports the parent's main module again.
if __name__ == "__main__":
    raise SystemExit(main())
