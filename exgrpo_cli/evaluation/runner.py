"""Running an eval suite: load the benchmarks, then per model sample, grade, save and score.

Where it sits: behind `exgrpo eval` (commands/eval.py). The order matters for the user: the
benchmark data and the model paths are checked first, so that a missing file stops the run before
minutes of model loading. Then, per model (`eval.compare` evaluates several with the same seeds,
so their samples are paired) and per benchmark, `sample_and_grade` draws n responses per question
with the rollout engine and grades them with the reward module; every sample goes to
generations.jsonl as soon as its benchmark is done, and `eval.regrade=<generations.jsonl>` grades
such a file again, without a model, into a new run dir (evaluation/regrade.py).

The paper's benchmarks follow the official evaluation (ExGRPO/eval_scripts/generate_vllm.py with
eval.sh's options): the data's system message is dropped, so that the model's own chat template
supplies its default one, and each sample is graded under `official_answer_rule` of its rendered
prompt. The synthetic and custom suites keep the template's prompt and the training reward's rule.
Each generation row records the rule it was graded with (`think_rule`, `boxed_only`), and a
regrade uses it.
"""

from __future__ import annotations

import dataclasses
import gc
import json
import logging
import os
import time
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console

from exgrpo_cli.config.schema import ConfigError, ExgrpoConfig
from exgrpo_cli.data.template_budget import check_template
from exgrpo_cli.data.templates import Template, get_template
from exgrpo_cli.evaluation.benchmarks import LoadedBenchmark, load_suite
from exgrpo_cli.evaluation.regrade import regrade
from exgrpo_cli.evaluation.report import GENERATIONS, ModelResult, finish, summarize
from exgrpo_cli.reward.extract import AnswerRule, ThinkRule, training_rule

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from exgrpo_cli.evaluation.validate import SampledResult
    from exgrpo_cli.parallel.sharding import DataParallel
    from exgrpo_cli.reward import RewardScorer
    from exgrpo_cli.reward.stage import Reward

log = logging.getLogger(__name__)

# HF `generate` refuses temperature 0; a temperature this small samples the argmax token (greedy).
GREEDY_TEMPERATURE = 1e-4
THINK_OPENING = "<think>\n"


def official_answer_rule(prompt: str) -> AnswerRule:
    """Where generate_vllm.py reads a sample's answer, from its rendered prompt.

    A prompt that ends with "<think>\\n" (a chat template that opens the think block) puts the
    sample in think format: the text between the first `</think>` and the next is graded, or the
    whole text when there is no `</think>` (split()[1] fails there, and the oat grader that
    eval.sh turns on grades the whole text instead). Any other prompt: the whole text. Either way
    the answer is the content of the last `\\boxed{}` (oat_math_grader.py), with no fallback."""
    think: ThinkRule = "first_or_whole" if prompt.endswith(THINK_OPENING) else "whole"
    return AnswerRule(think, boxed_only=True)


def output_dir(cfg: ExgrpoConfig) -> Path:
    return Path(cfg.eval.output_dir or cfg.trainer.output_dir)


def resolve_model_path(path: str, parallel: DataParallel | None = None) -> str:
    """A model folder, a training checkpoint (its model/ folder), a run dir (its latest
    checkpoint), a HF id or builtin:tiny. Raises ConfigError for a local path that holds no model,
    or whose checkpoint's model files fail their checksums. Collective under several ranks
    (`parallel`): they hash the files together."""
    if path.startswith("builtin:"):
        return path
    p = Path(path).expanduser()
    if p.is_dir():
        from exgrpo_cli.checkpoint import store as ckpt

        if (p / "config.json").is_file():
            folder = p
        elif (p / "model" / "config.json").is_file():
            folder = p / "model"
        elif (found := ckpt.latest_checkpoint(p / "checkpoints")) is not None:
            folder = found / "model"
        else:
            raise ConfigError(
                f"invalid model path {path!r}: the folder holds no model (config.json), "
                "checkpoint (model/) or run (checkpoints/)"
            )
        if (folder.parent / ckpt.COMPLETE).is_file():  # a checkpoint's weights: check what is read
            reason = ckpt.verify(folder.parent, prefix="model/", parallel=parallel)  # ranks share the hashing
            if reason:
                raise ConfigError(f"invalid model path {path!r}: the checkpoint does not verify: {reason}")
        return str(folder)
    if path.startswith(("/", ".", "~")):
        raise ConfigError(f"invalid model path {path!r}: no such folder")
    return path  # a Hugging Face id


def models_to_run(cfg: ExgrpoConfig, parallel: DataParallel | None = None) -> list[tuple[str, str]]:
    """(label, resolved path) per model: eval.compare when given, else model.path. Labels key the
    results and the generation rows, so a repeated entry gets a #2, #3 suffix."""
    names = list(cfg.eval.compare) or [cfg.model.path]
    out, seen = [], set()
    for name in names:
        label, i = name, 1
        while label in seen:
            i += 1
            label = f"{name}#{i}"
        seen.add(label)
        out.append((label, resolve_model_path(name, parallel)))
    return out


def check_one_engine_per_rank(cfg: ExgrpoConfig, ranks: int) -> None:
    """Refuse, before anything loads, a multi-rank eval of several models with an engine that can
    be built only once per ranked process (vLLM: closing the first model's engine would end the
    ranks' process group under the second)."""
    from exgrpo_cli.config.registry import pick
    from exgrpo_cli.rollout import ENGINES

    models = len(cfg.eval.compare) or 1
    engine = pick(ENGINES, "rollout.engine", cfg.rollout.engine)
    if ranks > 1 and models > 1 and engine.one_per_ranked_process:
        raise ConfigError(
            f"eval.compare of {models} models with rollout.engine={cfg.rollout.engine} on {ranks} ranks: "
            "this engine can be built once per rank process; run one `exgrpo eval` per model "
            "(model.path=...), or compare them with trainer.nproc=1"
        )


def settings(cfg: ExgrpoConfig) -> dict[str, Any]:
    e = cfg.eval
    return {
        "temperature": e.temperature,
        "top_p": e.top_p,
        "max_new_tokens": e.max_new_tokens or cfg.model.max_response_tokens,
        "n": e.n or "paper default",
        "k": e.k,
        "limit": e.limit or "all",
        "template": cfg.model.template,
        "engine": cfg.rollout.engine,
        "seed": cfg.trainer.seed,
    }


def benchmark_seed(seed: int, name: str) -> int:
    """The same seed for a benchmark in every model of a comparison (paired samples), whatever
    the order or the subset of benchmarks run."""
    return seed * 1_000_003 + zlib.crc32(name.encode())


def _rows(
    label: str, lb: LoadedBenchmark, res: SampledResult, requires_think: bool
) -> Iterable[dict[str, Any]]:
    b = lb.bench
    kinds = lb.kinds()
    for i, q in enumerate(res.questions):
        rule = res.rules[i] if res.rules else training_rule(requires_think)
        for j, response in enumerate(res.responses[i]):
            yield {
                "model": label,
                "benchmark": b.name,
                "title": b.title,
                "group": b.group,
                "question_id": q.uid,
                "sample": j,
                "prompt": res.prompts[i],
                "response": response,
                "extracted": res.extracted[i][j],
                "gold": q.answer,
                "kind": kinds[i],
                "requires_think": requires_think,
                "think_rule": rule.think,
                "boxed_only": rule.boxed_only,
                "correct": res.correct[i][j] >= res.correct_at,
                "reward": res.correct[i][j],
            }


# ----------------------------------------------------------------------------- generate


def evaluate_model(
    cfg: ExgrpoConfig,
    label: str,
    path: str,
    suite: list[LoadedBenchmark],
    template: Template,
    scorer: RewardScorer | Reward,
    gen_fh: TextIO,
    console: Console,
    parallel: DataParallel,
) -> ModelResult:
    """Every benchmark of `suite` on one model; writes its samples to `gen_fh` as it goes."""
    from exgrpo_cli.config.registry import pick
    from exgrpo_cli.evaluation.adapter import load_into
    from exgrpo_cli.evaluation.validate import sample_and_grade
    from exgrpo_cli.plan.model_bounds import check_model
    from exgrpo_cli.policy.model import load_model, load_tokenizer
    from exgrpo_cli.rollout import ENGINES, build_engine
    from exgrpo_cli.rollout.base import SamplingSpec

    same = path == cfg.model.path
    model_cfg = dataclasses.replace(cfg.model, path=path, gguf_file=cfg.model.gguf_file if same else "")
    run_cfg = dataclasses.replace(cfg, model=model_cfg)
    device = parallel.device  # a rank: its own GPU
    # rank 0 first: a hub tokenizer or model is downloaded once, the other ranks read its copy
    tokenizer = parallel.main_first(lambda: load_tokenizer(model_cfg))
    check_template(template, tokenizer, f"model {path}")  # once, under a time and memory budget
    # an engine that loads the weights itself (vLLM) gets no HF copy: it would only take memory
    engine_spec = pick(ENGINES, "rollout.engine", cfg.rollout.engine)
    model = None
    if engine_spec.needs_trainer_model:
        check_model(model_cfg.path, model_cfg.gguf_file, model_cfg.dtype)  # config.json vs weights, memory
        model = parallel.main_first(lambda: load_model(model_cfg, device))
        load_into(cfg, model)  # eval.adapter's weights on the base (model.lora layers built above)
    try:
        engine = build_engine(run_cfg, model, tokenizer)
    except BaseException:
        del model  # the next model of eval.compare, or the caller, should not find it in memory
        _free_memory()
        raise
    e = cfg.eval
    greedy_ok = e.temperature > 0 or engine_spec.supports_greedy
    temperature = e.temperature if greedy_ok else GREEDY_TEMPERATURE
    result = ModelResult(label, path)
    try:
        for lb in suite:
            n = lb.samples_per_question(e.n)
            spec = SamplingSpec(
                temperature,
                e.top_p,
                e.max_new_tokens or cfg.model.max_response_tokens,
                seed=benchmark_seed(cfg.trainer.seed, lb.bench.name),
            )
            t0 = time.time()
            with _Progress(console, f"{label} {lb.bench.title}", len(lb.questions)) as tick:
                res = sample_and_grade(
                    engine,
                    tokenizer,
                    template,
                    lb.questions,
                    scorer,
                    n=n,
                    spec=spec,
                    kinds=lb.kinds(),
                    chunk=e.batch_size * n,
                    progress=tick,
                    data_system=not lb.bench.official,
                    rule_for_prompt=official_answer_rule if lb.bench.official else None,
                    parallel=parallel,
                )
            for row in _rows(label, lb, res, template.requires_think):
                gen_fh.write(json.dumps(row, ensure_ascii=False) + "\n")
            gen_fh.flush()
            br = summarize(
                lb.bench,
                lb.source,
                res.correct,
                res.extracted,
                e.k,
                time.time() - t0,
                res.timeouts,
                res.errors,
                res.correct_at,
            )
            result.benchmarks.append(br)
            console.print(
                f"{label}  {br.title}: {br.questions} question(s) x {n}  {br.metric} "
                f"{100 * br.score:.1f}  ({br.seconds:.0f}s)",
                highlight=False,
            )
    finally:
        engine.close()
        del engine, model
        _free_memory()
    return result


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Progress:
    """A transient rich progress bar on a terminal; nothing otherwise (logs get one line per
    benchmark from the caller)."""

    task: TaskID  # set with the bar

    def __init__(self, console: Console, what: str, total: int) -> None:
        self.console, self.what, self.total = console, what, total
        self.bar: Progress | None = None

    def __enter__(self) -> Callable[[int], None]:
        if self.console.is_terminal:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(
                TextColumn(self.what),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self.bar.start()
            self.task = self.bar.add_task(self.what, total=self.total)
        return self.tick

    def tick(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()


def eval_scorer(cfg: ExgrpoConfig, template: Template, parallel: DataParallel) -> RewardScorer | Reward:
    """reward=math (the default): the benchmarks' own grading, math or choice per benchmark, in
    up to 4 workers; any other reward.kind: the run's reward (reward/stage.py), as training uses it."""
    from exgrpo_cli.reward import RewardScorer
    from exgrpo_cli.reward.stage import build_reward

    if cfg.reward.kind != "math":
        return build_reward(cfg.reward, template.requires_think, parallel.device)
    workers = min(4, os.cpu_count() or 1) // parallel.world_size
    return RewardScorer(requires_think=template.requires_think, workers=max(1, workers))


def run_eval(cfg: ExgrpoConfig, parallel: DataParallel | None = None) -> dict[str, Any] | None:
    """The whole `exgrpo eval` run (or a regrade); returns the results.json content. Under several
    ranks (`parallel`) each samples and grades its share; rank 0 alone writes and returns the results."""
    out = output_dir(cfg)
    if cfg.eval.regrade:
        return regrade(cfg, cfg.eval.regrade, out)
    from exgrpo_cli.evaluation.adapter import adapter_label, with_adapter
    from exgrpo_cli.parallel.fsdp import pick_device
    from exgrpo_cli.parallel.sharding import DataParallel

    parallel = parallel if parallel is not None else DataParallel(device=pick_device(cfg.trainer.device))
    main = parallel.is_main
    console = Console(stderr=True, quiet=not main)
    check_one_engine_per_rank(cfg, parallel.world_size)
    cfg = with_adapter(cfg, parallel)  # eval.adapter: checked against model.path before any model loads
    suite = parallel.main_first(lambda: load_suite(cfg))  # a missing file stops here, before any model loads
    for lb in suite:  # on the console too, not only in the log: a score over fewer rows than asked
        if lb.skipped:
            console.print(
                f"warning: {lb.bench.title}: skipped {lb.skipped} rows without a usable question or answer"
            )
    models = [(adapter_label(cfg, label), path) for label, path in models_to_run(cfg, parallel)]
    if cfg.trainer.threads:
        import torch

        torch.set_num_threads(cfg.trainer.threads)
    template = get_template(cfg.model.template)
    out.mkdir(parents=True, exist_ok=True)
    scorer = eval_scorer(cfg, template, parallel)
    results: list[ModelResult] = []
    try:
        with (out / GENERATIONS).open("w", encoding="utf-8") if main else open(os.devnull, "w") as fh:
            for label, path in models:
                results.append(
                    evaluate_model(cfg, label, path, suite, template, scorer, fh, console, parallel)
                )
    finally:
        scorer.close()
    if not main:
        return None
    return finish(cfg, out, results, cfg.eval.suite, settings(cfg))
