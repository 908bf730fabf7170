"""A training run's life around its steps: built before the first step (setup.py), run,
validated, checkpointed and stopped (training.py), one run per run dir (lock.py), the node's
ranks started from one command (launch.py), signals and requeues (preempt.py), a rank that died
(rank_failure.py), and what the run says about its delayed start (notices.py).

The step itself (step/) never imports this folder."""
