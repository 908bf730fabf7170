"""The policy model and what runs on it: the one way a run loads it (load.py: load_policy), the
model and its tokenizer (model.py, packaged.py), low-rank adapters
(lora.py), an fp32 head (head.py), the log-prob forwards (forward.py), the replay candidates'
scoring (scoring.py) and the HF export (export.py).

Where it sits in the step: loaded before the first step; its forwards run in candidate selection
and in the update (step/update.py, which owns the loss, the optimizer step and its skip rule);
its weights are exported when a step is checkpointed (checkpoint/store.py)."""
