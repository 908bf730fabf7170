"""`exgrpo ablate`: the paper's ablations (docs/algorithm.md §6) as sweeps of `exgrpo train` runs.

sweep.py    a preset's variants x seeds -> one job (override list, run dir) per run; done markers
runs.py     the jobs run as child processes (one by one, or through a Hydra launcher plugin)
summary.py  pure maths of the summary table over seeds (metrics.jsonl -> rows), md/csv writers
plot.py     curves.png: validation accuracy against fresh rollouts, mean and band over seeds

The command itself (commands/ablate.py) plans the sweep, calls these and reports.
"""
