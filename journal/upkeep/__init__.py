"""Keeping a journal sound and small: retention and its release, prune, compact, verify.

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
