"""The events, the one source of the schema; the one converter and checksum rule; every key layout.

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
