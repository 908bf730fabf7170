"""The command line: `exgrpo <command> ...` (main.py picks the command and hands the rest to
Hydra), each command's `--help` (help.py), and the overrides checked before Hydra runs
(overrides.py: a mistake is one line and exit code 2)."""
