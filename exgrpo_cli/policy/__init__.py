"""The policy model and what runs on it: loading (model.py, packaged.py), FSDP2 sharding
(distributed.py), what the ranks exchange (sharding.py: the one object every stage asks; vLLM's
tensor-parallel groups beside it, tensor_parallel.py), host-memory offload (offload.py), the
log-prob forwards (forward.py), the replay candidates' scoring (scoring.py), the HF export and the atomic
checkpoint folders (export.py, checkpoint.py).

Where it sits in the step: loaded before the first step; its forwards run in candidate selection
and in the update (train/update.py, which owns the loss, the optimizer step and its skip rule);
its weights are exported when a step is checkpointed.
"""
