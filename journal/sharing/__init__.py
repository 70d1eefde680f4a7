"""Sharing: push, pull and clone through a remote, bundles, named remotes, and the checks an import passes
before anything is committed.

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
