"""Training: the run around the steps (run.py: set up, validate, log, checkpoint, stop), the parts
it is built from (setup.py), the node's ranks started from one command (launch.py), one step
(loop.py), its policy update (update.py), its metrics (metrics.py), the run's state and
checkpoints (state.py), and the delayed-start notices (notices.py)."""
