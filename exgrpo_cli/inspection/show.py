"""`inspect.show=<question id>`: one question's stored responses, decoded with the run's tokenizer.

The checkpoint's `model/` folder holds the tokenizer (and, for `inspect.score=true`, the policy
under which each response's mean token entropy is computed with policy/scoring.py exactly as the
train step does; the response the run's `replay.trajectory_selection` rule would replay is
marked). The run's own config (`<run>/.hydra/config.yaml`) gives the settings that only describe
the run (prompt template, temperature, replay rule); every key that names code, a model or data
(config.COMMAND_ONLY: trust_remote_code, model and data sources) comes from this command's own
config, never from the run's: inspect-buffer is what people run on someone else's run. The data
source the run named is shown; the question text is looked up in this command's `data.*`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from exgrpo_cli.config.schema import ExgrpoConfig, LoraConfig, ModelConfig, with_own_command_only
from exgrpo_cli.errors import UsageError
from exgrpo_cli.inspection.report import run_dir_of
from exgrpo_cli.replay.buffer import ExperienceBuffer
from exgrpo_cli.replay.experience import Experience

if TYPE_CHECKING:
    from rich.console import Console
    from transformers import PreTrainedTokenizerBase

    from exgrpo_cli.data.types import Question


MAX_CONFIG_BYTES = 1 << 20


def weights_folder(checkpoint: Path) -> Path:
    """The checkpoint's policy weights: model/, or adapter/ where a LoRA run's checkpoint has no
    merged model/ (all but the run's last)."""
    if not (checkpoint / "model").is_dir() and (checkpoint / "adapter").is_dir():
        return checkpoint / "adapter"
    return checkpoint / "model"


def run_config(checkpoint: Path, own: ExgrpoConfig) -> tuple[ExgrpoConfig, str, str]:
    """The typed config the run was trained with, with every COMMAND_ONLY key (code, model, data)
    taken from `own`, this command's config; where it came from; and the data source the run named
    (for display only; "" when unknown)."""
    run = run_dir_of(checkpoint)
    saved = run / ".hydra" / "config.yaml" if run is not None else None
    if saved is None or not saved.is_file():
        return own, "this command's config (no .hydra/config.yaml beside the checkpoint)", ""
    from omegaconf import OmegaConf

    try:
        if saved.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"it is larger than {MAX_CONFIG_BYTES} bytes")
        loaded = OmegaConf.load(saved)
        # Saved unresolved: its ${hydra:runtime.output_dir} has no Hydra to resolve it here.
        OmegaConf.update(loaded, "trainer.output_dir", str(run), force_add=True)
        obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ExgrpoConfig), loaded))
        if not isinstance(obj, ExgrpoConfig):  # merged onto the schema: always one
            raise TypeError(f"it holds a {type(obj).__name__}, not an ExgrpoConfig")
    except Exception as err:  # an older or edited config: say so, still show the responses
        return own, f"this command's config ({saved} could not be read: {str(err)[:200]})", ""
    named = f"data.source={obj.data.source}" + (f" data.path={obj.data.path}" if obj.data.path else "")
    return with_own_command_only(obj, own), f"{saved} (model, code and data keys: this command's)", named


def _find_question(cfg: ExgrpoConfig, uid: str) -> tuple[Question | None, str]:
    from exgrpo_cli.data.sources import load_questions

    try:
        train, val, _ = load_questions(cfg.data)
    except Exception as err:  # data moved or offline: the stored responses are still worth showing
        return None, f"questions not loaded ({err})"
    for q in (*train, *val):
        if q.uid == uid:
            return q, ""
    return None, f"{uid} is not among this command's questions (data.source={cfg.data.source})"


def show_question(
    checkpoint: Path, buf: ExperienceBuffer, uid: str, fallback: ExgrpoConfig, score: bool
) -> dict[str, Any]:
    """A JSON-able description of `uid`'s experiences; raises KeyError when it is not buffered."""
    if uid not in buf:
        state = "retired (solved by a whole group)" if buf.is_retired(uid) else "not in the buffer"
        raise KeyError(f"question {uid!r} is {state}")
    from exgrpo_cli.data.templates import get_template
    from exgrpo_cli.policy.model import load_tokenizer

    cfg, source, named = run_config(checkpoint, fallback)
    # the checkpoint's weights and tokenizer, with this command's trust_remote_code (default off)
    # model.lora: model/ (the adapter merged) is in the run's last checkpoint only; elsewhere the
    # tokenizer is beside the adapter, and a merged model needs no LoRA layers of its own
    folder = weights_folder(checkpoint)
    mcfg = dataclasses.replace(cfg.model, path=str(folder), gguf_file="", lora=LoraConfig())
    tok = load_tokenizer(mcfg)
    exps = buf.experiences(uid)
    q, note = _find_question(cfg, uid)
    if named:
        note = f"{note}; the run named {named}" if note else f"the run named {named}"
    bucket = next(b for b in range(buf.num_buckets) if uid in set(buf.questions_in_bucket(b)))
    rows = [
        {
            "step": e.step,
            "length": int(e.response_ids.size),
            "behavior_logp_mean": float(np.mean(e.behavior_logp)),
            "text": tok.decode(e.response_ids.tolist(), skip_special_tokens=False),
        }
        for e in exps
    ]
    out: dict[str, Any] = {
        "uid": uid,
        "question": q.question if q else None,
        "answer": q.answer if q else None,
        "note": note,
        "config": source,
        "bucket": bucket + 1,
        "accuracy": buf.bucket_centres()[bucket],
        "experiences": rows,
    }
    if score:
        if q is None:
            raise KeyError(f"cannot score {uid!r}: its prompt is unknown ({note})")
        out.update(_scores(cfg, mcfg, tok, get_template(cfg.model.template).prompt_ids(q, tok), exps, rows))
    return out


def _scores(
    cfg: ExgrpoConfig,
    mcfg: ModelConfig,
    tok: PreTrainedTokenizerBase,
    prompt_ids: list[int],
    exps: list[Experience],
    rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """Each response's entropy (into `rows`), and which one the run's rule replays."""
    from transformers.utils import logging as hf_logging

    from exgrpo_cli.algo.logprobs import ENTROPY, CandidateScore
    from exgrpo_cli.config.registry import pick
    from exgrpo_cli.parallel.fsdp import pick_device
    from exgrpo_cli.plan.model_bounds import check_model
    from exgrpo_cli.policy.forward import token_budget
    from exgrpo_cli.policy.model import load_model
    from exgrpo_cli.policy.scoring import score_candidates
    from exgrpo_cli.replay.trajectory import TRAJECTORY_SELECTION

    hf_logging.disable_progress_bar()  # a weights-loading bar would garble the listing
    if Path(mcfg.path).name == "adapter":
        raise UsageError(
            f"inspect.score needs the policy's weights: {Path(mcfg.path).parent} holds a LoRA adapter "
            "and no merged model/ (the run's last checkpoint has one)"
        )
    check_model(mcfg.path, mcfg.gguf_file, mcfg.dtype)  # config.json vs its weights and the memory
    model = load_model(mcfg, pick_device("auto"))
    ids = prompt_ids  # as training fed them (Template.prompt_ids)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    budget = token_budget(cfg.algo.micro_batch_tokens, next(model.parameters()).device)

    def scored(kind: CandidateScore) -> list[float]:
        return score_candidates(
            model,
            [ids] * len(exps),
            [e.response_ids.tolist() for e in exps],
            kind=kind,
            temperature=cfg.rollout.temperature,
            pad_id=pad,
            token_budget=budget,
            max_rows=cfg.replay.entropy_batch_size,
        )

    entropies = scored(ENTROPY)
    for row, h in zip(rows, entropies):
        row["entropy"] = h
    name = cfg.replay.trajectory_selection
    rule = pick(TRAJECTORY_SELECTION, "replay.trajectory_selection", name)
    replayed = None
    if not rule.draws:
        by = entropies if rule.score is ENTROPY else scored(rule.score) if rule.score else []
        replayed = rule.pick(exps, by, np.random.default_rng(0))
    return {"temperature": cfg.rollout.temperature, "rule": name, "replayed": replayed}


def print_show(info: dict[str, Any], console: Console) -> None:
    from rich.markup import escape

    c = console
    c.print(
        f"[bold]question {escape(info['uid'])}[/]  bucket {info['bucket']} "
        f"(accuracy {info['accuracy']:.3f}), {len(info['experiences'])} stored responses"
    )
    if info["question"] is not None:
        c.print(f"[bold]Q:[/] {escape(info['question'])}   [bold]gold:[/] {escape(str(info['answer']))}")
    if info["note"]:
        c.print(f"[dim]{escape(info['note'])}[/]")
    c.print(f"[dim]config: {escape(info['config'])}[/]")
    for i, r in enumerate(info["experiences"]):
        head = (
            f"#{i} step {r['step']}  {r['length']} tokens  "
            f"behaviour log-prob mean {r['behavior_logp_mean']:.3f}"
        )
        if "entropy" in r:
            head += f"  entropy {r['entropy']:.4f}"
            if i == info.get("replayed"):
                head += f"  <- replayed by {info['rule']}"
        c.print(f"[cyan]{head}[/]", soft_wrap=True)
        c.print(escape(r["text"]), highlight=False)
