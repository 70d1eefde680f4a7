"""Payloads: the codec, the pipeline (encode, digest, compress) and the stores (LMDB, files, object storage).

Nothing here is public: the public names are `stepjournal`'s, which re-exports them.
"""
