"""The projections of the events: the step, rank, session and runs indexes, the call rows, where pulled events
sit, the audit folds and a step's samples.

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
