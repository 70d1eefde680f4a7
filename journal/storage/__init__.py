"""LMDB: environments and transactions, the page check that runs before LMDB maps a page, the event log.

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
