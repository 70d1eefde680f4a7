"""verl's default V1 trainer: its batch codec, its replay-buffer hooks, its stages and `import-verl` of its
dumps.

Nothing here is public: the public names are `stepjournal.adapters.verl`'s, which re-exports them.
"""
