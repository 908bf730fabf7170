"""`exgrpo` entry point: argv[1] picks the subcommand, everything after it goes to Hydra.

Hydra is called through `@hydra.main` (not the compose API) so that each subcommand keeps all of
Hydra's command line: overrides, `--cfg job`, `--help`, `-m/--multirun` and run directories.
Nothing heavy is imported here: `exgrpo --help` must answer at once.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: `exgrpo --help` must not wait for omegaconf
    from omegaconf import DictConfig

COMMANDS = {
    "train": "RL-train a policy with ExGRPO (replay.ratio=0: on-policy Dr.GRPO)",
    "eval": "evaluate a model or checkpoints on benchmark suites (avg@k / pass@k)",
    "ablate": "run one of the paper's ablations as a multirun sweep, then summarise it",
    "inspect-buffer": "show what a run's replay buffer holds (text, JSON or plots)",
}

# Each command's page in the repository (its --help footer names it too; tests/test_docs.py).
DOC_PAGES = {
    "train": "docs/training-and-configs.md",
    "eval": "docs/evaluation.md",
    "ablate": "docs/ablations-and-results.md",
    "inspect-buffer": "docs/replay-buffer.md",
}

USAGE = """usage: exgrpo <command> [hydra overrides ...]

ExGRPO: GRPO with a quality-aware experience replay buffer ("Learning to Reason from
Experience", ICLR 2026).

commands:
{commands}

Every command takes Hydra overrides (key=value, group=preset), `--cfg job` to print the
config, `-m` for a multirun sweep, `--help` for its usage, config groups and keys with their
meanings (`--help-all`: every key). Examples:
  exgrpo train                                  # the tiny built-in model on arithmetic, CPU
  exgrpo train replay.ratio=0 trainer.steps=20  # plain on-policy GRPO
  exgrpo eval eval=paper model=qwen2.5-math-7b  # the paper's benchmarks
  exgrpo inspect-buffer outputs/train/<run>     # the replay buffer of a run

Docs, in the exgrpo repository: README.md, and docs/README.md for every page; per command:
{pages}
"""


def _usage() -> str:
    width = max(len(c) for c in COMMANDS)
    lines = "\n".join(f"  {c.ljust(width)}  {h}" for c, h in COMMANDS.items())
    pages = "\n".join(f"  {c.ljust(width)}  {DOC_PAGES[c]}" for c in COMMANDS)
    return USAGE.format(commands=lines, pages=pages)


def _translate_inspect_args(args: list[str]) -> list[str]:
    """inspect-buffer takes a positional run dir and --json; turn them into Hydra overrides. A
    path that exists is the target even with `=` in it; it is passed quoted, so that spaces,
    brackets, commas and `${` reach the command as written."""
    out = []
    for a in args:
        if a == "--json":
            out.append("inspect.format=json")
        elif os.path.exists(a) or (not a.startswith("-") and "=" not in a):
            out.append(f"inspect.target={_hydra_quoted(a)}")
        else:
            out.append(a)
    return out


def _hydra_quoted(value: str) -> str:
    """`value` as a quoted Hydra override value: backslashes before a quote (or the end) doubled,
    quotes escaped, `${` escaped for OmegaConf (a literal, not an interpolation)."""
    text = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value)
    return "'" + text.replace("'", "\\'").replace("${", "\\${") + "'"


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        raise SystemExit(0)
    if argv[0] in ("-V", "--version"):
        from importlib.metadata import version

        print(version("exgrpo"))
        raise SystemExit(0)
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"exgrpo: unknown command {command!r}\n", file=sys.stderr)
        print(_usage(), file=sys.stderr)
        raise SystemExit(2)
    if command == "inspect-buffer":
        rest = _translate_inspect_args(rest)
    full_help = "--help-all" in rest
    rest = [a for a in rest if a != "--help-all"]
    preflight(command, rest, full_help)
    check_run_dir(command, rest)
    from exgrpo_cli.parallel.process_end import ends_without_teardown

    with ends_without_teardown():  # a rank under torchrun: no teardown race with gloo's threads
        run_hydra(command, rest)


# what exgrpo and Hydra open in a run dir, each checked before Hydra writes the first of them
RUN_DIR_FILES = (
    ".hydra/config.yaml",
    ".hydra/hydra.yaml",
    ".hydra/overrides.yaml",
    ".exgrpo.lock",
    "metrics.jsonl",
    "eval_metrics.jsonl",
)


def _named_run_dir(command: str, args: list[str]) -> str | None:
    """The run dir a single run will use when it is known before Hydra starts: `hydra.run.dir=`
    on the command line (or `+hydra.run.dir=`, `++hydra.run.dir=`, which Hydra takes the same
    way), or a SLURM job's default (outputs/<command>/slurm-<job id>, which a requeued job finds
    again); None for a timestamped new one or a sweep."""
    from exgrpo_cli.host import slurm_job_id

    if any(a in ("-m", "--multirun") for a in args):
        return None
    from exgrpo_cli.config.paths import run_dir_override

    named = [value for value in map(run_dir_override, args) if value is not None]
    if named:
        return named[-1]
    job = slurm_job_id()
    return f"outputs/{command.replace('-', '_')}/slurm-{job}" if job else None


def check_run_dir(command: str, args: list[str]) -> None:
    """Refuse, in one line before Hydra opens anything (exit 2), a run dir whose known paths are
    not regular files or folders: Hydra's open() of a FIFO at `.hydra/config.yaml` or at the log
    file blocked the command for ever, before exgrpo's own code ran."""
    from exgrpo_cli.checkpoint.safe_read import special_entry
    from exgrpo_cli.errors import UsageError, exit_on_error

    named = _named_run_dir(command, args)
    if named is None or "${" in named:
        return
    run = Path(named).expanduser()
    with exit_on_error(command):
        if run.exists() and not run.is_dir():  # a link to a folder is a folder
            raise UsageError(f"hydra.run.dir={named} is not a folder")
        for rel, folder_ok in ((".hydra", True), (f"{command.replace('-', '_')}.log", False)):
            problem = special_entry(run / rel, folder_ok)
            if problem:
                raise UsageError(problem)
        for rel in RUN_DIR_FILES:
            problem = special_entry(run / rel)
            if problem:
                raise UsageError(problem)


def preflight(command: str, args: list[str], full_help: bool) -> None:
    """Check the command line before Hydra runs (cli/overrides.py: one line, exit 2, no run folder);
    answer --help / --help-all here (cli/help.py)."""
    from exgrpo_cli.cli import overrides
    from exgrpo_cli.config.paths import config_dir
    from exgrpo_cli.errors import exit_on_error

    with exit_on_error(command):
        ns = overrides.check(command, args, config_dir())
        if ns.multirun or ns.shell_completion or ns.hydra_help:
            return  # a sweep's values were checked one by one; its runs compose themselves
        _register()
        composed = overrides.compose(command, ns.overrides, config_dir(), ns.config_dir)
    if ns.help or full_help:
        from exgrpo_cli.cli.help import render

        choices = {g: str(v) for g, v in _choices(command, ns.overrides).items()}
        page = render(
            command, COMMANDS[command], DOC_PAGES[command], config_dir(), composed, choices, full=full_help
        )
        print(page)
        raise SystemExit(0)


def _choices(command: str, overrides: list[str]) -> dict[str, str]:
    """The preset of each group: conf/config.yaml's defaults, then the command line's."""
    from exgrpo_cli.config.keys import default_presets
    from exgrpo_cli.config.paths import config_dir

    out = default_presets(config_dir())
    for o in overrides:
        group, eq, value = o.partition("=")
        if eq and group.lstrip("+") in out:
            out[group.lstrip("+")] = value
    return out


def _register() -> None:
    from exgrpo_cli.config.schema import register_configs
    from exgrpo_cli.host import register_run_name_resolver

    register_configs()
    register_run_name_resolver()


def run_hydra(command: str, overrides: list[str]) -> None:
    import hydra

    from exgrpo_cli.config.paths import config_dir

    _register()  # the schema, and the default run dir's name (conf/config.yaml)
    # conf/config.yaml names the job (log file, run dir) after this variable; passing it as one
    # more override instead would break argparse when the user mixes flags and overrides.
    os.environ["EXGRPO_COMMAND"] = command.replace("-", "_")
    os.environ["EXGRPO_DOC_PAGE"] = DOC_PAGES[command]  # named by --help's footer (conf/config.yaml)
    # Hydra reads sys.argv itself; give it the argv of a program named after the command.
    sys.argv = [f"exgrpo {command}", *overrides]
    os.environ.setdefault("HYDRA_FULL_ERROR", "0")

    @hydra.main(version_base=None, config_path=config_dir(), config_name="config")
    def _entry(cfg: DictConfig) -> None:
        from exgrpo_cli.commands import dispatch

        dispatch(command, cfg)

    _entry()


if __name__ == "__main__":
    main()
