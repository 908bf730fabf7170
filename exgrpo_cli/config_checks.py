"""The start-up check of a typed config's values (`validate`): ranges, choices and the rules that
span several fields, each failure a ConfigError naming the key and what it allows.

Where it sits: in `commands.dispatch` (and `exgrpo ablate` for each variant), after Hydra has
merged the YAML and the command line into the schema of config.py and before
`variants.check_variants` checks the variants' names; so a bad value stops the run with exit
code 2 before any model is loaded. Kept apart from the schema so that config.py stays the one list
of keys; this module imports nothing of exgrpo but config.py, so every part may import it.
"""

from __future__ import annotations

import math
import os
import re
from typing import Any

from exgrpo_cli.config import ArchConfig, ConfigError, ExgrpoConfig, LoraConfig

# trainer.best_metric: every sample pooled; the unweighted mean over the held-out data sources; the
# same without Minerva (the official criterion). evaluation/val_scores.py computes them
BEST_METRICS = ("val/accuracy", "val/source_mean", "val/source_mean_no_minerva")
# replay.readmit_into: back into fresh sampling (from the next epoch), or into the next steps'
# training batches (the paper's App. E.4)
READMIT_INTO = ("sampling", "batch")


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


def _validate_lora(c: LoraConfig) -> None:
    """model.lora's ranges; its rank against the model's layers is checked when the architecture is
    known, still before the weights load (policy/lora.py `check_base`)."""
    _check(c.rank >= 0, "model.lora.rank", c.rank, ">= 0 (0: off, full fine-tuning)")
    _check(c.alpha > 0 and math.isfinite(c.alpha), "model.lora.alpha", c.alpha, "a finite number > 0")
    _check(0.0 <= c.dropout < 1.0, "model.lora.dropout", c.dropout, "[0, 1)")
    names = list(c.target_modules)
    ok = bool(names) and all(isinstance(n, str) and n.isidentifier() for n in names)
    _check(ok, "model.lora.target_modules", names, "a non-empty list of module names (q_proj, ...)")


def validate(cfg: ExgrpoConfig, command: str = "train") -> None:
    """Refuse out-of-range or inconsistent values; raise ConfigError naming the key.

    Names of variants (engines, selection rules, losses, templates, data sources) are checked
    against the registries of the modules that own them by `exgrpo_cli.variants.check_variants`,
    which runs right after this, still before anything loads."""
    m, d, r, a, p, t = cfg.model, cfg.data, cfg.rollout, cfg.algo, cfg.replay, cfg.trainer
    _one_of("model.dtype", m.dtype, ("float32", "bfloat16", "float16"))
    _one_of(
        "model.attn_implementation", m.attn_implementation, ("auto", "sdpa", "eager", "flash_attention_2")
    )
    _check(m.max_prompt_tokens >= 1, "model.max_prompt_tokens", m.max_prompt_tokens, ">= 1")
    _check(m.max_response_tokens >= 1, "model.max_response_tokens", m.max_response_tokens, ">= 1")
    _check(bool(m.path), "model.path", m.path, "a HF id, a local folder, builtin:tiny or pypi:<package>")
    if not m.path.startswith("builtin:") and (m.path.startswith(("/", ".", "~")) or os.path.isdir(m.path)):
        path = os.path.expanduser(m.path)
        _check(os.path.isdir(path), "model.path", m.path, "an existing model folder")
        has_cfg = os.path.isfile(os.path.join(path, "config.json")) or bool(m.gguf_file)
        _check(has_cfg, "model.path", m.path, "a folder with a causal LM (config.json or a gguf_file)")
    _validate_arch(m.arch)
    _validate_lora(m.lora)
    _one_of("data.on_bad_row", d.on_bad_row, ("skip", "error"))
    s = d.synthetic
    _check(s.num_train >= 1, "data.synthetic.num_train", s.num_train, ">= 1")
    _check(s.num_val >= 1, "data.synthetic.num_val", s.num_val, ">= 1")
    _check(1 <= s.max_digits <= 4, "data.synthetic.max_digits", s.max_digits, "1..4")
    _check(
        bool(s.ops) and set(s.ops) <= {"+", "-", "*"},
        "data.synthetic.ops",
        s.ops,
        "a non-empty list of +, -, *",
    )

    _check(r.n >= 2, "rollout.n", r.n, ">= 2 (a group needs at least two responses)")
    _check(r.temperature > 0, "rollout.temperature", r.temperature, "> 0")
    _check(0 < r.top_p <= 1, "rollout.top_p", r.top_p, "(0, 1]")
    _check(r.tensor_parallel_size >= 1, "rollout.tensor_parallel_size", r.tensor_parallel_size, ">= 1")
    _check(
        r.validation_sleep_level in (1, 2),
        "rollout.validation_sleep_level",
        r.validation_sleep_level,
        "1 or 2",
    )
    if r.max_logprob_diff is not None:
        _check(
            r.max_logprob_diff > 0, "rollout.max_logprob_diff", r.max_logprob_diff, "> 0, or null (no check)"
        )
    _check(
        0 < r.gpu_memory_utilization <= 1,
        "rollout.gpu_memory_utilization",
        r.gpu_memory_utilization,
        "(0, 1]: vLLM's share of each GPU",
    )

    _check(a.questions_per_step >= 1, "algo.questions_per_step", a.questions_per_step, ">= 1")
    _check(a.updates_per_step >= 1, "algo.updates_per_step", a.updates_per_step, ">= 1")
    _check(
        a.updates_per_step <= a.questions_per_step,
        "algo.updates_per_step",
        a.updates_per_step,
        "<= algo.questions_per_step",
    )
    _check(a.lr > 0 and math.isfinite(a.lr), "algo.lr", a.lr, "a finite number > 0")
    _check(a.weight_decay >= 0, "algo.weight_decay", a.weight_decay, ">= 0")
    _check(a.grad_clip > 0, "algo.grad_clip", a.grad_clip, "> 0")
    _check(a.clip_eps > 0, "algo.clip_eps", a.clip_eps, "> 0")
    _check(a.entropy_coef >= 0, "algo.entropy_coef", a.entropy_coef, ">= 0")
    _check(
        len(a.betas) == 2 and all(0 <= b < 1 for b in a.betas), "algo.betas", a.betas, "two numbers in [0, 1)"
    )
    _check(a.micro_batch_tokens >= 0, "algo.micro_batch_tokens", a.micro_batch_tokens, ">= 0 (0: auto)")
    ob = a.official_batch
    _check(
        ob.ppo_mini_batch_size >= 1, "algo.official_batch.ppo_mini_batch_size", ob.ppo_mini_batch_size, ">= 1"
    )
    _check(
        ob.ppo_micro_batch_size >= 1 and ob.ppo_mini_batch_size % ob.ppo_micro_batch_size == 0,
        "algo.official_batch.ppo_micro_batch_size",
        ob.ppo_micro_batch_size,
        "a divisor of algo.official_batch.ppo_mini_batch_size (the official actor asserts it)",
    )
    _check(
        ob.ppo_max_token_len_per_gpu >= m.max_prompt_tokens + m.max_response_tokens,
        "algo.official_batch.ppo_max_token_len_per_gpu",
        ob.ppo_max_token_len_per_gpu,
        ">= model.max_prompt_tokens + model.max_response_tokens (one sequence must fit, as verl asserts)",
    )
    _check(ob.gpus >= 1, "algo.official_batch.gpus", ob.gpus, ">= 1 (the official run: 8)")

    _check(0.0 <= p.ratio <= 1.0, "replay.ratio", p.ratio, "a number in [0, 1]")
    _check(0.0 <= p.start_threshold <= 1.0, "replay.start_threshold", p.start_threshold, "[0, 1]")
    _check(p.beta > 0, "replay.beta", p.beta, "> 0")
    _check(p.sigma > 0, "replay.sigma", p.sigma, "> 0")
    _check(0.0 <= p.mu <= 1.0, "replay.mu", p.mu, "[0, 1] (accuracy scale)")
    if p.bucket_edges is not None:
        edges = list(p.bucket_edges)
        _check(len(edges) >= 1, "replay.bucket_edges", edges, "a non-empty list")
        _check(all(0.0 < x < 1.0 for x in edges), "replay.bucket_edges", edges, "values inside (0, 1)")
        _check(
            all(x < y for x, y in zip(edges, edges[1:])),
            "replay.bucket_edges",
            edges,
            "strictly increasing values",
        )
    _check(
        0.0 <= p.readmit_retired_fraction <= 1.0,
        "replay.readmit_retired_fraction",
        p.readmit_retired_fraction,
        "[0, 1]",
    )
    _check(p.readmit_every >= 0, "replay.readmit_every", p.readmit_every, ">= 0")
    _one_of("replay.readmit_into", p.readmit_into, READMIT_INTO)
    _check(p.max_experiences >= 0, "replay.max_experiences", p.max_experiences, ">= 0 (0: no cap)")
    _check(p.experience_lbound >= 0, "replay.experience_lbound", p.experience_lbound, ">= 0")
    low, high = p.experience_bounds(cfg.rollout.n)
    _check(
        low < high <= cfg.rollout.n - 1,
        "replay.experience_rbound",
        p.experience_rbound,
        f"null (K - 1), or > replay.experience_lbound={low} and <= rollout.n - 1 = {cfg.rollout.n - 1} "
        "(partly solved groups: a whole-K group retires its question)",
    )
    _check(p.entropy_batch_size >= 1, "replay.entropy_batch_size", p.entropy_batch_size, ">= 1")

    w = cfg.reward
    _check(math.isfinite(w.correct_at), "reward.correct_at", w.correct_at, "a finite number")
    _check(w.timeout_s > 0, "reward.timeout_s", w.timeout_s, "> 0 (seconds)")
    _check(w.max_failed_steps >= 1, "reward.max_failed_steps", w.max_failed_steps, ">= 1")
    _check(w.memory_limit_mb >= 0, "reward.memory_limit_mb", w.memory_limit_mb, ">= 0 (0: no cap)")
    _check(w.model.batch_size >= 1, "reward.model.batch_size", w.model.batch_size, ">= 1")
    _check(w.model.max_tokens >= 1, "reward.model.max_tokens", w.model.max_tokens, ">= 1")
    _one_of("reward.model.device", w.model.device, ("", "cpu", "cuda"))

    _one_of("logger.wandb.mode", cfg.logger.wandb.mode, ("auto", "online", "offline", "disabled"))
    _check(t.steps >= 1, "trainer.steps", t.steps, ">= 1")
    _check(t.save_every >= 0, "trainer.save_every", t.save_every, ">= 0")
    _check(t.eval_every >= 0, "trainer.eval_every", t.eval_every, ">= 0")
    _check(t.val_samples >= 1, "trainer.val_samples", t.val_samples, ">= 1")
    _check(t.val_questions >= 0, "trainer.val_questions", t.val_questions, ">= 0 (0: all)")
    _check(
        t.val_temperature is None or t.val_temperature > 0,
        "trainer.val_temperature",
        t.val_temperature,
        "> 0, or null for the rollout temperature",
    )
    _check(t.keep_checkpoints >= 1, "trainer.keep_checkpoints", t.keep_checkpoints, ">= 1")
    _one_of("trainer.best_metric", t.best_metric, BEST_METRICS)
    _check(t.max_skipped_steps >= 1, "trainer.max_skipped_steps", t.max_skipped_steps, ">= 1")
    _one_of("trainer.device", t.device, ("auto", "cpu", "cuda"))
    _check(t.threads >= 0, "trainer.threads", t.threads, ">= 0")
    _one_of(
        "trainer.fsdp_mixed_precision", t.fsdp_mixed_precision, ("", "bf16", "bfloat16", "fp16", "float16")
    )
    _check(
        t.nproc == "auto" or (t.nproc.isdigit() and int(t.nproc) >= 1),
        "trainer.nproc",
        t.nproc,
        "auto (one rank per visible GPU) or a number >= 1",
    )
    _check(t.dist_timeout_s >= 1, "trainer.dist_timeout_s", t.dist_timeout_s, ">= 1 (seconds)")
    _check(t.plan_ranks_per_node >= 0, "trainer.plan_ranks_per_node", t.plan_ranks_per_node, ">= 0")
    _check(t.plan_host_gib >= 0, "trainer.plan_host_gib", t.plan_host_gib, ">= 0 (0: this machine's)")
    for key, value in (("plan_ranks_per_node", t.plan_ranks_per_node), ("plan_host_gib", t.plan_host_gib)):
        _check(not value or t.dry_run, f"trainer.{key}", value, "only with trainer.dry_run=true")
    _check(
        not t.plan_ranks_per_node or bool(t.plan_devices),
        "trainer.plan_ranks_per_node",
        t.plan_ranks_per_node,
        "only with trainer.plan_devices (a real run counts the ranks on its node)",
    )
    if t.plan_devices:
        parse_plan_devices(t.plan_devices)
        _check(
            t.dry_run,
            "trainer.plan_devices",
            t.plan_devices,
            "only with trainer.dry_run=true (a real run plans for the devices it sees)",
        )
    if t.resume not in ("auto", "never"):
        _check(
            os.path.isdir(t.resume),
            "trainer.resume",
            t.resume,
            "auto, never or an existing checkpoint folder",
        )

    e = cfg.eval
    _check(e.k >= 1, "eval.k", e.k, ">= 1")
    _check(e.n >= 0, "eval.n", e.n, ">= 0 (0: paper default)")
    _check(e.n == 0 or e.k <= e.n, "eval.k", e.k, "<= eval.n")
    _check(e.temperature >= 0, "eval.temperature", e.temperature, ">= 0")
    _check(e.limit >= 0, "eval.limit", e.limit, ">= 0")
    _check(e.batch_size >= 1, "eval.batch_size", e.batch_size, ">= 1 (prompts per generate call)")
    if command == "eval" and e.suite == "custom" and not e.regrade:
        _check(
            bool(e.path) and os.path.isfile(e.path),
            "eval.path",
            e.path,
            "an existing parquet/jsonl file for the custom suite",
        )
    if e.regrade:
        _check(os.path.isfile(e.regrade), "eval.regrade", e.regrade, "an existing generations.jsonl")
    check_lora_rollout(cfg)
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
