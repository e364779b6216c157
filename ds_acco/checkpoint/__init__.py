"""Layer 2, checkpoint: files that can be trusted, whatever front end writes them.

Owns the manifest (sizes and range hashes of every file, written last), the background hashing and flushing of each file
as it is written, atomic publication of a tag (``<tag>.partial``, rename, ``latest``), the verification every rank
agrees on before a loaded tensor is used, the gate that lets a loader parse while the hashes run, and the finite check
of loaded masters and moments.

May import: layers 0-1 and torch (``torch.distributed`` for the ranks' agreement). It knows no engine: front ends pass
the files, tensors and callbacks.
"""
