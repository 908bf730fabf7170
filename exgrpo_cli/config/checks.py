"""The start-up check of a typed config's values (`validate`): ranges, choices and the rules that
span several fields, each failure a ConfigError naming the key and what it allows.

Where it sits: in `commands.dispatch` (and `exgrpo ablate` for each variant), after Hydra has
merged the YAML and the command line into the schema of config/schema.py and before
`variants.check_variants` checks the variants' names; so a bad value stops the run with exit
code 2 before any model is loaded. Kept apart from the schema so that config/schema.py stays the one list
of keys; this module imports nothing of exgrpo but config/schema.py, so every part may import it.

Each config section owns its checks: a function `(cfg, command) -> None` decorated with
`@section_check`, which registers it in `SECTION_CHECKS`; `validate` runs them in the order they
are defined here, and the first failure stops the run. Adding a check is one such function (or a
line in its section's function); nothing else changes.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from typing import Any

from exgrpo_cli.config.schema import ArchConfig, ConfigError, ExgrpoConfig, LoraConfig

# trainer.best_metric: every sample pooled; the unweighted mean over the held-out data sources; the
# same without Minerva (the official criterion). evaluation/val_scores.py computes them
BEST_METRICS = ("val/accuracy", "val/source_mean", "val/source_mean_no_minerva")
# replay.readmit_into: back into fresh sampling (from the next epoch), or into the next steps'
# training batches (the paper's App. E.4)
READMIT_INTO = ("sampling", "batch")
REPO_STRATEGIES = ("reward", "recency", "random")  # replay.repo.strategy (replay/repo.py)


def _check(ok: bool, key: str, value: Any, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"invalid {key}={value!r}: allowed {allowed}")


def _one_of(key: str, value: Any, choices: tuple[str, ...]) -> None:
    _check(value in choices, key, value, "one of " + ", ".join(map(str, choices)))


ARCH_REQUIRED = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)


def parse_plan_devices(value: str) -> tuple[int, float]:
    """`trainer.plan_devices` as (device count, GiB each): "8x80" -> (8, 80.0)."""
    match = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+(?:\.\d+)?)\s*", value)
    if not match or int(match.group(1)) < 1 or float(match.group(2)) <= 0:
        raise ConfigError(
            f"invalid trainer.plan_devices={value!r}: allowed <count>x<GiB per device>, e.g. 8x80"
        )
    return int(match.group(1)), float(match.group(2))


def _validate_arch(a: ArchConfig) -> None:
    numbers = {name: getattr(a, name) for name in (*ARCH_REQUIRED, "head_dim", "max_position_embeddings")}
    for name, value in numbers.items():
        _check(value >= 0, f"model.arch.{name}", value, ">= 0 (0: not carried)")
    given = [name for name in ARCH_REQUIRED if numbers[name]]
    if not given:
        return
    missing = [name for name in ARCH_REQUIRED if not numbers[name]]
    if missing:
        raise ConfigError(
            f"invalid model.arch.{missing[0]}=0: allowed > 0 when other model.arch numbers are set "
            f"({', '.join(given)}): a plan needs all of {', '.join(ARCH_REQUIRED)}"
        )
    _check(
        a.num_attention_heads % a.num_key_value_heads == 0,
        "model.arch.num_key_value_heads",
        a.num_key_value_heads,
        f"a divisor of model.arch.num_attention_heads={a.num_attention_heads}",
    )
    _check(
        a.head_dim > 0 or a.hidden_size % a.num_attention_heads == 0,
        "model.arch.head_dim",
        a.head_dim,
        "> 0 when hidden_size is not a multiple of num_attention_heads",
    )


def _validate_lora(c: LoraConfig, command: str) -> None:
    """model.lora's ranges; its rank against the model's layers is checked when the architecture is
    known, still before the weights load (policy/lora.py `check_base`)."""
    key = _keys("model.lora", c)
    key("rank", c.rank >= 0, ">= 0 (0: off, full fine-tuning)")
    key("alpha", c.alpha > 0 and math.isfinite(c.alpha), "a finite number > 0")
    key("dropout", 0.0 <= c.dropout < 1.0, "[0, 1)")
    # The training forwards run in train mode, so adapter dropout would put its noise into pi_old
    # (the ratio's denominator) and the stored log-probs, but not into trajectory scoring (no-grad,
    # eval mode): refused rather than trained with mismatched behaviour log-probs. Evaluation runs
    # in eval mode, where an adapter's recorded dropout does nothing.
    if command == "train" and c.rank > 0:
        key(
            "dropout",
            c.dropout == 0.0,
            "0 when training (dropout would add noise to pi_old and the stored log-probs that "
            "trajectory scoring does not see; docs/training-and-configs.md, LoRA)",
        )
    names = list(c.target_modules)
    ok = bool(names) and all(isinstance(n, str) and n.isidentifier() for n in names)
    _check(ok, "model.lora.target_modules", names, "a non-empty list of module names (q_proj, ...)")


def validate(cfg: ExgrpoConfig, command: str = "train") -> None:
    """Refuse out-of-range or inconsistent values; raise ConfigError naming the key.

    Names of variants (engines, selection rules, losses, templates, data sources) are checked
    against the registries of the modules that own them by `exgrpo_cli.commands.variants.check_variants`,
    which runs right after this, still before anything loads."""
    for check in SECTION_CHECKS:
        check(cfg, command)


SectionCheck = Callable[[ExgrpoConfig, str], None]  # (config, command) -> None, or a ConfigError
SECTION_CHECKS: list[SectionCheck] = []  # validate's table, in the order of this module


def section_check(check: SectionCheck) -> SectionCheck:
    """Register `check` in SECTION_CHECKS (a decorator)."""
    SECTION_CHECKS.append(check)
    return check


def _keys(section: str, values: Any) -> Callable[[str, bool, str], None]:
    """`key(name, ok, allowed)`: refuse `<section>.<name>` (with its value) unless `ok`."""
    return lambda name, ok, allowed: _check(ok, f"{section}.{name}", getattr(values, name), allowed)


@section_check
def check_model(cfg: ExgrpoConfig, command: str) -> None:
    m, key = cfg.model, _keys("model", cfg.model)
    _one_of("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    attention = ("auto", "sdpa", "eager", "flash_attention_2")
    _one_of("model.attn_implementation", m.attn_implementation, attention)
    key("max_prompt_tokens", m.max_prompt_tokens >= 1, ">= 1")
    key("max_response_tokens", m.max_response_tokens >= 1, ">= 1")
    key("path", bool(m.path), "a HF id, a local folder, builtin:tiny or pypi:<package>")
    if not m.path.startswith("builtin:") and (m.path.startswith(("/", ".", "~")) or os.path.isdir(m.path)):
        path = os.path.expanduser(m.path)
        key("path", os.path.isdir(path), "an existing model folder")
        has_cfg = os.path.isfile(os.path.join(path, "config.json")) or bool(m.gguf_file)
        key("path", has_cfg, "a folder with a causal LM (config.json or a gguf_file)")
    _validate_arch(m.arch)
    _validate_lora(m.lora, command)


@section_check
def check_data(cfg: ExgrpoConfig, command: str) -> None:
    _one_of("data.on_bad_row", cfg.data.on_bad_row, ("skip", "error"))
    s, key = cfg.data.synthetic, _keys("data.synthetic", cfg.data.synthetic)
    key("num_train", s.num_train >= 1, ">= 1")
    key("num_val", s.num_val >= 1, ">= 1")
    key("max_digits", 1 <= s.max_digits <= 4, "1..4")
    key("ops", bool(s.ops) and set(s.ops) <= {"+", "-", "*"}, "a non-empty list of +, -, *")


@section_check
def check_rollout(cfg: ExgrpoConfig, command: str) -> None:
    r, key = cfg.rollout, _keys("rollout", cfg.rollout)
    key("n", r.n >= 2, ">= 2 (a group needs at least two responses)")
    key("temperature", r.temperature > 0, "> 0")
    key("top_p", 0 < r.top_p <= 1, "(0, 1]")
    key("tensor_parallel_size", r.tensor_parallel_size >= 1, ">= 1")
    key("validation_sleep_level", r.validation_sleep_level in (1, 2), "1 or 2")
    if r.max_logprob_diff is not None:
        key("max_logprob_diff", r.max_logprob_diff > 0, "> 0, or null (no check)")
    key("gpu_memory_utilization", 0 < r.gpu_memory_utilization <= 1, "(0, 1]: vLLM's share of each GPU")


@section_check
def check_algo(cfg: ExgrpoConfig, command: str) -> None:
    a, m, key = cfg.algo, cfg.model, _keys("algo", cfg.algo)
    key("questions_per_step", a.questions_per_step >= 1, ">= 1")
    key("updates_per_step", a.updates_per_step >= 1, ">= 1")
    key("updates_per_step", a.updates_per_step <= a.questions_per_step, "<= algo.questions_per_step")
    key("lr", a.lr > 0 and math.isfinite(a.lr), "a finite number > 0")
    key("weight_decay", a.weight_decay >= 0, ">= 0")
    key("grad_clip", a.grad_clip > 0, "> 0")
    key("clip_eps", a.clip_eps > 0, "> 0")
    key("entropy_coef", a.entropy_coef >= 0, ">= 0")
    key("betas", len(a.betas) == 2 and all(0 <= b < 1 for b in a.betas), "two numbers in [0, 1)")
    key("micro_batch_tokens", a.micro_batch_tokens >= 0, ">= 0 (0: auto)")
    ob, key = a.official_batch, _keys("algo.official_batch", a.official_batch)
    key("ppo_mini_batch_size", ob.ppo_mini_batch_size >= 1, ">= 1")
    key(
        "ppo_micro_batch_size",
        ob.ppo_micro_batch_size >= 1 and ob.ppo_mini_batch_size % ob.ppo_micro_batch_size == 0,
        "a divisor of algo.official_batch.ppo_mini_batch_size (the official actor asserts it)",
    )
    key(
        "ppo_max_token_len_per_gpu",
        ob.ppo_max_token_len_per_gpu >= m.max_prompt_tokens + m.max_response_tokens,
        ">= model.max_prompt_tokens + model.max_response_tokens (one sequence must fit, as verl asserts)",
    )
    key("gpus", ob.gpus >= 1, ">= 1 (the official run: 8)")


@section_check
def check_replay(cfg: ExgrpoConfig, command: str) -> None:
    p, key = cfg.replay, _keys("replay", cfg.replay)
    key("ratio", 0.0 <= p.ratio <= 1.0, "a number in [0, 1]")
    key("start_threshold", 0.0 <= p.start_threshold <= 1.0, "[0, 1]")
    # beta=inf made every replayed token's f(w) = 0: replay without a gradient
    key("beta", p.beta > 0 and math.isfinite(p.beta), "a finite number > 0")
    key("sigma", p.sigma > 0, "> 0")
    key("mu", p.mu is None or 0.0 <= p.mu <= 1.0, "null, or [0, 1] (the bucket scale)")
    if p.bucket_edges is not None:
        edges = list(p.bucket_edges)
        _check(len(edges) >= 1, "replay.bucket_edges", edges, "a non-empty list")
        _check(all(0.0 < x < 1.0 for x in edges), "replay.bucket_edges", edges, "values inside (0, 1)")
        increasing = all(x < y for x, y in zip(edges, edges[1:]))
        _check(increasing, "replay.bucket_edges", edges, "strictly increasing values")
    key("readmit_retired_fraction", 0.0 <= p.readmit_retired_fraction <= 1.0, "[0, 1]")
    key("readmit_every", p.readmit_every >= 0, ">= 0")
    _one_of("replay.readmit_into", p.readmit_into, READMIT_INTO)
    key("readmit_batch_share", 0.0 <= p.readmit_batch_share <= 1.0, "[0, 1]")
    key("max_experiences", p.max_experiences >= 0, ">= 0 (0: no cap)")
    key("experience_lbound", p.experience_lbound >= 0, ">= 0")
    (low, high), k = p.experience_bounds(cfg.rollout.n), cfg.rollout.n
    key(
        "experience_rbound",
        low < high <= k - 1,
        f"null (K - 1), or > replay.experience_lbound={low} and <= rollout.n - 1 = {k - 1} "
        "(partly solved groups: a whole-K group retires its question)",
    )
    key("entropy_batch_size", p.entropy_batch_size >= 1, ">= 1")
    # a run without replay never reads its buffer: a carried one would be dead weight, unsaid
    key("init_from", not p.init_from or p.ratio > 0, "empty when replay.ratio=0 (nothing is replayed)")
    _check(p.prompt.cooldown >= 0, "replay.prompt.cooldown", p.prompt.cooldown, ">= 0")
    _check(p.prompt.max_reuse >= 1, "replay.prompt.max_reuse", p.prompt.max_reuse, ">= 1")
    q = p.prioritized
    _check(q.retest_every >= 0, "replay.prioritized.retest_every", q.retest_every, ">= 0 (0: never)")
    _check(0 <= q.retest_fraction <= 1, "replay.prioritized.retest_fraction", q.retest_fraction, "[0, 1]")
    _check(p.rlep.replayed >= 1, "replay.rlep.replayed", p.rlep.replayed, ">= 1")
    _one_of("replay.repo.strategy", p.repo.strategy, REPO_STRATEGIES)
    _check(p.repo.replayed >= 1, "replay.repo.replayed", p.repo.replayed, ">= 1")
    _check(p.repo.min_stored >= 1, "replay.repo.min_stored", p.repo.min_stored, ">= 1")
    _check(0 < p.repo.clip_eps < 1, "replay.repo.clip_eps", p.repo.clip_eps, "(0, 1)")
    _check(p.luffy.gamma > 0, "replay.luffy.gamma", p.luffy.gamma, "> 0")


@section_check
def check_offpolicy(cfg: ExgrpoConfig, command: str) -> None:
    """replay.max_age, the warning band and algo.rollout_correction (docs/off-policy.md)."""
    r, c, key = cfg.rollout, cfg.algo.rollout_correction, _keys("rollout", cfg.rollout)
    _check(cfg.replay.max_age >= 0, "replay.max_age", cfg.replay.max_age, ">= 0 (0: no cap)")
    if r.warn_logprob_diff is not None:
        key("warn_logprob_diff", r.warn_logprob_diff > 0, "> 0, or null (off)")
    key("logprob_diff_trend_window", r.logprob_diff_trend_window >= 0, ">= 0 (0: off)")
    if c.mode is None:
        return
    _one_of("algo.rollout_correction.mode", c.mode, ("token_tis", "geo_mask"))
    _check(c.cap >= 1, "algo.rollout_correction.cap", c.cap, ">= 1 (a cap below 1 shrinks every token)")
    _check(0 < c.low < 1 < c.high, "algo.rollout_correction.low/high", (c.low, c.high), "0 < low < 1 < high")
    # vLLM's log-probs under top-p are renormalised over the nucleus, the trainer's are over the
    # whole vocabulary: every ratio would be off by up to -log(top_p), which the correction would
    # "correct". Refused rather than renormalising the trainer's side (a top-p pass over the vocab
    # per token in every forward).
    key(
        "top_p",
        r.top_p == 1.0,
        f"1 with algo.rollout_correction.mode={c.mode} (the engine's nucleus log-probs are not the "
        "trainer's; set algo.rollout_correction.mode=null or rollout.top_p=1)",
    )


@section_check
def check_reward(cfg: ExgrpoConfig, command: str) -> None:
    w, key = cfg.reward, _keys("reward", cfg.reward)
    key("correct_at", math.isfinite(w.correct_at), "a finite number")
    weights = dict(w.components)
    ok = all(isinstance(v, (int, float)) and math.isfinite(v) and v != 0 for v in weights.values())
    key("components", ok, "{kind: weight}, each weight a finite non-zero number")
    # inf: a hung reward function would never be killed
    key("timeout_s", w.timeout_s > 0 and math.isfinite(w.timeout_s), "a finite number > 0 (seconds)")
    key("max_failed_steps", w.max_failed_steps >= 1, ">= 1")
    key("memory_limit_mb", w.memory_limit_mb >= 0, ">= 0 (0: no cap)")
    rm, key = w.model, _keys("reward.model", w.model)
    key("batch_size", rm.batch_size >= 1, ">= 1")
    key("max_tokens", rm.max_tokens >= 1, ">= 1")
    _one_of("reward.model.device", rm.device, ("", "cpu", "cuda"))


@section_check
def check_logger(cfg: ExgrpoConfig, command: str) -> None:
    _one_of("logger.wandb.mode", cfg.logger.wandb.mode, ("auto", "online", "offline", "disabled"))


@section_check
def check_trainer(cfg: ExgrpoConfig, command: str) -> None:
    t, key = cfg.trainer, _keys("trainer", cfg.trainer)
    key("steps", t.steps >= 1, ">= 1")
    key("save_every", t.save_every >= 0, ">= 0")
    key("eval_every", t.eval_every >= 0, ">= 0")
    key("val_samples", t.val_samples >= 1, ">= 1")
    key("val_questions", t.val_questions >= 0, ">= 0 (0: all)")
    val_t = t.val_temperature
    key("val_temperature", val_t is None or val_t > 0, "> 0, or null for the rollout temperature")
    key("keep_checkpoints", t.keep_checkpoints >= 1, ">= 1")
    _one_of("trainer.best_metric", t.best_metric, BEST_METRICS)
    key("max_skipped_steps", t.max_skipped_steps >= 1, ">= 1")
    _one_of("trainer.device", t.device, ("auto", "cpu", "cuda"))
    key("threads", t.threads >= 0, ">= 0")
    precisions = ("", "bf16", "bfloat16", "fp16", "float16")
    _one_of("trainer.fsdp_mixed_precision", t.fsdp_mixed_precision, precisions)
    nproc_ok = t.nproc == "auto" or (t.nproc.isdigit() and int(t.nproc) >= 1)
    key("nproc", nproc_ok, "auto (one rank per visible GPU) or a number >= 1")
    key("dist_timeout_s", t.dist_timeout_s >= 1, ">= 1 (seconds)")
    key("plan_ranks_per_node", t.plan_ranks_per_node >= 0, ">= 0")
    key("plan_host_gib", t.plan_host_gib >= 0, ">= 0 (0: this machine's)")
    for name in ("plan_ranks_per_node", "plan_host_gib"):
        key(name, not getattr(t, name) or t.dry_run, "only with trainer.dry_run=true")
    only_planned = "only with trainer.plan_devices (a real run counts the ranks on its node)"
    key("plan_ranks_per_node", not t.plan_ranks_per_node or bool(t.plan_devices), only_planned)
    if t.plan_devices:
        parse_plan_devices(t.plan_devices)
        key(
            "plan_devices",
            t.dry_run,
            "only with trainer.dry_run=true (a real run plans for the devices it sees)",
        )
    if t.resume not in ("auto", "never"):
        key("resume", os.path.isdir(t.resume), "auto, never or an existing checkpoint folder")


@section_check
def check_eval(cfg: ExgrpoConfig, command: str) -> None:
    e, key = cfg.eval, _keys("eval", cfg.eval)
    key("k", e.k >= 1, ">= 1")
    key("n", e.n >= 0, ">= 0 (0: paper default)")
    key("k", e.n == 0 or e.k <= e.n, "<= eval.n")
    key("temperature", e.temperature >= 0, ">= 0")
    key("limit", e.limit >= 0, ">= 0")
    key("batch_size", e.batch_size >= 1, ">= 1 (prompts per generate call)")
    if command == "eval" and e.suite == "custom" and not e.regrade:
        key(
            "path",
            bool(e.path) and os.path.isfile(e.path),
            "an existing parquet/jsonl file for the custom suite",
        )
    if e.regrade:
        key("regrade", os.path.isfile(e.regrade), "an existing generations.jsonl")
    check_lora_rollout(cfg)


@section_check
def check_ablation_and_inspect(cfg: ExgrpoConfig, command: str) -> None:
    _check(cfg.ablation.seeds >= 1, "ablation.seeds", cfg.ablation.seeds, ">= 1")
    _one_of("inspect.format", cfg.inspect.format, ("text", "json"))


# vLLM 0.32's accepted max_lora_rank (vllm.config.lora.MaxLoRARanks) and the ways a LoRA adapter
# reaches vLLM (rollout/vllm_lora.py)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
LORA_SYNCS = ("adapter", "merged")


def vllm_max_lora_rank(rank: int) -> int | None:
    """The smallest rank vLLM accepts that holds `rank` (None: none does, rank > 512)."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), None)


def lora_sync_problem(rank: int, engine: str, sync: str) -> str | None:
    """Why this LoRA setting cannot reach vLLM (None: it can)."""
    if sync not in LORA_SYNCS:
        return f"invalid rollout.lora_sync={sync!r}: allowed one of {', '.join(LORA_SYNCS)}"
    if rank > 0 and engine == "vllm" and sync == "adapter" and vllm_max_lora_rank(rank) is None:
        return (
            f"invalid model.lora.rank={rank} with rollout.engine=vllm rollout.lora_sync=adapter: vLLM "
            f"loads adapters of rank <= {VLLM_LORA_RANKS[-1]} only (rollout.lora_sync=merged syncs any rank)"
        )
    return None


def check_lora_rollout(cfg: ExgrpoConfig) -> None:
    """rollout.lora_sync's value, and a LoRA rank the adapter sync cannot hand to vLLM (> 512),
    refused before anything loads. Ranks between vLLM's are rounded up there (rollout/vllm_lora.py)."""
    problem = lora_sync_problem(cfg.model.lora.rank, cfg.rollout.engine, cfg.rollout.lora_sync)
    if problem:
        raise ConfigError(problem)
