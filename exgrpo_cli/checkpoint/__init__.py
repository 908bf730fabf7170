"""Checkpoints on disk and the safe reading of anything a run dir holds: the atomic, verified
checkpoint folders (store.py, files.py), the optimizer's sharded state and its hyper-parameters
at resume (optimizer_files.py, optimizer_groups.py), and the readers that treat a file someone
else wrote as data, never as code (safe_read.py, metadata_guard.py, pickle_ops.py)."""
