"""The train step (loop.py), the policy update (update.py) and the run around them (run.py)."""
