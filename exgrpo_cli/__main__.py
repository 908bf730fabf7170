"""`python -m exgrpo_cli ...` (and `torchrun -m exgrpo_cli ...`) is the same as `exgrpo ...`."""

from exgrpo_cli.cli.main import main

if __name__ == "__main__":
    main()
