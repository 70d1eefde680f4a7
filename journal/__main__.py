"""`python -m stepjournal`: the same command line as the `stepjournal` script."""

from stepjournal.adapters.cli import main

raise SystemExit(main())
