"""One ExGRPO train step, in the paper's order (loop.py): the reward stage (reward.py), the
policy update (update.py), the off-policy figures and the engine's mismatch (offpolicy.py,
divergence.py), the step's metrics (metrics.py), and everything a checkpoint holds (state.py)."""
