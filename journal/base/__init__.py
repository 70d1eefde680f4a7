"""The journal's base: typed errors, logging, paths, secrets, digests, the memory behind a payload view,
progress, the version; imports nothing else of the journal.

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
