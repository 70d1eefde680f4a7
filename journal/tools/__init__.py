"""Read-side tools over whole journals: diff (pairs, compares, reports) and export.

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
