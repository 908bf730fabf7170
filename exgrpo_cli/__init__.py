"""exgrpo: ExGRPO (GRPO + quality-aware experience replay) as a command-line tool and a library.

Stages of one train step, one package each: data -> rollout -> reward -> replay -> algo ->
policy (optimizer, checkpoints) -> metrics; `step/loop.py` strings them together.
"""

__version__ = "0.1.0"
