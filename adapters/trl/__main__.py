"""``python -m stepjournal.adapters.trl SCRIPT``: run a TRL script unedited, journaled as ``STEPJOURNAL`` says."""

from ._env import main

raise SystemExit(main())
