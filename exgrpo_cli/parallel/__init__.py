"""Data parallelism, in one place: the one object every stage asks for what the ranks exchange
(sharding.py), the process group and FSDP2's sharding of the model (fsdp.py), vLLM's
tensor-parallel groups (tensor_parallel.py), and where the training state lives when it is
offloaded to host memory (placement.py, offload.py).

Nobody outside this folder imports torch.distributed's collectives."""
